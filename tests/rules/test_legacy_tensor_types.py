"""ACC027 beyond its examples: each spelling, run migrated (runtime, on this CPU) beside the
original, makes the same tensor (values, dtype, device, requires_grad, graph); the shapes it
cannot tell are left with a diagnostic, and on the XLA targets the file is left as it is."""

import numpy as np
import pytest
import torch

from accrewrite.engine import Options, migrate_source

HEADER = """\
import numpy as np
import torch
from torch.autograd import Variable

cuda = True if torch.cuda.is_available() else False
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
LongTensor = torch.cuda.LongTensor if cuda else torch.LongTensor
x = torch.arange(6.0).view(3, 2).requires_grad_()
y = x * 2
"""


def migrated(lines: str, target: str = "runtime", select=("ACC027",)):
    result = migrate_source((HEADER + lines).encode(), "gan.py", Options(target=target, select=select))
    assert result.error is None
    return result


def made(source: str) -> dict:
    """The tensors ``source`` leaves in ``t``, ``u``: what each is, as far as a run can see."""
    namespace = {}
    np.random.seed(0)
    exec(compile(source, "gan.py", "exec"), namespace)
    return {name: (namespace[name].dtype, namespace[name].device, namespace[name].requires_grad,
                   namespace[name].is_leaf, namespace[name].shape, namespace[name].detach().tolist())
            for name in ("t", "u") if name in namespace}


@pytest.mark.parametrize("lines, spelled", [
    ("t = Variable(Tensor(x.size(0), 1).fill_(1.0), requires_grad=False)",
     "t = torch.empty(x.size(0), 1, dtype=torch.float32, device=xm.xla_device()).fill_(1.0)"),
    ("t = Tensor(x.shape[0], *x.shape).zero_()",
     "t = torch.empty(x.shape[0], *x.shape, dtype=torch.float32, device=xm.xla_device()).zero_()"),
    ("t = Variable(Tensor(np.random.normal(0, 1, (3, 4))))",
     "t = torch.tensor(np.random.normal(0, 1, (3, 4)), dtype=torch.float32, device=xm.xla_device())"),
    ("labels = np.array([0, 1, 2])\nt = Variable(LongTensor(labels))",
     "t = torch.tensor(labels, dtype=torch.int64, device=xm.xla_device())"),
    ("n = x.shape[0]\nt = LongTensor(n).fill_(7)",
     "t = torch.empty(n, dtype=torch.int64, device=xm.xla_device()).fill_(7)"),
    ("t = Variable(LongTensor(np.random.randint(0, 10, 5)))",
     "t = torch.tensor(np.random.randint(0, 10, 5), dtype=torch.int64, device=xm.xla_device())"),
    ("t = LongTensor(tuple(map(lambda s: s is not None, [1, None, 2])))",
     "t = torch.tensor(tuple(map(lambda s: s is not None, [1, None, 2])), dtype=torch.int64, device=xm.xla_device())"),
    ("t = Tensor([[1, 2], [3, 4]])",
     "t = torch.tensor([[1, 2], [3, 4]], dtype=torch.float32, device=xm.xla_device())"),
    ("t = Variable(torch.arange(4).type(Tensor))", "t = torch.arange(4).to(xm.xla_device(), torch.float32)"),
    ("t = torch.cuda.ByteTensor(2, 3).fill_(1) if cuda else torch.ones(2, 3, dtype=torch.uint8)",
     "t = torch.empty(2, 3, dtype=torch.uint8, device=xm.xla_device()).fill_(1) if cuda else "
     "torch.ones(2, 3, dtype=torch.uint8)"),
    # Variable detaches: a tensor with a graph keeps the detach, requires_grad is set after it
    ("t = Variable(y)", "t = y.detach()"),
    ("t = Variable(y, requires_grad=True)", "t = y.detach().requires_grad_()"),
    ("t = Variable(x.data.type(Tensor), requires_grad=True)",
     "t = x.data.to(xm.xla_device(), torch.float32).detach().requires_grad_()"),
    ("t = Variable(Tensor(np.ones((3, 1))), requires_grad=True)",
     "t = torch.tensor(np.ones((3, 1)), dtype=torch.float32, device=xm.xla_device()).requires_grad_()"),
    ("t = Variable(y * 3, requires_grad=x.requires_grad)", "t = (y * 3).detach().requires_grad_(x.requires_grad)"),
])
def test_each_spelling_makes_the_same_tensor(lines, spelled):
    result = migrated(lines + "\n")
    output = result.output.decode()
    assert spelled in output.splitlines() and not result.diagnostics
    assert "Tensor = " not in output and "LongTensor = " not in output
    assert made(output) == made(HEADER + lines + "\n")


def test_a_type_chosen_by_a_tensors_device_follows_that_tensor():
    source = ("import numpy as np\nimport torch\nfrom torch.autograd import Variable\n\n"
              "def noise(mu):\n    Tensor = torch.cuda.FloatTensor if mu.is_cuda else torch.FloatTensor\n"
              "    return Variable(Tensor(np.random.normal(0, 1, mu.shape)))\nt = noise(torch.ones(3, 2))\n")
    result = migrate_source(source.encode(), "unit.py", Options(target="torch_xla", select=("ACC027",)))
    body = "    return torch.tensor(np.random.normal(0, 1, mu.shape), dtype=torch.float32, device=mu.device)"
    assert result.output.decode().splitlines()[4:] == ["def noise(mu):", body, "t = noise(torch.ones(3, 2))"]
    assert made(result.output.decode()) == made(source)


@pytest.mark.parametrize("lines, line, message", [
    ("def noise(values):\n    return Tensor(values)\n", 11, "`Tensor(values)` may take sizes or data"),
    ("print(isinstance(x, torch.cuda.FloatTensor))\n", 10, "`torch.cuda.FloatTensor` is used where no device"),
    ("def make(kind):\n    return kind(3)\nt = make(LongTensor)\n", 12, "`LongTensor` is used where no device"),
])
def test_what_cannot_be_spelled_with_a_device_stays_and_is_reported(lines, line, message):
    result = migrated(lines)
    assert all(line in result.output.decode().splitlines() for line in lines.splitlines())
    assert any(d.code == "ACC027" and d.line == line and d.message.startswith(message) for d in result.diagnostics)
    left = migrated(lines, target="torch_xla", select=())
    assert left.output == (HEADER + lines).encode() and not left.fixes
    assert {d.code for d in left.diagnostics} == {"ACC027"}
    assert all(d.message.endswith("file left as it is") for d in left.diagnostics)


@pytest.mark.parametrize("alias, why", [
    ("T = torch.cuda.FloatTensor if cuda else torch.FloatTensor\nt = T(2, 3)\n",
     "`T` names a legacy type under a name the migration does not follow"),
    ("Tensor = torch.cuda.FloatTensor if opt.cuda else torch.FloatTensor\nt = Tensor(2, 3)\n",
     "`Tensor` is not always one legacy type chosen by CUDA's availability"),
    ("Tensor = torch.cuda.FloatTensor if cuda else torch.LongTensor\nt = Tensor(2, 3)\n",
     "`Tensor` is not always one legacy type chosen by CUDA's availability"),
])
def test_an_alias_the_migration_cannot_follow_stays(alias, why):
    result = migrated(alias)
    assert all(line in result.output.decode().splitlines() for line in alias.splitlines())
    assert why in [d.message for d in result.diagnostics]


def test_acc002_refuses_the_types_where_acc027_does_not_run():
    lines = "t = Tensor(2, 3)\n"
    assert "t = Tensor(2, 3)" not in migrated(lines, target="torch_xla", select=()).output.decode()
    result = migrated(lines, target="torch_xla", select=("ACC002",))
    assert result.output == (HEADER + lines).encode()
    assert {d.code for d in result.diagnostics} == {"ACC002"}


def test_on_the_cpu_the_runtime_makes_cpu_tensors_as_the_original_did():
    """The runtime's device is the CPU where CUDA is not available, as the original's types were."""
    output = migrated("t = Tensor(2, 3).fill_(0.5)\n").output.decode()
    assert made(output)["t"][1] == torch.device("cpu") == made(HEADER + "t = Tensor(2, 3).fill_(0.5)\n")["t"][1]


def test_a_conversion_to_a_cuda_type_is_a_move_for_the_device_loader():
    """``imgs.type(Tensor)`` copies the batch onto CUDA, as the ``.to(device, torch.float32)`` it
    becomes does: a host tensor mixed with it afterwards (clustergan's gradient penalty) is no use
    of the batch on the host, and the loop reads the device loader from the first migration on."""
    source = HEADER + (
        "from torch.utils.data import DataLoader\n"
        "def penalty(real):\n    alpha = torch.rand(real.size(0), 1)\n    return alpha.expand_as(real).cuda() * real\n"
        "model = torch.nn.Linear(2, 1).cuda()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(dataset, batch_size=4)\nfor imgs, _ in loader:\n    real_imgs = Variable(imgs.type(Tensor))\n"
        "    model(penalty(real_imgs)).sum().backward()\n    optimizer.step()\n")
    once = migrate_source(source.encode(), "gan.py", Options(target="torch_xla"))
    assert "    real_imgs = imgs.to(torch.float32)" in once.output.decode().splitlines()
    assert "for imgs, _ in pl.MpDeviceLoader(loader, torch_xla.device()):" in once.output.decode().splitlines()
    assert migrate_source(once.output, "gan.py", Options(target="torch_xla")).output == once.output
