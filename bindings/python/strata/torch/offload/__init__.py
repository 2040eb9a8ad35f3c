"""strata.torch.offload -- parameter offload: a model's parameters (and, with strata's
optimizers, its gradients) live in a strata store and are materialized in a bounded working
set while they are used (``strata.torch.offload_parameters``; docs/offload.md, "Parameter
offload").

How parameters are materialized. Each offloaded parameter becomes an
:class:`OffloadedParameter` (a ``torch.nn.Parameter`` subclass: ``isinstance`` checks,
``model.parameters()``, optimizers and ``requires_grad`` behave as before) whose data, when
released, is one element expanded to the parameter's shape: ``shape``, ``size()``,
``numel()`` and ``dim()`` stay true without a fetch. Every other torch operation that takes
the parameter -- a module's forward, a parameter used outside its own module (a tied output
head), ``p.add_()`` of torch.optim, ``model.load_state_dict`` -- materializes it first
(``__torch_function__``), so tied, shared and reused parameters need no registration.
Backward reads parameters through autograd's saved-tensor hooks (installed around every
operation on an offloaded parameter, inside the model's forward or not): a saved parameter
(or a view of one, as ``F.linear`` saves) is stored as a reference and fetched again when
backward needs it, so a released parameter is never read stale; other saved tensors are
untouched (a view made earlier keeps the buffer it views: fetches never reuse a buffer).
In-place changes of a materialized parameter (``p.clamp_()`` under no_grad, torch.optim's
update) are seen by its version counter and written back to the store when it is released.

Gradients. With strata's OffloadAdam/OffloadAdamW over the parameters, each gradient is
moved to the store as soon as torch has accumulated it (a hook on the parameter's
AccumulateGrad node): backward never holds the whole model's gradients, and micro-batches
accumulate in the store exactly as torch's ``p.grad += g`` would (within
``grad_host_budget`` bytes they stay in host memory instead: offload/_grad_host.py).
Between backward and step ``p.grad`` is an :class:`OffloadedGrad` standing for the stored
gradient: reads, in-place edits, ``clip_grad_norm_``, ``p.grad = None`` / ``= t`` and
``zero_grad`` give torch's results (offload/_grad_tensor.py; what each costs:
docs/offload.md, "Gradients between backward and step"). :meth:`ParameterOffload.grad`
reads one. With any other optimizer gradients stay in ``p.grad`` as torch leaves them (its
update then materializes each parameter).

Thread-safety: one thread at a time (torch's forward/backward thread); the working set's
fetch thread is internal.

Modules: _api.py (offload_parameters, offload_init), _handle.py (ParameterOffload),
_parameter.py (OffloadedParameter, what autograd saves of it, is_offloaded / offload_of),
_working_set.py (ParamRecord and its Residency, the WorkingSet: fetch, evict, prefetch),
_grads.py (the GradientStore), _grad_sum.py (fp32 sums of fp16/bf16 gradients),
_grad_host.py (gradients held in host memory within ``grad_host_budget``),
_grad_tensor.py (OffloadedGrad, ``p.grad`` of a stored gradient), _fastpath.py (torch's fused fast paths), _copy.py (deepcopy, pickling, repr),
_hooks.py (the model's hooks), _args.py (argument checks), _memory.py. The optimizer wing
(strata.torch.optim) imports only the names
below.
"""

from ._api import offload_init, offload_parameters
from ._grad_tensor import OffloadedGrad
from ._grads import GradInfo
from ._handle import ParameterOffload
from ._parameter import (OffloadedParameter, is_offloaded, note_checkpoint_value, offload_of,
                         restored_from)

__all__ = ["offload_parameters", "offload_init", "ParameterOffload", "OffloadedParameter",
           "GradInfo", "OffloadedGrad", "is_offloaded", "offload_of", "note_checkpoint_value",
           "restored_from"]
