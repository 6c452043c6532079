"""Trains the byte-level model (model.py) on the perl-doc corpus (data.py) on a CPU.

    nice -n 19 python3 python/kvarn/lm/train.py --max-minutes 47   # the full run, docs/model.md
    python3 python/kvarn/lm/train.py --smoke             # a few steps, seconds

Deterministic given the seed, the thread count and the BLAS: batches are windows of
seq_len + 1 bytes at offsets drawn from numpy's PCG64 seeded with --seed, the weights are
initialised from torch.manual_seed(--seed). AdamW with linear warmup then cosine decay to
--min-lr, over --steps or, where it comes first, over --max-minutes of wall time (so a run on
a busy machine still ends with a decayed learning rate; schedule_progress). Progress (step,
loss, lr, tokens/s, elapsed, ETA) goes to stderr every --log-every steps.

At the end the weights are written as float16 (<out>/model.npz) with <out>/model.json (the
config, the exact command line, the corpus package/version/digest, the steps, wall times and
the held-out bits per byte); then the float16 weights are loaded back and the held-out split
is scored with them, so the reported figure is that of the shipped file. The last line on
stdout is "held-out bpb: X".

Runs as a script (no dependency on the kvarn extension module) or as `python3 -m
kvarn.lm.train`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
from torch.nn import functional as F

if __package__ in (None, ""):
    # Run as a file: import the sibling modules directly, so training does not need the
    # compiled kvarn package that python/kvarn/__init__.py imports.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import data as lm_data  # noqa: E402
    import model as lm_model  # noqa: E402
else:
    from . import data as lm_data
    from . import model as lm_model

LN2 = math.log(2.0)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def schedule_progress(steps_done: int, elapsed: float, args) -> float:
    """How far the run is through its decay phase, 0..1; the run ends at 1.

    Progress is the larger of the step fraction and, with --max-minutes, the time fraction.
    On an idle machine the steps finish first and the run is exactly reproducible from its
    seed; where other work slows it down, the time limit takes over and the learning rate
    still decays fully before the deadline, rather than the run being cut off mid-schedule.
    """
    by_steps = (steps_done - args.warmup) / max(1, args.steps - args.warmup)
    by_time = elapsed / (60.0 * args.max_minutes) if args.max_minutes > 0 else 0.0
    return min(1.0, max(0.0, by_steps, by_time))


def lr_at(step: int, progress: float, args) -> float:
    """Learning rate for 0-based `step`: linear warmup, then cosine from --lr to --min-lr."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, args) -> torch.optim.Optimizer:
    # No weight decay on norms' gains (1-D); matrices and embeddings decay.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def heldout_bits_per_byte(model: lm_model.ByteLM, text: bytes, seq_len: int,
                          batch: int, max_bytes: int = 0) -> tuple:
    """Mean bits per predicted byte over `text` (its first max_bytes when > 0).

    The text is cut into consecutive blocks of seq_len bytes; block i is predicted from the
    byte before it (the last byte of block i - 1) and its own earlier bytes, so every byte
    but the first is predicted exactly once, with 1 to seq_len bytes of context. Returns
    (bpb, predicted byte count).
    """
    if max_bytes > 0:
        text = text[:max_bytes]
    arr = torch.tensor(np.frombuffer(text, dtype=np.uint8).astype(np.int64))
    n = arr.numel()
    starts = list(range(0, n - 1, seq_len))  # window [s, s + seq_len] predicts s+1..
    total_nats, total = 0.0, 0
    model.eval()
    for i in range(0, len(starts), batch):
        group = starts[i:i + batch]
        lengths = [min(seq_len, n - 1 - s) for s in group]
        width = max(lengths)
        x = torch.zeros(len(group), width, dtype=torch.long)
        y = torch.full((len(group), width), -100, dtype=torch.long)
        for j, (s, ln) in enumerate(zip(group, lengths)):
            x[j, :ln] = arr[s:s + ln]
            y[j, :ln] = arr[s + 1:s + 1 + ln]
        logits = model(x)
        total_nats += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                            ignore_index=-100, reduction="sum"))
        total += sum(lengths)
    return total_nats / total / LN2, total


def parse_args(argv):
    d = lm_model.ModelConfig()
    ap = argparse.ArgumentParser(description="Train the kvarn byte-level test model.")
    ap.add_argument("--out", help="output directory (default: the package's weights/; with "
                    "--smoke, a temporary directory removed at the end)")
    ap.add_argument("--smoke", action="store_true",
                    help="a handful of steps and a short evaluation, to check the script runs")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=2, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=d.max_seq_len, help="training context")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=2e-4)
    ap.add_argument("--warmup", type=int, default=40, help="linear warmup steps")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--max-minutes", type=float, default=0.0,
                    help="training time limit (0: none); the cosine decay runs over whichever "
                    "of --steps and this comes first (see schedule_progress)")
    ap.add_argument("--eval-batch", type=int, default=4)
    ap.add_argument("--eval-bytes", type=int, default=0,
                    help="score only the first N held-out bytes (0: all)")
    ap.add_argument("--d-model", type=int, default=d.d_model)
    ap.add_argument("--n-layers", type=int, default=d.n_layers)
    ap.add_argument("--n-q-heads", type=int, default=d.n_q_heads)
    ap.add_argument("--n-kv-heads", type=int, default=d.n_kv_heads)
    ap.add_argument("--head-dim", type=int, default=d.head_dim)
    ap.add_argument("--ffn-dim", type=int, default=d.ffn_dim)
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.batch, args.warmup, args.log_every = 3, 1, 1, 1
        args.eval_bytes = args.eval_bytes or 4 * args.seq_len
    args.out_is_temp = args.out is None and args.smoke
    if args.out is None:
        args.out = (tempfile.mkdtemp(prefix="kvarn-lm-smoke-") if args.smoke
                    else lm_model.WEIGHTS_DIR)
    if args.warmup >= args.steps:
        args.warmup = max(1, args.steps // 10)
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join([os.path.basename(sys.executable), sys.argv[0]] + list(argv))
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.Generator(np.random.PCG64(args.seed))

    try:
        corpus = lm_data.load_corpus()
    except lm_data.CorpusError as e:
        log(f"error: {e}")
        return 1
    info = corpus.describe()
    log(f"data: {info['package']} {info['version']}, {info['num_files']} files, "
        f"train {info['train_bytes']} bytes, held-out {info['heldout_bytes']} bytes")
    train = np.frombuffer(corpus.train, dtype=np.uint8)

    cfg = lm_model.ModelConfig(d_model=args.d_model, n_layers=args.n_layers,
                               n_q_heads=args.n_q_heads, n_kv_heads=args.n_kv_heads,
                               head_dim=args.head_dim, ffn_dim=args.ffn_dim,
                               max_seq_len=args.seq_len)
    model = lm_model.ByteLM(cfg)
    n_params = lm_model.count_parameters(model)
    log(f"model: {json.dumps(cfg.to_dict(), sort_keys=True)}, {n_params} parameters "
        f"({2 * n_params / 1e6:.2f} MB at fp16)")
    opt = make_optimizer(model, args)

    tokens_per_step = args.batch * args.seq_len
    log(f"train: {args.steps} steps x {args.batch} x {args.seq_len} = "
        f"{args.steps * tokens_per_step} tokens, {args.threads} threads")
    model.train()
    t0 = time.time()
    ema = None
    steps_done = 0
    progress = 0.0
    while steps_done < args.steps and progress < 1.0:
        step = steps_done
        lr = lr_at(step, progress, args)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = rng.integers(0, train.size - args.seq_len - 1, size=args.batch)
        window = np.stack([train[s:s + args.seq_len + 1] for s in starts]).astype(np.int64)
        window = torch.from_numpy(window)
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        steps_done = step + 1
        value = float(loss)
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        elapsed = time.time() - t0
        progress = schedule_progress(steps_done, elapsed, args) if steps_done > args.warmup else 0.0
        if steps_done % args.log_every == 0 or steps_done == args.steps or progress >= 1.0:
            rate = steps_done * tokens_per_step / elapsed
            eta = elapsed / steps_done * (args.steps - steps_done)
            if args.max_minutes > 0:
                eta = min(eta, max(0.0, 60.0 * args.max_minutes - elapsed))
            log(f"step {steps_done:5d}/{args.steps}  loss {value:.4f}  "
                f"(avg {ema:.4f} = {ema / LN2:.3f} bpb)  lr {lr:.2e}  {rate:.0f} tok/s  "
                f"elapsed {fmt_duration(elapsed)}  eta {fmt_duration(eta)}")
    time_limited = steps_done < args.steps
    if time_limited:
        log(f"--max-minutes {args.max_minutes} reached at step {steps_done} of {args.steps}; "
            f"the schedule had decayed fully")
    train_seconds = time.time() - t0

    meta = {
        "command": command,
        "data": info,
        "steps": steps_done,
        "steps_planned": args.steps,
        "max_minutes": args.max_minutes,
        "schedule_ended_by": "time" if time_limited else "steps",
        "batch": args.batch,
        "seq_len": args.seq_len,
        "tokens_seen": steps_done * tokens_per_step,
        "optimizer": {"name": "AdamW", "lr": args.lr, "min_lr": args.min_lr,
                      "warmup": args.warmup,
                      "schedule": "linear warmup, cosine decay over max(step, time) progress",
                      "betas": [0.9, 0.95], "weight_decay": args.weight_decay,
                      "grad_clip": args.grad_clip},
        "seed": args.seed,
        "threads": args.threads,
        "torch": torch.__version__,
        "parameters": n_params,
        "final_train_loss_avg_nats": ema,
        "train_wall_seconds": round(train_seconds, 1),
        "smoke": args.smoke,
    }
    lm_model.save_weights(model, args.out, meta)

    # Score the file as shipped: float16 weights, upcast to float32.
    t1 = time.time()
    shipped, _ = lm_model.load_weights(args.out)
    bpb, scored = heldout_bits_per_byte(shipped, corpus.heldout, args.seq_len, args.eval_batch,
                                        args.eval_bytes)
    eval_seconds = time.time() - t1
    prompt = b"=head1 NAME\n\n"
    sample = shipped.generate(prompt, 8 if args.smoke else 160)
    meta.update({
        "heldout_bpb": round(bpb, 4),
        "heldout_bytes_scored": scored,
        "eval_wall_seconds": round(eval_seconds, 1),
        "greedy_sample": {"prompt": prompt.decode(), "output": sample.decode("utf-8",
                                                                            "replace")},
    })
    npz_path, json_path = lm_model.save_weights(shipped, args.out, meta)
    log(f"wrote {npz_path} ({os.path.getsize(npz_path)} bytes) and {json_path}; "
        f"train {fmt_duration(train_seconds)}, eval {fmt_duration(eval_seconds)}")
    log(f"greedy sample: {prompt + sample!r}")
    if args.out_is_temp:
        shutil.rmtree(args.out)
    print(f"held-out bpb: {bpb:.4f} ({scored} bytes, {steps_done} steps, "
          f"train wall {fmt_duration(train_seconds)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
