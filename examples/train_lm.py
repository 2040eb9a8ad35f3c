#!/usr/bin/python3
"""Trains a small GPT-style character-level language model with its optimizer state on NVMe.

The corpus is real text present on every Debian machine: the Python standard library's
source files under /usr/lib/python3.X. The model (token + position embeddings, pre-LayerNorm
transformer blocks with causal self-attention and a GELU MLP, tied output head) is trained
twice from the same seed on the same batches:

  1. with strata.torch.OffloadAdamW: fp32 master weights and Adam moments in a strata store
     (nvme tier by default, under --dir), each step streamed through pinned buffers with
     reads, updates and writes overlapped (--arithmetic torch, the default, rounds each
     update exactly like torch.optim; --arithmetic simd uses the vectorized kernels);
  2. with torch.optim.AdamW (everything in DRAM), the reference.

Both runs use the same training loop, clipping by hand with
torch.nn.utils.clip_grad_norm_(model.parameters(), --max-grad-norm). strata's optimizer runs
with overlap_backward=True (each parameter's update starts during backward, bit-identical to
the step after it; a step the clipping rescales is redone after backward; --no-overlap turns
it off). --clip-in-step has strata clip inside its step instead (max_grad_norm=: the rule of
clip_grad_norm_ over the optimizer's parameters in param_groups order, which the torch run
then clips over). Either way the two runs are bit-identical.

It prints the loss, tokens/s and the bytes moved per tier at every step of run 1, then both
final losses (mean over a fixed held-out set) and the largest absolute difference between
the two models' parameters.

    PYTHONPATH=build/python /usr/bin/python3 examples/train_lm.py            # defaults
    ... --layers 6 --d-model 384 --steps 2000 --dir /nvme/strata --tier nvme

Exit status 0 when the two runs agree (final losses within --loss-tolerance relative, max
parameter difference <= --param-tolerance) and, in a run of at least LOSS_CHECK_STEPS (100)
steps, the held-out loss fell below 0.8 x the first step's loss; 1 otherwise. Shorter runs
(e.g. --steps 10, mostly warm-up) are checked against torch only.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import shutil
import sys
import sysconfig
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import strata
import strata.torch as strata_torch


# ---- data ----------------------------------------------------------------------------------

def load_corpus(root: str, max_bytes: int) -> str:
    """Concatenates the .py files under `root` (sorted, so the corpus is the same on every
    run) up to `max_bytes` characters; non-ASCII characters are dropped (char vocabulary)."""
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    files = [f for f in files if "site-packages" not in f and "dist-packages" not in f]
    parts, total = [], 0
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="ignore") as f:
                text = f.read()
        except OSError:
            continue
        text = text.encode("ascii", "ignore").decode("ascii")
        parts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    if total == 0:
        sys.exit(f"no Python sources found under {root}")
    return "".join(parts)[:max_bytes]


class Batches:
    """Random windows of the training split; the generator makes both runs see the same."""

    def __init__(self, data: torch.Tensor, context: int, batch: int, seed: int):
        self.data, self.context, self.batch = data, context, batch
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):
        ix = torch.randint(len(self.data) - self.context - 1, (self.batch,), generator=self.gen)
        x = torch.stack([self.data[i:i + self.context] for i in ix.tolist()])
        y = torch.stack([self.data[i + 1:i + 1 + self.context] for i in ix.tolist()])
        return x, y


# ---- model ---------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, context: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        mask = torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, context: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, context) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))


@torch.no_grad()
def evaluate(model, batches, device):
    model.eval()
    losses = [loss_of(model, x.to(device), y.to(device)).item() for x, y in batches]
    model.train()
    return sum(losses) / len(losses)


# ---- training ------------------------------------------------------------------------------

def param_groups(model, weight_decay, named=False):
    """GPT-2 style: no weight decay on biases, LayerNorm weights and the position table.
    named: (name, parameter) pairs, which strata's optimizers record in the store's keys
    (torch 1.13's optimizers take plain parameters)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("pos") else no_decay).append(
            (name, p) if named else p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


#: the fewest steps after which the loss must have fallen clearly (to 0.8 x the first loss;
#: the default run of 150 steps falls from 4.5 to about 2.5)
LOSS_CHECK_STEPS = 100


def positive_int(text):
    """argparse type: an int >= 1."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def lr_at(step, args):
    """Linear warm-up then cosine decay to 10%."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(args, name, make_optimizer, train_data, val_batches, vocab, device, verbose):
    torch.manual_seed(args.seed)
    model = GPT(vocab, args.d_model, args.layers, args.heads, args.context).to(device)
    opt = make_optimizer(model)
    batches = Batches(train_data, args.context, args.batch, args.seed + 1)
    tokens = args.batch * args.context
    first_loss = None
    start = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        x, y = batches.next()
        loss = loss_of(model, x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.max_grad_norm > 0 and not args.clip_in_step:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        elif args.max_grad_norm > 0 and not isinstance(opt, strata_torch.OffloadAdamW):
            # strata clips inside step() (max_grad_norm=): clip_grad_norm_'s rule over the
            # optimizer's parameters in param_groups order
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]],
                                           args.max_grad_norm)
        opt.step()
        dt = time.perf_counter() - t0
        first_loss = loss.item() if first_loss is None else first_loss
        if verbose:
            line = f"[{name}] step {step + 1:4d}/{args.steps}  loss {loss.item():.4f}  " \
                   f"{tokens / dt:8.0f} tok/s"
            if isinstance(opt, strata_torch.OffloadAdamW):
                s = opt.last_step
                line += (f"  nvme read {strata.format_bytes(s['bytes_read'])}"
                         f" written {strata.format_bytes(s['bytes_written'])}"
                         f"  host grads {strata.format_bytes(opt._last_host_grads)}"
                         f" weights {strata.format_bytes(opt._last_host_weights)}"
                         f"  step {s['seconds'] * 1e3:.1f} ms")
            print(line, flush=True)
        elif (step + 1) % max(1, args.steps // 10) == 0:
            print(f"[{name}] step {step + 1:4d}/{args.steps}  loss {loss.item():.4f}",
                  flush=True)
    elapsed = time.perf_counter() - start
    final = evaluate(model, val_batches, device)
    return model, opt, first_loss, final, elapsed


class TrackedOffloadAdamW(strata_torch.OffloadAdamW):
    """OffloadAdamW that also remembers the host bytes of the last step (for printing)."""

    def step(self, closure=None):
        before = dict(self.bytes_moved)
        out = super().step(closure)
        self._last_host_grads = self.bytes_moved["host_grads_read"] - before["host_grads_read"]
        self._last_host_weights = (self.bytes_moved["host_weights_written"] -
                                   before["host_weights_written"])
        return out


def main():
    default_dir = os.path.join(strata.default_data_dir(), "train_lm")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=positive_int, default=150, help="training steps (default 150)")
    ap.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    ap.add_argument("--d-model", type=int, default=96, help="model width (default 96)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    ap.add_argument("--context", type=int, default=64, help="context length (default 64)")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    ap.add_argument("--warmup", type=int, default=15, help="warm-up steps (default 15)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-grad-norm", type=float, default=1.0,
                    help="clip gradients by global norm (0 = off; default 1.0)")
    ap.add_argument("--clip-in-step", action="store_true",
                    help="strata clips inside its step (max_grad_norm=) instead of the "
                         "training loop's clip_grad_norm_")
    ap.add_argument("--dir", default=default_dir,
                    help=f"directory of the strata store (default {default_dir}; "
                         "its previous contents are replaced)")
    ap.add_argument("--tier", default="nvme", choices=["nvme", "host", "auto"],
                    help="where masters and moments live (default nvme)")
    ap.add_argument("--host-budget", default="1GiB",
                    help="DRAM for host-resident state under --tier auto (default 1GiB)")
    ap.add_argument("--corpus", default=sysconfig.get_paths()["stdlib"],
                    help="directory of .py files (default: this Python's standard library)")
    ap.add_argument("--corpus-bytes", type=int, default=4 << 20,
                    help="characters of corpus to use (default 4 MiB)")
    ap.add_argument("--arithmetic", default="torch", choices=["torch", "simd"],
                    help="strata's Adam arithmetic: 'torch' rounds exactly like torch.optim "
                         "(bit-identical runs; default), 'simd' uses the vectorized kernels "
                         "(each step within 1-2 ulp per element; training amplifies that)")
    ap.add_argument("--no-overlap", action="store_true",
                    help="step after backward (default: overlap_backward=True, the step's "
                         "updates start during backward; results are identical)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="where the model runs (auto: a GPU when present)")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the torch.optim.AdamW reference run")
    ap.add_argument("--loss-tolerance", type=float, default=0.005,
                    help="max relative difference of the final losses (default 0.5%%)")
    ap.add_argument("--param-tolerance", type=float, default=1e-4,
                    help="max absolute parameter difference (default 1e-4)")
    args = ap.parse_args()

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" \
        else args.device

    text = load_corpus(args.corpus, args.corpus_bytes)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    val = Batches(val_data, args.context, args.batch, seed=12345)
    val_batches = [val.next() for _ in range(8)]
    probe = GPT(len(chars), args.d_model, args.layers, args.heads, args.context)
    n_params = sum(p.numel() for p in probe.parameters())
    del probe
    print(f"corpus: {len(text):,} characters of {args.corpus} (*.py), vocabulary {len(chars)}")
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, context "
          f"{args.context}: {n_params:,} parameters; device {device}, {threads} threads")
    print(f"optimizer state: {args.tier} tier in {args.dir} "
          f"({strata.format_bytes(n_params * 12)} of fp32 masters + Adam moments)")

    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir, exist_ok=True)
    store = strata.Store.open(args.dir, host_budget="64MiB", staging="64MiB",
                              chunk_size="4MiB")

    def make_strata(model):
        return TrackedOffloadAdamW(param_groups(model, args.weight_decay, named=True),
                                   lr=args.lr, betas=(0.9, 0.95), store=store, tier=args.tier,
                                   host_budget=args.host_budget, num_threads=threads,
                                   arithmetic=args.arithmetic,
                                   max_grad_norm=(max(args.max_grad_norm, 0.0)
                                                  if args.clip_in_step else 0.0),
                                   overlap_backward=not args.no_overlap)

    def make_torch(model):
        return torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr,
                                 betas=(0.9, 0.95))

    m1, o1, first1, final1, t1 = train(args, "strata", make_strata, train_data, val_batches,
                                       len(chars), device, verbose=True)
    tok = args.steps * args.batch * args.context
    bm = o1.bytes_moved
    print(f"\nstrata OffloadAdamW: {args.steps} steps in {t1:.1f} s ({tok / t1:,.0f} tok/s); "
          f"first loss {first1:.4f}, final held-out loss {final1:.4f}")
    print(f"bytes moved: nvme read {strata.format_bytes(bm['nvme_read'])}, nvme written "
          f"{strata.format_bytes(bm['nvme_written'])}; host gradients read "
          f"{strata.format_bytes(bm['host_grads_read'])}, host weights written "
          f"{strata.format_bytes(bm['host_weights_written'])}; device->host "
          f"{strata.format_bytes(bm['device_to_host'])}, host->device "
          f"{strata.format_bytes(bm['host_to_device'])}")
    o1.checkpoint()
    u = store.usage()
    print(f"store {args.dir}: {u['objects']} objects, nvme {strata.format_bytes(u['nvme_bytes'])}"
          f" (checkpointed; inspect with `strata store ls {args.dir}`)")
    ok = True
    if args.steps >= LOSS_CHECK_STEPS:
        ok = final1 < 0.8 * first1
        if not ok:
            print(f"FAIL: the loss did not fall clearly ({first1:.4f} -> {final1:.4f})")
    else:
        print(f"(the loss drop is checked from {LOSS_CHECK_STEPS} steps on; {args.steps} "
              f"steps: {'not checked' if args.no_reference else 'checked against torch only'})")
    if not args.no_reference:
        m2, _, first2, final2, t2 = train(args, "torch", make_torch, train_data, val_batches,
                                          len(chars), device, verbose=False)
        diff = max((a.detach().float() - b.detach().float()).abs().max().item()
                   for a, b in zip(m1.parameters(), m2.parameters()))
        rel = abs(final1 - final2) / abs(final2)
        print(f"\ntorch AdamW:        {args.steps} steps in {t2:.1f} s ({tok / t2:,.0f} tok/s); "
              f"first loss {first2:.4f}, final held-out loss {final2:.4f}")
        print(f"final losses: strata {final1:.6f}  torch {final2:.6f}  relative difference "
              f"{rel * 100:.4f}% (limit {args.loss_tolerance * 100:.2f}%)")
        print(f"max |parameter difference|: {diff:.3e} (limit {args.param_tolerance:.0e})")
        if rel > args.loss_tolerance or diff > args.param_tolerance:
            print("FAIL: the strata and torch runs disagree")
            ok = False
    o1.close()
    store.close()
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
