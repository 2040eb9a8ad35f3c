"""The working set of offloaded parameters (strata.torch.offload_parameters): which
parameters are materialized in memory, their fetches from the store, eviction within a
byte budget, and prefetch along the traced order of use.

Budget. ``budget`` bytes bound what is materialized plus what is being fetched (never a
number of slots per parameter: a parameter takes its own bytes, whatever its size). A
parameter larger than the whole budget is still fetched, alone (everything else is evicted
first): a budget too small never fails, it only stops prefetch.

Order of use. Each phase (a forward of the model in a given mode -- training or eval, with
or without grad --, or a backward) records the order in which parameters are first used.
The next phase of the same kind prefetches along the recorded order: while a parameter is
used, the next ones are fetched by a background thread, as far ahead as the budget allows
without evicting a parameter needed sooner than the one fetched (Belady's rule). When the
order differs from the recorded one (dynamic control flow, another input), the rest of the
phase fetches on demand and the new order replaces the old at the phase's end: no error, no
warning, no hang; the next phase of that kind prefetches again.

Memory. A fetch reads into a 4096-byte-aligned buffer (``Store.get``) no tensor can see: a
new one, or one of the array pool, freed when its last reference went (_memory.py); a view
of a parameter that outlives its release keeps the old buffer and its values.

Thread-safety: the owner's thread (torch's forward/backward thread) calls everything but
``_run``, the fetch thread; shared state is guarded by ``_lock``.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Dict, List, Optional

import torch

from .._common import no_torch_function as _no_tf
from .._trace import TRACE
from ._comm_fetch import CommFetch as _CommFetch
from ._memory import ArrayPoolReservation
from ._record import IN_MEMORY, ParamRecord, Residency, shaped, tensor_of


class WorkingSet:
    """The materialized parameters of one ParameterOffload (see the module doc).

    :param store: the strata.Store holding the parameter objects.
    :param budget: bytes of materialized + in-flight parameter data (int > 0).
    :param prefetch: fetch ahead along the traced order (False: on demand only).
    :param stats: the owner's counters, updated in place (see ParameterOffload.stats).
    :param comm: partitioned parameters (see ``comm`` below); None: one process.
    """

    def __init__(self, store: Any, budget: int, prefetch: bool, stats: Dict[str, float],
                 comm: Any = None):
        self.store = store
        #: a strata.distributed.Communicator: parameters are partitioned objects, fetched
        #: with fetch_partitioned (collective: issued from the owner's thread only, in the
        #: same order on every rank) instead of by the fetch thread
        self.comm = comm
        self.budget = int(budget)
        self.prefetch, self.stats = prefetch, stats
        #: freed fetch buffers kept for the next fetch, up to the budget (_memory.py)
        self._pool = ArrayPoolReservation(self.budget)
        self.records: List[ParamRecord] = []
        self._lru: "collections.OrderedDict[int, None]" = collections.OrderedDict()  # LRU 1st
        self.resident_bytes = self.inflight_bytes = 0
        self.staged_bytes = 0  #: bytes of new values staged for resident parameters
        #: record indices that eviction must not choose (one operation's arguments)
        self.protected: frozenset = frozenset()
        self._lock = threading.Lock()
        #: (record, the store key of its value) to fetch, in order
        self._queue: "collections.deque[Any]" = collections.deque()
        self._wake = threading.Condition(self._lock)
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        #: traces of use: phase kind -> record indices in order of first use
        self.traces: Dict[Any, List[int]] = {}
        self._phase: Any = None
        self._recorded: List[int] = []
        self._seen: set = set()
        self._trace: Optional[List[int]] = None  # the trace followed (None: on demand)
        self._pos = 0  # entries of _trace matched so far
        self._next_use: Dict[int, int] = {}  # record index -> its position in _trace
        #: phase kind -> (record index -> the trace position of its last use in the phase:
        #: a parameter used again later, e.g. a tied embedding, is kept until then)
        self.last_uses: Dict[Any, Dict[int, int]] = {}
        self._last: Dict[int, int] = {}  # the current phase's last uses
        self._last_use: Dict[int, int] = {}  # those of the trace followed

    # ---- phases and traces ----------------------------------------------------------------

    @property
    def phase(self) -> Any:
        return self._phase

    def begin_phase(self, kind: Any) -> None:
        """Starts a phase (ends the current one first): follows its kind's trace, if any."""
        self.end_phase()
        self._phase = kind
        self._recorded = []
        self._seen = set()
        trace = self.traces.get(kind) if self.prefetch else None
        self._trace = trace
        self._pos = 0
        self._next_use = {} if trace is None else {s: i for i, s in enumerate(trace)}
        self._last = {}
        self._last_use = self.last_uses.get(kind, {}) if trace is not None else {}
        if trace:
            with torch.inference_mode(False):  # (the buffers of collective fetches)
                self._prefetch_from(0)

    def end_phase(self) -> None:
        """Ends the current phase: its order of use becomes its kind's trace."""
        if self._phase is None:
            return
        if self._recorded:
            self.traces[self._phase] = self._recorded
            self.last_uses[self._phase] = self._last
        self._phase = None
        self._trace = None
        self._next_use = {}
        self._last_use = {}

    def _record(self, s: ParamRecord) -> None:
        """First use of ``s`` in the phase: follow or leave the trace, prefetch ahead."""
        if self._phase is None:
            return
        self._last[s.index] = len(self._recorded)  # (its position, or the next one's)
        if s.index in self._seen:
            return
        self._seen.add(s.index)
        self._recorded.append(s.index)
        t = self._trace
        if t is None:
            return
        if self._pos < len(t) and t[self._pos] == s.index:
            self._pos += 1
            self._prefetch_from(self._pos)
        else:  # another order: on demand for the rest of the phase
            self.stats["trace_mismatches"] += 1
            self._trace = None
            self._next_use = {}
            self._last_use = {}

    # ---- materialization ------------------------------------------------------------------

    def materialize(self, s: ParamRecord) -> torch.Tensor:
        """``s``'s data in memory (fetched or waited for when needed), as the parameter's
        shape and layout; counts a prefetch hit or miss and the time stalled. The data is a
        normal tensor also under ``torch.inference_mode()`` (an inference tensor would
        break the next training forward that saves it for backward)."""
        if torch.is_inference_mode_enabled():
            with torch.inference_mode(False):
                return self._materialize(s)
        return self._materialize(s)

    def _materialize(self, s: ParamRecord) -> torch.Tensor:
        prev = self.protected
        self.protected = prev | {s.index}  # the prefetch that _record starts must not evict s
        try:
            self._record(s)
        finally:
            self.protected = prev
        if s.state in IN_MEMORY:
            self._lru.move_to_end(s.index)
            self.stats["resident_hits"] += 1
            return s.resident
        t0 = time.perf_counter()
        rf = TRACE.stall_begin(s) if TRACE.on else None
        if s.state is Residency.FETCHING:
            self.stats["prefetch_hits"] += 1
            s.pending.wait()
            self._take(s)
        else:
            self.stats["prefetch_misses"] += 1
            self.touch(s)
            self._make_room(s.nbytes, protect=s.index, before=None)
            t1 = time.perf_counter()
            data = self.read(s)
            self.stats["fetch_seconds"] += time.perf_counter() - t1
            if TRACE.on: TRACE.fetch_read(s, t1, time.perf_counter())  # noqa: E701
            self.stats["bytes_fetched"] += s.nbytes
            self._set_resident(s, data)
        self.stats["stall_seconds"] += time.perf_counter() - t0
        if TRACE.on: TRACE.stall_end(rf, s, t0)  # noqa: E701
        return s.resident

    def touch(self, s: ParamRecord) -> None:
        """Before ``s``'s stored value is read or written: a linked optimizer's update of it
        in backward not yet committed is rolled back (offload/_record.py, OptimizerLink)."""
        if s.link is not None:
            s.link.before_access(s.param)

    def read(self, s: ParamRecord) -> torch.Tensor:
        """``s``'s stored value, a new flat tensor (with a communicator: collective)."""
        if self.comm is None:
            self.touch(s)
            return tensor_of(self.store.get(s.value_key), s.dtype)
        out = torch.empty(s.numel, dtype=s.dtype)
        self.comm.fetch_partitioned(self.store, s.key, out)
        return out

    def read_part(self, s: ParamRecord) -> torch.Tensor:
        """This rank's stored slice of partitioned ``s`` (its ``owned`` elements), a new
        flat tensor; no collective."""
        b, e = s.owned
        if e == b:
            return torch.zeros(0, dtype=s.dtype)
        return tensor_of(self.store.get(s.key + "#part"), s.dtype)

    def _set_resident(self, s: ParamRecord, flat: torch.Tensor) -> None:
        if s.device.type != "cpu":
            flat = flat.to(s.device, non_blocking=False)
        s.resident = shaped(s, flat)
        s.state = Residency.RESIDENT
        self._lru[s.index] = None
        self.resident_bytes += s.nbytes
        self._peak()
        with _no_tf():
            s.param.data = s.resident
            s.mark = s.param._version

    def adopt(self, s: ParamRecord, value: torch.Tensor) -> None:
        """``p.data = value``: ``value`` is the parameter's data, newer than the store
        (ADOPTED: stored when released)."""
        if s.state is Residency.FETCHING:
            self.drain()
        if s.state is Residency.RELEASED:
            self.resident_bytes += s.nbytes
        self._lru[s.index] = None
        self._lru.move_to_end(s.index)
        s.resident = value
        s.state = Residency.ADOPTED
        with _no_tf():
            s.param.data = value

    def materialize_together(self, records: List[ParamRecord]) -> None:
        """Every record of one operation's arguments in memory at once (none of them is
        evicted to make room for another)."""
        prev = self.protected
        self.protected = prev | {s.index for s in records}
        try:
            for s in records:
                self.materialize(s)
        finally:
            self.protected = prev

    def _take(self, s: ParamRecord) -> None:
        """A finished prefetch of ``s`` becomes resident (its error is raised)."""
        if isinstance(s.pending, _CommFetch):
            s.pending.finish(s, self.stats)
        with self._lock:
            data, err = s.fetched, s.fetch_error
            s.fetched, s.fetch_error, s.pending = None, None, None
            s.state = Residency.RELEASED
            self.inflight_bytes -= s.nbytes
        if err is not None:
            raise err
        self._set_resident(s, data)

    def set_value(self, s: ParamRecord, flat: torch.Tensor) -> None:
        """``s``'s data is ``flat`` now (its stored value changed: a step): replaces the
        resident copy, if any, keeping it resident (and clean)."""
        if s.state not in IN_MEMORY:
            return
        with torch.no_grad(), _no_tf():
            s.resident.copy_(flat.view(s.shape))
            s.mark = s.param._version
        s.state = Residency.RESIDENT

    def stage(self, s: ParamRecord) -> Optional[torch.Tensor]:
        """A new flat buffer for resident ``s``'s next value (an update in backward writes
        it) when the budget has room beside what is in memory and in flight (nothing is
        evicted for it), else None; counted in the working set until :meth:`unstage`."""
        if (s.state is not Residency.RESIDENT or s.stride is not None
                or s.device.type != "cpu"):
            return None
        used = self.resident_bytes + self.inflight_bytes + self.staged_bytes
        if used + s.nbytes > self.budget:
            return None
        self.staged_bytes += s.nbytes
        self._peak()
        return torch.empty(s.numel, dtype=s.dtype)

    def unstage(self, s: ParamRecord, buf: torch.Tensor, value: bool) -> None:
        """Ends a buffer of :meth:`stage`: with ``value`` (``s``'s new stored value) it is
        ``s``'s data when ``s`` is still resident (else ``s`` is released); else dropped."""
        self.staged_bytes -= s.nbytes
        if not value:
            return
        if s.state is Residency.RESIDENT and not self.dirty(s):
            s.resident = buf.view(s.shape)
            with _no_tf():
                s.param.data = s.resident
                s.mark = s.param._version
        else:
            self.release(s, write_back=False)

    def dirty(self, s: ParamRecord) -> bool:
        """The data of ``s`` in memory is newer than the store: ADOPTED, or RESIDENT and
        changed in place since it was materialized or stored."""
        if s.state is Residency.ADOPTED:
            return True
        if s.state is not Residency.RESIDENT:
            return False
        with _no_tf():
            return s.param._version != s.mark

    def write_back(self, s: ParamRecord) -> None:
        """Stores the resident data of ``s`` when it changed (an edit of the parameter)."""
        if self.dirty(s):
            self.touch(s)
            with _no_tf():
                src = s.resident.detach().reshape(-1)
                if src.device.type != "cpu":
                    src = src.cpu()
                if s.link is not None:
                    s.link.write_master(s.param, src.contiguous())
                elif s.owned is None:
                    self.store.put(s.key, src.contiguous(), overwrite=True)
                elif s.owned[1] > s.owned[0]:  # this rank's slice (every rank edits alike)
                    self.store.put(s.key + "#part", src[s.owned[0]:s.owned[1]].contiguous(),
                                   overwrite=True)
                s.version += 1
                s.mark = s.param._version
            s.state = Residency.RESIDENT
            self.stats["bytes_written_back"] += s.nbytes

    def release(self, s: ParamRecord, write_back: bool = True) -> None:
        """Drops ``s``'s data from memory (written back first when it changed, unless
        ``write_back`` is False: the stored value is newer)."""
        if s.state not in IN_MEMORY:
            return
        if write_back:
            self.write_back(s)
        with _no_tf():
            s.param.data = s.placeholder
        s.resident = None
        s.state = Residency.RELEASED
        if TRACE.on: TRACE.instant(f"evict {s.name}", "evict", {"nbytes": s.nbytes})  # noqa: E701
        self._lru.pop(s.index, None)
        self.resident_bytes -= s.nbytes

    def release_all(self) -> None:
        """Every parameter released, every fetch in flight finished."""
        self.drain()
        for s in self.records:
            self.release(s)

    def drain(self) -> None:
        """Waits for the fetches in flight and drops their data."""
        for s in self.records:
            if s.state is Residency.FETCHING:
                s.pending.wait()
                if isinstance(s.pending, _CommFetch):
                    s.pending.finish(s, self.stats)
                with self._lock:
                    s.fetched, s.fetch_error, s.pending = None, None, None
                    s.state = Residency.RELEASED
                    self.inflight_bytes -= s.nbytes

    def _peak(self) -> None:
        used = self.resident_bytes + self.inflight_bytes + self.staged_bytes
        if used > self.stats["peak_working_set_bytes"]:
            self.stats["peak_working_set_bytes"] = used

    def _victims(self, need: int, protect: int,
                 before: Optional[int]) -> Optional[List[ParamRecord]]:
        """Records in memory whose release frees ``need`` bytes: those the followed trace does
        not use again first (least recently used first), then the ones used furthest
        ahead. ``before``: a trace position; records used before it are never chosen (None:
        any). None when not enough can be freed under that rule."""
        free = self.budget - self.resident_bytes - self.inflight_bytes - self.staged_bytes
        if free >= need:
            return []
        ahead, done = [], []
        for i in self._lru:
            if i == protect or i in self.protected:
                continue
            nu = self._next_use.get(i, -1)
            if nu < self._pos:  # first use passed: still needed at its last use?
                nu = self._last_use.get(i, -1)
            if nu >= self._pos:
                ahead.append((nu, i))
            else:
                done.append(i)
        order = [self.records[i] for i in done]
        ahead.sort(reverse=True)
        for nu, i in ahead:
            if before is not None and nu <= before:
                break
            order.append(self.records[i])
        chosen = []
        for s in order:
            if free >= need:
                break
            chosen.append(s)
            free += s.nbytes
        if free < need and before is not None:
            return None
        return chosen

    def _make_room(self, need: int, protect: int, before: Optional[int]) -> bool:
        victims = self._victims(need, protect, before)
        if victims is None:
            return False
        for v in victims:
            self.release(v)
        if before is None and self.inflight_bytes and (
                self.resident_bytes + self.inflight_bytes + self.staged_bytes + need
                > self.budget):
            # on demand and still over: let the fetches in flight land, then evict again
            for s in self.records:
                if s.state is Residency.FETCHING:
                    s.pending.wait()
                    self._take(s)
            for v in self._victims(need, protect, None) or []:
                self.release(v)
        return True

    # ---- prefetch -------------------------------------------------------------------------

    def _prefetch_from(self, pos: int) -> None:
        """Issues fetches of the followed trace's entries from ``pos`` on while they fit."""
        t = self._trace
        if t is None:
            return
        for k in range(pos, len(t)):
            s = self.records[t[k]]
            if s.state is not Residency.RELEASED:
                continue
            if s.link is not None and s.link.started(s.param):
                continue  # its update in backward runs: not used again before step()
            if s.nbytes > self.budget - self.inflight_bytes:
                return
            if not self._make_room(s.nbytes, protect=s.index, before=k):
                return
            self._issue(s)

    def _issue(self, s: ParamRecord) -> None:
        if self.comm is not None:  # collective: issued here, in this thread's order
            out = torch.empty(s.numel, dtype=s.dtype)
            s.pending = _CommFetch(self.comm.fetch_partitioned_async(self.store, s.key, out),
                                   out)
            s.state = Residency.FETCHING
            self.inflight_bytes += s.nbytes
            self._peak()
            return
        self.touch(s)
        key = s.value_key
        with self._lock:
            s.pending = threading.Event()
            s.state = Residency.FETCHING
            self.inflight_bytes += s.nbytes
            if TRACE.on: TRACE.fetch_issued(s)  # noqa: E701
            self._queue.append((s, key))
            self._peak()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="strata-param-fetch",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        """The fetch thread: reads queued parameters in order (GIL released in the read)."""
        while True:
            with self._lock:
                while not self._queue and not self._stop:
                    self._wake.wait()
                if self._stop and not self._queue:
                    return
                s, key = self._queue.popleft()
            data, err = None, None
            t0 = time.perf_counter()
            try:
                data = tensor_of(self.store.get(key), s.dtype)
            except BaseException as e:  # noqa: BLE001 (raised on the owner's thread)
                err = e
            dt = time.perf_counter() - t0
            if TRACE.on: TRACE.fetch_read(s, t0, t0 + dt)  # noqa: E701
            with self._lock:
                self.stats["fetch_seconds"] += dt
                if err is None:
                    self.stats["bytes_fetched"] += s.nbytes
                s.fetched, s.fetch_error = data, err
                ev = s.pending
            ev.set()

    def stop(self) -> None:
        """Ends the fetch thread (after the fetches queued); gives the array pool back."""
        self._pool.release()
        with self._lock:
            self._stop = True
            self._wake.notify()
            th = self._thread
        if th is not None:
            th.join()
        with self._lock:
            self._thread = None
            self._stop = False
