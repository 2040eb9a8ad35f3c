"""What parameter offload keeps per offloaded parameter: a :class:`ParamRecord`.

Each offloaded parameter has a :class:`ParamRecord` (its store object, its placeholder, its
gradient's bookkeeping) whose ``state`` (:class:`Residency`) says where its data is:
RELEASED (only in the store), FETCHING (a fetch issued, not yet taken), RESIDENT
(materialized; changed in place when ``p._version`` moved since) or ADOPTED (materialized
from ``p.data = t``: newer than the store, stored when released).

Thread-safety: plain records, owned by one ParameterOffload (its thread; the fetch thread
sets ``fetched``/``fetch_error`` under the working set's lock).
"""

from __future__ import annotations

import enum
import itertools
from typing import Any, List, Optional, Tuple

import numpy as np
import torch


def tensor_of(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A numpy array from ``Store.get`` as a flat torch tensor of ``dtype`` sharing its
    memory (bf16 objects come back as uint16 bits)."""
    if arr.dtype == np.uint16:
        arr = arr.view(np.int16)
    t = torch.from_numpy(arr.reshape(-1))
    return t.view(dtype) if t.dtype != dtype else t


def dense_stride(p: torch.Tensor) -> Optional[Tuple[int, ...]]:
    """``p.stride()`` when ``p`` (a plain tensor) is not contiguous but dense and
    non-overlapping in some order of its dimensions (channels_last, channels_last_3d, a
    transpose): the layout its materialized data keeps; None when it is contiguous, or
    overlapping / with gaps (such a parameter is materialized contiguous)."""
    if p.is_contiguous() or p.dim() < 2:
        return None
    order = sorted(range(p.dim()), key=lambda d: p.stride(d), reverse=True)
    return tuple(p.stride()) if p.permute(order).is_contiguous() else None


def shaped(s: "ParamRecord", flat: torch.Tensor) -> torch.Tensor:
    """The flat row-major value ``flat`` (``s.numel`` elements, on ``s.device``) as ``s``'s
    shape in its recorded layout (``s.stride``: a copy into a tensor of those strides; else
    a view)."""
    if s.stride is None:
        return flat.view(s.shape)
    out = torch.empty_strided(s.shape, s.stride, dtype=flat.dtype, device=flat.device)
    out.copy_(flat.view(s.shape))
    return out


class Residency(enum.Enum):
    """Where an offloaded parameter's data is (``ParamRecord.state``)."""

    #: only in the store; the parameter's data is the placeholder
    RELEASED = "released"
    #: a fetch was issued and not yet taken (``ParamRecord.pending``)
    FETCHING = "fetching"
    #: materialized (``ParamRecord.resident``); changed in place when ``p._version`` moved
    #: since ``ParamRecord.mark``
    RESIDENT = "resident"
    #: materialized from ``p.data = t``: newer than the store, stored when released
    ADOPTED = "adopted"


#: the states whose data is in memory
IN_MEMORY = (Residency.RESIDENT, Residency.ADOPTED)


class OptimizerLink:
    """What a strata optimizer that updates offloaded parameters inside backward
    (strata.torch.optim, ``overlap_backward=True``) offers the offload of one of them, once
    linked (:meth:`ParameterOffload.link_master`): the parameter's value IS the optimizer's
    fp32 master (one object on disk, written once per step, read by forward and backward).
    The offload calls, with the parameter ``p``:

    * ``master_key(p)``: the store key of ``p``'s master (its value);
    * ``before_access(p)``: before the offload reads or writes ``p``'s value in the store --
      ends (rolls back) an update of ``p`` started in backward and not yet committed by the
      step, since the stored master then holds the speculative value;
    * ``write_master(p, flat)``: stores ``flat`` (fp32, 1-d) as ``p``'s value (an edit of
      the materialized parameter written back);
    * ``take(p, grad) -> bool``: ``grad`` (1-d CPU, ``p``'s dtype) is ``p``'s final gradient
      of this backward; True when an update in backward took it (the offload then stores it
      only when ``keeps_grads``);
    * ``keeps_grads``: gradients taken are also stored, so that a redo (clipping, a skipped
      step, an edit of ``p.grad``) can read them;
    * ``edited(p)``: ``p.grad`` was changed after ``take`` (the update must be redone);
    * ``started(p) -> bool``: an update of ``p`` in backward runs, not yet committed (the
      prefetch does not fetch it: its value is not used again before the step).

    Documentation class: the optimizer's BackwardOverlap implements it.
    """


#: where each ParamRecord's ``version`` count starts: 2**32 counts apart (an int: no overflow)
_VERSION_STARTS = itertools.count(0, 1 << 32)


class ParamRecord:
    """One offloaded parameter: its store object, where its data is (``state``) and its
    gradient's bookkeeping (kept by the gradient store, offload/_grads.py).

    ``resident``: the tensor the parameter's data is while RESIDENT/ADOPTED (else None);
    ``pending``: the fetch in flight while FETCHING (an Event set by the fetch thread, or a
    collective fetch); ``version``: counts the changes of the stored value (a write-back, a
    step), from a start no other record has (:data:`_VERSION_STARTS`): a count names its
    record too, so an optimizer's mark ``("offloaded", version)`` of one offload's value is
    never matched by another offload's (offload/_parameter.py, ``restored_from``).
    """

    __slots__ = ("index", "name", "key", "grad_key", "shape", "dtype", "device", "numel",
                 "nbytes", "placeholder", "state", "resident", "pending", "fetched",
                 "fetch_error", "mark", "version", "has_grad", "grad_zero", "grad_finite",
                 "owned", "grad_norm", "to_store", "grad_ops", "grad_mem", "grad_mark",
                 "grad_dirty", "grad_obj", "param", "owner", "stride", "offloaded_from",
                 "link", "grad_early", "tile", "grad_acc32", "grad_obj32", "grad_sum",
                 "sum_norm", "sum_finite", "__weakref__")

    def __init__(self, index: int, name: str, key: str, p: torch.Tensor, owner: Any):
        self.index = index  # position in the model's named_parameters()
        self.name = name
        self.key = key
        self.grad_key = f"{key}#grad"
        self.shape = tuple(p.shape)
        self.dtype = p.dtype
        self.device = p.device
        self.numel = p.numel()
        self.nbytes = p.numel() * p.element_size()
        #: the data of a released parameter: one element expanded to the shape (so
        #: shape, size(), numel() and dim() stay true without a fetch)
        with torch.inference_mode(False):  # (offloaded under inference_mode: a normal tensor)
            self.placeholder = torch.zeros((), dtype=p.dtype, device=p.device).expand(self.shape)
        #: the materialized data's strides when the parameter was not contiguous (a
        #: channels_last conv weight, a transposed one); None: contiguous. The store object
        #: is always the value in row-major (logical) order.
        self.stride: Optional[Tuple[int, ...]] = dense_stride(p)
        self.state = Residency.RELEASED
        self.resident: Optional[torch.Tensor] = None
        self.pending: Any = None
        self.fetched: Optional[torch.Tensor] = None  # set by the fetch thread
        self.fetch_error: Optional[BaseException] = None
        self.mark = 0  # p._version when materialized or last stored
        self.version = next(_VERSION_STARTS)
        # the gradient's bookkeeping (offload/_grads.py, GradientStore's doc)
        self.has_grad = False  # a gradient of this step is in the store (grad_key)
        self.grad_zero = False  # ... zeroed by zero_grad(set_to_none=False): all zeros
        self.grad_finite: Optional[bool] = True  # None: unknown until read
        self.grad_norm: Optional[torch.Tensor] = None  # torch.norm(grad, 2), if known
        self.to_store = False  # gradients go to the store (a strata optimizer holds it)
        self.grad_ops: List[Tuple[str, Any]] = []  # p.grad.mul_(c)/div_(c) recorded
        self.grad_mem: Optional[torch.Tensor] = None  # the gradient materialized
        self.grad_mark = 0  # grad_mem._version when its norm was taken
        self.grad_dirty = False  # grad_mem differs from the stored gradient
        self.grad_obj: Any = None  # the OffloadedGrad p.grad returns
        # fp32 accumulation of an fp16/bf16 parameter's gradients (offload/_grad_sum.py)
        self.grad_acc32 = False  # micro-batch gradients are summed in fp32
        self.grad_obj32 = False  # the stored gradient object holds fp32 values
        self.grad_sum = False  # ... the fp32 sum, unedited: what the step takes
        self.sum_norm: Optional[torch.Tensor] = None  # torch.norm(sum, 2) (fp32, 0-d)
        self.sum_finite = True  # every element of the fp32 sum is finite
        self.param: Any = p
        self.owner = owner  # the ParameterOffload
        #: ((p._version, p.data_ptr()) just before the offload, whether the offload kept the
        #: stored value instead of p's -- resume), for an optimizer that held p in memory
        self.offloaded_from: Optional[Tuple[Tuple[int, int], bool]] = None
        #: the strata optimizer whose fp32 master of this parameter IS its value (an
        #: :class:`OptimizerLink`; None: the value is the object ``key``)
        self.link: Any = None
        #: the gradient of this step went to the linked optimizer's update in backward:
        #: "kept" (also stored, for a redo), "dropped" (not stored: its values are gone) or
        #: None (it is where the fields above say)
        self.grad_early: Optional[str] = None
        #: partitioned over ranks (a Communicator): the elements [begin, end) this rank's
        #: store holds (key + "#part"); None: the whole tensor is one object ``key``
        self.owned: Optional[Tuple[int, int]] = None
        #: the blocks of a tiled parameter (offload/_tiled.py, TileLayout); None: not tiled
        self.tile: Any = None

    def rename(self, name: str, key: str) -> None:
        """The parameter's name in the model and its store key (offload_init's temporary
        key replaced by the model's name)."""
        self.name, self.key, self.grad_key = name, key, f"{key}#grad"

    @property
    def value_key(self) -> str:
        """The store object holding the parameter's value: the linked optimizer's master,
        else its own object."""
        return self.link.master_key(self.param) if self.link is not None else self.key

    @property
    def state_numel(self) -> int:
        """Elements this rank steps: the owned slice when partitioned, else all."""
        return self.numel if self.owned is None else self.owned[1] - self.owned[0]
