"""kvarn.lm against a live kvarnd: the model's KV cache in the pool (short runs, seconds).

Needs torch and the shipped weights; the demo and eval also need the held-out text from
Debian's perl-doc (kvarn.lm.data), and skip with the reason where it is not installed.
"""

import io
import json
import os
import re
import sys

import pytest

torch = pytest.importorskip("torch")

import kvarn  # noqa: E402
from kvarn import local  # noqa: E402
from kvarn.lm import __main__ as lm_main  # noqa: E402
from kvarn.lm import data, kvcache, model as lm_model  # noqa: E402


@pytest.fixture(scope="module")
def model():
    if not os.path.exists(os.path.join(lm_model.WEIGHTS_DIR, "model.npz")):
        pytest.fail(f"the shipped weights are missing from {lm_model.WEIGHTS_DIR}")
    m, _ = lm_model.load_weights()
    return m


@pytest.fixture(scope="module")
def heldout():
    try:
        return data.load_corpus().heldout
    except data.CorpusError as e:
        pytest.skip(f"held-out text unavailable: {e}")


def run_main(argv):
    out = io.StringIO()
    old = sys.stdout
    sys.stdout = out
    try:
        rc = lm_main.main(argv)
    finally:
        sys.stdout = old
    return rc, out.getvalue()


@pytest.mark.parametrize("preset,tol", [("fp16", 2e-3), ("kvarn_k4v2_g128", None)])
def test_decoding_through_kvarnd_follows_the_fp16_cache(model, preset, tol):
    """Logits of prefill + decode with the K/V in kvarnd against the in-process fp16 cache: equal
    up to fp16 rounding on an fp16 pool; on a quantized pool close, and not equal (the K/V did
    go through the quantizer)."""
    text = bytes(range(32, 127)) * 4  # 380 bytes: sink, two quantized tiles, a tail
    with local.LocalDaemon(kvcache.model_layout_flags(model, preset)) as d:
        client = kvarn.Client(d.target)
        with client.open_session("t", max_sequences=1) as s:
            seq = kvcache.KvarndSequence(s, model)
            got = [seq.prefill(text[:300])]
            ref = lm_model.Fp16KVCache(model.cfg)
            logits, kv = model.prefill(list(text[:300]))
            ref.extend(kv)
            want = [logits[-1]]
            for i, tok in enumerate(text[300:340]):
                got.append(seq.step(tok))
                want.append(model.decode_step(tok, 300 + i, ref.attend_fn)[0])
            assert seq.length == 340
            table = s.table(seq.seq)
            assert len(table.quant_blocks) == 1 and table.has_sink  # tokens 128..255 sealed
    g, w = torch.stack(got), torch.stack(want)
    err = float(torch.linalg.norm(g - w) / torch.linalg.norm(w))
    if tol is not None:
        assert err < tol, err
    else:
        assert 1e-5 < err < 0.2, err


def test_a_second_prompt_adopts_the_cached_prefix_and_decodes_the_same(model):
    text = bytes(range(40, 120)) * 5
    with local.LocalDaemon(kvcache.model_layout_flags(model, "kvarn_k4v2_g128")) as d:
        client = kvarn.Client(d.target)
        with client.open_session("t", max_sequences=2) as s:
            a = kvcache.KvarndSequence(s, model)
            la = a.prefill(text[:300])
            b = kvcache.KvarndSequence(s, model)
            lb = b.prefill(text[:300])
            assert a.cached_tokens == 0 and b.cached_tokens == 256
            # b computed only 44 tokens over the dequantized prefix a sealed: close to a.
            assert float(torch.linalg.norm(la - lb) / torch.linalg.norm(la)) < 0.1
            assert s.stats()["prefix_hit_tokens"] == 256


def test_eval_json_reports_every_field_and_fp16_costs_nothing(heldout):
    rc, out = run_main(["eval", "--prefill", "300", "--decode", "24", "--preset", "fp16",
                        "--preset", "kvarn_k2v2_g128", "--json"])
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["preset"] for r in rows] == ["fp16", "kvarn_k2v2_g128"]
    for r in rows:
        for key in ("bits_per_byte", "delta_bpb", "kl_bits", "top1_agreement",
                    "window_error_static", "window_error_accumulated"):
            assert key in r, key
        assert len(r["window_error_static"]) == 1 and 0.0 <= r["top1_agreement"] <= 1.0
    fp16, k2 = rows
    assert abs(fp16["delta_bpb"]) < 1e-3 and fp16["kl_bits"] < 1e-4
    assert fp16["window_error_static"][0] < 1e-2
    assert k2["window_error_static"][0] > fp16["window_error_static"][0]
    assert k2["kl_bits"] > fp16["kl_bits"]


def test_demo_shares_system_prompts_and_reports_its_figures(heldout):
    rc, out = run_main(["demo", "--workers", "2", "--requests", "2", "--system-prompts", "1",
                        "--gen-bytes", "8", "--json"])
    assert rc == 0
    s = json.loads(out)
    assert s["decoded_tokens"] == 2 * 2 * 8
    # One system prompt of 400 bytes: each worker's second request adopts at least the three
    # tiles its first one sealed (more when the other worker got there first).
    assert s["prefix_hit_tokens"] >= 2 * 3 * 128, s
    assert 4.0 < s["compression"] < 5.0  # kvarn_k4v2_g128 at head_dim 128
    assert 0.0 <= s["top1_agreement_with_fp16_kv"] <= 1.0
    assert s["tiles_sealed"] > 0


def test_a_target_with_another_layout_is_a_clear_error(model):
    with local.LocalDaemon(["--num_layers=2", "--num_kv_heads=2", "--head_dim=64",
                            "--capacity=16MiB"]) as d:
        client = kvarn.Client(d.target)
        with client.open_session("t") as s:
            with pytest.raises(ValueError, match="--num_layers=4"):
                kvcache.check_layout(s, model)


def test_the_corpus_is_pinned_by_its_files_not_by_the_package_version(heldout, monkeypatch):
    # Another perl-doc version with the same .pod files (a perl security update; a machine
    # without bookworm-security) is the same corpus; other files are refused, naming both.
    monkeypatch.setattr(data, "installed_version", lambda: "5.36.0-7+deb12u3")
    corpus = data.load_corpus()
    assert corpus.heldout == heldout
    assert corpus.version == "5.36.0-7+deb12u3"
    monkeypatch.setattr(data, "EXPECTED_FILES_DIGEST", "0" * 64)
    with pytest.raises(data.CorpusError, match=re.escape(data.TRAINED_VERSION)):
        data.load_corpus()
    assert data.load_corpus(verify=False).heldout == heldout
