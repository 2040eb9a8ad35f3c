"""The Python guide's example (docs/guide-python.md): a store with its tiers, then a small
model whose parameters, gradients and AdamW state live in the store, trained bit-identically
to torch.optim.AdamW in memory. Run:
  PYTHONPATH=build/python /usr/bin/python3 examples/guide_store.py DIR
(DIR is created; the stores it holds are left there). Exit status 0 when every check holds.
"""
import copy
import os
import sys

import numpy as np
import torch

import strata
import strata.torch

root = sys.argv[1]
os.makedirs(root, exist_ok=True)

# [open]
store = strata.Store.open(os.path.join(root, "store"), host_budget="64MiB", staging="16MiB",
                          chunk_size="1MiB")
# [open]

# [put-get]
w = np.arange(1000, dtype=np.float32).reshape(10, 100) * 0.5
store.put("layer0/w", w, "nvme", overwrite=True)     # durable when put() returns
back = store.get("layer0/w")                          # a new numpy array
assert back.dtype == np.float32 and back.shape == (10, 100) and (back == w).all()
t = torch.empty(10, 100)
store.get_into("layer0/w", t)                         # into an existing tensor: no new array
assert torch.equal(t, torch.from_numpy(w))
# [put-get]

# [tiers]
store.move("layer0/w", "host")                        # promote: the NVMe copy stays
info = store.stat("layer0/w")
print(f"layer0/w: {info.dtype}{list(info.shape)}, {info.nbytes} bytes, tier {info.tier}, "
      f"NVMe copy {info.on_nvme}")
assert info.tier == "host" and info.on_nvme
store.prefetch_async("layer0/w", "host").result()  # every blocking call has an _async form
store.evict("layer0/w")                               # back to NVMe only
assert store.stat("layer0/w").tier == "nvme"
store.close()
# [tiers]

# [offload]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
reference = copy.deepcopy(model)                      # the same training in memory

pstore = strata.Store.open(os.path.join(root, "params"), durability="flush", chunk_size="1MiB",
                           host_budget="64MiB", staging="16MiB")
params = strata.torch.offload_parameters(model, pstore, working_set="1MiB", overwrite=True)
opt = strata.torch.OffloadAdamW(model.parameters(), lr=1e-2, store=pstore,
                                arithmetic="torch", overwrite=True)
ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
for step in range(5):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)
    losses = []
    for m, o in ((model, opt), (reference, ref_opt)):  # the training loop is unchanged
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        o.step()
        o.zero_grad()
        losses.append(loss.item())
    print(f"step {step}: loss {losses[0]:.6f} offloaded, {losses[1]:.6f} in memory")
    assert losses[0] == losses[1]
for (name, p), q in zip(model.named_parameters(), reference.parameters()):
    assert torch.equal(p.detach().clone(), q.detach()), name  # bit-identical
print("parameter bytes fetched from the store:", params.stats()["bytes_fetched"])
opt.close()
params.close()
pstore.close()
# [offload]
print("guide_store: OK")
