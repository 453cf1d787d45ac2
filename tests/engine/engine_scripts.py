"""Scripts the engine tests migrate (a module of its own: test modules import it by name)."""

TRAIN = b'''import torch

torch.manual_seed(0)
device = torch.device("cuda")
model = torch.nn.Linear(4, 4).cuda()
'''

# A small training loop that runs on the CPU and prints its losses: a real run for verify.
SMALL_TRAINING = """\
import torch
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(8, 4).to(device)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
"""

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
