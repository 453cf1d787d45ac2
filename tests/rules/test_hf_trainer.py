"""Scripts that Hugging Face's Trainer trains (ACC017): recognised by the Trainer they build, never
by an import alone; migrated by their settings on every target, with a line for what cannot be
rewritten; the Trainer's callbacks, subclass and collator checked as a training loop is."""

import os
import re
import subprocess
from pathlib import Path

import libcst as cst
import pytest

from accrewrite.analysis import analyze
from accrewrite.cli import main
from accrewrite.engine import Options, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"


def facts_of(code: str):
    return analyze(cst.parse_module(code))


def findings(name: str, target: str) -> list[tuple[str, int]]:
    result = migrate_source((FIXTURES / f"{name}.in.py").read_bytes(), f"{name}.py", Options(target=target))
    assert result.error is None, result.error
    return [(d.code, d.line) for d in result.diagnostics]


@pytest.mark.parametrize("code", [
    "from transformers import Trainer\ntrainer = Trainer(model=model, args=args)\n",
    "import transformers\ntransformers.Seq2SeqTrainer(model=model).train()\n",
    "from trl import SFTTrainer\nSFTTrainer(model=model, train_dataset=data).train()\n",
    "from trl import GRPOTrainer\nGRPOTrainer(model=model, reward_funcs=[f]).train()\n",
    "from transformers import Trainer as T\nclass Mine(T):\n    pass\nclass Yours(Mine):\n    pass\nYours(model=m)\n",
])
def test_a_file_that_builds_a_trainer_trains_through_transformers(code):
    facts = facts_of(code)
    assert facts.framework == "transformers" and facts.places_on_device
    assert len(facts.trainer_builds) == 1


def test_accelerate_beside_a_trainer_is_the_trainers_own():
    source = (b"from accelerate import PartialState\nfrom trl import SFTTrainer, SFTConfig\n"
              b"with PartialState().main_process_first():\n    data = load()\n"
              b"SFTTrainer(model=m, args=SFTConfig(output_dir='o'), train_dataset=data).train()\n")
    result = migrate_source(source, "sft.py", Options(target="torch_xla"))
    assert {f.code for f in (*result.fixes, *result.diagnostics)} == {"ACC017"}
    assert "SFTConfig(output_dir='o', optim='adamw_torch', dataloader_drop_last=True)" in result.output.decode()


@pytest.mark.parametrize("code", [
    # a model of transformers trained by the file's own loop
    "import torch\nfrom transformers import GPT2LMHeadModel\nmodel = GPT2LMHeadModel(config).cuda()\n"
    "for x in loader:\n    model(x).loss.backward()\n    optimizer.step()\n",
    # a Trainer named, never built
    "from transformers import Trainer\ndef fit(trainer: Trainer):\n    trainer.train()\n",
    # a class of another library called Trainer
    "from minigpt import Trainer\nTrainer(model).run()\n",
])
def test_a_file_that_builds_no_trainer_is_not_managed(code):
    facts = facts_of(code)
    assert facts.framework is None and not facts.trainer_builds


def test_what_the_trainer_calls_each_step_is_a_step_function():
    facts = facts_of(
        "from transformers import Trainer, TrainerCallback\n"
        "class Log(TrainerCallback):\n    def __init__(self): pass\n    def on_step_end(self, *a, **k): pass\n"
        "class Mine(Trainer):\n    def compute_loss(self, model, inputs, **k): pass\n"
        "class Collate:\n    def __call__(self, rows): pass\n"
        "def metrics(p): pass\n"
        "def helper(): pass\n"
        "def main():\n    def preprocess(logits, labels): pass\n    collate = Collate()\n"
        "    Mine(model=m, data_collator=collate, compute_metrics=metrics, preprocess_logits_for_metrics=preprocess,"
        " callbacks=[Log()]).train()\n"
    )
    # compute_metrics is given numpy arrays, once per evaluation
    assert sorted(f.name.value for f in facts.step_functions) == [
        "__call__", "compute_loss", "on_step_end", "preprocess"]


def test_a_trainer_given_a_tokenizer_and_no_collator_pads_each_batch():
    source = (b"import numpy as np\nfrom transformers import Trainer\n"
              b"def compute_metrics(p):\n    return {'acc': (np.argmax(p.predictions, 1) == p.label_ids).mean().item()}\n"
              b"Trainer(model=m, args=a, processing_class=tok, compute_metrics=compute_metrics).train()\n"
              b"Trainer(model=m, args=a, tokenizer=tok, data_collator=default_data_collator).train()\n")
    result = migrate_source(source, "t.py", Options(target="runtime"))
    (padding,) = [d for d in result.diagnostics if d.code != "ACC017"]
    assert (padding.code, padding.line) == ("ACC103", 5)  # compute_metrics reads numpy: no ACC101
    assert padding.message == "the Trainer's default collator pads each batch to its longest sample"


def test_a_transformers_model_in_a_loop_of_the_file_is_migrated_as_any_other():
    result = migrate_source((FIXTURES / "hf_model_loop.in.py").read_bytes(), "loop.py", Options(target="torch_xla"))
    assert {f.code for f in result.fixes} >= {"ACC002", "ACC003", "ACC006"}
    assert not any(f.code == "ACC017" for f in (*result.fixes, *result.diagnostics))


@pytest.mark.parametrize("target, expected", [
    ("torch_xla", [("ACC017", 23)]),  # set --bf16 --optim adamw_torch --dataloader_drop_last; start with launch
    ("torchacc", [("ACC017", 23)]),  # set --optim adamw_torch --dataloader_drop_last
    ("runtime", [("ACC017", 29)]),  # the Trainer trains as it is: how to start many processes
])
def test_settings_from_the_command_line_are_reported_with_their_flags(target, expected):
    assert findings("hf_trainer_parser", target) == expected


def test_the_flags_named_are_the_targets():
    result = migrate_source((FIXTURES / "hf_trainer_parser.in.py").read_bytes(), "p.py", Options(target="torch_xla"))
    (diagnostic,) = result.diagnostics
    assert "--bf16 --optim adamw_torch --dataloader_drop_last" in diagnostic.help
    assert "`torch_xla.launch(_mp_fn)`." in diagnostic.help  # the file defines _mp_fn already
    result = migrate_source((FIXTURES / "hf_trainer_parser.in.py").read_bytes(), "p.py", Options(target="torchacc"))
    (diagnostic,) = result.diagnostics
    assert "`--optim adamw_torch --dataloader_drop_last`" in diagnostic.help and "bf16" not in diagnostic.help


@pytest.mark.parametrize("target", ["runtime", "torchacc", "torch_xla"])
def test_callbacks_the_loss_and_the_collator_are_diagnosed_as_a_loop_is(target):
    found = findings("hf_trainer_padding", target)
    assert [f for f in found if f[0] != "ACC017"] == [
        ("ACC101", 21),  # .item() in a callback's on_step_end
        ("ACC101", 30),  # .item() in the Trainer subclass's compute_loss
        ("ACC103", 42),  # the tokenizer pads to the longest sample of its batch
        ("ACC103", 48),  # so does DataCollatorWithPadding
    ]
    # TrainingArguments(**CONFIG): what to set in the dict, where the target needs anything
    assert [f for f in found if f[0] == "ACC017"] == [("ACC017", 45 if target != "runtime" else 43)]


@pytest.mark.parametrize("target", ["runtime", "torchacc", "torch_xla"])
@pytest.mark.parametrize("name", ["hf_trainer_fp16", "hf_trainer_parser", "hf_trainer_padding"])
def test_each_finding_is_one_short_line_with_a_help(name, target):
    result = migrate_source((FIXTURES / f"{name}.in.py").read_bytes(), f"{name}.py", Options(target=target))
    for diagnostic in result.diagnostics:
        assert len(diagnostic.message) <= 90 and diagnostic.help.endswith("."), diagnostic


def test_keywords_are_added_in_the_calls_layout_and_a_second_run_changes_nothing():
    source = (FIXTURES / "hf_trainer_fp16.in.py").read_bytes()
    result = migrate_source(source, "t.py", Options(target="torch_xla"))
    output = result.output.decode()
    assert '        bf16=True,\n        optim="adamw_torch",\n        dataloader_drop_last=True,\n    )' in output
    assert sorted(f.message.split(":")[0] for f in result.fixes) == [
        "dataloader_drop_last=True", "fp16 -> bf16", 'optim="adamw_torch"']
    assert migrate_source(result.output, "t.py", Options(target="torch_xla")).fixes == []


def test_each_argument_keeps_its_comments_when_keywords_follow_it():
    source = (b"from trl import GRPOConfig, GRPOTrainer\n"
              b"args = GRPOConfig(\n"
              b"    bf16=True,                    # mixed precision\n"
              b"    optim='adamw_torch',\n\n"
              b"    # Hub integration\n"
              b"    push_to_hub=True,             # push the trained model\n"
              b"                                  # under your account\n"
              b"    # vLLM params\n"
              b"    #use_vllm=False,\n"
              b")\n"
              b"GRPOTrainer(model=m, args=args).train()\n")
    output = migrate_source(source, "t.py", Options(target="torch_xla")).output.decode()
    assert ("    push_to_hub=True,             # push the trained model\n"
            "                                  # under your account\n"
            "    # vLLM params\n"
            "    #use_vllm=False,\n"
            "    dataloader_drop_last=True,\n)\n") in output
    assert "    bf16=True,                    # mixed precision\n    optim='adamw_torch',\n\n    # Hub integration\n" in output


def test_fp16_set_on_the_settings_later_is_reported():
    source = (b"from transformers import Trainer, TrainingArguments\n"
              b"training_args = TrainingArguments(output_dir='o')\n"
              b"if torch.cuda.is_available():\n    training_args.fp16 = True\n"
              b"Trainer(model=m, args=training_args).train()\n")
    result = migrate_source(source, "t.py", Options(target="torch_xla"))
    (diagnostic,) = result.diagnostics
    assert (diagnostic.line, diagnostic.message) == (4, "`training_args.fp16` is set: fp16 is not the target's mixed precision")
    assert diagnostic.help.startswith("Set `training_args.bf16` where it is a Trainer's setting.")
    assert migrate_source(source, "t.py", Options(target="torchacc")).diagnostics == []


@pytest.mark.parametrize("code, message", [
    ('TrainingArguments(output_dir="o", fp16=True, bf16=True)', "`fp16` and `bf16` are both given"),
    ('TrainingArguments(output_dir="o", optim=args.optim)', "`optim=args.optim` must not be torch's fused AdamW"),
])
def test_settings_the_rule_cannot_decide_are_reported(code, message):
    source = f"from transformers import Trainer, TrainingArguments\nTrainer(model=m, args={code}).train()\n"
    result = migrate_source(source.encode(), "t.py", Options(target="torch_xla"))
    assert any(d.code == "ACC017" and d.message.startswith(message) for d in result.diagnostics)


@pytest.mark.parametrize("build, message", [
    ("Trainer(model=m, train_dataset=d)", "the Trainer takes default TrainingArguments"),
    ("Trainer(model=m, args=load_arguments())", "TrainingArguments come from outside this file"),
])
def test_settings_made_elsewhere_or_left_to_the_default_are_reported_at_the_trainer(build, message):
    source = f"from transformers import Trainer\n{build}.train()\n"
    (diagnostic,) = migrate_source(source.encode(), "t.py", Options(target="torch_xla")).diagnostics
    assert diagnostic.line == 2 and diagnostic.message.startswith(message)
    assert "set `bf16`, `optim`, `dataloader_drop_last`" in diagnostic.message
    assert "optim='adamw_torch'" in diagnostic.help


def test_an_explicit_fused_optimizer_is_replaced_in_the_files_quotes():
    source = b"from transformers import Trainer, TrainingArguments\nTrainer(args=TrainingArguments(optim='adamw_torch_fused'))\n"
    output = migrate_source(source, "t.py", Options(target="torch_xla")).output.decode()
    assert "TrainingArguments(optim='adamw_torch', dataloader_drop_last=True)" in output


def test_many_devices_are_told_the_targets_launcher():
    source = b'from transformers import Trainer, TrainingArguments\nTrainer(args=TrainingArguments(fsdp="full_shard"))\n'
    result = migrate_source(source, "t.py", Options(target="torch_xla"))
    (diagnostic,) = result.diagnostics
    assert diagnostic.message.startswith("`fsdp` trains on many devices")
    assert "torch_xla.launch(_mp_fn)" in diagnostic.help and '`fsdp_config={"xla": True}`' in diagnostic.help


def _with_trainer(python: str) -> None:
    """Skips where ``python`` cannot build a Trainer (transformers needs Accelerate for it)."""
    found = subprocess.run([python, "-c", "import transformers, accelerate"], capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"{python} has no transformers and accelerate")


@pytest.mark.xla
@pytest.mark.slow
def test_the_fp16_trainer_trains_on_the_xla_device_once_migrated(tmp_path, xla_python):
    # Unmigrated, the Trainer's fused AdamW fails on XLA tensors; migrated, it trains in bf16 there.
    _with_trainer(xla_python)
    source = (FIXTURES / "hf_trainer_fp16.in.py").read_bytes()
    (tmp_path / "train.py").write_bytes(migrate_source(source, "train.py", Options(target="torch_xla")).output)
    wrapper = ("import runpy; runpy.run_path('train.py', run_name='__main__'); import torch_xla.debug.metrics as m; "
               "print('xla executions', (m.metric_data('ExecuteTime') or [0])[0])")
    done = subprocess.run([xla_python, "-c", wrapper], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PJRT_DEVICE": "CPU", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(re.findall(r"^loss \d", done.stdout, re.MULTILINE)) == 4
    assert int(re.search(r"^xla executions (\d+)$", done.stdout, re.MULTILINE).group(1)) > 0


@pytest.mark.xla
@pytest.mark.slow
def test_the_migrated_trainer_matches_the_original_under_verify(tmp_path, monkeypatch, capsys, xla_python):
    # In float32: bfloat16 and float16 round apart beyond verify's tolerance. GPT-2's dropout
    # (attention's too) draws on the CPU on both sides, so the steps match to the float.
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    _with_trainer(xla_python)
    source = (FIXTURES / "hf_trainer_fp16.in.py").read_text().replace("        fp16=True,\n", "")
    (tmp_path / "train.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    code = main(["verify", "train.py", "--target", "torch_xla", "--python", f"torch_xla={xla_python}",
                 "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "match: 4 steps" in out
    assert int(re.search(r"torch_xla: (\d+) graph executions on the xla device", out).group(1)) > 0
