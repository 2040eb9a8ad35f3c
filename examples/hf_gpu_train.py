#!/usr/bin/env python3
"""A Hugging Face transformers model trained on the GPU with strata.torch.OffloadAdamW, beside
torch.optim.AdamW: the same model, the same batches, the same hyperparameters.

The model is built from a config (GPT-2 small by default, or a Llama-style one: --model
llama), randomly initialised (torch.manual_seed): nothing is downloaded. The data is real
text that every Python installation has: the bytes of the standard library's .py files, one
token per byte. Both runs start from the same weights (a deep copy) and see the same
batches:

  1. torch.optim.AdamW with its state in GPU memory (the reference);
  2. strata.torch.OffloadAdamW with the fp32 masters and both moments in a strata store
     (--tier nvme under --dir by default): each step copies the gradients to pinned host
     memory, updates on the CPU with the state streamed from the store, and copies the
     updated weights back.

It prints each step's loss and time, then for both runs: the final loss (mean over held-out
batches, eval mode), samples/s over the steps after the first, and peak GPU memory.

    PYTHONPATH=build/python python3 examples/hf_gpu_train.py              # GPT-2 small
    ... --model llama --steps 20 --batch 8 --seq 512 --dir /nvme/strata --json out.json

Exit status 0 when the final losses agree within --loss-tolerance (relative) and both fell;
1 otherwise. Without transformers, without CUDA (unless --device cpu) or with a strata that
cannot be imported, it prints why and exits 0 (--json then holds {"skipped": why}).
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import shutil
import sys
import sysconfig
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257, help="vocabulary size of the config")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-batches", type=int, default=2)
    ap.add_argument("--tier", choices=["nvme", "host"], default="nvme")
    ap.add_argument("--arithmetic", choices=["simd", "torch"], default="simd")
    ap.add_argument("--dir", default=os.path.join(os.environ.get("STRATA_DIR", "/var/tmp"),
                                                  "hf_gpu_train"))
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run)")
    ap.add_argument("--loss-tolerance", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results to this file too")
    return ap.parse_args(argv)


def write_json(path, res):
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def skip(args, why):
    print(f"hf_gpu_train: skipped: {why}")
    write_json(args.json, {"skipped": why})
    return 0


# ---- data ----------------------------------------------------------------------------------

def corpus_tokens(torch, max_bytes=8 << 20):
    """The standard library's .py files (sorted), as a uint8 tensor of byte tokens."""
    root = sysconfig.get_paths()["stdlib"]
    parts, total = [], 0
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        if "site-packages" in path or "dist-packages" in path:
            continue
        try:
            with open(path, "rb") as f:
                b = f.read()
        except OSError:
            continue
        parts.append(b)
        total += len(b)
        if total >= max_bytes:
            break
    data = b"".join(parts)
    if len(data) < 1 << 20:  # no sources here: random bytes still train the plumbing
        g = torch.Generator().manual_seed(0)
        return torch.randint(0, 256, (1 << 22,), generator=g, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def make_batches(torch, tokens, n, batch, seq, seed):
    """`n` batches of `batch` windows of `seq` tokens from random offsets (fixed seed)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        starts = torch.randint(0, tokens.numel() - seq - 1, (batch,), generator=g)
        out.append(torch.stack([tokens[s:s + seq] for s in starts.tolist()]).long())
    return out


# ---- model ---------------------------------------------------------------------------------

def build_model(transformers, args):
    if args.model == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=args.vocab, n_positions=max(1024, args.seq),
                                      n_embd=args.d_model, n_layer=args.layers,
                                      n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.d_model,
                                       intermediate_size=int(args.d_model * 8 / 3 + 127) // 128 * 128,
                                       num_hidden_layers=args.layers,
                                       num_attention_heads=args.heads,
                                       num_key_value_heads=args.heads,
                                       max_position_embeddings=max(1024, args.seq))
        model = transformers.LlamaForCausalLM(cfg)
    model.config.use_cache = False
    return model


def run(torch, model, opt, batches, eval_batches, device, label):
    """Trains on `batches`; returns the per-step losses, the seconds of steps 2.., the final
    held-out loss and the peak GPU memory."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    model.train()
    losses, t_first = [], None
    t0 = time.perf_counter()
    for i, x in enumerate(batches):
        x = x.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())  # synchronizes
        now = time.perf_counter()
        if i == 0:
            t_first = now
        print(f"  [{label}] step {i + 1:3d}  loss {losses[-1]:.5f}  {now - t0:7.2f} s", flush=True)
    timed = time.perf_counter() - t_first if len(batches) > 1 else float("nan")
    model.eval()
    with torch.no_grad():
        ev = [model(input_ids=x.to(device), labels=x.to(device)).loss.item() for x in eval_batches]
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    return losses, timed, sum(ev) / len(ev), peak


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        return skip(args, "torch is not installed")
    try:
        import transformers
    except ImportError:
        return skip(args, "transformers is not installed")
    if args.device == "cuda" and not torch.cuda.is_available():
        return skip(args, "no CUDA device (torch.cuda.is_available() is False)")
    try:
        import strata
        import strata.torch as strata_torch
    except ImportError as e:
        return skip(args, f"cannot import strata ({e}): put <build>/python on PYTHONPATH")
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 matmuls: both runs comparable
    torch.backends.cudnn.allow_tf32 = False

    tokens = corpus_tokens(torch)
    tokens = tokens % args.vocab if args.vocab < 256 else tokens
    train = make_batches(torch, tokens, args.steps, args.batch, args.seq, args.seed + 1)
    held = make_batches(torch, tokens, args.eval_batches, args.batch, args.seq, args.seed + 2)

    torch.manual_seed(args.seed)
    ref = build_model(transformers, args).to(device)
    ours = copy.deepcopy(ref)
    nparams = sum(p.numel() for p in ref.parameters())
    print(f"hf_gpu_train: {args.model} ({args.layers} layers, d_model {args.d_model}, "
          f"{nparams / 1e6:.1f} M parameters) on {device}"
          f"{' (' + torch.cuda.get_device_name(0) + ')' if device.type == 'cuda' else ''}; "
          f"transformers {transformers.__version__}, torch {torch.__version__}; "
          f"{args.steps} steps of {args.batch} x {args.seq} tokens")
    hp = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=args.weight_decay)

    print("torch.optim.AdamW:")
    t_opt = torch.optim.AdamW(ref.parameters(), **hp)
    l_t, s_t, f_t, m_t = run(torch, ref, t_opt, train, held, device, "torch")
    ref.zero_grad(set_to_none=True)  # its gradients and state out of the second run's peak
    del t_opt

    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir, exist_ok=True)
    print(f"strata.torch.OffloadAdamW (tier {args.tier}, {args.dir}):")
    s_opt = strata_torch.OffloadAdamW(ours.parameters(), path=os.path.join(args.dir, "store"),
                                      tier=args.tier, arithmetic=args.arithmetic, **hp)
    try:
        l_s, s_s, f_s, m_s = run(torch, ours, s_opt, train, held, device, "strata")
        moved = dict(s_opt.bytes_moved)
    finally:
        s_opt.close()
        shutil.rmtree(args.dir, ignore_errors=True)

    timed_samples = args.batch * (args.steps - 1)
    rel = abs(f_s - f_t) / max(abs(f_t), 1e-12)
    res = {
        "model": args.model, "parameters": nparams, "device": str(device),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "transformers": transformers.__version__, "torch": torch.__version__,
        "steps": args.steps, "batch": args.batch, "seq": args.seq, "tier": args.tier,
        "arithmetic": args.arithmetic,
        "losses_torch": l_t, "losses_strata": l_s,
        "final_loss_torch": f_t, "final_loss_strata": f_s, "loss_rel_diff": rel,
        "samples_per_s_torch": timed_samples / s_t, "samples_per_s_strata": timed_samples / s_s,
        "peak_gpu_bytes_torch": m_t, "peak_gpu_bytes_strata": m_s,
        "strata_bytes_moved": moved,
    }
    ok = rel <= args.loss_tolerance and l_t[-1] < l_t[0] and l_s[-1] < l_s[0]
    res["ok"] = ok
    write_json(args.json, res)
    gib = 1 << 30
    print(f"final held-out loss: strata {f_s:.5f}, torch {f_t:.5f} (relative difference "
          f"{rel:.2e}, tolerance {args.loss_tolerance:g})")
    print(f"samples/s (steps 2..{args.steps}): strata {res['samples_per_s_strata']:.2f}, "
          f"torch {res['samples_per_s_torch']:.2f}")
    if device.type == "cuda":
        print(f"peak GPU memory: strata {m_s / gib:.2f} GiB, torch {m_t / gib:.2f} GiB")
    print("OK" if ok else "MISMATCH (or a loss that did not fall)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
