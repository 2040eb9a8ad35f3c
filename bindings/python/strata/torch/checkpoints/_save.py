"""save_safetensors: a model's tensors to safetensors files in the Hugging Face layout
(``model.safetensors``, or shards ``model-0000k-of-0000n.safetensors`` and
``model.safetensors.index.json``, cut at ``max_shard_size`` as ``save_pretrained`` cuts
them), streamed from offloaded parameters' store objects and from memory through strata's
I/O engine (C++: strata/store/safetensors.hpp, write_file).

Thread-safety: one call per model at a time; the model must not run meanwhile.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from ... import _strata
from ._entries import FLOATING, model_of, state_entries, strata_dtype, where
from ._files import INDEX, SINGLE, parse_shard_size, shard_name, write_index
from ._save_ranks import write_from_ranks

#: what the last save_safetensors or save_torch_state_dict in this process moved, for
#: benchmarks and tests: ``bytes`` (tensor bytes of all files), ``rank_bytes`` (of them,
#: written by this process; from ranks about 1/world_size), ``rank``, ``world_size``,
#: ``seconds``
LAST_SAVE: Dict[str, float] = {}

_OURS = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")


def save_safetensors(module: Any, save_directory: Union[str, "os.PathLike[str]"], *,
                     max_shard_size: Union[int, str] = "5GB",
                     metadata: Optional[Dict[str, str]] = None,
                     dtype: Optional[torch.dtype] = None, durable: bool = True,
                     piece_bytes: Optional[Union[int, str]] = None,
                     pieces: Optional[int] = None, comm: Any = None) -> List[str]:
    """Writes ``module.state_dict()``'s tensors to ``save_directory`` as safetensors, the
    way ``transformers``' ``save_pretrained(safe_serialization=True)`` lays them out, without
    materializing the model: each file is written in pieces (O_DIRECT, several in flight)
    filled from offloaded parameters' store objects (read with ``Store.read_range``) and
    from tensors in memory, into ``<name>.tmp``, fdatasync'd, renamed into place, the
    directory fsync'd (``durable``). Host memory: about 2 x ``pieces`` x ``piece_bytes``
    of pinned buffers, plus, while their shard is written, temporary copies of the tensors
    in memory that are not contiguous CPU tensors (a CUDA model's: up to a shard).

    Files: one ``model.safetensors`` when everything fits in ``max_shard_size``, else
    ``model-00001-of-0000n.safetensors``... and ``model.safetensors.index.json``
    (``{"metadata": {"total_size": bytes of all tensors}, "weight_map": {name: file}}``).
    Shards are cut as huggingface_hub's ``split_torch_state_dict_into_shards`` cuts them:
    tensors in state_dict order, a new shard when the next would pass ``max_shard_size``,
    a tensor larger than it alone in its own. Files of an earlier save in the directory
    (``model*.safetensors`` of other names, a stale index) are removed afterwards, as
    save_pretrained does. Inside a file, tensors are in the reference writer's order
    (8-byte dtypes first, then by name) and the header is padded with spaces so the data
    starts at a multiple of 4096 bytes (the format allows trailing spaces).

    :param module: a ``torch.nn.Module`` (offloaded or not) or its :class:`ParameterOffload`.
    :param save_directory: created when absent.
    :param max_shard_size: bytes, or a string as transformers reads it ("5GB" = 5e9 bytes,
        "500MiB" = 500 * 2**20). Default "5GB".
    :param metadata: the files' ``__metadata__`` (str -> str); default ``{"format": "pt"}``.
    :param dtype: a floating dtype to store floating tensors in (converted in flight, round
        to nearest even as ``Tensor.to``); default None: each tensor's own dtype.
    :param durable: fsync files and directory before each rename (default True).
    :param piece_bytes: bytes per piece; default $STRATA_CHECKPOINT_PIECE_BYTES or 8 MiB.
    :param pieces: pieces in flight (x2 slots); default $STRATA_CHECKPOINT_PIECES or 4.
        (Not used when writing from ranks: one piece at a time.)
    :param comm: write from every rank of this strata.distributed.Communicator at once.
        Default: the communicator of the model's ZeRO-3 partitioned parameters
        (``offload_parameters(comm=...)``), else None: this process writes everything.
    :returns: the paths written (shards in order, then the index when sharded); on every
        rank when writing from ranks.
    :raises TypeError: an unsupported dtype (naming the key), ``dtype`` not floating.
    :raises ValueError: a bad ``max_shard_size`` or ``metadata``; one shard's offloaded
        tensors in two stores.
    :raises strata.IoError: (OSError) a failed write (errno; the ``.tmp`` is removed, an
        earlier file of the name is left as it was).

    **From ranks** (ZeRO-3, or ``comm`` given): collective -- every rank calls it with the
    same arguments. The layout (shards, headers, offsets) is computed on every rank and
    checked to agree (an all-gather of digests); rank 0 writes each file's header into
    ``<name>.tmp``; every rank writes elements ``partition_layout(numel, size)[rank]`` of
    each tensor in place (``pwrite`` in pieces of ``piece_bytes`` read from its ``#part``
    store object or from memory, converted to the file's dtype; host memory one piece):
    a partitioned parameter's own slice, a share of each tensor every rank holds whole
    (buffers); no rank reads or receives another's slices. After fsync and an all-gather
    of every rank's success, rank 0 renames the files into place, writes the index and
    removes an earlier save's files; the files are byte-identical to a one-process export
    of the same values. ``save_directory`` must be one directory every rank sees.
    Further errors: ValueError "save_safetensors: rank R's <field> differs from rank 0's
    (...)" on every rank when ranks disagree (save_directory, max_shard_size, metadata,
    dtype, durable, the files or tensors); a rank's failure raises its own error there
    and on the other ranks RuntimeError "save_safetensors: rank(s) [R] failed while
    writing its slices; nothing was renamed into place (the .tmp files are removed)"
    (an earlier file of each name is left as it was); ValueError: ``comm`` is not the
    communicator the parameters are partitioned over.

    Tied weights (one tensor under several names) are written once, under the first name
    in state_dict order; load_safetensors fills the other names from it.
    """
    model = model_of(module)
    limit = parse_shard_size(max_shard_size)
    if metadata is None:
        metadata = {"format": "pt"}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise ValueError("metadata: expected a dict of str -> str")
    if dtype is not None and dtype not in FLOATING:
        raise TypeError(f"dtype: expected a floating dtype (float32, float16, bfloat16, "
                        f"float64) or None, got {dtype}")
    t0 = time.perf_counter()
    directory = os.fspath(save_directory)
    os.makedirs(directory, exist_ok=True)
    tensors = _sources(model, dtype)
    shards = _split(tensors, limit)
    names = ([SINGLE] if len(shards) == 1 else
             [shard_name(k + 1, len(shards)) for k in range(len(shards))])
    comm = _comm_of(tensors, comm)
    if comm is not None:
        return _save_from_ranks(directory, names, shards, metadata, comm, piece_bytes, durable,
                                dict(save_directory=os.path.abspath(directory),
                                     max_shard_size=limit, metadata=sorted(metadata.items()),
                                     dtype=str(dtype), durable=durable), t0)
    written, weight_map, total = [], {}, 0
    for name, shard in zip(names, shards):
        stores = {id(t[3]): t[3] for t in shard if t[3] is not None}
        if len(stores) > 1:
            raise ValueError(f"{name}: its offloaded tensors are in {len(stores)} stores; "
                             "save models offloaded to one store")
        store = next(iter(stores.values()), None)
        path = os.path.join(directory, name)
        made = [_source(t) for t in shard]
        _strata.safetensors_write(path, [m[1] for m in made], metadata, store, piece_bytes,
                                  pieces, durable)
        del made
        written.append(path)
        for t in shard:
            weight_map[t[0]] = name
            total += t[4]
    if len(shards) > 1:
        written.append(write_index(directory, weight_map, total, durable))
    _remove_stale(directory, names, len(shards) > 1)
    LAST_SAVE.clear()
    LAST_SAVE.update(bytes=total, rank_bytes=total, rank=0,
                     world_size=1, seconds=time.perf_counter() - t0)
    return written


def _remove_stale(directory: str, names: List[str], indexed: bool) -> None:
    """Removes an earlier save's ``model*.safetensors`` and index not among ``names``."""
    keep = set(names) | ({INDEX} if indexed else set())
    for f in os.listdir(directory):
        if (f not in keep and (_OURS.fullmatch(f) or f == INDEX)
                and os.path.isfile(os.path.join(directory, f))):
            os.remove(os.path.join(directory, f))


def _comm_of(tensors: List[Tuple[Any, ...]], comm: Any, who: str = "save_safetensors") -> Any:
    """The communicator to write from (``comm``, else the partitioned parameters'), or None.
    :raises ValueError: ``comm``'s rank or size is not the partitions'."""
    parts = {id(h.comm): h.comm for _k, v, *_ in tensors
             for kind, h in [where(v)] if kind == "offloaded" and h.comm is not None}
    for c in parts.values():
        if comm is None:
            comm = c
        elif c.size != comm.size or c.rank != comm.rank:
            raise ValueError(f"{who}: comm is not the communicator the model's "
                             "parameters are partitioned over (rank/size differ)")
    return comm


def _save_from_ranks(directory: str, names: List[str], shards: List[List[Tuple[Any, ...]]],
                     metadata: Dict[str, str], comm: Any, piece_bytes: Any, durable: bool,
                     fields: Dict[str, Any], t0: float) -> List[str]:
    weight_map = {t[0]: name for name, shard in zip(names, shards) for t in shard}
    total = sum(t[4] for shard in shards for t in shard)
    indexed = len(shards) > 1

    def finish() -> None:
        if indexed:
            write_index(directory, weight_map, total, durable)
        _remove_stale(directory, names, indexed)
    mine = write_from_ranks(directory, names, shards, metadata, comm, piece_bytes, durable,
                            fields, finish)
    LAST_SAVE.clear()
    LAST_SAVE.update(bytes=total, rank_bytes=mine, rank=comm.rank, world_size=comm.size,
                     seconds=time.perf_counter() - t0)
    return [os.path.join(directory, n) for n in names] + \
        ([os.path.join(directory, INDEX)] if indexed else [])


def _sources(model: torch.nn.Module, dtype: Optional[torch.dtype]) -> List[Tuple[Any, ...]]:
    """(name, tensor, file dtype, its store or None, file bytes) per tensor to write, tied
    names dropped after the first; nothing is read or copied yet (see _source)."""
    out, seen = [], set()
    for k, v in state_entries(model).items():
        if id(v) in seen:
            continue
        seen.add(id(v))
        file_dtype = dtype if dtype is not None and v.dtype in FLOATING else v.dtype
        strata_dtype(file_dtype, k)  # (a TypeError naming k before anything is written)
        nbytes = v.numel() * torch.empty((), dtype=file_dtype).element_size()
        kind, handle = where(v)
        out.append((k, v, file_dtype, handle.store if kind == "offloaded" else None, nbytes))
    return out


def _source(entry: Tuple[Any, ...]) -> Tuple[Any, tuple]:
    """(memory to keep alive or None, write_file's source tuple) of one entry: an offloaded
    parameter's value object, or the tensor's memory (a temporary contiguous CPU copy of a
    CUDA or non-contiguous one, alive only while its shard is written)."""
    k, v, file_dtype, _store, _n = entry
    fd, shape = strata_dtype(file_dtype, k), list(v.shape)
    kind, handle = where(v)
    if kind == "offloaded":
        key, src_dtype = handle.value_object(v)
        return None, (k, fd, shape, strata_dtype(src_dtype, k), None, key, 0)
    src = v.detach()
    if src.device.type != "cpu" or not src.is_contiguous():
        src = src.contiguous().cpu()
    return src, (k, fd, shape, strata_dtype(src.dtype, k),
                 src.data_ptr() if src.numel() else None, None, 0)


def _split(tensors: List[Tuple[Any, ...]], limit: int) -> List[List[Tuple[Any, ...]]]:
    """huggingface_hub's split_state_dict_into_shards_factory: in order; a tensor over
    ``limit`` alone; a new shard when the next one would pass it."""
    shards: List[List[Tuple[Any, ...]]] = []
    cur: List[Tuple[Any, ...]] = []
    size = 0
    for t in tensors:
        if t[4] > limit:
            shards.append([t])
            continue
        if size + t[4] > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += t[4]
    if cur or not shards:
        shards.append(cur)
    return shards
