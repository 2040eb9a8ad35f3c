"""OffloadedOptimizer.set_grad_object through the binding: a gradient kept as a store object
gives masters and moments bit-identical to the same gradient attached with set_grad, for
fp32 and bf16 over several sub-groups and steps; dtype spellings; the errors."""
import numpy as np
import pytest
import torch

import strata

N = 23456  # sub-groups of 5000: four and a tail of 3456


def _make(store, prefix):
    o = strata.OffloadedOptimizer.create(store, "adamw", {"lr": 1e-2, "weight_decay": 0.01},
                                         key_prefix=prefix, sub_group_numel=5000,
                                         num_buffers=3)
    h = o.add_param("w", N, np.linspace(-1, 1, N, dtype=np.float32), placement="nvme")
    return o, h


def _state(o, h):
    return [o.read_param(h).tobytes()] + [o.read_state(h, k).tobytes()
                                          for k in range(o.num_states())]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_object_gradient_equals_memory_gradient(store, dtype):
    mem, hm = _make(store, "mem/")
    obj, ho = _make(store, "obj/")
    tdtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    # The dtype as a str, a torch dtype and a short name, one per step.
    spellings = [dtype, tdtype, {"float32": "fp32", "bfloat16": "bf16"}[dtype]]
    for step, spelling in enumerate(spellings, start=1):
        g = (torch.rand(N, generator=gen) - 0.5).to(tdtype)
        mem.set_grad(hm, g)
        store.put("grads/w", g, overwrite=True)
        obj.set_grad_object(ho, "grads/w", spelling)
        assert obj.param_info(ho)["has_grad"]
        rm = mem.step(max_grad_norm=0.0, skip_if_nonfinite=False)
        ro = obj.step(max_grad_norm=0.0, skip_if_nonfinite=False)
        assert ro["bytes_read"] == rm["bytes_read"] + N * g.element_size()
        assert _state(mem, hm) == _state(obj, ho), f"step {step}"
        assert obj.step_count(ho) == step
    mem.close()
    obj.close()


def test_grad_summary_gate_and_errors(store):
    o, h = _make(store, "e/")
    host = o.add_param("hosted", 100, placement="host")
    g = np.full(N, 0.125, dtype=np.float32)
    store.put("g", g)
    o.set_grad_object(h, "g", np.float32)  # a numpy dtype
    # The default step would scan the gradient for inf/NaN: refused, nothing changes.
    before = _state(o, h)
    with pytest.raises(strata.InvalidArgumentError) as e:
        o.step()
    assert "'w'" in e.value.message and "grad_summary" in e.value.message
    assert _state(o, h) == before and o.step_count(h) == 0
    # With the caller's summary the gate decides without a scan.
    r = o.step(max_grad_norm=1.0, grad_summary=(float(np.linalg.norm(g)), False, "strata"))
    assert not r["skipped"] and r["clip_coef"] < 1.0
    assert o.step_count(h) == 1
    with pytest.raises(strata.NotFoundError):
        o.set_grad_object(h, "absent", "float32")
    store.put("short", g[:-1])
    with pytest.raises(strata.InvalidArgumentError) as e:
        o.set_grad_object(h, "short", "float32")
    assert "'short'" in e.value.message
    with pytest.raises(strata.InvalidArgumentError) as e:
        o.set_grad_object(host, "g", "float32")
    assert "'hosted'" in e.value.message
    with pytest.raises(strata.InvalidArgumentError):
        o.set_grad_object(h, "g", "float7")
    with pytest.raises(strata.InvalidArgumentError):
        o.set_grad_object(h, "g", object())
    with pytest.raises(strata.InvalidArgumentError):  # a dtype the optimizer refuses
        o.set_grad_object(h, "g", torch.float64)
    o.set_grad(h, None)  # detaches the object
    assert not o.param_info(h)["has_grad"]
    o.close()
