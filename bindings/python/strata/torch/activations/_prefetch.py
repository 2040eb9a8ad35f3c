"""Backward's prefetch of spilled activations along a trace: the order in which the entries
of the last forward with the same signature (the sizes of its entries in pack order; the
last ``MAX_TRACES`` signatures keep theirs) were first unpacked in its backward (by pack
index), followed when a forward packs entries of those sizes in that order.
While it is followed, each first unpack issues reads of the next spilled entries of the
trace, as far ahead as ``window`` bytes of prefetched data allow (at least one entry); an
unpack the trace does not predict ends the prefetch for the rest of that backward (on
demand, no error) and the order recorded meanwhile becomes the next trace.

Reads go through the store (``Store.get`` into a new 4096-byte-aligned array, GIL
released) on one background thread, timed there (``fetch_seconds``); an entry freed while
its read is in flight drops the bytes when the read ends.

Thread-safety: :meth:`Prefetcher.issue` and the trace methods are called under the pool's
lock from the thread that unpacks; the fetch thread takes the same lock to publish a read.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from ._entry import Entry, State


#: signatures whose trace is kept (least recently recorded dropped first)
MAX_TRACES = 8


class Segment:
    """One ``with`` block's forward: its entries by pack index, their sizes (the
    signature), and the order of first unpack recorded in its backward."""

    __slots__ = ("entries", "sizes", "order", "seen", "follow", "pos", "positions",
                 "spilled")

    def __init__(self) -> None:
        self.entries: List[Entry] = []
        self.sizes: List[int] = []
        self.order: List[int] = []
        self.seen: set = set()
        self.follow: Optional[List[int]] = None  # the trace followed (None: on demand)
        self.pos = 0
        self.positions: Dict[int, int] = {}
        #: entries of this segment ever spilled: none, nothing to read ahead (the scan of
        #: the rest of the trace per first unpack, O(entries^2) per backward, is skipped)
        self.spilled = 0


class Prefetcher:
    """The trace and the fetch thread of one pool (see the module doc)."""

    def __init__(self, store: Any, lock: threading.Lock, window: int, stats: Dict[str, Any]):
        self.store, self.lock, self.window, self.stats = store, lock, int(window), stats
        #: order of the last backward by signature (sizes), the most recent last: a few
        #: shapes taking turns (batch or sequence buckets, a short last batch) keep theirs
        self.traces: "collections.OrderedDict[Tuple[int, ...], List[int]]" = \
            collections.OrderedDict()
        self.inflight_bytes = 0  # FETCHING + FETCHED bytes
        self._queue: "collections.deque[Entry]" = collections.deque()
        self._wake = threading.Condition(lock)
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self._dead: List[Entry] = []  # entries freed while their read was in flight

    def take_dead(self) -> List[Entry]:
        """The entries freed during their read, read since (under the lock)."""
        out, self._dead = self._dead, []
        return out

    # ---- the trace (under the lock) ---------------------------------------------------

    def first_unpack(self, seg: Segment, e: Entry) -> None:
        """``e`` (of ``seg``) is unpacked for the first time in this backward."""
        if e.pack_index in seg.seen:
            return
        if not seg.order and self.window > 0 and self.traces:
            follow = self.traces.get(tuple(seg.sizes))
            if follow is not None:
                seg.follow = follow
                seg.positions = {k: i for i, k in enumerate(seg.follow)}
                seg.pos = 0
            else:  # another forward (other sizes or another number of tensors)
                self.stats["trace_mismatches"] += 1
        seg.seen.add(e.pack_index)
        seg.order.append(e.pack_index)
        if seg.follow is None:
            return
        p = seg.positions.get(e.pack_index)
        if p is None or p < seg.pos:
            self.stats["trace_mismatches"] += 1
            seg.follow = None
            return
        seg.pos = p + 1
        if seg.spilled:
            self._ahead(seg)

    def end_backward(self, seg: Segment) -> None:
        """A backward through ``seg`` ended (a reentrant checkpoint's inner one too): the
        order recorded so far becomes the trace."""
        if seg.order:
            sig = tuple(seg.sizes)
            self.traces[sig] = list(seg.order)
            self.traces.move_to_end(sig)
            while len(self.traces) > MAX_TRACES:
                self.traces.popitem(last=False)

    def _ahead(self, seg: Segment) -> None:
        t = seg.follow
        for k in range(seg.pos, len(t)):
            e = seg.entries[t[k]] if t[k] < len(seg.entries) else None
            if e is None or e.state is not State.SPILLED or e.dead:
                continue
            if self.inflight_bytes and self.inflight_bytes + e.nbytes > self.window:
                return
            self.issue(e)

    # ---- reads ------------------------------------------------------------------------

    def issue(self, e: Entry) -> None:
        """Queues the read of spilled ``e`` (under the lock)."""
        e.state = State.FETCHING
        e.ready = threading.Event()
        e.prefetched = True
        self.inflight_bytes += e.nbytes
        self._queue.append(e)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="strata-activation-fetch",
                                            daemon=True)
            self._thread.start()
        self._wake.notify()

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self._queue and not self._stop:
                    self._wake.wait()
                if not self._queue:
                    return
                e = self._queue.popleft()
            data, err = None, None
            t0 = time.perf_counter()
            try:
                data = torch.from_numpy(self.store.get(e.key))
            except BaseException as x:  # noqa: BLE001 (raised where it is unpacked)
                err = x
            dt = time.perf_counter() - t0
            with self.lock:
                self.stats["fetch_seconds"] += dt
                if err is None:
                    self.stats["bytes_fetched"] += e.nbytes
                if e.dead:
                    self.inflight_bytes -= e.nbytes
                    self._dead.append(e)
                elif e.state is State.FETCHING:
                    e.fetched, e.fetch_error, e.state = data, err, State.FETCHED
                ev = e.ready
            ev.set()

    def stop(self) -> None:
        """Ends the fetch thread after the reads queued."""
        with self.lock:
            self._stop = True
            self._wake.notify()
            th = self._thread
        if th is not None:
            th.join()
        with self.lock:
            self._thread, self._stop = None, False
