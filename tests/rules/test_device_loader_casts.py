"""ACC003 beyond its examples: a batch move it removes keeps every effect but the move (the
batch's dtype, memory format, a copy), and one whose arguments it cannot tell stays whole. What
the loop is left with is run against the original line on this CPU, where the move is to the
CPU: the same values, dtypes and strides."""

import pytest
import torch

from accrewrite.engine import Options, migrate_source

HEADER = """\
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
model = torch.nn.Linear(4, 3).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(dataset, batch_size=8)
for x, y in loader:
"""
STEP = """\
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
"""
CONVERTED = [
    ("x = x.to(device, torch.float16)", "x = x.to(torch.float16)"),
    ("x = x.to(device=device, dtype=model_dtype)", "x = x.to(dtype=model_dtype)"),
    ("x = x.to(dtype=model_dtype, device=device, non_blocking=True)", "x = x.to(dtype=model_dtype)"),
    ("x = x.to(device, torch.float16, True)", "x = x.to(torch.float16)"),
    ("x = x.to(device, torch.float16, False, True)", "x = x.to(torch.float16, copy=True)"),
    ("x = x.to(device, copy=True)", "x = x.to(copy=True)"),
    ("x = x.to(device, non_blocking=True, memory_format=torch.channels_last)",
     "x = x.to(memory_format=torch.channels_last)"),
    ("x = x.cuda(non_blocking=True, memory_format=torch.channels_last)", "x = x.to(memory_format=torch.channels_last)"),
    ("x = x.cuda().half()", "x = x.half()"),
    ("x = x.to(device).float()", "x = x.float()"),
    ("x = x.to(y.device, y.dtype)", "x = x.to(y.dtype)"),
    ("x, y = x.to(device=device, dtype=model_dtype), y.to(device=device)", "x = x.to(dtype=model_dtype)"),
    ("x, y = x.to(device), y.to(device, torch.float64)", "y = y.to(torch.float64)"),
    ("x, y, z = x.to(device, torch.float16), y.to(device), y.to(device, torch.float16)",
     "x, z = x.to(torch.float16), y.to(torch.float16)"),
    ("x = {k: v.to(device, torch.float16, non_blocking=True) for k, v in x.items()}",
     "x = {k: v.to(torch.float16) for k, v in x.items()}"),
    ("x = [t.to(device, dtype=torch.float64) for t in x]", "x = [t.to(dtype=torch.float64) for t in x]"),
    # The DataLoader's list of tensors becomes a tuple.
    ("x = tuple(t.to(device, non_blocking=True) for t in x)", "x = tuple(t for t in x)"),
    ("x = x.to(device,\n             dtype=torch.float16,\n             non_blocking=True)",
     "x = x.to(dtype=torch.float16)"),
]
REMOVED = [
    "x = x.to(device, non_blocking=True)",
    "x = x.to(device, copy=False)",
    "x, y = x.cuda(0, True), y.to(device)",
    "x = list(t.to(device, non_blocking=True) for t in x)",
]
# Arguments that cannot be told, and a move to another tensor (its device and its dtype).
KEPT = ["x = x.to(device, **options)", "x = x.to(device, *args)", "x = x.to(y)"]


def migrated(line: str, target: str = "torch_xla", select=("ACC003",)):
    result = migrate_source((HEADER + f"    {line}\n" + STEP).encode(), "train.py",
                            Options(target=target, select=select))
    assert result.error is None
    return result


def loop_body(output: str) -> str:
    """What the loop does before its step, its indentation removed."""
    start = output.index("\n", output.index("for x, y in ")) + 1
    body = output[start:output.index("    loss = ", start)]
    return "\n".join(line[4:] for line in body.splitlines())


def batch(line: str) -> dict:
    """The loop's names where ``line`` runs: ``x`` as the line reads it (a tensor, a dict, a list)."""
    made = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 5, generator=made)
    if ".items()" in line:
        x = {"images": x, "masks": torch.rand(2, 4, generator=made)}
    elif " for t in x" in line:
        x = [x, torch.rand(2, 4, generator=made)]
    return {"x": x, "y": torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=made), "torch": torch,
            "device": torch.device("cpu"), "model_dtype": torch.bfloat16,
            "options": {"dtype": torch.float16}, "args": (torch.float16,)}


def ran(code: str, line: str) -> dict:
    """The names ``code`` binds or leaves, run on the batch that ``line`` moves."""
    names = batch(line)
    exec(code, names)
    return {name: names.get(name) for name in ("x", "y", "z")}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and (a.dtype, a.stride()) == (b.dtype, b.stride()) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def on_this_cpu(line: str) -> str:
    """The original line as it runs here: CUDA's move is a move to the device, the CPU."""
    return line.replace(".cuda(0, True)", ".to(device)").replace(".cuda(", ".to(device, ")


@pytest.mark.parametrize("line, kept", CONVERTED, ids=[line for line, _ in CONVERTED])
def test_a_removed_move_keeps_its_conversion(line, kept):
    result = migrated(line)
    assert loop_body(result.output.decode()) == kept
    assert same(ran(kept, line), ran(on_this_cpu(line), line))
    kept_by_the_move = ".to(" in kept  # not a .half() after it
    assert [f.message for f in result.fixes if f.message.startswith("removed")] == [
        "removed a per-batch move, keeping its conversion: the device loader moves batches" if kept_by_the_move
        else "removed a per-batch move: the device loader moves batches"]


@pytest.mark.parametrize("line", REMOVED)
def test_a_move_that_does_nothing_else_goes(line):
    result = migrated(line)
    assert "MpDeviceLoader(loader, device)" in result.output.decode()
    assert loop_body(result.output.decode()) == ""
    assert same(ran("", line), ran(on_this_cpu(line), line))


@pytest.mark.parametrize("line", KEPT)
def test_a_move_whose_arguments_cannot_be_told_stays_whole(line):
    output = migrated(line, select=()).output.decode()
    assert loop_body(output) == line


@pytest.mark.parametrize("target", ["runtime", "torch_xla", "torchacc"])
def test_every_rule_together_keeps_the_conversion(target):
    """ACC002 turns ``.cuda()`` into a move to the target's device first; its memory format stays."""
    lines = ("x, y = x.to(device=device, dtype=model_dtype), y.cuda(non_blocking=True)\n"
             "    x = x.cuda(non_blocking=True, memory_format=torch.channels_last)")
    output = migrated(lines, target=target, select=()).output.decode()
    assert "MpDeviceLoader(loader, device)" in output
    assert loop_body(output) == "x = x.to(dtype=model_dtype)\nx = x.to(memory_format=torch.channels_last)"


def test_a_move_in_a_comprehension_alone_feeds_the_loop():
    source = ("import torch\n\ndef evaluate(model, loader, device):\n    for batch in loader:\n"
              "        batch = [t.to(device, torch.float16) for t in batch]\n        print(model(*batch))\n")
    output = migrate_source(source.encode(), "eval.py", Options(target="torch_xla", select=("ACC003",))).output.decode()
    loop = "    for batch in pl.MpDeviceLoader(loader, device):\n        batch = [t.to(torch.float16) for t in batch]\n"
    assert loop in output


def test_a_legacy_tensor_type_is_left_to_acc027():
    """``x.type(torch.cuda.HalfTensor)`` is no move ACC003 removes; ACC027 makes it one
    (``x.to(device, torch.float16)``), whose move ACC003 then removes, and without ACC027 ACC002
    refuses the file on the XLA targets, as the type has no spelling for their device."""
    line = "x = x.type(torch.cuda.HalfTensor)"
    assert loop_body(migrated(line).output.decode()) == line
    assert loop_body(migrated(line, select=()).output.decode()) == "x = x.to(torch.float16)"
    result = migrated(line, select=("ACC002", "ACC003"))
    assert result.output == (HEADER + f"    {line}\n" + STEP).encode()
    assert [d.code for d in result.diagnostics] == ["ACC002"]
