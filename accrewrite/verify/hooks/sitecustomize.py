"""Put first on ``PYTHONPATH`` by ``accrewrite verify``, so that every Python process of a side
(the script, torchrun's workers, the processes the script starts) records its optimizer steps
and writes none of the user's files: the probe and the redirection beside this folder are loaded
by their paths. Then the interpreter's own sitecustomize, if any, runs as it would have."""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _start(name: str) -> None:
    path = os.path.join(os.path.dirname(_here), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_accrewrite_verify_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.start()


def _chain() -> None:
    saved = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != _here]
    this = sys.modules.pop("sitecustomize")
    try:
        import sitecustomize  # noqa: F401 - the next one on the path
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = this  # the import that ran this one expects a module
    finally:
        sys.path[:] = saved


_start("probe")
_start("redirect")  # after the probe, which imports torch
_chain()
