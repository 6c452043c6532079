#!/usr/bin/python3
"""Writes tests/golden/offsets: golden-format test vectors for the tiles the authors' golden
set lacks, computed with the project's own fp32 PyTorch statement of KVARN_SPEC.md §2-§5.

Cases: channels dominated by a constant offset after rotation (mean 100-1000x the spread),
keys and values near the fp16 limits (|x| up to 65504), and a few random tiles. The
arithmetic is the reference's as the spec writes it, in fp32 and in that order:
cur = T / exp(Lc) / exp(Lr); std = torch.std (Bessel; accumulated in double on the CPU);
step = (hi - lo) / qmax; a = Sr * step, b = Sr * lo, then fp16. torch.exp and torch.log are
torch's own (on x86, SLEEF's vector functions). The rotation is the fast Walsh-Hadamard
transform with the codec's butterflies (kernels/reference.cc FwhtInPlace), so the tile T the
balancing sees is the codec's bit for bit and the comparison isolates §3-§5.

Usage: /usr/bin/python3 tests/golden/make_offset_tiles.py [out_dir]   (deterministic, seed 12)
"""
import json
import os
import sys

import numpy as np
import torch

G, D, ITERATIONS = 128, 128, 8
PRESETS = [(4, 2)]


def fwht(x):
    """x . H for the normalized Sylvester H, along the last axis, in fp32, with the codec's
    butterfly order (stage h = 1, 2, 4, ..: pairs (j, j + h) -> (a + b, a - b)), then the
    product by the float 1/sqrt(n)."""
    x = x.clone().to(torch.float32)
    n = x.shape[-1]
    h = 1
    while h < n:
        y = x.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :].clone(), y[..., 1, :].clone()
        y[..., 0, :] = a + b
        y[..., 1, :] = a - b
        x = y.reshape(*x.shape[:-1], n)
        h *= 2
    norm = torch.tensor(1.0, dtype=torch.float32) / torch.sqrt(torch.tensor(float(n), dtype=torch.float32))
    return x * norm


def rounded_exp(x):
    """exp evaluated in double and rounded to float once: the codec's ExpF."""
    return torch.exp(x.double()).float()


def rounded_log(x):
    """log likewise: the codec's LogF."""
    return torch.log(x.double()).float()


# exp and log of the balancing: torch's (the reference's), or, with KVARN_EXACT_EXP=1 in the
# environment, the double-precision result rounded to float (the codec's ExpF/LogF), which
# separates differences of exp/log from differences of everything else. balance() and
# quantize() take other pairs too (tests/golden/torch_spec_check.py compares devices).
if os.environ.get("KVARN_EXACT_EXP") == "1":
    exp32, log32 = rounded_exp, rounded_log
else:
    exp32, log32 = torch.exp, torch.log


def torch_std(x, dim):
    """torch's own std (Bessel), in whatever precision torch accumulates on x's device."""
    return x.std(dim=dim)


def double_std(x, dim):
    """std accumulated in double and rounded to float once (the codec's BalanceStd, up to the
    order of summation)."""
    return x.double().std(dim=dim).float()


def imbalance(x, std=torch_std):
    cs, rs = std(x, 0), std(x, 1)
    return cs.max() / cs.min().clamp(min=1e-8) + rs.max() / rs.min().clamp(min=1e-8)


def balance(t, iterations, exp=None, log=None, std=torch_std):
    """§3 on an R x C fp32 tile (on any device; std and the divisions run where t is);
    returns the best-so-far column and row scales. exp, log: default exp32, log32."""
    exp, log = exp or exp32, log or log32
    rows, cols = t.shape
    lc = torch.zeros(cols, dtype=torch.float32, device=t.device)
    lr = torch.zeros(rows, dtype=torch.float32, device=t.device)
    best = imbalance(t, std)
    sc = torch.ones(cols, dtype=torch.float32, device=t.device)
    sr = torch.ones(rows, dtype=torch.float32, device=t.device)
    cur = t
    for _ in range(iterations):
        lc = (lc + log(std(cur, 0).clamp(1e-3, 1e3))).clamp(-0.3, 10.0)
        cur = t / exp(lc)[None, :] / exp(lr)[:, None]
        lr = (lr + log(std(cur, 1).clamp(1e-3, 1e3))).clamp(-0.3, 10.0)
        cur = t / exp(lc)[None, :] / exp(lr)[:, None]
        imb = imbalance(cur, std)
        if imb <= best:
            best = imb
            sc, sr = exp(lc), exp(lr)
    return sc, sr


def quantize(t, bits, iterations, exp=None, log=None, std=torch_std):
    """§4 per row of t: codes uint8 [R, C]; a, b fp16 [R]; s fp16 [C]; dequantized fp32
    (on t's device; exp, log, std as in balance)."""
    sc, sr = balance(t, iterations, exp, log, std)
    b_tile = t / sc[None, :] / sr[:, None]
    qmax = float(2 ** bits - 1)
    lo, hi = b_tile.min(dim=1).values, b_tile.max(dim=1).values
    step = ((hi - lo) / qmax).clamp(min=1e-10)
    q = torch.round((b_tile - lo[:, None]) / step[:, None]).clamp(0, qmax)
    a16, b16, s16 = (sr * step).half(), (sr * lo).half(), sc.half()
    deq = (q * a16.float()[:, None] + b16.float()[:, None]) * s16.float()[None, :]
    return q.to(torch.uint8), a16, b16, s16, deq


def pack_rows(codes, bits):
    """§5: element i of a row in byte i / p at bit (i % p) * bits."""
    per = 8 // bits
    c = codes.numpy().astype(np.uint8)
    out = np.zeros((c.shape[0], c.shape[1] // per), dtype=np.uint8)
    for j in range(per):
        out |= (c[:, j::per] << (j * bits)).astype(np.uint8)
    return out.tobytes()


def rel_l2(approx, exact):
    num = np.sum((np.asarray(approx, np.float64) - exact) ** 2)
    den = np.sum(np.asarray(exact, np.float64) ** 2)
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


def attention(q, k, v):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = q @ k.T / np.sqrt(k.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def unrotate(x_rot):
    h = fwht(torch.eye(D, dtype=torch.float32)).double().numpy()  # H, symmetric
    return np.asarray(x_rot, np.float64) @ h


def half(x):
    return torch.from_numpy(np.asarray(x, np.float32)).half().float()


def from_rotated(design):
    """An fp16-exact original-frame tile whose rotation is close to `design` [G, D]."""
    h = fwht(torch.eye(D, dtype=torch.float32)).double()
    return half((torch.from_numpy(np.asarray(design, np.float64)) @ h).numpy())


def make_cases(rng):
    cases = {}
    # Keys with channels dominated by a constant offset after rotation (mean 100-1000x the
    # spread), the others gaussian; values likewise on a few channels.
    design_k = rng.normal(0.0, 1.0, (G, D))
    for ch, ratio in zip(rng.choice(D, 12, replace=False), np.geomspace(100, 1000, 12)):
        spread = rng.uniform(0.02, 0.2)
        design_k[:, ch] = ratio * spread * rng.choice([-1, 1]) + spread * rng.normal(size=G)
    design_v = rng.normal(0.0, 1.0, (G, D))
    for ch, ratio in zip(rng.choice(D, 6, replace=False), np.geomspace(100, 1000, 6)):
        spread = rng.uniform(0.05, 0.5)
        design_v[:, ch] = ratio * spread + spread * rng.normal(size=G)
    cases["offset_channels"] = (from_rotated(design_k), from_rotated(design_v))
    # Every key channel offset-dominated, with token scales on top.
    design_k = np.empty((G, D))
    for ch in range(D):
        spread = rng.uniform(0.01, 0.1)
        design_k[:, ch] = rng.uniform(100, 1000) * spread * rng.choice([-1, 1]) + spread * rng.normal(size=G)
    cases["offset_all_key_channels"] = (from_rotated(design_k), half(rng.normal(0, 2, (G, D))))
    # Values near the fp16 limits: magnitudes up to 65504, random signs.
    big = rng.uniform(20000, 65504, (G, D)) * rng.choice([-1, 1], (G, D))
    cases["fp16_limits"] = (half(big), half(rng.uniform(20000, 65504, (G, D)) * rng.choice([-1, 1], (G, D))))
    # A few channels and tokens at the fp16 limits, the rest small.
    k = rng.normal(0, 1, (G, D))
    k[:, rng.choice(D, 2, replace=False)] = 65504 * rng.choice([-1, 1], (G, 2)) * rng.uniform(0.9, 1, (G, 2))
    v = rng.normal(0, 1, (G, D))
    v[rng.choice(G, 2, replace=False), :] = 8000 * rng.uniform(-1, 1, (2, D))  # more overflows a_V
    cases["fp16_limit_channels"] = (half(k), half(v))
    # Random tiles.
    cases["random_laplace"] = (half(rng.laplace(0, 1, (G, D))), half(rng.laplace(0, 3, (G, D))))
    return cases


def make_random_cases(rng, count):
    """`count` random tiles of the kinds above (constant-offset channels with token scales,
    fp16-limit channels), for wider sweeps than the committed set."""
    cases = {}
    for i in range(count):
        design_k = rng.normal(0.0, 1.0, (G, D)) * np.exp(rng.uniform(-0.3, 0.3, (G, 1)))
        nch = int(rng.integers(1, 64))
        for ch in rng.choice(D, nch, replace=False):
            spread = rng.uniform(0.01, 0.5)
            design_k[:, ch] = rng.uniform(100, 1000) * spread * rng.choice([-1, 1]) + spread * rng.normal(size=G)
        design_v = rng.normal(0.0, 1.0, (G, D))
        for ch in rng.choice(D, int(rng.integers(0, 16)), replace=False):
            spread = rng.uniform(0.05, 0.5)
            design_v[:, ch] = rng.uniform(100, 1000) * spread + spread * rng.normal(size=G)
        k, v = from_rotated(design_k), from_rotated(design_v)
        if i % 4 == 3:
            k = k.clone()
            k[:, int(rng.integers(0, D))] = 60000.0
        cases[f"random_offsets_{i}"] = (k, v)
    return cases


def write(out_dir, random_count=0, seed=12):
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    manifest = {"format": "kvarn-golden/1", "seed": 12, "tile_tokens": G, "head_dim": D,
                "sinkhorn_iterations": ITERATIONS,
                "hadamard": "normalized Sylvester, no random signs, x_rot = x @ H (fast transform, "
                            "the codec's butterfly order)",
                "producer": "tests/golden/make_offset_tiles.py: the project's fp32 PyTorch statement "
                            "of KVARN_SPEC.md, torch " + torch.__version__,
                "tolerances": "as ../manifest.json", "cases": []}
    cases = make_random_cases(rng, random_count) if random_count else make_cases(rng)
    for name, (k, v) in cases.items():
        k_rot, v_rot = fwht(k), fwht(v)
        qdir = rng.normal(0, 1, (8, D))
        aimed = k[rng.choice(G, 8, replace=False)].numpy() * 4.0
        q = np.concatenate([qdir, aimed]).astype(np.float32)
        files = {"k": k.numpy(), "v": v.numpy(), "q": q, "k_rot": k_rot.numpy(), "v_rot": v_rot.numpy()}
        for key, arr in files.items():
            np.save(os.path.join(out_dir, f"{name}.{key}.npy"), np.ascontiguousarray(arr, np.float32))
        entry = {"name": name, **{key: f"{name}.{key}.npy" for key in files}, "presets": [],
                 "degenerate": False}
        for kbits, vbits in PRESETS:
            prefix = f"{name}.k{kbits}v{vbits}"
            kq, ka, kb, kr, kdeq = quantize(k_rot.T.contiguous(), kbits, ITERATIONS)  # [D, G]
            vq, va, vb, vc, vdeq = quantize(v_rot, vbits, ITERATIONS)  # [G, D]
            fields = [ka, kb, kr, va, vb, vc]
            if not all(bool(torch.isfinite(f.float()).all()) for f in fields):
                if random_count:
                    break
                raise SystemExit(f"{name}: an fp16 scale overflows; the codec would reject this tile")
            out = {"k_codes": kq.numpy(), "v_codes": vq.numpy(), "k_a": ka.numpy(), "k_b": kb.numpy(),
                   "k_r": kr.numpy(), "v_c": vc.numpy(), "v_a": va.numpy(), "v_b": vb.numpy()}
            # The dequantized tiles (golden README's *_deq_rot.npy) are left out to keep the set
            # small; the tests do not read them.
            for key, arr in out.items():
                np.save(os.path.join(out_dir, f"{prefix}.{key}.npy"), np.ascontiguousarray(arr))
            record = (pack_rows(kq, kbits) + ka.numpy().tobytes() + kb.numpy().tobytes() +
                      kr.numpy().tobytes() + pack_rows(vq, vbits) + vc.numpy().tobytes() +
                      va.numpy().tobytes() + vb.numpy().tobytes())
            with open(os.path.join(out_dir, f"{prefix}.record.bin"), "wb") as f:
                f.write(record)
            k_hat, v_hat = unrotate(kdeq.T.contiguous().numpy()), unrotate(vdeq.numpy())
            exact = attention(q, k.numpy(), v.numpy())
            entry["presets"].append({
                "key_bits": kbits, "value_bits": vbits, "prefix": prefix, "record_bytes": len(record),
                "attn_rel_l2_error": rel_l2(attention(q, k_hat, v_hat), exact),
                "k_rel_l2_error": rel_l2(k_hat, k.numpy().astype(np.float64)),
                "v_rel_l2_error": rel_l2(v_hat, v.numpy().astype(np.float64))})
        if not entry["presets"]:
            continue
        manifest["cases"].append(entry)
        print(name, entry["presets"][0]["record_bytes"], "bytes; K offsets (max |mean|/std over channels):",
              f"{float((k_rot.mean(0).abs() / k_rot.std(0)).max()):.0f}")
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    # make_offset_tiles.py [out_dir [random_count [seed]]]: with a count, that many random
    # offset tiles instead of the committed cases (not committed; for sweeps, e.g.
    # `make_offset_tiles.py /tmp/sweep/offsets 60 5`, then
    # `KVARN_GOLDEN_DIR=/tmp/sweep build/bin/codec_offset_vectors_test`).
    args = sys.argv[1:]
    out = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "offsets")
    write(out, int(args[1]) if len(args) > 1 else 0, int(args[2]) if len(args) > 2 else 12)
