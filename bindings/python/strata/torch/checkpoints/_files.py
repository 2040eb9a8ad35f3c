"""The files of a safetensors checkpoint: one ``model.safetensors``, or shards
``model-0000k-of-0000n.safetensors`` named by ``model.safetensors.index.json``
(``{"metadata": {"total_size": bytes}, "weight_map": {name: shard file}}``: the Hugging Face
layout of ``save_pretrained``), and Hugging Face's size strings (``max_shard_size="5GB"``).

Thread-safety: plain functions and values.
"""

from __future__ import annotations

import json
import os
import re
from typing import Dict, List, Optional, Tuple, Union

from ... import _strata

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def shard_name(k: int, n: int, stem: str = "model") -> str:
    """``model-00001-of-00003.safetensors`` (k counted from 1): transformers' names."""
    return f"{stem}-{k:05d}-of-{n:05d}.safetensors"


def parse_shard_size(size: Union[int, str]) -> int:
    """Bytes of a ``max_shard_size``: an int, or a string as transformers reads it
    (``convert_file_size_to_int``): "5GB" = 5 * 10**9, "5GiB" = 5 * 2**30, also KB/MB/KiB/MiB,
    "100B"; a trailing "b" (bits) divides by 8 as there.

    :raises ValueError: another value, or <= 0."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise ValueError(f"max_shard_size: {size!r} is not an int or a size string such as '5GB'")
    if isinstance(size, int):
        out = size
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?)?(B|b)?\s*", size, re.IGNORECASE)
        if not m:
            raise ValueError(f"max_shard_size: cannot read {size!r} (e.g. '5GB', '500MiB', 1000000)")
        unit = (m.group(2) or "").upper()
        base = 1024 if unit.endswith("I") else 1000
        power = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[:1]]
        out = int(float(m.group(1)) * base ** power)
        if m.group(3) == "b" and unit:  # transformers: "5Gb" is gigabits
            out //= 8
    if out <= 0:
        raise ValueError(f"max_shard_size: {size!r} must be > 0 bytes")
    return out


def resolve(path: Union[str, "os.PathLike[str]"]) -> Tuple[List[str], Optional[Dict[str, str]], str]:
    """The shard files of checkpoint ``path``: a ``.safetensors`` file, an index
    ``*.index.json``, or a directory holding ``model.safetensors.index.json`` or
    ``model.safetensors``. Returns (shard paths in index order, weight_map or None, the
    path named in errors).

    :raises FileNotFoundError: nothing of the kind at ``path``; a shard the index names is
        missing (naming the index and the shard).
    :raises ValueError: an index that is not valid JSON or lacks an object "weight_map" of
        string values, or names a shard outside its directory."""
    path = os.fspath(path)
    if os.path.isdir(path):
        for name in (INDEX, SINGLE):
            if os.path.exists(os.path.join(path, name)):
                return resolve(os.path.join(path, name))
        raise FileNotFoundError(f"no {INDEX} or {SINGLE} in the directory {path!r}")
    if not path.endswith(".json"):
        if not os.path.exists(path):
            raise FileNotFoundError(f"safetensors file {path!r} does not exist")
        return [path], None, path
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"safetensors index {path!r} does not exist") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"safetensors index {path!r} is not valid JSON: {e}") from None
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise ValueError(f"safetensors index {path!r}: no \"weight_map\" object of "
                         "tensor name -> shard file name")
    folder = os.path.dirname(path)
    shards: List[str] = []
    for name, shard in wm.items():
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            raise ValueError(f"safetensors index {path!r}: tensor {name!r} names the shard "
                             f"{shard!r}, not a file name in the index's directory")
        full = os.path.join(folder, shard)
        if full not in shards:
            if not os.path.exists(full):
                raise FileNotFoundError(f"safetensors index {path!r}: shard {shard!r} (of tensor "
                                        f"{name!r}) is missing from {folder or '.'!r}")
            shards.append(full)
    return shards, wm, path


def open_shards(shards: List[str], weight_map: Optional[Dict[str, str]], where: str):
    """Opens every shard (parsing its header: DataLossError naming the file and byte offset
    on a malformed one) and maps each tensor name to (reader, index in the reader's tensors,
    dtype, shape).

    :raises ValueError: a name in two shards; a name the index maps to a shard whose header
        lacks it (naming the index, shard and tensor)."""
    readers = [_strata._SafetensorsReader(p) for p in shards]
    found: Dict[str, Tuple[object, int, str, Tuple[int, ...]]] = {}
    for r in readers:
        for i, (name, dtype, shape, _b, _e) in enumerate(r.tensors):
            if name in found:
                raise ValueError(f"tensor {name!r} is in two shards: {found[name][0].path!r} "
                                 f"and {r.path!r}")
            found[name] = (r, i, dtype, tuple(shape))
    if weight_map is not None:
        by_path = {os.path.basename(r.path): r for r in readers}
        for name, shard in weight_map.items():
            if name not in found or found[name][0] is not by_path[shard]:
                raise ValueError(f"safetensors index {where!r} maps tensor {name!r} to shard "
                                 f"{shard!r}, whose header lacks it")
    return readers, found


def write_index(directory: str, weight_map: Dict[str, str], total_size: int,
                durable: bool = True) -> str:
    """Writes ``model.safetensors.index.json`` as transformers does (``indent=2``, sorted
    keys, a final newline), durably (a temporary file, fsync, rename, fsync of the
    directory). Returns its path."""
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    path = os.path.join(directory, INDEX)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path
