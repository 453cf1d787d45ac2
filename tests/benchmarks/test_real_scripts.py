"""benchmarks/real_scripts.py on a tiny corpus written here: the training scripts and their
needs are found, a migration that does the work satisfies them and an output that does not is
reported as a miss; a tiny script run to its end, as the verify step runs each side. No verify
runs, no network."""

import argparse
import ast
import json
import struct
import subprocess
import sys
import textwrap
import zlib

import pytest
from benchmark_module import load

from accrewrite.unbound import REFUSAL
from accrewrite.verify import graphs

rs = load("real_scripts")

CUDA_SCRIPT = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        loader = DataLoader(data, batch_size=8)
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.cuda.amp.GradScaler()
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            optimizer.zero_grad()
            with torch.cuda.amp.autocast():
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


    main()
""")

# What a torch_xla migration of CUDA_SCRIPT must look like, spelled with aliases of its own.
HAND_MIGRATED = textwrap.dedent("""\
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xmodel
    from torch_xla.distributed import parallel_loader
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        device = torch_xla.device()
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        loader = DataLoader(data, batch_size=8)
        model = torch.nn.Linear(8, 2).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler('xla', enabled=False)
        for x, y in parallel_loader.MpDeviceLoader(loader, device):
            optimizer.zero_grad()
            with torch.autocast('xla', dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            xmodel.reduce_gradients(optimizer)
            scaler.step(optimizer)
            scaler.update()
""")

NOTHING_TO_MIGRATE = textwrap.dedent("""\
    def mean(values):
        return sum(values) / len(values)


    for epoch in range(3):
        print(mean([epoch, 1]))
""")

# Trains through a method; ``train_data`` is no loader: nothing in the file builds one.
TRAINER = textwrap.dedent("""\
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Trainer:
        def __init__(self, model, train_data, optimizer):
            self.model, self.train_data, self.optimizer = DDP(model), train_data, optimizer

        def _run_batch(self, x):
            self.optimizer.zero_grad()
            self.model(x).sum().backward()
            self.optimizer.step()

        def train(self, epochs):
            for _ in range(epochs):
                for x in self.train_data:
                    self._run_batch(x)
""")


@pytest.fixture
def corpus(tmp_path):
    repo = tmp_path / "corpus" / "someone+project"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text(CUDA_SCRIPT)
    (repo / "utils.py").write_text(NOTHING_TO_MIGRATE)
    (repo / "trainer.py").write_text(TRAINER)
    return tmp_path / "corpus"


def _by_name(needs):
    return {need.name: need for need in needs}


def test_the_needs_of_a_cuda_script():
    original = rs.analyse_original(CUDA_SCRIPT.encode())
    assert set(original.needs) == {rs.DEVICE, rs.LOADER, rs.REDUCTION, rs.AMP}
    assert list(original.loaders) == ["loader"]
    assert ".cuda()" in original.needs[rs.DEVICE]


def test_a_file_without_a_training_loop_needs_nothing():
    assert rs.analyse_original(NOTHING_TO_MIGRATE.encode()) is None


def test_training_through_a_method_needs_the_reduction_only():
    original = rs.analyse_original(TRAINER.encode())
    assert set(original.needs) == {rs.REDUCTION}
    assert original.loaders == {}


def test_the_migration_wraps_the_loader(corpus):
    path = corpus / "someone+project" / "train.py"
    report = rs.examine(str(path), "someone+project/train.py", "runtime")
    assert report.training and report.error is None and report.compiles and report.idempotent
    needs = _by_name(report.needs)
    assert set(needs) == {rs.DEVICE, rs.LOADER, rs.REDUCTION, rs.AMP}
    assert needs[rs.LOADER].satisfied, needs[rs.LOADER].why


def test_a_loader_left_for_host_work_is_a_miss_the_migration_reports(tmp_path):
    # The labels fill a tensor made on the host before they move: the loader stays on the host.
    source = CUDA_SCRIPT.replace("x, y = x.cuda(), y.cuda()", "onehot = torch.zeros(8, 2)\n"
                                 "        onehot[torch.arange(8), y] = 1\n"
                                 "        x, y = x.cuda(), onehot.cuda().argmax(1)")
    path = tmp_path / "train.py"
    path.write_text(source)
    needs = _by_name(rs.examine(str(path), "train.py", "torch_xla").needs)
    assert not needs[rs.LOADER].satisfied and needs[rs.LOADER].said
    assert needs[rs.DEVICE].satisfied and not needs[rs.DEVICE].said


def test_an_unmigrated_output_misses_everything():
    original = rs.analyse_original(CUDA_SCRIPT.encode())
    needs = _by_name(rs.check_output(original, CUDA_SCRIPT.encode(), "torch_xla"))
    assert not any(need.satisfied for need in needs.values())
    assert "remains" in needs[rs.DEVICE].why
    assert "loader" in needs[rs.LOADER].why
    assert "torch.cuda.amp" in needs[rs.AMP].why


def test_a_hand_migration_satisfies_everything_whatever_its_aliases():
    original = rs.analyse_original(CUDA_SCRIPT.encode())
    needs = rs.check_output(original, HAND_MIGRATED.encode(), "torch_xla")
    assert all(need.satisfied for need in needs), needs


def test_another_targets_spelling_does_not_count():
    original = rs.analyse_original(CUDA_SCRIPT.encode())
    needs = _by_name(rs.check_output(original, HAND_MIGRATED.encode(), "runtime"))
    assert not needs[rs.LOADER].satisfied and not needs[rs.REDUCTION].satisfied and not needs[rs.DEVICE].satisfied
    assert needs[rs.AMP].satisfied  # no CUDA spelling is left, whatever replaced it


@pytest.mark.parametrize("source, placed", [
    ("device = 'cuda'\ndevice = xm.xla_device()\n", False),  # rebound before any use
    ("device = 'cuda' if ok else 'cpu'\n", True),
    ("device_type = 'cuda' if 'cuda' in device else 'cpu'\n", False),  # a type, not a placement
    ("x = x.to(f'cuda:{rank}')\n", True),
    ("x = x.to(self.gpu_id)\n", True),
    ("x = x.to(torch.float16)\n", False),
    ("p.add_argument('--device', default='cuda')\nargs = p.parse_args()\n", False),  # never read
    ("p.add_argument('--device', default='cuda')\nargs = p.parse_args()\nd = args.device\n", True),
])
def test_cuda_placements(source, placed):
    assert bool(rs.cuda_placements(rs.Facts(ast.parse(source)))) == placed


def test_one_cpu_process_and_managed_training_need_no_reduction():
    cpu_only = TRAINER.replace("from torch.nn.parallel import DistributedDataParallel as DDP", "import torch")
    assert rs.analyse_original(cpu_only.replace("DDP(model)", "model").encode()).needs == {}
    assert rs.analyse_original(("from accelerate import Accelerator\n" + TRAINER).encode()) is None


def test_main_reports_the_corpus(corpus, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert rs.main([str(corpus), "--targets", "runtime", "--jobs", "1", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]["runtime"]
    assert summary["files"] == 3 and summary["internal_errors"] == [] and summary["not_idempotent"] == []
    assert summary["training_scripts"] == 2
    assert summary["needed"] == 5
    printed = capsys.readouterr().out
    assert "coverage runtime:" in printed and "someone+project/trainer.py" in printed


LIGHTNING = textwrap.dedent("""\
    import lightning as L
    import torch


    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    trainer = L.Trainer(max_epochs=1, accelerator="gpu")
    trainer.fit(Classifier(), loader)
""")

# transformers' Trainer places the model and reduces gradients itself; nothing here names CUDA.
HF_TRAINER = textwrap.dedent("""\
    import torch
    from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

    model = AutoModelForSequenceClassification.from_pretrained("bert-base-cased", torch_dtype=torch.float32)
    trainer = Trainer(model=model, args=TrainingArguments("out"), train_dataset=train_data)
    trainer.train()
""")


# d2l's Trainer places the model (num_gpus) and runs the loop inside the d2l package.
D2L_TRAINER = textwrap.dedent("""\
    import torch
    from d2l import torch as d2l

    model = d2l.LeNet(lr=0.1)
    trainer = d2l.Trainer(max_epochs=10, num_gpus=1)
    trainer.fit(model, d2l.FashionMNIST(batch_size=128))
""")


@pytest.mark.parametrize("source, trains", [
    (LIGHTNING, "lightning Trainer"),
    (HF_TRAINER, "transformers Trainer"),
    (D2L_TRAINER, "d2l Trainer"),
    ("from fastai.vision.all import *\nlearn = vision_learner(dls, resnet34)\nlearn.fine_tune(1)\n",
     "fastai vision_learner"),
    ("from lightning.pytorch.cli import LightningCLI\nclass CLI(LightningCLI):\n    pass\nCLI(Model)\n",
     "lightning LightningCLI"),
    ("import pytorch_lightning as pl\npl.Trainer(max_epochs=1).fit(model)\n", "pytorch_lightning Trainer"),
    ("from accelerate import Accelerator\naccelerator = Accelerator()\nmodel = accelerator.prepare(model)\n",
     "accelerate Accelerator"),
    (TRAINER, rs.LOOP),
    # A class of the file named like a trainer is not a framework's: its loop is what trains.
    ("class Trainer:\n    def fit(self):\n        pass\nTrainer().fit()\n", ""),
    ("from transformers import Trainer\ntrainer = Trainer(model=model)\n", ""),  # built, never trained
    (NOTHING_TO_MIGRATE, ""),
])
def test_what_trains_in_a_file(source, trains):
    assert rs.what_trains(source.encode()) == trains


def test_the_files_that_train_are_migrated_diagnosed_left_silently_or_skipped(corpus, tmp_path, capsys):
    repo = corpus / "someone+project"
    (repo / "lit.py").write_text(LIGHTNING)
    (repo / "d2l_lenet.py").write_text(D2L_TRAINER)
    (repo / "skipped.py").write_text("# accrewrite: skip-file\n" + CUDA_SCRIPT)
    cells = [{"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": None}
             for source in (["%matplotlib inline\n"], CUDA_SCRIPT.splitlines(keepends=True))]
    (repo / "lesson.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                                   "nbformat_minor": 4}))
    out = tmp_path / "report.json"
    assert rs.main([str(corpus), "--targets", "runtime,torch_xla", "--jobs", "1", "--json", str(out)]) == 0
    # train.py, trainer.py and the notebook are migrated, and on torch_xla the Lightning script too (ACC018);
    # utils.py does not train. d2l's Trainer is named by ACC109, and on runtime the Lightning script by ACC018.
    expected = {"runtime": (3, {"ACC018": 1, "ACC109": 1}), "torch_xla": (4, {"ACC109": 1})}
    for target, (migrated, diagnosed) in expected.items():
        summary = json.loads(out.read_text())["summary"][target]
        assert summary["trains"] == 6 and summary["migrated"] == migrated
        assert summary["diagnosed"] == sum(diagnosed.values()) and summary["diagnosed_by_code"] == diagnosed
        assert summary["silent"] == []
        assert summary["skipped_by_user"] == ["someone+project/skipped.py"] and summary["failed"] == []
        assert summary["framework_unnamed"] == []  # the findings on the framework scripts name their framework
    printed = capsys.readouterr().out
    assert "runtime: 6 train; 3 migrated, 2 left with a finding (ACC018 1, ACC109 1), 0 left silently, 1 skipped" in printed
    assert "torch_xla: 6 train; 4 migrated, 1 left with a finding (ACC109 1), 0 left silently, 1 skipped" in printed


def test_the_summary_counts_what_the_net_refused_among_the_internal_errors(capsys):
    net = f"{REFUSAL} 'device' unbound at line 9 (ACC003 device-loader); the file was left unchanged"
    reports = [rs.FileReport("a.py", "runtime", error=net, internal=True),
               rs.FileReport("b.py", "runtime", error="internal error (KeyError: 'x')", internal=True),
               rs.FileReport("c.py", "runtime")]
    summary = rs.summarise(reports, ["runtime"])
    assert summary["runtime"]["refused_by_net"] == [("a.py", net)] and len(summary["runtime"]["internal_errors"]) == 2
    rs.print_summary(summary, ["runtime"], None, 0.02)
    header, row = capsys.readouterr().out.splitlines()[-2:]
    assert row.split()[:4] == ["runtime", "3", "2", "1"] and "net refused" in header


def test_verdict_line():
    matched = subprocess.CompletedProcess([], 0, stdout="table\nmatch: 5 steps within 2%\n", stderr="")
    assert rs.verdict_line(matched) == "match: 5 steps within 2%"
    failed = subprocess.CompletedProcess([], 2, stdout="", stderr="original: 0/5 steps\nerror: original cannot run: it "
                                         "exited\n  File x\nRuntimeError: no data\nterminate called\n")
    assert rs.verdict_line(failed) == "error: original cannot run: it exited | RuntimeError: no data"


def test_a_failed_runs_note_starts_with_the_first_exception_of_its_ranks():
    stderr = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "train.py", line 3',
              "[rank1]: ValueError: SyncBatchNorm expected input tensor to be on GPU",
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "rank      : 1"]
    assert rs.first_exception(stderr) == ["ValueError: SyncBatchNorm expected input tensor to be on GPU"]
    assert rs.first_exception(["Killed"]) == []


def test_only_the_runtime_side_of_a_spawned_script_counts_two_cpu_devices():
    spawned = rs.Recipe("a/main.py", (), rs.no_data, devices=2)
    assert rs.side_environment(spawned, "runtime") == {"CPU_NUM_DEVICES": "2"}
    assert rs.side_environment(spawned, "torch_xla") == {"PJRT_DEVICE": "CPU"}
    assert rs.side_environment(spawned, "original") == {}


def test_celeba_writes_the_attribute_file_stargan_reads(tmp_path):
    rs.celeba("data/celeba", images=3, lines=2005)(tmp_path, sys.executable)
    lines = (tmp_path / "data/celeba/list_attr_celeba.txt").read_text().splitlines()
    assert lines[0] == "2005" and len(lines[1].split()) == 40 and len(lines) == 2007
    name, *values = lines[-1].split()
    assert (tmp_path / "data/celeba/images" / name).is_file() and set(values) <= {"1", "-1"} and len(values) == 40


def _png_pixels(path):
    """(colour type, the pixel bytes) of a PNG written by ``rs._png``: one IDAT, filter 0 rows."""
    data = path.read_bytes()
    width, height, _, colour = struct.unpack(">IIBB", data[16:26])
    rows = zlib.decompress(data[data.index(b"IDAT") + 4:data.index(b"IEND") - 8])
    stride = len(rows) // height
    return colour, b"".join(rows[i * stride + 1:(i + 1) * stride] for i in range(height))


def test_voc_masks_are_grayscale_class_indices(tmp_path):
    rs.voc_segmentation("data", train=2, val=1, classes=21, size=(8, 6))(tmp_path, sys.executable)
    voc = tmp_path / "data/VOCdevkit/VOC2012"
    names = (voc / "ImageSets/Segmentation/trainval.txt").read_text().split()
    assert len(names) == 3 and (voc / "ImageSets/Segmentation/val.txt").read_text().split() == names[2:]
    colour, pixels = _png_pixels(voc / "SegmentationClass" / f"{names[0]}.png")
    assert colour == 0 and len(pixels) == 8 * 6 and max(pixels) < 21
    colour, pixels = _png_pixels(voc / "JPEGImages" / f"{names[0]}.jpg")
    assert colour == 2 and len(pixels) == 8 * 6 * 3


# Trains two steps on the original's CUDA device or the CPU, then fails after training unless
# given --finish: what a run to the end sees and a verify of the first steps does not.
TO_THE_END = textwrap.dedent("""\
    import sys
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        loss = model(torch.ones(2, 4, device=device)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if "--finish" not in sys.argv:
        raise RuntimeError("evaluation after training failed")
""")


@pytest.fixture
def to_the_end(tmp_path):
    script = tmp_path / "corpus" / "someone+tutorial" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text(TO_THE_END)
    return script


def _args(**given):
    return argparse.Namespace(**{"python": sys.executable, "xla_python": None, "timeout": 300, **given})


@pytest.mark.slow
def test_a_migrated_side_runs_to_the_end_or_says_how_it_ended(to_the_end):
    finish = rs.Recipe("train.py", ("--finish",), rs.no_data)
    ended = rs.run_to_end(to_the_end, "train.py", finish, "runtime", _args())
    assert (ended.code, ended.note) == (0, "")
    failing = rs.Recipe("train.py", (), rs.no_data)
    failed = rs.run_to_end(to_the_end, "train.py", failing, "runtime", _args())
    assert failed.code == 1 and "RuntimeError: evaluation after training failed" in failed.note
    skipped = rs.run_to_end(to_the_end, "train.py", finish, "torch_xla", _args())
    assert skipped.code is None and skipped.note.startswith("skipped")


@pytest.mark.slow
def test_a_torch_xla_run_to_the_end_counts_its_xla_executions(to_the_end, xla_python):
    finish = rs.Recipe("train.py", ("--finish",), rs.no_data)
    ended = rs.run_to_end(to_the_end, "train.py", finish, "torch_xla", _args(xla_python=xla_python))
    assert ended.code == 0, ended.note
    assert ended.executions and ended.executions >= 2 and ended.compilations >= 1


def test_the_scorecard_of_a_script():
    verify = [rs.VerifyResult("a.py", "original,runtime", ("runtime",), 0, "match"),
              rs.VerifyResult("a.py", "original,torch_xla", ("torch_xla",), 1, "diverge")]
    ends = [rs.EndResult("a.py", "original", 0, ""), rs.EndResult("a.py", "runtime", 1, "NameError: device"),
            rs.EndResult("a.py", "torch_xla", 0, "", executions=0)]
    row = rs.scorecard(rs.Outcome(verify, ends))
    assert row == {"script": "a.py", "runtime verify": "yes", "torch_xla verify": "no", "original to end": "yes",
                   "runtime to end": "no", "torch_xla to end": "yes", "xla executions": "0"}


def test_the_verify_table_reads_the_torch_xla_sides_graph_profile_as_verify_prints_it(capsys):
    def printed(**found):
        return graphs.describe("torch_xla", "xla", graphs.Profile(**{"executions_in_all": 9, "compiles_in_all": 2,
                                                                     "ran": 12, **found}))

    clean = printed(steps=[3, 4], executions=[1, 1], compiles=[0, 0], transfers=[1, 1])
    assert rs.graph_profile(f"┃ table ┃\n{clean}\nmatch: 5 steps") == rs.GraphProfile("1", "1", 0)
    late = printed(steps=[3, 4, 5], executions=[2, 1, 1], compiles=[0, 1, 0], transfers=[0, 0, 0],
                   late={"train.py:17 changed the step's graph, train.py:30 ran it": [4],
                         "train.py:40 ran it": [5]})
    assert rs.graph_profile(late) == rs.GraphProfile("1.33", "0", 1, "train.py:17 changed the step's graph, "
                                                                       "train.py:30 ran it")
    assert rs.graph_profile("match: 5 steps") is None  # no torch_xla side
    result = rs.VerifyResult("a.py", "original,torch_xla", ("torch_xla",), 0, "match",
                             profile=rs.graph_profile(late))
    rs.print_verify([rs.Outcome([result], [])])
    table = capsys.readouterr().out
    assert "a.py  original,torch_xla     0      0s    1.33     1      0  match" in table
    assert "late compilation: train.py:17 changed the step's graph, train.py:30 ran it" in table


def test_a_framework_script_changed_for_something_else_is_listed_as_never_naming_its_framework():
    reports = [rs.FileReport("sft.py", "runtime", trains="trl SFTTrainer", outcome=rs.MIGRATED,
                             diagnostics=[("ACC010", 7)]),  # a memory statistic, say
               rs.FileReport("hf.py", "torch_xla", trains="transformers Trainer", outcome=rs.MIGRATED,
                             fixes=["ACC017"]),
               rs.FileReport("lit.py", "runtime", trains="lightning Trainer", outcome=rs.DIAGNOSED,
                             diagnostics=[("ACC107", 1)]),
               rs.FileReport("train.py", "runtime", trains=rs.LOOP, outcome=rs.MIGRATED)]
    assert rs.outcomes(reports)["framework_unnamed"] == [("sft.py", "trl SFTTrainer", rs.MIGRATED)]


def test_a_notebook_that_cannot_be_read_is_an_error_not_a_file_without_training(tmp_path):
    notebook = tmp_path / "lesson.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": CUDA_SCRIPT}]})[:-3])
    report = rs.examine(str(notebook), "lesson.ipynb", "runtime")
    assert report.error.startswith("not a notebook: its JSON is invalid") and not report.trains
