"""action.yml, the GitHub Action: its steps run here as the runner runs them (bash -eo
pipefail, inputs and the action's path substituted, GITHUB_STEP_SUMMARY pointed at a file).

The install step is given an empty ``install`` input: the interpreter running the tests has
accrewrite installed already, and a test must not pip-install into it.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from engine_scripts import SMALL_TRAINING, TRAIN
from schemas import GITHUB_ACTION, validate
from workflow_commands import parse

ROOT = Path(__file__).resolve().parents[2]
EXPRESSION = re.compile(
    r"\$\{\{\s*(inputs\.(\w+)|github\.action_path|runner\.temp|steps\.(\w+)\.outputs\.([\w-]+))\s*\}\}")


def run_action(workspace: Path, summary: Path, uploaded: str = "", **given) -> list[subprocess.CompletedProcess]:
    """Run the steps in order as the runner does (a failed step skips the later ones, save those
    that run ``always()``); returns what each step that ran did. A step that uses another action
    (the upload of verify's report) is not run; its artifact's address is ``uploaded``."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    inputs = {name: spec.get("default", "") for name, spec in action["inputs"].items()}
    inputs.update(given)
    temp = workspace.parent / "runner-temp"
    temp.mkdir(exist_ok=True)
    outputs: dict[str, dict[str, str]] = {}

    def substitute(text: str) -> str:
        def value(match):
            if match[3]:
                return outputs.get(match[3], {}).get(match[4], "")
            return {"github.action_path": str(ROOT), "runner.temp": str(temp)}.get(match[1]) or inputs[match[2]]

        return EXPRESSION.sub(value, text)

    done, failed = [], False
    for step in action["runs"]["steps"]:
        if not _runs(step.get("if", "success()"), inputs, failed):
            continue
        if "uses" in step:
            outputs[step["id"]] = {"artifact-url": uploaded}
            continue
        assert step["shell"] == "bash"
        written = temp / "output"
        written.write_text("")
        env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(written)}
        env.update({key: substitute(str(value)) for key, value in step.get("env", {}).items()})
        script = substitute(step["run"])
        result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                                cwd=workspace, env=env, capture_output=True, text=True, timeout=300)
        outputs[step.get("id", "")] = dict(line.split("=", 1) for line in written.read_text().splitlines())
        done.append(result)
        failed = failed or result.returncode != 0
    return done


def _runs(condition: str, inputs: dict[str, str], failed: bool) -> bool:
    """A step's ``if``, in the forms action.yml writes: ``always()``, ``success()`` and
    ``inputs.NAME != ''``, joined by ``&&``."""
    terms = [term.strip() for term in condition.split("&&")]
    if failed and "always()" not in terms:
        return False
    for term in terms:
        if term not in ("always()", "success()"):
            name = re.fullmatch(r"inputs\.(\w+) != ''", term)
            assert name, f"a condition this test does not read: {term}"
            if inputs[name[1]] == "":
                return False
    return True


def test_action_yml_follows_the_github_action_schema():
    validate(yaml.safe_load((ROOT / "action.yml").read_text()), GITHUB_ACTION)


@pytest.mark.slow
def test_the_action_fails_on_a_tree_to_migrate_with_annotations_and_the_diff_in_the_summary(tmp_path):
    workspace, summary = tmp_path / "repo", tmp_path / "summary.md"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "train.py").write_bytes(TRAIN)
    install, preview, check = run_action(workspace, summary, install="", python=sys.executable, paths="src")
    assert install.returncode == 0 and preview.returncode == 0, install.stderr + preview.stderr
    assert check.returncode == 1  # the job fails: the tree needs migrating

    written = summary.read_text()
    assert written.startswith("## accrewrite (target runtime): 1 of 1 file needs migrating\n")
    diff = re.search(r"```diff\n(.*?)\n```", written, re.DOTALL)[1]
    assert "--- a/src/train.py" in diff and "+device = xm.xla_device()" in diff
    assert "-torch.manual_seed(0)" in diff and "+xm.set_rng_state(0)" in diff

    annotations = [parse(line) for line in check.stdout.splitlines()]
    assert ("error", {"file": "src/train.py", "line": "3", "title": "ACC001 rng-seed"},
            "would migrate: torch.manual_seed(0) -> the target's seed call") in annotations
    assert {level for level, _, _ in annotations} == {"error"}
    assert (workspace / "src" / "train.py").read_bytes() == TRAIN  # a check writes nothing


@pytest.mark.slow
def test_the_action_passes_on_a_migrated_tree_and_takes_its_target(tmp_path, cli):
    workspace, summary = tmp_path / "repo", tmp_path / "summary.md"
    workspace.mkdir()
    (workspace / "train.py").write_bytes(TRAIN)
    assert cli("migrate", "--in-place", "--target", "torch_xla", workspace / "train.py")[0] == 0
    steps = run_action(workspace, summary, install="", python=sys.executable, target="torch_xla")
    assert [step.returncode for step in steps] == [0, 0, 0], steps[-1].stderr
    assert summary.read_text() == "## accrewrite (target torch_xla): 1 file checked: nothing to migrate\n"
    assert steps[-1].stdout == ""


@pytest.mark.slow
def test_the_action_verifies_a_script_with_its_verdict_and_a_link_to_its_report_in_the_summary(tmp_path):
    workspace, summary = tmp_path / "repo", tmp_path / "summary.md"
    workspace.mkdir()
    (workspace / "train.py").write_text(SMALL_TRAINING)
    steps = run_action(workspace, summary, uploaded="https://github.invalid/artifacts/1", install="",
                       python=sys.executable, verify="train.py --steps 3")
    install, preview, check, verified, summarised = steps
    assert check.returncode == 1  # the tree needs migrating; verify runs all the same
    assert verified.returncode == 0, verified.stderr
    assert summarised.returncode == 0, summarised.stderr  # a match
    written = summary.read_text()
    assert "## accrewrite verify: match\n\nmatch: 3 steps within their tolerances" in written
    assert "[The report](https://github.invalid/artifacts/1)" in written
    assert "| 3 |" in written
    assert "<svg" in (tmp_path / "runner-temp" / "accrewrite-verify.html").read_text()
