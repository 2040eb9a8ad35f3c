"""A small safetensors writer and reader written from the format's specification
(github.com/huggingface/safetensors, README "Format"), independent of strata's C++ code:
8 bytes little-endian u64 N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets"},
"__metadata__": {...}}`` (offsets relative to the byte after the header), then the data.
The tests check strata against it in both directions.
"""
import json
import struct

import numpy as np
import torch

NP_OF = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
         "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
         "BF16": np.int16}
ST_OF_TORCH = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
               torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
               torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def tensor_bytes(t):
    """The tensor's bytes, row-major (bf16 as its bits)."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write(path, tensors, metadata=None, pad=8):
    """Writes ``tensors`` ({name: torch tensor}, in the given order) and returns the file's
    bytes; the JSON is padded with spaces to a multiple of ``pad`` as the reference writer
    does (8)."""
    header, blobs, pos = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": ST_OF_TORCH[t.dtype], "shape": list(t.shape),
                        "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % pad)
    data = struct.pack("<Q", len(text)) + text + b"".join(blobs)
    with open(path, "wb") as f:
        f.write(data)
    return data


def read(path):
    """(metadata, {name: torch tensor}) of a safetensors file, checking the format's rules:
    N within the file, the header a JSON object, offsets in the data, the tensors covering
    it without holes or overlaps, each numel x dtype size bytes."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    assert isinstance(header, dict)
    meta = header.pop("__metadata__", None)
    body = data[8 + n:]
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    pos = 0
    for b, e, k in spans:
        assert b == pos, (k, b, pos)
        pos = e
    assert pos == len(body)
    out = {}
    for k, v in header.items():
        b, e = v["data_offsets"]
        arr = np.frombuffer(body[b:e], dtype=NP_OF[v["dtype"]]).reshape(v["shape"])
        assert arr.nbytes == e - b
        t = torch.from_numpy(arr.copy())
        if v["dtype"] == "BF16":
            t = t.view(torch.bfloat16)
        out[k] = t
    return meta, out, 8 + n


def image(header_json, data=b""):
    """A file image of a literal header text (for malformed headers)."""
    b = header_json.encode()
    return struct.pack("<Q", len(b)) + b + data
