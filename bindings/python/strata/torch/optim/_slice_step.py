"""A torch.optim class's own step on one slice of a parameter (for OffloadOptimizer,
optim/_any.py): the streamed slice of the fp32 master, of the gradient and of each
element-wise state tensor are torch views of strata's buffers, handed to a one-parameter
instance of the class, whose ``step()`` updates them in place -- the class's arithmetic,
whatever the torch version, so a tensor stepped slice by slice is bit-identical to the
class stepping it whole in memory (every supported class is element-wise: element i of the
result depends on element i of the inputs and on per-tensor scalars only).

Per-tensor scalar state (``step``, ASGD's ``eta``/``mu``, NAdam's ``mu_product``, SGD's
``momentum_buffer=None`` when momentum is 0) is what a state entry is when it is not a
tensor of the slice's shape: each slice gets a fresh copy of the values before the step,
and the values after it are taken from the first slice (offset 0), so they advance once
per tensor step.

Thread-safety: one slice at a time (the Python rule's calls are serial).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Dict, List, Sequence, Tuple

import torch

#: element-wise classes of torch.optim this module steps (torch 1.13's; the same names in 2.x)
SUPPORTED = ("SGD", "Adagrad", "RMSprop", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD",
             "Rprop", "Adam", "AdamW")

#: classes refused, and why
REFUSED = {
    "LBFGS": "LBFGS is not element-wise: its step re-evaluates the closure several times "
             "and keeps a history of whole-model vectors (line search, two-loop recursion), "
             "which cannot be streamed one slice at a time",
    "SparseAdam": "SparseAdam steps sparse gradients (only the rows a gradient holds), "
                  "while the offloaded pipeline streams dense slices of every element",
}


#: classes whose state OffloadOptimizer(state_dtype=torch.bfloat16) refuses to keep in bf16,
#: and why (the others' element-wise state is moments: running averages of gradients)
BF16_REFUSED = {
    "Adagrad": "its state 'sum' accumulates squared gradients without decay; in bf16 "
               "(8-bit significand) an increment below sum * 2^-9 is lost, so the sum -- "
               "and the learning-rate decay it drives -- stalls",
    "ASGD": "its state 'ax' is the running average of the parameters (the averaged model), "
            "which bf16 would hold more coarsely than the fp32 masters",
    "Rprop": "its state is the previous gradient and per-element step sizes scaled by "
             "etaminus/etaplus each step, not moments; bf16 would change every scaling",
}


def state_dtype_name(state_dtype: Any, cls: Any) -> str:
    """strata's name ("fp32" / "bf16") of OffloadOptimizer's ``state_dtype`` for ``cls`` (a
    torch.optim class, or None for an UpdateRule, whose states are its author's choice).

    :raises ValueError: a dtype other than None / torch.float32 / "fp32" / "float32" /
        torch.bfloat16 / "bf16" / "bfloat16" (naming it); bf16 for a class in
        ``BF16_REFUSED`` (naming the class and why)."""
    if state_dtype is None or state_dtype in (torch.float32, "fp32", "float32"):
        return "fp32"
    if state_dtype not in (torch.bfloat16, "bf16", "bfloat16"):
        raise ValueError(f"OffloadOptimizer: state_dtype must be torch.float32 or "
                         f"torch.bfloat16 (the state tensors' dtype in the store), got "
                         f"{state_dtype!r}")
    if cls is not None and cls.__name__ in BF16_REFUSED:
        raise ValueError(f"OffloadOptimizer: state_dtype=torch.bfloat16 is refused for "
                         f"torch.optim.{cls.__name__}: {BF16_REFUSED[cls.__name__]}")
    return "bf16"


def check_class(cls: Any) -> None:
    """Refuses what OffloadOptimizer cannot step.

    :raises TypeError: ``cls`` is not a torch.optim.Optimizer subclass.
    :raises ValueError: LBFGS, SparseAdam (naming why), or another class that is not one of
        ``SUPPORTED`` (its arithmetic is not known to be element-wise)."""
    if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)):
        raise TypeError(f"OffloadOptimizer: expected a torch.optim.Optimizer class (e.g. "
                        f"torch.optim.RMSprop) or a strata.torch.optim.UpdateRule, got "
                        f"{cls!r}")
    name = cls.__name__
    if name in REFUSED and cls.__module__.startswith("torch.optim"):
        raise ValueError(f"OffloadOptimizer: torch.optim.{name} is refused: {REFUSED[name]}")
    if name not in SUPPORTED or not cls.__module__.startswith("torch.optim"):
        raise ValueError(f"OffloadOptimizer: {cls.__module__}.{name} is not one of the "
                         f"element-wise torch.optim classes it steps ({', '.join(SUPPORTED)}); "
                         "write the update as a strata.torch.optim.UpdateRule instead")


def init_kwargs(cls: Any, group: Dict[str, Any]) -> Dict[str, Any]:
    """The entries of ``group`` that ``cls.__init__`` takes as keyword arguments."""
    names = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in group.items() if k in names and k != "params"}


def is_stream(value: Any) -> bool:
    """A state entry of a 1-D slice that is element-wise (not a per-tensor scalar)."""
    return isinstance(value, torch.Tensor) and value.dim() >= 1


def stream_names(cls: Any, group: Dict[str, Any]) -> List[str]:
    """The element-wise state tensors ``cls`` keeps with ``group``'s hyperparameters
    (e.g. RMSprop centered with momentum: square_avg, momentum_buffer, grad_avg), in the
    order the class creates them: found by one step of a 2-element parameter."""
    p = torch.zeros(2)
    p.grad = torch.ones(2)
    opt = cls([p], **init_kwargs(cls, group))
    _copy_group(opt.param_groups[0], group)
    opt.step()
    return [k for k, v in opt.state[p].items() if is_stream(v)]


def _copy_group(dst: Dict[str, Any], group: Dict[str, Any]) -> None:
    for k, v in group.items():
        if k != "params":
            dst[k] = v


def clone_scalars(scalars: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of per-tensor scalar state (tensors cloned) that a step may change in place."""
    return {k: (v.clone() if isinstance(v, torch.Tensor) else copy.copy(v))
            for k, v in scalars.items()}


def step_slice(cls: Any, group: Dict[str, Any], param: torch.Tensor, grad: torch.Tensor,
               streams: Dict[str, torch.Tensor], scalars: Dict[str, Any],
               fresh: bool) -> Dict[str, Any]:
    """One step of ``cls`` on a slice, in place: ``param`` (fp32, 1-D), ``grad`` (same
    shape), ``streams`` (name -> the state stream's 1-D fp32 view). ``fresh``: the tensor
    has no state yet (its first step: the class initializes it, e.g. Adagrad's
    initial_accumulator_value, Rprop's step_size = lr); else ``scalars`` is its per-tensor
    scalar state before the step (copied, not changed). Returns the scalar state after the
    step. State tensors the class replaces rather than updates in place (SGD's first
    momentum buffer, a clone of the gradient) are copied into their views."""
    opt = cls([param], **init_kwargs(cls, group))
    _copy_group(opt.param_groups[0], group)
    param.grad = grad
    state = opt.state[param]
    if not fresh:
        state.update(clone_scalars(scalars))
        state.update(streams)
    opt.step()
    after: Dict[str, Any] = {}
    for k, v in state.items():
        view = streams.get(k)
        if view is not None and is_stream(v):
            if v.data_ptr() != view.data_ptr():
                view.copy_(v)
        elif not is_stream(v):
            after[k] = v
    param.grad = None
    return after


def compact_state(state: Dict[str, Any]) -> Dict[str, Any]:
    """A construction-time state entry kept small: a tensor filled with one value becomes
    ("filled", value, dtype); other tensors are cloned, other values copied."""
    out: Dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.numel() > 0 and \
                bool((v == v.reshape(-1)[0]).all()):
            out[k] = ("filled", v.reshape(-1)[0].item(), v.dtype)
        else:
            out[k] = v.clone() if isinstance(v, torch.Tensor) else copy.copy(v)
    return out


def expand_state(compact: Dict[str, Any], param: torch.Tensor) -> Dict[str, Any]:
    """The state entry compact_state() kept, with its filled tensors made again, shaped
    like ``param``."""
    out: Dict[str, Any] = {}
    for k, v in compact.items():
        if isinstance(v, tuple) and len(v) == 3 and v[0] == "filled":
            out[k] = torch.full(param.shape, v[1], dtype=v[2])
        else:
            out[k] = v.clone() if isinstance(v, torch.Tensor) else copy.copy(v)
    return out


def resume_streams_error(e: Exception, streams: Sequence[str]) -> Exception:
    """The error of a resume whose hyperparameters make other state streams than the
    checkpoint's (strata's FailedPreconditionError `e`), saying what to pass."""
    return type(e)(
        f"OffloadOptimizer resume: the hyperparameters given make the state tensors "
        f"{list(streams)}, not the checkpoint's: pass the ones that decide which state a "
        "parameter has (e.g. SGD momentum, RMSprop centered/momentum, Adam amsgrad) as at "
        f"creation ({e})")


def scalars_to_record(scalars: Dict[str, Any]) -> Dict[str, Any]:
    """Per-tensor scalar state as JSON values: a tensor as [value, dtype name], None, ints,
    floats."""
    out: Dict[str, Any] = {}
    for k, v in scalars.items():
        if isinstance(v, torch.Tensor):
            out[k] = ["tensor", float(v.item()), str(v.dtype).replace("torch.", "")]
        else:
            out[k] = v
    return out


def scalars_from_record(rec: Dict[str, Any]) -> Dict[str, Any]:
    """The inverse of scalars_to_record."""
    out: Dict[str, Any] = {}
    for k, v in rec.items():
        if isinstance(v, list) and len(v) == 3 and v[0] == "tensor":
            out[k] = torch.tensor(v[1], dtype=getattr(torch, v[2]))
        else:
            out[k] = v
    return out


def split_state(state: Dict[str, Any]) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """A torch state entry of one parameter as (element-wise tensors, scalars): tensors of
    the parameter's shape (dim >= 1, or any tensor of more than one element) vs the rest."""
    streams, scalars = {}, {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor) and (v.dim() >= 1 or k not in ("step", "eta", "mu",
                                                                      "mu_product")):
            streams[k] = v
        else:
            scalars[k] = v
    return streams, scalars


def names(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "none"
