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
from engine_scripts import TRAIN
from schemas import GITHUB_ACTION, validate
from workflow_commands import parse

ROOT = Path(__file__).resolve().parents[2]
EXPRESSION = re.compile(r"\$\{\{\s*(inputs\.(\w+)|github\.action_path)\s*\}\}")


def run_action(workspace: Path, summary: Path, **given) -> list[subprocess.CompletedProcess]:
    """Run the steps in order until one fails; returns what each step that ran did."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    inputs = {name: spec.get("default", "") for name, spec in action["inputs"].items()}
    inputs.update(given)

    def substitute(text: str) -> str:
        def value(match):
            return str(ROOT) if match[1] == "github.action_path" else inputs[match[2]]

        return EXPRESSION.sub(value, text)

    done = []
    for step in action["runs"]["steps"]:
        assert step["shell"] == "bash"
        env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary)}
        env.update({key: substitute(str(value)) for key, value in step.get("env", {}).items()})
        script = substitute(step["run"])
        result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                                cwd=workspace, env=env, capture_output=True, text=True, timeout=300)
        done.append(result)
        if result.returncode != 0:
            break
    return done


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
