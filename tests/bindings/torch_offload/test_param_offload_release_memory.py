"""offload_parameters(release_memory=): whether glibc's malloc releases freed memory (mmap
threshold fixed at 128 KiB) or keeps it for reuse (offload/_memory.py, ReleaseRule). The threshold is process-wide and fixed once, so each case runs in a child
process: the decision (``mmap_threshold_fixed()``) at the exact boundary of the rule
(4 x the parameters' bytes against the memory available), the explicit forms, offload_init,
and what the decision does to a training loop's allocations (page faults of a 4 MiB buffer
allocated, touched and freed 20 times on the main thread: each a fresh mapping when fixed,
the heap's reused memory when not)."""

import json
import subprocess
import sys
import textwrap

import pytest
import numpy as np
import torch

import strata.torch as st

CHILD = textwrap.dedent("""
    import json, resource, sys, tempfile
    import torch, torch.nn as nn
    import strata.torch as st
    from strata.torch.offload import _memory
    mode, available, how = sys.argv[1], sys.argv[2], sys.argv[3]
    release = {"none": None, "true": True, "false": False}[mode]
    if available != "real":
        _memory.available_memory = lambda: int(available)
    torch.manual_seed(0)
    d = tempfile.mkdtemp(dir=sys.argv[4])
    if how == "init":
        with st.offload_init(path=d, working_set="1MiB", release_memory=release) as h:
            model = nn.Sequential(nn.Linear(64, 32, bias=False), nn.Linear(32, 16, bias=False))
        h.attach(model)
    else:
        model = nn.Sequential(nn.Linear(64, 32, bias=False), nn.Linear(32, 16, bias=False))
        h = st.offload_parameters(model, path=d, working_set="1MiB", release_memory=release)
    fixed, kept = _memory.mmap_threshold_fixed(), _memory.freed_memory_kept()
    model(torch.randn(2, 64)).sum().backward()
    torch.set_num_threads(1)  # fill_ below on this thread only: its faults are all counted
    x = torch.empty(1 << 20).fill_(1.0)  # 4 MiB: glibc's dynamic threshold rises when freed
    del x
    f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(20):
        x = torch.empty(1 << 20).fill_(1.0)
        del x
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
    h.close()
    print(json.dumps(dict(fixed=fixed, kept=kept, faults=faults)))
""")

#: the model's parameter bytes: 64 x 32 + 32 x 16 fp32 elements
PARAM_BYTES = (64 * 32 + 32 * 16) * 4


def _run(tmp_path, mode: str, available: str, how: str = "offload") -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, mode, available, how, str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("how", ["offload", "init"])
def test_default_fixes_only_when_the_training_state_exceeds_the_memory_available(tmp_path, how):
    # 4 x 10,240 bytes = 40,960: exceeded by one byte less of memory, not at equality
    got = _run(tmp_path, "none", str(4 * PARAM_BYTES - 1), how)
    assert got["fixed"] is True and got["kept"] is False
    got = _run(tmp_path, "none", str(4 * PARAM_BYTES), how)
    assert got["fixed"] is False and got["kept"] is True


def test_default_on_this_machine_keeps_freed_memory_and_allocations_reuse_the_heap(tmp_path):
    got = _run(tmp_path, "none", "real")
    assert got["fixed"] is False and got["kept"] is True
    # 20 x 4 MiB reused from the heap: a few buffers' pages faulted again at most (measured
    # 0-3,072, more under load), against 1,024 per buffer when every allocation is a fresh
    # mapping (20,500 below): at most a quarter of that
    assert got["faults"] <= 5 * 1024, got


def test_release_memory_true_fixes_and_every_large_allocation_faults_its_pages(tmp_path):
    got = _run(tmp_path, "true", str(1 << 50))
    assert got["fixed"] is True and got["kept"] is False
    assert got["faults"] >= 20 * 1024, got  # each 4 MiB buffer: 1,024 pages of 4 KiB


def test_release_memory_false_never_fixes(tmp_path):
    got = _run(tmp_path, "false", "1")
    assert got["fixed"] is False and got["kept"] is True
    assert got["faults"] <= 5 * 1024, got


@pytest.mark.parametrize("bad,shown", [(1, "1 (int)"), (0, "0 (int)"), ("yes", "'yes' (str)"),
                                       ("auto", "'auto' (str)"),
                                       (np.bool_(True), "True (bool_)")])
def test_bad_release_memory_is_a_type_error_naming_it(tmp_path, bad, shown):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError) as e:
        st.offload_parameters(model, path=str(tmp_path / "s"), release_memory=bad)
    assert str(e.value) == ("offload_parameters: release_memory must be True, False or None, "
                            f"got {shown}")
    assert type(model.weight) is torch.nn.Parameter  # nothing offloaded


def test_a_later_offload_with_false_raises_the_trim_threshold(tmp_path):
    """release_memory=None keeps with a trim threshold of an eighth of the memory available;
    a later offload with False asks for the full 1 GiB and gets it (a threshold is only
    ever raised while kept)."""
    code = textwrap.dedent("""
        import sys, tempfile, torch
        import strata.torch as st
        from strata.torch.offload import _memory
        _memory.available_memory = lambda: 64 << 20  # 4 x 10,240 B fits: kept, 8 MiB
        d = tempfile.mkdtemp(dir=sys.argv[1])
        a = st.offload_parameters(torch.nn.Linear(64, 32, bias=False), path=d + "/a")
        first = _memory._KEPT
        b = st.offload_parameters(torch.nn.Linear(64, 32, bias=False), path=d + "/b",
                                  release_memory=False)
        print(first, _memory._KEPT, _memory.freed_memory_kept())
        a.close(); b.close()
    """)
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(8 << 20), str(1 << 30), "True"]
