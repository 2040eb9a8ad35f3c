"""The optimizers guide's example (docs/guide-optimizers.md): any torch.optim class with
its state in a strata store, and a custom rule (Lion) written with torch ops, each trained
bit-identically to the same optimizer in memory; fp16 dynamic loss scaling. Run:
  PYTHONPATH=build/python /usr/bin/python3 examples/guide_optimizers.py DIR
(DIR is created; the stores are left there). Exit status 0 when every check holds.
"""
import os
import sys

import torch

from strata.torch.optim import (DynamicLossScaler, OffloadAdamW, OffloadOptimizer,
                                RuleOptimizer, update_rule)

root = sys.argv[1]
os.makedirs(root, exist_ok=True)


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def train(m, opt, steps=4):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()


# [any-class]
m1 = model()
opt = OffloadOptimizer(torch.optim.RMSprop, m1.parameters(), lr=1e-2, momentum=0.9,
                       centered=True, path=os.path.join(root, "rmsprop"), tier="nvme")
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
train(m1, opt)                 # each step: RMSprop's own step on each streamed slice
sd = opt.state_dict()          # torch.optim.RMSprop's format, read from the store
opt.close()                    # checkpoints; OffloadOptimizer(..., resume=True) reopens it
# [any-class]

m2 = model()
ref = torch.optim.RMSprop(m2.parameters(), lr=1e-2, momentum=0.9, centered=True)
train(m2, ref)
assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
ref_sd = ref.state_dict()["state"]
assert all(torch.equal(sd["state"][i][k], ref_sd[i][k])
           for i in ref_sd for k in ("square_avg", "momentum_buffer", "grad_avg"))


# [lion]
@update_rule(states=("exp_avg",), defaults=dict(lr=1e-4, betas=(0.9, 0.99),
                                                weight_decay=0.0))
def lion(param, grad, state, step, group):
    """Lion (Chen et al. 2023, arXiv:2302.06675, Algorithm 2, decoupled weight decay)."""
    beta1, beta2 = group["betas"]
    exp_avg = state["exp_avg"]
    update = exp_avg.mul(beta1).add_(grad, alpha=1 - beta1).sign_()
    param.mul_(1 - group["lr"] * group["weight_decay"]).add_(update, alpha=-group["lr"])
    exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


m3 = model()
opt = OffloadOptimizer(lion, m3.parameters(), lr=3e-4, weight_decay=0.1,
                       path=os.path.join(root, "lion"), tier="nvme")
train(m3, opt)
opt.close()
# [lion]

# [lion-in-memory]
m4 = model()
train(m4, RuleOptimizer(lion, m4.parameters(), lr=3e-4, weight_decay=0.1))
assert all(torch.equal(a, b) for a, b in zip(m3.parameters(), m4.parameters()))
# [lion-in-memory]

m5, data = model(), torch.Generator().manual_seed(1)
before = [p.detach().clone() for p in m5.parameters()]
# [loss-scale]
opt = OffloadAdamW(m5.parameters(), lr=1e-3, path=os.path.join(root, "adamw"),
                   max_grad_norm=1.0)
scaler = DynamicLossScaler()              # 2**16, window 1000, hysteresis 2, min 1
for _ in range(4):
    x, y = torch.randn(8, 16, generator=data), torch.randint(0, 4, (8,), generator=data)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(m5(x), y)  # fp32: loss * 2**16 fits
    scaler.scale(loss).backward()         # gradients times the scale
    scaler.step(opt)                      # unscaled inside the step; skipped on inf/NaN
    scaler.update()                       # DeepSpeed's rule
saved = scaler.state_dict()               # save it with the checkpoint; load_state_dict
opt.close()
# [loss-scale]
assert saved["scale"] == 2.0 ** 16 and saved["overflows"] == 0 and saved["iteration"] == 4
assert not any(torch.equal(a, b) for a, b in zip(before, m5.parameters()))
print("guide_optimizers: all checks passed")
