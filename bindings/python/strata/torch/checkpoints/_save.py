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

#: what the last save_safetensors in this process moved (bytes, seconds), for benchmarks
LAST_SAVE: Dict[str, float] = {}

_OURS = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")


def save_safetensors(module: Any, save_directory: Union[str, "os.PathLike[str]"], *,
                     max_shard_size: Union[int, str] = "5GB",
                     metadata: Optional[Dict[str, str]] = None,
                     dtype: Optional[torch.dtype] = None, durable: bool = True,
                     piece_bytes: Optional[Union[int, str]] = None,
                     pieces: Optional[int] = None) -> List[str]:
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
    :returns: the paths written (shards in order, then the index when sharded).
    :raises TypeError: an unsupported dtype (naming the key), ``dtype`` not floating.
    :raises ValueError: a bad ``max_shard_size`` or ``metadata``; one shard's offloaded
        tensors in two stores.
    :raises NotImplementedError: ZeRO-3 partitioned parameters.
    :raises strata.IoError: (OSError) a failed write (errno; the ``.tmp`` is removed, an
        earlier file of the name is left as it was).

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
    keep = set(names) | ({INDEX} if len(shards) > 1 else set())
    for f in os.listdir(directory):  # an earlier save's files
        if (f not in keep and (_OURS.fullmatch(f) or f == INDEX)
                and os.path.isfile(os.path.join(directory, f))):
            os.remove(os.path.join(directory, f))
    LAST_SAVE.clear()
    LAST_SAVE.update(bytes=total, seconds=time.perf_counter() - t0)
    return written


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
