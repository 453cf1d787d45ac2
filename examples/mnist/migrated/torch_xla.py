"""A plain single-device training loop: a small CNN on synthetic MNIST-shaped data.

Runs in seconds on a CPU (no downloads); uses CUDA when present.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import torch_xla.core.xla_model as xm
import torch_xla
from torch_xla.amp import syncfree
import atexit
import torch_xla.distributed.parallel_loader as pl


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.fc = nn.Linear(16 * 12 * 12, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def synthetic_mnist(samples):
    images = torch.randn(samples, 1, 28, 28)
    labels = torch.randint(0, 10, (samples,))
    return TensorDataset(images, labels)


atexit.register(torch_xla.sync)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    torch.manual_seed(0)
    xm.set_rng_state(0)
    device = torch_xla.device()

    loader = DataLoader(synthetic_mnist(64 * args.steps), batch_size=64, shuffle=True)
    torch.__future__.set_swap_module_params_on_conversion(True)
    model = Net().to(device)
    optimizer = syncfree.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        model.train()
        for step, (x, y) in enumerate(pl.MpDeviceLoader(loader, device)):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            xm.optimizer_step(optimizer)
            xm.add_step_closure(
                lambda epoch, step, loss: print(f"epoch {epoch} step {step} loss {loss.item():.4f}"),
                args=(epoch, step, loss.detach()),
                run_async=False)
        torch_xla.sync()


if __name__ == "__main__":
    main()
