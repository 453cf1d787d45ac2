"""``accrewrite explain``: a rule's documentation as one Markdown document, which rich renders
(paragraphs wrapped to the terminal, examples as highlighted code blocks)."""

from __future__ import annotations

from accrewrite.concepts import CATALOGUE
from accrewrite.rule import Rule


def kind(rule: type[Rule]) -> str:
    if rule.diagnostic_only():
        return "diagnostic (reports, changes nothing)"
    fix = "safe fix" if rule.safe else "unsafe fix (applied with --unsafe-fixes or when selected by code)"
    return fix + ("; opt-in" if rule.opt_in else "")


def _code_block(code: str) -> str:
    fence = "````" if "```" in code else "```"  # a fence longer than any inside
    return f"{fence}python\n{code.rstrip()}\n{fence}"


def _needs(rule: type[Rule]) -> str:
    """The concepts a target must have for the rule to run there, as the catalogue or the rule
    defines them."""
    if not rule.concepts:
        return ""
    definitions = {**CATALOGUE, **{definition.name: definition for definition in rule.defines}}
    return "*Runs on a target that has " + "; ".join(
        f"`{name}`: {definitions[name].meaning}" for name in rule.concepts) + ".*"


def markdown(rule: type[Rule]) -> str:
    parts = [
        f"# {rule.code} {rule.name}",
        rule.summary,
        f"*{kind(rule)}; targets: {', '.join(rule.supported_targets())}*",
        _needs(rule),
        rule.documentation(),
    ]
    for number, example in enumerate(rule.examples, start=1):
        together = f", with {', '.join(example.with_rules)}" if example.with_rules else ""
        together += f", --parallel {example.parallel}" if example.parallel else ""
        parts.append(f"## Example {number} (target {example.target}{together})")
        parts += ["Before:", _code_block(example.before)]
        if example.after != example.before:
            parts += ["After:", _code_block(example.after)]
        if example.diagnostics:
            reports = (f"{code} at line {line}" for code, _, line in (d.partition(":") for d in example.diagnostics))
            parts.append("Reports: " + ", ".join(reports))
    return "\n\n".join(part for part in parts if part)
