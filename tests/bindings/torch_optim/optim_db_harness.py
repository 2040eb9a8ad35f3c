"""The comparison behind test_torch_optim_db.py (torch's optim_db, torch >= 2.x) and
test_torch_optim_db_harness.py (a hand-written table of the same shape, any torch): a
torch.optim class run through strata.torch.optim.OffloadOptimizer (nvme tier) against the
class in memory, on the same model and data.

A "case" is an object shaped like torch's OptimizerInfo (``optim_cls``, ``optim_inputs_func``,
``optim_error_inputs_func``, ``supported_impls``, ``supports_fused_on``, ``supports_complex``)
whose inputs are shaped like OptimizerInput (``params``, ``kwargs``, ``desc``) and
ErrorOptimizerInput (``optimizer_error_input``, ``error_on``, ``error_type``, ``error_regex``);
the table builds them with :class:`Info`, :class:`Input` and :class:`ErrorInput`.

What is checked (each function asserts; none returns a verdict):

- :func:`check_training`: 4 steps (half of them through a closure) of a 2-layer model in two
  param groups (group 1 with half the learning rate) with a StepLR scheduler; after each step
  the parameters and ``state_dict()`` (state and param_groups) are torch.equal to the class in
  memory; then ``state_dict()``/``load_state_dict()`` both ways (the wrapper's state dict into
  a fresh in-memory optimizer, the in-memory one's into a fresh wrapper) and 2 more steps of
  all four optimizers, still equal. Where the class in memory raises (a flag torch refuses
  on the CPU, e.g. fused or capturable), the wrapper must raise the same exception type (at
  construction, where its probe step runs the class, or at its step: the class's exception
  or the ``__cause__`` of strata's InvalidArgumentError).
- :func:`check_no_grad_step`: a step with no gradients changes nothing and leaves the state
  dict equal to torch's.
- :func:`check_repr`: ``repr()`` shows the same param groups as torch's (optimizer printing).
- :func:`check_error_input`: an error input raises (or warns) as the class in memory does.
- :func:`check_refused`, :func:`check_complex_refused`: the wrapper's documented refusals.
"""
from __future__ import annotations

import copy
import inspect
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch

import strata
from strata.torch.optim import OffloadOptimizer

#: the classes OffloadOptimizer steps (docs/guide-optimizers.md, "A torch.optim class")
SUPPORTED = ("SGD", "Adagrad", "RMSprop", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD",
             "Rprop", "Adam", "AdamW")

#: the wrapper's documented refusals: class name -> start of its ValueError's reason
REFUSED = {"LBFGS": "LBFGS is refused: LBFGS is not element-wise",
           "SparseAdam": "SparseAdam is refused: SparseAdam steps sparse gradients"}
OTHER_REFUSED = "is not one of the element-wise torch.optim classes it steps"

STEPS = 4
MORE_STEPS = 2


# ---- the table's stand-ins for torch's OptimizerInfo / OptimizerInput ----------------------

@dataclass
class Input:
    params: Any
    kwargs: Dict[str, Any]
    desc: str = ""


@dataclass
class ErrorInput:
    optimizer_error_input: Input
    error_type: type
    error_regex: str = ""
    error_on: str = "construction"  # or "step" (torch's OptimizerErrorEnum.STEP_ERROR)


@dataclass
class Info:
    optim_cls: Any
    inputs: List[Input]
    error_inputs: List[ErrorInput] = field(default_factory=list)
    supported_impls: Tuple[str, ...] = ("foreach", "differentiable")
    supports_fused_on: Tuple[str, ...] = ()
    supports_complex: bool = True

    def optim_inputs_func(self, device, dtype=None):
        return copy.deepcopy(self.inputs)

    def optim_error_inputs_func(self, device, dtype):
        return copy.deepcopy(self.error_inputs)


# ---- reading an OptimizerInfo -------------------------------------------------------------

def inputs_of(info, device="cpu", dtype=torch.float32) -> List[Any]:
    """``info.optim_inputs_func`` on the device (torch < 2.5 takes the device only)."""
    fn = info.optim_inputs_func
    try:
        takes_dtype = "dtype" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_dtype = False
    return list(fn(device, dtype) if takes_dtype else fn(device))


def error_inputs_of(info, device="cpu", dtype=torch.float32) -> List[Any]:
    fn = getattr(info, "optim_error_inputs_func", None)
    return [] if fn is None else list(fn(device, dtype))


def variants(info, kwargs: Dict[str, Any], device="cpu") -> List[Tuple[str, Dict[str, Any]]]:
    """The input's kwargs as given, and once with each global flag of ``supported_impls``
    (foreach, differentiable; fused where torch has it on ``device``) set True, as torch's
    tests add them (the inputs leave them out)."""
    out = [("", dict(kwargs))]
    for flag in getattr(info, "supported_impls", ()):
        if flag == "fused" and device not in tuple(getattr(info, "supports_fused_on", ())):
            continue
        if flag in kwargs:
            continue
        out.append((flag, {**kwargs, flag: True}))
    return out


def case_id(info, i: int, desc: str, flag: str = "") -> str:
    words = re.sub(r"[^A-Za-z0-9]+", "_", desc or "input").strip("_")
    return f"{info.optim_cls.__name__}-{i}-{words}" + (f"-{flag}" if flag else "")


def error_on_step(error_input) -> bool:
    on = getattr(error_input, "error_on", "construction")
    return on == "step" or getattr(on, "name", "") == "STEP_ERROR"


# ---- the model, data and one step ---------------------------------------------------------

def _model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _lr_default(cls) -> Any:
    p = inspect.signature(cls.__init__).parameters.get("lr")
    return None if p is None else p.default


def _groups(model, cls, kwargs) -> List[Dict[str, Any]]:
    """Two param groups; the second with half the learning rate (when it has one)."""
    lr = kwargs.get("lr", _lr_default(cls))
    g1 = {"lr": lr * 0.5} if isinstance(lr, (float, int, torch.Tensor)) and \
        not isinstance(lr, bool) else {}
    return [{"params": list(model[0].parameters())},
            {"params": list(model[2].parameters()), **g1}]


def _batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def _step(model, opt, step: int) -> None:
    """One training step: forward, backward, ``opt.step()`` (through a closure on odd
    steps, whose loss the step returns). A differentiable class in memory steps with its
    parameters' requires_grad off (torch's differentiable step would otherwise write into
    leaves that require grad) and without a closure."""
    x, y = _batch(step)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    differentiable = not isinstance(opt, OffloadOptimizer) and any(
        g.get("differentiable") for g in opt.param_groups)
    if step % 2 and not differentiable:
        loss = opt.step(closure)
        assert isinstance(loss, torch.Tensor) and loss.dim() == 0
        return
    closure()
    params = list(model.parameters()) if differentiable else []
    for p in params:
        p.requires_grad_(False)
    try:
        opt.step()
    finally:
        for p in params:
            p.requires_grad_(True)


# ---- equality -----------------------------------------------------------------------------

def assert_equal_values(a: Any, b: Any, where: str) -> None:
    """torch.equal (and the same dtype) for tensors, == for the rest, element-wise in
    tuples/lists/dicts."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), (where, a, b)
        assert a.dtype == b.dtype, (where, a.dtype, b.dtype)
        assert torch.equal(a, b), where
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_values(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, a.keys(), b)
        for k in a:
            assert_equal_values(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b, (where, a, b)


def assert_same(m_ref, ref, m_off, off, when: str) -> None:
    for i, (a, b) in enumerate(zip(m_ref.parameters(), m_off.parameters())):
        assert torch.equal(a, b), f"{when}: parameter {i} differs"
    s_ref, s_off = ref.state_dict(), off.state_dict()
    assert_equal_values(s_ref["state"], s_off["state"], f"{when}: state")
    assert_equal_values(s_ref["param_groups"], s_off["param_groups"], f"{when}: param_groups")


# ---- the checks ---------------------------------------------------------------------------

def _offload(cls, groups, path, kwargs) -> OffloadOptimizer:
    return OffloadOptimizer(cls, groups, path=str(path), tier="nvme", sub_group_numel=32,
                            chunk_size="64KiB", **kwargs)


def _torch_fails(cls, kwargs) -> Optional[BaseException]:
    """The exception the class in memory raises in construction or its first two steps, or
    None."""
    m = _model()
    try:
        opt = cls(_groups(m, cls, kwargs), **kwargs)
        _step(m, opt, 0)
        _step(m, opt, 1)
    except Exception as e:  # noqa: BLE001 (any exception the class raises)
        return e
    return None


def _assert_raises_like(expected: BaseException, fn: Callable[[], Any]) -> None:
    with pytest.raises(Exception) as got:
        fn()
    e = got.value
    kinds = (type(e), type(e.__cause__)) if isinstance(e, strata.InvalidArgumentError) \
        else (type(e),)
    assert any(issubclass(k, type(expected)) for k in kinds), (
        f"the class in memory raised {type(expected).__name__}: {expected}; the wrapper "
        f"{type(e).__name__}: {e}")


def check_training(cls, kwargs: Dict[str, Any], tmp_path) -> None:
    """The wrapper is bit-identical to ``cls(**kwargs)`` in memory, or fails as it does."""
    failure = _torch_fails(cls, copy.deepcopy(kwargs))
    if failure is not None:
        def run():
            m = _model()
            off = _offload(cls, _groups(m, cls, kwargs), tmp_path / "fails", kwargs)
            try:
                _step(m, off, 0)
                _step(m, off, 1)
            finally:
                off.close()
        _assert_raises_like(failure, run)
        return
    m_ref, m_off = _model(), _model()
    ref = cls(_groups(m_ref, cls, kwargs), **copy.deepcopy(kwargs))
    off = _offload(cls, _groups(m_off, cls, kwargs), tmp_path / "off", copy.deepcopy(kwargs))
    try:
        assert_same(m_ref, ref, m_off, off, "before the first step")
        s_ref = torch.optim.lr_scheduler.StepLR(ref, step_size=2, gamma=0.5)
        s_off = torch.optim.lr_scheduler.StepLR(off, step_size=2, gamma=0.5)
        for step in range(STEPS):
            _step(m_ref, ref, step)
            _step(m_off, off, step)
            s_ref.step()
            s_off.step()
            assert_same(m_ref, ref, m_off, off, f"after step {step}")
        assert off.last_step["sub_groups"] >= 2  # the state was streamed in slices
        # state dicts both ways: the wrapper's into torch, torch's into a new wrapper
        m_a, m_b = copy.deepcopy(m_ref), copy.deepcopy(m_ref)
        into_torch = cls(_groups(m_a, cls, kwargs), **copy.deepcopy(kwargs))
        into_torch.load_state_dict(off.state_dict())
        into_off = _offload(cls, _groups(m_b, cls, kwargs), tmp_path / "into",
                            copy.deepcopy(kwargs))
        try:
            into_off.load_state_dict(ref.state_dict())
            assert_same(m_ref, ref, m_b, into_off, "torch's state dict loaded")
            assert_same(m_a, into_torch, m_off, off, "the wrapper's state dict loaded")
            for step in range(STEPS, STEPS + MORE_STEPS):
                for m, o in ((m_ref, ref), (m_off, off), (m_a, into_torch), (m_b, into_off)):
                    _step(m, o, step)
                assert_same(m_ref, ref, m_off, off, f"after step {step}")
                assert_same(m_ref, ref, m_a, into_torch, f"after step {step} (loaded, torch)")
                assert_same(m_ref, ref, m_b, into_off, f"after step {step} (loaded, wrapper)")
        finally:
            into_off.close()
    finally:
        off.close()


def check_no_grad_step(cls, kwargs: Dict[str, Any], tmp_path) -> None:
    """A step where no parameter has a gradient changes no parameter and no state."""
    if _torch_fails(cls, copy.deepcopy(kwargs)) is not None:
        pytest.skip("the class in memory fails with these arguments (check_training checks "
                    "the wrapper fails alike)")
    m_ref, m_off = _model(), _model()
    ref = cls(_groups(m_ref, cls, kwargs), **copy.deepcopy(kwargs))
    off = _offload(cls, _groups(m_off, cls, kwargs), tmp_path / "nograd", copy.deepcopy(kwargs))
    try:
        before = [p.detach().clone() for p in m_off.parameters()]
        ref.step()
        off.step()
        for p, q in zip(m_off.parameters(), before):
            assert torch.equal(p, q)
        assert_same(m_ref, ref, m_off, off, "after a step without gradients")
    finally:
        off.close()


def check_repr(cls, kwargs: Dict[str, Any], tmp_path) -> None:
    """``repr(wrapper)`` prints torch's param groups (the first line names the class)."""
    m_ref, m_off = _model(), _model()
    ref = cls(_groups(m_ref, cls, kwargs), **copy.deepcopy(kwargs))
    off = _offload(cls, _groups(m_off, cls, kwargs), tmp_path / "repr", copy.deepcopy(kwargs))
    try:
        mine, theirs = repr(off).splitlines(), repr(ref).splitlines()
        assert mine[0].startswith("OffloadOptimizer") and theirs[0].startswith(cls.__name__)
        assert mine[1:] == theirs[1:], (mine, theirs)
    finally:
        off.close()


def _error_params(error_input):
    params = error_input.optimizer_error_input.params
    if params is None:
        return [torch.nn.Parameter(torch.randn(2, 3))]
    return params


def _expect(error_input, fn: Callable[[], Any]) -> Optional[BaseException]:
    """Runs ``fn``; asserts it raised (or warned) ``error_input.error_type``; returns what it
    raised (None: a warning, not raised)."""
    kind, regex = error_input.error_type, error_input.error_regex
    if issubclass(kind, Warning):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            raised = None
            try:
                fn()
            except Exception as e:  # noqa: BLE001 (returned to the caller to judge)
                raised = e
        hits = [w for w in seen if issubclass(w.category, kind) and re.search(regex,
                                                                               str(w.message))]
        assert hits, f"no {kind.__name__} matching {regex!r}: {[str(w.message) for w in seen]}"
        return raised
    with pytest.raises(Exception) as got:
        fn()
    return got.value


def check_error_input(cls, error_input, tmp_path) -> None:
    """The class in memory raises (or warns) as the input says; the wrapper raises the same
    exception type (or strata's InvalidArgumentError with it as the cause, for a step), with
    torch's message when the error is the class's own; a warning is issued by the wrapper too
    (it constructs the class), which may then refuse the input itself (a parameter listed
    twice: documented)."""
    kwargs = error_input.optimizer_error_input.kwargs
    on_step = error_on_step(error_input)

    def torch_run():
        opt = cls(copy.copy(_error_params(error_input)), **copy.deepcopy(kwargs))
        if on_step:
            for g in opt.param_groups:
                for p in g["params"]:
                    p.grad = torch.rand_like(p)
            opt.step()

    theirs = _expect(error_input, torch_run)
    if theirs is not None and not issubclass(error_input.error_type, Warning):
        assert isinstance(theirs, error_input.error_type), repr(theirs)
        assert re.search(error_input.error_regex, str(theirs)), str(theirs)

    def wrapper_run():
        opt = OffloadOptimizer(cls, copy.copy(_error_params(error_input)),
                               path=str(tmp_path / "err"), **copy.deepcopy(kwargs))
        try:
            if on_step:
                for g in opt.param_groups:
                    for p in g["params"]:
                        p.grad = torch.rand_like(p)
                opt.step()
        finally:
            opt.close()

    mine = _expect(error_input, wrapper_run)
    if issubclass(error_input.error_type, Warning):
        if mine is not None:  # the wrapper's own refusal after torch's warning
            assert isinstance(mine, ValueError), repr(mine)
            assert re.match(r"OffloadOptimizer: parameter \d+ is parameter \d+ again",
                            str(mine)), str(mine)
        return
    kinds = (type(mine), type(mine.__cause__)) if isinstance(
        mine, strata.InvalidArgumentError) else (type(mine),)
    assert any(issubclass(k, error_input.error_type) for k in kinds), (
        f"torch raises {error_input.error_type.__name__}; the wrapper {type(mine).__name__}: "
        f"{mine}")
    own = mine.__cause__ if isinstance(mine, strata.InvalidArgumentError) else mine
    if not str(own).startswith("OffloadOptimizer"):  # torch's own error, passed through
        assert re.search(error_input.error_regex, str(own)), str(own)


def check_refused(cls, kwargs: Dict[str, Any], tmp_path) -> None:
    """A class the wrapper does not step: its documented ValueError."""
    name = cls.__name__
    expected = re.escape(REFUSED[name]) if name in REFUSED else re.escape(OTHER_REFUSED)
    with pytest.raises(ValueError, match=f"^OffloadOptimizer: .*{expected}"):
        OffloadOptimizer(cls, _model().parameters(), path=str(tmp_path / "refused"),
                         **copy.deepcopy(kwargs))


def check_complex_refused(cls, kwargs: Dict[str, Any], tmp_path) -> None:
    """Complex parameters (torch steps them as real pairs): the wrapper's documented
    ValueError naming the parameter; the class in memory takes them."""
    w = torch.nn.Parameter(torch.randn(4, dtype=torch.complex64))
    cls([w], **copy.deepcopy(kwargs))
    with pytest.raises(ValueError, match=r"^OffloadOptimizer: parameter 0 is torch\.complex64 "
                                         r"on cpu; it takes contiguous float32, float16 or "
                                         r"bfloat16 CPU parameters$"):
        OffloadOptimizer(cls, [w], path=str(tmp_path / "complex"), **copy.deepcopy(kwargs))


# ---- parametrization ----------------------------------------------------------------------

def training_params(infos) -> List[Any]:
    """pytest.param(cls, kwargs) for every supported class's inputs and flag variants."""
    out = []
    for info in infos:
        if info.optim_cls.__name__ not in SUPPORTED:
            continue
        for i, inp in enumerate(inputs_of(info)):
            if inp.params is not None:  # inputs that bring their own parameters: none on cpu
                continue
            for flag, kw in variants(info, inp.kwargs):
                out.append(pytest.param(info.optim_cls, kw,
                                        id=case_id(info, i, inp.desc, flag)))
    return out


def base_params(infos) -> List[Any]:
    """pytest.param(cls, kwargs) for every supported class's inputs as given."""
    return [pytest.param(info.optim_cls, inp.kwargs, id=case_id(info, i, inp.desc))
            for info in infos if info.optim_cls.__name__ in SUPPORTED
            for i, inp in enumerate(inputs_of(info)) if inp.params is None]


def error_params(infos) -> List[Any]:
    """pytest.param(cls, error_input) for every supported class's error inputs."""
    out = []
    for info in infos:
        if info.optim_cls.__name__ not in SUPPORTED:
            continue
        for i, ei in enumerate(error_inputs_of(info)):
            out.append(pytest.param(info.optim_cls, ei,
                                    id=case_id(info, i, ei.optimizer_error_input.desc)))
    return out


def refused_params(infos) -> List[Any]:
    out = []
    for info in infos:
        if info.optim_cls.__name__ in SUPPORTED:
            continue
        inputs = inputs_of(info)
        kw = inputs[0].kwargs if inputs else {}
        out.append(pytest.param(info.optim_cls, kw, id=info.optim_cls.__name__))
    return out


def complex_params(infos) -> List[Any]:
    return [pytest.param(info.optim_cls, {**inputs_of(info)[0].kwargs},
                         id=info.optim_cls.__name__)
            for info in infos if info.optim_cls.__name__ in SUPPORTED
            and getattr(info, "supports_complex", True) and inputs_of(info)]
