"""save_torch_state_dict: a model's state dict as a file ``torch.load`` reads -- torch.save's
zip format (``archive/data.pkl`` naming storages ``archive/data/<key>``, stored
uncompressed with their data 64-byte aligned as torch aligns them, ``archive/version``) --
laid out in advance (checkpoints/_universal_zip.py: ZipLayout) and written in place in
pieces from offloaded parameters' store objects and from memory, without materializing the
model: by one process, or by every ZeRO-3 rank at once, each its own slices
(checkpoints/_save_ranks.py: write_zip_from_ranks; the protocol of _ranks.py).

Thread-safety: one call per model at a time (collective over the ranks when from ranks);
the model must not run meanwhile.
"""

from __future__ import annotations

import io
import os
import time
from collections import OrderedDict
from typing import Any, Dict, Optional, Union

import torch

from ._entries import model_of, state_entries
from ._save import LAST_SAVE, _comm_of, _sources
from ._save_ranks import piece_elements, write_zip_from_ranks
from ._universal_zip import STORAGE_OF, Pickler, PickledTensor, Storage, ZipLayout


def save_torch_state_dict(module: Any, path: Union[str, "os.PathLike[str]"], *,
                          piece_bytes: Optional[Union[int, str]] = None,
                          durable: bool = True, comm: Any = None) -> str:
    """Writes ``module.state_dict()`` to ``path`` as ``torch.save(module.state_dict(), path)``
    would -- ``torch.load(path)`` gives the same keys, values, dtypes and shapes, tied
    tensors sharing one storage (stored once), the module versions (``_metadata``) --
    without materializing the model. The zip is laid out in advance from the names, dtypes
    and shapes (``archive/data.pkl``, ``archive/byteorder``, ``archive/data/<k>`` per
    storage, uncompressed, data 64-byte aligned, ``archive/version``; zip64 records past
    4 GiB); its skeleton is written into ``path``.tmp, then each tensor's bytes in place
    (``pwrite``) in pieces of ``piece_bytes`` read from offloaded parameters' store
    objects (``Store.read_range``; an edit in memory is stored first) or from memory, each
    storage's CRC-32 patched in, fsync'd, renamed over ``path`` and the directory fsync'd
    (``durable``). Host memory: one piece (plus, per piece, a CPU copy of a CUDA tensor's
    elements). The bytes do not depend on the process count: a file written from ranks
    equals the one-process file of the same values.

    **From ranks** (ZeRO-3 partitioned parameters, or data-parallel replicas given
    ``comm``): collective -- every rank calls it with the same arguments. The layout is
    checked to agree on every rank (an all-gather of digests); rank 0 writes the skeleton;
    every rank writes its elements ``partition_layout(numel, size)[rank]`` of each storage
    (a partitioned parameter's own ``#part`` slice; a share of a tensor every rank holds
    whole); no rank reads or receives another's slices. Each rank's CRC-32 of each range
    is all-gathered and rank 0 combines them in range order (``crc32_combine``), patches
    them in and renames the file into place once every rank succeeded. ``path`` must be
    one file every rank sees.

    :param module: a ``torch.nn.Module`` (offloaded or not) or its :class:`ParameterOffload`.
    :param piece_bytes: bytes read and written at a time (int or "8MiB"); default
        $STRATA_CHECKPOINT_PIECE_BYTES or 8 MiB.
    :param comm: a strata.distributed.Communicator to write from all of its ranks; default
        the one the model's parameters are partitioned over, else None (this process).
    :returns: ``path`` (on every rank). ``_save.LAST_SAVE`` then holds ``bytes`` (tensor
        bytes of the file) and ``rank_bytes`` (written by this rank), ``rank``,
        ``world_size``, ``seconds``.
    :raises TypeError: a dtype torch.save's storages do not name here (complex...).
    :raises ValueError: ``piece_bytes`` <= 0; from ranks, on every rank:
        "save_torch_state_dict: rank R's <path|durable|layout|tensors> differs from rank
        0's (every rank must call it with the same arguments and model)"; ``comm`` not the
        parameters' communicator.
    :raises RuntimeError: from ranks, on the ranks that did not fail:
        "save_torch_state_dict: rank(s) [R] failed while writing its slices; nothing was
        renamed into place (the .tmp files are removed)" (the failed rank raises its own).
    :raises OSError: the file cannot be written: the .tmp is removed, an earlier file at
        ``path`` is left as it was.
    """
    t0 = time.perf_counter()
    model = model_of(module)
    piece_elements(piece_bytes, 1)  # (a ValueError before anything is written)
    path = os.fspath(path)
    entries = state_entries(model)
    for k, v in entries.items():
        if v.dtype not in STORAGE_OF:
            raise TypeError(f"{k}: dtype {v.dtype} is not written by save_torch_state_dict")
    sources = _sources(model, None)  # one per storage: tied names after the first dropped
    storages: Dict[int, Storage] = {id(t[1]): Storage(str(j), t[1]) for j, t in enumerate(sources)}
    out: "OrderedDict[str, Any]" = OrderedDict(
        (k, PickledTensor(storages[id(v)], v.shape)) for k, v in entries.items())
    meta = getattr(model.state_dict(keep_vars=True), "_metadata", None)
    if meta is not None:
        out._metadata = meta  # type: ignore[attr-defined]
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(out)
    layout = ZipLayout([("archive/data.pkl", buf.getvalue(), 0),
                        ("archive/byteorder", b"little", 0)] +
                       [(f"archive/data/{j}", None, t[4]) for j, t in enumerate(sources)] +
                       [("archive/version", b"3\n", 0)])
    comm = _comm_of(sources, comm, "save_torch_state_dict")
    mine = write_zip_from_ranks(path, layout, sources, comm, piece_bytes, durable,
                                dict(path=os.path.abspath(path), durable=durable))
    LAST_SAVE.clear()
    LAST_SAVE.update(bytes=sum(t[4] for t in sources), rank_bytes=mine,
                     rank=0 if comm is None else comm.rank,
                     world_size=1 if comm is None else comm.size,
                     seconds=time.perf_counter() - t0)
    return path
