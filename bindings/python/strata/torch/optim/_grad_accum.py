"""Gradient accumulation in fp32 for fp16/bf16 in-memory parameters of strata's optimizers
(``grad_accumulation_dtype``, docs/guide-optimizers.md "Mixed precision: gradient
accumulation").

torch accumulates micro-batch gradients in the parameter's dtype: with bf16 parameters each
``p.grad += g`` rounds to 8 significant bits (DeepSpeed's issue 1800, "bf16 losses much
higher"). Here each watched parameter keeps an fp32 sum: a hook on ``p`` (a tensor hook,
which autograd runs before accumulating) takes the micro-batch's gradient ``g``, and a hook
on ``p``'s AccumulateGrad node (``p.expand_as(p).grad_fn.next_functions[0][0]``; torch 1.13
has no ``register_post_accumulate_grad_hook``), which runs after it, sets

    sum = g.float()                    (first micro-batch: p.grad was None)
    sum = p.grad.float() + g.float()   (p.grad not the one this module wrote, e.g. zeroed)
    sum = sum + g.float()              (otherwise)

and overwrites ``p.grad`` in place with ``sum`` rounded to the parameter's dtype (nearest
even). So ``p.grad`` keeps torch's dtype, shape, identity and meaning (the accumulated
gradient, to the parameter's precision) and the step takes the fp32 sum while ``p.grad`` is
the tensor this module last wrote, unchanged since (its ``_version``). Anything that changes
``p.grad`` -- ``clip_grad_norm_``, ``mul_``, ``zero_()``, ``p.grad = t``, ``p.grad = None``
-- makes the step take ``p.grad`` itself (what the user made of it), and the next
micro-batch starts its sum from it. Edits through ``p.grad.data`` bypass the version counter
and are not seen (as for parameters). ``torch.autograd.grad`` (no accumulation) changes
nothing. A backward with ``create_graph=True`` accumulates as torch does (no fp32 sum).

A parameter offloaded (strata.torch.offload_parameters) after the optimizer took it: the
offload tells this module (strata/torch/_common.py ``note_holder`` / ``announce_offload``;
:meth:`GradAccumulation.param_offloaded`), which binds it to its offload at once -- its
gradients go to the store from the next backward on, fp16/bf16 ones summed in fp32
(offload/_grad_sum.py) -- and hands over the fp32 sum of the micro-batches accumulated in
memory so far (while ``p.grad`` is unchanged since), so the sums are fp32 from the first
micro-batch whenever the offload comes (before the first backward, between steps, between
micro-batches).

Thread-safety: the hooks run on torch's autograd thread (the caller's for CPU models); the
rest on the optimizer's thread, one at a time.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch

from .._common import no_torch_function, note_holder
from ..offload import is_offloaded, offload_of

#: the dtypes whose gradients are accumulated in fp32 by default
LOW_PRECISION = (torch.float16, torch.bfloat16)

#: ``grad_accumulation_dtype`` value keeping torch's accumulation in the parameter's dtype
PARAM_DTYPE = "param"


def check_option(value: Any, overlap_backward: bool = False) -> str:
    """``grad_accumulation_dtype`` resolved: "float32" or "param".

    :param value: None (default: torch.float32, or "param" with ``overlap_backward``),
        ``torch.float32`` or ``"float32"``, or ``"param"``.
    :raises ValueError: another value, or torch.float32 with ``overlap_backward`` (its
        updates start in backward from the gradient torch accumulated).
    """
    if value is None:
        return PARAM_DTYPE if overlap_backward else "float32"
    if value is torch.float32 or value == "float32":
        if overlap_backward:
            raise ValueError(
                "grad_accumulation_dtype=torch.float32 is not supported with "
                "overlap_backward=True (updates started in backward take the gradient torch "
                "accumulated in the parameter's dtype): pass grad_accumulation_dtype='param' "
                "or overlap_backward=False")
        return "float32"
    if isinstance(value, str) and value == PARAM_DTYPE:
        return PARAM_DTYPE
    raise ValueError(f"grad_accumulation_dtype must be torch.float32 (the default: fp16/bf16 "
                     f"parameters' gradients summed in fp32) or 'param' (torch's accumulation "
                     f"in the parameter's dtype), got {value!r}")


class _Entry:
    __slots__ = ("sum", "shown", "version", "incoming", "base", "hooks")

    def __init__(self) -> None:
        self.sum: Optional[torch.Tensor] = None  # fp32, p's shape and device
        self.shown: Optional[torch.Tensor] = None  # the p.grad tensor last written
        self.version = -1
        self.incoming: Optional[torch.Tensor] = None  # the micro-batch's gradient
        self.base: Optional[torch.Tensor] = None  # the fp32 sum it is added to (or None)
        self.hooks: List[Any] = []


class GradAccumulation:
    """The fp32 gradient sums of an optimizer's fp16/bf16 in-memory parameters (see the
    module doc). With mode "param" it watches nothing and :meth:`grad` is ``p.grad``.

    :param mode: "float32" or "param" (:func:`check_option`).
    :param holds: ``holds(p)``: whether the optimizer still holds parameter ``p`` (called
        when ``p`` is offloaded; its param groups may have dropped it). None: every
        parameter given to :meth:`watch` is held until :meth:`close`.
    """

    def __init__(self, mode: str, holds: Optional[Callable[[torch.Tensor], bool]] = None):
        self.mode = mode
        self._entries: Dict[int, _Entry] = {}
        self._holds = holds
        self._closed = False

    def watch(self, params: Iterable[torch.Tensor]) -> None:
        """Starts fp32 accumulation for each fp16/bf16 leaf of ``params`` that requires
        grad and is not watched yet (others: nothing; offloaded parameters' gradients are
        the offload's), and notes the optimizer as a holder of every one of ``params``
        (:meth:`param_offloaded` when it is offloaded later). Idempotent; cheap."""
        params = list(params)
        for p in params:
            note_holder(p, self)
        if self.mode != "float32":
            return
        for p in params:
            if (id(p) in self._entries or p.dtype not in LOW_PRECISION
                    or not p.requires_grad or not p.is_leaf or is_offloaded(p)):
                continue
            e = _Entry()
            self._entries[id(p)] = e
            ref = weakref.ref(self)
            pref = weakref.ref(p)

            def pre(g: torch.Tensor, ref=ref, e=e, pref=pref) -> None:
                s, q = ref(), pref()
                if s is not None and q is not None:
                    s._incoming(q, e, g)

            def post(_inputs: Any, _outputs: Any, ref=ref, e=e, pref=pref) -> None:
                s, q = ref(), pref()
                if s is not None and q is not None:
                    s._accumulated(q, e)

            e.hooks.append(p.register_hook(pre))
            with torch.enable_grad(), no_torch_function():
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
            e.hooks.append(acc.register_hook(post))
            e.hooks.append(acc)  # the node lives as long as its hook must

    def param_offloaded(self, p: torch.Tensor) -> None:
        """Parameter offload has just taken ``p``, which the optimizer holds
        (strata/torch/_common.py ``announce_offload``): ``p`` is bound to its offload now
        (its gradients go to the store from the next backward on; fp16/bf16 ones summed in
        fp32 in mode "float32"), its in-memory accumulation stops (hooks removed), and the
        gradient accumulated in memory so far goes to the store -- its fp32 sum while
        ``p.grad`` is unchanged since this module wrote it, else ``p.grad``
        (ParameterOffload.adopt_grad). Nothing once closed or when ``holds(p)`` is False.

        :raises strata.Error: the store's errors writing the gradient."""
        if self._closed or (self._holds is not None and not self._holds(p)):
            return
        e = self._entries.pop(id(p), None)
        total = None
        if e is not None:
            if self._valid(p, e):
                total = e.sum
            for h in e.hooks:
                if hasattr(h, "remove"):
                    h.remove()
            e.hooks = []
        o = offload_of(p)
        o.bind_optimizer(p, self.mode == "float32")
        o.adopt_grad(p, total)

    def _valid(self, p: torch.Tensor, e: _Entry) -> bool:
        g = p.grad
        return e.sum is not None and g is not None and g is e.shown and g._version == e.version

    def _incoming(self, p: torch.Tensor, e: _Entry, g: torch.Tensor) -> None:
        """Before torch accumulates ``g`` into ``p.grad``: what it will be added to."""
        e.incoming = None
        if g.requires_grad or g.is_sparse or g.dtype != p.dtype:
            return  # create_graph (or an unusual gradient): torch's accumulation
        with torch.no_grad():
            if self._valid(p, e):
                e.base = e.sum
            else:
                cur = p.grad
                e.base = None if cur is None else cur.detach().float()  # (a copy: fp16/bf16)
        e.incoming = g.detach()

    def _accumulated(self, p: torch.Tensor, e: _Entry) -> None:
        """After torch accumulated: the fp32 sum, and ``p.grad`` overwritten with it
        rounded to the parameter's dtype."""
        g, e.incoming = e.incoming, None
        if g is None:
            e.sum, e.shown, e.base = None, None, None
            return
        with torch.no_grad():
            base, e.base = e.base, None
            s = g.float() if base is None else base.add_(g.float())
            cur = p.grad
            if cur is None or cur.requires_grad or cur.shape != p.shape:
                e.sum, e.shown = None, None
                return
            cur.copy_(s)  # round to nearest even, into torch's own gradient tensor
            e.sum, e.shown, e.version = s, cur, cur._version

    def grad(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        """The gradient the step takes for in-memory ``p``: its fp32 sum (p's shape and
        device) while ``p.grad`` is what this module wrote, else ``p.grad`` (None: none)."""
        e = self._entries.get(id(p))
        if e is not None and self._valid(p, e):
            return e.sum
        return p.grad

    def clear(self) -> None:
        """Forgets every sum (``zero_grad``): the next micro-batch starts from ``p.grad``."""
        for e in self._entries.values():
            e.sum, e.shown, e.base, e.incoming = None, None, None, None

    def sum_bytes(self) -> int:
        """Bytes held by the fp32 sums (4 per element of each parameter with one)."""
        return sum(e.sum.numel() * 4 for e in self._entries.values() if e.sum is not None)

    def close(self) -> None:
        """Removes every hook and sum (the optimizer closes); offloads are no longer
        told to this module."""
        self._closed = True
        for e in self._entries.values():
            for h in e.hooks:
                if hasattr(h, "remove"):
                    h.remove()
            e.hooks = []
        self._entries.clear()
