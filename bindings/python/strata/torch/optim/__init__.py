"""strata.torch.optim -- PyTorch optimizers whose fp32 master weights and moments live in a
strata store.

``OffloadAdam`` and ``OffloadAdamW`` are ``torch.optim.Optimizer`` subclasses with the
arguments and semantics of ``torch.optim.Adam`` / ``torch.optim.AdamW`` (torch 1.13:
bias correction, amsgrad, maximize, L2 vs decoupled weight decay). Each step:

1. the gradients are attached without copies when they are contiguous CPU tensors
   (fp32/fp16/bf16; other dtypes are converted to fp32); CUDA gradients are first copied
   into pinned host buffers (one per parameter, allocated once);
2. strata's offloaded step runs on the CPU (GIL released): for state in the nvme tier the
   masters and moments stream through a few pinned buffers, reads of the next sub-group and
   writes of the previous one overlapping the update (see optimizer/offload.hpp);
3. the updated weights go back into the model: fp32 CPU parameters receive the fp32
   masters, fp16/bf16 CPU parameters receive the rounded copy written by the kernel itself
   (round to nearest even), CUDA parameters via pinned host buffers.

The model's own parameters are never the master copy: with fp16/bf16 parameters the fp32
masters keep full precision across steps (mixed-precision training). Over parameters
offloaded by ``strata.torch.offload_parameters`` the gradients come from the offload's
store and the step runs in batches (optim/_offloaded_step.py).

Example::

    opt = strata.torch.OffloadAdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                                    path="/nvme/run1", tier="nvme", max_grad_norm=1.0)
    loss.backward(); opt.step(); opt.zero_grad()
    opt.checkpoint()                    # durable, in place

Thread-safety: like torch optimizers, one thread at a time.

What they keep of torch.optim's contract (docs/offload.md): parameters changed outside the
optimizer (``model.load_state_dict``, ``p.clamp_()``, ``p.data = t``) are stepped from
their current value; ``param_groups`` edits are followed as torch.optim's (state follows
the parameter object; a parameter listed twice is refused); ``optimizer.state[p]`` has
torch's entries; torch's keyword arguments are accepted; one open optimizer per store and
key prefix.

``OffloadOptimizer(torch.optim.RMSprop, params, lr=..., path=..., tier="nvme")`` runs any
element-wise torch.optim class (or a custom ``UpdateRule`` written with torch ops) with its
state in the store: the class's own step on each streamed slice, through strata's Python
update rule (docs/optimizers.md).

Modules (imports point down this list; the offload wing, strata.torch.offload, is reached
only through its package's public names):

- _any.py: OffloadOptimizer (any element-wise torch.optim class or UpdateRule; its own
  members, beside the chain below); _any_io.py: its state dicts and checkpoints;
  _slice_step.py: a class's step on one slice; _any_state.py: its ``optimizer.state``;
  _rule.py: UpdateRule, update_rule, RuleOptimizer (custom rules)
- _adam.py: OffloadAdam, OffloadAdamW (the constructor: arguments, settings, checks)
- _optimizer.py: OffloadedTorchOptimizer (members, step()'s order of work, close);
  _optimizer_io.py: its checkpoint and state-dict methods
- _step.py: the step's three paths; _offloaded_step.py: the step over offloaded parameters;
  _overlap.py: the step overlapped with backward; _gate.py: the gate's inputs
- _registry.py: param groups and parameters into strata; _layout.py: param_groups edits
  (strata groups as hyperparameter slots, moves, the layout record for resume);
  _param_table.py: parameters <-> strata handles, changed parameters
- _checkpoints.py: create/resume, checkpoint layout, state dicts; _state_view.py:
  ``optimizer.state``; _exchange.py: gradients in, weights out
- _hyperparams.py, _torch_kwargs.py, _names.py, _settings.py: torch's names and checks
- _universal.py: save_universal_checkpoint / load_universal_checkpoint (DeepSpeed's
  universal checkpoint layout, written and read by every rank at any world size)
- _grad_accum.py: fp32 gradient accumulation of fp16/bf16 in-memory parameters
  (``grad_accumulation_dtype``; both optimizers)
- _loss_scale.py: DynamicLossScaler (fp16 dynamic loss scaling, DeepSpeed's rule; the
  unscale fused into the step as its grad_scale, overflowing steps skipped on every rank)
"""

from ._adam import OffloadAdam, OffloadAdamW, _OffloadAdamBase  # noqa: F401 (strata.torch)
from ._any import OffloadOptimizer
from ._loss_scale import DynamicLossScaler
from ._rule import RuleOptimizer, UpdateRule, update_rule
from ._universal import load_universal_checkpoint, save_universal_checkpoint

__all__ = ["OffloadAdam", "OffloadAdamW", "OffloadOptimizer", "UpdateRule", "update_rule",
           "RuleOptimizer", "save_universal_checkpoint", "load_universal_checkpoint",
           "DynamicLossScaler"]
