"""save_safetensors from every rank at once (ZeRO-3 partitioned parameters, or data-parallel
replicas given ``comm=``): the files' layout is computed identically on every rank (and
checked to agree), rank 0 writes each file's header into ``<name>.tmp``, every rank writes
its element range of each tensor in place (``pwrite`` at the tensor's file offset, pieces
read from its ``#part`` store object or memory), fsync, and rank 0 renames the files into
place once every rank succeeded (checkpoints/_ranks.py, the protocol shared with the
universal layout). No rank reads or receives another rank's slices.

The header is the one strata's C++ writer (strata/store/safetensors.hpp: format_header,
layout_order) writes for the same tensors, byte for byte, so a file from ranks equals the
one-process export of the same values.

Thread-safety: collective over the ranks of ``comm``; the model must not run meanwhile.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ... import parse_size
from ...distributed import partition_layout
from ._entries import where
from ._ranks import agree, create, write_elements, write_in_place
from ._universal_zip import ZipLayout, combined_crc

#: safetensors dtypes in the order of the C++ StDType enum (layout_order sorts descending)
ST_DTYPES = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32",
             "U32", "F32", "F64", "I64", "U64")
ST_OF_TORCH = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
               torch.float64: "F64", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
               torch.int64: "I64", torch.uint8: "U8", torch.bool: "BOOL"}
_DATA_ALIGNMENT = 4096


def header_of(tensors: List[Tuple[str, str, List[int], int]], metadata: Dict[str, str]
              ) -> Tuple[bytes, Dict[str, Tuple[int, int]]]:
    """The header strata's writer writes for ``tensors`` ([(name, safetensors dtype, shape,
    bytes)]) and ``metadata``: the tensors laid out in the reference writer's order (dtype
    descending in the format's enum order, then name by UTF-8 bytes), the JSON compact
    with sorted keys (nlohmann's dump; ``__metadata__`` only when not empty), padded with
    spaces so the data starts at a multiple of 4096. Returns (the 8-byte length + JSON,
    {name: (begin, end)} data offsets relative to the end of the header)."""
    order = sorted(tensors, key=lambda t: (-ST_DTYPES.index(t[1]), t[0].encode("utf-8")))
    offsets, root, pos = {}, {}, 0
    for name, dt, shape, nbytes in order:
        offsets[name] = (pos, pos + nbytes)
        root[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    if metadata:
        root["__metadata__"] = dict(metadata)
    text = json.dumps(root, ensure_ascii=False, separators=(",", ":"),
                      sort_keys=True).encode("utf-8")
    total = -(-(8 + len(text)) // _DATA_ALIGNMENT) * _DATA_ALIGNMENT
    text += b" " * (total - 8 - len(text))
    return len(text).to_bytes(8, "little") + text, offsets


def piece_elements(piece_bytes: Any, itemsize: int) -> int:
    """Elements per piece: ``piece_bytes`` (int or size string; default
    $STRATA_CHECKPOINT_PIECE_BYTES or 8 MiB) over ``itemsize``, at least 1.
    :raises ValueError: a size <= 0 or unreadable (naming the argument or variable)."""
    what = "piece_bytes"
    if piece_bytes is None:
        piece_bytes = os.environ.get("STRATA_CHECKPOINT_PIECE_BYTES") or (8 << 20)
        what = "STRATA_CHECKPOINT_PIECE_BYTES"
    n = parse_size(piece_bytes) if isinstance(piece_bytes, str) else int(piece_bytes)
    if n <= 0:
        raise ValueError(f"{what}: must be > 0 bytes, got {piece_bytes!r}")
    return max(1, n // itemsize)


def _reader(entry: Tuple[Any, ...], share: Tuple[int, int], who: str):
    """A ``read(i, n)`` of elements of ``entry``'s tensor in its file dtype, from this
    rank's store object or memory, checked to hold ``share``; None when nothing to read."""
    k, v, file_dtype, _store, _n = entry
    kind, handle = where(v)
    if kind == "offloaded":
        key, ob, oe, src_dtype = handle.value_slice(v)
        store = handle.store
    else:
        key, ob, oe, src_dtype, store = None, 0, v.numel(), v.dtype, None
    b, e = share
    if e <= b:
        return None
    if not (ob <= b and e <= oe):
        raise ValueError(f"{who}: tensor {k!r}: this rank holds elements [{ob}, {oe}) but is "
                         f"to write [{b}, {e}) (comm is not the one its parameters are "
                         "partitioned over)")
    ssz = torch.empty((), dtype=src_dtype).element_size()
    if key is not None:
        def read(i: int, n: int) -> Any:
            raw = store.read_range(key, (i - ob) * ssz, n * ssz)
            if src_dtype == file_dtype:
                return raw
            t = torch.from_numpy(raw).view(src_dtype).to(file_dtype)
            return t.view(torch.uint8).numpy()
        return read
    flat = v.detach().reshape(-1)

    def read_memory(i: int, n: int) -> Any:
        t = flat[i:i + n]
        if t.device.type != "cpu":
            t = t.cpu()
        return t.to(file_dtype).contiguous().view(torch.uint8).numpy()
    return read_memory


def write_from_ranks(directory: str, names: List[str], shards: List[List[Tuple[Any, ...]]],
                     metadata: Dict[str, str], comm: Any, piece_bytes: Any, durable: bool,
                     fields: Dict[str, Any], finish: Callable[[], None],
                     who: str = "save_safetensors") -> int:
    """Writes ``shards`` (lists of _save._sources entries) as the files ``names`` in
    ``directory`` from every rank of ``comm``, renamed into place by rank 0 when every
    rank succeeded, then ``finish()`` run on rank 0 (the index, an earlier save's files
    removed); every rank returns once it is done. ``fields``: the arguments every rank
    must agree on (besides the layout). Returns the tensor bytes this rank wrote.

    :raises ValueError: ranks disagree (agree()); a rank's slices are not its share.
    :raises RuntimeError: another rank failed (naming it); nothing renamed into place
        (or, when rank 0 failed in its renames or ``finish``, what it did stays).
    :raises OSError: this rank's write failed (the same)."""
    rank, size = comm.rank, comm.size
    layouts = []
    for shard in shards:
        tensors = [(t[0], ST_OF_TORCH[t[2]], list(t[1].shape), t[4]) for t in shard]
        layouts.append(header_of(tensors, metadata))
    agree(comm, who, dict(fields, files=names,
                          tensors=[[(t[0], str(t[2]), tuple(t[1].shape)) for t in s]
                                   for s in shards]))
    paths = [os.path.join(directory, n) for n in names]

    def create_all(tmps: List[str]) -> None:
        for tmp, (header, offsets) in zip(tmps, layouts):
            data = max((e for _b, e in offsets.values()), default=0)
            create(tmp, len(header) + data, [(header, 0)])

    def write_mine(tmps: List[str]) -> List[int]:
        written = 0
        for tmp, shard, (header, offsets) in zip(tmps, shards, layouts):
            starts = [len(header) + offsets[t[0]][0] for t in shard]
            written += sum(_write_own(tmp, shard, starts, rank, size, piece_bytes, durable,
                                      who)[0::2])
        return [written]
    return int(write_in_place(comm, who, paths, create_all, write_mine,
                              finish=lambda: finish(), durable=durable,
                              finishing="finishing the files (renames, index) on rank 0")[0])


def _write_own(tmp: str, entries: List[Tuple[Any, ...]], starts: List[int], rank: int,
               size: int, piece_bytes: Any, durable: bool, who: str) -> List[int]:
    """Writes this rank's elements ``partition_layout(numel, size)[rank]`` of each of
    ``entries`` (_save._sources entries) into the file ``tmp`` in place, tensor j's
    element i at ``starts[j] + i * itemsize``, then fsyncs it (``durable``). Returns
    [bytes written, CRC-32 of them] per entry, flattened (0, 0 for an empty share).
    :raises OSError: a write fails; ValueError: this rank does not hold its share."""
    out: List[int] = []
    fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for t, start in zip(entries, starts):
            share = tuple(partition_layout(t[1].numel(), size)[rank])
            read = _reader(t, share, who)
            if read is None:
                out += [0, 0]
                continue
            fsz = torch.empty((), dtype=t[2]).element_size()
            out += list(write_elements(fd, start, fsz, share[0], share[1],
                                       piece_elements(piece_bytes, fsz), read))
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    return out


def write_zip_from_ranks(path: str, layout: ZipLayout, entries: List[Tuple[Any, ...]],
                         comm: Any, piece_bytes: Any, durable: bool, fields: Dict[str, Any],
                         who: str = "save_torch_state_dict") -> int:
    """Writes the torch.save zip ``layout`` (its entries 2, 3, ..., one per storage, in
    place, holding ``entries``: _save._sources entries in storage order) as ``path`` from every
    rank of ``comm`` (None: this process alone): rank 0 writes the skeleton into
    ``path``.tmp, every rank its elements ``partition_layout(numel, size)[rank]`` of each
    storage in place (pieces of ``piece_bytes``; host memory one piece), each rank's
    bytes and CRC-32 per storage all-gathered, rank 0 patching each storage's CRC-32
    (:func:`combined_crc` of the ranks' in rank order) into the zip, then renaming it into
    place. ``fields``: what every rank must agree on besides the layout. Returns the
    tensor bytes this rank wrote.

    :raises ValueError: ranks disagree (agree()); a rank's slices are not its share.
    :raises RuntimeError: another rank failed (naming it); nothing renamed into place.
    :raises OSError: this rank's write failed (the same)."""
    rank, size = (0, 1) if comm is None else (comm.rank, comm.size)
    if comm is not None:
        agree(comm, who, dict(fields, layout=layout.skeleton(),
                              tensors=[(t[0], str(t[2]), tuple(t[1].shape)) for t in entries]))
    first = 2  # data.pkl, byteorder, then the storages

    def create_all(tmps: List[str]) -> None:
        create(tmps[0], layout.file_nbytes, layout.skeleton())

    def write_mine(tmps: List[str]) -> List[int]:
        starts = layout.data_offsets[first:first + len(entries)]
        out = _write_own(tmps[0], entries, starts, rank, size, piece_bytes, durable, who)
        return [sum(out[0::2])] + out[1::2]

    def seal(tmps: List[str], every: Any) -> None:
        fd = os.open(tmps[0], os.O_WRONLY | os.O_CLOEXEC)
        try:
            for j, t in enumerate(entries):
                ranges = partition_layout(t[1].numel(), size)
                fsz = torch.empty((), dtype=t[2]).element_size()
                layout.patch_crc(fd, combined_crc(every[:, 1 + j], ranges, fsz), first + j)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    return int(write_in_place(comm, who, [path], create_all, write_mine, seal,
                              durable=durable)[0])
