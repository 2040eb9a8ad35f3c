"""The optim_db harness (optim_db_harness.py) on a hand-written table shaped like torch's
optim_db, so that it runs on any torch (1.13 here, which has no optim_db): OffloadOptimizer
(nvme tier) bit-identical to each class in memory with foreach/differentiable variants, state
dicts both ways, a step without gradients, printing, torch's argument errors, a flag torch
refuses on the CPU (fused Adam before torch 2.4) failing alike, and the wrapper's refusals.
test_torch_optim_db.py runs the same checks on torch's own optim_db (torch >= 2.x)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optim_db_harness as h  # noqa: E402
from optim_db_harness import ErrorInput, Info, Input  # noqa: E402


class SGDSubclass(torch.optim.SGD):
    """Not a torch.optim class: refused (its arithmetic is not known to be element-wise)."""


def _param():
    return torch.nn.Parameter(torch.randn(2, 3))


_P = _param()
_Q = _param()


def _fused_fails_on_cpu() -> bool:
    """torch < 2.4 has fused Adam on CUDA only: its step raises RuntimeError on the CPU."""
    p = torch.zeros(2, requires_grad=True)
    p.grad = torch.ones(2)
    try:
        torch.optim.Adam([p], lr=0.1, fused=True).step()
    except RuntimeError:
        return True
    return False


#: a step error of a supported class (as torch's OptimizerErrorEnum.STEP_ERROR), where it has one
_STEP_ERRORS = [
    ErrorInput(Input(None, {"lr": 0.01, "fused": True}, "fused on the CPU"), RuntimeError,
               "FusedAdam requires all the params to be CUDA", error_on="step"),
] if _fused_fails_on_cpu() else []

INFOS = [
    Info(torch.optim.SGD, [
        Input(None, {"lr": 0.1}, "lr"),
        Input(None, {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}, "dampening"),
        Input(None, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1},
              "nesterov"),
        Input(None, {"lr": 0.1, "weight_decay": 0.1, "maximize": True}, "maximize"),
    ], [
        ErrorInput(Input(None, {"lr": 1e-2, "momentum": -0.5}, "negative momentum"),
                   ValueError, "Invalid momentum value: -0.5"),
        ErrorInput(Input(None, {"lr": -1.0}, "negative lr"), ValueError,
                   "Invalid learning rate: -1.0"),
        ErrorInput(Input(_P, {"lr": 0.1}, "invalid param type"), TypeError,
                   "params argument given to the optimizer should be an iterable of Tensors "
                   "or dicts"),
        ErrorInput(Input([_P, _P], {"lr": 0.1}, "duplicate parameters"), UserWarning,
                   ".*a parameter group with duplicate parameters.*"),
        ErrorInput(Input([{"params": [_Q]}, {"params": [_Q]}], {"lr": 0.1},
                         "duplicates across groups"), ValueError,
                   "some parameters appear in more than one parameter group"),
    ]),
    Info(torch.optim.Adam, [
        Input(None, {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}, "amsgrad"),
        Input(None, {"lr": torch.tensor(0.01)}, "Tensor lr"),
    ], [
        ErrorInput(Input(None, {"lr": 1e-2, "betas": (1.0, 0.0)}, "beta1"), ValueError,
                   "Invalid beta parameter at index 0: 1.0"),
        *_STEP_ERRORS,
    ], supported_impls=("foreach", "differentiable", "fused"), supports_fused_on=("cpu",)),
    Info(torch.optim.RMSprop, [
        Input(None, {"lr": 0.01, "weight_decay": 0.1, "centered": True, "momentum": 0.1,
                     "maximize": True}, "centered momentum maximize"),
    ]),
    Info(torch.optim.Adagrad, [
        Input(None, {"lr": 0.1, "lr_decay": 0.5, "weight_decay": 0.1,
                     "initial_accumulator_value": 0.1}, "lr_decay"),
    ], [
        ErrorInput(Input(None, {"lr": 1e-2, "lr_decay": -0.5}, "negative lr_decay"),
                   ValueError, "Invalid lr_decay value: -0.5"),
    ], supported_impls=("foreach",)),
    Info(torch.optim.ASGD, [Input(None, {"lr": 0.02, "t0": 1}, "t0")],
         supported_impls=("foreach",)),
    Info(torch.optim.Rprop, [Input(None, {"lr": 0.01, "etas": (0.5, 1.5)}, "etas")], [
        ErrorInput(Input(None, {"lr": 1e-2, "etas": (1.0, 0.5)}, "etas"), ValueError,
                   "Invalid eta values: 1.0, 0.5"),
    ], supported_impls=("foreach",)),
    Info(torch.optim.NAdam, [Input(None, {"lr": 0.01, "momentum_decay": 6e-3}, "momentum_decay")],
         supported_impls=("foreach",)),
    Info(torch.optim.LBFGS, [Input(None, {"lr": 0.1}, "default")]),
    Info(torch.optim.SparseAdam, [Input(None, {"lr": 0.01}, "default")]),
    Info(SGDSubclass, [Input(None, {"lr": 0.1}, "default")]),
]


def test_the_table_covers_every_check():
    ids = lambda ps: [p.id for p in ps]  # noqa: E731
    assert "SGD-1-dampening-foreach" in ids(h.training_params(INFOS))
    assert "SGD-1-dampening-differentiable" in ids(h.training_params(INFOS))
    assert "Adam-0-amsgrad-fused" in ids(h.training_params(INFOS))
    assert "ASGD-0-t0-differentiable" not in ids(h.training_params(INFOS))
    assert len(h.training_params(INFOS)) == 4 * 3 + 2 * 4 + 3 + 2 * 4
    assert ids(h.refused_params(INFOS)) == ["LBFGS", "SparseAdam", "SGDSubclass"]
    assert len(h.error_params(INFOS)) == 5 + 1 + len(_STEP_ERRORS) + 1 + 1
    assert len(h.complex_params(INFOS)) == 7


@pytest.mark.parametrize("cls,kwargs", h.training_params(INFOS))
def test_trains_bit_identical_to_torch(cls, kwargs, tmp_path):
    h.check_training(cls, kwargs, tmp_path)


@pytest.mark.parametrize("cls,kwargs", h.base_params(INFOS))
def test_a_step_without_gradients_changes_nothing(cls, kwargs, tmp_path):
    h.check_no_grad_step(cls, kwargs, tmp_path)


@pytest.mark.parametrize("cls,kwargs", h.base_params(INFOS))
def test_prints_torchs_param_groups(cls, kwargs, tmp_path):
    h.check_repr(cls, kwargs, tmp_path)


@pytest.mark.parametrize("cls,error_input", h.error_params(INFOS))
def test_argument_errors_as_torch(cls, error_input, tmp_path):
    h.check_error_input(cls, error_input, tmp_path)


@pytest.mark.parametrize("cls,kwargs", h.refused_params(INFOS))
def test_refused_classes(cls, kwargs, tmp_path):
    h.check_refused(cls, kwargs, tmp_path)


@pytest.mark.parametrize("cls,kwargs", h.complex_params(INFOS))
def test_complex_parameters_refused(cls, kwargs, tmp_path):
    h.check_complex_refused(cls, kwargs, tmp_path)
