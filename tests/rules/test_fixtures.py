"""Golden fixtures (torchfix-style ``x.in.py`` -> ``x.<target>.out.py``), migrated with the default
rule selection on every target; those of ``fixtures/parallel`` (``x.in.py`` -> ``x.<kind>.out.py``,
commas in the kind written as ``_``) with ``--parallel`` on the runtime target. Set
ACCREWRITE_REGENERATE=1 to rewrite the goldens after an intended change, then review the diff."""

import io
import os
import tokenize
from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source
from accrewrite.registry import all_rules
from accrewrite.targets import all_targets

FIXTURES = Path(__file__).parent / "fixtures"
CASES = [
    (source, target)
    for source in sorted(FIXTURES.glob("*.in.py"))
    for target in all_targets()
]

# The kinds that tell the parallel rules apart: sharding alone, stages alone, every part that
# combines, and context parallel.
PARALLEL_CASES = [
    (source, kind)
    for source in sorted((FIXTURES / "parallel").glob("*.in.py"))
    for kind in ("fsdp", "pp", "fsdp,tp,pp", "cp")
]


def comments(code: bytes) -> list[str]:
    tokens = tokenize.tokenize(io.BytesIO(code).readline)
    return [token.string for token in tokens if token.type == tokenize.COMMENT]


@pytest.mark.parametrize("source, target", CASES, ids=[f"{s.name[:-6]}-{t}" for s, t in CASES])
def test_fixture(source, target):
    golden = source.with_name(source.name.replace(".in.py", f".{target}.out.py"))
    before = source.read_bytes()
    result = migrate_source(before, str(source), Options(target=target))
    assert result.error is None
    if os.environ.get("ACCREWRITE_REGENERATE"):
        golden.write_bytes(result.output)
    assert result.output.decode() == golden.read_text()
    # Each finding carries the code of the rule that gave it, so --select/--ignore act on it.
    names = {code: rule.name for code, rule in all_rules().items()}
    assert all(names[f.code] == f.name for f in (*result.fixes, *result.diagnostics, *result.withheld))
    compile(result.output, str(golden), "exec")
    # Fidelity: every comment survives; idempotency: a second run changes nothing.
    kept = comments(result.output)
    assert all(comment in kept for comment in comments(before))
    again = migrate_source(result.output, str(golden), Options(target=target))
    assert again.output == result.output and again.fixes == []


@pytest.mark.parametrize("source, kind", PARALLEL_CASES, ids=[f"{s.name[:-6]}-{k}" for s, k in PARALLEL_CASES])
def test_parallel_fixture(source, kind):
    golden = source.with_name(source.name.replace(".in.py", f".{kind.replace(',', '_')}.out.py"))
    options = Options(target="runtime", parallel=kind)
    result = migrate_source(source.read_bytes(), str(source), options)
    assert result.error is None
    if os.environ.get("ACCREWRITE_REGENERATE"):
        golden.write_bytes(result.output)
    assert result.output.decode() == golden.read_text()
    compile(result.output, str(golden), "exec")
    assert all(comment in comments(result.output) for comment in comments(source.read_bytes()))
    assert migrate_source(result.output, str(golden), options).output == result.output
