"""torch's own optimizer test inputs (torch.testing._internal.common_optimizers.optim_db,
torch >= 2.x) pointed at strata.torch.optim.OffloadOptimizer, on the CPU in float32: for
every OptimizerInfo whose class the wrapper steps, every OptimizerInput (and its foreach /
differentiable / fused-on-CPU variants) trains bit-identically to the class in memory with a
scheduler, state dicts exchanged both ways (optim_db_harness.check_training); a step without
gradients, printing, the class's optim_error_inputs_func cases (the same exception type),
complex parameters (refused); the classes it refuses (LBFGS, SparseAdam, and classes newer
than torch 1.13 such as Adafactor or Muon) give its documented error.

Skipped where torch has no optim_db (torch 1.13 here): it runs on the device machine's
torch (scripts/device-check.sh, step torch_optim_db); test_torch_optim_db_harness.py runs the
same harness on a hand-written table everywhere."""
import importlib
import os
import sys
import types
import unittest

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optim_db_harness as h  # noqa: E402

MODULE = "torch.testing._internal.common_optimizers"


def _import_why() -> str:
    """Imports MODULE (with a stand-in for ``expecttest``, a test-only package torch's
    common_utils imports for its TestCase base, when it is missing); '' or why not."""
    try:
        importlib.import_module(MODULE)
        return ""
    except ModuleNotFoundError as e:
        if e.name != "expecttest":
            return f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 (any failure is the reason to skip)
        return f"{type(e).__name__}: {e}"
    sys.modules["expecttest"] = types.SimpleNamespace(TestCase=unittest.TestCase)
    try:
        importlib.import_module(MODULE)
        return ""
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e} (with a stand-in expecttest)"


_WHY = _import_why()
_REASON = (f"torch {torch.__version__} has no usable {MODULE} ({_WHY}): torch's optim_db came "
           "with torch 2.x; this runs where torch >= 2.x is installed (the device check, "
           "scripts/device-check.sh); test_torch_optim_db_harness.py runs the same checks on "
           "a hand-written table here")
INFOS = [] if _WHY else list(importlib.import_module(MODULE).optim_db)
#: every test but the first needs optim_db
needs_optim_db = pytest.mark.skipif(bool(_WHY), reason=_REASON)


def _torch_major() -> int:
    return int(torch.__version__.split(".")[0])


def test_optim_db_is_missing_only_before_torch_2():
    """optim_db exists from torch 2.x on: where it is installed the module must import (a
    failure there is this harness's or torch's, not a skip); on torch 1.x it is absent."""
    if _torch_major() >= 2:
        assert _WHY == "", _WHY
        assert INFOS
    else:
        assert _WHY.startswith("ModuleNotFoundError: No module named 'torch.testing._internal."
                               "common_optimizers'"), _WHY
        assert INFOS == []


@needs_optim_db
def test_optim_db_has_every_supported_class():
    names = {info.optim_cls.__name__ for info in INFOS}
    assert set(h.SUPPORTED) <= names, sorted(set(h.SUPPORTED) - names)
    assert {"LBFGS", "SparseAdam"} <= names
    assert h.training_params(INFOS)


@needs_optim_db
@pytest.mark.parametrize("cls,kwargs", h.training_params(INFOS))
def test_trains_bit_identical_to_torch(cls, kwargs, tmp_path):
    h.check_training(cls, kwargs, tmp_path)


@needs_optim_db
@pytest.mark.parametrize("cls,kwargs", h.base_params(INFOS))
def test_a_step_without_gradients_changes_nothing(cls, kwargs, tmp_path):
    h.check_no_grad_step(cls, kwargs, tmp_path)


@needs_optim_db
@pytest.mark.parametrize("cls,kwargs", h.base_params(INFOS))
def test_prints_torchs_param_groups(cls, kwargs, tmp_path):
    h.check_repr(cls, kwargs, tmp_path)


@needs_optim_db
@pytest.mark.parametrize("cls,error_input", h.error_params(INFOS))
def test_argument_errors_as_torch(cls, error_input, tmp_path):
    h.check_error_input(cls, error_input, tmp_path)


@needs_optim_db
@pytest.mark.parametrize("cls,kwargs", h.refused_params(INFOS))
def test_refused_classes(cls, kwargs, tmp_path):
    h.check_refused(cls, kwargs, tmp_path)


@needs_optim_db
@pytest.mark.parametrize("cls,kwargs", h.complex_params(INFOS))
def test_complex_parameters_refused(cls, kwargs, tmp_path):
    h.check_complex_refused(cls, kwargs, tmp_path)
