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

Thread-safety: as ParameterOffload (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from .._common import all_finite, no_torch_function as _no_tf
from ._record import IN_MEMORY, ParamRecord, tensor_of
from ._tiled import read_block


def put_zeros(owner: Any, s: ParamRecord, key: str) -> None:
    """Object ``key``: ``s.numel`` zeros of ``s``'s dtype, made from one chunk of zeros
    (``Store.put_repeated``: no memory of the object's size)."""
    np_dtype = {torch.float32: np.float32, torch.float16: np.float16,
                torch.bfloat16: np.uint16, torch.float64: np.float64}[s.dtype]
    block = np.zeros(owner.store.chunk_bytes // np.dtype(np_dtype).itemsize, dtype=np_dtype)
    owner.store.put_repeated(key, block, s.numel, overwrite=True,
                             dtype="bf16" if s.dtype == torch.bfloat16 else None)


class _Rows:
    """What the last writer of a tiled gradient object knows of it: ``token`` (the
    ``grad_norm`` tensor it set: the object is unchanged while ``s.grad_norm`` is it),
    ``norms`` (fp32 norm of each row), ``negzero`` (blocks holding a ``-0.0``), ``finite``."""

    __slots__ = ("token", "norms", "negzero", "finite")

    def __init__(self, token: torch.Tensor, norms: torch.Tensor, negzero: set, finite: bool):
        self.token, self.norms, self.negzero, self.finite = token, norms, negzero, finite


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
        if s.grad_mem is not None:
            self.mode = "memory"  # materialized by the user: added there
        elif not s.has_grad:
            self.mode = "fresh"
        elif s.grad_zero:
            self.mode = "zeroed"
        else:
            g._check_kept(s)
            self.mode = "add"
        self.ops = list(s.grad_ops)
        tiled.ensure_grad_object(s)
        self.norms: List[Optional[torch.Tensor]] = [None] * s.tile.nblocks
        self.negzero: set = set()
        self.finite = True
        prev = tiled.rows.pop(id(s), None)
        #: what the previous writer left, when the object is unchanged since (add_rows)
        self.prev = prev if (self.mode == "add" and not self.ops and prev is not None
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
        if self.mode == "zeroed":
            val = blk.add_(0.0)  # torch: zeroed grad += g (-0.0 becomes +0.0)
        elif self.mode == "add":
            val = read_block(owner, s, i, key=s.grad_key)
            owner.stats_ref["grad_bytes_read"] += val.numel() * t.elem
            for op, c in self.ops:
                getattr(val, op)(c)  # the recorded scaling, in the gradient's dtype
            val.add_(blk)
        else:
            val = blk
        val = val.contiguous()
        off, _ = t.span(i)
        owner.store.write_range(s.grad_key, off * t.elem, val.reshape(-1))
        owner.stats_ref["grad_bytes_written"] += val.numel() * t.elem
        rn = _row_norms(val)
        self.norms[i] = rn
        if _has_negzero(val):
            self.negzero.add(i)
        self.finite = self.finite and all_finite(val, torch.norm(rn, 2.0))

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
        rn = prev.norms[r0:r1].clone()
        if len(rows):
            owner = self.tiled.owner
            st, stats = owner.store, owner.stats_ref
            nb = t.row_numel * t.elem
            rl = rows.tolist()
            cut = (torch.nonzero(rows[1:] - rows[:-1] != 1).squeeze(1) + 1).tolist()
            bounds = [0] + cut + [len(rl)]
            new = []
            for a, b in zip(bounds[:-1], bounds[1:]):
                arr = st.read_range(s.grad_key, rl[a] * nb, (b - a) * nb)
                val = tensor_of(arr, s.dtype).view((b - a,) + s.shape[1:])
                val.add_(vals[a:b])  # old + g; the block's other rows: old + 0.0 == old
                st.write_range(s.grad_key, rl[a] * nb, val.reshape(-1))
                new.append(val)
            stats["grad_bytes_read"] += len(rl) * nb
            stats["grad_bytes_written"] += len(rl) * nb
            val = new[0] if len(new) == 1 else torch.cat(new)
            n = _row_norms(val)
            rn[rows - r0] = n
            self.finite = self.finite and all_finite(val, torch.norm(n, 2.0))
        self.norms[i] = rn
        self.finite = self.finite and prev.finite  # (a non-finite element stays so)
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
        s.grad_norm = torch.norm(norms, 2.0).to(s.dtype)
        s.grad_finite = self.finite
        self.tiled.rows[id(s)] = _Rows(s.grad_norm, norms, self.negzero, self.finite)
        return None

    def abort(self) -> None:
        """The backward failed: the gradient object may be half written, so the stored
        gradient is dropped (``p.grad`` is None)."""
        if self.full is None and self.mode != "memory":
            self.s.owner.grads._drop(self.s)


class TiledGrads:
    """The tiled parameters' gradient objects of one ParameterOffload ``owner``."""

    def __init__(self, owner: Any):
        self.owner = owner
        self._ready: set = set()  # ids of records whose gradient object exists, full size
        #: id(record) -> _Rows: what the last BlockWriter of its gradient object left
        self.rows: Dict[int, _Rows] = {}

    def writer(self, s: ParamRecord, whole: bool = False) -> BlockWriter:
        """A :class:`BlockWriter` for one backward's gradient of tiled ``s`` (``whole``:
        assembled for autograd even with a strata optimizer -- ``autograd.grad``)."""
        return BlockWriter(self, s, whole)

    def ensure_grad_object(self, s: ParamRecord) -> None:
        """``s``'s gradient object exists with the parameter's size (created as zeros by
        :func:`put_zeros`: no memory of its size)."""
        if id(s) in self._ready:
            return
        st = self.owner.store
        if not (s.grad_key in st and st.stat(s.grad_key).nbytes == s.nbytes):
            put_zeros(self.owner, s, s.grad_key)
        self._ready.add(id(s))

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
        self._ready.discard(id(s))
        self.rows.pop(id(s), None)

    def for_step(self, s: ParamRecord) -> Tuple[str, str]:
        """``s``'s gradient object made to hold the gradient exactly as the step takes it
        (a materialized gradient stored, zeros written, recorded scalings applied block by
        block); returns (its key, its dtype name)."""
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
            self._ready.add(id(s))
        if s.grad_ops:
            for i in range(t.nblocks):
                off, _ = t.span(i)
                val = read_block(self.owner, s, i, key=s.grad_key).reshape(-1)
                for op, c in s.grad_ops:
                    getattr(val, op)(c)
                self.owner.store.write_range(s.grad_key, off * t.elem, val)
        s.grad_ops = []
        s.grad_zero = False
        return s.grad_key, _dtype_name(s.dtype)


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
