"""Scripts whose migration a second run changed (found by benchmarks/fuzz.py): the first run
must leave nothing for the second."""

import pytest

from accrewrite.engine import Options, migrate_source

IMPORTS_BELOW = b'''def build(model):
    scaler = torch.cuda.amp.GradScaler()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return scaler, optimizer


import torch
'''


@pytest.mark.parametrize("target", ["runtime", "torch_xla", "torchacc"])
def test_a_function_above_the_imports_is_migrated_at_once(target):
    """The first run saw no GradScaler (torch was not imported yet where it was made); the
    second, with the migrated scaler's import at the top, swapped the optimizer (ACC008)."""
    result = migrate_source(IMPORTS_BELOW, "t.py", Options(target=target))
    assert result.error is None and result.changed
    again = migrate_source(result.output, "t.py", Options(target=target))
    assert again.error is None and again.output == result.output
    if target == "runtime":
        assert b"syncfree.SGD(" in result.output
