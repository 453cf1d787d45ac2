"""Device loader: is the loading time hidden behind the step?

The loader takes as long per batch as the training step (a sleep of the measured step time,
like a slow disk or decoder); the step is real work (an MLP forward/backward/update). Measured
in one run, per step:

* ``compute``: the step alone, on preloaded batches;
* ``load``: the loader alone;
* ``plain``: ``for batch in loader: step(batch)`` -- load + compute;
* ``MpDeviceLoader``: the same loop over ``pl.MpDeviceLoader(loader, device)``.

Goal (issue 4): MpDeviceLoader step time <= 1.15 x max(load, compute).

    python benchmarks/device_loader.py [--steps 40]
"""

import argparse
import time

import torch

import accrewrite.runtime.parallel_loader as pl
import accrewrite.runtime.xla_model as xm


class SlowLoader:
    """Yields ``batches``, sleeping ``seconds`` before each one."""

    def __init__(self, batches, seconds):
        self.batches, self.seconds = batches, seconds

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            time.sleep(self.seconds)
            yield batch


def make_step(width, device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(batch):
        x, y = batch
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def per_step(loop, steps):
    start = time.perf_counter()
    loop()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()

    device = xm.xla_device()
    batches = [
        (torch.randn(args.batch_size, args.width), torch.randint(0, 10, (args.batch_size,)))
        for _ in range(args.steps)
    ]
    step = make_step(args.width, device)
    on_device = [(x.to(device), y.to(device)) for x, y in batches]
    for batch in on_device[:5]:  # warm-up
        step(batch)

    def compute_only():
        for batch in on_device:
            step(batch)

    compute = per_step(compute_only, args.steps)
    loader = SlowLoader(batches, seconds=compute)  # as long per batch as the step

    def load_only():
        for _ in loader:
            pass

    def plain():
        for x, y in loader:
            step((x.to(device), y.to(device)))

    def device_loader():
        for batch in pl.MpDeviceLoader(loader, device):
            step(batch)

    load = per_step(load_only, args.steps)
    plain_time = per_step(plain, args.steps)
    ours = per_step(device_loader, args.steps)
    bound = max(load, compute)
    print(f"device={device} steps={args.steps} batch={args.batch_size} width={args.width}")
    print(f"compute only      : {compute * 1e3:8.2f} ms/step")
    print(f"load only         : {load * 1e3:8.2f} ms/batch")
    print(f"plain loop        : {plain_time * 1e3:8.2f} ms/step  ({plain_time / bound:.2f} x max(load, compute))")
    print(f"MpDeviceLoader    : {ours * 1e3:8.2f} ms/step  ({ours / bound:.2f} x max(load, compute), goal <= 1.15)")
    print(f"speed-up over the plain loop = {plain_time / ours:.2f}x")


if __name__ == "__main__":
    main()
