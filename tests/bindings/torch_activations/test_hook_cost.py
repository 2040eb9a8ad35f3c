"""What activation offload's hooks do per saved tensor (their cost is the host pool's whole
cost over torch in memory, docs/activations.md): pack builds no TypedStorage (torch 1.13's
``Tensor.storage()`` is a Python constructor; pack asked for it three times per tensor),
and a backward whose segment has nothing spilled never scans the trace for reads to issue
(that scan ran at every first unpack: O(entries^2) per backward); gradients stay exact."""
import pytest
import torch

import strata
import strata.torch as st
from strata.torch.activations import _prefetch

D, B, LAYERS = 64, 256, 4  # a saved activation is B*D*4 = 64 KiB


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh())
                                 for _ in range(LAYERS)])


def run(act, steps=3):
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    grads = []
    for _ in range(steps):
        x = torch.randn(B, D, generator=g)
        if act is None:
            loss = m(x).square().mean()
        else:
            with act:
                loss = m(x).square().mean()
            act.wait_spills()
        loss.backward()
        grads.append([p.grad.clone() for p in m.parameters()])
        opt.step()
        opt.zero_grad()
    return grads


@pytest.fixture
def store(tmp_path):
    s = strata.Store.open(str(tmp_path / "s"), host_budget="8MiB", staging="16MiB",
                          chunk_size="1MiB", durability="flush", workers=2)
    yield s
    if not s.closed:
        s.close()


@pytest.fixture
def ahead_calls(monkeypatch):
    calls = []
    real = _prefetch.Prefetcher._ahead

    def counted(self, seg):
        calls.append(seg)
        return real(self, seg)
    monkeypatch.setattr(_prefetch.Prefetcher, "_ahead", counted)
    return calls


def exact(a, b):
    assert all(torch.equal(u, v) for x, y in zip(a, b) for u, v in zip(x, y))


def test_pack_builds_no_typed_storage(store, monkeypatch):
    made = []
    real = torch.Tensor.storage

    def counted(self):
        made.append(1)
        return real(self)
    act = st.offload_activations(store, min_bytes=4096, release_memory=False)
    monkeypatch.setattr(torch.Tensor, "storage", counted)
    got = run(act)
    monkeypatch.undo()
    exact(got, run(None))
    s = act.stats()
    # per step: each Linear's input and each Tanh's result, and square's input; a Tanh's
    # result is the next Linear's (or square's) input: LAYERS + 1 entries, LAYERS found
    assert s["tensors_packed"] == 3 * (2 * LAYERS + 1)
    assert s["tensors_deduplicated"] == 3 * LAYERS
    assert s["activation_bytes"] == 3 * (LAYERS + 1) * B * D * 4
    assert made == []
    act.close()


def test_host_pool_backward_scans_nothing(store, ahead_calls):
    act = st.offload_activations(store, min_bytes=4096, release_memory=False)
    exact(run(act), run(None))
    s = act.stats()
    assert s["spills"] == 0 and s["prefetch_hits"] == s["prefetch_misses"] == 0
    assert s["trace_mismatches"] == 0
    assert ahead_calls == []  # steps 2-3 followed step 1's trace: nothing to read ahead
    act.close()


def test_spilled_backward_still_reads_ahead(store, ahead_calls):
    act = st.offload_activations(store, host_budget_bytes=0, min_bytes=4096,
                                 release_memory=False)
    exact(run(act), run(None))
    s = act.stats()
    entries = LAYERS + 1  # per step
    assert s["spills"] == 3 * entries and s["trace_mismatches"] == 0
    # steps 2-3 follow step 1's trace: every first unpack looks ahead; the first entry a
    # backward unpacks is read on demand (nothing before it read it ahead), the rest ahead;
    # a second handle of an entry reads it again (its first unpack's bytes are gone)
    assert len(ahead_calls) == 2 * entries
    assert s["prefetch_hits"] == 2 * (entries - 1)
    assert s["prefetch_hits"] + s["prefetch_misses"] == s["tensors_packed"] == 3 * 9
    act.close()
