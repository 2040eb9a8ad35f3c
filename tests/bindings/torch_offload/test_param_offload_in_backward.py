"""The update inside backward over offloaded parameters (OffloadAdamW(overlap_backward=True)
on strata.torch.offload_parameters): each parameter's update starts when backward has
produced its final gradient, its store object is the optimizer's fp32 master, and the
gradient goes to the store only when a redo may need it (max_grad_norm set). Every case is
compared bit for bit with torch.optim.AdamW in memory on the same data, and the bytes moved
are counted exactly.
"""

import warnings

import pytest
import torch

import strata.torch as st
from test_param_offload import Net, batch, loss_of

SMALL, WHOLE = 4096, 1 << 24  # working sets: evicting everything / holding the whole model


def make(tmp_path, working_set, seed=0):
    torch.manual_seed(seed)
    ref, model = Net(), Net()
    model.load_state_dict(ref.state_dict())
    h = st.offload_parameters(model, path=str(tmp_path / "s"), working_set=working_set)
    return ref, model, h


def optimizers(ref, model, h, max_grad_norm=0.0, lr=1e-2, **kw):
    ropt = torch.optim.AdamW(ref.parameters(), lr=lr)
    opt = st.OffloadAdamW(model.parameters(), lr=lr, store=h.store, arithmetic="torch",
                          overlap_backward=True, max_grad_norm=max_grad_norm, **kw)
    return ropt, opt


def backward_both(ref, ropt, model, opt, step):
    """zero_grad and backward of step ``step``'s batch, torch's model then strata's."""
    for m, o in ((ref, ropt), (model, opt)):
        o.zero_grad()
        loss_of(m, *batch(step)).backward()


def assert_same(ref, model, h):
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        assert torch.equal(h.read(b), a.detach()), n


def trainable_numel(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def stepped_numel(model):
    """Elements of the parameters with a gradient in the last backward."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad and p.grad is not None)


@pytest.mark.parametrize("working_set", [SMALL, WHOLE])
def test_update_in_backward_is_torchs_and_moves_28_bytes(tmp_path, working_set):
    ref, model, h = make(tmp_path, working_set)
    ropt, opt = optimizers(ref, model, h)
    for step in range(4):
        fetched = h.stats()["bytes_fetched"]
        backward_both(ref, ropt, model, opt, step)
        if working_set == WHOLE and step > 0:
            # the new values were staged into the materialized parameters: nothing fetched
            assert h.stats()["bytes_fetched"] == fetched
        ropt.step()
        before = h.stats()
        opt.step()
        assert h.stats()["grad_bytes_written"] == 0  # no gradient stored
        assert h.stats()["grad_bytes_read"] == 0
        last = opt.last_step
        assert last["tensors_started_early"] > 0 and not last["rolled_back"]
        n = stepped_numel(model)
        if working_set == WHOLE and step > 0:
            # masters copied from the parameters materialized for backward: moments only
            assert last["bytes_read"] == 8 * n
        assert last["bytes_written"] == 12 * n  # master (= the parameter) and moments
        assert h.stats()["bytes_written_back"] == before["bytes_written_back"]
        assert_same(ref, model, h)
    opt.close()
    assert_same(ref, model, h)  # unlinked: the parameters' own objects hold the values
    h.close()


@pytest.mark.parametrize("max_norm", [0.05, 1e9])
def test_clipping_with_kept_gradients(tmp_path, max_norm):
    """max_grad_norm= stores the gradients too: a step that clips (0.05 clips these) rolls
    the early updates back and is redone from them, and the next backwards start none;
    one that does not clip (1e9) commits them."""
    ref, model, h = make(tmp_path, SMALL)
    ropt, opt = optimizers(ref, model, h, max_grad_norm=max_norm)
    seen = []
    for step in range(3):
        backward_both(ref, ropt, model, opt, step)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
        ropt.step()
        opt.step()
        last = opt.last_step
        seen.append((last["clip_coef"] < 1.0, last["rolled_back"],
                     last["tensors_started_early"] > 0))
        assert_same(ref, model, h)
    if max_norm < 1:
        assert seen == [(True, True, False), (True, False, False), (True, False, False)]
    else:
        assert seen == [(False, False, True)] * 3
    assert h.stats()["grad_bytes_written"] > 0  # kept for a redo
    opt.close()
    h.close()


def test_reading_parameters_before_the_step(tmp_path):
    """An eval forward between backward and step fetches started parameters: their early
    updates are rolled back and the step redone from the kept gradients."""
    ref, model, h = make(tmp_path, SMALL)
    ropt, opt = optimizers(ref, model, h, max_grad_norm=1e9)
    x, _ = batch(99)
    for step in range(2):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            loss_of(m, *batch(step)).backward()
            with torch.no_grad():
                m.eval()
                out = m(x)
                m.train()
            if m is ref:
                expect = out
            else:
                assert torch.equal(out, expect)  # the values before the step
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9)
        ropt.step()
        opt.step()
        assert_same(ref, model, h)
    opt.close()
    h.close()


def test_without_kept_gradients_edits_are_refused(tmp_path):
    ref, model, h = make(tmp_path, SMALL)
    _, opt = optimizers(ref, model, h)
    before = {n: h.read(p).clone() for n, p in model.named_parameters()}
    opt.zero_grad()
    loss_of(model, *batch(0)).backward()
    with pytest.raises(RuntimeError, match="'fc1.weight': its gradient was taken by the "
                                           "update in backward"):
        model.fc1.weight.grad.mul_(0.5)  # a hand-written clip that clips
    with pytest.raises(RuntimeError, match="max_grad_norm="):
        model.fc2.weight.grad.sum()
    n = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)  # norms known: no read
    assert float(n) > 0
    model.fc1.bias.grad = None  # the step must be redone without it: no gradients kept
    with pytest.raises(RuntimeError, match="not stored"):
        opt.step()
    for name, p in model.named_parameters():  # rolled back: nothing changed
        assert torch.equal(h.read(p), before[name]), name
    opt.close()
    h.close()


def test_a_skipped_step_needs_no_gradient(tmp_path):
    ref, model, h = make(tmp_path, SMALL)
    ropt, opt = optimizers(ref, model, h)
    for step in range(3):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            hk = None
            if step == 1:
                hk = m.fc2.weight.register_hook(lambda g: g * float("inf"))
            loss_of(m, *batch(step)).backward()
            if hk is not None:
                hk.remove()
        if step == 1:  # torch.optim would write NaN; strata skips (warned): so does the ref
            with pytest.warns(RuntimeWarning, match="skipped"):
                opt.step()
            assert opt.last_step["skipped"]
        else:
            ropt.step()
            opt.step()
        assert_same(ref, model, h)
    opt.close()
    h.close()


def test_accumulation_with_accumulating(tmp_path):
    ref, model, h = make(tmp_path, SMALL)
    ropt, opt = optimizers(ref, model, h)
    for step in range(3):
        for m, o in ((ref, ropt), (model, opt)):
            o.zero_grad()
            for k in range(3):
                if m is model and k < 2:
                    with opt.accumulating():
                        loss_of(m, *batch(step, k)).backward()
                else:
                    loss_of(m, *batch(step, k)).backward()
        ropt.step()
        opt.step()
        assert opt.last_step["tensors_started_early"] > 0
        assert_same(ref, model, h)
    opt.close()
    h.close()


def test_second_backward_without_accumulating_is_refused_or_redone(tmp_path):
    ref, model, h = make(tmp_path, SMALL)
    ropt, opt = optimizers(ref, model, h, max_grad_norm=1e9)
    for m, o in ((ref, ropt), (model, opt)):
        o.zero_grad()
        loss_of(m, *batch(0, 0)).backward()
        loss_of(m, *batch(0, 1)).backward()  # kept gradients: accumulated, then stepped
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9)
    ropt.step()
    opt.step()
    assert_same(ref, model, h)
    opt.close()
    _, opt = optimizers(ref, model, h, key_prefix="second/")  # no gradients kept: the
    # second backward cannot add
    opt.zero_grad()
    loss_of(model, *batch(1, 0)).backward()
    with pytest.raises(RuntimeError, match="accumulating"):
        loss_of(model, *batch(1, 1)).backward()
    opt.close()
    h.close()


def test_checkpoint_and_resume_of_linked_parameters(tmp_path):
    ref, model, h = make(tmp_path, SMALL)
    ropt, opt = optimizers(ref, model, h)
    for step in range(2):
        backward_both(ref, ropt, model, opt, step)
        ropt.step()
        opt.step()
    h.checkpoint()  # the parameters' own objects get the masters' values
    opt.close()
    h.close(restore=False)
    torch.manual_seed(5)
    fresh = Net()
    h2 = st.offload_parameters(fresh, path=str(tmp_path / "s"), resume=True)
    assert_same(ref, fresh, h2)
    h2.close()


@pytest.mark.parametrize("working_set", [SMALL, WHOLE])
def test_state_dict_round_trip_and_copies_between_steps(tmp_path, working_set):
    """After a step: the model's own state_dict loaded back, and deepcopy, see the values
    of the last step (the parameters' values are the masters)."""
    import copy
    ref, model, h = make(tmp_path, working_set)
    ropt, opt = optimizers(ref, model, h)
    for step in range(3):
        backward_both(ref, ropt, model, opt, step)
        ropt.step()
        opt.step()
        assert_same(ref, model, h)
        model.load_state_dict(model.state_dict())
        c = copy.deepcopy(model)
        for (n, a), (_, b) in zip(ref.named_parameters(), c.named_parameters()):
            assert torch.equal(b.detach(), a.detach()), n
        del c
    opt.close()
    h.close()


def test_a_redo_without_kept_gradients_says_why_and_changes_nothing(tmp_path):
    import copy
    ref, model, h = make(tmp_path, SMALL)
    _, opt = optimizers(ref, model, h)
    opt.zero_grad()
    loss_of(model, *batch(0)).backward()
    opt.step()
    before = {n: h.read(p).clone() for n, p in model.named_parameters()}
    for case in ("lr", "copy"):
        opt.zero_grad()
        loss_of(model, *batch(1)).backward()
        if case == "lr":
            opt.param_groups[0]["lr"] = 5e-3
            why = "hyperparameters were changed between backward and step"
        else:
            c = copy.deepcopy(model)  # reads the values of before the step
            for n, p in c.named_parameters():
                assert torch.equal(p.detach(), before[n]), n
            why = "was read or written between backward and step"
        with pytest.raises(RuntimeError, match=f"must be stepped after backward because .*{why}"):
            opt.step()
        for n, p in model.named_parameters():
            assert torch.equal(h.read(p), before[n]), (case, n)
    opt.close()
    h.close()
