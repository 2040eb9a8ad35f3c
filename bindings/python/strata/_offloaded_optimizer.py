"""strata.OffloadedOptimizer: the C++ ``strata::optimizer::OffloadedOptimizer``
(optimizer/include/strata/optimizer/offload.hpp) over a :class:`strata.Store`, one Python
method per method of the extension's ``_strata._OffloadedOptimizer``."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, Union

from . import _lifetime, _strata
from ._python_rule import PythonRule
from ._store import Future, Size, Store

#: ``count`` meaning "to the end of the tensor" (C++ ``optimizer::kToEnd``, 2^64 - 1)
_TO_END = (1 << 64) - 1


def _state_dtype_name(state_dtype: Any) -> str:
    """``state_dtype`` of create()/resume() as strata's dtype name: a str ("fp32", "bf16",
    "float32", "bfloat16") or a torch dtype (torch.float32 / torch.bfloat16; torch is not
    imported here). Other values go to the C++ check (InvalidArgumentError naming them)."""
    if isinstance(state_dtype, str):
        return state_dtype
    text = str(state_dtype)
    if text.startswith("torch."):
        return text[len("torch."):]
    raise TypeError(f"state_dtype must be a str or a torch dtype, got {state_dtype!r}")


class OffloadedOptimizer:
    """The offloaded optimizer of strata (C++ ``strata::optimizer::OffloadedOptimizer``):
    fp32 master weights and optimizer states in a :class:`Store`, updated on the CPU with
    NVMe reads and writes overlapped with the update. Framework-neutral (numpy arrays);
    :mod:`strata.torch` builds torch optimizers on it.

    Create with :meth:`create` (new) or :meth:`resume` (from a checkpoint); a parameter
    tensor is an int handle from :meth:`add_param`. Each method releases the GIL while it
    works. Arrays given to set_grad / set_param_copy stay referenced (and must stay
    unmodified during a step) until replaced. ``numel`` may be 0 (torch.optim accepts
    zero-size parameters): such a tensor has empty objects, and its step counter advances
    with each step while an (empty) gradient is attached, kept in the optimizer's
    checkpoint like any other. Once closed, the methods that step, read, write or change
    the optimizer raise FailedPreconditionError.
    """

    def __init__(self, impl: "_strata._OffloadedOptimizer", store: Store):
        self._o = impl
        self.store = store
        _lifetime.register(store, self)

    def close(self, checkpoint: bool = True) -> None:
        """The optimizer's last checkpoint, then its release (also by garbage collection,
        before its store closes, and at interpreter exit). A resume restores the state of
        the last :meth:`checkpoint` or close, whatever the tier: checkpoints when anything
        changed since the last one (``checkpoint=False``: releases without, as if the
        process were killed now). Idempotent; afterwards the other methods raise
        FailedPreconditionError.

        :raises ResourceExhaustedError, IoError: the checkpoint failed (e.g. disk full):
            everything is released all the same, and the last checkpoint stays the resume
            point.
        :raises FailedPreconditionError: a step failed part-way before (resume from the
            last checkpoint), or the store was closed first."""
        _lifetime.unregister(self.store, self)
        self._o.close(checkpoint)

    @classmethod
    def create(cls, store: Store, optimizer: str = "adamw",
               hyperparams: Optional[Dict[str, float]] = None, *, key_prefix: str = "optim/",
               sub_group_numel: int = 0, num_buffers: int = 4,
               pinned_budget: Optional[Size] = None, host_budget: Optional[Size] = None,
               default_placement: str = "auto", num_threads: int = 0,
               arithmetic: str = "simd",
               rule: Optional[PythonRule] = None,
               state_dtype: Any = "fp32") -> "OffloadedOptimizer":
        """A new optimizer ("adam", "adamw", "adagrad", "sgd", "lion") with param group 0
        from ``hyperparams`` (torch.optim names: lr, beta1, beta2, eps, weight_decay,
        amsgrad, maximize, ...; absent keys take torch's defaults).

        :param arithmetic: ``"simd"`` (default): the built-in vectorized kernels, each element
            within 1-2 ulp of torch; ``"torch"`` (adam/adamw only): element-wise rules that
            round exactly like torch.optim's CPU kernels (bit-identical parity runs; scalar,
            slower on large models).

        :param rule: a :class:`strata.PythonRule`: the update is that Python function
            (``optimizer`` and ``arithmetic`` are then ignored; ``hyperparams`` keys must be
            among the rule's ``defaults``).

        :param state_dtype: element type of the state streams in the store (moments):
            ``"fp32"`` (default) or ``"bf16"`` (also ``"bfloat16"``, ``torch.bfloat16``):
            bf16 moments ("bf16_optimizer_states"), read as bf16, widened to fp32 for the
            update (rules see fp32), rounded back to bf16 (nearest even) and written: a step
            moves 8 instead of 12 bytes per parameter each way for Adam (docs/offload.md,
            "bf16 moments"). Masters stay fp32; ``read_state`` returns the bf16 values as
            fp32, ``write_state`` rounds. Recorded in the checkpoint: ``resume`` must pass
            the same (FailedPreconditionError otherwise).

        :raises AlreadyExistsError: a checkpoint exists under ``key_prefix`` (use resume).
        :raises InvalidArgumentError: unknown optimizer or a bad hyperparameter/option.
        :raises DiskFullError: (OSError errno ENOSPC) the store's file system lacks the
            1 MiB the catalog needs (docs/offload.md, "Disk space").
        """
        return cls(_strata._OffloadedOptimizer.create(
            store._s, optimizer, dict(hyperparams or {}), False, key_prefix, sub_group_numel,
            num_buffers, pinned_budget, host_budget, default_placement, num_threads, False,
            arithmetic, rule, _state_dtype_name(state_dtype)), store)

    @classmethod
    def resume(cls, store: Store, optimizer: str = "adamw", *, key_prefix: str = "optim/",
               sub_group_numel: int = 0, num_buffers: int = 4,
               pinned_budget: Optional[Size] = None, host_budget: Optional[Size] = None,
               num_threads: int = 0, verify: bool = False,
               arithmetic: str = "simd",
               rule: Optional[PythonRule] = None,
               state_dtype: Any = "fp32") -> "OffloadedOptimizer":
        """Reopens the optimizer checkpointed under ``key_prefix`` (``rule``: the
        :class:`strata.PythonRule` it was made with, same name and number of states;
        ``state_dtype``: the one it was created with, see :meth:`create`).
        :raises NotFoundError: no checkpoint there.
        :raises FailedPreconditionError: the checkpoint's rule is another, or its state
            dtype is not ``state_dtype`` (the message names both)."""
        return cls(_strata._OffloadedOptimizer.create(
            store._s, optimizer, {}, True, key_prefix, sub_group_numel, num_buffers,
            pinned_budget, host_budget, "auto", num_threads, verify, arithmetic, rule,
            _state_dtype_name(state_dtype)), store)

    @staticmethod
    def remove(store: Store, *, key_prefix: str = "optim/", rule: Any = None) -> None:
        """Deletes the optimizer checkpointed under ``key_prefix`` in ``store``, and only it:
        its record and the objects of the parameters it lists (objects of another
        key_prefix, also one nested under this one, stay), then flushes the store. The
        optimizer must not be open meanwhile. Blocking (GIL released).

        :param rule: the :class:`strata.PythonRule` a checkpoint written with a Python rule
            was made with (as for :meth:`resume`); None for strata's own rules.
        :raises NotFoundError: no checkpoint under ``key_prefix``.
        :raises DataLossError: a malformed record.
        :raises InvalidArgumentError: a checkpoint of a Python rule and no ``rule``.
        :raises FailedPreconditionError: a read-only store, or a rule strata does not know.
        """
        _strata._OffloadedOptimizer.remove(store._s, key_prefix, rule)

    # ---- param groups ---------------------------------------------------------------------

    def add_param_group(self, hyperparams: Dict[str, float], /) -> int:
        """Adds a param group; keys absent from ``hyperparams`` take group 0's values.
        Returns the group index (1, 2, ...).
        :raises InvalidArgumentError: a bad or non-numeric hyperparameter."""
        return self._o.add_param_group(hyperparams)

    def num_param_groups(self) -> int:
        """The number of param groups (group 0 included)."""
        return self._o.num_param_groups()

    def hyperparams(self, group: int, /) -> Dict[str, float]:
        """The hyperparameters of ``group`` (booleans as 0.0 / 1.0).
        :raises OutOfRangeError: a bad group index."""
        return self._o.hyperparams(group)

    def set_hyperparams(self, group: int, hyperparams: Dict[str, float], /) -> None:
        """Merges ``hyperparams`` into the group's (keys present replace old values),
        effective from the next step; on error nothing changes.
        :raises OutOfRangeError: a bad group. :raises InvalidArgumentError: a bad value
            (e.g. lr < 0) or a non-numeric one."""
        self._o.set_hyperparams(group, hyperparams)

    # ---- tensors --------------------------------------------------------------------------

    def add_param(self, name: str, numel: int, init: Any = None, group: int = 0,
                  placement: str = "auto") -> int:
        """Adds a parameter tensor of ``numel`` fp32 elements (0 allowed) to ``group``, its
        states at the rule's initial values, its step counter 0; its objects are committed
        before this returns. Returns its handle (0, 1, ... in add order).

        :param name: unique, non-empty, printable ASCII without whitespace (used in keys).
        :param init: ``numel`` float32 host values (read during the call), or None: zeros.
        :param placement: "auto" (the create()'s default_placement, against host_budget),
            "host" or "nvme".
        :raises InvalidArgumentError: a bad/duplicate name, a bad group or placement, an
            ``init`` of another dtype or size, numel > (2^63-1)/4.
        :raises ResourceExhaustedError: DRAM or the NVMe tier (nvme_budget) is full;
            :class:`DiskFullError` (also OSError, errno ENOSPC) a file system lacks the disk
            space for the state with this tensor (the message names the directory, the need
            and the free bytes). :raises IoError:"""
        return self._o.add_param(name, numel, init, group, placement)

    def num_params(self) -> int:
        """The number of parameter tensors."""
        return self._o.num_params()

    def param_info(self, param: int, /) -> Dict[str, Any]:
        """``{"name", "numel", "placement" ("host" or "nvme"), "group", "step", "has_grad"}``
        of tensor ``param``. :raises OutOfRangeError: a bad handle."""
        return self._o.param_info(param)

    def find_param(self, name: str, /) -> int:
        """The handle of the tensor ``name``. :raises NotFoundError: no such tensor."""
        return self._o.find_param(name)

    def set_grad(self, param: int, grad: Any) -> None:
        """Attaches the gradient of ``param`` for the next steps: a host fp32/fp16/bf16
        array of its numel elements, kept referenced until replaced and unmodified during a
        step; None detaches (a tensor without one is not updated, like torch's grad None).
        :raises InvalidArgumentError: device memory, another dtype or size.
        :raises OutOfRangeError: a bad handle."""
        self._o.set_grad(param, grad)

    def set_grad_object(self, param: int, key: str, dtype: Any) -> None:
        """Attaches the gradient of NVMe-tier tensor ``param`` for the next steps as the
        object ``key`` of the optimizer's store: its numel elements of ``dtype`` ("float32",
        "float16", "bfloat16" or their short names, a torch dtype or a numpy dtype),
        row-major, the bytes :meth:`set_grad` would take (e.g. ``store.put(key, grad)``).
        Each step reads it sub-group by sub-group with the master and states (no memory of
        its size; ``bytes_read`` counts it), bit-identical to the same gradient in memory.
        It replaces a set_grad array; ``set_grad(param, None)``, ``set_grad`` and
        :meth:`clear_grads` replace or detach it. The object must not change during a step.
        The step cannot scan it: with one attached, ``max_grad_norm > 0`` or
        ``skip_if_nonfinite`` need ``grad_summary`` (else InvalidArgumentError naming the
        tensor, before anything changes).

        :raises InvalidArgumentError: a host-tier tensor, a dtype other than fp32/fp16/bf16,
            an object of another byte size (numel * element size) or recorded dtype.
        :raises NotFoundError: no object ``key`` in the store.
        :raises OutOfRangeError: a bad handle."""
        self._o.set_grad_object(param, key, dtype)

    def set_param_copy(self, param: int, dst: Any) -> None:
        """Makes every step that is not skipped write the updated weights of ``param`` to
        ``dst``, a writable host fp16/bf16 (rounded to nearest even) or fp32 (the master)
        array of its numel elements, kept referenced until replaced; None detaches.
        :raises InvalidArgumentError: device memory, read-only, another dtype or size.
        :raises OutOfRangeError: a bad handle."""
        self._o.set_param_copy(param, dst)

    def clear_grads(self) -> None:
        """Detaches every gradient."""
        self._o.clear_grads()

    # ---- stepping -------------------------------------------------------------------------

    def step(self, max_grad_norm: float = 0.0, grad_scale: float = 1.0,
             skip_if_nonfinite: bool = True,
             grad_summary: Optional[Tuple[float, bool, str]] = None) -> Dict[str, Any]:
        """One step of every tensor with a gradient: host tensors in place, then the NVMe
        pipeline; each updated tensor's step counter advances. Blocks until the step's
        writes are done (durable at the next :meth:`checkpoint`).

        :param max_grad_norm: > 0: clip by the global L2 norm like
            ``torch.nn.utils.clip_grad_norm_``; 0: no clipping.
        :param grad_scale: every gradient is multiplied by it first (e.g. 1/loss_scale).
        :param skip_if_nonfinite: skip the whole step when a gradient holds inf or NaN.
        :param grad_summary: the gate's inputs when the caller computed them over the step's
            gradients (not all attached at once, or torch's own norm): ``(grad_norm,
            nonfinite, arithmetic)`` -- the global L2 norm of every gradient (unscaled),
            whether any holds inf/NaN, and ``"strata"`` or ``"torch"`` (torch's fp32 norm:
            ``clip_grad_norm_``'s fp32 coefficient). The step then decides from these
            (C++ ``decide_gate``) without scanning the attached gradients. Default None.
        :returns: ``skipped``, ``grad_norm`` (NaN when not computed), ``clip_coef``,
            ``tensors_updated``, ``numel_updated``, ``bytes_read``, ``bytes_written`` (NVMe
            bytes), ``sub_groups``, ``seconds``, ``compute_seconds``, ``io_wait_seconds``,
            ``tensors_started_early``, ``early_seconds``, ``rolled_back`` (C++ StepStats).
        :raises IoError, DataLossError, ResourceExhaustedError: the store failed, naming the
            key; the tensors may then be partly updated, so checkpoint and close refuse
            (FailedPreconditionError): resume from the last checkpoint."""
        return self._o.step(max_grad_norm, grad_scale, skip_if_nonfinite, grad_summary)

    def step_async(self, max_grad_norm: float = 0.0, grad_scale: float = 1.0,
                   skip_if_nonfinite: bool = True,
                   grad_summary: Optional[Tuple[float, bool, str]] = None) -> Future:
        """As :meth:`step` on an internal thread: a :class:`Future` whose result is step()'s
        dict. Attached buffers must stay valid until it is done; other calls wait for it."""
        return self._o.step_async(max_grad_norm, grad_scale, skip_if_nonfinite, grad_summary)

    def begin_step(self, max_grad_norm: float = 0.0, grad_scale: float = 1.0,
                   skip_if_nonfinite: bool = True) -> None:
        """Opens a step overlapped with backward (docs/offload.md, C++ OVERLAPPED STEP) with
        the options of the :meth:`step` it stands for; :meth:`start_update` starts tensors
        early, :meth:`finish_step` completes it. While open, calls that change state fail.
        :raises FailedPreconditionError: one is open already. :raises InvalidArgumentError:"""
        self._o.begin_step(max_grad_norm, grad_scale, skip_if_nonfinite)

    def start_update(self, entries: Sequence[Tuple[int, Any, Any]]) -> None:
        """Starts, in the background and in order, the update of each ``(handle, grad,
        param_copy or None)`` of ``entries`` (their gradients final for this step): host
        fp32/fp16/bf16 arrays of the tensor's numel elements, kept referenced (and to stay
        unmodified) until finish_step()/abort_step(). Returns at once.
        :raises FailedPreconditionError: no step open, or a tensor started already.
        :raises InvalidArgumentError: an entry not of 3 items, or a bad array.
        :raises OutOfRangeError: a bad handle (an early I/O error: from finish_step)."""
        self._o.start_update(entries)

    def wait_started(self) -> None:
        """Waits until the early updates of every start_update() so far ran (or failed).
        :raises FailedPreconditionError: no step open."""
        self._o.wait_started()

    def finish_step(self, max_grad_norm: float = 0.0, grad_scale: float = 1.0,
                    skip_if_nonfinite: bool = True,
                    grad_summary: Optional[Tuple[float, bool, str]] = None) -> Dict[str, Any]:
        """Completes the open step, bit-identical to :meth:`step`: early updates kept when
        the step is neither skipped nor clipped and the options equal begin_step()'s, else
        rolled back and redone. Returns step()'s dict (``tensors_started_early``,
        ``early_seconds``, ``rolled_back`` tell what happened); ``grad_summary`` as step()'s.
        :raises FailedPreconditionError: no step open. :raises IoError, DataLossError: as
            step() or an early update's (then every early update is rolled back)."""
        return self._o.finish_step(max_grad_norm, grad_scale, skip_if_nonfinite, grad_summary)

    def abort_step(self) -> None:
        """Rolls back the open step's early updates and closes it (a no-op when none is
        open). :raises Error: the store's rollback error."""
        self._o.abort_step()

    def step_open(self) -> bool:
        """True between :meth:`begin_step` and finish_step()/abort_step()."""
        return self._o.step_open()

    # ---- state access (state_dict / load_state_dict) --------------------------------------

    def read_param(self, param: int, out: Any = None, offset: int = 0,
                   count: int = _TO_END) -> Any:
        """Elements [offset, offset + count) of the fp32 master of ``param`` (``count``
        default: to the end) into ``out`` (a writable host float32 array of count elements)
        or a new numpy array; returns it.
        :raises InvalidArgumentError: a bad ``out``, or offset/count not an int >= 0.
        :raises OutOfRangeError: a bad handle or range. Store errors for NVMe tensors."""
        return self._o.read_param(param, out, offset, count)

    def write_param(self, param: int, src: Any, offset: int = 0) -> None:
        """Overwrites the master of ``param`` from element ``offset`` with ``src`` (host
        float32); durable at the next :meth:`checkpoint`. :raises: as read_param."""
        self._o.write_param(param, src, offset)

    def read_state(self, param: int, stream: int, out: Any = None, offset: int = 0,
                   count: int = _TO_END) -> Any:
        """As :meth:`read_param` for state stream ``stream`` (0 <= stream < num_states(),
        named by :meth:`state_name`). :raises OutOfRangeError: also a bad stream."""
        return self._o.read_state(param, stream, out, offset, count)

    def write_state(self, param: int, stream: int, src: Any, offset: int = 0) -> None:
        """As :meth:`write_param` for state stream ``stream``.
        :raises OutOfRangeError: also a bad stream."""
        self._o.write_state(param, stream, src, offset)

    def step_count(self, param: int, /) -> int:
        """The step counter of ``param`` (torch ``state["step"]``).
        :raises OutOfRangeError: a bad handle."""
        return self._o.step_count(param)

    def set_step_count(self, param: int, step: int, /) -> None:
        """Restores the step counter of ``param`` (load_state_dict).
        :raises OutOfRangeError: a bad handle. :raises InvalidArgumentError: step < 0."""
        self._o.set_step_count(param, step)

    def num_states(self) -> int:
        """The number of fp32 state streams of the rule (Adam: 2, with amsgrad 3)."""
        return self._o.num_states()

    def state_name(self, i: int, /) -> str:
        """The name of state stream ``i`` (the torch state-dict key, e.g. "exp_avg")."""
        return self._o.state_name(i)

    def rule_name(self) -> str:
        """The rule name ("adam", "adamw", ...)."""
        return self._o.rule_name()

    # ---- durability -----------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Makes the state after the last completed step durable in place (host tensors to
        their objects, the record, one commit of the optimizer's keys); waits for a step in
        flight. On error the previous checkpoint stays the resume point.
        :raises IoError, ResourceExhaustedError: the store's errors.
        :raises FailedPreconditionError: closed, a closed store, or after a failed step."""
        self._o.checkpoint()

    # ---- counters and introspection -------------------------------------------------------

    def stats(self) -> Dict[str, Union[int, float]]:
        """The totals of the steps since create/resume or :meth:`reset_stats` (C++
        OptimizerStats, docs/offload.md "Stats"): ``steps``, ``steps_skipped``,
        ``steps_rolled_back``, ``sub_groups``, ``tensors_updated``, ``numel_updated``,
        ``bytes_read``, ``bytes_written``, ``step_seconds``, ``update_seconds``,
        ``io_wait_seconds``, ``early_seconds``, ``overlap`` = update / (update + io_wait)."""
        return self._o.stats()

    def reset_stats(self) -> None:
        """Zeroes the totals of :meth:`stats`."""
        self._o.reset_stats()

    def sub_group_numel(self) -> int:
        """The resolved pipeline sub-group size, elements per stream."""
        return self._o.sub_group_numel()

    def pinned_bytes(self) -> int:
        """Bytes of pinned memory of the pipeline."""
        return self._o.pinned_bytes()

    def host_bytes(self) -> int:
        """Bytes of DRAM held by host-tier tensors (masters + states)."""
        return self._o.host_bytes()

    # ---- disk space (docs/offload.md "Disk space") ----------------------------------------

    def disk_space(self, more_numels: Sequence[int] = ()) -> Dict[str, Any]:
        """The disk the state needs (tensors so far plus NVMe tensors of ``more_numels``
        elements) against the free space now, bytes: ``state_bytes`` (T), ``in_flight_bytes``,
        ``margin_bytes`` (1 MiB for the catalog, plus the gaps the store may leave to align
        large extents), ``need_bytes`` (2 T + in flight + margin), ``held_bytes``,
        ``free_bytes``; ``short_path`` ("" when it fits), ``short_need``, ``short_free``.
        :raises IoError: statvfs failed. :raises FailedPreconditionError: a closed store."""
        return self._o.disk_space(more_numels)

    def check_disk_space(self, more_numels: Sequence[int] = ()) -> None:
        """Returns when :meth:`disk_space` fits (e.g. a whole model before add_param).
        :raises DiskFullError: (OSError errno ENOSPC, a ResourceExhaustedError) it does not:
            the message names the directory, the bytes needed and the bytes free."""
        self._o.check_disk_space(more_numels)
