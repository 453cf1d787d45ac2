"""What Lightning and Accelerate scripts are told on each target (ACC018, ACC019), beside the
diagnostics every script gets (ACC101 in a LightningModule's training_step): the golden fixtures'
findings, line by line."""

from pathlib import Path

import pytest

from accrewrite.engine import Options, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"

FINDINGS = {
    "lightning_trainer": {
        # sync_dist and .item() in training_step; the launch note on the migrated Trainer
        "torch_xla": ([("ACC101", 22), ("ACC101", 24), ("ACC018", 35)], [("ACC018", 35)]),
        # no Lightning accelerator: the Trainer is left, and said so once
        "runtime": ([("ACC101", 24), ("ACC018", 35)], []),
        "torchacc": ([("ACC101", 24), ("ACC018", 35)], []),
    },
    "lightning_legacy": {
        # sync_batchnorm removed, the launch note; DDP on one device no longer shuffles; a strategy variable
        "torch_xla": ([("ACC018", 24), ("ACC018", 24), ("ACC018", 27)],
                      [("ACC018", 24), ("ACC018", 27), ("ACC018", 33)]),
        "runtime": ([("ACC018", 24)], []),
        "torchacc": ([("ACC018", 24)], []),
    },
    "lightning_cli": {
        # a LightningCLI subclass, a Trainer subclass, **vars(args), from_argparse_args, an accelerator option,
        # LightningCLI
        "torch_xla": ([("ACC018", 10), ("ACC018", 15), ("ACC018", 26), ("ACC018", 31), ("ACC018", 36),
                       ("ACC018", 41)], []),
        "runtime": ([("ACC018", 10)], []),
        "torchacc": ([("ACC018", 10)], []),
    },
    "lightning_fabric": {
        # Fabric is left, with what to change (its setup order too); .item() in the loop
        "torch_xla": ([("ACC018", 9), ("ACC101", 20)], []),
        "runtime": ([("ACC018", 9), ("ACC101", 20)], []),
        "torchacc": ([("ACC018", 9), ("ACC101", 20)], []),
    },
    "accelerate_fp16": {
        # how to launch, .item() in evaluation, a precision from an option, .cuda()
        "torch_xla": ([("ACC019", 11), ("ACC101", 33), ("ACC019", 42), ("ACC019", 43)], [("ACC019", 11)]),
        "runtime": ([("ACC019", 11), ("ACC101", 33)], []),
        "torchacc": ([("ACC019", 11), ("ACC101", 33)], []),
    },
}
CASES = [(name, target) for name, targets in FINDINGS.items() for target in targets]


@pytest.mark.parametrize("name, target", CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_a_framework_script_gets_its_findings_on_every_target(name, target):
    result = migrate_source((FIXTURES / f"{name}.in.py").read_bytes(), f"{name}.py", Options(target=target))
    diagnostics, fixes = FINDINGS[name][target]
    assert [(d.code, d.line) for d in result.diagnostics] == diagnostics
    assert [(f.code, f.line) for f in result.fixes] == fixes
    assert all(d.help.endswith(".") for d in result.diagnostics)


def test_rpc_training_is_still_left_to_the_diagnostics():
    source = b"import torch\nimport torch.distributed.rpc as rpc\n\nmodel = Net().cuda()\nrpc.init_rpc('w', rank=0)\n"
    result = migrate_source(source, "train.py", Options(target="torch_xla"))
    assert result.output == source and [(d.code, d.line) for d in result.diagnostics] == [("ACC107", 2)]
