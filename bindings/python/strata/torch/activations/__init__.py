"""strata.torch.activations -- activation offload: what autograd saves for backward goes to
a host pool with a byte budget and beyond it to a strata store's nvme tier, written
asynchronously in forward, prefetched in backward along the previous backward's order, and
freed as soon as autograd frees it (``strata.torch.offload_activations``;
docs/activations.md).

Modules: _api.py (offload_activations, ActivationOffload), _pool.py (the host pool: pack,
spill, unpack, free), _entry.py (an entry and its handle, what is offloaded,
deduplication), _prefetch.py (the trace and the fetch thread). The hooks meet parameter
offload's through strata.torch._saved.

Thread-safety: see ActivationOffload.
"""

from ._api import ActivationOffload, offload_activations

__all__ = ["offload_activations", "ActivationOffload"]
