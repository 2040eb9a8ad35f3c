"""strata's CPU optimizer kernels against torch.optim, 100 steps on the same random data.

The kernels run in the real strata code through the test-only executable optim_driver
(path in $STRATA_OPTIM_DRIVER, set by ctest); torch runs its default (single-tensor) fp32
implementation. Parameters and every state must agree to 1e-6 relative.
"""
import os
import subprocess

import numpy as np
import pytest
import torch

DRIVER = os.environ.get("STRATA_OPTIM_DRIVER")
NUMEL = 4099  # not a multiple of any vector width: exercises the tails too
STEPS = 100
RTOL = 1e-6

pytestmark = pytest.mark.skipif(not DRIVER, reason="STRATA_OPTIM_DRIVER not set (run via ctest)")

# (id, torch class, torch kwargs, driver args, state keys in strata's order)
CASES = [
    ("adam", torch.optim.Adam, dict(lr=1e-3), [], ["exp_avg", "exp_avg_sq"]),
    ("adam_wd_amsgrad", torch.optim.Adam,
     dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05, amsgrad=True),
     ["--beta1", "0.8", "--beta2", "0.99", "--eps", "1e-6", "--weight-decay", "0.05", "--amsgrad"],
     ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]),
    ("adam_maximize", torch.optim.Adam, dict(lr=1e-3, maximize=True), ["--maximize"],
     ["exp_avg", "exp_avg_sq"]),
    ("adamw", torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2), ["--weight-decay", "1e-2"],
     ["exp_avg", "exp_avg_sq"]),
    ("adamw_amsgrad", torch.optim.AdamW, dict(lr=3e-3, weight_decay=0.1, amsgrad=True),
     ["--weight-decay", "0.1", "--amsgrad"], ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]),
    ("adagrad", torch.optim.Adagrad, dict(lr=1e-2), [], ["sum"]),
    ("adagrad_full", torch.optim.Adagrad,
     dict(lr=5e-2, lr_decay=1e-3, weight_decay=1e-2, initial_accumulator_value=0.1, eps=1e-8),
     ["--lr-decay", "1e-3", "--weight-decay", "1e-2", "--initial-accumulator-value", "0.1",
      "--eps", "1e-8"], ["sum"]),
    ("sgd", torch.optim.SGD, dict(lr=1e-2), [], []),
    ("sgd_momentum", torch.optim.SGD, dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-3),
     ["--momentum", "0.9", "--dampening", "0.1", "--weight-decay", "1e-3"], ["momentum_buffer"]),
    ("sgd_nesterov", torch.optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True, maximize=True),
     ["--momentum", "0.9", "--nesterov", "--maximize"], ["momentum_buffer"]),
]


def torch_name(cls):
    return {torch.optim.Adam: "adam", torch.optim.AdamW: "adamw", torch.optim.Adagrad: "adagrad",
            torch.optim.SGD: "sgd"}[cls]


def run_torch(cls, kwargs, p0, grads, keys):
    torch.set_num_threads(1)
    param = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = cls([param], **kwargs)
    for g in grads:
        param.grad = g.clone()
        opt.step()
    state = opt.state[param]
    return param.detach().numpy(), [state[k].numpy() for k in keys]


def run_strata(tmp_path, name, lr, extra, p0, grad_bits, grad_dtype, nstates, chunks=1, threads=1,
               arithmetic="simd"):
    pfile, gfile, ofile = tmp_path / "p.bin", tmp_path / "g.bin", tmp_path / "out.bin"
    p0.tofile(pfile)
    grad_bits.tofile(gfile)
    cmd = [DRIVER, "--optimizer", name, "--numel", str(NUMEL), "--steps", str(STEPS),
           "--params", str(pfile), "--grads", str(gfile), "--out", str(ofile), "--lr", repr(lr),
           "--grad-dtype", grad_dtype, "--chunks", str(chunks), "--threads", str(threads),
           "--arithmetic", arithmetic] + extra
    subprocess.run(cmd, check=True)
    out = np.fromfile(ofile, dtype=np.float32)
    assert out.size == NUMEL * (1 + nstates)
    return out[:NUMEL], [out[NUMEL * (k + 1):NUMEL * (k + 2)] for k in range(nstates)]


def assert_close(actual, expected, what):
    """Elementwise |strata - torch| <= 1e-6 * max(|torch|, rms(torch)).

    Relative to the element itself, except for elements far below the tensor's typical
    magnitude (its RMS): those got there by cancellation (a parameter crossing zero, a
    momentum of mixed-sign gradients), and their fp32 rounding is that of the larger values
    they were computed from. Returns the largest such relative difference.
    """
    e = expected.astype(np.float64)
    rms = float(np.sqrt(np.mean(e * e))) if e.size else 0.0
    denom = np.maximum(np.abs(e), rms)
    rel = np.abs(actual.astype(np.float64) - e) / np.where(denom > 0, denom, 1.0)
    worst = int(np.argmax(rel)) if rel.size else 0
    assert rel.size == 0 or rel[worst] <= RTOL, (
        f"{what}: element {worst}: strata {actual[worst]!r} torch {expected[worst]!r} "
        f"(relative difference {rel[worst]:.3g} > {RTOL})")
    print(f"{what}: max relative difference {rel.max() if rel.size else 0:.3g}")
    return float(rel.max()) if rel.size else 0.0


def run_case(tmp_path, case, **strata_kw):
    """torch and strata on the case's random data: (p0, torch param, torch states, strata
    param, strata states)."""
    case_id, cls, kwargs, extra, keys = case
    gen = torch.Generator().manual_seed(sum(map(ord, case_id)))
    p0 = torch.randn(NUMEL, generator=gen).numpy()
    grads = torch.randn(STEPS, NUMEL, generator=gen)
    tp, tstates = run_torch(cls, kwargs, p0, grads, keys)
    sp, sstates = run_strata(tmp_path, torch_name(cls), kwargs["lr"], extra, p0,
                             grads.numpy(), "fp32", len(keys), **strata_kw)
    assert not np.array_equal(tp, p0)  # the optimizer did move the parameters
    return tp, tstates, sp, sstates


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_torch_for_100_steps(tmp_path, case):
    case_id, keys = case[0], case[4]
    tp, tstates, sp, sstates = run_case(tmp_path, case)
    assert_close(sp, tp, f"{case_id} param")
    for k, (a, b) in enumerate(zip(sstates, tstates)):
        assert_close(a, b, f"{case_id} state {keys[k]}")


@pytest.mark.parametrize("grad_dtype", ["bf16", "fp16"])
def test_low_precision_grads_match_torch_on_upcast_grads(tmp_path, grad_dtype):
    """strata reads bf16/fp16 gradients directly; torch gets the same values upcast."""
    tdtype = torch.bfloat16 if grad_dtype == "bf16" else torch.float16
    gen = torch.Generator().manual_seed(7)
    p0 = torch.randn(NUMEL, generator=gen).numpy()
    grads_lp = torch.randn(STEPS, NUMEL, generator=gen).to(tdtype)
    tp, tstates = run_torch(torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2), p0,
                            grads_lp.float(), ["exp_avg", "exp_avg_sq"])
    bits = grads_lp.view(torch.int16).numpy()
    sp, sstates = run_strata(tmp_path, "adamw", 1e-3, ["--weight-decay", "1e-2"], p0, bits,
                             grad_dtype, 2, chunks=3, threads=2)
    assert_close(sp, tp, "param")
    assert_close(sstates[1], tstates[1], "exp_avg_sq")


def test_sub_groups_and_threads_give_identical_bits(tmp_path):
    gen = torch.Generator().manual_seed(3)
    p0 = torch.randn(NUMEL, generator=gen).numpy()
    grads = torch.randn(STEPS, NUMEL, generator=gen).numpy()
    a = run_strata(tmp_path, "adam", 1e-3, [], p0, grads, "fp32", 2)
    b = run_strata(tmp_path, "adam", 1e-3, [], p0, grads, "fp32", 2, chunks=7, threads=3)
    assert np.array_equal(a[0], b[0])
    for x, y in zip(a[1], b[1]):
        assert np.array_equal(x, y)


ADAM_CASES = [c for c in CASES if c[1] in (torch.optim.Adam, torch.optim.AdamW)]


@pytest.mark.parametrize("case", ADAM_CASES, ids=[c[0] for c in ADAM_CASES])
def test_torch_exact_arithmetic_is_bit_identical_to_torch(tmp_path, case):
    """make_torch_exact_adam: every parameter and state bit equals torch's after 100 steps,
    updated in sub-groups on several threads."""
    case_id, keys = case[0], case[4]
    tp, tstates, sp, sstates = run_case(tmp_path, case, chunks=3, threads=2, arithmetic="torch")
    assert np.array_equal(sp.view(np.uint32), tp.view(np.uint32)), f"{case_id} param"
    for k, (a, b) in enumerate(zip(sstates, tstates)):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{case_id} {keys[k]}"
