"""kvarn.lm: a small byte-level transformer that produces real K/V for kvarnd to hold.

model.py is the model (GQA with head_dim 128, RoPE, a prefill / decode_step API whose
attention can be delegated to an external KV cache, and a reference fp16-cache generate);
data.py rebuilds its training text from Debian's perl-doc package; train.py trains it on a
CPU. The trained float16 weights ship in weights/. docs/model.md describes all of it.

    from kvarn.lm import load_weights
    model, meta = load_weights()          # weights/model.{npz,json}
    logits, kv = model.prefill(b"=head1 NAME\n\n")

Needs torch (Debian: python3-torch) and numpy.
"""

from .model import (ByteLM, Fp16KVCache, ModelConfig, WEIGHTS_DIR, gqa_attention, load_weights,
                    save_weights)

__all__ = ["ByteLM", "Fp16KVCache", "ModelConfig", "WEIGHTS_DIR", "gqa_attention",
           "load_weights", "save_weights"]
