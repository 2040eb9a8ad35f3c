"""The host pool of activation offload and its spill to the store: what the pack hook does
with a saved tensor, what the unpack hook gives back, and when bytes are freed.

Pack. A tensor :func:`kept_as_is` or smaller than ``min_bytes`` keeps its own reference.
Any other becomes an entry (deduplicated, see _entry.py) in the host pool: a CPU tensor
covering its storage is held as it is (it is in host memory already: no copy), a CPU view
of a part of a larger storage is copied into a 4096-byte-aligned buffer, a CUDA tensor is
copied to pinned memory on a side stream (the copy's source recorded on that stream, the
buffer from torch's pinned allocator, which does not reuse it before the copies that use
it are done). When the pool's bytes exceed ``budget``, the oldest entries (packed first,
so needed last in backward) are spilled: ``Store.put_async`` to the nvme tier under
``<key_prefix><n>``, their bytes dropped when the write is done; the forward waits only
when more than ``write_window`` bytes of writes are in flight.

Unpack. Bytes in the pool are returned as views (CUDA: copied to the device on the current
stream); spilled ones come from a prefetch (_prefetch.py) or are read on demand. The bytes
of a spilled entry are not kept after its unpack: a later unpack of the same entry (a
retained graph's next backward, double backward) reads it again unless the tensor of the
last unpack is still alive.

Free. An entry lives as long as a handle to it does (autograd frees a saved variable's
handle once backward used it, unless the graph is retained): then its bytes are dropped
and its store object deleted. Handles' ``__del__`` only queue the entry; the queue is
drained at every pack and unpack, at the end of each backward and by ``stats``/``close``.

Thread-safety: ``_lock`` guards the pool; pack runs on the forward's thread, unpack on
autograd's (the caller's for CPU), the fetch thread publishes reads.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ._entry import (Entry, Saved, State, StorageWeakRef, extent_of, flat_bytes, kept_as_is,
                     rebuild, storage_of)
from ._prefetch import Prefetcher, Segment


def host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """A new flat uint8 host tensor: pinned (CUDA), else 4096-byte aligned."""
    if pin:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    raw = np.empty(nbytes + 4096, dtype=np.uint8)
    off = (-raw.ctypes.data) % 4096
    return torch.from_numpy(raw[off:off + nbytes])


STAT_KEYS = ("activation_bytes", "bytes_spilled", "bytes_written", "bytes_fetched",
             "pool_bytes", "pool_peak_bytes", "spills", "prefetch_hits", "prefetch_misses",
             "stall_seconds", "fetch_seconds", "write_wait_seconds", "tensors_packed",
             "tensors_deduplicated", "tensors_kept", "trace_mismatches")


def _noop() -> None:
    pass


def _inside_backward() -> bool:
    """This thread runs an autograd backward now (only then may callbacks be queued)."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(_noop)
    except RuntimeError:
        return False
    return True


class Pool:
    """The saved activations of one ActivationOffload (see the module doc)."""

    def __init__(self, owner: Any, store: Any, budget: int, min_bytes: int, write_window: int,
                 prefetch_window: int, key_prefix: str):
        #: the ActivationOffload, weakly (its handles hold it strongly: it lives while a
        #: graph holds activations, and its finalizer closes this pool after that)
        self._owner = weakref.ref(owner)
        self.store = store
        self.budget, self.min_bytes, self.write_window = budget, min_bytes, write_window
        self.key_prefix = key_prefix
        self._lock = threading.Lock()
        self.stats: Dict[str, Any] = {k: 0 for k in STAT_KEYS}
        for k in STAT_KEYS:
            if k.endswith("_seconds"):
                self.stats[k] = 0.0
        self.prefetcher = Prefetcher(store, self._lock, prefetch_window, self.stats)
        #: entries whose last handle died (appended by Saved.__del__, drained under the lock)
        self.released: "collections.deque[Entry]" = collections.deque()
        self._host: "collections.OrderedDict[int, Entry]" = collections.OrderedDict()
        self._writing: "collections.deque[Entry]" = collections.deque()
        self._writing_bytes = 0
        self._dedupe: Dict[Any, Entry] = {}
        self._live: Dict[int, Entry] = {}
        self._deletes: List[Any] = []
        self._count = 0
        self.segment: Optional[Segment] = None
        self.in_backward = False
        self._bw_segments: List[Segment] = []
        self._streams: Dict[Any, Any] = {}
        self.closed = False

    # ---- pack -------------------------------------------------------------------------

    def pack(self, t: torch.Tensor) -> Any:
        """autograd's pack hook (inside the offload's ``with`` block)."""
        if self.in_backward and not _inside_backward():
            self._end_backward()  # a backward that raised: its end callback never ran
        if self.in_backward or self.segment is None or kept_as_is(t):
            self.stats["tensors_kept"] += 1
            return t
        es = t.element_size()
        if t.numel() * es < self.min_bytes or StorageWeakRef is None:
            self.stats["tensors_kept"] += 1
            return t
        storage = storage_of(t)
        snb = storage.nbytes()
        lo, hi = extent_of(t, snb)
        if snb % es == 0 and 2 * (hi - lo) >= snb:
            lo, hi = 0, snb
        sref = StorageWeakRef(storage)
        version = t._version
        dk = (sref.cdata, lo, hi, version, t.get_device())
        with self._lock:
            self._drain()
            e = self._dedupe.get(dk)
            if e is not None and (e.dead or e.sref.expired()):
                del self._dedupe[dk]
                e = None
            if e is None:
                e = self._new_entry(t, lo, hi, snb, version, sref, dk)
            else:
                self.stats["tensors_deduplicated"] += 1
            e.refs += 1
            self.stats["tensors_packed"] += 1
        return Saved(self._owner(), e, t, (t.storage_offset() * es - lo) // es)

    def _new_entry(self, t: torch.Tensor, lo: int, hi: int, snb: int, version: int,
                   sref: Any, dk: Any) -> Entry:
        seg = self.segment
        self._count += 1
        e = Entry(self._count, seg, len(seg.entries), f"{self.key_prefix}{self._count}",
                  hi - lo, lo, t.device)
        src = flat_bytes(t, lo, hi)
        if t.device.type == "cpu":
            if lo == 0 and hi == snb:
                e.data, e.adopted = src, True
            else:
                e.data = host_buffer(hi - lo, False)
                e.data.copy_(src)
        else:
            stream = self._streams.get(t.device)
            if stream is None:
                stream = self._streams[t.device] = torch.cuda.Stream(t.device)
            stream.wait_stream(torch.cuda.current_stream(t.device))
            e.data = host_buffer(hi - lo, True)
            with torch.cuda.stream(stream):
                e.data.copy_(src, non_blocking=True)
                e.event = torch.cuda.Event()
                e.event.record(stream)
            src.record_stream(stream)
        e.version, e.sref, e.dedupe_key = version, sref, dk
        seg.entries.append(e)
        seg.sizes.append(e.nbytes)
        self._dedupe[dk] = e
        self._live[e.index] = e
        self._host[e.index] = e
        st = self.stats
        st["activation_bytes"] += e.nbytes
        st["pool_bytes"] += e.nbytes
        st["pool_peak_bytes"] = max(st["pool_peak_bytes"], st["pool_bytes"])
        self._enforce_budget()
        return e

    def _enforce_budget(self) -> None:
        st = self.stats
        while st["pool_bytes"] - self._writing_bytes > self.budget and self._host:
            _, e = self._host.popitem(last=False)
            self._spill(e)
        self._poll_writes()
        while self._writing_bytes > self.write_window and self._writing:
            t0 = time.perf_counter()
            self._finish_write(self._writing.popleft())
            st["write_wait_seconds"] += time.perf_counter() - t0

    def _spill(self, e: Entry) -> None:
        if e.event is not None:
            e.event.synchronize()
        e.future = self.store.put_async(e.key, e.data, "nvme", overwrite=True)
        e.state = State.WRITING
        self._writing.append(e)
        self._writing_bytes += e.nbytes
        self.stats["bytes_spilled"] += e.nbytes
        self.stats["spills"] += 1
        e.segment.spilled += 1

    def _poll_writes(self) -> None:
        while self._writing and self._writing[0].future.done():
            self._finish_write(self._writing.popleft())

    def _finish_write(self, e: Entry) -> None:
        fut, e.future = e.future, None
        self._writing_bytes -= e.nbytes
        self.stats["pool_bytes"] -= e.nbytes
        try:
            fut.result()
        finally:
            if e.adopted and e.data is not None and e.data._version != e.version:
                e.modified = True
            e.data = None
            e.state = State.SPILLED
        self.stats["bytes_written"] += e.nbytes
        if e.dead:
            self._delete(e)

    # ---- free -------------------------------------------------------------------------

    def _drain(self) -> None:
        """Frees the entries whose last handle died (under the lock)."""
        while self.released:
            e = self.released.popleft()
            e.refs -= 1
            if e.refs <= 0 and not e.dead:
                self._free(e)
        for e in self.prefetcher.take_dead():
            self._delete(e)
        if self._deletes:
            self._deletes = [f for f in self._deletes if not f.done()]

    def _free(self, e: Entry) -> None:
        e.dead = True
        self._live.pop(e.index, None)
        if self._dedupe.get(e.dedupe_key) is e:
            del self._dedupe[e.dedupe_key]
        e.recent = None
        if e.state is State.HOST:
            self._host.pop(e.index, None)
            self.stats["pool_bytes"] -= e.nbytes
            e.data, e.state = None, State.FREED
        elif e.state is State.SPILLED:
            self._delete(e)
        elif e.state is State.FETCHED:
            e.fetched = None
            self.prefetcher.inflight_bytes -= e.nbytes
            self._delete(e)
        # WRITING: deleted when the write is done; FETCHING: when the read is (prefetcher)

    def _delete(self, e: Entry) -> None:
        e.state = State.FREED
        if not self.closed:
            self._deletes.append(self.store.delete_async(e.key))

    # ---- unpack -----------------------------------------------------------------------

    def begin_backward(self) -> None:
        """An unpack: inside backward until autograd's pass ends (packs meanwhile -- the
        recomputation of a reentrant checkpoint -- keep their tensors)."""
        if self.in_backward:
            return
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        except RuntimeError:  # an unpack outside backward (e.g. grad_fn._saved_self)
            return
        self.in_backward = True

    def _end_backward(self) -> None:
        self.in_backward = False
        with self._lock:
            for seg in self._bw_segments:
                self.prefetcher.end_backward(seg)
            self._bw_segments = []
            self._drain()

    def unpack(self, h: Saved) -> torch.Tensor:
        """autograd's unpack hook for handle ``h``: the saved tensor (see the module doc).

        :raises RuntimeError: the offload is closed; the tensor was changed in place after
            it was saved (as torch raises in memory); a store error reading it back."""
        e = h.entry
        if self.closed:
            raise RuntimeError("strata.torch.offload_activations: the offload was closed "
                               "while a graph still holds activations it saved (close() it "
                               "after the last backward)")
        if not self.in_backward:
            self.begin_backward()
        with self._lock:
            self._drain()
            self._poll_writes()
            if e.segment not in self._bw_segments:
                self._bw_segments.append(e.segment)
            self.prefetcher.first_unpack(e.segment, e)
            state, flat = e.state, e.data
            if (e.modified or h.modified()
                    or (e.adopted and flat is not None and flat._version != e.version)):
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified "
                    "by an inplace operation (a tensor saved by strata.torch."
                    "offload_activations changed after it was saved)")
            if state is State.FETCHED:
                self.stats["prefetch_hits"] += 1
                flat = self._take(e)
            elif state is State.SPILLED:
                flat = e.recent() if e.recent is not None else None
        if state is State.FETCHING:
            t0 = time.perf_counter()
            e.ready.wait()
            with self._lock:
                self.stats["stall_seconds"] += time.perf_counter() - t0
                self.stats["prefetch_hits"] += 1
                flat = self._take(e)
        elif state is State.SPILLED and flat is None:
            if self.store.closed:
                raise RuntimeError("strata.torch.offload_activations: the store was closed "
                                   "while a graph still holds activations spilled to it "
                                   "(close it after the last backward)")
            t0 = time.perf_counter()
            flat = torch.from_numpy(self.store.get(e.key))
            dt = time.perf_counter() - t0
            with self._lock:
                st = self.stats
                st["prefetch_misses"] += 1
                st["fetch_seconds"] += dt
                st["stall_seconds"] += dt
                st["bytes_fetched"] += e.nbytes
        elif state is State.FREED:
            raise RuntimeError("strata.torch.offload_activations: a saved tensor was unpacked "
                               "after it was freed")
        if e.device.type == "cuda" and flat.device.type == "cpu":
            if e.event is not None and state in (State.HOST, State.WRITING):
                torch.cuda.current_stream(e.device).wait_event(e.event)
            flat = flat.to(e.device, non_blocking=True)
        if state not in (State.HOST, State.WRITING):
            e.recent = weakref.ref(flat)
        return rebuild(flat, h)

    def _take(self, e: Entry) -> torch.Tensor:
        """A finished prefetch of ``e``: its bytes (the entry is SPILLED again)."""
        flat, err = e.fetched, e.fetch_error
        e.fetched, e.fetch_error, e.state = None, None, State.SPILLED
        self.prefetcher.inflight_bytes -= e.nbytes
        if err is not None:
            raise err
        return flat

    # ---- segments, stats, close -------------------------------------------------------

    def begin_segment(self) -> None:
        self.segment = Segment()

    def end_segment(self) -> None:
        self.segment = None
        with self._lock:
            self._drain()
            self._poll_writes()

    def snapshot(self) -> Dict[str, Any]:
        with self._lock:
            self._drain()
            self._poll_writes()
            out = dict(self.stats)
        out["entries_alive"] = len(self._live)
        return out

    def reset(self) -> None:
        with self._lock:
            for k in STAT_KEYS:
                if k not in ("pool_bytes",):
                    self.stats[k] = 0.0 if k.endswith("_seconds") else 0
            self.stats["pool_peak_bytes"] = self.stats["pool_bytes"]

    def wait_writes(self) -> None:
        """Waits for the spills in flight and the deletes of freed entries' objects."""
        with self._lock:
            while self._writing:
                self._finish_write(self._writing.popleft())
            self._drain()
            deletes, self._deletes = self._deletes, []
        for f in deletes:
            f.result()

    def close(self) -> None:
        """Ends the fetch thread, waits for writes, deletes every object left (none when
        the store was closed first)."""
        if self.closed:
            return
        self.prefetcher.stop()
        if self.store.closed:
            self.closed = True
        with self._lock:
            while self._writing:
                e = self._writing.popleft()
                try:
                    self._finish_write(e)
                except Exception:  # noqa: BLE001 (closing: the entry is dropped anyway)
                    pass
            self._drain()
            for e in list(self._live.values()):
                e.dead = True
                if not self.closed and e.state in (State.SPILLED, State.FETCHED, State.FETCHING):
                    self._deletes.append(self.store.delete_async(e.key))
                e.data = e.fetched = None
                e.state = State.FREED
            self._live.clear()
            self._host.clear()
            self._dedupe.clear()
            self.stats["pool_bytes"] = 0
            deletes, self._deletes = self._deletes, []
            self.closed = True
        for f in deletes:
            try:
                f.result()
            except Exception:  # noqa: BLE001 (already gone)
                pass
