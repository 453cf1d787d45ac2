"""Scripts the engine tests migrate (a module of its own: test modules import it by name)."""

TRAIN = b'''import torch

torch.manual_seed(0)
device = torch.device("cuda")
model = torch.nn.Linear(4, 4).cuda()
'''

# A training loop that reads `loss` on three lines (one finding told once) and `x` on a fourth.
HOST_SYNCS = b'''import torch
model = model.cuda()
for x, y in loader:
    loss = model(x, y)
    loss.backward()
    optimizer.step()
    a = loss.item()
    b = loss.item()
    c = loss.item()
    d = x.item()
'''
