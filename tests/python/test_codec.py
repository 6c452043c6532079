"""kvarn.codec: encode/decode/eval on arrays give what kvarnctl codec gives on the same
.npy files, and bad input is rejected."""

import json
import subprocess

import numpy as np
import pytest

import kvarn
from kvarn import codec
from kvtest import KVARNCTL, rel_l2

# The codec's reconstruction bounds (tests/kernels/encode_properties_test.cc).
BOUND = {4: 0.15, 2: 0.7}


def tile(g, d, seed):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((g, d)).astype(np.float32)
    keys[:, 3] += 8.0  # an outlier channel, as real keys have
    values = rng.standard_normal((g, d)).astype(np.float32)
    return keys, values


def kvarnctl(*args):
    r = subprocess.run([KVARNCTL, "codec", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("preset,d", [("kvarn_k4v2_g128", 128), ("kvarn_k4v2_g64", 64),
                                      ("kivi_k4v2_g128", 64), ("hadamard_k2v4_g64", 256),
                                      ("kvarn_k4v4_g128", 128)])
def test_encode_and_decode_equal_kvarnctl_codec_on_the_same_files(tmp_path, preset, d):
    g = codec.preset_info(preset, d)["tile_tokens"]
    keys, values = tile(g, d, seed=d)
    np.save(tmp_path / "k.npy", keys)
    np.save(tmp_path / "v.npy", values)
    kvarnctl("encode", "--preset", preset, "--keys", str(tmp_path / "k.npy"),
             "--values", str(tmp_path / "v.npy"), "--out", str(tmp_path / "r.bin"))
    record = codec.encode(preset, keys, values)
    assert record.dtype == np.uint8 and record.shape == (codec.preset_info(preset, d)["record_bytes"],)
    assert record.tobytes() == (tmp_path / "r.bin").read_bytes()

    kvarnctl("decode", "--preset", preset, "--record", str(tmp_path / "r.bin"),
             "--keys-out", str(tmp_path / "k2.npy"), "--values-out", str(tmp_path / "v2.npy"))
    dk, dv = codec.decode(preset, record)
    assert dk.shape == dv.shape == (g, d) and dk.dtype == np.float32
    np.testing.assert_array_equal(dk, np.load(tmp_path / "k2.npy"))
    np.testing.assert_array_equal(dv, np.load(tmp_path / "v2.npy"))
    # bytes in, the same tiles out.
    bk, bv = codec.decode(preset, (tmp_path / "r.bin").read_bytes())
    np.testing.assert_array_equal(bk, dk)
    info = codec.preset_info(preset, d)
    assert rel_l2(dk, keys) < BOUND[info["key_bits"]]
    assert rel_l2(dv, values) < BOUND[info["value_bits"]]


def test_encode_takes_batches_of_tiles_and_float16():
    preset = "kvarn_k4v2_g64"
    rng = np.random.default_rng(1)
    keys = rng.standard_normal((3, 2, 64, 64)).astype(np.float16)
    values = rng.standard_normal((3, 2, 64, 64)).astype(np.float16)
    records = codec.encode(preset, keys, values)
    assert records.shape == (3, 2, codec.preset_info(preset, 64)["record_bytes"])
    # Each record is the one tile's, and float16 in is float32 in (the same values).
    one = codec.encode(preset, keys[2, 1].astype(np.float32), values[2, 1].astype(np.float32))
    np.testing.assert_array_equal(records[2, 1], one)
    dk, dv = codec.decode(preset, records)
    assert dk.shape == (3, 2, 64, 64)
    np.testing.assert_array_equal(dk[2, 1], codec.decode(preset, one)[0])
    # Strided input (converted) encodes as its contiguous copy.
    k_t = np.ascontiguousarray(keys[0, 0].T).T
    np.testing.assert_array_equal(codec.encode(preset, k_t, values[0, 0]), records[0, 0])


def test_decode_frames_and_iterations():
    keys, values = tile(128, 128, seed=2)
    kivi = codec.encode("kivi_k4v2_g128", keys, values)
    np.testing.assert_array_equal(codec.decode("kivi_k4v2_g128", kivi, frame="storage")[0],
                                  codec.decode("kivi_k4v2_g128", kivi)[0])  # kivi does not rotate
    kv = codec.encode("kvarn_k4v2_g128", keys, values)
    stored, original = codec.decode("kvarn_k4v2_g128", kv, frame="storage")[0], codec.decode("kvarn_k4v2_g128", kv)[0]
    assert rel_l2(stored, original) > 0.5  # rotated
    assert np.isclose(np.linalg.norm(stored), np.linalg.norm(original), rtol=1e-4)  # orthogonal
    assert codec.encode("kvarn_k4v2_g128", keys, values, iterations=0).tobytes() != kv.tobytes()


def test_eval_reports_what_kvarnctl_codec_eval_reports(tmp_path):
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((2, 300, 64)).astype(np.float32)
    keys[..., 5] += 6.0
    values = rng.standard_normal((2, 300, 64)).astype(np.float32)
    np.save(tmp_path / "k.npy", keys)
    np.save(tmp_path / "v.npy", values)
    presets = ["kvarn_k4v2_g64", "kivi_k4v2_g64"]
    out = kvarnctl("eval", "--preset", presets[0], "--preset", presets[1], "--keys", str(tmp_path / "k.npy"),
                   "--values", str(tmp_path / "v.npy"), "--json", "--seed", "7")
    cli = [json.loads(line) for line in out.splitlines() if line.strip()]
    mine = codec.eval(presets, keys, values, seed=7)
    assert [r["preset"] for r in mine] == presets
    timing = {"encode_gbps", "decode_gbps", "encode_seconds", "decode_seconds"}
    for got, want in zip(mine, cli):
        assert set(got) == set(want)
        for key in set(want) - timing:
            assert got[key] == want[key], key
    one = codec.eval(presets[0], keys, values, seed=7)
    assert isinstance(one, dict) and one["k_rel_l2"] == mine[0]["k_rel_l2"]
    assert 0 < one["k_rel_l2_quantized"] < BOUND[4] and 0 < one["v_rel_l2_quantized"] < BOUND[2]
    # Caller's queries (grouped: 4 query heads over 2 kv-heads), no sink.
    q = rng.standard_normal((4, 3, 64)).astype(np.float32)
    r = codec.eval(presets[0], keys, values, queries=q, sink_tokens=0)
    assert r["sink_tokens"] == 0 and r["tiles_per_head"] == 4 and r["num_queries"] == 12
    assert r["queries"] == "file"
    assert r["attn_cosine_mean"] > 0.5


def test_bad_codec_input_is_rejected_with_the_reason():
    keys, values = tile(64, 64, seed=4)
    with pytest.raises(kvarn.InvalidArgumentError, match="unknown preset 'kvarn_k3v2_g64'"):
        codec.encode("kvarn_k3v2_g64", keys, values)
    with pytest.raises(ValueError, match=r"keys has shape \(32, 64\); kvarn_k4v2_g64 encodes tiles of shape"):
        codec.encode("kvarn_k4v2_g64", keys[:32], values[:32])
    with pytest.raises(ValueError, match="keys and values must have the same shape"):
        codec.encode("kvarn_k4v2_g64", keys, values[:, :32].copy())
    with pytest.raises(ValueError, match="head_dim 48 is not supported"):
        codec.encode("kvarn_k4v2_g64", keys[:, :48], values[:, :48])
    with pytest.raises(TypeError, match="keys has dtype int64"):
        codec.encode("kvarn_k4v2_g64", keys.astype(np.int64), values)
    bad = keys.copy()
    bad[3, 4] = np.inf
    with pytest.raises(kvarn.InvalidArgumentError):
        codec.encode("kvarn_k4v2_g64", bad, values)
    record = codec.encode("kvarn_k4v2_g64", keys, values)
    with pytest.raises(kvarn.InvalidArgumentError, match="which is no kvarn_k4v2_g64 record"):
        codec.decode("kvarn_k4v2_g64", record[:-1])
    with pytest.raises(ValueError, match="a kvarn_k4v2_g64 record with head_dim 128 is"):
        codec.decode("kvarn_k4v2_g64", record, head_dim=128)
    with pytest.raises(TypeError, match="records are uint8"):
        codec.decode("kvarn_k4v2_g64", record.astype(np.int16))
    with pytest.raises(ValueError, match=r"keys: element \[1, 2\] is NaN"):
        seq = np.zeros((4, 64), np.float32)
        seq[1, 2] = np.nan
        codec.eval("kvarn_k4v2_g64", seq, np.zeros((4, 64), np.float32))
    with pytest.raises(ValueError, match="beyond the fp16 range"):
        codec.eval("kvarn_k4v2_g64", np.full((4, 64), 1e6, np.float32), np.zeros((4, 64), np.float32))
    with pytest.raises(ValueError, match=r"queries has shape \(3, 2, 64\)"):
        codec.eval("kvarn_k4v2_g64", np.zeros((2, 4, 64)), np.zeros((2, 4, 64)), queries=np.zeros((3, 2, 64)))
    with pytest.raises(kvarn.InvalidArgumentError, match="sink"):
        codec.eval("kvarn_k4v2_g64", np.zeros((4, 64)), np.zeros((4, 64)), sink_tokens=5)


def test_presets_and_their_parameters():
    names = codec.presets()
    assert "kvarn_k4v2_g128" in names and "fp16" in names and len(names) == len(set(names))
    info = codec.preset_info("kvarn_k4v2_g128", 128)
    assert (info["method"], info["key_bits"], info["value_bits"], info["tile_tokens"]) == ("kvarn", 4, 2, 128)
    assert info["rotates"] and info["balances"]
    assert 4.0 < info["compression_ratio"] < 5.0  # "about 4.7x smaller than fp16"
    assert codec.implementation()[0] == "simd"
