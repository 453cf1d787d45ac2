import json

from engine_scripts import TRAIN


def project(tmp_path, table):
    (tmp_path / "pyproject.toml").write_text(f"[project]\nname = 'x'\n\n[tool.accrewrite]\n{table}\n")
    (tmp_path / "scripts").mkdir()
    path = tmp_path / "scripts" / "train.py"
    path.write_bytes(TRAIN)
    return path


def fixes(out):
    return {fix["code"] for fix in json.loads(out)["files"][0]["fixes"]}


def test_nearest_pyproject_sets_target_and_select(tmp_path, cli):
    path = project(tmp_path, 'target = "torchacc"\nselect = ["ACC002"]')
    code, out, _ = cli("migrate", path, "--format", "json")
    assert code == 0
    assert json.loads(out)["target"] == "torchacc"
    assert fixes(out) == {"ACC002"}


def test_flags_override_the_file(tmp_path, cli):
    path = project(tmp_path, 'target = "torchacc"\nselect = ["ACC002"]')
    _, out, _ = cli("migrate", path, "--format", "json", "--target", "torch_xla", "--select", "ACC001")
    assert json.loads(out)["target"] == "torch_xla" and fixes(out) == {"ACC001"}


def test_ignore_and_exclude_from_the_file(tmp_path, cli):
    path = project(tmp_path, 'ignore = ["rng-seed"]\nexclude = ["skipme"]')
    (path.parent / "skipme").mkdir()
    (path.parent / "skipme" / "x.py").write_bytes(TRAIN)
    _, out, _ = cli("migrate", path.parent, "--format", "json")
    document = json.loads(out)
    assert [f["path"] for f in document["files"]] == [str(path)]
    assert fixes(out) == {"ACC002"}


def test_unknown_key_is_an_error(tmp_path, cli):
    path = project(tmp_path, 'targett = "torchacc"')
    code, _, err = cli("migrate", path)
    assert code == 2 and "unknown key 'targett'" in err


def test_wrong_type_is_an_error(tmp_path, cli):
    path = project(tmp_path, 'select = "ACC001"')
    code, _, err = cli("migrate", path)
    assert code == 2 and "select must be a list of strings" in err


def test_each_file_takes_its_own_projects_configuration(tmp_path, cli, monkeypatch):
    # A monorepo's pre-commit run: two projects, one call.
    for name, table in (("a", 'target = "torch_xla"'), ("b", 'target = "runtime"\nexclude = ["legacy.py"]')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "pyproject.toml").write_text(f"[tool.accrewrite]\n{table}\n")
        for script in ("train.py", "legacy.py"):
            (tmp_path / name / script).write_bytes(TRAIN)
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("migrate", "--in-place", "a/train.py", "b/train.py", "b/legacy.py", "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert [f["path"] for f in document["files"]] == ["a/train.py", "b/train.py"] and document["target"] == "runtime, torch_xla"
    assert b"torch_xla" in (tmp_path / "a/train.py").read_bytes()
    assert b"accrewrite.runtime" in (tmp_path / "b/train.py").read_bytes()
    assert (tmp_path / "b/legacy.py").read_bytes() == TRAIN
    # A bad configuration anywhere stops the call before any file is written.
    (tmp_path / "b/pyproject.toml").write_text('[tool.accrewrite]\ntarget = "tpu"\n')
    (tmp_path / "a/legacy.py").write_bytes(TRAIN)
    code, _, err = cli("migrate", "--in-place", "a/legacy.py", "b/legacy.py")
    assert code == 2 and "b/pyproject.toml: [tool.accrewrite] target" in err
    assert (tmp_path / "a/legacy.py").read_bytes() == TRAIN
