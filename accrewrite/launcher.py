"""``accrun``: launch a migrated script on one or many processes. It is torchrun
(``torch.distributed.run``), with what accrewrite's runtime needs set beforehand:

    accrun [--allreduce-dtype bf16|fp16|none] [--bucket-mb MB] [torchrun options] SCRIPT [ARGS]

* ``--allreduce-dtype`` and ``--bucket-mb`` (before any torchrun option) set the runtime's
  gradient all-reduce wire dtype and bucket size for every process, through the environment
  variables ``ACCREWRITE_ALLREDUCE_DTYPE`` and ``ACCREWRITE_BUCKET_MB``.
* ``OMP_NUM_THREADS``, when unset, becomes the machine's cores divided among the local
  processes (torchrun would leave each process a single thread, which starves CPU training).
* With ``--max-restarts`` above 0, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` unless set: with
  torchrun's shared rendezvous store, a restarted worker can read a peer's address from the
  attempt before and fail with "connection refused" (pytorch/pytorch#135712).

Everything else (rendezvous, ``--nproc_per_node``, ``--nnodes``, elastic restarts, a free port
on a single node) is torchrun's. Torch is imported only when the job is launched, so
``import accrewrite.launcher`` stays light.
"""

import argparse
import os
import sys
from types import MappingProxyType

from accrewrite.choices import positive

_OWN_OPTIONS = MappingProxyType({
    "--allreduce-dtype": "ACCREWRITE_ALLREDUCE_DTYPE",
    "--bucket-mb": "ACCREWRITE_BUCKET_MB",
})


def _own_options_parser():
    parser = argparse.ArgumentParser(prog="accrun", add_help=False)
    parser.add_argument("--allreduce-dtype", choices=["bf16", "fp16", "none"])
    parser.add_argument("--bucket-mb", type=positive(float))
    return parser


def split_own_options(argv):
    """``(environment updates, torchrun argv)``: accrun's options lead the command line."""
    parser = _own_options_parser()
    own = []
    rest = list(argv)
    while rest and rest[0].split("=", 1)[0] in _OWN_OPTIONS:
        takes = 1 if "=" in rest[0] else 2
        own, rest = own + rest[:takes], rest[takes:]
    parsed = parser.parse_args(own)
    environment = {}
    for option, variable in _OWN_OPTIONS.items():
        value = getattr(parsed, option.lstrip("-").replace("-", "_"))
        if value is not None:
            environment[variable] = str(value)
    return environment, rest


def _threads_per_process(nproc_per_node):
    """Cores per local process, or None when torchrun resolves the process count itself."""
    try:
        nproc = int(nproc_per_node)
    except ValueError:  # "auto", "gpu", "cpu", ...
        return None
    return max(1, (os.cpu_count() or 1) // max(nproc, 1))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip(), end="\n\ntorchrun's options follow.\n\n")
    environment, torchrun_argv = split_own_options(argv)

    from torch.distributed import run as torchrun  # the launcher proper

    args = torchrun.parse_args(torchrun_argv)
    threads = _threads_per_process(args.nproc_per_node)
    if threads is not None:
        environment.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", str(threads)))
    if args.max_restarts > 0:
        environment.setdefault(
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        )
    os.environ.update(environment)
    torchrun.main(torchrun_argv)


if __name__ == "__main__":
    main()
