"""Child processes for the tests that kill a process or race two of them.

``start(target, *args)`` forks (no second torch import: seconds saved) and runs ``target(*args)``
on one intra-op thread, as a DataLoader worker does: a fork copies only the calling thread, and a
parallel kernel in the child would wait forever for the parent's OpenMP threads. Make the
events and queues such a child uses with ``CONTEXT``.
"""

import multiprocessing

import torch

CONTEXT = multiprocessing.get_context("fork")


def start(target, *args):
    process = CONTEXT.Process(target=_single_threaded, args=(target, *args))
    process.start()
    return process


def _single_threaded(target, *args):
    torch.set_num_threads(1)
    target(*args)
