#!/usr/bin/env python3
"""strata's safetensors import and export against the real ``safetensors`` and
``transformers`` packages (issue 27's done-when; run by scripts/device-check.sh on the GPU
machine, which has both; runs on the CPU, nothing downloaded):

1. a GPT-2 small model is built from a ``transformers.GPT2Config`` (random initialisation,
   fixed seed) and saved by ``save_pretrained`` as sharded safetensors with its index;
2. strata imports it (``load_safetensors``) into another randomly initialised model whose
   parameters are offloaded to a strata store (``offload_parameters``), and exports it
   again (``save_safetensors``, the same ``max_shard_size``);
3. both folders are read by ``safetensors.torch.load_file``: the same names, dtypes, shapes
   and values (``torch.equal``); strata's export converted to bf16 reads back as
   ``Tensor.to(torch.bfloat16)`` of the same values; ``transformers``'
   ``from_pretrained`` loads strata's export (``local_files_only``) to the same state dict.

    PYTHONPATH=build/python python3 tests/bindings/torch_checkpoints/hf_interop_check.py \\
        --dir /var/tmp/hf_interop --json out.json [--layers 12]

Exit status 0 when everything matches, 1 otherwise. Without ``safetensors``,
``transformers``, torch or strata importable it prints "hf_interop: skipped: <why>" and exits
0 (``--json`` then holds {"skipped": why}).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(os.environ.get("STRATA_DIR", "/var/tmp"),
                                                  "hf_interop"))
    ap.add_argument("--layers", type=int, default=12, help="GPT-2 small: 12")
    ap.add_argument("--max-shard-size", default="200MB")
    ap.add_argument("--json", help="write the results to this file too")
    return ap.parse_args(argv)


def write_json(path, res):
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def load_folder(load_file, folder):
    """{name: tensor} of every *.safetensors in ``folder``, read by safetensors itself."""
    out = {}
    for p in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        for k, v in load_file(p).items():
            if k in out:
                raise AssertionError(f"{k!r} in two files of {folder}")
            out[k] = v
    return out


def differences(a, b, convert=None):
    """Names whose dtype, shape or values differ (``convert`` applied to a's tensors)."""
    bad = sorted(set(a) ^ set(b))
    for k in sorted(set(a) & set(b)):
        x = a[k] if convert is None else convert(a[k])
        if x.dtype != b[k].dtype or x.shape != b[k].shape or not torch_equal(x, b[k]):
            bad.append(k)
    return bad


def torch_equal(x, y):
    import torch
    return torch.equal(x, y)


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
        import safetensors.torch as sft
        import transformers
        import strata
        import strata.torch as st
    except Exception as e:  # noqa: BLE001 -- any import failure is a reason to skip
        why = f"{type(e).__name__}: {e}"
        print(f"hf_interop: skipped: {why}")
        write_json(args.json, {"skipped": why})
        return 0
    res = {"transformers": transformers.__version__, "torch": torch.__version__}
    shutil.rmtree(args.dir, ignore_errors=True)
    hf_dir, ours, ours16 = (os.path.join(args.dir, n) for n in ("hf", "strata", "strata_bf16"))
    cfg = transformers.GPT2Config(n_layer=args.layers)
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    ref.save_pretrained(hf_dir, safe_serialization=True, max_shard_size=args.max_shard_size)
    res["hf_files"] = sorted(os.listdir(hf_dir))
    torch.manual_seed(1)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    store = strata.Store.open(os.path.join(args.dir, "store"))
    h = st.offload_parameters(model, store, working_set="256MiB")
    t0 = time.perf_counter()
    keys = st.load_safetensors(model, hf_dir, strict=False)
    res["import_seconds"] = time.perf_counter() - t0
    res["missing_keys"], res["unexpected_keys"] = list(keys.missing_keys), list(keys.unexpected_keys)
    t0 = time.perf_counter()
    st.save_safetensors(model, ours, max_shard_size=args.max_shard_size)
    res["export_seconds"] = time.perf_counter() - t0
    st.save_safetensors(model, ours16, max_shard_size=args.max_shard_size, dtype=torch.bfloat16)
    res["strata_files"] = sorted(os.listdir(ours))
    theirs, mine = load_folder(sft.load_file, hf_dir), load_folder(sft.load_file, ours)
    res["tensors"] = len(theirs)
    res["bytes"] = sum(v.numel() * v.element_size() for v in theirs.values())
    res["round_trip_differences"] = differences(theirs, mine)
    res["bf16_differences"] = differences(
        theirs, load_folder(sft.load_file, ours16),
        lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)
    h.close()
    store.close()
    shutil.copy(os.path.join(hf_dir, "config.json"), ours)
    back = transformers.GPT2LMHeadModel.from_pretrained(ours, local_files_only=True)
    want = ref.state_dict()
    got = back.state_dict()
    res["from_pretrained_differences"] = [k for k in want if k not in got or
                                          not torch.equal(want[k], got[k])]
    # GPT-2's tied head (lm_head.weight = wte) is saved once, as save_pretrained saves it
    allowed = {"lm_head.weight"}
    res["unexplained_missing"] = [k for k in res["missing_keys"] if k not in allowed
                                  and not k.endswith((".attn.bias", ".attn.masked_bias"))]
    ok = not (res["round_trip_differences"] or res["bf16_differences"]
              or res["from_pretrained_differences"] or res["unexplained_missing"]
              or res["unexpected_keys"])
    res["ok"] = ok
    print(f"hf_interop: GPT-2 ({args.layers} layers) {res['tensors']} tensors, "
          f"{res['bytes'] / 1e6:.0f} MB: import {res['import_seconds']:.2f} s, export "
          f"{res['export_seconds']:.2f} s; {'OK' if ok else 'MISMATCH'}")
    for k in ("round_trip_differences", "bf16_differences", "from_pretrained_differences",
              "unexplained_missing", "unexpected_keys"):
        if res[k]:
            print(f"hf_interop: {k}: {res[k][:10]}")
    write_json(args.json, res)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
