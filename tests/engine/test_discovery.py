import os

from accrewrite.discovery import discover


def touch(path, data="import torch\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data)
    return path


def names(found, root):
    assert not found.problems
    return sorted(str(p.relative_to(root)) for p in found.files)


def test_walk_skips_tooling_and_environment_dirs(tmp_path):
    touch(tmp_path / "train.py")
    touch(tmp_path / "pkg" / "model.py")
    touch(tmp_path / "notes.txt")
    for skipped in (".git/hooks/x.py", "__pycache__/a.py", "build/lib/a.py", "dist/a.py", ".venv/lib/a.py",
                    "pkg.egg-info/a.py", "node_modules/a.py"):
        touch(tmp_path / skipped)
    touch(tmp_path / "myenv" / "pyvenv.cfg", "home = /usr\n")
    touch(tmp_path / "myenv" / "lib" / "site.py")
    assert names(discover([str(tmp_path)]), tmp_path) == ["pkg/model.py", "train.py"]


def test_exclude_globs(tmp_path):
    touch(tmp_path / "train.py")
    touch(tmp_path / "legacy" / "old.py")
    touch(tmp_path / "tests" / "test_x.py")
    found = discover([str(tmp_path)], ("legacy", "test_*.py"))
    assert names(found, tmp_path) == ["train.py"]


def test_symlinks_out_of_the_tree_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    touch(outside / "secret.py")
    tree = tmp_path / "tree"
    touch(tree / "train.py")
    os.symlink(outside, tree / "linkdir")
    os.symlink(outside / "secret.py", tree / "link.py")
    assert names(discover([str(tree)]), tree) == ["train.py"]


def test_symlink_inside_the_tree_and_a_loop(tmp_path):
    touch(tmp_path / "a" / "train.py")
    os.symlink(tmp_path / "a", tmp_path / "a" / "loop")
    os.symlink(tmp_path, tmp_path / "a" / "up")
    found = discover([str(tmp_path)])
    assert names(found, tmp_path) == ["a/train.py"]


def test_explicit_files_and_missing_paths(tmp_path):
    file = touch(tmp_path / "script.py")
    os.symlink(file, tmp_path / "alias.py")
    found = discover([str(file), str(tmp_path / "missing.py"), str(file), str(tmp_path / "alias.py")])
    assert found.files == [file]  # one file by three names is taken once
    assert found.problems == [(str(tmp_path / "missing.py"), "no such file or directory")]


def test_a_symlink_loop_among_files_is_a_file_to_report_not_a_crash(tmp_path):
    touch(tmp_path / "train.py")
    os.symlink(tmp_path / "b.py", tmp_path / "a.py")
    os.symlink(tmp_path / "a.py", tmp_path / "b.py")
    found = discover([str(tmp_path), str(tmp_path / "a.py")])
    # Taken (reading them fails with ELOOP, each its own error); the walk goes on.
    assert sorted(p.name for p in found.files) == ["a.py", "b.py", "train.py"]
