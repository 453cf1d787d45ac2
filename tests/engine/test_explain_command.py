"""`accrewrite explain`: the rule's documentation rendered as Markdown."""

import re

import pytest

from accrewrite.registry import all_rules, find_rule


@pytest.fixture
def terminal(monkeypatch):
    """Output as a terminal gets it (rendered to its width), without colours; ``plain`` strips
    the bold and italics that remain."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("NO_COLOR", "1")


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_paragraphs_flow_and_examples_stay_code(cli, monkeypatch, terminal):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = cli("explain", "ACC006")
    out = plain(out)
    assert code == 0
    lines = [line.rstrip() for line in out.splitlines()]
    # The docstring breaks its lines at 100 columns; the terminal's width decides here.
    assert any("so the gradients are reduced explicitly:" in line for line in lines)
    for example in find_rule("ACC006").examples:
        for source in example.before.splitlines() + example.after.splitlines():
            if source.strip():
                assert any(line.strip() == source.strip() for line in lines), source
    assert "Example 1 (target torchacc)" in out and "``" not in out


def test_a_narrow_terminal_rewraps_paragraphs_not_code(cli, monkeypatch, terminal):
    monkeypatch.setenv("COLUMNS", "60")
    out = plain(cli("explain", "swin-window-process")[1])
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 60
    assert " shifted_x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))" in out  # the docstring's code block


def test_piped_it_is_the_markdown_itself_unpadded_and_rules_are_a_line_each(cli):
    out = cli("explain", "ACC006")[1]
    assert out.startswith("# ACC006 ") and "```python" in out
    assert "*Runs on a target that has `gradient_allreduce`: averages the gradients" in out  # the catalogue's words
    assert not [line for line in out.splitlines() if line != line.rstrip()]
    listed = cli("rules")[1].splitlines()
    assert len(listed) == len(all_rules()) and "…" not in "".join(listed)
    assert all(line == line.rstrip() for line in listed)
    assert any(line.startswith("ACC001  rng-seed ") and line.endswith(find_rule("ACC001").summary) for line in listed)


@pytest.mark.parametrize("code", list(all_rules()))
def test_rule_documentation_is_markdown(code):
    """Inline code in single backticks, code blocks fenced: no reStructuredText."""
    text = re.sub(r"^```.*?^```$", "", find_rule(code).documentation(), flags=re.MULTILINE | re.DOTALL)
    assert "``" not in text and not re.search(r"::\s*$", text, re.MULTILINE), code
