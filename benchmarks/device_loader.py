"""Device loader: is the loading time hidden behind the step?

The loader takes as long per batch as the training step (a sleep of the measured step time,
like a slow disk or decoder); the step is real work (an MLP forward/backward/update). Measured
in one run, per step:

* ``compute``: the step alone, on preloaded batches;
* ``load``: the loader alone;
* ``plain``: ``for batch in loader: step(batch)`` -- load + compute;
* ``MpDeviceLoader``: the same loop over ``pl.MpDeviceLoader(loader, device)``.

Goal: MpDeviceLoader step time <= 1.15 x max(load, compute).

The loader runs on a thread of the same interpreter: each batch it yields needs the GIL, which
the training step holds between torch calls, so on a busy machine the loader waits for it (up to
``sys.getswitchinterval()``, 5 ms) once per batch. That wait adds to the loader's own time, and
shows when load and compute are about equal, as here.

    python benchmarks/device_loader.py [--steps 40] [--repeats 3] [--threads N]
"""

import argparse
import statistics
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

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

    calibration = per_step(compute_only, args.steps)
    loader = SlowLoader(batches, seconds=calibration)  # as long per batch as the step

    def load_only():
        for _ in loader:
            pass

    def plain():
        for x, y in loader:
            step((x.to(device), y.to(device)))

    def device_loader():
        for batch in pl.MpDeviceLoader(loader, device):
            step(batch)

    loops = {"compute": compute_only, "load": load_only, "plain": plain, "ours": device_loader}
    times = {name: [] for name in loops}
    for _ in range(args.repeats):  # interleaved, so that a busy spell hits every variant
        for name, loop in loops.items():
            times[name].append(per_step(loop, args.steps))
    compute, load, plain_time, ours = (statistics.median(times[name]) for name in loops)
    bound = max(load, compute)
    print(f"device={device} steps={args.steps} batch={args.batch_size} width={args.width} "
          f"threads={torch.get_num_threads()} repeats={args.repeats} (medians)")
    print(f"compute only      : {compute * 1e3:8.2f} ms/step")
    print(f"load only         : {load * 1e3:8.2f} ms/batch")
    print(f"plain loop        : {plain_time * 1e3:8.2f} ms/step  ({plain_time / bound:.2f} x max(load, compute))")
    print(f"MpDeviceLoader    : {ours * 1e3:8.2f} ms/step  ({ours / bound:.2f} x max(load, compute), goal <= 1.15)")
    print(f"speed-up over the plain loop = {plain_time / ours:.2f}x")


if __name__ == "__main__":
    main()
