"""A model's tensors as a checkpoint names them: the entries of ``module.state_dict()``
(parameters and persistent buffers, in its order, under its names), tied tensors (one
tensor under several names), where each value lives (an offloaded parameter's store object,
or memory), and the dtype names of torch, strata and safetensors.

Thread-safety: plain functions; the model must not change meanwhile.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..offload import ParameterOffload, is_offloaded, offload_of

#: safetensors dtype -> torch dtype (the ten strata has; F8_*, U16/U32/U64 are not read)
TORCH_OF_ST = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
               "F64": torch.float64, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
               "I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool}
#: torch dtype -> strata dtype name
STRATA_OF_TORCH = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                   torch.float64: "fp64", torch.int8: "int8", torch.int16: "int16",
                   torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8",
                   torch.bool: "bool"}
FLOATING = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def strata_dtype(dtype: torch.dtype, what: str) -> str:
    """strata's name of ``dtype``. :raises TypeError: one it has not (complex, uint16...),
    naming ``what``."""
    try:
        return STRATA_OF_TORCH[dtype]
    except KeyError:
        raise TypeError(f"{what}: dtype {dtype} is not supported (supported: "
                        f"{', '.join(str(d) for d in STRATA_OF_TORCH)})") from None


def convertible(src: torch.dtype, dst: torch.dtype) -> bool:
    """The conversions done in flight: none, or between the floating dtypes."""
    return src == dst or (src in FLOATING and dst in FLOATING)


def model_of(module_or_offload: Any) -> torch.nn.Module:
    """The module (a ParameterOffload: its attached model).

    :raises TypeError: neither; :raises ValueError: an offload without a model yet."""
    if isinstance(module_or_offload, ParameterOffload):
        m = module_or_offload.model
        if m is None:
            raise ValueError("this ParameterOffload has no model yet (attach one first)")
        return m
    if not isinstance(module_or_offload, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module or a ParameterOffload, got "
                        f"{type(module_or_offload).__name__}")
    return module_or_offload


def state_entries(model: torch.nn.Module) -> "OrderedDict[str, torch.Tensor]":
    """``model.state_dict(keep_vars=True)``'s tensors (the parameter and buffer objects
    themselves: nothing is materialized or copied). Non-tensor entries (``_extra_state``)
    are left out."""
    return OrderedDict((k, v) for k, v in model.state_dict(keep_vars=True).items()
                       if torch.is_tensor(v))


def tied_groups(entries: "OrderedDict[str, torch.Tensor]") -> Dict[int, List[str]]:
    """id(tensor) -> its names in state_dict order (two or more: tied weights)."""
    groups: Dict[int, List[str]] = {}
    for k, v in entries.items():
        groups.setdefault(id(v), []).append(k)
    return groups


def compatible_shape(file_shape: Tuple[int, ...], shape: Tuple[int, ...]) -> bool:
    """The shapes torch's load_state_dict accepts: equal, or a 0-d tensor from a 1-element
    1-d one (its backward compatibility with torch 0.3's scalars)."""
    return tuple(file_shape) == tuple(shape) or (len(shape) == 0 and tuple(file_shape) == (1,))


def report(module: torch.nn.Module, missing: List[str], unexpected: List[str],
           mismatched: List[str], strict: bool) -> None:
    """Raises torch's RuntimeError of load_state_dict (the same wording) when there is a
    size mismatch, or, with ``strict``, a missing or unexpected key."""
    msgs = list(mismatched)
    if strict:
        if unexpected:
            msgs.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in unexpected)))
        if missing:
            msgs.insert(0, "Missing key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in missing)))
    if msgs:
        raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
            module.__class__.__name__, "\n\t".join(msgs)))


def incompatible_keys(missing: List[str], unexpected: List[str]) -> Any:
    """torch's ``_IncompatibleKeys(missing_keys, unexpected_keys)`` (what load_state_dict
    returns), or a namedtuple of the same fields where torch lacks it."""
    try:
        from torch.nn.modules.module import _IncompatibleKeys
    except ImportError:  # pragma: no cover (torch 1.13 .. 2.x have it)
        import collections
        _IncompatibleKeys = collections.namedtuple("IncompatibleKeys",
                                                   ["missing_keys", "unexpected_keys"])
    return _IncompatibleKeys(missing, unexpected)


def where(t: torch.Tensor) -> Tuple[str, Any]:
    """("offloaded", its ParameterOffload) or ("memory", None)."""
    if is_offloaded(t):
        return "offloaded", offload_of(t)
    return "memory", None


def bump_version(t: torch.Tensor) -> None:
    """Counts an in-place change of ``t`` (written behind torch's back, through its data
    pointer) in its version counter, as ``copy_`` would: an in-place op on an empty view
    (O(1); the view shares the counter)."""
    with torch.no_grad():
        t.detach().view(-1)[:0].zero_()


def filled_by_torch(model: torch.nn.Module, missing: List[str],
                    metadata: Optional[Dict[str, Any]]) -> List[str]:
    """The missing keys torch's load_state_dict fills itself instead of reporting them: a
    BatchNorm's ``num_batches_tracked`` when the state dict's ``_metadata`` gives its
    module no version >= 2 (``_NormBase._load_from_state_dict``; a safetensors file has no
    metadata: always). See :func:`fill_like_torch` for the value."""
    norm = getattr(torch.nn.modules.batchnorm, "_NormBase", None)
    out = []
    for prefix, m in model.named_modules():
        if norm is None or not isinstance(m, norm) or not m.track_running_stats \
                or getattr(m, "num_batches_tracked", None) is None:
            continue
        key = (prefix + "." if prefix else "") + "num_batches_tracked"
        version = ((metadata or {}).get(prefix) or {}).get("version")
        if key in missing and (version is None or version < 2):
            out.append(key)
    return out


_ZEROES: List[bool] = []


def fill_like_torch(model: torch.nn.Module, keys: List[str]) -> None:
    """Gives the ``num_batches_tracked`` buffers of ``keys`` the value the running torch's
    load_state_dict gives them (0 in torch 1.13; newer ones keep the module's value):
    found out once by loading a state dict without it into a BatchNorm1d."""
    if not keys:
        return
    if not _ZEROES:
        bn = torch.nn.BatchNorm1d(1)
        with torch.no_grad():
            bn.num_batches_tracked.fill_(5)
        bn.load_state_dict(OrderedDict((k, v) for k, v in bn.state_dict().items()
                                       if k != "num_batches_tracked"))
        _ZEROES.append(bn.num_batches_tracked.item() == 0)
    if _ZEROES[0]:
        buffers = dict(model.named_buffers())
        with torch.no_grad():
            for k in keys:
                buffers[k].zero_()
