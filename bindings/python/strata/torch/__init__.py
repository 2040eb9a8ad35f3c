"""strata.torch -- strata under PyTorch, in two wings joined by one public seam:

- ``strata.torch.optim``: the offloaded optimizers ``OffloadAdam`` / ``OffloadAdamW``
  (torch.optim.Adam/AdamW with fp32 masters and moments in a strata store);
- ``strata.torch.offload``: parameter offload, ``offload_parameters`` / ``offload_init``
  (a model's parameters, and with strata's optimizers its gradients, in a strata store,
  materialized in a bounded working set);
- ``strata.torch.activations``: activation offload, ``offload_activations`` (what autograd
  saves for backward in a host pool and the store's nvme tier);
- ``strata.torch.checkpoints``: ``load_safetensors`` / ``save_safetensors`` /
  ``load_torch_state_dict`` / ``save_torch_state_dict`` (checkpoint files into and out of a model's tensors, offloaded
  or not, streamed); the optimizer wing's ``save_universal_checkpoint`` /
  ``load_universal_checkpoint`` (optimizer state in DeepSpeed's universal layout, any world size).

The optimizer wing reaches offloaded parameters only through the offload wing's public
names (``is_offloaded``, ``offload_of``, ``ParameterOffload``'s methods); ``_common.py``
holds what both need once (the gradient-accumulator hook, the gradient-to-host copy, the
finiteness test), ``_trace.py`` strata's timeline (``trace`` / ``start_trace`` /
``stop_trace``, ``trace_spans``, ``STRATA_TRACE``). See docs/architecture.md, "The Python layer".
"""

from __future__ import annotations

from ._trace import spans as trace_spans, start_trace, stop_trace, trace
from .activations import ActivationOffload, offload_activations
from .checkpoints import (load_safetensors, load_torch_state_dict, save_safetensors,
                          save_torch_state_dict)
from .offload import OffloadedParameter, ParameterOffload, offload_init, offload_parameters
from .optim import OffloadAdam, OffloadAdamW, _OffloadAdamBase  # noqa: F401 (in the stubs)
from .optim import load_universal_checkpoint, save_universal_checkpoint

__all__ = ["OffloadAdam", "OffloadAdamW", "offload_parameters", "offload_init", "ParameterOffload",
           "OffloadedParameter", "offload_activations", "ActivationOffload", "load_safetensors",
           "save_safetensors", "load_torch_state_dict", "save_torch_state_dict", "save_universal_checkpoint",
           "load_universal_checkpoint", "trace", "start_trace", "stop_trace", "trace_spans"]
