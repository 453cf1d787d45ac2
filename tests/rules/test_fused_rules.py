"""The fused-replacement rules beyond their documented examples."""

import pytest

from accrewrite.engine import Options, migrate_source

SOURCE = b"""import torch
import torch.nn as nn

norm = nn.LayerNorm(8)
act = nn.GELU()
optimizer = torch.optim.Adam(params, lr=1e-3)
"""


def migrate(source, **options):
    return migrate_source(source, "model.py", Options(**options))


@pytest.mark.parametrize("code", ["ACC020", "ACC021", "ACC022"])
def test_a_target_without_the_fused_module_runs_nothing_and_says_nothing_per_node(code):
    result = migrate(SOURCE, target="torch_xla", select=(code,))
    assert not result.changed and not result.fixes and not result.diagnostics
    assert [rule.code for rule in Options(target="torch_xla", select=(code,)).unavailable()] == [code]


def test_only_rules_selected_by_exact_code_are_unavailable():
    assert Options(target="torch_xla").unavailable() == []
    assert Options(target="torch_xla", select=("ACC02",)).unavailable() == []
    assert [rule.code for rule in Options(target="torch_xla", select=("fused-adam", "ACC002")).unavailable()] == ["ACC021"]
    # By default every LayerNorm on torch_xla went unmentioned, not one note per module.
    assert not migrate(SOURCE, target="torch_xla").diagnostics


def test_unsafe_quick_gelu_is_offered_not_applied_by_default():
    result = migrate(SOURCE)
    assert b"nn.GELU()" in result.output
    assert [fix.code for fix in result.withheld] == ["ACC022"]
    assert b"QuickGelu()" in migrate(SOURCE, unsafe_fixes=True).output


def test_fused_adam_only_without_a_scaler():
    with_scaler = SOURCE + b"scaler = torch.cuda.amp.GradScaler()\n"
    result = migrate(with_scaler, select=("ACC021",))
    assert not result.changed


def test_torchacc_hooks_run_once_before_torch_and_are_idempotent():
    result = migrate(SOURCE, target="torchacc", select=("ACC020", "ACC021"))
    text = result.output.decode()
    assert text.startswith(
        "from torchacc.runtime import hooks\nhooks.enable_fused_layer_norm()\nhooks.enable_fused_adam()\n"
        "import torch\n"
    )
    again = migrate(result.output, target="torchacc", select=("ACC020", "ACC021"))
    assert again.output == result.output


def test_dropout_add_keeps_plain_additions():
    source = b"""import torch.nn as nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.act = nn.ReLU()

    def forward(self, x, y):
        return x + self.act(y)
"""
    assert not migrate(source, select=("ACC023",)).changed


def test_window_process_needs_swin_dimension_names():
    source = b"""import torch

def forward(x, s, ws):
    shifted = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
    windows = window_partition(shifted, ws)
    return windows
"""
    assert not migrate(source, select=("ACC024",)).changed


def test_loader_without_workers_is_diagnosed():
    source = b"import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=8)\n"
    result = migrate(source, select=("ACC012",))
    assert b"pin_memory=torch.cuda.is_available()" in result.output
    (diagnostic,) = result.diagnostics
    assert diagnostic.line == 2 and "num_workers" in diagnostic.message
    assert not migrate(source, target="torchacc", select=("ACC012",)).changed
