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
    """Mixin of ParameterOffload (needs its ``_record``, ``ws``, ``_stats``, ``_model``).
    Partitioned parameters (ZeRO-3): import writes this rank's slice, export from every rank
    reads this rank's slice (:meth:`value_slice`); :meth:`value_object` is one process
    only."""

    @property
    def model(self) -> Optional[torch.nn.Module]:
        """The attached model (None before :meth:`attach`)."""
        return self._model

    def _one_process(self, s: ParamRecord, what: str) -> None:
        if s.owned is not None:
            raise NotImplementedError(
                f"{what} of offloaded parameter {s.name!r}: a ZeRO-3 partitioned parameter "
                "(offload_parameters(comm=...)) has no whole value object on one rank; "
                "save_safetensors writes it from every rank (value_slice)")

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

    def value_slice(self, p: torch.Tensor) -> Tuple[Optional[str], int, int, torch.dtype]:
        """Where this rank reads ``p``'s current value: ``(key, begin, end, dtype)`` -- the
        store object whose bytes from offset 0 hold elements [begin, end) of the value
        (row-major, ``dtype``): in one process the whole value (as :meth:`value_object`:
        begin 0, end numel), with a communicator (ZeRO-3) this rank's slice ``#part``
        (key None when it is empty). An edit of the materialized parameter is stored first
        (its slice, as every rank stores its own); fetches in flight are finished first
        (every rank issued them; no new collective). Valid until ``p``'s value next changes.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        self.ws.drain()
        self.ws.write_back(s)
        self.ws.touch(s)
        if s.owned is None:
            return s.value_key, 0, s.numel, (torch.float32 if s.link is not None else s.dtype)
        b, e = s.owned
        return (s.key + "#part" if e > b else None), b, e, s.dtype

    def overwrite_object(self, p: torch.Tensor) -> Tuple[Optional[str], int, int]:
        """Where to write ``p``'s new value: ``(key, begin, end)`` -- the store object to
        overwrite with elements [begin, end) of ``p``'s new value (``p.dtype``, row-major
        order, e.g. by ``Store.write_range`` in pieces): in one process the whole value
        (``begin`` 0, ``end`` numel), with a communicator (ZeRO-3) this rank's slice, the
        only part it reads and writes (key None when the slice is empty). ``p`` is released
        from memory first without storing its data (a fetch in flight is finished and
        dropped), and counts as changed (its version). The caller must write the whole
        range before ``p`` is used again; no collective, but with a communicator every rank
        must load the same values before the next fetch.

        :raises KeyError: ``p`` is not a parameter of this offload.
        :raises ValueError: ``p`` is linked to a strata optimizer's master
            (``overlap_backward``): load checkpoints before creating the optimizer."""
        s = self._record(p)
        if s.link is not None:
            raise ValueError(f"offloaded parameter {s.name!r} is linked to a strata optimizer's "
                             "master (overlap_backward): load the checkpoint before creating "
                             "the optimizer")
        self.ws.drain()
        self.ws.release(s, write_back=False)
        s.version += 1
        b, e = (0, s.numel) if s.owned is None else s.owned
        self._stats["param_bytes_written"] += (e - b) * s.param.element_size()
        if s.owned is None:
            return s.key, b, e
        return (s.key + "#part" if e > b else None), b, e
