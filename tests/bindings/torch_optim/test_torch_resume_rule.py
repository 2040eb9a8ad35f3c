"""The one resume rule of strata.torch's optimizers (docs/offload.md, "Checkpoint and
resume"): ``resume=True`` restores the state of the last checkpoint() or close(), and close
happens on every orderly end -- explicit close(), ``del`` / garbage collection, interpreter
exit (also after Ctrl-C's KeyboardInterrupt), a ``with strata.Store`` block unwinding -- for
every tier. A process killed without closing (SIGKILL) resumes at its last checkpoint, even
when the shared store was flushed after it.

Each case trains in a child process (K steps, checkpoint, M more steps, then its ending),
then resumes here and compares every parameter's step count, master and moments bit for bit
with torch.optim.AdamW run for the expected number of steps on the same gradients
(arithmetic="torch").
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import strata
import strata.torch as st

K, M = 2, 2  # steps before the checkpoint, steps after it
SIZES = (3000, 5000, 700)
LR = 1e-2
# tier="auto": host_budget fits the last parameter only (700 * 12 bytes): p0, p1 NVMe, p2 DRAM
HOST_BUDGET = 700 * 12

CHILD = textwrap.dedent("""
    import gc, os, signal, sys, time
    import torch, strata, strata.torch as st
    path, tier, ending = sys.argv[1], sys.argv[2], sys.argv[3]
    K, M = {K}, {M}
    SIZES, LR, HOST_BUDGET = {SIZES}, {LR}, {HOST_BUDGET}

    def params():
        g = torch.Generator().manual_seed(7)
        return [torch.nn.Parameter(torch.randn(n, generator=g)) for n in SIZES]

    def grads(step):
        g = torch.Generator().manual_seed(100 + step)
        return [torch.randn(n, generator=g) for n in SIZES]

    def train(opt, ps, first, last):
        for s in range(first, last + 1):
            for p, gr in zip(ps, grads(s)):
                p.grad = gr.clone()
            opt.step()

    ps = params()
    kw = dict(lr=LR, tier=tier, host_budget=HOST_BUDGET, arithmetic="torch",
              chunk_size="64KiB")
    if ending == "sigint_with_store":
        with strata.Store.open(path, chunk_size="64KiB") as store:
            opt = st.OffloadAdamW(ps, store=store, **kw)
            train(opt, ps, 1, K)
            opt.checkpoint()
            train(opt, ps, K + 1, K + M)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during training
            time.sleep(30)
        sys.exit(3)
    if ending == "flush_then_kill":
        store = strata.Store.open(path, chunk_size="64KiB")
        opt = st.OffloadAdamW(ps, store=store, **kw)
    else:
        opt = st.OffloadAdamW(ps, path=path, **kw)
    placements = [opt._opt.param_info(h)["placement"] for h in range(len(SIZES))]
    want = dict(nvme=["nvme"] * 3, host=["host"] * 3, auto=["nvme", "nvme", "host"])[tier]
    assert placements == want, placements
    train(opt, ps, 1, K)
    opt.checkpoint()
    train(opt, ps, K + 1, K + M)
    if ending == "exit":
        pass                                   # interpreter exit, no close()
    elif ending == "close":
        opt.close()
    elif ending == "del":
        del opt
        gc.collect()
        os._exit(0)                            # no atexit: the del closed it
    elif ending == "sigint":
        os.kill(os.getpid(), signal.SIGINT)    # KeyboardInterrupt, uncaught
        time.sleep(30)
        sys.exit(3)
    elif ending == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif ending == "checkpoint_then_kill":
        opt.checkpoint()
        os.kill(os.getpid(), signal.SIGKILL)
    elif ending == "flush_then_kill":
        store.flush()                          # the owner's flush of the shared store
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        raise SystemExit("unknown ending " + ending)
""").format(K=K, M=M, SIZES=SIZES, LR=LR, HOST_BUDGET=HOST_BUDGET)

# ending -> (how the child must end, steps a resume restores)
ENDINGS = {
    "exit": ("ok", K + M),
    "close": ("ok", K + M),
    "del": ("ok", K + M),
    "sigint": ("sigint", K + M),
    "sigint_with_store": ("sigint", K + M),
    "kill": ("killed", K),
    "checkpoint_then_kill": ("killed", K + M),
    "flush_then_kill": ("killed", K),
}


def _params():
    g = torch.Generator().manual_seed(7)
    return [torch.nn.Parameter(torch.randn(n, generator=g)) for n in SIZES]


def _grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(n, generator=g) for n in SIZES]


def _torch_reference(steps):
    ps = _params()
    opt = torch.optim.AdamW(ps, lr=LR)
    for s in range(1, steps + 1):
        for p, gr in zip(ps, _grads(s)):
            p.grad = gr.clone()
        opt.step()
    return ps, opt.state_dict()["state"]


@pytest.mark.parametrize("tier", ["nvme", "host", "auto"])
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_resume_restores_the_last_checkpoint_or_close(tmp_path, tier, ending):
    path = str(tmp_path / "store")
    how, steps = ENDINGS[ending]
    r = subprocess.run([sys.executable, "-c", CHILD, path, tier, ending],
                       capture_output=True, text=True, timeout=300)
    if how == "ok":
        assert r.returncode == 0, r.stderr
    elif how == "killed":
        assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    else:  # an uncaught KeyboardInterrupt: traceback, then Python dies by SIGINT (3.8+)
        assert r.returncode in (1, -signal.SIGINT), (r.returncode, r.stderr)
        assert "KeyboardInterrupt" in r.stderr, r.stderr
    assert "failed" not in r.stderr, r.stderr

    ps = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    opt = st.OffloadAdamW(ps, lr=LR, path=path, resume=True, arithmetic="torch")
    try:
        ref_params, ref_state = _torch_reference(steps)
        state = opt.state_dict()["state"]
        for i in range(len(SIZES)):
            assert float(state[i]["step"]) == steps, (i, float(state[i]["step"]), steps)
            assert torch.equal(ps[i].detach(), ref_params[i].detach()), i
            assert torch.equal(state[i]["exp_avg"], ref_state[i]["exp_avg"]), i
            assert torch.equal(state[i]["exp_avg_sq"], ref_state[i]["exp_avg_sq"]), i
        # and it trains on like torch: one more step, still bit-identical
        ref = torch.optim.AdamW(ref_params, lr=LR)
        ref.load_state_dict({"state": ref_state, "param_groups": ref.state_dict()["param_groups"]})
        for p, q, gr in zip(ps, ref_params, _grads(steps + 1)):
            p.grad = gr.clone()
            q.grad = gr.clone()
        opt.step()
        ref.step()
        for p, q in zip(ps, ref_params):
            assert torch.equal(p.detach(), q.detach())
    finally:
        opt.close()


def test_close_takes_the_current_param_groups_and_a_failed_step_state_is_not_saved(tmp_path):
    # A scheduler's lr set after the last step is part of the close's checkpoint.
    path = str(tmp_path / "s")
    ps = _params()
    opt = st.OffloadAdamW(ps, lr=LR, path=path, tier="auto", host_budget=HOST_BUDGET,
                          arithmetic="torch")
    for p, gr in zip(ps, _grads(1)):
        p.grad = gr.clone()
    opt.step()
    opt.param_groups[0]["lr"] = 0.5
    opt.close()
    opt.close()  # idempotent
    with pytest.raises(strata.FailedPreconditionError, match="closed"):
        opt.step()
    ps2 = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    opt2 = st.OffloadAdamW(ps2, lr=0.5, path=path, resume=True, arithmetic="torch")
    assert opt2.param_groups[0]["lr"] == 0.5
    assert all(float(s["step"]) == 1 for s in opt2.state_dict()["state"].values())
    opt2.close()


def test_store_closed_first_gets_its_optimizers_checkpointed(tmp_path):
    # Closing a strata.Store closes the optimizers on it first: their close is a checkpoint.
    path = str(tmp_path / "s")
    store = strata.Store.open(path, chunk_size="64KiB")
    ps = _params()
    opt = st.OffloadAdamW(ps, lr=LR, store=store, tier="host", arithmetic="torch")
    for s in (1, 2):
        for p, gr in zip(ps, _grads(s)):
            p.grad = gr.clone()
        opt.step()
    store.close()
    with pytest.raises(strata.FailedPreconditionError, match="closed"):
        opt.step()
    ps2 = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES]
    opt2 = st.OffloadAdamW(ps2, lr=LR, path=path, resume=True, arithmetic="torch")
    ref_params, _ = _torch_reference(2)
    for p, q in zip(ps2, ref_params):
        assert torch.equal(p.detach(), q.detach())
    opt2.close()


def test_a_failed_constructor_leaves_no_checkpoint(tmp_path):
    # A constructor that fails part-way is released without a checkpoint: nothing to resume.
    path = str(tmp_path / "s")
    store = strata.Store.open(path)
    good = torch.nn.Parameter(torch.ones(10))
    with pytest.raises(ValueError):
        st.OffloadAdamW([good, torch.nn.Parameter(torch.ones(3, dtype=torch.float64))],
                        store=store)
    assert "optim/meta" not in store.keys("optim/")
    store.close()
