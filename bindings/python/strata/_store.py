"""strata.Store: named tensors in the device / host / nvme tiers (the C++ ``strata::Store``),
and :class:`ObjectInfo`, what :meth:`Store.stat` reports. A thin wrapper of
``strata._strata._Store``: arrays cross without copies (buffer protocol, DLPack) and every
blocking call releases the GIL (docs/bindings.md, "Python module strata")."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lifetime, _strata
from ._errors import InvalidArgumentError

Future = _strata.Future
format_bytes = _strata.format_bytes

#: a size argument: int bytes, or a string such as "1GiB" (powers of 1024; parse_size)
Size = Union[int, str]

# strata dtype name <-> numpy dtype (bf16 has no numpy type: it travels as uint16 bits).
_NP_OF = {
    "fp32": np.float32, "fp16": np.float16, "fp64": np.float64, "int8": np.int8,
    "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
    "bool": np.bool_, "bf16": np.uint16,
}
_FROM_NP = {np.dtype(v): k for k, v in _NP_OF.items() if k != "bf16"}


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What :meth:`Store.stat` reports about an object."""

    key: str
    dtype: str          #: "fp32", "fp16", "bf16", "fp64", "int8", ..., "bool"
    shape: Tuple[int, ...]
    nbytes: int         #: bytes of data (numel * element size)
    tier: str           #: fastest tier holding the current bytes: "device", "host", "nvme"
    on_nvme: bool       #: an NVMe copy exists (stale when dirty)
    dirty: bool         #: the in-memory copy is not yet durable
    pinned: bool
    num_chunks: int     #: chunks of the NVMe copy
    #: why the object's catalog row is damaged ("" when intact), e.g. "object 'k' chunks
    #: hold 3000 bytes, expected 4096"; dtype/shape/nbytes are then what the row claims,
    #: reading the object raises DataLossError, ``put(..., overwrite=True)`` or ``delete``
    #: replaces it. A damaged row does not fail :meth:`Store.open`.
    damage: str = ""


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _dtype_of(x: Any) -> Optional[str]:
    """strata dtype name of a numpy array / torch tensor, "uint16" for numpy uint16."""
    if _is_torch(x):
        name = str(x.dtype).replace("torch.", "")
        return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
                "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
                "uint8": "uint8", "bool": "bool"}.get(name)
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    dt = np.dtype(dt)
    if dt == np.uint16:
        return "uint16"
    return _FROM_NP.get(dt)


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Store:
    """A strata store: named tensors in the device / host / nvme tiers.

    Open with :meth:`Store.open`. Thread-safe: every method may be called from several
    Python threads at once (blocking calls release the GIL). Closing (``close()``, the end
    of a ``with`` block, or garbage collection) flushes dirty objects to NVMe.
    """

    def __init__(self, impl: "_strata._Store"):
        self._s = impl

    @classmethod
    def open(cls, path: str, nvme: Optional[Sequence[str]] = None, host_budget: Optional[Size] = None,
             nvme_budget: Optional[Size] = None, device_budget: Optional[Size] = None,
             chunk_size: Optional[Size] = None, staging: Optional[Size] = None,
             verify: Optional[bool] = None, durability: Optional[str] = None,
             read_only: bool = False, create: bool = True, workers: Optional[int] = None,
             numa_node: Optional[int] = None, device_id: Optional[int] = None,
             config: Optional[str] = None) -> "Store":
        """Opens (or creates) the store rooted at ``path`` and takes its write lock.

        Sizes are ints (bytes) or strings such as ``"1GiB"`` (powers of 1024). ``None`` keeps
        the default: built-in < the configuration file < the STRATA_* environment variables
        (docs/configuration.md); an argument given here wins over all three.

        :param nvme: directories (one per drive) to stripe chunks over; default ``[path]``.
        :param host_budget: pinned DRAM for host-tier objects (default 1 GiB).
        :param nvme_budget: NVMe tier bytes, 0 = unlimited (default).
        :param device_budget: GPU bytes, 0 = half the free memory (default).
        :param chunk_size: chunk size of a new store, multiple of 4096 (default 64 MiB).
        :param staging: pinned staging bytes for unaligned buffers (default 256 MiB).
        :param verify: verify chunk checksums on reads (default True).
        :param durability: ``"put"`` (each NVMe put durable when it returns; the default) or
            ``"flush"``.
        :param workers: threads that run store operations, 1 to 1024 (default 4).
        :param numa_node: NUMA placement: ``None``/-1 automatic (each NVMe directory's
            staging memory and I/O threads on its drive's node, the host tier near the GPU),
            -2 no binding, N everything on node N (see docs/store.md).
        :param config: a configuration file (JSON, e.g. written by ``strata tune``) whose
            "io" and "store" sections seed the options; default ``$STRATA_CONFIG`` when
            set. Its path is :attr:`config_file`, where the strata.torch optimizers read
            their "optimizer" section.
        :raises FailedPreconditionError: another process holds the store's lock.
        :raises NotFoundError: no store at ``path`` and ``create`` is False.
        :raises InvalidArgumentError: a bad option, or an unknown key or bad value in the
            configuration file (naming the key and the file).
        :raises NotFoundError: (also) the configuration file does not exist.
        :raises OSError: (IoError, PermissionDeniedError) the directory cannot be used.
        """
        return cls(_strata._Store.open(
            path, list(nvme or []), host_budget, nvme_budget, device_budget, chunk_size,
            staging, verify, durability, read_only, create, workers, numa_node, device_id,
            config))

    @property
    def config_file(self) -> str:
        """The configuration file the store's options came from ("" when none)."""
        return self._s.config_file

    # ---- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Flushes and releases the store. Later calls raise FailedPreconditionError.

        Optimizers on the store that are still open are closed first (each close is its
        last checkpoint), the newest first; their first error is raised after the store
        closed.

        :raises ResourceExhaustedError: (MemoryError) dirty host/device objects could not be
            written back (NVMe budget or disk full). Nothing is dropped: the store stays
            open, so ``delete`` some objects (or ``evict``) and ``close()`` again; a store
            that is garbage-collected open drops what it cannot write back.
        :raises IoError: (OSError) likewise for an I/O error during the write-back."""
        err = _lifetime.close_users(self)
        self._s.close()
        if err is not None:
            raise err

    @property
    def closed(self) -> bool:
        return self._s.closed

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- put / get -----------------------------------------------------------------------

    def put(self, key: str, array: Any, tier: str = "nvme", *, overwrite: bool = False,
            pin: bool = False, dtype: Optional[str] = None) -> None:
        """Stores ``array`` (numpy array, buffer, or torch tensor on CPU or GPU; C-contiguous)
        as object ``key`` in ``tier`` ("nvme", "host" or "device"). No copy is made: the
        store reads the array's memory directly (GIL released).

        :param dtype: reinterpret the elements, e.g. ``"bf16"`` for a uint16 numpy array
            holding bfloat16 bits.
        :param overwrite: replace an existing ``key`` whole: the new version's tier and pin
            are this call's, and the old version's pins end with it.
        :raises AlreadyExistsError: (KeyError) ``key`` exists and not ``overwrite``.
        :raises InvalidArgumentError: (ValueError) unsupported dtype, non-contiguous array,
            foreign byte order (e.g. numpy ``'>f4'``), sparse/meta/conj/neg torch tensor.
        :raises ResourceExhaustedError: (MemoryError) the tier's budget is full;
            :class:`DiskFullError` (also OSError, ``errno`` ENOSPC) the disk is full.
        :raises IoError: (OSError) a write failed; ``errno`` says why.
        """
        self._s.put(key, array, tier, overwrite, pin, dtype)

    def put_repeated(self, key: str, block: Any, numel: int, *, overwrite: bool = False,
                     dtype: Optional[str] = None) -> None:
        """Stores a 1-d object of ``numel`` elements of ``block``'s dtype whose bytes repeat
        ``block``'s (``block`` a C-contiguous array or CPU tensor; element i is
        ``block.flat[i % block.size]``), nvme tier: an object far larger than memory made
        from one small buffer, e.g. zeros to ``write_range`` into later.

        :param block: its bytes a multiple of the store's chunk bytes (``chunk_bytes()``).
        :param dtype: reinterpret the elements, as in :meth:`put` (``"bf16"``).
        :param numel: elements of the object (any count: the last chunk takes the block's
            first bytes).
        :raises InvalidArgumentError: (ValueError) ``block`` is empty or its bytes are not a
            multiple of the store's chunk bytes.
        :raises AlreadyExistsError: ``key`` exists and not ``overwrite``.
        Thread-safety: as :meth:`put`."""
        self._s.put_repeated(key, block, numel, overwrite, dtype)

    def put_async(self, key: str, array: Any, tier: str = "nvme", *, overwrite: bool = False,
                  pin: bool = False, dtype: Optional[str] = None) -> Future:
        """As :meth:`put`, returning a :class:`Future` (result None). The array is kept
        referenced, and must not be modified, until the future is done."""
        return self._s.put_async(key, array, tier, overwrite, pin, dtype)

    def get(self, key: str) -> np.ndarray:
        """Reads object ``key`` into a new numpy array of its dtype and shape (bf16 objects
        come back as uint16 bits; see :meth:`get_tensor`). The array's memory is 4096-byte
        aligned, so NVMe reads land in it directly.

        Atomic with respect to concurrent ``put(..., overwrite=True)`` of the same key: the
        array holds one version whole, the old or the new, even when the new one has another
        dtype or shape (the store fixes the version, then the array is allocated for it).

        :raises NotFoundError: (KeyError) no such key.
        :raises InvalidArgumentError: (ValueError) ``key`` is not a str or not valid UTF-8
            (e.g. holds a lone surrogate such as ``"a\\udc80"``).
        :raises DataLossError: (OSError) a checksum mismatch.
        :raises ResourceExhaustedError: the array's memory cannot be allocated.
        """
        return self._s.get(key)

    def get_async(self, key: str) -> Future:
        """As :meth:`get` (also atomic); the future's result is the array."""
        return self._s.get_async(key)

    def get_tensor(self, key: str) -> Any:
        """As :meth:`get`, as a torch CPU tensor sharing the array's memory (bf16 kept)."""
        import torch
        arr = self._s.get(key)
        if arr.dtype == np.uint16:  # bf16 bits; torch has no uint16
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)

    def get_into(self, key: str, out: Any, *, cast: bool = False) -> Any:
        """Reads object ``key`` into ``out`` (numpy array or torch tensor of the object's
        shape and dtype) and returns ``out``. The bytes land in ``out``'s memory with no
        intermediate copy (also for CUDA tensors). A bf16 object may be read into a numpy
        uint16 or int16 array (its bits, as :meth:`get` returns them).

        :param cast: allow an ``out`` of another dtype: the object is read into a temporary
            array and converted like ``out[...] = value`` (numpy ``casting="unsafe"``, torch
            ``copy_``), which may lose precision or range (e.g. fp32 -> int32 truncates).
            Without it a dtype mismatch is an error, never a silent conversion.
        :raises NotFoundError: (KeyError) no such key.
        :raises InvalidArgumentError: (ValueError) dtype mismatch without ``cast=True``
            (message: ``get_into 'k': the object is fp32, the destination is int32 ...``),
            shape mismatch, read-only or non-contiguous ``out``, unsupported dtype, a key
            that is not a str / not valid UTF-8.
        :raises DataLossError: (OSError) a checksum mismatch, or the object's catalog row
            is damaged (:attr:`ObjectInfo.damage`; checked first).
        """
        override = self._plan_get_into(key, out, cast, "get_into")
        if override is not False:
            self._s.get_into(key, out, override)
            return out
        self._convert_into(key, out)
        return out

    def get_into_async(self, key: str, out: Any) -> Future:
        """As :meth:`get_into` returning a Future whose result is ``out``. ``out`` must have
        the object's dtype (no ``cast``: conversion is not asynchronous; use ``get_into``).
        Do not touch ``out`` until the future is done.
        """
        override = self._plan_get_into(key, out, False, "get_into_async")
        return self._s.get_into_async(key, out, override)

    def _plan_get_into(self, key: str, out: Any, cast: bool, what: str):
        """None/"bf16": read directly (with that dtype override); False: convert."""
        info = self._s.stat(key)
        if info["damage"]:  # DataLoss (the store's message) before any shape/dtype check
            self._s.get(key)
        odt = _dtype_of(out)
        if odt == info["dtype"]:
            return None
        if odt in ("uint16", "int16") and info["dtype"] == "bf16" and not _is_torch(out):
            return "bf16"  # numpy carries bf16 as 16-bit integers
        if odt is None:
            raise InvalidArgumentError(f"{what} '{key}': unsupported destination dtype "
                                       f"{getattr(out, 'dtype', type(out).__name__)} (the "
                                       f"object is {info['dtype']})")
        if not cast:
            hint = (" (pass cast=True to convert)" if what == "get_into"
                    else " (use get_into(..., cast=True) to convert)")
            raise InvalidArgumentError(f"{what} '{key}': the object is {info['dtype']}, the "
                                       f"destination is {odt}{hint}")
        return False

    def _convert_into(self, key: str, out: Any) -> None:
        info = self._s.stat(key)
        shape = tuple(info["shape"])
        if tuple(out.shape) != shape:
            raise InvalidArgumentError(f"get_into '{key}': the object has shape {shape}, the "
                                       f"destination {tuple(out.shape)}")
        src = self._s.get(key)  # one whole version (a concurrent overwrite may change it)
        if tuple(src.shape) != tuple(out.shape):
            raise InvalidArgumentError(f"get_into '{key}': the object has shape "
                                       f"{tuple(src.shape)}, the destination {tuple(out.shape)}")
        bf16 = src.dtype == np.uint16  # strata has no uint16: these are bf16 bits
        if _is_torch(out):
            import torch
            if bf16:
                t = torch.from_numpy(src.view(np.int16)).view(torch.bfloat16)
            else:
                t = torch.from_numpy(src)
            out.copy_(t)
            return
        if bf16:
            src = _bf16_to_f32(src)
        np.copyto(out, src, casting="unsafe")

    # ---- metadata ------------------------------------------------------------------------

    def stat(self, key: str) -> ObjectInfo:
        """Metadata of ``key``. :raises NotFoundError: (KeyError) no such key."""
        d = self._s.stat(key)
        return ObjectInfo(**d)

    def list(self, prefix: str = "") -> List[ObjectInfo]:
        """:class:`ObjectInfo` of every key starting with ``prefix``, sorted by key."""
        return [ObjectInfo(**d) for d in self._s.list(prefix)]

    def keys(self, prefix: str = "") -> List[str]:
        """Keys starting with ``prefix``, sorted (bytewise UTF-8)."""
        return self._s.keys(prefix)

    def __contains__(self, key: str) -> bool:
        return self._s.contains(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def usage(self) -> Dict[str, int]:
        """Bytes used and budgeted per tier, and the object count."""
        return self._s.usage()

    def stats(self) -> Dict[str, Union[int, float]]:
        """The store's counters since open or :meth:`reset_stats` (a new dict; C++
        ``Store::stats()``, docs/store.md "Stats" defines each): ``{tier}_{read,write}_
        {bytes,ops}`` for device, host and nvme; ``promotions``, ``promotion_bytes``,
        ``evictions``, ``eviction_bytes``, ``lru_evictions``, ``writebacks``,
        ``writeback_bytes``; ``checksum_failures``; ``prefetches``, ``prefetch_hits``,
        ``prefetch_misses``; ``nvme_read_wait_seconds``, ``nvme_write_wait_seconds``;
        ``{host,staging}_pool_{in_use,capacity,peak}_bytes``; ``elapsed_seconds``. Ints,
        seconds as floats. Counters are per process: another process's reads of the same
        store are not in them."""
        return self._s.stats()

    def reset_stats(self) -> None:
        """Zeroes the counters of :meth:`stats` (the pools' peaks restart at their use)."""
        self._s.reset_stats()

    @property
    def chunk_bytes(self) -> int:
        return self._s.chunk_bytes()

    @property
    def has_device(self) -> bool:
        """True when the device (GPU) tier is usable."""
        return self._s.has_device()

    # ---- movement ------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        """Deletes ``key`` from every tier (durable on return). :raises NotFoundError:"""
        self._s.delete(key)

    def delete_async(self, key: str) -> Future:
        return self._s.delete_async(key)

    def move(self, key: str, tier: str) -> None:
        """Moves ``key`` to ``tier``: promotion keeps the NVMe copy, demotion writes back.
        :raises ResourceExhaustedError: the target tier is full.
        :raises FailedPreconditionError: a pinned object cannot go to nvme."""
        self._s.move(key, tier)

    def move_async(self, key: str, tier: str) -> Future:
        return self._s.move_async(key, tier)

    def prefetch(self, key: str, tier: str = "host") -> None:
        """Promotes ``key`` to ``tier`` unless it is already there or faster."""
        self._s.prefetch(key, tier)

    def prefetch_async(self, key: str, tier: str = "host") -> Future:
        return self._s.prefetch_async(key, tier)

    def evict(self, key: str) -> None:
        """Demotes ``key`` to NVMe and frees its memory."""
        self._s.evict(key)

    def pin(self, key: str) -> None:
        """Keeps ``key`` in its memory tier (never evicted by LRU); pins nest."""
        self._s.pin(key)

    def unpin(self, key: str) -> None:
        self._s.unpin(key)

    def flush(self) -> None:
        """Makes every object durable (write-back, fdatasync, one catalog commit)."""
        self._s.flush()

    def flush_async(self) -> Future:
        return self._s.flush_async()

    def read_range(self, key: str, offset: int, nbytes: int) -> np.ndarray:
        """Bytes [offset, offset+nbytes) of ``key`` as a uint8 array.
        :raises OutOfRangeError: (ValueError) past the end.
        :raises InvalidArgumentError: (ValueError) ``offset`` or ``nbytes`` not an int >= 0,
            ``key`` not a str / not valid UTF-8 (the message names the argument)."""
        return self._s.read_range(key, offset, nbytes)

    def write_range(self, key: str, offset: int, src: Any) -> None:
        """Overwrites bytes of ``key`` from ``src`` (any contiguous array); durable at the
        next flush. :raises OutOfRangeError: (ValueError) past the end.
        :raises InvalidArgumentError: (ValueError) ``offset`` not an int >= 0, ``key`` not a
            str / not valid UTF-8."""
        self._s.write_range(key, offset, src)

    def __repr__(self) -> str:
        if self.closed:
            return "<strata.Store closed>"
        u = self.usage()
        return f"<strata.Store objects={u['objects']} nvme={format_bytes(u['nvme_bytes'])}>"
