"""benchmarks/diagnostics_recall.py on a labelled script written here: found, missed, moved by
ACC009, false alarms and device waits are told apart, per-batch padding is counted beside the
host syncs, and labels follow their line's text."""

import json
import pathlib
import textwrap

from benchmark_module import load

dr = load("diagnostics_recall")

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""\
    import torch
    from metrics import evaluate

    model = torch.nn.Linear(8, 2).cuda()
    best = 10.0
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        loss.backward()
        optimizer.step()
        total = loss.item()
        print(f"step {step} loss {loss.item():.4f}")
        score = evaluate(model)
        with open("log.txt", "a") as log:
            log.write("score {}".format(score))
        peak = loss.max().item()
        torch.cuda.synchronize()
        if loss < best:
            best = total
    padded = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)
    fixed = tokenizer(texts, padding="max_length", max_length=128)
""")

# Lines as labelled by hand, two of them numbered as in an older version of the script (two
# lines higher): their text finds them.
LABELS = {"codes": ["ACC101", "ACC102", "ACC103"], "files": [{"repository": "me/loops", "path": "train.py", "labels": [
    {"line": 8, "code": "ACC101", "text": "total = loss.item()", "sync": True},
    {"line": 9, "code": "ACC101", "text": 'print(f"step {step} loss {loss.item():.4f}")', "sync": True},
    {"line": 14, "code": "ACC101", "text": 'log.write("score {}".format(score))', "sync": True,
     "expression": "score: a tensor that evaluate() of another module returns"},
    {"line": 17, "code": "ACC102", "text": "if loss < best:", "sync": True},
    {"line": 18, "code": "ACC101", "text": "best = total", "sync": False, "reason": "a Python float"},
    {"line": 19, "code": "ACC103", "text": "padded = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)",
     "sync": True},
    {"line": 20, "code": "ACC103", "text": 'fixed = tokenizer(texts, padding="max_length", max_length=128)',
     "sync": False, "reason": "a fixed length"},
]}]}


def measure(tmp_path):
    (tmp_path / "me+loops").mkdir()
    (tmp_path / "me+loops" / "train.py").write_text(SCRIPT)
    return dr.measure(tmp_path, LABELS)


def test_each_finding_is_matched_to_a_label(tmp_path):
    result = measure(tmp_path)
    assert result["syncs"] == 5 and result["negatives"] == 2 and not result["stale"]
    migrated, every, control, shapes = (result["codes"][column] for column in dr.COLUMNS)
    # The print moves into a step closure; the line nobody labelled (peak) is a false alarm;
    # the synchronize is a wait, not a read.
    assert (migrated["found"], migrated["moved"], migrated["missed"], migrated["false_alarms"]) == (1, 1, 1, 1)
    assert migrated["not_counted"] == 1
    assert migrated["misses"] == ['me+loops/train.py:14: log.write("score {}".format(score))']
    assert migrated["false_alarm_lines"] == ["me+loops/train.py:15: peak = loss.max().item()  (not labelled a sync)"]
    assert (every["found"], every["moved"], every["missed"], every["false_alarms"]) == (2, 0, 1, 1)
    assert (control["found"], control["missed"], control["false_alarms"]) == (1, 0, 0)
    assert control["recall"] == 1.0 and every["recall"] == 2 / 3 and every["precision"] == 2 / 3
    assert (shapes["found"], shapes["missed"], shapes["false_alarms"]) == (1, 0, 0)


def test_a_label_whose_text_is_gone_is_reported(tmp_path):
    labels = json.loads(json.dumps(LABELS))
    labels["files"][0]["labels"][0]["text"] = "total = float(loss)"
    (tmp_path / "me+loops").mkdir()
    (tmp_path / "me+loops" / "train.py").write_text(SCRIPT)
    result = dr.measure(tmp_path, labels)
    assert result["stale"] == ["me+loops/train.py:8: label text not found: total = float(loss)"]


def test_before_measures_another_source_tree_in_one_table(tmp_path, capsys):
    (tmp_path / "me+loops").mkdir()
    (tmp_path / "me+loops" / "train.py").write_text(SCRIPT)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(LABELS))
    assert dr.main([str(tmp_path), str(labels), "--before", str(ROOT)]) == 0
    out = capsys.readouterr().out
    assert "labelled files 1: 5 occurrences, 2 negatives" in out
    recall = next(line for line in out.splitlines() if line.startswith("recall"))
    assert recall.split()[1:] == ["0.50", "0.50", "0.67", "0.67", "1.00", "1.00", "1.00", "1.00"]
