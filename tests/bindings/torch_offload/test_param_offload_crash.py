"""Crash loop of the parameter-offload training (issue 16 with issue 13): a child trains
with offload_parameters + OffloadAdamW, checkpointing after every step, and is killed with
SIGKILL at a random moment (after a random number of checkpointed steps, then a random
delay of at most 50 ms); a second child resumes from the store (from scratch when no
checkpoint was made yet) and trains to the end. Every resumed run must end bit-identical
to torch's uninterrupted training. Trials: 3 by
default, STRATA_LONG_TESTS=1: 40 (seeds printed)."""
import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import torch

from test_param_offload import Net, train

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 6
CHILD = textwrap.dedent("""
    import sys, hashlib, torch
    sys.path.insert(0, {here!r})
    import strata, strata.torch as st
    from test_param_offload import Net, train
    torch.manual_seed(0)
    model = Net()
    store = strata.Store.open({path!r}, durability="flush", chunk_size="64KiB")
    # a child killed before its first checkpoint left nothing to resume: start over
    resume = "resume" in sys.argv and "optim/meta" in store
    h = st.offload_parameters(model, store, working_set=4096, resume=resume,
                              overwrite=not resume)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, store=store, arithmetic="torch",
                          resume=resume, overwrite=not resume, max_grad_norm=0.5)
    start = int(opt.state[model.fc1.weight]["step"]) if resume else 0
    print("START", start, flush=True)
    for step in range(start, {steps}):
        train(model, opt, step + 1, start=step)
        opt.checkpoint()
        print("CKPT", step + 1, flush=True)
    for n, p in h.parameters:
        print("P", n, hashlib.sha256(h.read(p).numpy().tobytes()).hexdigest(), flush=True)
""")


def _reference():
    torch.manual_seed(0)
    ref = Net()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    train(ref, opt, STEPS, clip=0.5, by_hand_clip=True)
    return {n: hashlib.sha256(t.detach().numpy().tobytes()).hexdigest()
            for n, t in ref.named_parameters()}


def test_sigkill_at_random_moments_then_resume(tmp_path):
    trials = 40 if os.environ.get("STRATA_LONG_TESTS") == "1" else 3
    want = _reference()
    seed = int(os.environ.get("STRATA_CRASH_SEED", time.time_ns() % 100000))
    rng = random.Random(seed)
    print(f"crash loop seed {seed}, {trials} trials")
    kills = 0
    for trial in range(trials):
        path = str(tmp_path / f"t{trial}")
        code = CHILD.format(here=HERE, path=path, steps=STEPS)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        # wait for the training to start and reach a random step (so that the kill lands
        # before the end however fast the machine is), then kill after a random delay
        # within the next step or its checkpoint
        assert p.stdout.readline().startswith("START 0")
        after = rng.randrange(0, STEPS - 1)  # 0: at once; k: once step k is checkpointed
        while after > 0:
            line = p.stdout.readline()
            assert line, "the child ended before its checkpoint"
            if line.startswith("CKPT "):
                after -= 1
        time.sleep(rng.uniform(0.0, 0.05))
        p.send_signal(signal.SIGKILL)
        p.communicate()
        kills += p.returncode == -signal.SIGKILL
        r = subprocess.run([sys.executable, "-c", code, "resume"], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"seed {seed} trial {trial}: {r.stderr}"
        got = {line.split()[1]: line.split()[2] for line in r.stdout.splitlines()
               if line.startswith("P ")}
        assert got == want, f"seed {seed} trial {trial}: resumed run differs"
    assert kills >= 1, f"seed {seed}: no trial was killed before it finished"
