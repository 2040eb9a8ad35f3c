"""fp32 gradient accumulation of offloaded fp16/bf16 parameters: the part of the gradient
store (offload/_grads.py) that keeps an fp32 sum of the micro-batch gradients when the
strata optimizer holding the parameter asks for it (``grad_accumulation_dtype``, default
``torch.float32``; docs/guide-optimizers.md "Mixed precision: gradient accumulation"), the
counterpart of optim/_grad_accum.py for in-memory parameters.

The gradient object ``<key>#grad`` then holds the fp32 sum (4 bytes per element instead of
2): each backward's gradient ``g`` (the parameter's dtype, as autograd makes it) is widened
and added as in-memory strata does it by hand::

    sum = g.float()                   (first backward since zero_grad(set_to_none=True))
    sum = g.float() + 0.0             (after zero_grad(set_to_none=False))
    sum = sum + g.float()             (otherwise, p.grad unedited since the last backward)
    sum = p.grad.float() + g.float()  (p.grad edited: scaled, materialized and changed)

``p.grad`` (the OffloadedGrad) shows the sum rounded to the parameter's dtype (nearest
even); its cached norm and finiteness are that rounded tensor's. The step takes the fp32
sum (``grad_sum`` True: the record's ``sum_norm`` / ``sum_finite`` are its norm and
finiteness, what the step's gate uses) until ``p.grad`` is changed: any in-place edit
(``mul_``/``div_`` even by 1, as ``clip_grad_norm_`` does; ``zero_()``; an edit of the
materialized values; ``p.grad.data = t``) makes the step take ``p.grad`` as it then is, in
the parameter's dtype, as for in-memory parameters. With a communicator (ZeRO-3) each
backward's gradient is widened before the reduce-scatter, so the reduction over ranks and
the average are fp32 too (4 bytes per element sent instead of 2). Tiled parameters
(``tile_bytes``) are summed the same way, block by block (offload/_tiled_grads.py); updates
in backward (``overlap_backward``, which defaults to "param") keep the parameter's dtype.

A parameter offloaded after the optimizer took it in memory is bound at the offload
(strata/torch/_common.py ``announce_offload``; ParameterOffload.adopt_grad): a gradient
accumulated in memory before it (``p.grad``) goes to the store then, as the stored sum --
the optimizer's fp32 sum of those micro-batches when it hands one (:func:`store_sum`),
else ``p.grad`` widened (exact for one micro-batch's gradient) -- so the micro-batches after
the offload add to it in fp32.

Thread-safety: as the gradient store (the training thread; autograd's for the hooks).
"""

from __future__ import annotations

import torch

from .._common import all_finite, host_grad, no_torch_function as _no_tf
from ._record import ParamRecord, tensor_of

#: the dtypes whose offloaded gradients may be summed in fp32
LOW_PRECISION = (torch.float16, torch.bfloat16)


def wants_fp32(s: ParamRecord, fp32_sums: bool) -> bool:
    """Whether ``s``'s gradients are summed in fp32: asked for (``fp32_sums``), an fp16/bf16
    parameter (a tiled one block by block: offload/_tiled_grads.py), not linked to an update
    in backward."""
    return bool(fp32_sums) and s.dtype in LOW_PRECISION


def read_sum(grads: "object", s: ParamRecord) -> torch.Tensor:
    """The stored fp32 sum of ``s`` (``s.grad_sum`` True): a new flat fp32 CPU tensor of
    ``s.state_numel`` elements."""
    if s.state_numel == 0:
        return torch.zeros(0, dtype=torch.float32)
    if s.index in grads._writes:
        grads._wait(s.index)
    g = tensor_of(grads.store.get(s.grad_key), torch.float32)
    grads.stats["grad_bytes_read"] += g.numel() * 4
    return g


def sum_base(grads: "object", s: ParamRecord) -> torch.Tensor:
    """What the next backward's fp32 gradient is added to (``s.has_grad``, not zeroed): the
    stored fp32 sum while ``p.grad`` is unedited, else ``p.grad``'s values widened (a new
    flat fp32 tensor either way)."""
    grads._sync_mem(s)
    if s.grad_sum:
        return read_sum(grads, s)
    return grads.read(s).float()


def note_sum(s: ParamRecord, g: torch.Tensor) -> None:
    """``g`` (flat fp32) is ``s``'s new sum: the norm and finiteness of the sum (the step's)
    and of the sum rounded to the parameter's dtype (what ``p.grad`` shows)."""
    r = g.to(s.dtype)
    s.grad_norm = torch.norm(r, 2.0)
    s.grad_finite = all_finite(r, s.grad_norm)
    s.sum_norm = torch.norm(g, 2.0)
    s.sum_finite = all_finite(g, s.sum_norm)
    s.grad_sum = True


def store_sum(grads: "object", s: ParamRecord, g: torch.Tensor) -> None:
    """``g`` -- the fp32 sum of the micro-batch gradients accumulated in memory before
    ``s``'s parameter was offloaded (its optimizer's, optim/_grad_accum.py; ``p.grad``
    holds it rounded to the parameter's dtype) -- becomes the stored fp32 sum, as if summed
    here, and ``p.grad`` (torch's field) is cleared. With a communicator the sum is
    reduce-scattered as a backward's gradient is (a collective). Only for a bound,
    untiled ``s`` with ``grad_acc32`` and no stored gradient.

    :param g: fp32, the parameter's shape (or numel) and device; not changed."""
    with _no_tf():
        s.param.grad = None
        flat = host_grad(g.detach(), where=f"offloaded parameter {s.name!r}: ",
                         keep_dtype=True)
    if flat.data_ptr() == g.data_ptr():
        flat = flat.clone()  # (the optimizer's buffer stays its own)
    if grads.comm is not None:
        flat = grads._reduce_scatter(s, flat)
    grads._forget_values(s)
    s.has_grad = True
    note_sum(s, flat)
    grads._write(s, flat)
