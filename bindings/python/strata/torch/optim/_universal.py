"""Optimizer state through DeepSpeed's universal checkpoint layout (deepspeed/checkpoint/
ds_to_universal.py, universal_checkpoint.py), the route to another world size:

    <path>/zero/<parameter name>/fp32.pt        torch.save({"param": fp32 master, "cat_dim": 0})
    <path>/zero/<parameter name>/exp_avg.pt     the same for each state tensor (exp_avg_sq,
                                                max_exp_avg_sq with amsgrad)
    <path>/zero/<parameter name>/step.pt        torch.save(0-d float32 tensor: its step count)
    <path>/zero/optimizer_state.pt              torch.save({"param_groups": [...],
                                                            "param_names": [[...], ...]})

Every tensor file holds the whole parameter (its model shape), whatever the world size it
was written at. :func:`save_universal_checkpoint` writes each file from every rank at once:
rank 0 lays out the zip archive (checkpoints/_universal_zip.py) and each rank writes its
element range of the storage in place, read from its optimizer in pieces (no gather; host
memory: one piece); the CRC-32s of the ranges are combined on rank 0.
:func:`load_universal_checkpoint` has each rank read only the elements its optimizer holds
of each file (a byte range of the uncompressed storage) through strata's reader (O_DIRECT
aligned supersets, checkpoints' ``_SafetensorsReader.ranges``), at any world size.

Thread-safety: collective over the ranks of ``comm``; one call per optimizer at a time, the
model not running meanwhile.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from ... import _strata, parse_size
from ...distributed import partition_layout
from ..checkpoints._torch_zip import TensorRef
from ..checkpoints._ranks import fsync_dir, outcome, remove_all, write_elements
from ..checkpoints._universal_zip import TensorFileLayout, combined_crc, read_saved
from ..offload import offload_of
from ._exchange import copy_master_to_param

_MASTER = "fp32"
_PIECE = 16 << 20  # default bytes per piece read or written


class _Param:
    """One parameter of the optimizer: name, tensor, strata handle, group, and the
    elements [held_begin, held_end) of the whole parameter its core holds on this rank."""

    __slots__ = ("name", "p", "h", "group", "numel", "held", "partitioned")

    def __init__(self, name: str, p: torch.Tensor, h: int, group: int, held: Tuple[int, int],
                 partitioned: bool):
        self.name, self.p, self.h, self.group = name, p, h, group
        self.numel = p.numel()
        self.held, self.partitioned = held, partitioned


def _check_optimizer(optimizer: Any, who: str) -> None:
    from ._optimizer import OffloadedTorchOptimizer
    if not isinstance(optimizer, OffloadedTorchOptimizer):
        raise TypeError(f"{who}: expected a strata.torch.OffloadAdam or OffloadAdamW, got "
                        f"{type(optimizer).__name__}")
    optimizer._check_open()


def _params(optimizer: Any, model: torch.nn.Module, comm: Any, who: str
            ) -> Tuple[List[_Param], Any]:
    """The optimizer's parameters in param_groups order (each once), named by ``model``,
    and the communicator in effect (``comm``, else the ZeRO-3 offload's; None: one
    process)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{who}: model: expected a torch.nn.Module, got {type(model).__name__}")
    names = {id(p): n for n, p in model.named_parameters()}
    table = optimizer._table
    found: List[Tuple[str, torch.Tensor, int, int, Any]] = []
    seen = set()
    for gi, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = names.get(id(p))
            if name is None:
                raise ValueError(f"{who}: parameter {i} of param group {gi} is not a "
                                 "parameter of the model given (its name names its files)")
            if "/" in name or name in (".", "..") or not name:
                raise ValueError(f"{who}: parameter name {name!r} cannot name a directory")
            o = offload_of(p)
            found.append((name, p, table.handle_of(p), gi, o.comm if o is not None else None))
    zero3 = [c for *_, c in found if c is not None]
    if comm is None and zero3:
        comm = zero3[0]
    if comm is not None and comm.size == 1:
        comm = None
    for c in zero3:
        if comm is None or c.size != comm.size or c.rank != comm.rank:
            raise ValueError(f"{who}: comm is not the communicator its ZeRO-3 offloaded "
                             "parameters are partitioned over (rank/size differ)")
    out = []
    for name, p, h, gi, c in found:
        held = c.owned_range(p.numel()) if c is not None else (0, p.numel())
        out.append(_Param(name, p, h, gi, tuple(held), c is not None))
    return out, comm


def _files(path: str, x: _Param, states: List[str]) -> List[Tuple[int, str]]:
    """(core stream: -1 the master, k state k; file) of one parameter."""
    d = os.path.join(path, "zero", x.name)
    return [(-1, os.path.join(d, _MASTER + ".pt"))] + \
        [(k, os.path.join(d, s + ".pt")) for k, s in enumerate(states)]


def _piece_elems(piece_bytes: Any) -> int:
    n = _PIECE if piece_bytes is None else (parse_size(piece_bytes) if isinstance(piece_bytes, str)
                                            else int(piece_bytes))
    if n < 4:
        raise ValueError(f"piece_bytes: must be >= 4, got {piece_bytes!r}")
    return n // 4


def _read_core(core: Any, h: int, stream: int, out: np.ndarray, offset: int) -> np.ndarray:
    if stream < 0:
        return core.read_param(h, out, offset, out.size)
    return core.read_state(h, stream, out, offset, out.size)


def _save_small(obj: Any, final: str, durable: bool) -> None:
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, final)


def save_universal_checkpoint(optimizer: Any, model: torch.nn.Module,
                              path: Union[str, "os.PathLike[str]"], *, comm: Any = None,
                              piece_bytes: Optional[Union[int, str]] = None,
                              durable: bool = True) -> str:
    """Writes ``optimizer``'s state (OffloadAdam/OffloadAdamW) in DeepSpeed's universal
    checkpoint layout under ``path`` (module doc): per parameter of ``model`` the optimizer
    holds, its fp32 master (``fp32.pt``), each state tensor (``exp_avg.pt``,
    ``exp_avg_sq.pt``, ``max_exp_avg_sq.pt`` with amsgrad), each the whole parameter in
    its model shape as ``{"param": tensor (float32), "cat_dim": 0}``, and its step count
    (``step.pt``: a 0-d float32 tensor, as torch 1.13's Adam keeps it); and
    ``zero/optimizer_state.pt``: ``param_groups`` (torch's hyperparameters; ``params`` the
    indices in the group) and ``param_names`` (the names of each group's parameters).

    Collective: every rank of ``comm`` calls it with the same arguments. ZeRO-3 (parameters
    from ``offload_parameters(comm=...)``) each rank writes the slice its optimizer holds;
    data-parallel replicas (every rank holding all of the state) each write the
    ``comm.owned_range`` share of every file; without a communicator one process writes
    all. The tensor files are written in place from all ranks (``pwrite`` of pieces of
    ``piece_bytes``, default 16 MiB, read from the optimizer: host memory one piece), the
    zip's skeleton and CRC-32 by rank 0, then fsync'd (``durable``) and renamed from
    ``.tmp``; ``path`` must be one directory all ranks see. Parameters changed outside the
    optimizer are taken as their masters first (as state_dict()).

    :param model: names the parameters (``named_parameters()``; tied ones once).
    :param comm: a strata.distributed.Communicator; default: the one the optimizer's
        ZeRO-3 offloaded parameters are partitioned over, else None.
    :returns: ``path``.
    :raises TypeError: not a strata OffloadAdam/OffloadAdamW, or ``model`` not a Module.
    :raises ValueError: a parameter of the optimizer that ``model`` does not name, or a
        name with "/"; ``comm`` other than the ZeRO-3 partitions'.
    :raises strata.FailedPreconditionError: the optimizer is closed.
    :raises OSError: a file cannot be written: raised on the rank that failed, and on the
        others a RuntimeError "save_universal_checkpoint: rank(s) [R] failed while writing;
        nothing was renamed into place (the .tmp files are removed)" (checkpoints/_ranks.py).
    """
    who = "save_universal_checkpoint"
    _check_optimizer(optimizer, who)
    path = os.fspath(path)
    optimizer._abort_overlap()
    optimizer._table.take_changed()
    optimizer.state.write_back()
    params, comm = _params(optimizer, model, comm, who)
    rank, size = (comm.rank, comm.size) if comm is not None else (0, 1)
    core = optimizer._table.core
    states = optimizer._table.state_names()
    piece = _piece_elems(piece_bytes)
    jobs = []  # (param, stream, final path, layout)
    for x in params:
        for stream, f in _files(path, x, states):
            jobs.append((x, stream, f, TensorFileLayout(torch.float32, x.p.shape, {"cat_dim": 0})))
    tmps = [f + ".tmp" for _x, _s, f, _l in jobs]
    error = None
    if rank == 0:
        try:
            for x in params:
                os.makedirs(os.path.join(path, "zero", x.name), exist_ok=True)
            for _x, _s, f, layout in jobs:
                fd = os.open(f + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    layout.write_skeleton(fd)
                finally:
                    os.close(fd)
        except OSError as err:
            error = err
    outcome(comm, "save_universal_checkpoint", error, lambda: remove_all(tmps),
            "creating the files; nothing was renamed into place (the .tmp files are removed)")
    crcs = np.zeros(len(jobs), dtype=np.int64)
    buf = np.empty(min(piece, max([x.held[1] - x.held[0] for x in params] + [1])),
                   dtype=np.float32)
    error = None
    try:
        for j, (x, stream, f, layout) in enumerate(jobs):
            b, e = partition_layout(x.numel, size)[rank] if not x.partitioned else x.held
            fd = os.open(f + ".tmp", os.O_WRONLY)
            try:
                _n, crcs[j] = write_elements(
                    fd, layout.data_offset, 4, b, e, piece,
                    lambda at, n, x=x, s=stream: _read_core(core, x.h, s, buf[:n], at - x.held[0]))
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
    except Exception as err:  # noqa: BLE001 -- reported to every rank, re-raised here
        error = err
    outcome(comm, "save_universal_checkpoint", error, lambda: remove_all(tmps))
    every = comm.all_gather(crcs) if comm is not None else crcs
    every = every.reshape(size, len(jobs))
    if rank == 0:
        for j, (x, _s, f, layout) in enumerate(jobs):
            crc = combined_crc(every[:, j], partition_layout(x.numel, size), 4)
            fd = os.open(f + ".tmp", os.O_WRONLY)
            try:
                layout.patch_crc(fd, crc)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(f + ".tmp", f)
        for x in params:
            d = os.path.join(path, "zero", x.name)
            _save_small(torch.tensor(float(core.step_count(x.h))), os.path.join(d, "step.pt"),
                        durable)
            if durable:
                fsync_dir(d)
        _save_small(_optimizer_state(optimizer, params),
                    os.path.join(path, "zero", "optimizer_state.pt"), durable)
        if durable:
            fsync_dir(os.path.join(path, "zero"))
    if comm is not None:
        comm.barrier()
    return path


def _optimizer_state(optimizer: Any, params: List[_Param]) -> Dict[str, Any]:
    groups, names = [], []
    for gi, group in enumerate(optimizer.param_groups):
        g = {k: v for k, v in group.items() if k != "params"}
        mine = [x.name for x in params if x.group == gi]
        g["params"] = list(range(len(mine)))
        groups.append(g)
        names.append(mine)
    return {"param_groups": groups, "param_names": names}


def _tensor_file(f: str, x: _Param) -> Tuple[str, Tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of the "param" tensor of universal file ``f`` (file
    offsets), checked against ``x``."""
    if not os.path.isfile(f):
        raise FileNotFoundError(f"universal checkpoint: {f!r} is missing (parameter "
                                f"{x.name!r})")
    obj, storages = read_saved(f)
    t = obj.get("param") if isinstance(obj, dict) else None
    if not isinstance(t, TensorRef):
        raise ValueError(f"universal checkpoint file {f!r}: no tensor under 'param'")
    if not t.contiguous():
        raise ValueError(f"universal checkpoint file {f!r}: 'param' is a non-contiguous view")
    if tuple(t.shape) != tuple(x.p.shape):
        raise ValueError(f"universal checkpoint file {f!r}: shape {list(t.shape)}, but "
                         f"parameter {x.name!r} has shape {list(x.p.shape)}")
    dtype, itemsize, data, nbytes = storages[t.storage.key]
    if dtype not in ("F32", "F64", "F16", "BF16"):
        raise ValueError(f"universal checkpoint file {f!r}: dtype {dtype} is not floating")
    begin = data + t.offset * itemsize
    end = begin + x.numel * itemsize
    if end > data + nbytes:
        raise ValueError(f"universal checkpoint file {f!r}: 'param' needs bytes [{begin}, "
                         f"{end}) but its storage ends at byte {data + nbytes}")
    return dtype, tuple(t.shape), begin, end


def _step_file(f: str, x: _Param) -> int:
    if not os.path.isfile(f):
        raise FileNotFoundError(f"universal checkpoint: {f!r} is missing (parameter "
                                f"{x.name!r})")
    obj, storages = read_saved(f)
    if isinstance(obj, dict) and "param" in obj:
        obj = obj["param"]
    if isinstance(obj, TensorRef):
        dtype, itemsize, data, nbytes = storages[obj.storage.key]
        kinds = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4"}
        if dtype not in kinds or nbytes < (obj.offset + 1) * itemsize:
            raise ValueError(f"universal checkpoint file {f!r}: step is a {dtype} tensor")
        with open(f, "rb") as fh:
            fh.seek(data + obj.offset * itemsize)
            obj = np.frombuffer(fh.read(itemsize), dtype=kinds[dtype])[0].item()
    if isinstance(obj, bool) or not isinstance(obj, (int, float)) or obj < 0 or obj != int(obj):
        raise ValueError(f"universal checkpoint file {f!r}: step {obj!r} is not an integer >= 0")
    return int(obj)


def load_universal_checkpoint(optimizer: Any, model: torch.nn.Module,
                              path: Union[str, "os.PathLike[str]"], *, comm: Any = None,
                              piece_bytes: Optional[Union[int, str]] = None,
                              pieces: Optional[int] = None) -> None:
    """Loads a universal checkpoint (module doc; DeepSpeed's ``ds_to_universal.py`` output
    or :func:`save_universal_checkpoint`'s, written at any world size) into ``optimizer``
    (OffloadAdam/OffloadAdamW) and ``model``'s parameters: each parameter's fp32 master,
    state tensors and step count, and each param group's hyperparameters (as
    load_state_dict takes them: keys the saved group lacks take torch's defaults). The
    parameters get their masters' values (converted to their dtype; ZeRO-3: this rank's
    slice of its object). Each rank reads only the elements its optimizer holds (ZeRO-3:
    its slice, a byte range of each file; otherwise the whole parameter) in pieces of
    ``piece_bytes`` (default 16 MiB) through strata's reader (``pieces`` in flight);
    floating files (fp32, fp64, fp16, bf16) are converted to fp32 in flight. Files the
    optimizer has no state for (``max_exp_avg_sq.pt`` without amsgrad) are not read.
    Everything is checked (files, shapes, groups) before anything is written.

    Collective only in that every rank reads the same files; no communication.

    :param model: names the parameters (as save_universal_checkpoint).
    :param comm: as save_universal_checkpoint (the ZeRO-3 partitions' by default).
    :raises FileNotFoundError: a parameter's file is missing (naming it and the parameter).
    :raises ValueError: another number of param groups or of parameters in a group, a
        parameter of the optimizer the checkpoint's group does not name, a shape other than
        the parameter's, a tensor file without a floating "param" tensor, a step that is not
        an integer >= 0, a hyperparameter strata refuses, another ``amsgrad`` (naming the
        file, parameter or group); as save_universal_checkpoint for names and ``comm``.
    :raises TypeError: as save_universal_checkpoint.
    """
    who = "load_universal_checkpoint"
    _check_optimizer(optimizer, who)
    path = os.fspath(path)
    optimizer._abort_overlap()
    optimizer._sync_params()
    params, comm = _params(optimizer, model, comm, who)
    table, core = optimizer._table, optimizer._table.core
    states = table.state_names()
    piece = _piece_elems(piece_bytes)
    meta_path = os.path.join(path, "zero", "optimizer_state.pt")
    if not os.path.isfile(meta_path):
        raise FileNotFoundError(f"universal checkpoint: {meta_path!r} is missing")
    meta, _ = read_saved(meta_path)
    if not isinstance(meta, dict) or not isinstance(meta.get("param_groups"), list):
        raise ValueError(f"universal checkpoint file {meta_path!r}: no 'param_groups' list")
    groups = meta["param_groups"]
    saved_names = meta.get("param_names")
    ck = optimizer._checkpoints
    merged = ck.check_loaded_groups(groups, optimizer.param_groups,
                                    [optimizer._registry.amsgrad()] * len(groups))
    if saved_names is not None:
        for x in params:
            if x.name not in saved_names[x.group]:
                raise ValueError(f"universal checkpoint {path!r}: param group {x.group} does "
                                 f"not hold parameter {x.name!r}")
    plan = []
    for x in params:
        files = [(s, f, _tensor_file(f, x)) for s, f in _files(path, x, states)]
        step = _step_file(os.path.join(path, "zero", x.name, "step.pt"), x)
        plan.append((x, files, step))
    for ours, m in zip(optimizer.param_groups, merged):
        ps = ours["params"]
        ours.clear()
        ours.update(m, params=ps)
    optimizer._sync_hyperparams()
    optimizer.state.invalidate()
    buf = np.empty(min(piece, max([x.held[1] - x.held[0] for x in params] + [1])),
                   dtype=np.float32)
    for x, files, step in plan:
        b, e = x.held
        for stream, f, (dtype, shape, begin, end) in files:
            if e <= b:
                continue
            reader = _strata._SafetensorsReader.ranges(f, [("param", dtype, list(shape),
                                                           begin, end)])
            for at in range(b, e, piece):
                n = min(piece, e - at)
                dst = buf[:n]
                reader.copy([(0, at, at + n, "fp32", dst.ctypes.data, None, 0)], None,
                            piece_bytes, pieces)
                if stream < 0:
                    core.write_param(x.h, dst, at - b)
                else:
                    core.write_state(x.h, stream, dst, at - b)
        core.set_step_count(x.h, step)
        copy_master_to_param(core, x.h, x.p)
        table.mark(x.h)
