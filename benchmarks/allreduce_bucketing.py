"""All-reduce bucketing: ``xm.all_reduce`` of a 100-tensor model's gradients (bucketed: one
collective per bucket) vs one ``dist.all_reduce`` per tensor, on 2 gloo processes.

The gradient list mimics a model of 50 layers (a weight and a bias each: 100 tensors). Both
methods reduce the same tensors, alternating, --repeats times each after a barrier; rank 0
prints the medians and the ratio, plus the bf16-compressed variant.

Goal: bucketed at least 3x faster than per-tensor.

    python benchmarks/allreduce_bucketing.py [--layers 50] [--width 128] [--repeats 20]
"""

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def gradients(layers, width):
    return [t for _ in range(layers) for t in (torch.randn(width, width), torch.randn(width))]


def per_tensor(tensors):
    for tensor in tensors:
        dist.all_reduce(tensor)
        tensor.mul_(1.0 / dist.get_world_size())


def timed(fn, tensors):
    dist.barrier()
    start = time.perf_counter()
    fn(tensors)
    return time.perf_counter() - start


def run(rank, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    import accrewrite.runtime.xla_model as xm

    dist.init_process_group("gloo")
    torch.manual_seed(rank)
    tensors = gradients(args.layers, args.width)
    methods = {
        "per-tensor dist.all_reduce": per_tensor,
        "xm.all_reduce (bucketed)": lambda ts: xm.all_reduce("mean", ts),
        "xm.all_reduce (bucketed, bf16 wire)": lambda ts: xm.all_reduce("mean", ts, compress="bf16"),
    }
    times = {name: [] for name in methods}
    for name, fn in methods.items():  # warm-up
        timed(fn, tensors)
    for _ in range(args.repeats):
        for name, fn in methods.items():
            times[name].append(timed(fn, tensors))
    if rank == 0:
        medians = {name: statistics.median(t) for name, t in times.items()}
        base = medians["per-tensor dist.all_reduce"]
        numel = sum(t.numel() for t in tensors)
        print(f"world={world} tensors={len(tensors)} elements={numel} ({numel * 4 / 2**20:.1f} MiB fp32) "
              f"repeats={args.repeats}")
        for name, median in medians.items():
            print(f"{name:38s}: {median * 1e3:8.3f} ms   speed-up vs per-tensor {base / median:5.2f}x")
        print("goal: bucketed >= 3x faster than per-tensor")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=50)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(run, args=(args.world, port, args), nprocs=args.world)


if __name__ == "__main__":
    main()
