"""ACC033 beyond its examples: a running sum stays on the device only where every read of it
takes a tensor as it took a number; elsewhere the read stays, and ACC101 reports it."""

import math
import textwrap

import pytest
import torch

from accrewrite.engine import Options, migrate_source

HEADER = """\
import math
import torch

criterion = torch.nn.CrossEntropyLoss()
model = torch.nn.Linear(4, 4).cuda()


class Meter:
    def __init__(self):
        self.sum, self.count = 0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def train(loader, top1=Meter()):
"""


def migrated(body: str):
    source = HEADER + textwrap.indent(textwrap.dedent(body), "    ")
    result = migrate_source(source.encode(), "train.py", Options(target="torch_xla", select=("ACC033", "ACC101")))
    assert result.error is None
    return source, result


def loop(*lines: str, before: str = "total = 0.\n", after: str = "") -> str:
    step = "loss = criterion(model(x), y)\nloss.backward()\noptimizer.step()\n"
    body = textwrap.indent(step + "".join(f"{line}\n" for line in lines), "    ")
    return f"{before}for x, y in loader:\n{body}{after}"


KEPT = [
    # read formatted, by math, through arithmetic assigned to a name
    loop("total += loss.item()", "if step % 10 == 0:", "    cur = total / 10", "    print(f'{cur:.3f} {math.exp(cur):.2f}')",
         "    total = 0"),
    loop("total += float(loss)", "print('%.4f' % (total / 2))"),
    # read, then set anew before the next addition
    loop("if step % 10 == 0:", "    print(f'{total:.2f}')", "    total = 0", "total += loss.item()"),
    loop("total += loss.item() * x.size(0)", "print('{:.2f}'.format(total))"),
    loop("total += loss.mean().item()", "print('{:.2f}'.format(int(total)))"),
    loop("total += torch.nn.functional.cross_entropy(model(x), y).item()", "print(f'{total}')"),
    # formatted once after the loop, as well as in it
    loop("total += loss.item()", "if step % 10 == 0:", "    print(f'{total / 10:.3f}')",
         after="print(f'epoch: {total / len(loader):.6f}')\n"),
]
LEFT = [
    # printed whole: a tensor prints as `tensor(...)`
    loop("total += loss.item()", "print(total)"),
    loop("total += loss.item()", "print('%s' % total)"),
    loop("total += loss.item()", "print('{!r}'.format(total))"),
    # assigned after the loop, returned, compared, passed on, kept in a list
    loop("total += loss.item()", after="avg = total / 2\nprint(f'{avg:.2f}')\n"),
    loop("total += loss.item()", after="return total\n"),
    loop("total += loss.item()", "if total > 3:", "    break"),
    loop("total += loss.item()", "log(total)"),
    loop("total += loss.item()", "history.append(total)"),
    # read before this step's addition: a step closure given the sum would see it added
    loop("if step % 10 == 0:", "    print(f'{total:.2f}')", "total += loss.item()"),
    # bound to something else on a path
    loop("total += loss.item()", "print(f'{total:.2f}')", before="total = start\n"),
    # a read of a tensor that may hold more than one value in a 0-d tensor ([1]: formatting fails)
    loop("total += y[:1].float().item()", "print(f'{total:.2f}')"),
    loop("total += torch.nn.CrossEntropyLoss(reduction='none')(model(x), y).sum(0, keepdim=True).item()",
         "print(f'{total:.2f}')"),
    # a meter of a class the script never gives a tensor, or whose instance is read otherwise
    loop("meter.update(loss.item())", before="meter = Meter()\n"),
    loop("meter.update(loss.item())", "top1.update(loss.detach())", "print(meter.sum)",
         before="meter = Meter()\ntop1 = Meter()\n"),
    loop("meter.update(loss.item())", "top1.update(loss.detach())", after="return meter\n",
         before="meter = Meter()\ntop1 = Meter()\n"),
]


@pytest.mark.parametrize("body", KEPT)
def test_a_sum_read_as_a_number_stays_on_the_device(body):
    source, result = migrated(body)
    output = result.output.decode()
    assert ".item()" not in output.split("def train")[1] and "float(loss)" not in output
    assert "loss.detach()" in output or ".mean().detach()" in output or ").detach()" in output
    assert [f.code for f in result.diagnostics] == []


@pytest.mark.parametrize("body", LEFT)
def test_a_sum_read_otherwise_keeps_its_read(body):
    source, result = migrated(body)
    assert result.output.decode() == source
    assert "ACC101" in [f.code for f in result.diagnostics]


def test_a_meter_beside_one_given_tensors_holds_tensors():
    body = loop("meter.update(loss.item(), x.size(0))", "top1.update((model(x).argmax(1) == y).float().mean())",
                "print(f'{meter.avg:.4f}')", "meters = [meter, top1]",
                before="meter = Meter()\ntop1 = Meter()\n")
    source, result = migrated(body)
    assert "meter.update(loss.detach(), x.size(0))" in result.output.decode()


@pytest.mark.parametrize("spec", ["{:.4f}", "{:5.2f}", "{:.3e}", "{}", "{:g}"])
def test_a_0d_tensor_formats_as_the_float_it_holds(spec):
    # What the kept sums rely on: torch formats a 0-d tensor as its value, and math reads it.
    values = [0.7312, 1.25, 2.0004]
    number, tensor = 0., 0.
    for value in values:
        number += value
        tensor += torch.tensor(value, dtype=torch.float64)
    assert spec.format(tensor) == spec.format(number)
    assert "%.4f" % tensor == "%.4f" % number
    assert math.exp(tensor / 3) == pytest.approx(math.exp(number / 3))
