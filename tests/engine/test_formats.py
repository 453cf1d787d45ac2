"""Output formats: SARIF against its schema, GitHub workflow commands, GitLab Code Quality, the
concise and full text formats, --statistics and --show-fixes."""

import io
import json
import re

import pytest
from engine_scripts import HOST_SYNCS, TRAIN
from rich.console import Console
from schemas import SARIF, validate
from workflow_commands import parse

from accrewrite.errors import FileError
from accrewrite.registry import find_rule
from accrewrite.report import github, text
from accrewrite.rule import Finding
from accrewrite.runner import Outcome


def tree(tmp_path):
    (tmp_path / "train.py").write_bytes(HOST_SYNCS)
    (tmp_path / "odd name #1.py").write_bytes(TRAIN)
    (tmp_path / "broken.py").write_bytes(b"import torch\nx = (\n")
    return tmp_path


def test_sarif_validates_against_the_sarif_2_1_0_schema(tmp_path, cli):
    code, out, _ = cli("migrate", "--check", "--format", "sarif", tree(tmp_path))
    assert code == 2  # broken.py
    log = json.loads(out)
    validate(log, SARIF)
    (run,) = log["runs"]
    assert {r["ruleId"] for r in run["results"]} >= {"ACC001", "ACC101"}
    assert run["invocations"][0]["toolExecutionNotifications"][0]["level"] == "error"
    diagnostic = next(r for r in run["results"] if r["ruleId"] == "ACC101")
    assert "step closure" in diagnostic["properties"]["help"]
    rule = run["tool"]["driver"]["rules"][diagnostic["ruleIndex"]]
    assert rule["id"] == "ACC101" and rule["help"]["markdown"] == find_rule("ACC101").documentation()


def test_sarif_schema_check_catches_a_broken_log(tmp_path, cli):
    """The schema check is real: a log without a version fails it."""
    import jsonschema
    import pytest

    log = json.loads(cli("migrate", "--format", "sarif", tree(tmp_path))[1])
    del log["version"]
    with pytest.raises(jsonschema.ValidationError):
        validate(log, SARIF)


def test_github_commands_escape_percent_newlines_colons_and_commas():
    outcome = Outcome(
        "dir:1/a,b%c.py",
        error=FileError("100% broken\r\nsee: a, b"),
        diagnostics=[Finding("ACC101", "host-sync", "50% of\nlines: x,y", None, line=7, col=3)],
    )
    lines = github.render([outcome], "diff", "runtime").splitlines()
    assert len(lines) == 2  # one command a line: no raw line break survives
    level, properties, message = parse(lines[0])
    assert level == "error" and properties["file"] == "dir:1/a,b%c.py" and message == "100% broken\r\nsee: a, b"
    assert "file=dir%3A1/a%2Cb%25c.py" in lines[0] and "::100%25 broken%0D%0Asee: a, b" in lines[0]
    level, properties, message = parse(lines[1])
    assert (level, properties) == ("warning", {"file": "dir:1/a,b%c.py", "line": "7", "col": "4", "title": "ACC101"})
    assert message == "50% of\nlines: x,y"


def test_github_format_end_to_end_follows_the_command_syntax(tmp_path, cli):
    code, out, _ = cli("migrate", "--check", "--format", "github", tree(tmp_path))
    annotations = [parse(line) for line in out.splitlines()]
    files = {properties["file"] for _, properties, _ in annotations}
    assert files == {str(tmp_path / name) for name in ("train.py", "odd name #1.py", "broken.py")}
    assert ("warning", "ACC101") in {(level, properties["title"]) for level, properties, _ in annotations}


def test_gitlab_code_quality_report(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("CI_PROJECT_DIR", str(tmp_path))
    code, out, _ = cli("migrate", "--check", "--format", "gitlab", tree(tmp_path))
    issues = json.loads(out)
    for issue in issues:
        assert set(issue) >= {"description", "check_name", "fingerprint", "severity", "location"}
        assert issue["severity"] in ("info", "minor", "major", "critical", "blocker")
        assert issue["location"]["lines"]["begin"] >= 1
    assert {i["location"]["path"] for i in issues} == {"train.py", "odd name #1.py", "broken.py"}
    assert len({i["fingerprint"] for i in issues}) == len(issues)  # repeats are told apart
    host_syncs = [i for i in issues if i["check_name"] == "ACC101"]
    assert [i["location"]["lines"]["begin"] for i in host_syncs] == [7, 8, 9, 10]
    assert host_syncs[0]["description"] == "ACC101 `loss.item()` syncs the host every step"
    assert "step closure" in host_syncs[0]["content"]["body"]
    # A line added above moves the findings, not their fingerprints.
    (tmp_path / "train.py").write_bytes(b"# moved\n" + HOST_SYNCS)
    moved = json.loads(cli("migrate", "--check", "--format", "gitlab", tmp_path)[1])
    assert {i["fingerprint"] for i in moved} == {i["fingerprint"] for i in issues}


def test_concise_lines_state_one_fact_and_a_repeat_once(tmp_path, cli):
    path = tmp_path / "train.py"
    path.write_bytes(HOST_SYNCS)
    code, out, _ = cli("migrate", "--check", path)
    lines = [line for line in out.splitlines() if re.match(rf"{re.escape(str(path))}:\d+:\d+: ACC", line)]
    assert lines == [
        f"{path}:7:9: ACC101 `loss.item()` syncs the host every step (also on lines 8, 9)",
        f"{path}:10:9: ACC101 `x.item()` syncs the host every step",
    ]


@pytest.mark.parametrize("form", ["concise", "full"])
def test_a_location_on_line_100_is_not_read_as_an_emoji_code(tmp_path, cli, form):
    # rich reads ":100:" as an emoji code: the location would print as "train.py💯9".
    path = tmp_path / "train.py"
    path.write_bytes(b"# a line above\n" * 93 + HOST_SYNCS)
    code, out, _ = cli("migrate", "--check", "--output-format", form, path)
    assert f"{path}:100:9: ACC101 `loss.item()` syncs the host every step" in out


def test_full_format_shows_the_source_line_and_the_help_once(tmp_path, cli):
    path = tmp_path / "train.py"
    path.write_bytes(HOST_SYNCS)
    code, out, _ = cli("migrate", "--check", "--output-format", "full", path)
    assert f"{path}:8:9: ACC101 `loss.item()` syncs the host every step" in out
    assert "7 |     a = loss.item()\n  |         ^" in out
    helps = [line for line in out.splitlines() if line.startswith("  = help: ")]
    assert len(helps) == 4 and helps[1] == helps[2] == "  = help: as on line 7"
    assert "step closure" in helps[0] and "step closure" in helps[3]


def test_statistics_count_each_rule(tmp_path, cli):
    tree(tmp_path)
    _, document, _ = cli("migrate", "--format", "json", tmp_path)
    expected = {}
    for entry in json.loads(document)["files"]:
        for kind, found in (("fix", entry["fixes"]), ("diagnostic", entry["diagnostics"])):
            for finding in found:
                expected[(finding["code"], kind)] = expected.get((finding["code"], kind), 0) + 1
    code, out, _ = cli("migrate", "--statistics", "--format", "json", tmp_path)
    assert code == 2
    assert {(row["code"], row["kind"]): row["count"] for row in json.loads(out)} == expected
    code, out, _ = cli("migrate", "--statistics", tmp_path)
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["4", "ACC101", "host-sync", "diagnostic"]
    assert {(row[1], row[3]): int(row[0]) for row in rows if row[1] != "error"} == expected
    assert rows[-1][:2] == ["1", "error"]


def test_show_fixes_lists_the_fixes_per_file_and_rule(tmp_path, cli):
    path = tmp_path / "train.py"
    path.write_bytes(TRAIN)
    code, out, _ = cli("migrate", "--check", "--show-fixes", path)
    assert f"Would apply 3 fixes in 1 file:\n- {path}:\n    1 × ACC001 (rng-seed)\n    2 × ACC002 (device-placement)\n" in out
    code, out, _ = cli("migrate", "--in-place", "--show-fixes", path)
    assert code == 0 and "Applied 3 fixes in 1 file:" in out


LONG_DIFF = (
    "--- a/train.py\n+++ b/train.py\n@@ -1,2 +1,2 @@\n"
    f"-x = [{', '.join(['0'] * 60)}]  # [not markup]\n+y = 1\n \\ No newline at end of file\n"
)


def test_a_diff_to_a_pipe_is_written_as_it_is():
    out = io.StringIO()
    text.print_diff(LONG_DIFF, Console(file=out, width=40))
    assert out.getvalue() == LONG_DIFF


def test_a_diff_to_a_terminal_is_coloured_and_not_wrapped():
    out = io.StringIO()
    text.print_diff(LONG_DIFF, Console(file=out, width=40, force_terminal=True, color_system="standard"))
    coloured = out.getvalue()
    assert "\x1b[32m+y = 1" in coloured and "\x1b[31m-x = [0, 0" in coloured
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == LONG_DIFF
