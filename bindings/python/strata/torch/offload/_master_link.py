"""The linked optimizer's fp32 master as an offloaded parameter's value: the part of
ParameterOffload (offload/_handle.py) that strata's update inside backward uses
(strata/torch/optim/_overlap.py; the protocol: offload/_record.py, OptimizerLink). One copy
on disk: while linked, fetches read the master, edits are written into it, and the
parameter's own object is refreshed only by ``unlink_master``, ``checkpoint()`` and close.

Thread-safety: as ParameterOffload (one thread at a time).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .._common import no_torch_function as _no_tf
from ._record import Residency


class MasterLinks:
    """Mixin of ParameterOffload (needs its ``_record``, ``ws``, ``store``, ``tier``)."""

    def link_master(self, p: torch.Tensor, link: Any) -> None:
        """From now on ``p``'s value is the fp32 master that ``link`` (a strata optimizer,
        offload/_record.py OptimizerLink) keeps in this offload's store: fetches read it,
        edits are written into it, and ``p``'s own object is no longer written (one copy on
        disk instead of two; refreshed by :meth:`unlink_master`, :meth:`checkpoint` and
        close). The master must hold ``p``'s current stored value. Only fp32 parameters of
        one process.

        :raises KeyError: ``p`` is not a parameter of this offload.
        :raises ValueError: ``p`` is not fp32, or is partitioned over ranks."""
        s = self._record(p)
        if s.dtype != torch.float32 or s.owned is not None:
            raise ValueError(f"offloaded parameter {s.name!r}: only an fp32 parameter of one "
                             "process can be linked to an optimizer's master")
        if s.link is link:
            return
        self.unlink_master(p)
        self.ws.write_back(s)  # the master must hold the value: an edit in memory first
        s.link = link

    def unlink_master(self, p: torch.Tensor) -> None:
        """``p``'s value is its own object again (the master's value copied there); no-op
        when not linked.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        if s.link is None:
            return
        self.ws.touch(s)
        value = self.store.get(s.value_key)
        self.store.put(s.key, value, tier=self.tier, overwrite=True)
        s.link = None

    def linked(self, p: torch.Tensor) -> bool:
        """``p``'s value is a linked optimizer's master (:meth:`link_master`).

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self._record(p).link is not None

    def master_view(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        """The materialized value of linked ``p`` as a flat fp32 view of its memory, when it
        is in memory, unchanged since fetched and contiguous (then equal to the master);
        else None. The caller must not change it.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        if (s.link is None or s.state is not Residency.RESIDENT or self.ws.dirty(s)
                or s.stride is not None or s.device.type != "cpu"):
            return None
        with _no_tf():
            return s.resident.detach().view(-1)

    def stage(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        """A buffer for the next value of linked, materialized ``p`` (flat, its dtype), for
        an update in backward to write, when the working set has room for it beside what it
        holds; else None. End it with :meth:`committed` or :meth:`unstage`.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        return self.ws.stage(self._record(p))

    def unstage(self, p: torch.Tensor, buf: torch.Tensor) -> None:
        """Drops a buffer of :meth:`stage` (its update was rolled back).

        :raises KeyError: ``p`` is not a parameter of this offload."""
        self.ws.unstage(self._record(p), buf, value=False)

    def committed(self, p: torch.Tensor, staged: Optional[torch.Tensor] = None) -> None:
        """The linked optimizer's step changed ``p``'s master (its value) behind the
        offload: ``staged`` (a buffer of :meth:`stage` holding the new value) becomes the
        materialized data when ``p`` is still in memory; else the materialized copy (the
        old value) is released. The version is counted.

        :raises KeyError: ``p`` is not a parameter of this offload."""
        s = self._record(p)
        s.version += 1
        if staged is not None:
            self.ws.unstage(s, staged, value=True)
        else:
            self.ws.release(s, write_back=False)

