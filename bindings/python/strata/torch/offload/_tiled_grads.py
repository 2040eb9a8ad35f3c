"""The gradients and values of tiled parameters (offload/_tiled.py) block by block: the
writer a tiled operator's backward hands each block's weight gradient to, what the
optimizer's step needs (the gradient object complete, the new value stored block by block),
and the mixin of ParameterOffload that the optimizer wing reaches them through.

Gradient object: ``<key>#grad`` holds the whole gradient in row-major order, as for any
offloaded parameter; a block's gradient is written with ``write_range`` at its offset. With
a strata optimizer (the gradient goes to the store) the contributions of one parameter add
as torch's ``p.grad += g`` does: the first backward after ``zero_grad(set_to_none=True)``
writes the blocks as they come, after ``zero_grad(set_to_none=False)`` adds them to zeros
(``g + 0.0``), later ones read the block, replay recorded scalings (``p.grad.mul_(c)``) and
add. An embedding's contribution (zeros but for its ids' rows) added to a gradient the
previous writer of this object left unchanged since (no scaling, no other write; e.g. a
tied output head's, earlier in the same backward) reads and writes only its rows
(:meth:`BlockWriter.add_rows`, byte ranges), in each block that holds no ``-0.0`` (where
``x + 0.0`` would change a row it does not touch; such a block is read and written whole):
the same values as adding the whole block. Its norm is ``torch.norm`` of the stacked row
norms (``torch.linalg.vector_norm`` of each row in fp32; ``clip_grad_norm_``'s rule one
level down): the same value up to summation order, not bit-identical to ``torch.norm`` of
the whole gradient. Without a strata optimizer the blocks are assembled into one gradient
tensor that torch accumulates into ``p.grad`` (memory of the whole parameter).

fp32 sums (an fp16/bf16 parameter whose strata optimizer asks for them, ``grad_acc32``:
offload/_grad_sum.py). The object holds the fp32 sum of the micro-batch gradients (4 bytes
per element) and every block is added as offload/_grad_sum.py adds whole gradients: the
block's gradient ``g`` (the parameter's dtype, as torch's backward makes it) widened, and
``g.float()`` written (first backward), ``g.float() + 0.0`` (after
``zero_grad(set_to_none=False)``), ``sum + g.float()`` (the stored sum, ``p.grad`` unedited)
or ``p.grad.float() + g.float()`` (``p.grad`` edited: the stored block rounded to the
parameter's dtype and the recorded scalings replayed, or the materialized values); the
norms and finiteness of the sum (the step's) and of the sum rounded (``p.grad``'s) are
kept from row norms of both. An object of the other layout (a gradient stored whole in the
parameter's dtype: ``p.grad`` materialized, edited and evicted; or one summed before the
optimizer asked for fp32 sums) is materialized once and added from memory.

Thread-safety: as ParameterOffload (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from .._common import all_finite, no_torch_function as _no_tf
from ._record import IN_MEMORY, ParamRecord, tensor_of
from ._tiled import read_block


def put_zeros(owner: Any, s: ParamRecord, key: str, fp32: bool = False) -> None:
    """Object ``key``: ``s.numel`` zeros of ``s``'s dtype (fp32 when ``fp32``), made from
    one chunk of zeros (``Store.put_repeated``: no memory of the object's size)."""
    dtype = torch.float32 if fp32 else s.dtype
    np_dtype = {torch.float32: np.float32, torch.float16: np.float16,
                torch.bfloat16: np.uint16, torch.float64: np.float64}[dtype]
    block = np.zeros(owner.store.chunk_bytes // np.dtype(np_dtype).itemsize, dtype=np_dtype)
    owner.store.put_repeated(key, block, s.numel, overwrite=True,
                             dtype="bf16" if dtype == torch.bfloat16 else None)


def _grad_block(owner: Any, s: ParamRecord, i: int, fp32: bool) -> torch.Tensor:
    """Block ``i`` of ``s``'s gradient object (fp32 values when ``fp32``, else ``s``'s
    dtype): a new tensor of shape ``[r1 - r0, *shape[1:]]``; counted in
    ``grad_bytes_read``."""
    t = s.tile
    off, n = t.span(i)
    r0, r1 = t.rows_of(i)
    elem = 4 if fp32 else t.elem
    arr = owner.store.read_range(s.grad_key, off * elem, n * elem)
    owner.stats_ref["grad_bytes_read"] += n * elem
    return tensor_of(arr, torch.float32 if fp32 else s.dtype).view((r1 - r0,) + s.shape[1:])


class _Rows:
    """What the last writer of a tiled gradient object knows of it: ``token`` (the
    ``grad_norm`` tensor it set: the object is unchanged while ``s.grad_norm`` is it),
    ``norms`` (fp32 norm of each row of the stored values), ``negzero`` (blocks holding a
    ``-0.0``), ``finite``; with an fp32 sum stored, ``rnorms`` / ``rfinite`` of the sum
    rounded to the parameter's dtype (else None / True)."""

    __slots__ = ("token", "norms", "negzero", "finite", "rnorms", "rfinite")

    def __init__(self, token: torch.Tensor, norms: torch.Tensor, negzero: set, finite: bool,
                 rnorms: Optional[torch.Tensor] = None, rfinite: bool = True):
        self.token, self.norms, self.negzero, self.finite = token, norms, negzero, finite
        self.rnorms, self.rfinite = rnorms, rfinite


def _has_negzero(val: torch.Tensor) -> bool:
    """``val`` (a float tensor) holds a ``-0.0`` (its bit pattern: the sign bit alone)."""
    bits = {4: (torch.int32, -2 ** 31), 2: (torch.int16, -2 ** 15), 8: (torch.int64, -2 ** 63)}
    dt, neg = bits[val.element_size()]
    return bool((val.reshape(-1).view(dt) == neg).any())


def _row_norms(val: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(val.reshape(val.shape[0], -1), 2.0, dim=1,
                                    dtype=torch.float32)


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.float16: "float16",
            torch.bfloat16: "bfloat16"}[dtype]


class BlockWriter:
    """One tiled backward's weight gradient of ``s``, block by block (:meth:`add` every
    block once, then :meth:`end`, or :meth:`abort` on an error)."""

    def __init__(self, tiled: "TiledGrads", s: ParamRecord, whole: bool = False):
        self.tiled, self.s = tiled, s
        g = tiled.owner.grads
        self.full: Optional[torch.Tensor] = None
        if whole or not s.to_store:  # for autograd (torch accumulates p.grad): in memory
            self.full = torch.empty(s.shape, dtype=s.dtype)
            return
        if s.index in g._writes:
            g._wait(s.index)
        #: summed in fp32 (offload/_grad_sum.py; the module doc)
        self.acc32 = acc32 = s.grad_acc32
        if s.grad_mem is not None:
            g._sync_mem(s)
            if acc32 and s.grad_sum:  # a copy of the rounded sum, unedited: the object has
                g._release_mem(s)  # the sum
        if s.grad_mem is not None:
            self.mode = "memory"  # materialized by the user: added there
        elif not s.has_grad:
            self.mode = "fresh"
        elif s.grad_zero:
            self.mode = "zeroed"
        else:
            g._check_kept(s)
            self.mode = "add"
            if acc32 != s.grad_obj32:  # the object has the other layout: from memory
                g.materialize(s)
                self.mode = "memory"
        if self.mode == "memory" and acc32:
            self.mode = "memory32"  # p.grad.float() + g.float(), into an fp32 object
        self.ops = list(s.grad_ops)
        #: added to the stored fp32 sum as it is (else to p.grad's values, widened)
        self.on_sum = acc32 and s.grad_sum
        if self.mode != "memory":
            tiled.ensure_grad_object(s, fp32=acc32)
        self.norms: List[Optional[torch.Tensor]] = [None] * s.tile.nblocks
        self.rnorms: List[Optional[torch.Tensor]] = [None] * s.tile.nblocks
        self.negzero: set = set()
        self.finite = self.rfinite = True
        prev = tiled.rows.pop(id(s), None)
        #: what the previous writer left, when the object is unchanged since (add_rows)
        self.prev = prev if (self.mode == "add" and not self.ops and prev is not None
                             and (self.on_sum or not acc32)
                             and s.grad_norm is not None and prev.token is s.grad_norm) else None

    @property
    def by_rows(self) -> bool:
        """:meth:`add_rows` may be used (the object is what the previous writer left)."""
        return self.prev is not None

    def add(self, i: int, blk: torch.Tensor) -> None:
        """Block ``i``'s gradient ``blk`` (shape ``[r1 - r0, *shape[1:]]``, the parameter's
        dtype; may be changed in place)."""
        s, t = self.s, self.s.tile
        r0, r1 = t.rows_of(i)
        if self.full is not None:
            self.full[r0:r1] = blk
            return
        if self.mode == "memory":
            with _no_tf():
                s.grad_mem[r0:r1].add_(blk)
            return
        owner = self.tiled.owner
        if self.acc32:
            blk = blk.float()  # (a new tensor)
        if self.mode == "memory32":
            with _no_tf():
                val = s.grad_mem[r0:r1].detach().float().add_(blk)  # p.grad.float() + g
        elif self.mode == "zeroed":
            val = blk.add_(0.0)  # torch: zeroed grad += g (-0.0 becomes +0.0)
        elif self.mode == "add":
            val = _grad_block(owner, s, i, self.acc32)
            if self.acc32 and not self.on_sum:
                val = val.to(s.dtype)  # p.grad's values: the sum rounded, ...
            for op, c in self.ops:
                getattr(val, op)(c)  # the recorded scaling, in the gradient's dtype
            if val.dtype != blk.dtype:
                val = val.float()  # ... widened
            val.add_(blk)
        else:
            val = blk
        val = val.contiguous()
        off, _ = t.span(i)
        elem = val.element_size()
        owner.store.write_range(s.grad_key, off * elem, val.reshape(-1))
        owner.stats_ref["grad_bytes_written"] += val.numel() * elem
        self._note(i, val)

    def _note(self, i: int, val: torch.Tensor, rows: Optional[torch.Tensor] = None) -> None:
        """Row norms and finiteness of block ``i``'s new values ``val`` (its rows ``rows``
        only, into the previous writer's row norms, when given); of the sum rounded too."""
        rn = _row_norms(val)
        fin = all_finite(val, torch.norm(rn, 2.0))
        rr, rfin = None, True
        if self.acc32:
            r = val.to(self.s.dtype)
            rr = _row_norms(r)
            rfin = all_finite(r, torch.norm(rr, 2.0))
        if rows is None:
            self.norms[i], self.rnorms[i] = rn, rr
            if _has_negzero(val):
                self.negzero.add(i)
        else:
            r0, r1 = self.s.tile.rows_of(i)
            self.norms[i] = self.prev.norms[r0:r1].clone()
            self.norms[i][rows - r0] = rn
            if self.acc32:
                self.rnorms[i] = self.prev.rnorms[r0:r1].clone()
                self.rnorms[i][rows - r0] = rr
        self.finite = self.finite and fin
        self.rfinite = self.rfinite and rfin

    def add_rows(self, i: int, rows: torch.Tensor, vals: torch.Tensor) -> bool:
        """Adds ``vals`` (shape ``[k, *shape[1:]]``, the parameter's dtype) to rows ``rows``
        (sorted distinct row numbers of block ``i``, an int64 tensor of ``k``) and zeros to
        the block's other rows, reading and writing only those rows; False (nothing done:
        use :meth:`add`) when the block holds a ``-0.0`` or :attr:`by_rows` is False."""
        prev, s = self.prev, self.s
        if prev is None or i in prev.negzero:
            return False
        t = s.tile
        r0, r1 = t.rows_of(i)
        if not len(rows):
            self.norms[i] = prev.norms[r0:r1].clone()
            self.rnorms[i] = prev.rnorms[r0:r1].clone() if self.acc32 else None
        else:
            owner = self.tiled.owner
            st, stats = owner.store, owner.stats_ref
            dtype = torch.float32 if self.acc32 else s.dtype
            vals = vals.to(dtype)  # (fp32 sums: g.float())
            nb = t.row_numel * vals.element_size()
            rl = rows.tolist()
            cut = (torch.nonzero(rows[1:] - rows[:-1] != 1).squeeze(1) + 1).tolist()
            bounds = [0] + cut + [len(rl)]
            new = []
            for a, b in zip(bounds[:-1], bounds[1:]):
                arr = st.read_range(s.grad_key, rl[a] * nb, (b - a) * nb)
                val = tensor_of(arr, dtype).view((b - a,) + s.shape[1:])
                val.add_(vals[a:b])  # old + g; the block's other rows: old + 0.0 == old
                st.write_range(s.grad_key, rl[a] * nb, val.reshape(-1))
                new.append(val)
            stats["grad_bytes_read"] += len(rl) * nb
            stats["grad_bytes_written"] += len(rl) * nb
            self._note(i, new[0] if len(new) == 1 else torch.cat(new), rows)
        self.finite = self.finite and prev.finite  # (a non-finite element stays so)
        self.rfinite = self.rfinite and prev.rfinite
        return True

    def end(self) -> Optional[torch.Tensor]:
        """The gradient is complete: the bookkeeping of a stored gradient (returns None), or
        the assembled gradient for autograd (no strata optimizer)."""
        if self.full is not None:
            return self.full
        s = self.s
        if self.mode == "memory":
            return None
        g = self.s.owner.grads
        g._forget_values(s)
        s.has_grad = True
        norms = torch.cat(self.norms)
        rnorms = torch.cat(self.rnorms) if self.acc32 else None
        if self.acc32:  # (offload/_grad_sum.py's note_sum, from the rows' norms)
            s.grad_norm = torch.norm(rnorms, 2.0).to(s.dtype)
            s.grad_finite = self.rfinite
            s.sum_norm = torch.norm(norms, 2.0)
            s.sum_finite = self.finite
            s.grad_sum = True
        else:
            s.grad_norm = torch.norm(norms, 2.0).to(s.dtype)
            s.grad_finite = self.finite
        self.tiled.rows[id(s)] = _Rows(s.grad_norm, norms, self.negzero, self.finite,
                                       rnorms, self.rfinite)
        return None

    def abort(self) -> None:
        """The backward failed: the gradient object may be half written, so the stored
        gradient is dropped (``p.grad`` is None)."""
        if self.full is None and self.mode != "memory":
            self.s.owner.grads._drop(self.s)  # (memory32: p.grad's values are dropped too)


class TiledGrads:
    """The tiled parameters' gradient objects of one ParameterOffload ``owner``."""

    def __init__(self, owner: Any):
        self.owner = owner
        #: id(record) -> bytes of its gradient object, known to exist with that size
        self._ready: Dict[int, int] = {}
        #: id(record) -> _Rows: what the last BlockWriter of its gradient object left
        self.rows: Dict[int, _Rows] = {}

    def writer(self, s: ParamRecord, whole: bool = False) -> BlockWriter:
        """A :class:`BlockWriter` for one backward's gradient of tiled ``s`` (``whole``:
        assembled for autograd even with a strata optimizer -- ``autograd.grad``)."""
        return BlockWriter(self, s, whole)

    def ensure_grad_object(self, s: ParamRecord, fp32: bool = False) -> None:
        """``s``'s gradient object exists with the parameter's size in its dtype, or in
        fp32 (``fp32``: an fp32 sum; ``s.grad_obj32`` says which it holds), created as zeros
        by :func:`put_zeros` (no memory of its size) when its size is another."""
        nbytes = s.numel * (4 if fp32 else s.tile.elem)
        if self._ready.get(id(s)) == nbytes and s.grad_obj32 == fp32:
            return
        st = self.owner.store
        if not (s.grad_key in st and st.stat(s.grad_key).nbytes == nbytes):
            put_zeros(self.owner, s, s.grad_key, fp32)
        self._ready[id(s)] = nbytes
        s.grad_obj32 = fp32

    def copy_value(self, s: ParamRecord, key: str) -> None:
        """``s``'s stored value also as object ``key``, block by block (offload_init's
        temporary key to the model's name)."""
        st, t = self.owner.store, s.tile
        put_zeros(self.owner, s, key)
        for i in range(t.nblocks):
            off, _ = t.span(i)
            st.write_range(key, off * t.elem, read_block(self.owner, s, i).reshape(-1))

    def forget(self, s: ParamRecord) -> None:
        """``s``'s gradient object may be gone (its key changed)."""
        self._ready.pop(id(s), None)
        self.rows.pop(id(s), None)

    def for_step(self, s: ParamRecord) -> Tuple[str, str]:
        """``s``'s gradient object made to hold the gradient exactly as the step takes it
        (a materialized gradient stored, zeros written, recorded scalings applied block by
        block; an fp32 sum as it is while ``p.grad`` is unedited, else ``p.grad``'s values:
        the sum rounded, scalings replayed, widened back into the fp32 object); returns
        (its key, its dtype name)."""
        g = self.owner.grads
        g._check_kept(s)
        if s.index in g._writes:
            g._wait(s.index)
        if s.grad_mem is not None:
            g._evict(s)
            g.flush()
        t = s.tile
        if s.grad_zero:  # zeros, then the recorded scalings, as GradientStore reads them
            put_zeros(self.owner, s, s.grad_key)
            self._ready[id(s)] = s.numel * t.elem
            s.grad_obj32 = False
        obj32 = s.grad_obj32
        if s.grad_ops or (obj32 and not s.grad_sum):
            for i in range(t.nblocks):
                off, _ = t.span(i)
                val = _grad_block(self.owner, s, i, obj32).reshape(-1)
                if obj32:
                    val = val.to(s.dtype)  # p.grad's values (the sum rounded), ...
                for op, c in s.grad_ops:
                    getattr(val, op)(c)
                if obj32:
                    val = val.float()  # ... in the fp32 object (exact)
                self.owner.store.write_range(s.grad_key, off * val.element_size(), val)
                self.owner.stats_ref["grad_bytes_written"] += val.numel() * val.element_size()
        s.grad_ops = []
        s.grad_zero = False
        return s.grad_key, _dtype_name(torch.float32 if obj32 else s.dtype)


class TiledAccess:
    """Mixin of ParameterOffload: the optimizer wing's view of tiled parameters (needs its
    ``_record``, ``ws``, ``store``, ``tiled_grads``, ``_stats``)."""

    def tiled(self, p: torch.Tensor) -> bool:
        """``p`` is tiled (offload/_tiled.py): its value and gradient are read and written
        in blocks, never whole.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self._record(p).tile is not None

    def value_blocks(self, p: torch.Tensor) -> Iterator[Tuple[int, torch.Tensor]]:
        """``(offset, values)`` of every block of tiled ``p``'s current value: element
        offset in the flat value, a new flat tensor of ``p``'s dtype.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        t = s.tile
        for i in range(t.nblocks):
            off, n = t.span(i)
            if s.state in IN_MEMORY:
                with _no_tf():
                    yield off, s.resident.detach().reshape(-1)[off:off + n].clone()
            else:
                yield off, read_block(self, s, i).reshape(-1)

    def grad_object(self, p: torch.Tensor) -> Tuple[str, str]:
        """The store key and dtype name of tiled ``p``'s gradient as the step takes it
        (see TiledGrads.for_step).

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self.tiled_grads.for_step(self._record(p))

    def write_blocks(self, p: torch.Tensor, read: Callable[[int, int], torch.Tensor]) -> None:
        """Stores tiled ``p``'s new value block by block, ``read(offset, count)`` giving
        each block's values (any float dtype, converted): the optimizer's step. A
        materialized copy is released first.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        self.ws.release(s, write_back=False)
        t = s.tile
        for i in range(t.nblocks):
            off, n = t.span(i)
            v = read(off, n).to(s.dtype).contiguous()
            self.store.write_range(s.key, off * t.elem, v)
            self._stats["param_bytes_written"] += n * t.elem
        s.version += 1
