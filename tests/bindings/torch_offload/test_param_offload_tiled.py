"""Tiling (offload_parameters(tile_bytes=...)): a parameter larger than tile_bytes that
F.linear / F.embedding use is computed block by block, its gradient written block by block
into its gradient object and stepped by strata's optimizer from there. Compared with torch
in memory on the same data: F.embedding (forward, gradient, training with OffloadAdamW) bit
for bit; F.linear within summation-order differences (the BLAS computes a column block of a
product in another order than the whole product: docs/offload.md, "Tiling"), its bias
gradient bit for bit.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import strata
import strata.torch as st

V, D = 1000, 64  # the tiled parameters: 1000 x 64 fp32 = 256000 bytes
TILE = 32 * 1024  # 128 rows per block -> 8 blocks


class Lookup(nn.Module):
    """An embedding (tiled) and a small Linear (not tiled)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D, padding_idx=3)
        self.fc = nn.Linear(D, 4)

    def forward(self, idx):
        return self.fc(torch.tanh(self.emb(idx)))


class Tied(nn.Module):
    """An embedding whose weight is also the output head (F.linear), and a Linear head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.head = nn.Linear(D, V)

    def forward(self, idx):
        h = torch.tanh(self.emb(idx))
        return self.head(h) + F.linear(h, self.emb.weight)


def offload(model, tmp_path, **kw):
    store = strata.Store.open(str(tmp_path / "s"), chunk_size="64KiB")
    kw.setdefault("working_set", "256KiB")
    kw.setdefault("tile_bytes", TILE)
    return st.offload_parameters(model, store, **kw)


def batch(step, n=(4, 16)):
    g = torch.Generator().manual_seed(100 + step)
    idx = torch.randint(0, V, n, generator=g)
    idx[0, :3] = 3  # the padding row, and repeated indices
    idx[1, :5] = 7
    return idx, torch.randint(0, 4, n, generator=g)


def test_only_parameters_above_tile_bytes_are_tiled_and_keys_stay(tmp_path):
    torch.manual_seed(0)
    ref, model = Tied(), Tied()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path)
    assert [(s.name, s.tile.nblocks if s.tile else None) for s in h.ws.records] == [
        ("emb.weight", 8), ("head.weight", 8), ("head.bias", None)]
    assert sorted(model.state_dict()) == sorted(ref.state_dict())
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref.state_dict()[k]), k
    assert "params/emb.weight" in h.store


def test_embedding_forward_and_gradient_are_bit_identical(tmp_path):
    torch.manual_seed(0)
    ref, model = Lookup(), Lookup()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path)
    idx, y = batch(0)
    out_ref, out = ref(idx), model(idx)
    assert torch.equal(out, out_ref)
    F.cross_entropy(out_ref.view(-1, 4), y.view(-1)).backward()
    F.cross_entropy(out.view(-1, 4), y.view(-1)).backward()
    for (n, a), b in zip(ref.named_parameters(), model.parameters()):
        assert torch.equal(b.grad, a.grad), n  # no strata optimizer: gradients in p.grad
    assert torch.equal(model.emb.weight.grad[3], torch.zeros(D))  # padding_idx
    st_ = h.stats()
    # forward reads only the rows the ids use, no block; backward reads nothing
    assert st_["tile_blocks_fetched"] == 0
    assert st_["bytes_fetched"] == len(torch.unique(idx)) * D * 4 + (4 * D + 4) * 4
    assert st_["resident_bytes"] <= h.working_set_bytes


def test_linear_within_summation_order_and_bias_exact(tmp_path):
    torch.manual_seed(0)
    ref = nn.Linear(D, V)
    model = copy.deepcopy(ref)
    h = offload(model, tmp_path)
    x = torch.randn(4, 16, D, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    g = torch.randn(4, 16, V)
    o_ref, o = ref(x), model(x2)
    torch.testing.assert_close(o, o_ref, rtol=1e-6, atol=1e-5)
    o_ref.backward(g)
    o.backward(g)
    torch.testing.assert_close(model.weight.grad, ref.weight.grad, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.bias.grad, ref.bias.grad)
    assert h.stats()["tile_blocks_fetched"] == 16  # forward 8, backward 8 (input gradient)


def test_frozen_input_reads_no_blocks_in_backward(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(D, V)
    h = offload(model, tmp_path)
    x = torch.randn(8, D)  # no input gradient: backward needs only x
    model(x).sum().backward()
    assert h.stats()["tile_blocks_fetched"] == 8
    with torch.no_grad():
        model(x)
    assert h.stats()["tile_blocks_fetched"] == 16


def train(model, opt, steps, accumulate=1, zero_to_none=True):
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=zero_to_none)
        for k in range(accumulate):
            idx, y = batch(10 * step + k)
            loss = F.cross_entropy(model(idx).view(-1, 4), y.view(-1))
            loss.backward()
            losses.append(loss.item())
        opt.step()
    return losses


@pytest.mark.parametrize("accumulate,zero_to_none", [(1, True), (3, True), (2, False)])
def test_training_with_offload_adamw_is_bit_identical(tmp_path, accumulate, zero_to_none):
    torch.manual_seed(0)
    ref, model = Lookup(), Lookup()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    assert train(model, opt, 3, accumulate, zero_to_none) == \
        train(ref, ropt, 3, accumulate, zero_to_none)
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), n
    assert torch.equal(opt.state[model.emb.weight]["exp_avg"],
                       ropt.state[ref.emb.weight]["exp_avg"])
    assert h.stats()["resident_bytes"] <= h.working_set_bytes


def test_overlap_backward_steps_tiled_parameters_after_backward(tmp_path):
    torch.manual_seed(0)
    ref, model = Lookup(), Lookup()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch",
                          overlap_backward=True)
    assert train(model, opt, 3) == train(ref, ropt, 3)
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), n
    assert not h.linked(model.emb.weight)


def test_tied_embedding_and_head_train_close_to_torch(tmp_path):
    torch.manual_seed(0)
    ref, model = Tied(), Tied()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, store=h.store, arithmetic="torch")

    def run(m, o):
        out = []
        for step in range(3):
            o.zero_grad()
            idx, _ = batch(step)
            y = torch.randint(0, V, idx.shape, generator=torch.Generator().manual_seed(step))
            loss = F.cross_entropy(m(idx).view(-1, V), y.view(-1))
            loss.backward()
            out.append(loss.item())
            o.step()
        return out

    torch.testing.assert_close(run(model, opt), run(ref, ropt), rtol=1e-6, atol=0)
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(h.read(b), a.detach(), rtol=0, atol=1e-6, msg=n)


def test_clip_grad_norm_of_a_tiled_gradient_is_torchs_up_to_summation_order(tmp_path):
    torch.manual_seed(0)
    ref, model = Lookup(), Lookup()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store)
    idx, y = batch(0)
    for m in (ref, model):
        F.cross_entropy(m(idx).view(-1, 4), y.view(-1)).backward()
    n_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e-3)
    n = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    torch.testing.assert_close(n, n_ref, rtol=1e-6, atol=0)
    opt.step()
    assert opt.last_step["skipped"] is False


def test_embedding_options_it_cannot_tile_are_refused(tmp_path):
    model = nn.Embedding(V, D, max_norm=1.0)
    offload(model, tmp_path)
    with pytest.raises(ValueError, match="emb|weight.*max_norm"):
        model(torch.tensor([1, 2]))


def test_out_of_range_index_is_an_index_error(tmp_path):
    model = nn.Embedding(V, D)
    offload(model, tmp_path)
    with pytest.raises(IndexError, match="out of range"):
        model(torch.tensor([1, V]))


def test_float_ids_are_torchs_runtime_error(tmp_path):
    model = nn.Embedding(V, D)
    offload(model, tmp_path)
    with pytest.raises(RuntimeError) as got:
        model(torch.tensor([1.0, 2.0]))
    with pytest.raises(RuntimeError) as want:
        nn.Embedding(V, D)(torch.tensor([1.0, 2.0]))
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_empty_ids_train_as_torch(tmp_path, shape):
    """An empty id tensor's forward is empty and its backward adds nothing (torch: a zero
    gradient); the step after it is torch's."""
    torch.manual_seed(0)
    ref = nn.Embedding(V, D)
    model = copy.deepcopy(ref)
    h = offload(model, tmp_path)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for m, o in ((ref, ref_opt), (model, opt)):
        empty = m(torch.zeros(shape, dtype=torch.long))
        assert empty.shape == shape + (D,)
        (empty.sum() + m(torch.tensor([5, 900])).sum()).backward()
        o.step()
    assert torch.equal(model.weight.detach(), ref.weight.detach())


def test_offload_init_initializes_tiled_parameters_block_by_block(tmp_path):
    """nn.init's random fills on blocks draw what they draw on the whole tensor."""
    torch.manual_seed(0)
    ref = Tied()
    store = strata.Store.open(str(tmp_path / "s"), chunk_size="64KiB")
    torch.manual_seed(0)
    with st.offload_init(store, working_set="256KiB", tile_bytes=TILE) as h:
        model = Tied()
    h.attach(model)
    assert h.stats()["peak_working_set_bytes"] <= 2 * TILE + 4 * V
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), n
    with torch.no_grad():
        model.emb.weight.mul_(0.5)
        ref.emb.weight.mul_(0.5)
    assert torch.equal(h.read(model.emb.weight), ref.emb.weight.detach())


def test_load_state_dict_copies_into_blocks(tmp_path):
    torch.manual_seed(0)
    model, other = Tied(), Tied()
    h = offload(model, tmp_path)
    h.reset_stats()
    model.load_state_dict(other.state_dict())
    assert h.stats()["peak_working_set_bytes"] <= 4 * V  # only the bias materialized
    for (n, a), (_, b) in zip(other.named_parameters(), model.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), n


def test_checkpoint_and_resume_of_a_tiled_parameter(tmp_path):
    torch.manual_seed(0)
    ref, model = Lookup(), Lookup()
    model.load_state_dict(ref.state_dict())
    path = str(tmp_path / "s")
    store = strata.Store.open(path, chunk_size="64KiB")
    h = st.offload_parameters(model, store, working_set="256KiB", tile_bytes=TILE)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=store, arithmetic="torch")
    expected = train(ref, ropt, 4)
    got = train(model, opt, 2)
    opt.checkpoint()
    opt.close()
    h.close(restore=False)
    store.close()
    torch.manual_seed(1)
    again = Lookup()  # other values: the stored ones are taken
    store = strata.Store.open(path)
    h = st.offload_parameters(again, store, working_set="256KiB", tile_bytes=TILE,
                              resume=True)
    assert h.tiled(again.emb.weight)
    opt = st.OffloadAdamW(again.parameters(), lr=1e-2, store=store, arithmetic="torch",
                          resume=True)
    losses = []
    for step in range(2, 4):
        opt.zero_grad()
        idx, y = batch(10 * step)
        loss = F.cross_entropy(again(idx).view(-1, 4), y.view(-1))
        loss.backward()
        losses.append(loss.item())
        opt.step()
    assert got + losses == expected
    for (n, a), (_, b) in zip(ref.named_parameters(), again.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), n


def test_gradients_torch_is_not_asked_for_are_not_written(tmp_path):
    """backward(inputs=[x]) and autograd.grad: p.grad of a tiled weight as torch leaves it
    (they wrote the weight's gradient into the gradient object, or raised)."""
    torch.manual_seed(0)
    ref = nn.Linear(D, V)
    model = copy.deepcopy(ref)
    h = offload(model, tmp_path)
    st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store)
    x = torch.randn(8, D, requires_grad=True)
    model(x).sum().backward(inputs=[x])
    assert model.weight.grad is None and model.bias.grad is None
    (gx,) = torch.autograd.grad(model(x).sum(), [x])
    assert model.weight.grad is None
    torch.manual_seed(0)
    emb_ref = nn.Embedding(V, D)
    emb = copy.deepcopy(emb_ref)
    h2 = offload(emb, tmp_path / "e")
    st.OffloadAdamW(emb.parameters(), lr=1e-2, store=h2.store)
    idx, _ = batch(0)
    (want,) = torch.autograd.grad(emb_ref(idx).pow(2).sum(), [emb_ref.weight])
    (got,) = torch.autograd.grad(emb(idx).pow(2).sum(), [emb.weight])
    assert torch.equal(got, want)
    assert emb.weight.grad is None


def test_normal_init_with_a_last_block_of_fewer_than_16_elements(tmp_path):
    """torch's normal_ redoes the last 16 elements of the whole tensor: a last block of
    fewer than 16 elements joins the block before (it drew other numbers)."""
    n = 8192 + 5
    torch.manual_seed(0)
    want = nn.init.normal_(torch.empty(n))
    m = nn.Module()
    m.p = nn.Parameter(torch.zeros(n))
    h = offload(m, tmp_path, tile_bytes=4096)  # 1024 elements a block
    t = h.ws.records[0].tile
    assert t.nblocks == 8 and t.rows_of(7) == (7168, n)
    torch.manual_seed(0)
    with torch.no_grad():
        nn.init.normal_(m.p)
    assert torch.equal(h.read(m.p), want)


@pytest.mark.parametrize("bad,error,match", [
    (0, ValueError, "tile_bytes must be > 0"), (-1, ValueError, "tile_bytes must be > 0"),
    ("abc", ValueError, "tile_bytes 'abc' is not a byte size"), (1.5, TypeError, "tile_bytes")])
def test_bad_tile_bytes_is_an_error_naming_it(tmp_path, bad, error, match):
    with pytest.raises(error, match=match):
        offload(nn.Linear(D, V), tmp_path, tile_bytes=bad)


@pytest.mark.parametrize("autocast", [True, False])
def test_low_precision_linear_gradients_are_torchs(tmp_path, autocast):
    """CPU autocast to bf16 (backward failed: fp32 input, bf16 gradient) and bf16
    parameters (the input gradient was summed in bf16, rounded once per block)."""
    torch.manual_seed(0)
    ref = nn.Linear(D, V)
    if not autocast:
        ref.bfloat16()
    model = copy.deepcopy(ref)
    offload(model, tmp_path)
    torch.manual_seed(3)
    x = torch.randn(8, D, dtype=torch.float32 if autocast else torch.bfloat16)
    x.requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        o_ref, o = ref(x), model(x2)
    assert o.dtype == torch.bfloat16 and torch.equal(o, o_ref)
    o_ref.float().pow(2).sum().backward()
    o.float().pow(2).sum().backward()
    assert model.weight.grad.dtype == ref.weight.grad.dtype
    assert torch.equal(model.weight.grad, ref.weight.grad)
    assert torch.equal(model.bias.grad, ref.bias.grad)
    assert x2.grad.dtype == x.grad.dtype and torch.equal(x2.grad, x.grad)


@pytest.mark.parametrize("where", ["own store", "deepcopy"])
def test_optimizer_on_another_store_steps_tiled_parameters(tmp_path, where):
    """An optimizer whose store is not the offload's (no store=; a deepcopy's offload):
    the tiled gradient is stepped whole (set_grad_object found no object there)."""
    torch.manual_seed(0)
    ref, model = Lookup(), Lookup()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path)
    if where == "deepcopy":
        model = copy.deepcopy(model)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, arithmetic="torch")
    assert opt.store is not h.store
    assert train(model, opt, 3, 2, False) == train(ref, ropt, 3, 2, False)
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(b.detach(), a.detach()), n


def test_blocks_fit_half_the_working_set_whatever_tile_bytes(tmp_path):
    torch.manual_seed(0)
    ref = nn.Linear(D, V)
    model = copy.deepcopy(ref)
    h = offload(model, tmp_path, working_set=64 * 1024, tile_bytes=200 * 1024)
    assert h.ws.records[0].tile.block_rows == 128  # 32 KiB blocks, not 200 KiB
    x = torch.randn(8, D)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-6, atol=1e-5)
    # the two blocks fill the working set; the bias, the same call's argument, comes beside
    assert h.stats()["peak_working_set_bytes"] == 64 * 1024 + 4 * V


def test_a_host_tier_optimizer_steps_tiled_parameters_whole(tmp_path):
    torch.manual_seed(0)
    ref, model = Lookup(), Lookup()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch",
                          tier="host")
    assert train(model, opt, 2, 2) == train(ref, ropt, 2, 2)
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), n


def test_a_step_on_zeroed_gradients_is_torchs(tmp_path):
    """zero_grad(set_to_none=False), then step without a backward: the gradient object is
    made zeros for the step (torch.optim steps a zero gradient)."""
    torch.manual_seed(0)
    ref, model = Lookup(), Lookup()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    assert train(model, opt, 1) == train(ref, ropt, 1)
    for o in (opt, ropt):
        o.zero_grad(set_to_none=False)
        o.step()
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), n


def _count_ranges(h):
    """Wraps h.store.read_range: the (offset, nbytes) of each call, in a list."""
    calls, real = [], h.store.read_range

    def read_range(key, offset, nbytes):
        calls.append((key, offset, nbytes))
        return real(key, offset, nbytes)

    h.store.read_range = read_range
    return calls


def test_embedding_forward_reads_only_its_rows_adjacent_ones_as_one_range(tmp_path):
    torch.manual_seed(0)
    ref = nn.Embedding(V, D)
    model = copy.deepcopy(ref)
    h = offload(model, tmp_path)
    idx = torch.tensor([[5, 6, 7, 7, 20], [999, 0, 5, 6, 21]])
    h.reset_stats()
    calls = _count_ranges(h)
    with torch.no_grad():
        out = model(idx)
    assert torch.equal(out, ref(idx).detach())
    rows = D * 4
    assert sorted((o // rows, n // rows) for _, o, n in calls) == [(0, 1), (5, 3), (20, 2),
                                                                   (999, 1)]
    st_ = h.stats()
    assert st_["bytes_fetched"] == 7 * rows and st_["tile_blocks_fetched"] == 0
    out = model(idx)  # with autograd: the same rows
    assert torch.equal(out, ref(idx))
    assert h.stats()["bytes_fetched"] == 14 * rows


def test_embedding_rows_beyond_a_block_are_read_in_groups(tmp_path):
    torch.manual_seed(0)
    ref = nn.Embedding(V, D)
    model = copy.deepcopy(ref)
    h = offload(model, tmp_path, working_set=64 * 1024, tile_bytes=200 * 1024)
    idx = torch.arange(V - 1, -1, -3).view(2, -1)  # 334 rows, none adjacent: 3 groups of 128
    h.reset_stats()
    calls = _count_ranges(h)
    with torch.no_grad():
        out = model(idx)
    assert torch.equal(out, ref(idx).detach())
    assert len(calls) == 334 and h.stats()["bytes_fetched"] == 334 * D * 4
    assert h.stats()["peak_working_set_bytes"] <= 64 * 1024


class TiedLM(nn.Module):
    """The bench's shape: an embedding whose weight is the output head, a Linear between."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.mid = nn.Linear(D, D)

    def forward(self, idx):
        return F.linear(torch.tanh(self.mid(self.emb(idx))), self.emb.weight)


def test_first_blocks_of_a_use_are_read_ahead_along_the_recorded_uses(tmp_path):
    torch.manual_seed(0)
    ref, model = TiedLM(), TiedLM()
    model.load_state_dict(ref.state_dict())
    h = offload(model, tmp_path, working_set="512KiB")
    for step in range(3):
        idx, _ = batch(step)
        h.reset_stats()
        for m in (ref, model):
            m.zero_grad()
            m(idx).square().mean().backward()
        for (n, a), b in zip(ref.named_parameters(), model.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=n)
        st_ = h.stats()
        # head forward and head backward read 8 blocks each; from the second iteration on
        # the forward's first 2 (its last to first order: blocks 7, 6) are read ahead after
        # the embedding, and the 4 blocks it holds at its end (2 in use and in flight, 2
        # more with room in the 512 KiB working set: blocks 3..0) are kept for the
        # backward, which reads only blocks 4..7
        assert st_["tile_blocks_fetched"] == (16 if step == 0 else 12), step
        assert st_["tile_blocks_ahead"] == (0 if step == 0 else 2), step
        assert st_["peak_working_set_bytes"] <= h.working_set_bytes
    assert h.ws.staged_bytes == 0


def test_blocks_kept_for_the_backward_give_the_same_bits(tmp_path):
    """The head's backward with the forward's last blocks kept (recorded order) and with
    every block read again (order forgotten): the same gradients, bit for bit."""
    torch.manual_seed(0)
    model = TiedLM()
    h = offload(model, tmp_path, working_set="512KiB")
    idx, _ = batch(0)

    def grads(keep):
        if not keep and h.tile_reads is not None:
            h.tile_reads.next_of.clear()  # (nothing recorded: nothing kept)
        h.reset_stats()
        model.zero_grad(set_to_none=True)
        model(idx).square().mean().backward()
        return [p.grad.clone() for p in model.parameters()], h.stats()["tile_blocks_fetched"]

    grads(False)  # (records the order: forward, then its backward)
    g1, n1 = grads(True)
    g0, n0 = grads(False)
    assert (n1, n0) == (12, 16)
    assert all(torch.equal(a, b) for a, b in zip(g1, g0))
    assert h.ws.staged_bytes == 0


def test_blocks_read_ahead_of_a_changed_value_are_dropped(tmp_path):
    torch.manual_seed(0)
    ref = nn.Linear(D, V)
    model = copy.deepcopy(ref)
    h = offload(model, tmp_path)
    x = torch.randn(4, D)
    for step in range(2):
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        ref(x1).sum().backward()
        out = model(x2)
        if step == 1:
            assert h.tile_reads.ahead is not None  # the backward's first blocks
            h.ws.records[0].version += 1  # (as a step or an edit does)
        h.reset_stats()
        out.sum().backward()
        torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-5, atol=1e-6)
        assert h.stats()["tile_blocks_ahead"] == 0
        assert h.stats()["tile_blocks_fetched"] == 8
    assert h.ws.staged_bytes == 0


def _tied_grads(tmp_path, name, by_rows):
    """TiedLM's gradients after one backward with OffloadAdamW (gradients in the store),
    the embedding's contribution added by rows or (by_rows False) block by block."""
    from strata.torch.offload._tiled_grads import BlockWriter
    torch.manual_seed(0)
    model = TiedLM()
    h = offload(model, tmp_path / name)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, store=h.store)
    idx = batch(0)[0] % 300  # blocks 0..2 (of 8) only: the others get zeros
    h.reset_stats()
    real = BlockWriter.by_rows
    if not by_rows:
        BlockWriter.by_rows = property(lambda self: False)
    try:
        model(idx).square().mean().backward()
    finally:
        BlockWriter.by_rows = real
    stats = h.stats()  # (before p.grad reads the gradients)
    return {n: p.grad.clone() for n, p in model.named_parameters()}, stats, opt


def test_tied_gradient_reads_and_writes_only_the_embeddings_rows(tmp_path):
    rows = len(torch.unique(batch(0)[0] % 300)) * D * 4
    g_rows, st_rows, _ = _tied_grads(tmp_path, "a", True)
    g_dense, st_dense, _ = _tied_grads(tmp_path, "b", False)
    for n in g_dense:
        assert torch.equal(g_rows[n], g_dense[n]), n  # the same values as whole blocks
    assert st_dense["grad_bytes_read"] == V * D * 4
    assert st_rows["grad_bytes_read"] == rows  # the head's blocks, then only the rows
    assert st_rows["grad_bytes_written"] - st_dense["grad_bytes_written"] == rows - V * D * 4


def test_a_block_holding_negative_zero_is_added_whole(tmp_path):
    torch.manual_seed(0)
    model = nn.Embedding(V, D)
    h = offload(model, tmp_path)
    st.OffloadAdamW(model.parameters(), lr=1e-3, store=h.store)
    s = h.ws.records[0]
    first = torch.randn(V, D)
    first[300, 5] = -0.0  # block 2 (rows 256..383)
    w = h.tiled_grads.writer(s)
    for i in range(s.tile.nblocks):
        r0, r1 = s.tile.rows_of(i)
        w.add(i, first[r0:r1].clone())
    assert w.end() is None
    w = h.tiled_grads.writer(s)
    assert w.by_rows
    add = torch.zeros(V, D)
    for i in range(s.tile.nblocks):
        r0, r1 = s.tile.rows_of(i)
        rows = torch.tensor([r0 + 1, r0 + 2, r0 + 50])
        vals = torch.randn(3, D)
        add[rows] = vals
        if w.add_rows(i, rows, vals.clone()):
            assert i != 2
        else:
            assert i == 2
            w.add(i, add[r0:r1].clone())
    w.end()
    want = first + add
    assert torch.equal(model.weight.grad, want)
    assert model.weight.grad[300, 5].item() == 0.0 and not torch.signbit(
        model.weight.grad[300, 5])
    torch.testing.assert_close(s.grad_norm, torch.norm(want), rtol=1e-6, atol=0)
