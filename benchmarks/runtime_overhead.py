"""Runtime overhead: a training loop migrated to accrewrite.runtime vs the original eager loop.

One process on the CPU, compile off. The original loop is plain PyTorch (DataLoader, .to(device),
optimizer.step(), a loss log that reads .item() every --log-every steps); the migrated loop is
what ``accrewrite migrate --target runtime`` makes of it (xla_device, pl.MpDeviceLoader,
xm.optimizer_step, the log in an async step closure). Both train the same model on the same data;
the two loops alternate, --repeats times each, and the medians are compared.

Goal (issue 4): migrated / original <= 1.05.

    python benchmarks/runtime_overhead.py [--steps 200] [--repeats 5]
"""

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import accrewrite.runtime.parallel_loader as pl
import accrewrite.runtime.xla_model as xm


def build(width, batch_size, steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )
    data = TensorDataset(torch.randn(steps * batch_size, width), torch.randint(0, 10, (steps * batch_size,)))
    loader = DataLoader(data, batch_size=batch_size, num_workers=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, loader, optimizer


def original_loop(model, loader, optimizer, log_every, log):
    device = torch.device("cpu")
    model.to(device)
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % log_every == 0:
            log(step, loss.item())


def migrated_loop(model, loader, optimizer, log_every, log):
    device = xm.xla_device()
    xm.set_replication(device, [device])
    model.to(device)
    for step, (x, y) in enumerate(pl.MpDeviceLoader(loader, device)):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)
        if step % log_every == 0:
            xm.add_step_closure(lambda s, l: log(s, l.item()), args=(step, loss.detach()), run_async=True)
    xm.mark_step(wait=True)


def timed(loop, args):
    model, loader, optimizer = build(args.width, args.batch_size, args.steps)
    logged = []
    start = time.perf_counter()
    loop(model, loader, optimizer, args.log_every, lambda step, loss: logged.append((step, loss)))
    elapsed = time.perf_counter() - start
    return elapsed, logged


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    timed(original_loop, args), timed(migrated_loop, args)  # warm-up: allocator, threads
    original, migrated = [], []
    for _ in range(args.repeats):
        t, original_log = timed(original_loop, args)
        original.append(t)
        t, migrated_log = timed(migrated_loop, args)
        migrated.append(t)
    # same training, same logged losses: the comparison is like for like
    assert [s for s, _ in original_log] == [s for s, _ in migrated_log]
    assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(original_log, migrated_log))

    o, m = statistics.median(original), statistics.median(migrated)
    print(f"steps={args.steps} batch={args.batch_size} width={args.width} repeats={args.repeats} "
          f"threads={torch.get_num_threads()}")
    print(f"original eager loop : {o * 1e3 / args.steps:8.3f} ms/step (median of {args.repeats})")
    print(f"migrated (runtime)  : {m * 1e3 / args.steps:8.3f} ms/step")
    print(f"overhead ratio migrated/original = {m / o:.3f}  (goal <= 1.05)")


if __name__ == "__main__":
    main()
