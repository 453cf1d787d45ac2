"""The project speaks of itself in its own words: no output, document, comment or docstring
cites a source document or a tracker issue by its number, or a design page outside the
repository. It says what the thing is ("TorchAcc's migration guide, step 4")."""

import json
import re
from pathlib import Path

import pytest

from accrewrite.registry import all_rules

ROOT = Path(__file__).resolve().parents[2]
CITATIONS = [
    re.compile(r"seed[ _-]?0\d\d", re.IGNORECASE),
    re.compile(r"\bissue \d+", re.IGNORECASE),
    re.compile(r"\bDESIGN\.md\b"),  # the design page outside the repository (docs/design.md is ours)
]
# Where the project's words are: its documents, its code's comments and docstrings, its tests.
TEXT = (".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg")
SCANNED = ["README.md", "action.yml", "pyproject.toml", "setup.py", ".pre-commit-hooks.yaml", "docs",
           "accrewrite", "rules", "runtime", "kernels", "examples", "benchmarks", "tests"]


def citations(text: str) -> list[str]:
    return [match.group(0) for pattern in CITATIONS for match in pattern.finditer(text)]


def project_files():
    for name in SCANNED:
        path = ROOT / name
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in TEXT)
        yield from (p for p in found if p != Path(__file__).resolve() and "__pycache__" not in p.parts)


def test_the_patterns_catch_what_they_are_for():
    seed, issue = "Seed " + "001", "issue " + "5"  # spelled apart: this file cites nothing either
    assert citations(f"{seed}, step 4.") == [seed]
    assert citations(f"Goal ({issue}): 2x") == [issue]
    assert citations("see DESIGN.md") == ["DESIGN.md"] and citations("docs/design.md") == []
    assert citations("torch.manual_seed(0) with seed 0") == []


def test_no_file_of_the_project_cites_them():
    found = {}
    for path in project_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for line_number, line in enumerate(text.splitlines(), start=1):
            if citations(line):
                found[f"{path.relative_to(ROOT)}:{line_number}"] = line.strip()
    assert not found, "\n".join(f"{where}: {line}" for where, line in found.items())


@pytest.mark.slow
def test_no_output_cites_them(cli):
    outputs = [cli("rules")[1], cli("rules", "--format", "json")[1]]
    outputs += [cli("explain", code)[1] for code in all_rules()]
    for command in ("migrate", "rules", "explain", "verify"):
        with pytest.raises(SystemExit):
            cli(command, "--help")
    examples = ROOT / "examples"
    for target in ("runtime", "torchacc", "torch_xla"):
        outputs.append(cli("migrate", "--format", "json", "--target", target, examples)[1])
        outputs.append(cli("migrate", "--output-format", "full", "--target", target, examples)[1])
    assert json.loads(outputs[1]) and all(outputs)
    found = [citation for output in outputs for citation in citations(output)]
    assert not found
