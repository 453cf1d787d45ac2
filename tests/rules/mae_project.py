"""A project laid out as MAE, DeiT and DETR are (a module of its own: test modules import it by
name): util/misc.py sets up the process group and holds the loss scaler that steps the
optimizer, engine.py the epoch (rank 0 prints its losses), main.py the entry point, which wraps
the model in DistributedDataParallel and writes each rank's parameters at its end."""

MISC = '''\
import os

import torch
import torch.distributed as dist


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu) if torch.cuda.is_available() else None
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")


class NativeScaler:
    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
        self._scaler.scale(loss).backward()
        self._scaler.unscale_(optimizer)
        if clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()
'''

ENGINE = '''\
import torch


def train_one_epoch(model, data_loader, optimizer, device, loss_scaler):
    for samples, targets in data_loader:
        samples = samples.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        loss = torch.nn.functional.mse_loss(model(samples), targets)
        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())
        optimizer.zero_grad()
        if torch.distributed.get_rank() == 0:
            print(f"loss {loss.item():.6f}")
'''

MAIN = '''\
import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import util.misc as misc
from engine import train_one_epoch
from util.misc import NativeScaler

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda")
args = parser.parse_args()
misc.init_distributed_mode(args)
device = torch.device(args.device)
torch.manual_seed(0)
data = TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
torch.manual_seed(args.rank)  # every rank starts from its own weights: DDP broadcasts rank 0's
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu] if args.device == "cuda" else None)
optimizer = torch.optim.SGD(model.module.parameters(), lr=0.1)
train_one_epoch(model, loader, optimizer, device, NativeScaler())
torch.save(torch.cat([p.detach().flatten() for p in model.module.parameters()]).cpu(), f"params_{args.rank}.pt")
'''
