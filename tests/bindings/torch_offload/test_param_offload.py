"""strata.torch.offload_parameters: parameters (and gradients) in the store, materialized in
a bounded working set; every result compared bit for bit with the same training in memory.
"""

import copy
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import strata
import strata.torch as st

VOCAB = 40


class Net(nn.Module):
    """Tied embedding/head, a block called twice in one forward, a parameter used outside
    its own module (``gate.weight`` read by the root), a frozen parameter, and an optional
    branch (dynamic control flow)."""

    def __init__(self, d=24):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.gate = nn.Linear(d, d, bias=False)
        self.extra = nn.Linear(d, d)
        self.frozen = nn.Linear(d, d)
        self.frozen.requires_grad_(False)
        self.ln = nn.LayerNorm(d)
        self.branch = False

    def block(self, h):
        return h + self.fc2(F.gelu(self.fc1(h)))

    def forward(self, x):
        h = self.emb(x)
        h = self.block(h)
        h = self.block(h) * torch.sigmoid(h @ self.gate.weight.t())  # reused; shared
        h = h + self.frozen(h)
        if self.branch:
            h = self.extra(h)
        return self.ln(h) @ self.emb.weight.t()  # tied head


def batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randint(0, VOCAB, (3, 7), generator=g)
    y = torch.randint(0, VOCAB, (3, 7), generator=g)
    return x, y


def loss_of(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def train(model, opt, steps, *, micro=1, clip=0.0, by_hand_clip=False, branch_at=(),
          eval_every=0, start=0):
    losses = []
    for step in range(start, steps):
        model.branch = step in branch_at
        opt.zero_grad()
        for m in range(micro):
            loss = loss_of(model, *batch(step, m))
            loss.backward()
        if by_hand_clip and clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
        if eval_every and step % eval_every == 0:
            model.eval()
            with torch.no_grad():
                losses.append(loss_of(model, *batch(99, 0)).item())
            model.train()
    return losses


def trainable_groups(model):
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


def model_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def assert_same_params(ref, model, handle):
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(a.detach(), handle.read(b)), n


@pytest.fixture
def pair(tmp_path):
    torch.manual_seed(0)
    ref = Net()
    model = copy.deepcopy(ref)
    return ref, model, tmp_path


@pytest.mark.parametrize("tier", ["nvme", "host"])
@pytest.mark.parametrize("micro,clip", [(1, 0.0), (3, 0.5)])
def test_bit_exact_against_torch(pair, tier, micro, clip):
    ref, model, tmp = pair
    budget = model_bytes(model) // 3
    h = st.offload_parameters(model, path=str(tmp / "s"), working_set=budget, tier=tier)
    opt = st.OffloadAdamW(trainable_groups(model), lr=1e-2, store=h.store, arithmetic="torch",
                          max_grad_norm=clip, tier=tier)
    ref_opt = torch.optim.AdamW(trainable_groups(ref), lr=1e-2)
    want = train(ref, ref_opt, 6, micro=micro, clip=clip, by_hand_clip=True, eval_every=2,
                 branch_at=(3,))
    got = train(model, opt, 6, micro=micro, clip=clip, eval_every=2, branch_at=(3,))
    assert got == want
    assert_same_params(ref, model, h)
    s = h.stats()
    assert s["peak_working_set_bytes"] <= budget + max(
        p.numel() * 4 for p in model.parameters())
    assert s["bytes_fetched"] > 0 and s["grad_bytes_written"] > 0
    assert s["prefetch_hits"] > 0
    assert s["trace_mismatches"] >= 1  # the branch at step 3 changed the order of use
    opt.close()
    h.close()
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert type(b) is nn.Parameter and torch.equal(a, b), n


def test_torch_optimizer_over_offloaded_parameters(pair):
    """torch.optim's own update materializes each parameter; gradients stay in p.grad."""
    ref, model, tmp = pair
    h = st.offload_parameters(model, path=str(tmp / "s"), working_set=4096)
    want = train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), 4, micro=2)
    got = train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), 4, micro=2)
    assert got == want
    assert_same_params(ref, model, h)
    assert h.stats()["bytes_written_back"] > 0
    h.close()


def test_edits_state_dict_and_data_assignment(pair):
    ref, model, tmp = pair
    h = st.offload_parameters(model, path=str(tmp / "s"), working_set=2048)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    train(ref, ref_opt, 2)
    train(model, opt, 2)
    with torch.no_grad():  # edits outside the optimizer: stepped from the edited values
        ref.fc1.weight.clamp_(-0.05, 0.05)
        model.fc1.weight.clamp_(-0.05, 0.05)
        ref.ln.weight.data = torch.full_like(ref.ln.weight, 0.5)
        model.ln.weight.data = torch.full_like(ref.ln.weight, 0.5)
    sd = model.state_dict()
    assert set(sd) == set(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(sd[k], v), k
    assert train(model, opt, 4, start=2) == train(ref, ref_opt, 4, start=2)
    assert_same_params(ref, model, h)
    model.load_state_dict(ref.state_dict())  # round trip through load_state_dict
    assert_same_params(ref, model, h)
    with pytest.raises(ValueError, match="fc1.weight.*shape"):
        model.fc1.weight.data = torch.zeros(3)
    opt.close()
    h.close()


def test_gradients_go_to_the_store(pair):
    ref, model, tmp = pair
    h = st.offload_parameters(model, path=str(tmp / "s"), working_set=4096)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    for m in range(2):
        loss_of(ref, *batch(0, m)).backward()
        loss_of(model, *batch(0, m)).backward()
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        if a.grad is None:
            assert h.grad(b) is None and b.grad is None, n
        else:
            assert torch.equal(h.grad(b), a.grad), n
            assert type(b.grad).__name__ == "OffloadedGrad", n  # p.grad: the stored one
            assert torch.equal(b.grad, a.grad), n
    model.zero_grad()  # torch 1.13: zeros (set_to_none=False)
    ref.zero_grad()
    assert torch.equal(h.grad(model.fc1.weight), ref.fc1.weight.grad)
    assert not ref.fc1.weight.grad.any()
    model.zero_grad(set_to_none=True)
    assert h.grad(model.fc1.weight) is None
    opt.close()
    h.close()


def test_errors(tmp_path):
    m = Net()
    with pytest.raises(TypeError, match="torch.nn.Module"):
        st.offload_parameters([1, 2])
    with pytest.raises(ValueError, match="working_set"):
        st.offload_parameters(m, path=str(tmp_path / "a"), working_set=0)
    with pytest.raises(ValueError, match="tier"):
        st.offload_parameters(m, path=str(tmp_path / "a"), tier="gpu")
    h = st.offload_parameters(m, path=str(tmp_path / "b"))
    with pytest.raises(ValueError, match="offloaded already"):
        st.offload_parameters(m, store=h.store, key_prefix="other/")
    h.close(restore=False)
    m2 = Net()
    with strata.Store.open(str(tmp_path / "b")) as s:
        with pytest.raises(strata.AlreadyExistsError, match="resume=True"):
            st.offload_parameters(m2, s)
        with pytest.raises(strata.NotFoundError, match="params2/emb.weight"):
            st.offload_parameters(m2, s, key_prefix="params2/", resume=True)
    m3 = nn.Linear(3, 3)
    m3.weight = nn.Parameter(torch.zeros(3, 3, dtype=torch.long), requires_grad=False)
    with pytest.raises(ValueError, match="'weight' has dtype torch.int64"):
        st.offload_parameters(m3, path=str(tmp_path / "c"))


def test_resume_after_close(pair):
    """close(restore=False), then a new process's model resumes from the store."""
    ref, model, tmp = pair
    path = str(tmp / "s")
    h = st.offload_parameters(model, path=path, working_set=4096)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    train(model, opt, 3)
    train(ref, ref_opt, 3)
    opt.close()
    h.close(restore=False)
    torch.manual_seed(123)
    fresh = Net()
    h2 = st.offload_parameters(fresh, path=path, resume=True, working_set=4096)
    opt2 = st.OffloadAdamW(fresh.parameters(), lr=1e-2, store=h2.store, arithmetic="torch",
                           resume=True)
    assert train(fresh, opt2, 6, start=3) == train(ref, ref_opt, 6, start=3)
    assert_same_params(ref, fresh, h2)
    opt2.close()
    h2.close()


KILL_CHILD = textwrap.dedent("""
    import os, signal, sys, torch
    sys.path.insert(0, {here!r})
    import strata, strata.torch as st
    from test_param_offload import Net, train, batch, loss_of
    torch.manual_seed(0)
    model = Net()
    store = strata.Store.open({path!r}, durability="flush", chunk_size="64KiB")
    resume = {resume!r}
    h = st.offload_parameters(model, store, working_set=4096, resume=resume)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=store, arithmetic="torch",
                          resume=resume, max_grad_norm=0.5)
    start = opt.state[model.fc1.weight]["step"] if resume else 0
    start = int(start)
    train(model, opt, {ckpt})  if not resume else None
    if not resume:
        opt.checkpoint()
        # die inside the next step, after its first batch stored new weights
        orig = h.write
        def dying_write(p, v):
            orig(p, v)
            os.kill(os.getpid(), signal.SIGKILL)
        h.write = dying_write
        train(model, opt, {ckpt} + 1, start={ckpt})
    else:
        print("START", start, flush=True)
        losses = train(model, opt, {total}, start=start)
        print("LOSSES", repr(losses), flush=True)
        import hashlib
        for n, p in h.parameters:
            print("P", n, hashlib.sha256(h.read(p).numpy().tobytes()).hexdigest(), flush=True)
""")


def test_sigkill_during_step_then_resume(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    path = str(tmp_path / "s")
    env = dict(os.environ)
    common = dict(here=here, path=path, ckpt=3, total=6)
    p = subprocess.run([sys.executable, "-c", KILL_CHILD.format(resume=False, **common)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    p = subprocess.run([sys.executable, "-c", KILL_CHILD.format(resume=True, **common)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert "START 3" in out
    torch.manual_seed(0)
    ref = Net()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    train(ref, ref_opt, 3, clip=0.5, by_hand_clip=True)
    want = train(ref, ref_opt, 6, start=3, clip=0.5, by_hand_clip=True)
    losses = [line for line in out if line.startswith("LOSSES")][0]
    assert eval(losses[len("LOSSES "):]) == want
    import hashlib
    digests = {line.split()[1]: line.split()[2] for line in out if line.startswith("P ")}
    for n, t in ref.named_parameters():
        assert digests[n] == hashlib.sha256(t.detach().numpy().tobytes()).hexdigest(), n


RSS_CHILD = textwrap.dedent("""
    import sys, torch, torch.nn as nn
    import strata, strata.torch as st
    def status(k):
        for line in open("/proc/self/status"):
            if line.startswith(k):
                return int(line.split()[1]) * 1024
    torch.manual_seed(0)
    # 24 layers of 256 x 1024 fp32 (1 MiB each) = 24 MiB of parameters, 8 MiB working set
    model = nn.Sequential(*[nn.Sequential(nn.Linear(1024 if i % 2 else 256, 256 if i % 2 else 1024,
                                                    bias=False), nn.Tanh()) for i in range(24)])
    store = strata.Store.open({path!r}, durability="flush", chunk_size="256KiB",
                              host_budget="4MiB", staging="4MiB")
    h = st.offload_parameters(model, store, working_set="8MiB")
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, store=store, num_buffers=2)
    x = torch.randn(4, 256)
    model(x).sum().backward(); opt.step(); opt.zero_grad()
    base = status("VmRSS:")
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
    for _ in range(3):
        model(x).sum().backward(); opt.step(); opt.zero_grad()
    print(base, status("VmHWM:"), h.stats()["peak_working_set_bytes"])
""")


def test_peak_rss_within_the_working_set(tmp_path):
    """A model 3 x the working set: peak RSS grows by at most the budget (8 MiB) + the
    documented constant (docs/offload.md: step batch buffers <= the budget, gradient writes
    in flight <= half of it, the optimizer pipeline, activations: 24 MiB here)."""
    p = subprocess.run([sys.executable, "-c", RSS_CHILD.format(path=str(tmp_path / "s"))],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    base, hwm, peak_ws = map(int, p.stdout.split())
    assert peak_ws <= 8 << 20
    assert hwm - base <= (8 << 20) + (24 << 20), (base, hwm)


def test_offload_init_builds_the_same_model(tmp_path):
    torch.manual_seed(7)
    want = Net()
    torch.manual_seed(7)
    with st.offload_init(path=str(tmp_path / "s"), working_set=2048) as h:
        got = Net()
        stray = nn.Linear(3, 2)  # made in the block, not part of the model
    h.attach(got)
    assert type(stray.weight) is nn.Parameter  # given back at attach()
    for (n, a), (m, b) in zip(want.named_parameters(), got.named_parameters()):
        assert n == m and type(b) is st.OffloadedParameter
        assert torch.equal(a, h.read(b)), n
    assert sorted(h.store.keys("params/")) == sorted(f"params/{n}" for n, _ in
                                                     want.named_parameters())
    with pytest.raises(ValueError, match="already"):
        with st.offload_init(path=str(tmp_path / "t")):
            with st.offload_init(path=str(tmp_path / "u")):
                pass
    h.close()


def test_bf16_parameters_match_the_optimizer_without_offload(pair):
    """bf16 working copies: the step stores the kernel's rounding of the fp32 masters, as
    OffloadAdamW writes into an in-memory bf16 parameter."""
    ref, model, tmp = pair
    ref.to(torch.bfloat16)
    model.to(torch.bfloat16)
    h = st.offload_parameters(model, path=str(tmp / "s"), working_set=4096)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=h.store, arithmetic="torch")
    ref_opt = st.OffloadAdamW(ref.parameters(), lr=1e-2, path=str(tmp / "r"), arithmetic="torch")
    assert train(model, opt, 4) == train(ref, ref_opt, 4)
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert a.dtype == torch.bfloat16 and torch.equal(a.detach(), h.read(b)), n
    for p, q in zip(ref.parameters(), model.parameters()):
        if p.requires_grad and ref_opt.state[p]:
            assert torch.equal(torch.as_tensor(ref_opt.state[p]["exp_avg"]),
                               torch.as_tensor(opt.state[q]["exp_avg"]))
    opt.close()
    ref_opt.close()
    h.close()


def test_two_offloads_in_one_operation(tmp_path):
    """Parameters of two offloads (two models) used by one operation, forward and backward."""
    torch.manual_seed(3)
    a, b = nn.Linear(6, 6), nn.Linear(6, 6)
    ra, rb = copy.deepcopy(a), copy.deepcopy(b)
    ha = st.offload_parameters(a, path=str(tmp_path / "a"), working_set=64)
    hb = st.offload_parameters(b, path=str(tmp_path / "b"), working_set=64)
    x = torch.randn(3, 6)
    got = (x @ (a.weight @ b.weight)).sum()
    want = (x @ (ra.weight @ rb.weight)).sum()
    got.backward()
    want.backward()
    assert got.item() == want.item()
    assert torch.equal(a.weight.grad, ra.weight.grad) and torch.equal(b.weight.grad, rb.weight.grad)
    ha.close()
    hb.close()
