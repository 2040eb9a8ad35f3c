"""save_torch_state_dict: a model's state dict as a file ``torch.load`` reads -- torch.save's
zip format (``archive/data.pkl`` naming storages ``archive/data/<key>``, stored
uncompressed with their data 64-byte aligned as torch aligns them, ``archive/version``) --
streamed from offloaded parameters' store objects and from memory in pieces, without
materializing the model.

Thread-safety: one call per model at a time; the model must not run meanwhile.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from typing import Any, Dict, Optional, Union

import torch

from ... import parse_size
from ._entries import model_of, state_entries, where

#: torch dtype -> the storage class torch.save names in data.pkl
_STORAGE_OF = {torch.float32: "FloatStorage", torch.float64: "DoubleStorage",
               torch.float16: "HalfStorage", torch.bfloat16: "BFloat16Storage",
               torch.int64: "LongStorage", torch.int32: "IntStorage",
               torch.int16: "ShortStorage", torch.int8: "CharStorage",
               torch.uint8: "ByteStorage", torch.bool: "BoolStorage"}
_ALIGN = 64  # torch's PyTorchStreamWriter aligns each record's data to 64 bytes


class _Storage:
    __slots__ = ("key", "dtype", "numel", "tensor")

    def __init__(self, key: str, tensor: torch.Tensor):
        self.key, self.dtype, self.numel, self.tensor = key, tensor.dtype, tensor.numel(), tensor


class _Tensor:
    """Pickles as torch.save pickles a contiguous tensor of its own storage."""

    def __init__(self, storage: _Storage, shape):
        self.storage, self.shape = storage, tuple(shape)

    def __reduce__(self):
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.append(acc)
            acc *= max(d, 1)
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, self.shape, tuple(reversed(stride)), False,
                 OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _Storage):
            return ("storage", getattr(torch, _STORAGE_OF[obj.dtype]), obj.key, "cpu", obj.numel)
        return None


def save_torch_state_dict(module: Any, path: Union[str, "os.PathLike[str]"], *,
                          piece_bytes: Optional[Union[int, str]] = None,
                          durable: bool = True) -> str:
    """Writes ``module.state_dict()`` to ``path`` as ``torch.save(module.state_dict(), path)``
    would -- ``torch.load(path)`` gives the same keys, values, dtypes and shapes, tied
    tensors sharing one storage, the module versions (``_metadata``) -- streaming each
    tensor's bytes in pieces of ``piece_bytes`` from offloaded parameters' store objects
    (``Store.read_range``) or from memory: host memory stays at a few pieces (plus a
    temporary contiguous CPU copy of a CUDA or non-contiguous tensor while it is written).
    Written into ``path``.tmp (buffered writes, zipfile's CRC-32 and zip64 records), then
    fsync'd, renamed over ``path`` and the directory fsync'd (``durable``).

    :param piece_bytes: bytes read and written at a time (int or "8MiB"; default 8 MiB).
    :returns: ``path``.
    :raises TypeError: a dtype torch.save's storages do not name here (complex...).
    :raises NotImplementedError: ZeRO-3 partitioned parameters.
    :raises OSError: the file cannot be written (the .tmp is removed).
    """
    model = model_of(module)
    piece = 8 << 20 if piece_bytes is None else (parse_size(piece_bytes) if isinstance(piece_bytes, str)
                                                else int(piece_bytes))
    if piece <= 0:
        raise ValueError(f"piece_bytes: must be > 0, got {piece_bytes!r}")
    path = os.fspath(path)
    meta = getattr(model.state_dict(keep_vars=True), "_metadata", None)
    storages: Dict[int, _Storage] = {}
    out: "OrderedDict[str, Any]" = OrderedDict()
    for k, v in state_entries(model).items():
        if v.dtype not in _STORAGE_OF:
            raise TypeError(f"{k}: dtype {v.dtype} is not written by save_torch_state_dict")
        s = storages.setdefault(id(v), _Storage(str(len(storages)), v))
        out[k] = _Tensor(s, v.shape)
    if meta is not None:
        out._metadata = meta  # type: ignore[attr-defined]
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(out)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
                z.writestr(_info(f, "archive/data.pkl", 0), buf.getvalue())
                z.writestr(_info(f, "archive/byteorder", 0), "little")
                for s in storages.values():
                    _write_storage(z, f, s, piece)
                z.writestr(_info(f, "archive/version", 0), "3\n")
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if durable:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def _info(f: Any, name: str, nbytes: int) -> zipfile.ZipInfo:
    """An entry whose data starts 64-byte aligned: padding in an extra field (id "FB", as
    torch's writer), counting the zip64 extra zipfile adds for an entry over 2 GiB."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    zip64 = 20 if nbytes > (1 << 31) else 0
    start = f.tell() + 30 + len(name.encode()) + zip64
    pad = -(start + 4) % _ALIGN
    info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
    return info


def _write_storage(z: zipfile.ZipFile, f: Any, s: _Storage, piece: int) -> None:
    v = s.tensor
    nbytes = v.numel() * v.element_size()
    info = _info(f, f"archive/data/{s.key}", nbytes)
    kind, handle = where(v)
    with z.open(info, "w", force_zip64=nbytes > (1 << 31)) as w:
        if kind == "offloaded":
            key, src_dtype = handle.value_object(v)
            if src_dtype != v.dtype:  # a linked optimizer's fp32 master: converted per piece
                step = piece // 4
                for at in range(0, v.numel(), step):
                    n = min(step, v.numel() - at)
                    arr = handle.store.read_range(key, at * 4, n * 4).view("float32")
                    w.write(_bytes_of(torch.from_numpy(arr).to(v.dtype)))
            else:
                for at in range(0, nbytes, piece):
                    w.write(handle.store.read_range(key, at, min(piece, nbytes - at)).data)
            return
        src = v.detach()
        if src.device.type != "cpu" or not src.is_contiguous():
            src = src.contiguous().cpu()
        flat = _bytes_of(src)
        for at in range(0, nbytes, piece):
            w.write(flat[at:at + piece])


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes (no copy)."""
    t = t.reshape(-1)
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    elif t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return memoryview(t.numpy()).cast("B")
