"""python3 -m kvarn.lm {demo,eval}: the model generating with its KV cache in kvarnd.

Without --target each command starts its own kvarnd from the build (kvarn.local.LocalDaemon)
on a temporary socket, sized and shaped for the model, one per preset; with --target it uses a
running kvarnd, whose layout must be the model's (and, for eval, whose preset is the one
evaluated). docs/model.md describes the model and both commands.
"""

from __future__ import annotations

import argparse
import json
import sys


def _parser() -> argparse.ArgumentParser:
    from . import demo, evaluate
    ap = argparse.ArgumentParser(prog="python3 -m kvarn.lm", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, mod, help_text in (("demo", demo, "worker processes generating text through kvarnd"),
                                 ("eval", evaluate, "the cost of each preset during decoding")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--target", help="a running kvarnd (unix:/path); default: start one")
        p.add_argument("--weights", default=None, help="weights directory (default: the shipped)")
        p.add_argument("--json", action="store_true", help="print JSON on stdout")
        mod.add_arguments(p)
    sub.choices["demo"].add_argument("--preset", default="kvarn_k4v2_g128",
                                     help="the pool's preset when kvarnd is started here")
    return ap


def _heldout(strict: bool) -> bytes:
    """The held-out text. eval insists on the pinned files (its figures are comparable only on
    them); demo warns and takes what the installed package has."""
    from . import data
    try:
        return data.load_corpus().heldout
    except data.CorpusError as e:
        if strict:
            raise
        print(f"kvarn.lm: warning: {e}; the demo uses the installed files", file=sys.stderr)
        return data.load_corpus(verify=False).heldout


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    import torch
    from .. import local
    from . import demo, evaluate, kvcache, model as lm_model
    import kvarn
    torch.set_num_threads(1)
    if args.weights is None:
        args.weights = lm_model.WEIGHTS_DIR
    try:
        model, _ = lm_model.load_weights(args.weights)
        text = _heldout(strict=args.command == "eval")
    except Exception as e:  # a missing package or weights: say which, exit 2
        print(f"kvarn.lm: {e}", file=sys.stderr)
        return 2
    if args.command == "demo":
        if args.target:
            demo.run(args, args.target, text)
            return 0
        with local.LocalDaemon(kvcache.model_layout_flags(model, args.preset)) as d:
            demo.run(args, d.target, text)
        return 0
    presets = args.presets or evaluate.DEFAULT_PRESETS
    need = args.offset + args.prefill + args.decode + 1
    if need > len(text):
        print(f"kvarn.lm: --offset + --prefill + --decode + 1 = {need} bytes, the held-out text "
              f"has {len(text)}", file=sys.stderr)
        return 2
    if args.prefill + args.decode > model.cfg.max_seq_len:
        print(f"kvarn.lm: note: {args.prefill + args.decode} positions exceed the trained context "
              f"{model.cfg.max_seq_len}", file=sys.stderr)
    passage = text[args.offset:need]
    progress = evaluate.Progress(args.decode * (len(presets) + 1))
    ref = evaluate.reference_run(model, passage, args.prefill, args.decode, progress)
    rows = []
    for preset in presets:
        def measure(target):
            client = kvarn.Client(target)
            with client.open_session("lm-eval", max_sequences=1, client_name="kvarn.lm eval") as s:
                kvcache.check_layout(s, model)
                if s.layout.preset != preset:
                    raise ValueError(f"kvarnd at {target} stores {s.layout.preset}, not {preset}: "
                                     f"give --preset {s.layout.preset}, or no --target")
                run = evaluate.quantized_run(model, s, passage, args.prefill, args.decode,
                                             progress, preset)
            return evaluate.summarize(preset, passage, args.prefill, args.decode, ref, run)
        if args.target:
            rows.append(measure(args.target))
        else:
            with local.LocalDaemon(kvcache.model_layout_flags(model, preset)) as d:
                rows.append(measure(d.target))
    progress.end()
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"{args.prefill} held-out bytes prefilled, {args.decode} decoded teacher-forced; "
          f"fp16-KV bits/byte {rows[0]['fp16_bits_per_byte']:.4f}")
    print(f"{'preset':<20} {'bits/byte':>9} {'delta':>8} {'KL bits':>8} {'top-1':>7}  "
          f"attention error per 128-step window: static | accumulated")
    for r in rows:
        st = " ".join(f"{x:.4f}" for x in r["window_error_static"])
        ac = " ".join(f"{x:.4f}" for x in r["window_error_accumulated"])
        print(f"{r['preset']:<20} {r['bits_per_byte']:>9.4f} {r['delta_bpb']:>+8.4f} "
              f"{r['kl_bits']:>8.5f} {100 * r['top1_agreement']:>6.2f}%  {st} | {ac}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
