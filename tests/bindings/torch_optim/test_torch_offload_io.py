"""The I/O of strata.torch's offloaded optimizers: 12 bytes read and 12 written per fp32
parameter per step on the nvme tier (measured with /proc/self/io), bytes_moved counting
every byte, and the weights copied into the model by the step itself (bit-identical to
torch.optim with arithmetic="torch", for every parameter layout and dtype)."""
import os

import pytest
import torch

import strata.torch as st


def _params(seed, shapes, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(dtype)) for s in shapes]


def _grads(params, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


@pytest.mark.parametrize("tier", ["nvme", "host"])
def test_step_reads_and_writes_12_bytes_per_fp32_parameter(tmp_path, tier, proc_io):
    shapes = [(512, 512), (1000, 300), (7,), (4096,)]  # 566,247 parameters
    numel = sum(torch.Size(s).numel() for s in shapes)
    ours = _params(0, shapes)
    opt = st.OffloadAdamW(ours, lr=1e-3, path=str(tmp_path / "s"), tier=tier)
    try:
        _grads(ours, 0)
        opt.step()  # the first step may touch files for the first time
        for step in range(1, 4):
            _grads(ours, step)
            before, moved = proc_io(), dict(opt.bytes_moved)
            opt.step()
            after = proc_io()
            read, written = after[0] - before[0], after[1] - before[1]
            delta = {k: opt.bytes_moved[k] - moved[k] for k in moved}
            # The tails of the objects round up to 4 KiB blocks: 3 streams x 4 tensors.
            slack = 3 * len(shapes) * 4096
            if tier == "nvme":
                assert 12 * numel <= read <= 12 * numel + slack, (read, 12 * numel)
                assert 12 * numel <= written <= 12 * numel + slack, (written, 12 * numel)
                assert delta["nvme_read"] == 12 * numel
                assert delta["nvme_written"] == 12 * numel
            else:
                assert read <= slack and written <= slack, (read, written)
                assert delta["nvme_read"] == delta["nvme_written"] == 0
            assert delta["host_grads_read"] == 4 * numel
            assert delta["host_weights_written"] == 4 * numel
            assert delta["host_copies"] == 0
            assert delta["device_to_host"] == delta["host_to_device"] == 0
    finally:
        opt.close()


@pytest.mark.parametrize("tier", ["nvme", "host"])
def test_weights_written_by_the_step_match_torch_for_every_layout(tmp_path, tier):
    """fp32 contiguous (written in place), channels_last (through a buffer), fp16 and a
    non-contiguous fp16 parameter: bit-identical to torch.optim.AdamW over 4 steps."""
    def make():
        ps = _params(1, [(4, 3, 5, 5), (4, 3, 5, 5), (33,), (17, 3)])
        ps[1].data = ps[1].data.to(memory_format=torch.channels_last)
        return ps
    ours, ref = make(), make()
    ours16 = _params(2, [(40,), (9, 8)], torch.float16)
    ours16[1].data = ours16[1].data.t().contiguous().t()  # non-contiguous fp16
    ref16 = [torch.nn.Parameter(p.detach().float().clone()) for p in ours16]
    assert not ours[1].is_contiguous() and not ours16[1].is_contiguous()
    opt = st.OffloadAdamW([{"params": ours}, {"params": ours16}], lr=1e-2,
                          path=str(tmp_path / "s"), tier=tier, arithmetic="torch")
    torch_opt = torch.optim.AdamW(ref + ref16, lr=1e-2)
    try:
        for step in range(4):
            _grads(ours, step)
            _grads(ref, step)
            _grads(ours16, step + 10)
            for a, b in zip(ours16, ref16):
                b.grad = a.grad.float()
            moved = dict(opt.bytes_moved)
            opt.step()
            torch_opt.step()
            for a, b in zip(ours, ref):
                assert torch.equal(a, b)
            for a, b in zip(ours16, ref16):
                assert torch.equal(a, b.detach().half())
            n_buffered = ours[1].numel() * 4 + ours16[1].numel() * 2
            assert opt.bytes_moved["host_copies"] - moved["host_copies"] == n_buffered
    finally:
        opt.close()


def test_same_tensors_are_not_attached_again(tmp_path, monkeypatch):
    """A step whose gradients and parameters are those of the last step calls neither
    set_grad nor set_param_copy; a new gradient tensor (zero_grad(set_to_none=True)) is
    attached again."""
    ps = _params(3, [(10,)] * 4)
    opt = st.OffloadAdam(ps, lr=1e-3, path=str(tmp_path / "s"))
    try:
        _grads(ps, 0)
        opt.step()
        calls = []
        real = opt._opt
        for name in ("set_grad", "set_param_copy"):
            fn = getattr(real, name)
            monkeypatch.setattr(real, name, lambda h, t, _fn=fn, _n=name: (calls.append(_n), _fn(h, t)))
        opt.step()
        assert calls == []
        opt.zero_grad(set_to_none=True)
        _grads(ps[:1], 1)
        opt.step()  # p0: a new gradient; p1..p3: no gradient now (detached once)
        assert sorted(calls) == ["set_grad"] * 4 + ["set_param_copy"] * 3
    finally:
        opt.close()


@pytest.fixture
def small_fs(mount_tmpfs):
    """A 20 MiB tmpfs (skips where mount is refused)."""
    return mount_tmpfs("20m")


def _data_blocks(root):
    return sum(os.stat(os.path.join(root, f)).st_blocks * 512
               for f in os.listdir(root) if f.endswith(".data"))


def _assert_disk_full(err, where):
    """``err`` is the one exception type of a full disk: DiskFullError, an OSError with errno
    ENOSPC (what ``except OSError`` catches) and a ResourceExhaustedError."""
    import errno

    import strata
    assert isinstance(err, strata.DiskFullError), type(err)
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC, err.errno
    assert isinstance(err, strata.ResourceExhaustedError) and err.code == "ResourceExhausted"
    assert f"[errno {errno.ENOSPC}]" in str(err) and where in err.message, str(err)


def test_state_that_does_not_fit_is_refused_at_creation(small_fs):
    ps = _params(4, [(1024, 1024)])  # 12 MiB of state: 24 MiB with its new copies
    with pytest.raises(OSError) as e:  # DiskFullError, as a full disk during a step
        st.OffloadAdamW(ps, path=str(small_fs / "s"))
    _assert_disk_full(e.value, str(small_fs / "s"))
    msg = str(e.value)
    assert str(small_fs / "s") in msg and "more bytes" in msg and "bytes (" in msg, msg
    assert "2 x its state (12582912 bytes" in msg, msg


def test_group_that_does_not_fit_is_refused_at_add_param_group(small_fs):
    ours = _params(4, [(1000,)])
    opt = st.OffloadAdamW(ours, path=str(small_fs / "s"))
    try:
        big = _params(5, [(1024, 1024)])
        with pytest.raises(OSError) as e:
            opt.add_param_group({"params": big})
        _assert_disk_full(e.value, str(small_fs / "s"))
        assert "offload: not enough disk space" in e.value.message, e.value.message
        assert len(opt.param_groups) == 1  # nothing added
    finally:
        opt.close()


def test_full_budget_is_not_a_full_disk(tmp_path):
    """A full nvme_budget: a plain ResourceExhaustedError (not an OSError), as any budget."""
    import strata
    with strata.Store.open(str(tmp_path / "s"), staging="4MiB", chunk_size="1MiB",
                           nvme_budget="4MiB") as store:
        with pytest.raises(strata.ResourceExhaustedError) as e:
            st.OffloadAdamW(_params(4, [(1024, 1024)]), store=store, tier="nvme")
            assert not isinstance(e.value, OSError) and e.value.errno == 0, repr(e.value)
            assert "budget" in e.value.message, e.value.message


def test_state_that_fits_steps_and_disk_usage_stays_bounded(small_fs):
    shapes = [(300, 1000), (77,)]
    ours = _params(5, shapes)
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    root = str(small_fs / "s")
    opt = st.OffloadAdamW(ours, lr=1e-3, path=root, arithmetic="torch")
    torch_opt = torch.optim.AdamW(ref, lr=1e-3)
    try:
        need = opt._opt.disk_space()
        T = need["state_bytes"]
        assert T == 3 * (-(-300 * 1000 * 4 // 4096) * 4096 + 4096)  # 4 KiB blocks
        tail = (20 << 20) // 4  # the data file's preallocated growth between commits, at most
        for step in range(30):
            _grads(ours, step)
            _grads(ref, step)
            opt.step()
            torch_opt.step()
            assert _data_blocks(root) <= 2 * T + need["in_flight_bytes"] + 4096 + tail
            if step % 5 == 4:
                opt.checkpoint()
                # one copy + the checkpoint record, plus at most the warm reserve (freed
                # extents kept for the next step's writes: at most the bytes in use)
                assert T + 4096 <= _data_blocks(root) <= 2 * (T + 4096)
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)
    finally:
        opt.close()
    assert _data_blocks(root) == T + 4096  # a closed store punches the reserve too
