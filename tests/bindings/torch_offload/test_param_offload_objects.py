"""The offloaded parameter object as torch users expect it (issue 24, items 5, 6, 8, 10):
inference_mode forwards leave no inference tensors, torch's fused fast paths give torch's
numbers, deepcopy / AveragedModel / EMA copies live in the same store, torch.save and
pickling, repr, memory formats, the LSTM exception to the working-set bound, and bad
arguments. Every value is compared with the same model in memory (torch.equal)."""

import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import strata
import strata.torch as st
from strata.torch.offload import OffloadedParameter, is_offloaded, offload_of

TIERS = ["nvme", "host"]


def pair(make, tmp_path, tier="nvme", working_set=4096, **kw):
    """(offloaded model, the same model in memory, handle)."""
    torch.manual_seed(0)
    ref = make()
    model = copy.deepcopy(ref)
    h = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=working_set,
                              tier=tier, **kw)
    return model, ref, h


def same_params(a, b):
    pa, pb = list(a.parameters()), list(b.parameters())
    return len(pa) == len(pb) and all(torch.equal(x, y) for x, y in zip(pa, pb))


def sgd_step(model, opt, x):
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    return loss.detach()


class NormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6 * 6 * 6, 8)
        self.ln = nn.LayerNorm(8)

    def forward(self, x):
        return self.ln(self.fc(F.relu(self.bn(self.conv(x))).flatten(1)))


@pytest.mark.parametrize("tier", TIERS)
def test_inference_mode_then_training(tmp_path, tier):
    model, ref, h = pair(NormNet, tmp_path, tier)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    for step in range(3):
        for m in (model, ref):
            m.eval()
        with torch.inference_mode():
            a, b = model(x), ref(x)
        assert torch.equal(a, b)
        # what inference_mode materialized is a normal tensor (not an inference tensor)
        for p in model.parameters():
            with torch._C.DisableTorchFunction():
                assert not torch.is_inference(p.data)
        for m in (model, ref):
            m.train()
        la, lb = (sgd_step(m, o, x) for m, o in zip((model, ref), opts))
        assert torch.equal(la, lb)
    assert same_params(model, ref)
    h.close()
    assert same_params(model, ref)


def encoder():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, 2), nn.Linear(16, 4))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_fused_fast_paths_give_torchs_numbers(tmp_path, tier, ctx):
    model, ref, h = pair(encoder, tmp_path, tier, working_set=4096)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    for step in range(2):
        for m in (model, ref):
            m.eval()
        with ctx():
            assert torch.equal(model(x), ref(x))
            assert torch.equal(model[0](x, src_key_padding_mask=mask),
                               ref[0](x, src_key_padding_mask=mask))
            mha, mref = model[0].layers[1].self_attn, ref[0].layers[1].self_attn
            assert torch.equal(mha(x, x, x, need_weights=False)[0],
                               mref(x, x, x, need_weights=False)[0])
        assert all(type(p) is OffloadedParameter for p in model.parameters())
        for m in (model, ref):
            m.train()
        assert torch.equal(*(sgd_step(m, o, x) for m, o in zip((model, ref), opts)))
    assert same_params(model, ref)
    h.close()


def test_fast_path_sees_in_place_edits_and_recovers_from_errors(tmp_path):
    model, ref, h = pair(encoder, tmp_path)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(3))

    def scale(module, inputs, output):  # an edit while the parameters are presented plain
        module.linear1.weight.mul_(0.5)

    for m in (model, ref):
        m.eval()
        m[0].layers[0].register_forward_hook(scale)
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
    with torch.no_grad(), pytest.raises(Exception):
        model[0].layers[1].self_attn(x[:, :, :3], x, x)  # a bad shape: forward raises
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))  # presented parameters undone, values kept
    assert all(type(p) is OffloadedParameter for p in model.parameters())
    h.release_all()
    assert same_params(model, ref)
    h.close()


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 8)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 12, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(torch.tanh(self.fc(self.emb(x))))


@pytest.mark.parametrize("tier", TIERS)
def test_deepcopy_ema_and_averaged_model_in_the_same_store(tmp_path, tier):
    model, ref, h = pair(Tied, tmp_path, tier, working_set=512)
    x = torch.randint(0, 12, (4, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model.fc.weight.add_(1.0)  # a materialized, edited value: the copy takes it
        ref.fc.weight.add_(1.0)
    ema, ema_ref = copy.deepcopy(model), copy.deepcopy(ref)
    ch = offload_of(ema.fc.weight)
    assert ch is not None and ch is not h and ch.store is h.store
    assert ch.key_prefix == "params/#copy1/"
    assert sorted(h.store.keys("params/#copy1/")) == [
        "params/#copy1/emb.weight", "params/#copy1/fc.bias", "params/#copy1/fc.weight"]
    assert ema.head.weight is ema.emb.weight  # tied stays tied
    assert all(is_offloaded(p) for p in ema.parameters())
    assert same_params(ema, ema_ref)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    for step in range(3):
        for m, o in zip((model, ref), opts):
            o.zero_grad()
            F.cross_entropy(m(x).reshape(-1, 12), x.reshape(-1)).backward()
            o.step()
        with torch.no_grad():
            for e, m in ((ema, model), (ema_ref, ref)):
                for pe, p in zip(e.parameters(), m.parameters()):
                    pe.mul_(0.9).add_(p, alpha=0.1)
    assert same_params(ema, ema_ref)
    assert same_params(model, ref)
    assert torch.equal(ema(x), ema_ref(x))  # the copy's own hooks and working set
    assert ch.stats()["bytes_fetched"] > 0
    avg, avg_ref = (torch.optim.swa_utils.AveragedModel(m) for m in (model, ref))
    assert offload_of(next(avg.parameters())).key_prefix == "params/#copy2/"
    for step in range(2):
        avg.update_parameters(model)
        avg_ref.update_parameters(ref)
    assert same_params(avg, avg_ref)
    ch.close()  # back in memory, its objects deleted
    assert not any(is_offloaded(p) for p in ema.parameters())
    assert h.store.keys("params/#copy1/") == []
    assert len(ema._forward_pre_hooks) == 0
    assert same_params(ema, ema_ref)
    h.close()  # the store closes: the AveragedModel's offload is closed (restored) first
    assert not any(is_offloaded(p) for p in avg.parameters())
    assert same_params(avg, avg_ref)


def test_deepcopy_refused_after_close(tmp_path):
    model, ref, h = pair(Tied, tmp_path)
    h.close(restore=False)
    with pytest.raises(strata.FailedPreconditionError):
        copy.deepcopy(model)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


@pytest.mark.parametrize("tier", TIERS)
def test_torch_save_model_and_state_dict(tmp_path, tier):
    make = lambda: ConvNet().to(memory_format=torch.channels_last)  # noqa: E731
    model, ref, h = pair(make, tmp_path, tier, working_set=1024)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert all(type(p) is nn.Parameter for p in loaded.parameters())
    assert same_params(loaded, ref)
    assert loaded.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(loaded(x), ref(x))  # its (dropped) strata hooks do nothing
    loaded.zero_grad()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    sd, sd_ref = torch.load(buf), ref.state_dict()
    assert list(sd) == list(sd_ref) and all(torch.equal(sd[k], sd_ref[k]) for k in sd)
    p = pickle.loads(pickle.dumps(model.fc.weight))
    assert type(p) is nn.Parameter and torch.equal(p, ref.fc.weight)
    assert all(is_offloaded(q) for q in model.parameters())  # the model is unchanged
    h.close()


def test_pickle_refused_above_available_memory(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples"))
    from memory_limit import MemoryLimit, MemoryLimitUnavailable
    child = textwrap.dedent(f"""
        import io, torch, torch.nn as nn, strata, strata.torch as st
        from strata.torch.offload._memory import available_memory
        n = (available_memory() + (16 << 20)) // 4 // 4 + 1  # 4 fp32 parameters, above it
        with st.offload_init(path={str(tmp_path / 's')!r}, working_set=n * 4) as h:
            model = nn.ParameterList([nn.Parameter(torch.empty(n)) for _ in range(4)])
        h.attach(model)
        try:
            torch.save(model, io.BytesIO())
        except strata.ResourceExhaustedError as e:
            assert "checkpoint()" in str(e) and "read(p)" in str(e), str(e)
            assert "'0'" in str(e), str(e)  # names the parameter
            print("REFUSED")
        h.close(restore=False)
    """)
    try:
        lim = MemoryLimit(320 << 20)
    except MemoryLimitUnavailable as e:
        pytest.skip(f"no memory cgroup: {e}")
    out = tmp_path / "out.txt"
    with lim, open(out, "w") as f:
        rc = lim.run([sys.executable, "-c", child], timeout=120, stdout=f,
                     stderr=subprocess.STDOUT)
    text = out.read_text()
    assert rc == 0, text
    assert text.strip().splitlines()[-1] == "REFUSED", text


def test_repr_reads_like_torchs(tmp_path):
    def make():
        m = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2).to(torch.bfloat16))
        m[1].requires_grad_(False)
        return m
    model, ref, h = pair(make, tmp_path)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert repr(p) == repr(q) and str(p) == str(q)
    assert repr(model) == repr(ref)
    assert h.stats()["bytes_fetched"] == 0  # read without the working set
    h.close()


@pytest.mark.parametrize("tier", TIERS)
def test_channels_last_weights_keep_their_layout(tmp_path, tier):
    make = lambda: ConvNet().to(memory_format=torch.channels_last)  # noqa: E731
    model, ref, h = pair(make, tmp_path, tier, working_set=1024)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    for step in range(2):
        assert torch.equal(*(sgd_step(m, o, x) for m, o in zip((model, ref), opts)))
        w = model.conv.weight
        assert w.is_contiguous(memory_format=torch.channels_last)
        assert w.stride() == ref.conv.weight.stride()
        assert torch.equal(w.grad, ref.conv.weight.grad)
    h.release_all()
    assert same_params(model, ref)
    h.close()
    assert model.conv.weight.stride() == ref.conv.weight.stride()
    assert same_params(model, ref)


def test_lstm_materializes_all_weights_at_once(tmp_path):
    model, ref, h = pair(lambda: nn.LSTM(32, 64, num_layers=2), tmp_path, working_set=65536)
    total = sum(p.numel() * p.element_size() for p in ref.parameters())
    assert total == 233472
    x = torch.randn(5, 3, 32, generator=torch.Generator().manual_seed(7))
    y, _ = model(x)
    y_ref, _ = ref(x)
    y.sum().backward()
    y_ref.sum().backward()
    assert torch.equal(y, y_ref)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))
    # one _VF.lstm call takes all 8 weights: the working set (64 KiB) is exceeded, 3.6x
    assert h.stats()["peak_working_set_bytes"] == total
    h.close()


BAD = [
    (dict(working_set=None), TypeError, "working_set"),
    (dict(working_set=0), ValueError, "working_set"),
    (dict(working_set=-5), ValueError, "working_set"),
    (dict(working_set="lots"), ValueError, "working_set 'lots'"),
    (dict(working_set="0MiB"), ValueError, "working_set"),
    (dict(working_set=True), TypeError, "working_set"),
    (dict(working_set=1e6), TypeError, "working_set"),
    (dict(tier="gpu"), ValueError, "tier"),
    (dict(tier=None), TypeError, "tier"),
    (dict(path=5), TypeError, "path"),
    (dict(path="FILE"), ValueError, "is a file"),
    (dict(key_prefix=""), ValueError, "key_prefix"),
    (dict(key_prefix=3), TypeError, "key_prefix"),
    (dict(key_prefix="a\x00b"), ValueError, "key_prefix"),
    (dict(store="/tmp/x"), TypeError, "store"),
    (dict(comm="gloo"), TypeError, "comm"),
    (dict(prefetch="yes"), TypeError, "prefetch"),
    (dict(resume=1), TypeError, "resume"),
    (dict(overwrite=None), TypeError, "overwrite"),
    (dict(average_gradients=0), TypeError, "average_gradients"),
]


@pytest.mark.parametrize("kwargs,exc,text", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_arguments_name_themselves(tmp_path, kwargs, exc, text):
    if kwargs.get("path") == "FILE":
        (tmp_path / "f").write_text("x")
        kwargs = dict(path=str(tmp_path / "f"))
    if "store" not in kwargs:
        kwargs.setdefault("path", str(tmp_path / "s"))
    m = nn.Linear(2, 2)
    with pytest.raises(exc) as e:
        st.offload_parameters(m, **kwargs)
    assert text in str(e.value)
    assert not is_offloaded(m.weight)
    if "overwrite" not in kwargs:  # offload_init takes the same arguments (but overwrite)
        with pytest.raises(exc) as e:
            with st.offload_init(**kwargs):
                pass
        assert text in str(e.value)
