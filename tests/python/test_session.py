"""kvarn.Client and kvarn.Session against a live kvarnd: sequences, appends and seals,
prefix sharing, fork and release, in-place reads and decode attention."""

import os

import numpy as np
import pytest

import kvarn
from kvtest import G, LAYOUT, Daemon, make_kv, rel_l2, tokens

L, H, D = LAYOUT["num_layers"], LAYOUT["num_kv_heads"], LAYOUT["head_dim"]

# Bounds, and why:
#  * FP16_PARTS: the sink and tail hold the appended fp16 K/V rotated into the storage frame
#    and rounded to fp16 once more (relative 2^-11 per element, ~3e-4 in L2 over a tile), so
#    dequantizing them gives the appended values back within 2e-3.
#  * QUANT_K, QUANT_V: the codec's reconstruction bounds for 4-bit keys and 2-bit values
#    (tests/kernels/encode_properties_test.cc ReconstructionBound).
#  * SAME_AS_CODEC: the daemon seals a tile from its fp16 storage-frame tail; kvarn.codec
#    encodes the same tile from the appended values in the original frame. The inputs differ
#    by one fp16 rounding, far below the quantization step, so the two reconstruction errors
#    agree to a few percent of themselves (measured: under 0.1%); 10% of the error still
#    fails a tile from another position, head or layer (errors of order 1).
#  * ATTEND_VS_DEQUANTIZED: Attend reads exactly what dequantize returns; the only
#    differences are fp32 accumulation and the query's trip through the Hadamard rotation
#    (relative ~1e-6), so 1e-3 is generous yet far below what a wrong block, head, layer or
#    token count gives (order 1).
FP16_PARTS = 2e-3
QUANT_K, QUANT_V = 0.15, 0.7
SAME_AS_CODEC = 0.10
ATTEND_VS_DEQUANTIZED = 1e-3


def attention(q, k, v):
    """Exact decode attention in float64: q (D,), k and v (T, D), scale 1/sqrt(D)."""
    s = (k.astype(np.float64) @ q.astype(np.float64)) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max())
    return (p / p.sum()) @ v.astype(np.float64)


def appended(session, prompt, seed):
    """A sequence holding the K/V of `prompt` (from token 0); returns (id, table, keys, values)."""
    seq, cached, _ = session.create_sequence(prompt)
    assert cached == 0
    k, v = make_kv(len(prompt), seed)
    info = session.append(seq, prompt, k, v)
    return seq, info.table, k, v


def test_client_describes_the_daemon_layout(client, session, daemon):
    d = client.describe()
    assert d["layout"]["num_layers"] == L and d["layout"]["head_dim"] == D
    assert d["backend"] == "host"
    assert d["epoch"] == daemon.epoch
    assert client.layout() == kvarn.Layout(**LAYOUT)
    assert session.layout == kvarn.Layout(**LAYOUT)
    assert session.mapped and not session.on_device and session.alive
    assert session.tail_page_bytes == os.sysconf("SC_PAGE_SIZE")  # huge_pages is off by default
    assert session.tile_tokens == G
    assert session.epoch == daemon.epoch
    assert session.pool["backend"] == "BACKEND_HOST"


def test_appending_a_full_tile_seals_it_into_the_table(session):
    prompt = tokens(1000, 2 * G + 10)
    seq, cached, table = session.create_sequence(prompt)
    assert (cached, table.tokens, table.has_sink, table.quant_blocks) == (0, 0, False, [])
    k, v = make_kv(len(prompt), seed=1)
    seals_before = session.stats()["seals"]

    # Part of a tile: committed into the tail, nothing sealed.
    info = session.append(seq, prompt[:30], k[:30], v[:30])
    assert not info.sealed
    assert (info.table.tokens, info.table.tail_tokens, info.table.has_sink) == (30, 30, False)
    # The rest of the first tile: it fills and becomes the fp16 sink.
    info = session.append(seq, prompt[30:G], k[30:G], v[30:G])
    assert info.sealed
    assert (info.table.tokens, info.table.tail_tokens, info.table.has_sink) == (G, 0, True)
    assert info.table.quant_blocks == []
    # A second full tile, staged in two parts and committed at once: one quantized block.
    session.stage(seq, k[G:G + 20], v[G:G + 20])
    session.stage(seq, k[G + 20:2 * G], v[G + 20:2 * G])
    info = session.commit(seq, prompt[G:2 * G])
    assert info.sealed
    assert info.table.tokens == 2 * G and info.table.tail_tokens == 0
    assert len(info.table.quant_blocks) == 1
    # Ten more: in the tail.
    info = session.append(seq, prompt[2 * G:], k[2 * G:], v[2 * G:])
    assert not info.sealed and info.table.tail_tokens == 10 and info.table.tokens == len(prompt)
    assert session.table(seq) == info.table
    assert session.stats()["seals"] == seals_before + 2


def test_append_splits_a_long_prompt_at_tile_boundaries(session):
    prompt = tokens(5000, 3 * G + 5)
    seq, table, _, _ = appended(session, prompt, seed=2)
    assert table.tokens == len(prompt)
    assert table.has_sink and len(table.quant_blocks) == 2 and table.tail_tokens == 5


def test_commit_batch_commits_many_sequences_and_reports_each_item(session):
    a, _, _ = session.create_sequence(tokens(100, 10))
    b, _, _ = session.create_sequence(tokens(200, 10))
    k, v = make_kv(4, seed=3)
    session.stage(a, k, v)
    session.stage(b, k[:2], v[:2])
    results = session.commit_batch([(a, tokens(100, 4)), (b, tokens(200, 3))])
    assert isinstance(results[0], kvarn.AppendInfo)
    assert results[0].table.tokens == 4 and results[0].table.tail_tokens == 4
    # b staged 2 tokens, not 3: that item alone fails, with its code, and is not raised.
    assert isinstance(results[1], kvarn.InvalidArgumentError)
    assert results[1].code == "INVALID_ARGUMENT" and "2 staged tokens" in results[1].message
    results = session.commit_batch([(b, tokens(200, 2))])
    assert results[0].table.tokens == 2


def test_a_second_session_adopts_the_cached_prefix(client, tenant):
    prompt = tokens(7000, 2 * G + 10)
    with client.open_session(tenant, max_sequences=2) as a:
        seq_a, table_a, _, _ = appended(a, prompt, seed=4)
        keys_a, values_a = a.dequantize(seq_a)
        with client.open_session(tenant, max_sequences=2) as b:
            # floor((len - 1) / G) = 2 tiles: the sink and one quantized block.
            assert b.lookup(prompt) == 2 * G
            seq_b, cached, table_b = b.create_sequence(prompt)
            assert cached == 2 * G
            assert table_b.tokens == 2 * G and table_b.tail_tokens == 0
            assert table_b.has_sink and table_b.sink_block == table_a.sink_block
            assert table_b.quant_blocks == table_a.quant_blocks
            # The very same blocks, read in place by either session.
            keys_b, values_b = b.dequantize(seq_b)
            np.testing.assert_array_equal(keys_b, keys_a[:2 * G])
            np.testing.assert_array_equal(values_b, values_a[:2 * G])
            block = table_a.quant_blocks[0]
            np.testing.assert_array_equal(b.block_bytes(block), a.block_bytes(block))
            stats = b.stats()
            assert stats["prefix_hit_tokens"] >= 2 * G
            # B appends the rest from cached_tokens on.
            k, v = make_kv(len(prompt) - cached, seed=5)
            info = b.append(seq_b, prompt[cached:], k, v)
            assert info.table.tokens == len(prompt) and info.table.quant_blocks == table_a.quant_blocks
        # Another tenant shares nothing.
        with client.open_session(tenant + "-other", max_sequences=1) as other:
            assert other.lookup(prompt) == 0


def test_fork_shares_blocks_and_release_drops_the_sequence(session):
    prompt = tokens(9000, G + G + 7)
    seq, table, _, _ = appended(session, prompt, seed=6)
    sequences_before = session.stats()["sequences"]
    child, cached, child_table = session.fork(seq)
    assert child != seq and cached == 0
    assert child_table.tokens == table.tokens
    assert child_table.sink_block == table.sink_block and child_table.quant_blocks == table.quant_blocks
    assert child_table.tail_tokens == 7 and child_table.tail_slot != table.tail_slot
    for got, want in zip(session.dequantize(child), session.dequantize(seq)):
        np.testing.assert_array_equal(got, want)  # the tail was copied, the blocks are shared
    assert session.stats()["sequences"] == sequences_before + 1
    # The fork grows on its own.
    k, v = make_kv(3, seed=7)
    assert session.append(child, tokens(1, 3), k, v).table.tokens == table.tokens + 3
    assert session.table(seq).tokens == table.tokens

    session.release(np.uint64(child))  # numpy integers are ids too
    assert session.stats()["sequences"] == sequences_before
    with pytest.raises(kvarn.NotFoundError):
        session.table(child)
    with pytest.raises(kvarn.NotFoundError) as e:
        session.fork(child)  # the daemon no longer knows it
    assert e.value.code == "NOT_FOUND"
    session.release([seq])
    assert session.stats()["sequences"] == sequences_before - 1


def test_dequantize_returns_the_appended_kv_within_the_codec_error(session):
    prompt = tokens(11000, 3 * G + 40)  # sink, two quantized tiles, 40 tail tokens
    seq, table, k, v = appended(session, prompt, seed=8)
    keys, values = session.dequantize(seq)
    assert keys.shape == values.shape == (len(prompt), L, H, D) and keys.dtype == np.float32
    for part in (slice(0, G), slice(3 * G, None)):  # fp16 sink and tail
        assert rel_l2(keys[part], k[part]) < FP16_PARTS
        assert rel_l2(values[part], v[part]) < FP16_PARTS
    for tile, block in enumerate(table.quant_blocks):
        rows = slice((tile + 1) * G, (tile + 2) * G)
        # In place, per block: the same numbers as dequantize.
        bk, bv = session.dequantize_block(block)
        assert bk.shape == (L, H, G, D)
        np.testing.assert_array_equal(bk, keys[rows].transpose(1, 2, 0, 3))
        np.testing.assert_array_equal(bv, values[rows].transpose(1, 2, 0, 3))
        raw = session.block_bytes(block)
        for layer in range(L):
            for head in range(H):
                want_k = k[rows, layer, head].astype(np.float32)
                want_v = v[rows, layer, head].astype(np.float32)
                got_k, got_v = keys[rows, layer, head], values[rows, layer, head]
                assert rel_l2(got_k, want_k) < QUANT_K
                assert rel_l2(got_v, want_v) < QUANT_V
                # The record in the pool decodes with kvarn.codec to what the session read.
                dk, dv = kvarn.codec.decode(LAYOUT["preset"], raw[layer, head])
                np.testing.assert_array_equal(dk, got_k)
                np.testing.assert_array_equal(dv, got_v)
                # And its error is the codec's own on the same tile.
                ck, cv = kvarn.codec.decode(
                    LAYOUT["preset"], kvarn.codec.encode(LAYOUT["preset"], want_k, want_v))
                assert abs(rel_l2(got_k, want_k) - rel_l2(ck, want_k)) < SAME_AS_CODEC * rel_l2(ck, want_k)
                assert abs(rel_l2(got_v, want_v) - rel_l2(cv, want_v)) < SAME_AS_CODEC * rel_l2(cv, want_v)
    # One layer; and the Read RPC (the daemon decodes) agrees with the in-place read.
    k1, v1 = session.dequantize(seq, layer=1)
    np.testing.assert_array_equal(k1, keys[:, 1])
    np.testing.assert_array_equal(v1, values[:, 1])
    rk, rv = session.read(seq, 1)
    assert rk.shape == (len(prompt), H, D)
    np.testing.assert_allclose(rk, keys[:, 1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(rv, values[:, 1], rtol=0, atol=1e-5)
    rk, _ = session.read(seq, 0, start=G, count=10)
    np.testing.assert_allclose(rk, keys[G:G + 10, 0], rtol=0, atol=1e-5)


def test_append_inline_stores_what_append_stores(session):
    prompt = tokens(13000, G + 20)
    k, v = make_kv(len(prompt), seed=9)
    a, _, _ = session.create_sequence(prompt)
    b, _, _ = session.create_sequence(tokens(14000, len(prompt)))
    session.append(a, prompt, k, v)
    info = session.append_inline(b, tokens(14000, len(prompt)), k, v)
    assert info.table.tokens == len(prompt) and info.table.has_sink
    for got, want in zip(session.dequantize(b), session.dequantize(a)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("q_heads", [H, 2 * H])  # plain and grouped-query attention
def test_attend_matches_attention_over_the_dequantized_kv(session, q_heads):
    prompt = tokens(15000 + q_heads, 3 * G + 40)
    seq, _, _, _ = appended(session, prompt, seed=10)
    rng = np.random.default_rng(11)
    group = q_heads // H
    for layer in range(L):
        q = rng.standard_normal((q_heads, D)).astype(np.float32)
        out = session.attend(seq, layer, q)
        assert out.shape == (q_heads, D) and out.dtype == np.float32
        keys, values = session.dequantize(seq, layer=layer)
        want = np.stack([attention(q[i], keys[:, i // group], values[:, i // group])
                         for i in range(q_heads)])
        assert rel_l2(out, want) < ATTEND_VS_DEQUANTIZED
        # Into a caller's array.
        buf = np.empty((q_heads, D), np.float32)
        assert session.attend(seq, layer, q, out=buf) is buf
        np.testing.assert_array_equal(buf, out)
    # A sequence with a different history gives a different answer (the check has teeth).
    other, _, _, _ = appended(session, tokens(16000 + q_heads, 3 * G + 40), seed=12)
    assert rel_l2(session.attend(other, 0, q), session.attend(seq, 0, q)) > 0.1


def test_attend_lse_merges_a_new_token_exactly_as_committing_it(session):
    """What a decode step does: attention over the pool merged with its own new token through
    the log-sum-exp equals attention after that token is committed."""
    prompt = tokens(18000, 2 * G + 5)
    seq, _, _, _ = appended(session, prompt, seed=20)
    rng = np.random.default_rng(21)
    q = rng.standard_normal((2 * H, D)).astype(np.float32)
    k_new, v_new = make_kv(1, seed=22)  # fp16 values, so the committed copy is exact
    k_new32, v_new32 = k_new.astype(np.float32), v_new.astype(np.float32)
    merged = {}
    for layer in range(L):
        out, lse = session.attend(seq, layer, q, return_lse=True)
        assert lse.shape == (2 * H,) and lse.dtype == np.float32
        keys, _ = session.dequantize(seq, layer=layer)
        for i in range(2 * H):  # lse is log sum exp over the pool's keys for that head
            s = (keys[:, i // 2].astype(np.float64) @ q[i].astype(np.float64)) / np.sqrt(D)
            want = s.max() + np.log(np.exp(s - s.max()).sum())
            assert abs(lse[i] - want) < 1e-3 * max(1.0, abs(want))
        kv_head = np.arange(2 * H) // 2
        s_new = (q * k_new32[0, layer, kv_head]).sum(-1) / np.sqrt(D)
        m = np.maximum(lse, s_new)
        w, u = np.exp(lse - m)[:, None], np.exp(s_new - m)[:, None]
        merged[layer] = (w * out + u * v_new32[0, layer, kv_head]) / (w + u)
    session.append(seq, [7], k_new, v_new)
    for layer in range(L):
        after = session.attend(seq, layer, q)
        assert rel_l2(merged[layer], after) < 1e-5


def test_stats_and_sequences_describe_this_session(session):
    seq, _, _ = session.create_sequence(tokens(1, 5))
    stats = session.stats()
    assert stats["sessions"] >= 1 and stats["sequences"] >= 1
    assert stats["preset"] == LAYOUT["preset"]
    listed = session.list_sequences()
    ids = [row["sequence_id"] for row in listed["sequences"]]
    assert seq in ids
    evicted = session.evict("tenant")
    assert set(evicted) == {"blocks", "bytes"}
    use = session.resident()
    assert use["tail"] >= 0 and use["quant"] >= 0


def test_torch_cpu_tensors_go_in_and_come_out(session):
    torch = pytest.importorskip("torch")
    prompt = tokens(17000, G + 9)
    k, v = make_kv(len(prompt), seed=13)
    a, _, _ = session.create_sequence(prompt)
    b, _, _ = session.create_sequence(tokens(18000, len(prompt)))
    session.append(a, prompt, k, v)
    session.append(b, tokens(18000, len(prompt)), torch.from_numpy(k), torch.from_numpy(v))
    for got, want in zip(session.dequantize(b), session.dequantize(a)):
        np.testing.assert_array_equal(got, want)
    q = np.random.default_rng(14).standard_normal((2 * H, D)).astype(np.float32)
    out = session.attend(a, 0, torch.from_numpy(q).requires_grad_(True))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), session.attend(a, 0, q))
    # bfloat16 (no numpy equivalent) is widened; token ids as an int64 tensor.
    c, _, _ = session.create_sequence(torch.arange(19000, 19000 + 5))
    info = session.append(c, torch.arange(19000, 19000 + 5),
                          torch.from_numpy(k[:5]).bfloat16(), torch.from_numpy(v[:5]).bfloat16())
    assert info.table.tokens == 5


def _huge_pages_available():
    """(pages a new segment can reserve, huge page size in bytes), from /proc/meminfo."""
    fields = {k: v.split()[0] for k, v in (line.split(":", 1) for line in open("/proc/meminfo"))}
    free, reserved = int(fields.get("HugePages_Free", 0)), int(fields.get("HugePages_Rsvd", 0))
    return free - reserved, int(fields.get("Hugepagesize", 0)) * 1024


def test_a_tail_on_huge_pages_is_mapped_and_read_back():
    available, page = _huge_pages_available()
    # The daemon's 16 MiB pool and one tail, each segment rounded up to whole pages.
    needed = -(-(16 << 20) // page) + 3 if page else 1
    if page == 0 or available < needed:
        pytest.skip(f"needs {needed} available huge pages (vm.nr_hugepages); {available} available")
    d = Daemon(extra_flags=["--huge_pages=on"])
    try:
        with kvarn.Client(d.target).open_session("py-huge", max_sequences=2) as s:
            assert s.tail_page_bytes == page
            prompt = tokens(7000, 10)  # stays in the tail
            seq, _, _ = s.create_sequence(prompt)
            k, v = make_kv(len(prompt), seed=3)
            s.append(seq, prompt, k, v)
            keys, values = s.read(seq, 0, 0, len(prompt))
            assert np.abs(keys - k[:, 0].astype(np.float32)).max() < 1e-2
            assert np.abs(values - v[:, 0].astype(np.float32)).max() < 1e-2
    finally:
        d.stop()
