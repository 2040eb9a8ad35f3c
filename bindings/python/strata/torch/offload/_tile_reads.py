"""Reading tiled parameters (offload/_tiled.py): blocks of whole rows, several in flight,
the first ones of an operator's use read ahead of it along the recorded order of uses, and
an embedding's rows by byte ranges.

Blocks. An operator walks the blocks of a tiled parameter in order (:func:`blocks`); up to
``MAX_DEPTH`` blocks are read ahead of the one in use on the offload's block thread (two
always, counted in the working set, which evicts for them; more only when the working set
has room for them without evicting).

Uses ahead. Every use of a tiled parameter that reads it -- ``(phase, record, what)``:
phase the working set's (forward in a mode, or backward), what ``"linear"``,
``"linear_bwd"`` or ``"embedding"`` -- is recorded, with the use that followed it last
time. When a use ends and the use that followed it last time reads blocks, its first blocks
(two at most) are read at once on the block thread, counted in the working set meanwhile,
so that they are ready when it starts (e.g. the tied output head's blocks while the layers
between the embedding and the head run; the head's backward's while the loss is computed).
A use that starts finds them and takes them when it is that use and the parameter's value
has not changed since (``version``); otherwise they are dropped (read again: no error, no
stale value). Nothing is read ahead from a backward into the next forward (the optimizer's
step comes between them and changes the value).

Kept blocks. A forward ``F.linear`` use whose next use last time was its own backward (the
tied output head: forward, the loss, then its backward first) walks its blocks from the
last to the first (each output column block is computed alone, so the order changes no
result), and the blocks it holds at its end -- the first ones, as many as its reserve in
the working set covers: two, more where the working set had room for them without
evicting (``MAX_DEPTH``) -- stay in memory, counted in the working set, for the backward,
which walks the blocks from the first on (the input gradient's summation order is
unchanged) and takes them instead of reading them again (not counted in
``tile_blocks_fetched``); the blocks read ahead of that backward are then these (same
rules: a different use or a changed value drops them).

Rows. :func:`embedding_rows` reads only the rows its ids use: the distinct ids, sorted,
adjacent ones coalesced into one byte range of the store object (``Store.read_range``),
ranges read in parallel (``ROW_THREADS`` threads), in groups of at most a block's bytes;
the output rows are copied from them (exact, bit-identical to ``F.embedding``).

Counters: block and row bytes in ``bytes_fetched``; blocks in ``tile_blocks_fetched``, those
a use found read ahead also in ``tile_blocks_ahead``; reading time (summed over the reading
threads) in ``tile_fetch_seconds``; waits in ``tile_stall_seconds``.

Thread-safety: one thread at a time (torch's forward/backward thread); reads run on the
offload's block thread and row threads.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

import torch

from .._common import no_torch_function as _no_tf
from .._trace import TRACE
from ._record import IN_MEMORY, ParamRecord, tensor_of

#: blocks in use and in flight at most, per operator
MAX_DEPTH = 4
#: blocks read ahead of a use
AHEAD_BLOCKS = 2
#: threads reading an embedding's row ranges
ROW_THREADS = 4


def _executor(owner: Any) -> ThreadPoolExecutor:
    ex = owner.block_reader
    if ex is None:
        ex = owner.block_reader = ThreadPoolExecutor(1, thread_name_prefix="strata-blocks")
    return ex


def read_block(owner: Any, s: ParamRecord, i: int, key: Optional[str] = None) -> torch.Tensor:
    """Block ``i`` of ``s``'s stored value (``key``: another object of the same layout),
    a new tensor of shape ``[r1 - r0, *shape[1:]]`` and ``s``'s dtype.

    :raises strata errors: of ``Store.read_range`` (NotFound, OutOfRange, DataLoss)."""
    t = s.tile
    off, n = t.span(i)
    r0, r1 = t.rows_of(i)
    arr = owner.store.read_range(key or s.value_key, off * t.elem, n * t.elem)
    return tensor_of(arr, s.dtype).view((r1 - r0,) + s.shape[1:])


def _timed_read(owner: Any, s: ParamRecord, i: int) -> Tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    out = read_block(owner, s, i)
    if TRACE.on: TRACE.instant(f"block {s.name}[{i}]", "fetch", {"i": i})  # noqa: E701
    return out, time.perf_counter() - t0


class _Ahead:
    """Blocks read ahead of one use (or kept for it): its key, the value's version, the
    futures of its first k blocks in its order (:meth:`TileReads.order`; a kept block's
    result is ``(block, None)``) and the bytes counted for them in the working set."""

    __slots__ = ("key", "s", "version", "blocks", "futs", "reserve", "kept")

    def __init__(self, key: Tuple[Any, ...], s: ParamRecord, blocks: List[int],
                 futs: List[Future], reserve: int, kept: bool = False):
        self.key, self.s, self.version = key, s, s.version
        self.blocks, self.futs, self.reserve, self.kept = blocks, futs, reserve, kept


class TileReads:
    """The recorded order of tiled uses of one ParameterOffload and what is read ahead."""

    def __init__(self, owner: Any):
        self.owner = owner
        self.next_of: Dict[Tuple[Any, ...], Tuple[Any, ...]] = {}
        self.last: Optional[Tuple[Any, ...]] = None
        self.ahead: Optional[_Ahead] = None
        self.rows_pool: Optional[ThreadPoolExecutor] = None

    def begin(self, key: Tuple[Any, ...]) -> Optional[_Ahead]:
        """Use ``key`` starts: recorded after the last one; returns what was read ahead
        for it (the caller owns its futures and reserve; the first blocks of its
        :meth:`order`), dropping anything else."""
        if self.last is not None and self.last != key:
            self.next_of[self.last] = key
        self.last = key
        a, self.ahead = self.ahead, None
        if a is None:
            return None
        s = a.s
        if (a.key == key and a.version == s.version and s.state not in IN_MEMORY
                and a.blocks == self.order(key, s.tile.nblocks)[:len(a.blocks)]):
            return a
        self._drop(a)
        return None

    def keeps(self, key: Tuple[Any, ...]) -> bool:
        """Use ``key`` is a forward ``F.linear`` whose next use last time was its own
        backward: its blocks are walked last to first and its last ones kept for it."""
        return key[2] == "linear" and self.next_of.get(key) == (("backward",), key[1],
                                                                "linear_bwd")

    def order(self, key: Tuple[Any, ...], n: int) -> List[int]:
        """The order in which use ``key`` walks the ``n`` blocks of its parameter."""
        return list(range(n - 1, -1, -1)) if self.keeps(key) else list(range(n))

    def keep(self, key: Tuple[Any, ...], s: ParamRecord, kept: Dict[int, torch.Tensor],
             reserve: int) -> int:
        """Use ``key`` (:meth:`keeps`) ended holding blocks ``kept`` (index -> block),
        ``reserve`` bytes counted for them in the working set: the ones that are the first
        blocks of the next use are kept for it; returns the bytes still counted for them
        (the caller uncounts the rest)."""
        nxt = self.next_of[key]
        first = self.order(nxt, s.tile.nblocks)
        k = 0
        while k < len(first) and first[k] in kept:
            k += 1
        if k == 0 or self.ahead is not None:
            return 0
        futs = []
        for i in first[:k]:
            f: Future = Future()
            f.set_result((kept[i], None))
            futs.append(f)
        held = min(reserve, k * s.tile.block_bytes)
        self.ahead = _Ahead(nxt, s, first[:k], futs, held, kept=True)
        return held

    def end(self, key: Tuple[Any, ...]) -> None:
        """Use ``key`` ended: the first blocks of the use that followed it last time are
        read ahead when it reads blocks (not from a backward into a forward)."""
        nxt = self.next_of.get(key)
        if nxt is None or nxt[2] not in ("linear", "linear_bwd") or self.ahead is not None:
            return
        if key[0] == ("backward",) and nxt[0] != ("backward",):
            return
        owner = self.owner
        s = owner.ws.records[nxt[1]]
        if s.tile is None or s.state in IN_MEMORY or s.pending is not None:
            return
        t = s.tile
        k = min(AHEAD_BLOCKS, t.nblocks)
        ws = owner.ws
        ws.touch(s)
        reserve = k * t.block_bytes
        ws._make_room(reserve, protect=-1, before=None)
        ws.staged_bytes += reserve
        ws._peak()
        ex = _executor(owner)
        first = self.order(nxt, t.nblocks)[:k]
        self.ahead = _Ahead(nxt, s, first,
                            [ex.submit(_timed_read, owner, s, i) for i in first], reserve)

    def drop(self, s: Optional[ParamRecord] = None) -> None:
        """Drops what is read ahead (of ``s`` only, when given): waited for, uncounted."""
        a = self.ahead
        if a is not None and (s is None or a.s is s):
            self.ahead = None
            self._drop(a)

    def _drop(self, a: _Ahead) -> None:
        for f in a.futs:
            f.exception()  # (wait: the buffer must not be read into after this)
        self.owner.ws.staged_bytes -= a.reserve

    def rows_executor(self) -> ThreadPoolExecutor:
        if self.rows_pool is None:
            self.rows_pool = ThreadPoolExecutor(ROW_THREADS, thread_name_prefix="strata-rows")
        return self.rows_pool

    def close(self) -> None:
        self.drop()
        if self.rows_pool is not None:
            self.rows_pool.shutdown()
            self.rows_pool = None


def reads_of(owner: Any) -> TileReads:
    """The :class:`TileReads` of ``owner`` (made on first use)."""
    r = getattr(owner, "tile_reads", None)
    if r is None:
        r = owner.tile_reads = TileReads(owner)
    return r


def blocks(owner: Any, s: ParamRecord, need_values: bool = True, use: Optional[str] = None
           ) -> Iterator[Tuple[int, int, int, Optional[torch.Tensor]]]:
    """``(i, r0, r1, W[r0:r1])`` for every block of tiled ``s``, in order (last to first for
    a use that keeps its blocks for its backward: the module doc): from memory when
    ``s`` is materialized (an edit in place is seen), else read from the store with the
    next blocks in flight on the block thread (see the module doc). ``need_values`` False:
    no reads, ``None`` as the block. ``use`` (``"linear"``, ``"linear_bwd"``): the use is
    recorded and takes the blocks read ahead for it; None (an in-place edit): not recorded,
    blocks read ahead of ``s`` dropped."""
    t = s.tile
    if not need_values:
        for i in range(t.nblocks):
            r0, r1 = t.rows_of(i)
            yield i, r0, r1, None
        return
    reads = reads_of(owner)
    key = (owner.ws.phase, s.index, use)
    ahead = reads.begin(key) if use is not None else None
    if use is None:
        reads.drop(s)
    if s.state in IN_MEMORY:
        if ahead is not None:
            reads._drop(ahead)
        with _no_tf():
            data = s.resident.detach()
        for i in range(t.nblocks):
            r0, r1 = t.rows_of(i)
            yield i, r0, r1, data[r0:r1]
        return
    ws, stats = owner.ws, owner.stats_ref
    if s.pending is not None:
        ws.drain()
    ws.touch(s)
    futs: Deque[Future] = collections.deque(ahead.futs if ahead is not None else ())
    order = reads.order(key, t.nblocks) if use is not None else list(range(t.nblocks))
    stats["tile_blocks_ahead"] += 0 if ahead is None or ahead.kept else len(futs)
    held = ahead.reserve if ahead is not None else 0
    reserve = max(0, min(2, t.nblocks) * t.block_bytes - held)
    ws._make_room(reserve, protect=-1, before=None)
    ws.staged_bytes += reserve
    reserve += held
    # more blocks in flight where the working set has room for them without evicting
    free = ws.budget - ws.resident_bytes - ws.inflight_bytes - ws.staged_bytes
    extra = max(0, min(MAX_DEPTH - 2, t.nblocks - 2, free // max(1, t.block_bytes)))
    ws.staged_bytes += extra * t.block_bytes
    reserve += extra * t.block_bytes
    depth = max(len(futs), min(2, t.nblocks) + extra)
    ws._peak()
    ex = _executor(owner)
    issued = len(futs)
    n = t.nblocks
    # a use keeping its blocks for its backward: the last ones it walks, as many as its
    # reserve covers (those in use and in flight at its end: no more memory than it held)
    nkeep = min(n, reserve // max(1, t.block_bytes)) if use and reads.keeps(key) else 0
    kept: Dict[int, torch.Tensor] = {}
    kept_bytes = 0  # (of the reserve: counted for the blocks kept, from now on)
    try:
        while issued < min(depth, n):
            futs.append(ex.submit(_timed_read, owner, s, order[issued]))
            issued += 1
        for j, i in enumerate(order):
            t0 = time.perf_counter()
            block, seconds = futs.popleft().result()
            stats["tile_stall_seconds"] += time.perf_counter() - t0
            if seconds is not None:  # (None: kept in memory by the use before)
                stats["tile_fetch_seconds"] += seconds
                stats["tile_blocks_fetched"] += 1
                stats["bytes_fetched"] += block.numel() * t.elem
            if issued < n:
                futs.append(ex.submit(_timed_read, owner, s, order[issued]))
                issued += 1
            if j >= n - nkeep:
                kept[i] = block
            r0, r1 = t.rows_of(i)
            yield i, r0, r1, block
        if kept:
            kept_bytes = reads.keep(key, s, kept, reserve)
    finally:
        for f in futs:
            f.exception()  # (wait: the buffer must not be read into after this)
        ws.staged_bytes -= reserve - kept_bytes
    if use is not None and not kept_bytes:
        reads.end(key)


def _read_rows(owner: Any, s: ParamRecord, r0: int, r1: int) -> Tuple[torch.Tensor, float]:
    t = s.tile
    t0 = time.perf_counter()
    nb = t.row_numel * t.elem
    arr = owner.store.read_range(s.value_key, r0 * nb, (r1 - r0) * nb)
    return tensor_of(arr, s.dtype).view((r1 - r0,) + s.shape[1:]), time.perf_counter() - t0


def embedding_rows(owner: Any, s: ParamRecord, idx: torch.Tensor) -> torch.Tensor:
    """``F.embedding(idx, W)`` for tiled ``W`` (record ``s``), reading only the rows ``idx``
    uses (see the module doc): shape ``[*idx.shape, *W.shape[1:]]``, ``W``'s dtype; exact.

    :raises RuntimeError: ``idx`` not int64/int32 (torch's message).
    :raises IndexError: an id outside ``[0, rows)`` (as torch's message).
    :raises strata errors: of ``Store.read_range``."""
    if idx.dtype not in (torch.int64, torch.int32):
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the "
                           "following scalar types: Long, Int; but got "
                           f"{idx.type()} instead (while checking arguments for embedding)")
    flat = idx.reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= s.shape[0]):
        raise IndexError(f"index out of range in self (tiled parameter {s.name!r} has "
                         f"{s.shape[0]} rows; indices from {int(flat.min())} to "
                         f"{int(flat.max())})")
    reads = reads_of(owner)
    key = (owner.ws.phase, s.index, "embedding")
    ahead = reads.begin(key)
    if ahead is not None:
        reads._drop(ahead)
    t = s.tile
    if s.state in IN_MEMORY:
        with _no_tf():
            out = s.resident.detach().index_select(0, flat)
        return out.view(tuple(idx.shape) + s.shape[1:])
    out = torch.empty((flat.numel(),) + s.shape[1:], dtype=s.dtype)
    if flat.numel() == 0:
        return out.view(tuple(idx.shape) + s.shape[1:])
    uniq, inv = torch.unique(flat, sorted=True, return_inverse=True)
    row_bytes = t.row_numel * t.elem
    per = max(1, t.block_bytes // row_bytes)  # rows per group: a block's bytes
    ws, stats = owner.ws, owner.stats_ref
    if s.pending is not None:
        ws.drain()
    ws.touch(s)
    reserve = min(len(uniq), per) * row_bytes
    ws._make_room(reserve, protect=-1, before=None)
    ws.staged_bytes += reserve
    ws._peak()
    ex = reads.rows_executor()
    try:
        for g0 in range(0, len(uniq), per):
            u = uniq[g0:g0 + per]
            # runs of adjacent rows: [starts[k], ends[k])
            cut = (torch.nonzero(u[1:] - u[:-1] != 1).squeeze(1) + 1).tolist()
            bounds = [0] + cut + [len(u)]
            ul = u.tolist()
            t0 = time.perf_counter()
            futs = [ex.submit(_read_rows, owner, s, ul[a], ul[b - 1] + 1)
                    for a, b in zip(bounds[:-1], bounds[1:])]
            parts = []
            for f in futs:
                part, seconds = f.result()
                parts.append(part)
                stats["tile_fetch_seconds"] += seconds
            stats["tile_stall_seconds"] += time.perf_counter() - t0
            stats["bytes_fetched"] += len(ul) * row_bytes
            rows = parts[0] if len(parts) == 1 else torch.cat(parts)
            if g0 == 0 and len(u) == len(uniq):
                torch.index_select(rows, 0, inv, out=out)
            else:
                sel = ((inv >= g0) & (inv < g0 + len(u))).nonzero().squeeze(1)
                out[sel] = rows.index_select(0, inv[sel] - g0)
    finally:
        ws.staged_bytes -= reserve
    reads.end(key)
    return out.view(tuple(idx.shape) + s.shape[1:])
