"""The checkpoint and state-dict methods of OffloadedTorchOptimizer (optim/_optimizer.py),
a mixin over its members: ``checkpoint()``, ``state_dict()``, ``load_state_dict()``,
``__setstate__``, and the refusal of copies (``refuse_copy``, OffloadOptimizer's too); the
work is optim/_checkpoints.py's.

Thread-safety: like torch optimizers, one thread at a time.
"""

from __future__ import annotations

from typing import Any, Dict

from . import _layout


def refuse_copy(opt: Any, *_: Any) -> None:
    """``copy.copy`` / ``copy.deepcopy`` of a strata optimizer: its state lives in its store
    under its key prefix, which a copy would share (and a deepcopy would duplicate the
    offloaded parameters' objects into), so neither is made.

    :raises TypeError: always, naming the class and the way to get a second optimizer."""
    name = type(opt).__name__
    raise TypeError(f"{name} cannot be copied: its state lives in strata's store, which a "
                    f"copy would share; make another {name} over the parameters (its own "
                    "store or key_prefix) and load_state_dict(opt.state_dict()) into it")


class CheckpointMethods:
    """OffloadedTorchOptimizer's checkpoint and state-dict methods (it defines
    ``_check_open``, ``_abort_overlap``, ``_sync_all``, ``_sync_params`` and the members
    used here)."""

    __copy__ = refuse_copy
    __deepcopy__ = refuse_copy

    # ---- checkpoints and state dicts (optim/_checkpoints.py) ------------------------------

    def checkpoint(self) -> None:
        """Makes the state after the last step durable in place: one commit of the
        optimizer's objects, which holds every parameter's state and step count,
        zero-size parameters' included, and the current ``param_groups``' hyperparameters
        (an lr a scheduler set after the last step included). Parameters changed outside
        the optimizer since the last step are taken as their masters first, and parameters
        added to ``param_groups`` are registered (as at step()). Reopen with
        ``resume=True`` and the same store/path and key_prefix: a resume restores the last
        checkpoint or :meth:`close` (also garbage collection and interpreter exit),
        whatever the tier; a process killed without closing resumes at its last
        checkpoint, even if the store was flushed since.

        :raises ValueError, TypeError: a param_groups listing or a hyperparameter strata
            cannot follow (as step(); nothing is written).

        :raises strata.FailedPreconditionError: the optimizer is closed, or a step failed
            part-way before (resume from the last checkpoint).
        :raises strata.Error: the store's errors (IoError, ResourceExhausted, ...); the last
            checkpoint then stays the resume point.
        """
        self._check_open()
        self._abort_overlap()  # the state after the last completed step
        self._sync_all()
        _layout.write_record(self._table, self.tier)
        self._opt.checkpoint()

    def state_dict(self) -> Dict[str, Any]:
        """torch.optim.Adam's format: ``state[i]`` has ``step`` (a float tensor),
        ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad) as fp32 CPU
        tensors shaped like parameter i; for fp16/bf16 parameters also ``master_param``
        (the fp32 master). Parameters are numbered as torch.optim.Optimizer.state_dict
        numbers them: by identity, in ``param_groups`` order, a parameter listed again
        keeping its first number (the numbers then skip its later positions). Parameters
        changed outside the optimizer are taken as their masters first. It loads into
        torch.optim.Adam/AdamW and back."""
        self._check_open()
        self._abort_overlap()  # the state after the last completed step
        self._table.take_changed()
        self.state.write_back()
        return self._checkpoints.state_dict(self.param_groups)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state dict of this class or of torch.optim.Adam/AdamW (same groups and
        parameter sizes). Masters come from ``master_param`` when present, else from the
        model's current parameters; a parameter without a state entry restarts (zero
        moments, step 0). Each group becomes the saved one, as in torch: its keys replace
        ``param_groups``' (keys only ours had are dropped), and optional keys it lacks
        (e.g. ``maximize`` in an older checkpoint) take torch's defaults (amsgrad and
        maximize False, foreach None, capturable/differentiable/fused False), not the live
        values. Parameters changed outside the optimizer afterwards (e.g. a
        ``model.load_state_dict`` after this call) are taken at the next step.

        Atomic with respect to validation: everything is checked before anything is
        written, so a refused state dict leaves the optimizer exactly as it was.

        :raises ValueError: a different number of groups or of parameters in a group; a
            saved group without lr, betas, eps or weight_decay (naming the group and key;
            torch would fail at its next step); a hyperparameter out of range (naming the
            group); ``amsgrad`` other than this
            optimizer's (strata's state streams are fixed at creation); a state entry
            without ``step`` or with a step that is not an integer >= 0; a state tensor
            (exp_avg, exp_avg_sq, max_exp_avg_sq, master_param) whose element count is not
            the parameter's (naming the parameter index, the state and both sizes).
        :raises strata.FailedPreconditionError: the optimizer is closed.
        """
        self._check_open()
        self._abort_overlap()  # the state after the last completed step
        self._sync_params()
        self._checkpoints.load(state_dict, self.param_groups, self._registry, self.state)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """As torch.optim.Adam/AdamW.__setstate__: groups lacking an optional key take
        torch's default (amsgrad, maximize, foreach, capturable, ...)."""
        super().__setstate__(state)
        for group in self.param_groups:
            for k, v in self._flags.group_defaults().items():
                group.setdefault(k, v)
