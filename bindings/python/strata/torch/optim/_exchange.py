"""The exchange between a model's tensors and strata's offloaded optimizer: gradients into
the optimizer before a step, updated weights back into the parameters during it
(``TensorExchange``; not the store's pinned staging pool).

CPU tensors travel without copies where they are contiguous and of a dtype strata takes
(fp32/fp16/bf16); CUDA tensors through pinned host buffers, one per parameter and use,
allocated once. Thread-safety: one thread at a time (the optimizer's).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from .._common import GRAD_DTYPES, host_grad
from ..offload import offload_of


def as_f32_numpy(t: Any) -> np.ndarray:
    """``t`` (a tensor on any device, or anything numpy takes) as a flat contiguous fp32
    numpy array (a copy only where needed)."""
    if torch.is_tensor(t):
        return t.detach().to(device="cpu", dtype=torch.float32).reshape(-1).contiguous().numpy()
    return np.ascontiguousarray(np.asarray(t, dtype=np.float32).reshape(-1))


class TensorExchange:
    """The host buffers of parameters the kernel cannot write in place, what is attached to
    strata, and the byte counters of the moves.

    Every parameter with a gradient gets the updated weights from the step itself (strata's
    ``set_param_copy``): contiguous CPU parameters (fp32, fp16, bf16) straight into their
    memory, others (CUDA, non-contiguous) into a host buffer of the parameter's dtype
    (pinned for CUDA) that :meth:`copy_back` copies into the parameter. No master is read a
    second time to refresh the model. What is attached is remembered, so a step whose
    gradients and parameters are the tensors of the previous step attaches nothing again.

    :param bytes_moved: the optimizer's counters (bytes), updated in place:
        ``host_grads_read`` (gradient bytes the kernel reads), ``host_weights_written``
        (weight bytes the kernel writes: into a parameter or its buffer),
        ``host_copies`` (bytes torch copies on the host: gradients converted to a dtype or
        layout strata takes, buffers into non-contiguous CPU parameters),
        ``device_to_host`` / ``host_to_device`` (CUDA gradients out, weights in).
    """

    def __init__(self, bytes_moved: Dict[str, int]):
        self.bytes_moved = bytes_moved
        self._pinned: Dict[Tuple[int, str], torch.Tensor] = {}
        #: handle -> (tensor, data_ptr) attached by set_grad / set_param_copy (None: detached)
        self._grad: Dict[int, Any] = {}
        self._copy: Dict[int, Any] = {}

    def _pinned_buf(self, h: int, kind: str, numel: int, dtype: torch.dtype,
                    pin: bool) -> torch.Tensor:
        """The host buffer ``kind`` ("grad", "copy") of handle ``h``, (re)made when its
        dtype or size changed; pinned when ``pin`` and CUDA is available."""
        buf = self._pinned.get((h, kind))
        if buf is None or buf.dtype != dtype or buf.numel() != numel:
            buf = torch.empty(numel, dtype=dtype, pin_memory=pin and torch.cuda.is_available())
            self._pinned[(h, kind)] = buf
        return buf

    @staticmethod
    def _set(opt_set: Any, held: Dict[int, Any], h: int, owner: Optional[torch.Tensor],
             t: Optional[torch.Tensor]) -> None:
        """``opt_set(h, t)`` unless ``t`` is what was attached for the same ``owner`` tensor
        (same object, same memory) last time; ``owner`` None detaches."""
        key = None if owner is None else (owner, owner.data_ptr())
        cur = held.get(h, False)
        if cur is not False and (cur is None) == (key is None) and (
                key is None or (cur[0] is key[0] and cur[1] == key[1])):
            return
        opt_set(h, t)
        held[h] = key

    def forget_grad(self, h: int) -> None:
        """Handle ``h``'s gradient was attached (or detached) behind this object's back (an
        overlapped step): the next attach() or detach() sets it again."""
        self._grad.pop(h, None)

    def forget(self, h: int) -> None:
        """Handle ``h``'s gradient and weight destination were set behind this object's back
        (the step over offloaded parameters): the next attach() or detach() sets both."""
        self._grad.pop(h, None)
        self._copy.pop(h, None)

    def detach(self, opt: Any, h: int) -> None:
        """A parameter without a gradient: neither read nor written by the step."""
        self._set(opt.set_grad, self._grad, h, None, None)
        self._set(opt.set_param_copy, self._copy, h, None, None)

    def attach(self, opt: Any, p: torch.nn.Parameter, h: int,
               grad: Optional[torch.Tensor] = None) -> bool:
        """Attaches ``grad`` (default ``p.grad``, not None; p's shape, any float dtype:
        fp32 for the fp32 sum of optim/_grad_accum.py) to strata handle ``h`` of ``opt`` and
        the destination of the updated weights (``p`` itself or its buffer).

        :returns: True when a device-to-host copy was queued: synchronize CUDA before the
            step.
        :raises RuntimeError: a sparse gradient.
        """
        g = p.grad if grad is None else grad
        on_gpu = g.is_cuda
        buf = None
        if on_gpu and not g.is_sparse:
            buf = self._pinned_buf(h, "grad", g.numel(), g.dtype if g.dtype in GRAD_DTYPES
                                   else torch.float32, True)
        host = host_grad(g, out=buf)
        in_place = not on_gpu and host.data_ptr() == g.data_ptr() and host.dtype == g.dtype
        if on_gpu:
            self.bytes_moved["device_to_host"] += host.numel() * host.element_size()
        elif not in_place:
            self.bytes_moved["host_copies"] += host.numel() * host.element_size()
        # the tensor strata reads is remembered by its owner: g itself when read in place
        owner = buf if on_gpu else (g if in_place else host)
        self._set(opt.set_grad, self._grad, h, owner, host)
        self.bytes_moved["host_grads_read"] += host.numel() * host.element_size()
        if not p.is_cuda and p.is_contiguous():
            # the kernel writes the parameter itself
            self._set(opt.set_param_copy, self._copy, h, p, p.detach().view(-1))
        else:
            buf = self._pinned_buf(h, "copy", p.numel(), p.dtype, p.is_cuda)
            self._set(opt.set_param_copy, self._copy, h, buf, buf)
        return on_gpu

    def copy_back(self, p: torch.nn.Parameter, h: int) -> None:
        """After a step that was not skipped: counts the weights the step wrote and copies
        them into ``p`` where the kernel wrote a buffer (CUDA copies are queued
        non-blocking: synchronize before using them)."""
        self.bytes_moved["host_weights_written"] += p.numel() * p.element_size()
        if not p.is_cuda and p.is_contiguous():
            return  # written by the step
        buf = self._pinned[(h, "copy")]
        p.data.copy_(buf.view(p.shape), non_blocking=p.is_cuda)
        key = "host_to_device" if p.is_cuda else "host_copies"
        self.bytes_moved[key] += p.numel() * p.element_size()


def bump_version(p: torch.Tensor) -> None:
    """Counts an in-place update of ``p`` that strata made through its memory (the kernel
    writes contiguous CPU parameters directly), as torch.optim's in-place update would: O(1)
    (an in-place op on an empty view shares p's version counter). Keeps autograd's check of
    saved tensors ("modified by an inplace operation") and lets another optimizer over the
    same parameter see the change."""
    with torch.no_grad():
        if p.dim() == 0:
            p.mul_(1)  # one element (x * 1 keeps -0.0 and NaN as they are)
        else:
            p.narrow(0, 0, 0).mul_(1)  # any layout (a view of no element)


def master_from_blocks(opt: Any, h: int, p: torch.nn.Parameter) -> None:
    """Tiled offloaded ``p``'s current value into the fp32 master of handle ``h``, block by
    block (offload/_tiled.py: never the whole value in memory)."""
    for off, block in offload_of(p).value_blocks(p):
        opt.write_param(h, as_f32_numpy(block), off)


def blocks_from_master(opt: Any, h: int, p: torch.nn.Parameter) -> None:
    """The fp32 master of handle ``h`` into tiled offloaded ``p``'s store object, block by
    block (the step's new value, a resume)."""
    offload_of(p).write_blocks(
        p, lambda off, n: torch.from_numpy(opt.read_param(h, None, off, n)))


def copy_master_to_param(opt: Any, h: int, p: torch.nn.Parameter) -> None:
    """The fp32 master of handle ``h`` into ``p`` (any dtype and device; resume)."""
    o = offload_of(p)
    if o is not None and o.tiled(p):
        blocks_from_master(opt, h, p)
        return
    master = torch.from_numpy(opt.read_param(h))
    if o is not None:  # an offloaded parameter: its object (this rank's slice, ZeRO-3)
        o.write(p, master)
        return
    master = master.view(p.shape)
    with torch.no_grad():
        p.copy_(master)
