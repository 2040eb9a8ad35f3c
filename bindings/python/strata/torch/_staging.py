"""Staging between a model's parameters and strata's offloaded optimizer: gradients into
the optimizer before a step, updated weights back into the parameters after it.

CPU tensors travel without copies where they are contiguous and of a dtype strata takes
(fp32/fp16/bf16); CUDA tensors through pinned host buffers, one per parameter and use,
allocated once. Thread-safety: one thread at a time (the optimizer's).
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np
import torch

#: gradient dtypes strata reads as they are (others are converted to fp32)
GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: parameter dtypes that receive the kernel's rounded copy (set_param_copy)
HALF_DTYPES = (torch.float16, torch.bfloat16)


def as_f32_numpy(t: Any) -> np.ndarray:
    """``t`` (a tensor on any device, or anything numpy takes) as a flat contiguous fp32
    numpy array (a copy only where needed)."""
    if torch.is_tensor(t):
        return t.detach().to(device="cpu", dtype=torch.float32).reshape(-1).contiguous().numpy()
    return np.ascontiguousarray(np.asarray(t, dtype=np.float32).reshape(-1))


class Staging:
    """The pinned host buffers of CUDA parameters and the byte counters of the moves.

    :param bytes_moved: the optimizer's counters (nvme_read, nvme_written, host_grads_read,
        host_weights_written, device_to_host, host_to_device; bytes), updated in place.
    """

    def __init__(self, bytes_moved: Dict[str, int]):
        self.bytes_moved = bytes_moved
        self._pinned: Dict[Tuple[int, str], torch.Tensor] = {}

    def _pinned_buf(self, h: int, kind: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The pinned buffer ``kind`` ("grad", "copy", "master") of handle ``h``, (re)made
        when its dtype or size changed."""
        buf = self._pinned.get((h, kind))
        if buf is None or buf.dtype != dtype or buf.numel() != numel:
            buf = torch.empty(numel, dtype=dtype, pin_memory=torch.cuda.is_available())
            self._pinned[(h, kind)] = buf
        return buf

    def attach(self, opt: Any, p: torch.nn.Parameter, h: int) -> bool:
        """Attaches ``p.grad`` (not None) to strata handle ``h`` of ``opt`` and, for
        fp16/bf16 parameters, the buffer that receives the rounded update.

        :returns: True when a device-to-host copy was queued: synchronize CUDA before the
            step.
        :raises RuntimeError: a sparse gradient.
        """
        g = p.grad
        on_gpu = False
        if g.is_sparse:
            raise RuntimeError("strata offloaded optimizers do not support sparse gradients")
        if g.is_cuda:
            host = self._pinned_buf(h, "grad", g.numel(), g.dtype if g.dtype in GRAD_DTYPES
                                    else torch.float32)
            host.copy_(g.reshape(-1), non_blocking=True)
            self.bytes_moved["device_to_host"] += host.numel() * host.element_size()
            on_gpu = True
        else:
            host = g.reshape(-1)
            if host.dtype not in GRAD_DTYPES:
                host = host.float()
            if not host.is_contiguous():
                host = host.contiguous()
        opt.set_grad(h, host)
        self.bytes_moved["host_grads_read"] += host.numel() * host.element_size()
        # fp16/bf16 CPU parameters receive the rounded copy from the kernel directly.
        if not p.is_cuda and p.dtype in HALF_DTYPES and p.is_contiguous():
            opt.set_param_copy(h, p.detach().view(-1))
        elif p.is_cuda and p.dtype in HALF_DTYPES:
            opt.set_param_copy(h, self._pinned_buf(h, "copy", p.numel(), p.dtype))
        else:
            opt.set_param_copy(h, None)
        return on_gpu

    def copy_back(self, opt: Any, p: torch.nn.Parameter, h: int) -> None:
        """After a step: the updated weights of handle ``h`` into ``p`` (CUDA copies are
        queued non-blocking: synchronize before using them)."""
        nbytes = p.numel() * p.element_size()
        if p.is_cuda:
            if p.dtype in HALF_DTYPES:
                buf = self._pinned[(h, "copy")]
            else:
                buf = self._pinned_buf(h, "master", p.numel(), torch.float32)
                opt.read_param(h, buf)
            p.data.view(-1).copy_(buf.to(p.dtype) if buf.dtype != p.dtype else buf,
                                  non_blocking=True)
            self.bytes_moved["host_to_device"] += nbytes
            return
        self.bytes_moved["host_weights_written"] += nbytes
        if p.dtype in HALF_DTYPES and p.is_contiguous():
            return  # written by the kernel (set_param_copy)
        if p.dtype == torch.float32 and p.is_contiguous():
            opt.read_param(h, p.detach().view(-1))  # straight into the parameter
            return
        p.data.copy_(torch.from_numpy(opt.read_param(h)).view(p.shape))


def copy_master_to_param(opt: Any, h: int, p: torch.nn.Parameter) -> None:
    """The fp32 master of handle ``h`` into ``p`` (any dtype and device; resume)."""
    master = torch.from_numpy(opt.read_param(h)).view(p.shape)
    with torch.no_grad():
        p.copy_(master)
