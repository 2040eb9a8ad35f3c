"""strata.PythonRule: an element-wise optimizer update written in Python, run by strata's
offloaded optimizer on each streamed slice (the C++ rule of bindings/python/src/py_rule.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Sequence


@dataclass(frozen=True)
class PythonRule:
    """An update rule of :class:`strata.OffloadedOptimizer` written in Python.

    ``update(param, grad, states, step, hyperparams, ctx)`` is called once per slice of a
    parameter tensor that the step streams (a sub-group of an nvme-tier tensor, or a whole
    host-tier tensor) -- never per element or per 16384-element tile -- and updates the
    slice in place:

    - ``param``: numpy float32 1-D array, the slice of the fp32 master (writable view of
      strata's pinned buffer: no copy);
    - ``grad``: the gradient slice, a view (writable for torch.from_numpy's sake: do not
      write it; it is the caller's gradient), as attached: float32, float16, or
      uint16 holding bfloat16 bits (``ctx["grad_dtype"] == "bfloat16"``; torch:
      ``torch.from_numpy(grad).view(torch.bfloat16)``), NOT yet multiplied by
      ``ctx["grad_scale"]`` (the clipping coefficient times 1 / loss scale: multiply when
      it is not 1);
    - ``states``: tuple of writable float32 views, one per ``state_names`` entry;
    - ``step``: int, the tensor's step number after this step (1 at the first);
    - ``hyperparams``: dict of the param group's values (floats; see ``defaults``);
    - ``ctx``: dict of ``param`` (the tensor's handle), ``name``, ``offset`` (element offset
      of the slice in the tensor), ``grad_scale``, ``grad_dtype``.

    The arrays are views valid during the call only: do not keep them. The slices of one
    tensor at one step are given in order, each once; so per-tensor scalar state (e.g. a
    running product) advances at ``offset == 0``. The call runs on the thread of ``step()``
    (which released the GIL) or the overlapped step's, holding the GIL; torch ops in it may
    use torch's intra-op threads. An exception raised by ``update`` fails the step with
    strata.InvalidArgumentError naming the rule, the parameter, the slice and the step, the
    exception as its ``__cause__``, and the step is rolled back: every master, state and
    step count is as before it (optimizer/offload.hpp, "A RULE THAT FAILS").

    :param name: the rule's name, recorded in checkpoints (a resume needs a rule of this
        name and number of states).
    :param state_names: names of the fp32 state streams (0..4), e.g. ("exp_avg",).
    :param state_inits: their initial values (default: zeros).
    :param defaults: every hyperparameter the rule takes and its default (numbers;
        booleans as 0/1); a param group with another key is refused (InvalidArgumentError).
    Thread-safety: ``update`` is called one slice at a time per optimizer.
    """

    name: str
    update: Callable[..., Any]
    state_names: Sequence[str] = ()
    state_inits: Sequence[float] = ()
    defaults: Dict[str, float] = field(default_factory=dict)
