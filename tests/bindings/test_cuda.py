"""strata with CUDA tensors: OffloadAdamW on CUDA parameters against torch.optim.AdamW on the
same CUDA parameters, and the store's device tier fed from and read into CUDA tensors.
Skips without CUDA (ctest: bindings.pytest_gpu, label gpu)."""
import pytest
import torch

import strata
import strata.torch as st

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _model(dtype, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5))
    return m.to(device="cuda", dtype=dtype)


def _batches(n, dtype):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 32, generator=g).to("cuda", dtype),
             torch.randint(0, 5, (16,), generator=g).cuda()) for _ in range(n)]


def _train(model, opt, batches):
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("tier", ["nvme", "host"])
def test_offload_adamw_on_cuda_parameters_tracks_torch(tmp_path, tier):
    torch.backends.cuda.matmul.allow_tf32 = False
    m1, m2 = _model(torch.float32), _model(torch.float32)
    o1 = st.OffloadAdamW(m1.parameters(), lr=1e-2, path=str(tmp_path / "s"), tier=tier,
                         arithmetic="torch")
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    batches = _batches(10, torch.float32)
    l1, l2 = _train(m1, o1, batches), _train(m2, o2, batches)
    assert all(p.is_cuda for p in m1.parameters())
    diff = max((a - b).abs().max().item() for a, b in zip(m1.parameters(), m2.parameters()))
    assert diff <= 1e-5, diff
    assert abs(l1[-1] - l2[-1]) <= 1e-5 * max(1.0, abs(l2[-1]))
    numel = sum(p.numel() for p in m1.parameters())
    # every step: the gradients down, the updated weights up
    assert o1.bytes_moved["device_to_host"] == 10 * numel * 4
    assert o1.bytes_moved["host_to_device"] == 10 * numel * 4
    o1.close()


def test_bf16_cuda_parameters_receive_the_rounded_masters(tmp_path):
    m = _model(torch.bfloat16)
    o = st.OffloadAdamW(m.parameters(), lr=1e-2, path=str(tmp_path / "s"))
    losses = _train(m, o, _batches(1, torch.bfloat16) * 10)
    assert losses[-1] < losses[0]
    sd = o.state_dict()
    for i, p in enumerate(m.parameters()):
        assert p.is_cuda and p.dtype == torch.bfloat16
        assert torch.equal(sd["state"][i]["master_param"].to(torch.bfloat16), p.detach().cpu())
    o.close()


def test_device_tier_from_and_into_cuda_tensors(tmp_path):
    with strata.Store.open(str(tmp_path / "s"), device_budget="64MiB", host_budget="64MiB",
                           chunk_size="1MiB") as s:
        assert s.has_device()
        x = torch.randn(3 << 20, device="cuda")  # 12 MiB, spans chunks
        torch.cuda.synchronize()  # strata copies on its own stream
        s.put("x", x, tier="device")
        assert s.stat("x").tier == "device"
        out = torch.empty_like(x)
        s.get_into("x", out)
        assert torch.equal(out, x)
        for tier in ("host", "nvme", "device"):  # down the tiers and back up
            s.move("x", tier)
            assert s.stat("x").tier == tier
            out.zero_()
            s.get_into("x", out)
            assert torch.equal(out, x)
        host = torch.empty(x.numel())
        s.get_into("x", host)  # device tier -> host tensor
        assert torch.equal(host, x.cpu())
