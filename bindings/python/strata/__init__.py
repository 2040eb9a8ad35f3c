"""strata — a tiered tensor store (GPU HBM / pinned DRAM / NVMe) and an offloaded optimizer.

Quick start::

    import numpy as np, strata
    with strata.Store.open("/var/tmp/strata-demo", host_budget="1GiB") as store:
        store.put("w", np.arange(10, dtype=np.float32), tier="nvme")
        w = store.get("w")                 # numpy array, read from NVMe
        store.get_into("w", out=w)         # into an existing array or torch tensor, no copy
        fut = store.get_async("w")         # strata.Future; .result(timeout=None)

Arrays cross without copies (buffer protocol, DLPack); every blocking call releases the GIL.
Errors are :class:`strata.Error` subclasses that are also KeyError / ValueError /
MemoryError / OSError / ... (``strata._errors``, docs/errors.md).

Where things live: :class:`Store`, :class:`ObjectInfo` in ``_store``;
:class:`OffloadedOptimizer` in ``_offloaded_optimizer``; :class:`PythonRule` (an update
rule in Python) in ``_python_rule``; :func:`load_config` in
``_config``; the compiled core in ``_strata``. ``strata.torch`` has the PyTorch optimizers
(OffloadAdam, OffloadAdamW), ``strata.distributed`` the collectives.
"""

from __future__ import annotations

from . import _lifetime, _strata  # noqa: F401 (strata._lifetime is used by strata.torch)
from ._config import load_config
from ._data_dir import default_data_dir
from ._errors import (AlreadyExistsError, CancelledError, DataLossError, DeadlineExceededError,
                      DiskFullError, Error, FailedPreconditionError, InternalError,
                      InvalidArgumentError, IoError, NotFoundError, OutOfRangeError,
                      PermissionDeniedError, ResourceExhaustedError, UnavailableError,
                      UnimplementedError)
from ._offloaded_optimizer import OffloadedOptimizer
from ._python_rule import PythonRule
from ._store import ObjectInfo, Size, Store  # noqa: F401 (Size: public, not in __all__)

__version__ = "0.1.0"

Future = _strata.Future
parse_size = _strata.parse_size
format_bytes = _strata.format_bytes
built_with_cuda: bool = _strata.built_with_cuda

__all__ = [
    "Store", "ObjectInfo", "Future", "OffloadedOptimizer", "PythonRule", "parse_size",
    "format_bytes",
    "default_data_dir", "load_config",
    "Error", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError", "OutOfRangeError",
    "ResourceExhaustedError", "FailedPreconditionError", "DataLossError", "UnavailableError",
    "IoError", "DeadlineExceededError", "CancelledError", "UnimplementedError",
    "InternalError", "PermissionDeniedError", "DiskFullError",
]
