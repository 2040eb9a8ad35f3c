"""ParameterOffload: the handle of one model's offloaded parameters -- setup (storing
and naming them, attach, offload_init's parameters), the values the optimizer wing reads
and writes through it, statistics, checkpoint and close. Members: the working set
(offload/_working_set.py) and the gradient store (offload/_grads.py). The package doc
(strata/torch/offload/__init__.py) explains how parameters are materialized.

Thread-safety: one thread at a time (torch's forward/backward thread); the working set's
fetch thread is internal.
"""

from __future__ import annotations

import shutil
import weakref
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

import strata

from ..._data_dir import make_temp_dir
from .._common import announce_offload, no_torch_function as _no_tf
from .._trace import TRACE, traced
from ._args import (check_bool, check_comm, check_key_prefix, check_model, check_store_and_path,
                    check_tier, grad_host_budget_bytes, working_set_bytes)
from ._fastpath import FastPaths
from ._grad_access import GradAccess
from ._grads import GradientStore
from ._hooks import install_model_hooks, remove_hooks
from ._master_link import MasterLinks
from ._memory import ReleaseRule
from ._parameter import (holds_checkpoint_value, make_offloaded, make_plain, note_restored,
                         record_of)
from ._record import IN_MEMORY, ParamRecord, shaped
from ._tiled import plan_tile
from ._tiled_grads import TiledAccess, TiledGrads, put_zeros
from ._value_objects import ValueObjects
from ._working_set import WorkingSet


class ParameterOffload(GradAccess, MasterLinks, TiledAccess, ValueObjects):
    """What :func:`offload_parameters` returns: the offloaded parameters of one model.

    Attributes: ``store`` (the strata.Store), ``working_set_bytes`` (the budget, bytes),
    ``grad_host_budget`` (bytes), ``tier``, ``key_prefix``, ``comm`` (the Communicator of a
    ZeRO-3 job, None in one process). Members: ``ws`` (the WorkingSet: which parameters are
    in memory) and ``grads`` (the GradientStore: gradients a strata optimizer steps). See
    :meth:`stats` for the counters.

    The optimizer wing (strata.torch.optim) reaches offloaded parameters only through the
    public methods below: :meth:`state_numel`, :meth:`read_state`, :meth:`write`,
    :meth:`write_back`, :meth:`version`, :meth:`position`, :meth:`bind_optimizer`,
    :meth:`grad_info`, :meth:`read_grad`, :meth:`collect_grads`, :meth:`release_all`,
    :meth:`zero_grad`, and for the update inside backward :meth:`link_master`,
    :meth:`unlink_master`, :meth:`linked`, :meth:`master_view`, :meth:`stage`,
    :meth:`unstage`, :meth:`committed`. Checkpoint import/export (strata.torch.checkpoints)
    streams values through :meth:`value_object` / :meth:`overwrite_object`.
    """

    def __init__(self, store: Optional[strata.Store], path: Optional[str],
                 working_set: Union[int, str], tier: str, key_prefix: str, prefetch: bool,
                 resume: bool = False, comm: Any = None, average_gradients: bool = True,
                 tile_bytes: Optional[int] = None, grad_host_budget: Union[int, str] = 0,
                 release_memory: Optional[bool] = None):
        self._closed = True
        self._owns_store = False
        self._owned_dir: Optional[str] = None
        self._model: Optional[torch.nn.Module] = None
        path = check_store_and_path(store, path)
        tier, key_prefix = check_tier(tier), check_key_prefix(key_prefix)
        budget = working_set_bytes(working_set)
        for name, flag in (("prefetch", prefetch), ("resume", resume),
                           ("average_gradients", average_gradients)):
            check_bool(name, flag)
        comm = check_comm(comm)
        #: when glibc's mmap threshold is fixed (offload/_memory.py; release_memory)
        self.release_rule = ReleaseRule(release_memory)
        #: bytes of gradients held in host memory instead of the store (offload/_grad_host.py)
        self.grad_host_budget = grad_host_budget_bytes(grad_host_budget)
        #: parameters of more bytes are tiled (offload/_tiled.py); None: none
        self.tile_bytes = None if tile_bytes is None else working_set_bytes(tile_bytes,
                                                                            "tile_bytes")
        if resume and store is None and path is None:
            raise ValueError("offload_parameters(resume=True): pass the store or the path of "
                             "the earlier run (a temporary store holds nothing to resume)")
        if store is None:
            if path is None:
                path = self._owned_dir = make_temp_dir("params-")
            store = strata.Store.open(path, host_budget="64MiB", staging="64MiB",
                                      chunk_size="4MiB", durability="flush", create=not resume)
            self._owns_store = True
        self.store = store
        self.tier = tier
        self.key_prefix = key_prefix
        self.working_set_bytes = budget
        self._stats: Dict[str, float] = {}
        self.reset_stats()
        #: strata.distributed.Communicator of a ZeRO-3 job (None: one process)
        self.comm = comm if comm is not None and comm.size > 1 else None
        self.average_gradients = average_gradients
        self.ws = WorkingSet(store, budget, prefetch, self._stats, self.comm)
        self.grads = GradientStore(store, self.ws.records, tier, budget // 2, self.comm,
                                   average_gradients, self._stats, self.begin_backward,
                                   self.grad_host_budget)
        self._hook_handles: List[Any] = []
        #: the modules whose hooks are this offload's (offload/_hooks.py), weakly
        self.hooked_modules: List["weakref.ReferenceType[torch.nn.Module]"] = []
        self.fast = FastPaths(self)  # torch's fused fast paths (offload/_fastpath.py)
        self.tiled_grads = TiledGrads(self)
        self.block_reader: Any = None  # the block thread of tiled parameters (lazily)
        self.tile_reads: Any = None  # tiled uses, reads ahead (offload/_tile_reads.py; lazily)
        self.stats_ref = self._stats
        #: a deepcopy's offload (offload/_copy.py): the source's key_prefix (else None)
        self.copy_of_prefix: Optional[str] = None
        self._init_count = 0  # parameters offloaded by offload_init, not yet attached
        self._closed = False
        strata._lifetime.register(self.store, self)

    # ---- setup ---------------------------------------------------------------------------

    def _offload(self, p: torch.nn.Parameter, name: str, key: str,
                 store_value: Any = True) -> ParamRecord:
        """``p`` into the store as ``key`` (its current value; ``store_value`` False: the
        value stored there already is kept -- resume; "zeros": zeros, made without memory of
        its size -- a parameter built on the meta device) and released."""
        s = ParamRecord(len(self.ws.records), name, key, p, self)
        with _no_tf():
            s.offloaded_from = ((p._version, p.data_ptr()), not store_value)
            s.tile = plan_tile(p, self.tile_bytes if self.tier == "nvme" else None, self.comm,
                               self.working_set_bytes)
        if self.comm is not None:
            s.owned = self.comm.owned_range(s.numel)
        if store_value == "zeros":
            put_zeros(self, s, key)
        elif store_value:
            with _no_tf():
                src = p.detach().reshape(-1).contiguous()
                if src.device.type != "cpu":
                    src = src.cpu()
            if self.comm is None:
                self.store.put(key, src, tier=self.tier, overwrite=True)
            else:  # collective: each rank keeps its slice
                self.comm.put_partitioned(self.store, key, src, tier=self.tier, overwrite=True)
        self.ws.records.append(s)
        self.release_rule.note(s.nbytes)
        make_offloaded(p, s)
        return s

    def _copy_object(self, s: ParamRecord, key: str) -> None:
        """``s``'s stored value (this rank's part) also as ``key``."""
        bf16 = "bf16" if s.dtype == torch.bfloat16 else None
        if s.tile is not None:  # block by block: never the whole value in memory
            return self.tiled_grads.copy_value(s, key)
        if self.comm is None:
            self.store.put(key, self.store.get(s.key), tier=self.tier, overwrite=True, dtype=bf16)
            return
        part = (self.store.get(s.key + "#part") if s.state_numel else
                torch.empty(0, dtype=s.dtype))
        self.comm.put_partitioned_slice(self.store, key, part, s.shape,
                                        dtype=bf16 if not torch.is_tensor(part) else None,
                                        tier=self.tier, overwrite=True)

    def _delete_object(self, s: ParamRecord) -> None:
        if self.comm is None:
            self.store.delete(s.key)
        else:
            import strata.distributed as sd
            sd.remove_partitioned(self.store, s.key)

    def init_offload(self, p: torch.nn.Parameter, zeros: bool = False) -> None:
        """offload_init: a parameter just registered by a module under construction
        (``zeros``: stored as zeros, its data not read -- one made from a meta tensor)."""
        if record_of(p) is not None or not p.is_floating_point() or p.is_sparse:
            return
        self._init_count += 1
        s = self._offload(p, f"#init{self._init_count}",
                          f"{self.key_prefix}#init/{self._init_count}",
                          store_value="zeros" if zeros else True)
        s.offloaded_from = None  # no optimizer can have held it

    def attach(self, model: torch.nn.Module, resume: bool = False,
               overwrite: bool = False) -> "ParameterOffload":
        """Makes ``model``'s parameters this offload's, named as ``model.named_parameters()``
        (see :func:`offload_parameters` for the arguments and errors): parameters
        offloaded by :func:`offload_init` are renamed (copied to their named keys, one at a
        time), the others are stored now. Installs the model's hooks. Then each strata
        optimizer that already holds a parameter binds it (strata/torch/_common.py
        ``announce_offload``): its gradients go to the store from the next backward on,
        fp16/bf16 ones summed in fp32, and one already in ``p.grad`` goes there now
        (:meth:`adopt_grad`). Once per offload.

        :returns: self.
        """
        self._check_open()
        check_bool("resume", resume)
        check_bool("overwrite", overwrite)
        if self._model is not None:
            raise ValueError("offload_parameters: this ParameterOffload has a model already")
        named = check_model(self, model, resume, overwrite)
        self.ws.release_all()
        old = {id(s.param): s for s in self.ws.records}
        records: List[ParamRecord] = []
        for i, (n, p) in enumerate(named):
            key = f"{self.key_prefix}{n}"
            s = old.pop(id(p), None)
            if s is None:  # resume: the stored value is the parameter's, not the model's
                # (unless it holds a resumed optimizer checkpoint's master: see
                # offload/_parameter.py, note_checkpoint_value)
                s = self._offload(p, n, key,
                                  store_value=not resume or holds_checkpoint_value(p))
                self.ws.records.pop()
            elif s.key != key:  # from offload_init: to its named key
                if not resume:
                    self._copy_object(s, key)
                self._delete_object(s)
                s.rename(n, key)
                self.tiled_grads.forget(s)
            s.index = i
            records.append(s)
        for s in old.values():  # made under offload_init but not in the model: back home
            self._restore(s)
            self._delete_object(s)
        self.ws.records[:] = records
        self.store.flush()
        self._model = model
        install_model_hooks(self, model)
        for s in records:  # strata optimizers holding a parameter bind it now (_common.py)
            announce_offload(s.param)
        return self

    # ---- forward / backward --------------------------------------------------------------

    def _forward_begin(self, module: torch.nn.Module, inputs: Any) -> None:
        self.fast.restore_stale()
        if TRACE.refresh(): TRACE.phase_begin("forward")  # noqa: E701
        self.ws.begin_phase(("forward", module.training, torch.is_grad_enabled()))

    def _forward_end(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        self.ws.end_phase()
        if TRACE.on: TRACE.phase_end()  # noqa: E701

    def begin_backward(self) -> None:
        """Backward started using this offload's parameters (a gradient hook or a saved
        parameter's unpack): the working set follows the backward trace."""
        if self.ws.phase != ("backward",):
            if TRACE.on: TRACE.backward_begin()  # noqa: E701
            self.ws.begin_phase(("backward",))

    # ---- values --------------------------------------------------------------------------

    def _record(self, p: Any) -> ParamRecord:
        s = record_of(p)
        if s is None or s.owner is not self:
            raise KeyError("not a parameter offloaded by this ParameterOffload")
        return s

    def read(self, p: torch.Tensor) -> torch.Tensor:
        """The current value of offloaded parameter ``p`` (a new CPU tensor of its shape and
        dtype; the materialized data when it is in memory, else read from the store).

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        if s.state in IN_MEMORY:
            with _no_tf():
                return s.resident.detach().cpu().clone()
        return self.ws.read(s).view(s.shape)

    def read_state(self, p: torch.Tensor) -> torch.Tensor:
        """What an optimizer of this rank steps of ``p``: its value (flat) in one process,
        this rank's slice with a communicator (no collective). A new 1-d CPU tensor of
        ``state_numel(p)`` elements of ``p``'s dtype.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        if s.owned is None:
            return self.read(p).reshape(-1)
        b, e = s.owned
        if s.state in IN_MEMORY:
            with _no_tf():
                return s.resident.detach().reshape(-1)[b:e].cpu().clone()
        return self.ws.read_part(s)

    def offloaded_from(self, p: torch.Tensor) -> Optional[Tuple[Tuple[int, int], bool]]:
        """How ``p`` became offloaded, for an optimizer that held it in memory before:
        ``((version, data_ptr), resumed)`` -- ``p._version`` and ``p.data_ptr()`` just before
        the offload (equal to what the optimizer recorded when ``p`` was not changed in
        memory since), and whether its value is the stored one of an earlier run
        (``resume=True``) rather than ``p``'s; None for a parameter made under offload_init.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self._record(p).offloaded_from

    def state_numel(self, p: torch.Tensor) -> int:
        """Elements of read_state(p): all of ``p``'s, or this rank's slice (ZeRO-3).

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self._record(p).state_numel

    def name_of(self, p: torch.Tensor) -> str:
        """``p``'s name in the model (``named_parameters()``). :raises KeyError: not one of
        this offload's parameters."""
        return self._record(p).name

    def position(self, p: torch.Tensor) -> int:
        """``p``'s position in the model's ``named_parameters()`` (the order
        ``clip_grad_norm_(model.parameters())`` stacks gradient norms in).

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self._record(p).index

    @traced("write", "store")
    def write(self, p: torch.Tensor, value: torch.Tensor) -> None:
        """Stores ``value`` (any dtype, converted; ``state_numel(p)`` elements: the whole
        parameter, or this rank's slice with a communicator) as ``p``'s value; a
        materialized copy is updated (one process) or released (ranks: the other slices
        change too). Used by the optimizer's step and resume. No collective. Linked
        (:meth:`link_master`): written into the optimizer's master."""
        s = self._record(p)
        with _no_tf():
            flat = value.detach().reshape(-1).to(dtype=s.dtype, device="cpu").contiguous()
        if flat.numel() != s.state_numel:
            raise ValueError(f"offloaded parameter {s.name!r}: {flat.numel()} elements "
                             f"written, {s.state_numel} expected")
        s.version += 1
        if s.link is not None:
            self.ws.touch(s)
            s.link.write_master(p, flat.to(torch.float32))
            self._stats["param_bytes_written"] += flat.numel() * 4  # the fp32 master
            self.ws.set_value(s, flat)
            return
        self._stats["param_bytes_written"] += flat.numel() * flat.element_size()
        if s.owned is None:
            self.store.put(s.key, flat, tier=self.tier, overwrite=True)
            self.ws.set_value(s, flat)
            return
        if flat.numel():
            self.store.put(s.key + "#part", flat, tier=self.tier, overwrite=True)
        self.ws.release(s, write_back=False)

    def write_back(self) -> None:
        """Stores every materialized parameter changed in place since it was fetched."""
        for s in self.ws.records:
            self.ws.write_back(s)

    def release_all(self) -> None:
        """Every parameter released from memory (changed ones stored first), every fetch in
        flight finished: what a step that rewrites every value does first."""
        self.fast.restore_stale()
        self.ws.release_all()

    def version(self, p: torch.Tensor) -> int:
        """Counts the changes of ``p``'s stored value (edits written back, steps).

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self._record(p).version

    @property
    def parameters(self) -> List[Tuple[str, torch.nn.Parameter]]:
        """(name, parameter) of every offloaded parameter, in the model's order."""
        return [(s.name, s.param) for s in self.ws.records]

    # ---- statistics ----------------------------------------------------------------------

    def reset_stats(self) -> None:
        """Sets every counter of :meth:`stats` to zero."""
        for k in ("bytes_fetched", "fetch_seconds", "stall_seconds", "prefetch_hits",
                  "prefetch_misses", "resident_hits", "trace_mismatches",
                  "peak_working_set_bytes", "bytes_written_back", "param_bytes_written",
                  "grad_bytes_written", "grad_bytes_read", "tile_blocks_fetched",
                  "tile_fetch_seconds", "tile_stall_seconds", "tile_blocks_ahead"):
            self._stats[k] = 0 if not k.endswith("seconds") else 0.0

    def stats(self) -> Dict[str, Any]:
        """Counters since the last :meth:`reset_stats` (a new dict):

        ``bytes_fetched`` (parameter bytes read from the store, int), ``bytes_fetched_<tier>``
        (the same, by the tier holding them), ``fetch_seconds`` (time spent reading them,
        seconds, on whichever thread read), ``stall_seconds`` (time forward/backward waited
        for a parameter), ``prefetch_hits`` (uses found in flight or fetched ahead),
        ``prefetch_misses`` (uses fetched on demand), ``resident_hits`` (uses found in
        memory), ``trace_mismatches`` (phases whose order differed from the trace),
        ``peak_working_set_bytes`` (most materialized + in-flight bytes at once),
        ``working_set_bytes`` (the budget), ``bytes_written_back`` (edited parameters
        stored), ``param_bytes_written`` (parameter values stored by :meth:`write`: an
        optimizer's step or resume, bytes; none for a linked parameter whose step wrote
        its master, which the optimizer's own bytes_written counts), ``grad_bytes_written`` / ``grad_bytes_read``
        (gradients to / from the store, bytes), ``grad_host_bytes`` (gradients held in
        memory now instead of the store, at most ``grad_host_budget``); tiled parameters
        (offload/_tiled.py):
        ``tile_blocks_fetched`` (blocks read, their bytes also in ``bytes_fetched``),
        ``tile_fetch_seconds`` (time reading them, on the block thread),
        ``tile_stall_seconds`` (time the operators waited for a block or rows),
        ``tile_blocks_ahead`` (blocks an operator found read ahead of its use, also in
        ``tile_blocks_fetched``; offload/_tile_reads.py).
        """
        out = dict(self._stats)
        out[f"bytes_fetched_{self.tier}"] = out["bytes_fetched"]
        out["working_set_bytes"] = self.working_set_bytes
        out["resident_bytes"] = self.ws.resident_bytes
        out["grad_host_bytes"] = self.grads.host.used
        return out

    # ---- lifetime ------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Makes the parameters durable: edits written back, the store flushed. (A strata
        optimizer's checkpoint() holds the masters the parameters resume from; call both,
        or only the optimizer's: its resume writes the masters into the parameters.)"""
        self._check_open()
        self.fast.restore_stale()
        self.write_back()
        for s in self.ws.records:  # linked: their own objects get the masters' values
            if s.link is not None:
                self.ws.touch(s)
                self.store.put(s.key, self.store.get(s.value_key), tier=self.tier,
                               overwrite=True)
        self.store.flush()

    @property
    def closed(self) -> bool:
        """close() was called (or setup failed)."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise strata.FailedPreconditionError("ParameterOffload is closed")

    def close(self, restore: bool = True) -> None:
        """Ends the offload. ``restore``: the parameters get their values back in memory
        (plain ``torch.nn.Parameter`` objects again, the same objects; a deepcopy's offload
        then deletes its store objects, see offload/_copy.py); else they keep only their
        stored values (the store stays usable with resume=True). Idempotent. A strata optimizer
        over the parameters goes on in memory: a restored parameter, unchanged since, keeps
        the optimizer's fp32 master (an fp16/bf16 value is its rounding: offload/_parameter.py,
        restored_from); one changed after the close is taken as the master, as ever. With
        ``restore``, a gradient a strata optimizer held in the store (or in host memory) is
        ``p.grad`` again, as ``p.grad`` showed it (an fp32 sum of an fp16/bf16 parameter
        rounded to its dtype), so accumulation goes on as torch's would; not for tiled
        parameters, over ranks (ZeRO-3: a rank holds only its slice of the sum), or for a
        gradient the update in backward took unstored (overlap_backward without
        max_grad_norm): those are dropped."""
        if self._closed:
            return
        self._closed = True
        error: Optional[BaseException] = None
        try:
            self.flush_grads()
            held = {}  # record index -> the gradient p.grad showed (flat), given back below
            if restore and self.comm is None:
                for s in self.ws.records:
                    if s.to_store and s.has_grad and s.tile is None and s.grad_early != "dropped":
                        held[s.index] = self.grads.read(s)
            self.grads.unbind_all()  # a strata optimizer over the parameters goes on in memory
            self.fast.restore_stale()
            self.ws.release_all()
            for s in self.ws.records:
                self.unlink_master(s.param)
            self.ws.stop()
            if self.tile_reads is not None:
                self.tile_reads.close()
            if self.block_reader is not None:
                self.block_reader.shutdown()
            for h in self._hook_handles:
                h.remove()
            remove_hooks(self)
            if restore:
                for s in self.ws.records:
                    self._restore(s)
                    g = held.get(s.index)
                    if g is not None:
                        with _no_tf():
                            s.param.grad = shaped(s, g).to(s.device)
                    if self.copy_of_prefix is not None:  # a deepcopy's objects: temporary
                        self._delete_object(s)
            self.store.flush()
        except BaseException as e:  # noqa: BLE001 (raised after the release)
            error = e
        strata._lifetime.unregister(self.store, self)
        self._close_store()
        if error is not None:
            raise error

    def _restore(self, s: ParamRecord) -> None:
        """``s``'s parameter in memory again, a plain torch.nn.Parameter (same object); an
        optimizer whose master it is the rounding of keeps that master (restored_from)."""
        make_plain(s.param, shaped(s, self.ws.read(s).to(s.device)))
        note_restored(s.param, s.version)

    def _close_store(self) -> None:
        if self._owns_store and self.store is not None and not self.store.closed:
            self.store.close()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    def __enter__(self) -> "ParameterOffload":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
