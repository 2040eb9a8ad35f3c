"""OffloadOptimizer's fp32 masters of fp16/bf16 parameters in its state dicts
(optim/_any_io.py; docs/guide-optimizers.md "Mixed precision"): ``state_dict()`` shows each
master as ``master_param`` (as OffloadAdam/AdamW do), equal to torch by hand's fp32 masters;
``load_state_dict`` of it into a fresh optimizer restores masters and state bit for bit (not
cast to the parameter's dtype as torch.optim's load casts), and training goes on identically;
a state dict without masters (the class in memory's) takes the parameters' values; a
``master_param`` of another size is refused before anything is written."""
import pytest
import torch
import torch.nn.functional as F

from strata.torch.optim import OffloadOptimizer
from test_mixed_precision import Net, _batches, _reference, _train

CASES = [
    (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
]
IDS = ["SGD-momentum", "AdamW"]


def _equal_dicts(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert sorted(a["state"]) == sorted(b["state"])
    for i in a["state"]:
        assert sorted(a["state"][i]) == sorted(b["state"][i]), i
        for k, v in a["state"][i].items():
            w = b["state"][i][k]
            if torch.is_tensor(v):
                assert v.dtype == w.dtype and torch.equal(v, w), (i, k)
            else:
                assert v == w, (i, k)


def _masters(opt, model):
    return [torch.from_numpy(opt._core.read_param(opt._handle[id(p)])).view(p.shape)
            for p in model.parameters()]


@pytest.mark.parametrize("tier", ["nvme", "host"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls, kw", CASES, ids=IDS)
def test_state_dict_masters_round_trip(tmp_path, tier, dtype, cls, kw):
    want = _reference(dtype, lambda m: cls(m, **kw))
    model, opt = _train(dtype, lambda m: OffloadOptimizer(
        cls, m.parameters(), path=str(tmp_path / "a"), tier=tier, **kw), want)
    sd = opt.state_dict()
    # torch by hand's masters and state (the class on fp32 masters)
    ref_masters = want[-1][1]
    for i, m in enumerate(ref_masters):
        st = sd["state"][i]
        assert st["master_param"].dtype == torch.float32
        assert torch.equal(st["master_param"], m), i
        assert not torch.equal(st["master_param"].to(dtype).float(), m), \
            f"{i}: the master must hold more than the rounded parameter"
    # a fresh model and optimizer: the model's values, then the optimizer's state dict
    fresh = Net(dtype)
    fresh.load_state_dict(model.state_dict())
    opt2 = OffloadOptimizer(cls, fresh.parameters(), path=str(tmp_path / "b"), tier=tier,
                            **kw)
    opt2.load_state_dict(sd)
    _equal_dicts(opt2.state_dict(), sd)
    for got, m in zip(_masters(opt2, fresh), ref_masters):
        assert torch.equal(got, m)
    # one more step on both: identical (the masters, not the rounded parameters, stepped)
    x, y = _batches(1)[0][0]
    for mm, o in ((model, opt), (fresh, opt2)):
        o.zero_grad(set_to_none=True)
        F.mse_loss(mm(x), y).backward()
        o.step()
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a.detach(), b.detach())
    _equal_dicts(opt2.state_dict(), opt.state_dict())
    opt.close()
    opt2.close()


def test_a_state_dict_without_masters_takes_the_parameters(tmp_path):
    kw = dict(lr=0.05, momentum=0.9)
    want = _reference(torch.bfloat16, lambda m: torch.optim.SGD(m, **kw))
    model, opt = _train(torch.bfloat16, lambda m: OffloadOptimizer(
        torch.optim.SGD, m.parameters(), path=str(tmp_path / "a"), tier="host", **kw), want)
    sd = opt.state_dict()
    assert any(not torch.equal(m, p.detach().float())
               for m, p in zip(_masters(opt, model), model.parameters()))
    for st in sd["state"].values():
        del st["master_param"]  # as the class in memory's state dict
    opt.load_state_dict(sd)
    for got, p in zip(_masters(opt, model), model.parameters()):
        assert torch.equal(got, p.detach().float())
    opt.close()


def test_a_master_of_another_size_is_refused(tmp_path):
    kw = dict(lr=0.05, momentum=0.9)
    want = _reference(torch.bfloat16, lambda m: torch.optim.SGD(m, **kw))
    model, opt = _train(torch.bfloat16, lambda m: OffloadOptimizer(
        torch.optim.SGD, m.parameters(), path=str(tmp_path / "a"), tier="host", **kw), want)
    before = opt.state_dict()
    bad = opt.state_dict()
    bad["state"][1]["master_param"] = torch.zeros(3)
    bad["state"][0]["momentum_buffer"] = torch.zeros_like(bad["state"][0]["momentum_buffer"])
    with pytest.raises(ValueError, match="master_param of parameter 1 has 3 elements"):
        opt.load_state_dict(bad)
    _equal_dicts(opt.state_dict(), before)  # nothing written
    opt.close()


def test_fp32_parameters_have_no_master_param(tmp_path):
    model = Net(torch.float32)
    opt = OffloadOptimizer(torch.optim.SGD, model.parameters(), lr=0.1, momentum=0.9,
                           path=str(tmp_path / "a"), tier="host")
    x, y = _batches(1)[0][0]
    F.mse_loss(model(x), y).backward()
    opt.step()
    sd = opt.state_dict()
    ref = torch.optim.SGD(Net(torch.float32).parameters(), lr=0.1, momentum=0.9)
    ref.load_state_dict(sd)  # loads into the class in memory
    for i in range(len(list(model.parameters()))):
        assert sorted(sd["state"][i]) == ["momentum_buffer"], i
    opt.close()
