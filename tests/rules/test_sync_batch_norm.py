"""ACC016 beyond its examples: imports by name split with their comments kept, what the removed
conversion leaves, and the findings where the target has no synchronized batch norm."""

import textwrap

from accrewrite.engine import Options, migrate_source


def _migrated(source: str, target: str):
    result = migrate_source(textwrap.dedent(source).encode(), "model.py", Options(target=target, select=("ACC016",)))
    assert result.error is None
    return result.output.decode(), [(d.code, d.line, d.message) for d in result.diagnostics]


def test_an_import_by_name_is_split_and_keeps_its_comments():
    output, _ = _migrated("""
        from torch.nn import (
            BatchNorm2d,
            SyncBatchNorm as SBN,  # one statistic over every GPU
        )
        from torch.nn import SyncBatchNorm, GroupNorm  # norms

        layer = SBN(3) if sync else BatchNorm2d(3)
        """, "runtime")
    assert output == textwrap.dedent("""
        from accrewrite.runtime.nn import SyncBatchNorm as SBN  # one statistic over every GPU
        from torch.nn import (
            BatchNorm2d,
        )
        from accrewrite.runtime.nn import SyncBatchNorm
        from torch.nn import GroupNorm  # norms

        layer = SBN(3) if sync else BatchNorm2d(3)
        """)
    again, _ = _migrated(output, "runtime")
    assert again == output


def test_the_removed_conversion_leaves_the_module_and_the_comments():
    output, found = _migrated("""
        import torch.nn as nn

        # one statistic over every GPU
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # SyncBN
        nn.SyncBatchNorm.convert_sync_batchnorm(net)
        head = nn.SyncBatchNorm.convert_sync_batchnorm(a if b else c).to(device)
        other = nn.SyncBatchNorm.convert_sync_batchnorm(module=m, process_group=group)
        """, "torch_xla")
    assert output == textwrap.dedent("""
        import torch.nn as nn

        # one statistic over every GPU
        pass  # SyncBN
        head = (a if b else c).to(device)
        other = m
        """)
    assert [(code, line) for code, line, _ in found] == [("ACC016", line) for line in (5, 6, 7, 8)]
    assert all("per replica" in message for _, _, message in found)


def test_without_a_synchronized_batch_norm_its_other_uses_are_reported():
    output, found = _migrated("""
        import torch.nn as nn
        from torch.nn import SyncBatchNorm

        def backbone(sync_bn):
            return ResNet(norm_layer=nn.SyncBatchNorm if sync_bn else nn.BatchNorm2d)

        def has_batchnorms(model):
            return any(isinstance(m, (nn.BatchNorm2d, nn.SyncBatchNorm)) for m in model.modules())
        """, "torch_xla")
    assert "SyncBatchNorm" in output and "accrewrite" not in output
    assert [(line, message.split(":")[0]) for _, line, message in found] == [
        (3, "`SyncBatchNorm` is imported from torch by name"),
        (6, "`nn.SyncBatchNorm` is passed as a value"),
    ]


def test_a_build_by_name_refuses_the_file():
    source = "from torch.nn import SyncBatchNorm\n\nnorm = SyncBatchNorm(8).cuda()\n"
    output, found = _migrated(source, "torchacc")
    assert output == source
    assert [(line, message.split(",")[0]) for _, line, message in found] == [
        (3, "`SyncBatchNorm(...)` builds a SyncBatchNorm")
    ]
