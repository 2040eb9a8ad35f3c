"""Finiteness of a gradient, cheaply: what the offloaded step's gate (skip a step whose
gradients hold an inf or NaN) asks of every gradient as backward produces it.

Thread-safety: pure functions.
"""

from __future__ import annotations

from typing import Optional

import torch


def all_finite(t: torch.Tensor, norm: Optional[torch.Tensor] = None) -> bool:
    """``bool(torch.isfinite(t).all())`` for a floating tensor of any shape, dtype and
    layout, ~25x faster on CPU: torch 1.13's isfinite builds several full-size temporaries
    (measured: 2.5-5 s per iteration over the main job's 139 M gradients on 2 cores). The L2
    norm is finite only when every element is (a NaN or an infinity reaches it), so a finite
    norm answers True; a non-finite one (a non-finite element, or an overflow of large
    finite ones) takes the exact test.

    :param t: the tensor (CPU or CUDA; floating point).
    :param norm: ``torch.norm(t, 2.0)`` when the caller has it (clipping does), else it is
        computed here.
    :returns: True when every element of ``t`` is finite.
    """
    if norm is None:
        norm = torch.norm(t, 2.0)
    if bool(torch.isfinite(norm)):
        return True
    return bool(torch.isfinite(t).all())
