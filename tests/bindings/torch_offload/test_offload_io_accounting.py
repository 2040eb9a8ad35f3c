"""The bytes an offloaded training iteration moves from and to its store, as
examples/train_offload.py's store_bytes() counts them (the accounting of the main job and
of bench/optimizer/param_offload.py), against what the process read and wrote
(/proc/self/io, nvme tier, O_DIRECT): no byte counted twice, none left out (the tails of
objects round up to 4 KiB blocks and the catalog's commits add a little: 2% allowed)."""
import argparse
import os
import sys
import sysconfig

import pytest
import torch.nn.functional as F

import strata
import strata.torch as st

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples")
sys.path.insert(0, EXAMPLES)
from train_lm import param_groups  # noqa: E402
from train_offload import PRESETS, build, bytes_moved, store_bytes  # noqa: E402


# (overlap_backward, max_grad_norm, bytes written per parameter): fp32 AdamW after backward
# writes gradients (4 B), the step's weights (4), masters and moments (12); updated inside
# backward without clipping, only the master (the parameter's value) and moments (12)
CASES = [(False, 1.0, 20), (True, 0.0, 12)]


@pytest.mark.parametrize("overlap,max_grad_norm,written_per_param", CASES)
def test_counted_bytes_are_the_bytes_moved(tmp_path, proc_io, overlap, max_grad_norm,
                                           written_per_param):
    args = argparse.Namespace(**PRESETS["tiny"], seed=0, corpus=sysconfig.get_paths()["stdlib"],
                              corpus_bytes=1 << 20)
    store = strata.Store.open(str(tmp_path / "s"), host_budget="16MiB", staging="16MiB",
                              chunk_size="1MiB", durability="flush")
    with st.offload_init(store, working_set=args.working_set) as h:
        model, batches, vocab = build(args)
    h.attach(model, overwrite=True)
    opt = st.OffloadAdamW(param_groups(model, 0.1), lr=3e-4, store=store,
                          max_grad_norm=max_grad_norm, overlap_backward=overlap,
                          overwrite=True)
    n = sum(p.numel() for p in model.parameters())
    try:
        for it in range(3):
            x, y = batches.next()
            before, io0 = store_bytes(h, opt), proc_io()
            loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            store.flush()
            moved, io1 = bytes_moved(before, store_bytes(h, opt)), proc_io()
            if it == 0:
                continue  # the first: files grow, the trace is made
            read, written = io1[0] - io0[0], io1[1] - io0[1]
            assert moved["read"] <= read <= 1.02 * moved["read"], (moved, read)
            assert moved["written"] <= written <= 1.02 * moved["written"], (moved, written)
            assert moved["written"] == written_per_param * n
            # reads: every parameter fetched at least once (>= 4 B), then after backward its
            # gradient (4) and state (12), inside backward its moments only (8)
            assert moved["read"] >= written_per_param * n
    finally:
        opt.close()
        h.close(restore=False)
        store.close()
