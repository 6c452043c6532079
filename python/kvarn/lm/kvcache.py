"""The model's KV cache held by kvarnd: every K/V goes into the pool, attention reads it there.

A KvarndSequence is one sequence of one kvarnd session:
  * prefill: the prompt is looked up (CreateSequence adopts the longest cached prefix, whose
    K/V are read back dequantized instead of recomputed); the K/V of the rest are staged into
    the session's tail and committed, and the daemon seals every full tile (quantizes it).
  * decode: per layer, attention over everything committed is the fused kernel reading the pool
    in place (Session.attend), with its log-sum-exp, merged exactly with the step's own new
    token; after the last layer the token's K/V of every layer are appended.
So the model never keeps K/V of its own: what it attends to is what kvarnd holds.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .model import KV, ByteLM


def model_layout_flags(model: ByteLM, preset: str, capacity: str = "256MiB") -> List[str]:
    """kvarnd flags for a pool holding this model's K/V with `preset`."""
    c = model.cfg
    return [f"--model_id=kvarn-lm-{c.n_layers}x{c.n_kv_heads}x{c.head_dim}",
            f"--num_layers={c.n_layers}", f"--num_kv_heads={c.n_kv_heads}",
            f"--head_dim={c.head_dim}", f"--preset={preset}", "--sink_tokens=128",
            f"--capacity={capacity}", "--default_tail_slots=8", "--fp16_share=0.25"]


def check_layout(session, model: ByteLM) -> None:
    """Raises ValueError naming both when kvarnd's layout is not this model's."""
    lay, c = session.layout, model.cfg
    got = (lay.num_layers, lay.num_kv_heads, lay.head_dim)
    want = (c.n_layers, c.n_kv_heads, c.head_dim)
    if got != want:
        raise ValueError(f"kvarnd holds K/V of {got[0]} layers x {got[1]} kv-heads x {got[2]}; "
                         f"this model needs {want[0]} x {want[1]} x {want[2]}: start kvarnd "
                         f"with --num_layers={want[0]} --num_kv_heads={want[1]} "
                         f"--head_dim={want[2]}")


def stack_kv(kv: Sequence[KV]) -> Tuple[np.ndarray, np.ndarray]:
    """Per-layer [T, H, D] (or [H, D]) -> keys, values [T, L, H, D] float16, what append takes."""
    ks = [k if k.dim() == 3 else k.unsqueeze(0) for k, _ in kv]
    vs = [v if v.dim() == 3 else v.unsqueeze(0) for _, v in kv]
    k = torch.stack(ks, dim=1).to(torch.float16).contiguous().numpy()
    v = torch.stack(vs, dim=1).to(torch.float16).contiguous().numpy()
    return k, v


class KvarndSequence:
    """One sequence's KV cache in kvarnd (see the module docstring). Not thread-safe."""

    def __init__(self, session, model: ByteLM):
        self.session = session
        self.model = model
        self.seq: Optional[int] = None
        self.length = 0          # tokens committed
        self.cached_tokens = 0   # of the prompt, adopted from the prefix cache
        # Of the last decode step, per layer: the query, the attention output, the new K/V.
        self.last_queries: List[torch.Tensor] = []
        self.last_attention: List[torch.Tensor] = []
        self.last_kv: List[KV] = []

    def prefill(self, prompt: bytes) -> torch.Tensor:
        """Creates the sequence and fills it with the prompt; returns the last position's logits."""
        ids = list(prompt)
        self.seq, self.cached_tokens, _ = self.session.create_sequence(ids)
        past = None
        if self.cached_tokens:
            keys, values = self.session.dequantize(self.seq)  # [T, L, H, D] as the pool holds them
            past = [(torch.from_numpy(keys[:, l]), torch.from_numpy(values[:, l]))
                    for l in range(self.model.cfg.n_layers)]
        logits, kv = self.model.prefill(ids[self.cached_tokens:], past_kv=past)
        k, v = stack_kv(kv)
        self.session.append(self.seq, ids[self.cached_tokens:], k, v)
        self.length = len(ids)
        return logits[-1]

    def attend_fn(self, layer: int, q: torch.Tensor, k_new: torch.Tensor,
                  v_new: torch.Tensor) -> torch.Tensor:
        """The model's per-layer attention of a decode step (ByteLM.decode_step's attend_fn)."""
        if layer == 0:
            self.last_queries = [None] * self.model.cfg.n_layers
            self.last_attention = [None] * self.model.cfg.n_layers
        self.last_queries[layer] = q
        qn = q.float().contiguous().numpy()
        out, lse = self.session.attend(self.seq, layer, qn, return_lse=True)
        group = q.shape[0] // k_new.shape[0]
        kh = k_new.float().repeat_interleave(group, dim=0)  # the kv-head each query head reads
        vh = v_new.float().repeat_interleave(group, dim=0)
        s_new = (q.float() * kh).sum(-1) * self.model.cfg.softmax_scale
        lse_t = torch.from_numpy(lse)
        m = torch.maximum(lse_t, s_new)
        w, u = torch.exp(lse_t - m)[:, None], torch.exp(s_new - m)[:, None]
        merged = (w * torch.from_numpy(out) + u * vh) / (w + u)
        self.last_attention[layer] = merged
        return merged

    def step(self, token: int) -> torch.Tensor:
        """Decodes `token` at the next position; its K/V go into kvarnd. Returns the logits."""
        logits, kv = self.model.decode_step(token, self.length, self.attend_fn)
        self.last_kv = kv
        k, v = stack_kv(kv)
        self.session.append(self.seq, [int(token)], k, v)
        self.length += 1
        return logits

    def release(self) -> None:
        if self.seq is not None:
            self.session.release(self.seq)
            self.seq = None


def bytes_per_token(describe: dict) -> Tuple[float, float]:
    """(stored bytes per token in quantized tiles, fp16 bytes per token) for kvarnd's layout."""
    lay = describe["layout"]
    slots = int(lay["num_layers"]) * int(lay["num_kv_heads"])
    quant = int(describe["record_bytes"]) * slots / int(describe["tile_tokens"])
    fp16 = 2 * 2 * slots * int(lay["head_dim"])
    return quant, float(fp16)


def softmax_scale(model: ByteLM) -> float:
    return 1.0 / math.sqrt(model.cfg.head_dim)
