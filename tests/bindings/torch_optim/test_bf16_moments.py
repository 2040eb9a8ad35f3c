"""OffloadAdamW(state_dtype=torch.bfloat16): bf16 moments in the store. Bit for bit against
torch.optim.AdamW done by hand with its moments rounded to bf16 (nearest even, torch's
.bfloat16()) after every step; nvme and host tiers, a resume in the middle; the step's
bytes (8 instead of 12 per parameter each way); state[p] shows fp32 tensors of bf16
values; a resume with another state dtype and bad dtypes are refused."""

import pytest
import torch

import strata
import strata.torch as st

TIERS = ["nvme", "host"]


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 8))


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g))
            for _ in range(n)]


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def round_moments_to_bf16(opt):
    """The reference's rounding: every moment to bf16 and back (exact widening)."""
    for s in opt.state.values():
        for k in MOMENTS:
            if k in s:
                s[k].copy_(s[k].to(torch.bfloat16).to(torch.float32))


def ref_step(model, opt, x, y):
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    round_moments_to_bf16(opt)


def strata_step(model, opt, x, y):
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()


def assert_same(ref, topt, model, sopt):
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a, b)
        ts, ss = topt.state[a], sopt.state[b]
        assert set(k for k in MOMENTS if k in ts) == set(k for k in MOMENTS if k in ss)
        for k in (k for k in MOMENTS if k in ts):
            assert ss[k].dtype == torch.float32
            assert torch.equal(ts[k], ss[k]), k
            # bf16 values: widening their bf16 rounding changes nothing
            assert torch.equal(ss[k].to(torch.bfloat16).to(torch.float32), ss[k])


@pytest.mark.parametrize("amsgrad", [False, True], ids=["adamw", "amsgrad"])
@pytest.mark.parametrize("tier", TIERS)
def test_bit_identical_to_adamw_with_moments_rounded_to_bf16_and_resume(tmp_path, tier,
                                                                        amsgrad):
    ref, model = make_model(), make_model()
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, amsgrad=amsgrad)
    path = str(tmp_path / "s")
    kw = dict(lr=1e-2, weight_decay=0.1, amsgrad=amsgrad, tier=tier, arithmetic="torch",
              state_dtype=torch.bfloat16, sub_group_numel=1000)
    sopt = st.OffloadAdamW(model.parameters(), path=path, **kw)
    data = batches(6)
    for x, y in data[:3]:
        ref_step(ref, topt, x, y)
        strata_step(model, sopt, x, y)
        assert_same(ref, topt, model, sopt)
    sopt.close()
    # A resume with fp32 moments is refused, naming both dtypes.
    with pytest.raises(strata.FailedPreconditionError, match="holds bf16 optimizer states"):
        st.OffloadAdamW(model.parameters(), path=path, resume=True, tier=tier,
                        amsgrad=amsgrad, arithmetic="torch", sub_group_numel=1000)
    sopt = st.OffloadAdamW(model.parameters(), path=path, resume=True, **kw)
    for x, y in data[3:]:
        ref_step(ref, topt, x, y)
        strata_step(model, sopt, x, y)
        assert_same(ref, topt, model, sopt)
    sopt.close()


def step_bytes(tmp_path, name, state_dtype):
    model = make_model()
    numel = sum(p.numel() for p in model.parameters())
    sopt = st.OffloadAdamW(model.parameters(), lr=1e-2, path=str(tmp_path / name),
                           tier="nvme", state_dtype=state_dtype)
    x, y = batches(1)[0]
    strata_step(model, sopt, x, y)
    r, w = sopt.last_step["bytes_read"], sopt.last_step["bytes_written"]
    sopt.close()
    return numel, r, w


def test_step_bytes_are_eight_instead_of_twelve_per_parameter(tmp_path):
    n, r32, w32 = step_bytes(tmp_path, "f", torch.float32)
    _, r16, w16 = step_bytes(tmp_path, "b", torch.bfloat16)
    assert (r32, w32) == (12 * n, 12 * n)
    assert (r16, w16) == (8 * n, 8 * n)


def test_bad_state_dtype_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="state_dtype must be torch.float32 or torch.bfloat16"):
        st.OffloadAdamW(make_model().parameters(), path=str(tmp_path / "s"),
                        state_dtype=torch.float16)


def test_load_state_dict_rounds_moments_to_bf16(tmp_path):
    ref, model = make_model(), make_model()
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    x, y = batches(1)[0]
    strata_step(ref, topt, x, y)  # fp32 moments, not rounded
    sopt = st.OffloadAdamW(model.parameters(), lr=1e-2, path=str(tmp_path / "s"),
                           state_dtype="bf16")
    sopt.load_state_dict(topt.state_dict())
    for a, b in zip(ref.parameters(), model.parameters()):
        for k in ("exp_avg", "exp_avg_sq"):
            want = topt.state[a][k].to(torch.bfloat16).to(torch.float32)
            assert torch.equal(sopt.state[b][k], want)
    sopt.close()


@pytest.mark.parametrize("placement", ["nvme", "host"])
def test_low_level_offloaded_optimizer_state_dtype(tmp_path, placement):
    """strata.OffloadedOptimizer(state_dtype="bf16"): step bytes, read_state/write_state
    convert, resume needs the same dtype (torch.bfloat16 accepted too)."""
    import numpy as np
    n = 5000
    store = strata.Store.open(str(tmp_path / "s"))
    opt = strata.OffloadedOptimizer.create(store, "adamw", {"lr": 1e-2},
                                           sub_group_numel=1024, state_dtype="bf16")
    h = opt.add_param("w", n, np.linspace(-1, 1, n, dtype=np.float32), placement=placement)
    g = np.linspace(-0.5, 0.5, n, dtype=np.float32)
    opt.set_grad(h, g)
    stats = opt.step()
    if placement == "nvme":
        assert (stats["bytes_read"], stats["bytes_written"]) == (8 * n, 8 * n)
    m = opt.read_state(h, 0)
    assert m.dtype == np.float32
    want = torch.from_numpy(g * np.float32(0.1)).to(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(m, want)  # exp_avg after step 1: (1 - beta1) * g, rounded
    v = np.full(n, 1.0 + 1.0 / 256.0, dtype=np.float32)  # a tie: rounds to even, 1.0
    opt.write_state(h, 1, v)
    assert np.array_equal(opt.read_state(h, 1), np.ones(n, dtype=np.float32))
    opt.close()
    with pytest.raises(strata.FailedPreconditionError, match="state_dtype is fp32"):
        strata.OffloadedOptimizer.resume(store, "adamw")
    opt = strata.OffloadedOptimizer.resume(store, "adamw", state_dtype=torch.bfloat16)
    assert np.array_equal(opt.read_state(h, 0), want)
    opt.close()
    with pytest.raises(strata.InvalidArgumentError, match="state_dtype fp16 is not supported"):
        strata.OffloadedOptimizer.create(store, "adamw", key_prefix="other/",
                                         state_dtype="fp16")
    store.close()
