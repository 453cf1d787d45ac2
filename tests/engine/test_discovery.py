import os

import pytest

from accrewrite.discovery import discover


def touch(path, data="import torch\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data)
    return path


def names(paths, root):
    return sorted(str(p.relative_to(root)) for p in paths)


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
    assert discover([str(file), str(file)]) == [file]
    with pytest.raises(FileNotFoundError, match="missing.py"):
        discover([str(tmp_path / "missing.py")])
