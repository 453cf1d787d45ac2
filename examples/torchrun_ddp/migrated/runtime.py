"""DistributedDataParallel under torchrun, in the shape of pytorch/examples'
``distributed/ddp-tutorial-series/multigpu_torchrun.py``.

``LOCAL_RANK`` comes from the environment that torchrun sets, ``init_process_group`` /
``destroy_process_group`` frame the run, a ``Trainer`` class wraps the model in DDP, a
``DistributedSampler`` shards the data (``set_epoch`` every epoch) and snapshots save
``self.model.module``. A small MLP on a synthetic regression task; without CUDA the processes use
gloo on the CPU. Launch it with torchrun:

    torchrun --standalone --nproc_per_node=2 train.py --steps 20
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
import accrewrite.runtime.xla_model as xm
import accrewrite.runtime.parallel_loader as pl


def ddp_setup():
    if torch.cuda.is_available():
        pass
    init_process_group(backend=xm.dist_backend())


class MyTrainDataset(Dataset):
    """y = a fixed random linear map of x, plus noise."""

    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(20, 1, generator=generator) / 20 ** 0.5
        self.data = []
        for _ in range(size):
            x = torch.randn(20, generator=generator)
            self.data.append((x, x @ weight + 0.1 * torch.randn(1, generator=generator)))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
        max_steps: int,
    ) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.device = xm.xla_device()
        xm.set_replication(self.device, [self.device])
        self.model = model.to(self.device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.steps_run = 0
        self.max_steps = max_steps
        self.snapshot_path = snapshot_path
        if snapshot_path and os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)

        xm.broadcast_master_param(self.model)

    def _load_snapshot(self, snapshot_path):
        loc = xm.xla_device()
        xm.set_replication(loc, [loc])
        snapshot = torch.load(snapshot_path, map_location=loc)
        self.model.load_state_dict({key.removeprefix("module."): value for key, value in snapshot["MODEL_STATE"].items()})
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        xm.optimizer_step(self.optimizer)
        return loss

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        if self.global_rank == 0:
            print(f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in pl.MpDeviceLoader(self.train_data, self.device):
            loss = self._run_batch(source, targets)
            if self.global_rank == 0:
                xm.add_step_closure(
                    lambda epoch, steps_run, loss: print(f"epoch {epoch} step {steps_run} loss {loss.item():.4f}"),
                    args=(epoch, self.steps_run, loss.detach()),
                    run_async=False)
            self.steps_run += 1
            if self.steps_run >= self.max_steps:
                break
        xm.mark_step()

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.snapshot_path and self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
            if self.steps_run >= self.max_steps:
                break


def load_train_objs():
    train_set = MyTrainDataset(2048)  # load your dataset
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=True,
        shuffle=False,
        sampler=DistributedSampler(dataset)
    )


def main(save_every: int, total_epochs: int, batch_size: int, max_steps: int, snapshot_path: str = ""):
    ddp_setup()
    xm.set_rng_state(0)
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path, max_steps)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('--total_epochs', default=2, type=int, help='Total epochs to train the model')
    parser.add_argument('--save_every', default=1, type=int, help='How often to save a snapshot')
    parser.add_argument('--batch_size', default=32, type=int, help='Input batch size on each device (default: 32)')
    parser.add_argument('--steps', default=20, type=int, help='Stop after this many steps')
    parser.add_argument('--snapshot_path', default='', help='Save snapshots here (none when empty)')
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size, args.steps, args.snapshot_path)
