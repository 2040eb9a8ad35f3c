"""A parameter fetch over ranks in flight (ZeRO-3: ``Communicator.fetch_partitioned_async``)
for the working set (offload/_working_set.py): its future and output buffer.

Thread-safety: the working set's owner thread only (collectives are issued there).
"""

from __future__ import annotations

import time
from typing import Any, Dict

import torch

from ._record import ParamRecord


class CommFetch:
    """A fetch_partitioned in flight: the future and its output buffer. ``wait`` blocks
    until it is done; ``finish`` hands the result (or error) to the record."""

    __slots__ = ("future", "out", "issued")

    def __init__(self, future: Any, out: torch.Tensor):
        self.future = future
        self.out = out
        self.issued = time.perf_counter()

    def wait(self) -> None:
        try:
            self.future.result()
        except BaseException:  # noqa: BLE001 (handed over by finish)
            pass

    def finish(self, s: ParamRecord, stats: Dict[str, float]) -> None:
        try:
            self.future.result()
            s.fetched, s.fetch_error = self.out, None
            stats["bytes_fetched"] += s.nbytes
        except BaseException as e:  # noqa: BLE001 (raised by _take)
            s.fetched, s.fetch_error = None, e
        stats["fetch_seconds"] += time.perf_counter() - self.issued
