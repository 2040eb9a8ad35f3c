"""torch.save's zip archives laid out in advance from the names, dtypes and shapes alone
(:class:`ZipLayout`), so that one process writes everything but the tensors' bytes (the
"skeleton": local headers, ``data.pkl``, ``byteorder``, ``version``, the central directory,
zip64 records where sizes or offsets pass 4 GiB) and every process writes its own element
range of each stored (uncompressed, 64-byte aligned, as torch aligns it) storage entry in
place. Each entry's CRC-32 is combined from the ranges' CRCs (:func:`crc32_combine`, zlib's
algorithm; :func:`combined_crc`) and patched into its local header and central-directory
record afterwards. Used for a state dict's file (checkpoints/_torch_save.py, from one
process or every rank) and for one tensor's file, ``torch.save({"param": t, "cat_dim": 0})``
(:class:`TensorFileLayout`: DeepSpeed's universal checkpoint files, optim/_universal.py).

Zip format: PKWARE's APPNOTE.TXT 6.3 (4.3.7 local file header, 4.3.12 central directory
header, 4.3.14-16 zip64 end of central directory record/locator and end of central
directory record, 4.5.3 the zip64 extended information extra field). The data.pkl pickle
is torch.save's (:class:`Pickler`: ``_rebuild_tensor_v2`` over a persistent storage id).

Thread-safety: plain functions and an immutable layout object.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections import OrderedDict
from typing import Any, Dict, List, Sequence, Tuple

import torch

#: sizes and offsets at or above this are written as zip64 fields (tests lower it to force
#: the zip64 records on small files)
ZIP64_LIMIT = 0xFFFFFFFF
_DOS_DATE = (1 << 5) | 1  # 1980-01-01, time 00:00:00
_STORAGE_ENTRY = "archive/data/0"
#: torch dtype -> the storage class torch.save names in data.pkl
STORAGE_OF = {torch.float32: "FloatStorage", torch.float64: "DoubleStorage",
              torch.float16: "HalfStorage", torch.bfloat16: "BFloat16Storage",
              torch.int64: "LongStorage", torch.int32: "IntStorage",
              torch.int16: "ShortStorage", torch.int8: "CharStorage",
              torch.uint8: "ByteStorage", torch.bool: "BoolStorage"}
_ALIGN = 64  # torch's PyTorchStreamWriter aligns each record's data to 64 bytes


class Storage:
    """A storage as data.pkl names it (``archive/data/<key>``): dtype and elements."""

    __slots__ = ("key", "dtype", "numel", "tensor")

    def __init__(self, key: str, tensor: torch.Tensor):
        self.key, self.dtype, self.numel, self.tensor = key, tensor.dtype, tensor.numel(), tensor


class PickledTensor:
    """Pickles as torch.save pickles a contiguous tensor of its own storage."""

    def __init__(self, storage: Storage, shape):
        self.storage, self.shape = storage, tuple(shape)

    def __reduce__(self):
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.append(acc)
            acc *= max(d, 1)
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, self.shape, tuple(reversed(stride)), False,
                 OrderedDict()))


class Pickler(pickle.Pickler):
    """torch.save's pickler of data.pkl: a :class:`Storage` as its persistent id."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Storage):
            return ("storage", getattr(torch, STORAGE_OF[obj.dtype]), obj.key, "cpu", obj.numel)
        return None


def _gf2_times(mat: Sequence[int], vec: int) -> int:
    s, i = 0, 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _gf2_square(mat: Sequence[int]) -> List[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 (zlib's, as ``zlib.crc32``) of A followed by B from ``crc1`` = crc32(A),
    ``crc2`` = crc32(B) and ``len2`` = len(B) in bytes: crc1 advanced over len2 zero bytes
    by squaring the GF(2) operator of one zero bit (zlib's crc32_combine, crc32.c; O(log
    len2) 32x32 bit-matrix products). ``len2`` <= 0 returns crc1."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    even = _gf2_square(odd)  # two
    odd = _gf2_square(even)  # four
    while True:
        even = _gf2_square(odd)  # 8, 32, ... zero bits: 1, 4, ... zero bytes
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def _pickle_of(dtype: torch.dtype, shape: Tuple[int, ...], extra: Dict[str, Any]) -> bytes:
    meta = torch.empty(shape, dtype=dtype, device="meta")
    storage = Storage("0", meta)
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump({"param": PickledTensor(storage, shape), **extra})
    return buf.getvalue()


class _Entry:
    __slots__ = ("name", "data", "nbytes", "offset", "data_offset", "local")

    def __init__(self, name: str, data: bytes, nbytes: int):
        self.name, self.data, self.nbytes = name.encode(), data, nbytes
        self.offset = self.data_offset = 0
        self.local = b""


class ZipLayout:
    """Where everything of a zip archive of stored (uncompressed) entries lies, decided from
    the entries' names and sizes alone: each entry's local header (data 64-byte aligned by
    an "FB" padding extra field, as torch's writer aligns it), its data, the central
    directory and end records (zip64 where a size or offset reaches :data:`ZIP64_LIMIT`).

    :param entries: [(name, data, nbytes)] in file order: ``data`` bytes for an entry
        written whole with the skeleton (its CRC-32 computed here), or None for one whose
        ``nbytes`` bytes are written in place later (:meth:`write_skeleton` leaves a hole,
        :meth:`patch_crc` fills in its CRC-32).

    ``data_offsets[i]``: the file offset of entry i's first data byte; ``file_nbytes``:
    the file's size in bytes. Immutable once built.
    """

    def __init__(self, entries: Sequence[Tuple[str, Any, int]]):
        self._entries = [_Entry(n, d if d is not None else b"", len(d) if d is not None else nb)
                         for n, d, nb in entries]
        at = 0
        for e in self._entries:
            size = len(e.data) if e.data else e.nbytes
            e.offset = at
            big = size >= ZIP64_LIMIT
            zip64 = struct.pack("<HHQQ", 1, 16, size, size) if big else b""
            start = at + 30 + len(e.name) + len(zip64)
            pad = -(start + 4) % _ALIGN
            extra_field = zip64 + struct.pack("<HH", 0x4246, pad) + b"Z" * pad
            crc = _crc(e.data) if e.data else 0
            fixed = 0xFFFFFFFF if big else size
            e.local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if big else 20, 0, 0, 0,
                                  _DOS_DATE, crc, fixed, fixed, len(e.name),
                                  len(extra_field)) + e.name + extra_field
            e.data_offset = at + len(e.local)
            at = e.data_offset + size
        self.data_offsets = [e.data_offset for e in self._entries]
        self._cd_offset = at
        self._cd_entry_offsets: List[int] = []
        cd = bytearray()
        for e in self._entries:
            self._cd_entry_offsets.append(at + len(cd))
            cd += self._central(e, crc=_crc(e.data) if e.data else 0)
        self._cd_nbytes = len(cd)
        self._cd = bytes(cd)
        self._end = self._end_records()
        self.file_nbytes = self._cd_offset + self._cd_nbytes + len(self._end)

    def _central(self, e: _Entry, crc: int) -> bytes:
        size = len(e.data) if e.data else e.nbytes
        fields = []
        fsize = size
        if size >= ZIP64_LIMIT:
            fsize = 0xFFFFFFFF
            fields += [size, size]
        foff = e.offset
        if e.offset >= ZIP64_LIMIT:
            foff = 0xFFFFFFFF
            fields.append(e.offset)
        extra = struct.pack("<HH", 1, 8 * len(fields)) + struct.pack(f"<{len(fields)}Q", *fields) \
            if fields else b""
        version = 45 if fields else 20
        return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, version, version, 0, 0, 0,
                           _DOS_DATE, crc, fsize, fsize, len(e.name), len(extra), 0, 0, 0, 0,
                           foff) + e.name + extra

    def _end_records(self) -> bytes:
        n = len(self._entries)
        big = self._cd_offset >= ZIP64_LIMIT or self._cd_nbytes >= ZIP64_LIMIT
        out = b""
        if big:
            z64 = self._cd_offset + self._cd_nbytes
            out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n,
                               self._cd_nbytes, self._cd_offset)
            out += struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
        off = 0xFFFFFFFF if big else self._cd_offset
        size = 0xFFFFFFFF if big else self._cd_nbytes
        return out + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, size, off, 0)

    def skeleton(self) -> List[Tuple[bytes, int]]:
        """Everything but the in-place entries' data, as [(bytes, file offset)]: local
        headers, the data given whole, the central directory and end records."""
        return [(e.local + (e.data if e.data else b""), e.offset) for e in self._entries] + \
            [(self._cd + self._end, self._cd_offset)]

    def write_skeleton(self, fd: int) -> None:
        """Writes :meth:`skeleton` into the open file ``fd`` (pwrite; the in-place entries'
        data stay holes until the ranks fill them) and sets its size to ``file_nbytes``.
        :raises OSError: the writes fail."""
        import os
        os.ftruncate(fd, self.file_nbytes)
        for data, at in self.skeleton():
            _pwrite_all(fd, data, at)

    def patch_crc(self, fd: int, crc: int, entry: int) -> None:
        """Writes entry ``entry``'s CRC-32 ``crc`` into its local header and its
        central-directory record (pwrite into ``fd``). :raises OSError: a write fails."""
        raw = struct.pack("<I", crc & 0xFFFFFFFF)
        _pwrite_all(fd, raw, self._entries[entry].offset + 14)
        _pwrite_all(fd, raw, self._cd_entry_offsets[entry] + 16)


def combined_crc(crcs: Sequence[int], ranges: Sequence[Tuple[int, int]], itemsize: int) -> int:
    """The CRC-32 of a tensor's bytes from the CRC-32s ``crcs[r]`` of its element ranges
    ``ranges[r]`` = [begin, end) (consecutive, in order; ``itemsize`` bytes an element),
    combined with :func:`crc32_combine`."""
    crc = 0
    for c, (b, e) in zip(crcs, ranges):
        crc = crc32_combine(crc, int(c) & 0xFFFFFFFF, (e - b) * itemsize)
    return crc


class TensorFileLayout(ZipLayout):
    """Where everything of one tensor's torch.save file lies. ``data_offset``: the file
    offset of the tensor's first byte (element i at ``data_offset + i * itemsize``);
    ``nbytes``: the tensor's bytes; ``file_nbytes``: the file's size.

    :param dtype, shape: the tensor's (contiguous, little-endian; any dtype torch.save
        names a storage for here: float32, float64, float16, bfloat16, integers, bool).
    :param extra: other entries of the dict saved beside "param" (picklable plain values,
        e.g. ``{"cat_dim": 0}``).
    """

    def __init__(self, dtype: torch.dtype, shape: Sequence[int], extra: Dict[str, Any]):
        self.shape = tuple(int(d) for d in shape)
        numel = 1
        for d in self.shape:
            numel *= d
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.nbytes = numel * self.itemsize
        super().__init__([("archive/data.pkl", _pickle_of(dtype, self.shape, extra), 0),
                          ("archive/byteorder", b"little", 0),
                          (_STORAGE_ENTRY, None, self.nbytes),
                          ("archive/version", b"3\n", 0)])
        self.data_offset = self.data_offsets[2]

    def patch_crc(self, fd: int, crc: int, entry: int = 2) -> None:
        """Writes the storage entry's CRC-32 ``crc`` into its local header and its
        central-directory record (pwrite into ``fd``)."""
        super().patch_crc(fd, crc, entry)


def _crc(data: bytes) -> int:
    import zlib
    return zlib.crc32(data) & 0xFFFFFFFF


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    """pwrite of all of ``data`` at ``offset``, short writes continued."""
    import os
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(f"pwrite of {len(view)} bytes at offset {offset} wrote {n}")
        view, offset = view[n:], offset + n


def pwrite_all(fd: int, data: Any, offset: int) -> None:
    """pwrite of every byte of ``data`` (bytes-like) at file offset ``offset`` (short
    writes continued). :raises OSError: a write fails or writes nothing."""
    _pwrite_all(fd, data, offset)


def read_saved(path: str) -> Tuple[Any, Dict[str, Tuple[str, int, int, int]]]:
    """The object of torch.save file ``path`` read without torch.load (the restricted
    unpickler of checkpoints/_torch_zip.py: plain values, dicts, tuples, tensors; no code
    from the file runs), its tensors left as ``_torch_zip.TensorRef``s, and for each
    storage key its (safetensors dtype, element size, file offset of its data, bytes).
    The tensors' bytes can then be read in place (they are stored uncompressed).

    :raises ValueError: not a zip archive, no single data.pkl, a compressed storage entry,
        a damaged pickle or archive (naming the file and entry).
    :raises pickle.UnpicklingError: data.pkl needs a global a state dict does not."""
    import zipfile
    from ._torch_zip import ForbiddenGlobal, _data_offset, _entry, _Unpickler
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError) as e:
        raise ValueError(f"torch.save file {path!r} is not a zip archive ({e})") from None
    with z, open(path, "rb") as f:
        pkl = [i for i in z.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
        if len(pkl) != 1:
            raise ValueError(f"torch.save file {path!r}: {len(pkl)} data.pkl entries, expected 1")
        prefix = pkl[0].filename[:-len("data.pkl")]
        if prefix + "byteorder" in z.namelist() and z.read(prefix + "byteorder").strip() != b"little":
            raise ValueError(f"torch.save file {path!r}: written on a big-endian machine")
        try:
            up = _Unpickler(z.read(pkl[0]), path)
            obj = up.load()
        except ForbiddenGlobal:
            raise
        except Exception as e:  # a damaged archive or pickle: whatever the parsers raise
            raise ValueError(f"torch.save file {path!r}: {pkl[0].filename!r} cannot be read "
                             f"({type(e).__name__}: {e})") from e
        storages = {}
        for key, s in up.storages.items():
            info = _entry(z, prefix + "data/" + key, path)
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"torch.save file {path!r}: entry {info.filename!r} is "
                                 "compressed; torch writes storages uncompressed")
            storages[key] = (s.dtype, s.itemsize, _data_offset(f, info, path), info.file_size)
    return obj, storages
