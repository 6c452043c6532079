"""python3 -m kvarn.lm eval: what KV quantization costs during decoding, preset by preset.

The protocol (after the KVarN paper): prefill held-out text, then decode it teacher-forced for
N steps, with the K/V going through kvarnd's pool exactly as in the demo. Against the same
model with an fp16 KV cache in-process, on the same bytes:
  bits_per_byte, delta_bpb     next-byte loss of the quantized run, and its excess over fp16 KV
  kl_bits                      mean KL(p_fp16 || p_quantized) of the next-byte distributions
  top1_agreement               share of steps where both predict the same next byte
  window_error_static          per window of 128 decode steps, the attention output's relative
                               L2 error against attention over the run's own unquantized K/V
                               (this step's quantization error alone)
  window_error_accumulated     the same against the fp16-KV run's attention output (what the
                               quantized history has done to the activations so far)
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from . import kvcache, model as lm_model

WINDOW = 128
DEFAULT_PRESETS = ["fp16", "kvarn_k4v2_g128", "kvarn_k4v4_g128", "kvarn_k2v2_g128",
                   "hadamard_k4v2_g128", "kivi_k4v2_g128"]


class Progress:
    """One line on stderr, redrawn: done/total, rate and what runs."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.t0 = time.perf_counter()

    def tick(self, what: str, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.done < self.total and now - getattr(self, "_drawn", 0.0) < 0.25:
            return  # at most four redraws a second
        self._drawn = now
        el = now - self.t0
        rate = self.done / el if el > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        bar = "#" * int(30 * self.done / max(1, self.total))
        self.stream.write(f"\r[{bar:<30}] {self.done}/{self.total} steps {rate:.0f}/s "
                          f"eta {eta:.0f}s  {what:<24}")
        self.stream.flush()

    def end(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm(a - b) / max(float(torch.linalg.norm(b)), 1e-30))


def reference_run(model, text: bytes, prefill: int, steps: int, progress: Progress):
    """The fp16-KV run: per decode step, the log-probabilities and every layer's attention."""
    cache = lm_model.Fp16KVCache(model.cfg)
    _, kv = model.prefill(list(text[:prefill]))
    cache.extend(kv)
    logp, attn = [], []
    for i in range(steps):
        outs = [None] * model.cfg.n_layers

        def fn(layer, q, k, v, outs=outs):
            outs[layer] = cache.attend_fn(layer, q, k, v)
            return outs[layer]
        logits, _ = model.decode_step(text[prefill + i], prefill + i, fn)
        logp.append(torch.log_softmax(logits.double(), -1))
        attn.append(outs)
        progress.tick("fp16 KV (in-process)")
    return logp, attn


def quantized_run(model, session, text: bytes, prefill: int, steps: int, progress: Progress,
                  preset: str):
    """The kvarnd run, and attention over the run's own unquantized K/V at every step."""
    seq = kvcache.KvarndSequence(session, model)
    # The prefill's own K/V, unquantized, start the run's exact history.
    _, kv = model.prefill(list(text[:prefill]))
    hist = [[k.clone(), v.clone()] for k, v in kv]
    seq.prefill(text[:prefill])
    logp, attn, static = [], [], []
    for i in range(steps):
        logits = seq.step(text[prefill + i])
        for layer, (kn, vn) in enumerate(seq.last_kv):
            hist[layer][0] = torch.cat((hist[layer][0], kn.unsqueeze(0)))
            hist[layer][1] = torch.cat((hist[layer][1], vn.unsqueeze(0)))
        # The same queries over the run's own unquantized K/V: this step's error alone.
        static.append([_rel(seq.last_attention[l], lm_model.gqa_attention(
            seq.last_queries[l], hist[l][0], hist[l][1])) for l in range(model.cfg.n_layers)])
        logp.append(torch.log_softmax(logits.double(), -1))
        attn.append(list(seq.last_attention))
        progress.tick(preset)
    seq.release()
    return logp, attn, static


def summarize(preset, text, prefill, steps, ref, run) -> dict:
    ref_logp, ref_attn = ref
    logp, attn, static = run
    targets = [text[prefill + i + 1] for i in range(steps)]
    nll = [-float(lp[t]) / math.log(2) for lp, t in zip(logp, targets)]
    ref_nll = [-float(lp[t]) / math.log(2) for lp, t in zip(ref_logp, targets)]
    kl = [float((torch.exp(r) * (r - q)).sum()) / math.log(2) for r, q in zip(ref_logp, logp)]
    top1 = [int(torch.argmax(r) == torch.argmax(q)) for r, q in zip(ref_logp, logp)]
    acc = [sum(_rel(a, b) for a, b in zip(step, ref_step)) / len(step)
           for step, ref_step in zip(attn, ref_attn)]
    stat = [sum(s) / len(s) for s in static]
    windows = range(0, steps, WINDOW)
    return {
        "preset": preset, "prefill_tokens": prefill, "decode_steps": steps,
        "bits_per_byte": sum(nll) / steps, "fp16_bits_per_byte": sum(ref_nll) / steps,
        "delta_bpb": (sum(nll) - sum(ref_nll)) / steps, "kl_bits": sum(kl) / steps,
        "top1_agreement": sum(top1) / steps,
        "window_error_static": [sum(stat[w:w + WINDOW]) / len(stat[w:w + WINDOW]) for w in windows],
        "window_error_accumulated": [sum(acc[w:w + WINDOW]) / len(acc[w:w + WINDOW]) for w in windows],
    }


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--preset", action="append", dest="presets",
                    help=f"a kvarnd preset (repeatable; default: {' '.join(DEFAULT_PRESETS)})")
    ap.add_argument("--prefill", type=int, default=512, help="held-out bytes prefilled (default 512)")
    ap.add_argument("--decode", type=int, default=384,
                    help="teacher-forced decode steps (default 384: three windows of 128)")
    ap.add_argument("--offset", type=int, default=0, help="where in the held-out text to start")
