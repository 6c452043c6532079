#!/usr/bin/python3
"""Which exp, log and reduction reproduce the authors' records? Runs the project's fp32 torch
statement of KVARN_SPEC.md §3-§4 (make_offset_tiles.quantize) with several arithmetic
variants (torch's CPU functions, CUDA's float functions, the codec's double-rounded pair;
reductions and divisions on the CPU or the GPU) and

1. compares each variant's records with the authors' golden records bit for bit (the input is
   the authors' own rotated tiles, `*.k_rot.npy` / `*.v_rot.npy`, so only §3-§4 differ);
2. compares each variant with the codec's arithmetic (`cpu-rounded`: std accumulated in
   double on the CPU, exp and log evaluated in double and rounded once) on the committed
   offset cases and on random constant-offset tiles (make_offset_tiles.make_random_cases);
3. counts, over every float the codec feeds exp (all of [-0.3, 10]) and log (all of
   [1e-3, 1e3]), how often each device's float function differs from the rounded double.

CUDA variants run where torch sees a GPU; without one the CPU variants still run.

Usage: python3 tests/golden/torch_spec_check.py [--golden DIR] [--sweep N] [--seed S]
                                                [--json FILE] [--no-exhaustive]
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_offset_tiles as spec  # noqa: E402

ITERATIONS = spec.ITERATIONS
HAVE_CUDA = torch.cuda.is_available()


def on_cuda(fn):
    """fn evaluated on the GPU for a CPU tensor, the result back on the CPU."""
    return lambda x: fn(x.cuda()).cpu()


def variants():
    """name -> (device of the tile arithmetic, exp, log, std)."""
    rexp, rlog, dstd, tstd = spec.rounded_exp, spec.rounded_log, spec.double_std, spec.torch_std
    v = {
        "cpu-torch": ("cpu", torch.exp, torch.log, tstd),
        "cpu-rounded": ("cpu", rexp, rlog, dstd),  # the codec's arithmetic
    }
    if HAVE_CUDA:
        cexp, clog = on_cuda(torch.exp), on_cuda(torch.log)
        v.update({
            "cuda-torch": ("cuda", torch.exp, torch.log, tstd),
            "cuda-rounded": ("cuda", rexp, rlog, tstd),
            "cpu+cuda-exp-log": ("cpu", cexp, clog, dstd),
            "cpu+cuda-exp": ("cpu", cexp, rlog, dstd),
            "cpu+cuda-log": ("cpu", rexp, clog, dstd),
        })
    return v


def fp16_ulps(a, b):
    """Largest distance in fp16 ulps between two fp16 arrays (sign-magnitude order)."""
    def ordered(x):
        bits = np.asarray(x, np.float16).view(np.uint16).astype(np.int64)
        mag = bits & 0x7FFF
        return np.where(bits & 0x8000, -mag, mag)
    return int(np.abs(ordered(a) - ordered(b)).max()) if np.size(a) else 0


def encode(tile, bits, variant):
    """One tile's record under a variant: codes, a, b, s as numpy arrays."""
    device, exp, log, std = variant
    t = torch.from_numpy(np.ascontiguousarray(tile, np.float32)).to(device)
    q, a, b, s, _ = spec.quantize(t, bits, ITERATIONS, exp, log, std)
    return tuple(x.cpu().numpy() for x in (q, a, b, s))


def compare(rec, want):
    """(codes differing, max ulps over a, b, s, finite) for two records."""
    codes = int(np.count_nonzero(rec[0] != want[0]))
    ulps = max(fp16_ulps(x, y) for x, y in zip(rec[1:], want[1:]))
    finite = all(np.isfinite(np.asarray(x, np.float32)).all() for x in rec[1:])
    return codes, ulps, finite


def golden_tiles(golden_dir, rotation):
    """(label, tile, bits, authors' record) for every K and V tile of every case-preset. The
    tile is the authors' rotated one (rotation "authors"), or the project's fast transform of
    the original-frame tile (rotation "project", what the codec sees: it differs from the
    authors' in the last bit of a few hundred elements per tile)."""
    manifest = json.load(open(os.path.join(golden_dir, "manifest.json")))
    load = lambda name: np.load(os.path.join(golden_dir, name))  # noqa: E731
    for case in manifest["cases"]:
        if rotation == "authors":
            k_rot, v_rot = load(case["k_rot"]), load(case["v_rot"])
        else:
            k_rot, v_rot = (spec.fwht(torch.from_numpy(load(case[x]))).numpy() for x in ("k", "v"))
        for p in case["presets"]:
            pre = p["prefix"]
            yield (f"{pre}.K", k_rot.T, p["key_bits"],
                   (load(f"{pre}.k_codes.npy"), load(f"{pre}.k_a.npy"), load(f"{pre}.k_b.npy"),
                    load(f"{pre}.k_r.npy")))
            yield (f"{pre}.V", v_rot, p["value_bits"],
                   (load(f"{pre}.v_codes.npy"), load(f"{pre}.v_a.npy"), load(f"{pre}.v_b.npy"),
                    load(f"{pre}.v_c.npy")))


def check_golden(golden_dir, vs, rotation):
    whose = {"authors": "the authors'", "project": "the project's"}[rotation]
    print(f"== 1. the authors' golden records ({golden_dir}), bit for bit, from {whose} rotated "
          "tiles", flush=True)
    tiles = list(golden_tiles(golden_dir, rotation))
    out = {}
    for name, var in vs.items():
        exact, misses = 0, []
        for label, tile, bits, want in tiles:
            codes, ulps, _ = compare(encode(tile, bits, var), want)
            if codes == 0 and ulps == 0:
                exact += 1
            else:
                misses.append({"tile": label, "codes_differing": codes, "max_scale_ulps": ulps})
        out[name] = {"exact": exact, "tiles": len(tiles), "misses": misses}
        detail = "; ".join(f"{m['tile']}: {m['codes_differing']} codes, {m['max_scale_ulps']} ulps"
                           for m in misses)
        print(f"  {name:18s} {exact}/{len(tiles)} tiles exact" + (f"  ({detail})" if detail else ""),
              flush=True)
    return out


def sweep_cases(count, seed):
    cases = spec.make_cases(np.random.default_rng(12))
    if count:
        cases.update(spec.make_random_cases(np.random.default_rng(seed), count))
    return cases


def classify(ulps):
    if ulps == 0:
        return "exact"
    if ulps <= 8:
        return "1-8 ulps"
    if 400 <= ulps <= 700:
        return "~530 ulps"
    return "other"


def check_sweep(count, seed, vs):
    print(f"== 2. offset tiles ({count} random, seed {seed}, and the committed cases) against "
          "the codec's arithmetic (cpu-rounded)", flush=True)
    cases = sweep_cases(count, seed)
    codec = vs["cpu-rounded"]
    tallies = {name: {} for name in vs if name != "cpu-rounded"}
    worst = {name: [] for name in tallies}
    used = 0
    for case, (k, v) in cases.items():
        tiles = [(f"{case}.K", spec.fwht(k).T.contiguous().numpy(), 4),
                 (f"{case}.V", spec.fwht(v).numpy(), 2)]
        refs = [encode(t, bits, codec) for _, t, bits in tiles]
        if not all(compare(r, r)[2] for r in refs):
            continue  # an fp16 scale overflows: the codec rejects such a tile
        used += 1
        for name in tallies:
            for (label, t, bits), ref in zip(tiles, refs):
                codes, ulps, _ = compare(encode(t, bits, vs[name]), ref)
                kind = classify(ulps) + (" +codes" if codes else "")
                tallies[name][kind] = tallies[name].get(kind, 0) + 1
                if ulps > 8 or codes:
                    worst[name].append((ulps, codes, label))
    for name, tally in tallies.items():
        top = sorted(worst[name], reverse=True)[:3]
        print(f"  {name:18s} {2 * used} tiles: " + ", ".join(f"{k} {n}" for k, n in sorted(tally.items()))
              + (f"; largest: {top}" if top else ""), flush=True)
    return {"tiles": 2 * used, "tallies": tallies,
            "largest": {n: sorted(w, reverse=True)[:10] for n, w in worst.items()}}


def float_range(lo, hi):
    """Every float32 in [lo, hi] (lo < 0 < hi allowed), as int32 bit-pattern ranges."""
    f = lambda x: int(np.array(x, np.float32).view(np.int32))  # noqa: E731
    if lo >= 0:
        return [(f(lo), f(hi))]
    return [(f(0.0), f(hi)), (f(-0.0) + 1, f(lo))]


def count_differences(fn_a, fn_b, lo, hi, device, stride=1, chunk=1 << 27):
    """How many floats of [lo, hi] (every stride-th) fn_a and fn_b map to different floats."""
    total = differ = 0
    for first, last in float_range(lo, hi):
        a, b = min(first, last), max(first, last)
        for start in range(a, b + 1, chunk * stride):
            stop = min(start + chunk * stride, b + 1)
            bits = torch.arange(start, stop, stride, dtype=torch.int64, device=device)
            x = bits.to(torch.int32).view(torch.float32)
            x = x[(x >= lo) & (x <= hi)]
            ra, rb = fn_a(x), fn_b(x)
            differ += int((ra.view(torch.int32) != rb.view(torch.int32)).sum())
            total += x.numel()
    return differ, total


def check_exhaustive():
    print("== 3. exp on every float of [-0.3, 10], log on every float of [1e-3, 1e3]", flush=True)
    out = {}
    # The CPU's functions are compared on every stride-th float (every float there takes
    # minutes); the GPU's on all of them.
    rows = [("exp", torch.exp, spec.rounded_exp, -0.3, 10.0, 37),
            ("log", torch.log, spec.rounded_log, 1e-3, 1e3, 7)]
    for fname, fn, rounded, lo, hi, stride in rows:
        if HAVE_CUDA:
            d, n = count_differences(fn, rounded, lo, hi, "cuda")
            out[f"cuda {fname}f vs rounded double"] = (d, n)
            d2, n2 = count_differences(lambda x: fn(x.cpu()).cuda(), fn, lo, hi, "cuda", stride)
            out[f"cpu torch {fname} vs cuda {fname}f (every {stride}th float)"] = (d2, n2)
        d3, n3 = count_differences(fn, rounded, lo, hi, "cpu", stride, chunk=1 << 24)
        out[f"cpu torch {fname} vs rounded double (every {stride}th float)"] = (d3, n3)
    for label, (d, n) in out.items():
        print(f"  {label}: {d:,} of {n:,} differ ({100.0 * d / n:.3f}%)", flush=True)
    return {k: {"differ": d, "inputs": n} for k, (d, n) in out.items()}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--golden", default=here, help="directory of the authors' manifest.json")
    ap.add_argument("--sweep", type=int, default=60, help="random offset tiles (0: committed cases only)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-exhaustive", action="store_true", help="skip part 3")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.monotonic()
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(0) if HAVE_CUDA else None}
    print(f"torch {env['torch']}, CUDA {env['cuda']}, device {env['device']}", flush=True)
    vs = variants()
    res = {"env": env, "golden": {r: check_golden(args.golden, vs, r) for r in ("authors", "project")},
           "sweep": check_sweep(args.sweep, args.seed, vs)}
    if not args.no_exhaustive:
        res["exhaustive"] = check_exhaustive()
    print(f"done in {time.monotonic() - t0:.0f} s (wall clock)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
