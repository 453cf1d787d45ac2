"""Image classification in the shape of pytorch/examples' ``imagenet/main.py``.

``mp.spawn`` workers (``--multiprocessing-distributed``) or torchrun (``--dist-url env://``),
``DistributedDataParallel(model, device_ids=[gpu])``, ``.cuda(gpu, non_blocking=True)`` in the
loop, ``DistributedSampler`` with ``set_epoch``, SGD with a ``StepLR`` schedule, AverageMeters and
top-k accuracy. Synthetic 32x32 images and a tiny CNN replace ImageNet and ResNet-50 (the real
script's ``--dummy`` mode), so it runs in seconds on a CPU; without CUDA the workers use gloo.

    python train.py --steps 20
    python train.py --steps 20 --multiprocessing-distributed
    torchrun --nproc_per_node=2 train.py --steps 20 --dist-url env://
"""

import argparse
import os
import random
import time

import torch
import torch.backends.cudnn as cudnn
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim
import torch.utils.data
import torch.utils.data.distributed
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import TensorDataset


def enable_torchacc_compiler():
    return os.getenv('TORCHACC_COMPILER_OPT') is not None

if enable_torchacc_compiler():
    import torchacc.torch_xla.core.xla_model as xm
    import torchacc.torch_xla.distributed.xla_backend
    import atexit
    import torchacc.torch_xla.distributed.parallel_loader as pl


parser = argparse.ArgumentParser(description='PyTorch ImageNet Training (synthetic data)')
parser.add_argument('-j', '--workers', default=0, type=int, metavar='N',
                    help='number of data loading workers (default: 0)')
parser.add_argument('--epochs', default=2, type=int, metavar='N', help='number of total epochs to run')
parser.add_argument('--steps', default=20, type=int, help='stop after this many training steps')
parser.add_argument('-b', '--batch-size', default=32, type=int, metavar='N',
                    help='mini-batch size (default: 32), this is the total batch size of all GPUs on '
                         'the current node when using Data Parallel or Distributed Data Parallel')
parser.add_argument('--lr', '--learning-rate', default=0.002, type=float, metavar='LR', dest='lr')
parser.add_argument('--momentum', default=0.9, type=float, metavar='M', help='momentum')
parser.add_argument('--wd', '--weight-decay', default=1e-4, type=float, metavar='W', dest='weight_decay')
parser.add_argument('-p', '--print-freq', default=1, type=int, metavar='N', help='print frequency')
parser.add_argument('--world-size', default=-1, type=int, help='number of nodes for distributed training')
parser.add_argument('--rank', default=-1, type=int, help='node rank for distributed training')
parser.add_argument('--dist-url', default='tcp://127.0.0.1:23456', type=str,
                    help='url used to set up distributed training')
parser.add_argument('--dist-backend', default='nccl' if torch.cuda.is_available() else 'gloo', type=str,
                    help='distributed backend')
parser.add_argument('--seed', default=0, type=int, help='seed for initializing training')
parser.add_argument('--gpu', default=None, type=int, help='GPU id to use')
parser.add_argument('--multiprocessing-distributed', action='store_true',
                    help='Use multi-processing distributed training to launch N processes per node')


class SmallConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def synthetic_imagenet(samples, seed):
    """Class-dependent mean colour plus noise: learnable, like a tiny ImageFolder."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 10, (samples,), generator=generator)
    images = torch.randn(samples, 3, 32, 32, generator=generator) + (target.float() / 5.0 - 1.0).view(-1, 1, 1, 1)
    return TensorDataset(images, target)


def main():
    args = parser.parse_args()

    if args.seed is not None:
        random.seed(args.seed)
        if enable_torchacc_compiler():
            xm.set_rng_state(args.seed)
        else:
            torch.manual_seed(args.seed)
        cudnn.deterministic = True
        cudnn.benchmark = False

    if args.dist_url == "env://" and args.world_size == -1:
        args.world_size = int(os.environ["WORLD_SIZE"])

    args.distributed = args.world_size > 1 or args.multiprocessing_distributed

    if torch.cuda.is_available():
        ngpus_per_node = torch.cuda.device_count()
    else:
        ngpus_per_node = 1
    if args.multiprocessing_distributed:
        # Since we have ngpus_per_node processes per node, the total world_size
        # needs to be adjusted accordingly
        args.world_size = ngpus_per_node * max(args.world_size, 1)
        # Use torch.multiprocessing.spawn to launch distributed processes: the
        # main_worker process function
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        # Simply call main_worker function
        main_worker(args.gpu, ngpus_per_node, args)


def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu

    if args.gpu is not None and torch.cuda.is_available():
        print("Use GPU: {} for training".format(args.gpu))

    if args.distributed:
        if args.dist_url == "env://" and args.rank == -1:
            args.rank = int(os.environ["RANK"])
        if args.multiprocessing_distributed:
            # For multiprocessing distributed training, rank needs to be the
            # global rank among all the processes
            args.rank = max(args.rank, 0) * ngpus_per_node + gpu
        if enable_torchacc_compiler():
            dist.init_process_group(backend='xla', init_method=args.dist_url,
                                    world_size=args.world_size, rank=args.rank)
        else:
            dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                    world_size=args.world_size, rank=args.rank)
    if enable_torchacc_compiler():
        xm.set_rng_state(args.seed)  # the same initial weights in every worker
    else:
        torch.manual_seed(args.seed)  # the same initial weights in every worker
    model = SmallConvNet()

    if enable_torchacc_compiler():
        torch.__future__.set_swap_module_params_on_conversion(True)

        if False:
            print('using CPU, this will be slow')
            if not enable_torchacc_compiler():
                if args.distributed:
                    model = torch.nn.parallel.DistributedDataParallel(model)
        elif args.distributed:
            # For multiprocessing distributed, DistributedDataParallel constructor
            # should always set the single device scope, otherwise,
            # DistributedDataParallel will use all available devices.
            if args.gpu is not None:
                if enable_torchacc_compiler():
                    model.to(xm.xla_device())
                else:
                    torch.cuda.set_device(args.gpu)
                    model.cuda(args.gpu)
                # When using a single GPU per process and per
                # DistributedDataParallel, we need to divide the batch size
                # ourselves based on the total number of GPUs of the current node.
                args.batch_size = int(args.batch_size / ngpus_per_node)
                args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
                if not enable_torchacc_compiler():
                    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
            else:
                if enable_torchacc_compiler():
                    model.to(xm.xla_device())
                else:
                    model.cuda()
                    # DistributedDataParallel will divide and allocate batch_size to all
                    # available GPUs if device_ids are not set
                    model = torch.nn.parallel.DistributedDataParallel(model)
        elif args.gpu is not None:
            if enable_torchacc_compiler():
                model = model.to(xm.xla_device())
            else:
                torch.cuda.set_device(args.gpu)
                model = model.cuda(args.gpu)
        else:
            if enable_torchacc_compiler():
                model = model.to(xm.xla_device())
            else:
                model = model.cuda()
    else:
        if not torch.cuda.is_available():
            print('using CPU, this will be slow')
            if args.distributed:
                model = torch.nn.parallel.DistributedDataParallel(model)
        elif args.distributed:
            # For multiprocessing distributed, DistributedDataParallel constructor
            # should always set the single device scope, otherwise,
            # DistributedDataParallel will use all available devices.
            if args.gpu is not None:
                torch.cuda.set_device(args.gpu)
                model.cuda(args.gpu)
                # When using a single GPU per process and per
                # DistributedDataParallel, we need to divide the batch size
                # ourselves based on the total number of GPUs of the current node.
                args.batch_size = int(args.batch_size / ngpus_per_node)
                args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
            else:
                model.cuda()
                # DistributedDataParallel will divide and allocate batch_size to all
                # available GPUs if device_ids are not set
                model = torch.nn.parallel.DistributedDataParallel(model)
        elif args.gpu is not None:
            torch.cuda.set_device(args.gpu)
            model = model.cuda(args.gpu)
        else:
            model = model.cuda()

    # define loss function (criterion), optimizer, and learning rate scheduler
    criterion = nn.CrossEntropyLoss()
    if enable_torchacc_compiler():
        if True:
            if enable_torchacc_compiler():
                criterion = criterion.to(xm.xla_device())
            else:
                criterion = criterion.cuda(args.gpu)
    else:
        if torch.cuda.is_available():
            criterion = criterion.cuda(args.gpu)

    optimizer = torch.optim.SGD(model.parameters(), args.lr,
                                momentum=args.momentum,
                                weight_decay=args.weight_decay)

    """Sets the learning rate to the initial LR decayed by 10 every epoch"""
    scheduler = StepLR(optimizer, step_size=1, gamma=0.1)

    cudnn.benchmark = True

    train_dataset = synthetic_imagenet(1024, seed=1)
    val_dataset = synthetic_imagenet(256, seed=2)

    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    else:
        train_sampler = None
        val_sampler = None

    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)

    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False,
        num_workers=args.workers, pin_memory=True, sampler=val_sampler)

    args.global_step = 0
    for epoch in range(args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)

        # train for one epoch
        train(train_loader, model, criterion, optimizer, epoch, args)

        # evaluate on validation set
        acc1 = validate(val_loader, model, criterion, args)

        scheduler.step()
        if args.global_step >= args.steps:
            break

    if args.distributed:
        dist.destroy_process_group()


if enable_torchacc_compiler():
    atexit.register(xm.mark_step)


def train(train_loader, model, criterion, optimizer, epoch, args):
    batch_time = AverageMeter('Time', ':6.3f')
    losses = AverageMeter('Loss', ':.4e')
    top1 = AverageMeter('Acc@1', ':6.2f')

    # switch to train mode
    model.train()

    end = time.time()
    if enable_torchacc_compiler():
        for i, (images, target) in enumerate(pl.MpDeviceLoader(train_loader, xm.xla_device())):
            if enable_torchacc_compiler():
                if True:
                    if not enable_torchacc_compiler():
                        images = images.cuda(args.gpu, non_blocking=True)
                        target = target.cuda(args.gpu, non_blocking=True)
            else:
                if torch.cuda.is_available():
                    images = images.cuda(args.gpu, non_blocking=True)
                    target = target.cuda(args.gpu, non_blocking=True)

            # compute output
            output = model(images)
            loss = criterion(output, target)

            # measure accuracy and record loss
            acc1, = accuracy(output, target, topk=(1,))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1[0], images.size(0))

            # compute gradient and do SGD step
            optimizer.zero_grad()
            loss.backward()
            if enable_torchacc_compiler():
                xm.optimizer_step(optimizer)
            else:
                optimizer.step()

            # measure elapsed time
            batch_time.update(time.time() - end)
            end = time.time()

            if i % args.print_freq == 0 and is_main(args):
                if enable_torchacc_compiler():
                    xm.add_step_closure(
                        lambda epoch, global_step, loss, top1, batch_time: print(f"epoch {epoch} step {global_step} loss {loss.item():.4f} {top1} {batch_time}"),
                        args=(epoch, args.global_step, loss.detach(), top1, batch_time),
                        run_async=False)
                else:
                    print(f"epoch {epoch} step {args.global_step} loss {loss.item():.4f} {top1} {batch_time}")
            args.global_step += 1
            if args.global_step >= args.steps:
                break
        xm.mark_step()
    else:
        for i, (images, target) in enumerate(train_loader):
            if torch.cuda.is_available():
                images = images.cuda(args.gpu, non_blocking=True)
                target = target.cuda(args.gpu, non_blocking=True)

            # compute output
            output = model(images)
            loss = criterion(output, target)

            # measure accuracy and record loss
            acc1, = accuracy(output, target, topk=(1,))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1[0], images.size(0))

            # compute gradient and do SGD step
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            # measure elapsed time
            batch_time.update(time.time() - end)
            end = time.time()

            if i % args.print_freq == 0 and is_main(args):
                print(f"epoch {epoch} step {args.global_step} loss {loss.item():.4f} {top1} {batch_time}")
            args.global_step += 1
            if args.global_step >= args.steps:
                break


def validate(val_loader, model, criterion, args):
    losses = AverageMeter('Loss', ':.4e')
    top1 = AverageMeter('Acc@1', ':6.2f')

    # switch to evaluate mode
    model.eval()

    with torch.no_grad():
        if enable_torchacc_compiler():
            for i, (images, target) in enumerate(pl.MpDeviceLoader(val_loader, xm.xla_device())):
                if enable_torchacc_compiler():
                    if True:
                        if not enable_torchacc_compiler():
                            images = images.cuda(args.gpu, non_blocking=True)
                            target = target.cuda(args.gpu, non_blocking=True)
                else:
                    if torch.cuda.is_available():
                        images = images.cuda(args.gpu, non_blocking=True)
                        target = target.cuda(args.gpu, non_blocking=True)

                output = model(images)
                loss = criterion(output, target)

                acc1, = accuracy(output, target, topk=(1,))
                losses.update(loss.item(), images.size(0))
                top1.update(acc1[0], images.size(0))
        else:
            for i, (images, target) in enumerate(val_loader):
                if torch.cuda.is_available():
                    images = images.cuda(args.gpu, non_blocking=True)
                    target = target.cuda(args.gpu, non_blocking=True)

                output = model(images)
                loss = criterion(output, target)

                acc1, = accuracy(output, target, topk=(1,))
                losses.update(loss.item(), images.size(0))
                top1.update(acc1[0], images.size(0))

    if args.distributed:
        top1.all_reduce()
    if is_main(args):
        print(f' * Acc@1 {top1.avg:.3f}')
    return top1.avg


def is_main(args):
    return not args.distributed or args.rank == 0


class AverageMeter(object):
    """Computes and stores the average and current value"""

    def __init__(self, name, fmt=':f'):
        self.name = name
        self.fmt = fmt
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def all_reduce(self):
        if enable_torchacc_compiler():
            device = xm.xla_device()
            xm.set_replication(device, [device])
        else:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        total = torch.tensor([self.sum, self.count], dtype=torch.float32, device=device)
        dist.all_reduce(total, dist.ReduceOp.SUM, async_op=False)
        self.sum, self.count = total.tolist()
        self.avg = self.sum / self.count

    def __str__(self):
        fmtstr = '{name} {val' + self.fmt + '} ({avg' + self.fmt + '})'
        return fmtstr.format(**self.__dict__)


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)

        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))

        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


if __name__ == '__main__':
    main()
