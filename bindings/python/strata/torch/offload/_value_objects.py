"""The store objects of offloaded parameters' values, as checkpoint import and export
(strata.torch.checkpoints) reach them: the part of ParameterOffload (offload/_handle.py)
that hands out the object holding a parameter's current value (to stream it into a file)
and the object to overwrite with a new one (to stream a file into it), so that neither the
model nor the file is ever materialized.

Thread-safety: as ParameterOffload (one thread at a time).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._record import ParamRecord


class ValueObjects:
    """Mixin of ParameterOffload (needs its ``_record``, ``ws``, ``_stats``, ``_model``)."""

    @property
    def model(self) -> Optional[torch.nn.Module]:
        """The attached model (None before :meth:`attach`)."""
        return self._model

    def _one_process(self, s: ParamRecord, what: str) -> None:
        if s.owned is not None:
            raise NotImplementedError(
                f"{what} of offloaded parameter {s.name!r}: ZeRO-3 partitioned parameters "
                "(offload_parameters(comm=...)) are not supported yet; load or save in one "
                "process")

    def value_object(self, p: torch.Tensor) -> Tuple[str, torch.dtype]:
        """The store object holding ``p``'s current value and its dtype, for reading it
        whole in row-major order (``numel(p)`` elements): an edit of the materialized
        parameter is stored first, a linked optimizer's update in backward not yet committed
        is rolled back (the object is then its fp32 master: dtype torch.float32, else
        ``p.dtype``). The object stays valid until ``p``'s value next changes.

        :raises KeyError: ``p`` is not a parameter of this offload.
        :raises NotImplementedError: a ZeRO-3 (partitioned) parameter."""
        s = self._record(p)
        self._one_process(s, "export")
        self.ws.write_back(s)
        self.ws.touch(s)
        return s.value_key, (torch.float32 if s.link is not None else s.dtype)

    def overwrite_object(self, p: torch.Tensor) -> str:
        """The store object to overwrite with ``p``'s new value (``numel(p)`` elements of
        ``p.dtype``, row-major, e.g. by ``Store.write_range`` in pieces): ``p`` is released
        from memory first without storing its data (a fetch in flight is finished and
        dropped), and counts as changed (its version). The caller must write the whole
        object before ``p`` is used again.

        :raises KeyError: ``p`` is not a parameter of this offload.
        :raises ValueError: ``p`` is linked to a strata optimizer's master
            (``overlap_backward``): load checkpoints before creating the optimizer.
        :raises NotImplementedError: a ZeRO-3 (partitioned) parameter."""
        s = self._record(p)
        self._one_process(s, "import")
        if s.link is not None:
            raise ValueError(f"offloaded parameter {s.name!r} is linked to a strata optimizer's "
                             "master (overlap_backward): load the checkpoint before creating "
                             "the optimizer")
        self.ws.drain()
        self.ws.release(s, write_back=False)
        s.version += 1
        self._stats["param_bytes_written"] += s.nbytes
        return s.key
