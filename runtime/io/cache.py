"""A disk cache of preprocessed samples (TorchAcc's "Preprocess Cache").

``PreprocessCache(dataset, preprocess_fn, cache_dir)`` is a map-style dataset whose item ``i`` is
``preprocess_fn(dataset[i], **fn_kwargs)``, computed once and read back from disk afterwards::

    train = PreprocessCache(raw, tokenize, "/data/cache", fn_kwargs={"max_length": 512},
                            dataset_id="wiki-2024-06")
    loader = DataLoader(train, batch_size=32, num_workers=4)

The cache file is named by a fingerprint (SHA-256) of

* the dataset's identity: ``dataset_id`` when given (recommended: a path and version), else a
  Hugging Face dataset's ``_fingerprint``, else its class, length and first, middle and last
  samples (content changes elsewhere are not seen: pass ``dataset_id``);
* the preprocessing function's code: bytecode, constants, defaults, closure values, and,
  recursively, the functions, classes and constants of user code (code outside the Python and
  site-packages directories) that it names as globals; ``functools.partial`` arguments and the
  state of callable objects count too; library objects count by name;
* ``fn_kwargs``, the keyword arguments passed to the function.

So a changed function or argument selects a different file and the samples are recomputed; old
files are left in ``cache_dir`` for the user to delete.

File format (one file, ``<fingerprint>.cache``): a header, one record per sample, an index
``[n, 3]`` int64 of (offset, length, crc32), and a footer with the index's offset and checksum.
A record holds the sample's structure pickled with tensors and arrays replaced by references to
64-byte-aligned raw bytes in the same record. A read is one ``pread`` of the record from a file
descriptor kept open, into a fresh buffer: one copy from the page cache (shared by DataLoader
workers and ranks on one machine), whose tensors and arrays are views of that buffer, so a sample
that the caller modifies in place does not change the next read of it. There is no memory map:
a mapped file truncated under its reader kills the reader (SIGBUS); a read comes back short.

Integrity: the file is written to a temporary name (``.building-<fingerprint>-*.tmp``) and renamed
into place (atomic: readers see the old file or the whole new one); a temporary left by a builder
that was killed is removed by the next build of the same fingerprint (which holds the lock, so no
one else is writing it). Opening checks the header, footer, index checksum and record bounds;
every read checks that its record is whole and its crc32. A file that fails a check is reported
(:class:`CacheCorruptionWarning`) and rebuilt, and the read returns the recomputed sample: never a
crash, never a wrong sample.

Several processes (ranks, DataLoader workers, jobs sharing ``cache_dir``) elect one writer with an
advisory ``flock`` on ``<fingerprint>.lock``: the first to take it builds, the others block until
it is released (``wait_timeout`` bounds the wait) and then read the finished file. The OS drops
the lock if the writer dies, and the next process rebuilds. POSIX only (``fcntl``).
"""

import fcntl
import logging
import os
import pickle
import struct
import tempfile
import time
import warnings
import weakref
import zlib
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .fingerprint import fingerprint

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_MAGIC = b"ACCPREP\x00"
_HEADER = struct.Struct("<8sI")  # magic, format version
_FOOTER = struct.Struct("<8sQQI32s")  # magic, index offset, samples, index crc32, fingerprint
_ALIGN = 64  # payloads start cache-line aligned, whatever their dtype


class CacheCorruptionWarning(RuntimeWarning):
    """A cache file failed an integrity check; it is rebuilt and the affected read recomputed."""


class PreprocessCache(Dataset):
    """``preprocess_fn(dataset[i], **fn_kwargs)`` for every ``i``, cached in ``cache_dir``.

    The cache is built (or found) when the object is created; ``status`` says which: ``"hit"``,
    ``"built"`` or ``"rebuilt"`` (a corrupt file was replaced). ``num_workers`` > 0 runs the
    preprocessing of a build in that many DataLoader worker processes. Samples may be any nesting
    of dicts, lists and tuples whose leaves are tensors, numpy arrays or picklable values.
    """

    def __init__(
        self,
        dataset,
        preprocess_fn,
        cache_dir,
        *,
        fn_kwargs: dict | None = None,
        dataset_id: str | None = None,
        num_workers: int = 0,
        wait_timeout: float | None = None,
    ):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(
                f"PreprocessCache needs a map-style dataset (__getitem__ and __len__), "
                f"got {type(dataset).__name__}"
            )
        if not callable(preprocess_fn):
            raise TypeError(f"preprocess_fn must be callable, got {preprocess_fn!r}")
        if fn_kwargs is not None and not isinstance(fn_kwargs, dict):
            raise TypeError(f"fn_kwargs must be a dict, got {type(fn_kwargs).__name__}")
        self.dataset = dataset
        self.preprocess_fn = preprocess_fn
        self.fn_kwargs = dict(fn_kwargs or {})
        self.num_workers = num_workers
        self.wait_timeout = wait_timeout
        self.fingerprint = fingerprint(dataset, preprocess_fn, self.fn_kwargs, dataset_id)
        os.makedirs(cache_dir, exist_ok=True)
        self.path = os.path.join(os.fspath(cache_dir), f"{self.fingerprint}.cache")
        self._lock_path = os.path.join(os.fspath(cache_dir), f"{self.fingerprint}.lock")
        self._length = len(dataset)
        self._file = None
        self.status = self._open_or_build()

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int):
        if not -self._length <= index < self._length:
            raise IndexError(f"index {index} out of range for {self._length} samples")
        index %= self._length
        if self._file is None:  # unpickled in a DataLoader worker: open the file again
            self._open_or_build()
        try:
            return self._file.read(index)
        except _Invalid as problem:
            self._report(str(problem))
        self._open_or_build(stale=self._file)
        self.status = "rebuilt"
        try:
            return self._file.read(index)
        except _Invalid:  # the fresh file is bad too (failing disk): do not trust it
            return self._compute(index)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_file"] = None  # an open file does not pickle; the worker opens the file itself
        return state

    # -- building and opening -------------------------------------------------------------

    def _open_or_build(self, stale: "_CacheFile | None" = None) -> str:
        """Open the cache file, first building it (as the one writer) if it is missing or fails
        its checks, or if it is still the file ``stale`` that a read found corrupt."""
        if stale is None and (problem := self._try_open()) is None:
            return "hit"
        with self._writer_lock():
            problem = "stale"
            if stale is None or _inode(self.path) != stale.inode:
                problem = self._try_open()  # another process may have built it while we waited
                if problem is None:
                    return "hit"
                if problem != "missing":
                    self._report(problem)
            self._build()
            if self._try_open() is not None:
                raise RuntimeError(f"the cache file just written does not read back: {self.path}")
            return "built" if problem == "missing" else "rebuilt"

    def _try_open(self) -> str | None:
        """Open the cache file; None on success, else why it cannot be used."""
        try:
            self._file = _CacheFile(self.path, self.fingerprint, self._length)
            return None
        except FileNotFoundError:
            return "missing"
        except _Invalid as problem:
            return str(problem)

    def _report(self, problem: str) -> None:
        warnings.warn(f"preprocess cache {self.path}: {problem}; rebuilding it",
                      CacheCorruptionWarning, stacklevel=3)

    def _compute(self, index: int):
        return self.preprocess_fn(self.dataset[index], **self.fn_kwargs)

    def _samples(self):
        if self.num_workers <= 0:
            return (self._compute(i) for i in range(self._length))
        return DataLoader(_Preprocessed(self), batch_size=None, num_workers=self.num_workers,
                          collate_fn=_identity)

    def _build(self) -> None:
        directory = os.path.dirname(self.path)
        prefix = f".building-{self.fingerprint}-"
        for name in os.listdir(directory):
            # This process holds the writer lock: no one else writes this fingerprint's temporary.
            if name.startswith(prefix) and name.endswith(".tmp"):
                os.unlink(os.path.join(directory, name))
                logger.info("preprocess cache %s: removed %s, left by a build that was killed",
                            self.path, name)
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".tmp")
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(_HEADER.pack(_MAGIC, FORMAT_VERSION))
                index = np.zeros((self._length, 3), dtype=np.int64)
                count = 0
                for count, sample in enumerate(self._samples(), start=1):
                    offset = _pad_to_alignment(out)
                    record = _encode(sample)
                    out.write(record)
                    index[count - 1] = (offset, len(record), zlib.crc32(record))
                if count != self._length:
                    raise RuntimeError(f"the dataset yielded {count} samples, expected {self._length}")
                index_offset = _pad_to_alignment(out)
                index_bytes = index.tobytes()
                out.write(index_bytes)
                out.write(_FOOTER.pack(_MAGIC, index_offset, self._length, zlib.crc32(index_bytes),
                                       bytes.fromhex(self.fingerprint)))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            os.unlink(temporary)
            raise
        logger.info("preprocess cache %s: wrote %d samples", self.path, self._length)

    @contextmanager
    def _writer_lock(self):
        with open(self._lock_path, "a+b") as lock:
            if self.wait_timeout is None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            else:
                deadline = time.monotonic() + self.wait_timeout
                while True:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise TimeoutError(
                                f"waited {self.wait_timeout}s for another process to build "
                                f"{self.path} (lock {self._lock_path})"
                            ) from None
                        time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


class _Preprocessed(Dataset):
    """The uncached samples, for DataLoader workers during a build."""

    def __init__(self, cache: PreprocessCache):
        self.cache = cache

    def __len__(self):
        return len(self.cache)

    def __getitem__(self, index):
        return self.cache._compute(index)


def _identity(sample):
    return sample


# -- the file format -------------------------------------------------------------------------


class _Invalid(Exception):
    """The cache file exists but cannot be trusted (the message says why)."""


class _TensorRef(NamedTuple):
    """Placeholder for a tensor or array in a pickled record: where its bytes are."""

    numpy: bool  # an np.ndarray (else a torch.Tensor)
    dtype: object  # torch.dtype, or the numpy dtype string
    shape: tuple
    offset: int  # from the record's first payload byte
    nbytes: int


class _CacheFile:
    """A validated cache file, held open; records are read with ``pread``."""

    def __init__(self, path: str, fingerprint: str, length: int):
        self.fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self.fd)
        status = os.fstat(self.fd)
        self.inode, size = status.st_ino, status.st_size
        if size < _HEADER.size + _FOOTER.size:
            raise _Invalid(f"file is truncated ({size} bytes)")
        magic, version = _HEADER.unpack(self._pread(0, _HEADER.size, "the header"))
        if magic != _MAGIC or version != FORMAT_VERSION:
            raise _Invalid("bad header (not a cache file of this format version)")
        footer = self._pread(size - _FOOTER.size, _FOOTER.size, "the footer")
        magic, index_offset, count, index_crc, stored = _FOOTER.unpack(footer)
        if magic != _MAGIC:
            raise _Invalid("bad footer (the file is truncated or overwritten)")
        if stored.hex() != fingerprint or count != length:
            raise _Invalid(f"the file holds {count} samples of fingerprint {stored.hex()}")
        if index_offset + count * 24 != size - _FOOTER.size:
            raise _Invalid("index does not end at the footer (the file is truncated)")
        index = self._pread(index_offset, count * 24, "the index")
        if zlib.crc32(index) != index_crc:
            raise _Invalid("index fails its checksum")
        self.index = np.frombuffer(index, dtype=np.int64).reshape(count, 3)
        ends = self.index[:, 0] + self.index[:, 1]
        if count and (self.index[:, 0].min() < _HEADER.size or ends.max() > index_offset):
            raise _Invalid("a record lies outside the data region")

    def read(self, index: int):
        """Sample ``index``; _Invalid if its record is cut short or fails its checksum."""
        offset, length, crc = (int(v) for v in self.index[index])
        record = self._pread(offset, length, f"record {index}")
        if zlib.crc32(record) != crc:
            raise _Invalid(f"record {index} fails its checksum")
        (skeleton_size,) = struct.unpack_from("<Q", record, 0)
        try:
            skeleton = pickle.loads(memoryview(record)[8: 8 + skeleton_size])
        except Exception:  # the checksum matched, so only a format bug lands here; do not guess
            raise _Invalid(f"record {index} does not unpickle") from None
        return _restore(skeleton, record, _payload_base(skeleton_size))

    def _pread(self, offset: int, length: int, what: str) -> bytearray:
        """``length`` bytes at ``offset``, read into a new buffer."""
        buffer = bytearray(length)
        view = memoryview(buffer)
        done = 0
        while done < length:
            count = os.preadv(self.fd, [view[done:]], offset + done)
            if count == 0:
                raise _Invalid(f"{what} is cut short (the file was truncated)")
            done += count
        return buffer


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _pad_to_alignment(out) -> int:
    position = out.tell()
    padding = -position % _ALIGN
    out.write(b"\0" * padding)
    return position + padding


def _encode(sample) -> bytes:
    """A record: ``<Q skeleton size><pickled skeleton><aligned tensor bytes...>``."""
    payloads: list[tuple[int, bytes]] = []
    cursor = [0]  # payload bytes so far, relative to the first payload

    def strip(value):
        if isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
            return add(False, value.dtype, tuple(value.shape), data)
        if isinstance(value, np.ndarray) and value.dtype != object:
            return add(True, value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
        if type(value) in (list, tuple, dict):
            if isinstance(value, dict):
                return {key: strip(item) for key, item in value.items()}
            return type(value)(strip(item) for item in value)
        return value

    def add(is_numpy, dtype, shape, data):
        start = cursor[0] + (-cursor[0] % _ALIGN)
        payloads.append((start, data))
        cursor[0] = start + len(data)
        return _TensorRef(is_numpy, dtype, shape, start, len(data))

    skeleton = pickle.dumps(strip(sample), protocol=pickle.HIGHEST_PROTOCOL)
    out = bytearray(struct.pack("<Q", len(skeleton)) + skeleton)
    base = _payload_base(len(skeleton))
    for start, data in payloads:
        out += b"\0" * (base + start - len(out))
        out += data
    return bytes(out)


def _payload_base(skeleton_size: int) -> int:
    """Where a record's payloads start: after the skeleton, aligned (records start aligned)."""
    head = 8 + skeleton_size
    return head + (-head % _ALIGN)


def _restore(value, record: bytearray, payload_base: int):
    """The sample from its skeleton: references become views of the ``record`` read."""
    if isinstance(value, _TensorRef):
        start = payload_base + value.offset
        if value.numpy:
            dtype = np.dtype(value.dtype)
            count = value.nbytes // dtype.itemsize
            return np.frombuffer(record, dtype, count, offset=start).reshape(value.shape)
        if not value.nbytes:  # frombuffer refuses an empty view
            return torch.empty(value.shape, dtype=value.dtype)
        count = value.nbytes // value.dtype.itemsize
        tensor = torch.frombuffer(record, dtype=value.dtype, count=count, offset=start)
        return tensor.view(value.shape)
    if type(value) in (list, tuple):
        return type(value)(_restore(item, record, payload_base) for item in value)
    if type(value) is dict:
        return {key: _restore(item, record, payload_base) for key, item in value.items()}
    return value
