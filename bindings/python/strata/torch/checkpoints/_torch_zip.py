"""torch.save files (the zip format torch writes since 1.6) read without torch.load: the zip
central directory (Python's zipfile) gives each entry's offset; ``data.pkl`` is read by a
restricted unpickler that records each storage (``persistent_load``: ``('storage', type,
key, location, numel)``, the entry ``<archive>/data/<key>``) and each tensor built on it
(``torch._utils._rebuild_tensor_v2``: offset, size, stride) instead of loading them, so the
tensors' bytes can then be read in place (uncompressed entries) by strata's reader
(``_SafetensorsReader.ranges``). Only the globals a state dict needs are resolved; any
other raises (no code from the file runs).

Thread-safety: plain functions.
"""

from __future__ import annotations

import pickle
import struct
import zipfile
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

#: torch's storage classes -> (safetensors dtype, element bytes)
_STORAGE = {"FloatStorage": ("F32", 4), "DoubleStorage": ("F64", 8), "HalfStorage": ("F16", 2),
            "BFloat16Storage": ("BF16", 2), "LongStorage": ("I64", 8), "IntStorage": ("I32", 4),
            "ShortStorage": ("I16", 2), "CharStorage": ("I8", 1), "ByteStorage": ("U8", 1),
            "BoolStorage": ("BOOL", 1)}


class StorageRef:
    """A storage of the archive: its entry key, dtype (safetensors name), element size."""

    __slots__ = ("key", "dtype", "itemsize", "numel")

    def __init__(self, key: str, dtype: str, itemsize: int, numel: int):
        self.key, self.dtype, self.itemsize, self.numel = key, dtype, itemsize, numel


class TensorRef:
    """A tensor of the archive, not loaded: its storage and view (elements)."""

    __slots__ = ("storage", "offset", "shape", "stride")

    def __init__(self, storage: StorageRef, offset: int, shape: Tuple[int, ...],
                 stride: Tuple[int, ...]):
        self.storage, self.offset, self.shape, self.stride = storage, offset, shape, stride

    def contiguous(self) -> bool:
        want, acc = [], 1
        for d in reversed(self.shape):
            want.append(acc)
            acc *= d
        return all(d == 1 or s == w for d, s, w in zip(self.shape, self.stride, reversed(want)))


class ForbiddenGlobal(pickle.UnpicklingError):
    """data.pkl names a global a state dict does not need (nothing of it is run)."""


class _StorageType:
    def __init__(self, name: str):
        self.name = name


def _rebuild_tensor_v2(storage, offset, size, stride, *rest):
    return TensorRef(storage, int(offset), tuple(size), tuple(stride))


def _rebuild_parameter(data, *rest):
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    return func(*args)


_GLOBALS = {("collections", "OrderedDict"): OrderedDict, ("torch", "Size"): tuple,
            ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
            ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
            ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
            ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2}


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, path: str):
        import io
        super().__init__(io.BytesIO(data))
        self.path = path
        self.storages: Dict[str, StorageRef] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _STORAGE:
            return _StorageType(name)
        if (module, name) in (("torch", "Tensor"), ("torch.nn.parameter", "Parameter")):
            return object  # _rebuild_from_type_v2's type argument (not used)
        fn = _GLOBALS.get((module, name))
        if fn is None:
            raise ForbiddenGlobal(
                f"torch.save file {self.path!r}: data.pkl needs {module}.{name}, which a "
                "state dict does not (only tensors, parameters and OrderedDicts are read)")
        return fn

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"torch.save file {self.path!r}: unknown persistent "
                                         f"id {pid!r} in data.pkl")
        _, typ, key, _location, numel = pid
        ref = self.storages.get(key)
        if ref is None:
            dtype, size = _STORAGE[typ.name]
            ref = self.storages[key] = StorageRef(str(key), dtype, size, int(numel))
        return ref


def _data_offset(f, info: zipfile.ZipInfo, path: str) -> int:
    """File offset of an entry's data: after its local header (30 bytes, name, extra)."""
    f.seek(info.header_offset)
    local = f.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise ValueError(f"torch.save file {path!r}: no local header of {info.filename!r} at "
                         f"byte {info.header_offset}")
    n, m = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + n + m


def read_archive(path: str, key: Optional[str] = None
                 ) -> Tuple[List[tuple], Dict[str, Any], Optional[Dict[str, Any]]]:
    """The tensors of the state dict in torch.save file ``path`` (``key``: the state dict
    is ``obj[key]`` of a dict saved, e.g. "model"), as entries for
    ``_SafetensorsReader.ranges``: [(name, dtype, shape, begin, end)] with file offsets,
    plus {name: TensorRef} and the state dict's ``_metadata`` (module versions; None when
    it has none).

    :raises ValueError: not a zip archive (torch's legacy format), a compressed storage, a
        storage entry missing or shorter than a tensor on it, a non-contiguous tensor, no
        state dict (naming the file, the entry and the byte offset where one applies).
        A damaged archive or pickle is a ValueError naming the file (whatever zipfile or
        pickle raised is its ``__cause__``).
    :raises ForbiddenGlobal: (pickle.UnpicklingError) data.pkl needs a global a state dict
        does not."""
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError) as e:
        raise ValueError(f"torch.save file {path!r} is not a zip archive ({e}): torch's legacy "
                         "(pre-1.6) format is not read") from None
    with z, open(path, "rb") as f:
        pkl = [i for i in z.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
        if len(pkl) != 1:
            raise ValueError(f"torch.save file {path!r}: {len(pkl)} data.pkl entries, expected 1")
        prefix = pkl[0].filename[:-len("data.pkl")]
        if prefix + "byteorder" in z.namelist() and z.read(prefix + "byteorder").strip() != b"little":
            raise ValueError(f"torch.save file {path!r}: written on a big-endian machine "
                             "(its byteorder entry); only little-endian files are read")
        try:
            up = _Unpickler(z.read(pkl[0]), path)
            obj = up.load()
        except ForbiddenGlobal:
            raise
        except Exception as e:  # a damaged archive or pickle: whatever the parsers raise
            raise ValueError(f"torch.save file {path!r}: {pkl[0].filename!r} cannot be read "
                             f"({type(e).__name__}: {e})") from e
        if key is not None:
            if not isinstance(obj, dict) or key not in obj:
                raise ValueError(f"torch.save file {path!r}: the object saved has no key {key!r}")
            obj = obj[key]
        if not isinstance(obj, dict) or not all(isinstance(v, TensorRef) for v in obj.values()):
            raise ValueError(f"torch.save file {path!r}: the object saved is not a state dict "
                             "(a dict of tensors); pass key= for one inside it")
        entries, refs = [], {}
        for name, t in obj.items():
            s = t.storage
            info = _entry(z, prefix + "data/" + s.key, path)
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"torch.save file {path!r}: entry {info.filename!r} is "
                                 "compressed; torch writes storages uncompressed")
            if not t.contiguous():
                raise ValueError(f"torch.save file {path!r}: tensor {name!r} is a "
                                 f"non-contiguous view (stride {t.stride}); save "
                                 "{k: v.contiguous()} instead")
            numel = 1
            for d in t.shape:
                numel *= d
            begin = _data_offset(f, info, path) + t.offset * s.itemsize
            end = begin + numel * s.itemsize
            if (t.offset + numel) * s.itemsize > info.file_size:
                raise ValueError(f"torch.save file {path!r}: tensor {name!r} needs bytes "
                                 f"[{begin}, {end}) but its storage {info.filename!r} holds "
                                 f"{info.file_size} bytes from byte {begin - t.offset * s.itemsize}")
            entries.append((str(name), s.dtype, list(t.shape), begin, end))
            refs[str(name)] = t
        metadata = getattr(obj, "_metadata", None)
    return entries, refs, metadata if isinstance(metadata, dict) else None


def _entry(z: zipfile.ZipFile, name: str, path: str) -> zipfile.ZipInfo:
    try:
        return z.getinfo(name)
    except KeyError:
        raise ValueError(f"torch.save file {path!r}: the storage entry {name!r} is missing") from None
