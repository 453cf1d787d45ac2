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
