"""Gradients held in host memory between micro-batches (offload_parameters'
``grad_host_budget``, offload/_grad_host.py): with 3 micro-batches per step, the offloaded
model under OffloadAdamW steps bit for bit as torch.optim.AdamW in memory, on the nvme and
host tiers, and the gradient bytes the store moves are exactly those of the parameters
whose gradients did not fit (4 written by each micro-batch and 4 read by each later one
and by the step, per fp32 element):

* a budget holding every gradient (0 bytes), part of them (first come first held: the
  parameters that do not fit go to the store), 0 and the default (today's bytes);
* both zero_grad forms, clip_grad_norm_ by hand, fp32 sums of a bf16 model, the update in
  backward (overlap_backward=True, with and without a redo), checkpoint and close;
* the ``p.grad`` idioms of test_param_offload_grads.py (reads, in-place edits,
  ``p.grad = None`` / ``= t``, hooks, foreach, GradScaler) with held gradients;
* bad budgets refused, naming the argument.
(ZeRO-3 with held slices: tests/bindings/torch_offload/zero3_grad_budget_worker.py.)
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import strata.torch as st
from strata.torch.offload import offload_of
import test_param_offload_grads as grads_tests
from test_param_offload import Net, batch, loss_of

TIERS = ["nvme", "host"]
MICRO, STEPS = 3, 3


class Mlp(nn.Module):
    """Three linear layers. With fp32 gradients (or fp32 sums) of 4 bytes per element,
    :data:`SOME` holds the three biases and ``l3.weight`` (308 elements) in whatever order
    backward produces them, and neither ``l1.weight`` (2048) nor ``l2.weight`` (3072), each
    larger than the whole budget."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2, self.l3 = nn.Linear(32, 64), nn.Linear(64, 48), nn.Linear(48, 4)
        self.to(dtype)
        self.dtype = dtype

    def forward(self, x):
        h = torch.tanh(self.l2(torch.tanh(self.l1(x.to(self.dtype)))))
        return self.l3(h).float()


HELD_SOME = {"l1.bias", "l2.bias", "l3.weight", "l3.bias"}
SOME = 4 * (64 + 48 + 4 * 48 + 4)  # bytes: exactly the gradients HELD_SOME
ALL = "1MiB"
NUMEL = 32 * 64 + 64 + 64 * 48 + 48 + 48 * 4 + 4


def micro_batches(step):
    g = torch.Generator().manual_seed(100 + step)
    return [(torch.randn(8, 32, generator=g), torch.randn(8, 4, generator=g))
            for _ in range(MICRO)]


def stored_numel(budget):
    """Elements whose gradients go to the store under ``budget`` (Mlp)."""
    if budget == ALL:
        return 0
    if budget == SOME:
        return sum(p.numel() for n, p in Mlp().named_parameters() if n not in HELD_SOME)
    return NUMEL


def offloaded_mlp(tmp_path, tier, budget, dtype=torch.float32, **kw):
    model = Mlp(dtype)
    if budget is None:  # the default
        h = st.offload_parameters(model, path=str(tmp_path / "p"), tier=tier,
                                  working_set=1024, **kw)
    else:
        h = st.offload_parameters(model, path=str(tmp_path / "p"), tier=tier,
                                  working_set=1024, grad_host_budget=budget, **kw)
    return model, h


def assert_params(ref, model, h, step):
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), (step, n)


def grad_bytes(h):
    s = h.stats()
    return s["grad_bytes_written"], s["grad_bytes_read"]


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("budget", [ALL, SOME, 0, None], ids=["all", "some", "zero", "default"])
@pytest.mark.parametrize("tier", TIERS)
def test_held_gradients_step_as_torch_and_move_exact_bytes(tmp_path, tier, budget,
                                                           set_to_none):
    ref = Mlp()
    model, h = offloaded_mlp(tmp_path, tier, budget)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1, store=h.store,
                          arithmetic="torch")
    stored = stored_numel(budget)
    for step in range(STEPS):
        before = grad_bytes(h)
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad(set_to_none=set_to_none)
            for x, y in micro_batches(step):
                F.mse_loss(m(x), y).backward()
        assert h.stats()["grad_host_bytes"] == 4 * (NUMEL - stored)
        ropt.step()
        opt.step()
        written, read = grad_bytes(h)
        # each micro-batch writes a stored gradient; the later ones and the step read it
        assert (written - before[0], read - before[1]) == (MICRO * 4 * stored,
                                                           MICRO * 4 * stored), step
        assert_params(ref, model, h, step)
    opt.zero_grad(set_to_none=True)
    assert h.stats()["grad_host_bytes"] == 0  # released with the gradients
    opt.close()
    h.close()


@pytest.mark.parametrize("budget", [ALL, SOME], ids=["all", "some"])
@pytest.mark.parametrize("tier", TIERS)
def test_clip_grad_norm_by_hand(tmp_path, tier, budget):
    ref = Mlp()
    model, h = offloaded_mlp(tmp_path, tier, budget)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    stored = stored_numel(budget)
    for step in range(STEPS):
        before = grad_bytes(h)
        norms = []
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            for x, y in micro_batches(step):
                F.mse_loss(m(x), y).backward()
            norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05))
            o.step()
        assert torch.equal(norms[0], norms[1]) and float(norms[0]) > 0.05, step  # clipped
        written, read = grad_bytes(h)
        # the norms were known and the scaling recorded: no gradient read for the clip
        assert (written - before[0], read - before[1]) == (MICRO * 4 * stored,
                                                           MICRO * 4 * stored), step
        assert_params(ref, model, h, step)
    opt.close()
    h.close()


@pytest.mark.parametrize("budget", [ALL, SOME, 0], ids=["all", "some", "zero"])
@pytest.mark.parametrize("tier", TIERS)
def test_fp32_sums_of_a_bf16_model(tmp_path, tier, budget):
    """bf16 parameters, their micro-batch gradients summed in fp32 (the held sum is the fp32
    one: 4 bytes per element), AdamW on fp32 masters: torch by hand."""
    ref = Mlp(torch.bfloat16)
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    ropt = torch.optim.AdamW(masters, lr=1e-2, weight_decay=0.1)
    model, h = offloaded_mlp(tmp_path, tier, budget, torch.bfloat16)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1, store=h.store,
                          arithmetic="torch")
    stored = stored_numel(budget)
    for step in range(STEPS):
        sums = [None] * len(masters)
        for x, y in micro_batches(step):
            for p in ref.parameters():
                p.grad = None
            F.mse_loss(ref(x), y).backward()
            sums = [p.grad.float() if t is None else t + p.grad.float()
                    for p, t in zip(ref.parameters(), sums)]
        for m, t in zip(masters, sums):
            m.grad = t
        ropt.step()
        with torch.no_grad():
            for p, m in zip(ref.parameters(), masters):
                p.copy_(m)
        before = grad_bytes(h)
        opt.zero_grad(set_to_none=True)
        for x, y in micro_batches(step):
            F.mse_loss(model(x), y).backward()
        for p, t in zip(model.parameters(), sums):  # p.grad: the fp32 sum rounded
            assert torch.equal(p.grad.clone(), t.to(torch.bfloat16)), step
        assert h.stats()["grad_host_bytes"] == 4 * (NUMEL - stored)
        opt.step()
        written, read = grad_bytes(h)
        # (+ 1 read: the p.grad checks above read the stored sums once more)
        assert (written - before[0], read - before[1]) == (MICRO * 4 * stored,
                                                           (MICRO + 1) * 4 * stored), step
        assert_params(ref, model, h, step)
    opt.close()
    h.close()


@pytest.mark.parametrize("max_norm", [0.0, 0.05, 1e9])
def test_update_in_backward(tmp_path, max_norm):
    """overlap_backward=True, the first two micro-batches in accumulating(): their sums are
    held; the last backward's gradient goes to the update in backward (also held for a
    redo with max_grad_norm: 0.05 clips, so the step is redone from the held sums)."""
    torch.manual_seed(0)
    ref, model = Net(), Net()
    model.load_state_dict(ref.state_dict())
    h = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=4096,
                              grad_host_budget=ALL)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch",
                          overlap_backward=True, max_grad_norm=max_norm)
    for step in range(STEPS):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            for k in range(MICRO):
                if m is model and k < MICRO - 1:
                    with opt.accumulating():
                        loss_of(m, *batch(step, k)).backward()
                else:
                    loss_of(m, *batch(step, k)).backward()
        if max_norm:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
        ropt.step()
        opt.step()
        last = opt.last_step
        if max_norm == 0.05:
            assert last["clip_coef"] < 1.0
        else:
            assert last["tensors_started_early"] > 0 and not last["rolled_back"]
        assert grad_bytes(h) == (0, 0), step
        grads_tests.assert_same(ref, model, h)
    opt.close()
    h.close()


@pytest.mark.parametrize("tier", TIERS)
def test_checkpoint_and_close_with_held_gradients(tmp_path, tier):
    """Gradients are no part of a checkpoint: checkpoints between micro-batches leave the
    held sums as they are; close gives the held sums back as ``p.grad`` (the optimizer's in
    memory from then on, as for stored gradients) and holds nothing more."""
    ref = Mlp()
    model, h = offloaded_mlp(tmp_path, tier, ALL)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    for step in range(2):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            for k, (x, y) in enumerate(micro_batches(step)):
                F.mse_loss(m(x), y).backward()
                if m is model and k == 0:
                    h.checkpoint()
                    opt.checkpoint()
            o.step()
        assert_params(ref, model, h, step)
    assert grad_bytes(h) == (0, 0)
    x, y = micro_batches(5)[0]
    for m in (ref, model):  # one more micro-batch on top of the last step's gradients
        F.mse_loss(m(x), y).backward()
    assert h.stats()["grad_host_bytes"] == 4 * NUMEL
    h.close()
    assert h.grads.host.used == 0
    for p, r in zip(model.parameters(), ref.parameters()):
        assert type(p) is torch.nn.Parameter and torch.equal(p.grad, r.grad)
    opt.close()


def test_offload_init_and_copies_take_the_budget(tmp_path):
    import copy
    with st.offload_init(path=str(tmp_path / "i"), working_set=1024,
                         grad_host_budget="64KiB") as h:
        model = Mlp()
    h.attach(model)
    assert h.grad_host_budget == 64 * 1024
    c = copy.deepcopy(model)
    ch = offload_of(next(c.parameters()))
    assert ch is not h and ch.grad_host_budget == 64 * 1024
    ch.close()
    h.close()


@pytest.mark.parametrize("value,error,match", [
    (-1, ValueError, "grad_host_budget must be >= 0 bytes"),
    ("-1MiB", ValueError, "grad_host_budget '-1MiB' is not a byte size"),
    ("lots", ValueError, "grad_host_budget 'lots' is not a byte size"),
    (1.5, TypeError, "grad_host_budget must be bytes as an int"),
    (None, TypeError, "grad_host_budget must be bytes as an int"),
    (True, TypeError, "grad_host_budget must be bytes as an int"),
])
def test_bad_budgets_are_refused_naming_the_argument(tmp_path, value, error, match):
    with pytest.raises(error, match=match):
        st.offload_parameters(Mlp(), path=str(tmp_path / "p"), grad_host_budget=value)
    with pytest.raises(error, match=match):
        with st.offload_init(path=str(tmp_path / "q"), grad_host_budget=value):
            pass


def test_budget_strings_and_zero(tmp_path):
    for i, (value, want) in enumerate((("256MiB", 256 << 20), (0, 0), ("0", 0), (4096, 4096))):
        h = st.offload_parameters(Mlp(), path=str(tmp_path / f"p{i}"),
                                  grad_host_budget=value)
        assert h.grad_host_budget == want and h.stats()["grad_host_bytes"] == 0
        h.close()


# ---- the p.grad idioms of test_param_offload_grads.py, gradients held --------------------

def _trainable_bytes():
    torch.manual_seed(0)
    return 4 * sum(p.numel() for p in Net().parameters() if p.requires_grad)


@pytest.fixture(params=[(t, b) for t in TIERS for b in ("all", "half")],
                ids=lambda v: f"{v[0]}-{v[1]}")
def setup(request, tmp_path):
    """As test_param_offload_grads.py's: a working set small enough that materialized
    gradients are stored back (here: held again, when they fit) and released."""
    tier, which = request.param
    budget = _trainable_bytes() if which == "all" else _trainable_bytes() // 2
    ref, model = grads_tests.make_pair()
    h = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=4096, tier=tier,
                              grad_host_budget=budget)
    yield ref, model, h
    if which == "all":
        assert h.stats()["grad_bytes_written"] == 0  # every gradient was held
    h.close()


# collected here, they run with this module's ``setup`` fixture (gradients held)
test_clip_grad_value_and_in_place_edits = grads_tests.test_clip_grad_value_and_in_place_edits
test_grad_none_skips_the_parameter = grads_tests.test_grad_none_skips_the_parameter
test_assigning_a_gradient = grads_tests.test_assigning_a_gradient
test_accumulation_with_edits_between_micro_batches = \
    grads_tests.test_accumulation_with_edits_between_micro_batches
test_zero_grad_forms_and_hooks = grads_tests.test_zero_grad_forms_and_hooks
test_foreach_forms = grads_tests.test_foreach_forms
test_hand_written_sgd_reads_the_gradient = grads_tests.test_hand_written_sgd_reads_the_gradient
test_amp_grad_scaler_unscale = grads_tests.test_amp_grad_scaler_unscale
test_max_grad_norm_of_offloaded_parameters_is_clip_grad_norm_over_the_model = \
    grads_tests.test_max_grad_norm_of_offloaded_parameters_is_clip_grad_norm_over_the_model


def test_micro_batches_with_held_gradients_and_edits(setup):
    """3 micro-batches per step, p.grad read and scaled between them."""
    ref, model, h = setup

    def between(m, step):
        m.fc1.weight.grad.mul_(0.5)
        return m.fc2.bias.grad.clone()
    r, s = grads_tests.run(ref, model, h, between, micro=MICRO)
    for a, b in zip(r, s):
        assert torch.equal(a, b)
    grads_tests.assert_same(ref, model, h)


def test_zero3_two_ranks_hold_their_slices(tmp_path):
    """ZeRO-3 (offload_parameters(comm=...)), 2 ranks under strata launch: each rank holds
    the reduced sums of its own slices (zero3_grad_budget_worker.py checks every parameter
    against torch by hand after every step, and 0 gradient bytes moved)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from test_distributed import _check_ranks, _free_port_pair, _strata_cli
    cli = _strata_cli()
    if cli is None:
        pytest.skip("the strata CLI was not found (set STRATA_CLI)")
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "zero3_grad_budget_worker.py")
    cmd = [cli, "launch", "--nproc", "2", "--master-port", str(_free_port_pair()),
           "--timeout", "200", "--", sys.executable, worker, str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=250)
    _check_ranks(r, "zero3-grad-budget", range(2), lambda k: f"[rank {k}] ")
