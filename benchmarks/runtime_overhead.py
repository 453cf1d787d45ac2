"""Runtime overhead: a training loop migrated to accrewrite.runtime vs the original eager loop.

One process on the CPU, compile off. The original loop is plain PyTorch (DataLoader, .to(device),
optimizer.step(), a loss log that reads .item() every --log-every steps); the migrated loop is
what ``accrewrite migrate --target runtime`` makes of it (xla_device, pl.MpDeviceLoader,
xm.optimizer_step, the log in an async step closure). Both train the same model on the same data;
the two loops alternate, --repeats times each, and the medians are compared.

Goal: migrated / original <= 1.05.

The device loader's thread collates the next batch while the step runs. On a machine with few
free cores an intra-op thread pool as wide as the machine then competes with it (OpenMP teams
wait for a descheduled member), which --threads shows: compare the ratio at the default thread
count and at --threads 1.

    python benchmarks/runtime_overhead.py [--steps 200] [--repeats 5] [--threads N]
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
    """(wall seconds, process CPU seconds, logged losses) of one run of ``loop``."""
    model, loader, optimizer = build(args.width, args.batch_size, args.steps)
    logged = []
    wall, cpu = time.perf_counter(), time.process_time()
    loop(model, loader, optimizer, args.log_every, lambda step, loss: logged.append((step, loss)))
    return time.perf_counter() - wall, time.process_time() - cpu, logged


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    timed(original_loop, args), timed(migrated_loop, args)  # warm-up: allocator, threads
    runs = {"original": [], "migrated": []}
    for _ in range(args.repeats):
        runs["original"].append(timed(original_loop, args))
        runs["migrated"].append(timed(migrated_loop, args))
    # same training, same logged losses: the comparison is like for like
    original_log, migrated_log = runs["original"][-1][2], runs["migrated"][-1][2]
    assert [s for s, _ in original_log] == [s for s, _ in migrated_log]
    assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(original_log, migrated_log))

    wall = {name: statistics.median(r[0] for r in rs) for name, rs in runs.items()}
    cpu = {name: statistics.median(r[1] for r in rs) for name, rs in runs.items()}
    print(f"steps={args.steps} batch={args.batch_size} width={args.width} repeats={args.repeats} "
          f"threads={torch.get_num_threads()}")
    for name in runs:
        print(f"{name:9s}: {wall[name] * 1e3 / args.steps:8.3f} ms/step wall, "
              f"{cpu[name] * 1e3 / args.steps:8.3f} ms/step CPU (medians of {args.repeats})")
    # CPU time counts the work each loop does and is steadier than wall time on a busy machine.
    print(f"overhead ratio migrated/original = {wall['migrated'] / wall['original']:.3f} wall, "
          f"{cpu['migrated'] / cpu['original']:.3f} CPU time  (goal <= 1.05)")


if __name__ == "__main__":
    main()
