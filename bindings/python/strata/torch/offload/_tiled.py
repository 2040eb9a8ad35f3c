"""Tiling: an offloaded parameter larger than ``tile_bytes`` (offload_parameters' argument)
that ``F.linear`` or ``F.embedding`` uses is never materialized whole. Its store object
(the row-major value, the same key) is read in *blocks* of whole rows (dim 0: a Linear's
output features, an Embedding's entries), at most ``tile_bytes`` each; the operator is
computed block by block while the next blocks are read on the offload's block thread (the
first ones ahead of the use: offload/_tile_reads.py), ``F.embedding`` reads only the rows
its ids use (byte ranges of the object); in
backward each block's weight gradient goes straight into the parameter's gradient object
(offload/_tiled_grads.py), and the optimizer's step streams it from there (ZeRO-Infinity's
memory-centric tiling, SC21 section 5.1.3, without rewriting the model: the module, its
parameter and its state_dict key stay what they are).

What is exact (tests/bindings/torch_offload/test_param_offload_tiled.py compares with torch):

* ``F.linear``: each output column block is ``F.linear(x, W[r0:r1], b[r0:r1])`` and each
  weight-gradient block ``(x2d.t() @ g2d[:, r0:r1]).t()``: the same dot products as the
  whole operator, which the test finds bit-identical on this CPU's BLAS; the **input
  gradient** sums the blocks' ``g[:, r0:r1] @ W[r0:r1]`` one after another instead of in one
  matrix product: another summation order (docs/offload.md gives the measured difference).
* ``F.embedding``: the rows its ids use are read and copied (exact); the weight gradient
  of each block is ``index_add_`` of the gradient rows in their order of occurrence, as
  torch's CPU backward sums them (added to an unchanged earlier gradient by rows only:
  offload/_tiled_grads.py): bit-identical.
* in-place initialization and edits without autograd (``nn.init.normal_``/``uniform_``/
  ``zeros_``/``trunc_normal_``, ``fill_``, ``mul_``, ``copy_`` as ``load_state_dict`` does):
  applied block by block and stored (elementwise, so exact; random fills draw the same
  numbers as on the whole tensor, blocks being multiples of 16 elements).

Other operations on a tiled parameter (``x @ W.t()``, ``state_dict()``, an in-place edit)
materialize it whole, as any offloaded parameter (more memory than the working set).

Thread-safety: one thread at a time (torch's forward/backward thread); the block reads run
on the offload's block thread.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from .._common import no_torch_function as _no_tf
from ._record import IN_MEMORY, ParamRecord, dense_stride
from ._tile_reads import blocks, embedding_rows, reads_of
from ._tile_reads import read_block  # noqa: F401 (offload/_tiled_grads.py imports it here)


class TileLayout:
    """The blocks of a tiled parameter: ``rows`` (its dim 0), ``row_numel`` (elements per
    row), ``block_rows`` (rows per block; the last block may hold fewer), ``elem`` (bytes
    per element)."""

    __slots__ = ("rows", "row_numel", "block_rows", "elem")

    def __init__(self, shape: Tuple[int, ...], elem: int, tile_bytes: int):
        self.rows = shape[0]
        self.row_numel = math.prod(shape[1:])
        self.elem = elem
        # blocks of a multiple of 16 elements: torch's CPU normal_ fills 16 at a time (and
        # redoes a tail), so normal_ block by block draws what normal_ on the whole does
        unit = 16 // math.gcd(self.row_numel, 16)
        rows = tile_bytes // max(1, self.row_numel * elem)
        self.block_rows = max(unit, rows - rows % unit)

    @property
    def nblocks(self) -> int:
        n = -(-self.rows // self.block_rows)
        if n > 1 and (self.rows - (n - 1) * self.block_rows) * self.row_numel < 16:
            n -= 1  # a tail of < 16 elements joins the block before (normal_: see above)
        return n

    @property
    def block_bytes(self) -> int:
        """Bytes of the largest block."""
        r0, r1 = self.rows_of(self.nblocks - 1)
        return max(min(self.block_rows, self.rows), r1 - r0) * self.row_numel * self.elem

    def rows_of(self, i: int) -> Tuple[int, int]:
        """Rows [r0, r1) of block ``i`` (the last one: up to ``rows``)."""
        r0 = i * self.block_rows
        return r0, self.rows if i == self.nblocks - 1 else r0 + self.block_rows

    def span(self, i: int) -> Tuple[int, int]:
        """Elements [offset, offset + count) of block ``i`` in the flat value."""
        r0, r1 = self.rows_of(i)
        return r0 * self.row_numel, (r1 - r0) * self.row_numel


def plan_tile(p: torch.Tensor, tile_bytes: Optional[int], comm: Any,
              working_set: Optional[int] = None) -> Optional[TileLayout]:
    """The blocks of ``p`` when it is tiled (``tile_bytes`` set, more bytes than that, at
    least 2 rows, a contiguous CPU tensor of one process), else None. Blocks hold at most
    ``tile_bytes``, and at most half of ``working_set`` (the two blocks an operator holds
    stay within the budget)."""
    if tile_bytes is None or comm is not None:
        return None
    if (p.numel() * p.element_size() <= tile_bytes or p.dim() < 1 or p.shape[0] < 2
            or p.device.type != "cpu" or dense_stride(p) is not None):
        return None
    block = tile_bytes if working_set is None else max(1, min(tile_bytes, working_set // 2))
    return TileLayout(tuple(p.shape), p.element_size(), block)


# ---- the operators -----------------------------------------------------------------------


def _linear_forward(owner: Any, s: ParamRecord, x: torch.Tensor,
                    bias: Optional[torch.Tensor]) -> torch.Tensor:
    out = None
    for _, r0, r1, w in blocks(owner, s, use="linear"):
        y = F.linear(x, w, None if bias is None else bias[r0:r1])
        if out is None:
            out = torch.empty(tuple(x.shape[:-1]) + (s.shape[0],), dtype=y.dtype,
                              device=y.device)
        out[..., r0:r1] = y
    return out


class _TiledLinear(torch.autograd.Function):
    """``F.linear(x, W, b)`` with tiled ``W`` (the record in ``ctx``); ``weight`` is the
    parameter itself, passed so that backward runs when only it requires grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: Optional[torch.Tensor], weight: torch.Tensor,
                record: ParamRecord) -> torch.Tensor:
        ctx.record = record
        ctx.has_bias = bias is not None
        # under CPU autocast F.linear computes in its dtype: so does backward (torch's)
        ctx.cast = torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        ctx.save_for_backward(x)
        return _linear_forward(record.owner, record, x, bias)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        s = ctx.record
        owner = s.owner
        owner.begin_backward()
        need_x, need_b = ctx.needs_input_grad[:2]
        need_w = _weight_grad(ctx, 2, 2 if ctx.has_bias else 1)  # (None: no edge)
        g2 = g.reshape(-1, g.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        cast = ctx.cast or x2.dtype
        x2 = x2.to(cast)
        # the input gradient summed over blocks in fp32 (a bf16/fp16 sum per block would
        # round once per block, torch's matrix product rounds once)
        acc = torch.float32 if cast in (torch.bfloat16, torch.float16) else cast
        gx = None
        writer = owner.tiled_grads.writer(s, whole=not need_w) if need_w is not None else None
        try:
            for i, r0, r1, w in blocks(owner, s, need_values=need_x, use="linear_bwd"):
                gb = g2[:, r0:r1]
                if need_x:
                    part = gb.to(acc).mm(w.to(cast).to(acc))
                    gx = part if gx is None else gx.add_(part)
                if writer is not None:  # as linear's backward: (x2d^T g2d)^T, per block
                    writer.add(i, x2.t().mm(gb).t().to(s.dtype))
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        gw = writer.end() if writer is not None else None
        gb_all = g2.sum(0) if (ctx.has_bias and need_b) else None
        return (gx.to(cast).view(x.shape) if gx is not None else None), gb_all, gw, None


def _weight_grad(ctx: Any, k: int, edge: int) -> Optional[bool]:
    """How the backward of ``ctx`` hands over the gradient of its tiled weight (input
    ``k``, the ``edge``-th tensor input): None when this backward does not compute it (frozen, or ``backward(inputs=)`` /
    ``autograd.grad`` of other tensors: torch leaves ``p.grad`` alone), False when
    ``autograd.grad`` asks for the weight's (returned whole, ``p.grad`` untouched), True
    when it accumulates into ``p.grad`` (a strata optimizer's: written block by block)."""
    if not ctx.needs_input_grad[k]:
        return None
    fn = ctx.next_functions[edge][0]
    try:
        if not torch._C._will_engine_execute_node(fn):
            return None
    except RuntimeError:  # (torch refuses to answer for a leaf autograd.grad captures)
        return False
    return True


class _TiledEmbedding(torch.autograd.Function):
    """``F.embedding(idx, W, padding_idx)`` with tiled ``W``."""

    @staticmethod
    def forward(ctx: Any, idx: torch.Tensor, weight: torch.Tensor, record: ParamRecord,
                padding_idx: Optional[int]) -> torch.Tensor:
        ctx.record = record
        ctx.padding_idx = padding_idx
        ctx.save_for_backward(idx)
        return embedding_rows(record.owner, record, idx)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        (idx,) = ctx.saved_tensors
        s = ctx.record
        owner = s.owner
        owner.begin_backward()
        need_w = _weight_grad(ctx, 1, 1)
        if need_w is None:
            return None, None, None, None
        flat = idx.reshape(-1)
        g2 = g.reshape(flat.numel(), -1 if flat.numel() else int(math.prod(s.shape[1:])))
        writer = owner.tiled_grads.writer(s, whole=not need_w)
        try:  # every block: torch's backward makes the whole gradient (zeros where unused)
            for i, r0, r1, _ in blocks(owner, s, need_values=False):
                m = (flat >= r0) & (flat < r1)
                if ctx.padding_idx is not None:
                    m &= flat != ctx.padding_idx
                sel = m.nonzero().squeeze(1)
                if writer.full is None and writer.by_rows:  # only its rows (_tiled_grads.py)
                    rows, pos = torch.unique(flat[sel], sorted=True, return_inverse=True)
                    vals = torch.zeros((len(rows),) + s.shape[1:], dtype=g.dtype)
                    if len(rows):
                        vals.view(len(rows), -1).index_add_(0, pos, g2[sel])  # (same sums)
                    if writer.add_rows(i, rows, vals):
                        continue
                blk = torch.zeros((r1 - r0,) + s.shape[1:], dtype=g.dtype)
                if sel.numel():
                    blk.view(r1 - r0, -1).index_add_(0, flat[sel] - r0, g2[sel])
                writer.add(i, blk)
        except BaseException:
            writer.abort()
            raise
        return None, writer.end(), None, None


#: in-place operations applied block by block (no autograd): those that read the old values
_EDITS = frozenset({"mul_", "add_", "sub_", "div_", "clamp_", "clamp_min_", "clamp_max_",
                    "erfinv_", "neg_", "abs_"})
#: ... and those that overwrite every element (the old values are not read)
_FILLS = frozenset({"normal_", "uniform_", "zero_", "fill_", "copy_"})


def _edit_blocks(func: Any, s: ParamRecord, args: Tuple[Any, ...], kwargs: dict) -> Any:
    """In-place ``func(p, *args[1:], **kwargs)`` on tiled ``p``, block by block: each block
    read (unless overwritten), changed and written back; the stored value's version moves
    (an optimizer takes it as the new master)."""
    name = func.__name__
    rest = args[1:]
    src = None
    if name == "copy_":
        src = rest[0]
        with _no_tf():
            if not torch.is_tensor(src) or tuple(src.shape) != s.shape:
                return NOT_TILED  # (broadcasting copy: whole, as any parameter)
            if getattr(src, "_strata_record", None) is not None:
                return NOT_TILED
        rest = rest[1:]
    for v in list(rest) + list(kwargs.values()):
        if torch.is_tensor(v) and v.dim() > 0:
            return NOT_TILED  # a tensor operand: whole, as any parameter
    owner, t = s.owner, s.tile
    if s.pending is not None:  # a whole-parameter prefetch in flight: dropped first, so
        owner.ws.drain()  # that its (old) value never lands after the blocks are written
    reads_of(owner).drop(s)  # (so are blocks read ahead)
    owner.ws.touch(s)
    with _no_tf():
        for i, r0, r1, w in blocks(owner, s, need_values=name in _EDITS):
            if w is None:
                w = torch.empty((r1 - r0,) + s.shape[1:], dtype=s.dtype)
            if src is not None:
                w.copy_(src[r0:r1], *rest, **kwargs)
            else:
                func(w, *rest, **kwargs)
            off, _ = t.span(i)
            owner.store.write_range(s.key, off * t.elem, w.reshape(-1).contiguous())
            owner.stats_ref["bytes_written_back"] += w.numel() * t.elem
    s.version += 1
    return args[0]


def _init(func: Any, args: Tuple[Any, ...], kwargs: dict) -> Any:
    """``torch.nn.init.<name>(p, ...)`` on tiled ``p``: the Tensor method it comes down
    to, with torch.nn.init's own arithmetic for the bounds (so each block pass goes through
    :func:`_edit_blocks`); NOT_TILED for a function not listed."""
    import inspect
    init = torch.nn.init
    a = inspect.signature(func).bind(*args, **kwargs)
    a.apply_defaults()
    v = dict(a.arguments)
    t = v.pop("tensor")
    name = func.__name__
    with torch.no_grad():
        if name == "normal_":
            return t.normal_(v["mean"], v["std"])
        if name == "uniform_":
            return t.uniform_(v["a"], v["b"])
        if name == "zeros_":
            return t.zero_()
        if name in ("ones_", "constant_"):
            return t.fill_(1.0 if name == "ones_" else v["val"])
        if name in ("kaiming_uniform_", "kaiming_normal_"):
            fan = init._calculate_correct_fan(t, v["mode"])
            std = init.calculate_gain(v["nonlinearity"], v["a"]) / math.sqrt(fan)
            if name == "kaiming_normal_":
                return t.normal_(0, std)
            bound = math.sqrt(3.0) * std
            return t.uniform_(-bound, bound)
        if name in ("xavier_uniform_", "xavier_normal_"):
            fan_in, fan_out = init._calculate_fan_in_and_fan_out(t)
            std = v["gain"] * math.sqrt(2.0 / float(fan_in + fan_out))
            if name == "xavier_normal_":
                return t.normal_(0.0, std)
            bound = math.sqrt(3.0) * std
            return t.uniform_(-bound, bound)
        if name == "trunc_normal_":
            return init._no_grad_trunc_normal_(t, v["mean"], v["std"], v["a"], v["b"])
    return NOT_TILED


_INITS = frozenset({"normal_", "uniform_", "zeros_", "ones_", "constant_", "kaiming_uniform_",
                    "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "trunc_normal_"})


def _is_tiled(w: Any) -> Optional[ParamRecord]:
    s = getattr(w, "_strata_record", None)
    if s is None or s.tile is None or s.state in IN_MEMORY:
        return None
    return s


def tiled_call(func: Any, args: Tuple[Any, ...], kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` computed on blocks when it is ``F.linear`` or
    ``F.embedding`` over a tiled parameter not in memory; else :data:`NOT_TILED`."""
    name = getattr(func, "__name__", "")
    if getattr(func, "__module__", "") == "torch.nn.init":
        t = args[0] if args else kwargs.get("tensor")  # (nn.init passes it by keyword)
        if name in _INITS and _is_tiled(t) is not None:
            return _init(func, args, kwargs)
        return NOT_TILED
    if name in _EDITS or name in _FILLS:
        s = _is_tiled(args[0]) if args else None
        if s is None or (torch.is_grad_enabled() and s.param.requires_grad):
            return NOT_TILED  # (torch refuses in-place on a leaf that requires grad)
        return _edit_blocks(func, s, args, kwargs)
    if func is F.embedding:
        names = ("input", "weight", "padding_idx", "max_norm", "norm_type",
                 "scale_grad_by_freq", "sparse")
        a = dict(zip(names, args), **kwargs)
        s = _is_tiled(a.get("weight"))
        if s is None:
            return NOT_TILED
        if a.get("max_norm") is not None or a.get("scale_grad_by_freq") or a.get("sparse"):
            raise ValueError(f"F.embedding over tiled offloaded parameter {s.name!r}: "
                             "max_norm, scale_grad_by_freq and sparse are not supported "
                             "(pass tile_bytes=None to offload_parameters, or a tile_bytes "
                             "above this parameter's size)")
        pad = a.get("padding_idx")
        if pad is not None and pad < 0:
            pad += s.shape[0]
        w = a["weight"]
        with _no_tf():
            if torch.is_grad_enabled() and w.requires_grad:
                return _TiledEmbedding.apply(a["input"], w, s, pad)
            return embedding_rows(s.owner, s, a["input"])
    if name == "linear" and func in _LINEARS:
        a = dict(zip(("input", "weight", "bias"), args), **kwargs)
        s = _is_tiled(a.get("weight"))
        if s is None:
            return NOT_TILED
        x, w, b = a["input"], a["weight"], a.get("bias")
        owner = s.owner
        rb = getattr(b, "_strata_record", None)
        prev = owner.ws.protected
        if rb is not None:  # the bias (an offloaded parameter) stays in memory meanwhile
            owner.ws.protected = prev | {rb.index}
            owner.ws.materialize(rb)
        try:
            with _no_tf():
                if torch.is_grad_enabled() and (w.requires_grad or x.requires_grad
                                                or (b is not None and b.requires_grad)):
                    return _TiledLinear.apply(x, b, w, s)
                return _linear_forward(owner, s, x, b)
        finally:
            owner.ws.protected = prev
    return NOT_TILED


#: what :func:`tiled_call` returns when the call is not one it computes on blocks
NOT_TILED = object()
_LINEARS = (F.linear, torch._C._nn.linear)
#: the function names :func:`tiled_call` may compute on blocks
TILED_NAMES = frozenset({"linear", "embedding"}) | _EDITS | _FILLS | _INITS
