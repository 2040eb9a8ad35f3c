"""The gradient finiteness test of parameter offload (strata.torch._common.all_finite,
the cheap stand-in for torch.isfinite(g).all() run on every gradient in backward): exactly
torch's answer for NaN and infinities anywhere, for finite values whose norm overflows, in
every floating dtype; and the offloaded step skipped exactly when a gradient is not finite,
with clipping on and off."""

import pytest
import torch

import strata.torch as st
from strata.torch._common import all_finite

BAD = (float("nan"), float("inf"), float("-inf"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16])
@pytest.mark.parametrize("n", [1, 5, 4099])
def test_matches_torch_isfinite(dtype, n):
    g = torch.Generator().manual_seed(n)
    base = torch.randn(n, generator=g).to(dtype)
    assert all_finite(base) is True
    for pos in sorted({0, n // 2, n - 1}):
        for bad in BAD:
            t = base.clone()
            t[pos] = bad
            assert all_finite(t) is False, (dtype, n, pos, bad)
            assert all_finite(t, torch.norm(t, 2.0)) is False
            strided = torch.stack([t, base], 1)[:, 0]  # non-contiguous
            assert all_finite(strided) is False
    # finite values whose L2 norm overflows: the exact test decides (finite)
    big = torch.full((n + 1,), torch.finfo(dtype).max / 2, dtype=dtype)
    assert not torch.isfinite(torch.norm(big, 2.0)) or dtype == torch.float64
    assert all_finite(big) is True
    big[-1] = float("nan")
    assert all_finite(big) is False


@pytest.mark.parametrize("clip", [0.0, 1.0])
@pytest.mark.parametrize("value, skipped", [(float("nan"), True), (float("inf"), True),
                                            (3e38, False), (0.5, False)])
def test_offloaded_step_skips_exactly_the_non_finite(tmp_path, clip, value, skipped):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)
    h = st.offload_parameters(model, path=str(tmp_path / "p"), working_set="1MiB")
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, path=str(tmp_path / "o"),
                          max_grad_norm=clip)
    try:
        before = h.read(model.weight)
        x = torch.ones(2, 6)
        x[1, 3] = value  # reaches one column of weight's gradient (and the bias' through it)
        loss = (model(x) * torch.tensor([1.0, 0.0, 0.0, 0.0])).sum()
        loss.backward()
        g = h.grad(model.weight)
        assert bool(torch.isfinite(g).all()) is not skipped
        opt.step()
        assert opt.last_step["skipped"] is skipped
        assert torch.equal(h.read(model.weight), before) is skipped
    finally:
        opt.close()
        h.close()
