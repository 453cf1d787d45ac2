"""`accrewrite explain`: the rule's documentation rendered as Markdown."""

import re

import pytest

from accrewrite.registry import all_rules, find_rule


def test_paragraphs_flow_and_examples_stay_code(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = cli("explain", "ACC006")
    assert code == 0
    lines = [line.rstrip() for line in out.splitlines()]
    # The docstring breaks its lines at 100 columns; the terminal's width decides here.
    assert any("so the gradients are reduced explicitly:" in line for line in lines)
    for example in find_rule("ACC006").examples:
        for source in example.before.splitlines() + example.after.splitlines():
            if source.strip():
                assert any(line.strip() == source.strip() for line in lines), source
    assert "Example 1 (target torchacc)" in out and "``" not in out


def test_a_narrow_terminal_rewraps_paragraphs_not_code(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    out = cli("explain", "swin-window-process")[1]
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 60
    assert " shifted_x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))" in out  # the docstring's code block


@pytest.mark.parametrize("code", list(all_rules()))
def test_rule_documentation_is_markdown(code):
    """Inline code in single backticks, code blocks fenced: no reStructuredText."""
    text = re.sub(r"^```.*?^```$", "", find_rule(code).documentation(), flags=re.MULTILINE | re.DOTALL)
    assert "``" not in text and not re.search(r"::\s*$", text, re.MULTILINE), code
