"""OffloadOptimizer: any element-wise torch.optim optimizer -- or a custom
:class:`~strata.torch.optim.UpdateRule` -- with its state in a strata store, stepped by
strata's offloaded pipeline (optimizer/offload.hpp) through a Python update rule
(strata.PythonRule, bindings/python/src/py_rule.cpp): for each streamed slice the class's
own ``step()`` runs on torch views of the slice (optim/_slice_step.py), so training is
bit-identical to the class in memory.

Layout in the store (``key_prefix``): the C++ optimizer's objects, one tensor ``p<i>`` per
parameter (i = its index in param_groups order), and an internal tensor
``torch-record-<n>`` holding a JSON record (param_groups' hyperparameters, the per-tensor
scalar state) committed with every checkpoint.

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

import shutil
from typing import Any, Dict, Iterable, List, Optional

import torch

import strata

from ..._data_dir import make_temp_dir
from ..offload import is_offloaded, note_checkpoint_value
from . import _any_offloaded as aof
from . import _settings
from . import _slice_step as ss
from ._exchange import bump_version
from ._any_io import _RECORD, AnyCheckpointMethods, master_numpy
from ._any_state import AnyStateView, decode_record, weak_callback as _callback, weak_method as _weak
from ._grad_accum import GradAccumulation, check_option
from ._rule import UpdateRule


class OffloadOptimizer(AnyCheckpointMethods, torch.optim.Optimizer):
    """``OffloadOptimizer(torch.optim.RMSprop, model.parameters(), lr=1e-2, path=...,
    tier="nvme")``: the optimizer class's arithmetic, its state (every element-wise state
    tensor, fp32 or ``state_dtype``) in a strata store, streamed sub-group by sub-group (reads, update,
    writes overlapped) at each ``step()``.

    Supported: torch.optim's SGD (momentum, dampening, nesterov, weight_decay, maximize),
    Adagrad, RMSprop (centered, momentum), Adadelta, Adamax, NAdam, RAdam, ASGD, Rprop,
    Adam, AdamW; and :class:`~strata.torch.optim.UpdateRule` (custom rules). Refused:
    LBFGS, SparseAdam (ValueError saying why), other classes, sparse gradients.

    What it keeps of torch's contract: ``param_groups`` (its hyperparameters are read at
    each step: schedulers and edits work; adding, removing or moving parameters does not,
    ValueError); ``state_dict()`` in the class's own format, loadable into the class in
    memory, and ``load_state_dict()`` of the class's state dicts; a closure is evaluated
    once (as every supported class does). Parameters must be contiguous fp32, fp16 or bf16
    CPU tensors: the state and an fp32 master of each are in the store, the class's step
    runs on the masters, and fp16/bf16 parameters receive the updated master rounded to
    nearest even (docs/guide-optimizers.md, "Mixed precision"); parameters changed outside
    the optimizer (``model.load_state_dict``, ``p.copy_()``)
    are stepped from their new value (``p.data`` edits in place are not seen).
    ``optimizer.state[p]`` reads p's state from the store (copies, optim/_any_state.py).
    Parameters offloaded by ``strata.torch.offload_parameters`` are stepped through the
    offload's store as OffloadAdam steps them: gradients read from it, new values stored
    there, in batches bounded by its working set (optim/_any_offloaded.py).

    :param optimizer_class: a torch.optim class, or an UpdateRule.
    :param params: as torch.optim (tensors or param-group dicts).
    :param hyperparams: the class's keyword arguments (``lr=...``), checked by the class.
    :param store: a :class:`strata.Store` (not closed by the optimizer), or None: a store
        at ``path`` (default: a temporary directory, removed by :meth:`close`).
    :param tier: "nvme" (default), "host" or "auto" (strata placement of every tensor).
        None (the default of this and of ``sub_group_numel``, ``num_buffers``,
        ``num_threads``, ``state_dtype``): the configuration file's value, else the default.
    :param key_prefix: prefix of the optimizer's keys in the store.
    :param resume: reopen the checkpoint under ``key_prefix`` (same class, same parameters
        in the same order and groups): masters are copied into the parameters, and the
        checkpoint's hyperparameters replace the given ones (as load_state_dict).
    :param overwrite: delete a checkpoint under ``key_prefix`` first.
    :param sub_group_numel, num_buffers, num_threads, chunk_size: pipeline settings
        (strata.OffloadedOptimizer.create; ints >= 0, 0 = auto; defaults 0, 4, 0; the
        chunk size of a store the optimizer opens, default its configuration's).
    :param config: a strata configuration file (docs/configuration.md; default: the one
        ``store`` was opened with, else ``$STRATA_CONFIG``): its "optimizer" section's
        ``default_placement``, ``sub_group_numel``, ``num_buffers``, ``num_threads`` and
        ``state_dtype`` are the defaults of those arguments (an argument given wins; its
        other keys are OffloadAdam(W)'s), and a store the optimizer opens takes its "store"
        and "io" sections. ``optimizer.settings`` shows what is in effect: tier,
        sub_group_numel, num_buffers, num_threads, state_dtype ("fp32" / "bf16"), config.
    :param grad_accumulation_dtype: ``torch.float32`` (default: the micro-batch gradients
        of fp16/bf16 parameters are summed in fp32, optim/_grad_accum.py) or ``"param"``
        (torch's accumulation in the parameter's dtype); as OffloadAdam's.
    :param state_dtype: element type of the state tensors in the store: ``torch.float32``
        (default; also None, "fp32") or ``torch.bfloat16`` ("bf16"; 2 bytes per element
        instead of 4, masters stay fp32): each step the class's step runs on the states
        widened to fp32 and they are rounded back to bf16 (nearest even), exactly the
        class in memory with its state tensors rounded to bf16 after every step. For the
        classes whose state is moments (SGD, RMSprop, Adadelta, Adamax, NAdam, RAdam, Adam,
        AdamW) and UpdateRules; refused for Adagrad, ASGD and Rprop (ValueError saying
        why). ``state[p]``/``state_dict()`` show fp32 tensors of bf16 values; loaded
        state is rounded to bf16. Recorded in the checkpoint: ``resume`` passes the same
        (strata.FailedPreconditionError naming both otherwise).
    :raises TypeError, ValueError: a class that is not supported (naming why), the class's
        own argument errors, a bad ``state_dtype`` or bf16 for a refused class, an unknown
        tier or a count that is not an int >= 0 (naming it), a parameter that is not a contiguous fp32/fp16/bf16 CPU tensor
        (naming its index), a parameter offloaded with a communicator (ZeRO-3; ValueError:
        use OffloadAdam/OffloadAdamW), a bad ``grad_accumulation_dtype``,
        ``resume`` without store/path or with other parameters.
    :raises strata.Error: the store's errors (AlreadyExistsError: a checkpoint is there and
        neither resume nor overwrite was given); InvalidArgumentError: a malformed
        configuration file (naming the file, the key and the value; NotFoundError: none).
    """

    _grad_scale = None  #: 1/loss scale while a DynamicLossScaler steps (optim/_loss_scale.py)

    def __init__(self, optimizer_class: Any, params: Iterable[Any], *,
                 store: Optional[strata.Store] = None, path: Optional[str] = None,
                 tier: Optional[str] = None, key_prefix: str = "optim/", resume: bool = False,
                 overwrite: bool = False, sub_group_numel: Optional[int] = None,
                 num_buffers: Optional[int] = None, num_threads: Optional[int] = None,
                 chunk_size: Any = None, grad_accumulation_dtype: Any = None,
                 state_dtype: Any = None, config: Optional[str] = None, **hyperparams: Any):
        self._core: Optional[strata.OffloadedOptimizer] = None
        self._accum: Optional[GradAccumulation] = None
        self._closed = False
        self._initial: Dict[int, Dict[str, Any]] = {}
        self._owned_dir: Optional[str] = None
        self._owns_store = False
        self.store: Optional[strata.Store] = None
        self._rule: Optional[UpdateRule] = None
        self._cls: Any = None
        if isinstance(params, torch.Tensor):  # as torch.optim.Optimizer refuses it
            raise TypeError("params argument given to the optimizer should be an iterable "
                            "of Tensors or dicts, but got " + torch.typename(params))
        params = list(params)
        mode = check_option(grad_accumulation_dtype)
        if isinstance(optimizer_class, UpdateRule):
            self._rule = optimizer_class
            unknown = sorted(set(hyperparams) - set(self._rule.defaults))
            if unknown:
                raise TypeError(f"OffloadOptimizer: rule {self._rule.name!r} has no "
                                f"hyperparameter {unknown[0]!r}")
            super().__init__(params, {**self._rule.defaults, **hyperparams})
            kind = f"rule:{self._rule.name}"
        else:
            ss.check_class(optimizer_class)
            self._cls = optimizer_class
        #: the settings in effect (optim/_settings.py: argument, else the file, else default)
        self.settings: Dict[str, Any] = _settings.resolve_any(config, store, dict(
            tier=tier, sub_group_numel=sub_group_numel, num_buffers=num_buffers,
            num_threads=num_threads, state_dtype=state_dtype))
        s = self.settings
        state_dtype = s["state_dtype"] = ss.state_dtype_name(s["state_dtype"], self._cls)
        if self._cls is not None:
            reference = optimizer_class(params, **hyperparams)  # the class's own checks
            groups = [{k: v for k, v in g.items()} for g in reference.param_groups]
            defaults = dict(reference.defaults)
            # State a class makes at construction (Adagrad: step 0, sum filled with
            # initial_accumulator_value): what state[p] / state_dict() show before p's
            # first step, kept small (a filled tensor as its value).
            self._initial = {id(p): ss.compact_state(st) for p, st in reference.state.items()
                             if st}
            del reference
            super().__init__(groups, defaults)
            kind = f"torch.optim.{optimizer_class.__name__}"
        self._kind = kind
        self._params: List[torch.Tensor] = [p for g in self.param_groups for p in g["params"]]
        aof.check_params(self._params)
        self._layout = self._current_layout()
        self._stream_cache: Dict[str, List[str]] = {}
        self._streams = self._union_streams()
        self._scalars: Dict[int, Dict[str, Any]] = {}  # handle -> scalar state (has state)
        self._pending: Dict[int, Dict[str, Any]] = {}
        self._record_handle: Optional[int] = None
        if resume and store is None and path is None:
            raise ValueError("OffloadOptimizer: resume=True needs the store or path of the "
                             "checkpoint")
        try:
            self._open(store, path, s["tier"], key_prefix, resume, overwrite, chunk_size,
                       dict(sub_group_numel=s["sub_group_numel"], num_buffers=s["num_buffers"],
                            num_threads=s["num_threads"], state_dtype=state_dtype))
        except BaseException:
            self.close()
            raise
        #: fp32 sums of fp16/bf16 parameters' micro-batch gradients (optim/_grad_accum.py;
        #: offloaded parameters': their offload's, offload/_grad_sum.py)
        self._accum = GradAccumulation(mode)
        self._accum.watch(self._params)
        aof.prepare(self._params, mode == "float32")
        #: torch's per-parameter state, read from the store (optim/_any_state.py)
        self.state = AnyStateView(_weak(self, "_entry"), _weak(self, "_with_state"))  # type: ignore
        strata._lifetime.register(self.store, self)

    # ---- setup ---------------------------------------------------------------------------

    def _open(self, store, path, tier, key_prefix, resume, overwrite, chunk_size, pipeline):
        if store is None:
            self._owns_store = True
            if path is None:
                path = self._owned_dir = make_temp_dir("optim-")
            store = strata.Store.open(path, host_budget="64MiB", staging="64MiB",
                                      chunk_size=chunk_size, create=not resume,
                                      config=self.settings["config"])
        self.store = store
        rule = strata.PythonRule(name=self._kind, update=_callback(self),
                                 state_names=tuple(self._streams))
        if overwrite and not resume:
            try:
                strata.OffloadedOptimizer.remove(store, key_prefix=key_prefix, rule=rule)
            except strata.NotFoundError:
                pass
        if resume:
            try:
                self._core = strata.OffloadedOptimizer.resume(store, key_prefix=key_prefix,
                                                              rule=rule, **pipeline)
            except strata.FailedPreconditionError as e:
                if "state streams" not in str(e):
                    raise
                raise ss.resume_streams_error(e, self._streams) from e
        else:
            self._core = strata.OffloadedOptimizer.create(
                store, key_prefix=key_prefix, default_placement=tier, rule=rule, **pipeline)
        core = self._core
        self._handle: Dict[int, int] = {}
        self._group_of: Dict[int, int] = {}
        self._by_handle: Dict[int, torch.Tensor] = {}
        if resume:
            self._resume(core)
        else:
            for i, p in enumerate(self._params):
                h = (aof.add(core, f"p{i}", p) if is_offloaded(p) else
                     core.add_param(f"p{i}", p.numel(), master_numpy(p)))
                self._bind(i, p, h)
        self._seen = {h: self._signature(p) for h, p in self._by_handle.items()}

    def _bind(self, i: int, p: torch.Tensor, h: int) -> None:
        self._handle[id(p)] = h
        self._by_handle[h] = p
        self._group_of[h] = next(gi for gi, g in enumerate(self.param_groups)
                                 if any(q is p for q in g["params"]))
        if not is_offloaded(p):  # (an offloaded one's copy: a buffer at each step)
            self._core.set_param_copy(h, p.detach().view(-1))  # fp16/bf16: rounded by strata

    def _master_into(self, h: int, p: torch.Tensor) -> None:
        """The fp32 master of handle ``h`` into ``p`` (fp16/bf16: rounded to nearest
        even, as strata's parameter copy; offloaded: into its store)."""
        if is_offloaded(p):
            aof.master_into(self._core, h, p)
            return
        with torch.no_grad():
            if p.dtype == torch.float32:
                self._core.read_param(h, out=p.detach().view(-1).numpy())
            else:
                p.detach().view(-1).copy_(torch.from_numpy(self._core.read_param(h)))

    def _resume(self, core: strata.OffloadedOptimizer) -> None:
        by_name = {core.param_info(h)["name"]: h for h in range(core.num_params())}
        records = sorted((n for n in by_name if n.startswith(_RECORD)),
                         key=lambda n: int(n[len(_RECORD):]))
        want = sum(1 for n in by_name if not n.startswith(_RECORD))
        if want != len(self._params):
            raise ValueError(f"OffloadOptimizer resume: the checkpoint has {want} parameters, "
                             f"the model gives {len(self._params)}")
        for i, p in enumerate(self._params):
            h = by_name[f"p{i}"]
            if core.param_info(h)["numel"] != p.numel():
                raise ValueError(f"OffloadOptimizer resume: parameter {i} has "
                                 f"{p.numel()} elements, the checkpoint's "
                                 f"{core.param_info(h)['numel']}")
            self._bind(i, p, h)
        if records:
            self._record_handle = by_name[records[-1]]
            rec = decode_record(core.read_param(self._record_handle))
            if len(rec["groups"]) != len(self.param_groups):
                raise ValueError(f"OffloadOptimizer resume: the checkpoint has "
                                 f"{len(rec['groups'])} param groups, the model "
                                 f"{len(self.param_groups)}")
            for g, saved in zip(self.param_groups, rec["groups"]):
                for k, v in saved.items():
                    g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
            self._scalars = {int(h): ss.scalars_from_record(s)
                             for h, s in rec["scalars"].items()}
        for h, p in self._by_handle.items():
            self._master_into(h, p)
            if not is_offloaded(p):  # a later offload_parameters(resume=True) keeps it
                bump_version(p)
                note_checkpoint_value(p)

    def _current_layout(self) -> List[List[int]]:
        return [[id(p) for p in g["params"]] for g in self.param_groups]

    def _group_streams(self, group: Dict[str, Any]) -> List[str]:
        if self._rule is not None:
            return list(self._rule.states)
        key = repr(sorted((k, repr(v)) for k, v in group.items() if k != "params"))
        if key not in self._stream_cache:
            self._stream_cache[key] = ss.stream_names(self._cls, group)
        return self._stream_cache[key]

    def _union_streams(self) -> List[str]:
        out: List[str] = []
        for g in self.param_groups:
            out += [n for n in self._group_streams(g) if n not in out]
        if len(out) > 4:
            raise ValueError(f"OffloadOptimizer: {self._kind} keeps {len(out)} state tensors "
                             f"({ss.names(out)}), strata at most 4")
        return out

    @staticmethod
    def _signature(p: torch.Tensor):
        return aof.signature(p) if is_offloaded(p) else (p.data_ptr(), p._version)

    def _check_open(self) -> None:
        if self._closed:
            raise strata.FailedPreconditionError("OffloadOptimizer is closed")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Only during construction: afterwards ValueError (the offloaded layout is fixed)."""
        if getattr(self, "_closed", False):
            self._check_open()
        if getattr(self, "_core", None) is not None:
            raise ValueError("OffloadOptimizer: parameters cannot be added after construction")
        super().add_param_group(param_group)

    # ---- the update of one slice (strata.PythonRule's callable) ---------------------------

    def _update_slice(self, param, grad, states, step, hp, ctx) -> None:
        h = ctx["param"]
        group = self.param_groups[self._group_of[h]]
        pv, gv = torch.from_numpy(param), torch.from_numpy(grad)
        if ctx["grad_scale"] != 1.0:
            gv = gv * ctx["grad_scale"]
        names = self._group_streams(group)
        streams = {n: torch.from_numpy(states[self._streams.index(n)]) for n in names}
        after = self._step_slice(h, group, pv, gv, streams, step)
        if ctx["offset"] == 0:
            self._pending[h] = after

    def _step_slice(self, h, group, pv, gv, streams, step) -> Dict[str, Any]:
        """The class's (or rule's) step on one slice; returns the scalar state after it."""
        if self._rule is not None:
            self._rule.update(pv, gv, streams, step, group)
            return {"step": step}
        return ss.step_slice(self._cls, group, pv, gv, streams, self._scalars.get(h, {}),
                             h not in self._scalars)

    # ---- stepping ------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every parameter with a gradient (the class's step, slice by slice);
        returns the closure's loss (evaluated once, first). Under a DynamicLossScaler
        (optim/_loss_scale.py) the slices' gradients are unscaled and a step with an inf or
        NaN gradient is skipped (``last_step["skipped"]``, nothing changed).

        :raises ValueError: sparse gradients; parameters added, removed or moved in
            param_groups; a hyperparameter change needing a state tensor the optimizer was
            not created with (e.g. SGD's momentum from 0).
        :raises strata.InvalidArgumentError: the class's step raised on a slice (its
            exception the ``__cause__``); the step is rolled back (nothing changed; over
            offloaded parameters, the batches stepped before keep their updates)."""
        self._check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._current_layout() != self._layout:
            raise ValueError("OffloadOptimizer: the parameters of param_groups changed since "
                             "construction (adding, removing or moving parameters is not "
                             "supported; hyperparameters may change)")
        for gi, g in enumerate(self.param_groups):
            missing = [n for n in self._group_streams(g) if n not in self._streams]
            if missing:
                raise ValueError(f"OffloadOptimizer: param group {gi}'s hyperparameters need "
                                 f"state {ss.names(missing)}, which the optimizer was not "
                                 f"created with (it keeps {ss.names(self._streams)})")
        core, stepped, grads = self._core, [], []
        aof.prepare(self._params, self._accum.mode == "float32")
        offloaded = [(h, p) for h, p in self._by_handle.items() if is_offloaded(p)]
        aof.take_changed(core, list(self._by_handle.items()), self._seen)  # offloaded, restored
        for h, p in self._by_handle.items():
            if is_offloaded(p):  # (its gradient is read from the store, batch by batch)
                continue
            if self._seen[h] != self._signature(p):  # changed outside: its value is the master
                if self._seen[h][0] != p.data_ptr():
                    if not p.is_contiguous():
                        raise ValueError(f"OffloadOptimizer: parameter {h} is no longer "
                                         "contiguous")
                    core.set_param_copy(h, p.detach().view(-1))
                core.write_param(h, master_numpy(p))
            g = self._accum.grad(p)  # p.grad, or the fp32 sum of an fp16/bf16 parameter's
            if g is None:
                core.set_grad(h, None)
                continue
            if g.is_sparse:
                raise ValueError(f"OffloadOptimizer: parameter {h} has a sparse gradient; "
                                 "strata streams dense state (torch.optim.SparseAdam's "
                                 "sparse updates are not supported)")
            g = g.detach().to(torch.float32).contiguous().view(-1)
            grads.append(g)
            core.set_grad(h, g.numpy())
            stepped.append((h, p))
        scale = self._grad_scale  # set by a DynamicLossScaler
        # offloaded parameters in batches bounded by the working set (optim/_any_offloaded.py);
        # the in-memory ones in the first
        batches = aof.batches(aof.with_grad(offloaded, scale is not None)) or [[]]
        for k, batch in enumerate(batches):
            st = self._step_batch(stepped if k == 0 else [], batch, scale)
            self.last_step = st if k == 0 else aof.add_stats(self.last_step, st)
            if st["skipped"]:  # (nothing changed: a skip can only be the first batch's)
                break
        return loss

    def _step_batch(self, stepped, batch, scale) -> Dict[str, Any]:
        """One step of strata's optimizer over the in-memory parameters ``stepped`` (their
        gradients attached) and the offloaded ``batch`` (handle, p): their gradients read
        from the store, their new values stored; returns strata's step statistics."""
        core = self._core
        held = [(h, p) + aof.attach(core, h, p) for h, p in batch]
        self._pending = {}
        try:  # under a loss scaler: 1/scale in the slices, skipped on inf/NaN (as Adam's)
            st = core.step(0.0, 1.0 if scale is None else scale, scale is not None)
        except BaseException:
            self._pending = {}
            for h, p in stepped:  # the parameter copies written before the failure
                self._master_into(h, p)
            raise
        finally:
            for h, _ in stepped:
                core.set_grad(h, None)
            for h, *_ in held:
                core.set_grad(h, None)
                core.set_param_copy(h, None)
        if st["skipped"]: return st  # noqa: E701 (nothing changed)
        for h, p, *rest in stepped + held:
            if p.numel() == 0:  # no slice was streamed: the class's step on empty tensors
                group = self.param_groups[self._group_of[h]]
                self._pending[h] = self._step_slice(h, group, torch.empty(0), torch.empty(0), {
                    n: torch.empty(0) for n in self._group_streams(group)}, core.step_count(h))
            self._scalars[h] = self._pending.get(h, {})
            if rest:
                aof.store_value(p, rest[1])
            else:
                bump_version(p)
            self._seen[h] = self._signature(p)
        self._pending = {}
        return st

    def zero_grad(self, set_to_none: bool = False) -> None:
        """As torch.optim.Optimizer.zero_grad (offloaded parameters' stored gradients too,
        through their ``p.grad``); the fp32 gradient sums start again."""
        for o in aof.offloads(self._params):
            o.flush_grads()  # a write in flight fails here, not at an unrelated later call
        if self._accum is not None:
            self._accum.clear()
        super().zero_grad(set_to_none)

    # ---- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """The last checkpoint (skipped in a temporary directory, removed), then the
        release; idempotent. Also at garbage collection and interpreter exit."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        error: Optional[BaseException] = None
        if getattr(self, "_accum", None) is not None:
            self._accum.close()  # its hooks removed
        core, self._core = self._core, None
        if core is not None:
            try:
                keep = self._owned_dir is None
                if keep:
                    self._core = core
                    self._take_changed()
                    self._write_record()
                core.close(checkpoint=keep)
            except Exception as e:  # noqa: BLE001
                error = e
                try:
                    core.close(checkpoint=False)
                except Exception:  # noqa: BLE001
                    pass
            finally:
                self._core = None
            strata._lifetime.unregister(self.store, self)
        if self._owns_store and self.store is not None and not self.store.closed:
            self.store.close()
        owned, self._owned_dir = self._owned_dir, None
        if owned is not None:
            shutil.rmtree(owned, ignore_errors=True)
        if error is not None:
            raise error

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

