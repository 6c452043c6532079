"""A small byte-level decoder-only transformer whose K/V can live outside the model.

The model exists to give kvarnd real K/V to hold: its attention heads have the width real
models use (head_dim 128), it uses grouped-query attention and rotary position embeddings,
and it is trained on real text (see data.py and train.py, and docs/model.md). It is tiny
everywhere else so that it trains on a CPU in under an hour.

Three ways to run it:
  * forward(tokens)     batched training/evaluation pass, [B, T] -> logits [B, T, 256].
  * prefill(tokens)     one sequence, returns logits and every layer's K (after RoPE) and V,
                        so that an external cache can store them.
  * decode_step(token, position, attend_fn)
                        one new token; per layer, attention over the past is delegated to
                        attend_fn, which receives the query and this token's K/V and returns
                        the attention output. The caller's cache decides how K/V are stored
                        (fp16, KVarN-quantized, paged in shared memory, ...).
generate() is the reference path built from the last two with an in-process fp16 KV cache
(Fp16KVCache).

Conventions shared with any external cache:
  * K/V layout per token and layer: [num_kv_heads, head_dim]; a layer's cache for T tokens
    is [T, num_kv_heads, head_dim]. K is stored after RoPE, so cached keys never need the
    position again.
  * Query head h reads kv head h // (num_q_heads // num_kv_heads) (GQA grouping).
  * Softmax scale is 1/sqrt(head_dim) = 1/sqrt(128); scores are computed in float32.
  * Attention is causal: the token at position p attends to positions 0..p inclusive, so
    attend_fn must include the new token's own K/V.
gqa_attention() is the exact attention math; an external cache that dequantizes its K/V can
call it to stay consistent with the reference.

Computation is float32 on CPU; the shipped weights are float16 and are upcast on load.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

# Per-layer (k, v) pair; each [T, num_kv_heads, head_dim] (prefill) or
# [num_kv_heads, head_dim] (decode_step).
KV = Tuple[torch.Tensor, torch.Tensor]

# attend_fn(layer, q, k_new, v_new) -> out.
#   layer: layer index, 0-based.
#   q:     [num_q_heads, head_dim] float32, RoPE already applied.
#   k_new: [num_kv_heads, head_dim] float32, RoPE already applied.
#   v_new: [num_kv_heads, head_dim] float32.
#   out:   [num_q_heads, head_dim], causal attention over the layer's past K/V plus k_new/v_new.
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# Query block length of the batched causal attention (see Attention.attend_causal).
ATTN_BLOCK = 256

WEIGHTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256  # bytes
    d_model: int = 256
    n_layers: int = 4
    n_q_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 128
    ffn_dim: int = 768  # SwiGLU hidden width
    max_seq_len: int = 1024  # training context; RoPE itself has no hard limit
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.n_q_heads % self.n_kv_heads != 0:
            raise ValueError("n_q_heads must be a multiple of n_kv_heads")
        if self.head_dim % 2 != 0:
            raise ValueError("head_dim must be even for RoPE")

    @property
    def group_size(self) -> int:
        return self.n_q_heads // self.n_kv_heads

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(ModelConfig)}
        return ModelConfig(**{k: v for k, v in d.items() if k in names})


def rope_cos_sin(positions: torch.Tensor, head_dim: int,
                 theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [len(positions), head_dim // 2] for integer positions."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates pairs (x[..., i], x[..., i + head_dim/2]) ("half" layout).

    x: [..., T, H, head_dim]; cos, sin: [T, head_dim // 2].
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = cos[:, None, :]
    s = sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of one query position over T cached positions (all visible).

    q: [n_q_heads, head_dim]; k, v: [T, n_kv_heads, head_dim] (any float dtype; computed in
    float32). Returns [n_q_heads, head_dim] float32. This is the decode-time math of the model;
    external caches may call it on their (dequantized) K/V.
    """
    n_q, head_dim = q.shape
    n_kv = k.shape[1]
    group = n_q // n_kv
    qf = q.float().view(n_kv, group, head_dim)
    kf = k.float().permute(1, 2, 0)  # [n_kv, head_dim, T]
    vf = v.float().permute(1, 0, 2)  # [n_kv, T, head_dim]
    scores = torch.matmul(qf, kf) * (1.0 / math.sqrt(head_dim))  # [n_kv, group, T]
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, vf).reshape(n_q, head_dim)


class RMSNorm(nn.Module):

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wq = nn.Linear(cfg.d_model, cfg.n_q_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_q_heads * cfg.head_dim, cfg.d_model, bias=False)

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x: [..., T, d_model] -> q [..., T, Hq, D], k/v [..., T, Hkv, D], RoPE on q and k."""
        c = self.cfg
        lead = x.shape[:-1]
        q = self.wq(x).view(*lead, c.n_q_heads, c.head_dim)
        k = self.wk(x).view(*lead, c.n_kv_heads, c.head_dim)
        v = self.wv(x).view(*lead, c.n_kv_heads, c.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      past_len: int) -> torch.Tensor:
        """Causal attention for a run of new positions.

        q: [B, Tn, Hq, D] for positions past_len..past_len+Tn-1; k, v: [B, Tk, Hkv, D] with
        Tk = past_len + Tn. Returns [B, Tn, Hq * D]. Scores and softmax are float32 unless
        the caller runs under autocast (training does, in bfloat16).

        Queries go in blocks of ATTN_BLOCK positions; a block only multiplies against the keys
        it can see, which skips most of the masked upper triangle (about 40% of the attention
        FLOPs at T = 1024) without changing the result.
        """
        c = self.cfg
        b, tn = q.shape[0], q.shape[1]
        g = c.group_size
        # The G query heads sharing a kv head are stacked along the row axis, so one matmul
        # against that kv head's keys serves all of them and K/V are never repeated.
        qh = (q * c.softmax_scale).view(b, tn, c.n_kv_heads, g, c.head_dim)
        qh = qh.permute(0, 2, 3, 1, 4)  # [B, Hkv, G, Tn, D]
        kt = k.permute(0, 2, 3, 1)  # [B, Hkv, D, Tk]
        vh = v.permute(0, 2, 1, 3)  # [B, Hkv, Tk, D]
        outs = []
        for s in range(0, tn, ATTN_BLOCK):
            e = min(tn, s + ATTN_BLOCK)
            n = e - s
            visible = past_len + e
            qb = qh[:, :, :, s:e, :].reshape(b, c.n_kv_heads, g * n, c.head_dim)
            scores = torch.matmul(qb, kt[..., :visible]).view(b, c.n_kv_heads, g, n, visible)
            qpos = torch.arange(past_len + s, past_len + e, device=q.device)
            kpos = torch.arange(visible, device=q.device)
            scores = scores.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1).to(vh.dtype)
            probs = probs.view(b, c.n_kv_heads, g * n, visible)
            outs.append(torch.matmul(probs, vh[:, :, :visible, :]).view(b, c.n_kv_heads, g, n,
                                                                        c.head_dim))
        out = torch.cat(outs, dim=3) if len(outs) > 1 else outs[0]  # [B, Hkv, G, Tn, D]
        return out.permute(0, 3, 1, 2, 4).reshape(b, tn, c.n_q_heads * c.head_dim)


class FeedForward(nn.Module):

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.w_down = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = FeedForward(cfg)


class ByteLM(nn.Module):
    """Pre-norm decoder: embedding, n_layers x (RMSNorm, GQA + RoPE, RMSNorm, SwiGLU), RMSNorm,
    output head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = 0.02
        # Residual-branch outputs scaled down with depth (GPT-2 style) so the stream stays O(1).
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            if name.endswith("wo.weight") or name.endswith("w_down.weight"):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    # ---- batched pass (training, evaluation) ----------------------------------------------

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [B, T] int64 -> logits [B, T, vocab] float32."""
        logits, _ = self._run(tokens, past_kv=None, want_kv=False)
        return logits

    def _run(self, tokens: torch.Tensor, past_kv: Optional[Sequence[KV]], want_kv: bool):
        cfg = self.cfg
        b, t = tokens.shape
        past_len = 0 if past_kv is None else past_kv[0][0].shape[1]
        positions = torch.arange(past_len, past_len + t, device=tokens.device)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        x = self.embed(tokens)
        new_kv: List[KV] = []
        for i, blk in enumerate(self.blocks):
            q, k, v = blk.attn.project_qkv(blk.attn_norm(x), cos, sin)
            if want_kv:
                new_kv.append((k, v))
            if past_kv is not None:
                k = torch.cat((past_kv[i][0].to(k.dtype), k), dim=1)
                v = torch.cat((past_kv[i][1].to(v.dtype), v), dim=1)
            x = x + blk.attn.wo(blk.attn.attend_causal(q, k, v, past_len))
            x = x + blk.ffn(blk.ffn_norm(x))
        return self.head(self.norm(x)), new_kv

    # ---- single-sequence API for an external KV cache --------------------------------------

    @torch.no_grad()
    def prefill(self, tokens,
                past_kv: Optional[Sequence[KV]] = None) -> Tuple[torch.Tensor, List[KV]]:
        """Runs a prompt and returns its logits and per-layer K/V.

        tokens: 1-D ints (tensor, list or bytes), length T >= 1, at positions P..P+T-1 where P is
        the length of past_kv (0 when None). past_kv, optional: per layer (k, v), each
        [P, n_kv_heads, head_dim], e.g. a shared prefix read back from a cache.
        Returns logits [T, vocab] float32 and, per layer, (k, v) of the T new tokens only, each
        [T, n_kv_heads, head_dim] float32, k after RoPE.
        """
        toks = as_token_tensor(tokens)
        past = None if past_kv is None else [(k.unsqueeze(0), v.unsqueeze(0)) for k, v in past_kv]
        logits, kv = self._run(toks.unsqueeze(0), past_kv=past, want_kv=True)
        return logits[0], [(k[0].contiguous(), v[0].contiguous()) for k, v in kv]

    @torch.no_grad()
    def decode_step(self, token: int, position: int,
                    attend_fn: AttendFn) -> Tuple[torch.Tensor, List[KV]]:
        """Runs one token at `position`, delegating attention to attend_fn layer by layer.

        attend_fn(layer, q, k_new, v_new) must return the causal attention output
        [n_q_heads, head_dim] over that layer's positions 0..position, where position holds
        k_new/v_new (see the module docstring for scale and grouping). It is called for layers
        0, 1, ... in order, exactly once each; a cache typically appends k_new/v_new and then
        attends. Returns logits [vocab] float32 and, per layer, (k_new, v_new), each
        [n_kv_heads, head_dim] float32.
        """
        cfg = self.cfg
        cos, sin = rope_cos_sin(torch.tensor([position]), cfg.head_dim, cfg.rope_theta)
        x = self.embed(torch.tensor([int(token)], dtype=torch.long))  # [1, d_model]
        new_kv: List[KV] = []
        for i, blk in enumerate(self.blocks):
            q, k, v = blk.attn.project_qkv(blk.attn_norm(x), cos, sin)  # [1, H, D]
            q, k, v = q[0], k[0], v[0]
            new_kv.append((k, v))
            out = attend_fn(i, q, k, v)
            if tuple(out.shape) != (cfg.n_q_heads, cfg.head_dim):
                raise ValueError(f"attend_fn returned shape {tuple(out.shape)}, want "
                        f"({cfg.n_q_heads}, {cfg.head_dim})")
            x = x + blk.attn.wo(out.float().reshape(1, -1))
            x = x + blk.ffn(blk.ffn_norm(x))
        return self.head(self.norm(x))[0], new_kv

    @torch.no_grad()
    def generate(self, prompt, max_new_tokens: int, temperature: float = 0.0,
                              seed: int = 0, cache: Optional["Fp16KVCache"] = None) -> bytes:
        """Reference generation with an in-process fp16 KV cache.

        Greedy when temperature == 0, else samples with a torch.Generator seeded by `seed`.
        Returns the generated bytes (prompt excluded). The cache used is left in `cache` when one
        is passed in (it must be empty), so callers can inspect the K/V.
        """
        toks = as_token_tensor(prompt)
        cache = cache if cache is not None else Fp16KVCache(self.cfg)
        if len(cache) != 0:
            raise ValueError("generate() needs an empty cache")
        logits, kv = self.prefill(toks)
        cache.extend(kv)
        last = logits[-1]
        gen = torch.Generator().manual_seed(seed)
        out = bytearray()
        pos = toks.numel()
        for _ in range(max_new_tokens):
            nxt = pick_token(last, temperature, gen)
            out.append(nxt)
            last, _ = self.decode_step(nxt, pos, cache.attend_fn)
            pos += 1
        return bytes(out)


class Fp16KVCache:
    """The reference KV cache: per layer, K/V of every position stored as float16 tensors.

    Not thread-safe. attend_fn appends the new token's K/V (rounded to fp16) to the layer, then
    attends over the whole layer with gqa_attention.
    """

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.k: List[torch.Tensor] = [self._empty() for _ in range(cfg.n_layers)]
        self.v: List[torch.Tensor] = [self._empty() for _ in range(cfg.n_layers)]

    def _empty(self) -> torch.Tensor:
        return torch.empty(0, self.cfg.n_kv_heads, self.cfg.head_dim, dtype=torch.float16)

    def __len__(self) -> int:
        return self.k[0].shape[0]

    def extend(self, kv: Sequence[KV]) -> None:
        """Appends per-layer K/V, each [T, n_kv_heads, head_dim] (e.g. from prefill)."""
        for i, (k, v) in enumerate(kv):
            self.k[i] = torch.cat((self.k[i], k.to(torch.float16)), dim=0)
            self.v[i] = torch.cat((self.v[i], v.to(torch.float16)), dim=0)

    def attend_fn(self, layer: int, q: torch.Tensor, k_new: torch.Tensor,
                  v_new: torch.Tensor) -> torch.Tensor:
        self.k[layer] = torch.cat((self.k[layer], k_new.to(torch.float16).unsqueeze(0)), dim=0)
        self.v[layer] = torch.cat((self.v[layer], v_new.to(torch.float16).unsqueeze(0)), dim=0)
        return gqa_attention(q, self.k[layer], self.v[layer])


def pick_token(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    if temperature <= 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


def as_token_tensor(tokens) -> torch.Tensor:
    if isinstance(tokens, (bytes, bytearray)):
        t = torch.tensor(list(tokens), dtype=torch.long)
    else:
        t = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    if t.numel() == 0:
        raise ValueError("need at least one token")
    return t


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- weights on disk ---------------------------------------------------------------------
# <dir>/model.npz holds the state_dict as float16 arrays (numpy-readable, no pickle);
# <dir>/model.json holds {"config": {...}, ...training metadata...}.


def save_weights(model: ByteLM, directory: str, metadata: dict) -> Tuple[str, str]:
    os.makedirs(directory, exist_ok=True)
    npz_path = os.path.join(directory, "model.npz")
    json_path = os.path.join(directory, "model.json")
    arrays = {k: v.detach().to(torch.float16).cpu().numpy() for k, v in model.state_dict().items()}
    np.savez(npz_path, **arrays)
    meta = dict(metadata)
    meta["config"] = model.cfg.to_dict()
    with open(json_path, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    return npz_path, json_path


def load_weights(directory: str = WEIGHTS_DIR) -> Tuple[ByteLM, dict]:
    """Loads <directory>/model.{json,npz}; returns the model (float32, eval mode) and the JSON."""
    with open(os.path.join(directory, "model.json")) as f:
        meta = json.load(f)
    model = ByteLM(ModelConfig.from_dict(meta["config"]))
    with np.load(os.path.join(directory, "model.npz")) as z:
        state = {k: torch.from_numpy(z[k].astype(np.float32)) for k in z.files}
    model.load_state_dict(state, strict=True)
    model.eval()
    return model, meta
