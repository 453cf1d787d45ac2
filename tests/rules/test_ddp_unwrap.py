"""ACC005 beyond its documented examples."""

import pytest

from accrewrite.engine import Options, migrate_source

HEAD = b'''import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
'''


@pytest.mark.parametrize("wrapping", [
    b"net = build_model()\nmodel = DDP(net.cuda(), device_ids=[0])\n",
    b"model = build_model()\nmodel = DDP(model.cuda(), device_ids=[0])\n",
    b"model = DDP(build_model().cuda(), device_ids=[0])\n",
])
@pytest.mark.parametrize("target", ["runtime", "torch_xla"])
def test_the_broadcast_reads_the_unwrapped_model_not_the_wrapped_expression_again(wrapping, target):
    """DDP(net.cuda()): the broadcast of rank 0's weights reads the variable the model is
    assigned to; ``xm.broadcast_master_param(net.cuda())`` moved the model to CUDA again (a second
    run migrated it), and DDP(build_model().cuda()) broadcast a model built for the purpose."""
    result = migrate_source(HEAD + wrapping, "t.py", Options(target=target))
    assert result.error is None
    output = result.output.decode()
    assert "xm.broadcast_master_param(model)\n" in output, output
    assert ".cuda()" not in output and output.count("build_model()") == 1, output
    again = migrate_source(result.output, "t.py", Options(target=target))
    assert again.error is None and again.output == result.output


def _migrated(source: str, target: str = "runtime"):
    result = migrate_source(source.encode(), "t.py", Options(target=target))
    assert result.error is None
    again = migrate_source(result.output, "t.py", Options(target=target))
    assert again.output == result.output and again.fixes == []
    return result


@pytest.mark.parametrize("load", [
    "model.load_state_dict(torch.load(path))\nmodel = torch.nn.DataParallel(model)\n",
    "model = torch.nn.DataParallel(model)\nmodel.module.load_state_dict(torch.load(path))\n",
])
def test_a_load_of_keys_without_the_wrappers_prefix_is_left_as_it_is(load):
    """Loaded before the wrap, or through ``.module``, the keys never had ``module.``."""
    output = _migrated(f"import torch\n\nmodel = Net()\n{load}").output.decode()
    assert "model.load_state_dict(torch.load(path))" in output and "removeprefix" not in output, output


def test_a_ddp_wrappers_checkpoint_loads_into_the_unwrapped_model():
    source = HEAD.decode() + "model = DDP(Net().cuda(), device_ids=[0])\nmodel.load_state_dict(torch.load(path))\n"
    output = _migrated(source, "torch_xla").output.decode()
    renamed = '{key.removeprefix("module."): value for key, value in torch.load(path).items()}'
    assert f"model.load_state_dict({renamed})" in output, output


def test_a_load_whose_state_dict_cannot_be_told_is_reported():
    result = _migrated("import torch\n\nmodel = torch.nn.DataParallel(Net())\nmodel.load_state_dict(**kwargs)\n")
    assert [(d.code, d.line) for d in result.diagnostics] == [("ACC005", 4)]
    assert "module." in result.diagnostics[0].message


@pytest.mark.parametrize("scale", [
    "args.batch_size *= n_gpu\n",
    "args.batch_size = args.batch_size * n_gpu\n",
    "batch_size = 32 * torch.cuda.device_count()\n",
])
def test_a_batch_scaled_by_the_gpu_count_is_reported_where_dataparallel_goes(scale):
    source = f"import torch\n\nn_gpu = torch.cuda.device_count()\n{scale}model = torch.nn.DataParallel(model)\n"
    result = _migrated(source)
    assert [(d.code, d.line) for d in result.diagnostics] == [("ACC005", 4)]


def test_a_batch_scaled_by_the_gpu_count_is_not_reported_where_the_file_runs_ddp():
    """Under DDP each process takes its share, so a device count there is of processes."""
    source = HEAD.decode() + "n_gpu = torch.cuda.device_count()\nbatch = 32 * n_gpu\n" + (
        "model = DDP(model, device_ids=[0]) if ddp else torch.nn.DataParallel(model)\n")
    assert not [d for d in _migrated(source).diagnostics if d.code == "ACC005"]
