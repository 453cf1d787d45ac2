"""ACC109: a script that a library's trainer trains says so, and only such a script."""

import pytest

from accrewrite.engine import Options, migrate_source

FASTAI = b"""from fastai.vision.all import *
import torch

dls = ImageDataLoaders.from_folder(path, valid_pct=0.2)
learn = vision_learner(dls, resnet34, metrics=error_rate)
learn.fine_tune(1)
"""
CHAINED = b"import torch\nimport d2l.torch as d2l\nd2l.Trainer(max_epochs=3, num_gpus=1).fit(model, data)\n"
OWN_LOOP = b"""import torch
from d2l import torch as d2l

trainer = d2l.Trainer(max_epochs=10)
model = torch.nn.Linear(2, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in data:
    loss = model(x.cuda()).sum()
    loss.backward()
    optimizer.step()
trainer.fit(model, data)
"""
LIGHTNING = b"import torch\nimport lightning as L\ntrainer = L.Trainer(max_epochs=1)\ntrainer.fit(model, data)\n"


def findings(source: bytes, target: str) -> list[tuple[str, int]]:
    result = migrate_source(source, "nb.py", Options(target=target))
    assert result.error is None
    return [(d.code, d.line) for d in result.diagnostics if d.code == "ACC109"]


@pytest.mark.parametrize("target", ["runtime", "torch_xla", "torchacc"])
@pytest.mark.parametrize("source, line", [(FASTAI, 6), (CHAINED, 3)])
def test_a_library_trainer_is_reported_on_every_target(source, line, target):
    assert findings(source, target) == [("ACC109", line)]


@pytest.mark.parametrize("source", [OWN_LOOP, LIGHTNING])
def test_a_loop_of_the_file_or_a_framework_with_a_rule_is_not_a_library_trainer(source):
    assert findings(source, "torch_xla") == []


def test_the_message_names_the_trainer():
    (diagnostic,) = [d for d in migrate_source(CHAINED, "nb.py", Options(target="torch_xla")).diagnostics
                     if d.code == "ACC109"]
    assert diagnostic.message == "`d2l.torch.Trainer` trains this script, in a loop outside it"
