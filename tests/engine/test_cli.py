"""The CLI contract: modes, exit codes 0/1/2, formats, rules, explain."""

import io
import json
import subprocess
import sys

import pytest

from engine_scripts import TRAIN


def write(tmp_path, name="train.py", data=TRAIN):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_diff_is_the_default_and_writes_nothing(tmp_path, cli):
    path = write(tmp_path)
    code, out, _ = cli("migrate", path)
    assert code == 0
    assert "+device = xm.xla_device()" in out
    assert "-torch.manual_seed(0)" in out
    assert path.read_bytes() == TRAIN
    assert "files" in out and "changed" in out and "diagnostics" in out  # the summary table


def test_check_exits_1_when_a_file_would_change_and_0_when_migrated(tmp_path, cli):
    path = write(tmp_path)
    code, out, _ = cli("migrate", "--check", path)
    assert code == 1
    assert "Would migrate" in out
    assert path.read_bytes() == TRAIN
    assert cli("migrate", "--in-place", path)[0] == 0
    assert cli("migrate", "--check", path)[0] == 0


def test_in_place_rewrites_and_second_run_changes_nothing(tmp_path, cli):
    path = write(tmp_path)
    assert cli("migrate", "--in-place", path)[0] == 0
    migrated = path.read_bytes()
    assert b"import accrewrite.runtime.xla_model as xm" in migrated
    assert b".to(device)" in migrated
    stat_before = path.stat()
    assert cli("migrate", "--in-place", path)[0] == 0
    assert path.read_bytes() == migrated
    assert path.stat().st_mtime_ns == stat_before.st_mtime_ns  # not rewritten at all


def test_output_dir_mirrors_the_tree_and_leaves_sources(tmp_path, cli):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    write(source / "pkg")
    write(source, "other.py", b"x = 1\n")
    out_dir = tmp_path / "out"
    code, _, _ = cli("migrate", source, "--output-dir", out_dir, "--target", "torchacc")
    assert code == 0
    assert b"torchacc.torch_xla.core.xla_model" in (out_dir / "pkg" / "train.py").read_bytes()
    assert (out_dir / "other.py").read_bytes() == b"x = 1\n"
    assert (source / "pkg" / "train.py").read_bytes() == TRAIN


def test_error_exit_2_and_other_files_still_run(tmp_path, cli):
    bad = write(tmp_path, "bad.py", b"import torch\ndef f(:\n    pass\n")
    good = write(tmp_path, "good.py")
    code, out, _ = cli("migrate", "--in-place", bad, good)
    assert code == 2
    assert f"{bad}:2:" in out and "syntax error" in out
    assert b"xm.xla_device()" in good.read_bytes()


def test_diagnostics_print_brackets_as_written(tmp_path, cli):
    source = (b"import torch\nmodel = Net().cuda()\nfor step, (x, y) in enumerate(loader):\n"
              b"    loss = model(x[step:step + 2]).sum()\n    loss.backward()\n    optimizer.step()\n")
    path = write(tmp_path, "[train].py", source)
    code, out, _ = cli("migrate", path)
    assert code == 0
    assert "[train].py:4:" in out and "`x[step:step + 2]`" in out  # not taken for rich markup


def test_bad_arguments_exit_2(tmp_path, cli, capsys):
    path = write(tmp_path)
    assert cli("migrate", path, "--select", "ACC999")[0] == 2
    assert cli("migrate", tmp_path / "missing.py")[0] == 2
    try:
        cli("migrate", path, "--target", "nowhere")
    except SystemExit as exc:  # argparse's own exit for a bad choice
        assert exc.code == 2
    else:
        raise AssertionError("a bad --target must exit 2")


def test_select_and_ignore(tmp_path, cli):
    path = write(tmp_path)
    _, out, _ = cli("migrate", path, "--select", "ACC001", "--format", "json")
    codes = {fix["code"] for fix in json.loads(out)["files"][0]["fixes"]}
    assert codes == {"ACC001"}
    _, out, _ = cli("migrate", path, "--ignore", "rng-seed", "--format", "json")
    codes = {fix["code"] for fix in json.loads(out)["files"][0]["fixes"]}
    assert codes == {"ACC002"}


def test_a_rule_selected_by_code_that_the_target_lacks_is_said_once(tmp_path, cli):
    source = b"import torch.nn as nn\n\nnorms = [nn.LayerNorm(8), nn.LayerNorm(16)]\n"
    paths = [write(tmp_path, name, source) for name in ("a.py", "b.py")]
    code, out, err = cli("migrate", *paths, "--target", "torch_xla", "--select", "ACC020")
    assert code == 0
    assert err.count("ACC020") == 1 and "not available on target 'torch_xla'" in err
    assert "ACC020" not in out
    assert "ACC020" not in cli("migrate", *paths, "--target", "torch_xla")[2]


def test_json_document(tmp_path, cli):
    path = write(tmp_path)
    code, out, _ = cli("migrate", path, "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert document["version"] == 2 and document["target"] == "runtime"
    (entry,) = document["files"]
    assert entry["path"] == str(path) and entry["changed"] is True and entry["error"] is None
    assert {"code": "ACC001", "name": "rng-seed", "line": 3}.items() <= entry["fixes"][0].items()
    assert document["summary"] == {"files": 1, "changed": 1, "written": 0, "errors": 0, "fixes": 3, "diagnostics": 0}


def test_json_columns_count_from_one_as_the_text_does_with_where_each_diagnostic_ends(tmp_path, cli):
    path = write(tmp_path, "sync.py", b"""import torch
model = torch.nn.Linear(2, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.ones(3, 2):
    loss = model(x.cuda()).sum()
    loss.backward()
    optimizer.step()
    print(loss.item(),
          "logged")
""")
    _, text, _ = cli("migrate", path, "--select", "ACC101")
    _, out, _ = cli("migrate", path, "--select", "ACC101", "--format", "json")
    (diagnostic,) = json.loads(out)["files"][0]["diagnostics"]
    assert f"{path}:8:11: ACC101" in text
    assert (diagnostic["line"], diagnostic["col"]) == (8, 11)
    assert diagnostic["end_location"] == {"line": 8, "col": 11 + len("loss.item()")}


def test_github_annotations(tmp_path, cli):
    bad = write(tmp_path, "bad.py", b"import torch\nx = (\n")
    path = write(tmp_path)
    code, out, _ = cli("migrate", "--check", "--format", "github", path, bad)
    assert code == 2
    lines = out.splitlines()
    assert any(line.startswith(f"::error file={path},line=3,title=ACC001 rng-seed::would migrate") for line in lines)
    assert any(line.startswith(f"::error file={bad},line=") and "syntax error" in line for line in lines)


def test_sarif_is_valid_2_1_0(tmp_path, cli):
    path = write(tmp_path)
    code, out, _ = cli("migrate", "--format", "sarif", path)
    assert code == 0
    log = json.loads(out)
    assert log["version"] == "2.1.0"
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "accrewrite"
    rule_ids = [rule["id"] for rule in driver["rules"]]
    assert "ACC001" in rule_ids and "ACC002" in rule_ids
    for result in run["results"]:
        assert rule_ids[result["ruleIndex"]] == result["ruleId"]
        assert result["level"] in ("none", "note", "warning", "error")
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
    assert run["results"]


def test_jobs_give_the_same_results(tmp_path, cli):
    for index in range(6):
        write(tmp_path, f"t{index}.py", TRAIN.replace(b"(4, 4)", f"({index}, 4)".encode()))
    _, serial, _ = cli("migrate", tmp_path, "--format", "json", "--jobs", "1")
    _, parallel, _ = cli("migrate", tmp_path, "--format", "json", "--jobs", "2")
    assert json.loads(serial) == json.loads(parallel)
    assert json.loads(serial)["summary"]["changed"] == 6


def test_rules_lists_every_rule_with_targets(cli):
    code, out, _ = cli("rules", "--format", "json")
    assert code == 0
    rules = {rule["code"]: rule for rule in json.loads(out)}
    assert rules["ACC001"]["name"] == "rng-seed"
    assert rules["ACC002"]["targets"] == ["runtime", "torch_xla", "torchacc"]
    assert all(isinstance(rule["safe"], bool) for rule in rules.values())


def test_explain_prints_the_documentation_and_examples(cli):
    code, out, _ = cli("explain", "device-placement")
    assert code == 0
    assert "ACC002 device-placement" in out and "Example 1" in out and "xm.xla_device()" in out
    assert cli("explain", "ACC999")[0] == 2


def test_progress_bar_on_a_terminal_for_large_trees(tmp_path):
    """The bar goes to stderr only when stderr is a terminal (here a pseudo-terminal)."""
    import os
    import pty
    import subprocess
    import sys

    for index in range(25):
        write(tmp_path, f"t{index}.py")
    leader, follower = pty.openpty()
    done = subprocess.run(
        [sys.executable, "-m", "accrewrite", "migrate", str(tmp_path), "--format", "json"],
        stdout=subprocess.PIPE, stderr=follower, env={**os.environ, "TERM": "xterm", "COLUMNS": "100"},
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert done.returncode == 0
    assert b"migrating" in seen and b"25/25" in seen
    assert json.loads(done.stdout)["summary"]["files"] == 25  # stdout stays clean JSON


def stdin(monkeypatch, data: bytes):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_dash_reads_standard_input_named_by_stdin_filename(tmp_path, cli, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.accrewrite]\ntarget = "torch_xla"\n')
    stdin(monkeypatch, TRAIN)
    code, out, _ = cli("migrate", "-", "--stdin-filename", tmp_path / "train.py")
    assert code == 0 and f"--- a/{tmp_path / 'train.py'}" in out
    assert "import torch_xla" in out  # the pyproject.toml beside the name it was given
    stdin(monkeypatch, TRAIN)
    code, out, err = cli("migrate", "-", "--in-place")
    assert code == 0 and out.startswith("import torch") and "xm.xla_device()" in out  # the source alone
    assert "accrewrite migrate (target runtime)" in err  # the report on standard error
    stdin(monkeypatch, TRAIN)
    assert cli("migrate", "-", "--check")[0] == 1
    assert cli("migrate", "-", str(tmp_path))[0] == 2  # `-` stands alone


def test_a_folder_without_python_files_is_said_and_a_missing_path_is_no_file(tmp_path, cli):
    (tmp_path / "notes.txt").write_text("")
    code, _, err = cli("migrate", tmp_path)
    assert code == 0 and f"warning: no Python files found under {tmp_path}" in err
    code, out, err = cli("migrate", tmp_path / "missing.py", write(tmp_path))
    assert code == 2 and "no such file or directory" in out + err
    summary = [line for line in out.splitlines() if line.startswith("│")][-1]
    assert summary.split("│")[1].strip() == "1"  # one file: the missing path is an error, not a file


def test_unknown_names_say_where_they_came_from_and_what_was_meant(tmp_path, cli):
    with pytest.raises(SystemExit):
        cli("migrate", write(tmp_path), "--target", "torch-xla")
    (tmp_path / "pyproject.toml").write_text('[tool.accrewrite]\ntarget = "torch-xla"\n')
    code, _, err = cli("migrate", write(tmp_path))
    assert code == 2 and "pyproject.toml: [tool.accrewrite] target: unknown target 'torch-xla'; did you mean " \
                          "'torch_xla'?" in err
    (tmp_path / "pyproject.toml").write_text('[tool.accrewrite]\nselect = ["ACC999"]\n')
    code, _, err = cli("migrate", write(tmp_path))
    assert code == 2 and "pyproject.toml: [tool.accrewrite] select/ignore: 'ACC999' matches no rule" in err
    (tmp_path / "pyproject.toml").write_text('[tool.accrewrite]\ntargt = "runtime"\n')
    code, _, err = cli("migrate", write(tmp_path))
    assert code == 2 and "pyproject.toml: [tool.accrewrite] has unknown key 'targt'" in err
    (tmp_path / "pyproject.toml").unlink()
    code, _, err = cli("migrate", write(tmp_path), "--select", "ACC998")
    assert code == 2 and "--select/--ignore: 'ACC998' matches no rule" in err


def test_argument_errors_name_the_fix(tmp_path, cli, capsys):
    with pytest.raises(SystemExit):
        cli("migrate", write(tmp_path), "--target", "torch-xla")
    assert "unknown target 'torch-xla'; did you mean 'torch_xla'?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli("verify", write(tmp_path), "--lr", "0.1")
    assert "the script's own arguments go after `--`" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli("migrate", "--help")
    assert "--parallel fsdp|tp|fsdp,tp|pp|fsdp,pp|tp,pp|fsdp,tp,pp|cp|fsdp,cp" in capsys.readouterr().out


def test_version_imports_neither_libcst_nor_the_rules_and_reads_no_installed_packages():
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "accrewrite.cli", "--version"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("accrewrite ")
    assert " libcst" not in done.stderr and "accrewrite.rules.acc" not in done.stderr
    assert " importlib.metadata" not in done.stderr  # the entry points of every installed package


def test_the_codemod_reads_the_runtimes_parallel_kinds_without_torch():
    code = ("import sys, accrewrite.cli, accrewrite.config, accrewrite.engine\n"
            "from accrewrite.base.parallel_kinds import PARALLEL_KINDS\n"
            "assert accrewrite.cli.PARALLEL_KINDS is accrewrite.config.PARALLEL_KINDS is PARALLEL_KINDS\n"
            "print(sorted(name for name in sys.modules if name.split('.')[0] == 'torch'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]"]
