"""Edits of ``param_groups`` after construction behave as in torch.optim.Adam/AdamW (state
keyed by the parameter object): every test runs the same edits on an OffloadAdam(W) and on
torch's optimizer over equal parameters with gradients from the same backward, and asserts
bit-identical parameters and ``state_dict()`` (arithmetic="torch"), on the nvme and host
tiers, with and without overlap_backward (optim/_layout.py, docs/offload.md)."""
import pytest
import torch

import strata.torch as st

CASES = [("nvme", False), ("nvme", True), ("host", False), ("host", True)]
SHAPES = [(5, 3), (7,), (4, 2), (6,), (3, 3)]


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]


def _backward(ps, k):
    """One backward over every parameter (also those in no group, as a model's would)."""
    loss = sum(((p * (0.3 * (i + 1) - 0.1 * k)).sum() + 0.05 * (p * p).sum() * (k + 1))
               for i, p in enumerate(ps))
    loss.backward()


def _pair(tmp_path, tier, overlap, groups, cls="AdamW", **kw):
    """(ours, its parameters), (torch's, its parameters): ``groups(ps)`` -> param groups."""
    a, b = _params(), _params()
    ours = getattr(st, "Offload" + cls)(groups(a), path=str(tmp_path / f"s-{tier}"), tier=tier,
                                        arithmetic="torch", num_threads=1,
                                        overlap_backward=overlap, **kw)
    ref = getattr(torch.optim, cls)(groups(b), **kw)
    return (ours, a), (ref, b)


def _run(pairs, steps, edit=None):
    """``steps`` steps of both; ``edit(k, opt, ps)`` before step k's backward."""
    for k in range(steps):
        for opt, ps in pairs:
            if edit is not None:
                edit(k, opt, ps)
            opt.zero_grad(set_to_none=True)
            _backward(ps, k)
            opt.step()


def _assert_same(pairs):
    (ours, a), (ref, b) = pairs
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x.detach(), y.detach()), f"parameter {i}"
    s1, s2 = ours.state_dict(), ref.state_dict()
    assert [g["params"] for g in s1["param_groups"]] == [g["params"] for g in s2["param_groups"]]
    for g1, g2 in zip(s1["param_groups"], s2["param_groups"]):
        for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
            assert g1[k] == g2[k], k
    assert sorted(s1["state"]) == sorted(s2["state"])
    for i, st2 in s2["state"].items():
        assert sorted(s1["state"][i]) == sorted(st2), i
        for k, v in st2.items():
            assert torch.equal(s1["state"][i][k], v), (i, k)
    for x, y in zip(a, b):  # optimizer.state keyed by the object, in or out of groups
        assert (x in ours.state) == (y in ref.state)
        for k, v in ref.state.get(y, {}).items():  # (a defaultdict: [] would insert)
            assert torch.equal(ours.state[x][k], v), k


def _drop(params, p):
    """Removes ``p`` from the list ``params`` by identity (list.remove compares values)."""
    params[:] = [q for q in params if q is not p]


def _hp(lr, wd=0.0):
    return dict(lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd, amsgrad=False,
                maximize=False)


@pytest.mark.parametrize("tier,overlap", CASES)
def test_swapping_the_groups_params_each_step_keeps_each_parameters_state(tmp_path, tier,
                                                                           overlap):
    """DeepSpeed's test_step_same_step_idempotent_across_param_keys: param_groups[0]
    ['params'] swapped between two parameters every step."""
    pairs = _pair(tmp_path, tier, overlap, lambda ps: [ps[0]], lr=0.01)

    def edit(k, opt, ps):
        opt.param_groups[0]["params"] = [ps[k % 2]]
    _run(pairs, 5, edit)
    assert pairs[0][0].state[pairs[0][1][0]]["step"].item() == 3
    assert pairs[0][0].state[pairs[0][1][1]]["step"].item() == 2  # in no group now
    for opt, ps in pairs:  # numbered again (state_dict raises KeyError for one in no group)
        opt.param_groups[0]["params"] = [ps[0], ps[1]]
    _assert_same(pairs)
    pairs[0][0].close()


@pytest.mark.parametrize("tier,overlap", CASES)
def test_removed_reordered_replaced_and_returning_parameters(tmp_path, tier, overlap):
    """Removed (its state kept, not stepped although it has a gradient), reordered,
    a list replaced by one with a new parameter, a removed one back at another place."""
    pairs = _pair(tmp_path, tier, overlap, lambda ps: [{"params": ps[:3]},
                                                       {"params": [ps[3]], "lr": 0.1}],
                  lr=0.01, weight_decay=0.1)

    def edit(k, opt, ps):
        g = opt.param_groups
        if k == 1:
            _drop(g[0]["params"], ps[1])
        elif k == 2:
            g[0]["params"].reverse()
        elif k == 3:
            g[0]["params"] = [ps[4], ps[2], ps[0]]  # ps[4]: new
        elif k == 4:
            g[1]["params"].insert(0, ps[1])  # back, in the group with another lr
    _run(pairs, 7, edit)
    _assert_same(pairs)
    pairs[0][0].close()


@pytest.mark.parametrize("tier,overlap", CASES)
def test_parameters_moved_between_groups_take_the_new_groups_hyperparameters(
        tmp_path, tier, overlap):
    pairs = _pair(tmp_path, tier, overlap, lambda ps: [
        {"params": ps[:2]}, {"params": ps[2:4], "lr": 0.1, "weight_decay": 0.5}], lr=0.01)

    def edit(k, opt, ps):
        g = opt.param_groups
        if k == 1:  # to the other group, and back two steps later
            _drop(g[0]["params"], ps[0])
            g[1]["params"].append(ps[0])
        elif k == 3:
            _drop(g[1]["params"], ps[0])
            g[0]["params"].insert(0, ps[0])
        elif k == 4:  # the groups' values change (a scheduler), then a merge
            g[0]["lr"] = 0.02
        elif k == 5:
            g[0]["params"] += g[1]["params"]
            del g[1]
    _run(pairs, 7, edit)
    _assert_same(pairs)
    ours = pairs[0][0]
    # ps[0] moved once into a new tensor and back into its old one; the merge moved nothing
    assert ours._table.core.num_params() == 4 + 1  # ps[4] is in no group
    ours.close()


@pytest.mark.parametrize("tier,overlap", CASES)
def test_groups_deleted_inserted_and_split(tmp_path, tier, overlap):
    pairs = _pair(tmp_path, tier, overlap, lambda ps: [
        {"params": [ps[0]]}, {"params": [ps[1], ps[2]], "lr": 0.05},
        {"params": [ps[3]], "lr": 0.2}], cls="Adam", lr=0.01)

    def edit(k, opt, ps):
        g = opt.param_groups
        if k == 1:
            del g[0]  # groups shift: nothing moves
        elif k == 2:
            g.insert(0, dict(g[0], **_hp(0.3), params=[ps[4], ps[0]]))  # new, removed
        elif k == 3:  # split: a new group with one of group 1's parameters, another lr
            _drop(g[1]["params"], ps[2])
            g.append(dict(g[0], **_hp(0.07, 0.01), params=[ps[2]]))
    _run(pairs, 6, edit)
    _assert_same(pairs)
    pairs[0][0].close()


def test_state_dict_of_a_parameter_with_state_in_no_group_raises_keyerror_as_torch(tmp_path):
    pairs = _pair(tmp_path, "host", False, lambda ps: ps[:2], lr=0.01)
    _run(pairs, 2)
    for opt, ps in pairs:
        _drop(opt.param_groups[0]["params"], ps[0])
    with pytest.raises(KeyError):
        pairs[1][0].state_dict()
    with pytest.raises(KeyError, match="p0.*in no param group"):
        pairs[0][0].state_dict()
    for opt, ps in pairs:  # torch: del state[p] drops it; strata: restarts it
        del opt.state[ps[0]]
    _assert_same(pairs)
    _run(pairs, 2, lambda k, opt, ps: opt.param_groups[0]["params"].append(ps[0]) if k == 0
         else None)
    _assert_same(pairs)
    pairs[0][0].close()


@pytest.mark.parametrize("tier,overlap", CASES[:2])
def test_load_state_dict_after_edits_maps_as_torch(tmp_path, tier, overlap):
    """A state dict of torch's optimizer after edits loads into ours after the same edits;
    a parameter in no group loses its state, as torch's."""
    pairs = _pair(tmp_path, tier, overlap, lambda ps: [
        {"params": ps[:3]}, {"params": ps[3:], "lr": 0.1}], lr=0.01)
    _run(pairs, 2)

    def edit(opt, ps):
        g = opt.param_groups
        g[0]["params"] = [ps[2], ps[0]]
        g[1]["params"] = [ps[4], ps[1], ps[3]]
    for opt, ps in pairs:
        edit(opt, ps)
    _run(pairs, 1)
    sd = pairs[1][0].state_dict()
    pairs[0][0].load_state_dict(sd)
    pairs[1][0].load_state_dict(sd)
    _run(pairs, 2)
    _assert_same(pairs)
    pairs[0][0].close()


def _named(ps, order):
    return [("w%d" % i, ps[i]) for i in order]


@pytest.mark.parametrize("tier,overlap", CASES[::2])
def test_checkpoint_after_edits_resumes_by_name_in_any_order(tmp_path, tier, overlap):
    path = str(tmp_path / "s")
    a, b = _params(), _params()
    kw = dict(lr=0.01, weight_decay=0.1)
    ours = st.OffloadAdamW([{"params": _named(a, [0, 1, 2])},
                            {"params": _named(a, [3]), "lr": 0.1}], path=path, tier=tier,
                           arithmetic="torch", num_threads=1, overlap_backward=overlap, **kw)
    ref = torch.optim.AdamW([{"params": b[:3]}, {"params": [b[3]], "lr": 0.1}], **kw)
    pairs = [(ours, a), (ref, b)]
    _run(pairs, 2)
    for opt, ps in pairs:  # w1 to group 1 (another lr: a move), w2 out of every group
        opt.param_groups[0]["params"] = [ps[0]]
        opt.param_groups[1]["params"].append(ps[1])
    _run(pairs, 2)
    ours.close()
    with pytest.raises(ValueError, match="holds parameter 'p3:w3' in param group 1, the "
                                         "model does not give it"):
        st.OffloadAdamW([{"params": _named(a, [0])}, {"params": _named(a, [1])}], path=path,
                        tier=tier, resume=True, arithmetic="torch", **kw)
    with pytest.raises(ValueError, match="no parameter named 'w4'.*param group 1"):
        st.OffloadAdamW([{"params": _named(a, [0])}, {"params": _named(a, [4, 3, 1])}],
                        path=path, tier=tier, resume=True, arithmetic="torch", **kw)
    c = [torch.nn.Parameter(torch.zeros_like(p)) for p in a]  # values come from the store
    ours = st.OffloadAdamW([{"params": _named(c, [0])}, {"params": _named(c, [1, 3])}],
                           path=path, tier=tier, resume=True, arithmetic="torch",
                           num_threads=1, overlap_backward=overlap, **kw)
    ref.param_groups[1]["params"] = [b[1], b[3]]
    for i in (2, 4):  # not in the optimizer: the model's own values
        c[i].data.copy_(a[i].detach())
    pairs = [(ours, c), (ref, b)]
    _run(pairs, 2)
    del ref.state[b[2]]  # in no group: torch's state_dict would raise KeyError for it
    _assert_same(pairs)
    ours.close()


def test_checkpoint_after_edits_resumes_by_position_without_names(tmp_path):
    path = str(tmp_path / "s-nvme")
    pairs = _pair(tmp_path, "nvme", False, lambda ps: [{"params": ps[:3]},
                                                       {"params": ps[3:], "lr": 0.1}], lr=0.01)
    (ours, a), (ref, b) = pairs
    _run(pairs, 2)
    for opt, ps in pairs:
        opt.param_groups[0]["params"] = [ps[2], ps[0]]
        opt.param_groups[1]["params"] = [ps[1], ps[4], ps[3]]
    _run(pairs, 1)
    ours.close()
    with pytest.raises(ValueError, match="param group 0 has 2 parameters, the model gives 3"):
        st.OffloadAdamW([{"params": a[:3]}, {"params": a[3:]}], path=path, tier="nvme",
                        resume=True, arithmetic="torch", lr=0.01)
    c = [torch.nn.Parameter(torch.zeros_like(p)) for p in a]
    ours = st.OffloadAdamW([{"params": [c[2], c[0]]}, {"params": [c[1], c[4], c[3]]}],
                           path=path, tier="nvme", resume=True, arithmetic="torch",
                           num_threads=1, lr=0.01)
    pairs = [(ours, c), (ref, b)]
    _run(pairs, 2)
    _assert_same(pairs)
    ours.close()
