"""fp32 gradient accumulation of tiled bf16/fp16 parameters (offload_parameters(tile_bytes=),
offload/_tiled_grads.py, offload/_grad_sum.py): with a strata optimizer (its default
``grad_accumulation_dtype=torch.float32``) each backward's weight gradient block (the
parameter's dtype, as torch's backward makes it) is widened and added to the fp32 sum in
the gradient object (4 bytes per element), block by block; ``p.grad`` shows the sum
rounded to the parameter's dtype and the step takes the fp32 sum.

Compared with torch in memory summing each micro-batch's gradient in fp32 by hand
(``sum = g.float()``, then ``sum + g.float()``), then torch.optim.AdamW on fp32 masters, the
parameters being the masters rounded: a tiled bf16 ``nn.Linear`` and a tiled bf16
``nn.Embedding`` (repeated ids, a padding row), 3 micro-batches per step, zero_grad with and without set_to_none --
``p.grad``, the parameters and the fp32 masters bit-identical (torch.equal) at every step;
also after edits of ``p.grad`` (``mul_``, ``add_``) between micro-batches, and under
OffloadOptimizer(torch.optim.AdamW) (which steps a tiled parameter whole from its sum).
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import strata
import strata.torch as st

V, D = 1000, 64  # the tiled parameters: 1000 x 64 bf16 = 128000 bytes
TILE = 32 * 1024  # 256 rows per block -> 4 blocks
MICRO = 3
STEPS = 3


class Head(nn.Module):
    """A tiled Linear(D, V) (its bias not tiled), bf16, on inputs that need no gradient
    (a tiled Linear's input gradient sums its blocks in another order than torch:
    docs/offload.md "Tiling")."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l2 = nn.Linear(D, V)
        self.bfloat16()

    def forward(self, x):
        return self.l2(x.bfloat16()).float()


class Lookup(nn.Module):
    """A tiled Embedding(V, D) (padding row 3) and a small Linear (not tiled), bf16."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(V, D, padding_idx=3)
        self.fc = nn.Linear(D, 4)
        self.bfloat16()

    def forward(self, idx):
        return self.fc(torch.tanh(self.emb(idx))).float()


def _batches(kind):
    """STEPS steps of MICRO micro-batches (input, target)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        mb = []
        for _ in range(MICRO):
            if kind == "linear":
                mb.append((torch.randn(16, D, generator=g), torch.randn(16, V, generator=g)))
            else:
                idx = torch.randint(0, V, (4, 16), generator=g)
                idx[0, :3] = 3  # the padding row, and repeated ids
                idx[1, :5] = 7
                mb.append((idx, torch.randn(4, 16, 4, generator=g)))
        out.append(mb)
    return out


MODELS = {"linear": Head, "embedding": Lookup}


def _reference(kind, zero_to_none, fp32_sum=True, edit=None):
    """torch by hand: each micro-batch's gradient (autograd's, bf16) summed in fp32 (``+ 0.0``
    first after a zero_grad(set_to_none=False), as torch adds to zeros), or by torch in bf16
    (``fp32_sum`` False); AdamW on fp32 masters; the parameters the masters rounded.
    ``edit`` (op, c, k): ``p.grad.<op>(c)`` after micro-batch k of the first step -- the sum
    becomes p.grad's values (the sum rounded, edited in bf16) widened. Returns (params,
    masters, sums) after each step."""
    ref = MODELS[kind]()
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    topt = torch.optim.AdamW(masters, lr=1e-2)
    out = []
    for step, mb in enumerate(_batches(kind)):
        sums = [None] * len(masters)
        for p in ref.parameters():
            p.grad = None
        for k, (x, y) in enumerate(mb):
            if fp32_sum:
                for p in ref.parameters():
                    p.grad = None  # this micro-batch's gradient alone
            F.mse_loss(ref(x), y).backward()
            if fp32_sum:
                zeroed = k == 0 and step > 0 and not zero_to_none
                sums = [p.grad.float() + 0.0 if zeroed else
                        p.grad.float() if t is None else t + p.grad.float()
                        for p, t in zip(ref.parameters(), sums)]
                if edit is not None and step == 0 and k == edit[2]:
                    sums = [getattr(t.to(torch.bfloat16), edit[0])(edit[1]).float()
                            for t in sums]
        if not fp32_sum:
            sums = [p.grad.float() for p in ref.parameters()]
        for m, t in zip(masters, sums):
            m.grad = t.clone()
        topt.step()
        with torch.no_grad():
            for p, m in zip(ref.parameters(), masters):
                p.copy_(m)
        out.append(([p.detach().clone() for p in ref.parameters()],
                    [m.detach().clone() for m in masters], sums))
    return out


def _offloaded(kind, tmp_path, **opt_kw):
    model = MODELS[kind]()
    store = strata.Store.open(str(tmp_path / "s"), chunk_size="64KiB")
    h = st.offload_parameters(model, store, working_set="256KiB", tile_bytes=TILE)
    tiled = [s.name for s in h.ws.records if s.tile is not None]
    assert tiled == (["l2.weight"] if kind == "linear" else ["emb.weight"])
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch",
                          **opt_kw)
    return model, h, opt


@pytest.mark.parametrize("zero_to_none", [True, False])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_tiled_fp32_accumulation_equals_torch_by_hand(tmp_path, kind, zero_to_none):
    want = _reference(kind, zero_to_none)
    other = _reference(kind, zero_to_none, fp32_sum=False)
    assert any(not torch.equal(a, b) for a, b in zip(want[-1][0], other[-1][0])), \
        "the data must tell fp32 accumulation from torch's"
    model, h, opt = _offloaded(kind, tmp_path)
    for step, mb in enumerate(_batches(kind)):
        opt.zero_grad(set_to_none=zero_to_none)
        for x, y in mb:
            F.mse_loss(model(x), y).backward()
        for i, (p, t) in enumerate(zip(model.parameters(), want[step][2])):
            # p.grad: the fp32 sum rounded to bf16 (nearest even)
            assert p.grad.dtype == torch.bfloat16, (step, i)
            assert torch.equal(p.grad.clone(), t.to(torch.bfloat16)), (step, i)
        opt.step()
        for i, (p, r) in enumerate(zip(model.parameters(), want[step][0])):
            assert torch.equal(h.read(p), r), (step, i)
    state = opt.state_dict()["state"]
    for i, m in enumerate(want[-1][1]):
        assert torch.equal(state[i]["master_param"].view(m.shape), m), i
    assert h.stats()["peak_working_set_bytes"] <= h.working_set_bytes
    opt.close()
    h.close()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_tiled_gradient_object_holds_the_fp32_sum(tmp_path, kind):
    """4 bytes per element by default, written block by block (``grad_bytes_written``: each
    block once per backward, no whole-object write); 2 with ``"param"``, torch's own
    accumulation in bf16."""
    for mode, elem in ((None, 4), ("param", 2)):
        model, h, opt = _offloaded(kind, tmp_path / str(elem), grad_accumulation_dtype=mode)
        name = "l2.weight" if kind == "linear" else "emb.weight"
        p = dict(model.named_parameters())[name]
        x, y = _batches(kind)[0][0]
        for _ in range(2):
            F.mse_loss(model(x), y).backward()
        h.flush_grads()
        assert h.store.stat(f"params/{name}#grad").nbytes == p.numel() * elem, mode
        opt.close()
        h.close()


def test_param_option_keeps_torchs_bf16_accumulation(tmp_path):
    want = _reference("linear", True, fp32_sum=False)
    model, h, opt = _offloaded("linear", tmp_path, grad_accumulation_dtype="param")
    for step, mb in enumerate(_batches("linear")):
        opt.zero_grad(set_to_none=True)
        for x, y in mb:
            F.mse_loss(model(x), y).backward()
        opt.step()
        for i, (p, r) in enumerate(zip(model.parameters(), want[step][0])):
            assert torch.equal(h.read(p), r), (step, i)
    opt.close()
    h.close()


@pytest.mark.parametrize("edit", [("mul_", 0.5, 0), ("mul_", 0.5, MICRO - 1),
                                  ("add_", 1e-3, 0), ("add_", 1e-3, MICRO - 1)])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_edits_of_p_grad_make_the_sum_p_grads_values(tmp_path, kind, edit):
    """``p.grad.mul_(c)`` (a recorded scaling) or ``add_(c)`` (the values materialized and
    edited) after the first or the last micro-batch: the next backward adds to p.grad's
    values widened (block by block from the object, or from memory), or the step takes
    them: as torch by hand."""
    op, c, at = edit
    want = _reference(kind, True, edit=edit)
    model, h, opt = _offloaded(kind, tmp_path)
    for step, mb in enumerate(_batches(kind)):
        opt.zero_grad(set_to_none=True)
        for k, (x, y) in enumerate(mb):
            F.mse_loss(model(x), y).backward()
            if step == 0 and k == at:
                for p in model.parameters():
                    getattr(p.grad, op)(c)
        for i, (p, t) in enumerate(zip(model.parameters(), want[step][2])):
            assert torch.equal(p.grad.clone(), t.to(torch.bfloat16)), (step, i)
        opt.step()
        for i, (p, r) in enumerate(zip(model.parameters(), want[step][0])):
            assert torch.equal(h.read(p), r), (step, i)
    state = opt.state_dict()["state"]
    for i, m in enumerate(want[-1][1]):
        assert torch.equal(state[i]["master_param"].view(m.shape), m), i
    opt.close()
    h.close()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_offload_optimizer_steps_the_fp32_sums_of_tiled_parameters(tmp_path, kind):
    """OffloadOptimizer(torch.optim.AdamW) steps a tiled parameter whole (its fp32 sum read
    from the gradient object): as torch by hand too."""
    from strata.torch.optim import OffloadOptimizer
    want = _reference(kind, True)
    model = MODELS[kind]()
    store = strata.Store.open(str(tmp_path / "s"), chunk_size="64KiB")
    h = st.offload_parameters(model, store, working_set="256KiB", tile_bytes=TILE)
    opt = OffloadOptimizer(torch.optim.AdamW, model.parameters(), path=str(tmp_path / "o"),
                           lr=1e-2)
    for step, mb in enumerate(_batches(kind)):
        opt.zero_grad(set_to_none=True)
        for x, y in mb:
            F.mse_loss(model(x), y).backward()
        opt.step()
        for i, (p, r) in enumerate(zip(model.parameters(), want[step][0])):
            assert torch.equal(h.read(p), r), (step, i)
    opt.close()
    h.close()
