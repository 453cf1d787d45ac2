"""Stable fingerprints of datasets, functions and values, for keying caches on disk.

A fingerprint must be equal across processes and runs for the same inputs (so no ``id()``, no
``hash()`` of strings, no memory addresses) and differ when the code or data that produces a
cached result changes.
"""

import functools
import hashlib
import os
import pickle
import sys
import sysconfig
import types

import numpy as np
import torch

FINGERPRINT_VERSION = 1

_LIBRARY_DIRS = tuple(
    os.path.realpath(path) + os.sep
    for path in {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def fingerprint(dataset, function, fn_kwargs: dict, dataset_id: str | None = None) -> str:
    """SHA-256 hex digest of a dataset's identity, a function's code and its keyword arguments."""
    digest = hashlib.sha256(f"accrewrite-preprocess-{FINGERPRINT_VERSION}".encode())
    _feed_dataset(digest, dataset, dataset_id)
    _feed(digest, function, set())
    _feed(digest, fn_kwargs, set())
    return digest.hexdigest()


def _feed_dataset(digest, dataset, dataset_id) -> None:
    if dataset_id is not None:
        _feed(digest, ("dataset_id", str(dataset_id)), set())
    elif isinstance(getattr(dataset, "_fingerprint", None), str):  # a Hugging Face Dataset
        _feed(digest, ("hf", dataset._fingerprint), set())
    else:
        length = len(dataset)
        probes = sorted({0, length // 2, length - 1}) if length else []
        _feed(digest, (_qualified_name(type(dataset)), length), set())
        for index in probes:
            _feed(digest, dataset[index], set())


def _feed(digest, value, seen: set) -> None:
    """Add ``value`` to ``digest`` by content; ``seen`` breaks cycles between functions."""
    update = digest.update
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        update(f"{type(value).__name__}[{len(items)}](".encode())
        for item in items:
            _feed(digest, item, seen)
        update(b")")
    elif isinstance(value, dict):
        update(f"dict[{len(value)}](".encode())
        for key in sorted(value, key=repr):
            _feed(digest, key, seen)
            _feed(digest, value[key], seen)
        update(b")")
    elif isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        update(f"tensor:{value.dtype}:{tuple(value.shape)};".encode())
        if flat.numel():
            update(flat.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, np.ndarray) and value.dtype != object:
        update(f"ndarray:{value.dtype.str}:{value.shape};".encode())
        update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (types.FunctionType, types.MethodType, functools.partial, type)) \
            or callable(value) and not isinstance(value, types.BuiltinFunctionType):
        _feed_callable(digest, value, seen)
    elif isinstance(value, types.ModuleType):
        update(f"module:{value.__name__};".encode())
    else:
        _feed_object(digest, value)


def _feed_callable(digest, value, seen: set) -> None:
    if id(value) in seen:
        digest.update(f"seen:{_qualified_name(value)};".encode())
        return
    seen.add(id(value))
    if isinstance(value, functools.partial):
        digest.update(b"partial(")
        _feed(digest, (value.func, value.args, value.keywords), seen)
        digest.update(b")")
    elif isinstance(value, types.MethodType):
        digest.update(b"method(")
        _feed(digest, value.__func__, seen)
        _feed(digest, value.__self__, seen)
        digest.update(b")")
    elif isinstance(value, types.FunctionType) and _is_user_code(value):
        _feed_function(digest, value, seen)
    elif isinstance(value, type) and _is_user_code(value):
        digest.update(f"class:{_qualified_name(value)}(".encode())
        for name, member in sorted(vars(value).items()):
            if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
                digest.update(name.encode())
                _feed(digest, getattr(member, "__func__", getattr(member, "fget", member)), seen)
        digest.update(b")")
    elif not isinstance(value, (types.FunctionType, type)) and _is_user_code(type(value)):
        # A callable object: its class's code and its state.
        _feed(digest, type(value), seen)
        _feed(digest, getattr(value, "__dict__", {}), seen)
    elif isinstance(value, (types.FunctionType, type)):
        # Library code: its name stands for it (a library upgrade is not tracked).
        digest.update(f"library:{_qualified_name(value)};".encode())
    else:  # a library's callable object (a tokenizer): its state is what matters
        _feed_object(digest, value)


def _feed_function(digest, function: types.FunctionType, seen: set) -> None:
    digest.update(f"function:{function.__qualname__}(".encode())
    _feed_code(digest, function.__code__)
    _feed(digest, function.__defaults__, seen)
    _feed(digest, function.__kwdefaults__, seen)
    for cell in function.__closure__ or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell (the closure variable is not bound yet)
            contents = None
        _feed(digest, contents, seen)
    for name in sorted(_global_names(function.__code__)):
        if name in function.__globals__:
            digest.update(f"global:{name}=".encode())
            _feed(digest, function.__globals__[name], seen)
    digest.update(b")")


def _feed_code(digest, code: types.CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            _feed_code(digest, constant)
        else:
            digest.update(f"{type(constant).__name__}:{constant!r};".encode())


def _global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the functions nested in it) may read as globals."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def _feed_object(digest, value) -> None:
    """Anything else by its pickle, or by its type's name where it does not pickle."""
    try:
        data = pickle.dumps(value, protocol=4)
    except Exception:
        digest.update(f"unpicklable:{_qualified_name(type(value))};".encode())
    else:
        digest.update(f"pickle:{len(data)}:".encode())
        digest.update(data)


def _is_user_code(value) -> bool:
    """Defined outside the standard library and site-packages (or where, cannot be told)."""
    module = sys.modules.get(getattr(value, "__module__", None) or "")
    if module is None:  # made by exec() or its module is gone: no file to judge by, digest it
        return True
    path = getattr(module, "__file__", None)
    if path is None:  # built-in and frozen modules: library; __main__ of `python -c` or a REPL: user
        return module.__name__ == "__main__"
    return not os.path.realpath(path).startswith(_LIBRARY_DIRS)


def _qualified_name(value) -> str:
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__qualname__)}"
