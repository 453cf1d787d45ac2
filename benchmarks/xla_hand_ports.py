"""Graphs per step on torch_xla: torch_xla's own hand ports against accrewrite's migrations of the
CUDA scripts they port, and recurrent models as accrewrite migrates them.

    python benchmarks/xla_hand_ports.py --xla XLA --examples EXAMPLES [--tutorials DIR2]
        [--xla-python PATH] [--steps 6] [--timeout S] [--only TEXT] [--json OUT]

XLA is a checkout of pytorch/xla, EXAMPLES one of pytorch/examples and DIR2 the tutorial corpus
(docs/benchmarks.md), each only read: every script runs in a scratch copy of its folder, with
synthetic data written beside it. The hand ports (``PAIRS``) are XLA's
``test/test_train_mp_mnist.py``, ``test/test_train_mp_imagenet.py`` on fake data,
``examples/train_resnet_base.py``, ``examples/train_decoder_only_base.py`` and the DC-GAN notebook
that ``contrib/colab/`` held until torch_xla 2.0 (git's history has it: ``git -C XLA show
acdb371f^:contrib/colab/DC-GAN.ipynb > XLA/contrib/colab/DC-GAN.ipynb``). Each is paired with the
pytorch/examples script it ports (mnist, imagenet twice, word_language_model, dcgan), migrated
by ``accrewrite migrate --target torch_xla`` with the interpreter running this benchmark. The
recurrent models (``RECURRENT``), migrated the same way, have no hand port: pytorch/examples'
``mnist_rnn`` and yunjey's RNN (an ``nn.LSTM`` over the 28 rows of an image) and ``CHAR_RNN``, a
script written here in the shape of the tutorials' character models (aladdinpersson's
``generating_names.py``): an LSTM fed one character at a time by a Python loop.

Every script runs on torch_xla's CPU device (``PJRT_DEVICE=CPU``, ``--xla-python``), small
sizes, one process. ``HOOK``, imported first by every process (``sitecustomize``), reads
torch_xla's metrics after each step of the first optimizer that steps (a GAN's discriminator)
and stops the process after ``--steps`` + 1 of them (a script that ends sooner is counted over the
steps it made): step k is what runs between the ends of its optimizer steps k and k + 1, so it
holds step k's graph execution (XLA runs a step's graph after its optimizer step) and the next
step's work up to its optimizer step. Counted per step: graph
executions (``ExecuteTime``), compilations (``CompileTime``) and transfers from the device to the
host (``TransferFromDeviceTime``: ``.item()``, a print of a tensor, a Python ``if`` on one).
Printed per script: the seconds spent compiling until step 3's optimizer step (the warm-up), then
over steps 3 to ``--steps``: graphs per step, compilations, host transfers per step, seconds per
step (a shared CPU: for orientation only). The hand ports' own text is not changed, except for
the sizes that their flags do not reach and the names torch_xla has since renamed (``Side.edits``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its sibling benchmark modules

from real_scripts import (RECIPES, SITE, XLA_MARK, Recipe, image_folder, mnist, mnist_above, no_data, prepare,  # noqa: E402
                          wikitext)

WARM_UP = 2  # steps whose compilations are expected: the first step's graph, and the second's (its optimizer state)

HOOK = '''

# Appended by benchmarks/xla_hand_ports.py: see its HOOK.
def _profile_steps():
    import atexit
    import json
    import os
    import time

    folder, steps = os.environ.get("XLA_HAND_PORTS_OUT"), int(os.environ.get("XLA_HAND_PORTS_STEPS", "0"))
    if not folder:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    marks, first = [], []

    def mark():
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met

        xm.wait_device_ops()  # the graphs launched so far have run: their counts land in this step

        def metric(name):
            found = met.metric_data(name)
            return (found[0], found[1]) if found else (0, 0.0)

        compilations, compile_ns = metric("CompileTime")
        return {"executions": metric("ExecuteTime")[0] + metric("ExecuteReplicatedTime")[0],
                "compilations": compilations, "compile_s": compile_ns / 1e9,
                "transfers": metric("TransferFromDeviceTime")[0], "time": time.monotonic()}

    def write():
        if marks:
            with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as out:
                json.dump(marks, out)

    def after_step(optimizer, args, kwargs):
        first[:] = first or [optimizer]
        if optimizer is not first[0]:
            return
        marks.append(mark())
        if len(marks) > steps:
            write()
            os._exit(0)  # the steps are counted: what the script does after them is not measured

    register_optimizer_step_post_hook(after_step)
    atexit.register(write)  # a script that ends sooner: the steps it made


_profile_steps()
'''

CHAR_RNN = '''"""A character-level LSTM fed one character at a time (written by benchmarks/xla_hand_ports.py)."""
import random
import string

import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
characters = string.ascii_lowercase + " "
text = open("data/names.txt").read()


class CharRNN(nn.Module):
    def __init__(self, size, hidden, layers):
        super().__init__()
        self.hidden, self.layers = hidden, layers
        self.embed = nn.Embedding(size, hidden)
        self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True)
        self.fc = nn.Linear(hidden, size)

    def forward(self, x, hidden, cell):
        out, (hidden, cell) = self.lstm(self.embed(x).unsqueeze(1), (hidden, cell))
        return self.fc(out.reshape(out.shape[0], -1)), (hidden, cell)

    def init_hidden(self, batch):
        return (torch.zeros(self.layers, batch, self.hidden).to(device),
                torch.zeros(self.layers, batch, self.hidden).to(device))


def char_tensor(chunk):
    return torch.tensor([characters.index(c) for c in chunk]).long()


chunk_len, batch_size = 32, 4
model = CharRNN(len(characters), 64, 2).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
criterion = nn.CrossEntropyLoss()
for epoch in range(1, 101):
    starts = [random.randint(0, len(text) - chunk_len - 1) for _ in range(batch_size)]
    inp = torch.stack([char_tensor(text[s:s + chunk_len]) for s in starts]).to(device)
    target = torch.stack([char_tensor(text[s + 1:s + chunk_len + 1]) for s in starts]).to(device)
    hidden, cell = model.init_hidden(batch_size)
    model.zero_grad()
    loss = 0
    for c in range(chunk_len):
        output, (hidden, cell) = model(inp[:, c], hidden, cell)
        loss += criterion(output, target[:, c])
    loss.backward()
    optimizer.step()
    if epoch % 10 == 0:
        print(f"epoch {epoch}: loss {loss.item() / chunk_len:.4f}")
'''


@dataclass(frozen=True)
class Side:
    """One script as it runs: a hand port as written, or a CUDA script migrated to torch_xla."""

    root: str  # which directory argument holds it: "xla", "examples", "tutorials" or "written" (CHAR_RNN)
    path: str  # under that directory
    args: tuple[str, ...] = ()
    data: Callable[[Path, str], None] = no_data  # writes the data, given the working directory and the interpreter
    migrate: bool = False
    edits: tuple[tuple[str, str], ...] = ()  # a hand port's sizes its flags do not reach, and renamed names
    recipe: Recipe | None = None  # a tutorial recipe of benchmarks/real_scripts.py, run as it says


@dataclass(frozen=True)
class Pair:
    name: str
    hand: Side | None  # None: a recurrent model, which torch_xla does not port by hand
    migrated: Side
    note: str = ""


def images(cwd: Path, python: str) -> None:
    """An ImageFolder of 20 training images, ten steps of two: enough that no epoch ends."""
    image_folder(cwd / "images", classes=2, per_class=10)


def names(cwd: Path, python: str) -> None:
    """``data/names.txt``, the text CHAR_RNN reads: 400 random lowercase names."""
    rng = random.Random(0)
    (cwd / "data").mkdir()
    (cwd / "data" / "names.txt").write_text(" ".join(
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(400)))


_ONE_PROCESS = ("--num_cores", "1", "--num_workers", "0", "--fake_data")
_DECODER = Side("xla", "examples/train_decoder_only_base.py",
                ("--hidden-size", "64", "--num-layers", "2", "--num-attention-heads", "4", "--num-key-value-heads", "2",
                 "--intermediate-size", "128"))
"""torch_xla's language model: word_language_model's Transformer and its LSTM are both set against it."""
PAIRS = (
    Pair("MNIST",
         Side("xla", "test/test_train_mp_mnist.py", (*_ONE_PROCESS, "--batch_size", "16", "--num_epochs", "1")),
         Side("examples", "mnist/main.py", ("--epochs", "1", "--batch-size", "16", "--no-accel"), mnist_above,
              migrate=True)),
    Pair("ImageNet ResNet-18",
         Side("xla", "test/test_train_mp_imagenet.py",
              (*_ONE_PROCESS, "--model", "resnet18", "--batch_size", "2", "--test_set_batch_size", "2",
               "--num_epochs", "1")),
         Side("examples", "imagenet/main.py",
              ("-a", "resnet18", "--epochs", "1", "-b", "2", "-j", "0", "-p", "100", "images"), images, migrate=True),
         note="224-pixel images of two classes on both sides (the hand port's zeros, the original's image folder)"),
    Pair("ImageNet ResNet-50",
         Side("xla", "examples/train_resnet_base.py", (), edits=(("self.batch_size = 128", "self.batch_size = 2"),)),
         Side("examples", "imagenet/main.py",
              ("-a", "resnet50", "--epochs", "1", "-b", "2", "-j", "0", "-p", "100", "images"), images, migrate=True),
         note="torch_xla's example compiles its step with torch_xla.compile; batches of 2 on both sides"),
    Pair("Transformer language model",
         _DECODER,
         Side("examples", "word_language_model/main.py",
              ("--data", "wt2", "--model", "Transformer", "--nhead", "4", "--emsize", "64", "--nhid", "128",
               "--nlayers", "2", "--batch_size", "16", "--bptt", "32", "--lr", "0.001", "--use-optimizer", "--accel"),
              wikitext, migrate=True),
         note="the hand port trains a decoder on 16 x 512 tokens; word_language_model a Transformer on 16 x 32"),
    Pair("DCGAN",
         Side("xla", "contrib/colab/DC-GAN.ipynb", (),
              mnist("data/dataset", train=256),
              edits=(("FLAGS['datadir'] = \"/tmp/mnist\"", "FLAGS['datadir'] = \"data\""),
                     ("FLAGS['batch_size'] = 128", "FLAGS['batch_size'] = 16"),
                     ("FLAGS['num_workers'] = 4", "FLAGS['num_workers'] = 0"),
                     ("FLAGS['num_cores'] = 8", "FLAGS['num_cores'] = 1"),
                     ("xm.xrt_world_size()", "torch_xla.runtime.world_size()"),
                     ("xm.get_ordinal()", "torch_xla.runtime.global_ordinal()"))),
         Side("examples", "dcgan/main.py",
              ("--dataset", "fake", "--niter", "1", "--batchSize", "4", "--imageSize", "64", "--workers", "0",
               "--outf", "out", "--accel"), migrate=True),
         note="the notebook's GAN is MNIST-sized (28 pixels), pytorch/examples' 64 pixels: each step is the "
              "discriminator's and the generator's"),
    Pair("LSTM language model",
         _DECODER,
         Side("examples", "word_language_model/main.py",
              ("--data", "wt2", "--model", "LSTM", "--emsize", "64", "--nhid", "64", "--nlayers", "2",
               "--batch_size", "16", "--bptt", "32", "--lr", "0.001", "--use-optimizer", "--accel"),
              wikitext, migrate=True),
         note="word_language_model's default model against the same hand port"),
)
RECURRENT = (
    Pair("pytorch/examples mnist_rnn (nn.LSTM over 28 rows)", None,
         Side("examples", "mnist_rnn/main.py", ("--epochs", "1", "--batch-size", "16"), mnist_above, migrate=True)),
    Pair("yunjey's RNN (2-layer nn.LSTM over 28 rows)", None,
         Side("tutorials", "yunjey+pytorch-tutorial/tutorials/02-intermediate/recurrent_neural_network/main.py", (),
              mnist("../../data", train=800, test=100), migrate=True)),
    Pair("char-RNN (32 characters, a Python loop)", None,
         Side("written", "char_rnn/main.py", (), names, migrate=True)),
)


@dataclass
class Profile:
    """What one script did on the device, step by step (``marks``: the metrics after each step)."""

    marks: list[dict] = field(default_factory=list)
    error: str = ""
    findings: list[str] = field(default_factory=list)  # accrewrite's diagnostics, for a migrated side

    def steps(self) -> list[dict]:
        return [{key: later[key] - earlier[key] for key in later} for earlier, later in zip(self.marks, self.marks[1:])]

    def summary(self) -> dict:
        if self.error:
            return {"error": self.error}
        settled = self.steps()[WARM_UP:]

        def spread(key: str) -> str:
            low, high = min(s[key] for s in settled), max(s[key] for s in settled)
            return f"{low}" if low == high else f"{low}-{high}"

        return {"warm-up compile s": round(self.marks[WARM_UP]["compile_s"], 1),
                "graphs/step": spread("executions"),
                "compilations after warm-up": sum(s["compilations"] for s in settled),
                "host transfers/step": spread("transfers"),
                "s/step": round(statistics.median(s["time"] for s in settled), 2)}


def tutorial_recipes(tutorials: Path) -> tuple[Pair, ...]:
    """The recipes of benchmarks/real_scripts.py whose script the tutorial corpus holds, each
    migrated, one process: whether it compiles after warm-up, and the ACC103 lines it got."""
    return tuple(Pair(recipe.suffix, None, Side("tutorials", recipe.suffix, recipe.args, recipe.data, migrate=True,
                                                   recipe=recipe))
                 for recipe in RECIPES if recipe.nproc == 1 and recipe.on_device and (tutorials / recipe.suffix).is_file())


def source_of(side: Side, roots: dict[str, Path], into: Path) -> Path:
    """The script to copy: under its directory argument, or CHAR_RNN written into ``into``."""
    if side.root == "written":
        script = into / "written" / side.path
        script.parent.mkdir(parents=True)
        script.write_text(CHAR_RNN)
        return script
    if roots.get(side.root) is None:
        raise LookupError(f"no --{side.root} given")
    script = roots[side.root] / side.path
    if not script.is_file():
        raise LookupError(f"{script} not found")
    return script


def notebook_script(notebook: Path) -> Path:
    """The notebook's code cells as a script beside it, without those that need Colab's machine
    (its TPU check, its image display) and IPython's ``!`` lines."""
    cells = json.loads(notebook.read_text())["cells"]
    colab = ("COLAB_TPU_ADDR", "google.colab", "display_results()")
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    kept = [text for text in code if not any(word in text for word in colab)]
    lines = [line for text in kept for line in text.splitlines() if not line.lstrip().startswith(("!", "%"))]
    script = notebook.with_suffix(".py")
    script.write_text("\n".join(lines) + "\n")
    return script


def edit(script: Path, edits: tuple[tuple[str, str], ...]) -> None:
    text = script.read_text()
    for old, new in edits:
        if old not in text:
            raise LookupError(f"{script.name} no longer holds {old!r}: the hand port changed")
        text = text.replace(old, new)
    script.write_text(text)


def migrate(folder: Path, script: Path) -> list[str]:
    """The folder's scripts migrated to torch_xla in place; accrewrite's findings. A file of the
    folder that does not parse (a notebook beside the script) stops only its own migration."""
    done = subprocess.run([sys.executable, "-m", "accrewrite.cli", "migrate", "--target", "torch_xla", "--in-place",
                           str(folder)], capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    if done.returncode not in (0, 1, 2) or done.returncode == 2 and (not errors or any(
            line.startswith(f"{script}:") for line in errors)):
        raise RuntimeError(f"accrewrite migrate: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    return [line.strip().replace(f"{folder}{os.sep}", "") for line in done.stdout.splitlines() if " ACC" in line]


def run(side: Side, roots: dict[str, Path], args) -> Profile:
    """One side run on torch_xla's CPU device for ``args.steps`` + 1 optimizer steps."""
    profile = Profile()
    with tempfile.TemporaryDirectory(prefix="xla-hand-ports-") as scratch:
        scratch = Path(scratch)
        try:
            source = source_of(side, roots, scratch / "source")
            recipe = side.recipe or Recipe(side.path, side.args, side.data)
            ready = prepare(source, recipe, scratch / "run", args.xla_python)
            (scratch / "run" / "site" / "sitecustomize.py").write_text(SITE + HOOK)
            script = notebook_script(ready.script) if ready.script.suffix == ".ipynb" else ready.script
            edit(script, side.edits)
            if side.migrate:
                profile.findings = migrate(ready.cwd, script)
        except (LookupError, RuntimeError, OSError, subprocess.SubprocessError) as exc:
            profile.error = f"could not prepare it: {exc}"
            return profile
        out = scratch / "profile"
        out.mkdir()
        env = {**ready.env, "PJRT_DEVICE": "CPU", "XLA_HAND_PORTS_OUT": str(out),
               "XLA_HAND_PORTS_STEPS": str(args.steps)}
        try:
            done = subprocess.run([args.xla_python, str(script), *side.args], cwd=ready.cwd, env=env,
                                  capture_output=True, text=True, timeout=args.timeout)
            tail = [line for line in done.stderr.strip().splitlines() if not line.startswith(XLA_MARK)][-2:]
        except subprocess.TimeoutExpired:
            tail = [f"still running after {args.timeout} s (--timeout)"]
        written = sorted(out.glob("*.json"))
        profile.marks = json.loads(written[0].read_text()) if written else []
        if len(profile.marks) <= WARM_UP + 1:
            profile.error = (f"made {len(profile.marks)} optimizer steps, none after warm-up: "
                             + " | ".join(tail))
    return profile


COLUMNS = ("warm-up compile s", "graphs/step", "compilations after warm-up", "host transfers/step", "s/step")


def row(name: str, side: str, profile: Profile) -> str:
    summary = profile.summary()
    if "error" in summary:
        return f"| {name} | {side} | {summary['error'].replace('|', '/')} |" + " |" * (len(COLUMNS) - 1)
    return f"| {name} | {side} | " + " | ".join(str(summary[c]) for c in COLUMNS) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xla", type=Path, help="a checkout of pytorch/xla")
    parser.add_argument("--examples", type=Path, help="a checkout of pytorch/examples")
    parser.add_argument("--tutorials", type=Path, help="the tutorial corpus (yunjey+pytorch-tutorial inside)")
    parser.add_argument("--xla-python", default=os.environ.get("ACCREWRITE_XLA_PYTHON"),
                        help="an interpreter with torch_xla and torchvision (default: $ACCREWRITE_XLA_PYTHON)")
    parser.add_argument("--steps", type=int, default=6, help="steps measured (default 6: steps 3 to 6 after warm-up)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per script")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT", help="rows whose name holds TEXT")
    parser.add_argument("--json", metavar="OUT", help="write every step's metrics as JSON")
    parser.add_argument("--recipes", action="store_true",
                        help="profile the recipes of benchmarks/real_scripts.py found under --tutorials instead")
    args = parser.parse_args(argv)
    if not args.xla_python:
        parser.error("--xla-python (or $ACCREWRITE_XLA_PYTHON) is needed")
    if args.steps <= WARM_UP:
        parser.error(f"--steps must be above the {WARM_UP} warm-up steps")
    roots = {"xla": args.xla, "examples": args.examples, "tutorials": args.tutorials}
    if args.recipes and not args.tutorials:
        parser.error("--recipes needs --tutorials")
    pairs = tutorial_recipes(args.tutorials) if args.recipes else (*PAIRS, *RECURRENT)
    chosen = [p for p in pairs if not args.only or any(text in p.name for text in args.only)]
    print("| script | side | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS), flush=True)
    results, profiles = [], {}
    for pair in chosen:
        sides = [("hand port", pair.hand)] if pair.hand else []
        for label, side in [*sides, ("migrated by accrewrite", pair.migrated)]:
            profile = profiles[side] = profiles.get(side) or run(side, roots, args)  # a hand port two pairs share
            print(row(pair.name, label, profile), flush=True)
            results.append({"name": pair.name, "side": label, "script": f"{side.root}/{side.path}",
                            "summary": profile.summary(), "steps": profile.steps(), "findings": profile.findings})
    print("".join(f"\n{pair.name}: {pair.note}" for pair in chosen if pair.note))
    late = [result for result in results if result["summary"].get("compilations after warm-up")]
    for result in late:  # each compiles after warm-up: does accrewrite name the line?
        named = [finding for finding in result["findings"] if "ACC103" in finding]
        print(f"{result['name']}: compiles after warm-up; ACC103: {'; '.join(named) or 'none'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
