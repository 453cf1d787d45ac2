"""Every rule's documented before/after examples, run as tests (as Fixit does)."""

import pytest

from accrewrite.engine import Options, migrate_source
from accrewrite.registry import all_rules

EXAMPLES = [(rule, number, example) for rule in all_rules().values() for number, example in enumerate(rule.examples)]


def test_every_rule_documents_itself():
    for rule in all_rules().values():
        assert rule.code and rule.name and rule.summary and rule.documentation(), rule
        assert rule.examples, f"{rule.code} has no before/after example"
        assert rule.supported_targets(), f"{rule.code} runs on no target"


@pytest.mark.parametrize(
    "rule, number, example", EXAMPLES, ids=[f"{rule.code}-{number}" for rule, number, _ in EXAMPLES]
)
def test_example(rule, number, example):
    options = Options(target=example.target, select=(rule.code, *example.with_rules), parallel=example.parallel)
    result = migrate_source(example.before.encode(), f"{rule.code}-example-{number}.py", options)
    assert result.error is None
    assert result.output.decode() == example.after
    assert all(finding.code in (rule.code, *example.with_rules) for finding in (*result.fixes, *result.diagnostics))
    assert any(finding.code == rule.code for finding in (*result.fixes, *result.diagnostics))
    # A fix rule's example shows a fix; a diagnostic rule's shows the findings it reports.
    assert result.fixes or example.diagnostics
    if example.diagnostics:
        assert [f"{d.code}:{d.line}" for d in result.diagnostics] == list(example.diagnostics)
    compile(result.output, "after.py", "exec")
    assert migrate_source(result.output, "after.py", options).output == result.output
