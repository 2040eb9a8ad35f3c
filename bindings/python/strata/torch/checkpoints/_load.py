"""load_safetensors / load_torch_state_dict: a safetensors checkpoint (one file or shards
with their index), or a torch.save state dict, into a model's tensors -- offloaded parameters' store objects, or the tensors in memory -- as
``model.load_state_dict`` would load the same state dict, streamed through strata's I/O
engine (C++: strata/store/safetensors.hpp, copy_tensors).

Thread-safety: one call per model at a time; the model must not run meanwhile.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from ._entries import (TORCH_OF_ST, bump_version, compatible_shape, convertible,
                       fill_like_torch, filled_by_torch, incompatible_keys, model_of, report,
                       state_entries, strata_dtype, tied_groups, where)
from ... import _strata
from ._files import open_shards, resolve
from ._torch_zip import read_archive

#: what the last load_safetensors in this process moved (bytes, seconds), for benchmarks
LAST_LOAD: Dict[str, float] = {}


def load_safetensors(module: Any, path: Union[str, "os.PathLike[str]"], *, strict: bool = True,
                     prefix: str = "", piece_bytes: Optional[Union[int, str]] = None,
                     pieces: Optional[int] = None) -> Any:
    """Loads the safetensors checkpoint at ``path`` into ``module``'s parameters and
    buffers, matching names as ``module.load_state_dict(state_dict, strict)`` does, without
    materializing the model or the file: each tensor is read in pieces (O_DIRECT, aligned
    superset reads, several pieces in flight), converted to the destination's dtype in
    flight, and written straight into an offloaded parameter's store object
    (``Store.write_range``) or into the tensor's memory. Host memory: about
    2 x ``pieces`` x ``piece_bytes`` of pinned buffers (default 2 x 4 x 8 MiB), plus, for a
    tensor in memory that is not a contiguous CPU tensor (CUDA, channels_last), one
    temporary copy of it.

    :param module: a ``torch.nn.Module`` (offloaded with strata.torch.offload_parameters /
        offload_init, or not: then this is a fast loader into its tensors), or the
        :class:`ParameterOffload` of an attached model.
    :param path: a ``.safetensors`` file, a ``model.safetensors.index.json`` (shards named
        by its ``weight_map``), or a directory holding either (a Hugging Face model folder).
    :param strict: as load_state_dict: raise when a key of ``module.state_dict()`` is not in
        the file (missing) or a tensor of the file is not a key of the model (unexpected).
        Tied weights (one tensor under several names, e.g. an embedding and the output
        head): one name in the file loads it and the others are not missing (what
        ``safetensors.torch.load_model`` does); several in the file: the last in
        state_dict order wins, as load_state_dict's successive copies would. A BatchNorm's
        ``num_batches_tracked`` absent from a file without module versions (every
        safetensors file) is not missing and gets the value torch's own load gives it
        (0 in torch 1.13), as ``_NormBase._load_from_state_dict`` does.
    :param prefix: only the file's tensors whose names start with it are considered, the
        prefix removed ("model." for a checkpoint of a wrapper); the others are ignored.
    :param piece_bytes: bytes per piece (int or "8MiB"); default $STRATA_CHECKPOINT_PIECE_BYTES
        or 8 MiB.
    :param pieces: pieces in flight; default $STRATA_CHECKPOINT_PIECES or 4.
    :returns: torch's ``_IncompatibleKeys(missing_keys, unexpected_keys)`` (lists of names,
        in state_dict order / file order).
    :raises RuntimeError: torch's message ("Error(s) in loading state_dict for <class>:")
        for a size mismatch ("size mismatch for <key>: copying a param with shape ... from
        checkpoint, the shape in current model is ...") and, with ``strict``, missing and
        unexpected keys. Raised before anything is loaded (torch loads the other tensors
        first).
    :raises TypeError: a dtype that is not converted (e.g. I64 into a float32 buffer; only
        equal dtypes and fp32/fp16/bf16/fp64 among themselves), naming the key.
    :raises strata.DataLossError: a malformed file: the message names the file and the byte
        offset (truncated file, header length past the end, offsets out of range or
        overlapping, unknown dtype, ...).
    :raises FileNotFoundError: no checkpoint at ``path``, a shard missing from the index's
        directory. :raises ValueError: a malformed index, a tensor in two shards, an index
        entry its shard lacks, an offloaded parameter linked to an optimizer's master.
    With ZeRO-3 (``offload_parameters(comm=...)``) every rank calls this with the same
    file and reads only its own slice of each parameter (no collective, no gather, no
    rank-0 copy); buffers, which every rank holds, are read whole on each.
    """
    model = _check(module, strict, prefix)
    t0 = time.perf_counter()
    shards, weight_map, where_ = resolve(path)
    readers, found = open_shards(shards, weight_map, where_)
    return _load(model, readers, found, strict, prefix, piece_bytes, pieces, t0, None)


def load_torch_state_dict(module: Any, path: Union[str, "os.PathLike[str]"], *,
                          strict: bool = True, prefix: str = "", key: Optional[str] = None,
                          piece_bytes: Optional[Union[int, str]] = None,
                          pieces: Optional[int] = None) -> Any:
    """Loads a state dict saved with ``torch.save`` (the zip format of torch >= 1.6) into
    ``module`` as :func:`load_safetensors` loads a safetensors file -- the same name
    matching, errors, conversions and streaming -- without ``torch.load``: the archive's
    ``data.pkl`` is read by a restricted unpickler that records each tensor's storage
    entry and view (no other code runs, no storage is loaded), then each tensor's bytes are
    read in place from its uncompressed entry (O_DIRECT, aligned supersets).

    :param key: the state dict is ``obj[key]`` of the dict saved (a training checkpoint's
        ``"model"``, ``"state_dict"``); default None: the object saved is the state dict.
    :raises ValueError: not a zip archive (the legacy format), a compressed or missing
        storage entry, a non-contiguous tensor, no state dict (naming the file and entry).
    :raises pickle.UnpicklingError: data.pkl needs a global other than a state dict's
        (OrderedDict, torch's tensor/parameter rebuild functions, storage types).
    Other arguments, returns and errors: as :func:`load_safetensors`.
    """
    model = _check(module, strict, prefix)
    t0 = time.perf_counter()
    path = os.fspath(path)
    entries, _refs, metadata = read_archive(path, key)
    reader = _strata._SafetensorsReader.ranges(path, entries)
    found = {n: (reader, i, dt, tuple(shape)) for i, (n, dt, shape, _b, _e) in enumerate(entries)}
    return _load(model, [reader], found, strict, prefix, piece_bytes, pieces, t0, metadata)


def _check(module: Any, strict: Any, prefix: Any) -> torch.nn.Module:
    model = model_of(module)
    if not isinstance(strict, bool):
        raise TypeError(f"strict: expected a bool, got {type(strict).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix: expected a str, got {type(prefix).__name__}")
    return model


def _load(model: torch.nn.Module, readers: List[Any], found: Dict[str, Any], strict: bool,
          prefix: str, piece_bytes: Any, pieces: Any, t0: float,
          metadata: Optional[Dict[str, Any]]) -> Any:
    """The load of the tensors ``found`` ({file name: (reader, index, dtype, shape)});
    ``metadata``: the state dict's ``_metadata`` (module versions), if it has one."""
    file_keys = [(n[len(prefix):], n) for r in readers for n, *_ in r.tensors if n.startswith(prefix)]
    entries = state_entries(model)
    groups = tied_groups(entries)
    in_file = {k: n for k, n in file_keys}
    missing = [k for k, v in entries.items()
               if k not in in_file and not any(a in in_file for a in groups[id(v)])]
    filled = filled_by_torch(model, missing, metadata)
    missing = [k for k in missing if k not in filled]
    unexpected = [k for k, _ in file_keys if k not in entries]
    mismatched = []
    for k, v in entries.items():
        if k in in_file:
            shape = found[in_file[k]][3]
            if not compatible_shape(shape, tuple(v.shape)):
                mismatched.append(f"size mismatch for {k}: copying a param with shape "
                                  f"{torch.Size(shape)} from checkpoint, the shape in current "
                                  f"model is {v.shape}.")
    report(model, missing, unexpected, mismatched, strict)
    # One name per tensor: the last of its names the file holds.
    chosen: Dict[int, Tuple[str, torch.Tensor]] = {}
    for k, v in entries.items():
        if k in in_file:
            chosen[id(v)] = (k, v)
    for k, v in chosen.values():
        dt = TORCH_OF_ST.get(found[in_file[k]][2])
        if dt is None or not convertible(dt, v.dtype):
            raise TypeError(f"{k}: the checkpoint's {found[in_file[k]][2]} tensor cannot be "
                            f"loaded into a {v.dtype} tensor (only the same dtype, or between "
                            "float32, float16, bfloat16 and float64)")
    moved = _copy(readers, found, in_file, list(chosen.values()), piece_bytes, pieces)
    fill_like_torch(model, filled)
    LAST_LOAD.clear()
    LAST_LOAD.update(bytes=moved, seconds=time.perf_counter() - t0)
    return incompatible_keys(missing, unexpected)


def _copy(readers: List[Any], found: Dict[str, Any], in_file: Dict[str, str],
          chosen: List[Tuple[str, torch.Tensor]], piece_bytes: Any, pieces: Any) -> int:
    """Copies each chosen (key, tensor) from its file, one copy_tensors call per (reader,
    store). Returns the file bytes read (aligned supersets included)."""
    jobs: Dict[Tuple[int, int], Tuple[Any, Any, List[tuple]]] = {}
    keep: List[torch.Tensor] = []  # memory the targets point into, alive until copied
    after: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (temporary, destination)
    bumped: List[torch.Tensor] = []
    handles = set()
    for k, v in chosen:
        reader, index, _dt, _shape = found[in_file[k]]
        kind, handle = where(v)
        dtype = strata_dtype(v.dtype, k)
        if kind == "offloaded":
            if id(handle) not in handles:
                handles.add(id(handle))
                handle.release_all()  # edits stored, fetches in flight finished
            key, begin, end = handle.overwrite_object(v)  # ZeRO-3: this rank's slice
            if key is None:
                continue
            store = handle.store
            target = (index, begin, end, dtype, None, key, 0)
        else:
            store = None
            if v.device.type == "cpu" and v.is_contiguous() and not v.is_meta:
                dst = v.detach()
                bumped.append(v)
            else:
                dst = torch.empty(v.shape, dtype=v.dtype)
                after.append((dst, v))
            keep.append(dst)
            target = (index, 0, None, dtype, dst.data_ptr() if dst.numel() else None, None, 0)
            if dst.numel() == 0:
                continue
        jobs.setdefault((id(reader), id(store)), (reader, store, []))[2].append(target)
    # Memory targets join the first job of their reader (one pass over the file).
    moved = 0
    for reader, store, targets in _merge(jobs):
        moved += reader.copy(targets, store, piece_bytes, pieces)["bytes_read"]
    with torch.no_grad():
        for tmp, dst in after:
            dst.copy_(tmp)
    for v in bumped:
        bump_version(v)
    return moved


def _merge(jobs: Dict[Tuple[int, int], Tuple[Any, Any, List[tuple]]]):
    """The jobs of each reader with its memory targets in the first job that has a store
    (else alone)."""
    by_reader: Dict[int, List[Tuple[Any, Any, List[tuple]]]] = {}
    for (rid, _sid), job in jobs.items():
        by_reader.setdefault(rid, []).append(job)
    for rjobs in by_reader.values():
        mem = [j for j in rjobs if j[1] is None]
        stored = [j for j in rjobs if j[1] is not None]
        if mem and stored:
            stored[0] = (stored[0][0], stored[0][1], mem[0][2] + stored[0][2])
            mem = []
        for j in mem + stored:
            # file order: the drive reads forward
            j[2].sort(key=lambda t: j[0].tensors[t[0]][3])
            yield j
