"""What activation offload keeps per saved tensor: an :class:`Entry` (the bytes of one
storage, or of one range of a storage, in the host pool or on NVMe, with an explicit
:class:`State`) and a :class:`Saved` handle per pack (what autograd holds: the entry plus
the saved tensor's dtype and geometry), and the rules of what is packed at all
(:func:`kept_as_is`) and how a tensor maps to an entry (:func:`extent_of`).

Deduplication. An entry is keyed by its storage (a weak reference's identity, never a
bare address that a freed storage's successor could reuse), the byte range it holds and
the tensor's ``_version``: a view and its base, or one tensor saved twice in a forward,
share one entry while the storage is alive and unchanged. A view covering at least half of
its storage takes the whole storage (so its base and sibling views hit the same entry); a
smaller view takes only its own range.

Thread-safety: entries are changed under their pool's lock; ``Saved.__del__`` (any thread,
any time: autograd frees saved variables) only appends to the pool's release queue.
"""

from __future__ import annotations

import enum
import weakref
from typing import Any, Optional, Tuple

import torch

from .._saved import SavedHandle

try:  # the storage's weak reference (its identity: StorageImpl address) in 1.13 and 2.x
    from torch.multiprocessing.reductions import StorageWeakRef
except ImportError:  # pragma: no cover
    StorageWeakRef = None  # type: ignore[assignment,misc]


class State(enum.Enum):
    HOST = "host"          #: bytes in the host pool
    WRITING = "writing"    #: in the pool, its spill to NVMe in flight
    SPILLED = "spilled"    #: on NVMe only
    FETCHING = "fetching"  #: on NVMe, a prefetch in flight
    FETCHED = "fetched"    #: on NVMe, prefetched bytes held until unpacked
    FREED = "freed"        #: no handle left: bytes dropped, store object deleted


class Entry:
    """The bytes of one saved storage (range). ``data``: a flat uint8 tensor (HOST,
    WRITING); ``fetched``: the prefetched one (FETCHED); ``refs``: live handles."""

    __slots__ = ("index", "segment", "pack_index", "key", "nbytes", "lo", "state", "data",
                 "adopted", "version", "modified", "event", "future", "fetched", "ready",
                 "fetch_error", "recent", "refs", "dead", "dedupe_key", "sref", "device",
                 "prefetched")

    def __init__(self, index: int, segment: Any, pack_index: int, key: str, nbytes: int,
                 lo: int, device: torch.device):
        self.index, self.segment, self.pack_index = index, segment, pack_index
        self.key, self.nbytes, self.lo, self.device = key, nbytes, lo, device
        self.state = State.HOST
        self.data: Optional[torch.Tensor] = None
        self.adopted = False  # data is a view of the saved storage itself (CPU, no copy)
        self.version = 0
        self.modified = False  # an adopted storage changed in place before its spill
        self.event: Any = None  # CUDA: the device-to-host copy's event
        self.future: Any = None  # the spill's put_async
        self.fetched: Optional[torch.Tensor] = None
        self.ready: Any = None  # threading.Event of a prefetch
        self.fetch_error: Optional[BaseException] = None
        self.recent: Any = None  # weakref of the last unpacked bytes (a second unpack)
        self.refs = 0
        self.dead = False
        self.dedupe_key: Optional[Tuple] = None
        self.sref: Any = None
        self.prefetched = False


class Saved(SavedHandle):
    """What autograd saves for an offloaded tensor: its entry and how to rebuild it
    (dtype, size, stride, offset in elements from the entry's first byte)."""

    __slots__ = ("owner", "entry", "dtype", "size", "stride", "offset", "tref", "version",
                 "__weakref__")

    def __init__(self, owner: Any, entry: Entry, t: torch.Tensor, offset: int):
        self.owner, self.entry = owner, entry
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.size(), t.stride(), offset
        #: the saved tensor, weakly, and its version: torch does not check versions of
        #: hooked saved tensors, so unpack does (a copy or a spill would hide the change)
        self.tref, self.version = weakref.ref(t), t._version

    def modified(self) -> bool:
        """The saved tensor, still alive, was changed in place since it was saved."""
        t = self.tref()
        return t is not None and t._version != self.version

    def unpack(self) -> torch.Tensor:
        return self.owner.pool.unpack(self)

    def __del__(self) -> None:
        try:
            self.owner.pool.released.append(self.entry)
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def kept_as_is(t: torch.Tensor) -> bool:
    """``t`` keeps its own saved reference (never copied as an activation): a parameter
    (strata's offloaded ones included) or a view of one, a leaf that requires grad or a
    view of one (the caller holds it anyway), a tensor subclass, a non-strided, quantized
    or meta tensor, a tensor on a device other than cpu/cuda, an empty tensor."""
    if type(t) is not torch.Tensor:  # Parameter, OffloadedParameter, other subclasses
        return True
    if t.layout != torch.strided or t.is_quantized or t.is_meta or t.numel() == 0:
        return True
    if t.device.type not in ("cpu", "cuda"):
        return True
    if t.requires_grad and t.is_leaf:
        return True
    base = t._base
    if base is not None and (isinstance(base, torch.nn.Parameter)
                             or (base.requires_grad and base.is_leaf)):
        return True
    return False


#: the storage accessor that makes no Python object per call: torch 2.x's
#: ``untyped_storage``, 1.13's ``_storage`` (``Tensor.storage()`` builds a TypedStorage in
#: Python each time: pack asked for it three times per tensor)
_UNTYPED = (getattr(torch.Tensor, "untyped_storage", None)
            or getattr(torch.Tensor, "_storage", None))


def storage_of(t: torch.Tensor) -> Any:
    """``t``'s storage, untyped (``nbytes()`` and ``_weak_ref()`` as StorageWeakRef needs)."""
    return _UNTYPED(t) if _UNTYPED is not None else t.storage()


def extent_of(t: torch.Tensor, snb: int) -> Tuple[int, int]:
    """(first byte, end byte) of what ``t`` reads of its storage of ``snb`` bytes: the whole
    storage (0, snb) at once for a contiguous tensor that fills it (the common case)."""
    es = t.element_size()
    lo = t.storage_offset() * es
    if lo == 0 and t.numel() * es == snb and t.is_contiguous():
        return 0, snb
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.size(), t.stride()))
    return lo, lo + span * es


def flat_bytes(t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Bytes [lo, hi) of ``t``'s storage as a flat uint8 view (no copy; no autograd: a
    detached tensor's views record nothing, no grad-mode switch needed)."""
    es = t.element_size()
    flat = t.detach().as_strided(((hi - lo) // es,), (1,), lo // es)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def rebuild(flat: torch.Tensor, h: Saved) -> torch.Tensor:
    """Saved tensor ``h`` from its entry's bytes ``flat`` (a view: no copy)."""
    typed = flat.view(h.dtype) if h.dtype != torch.uint8 else flat
    return typed.as_strided(h.size, h.stride, typed.storage_offset() + h.offset)
