"""A careless or hostile caller against every public entry point of the kvarn package.

Each case hands one entry point (kvarn.Client, a Session method, kvarn.codec, kvarn.Layout) one
hostile argument made from a valid one: numpy arrays of every dtype, 0-d, empty, a rank off,
2^40 zero-stride rows, element counts past 2^64, negative/zero strides, strided, Fortran,
read-only, misaligned and big-endian arrays; torch tensors (transposed, bfloat16, int,
requires_grad, meta, sparse, expanded, negated); ints past 2^31, 2^32, 2^64, non-integral and
unknown ids; NaN/Inf; None, str, bytes; objects whose __array__, __index__ or __str__ is broken.
The call must return what the same call on a clean copy returns (same values, C order; a call
that writes runs on a fresh twin sequence, and the twins' dequantized K/V must agree), or raise
TypeError, ValueError, OverflowError, a kvarn.Error but INTERNAL/UNKNOWN (or the caller's own
exception) having changed nothing at the daemon (the session's sequences, the stats' counters
and block states, nothing left staged); it never writes into an input.

The cases run one at a time in a driver process (this file as a script, against the module's
kvarnd), each under a deadline (faulthandler.dump_traceback_later): a case that kills or hangs
the driver fails under its own name and a new driver goes on. RLIMIT_DATA caps the driver's
heap (a huge copy is a MemoryError, not swapping).
"""

import fractions
import importlib.util
import itertools
import json
import math
import mmap
import os
import resource
import sys

import numpy as np
import pytest

import kvarn
from kvarn import codec
import driven
from driven import CaseSkipped
from kvtest import G, LAYOUT, make_kv

L, H, D = LAYOUT["num_layers"], LAYOUT["num_kv_heads"], LAYOUT["head_dim"]
PRESET = LAYOUT["preset"]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
CASE_DEADLINE_S = 20.0
DRIVER_DEADLINE_S = 300.0
MAP_NORESERVE = 0x4000  # Linux; Python 3.11's mmap module does not name it
TIMING = {"encode_gbps", "decode_gbps", "encode_seconds", "decode_seconds"}
STATE_KEYS = ("sequences", "sessions", "seals", "evictions", "prefix_queried_tokens",
              "prefix_hit_tokens", "pool")
NO = "no valid meaning"  # the clean value of an input that must be refused
torch = None  # the driver imports it (kvarn looks for tensors only once the program has)


class CallerError(Exception):
    """What the test's sabotaged objects raise; it must reach the caller unchanged."""


def _fail(what):
    def method(self, *args, **kwargs):
        raise CallerError(f"broken {what}")
    return method


def sabotaged(name, **methods):  # an object whose protocol methods misbehave as given
    return type(name, (), methods)()


def overflowing(typestr, buf=np.zeros(8, np.uint8)):
    """An __array_interface__ of shape (2^62, 2^62): its element count overflows 64 bits."""
    return sabotaged("Overflowing", __array_interface__={
        "shape": (2**62, 2**62), "typestr": typestr, "version": 3, "strides": (0, 0),
        "data": (buf.ctypes.data, False)})


def short(x):
    r = repr(x).replace("\n", " ")
    return r if len(r) <= 160 else r[:160] + "..."


# ---- Inputs: (label, make) with make(c, valid) -> (hostile, clean) --------------------------
# c is the argument's valid array, valid(dtype) whether the argument takes that dtype.

def _misaligned(c):  # the values of c, one byte past an aligned buffer's start
    return np.frombuffer(bytearray(b"\0" + c.tobytes()), np.uint8)[1:].view(c.dtype).reshape(c.shape)


_strided = lambda c: np.repeat(c, 2, axis=-1)[..., ::2]  # noqa: E731 (c's values, strided)
_copy = lambda x: np.array(x, order="C", copy=True)  # noqa: E731


def _dtype(dt):
    def make(c, valid):
        h = np.zeros(c.shape, dt) if np.dtype(dt).kind in "MmV" else c.astype(dt)
        return h, (_copy(h) if valid(h.dtype) else NO)
    return make


def _value(x, dt=None):
    def make(c, valid):
        h = c.astype(dt or c.dtype)
        h.reshape(-1)[0] = x
        return h, _copy(h)
    return make


DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "longdouble", "complex64", "complex128", "object",
          ("datetime64", "M8[ns]"), ("timedelta64", "m8[ns]"), ("str", "U8"), ("bytes", "S8"),
          ("structured", [("f", "<f4")])]
COMMON = [(f"dtype_{d if isinstance(d, str) else d[0]}", _dtype(d if isinstance(d, str) else d[1]))
          for d in DTYPES] + [
    ("0d", lambda c, v: (np.asarray(c.reshape(-1)[0]), _copy(c.reshape(-1)[0]))),
    ("empty", lambda c, v: (c[:0], _copy(c[:0]))),
    ("rank_plus_1", lambda c, v: (c[None], _copy(c[None]))),
    ("rank_minus_1", lambda c, v: (c[0], _copy(c[0]))),
    ("fortran", lambda c, v: (np.asfortranarray(c), c)),
    ("strided", lambda c, v: (_strided(c), c)),
    ("negative_stride", lambda c, v: (c[::-1], _copy(c[::-1]))),
    ("zero_stride", lambda c, v: (np.broadcast_to(c[:1], c.shape), _copy(np.broadcast_to(c[:1], c.shape)))),
    ("read_only", lambda c, v: (np.lib.stride_tricks.as_strided(c.copy(), writeable=False), c)),
    ("misaligned", lambda c, v: (_misaligned(c), c)),
    ("big_endian", lambda c, v: (c.astype(c.dtype.newbyteorder(">")), c)),
    ("list", lambda c, v: (c.tolist(), np.asarray(c.tolist()))),
    *[(n, lambda c, v, x=x: (x, NO)) for n, x in [("none", None), ("str", "abc"), ("bytes", b"abc"),
                                                   ("object", object())]],
    ("broken_array", lambda c, v: (sabotaged("BrokenArray", __array__=_fail("__array__")), NO)),
    ("array_gives_list", lambda c, v: (sabotaged("ListArray", __array__=lambda *a, **k: [1.0]), NO)),
    ("overflowing_shape", lambda c, v: (overflowing(c.dtype.str), NO))]
# 2^40 rows of zero stride and one column too many: refusable from the shape alone.
HUGE = [("huge_zero_stride", lambda c, v: (
    np.broadcast_to(np.zeros((), c.dtype), (2**40,) + c.shape[1:-1] + (c.shape[-1] + 1,)), NO))]
FLOATS = COMMON + HUGE + [
    ("nan", _value(np.nan)), ("inf", _value(np.inf)), ("minus_inf", _value(-np.inf)),
    ("beyond_fp16", _value(7e4, np.float32)), ("float64_1e300", _value(1e300, np.float64))]
IDS = COMMON + [
    ("minus_1", lambda c, v: ([1, -1, 2], NO)), ("2^32", lambda c, v: ([1, 2**32, 2], NO)),
    ("2^32-1", lambda c, v: ([1, 2**32 - 1, 2], np.array([1, 2**32 - 1, 2]))),
    ("2^63", lambda c, v: ([1, 2**63, 2], NO)), ("2^64", lambda c, v: ([1, 2**64, 2], NO)),
    ("2^100", lambda c, v: ([1, 2**100, 2], NO)), ("min_int64", lambda c, v: ([1, -2**63, 2], NO)),
    ("bytearray", lambda c, v: (bytearray(b"\x05\x06\x07"), np.array([5, 6, 7], np.uint8))),
    ("range", lambda c, v: (range(5, 8), np.arange(5, 8))),
    ("generator", lambda c, v: ((i for i in c.tolist()), NO)),
    ("dict", lambda c, v: ({1: 2}, NO)),
    ("2^32_zero_stride", lambda c, v: (np.broadcast_to(np.uint32(5), (2**32,)), NO))]
RECORDS = COMMON + HUGE + [
    ("bytes_object", lambda c, v: (c.tobytes(), c.reshape(-1))),
    ("bytearray", lambda c, v: (bytearray(c.tobytes()), c.reshape(-1))),
    ("memoryview", lambda c, v: (memoryview(c), c)),
    ("memoryview_float32", lambda c, v: (memoryview(c.view(np.float32)), c)),
    ("memoryview_strided", lambda c, v: (memoryview(_strided(c)), c)),
    ("garbage", lambda c, v: 2 * (np.random.default_rng(7).integers(0, 256, c.shape, np.uint8),))]


def _t(c, dtype=None):
    return torch.from_numpy(np.ascontiguousarray(c if dtype is None else c.astype(dtype)))


TORCH_FLOATS = {  # label: c -> (hostile, clean); NO where the tensor must be refused
    "torch": lambda c: (_t(c), _t(c)),
    "torch_transposed": lambda c: (_t(np.swapaxes(c, -1, -2)).transpose(-1, -2), _t(c)),
    "torch_requires_grad": lambda c: (_t(c, np.float32).requires_grad_(True), _t(c, np.float32)),
    "torch_bfloat16": lambda c: (_t(c, np.float32).bfloat16(), _t(c, np.float32).bfloat16()),
    "torch_float64": lambda c: (_t(c, np.float64), _t(c, np.float64)),
    "torch_expanded": lambda c: (_t(c[:1]).expand(c.shape), _t(c[:1]).expand(c.shape).contiguous()),
    "torch_negative_view": lambda c: ((-_t(c, np.float32))._neg_view(), _t(c, np.float32)),
    "torch_int32": lambda c: (_t(c, np.int32), NO),
    "torch_meta": lambda c: (torch.empty(c.shape, device="meta"), NO),
    "torch_sparse": lambda c: (_t(c, np.float32).to_sparse(), NO),
    "torch_huge_expanded": lambda c: (
        torch.zeros(()).expand((2**40,) + c.shape[1:-1] + (c.shape[-1] + 1,)), NO)}
TORCH_IDS = {
    "torch_int64": lambda c: (_t(c, np.int64), _t(c, np.int64)),
    "torch_strided": lambda c: (_t(np.repeat(c, 2), np.int64)[::2], _t(c, np.int64)),
    "torch_float": lambda c: (_t(c, np.float32), NO),
    "torch_bool": lambda c: (_t(c, np.bool_), NO),
    "torch_meta": lambda c: (torch.empty(c.shape, dtype=torch.int64, device="meta"), NO)}
if HAVE_TORCH:
    FLOATS += [(n, lambda c, v, f=f: f(c)) for n, f in TORCH_FLOATS.items()]
    IDS += [(n, lambda c, v, f=f: f(c)) for n, f in TORCH_IDS.items()]

# Scalars: (label, make) with make(valid) -> (hostile, clean).
INTS = [("minus_1", lambda v: (-1, NO)), ("2^31", lambda v: (2**31, 2**31)),
        ("2^32", lambda v: (2**32 + v, 2**32 + v)), ("2^64", lambda v: (2**64 + v, NO)),
        ("2^100", lambda v: (2**100, NO)), ("numpy_int64", lambda v: (np.int64(v), v)),
        ("numpy_float32_fraction", lambda v: (np.float32(v + 0.5), NO)),
        ("fraction", lambda v: (fractions.Fraction(2 * v + 1, 2), NO)),
        ("float", lambda v: (float(v), NO)), ("nan", lambda v: (math.nan, NO)),
        ("str", lambda v: (str(v), NO)), ("none", lambda v: (None, NO)),
        ("broken_index", lambda v: (sabotaged("BrokenIndex", __index__=_fail("__index__")), NO)),
        ("huge_index", lambda v: (sabotaged("HugeIndex", __index__=lambda self: 2**70), NO))]
# A bool is not a count, a layer or a size (True is not 1) as it is not an id (_bool_id).
BOOLS = [("true", lambda v: (True, NO)), ("numpy_true", lambda v: (np.True_, NO))]
SEQS = INTS + [("unknown", lambda v: (2**64 - 1, NO)), ("numpy_uint64", lambda v: (np.uint64(v), v)),
               ("0d_array", lambda v: (np.array(v), v)), ("bytes", lambda v: (b"1", NO))]
FLOAT_SECONDS = [("nan", math.nan), ("inf", math.inf), ("minus_inf", -math.inf), ("1e300", 1e300),
                 ("zero", 0.0), ("minus_1", -1.0), ("str", "5"), ("none", None),
                 ("2^1100", 2**1100), ("numpy_float32", np.float32(2.5))]
STRS = [("empty", lambda v: ""), ("nul", lambda v: "\0"), ("nul_suffix", lambda v: v + "\0junk"),
        ("surrogate", lambda v: "\udcff"), ("utf8_bytes", lambda v: v.encode()),
        ("long", lambda v: "x" * 100_000), ("none", lambda v: None), ("int", lambda v: 5),
        ("list", lambda v: [v])]


# ---- Checks (in the driver) ------------------------------------------------------------------

def attempt(f):
    try:
        return True, f()
    except Exception as e:  # noqa: BLE001 (classified by the caller)
        return False, e


def refusal_ok(e):  # an exception that names the problem, or the caller's own
    if isinstance(e, kvarn.Error):
        return not isinstance(e, (kvarn.InternalError, kvarn.UnknownError))
    return isinstance(e, (TypeError, ValueError, OverflowError, CallerError))


refused = lambda e: f"{type(e).__name__}: {short(str(e))}"  # noqa: E731


def summary(x):  # what twin sequences have in common: the counts, not the block ids
    if isinstance(x, kvarn.SequenceTable):
        return (x.tokens, x.has_sink, len(x.quant_blocks), x.tail_tokens)
    if isinstance(x, (kvarn.AppendInfo, kvarn.SequenceInfo)):
        return (getattr(x, "sealed", None), getattr(x, "cached_tokens", None), summary(x.table))
    return x


def assert_same(got, want, where="result"):
    if torch is not None and isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where} is {type(got).__name__}, not a tensor"
        got, want = got.detach().numpy(), want.detach().numpy()
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and (got.dtype, got.shape) == (want.dtype, want.shape), \
            f"{where}: {getattr(got, 'shape', short(got))}; the clean call gave {want.dtype} {want.shape}"
        same = np.array_equal(got, want, equal_nan=want.dtype.kind in "fc")
        assert same, f"{where} differs from the clean call's: {short(got)} vs {short(want)}"
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {short(got)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, dict):
        assert set(got) - TIMING == set(want) - TIMING, f"{where} keys: {sorted(got)}"
        for k in set(want) - TIMING:
            assert_same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, BaseException):
        assert type(got) is type(want), f"{where}: {short(got)}; clean: {short(want)}"
    elif isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got), f"{where}: {got!r}, not NaN"
    else:
        assert summary(got) == summary(want), f"{where}: {short(got)}; clean: {short(want)}"


def untouched(x):
    """A check that the input x still holds what it holds now."""
    if isinstance(x, np.ndarray) and x.nbytes < 1 << 24:
        keep = x.copy()
        return lambda: np.array_equal(x, keep, equal_nan=x.dtype.kind in "fc")
    if torch is not None and isinstance(x, torch.Tensor) and x.layout == torch.strided \
            and x.device.type == "cpu" and x.numel() < 1 << 22:
        keep = x.detach().clone()
        return lambda: torch.equal(x.detach(), keep) or bool(torch.isnan(keep.float()).any())
    return lambda: True


class Ctx:
    """The driver's session: a sequence to read (an fp16 sink, a quantized tile, 10 tail
    tokens), fresh twin sequences for the calls that write, and the data the calls take."""

    def __init__(self, target):
        self.target = target
        self.client = kvarn.Client(target)
        self.s = self.client.open_session(f"hostile-{os.getpid()}", max_sequences=8)
        self.starts = itertools.count(1)
        prompt = self.prompt(2 * G + 10)
        self.R = self.s.create_sequence(prompt).id
        self.s.append(self.R, prompt, *make_kv(len(prompt), seed=5))
        self.B = self.s.table(self.R).quant_blocks[0]
        self.K3, self.V3 = make_kv(3, seed=1)
        self.K1, self.V1 = make_kv(1, seed=2)
        rng = np.random.default_rng(3)
        self.Q = rng.standard_normal((2 * H, D)).astype(np.float32)
        self.KT = rng.standard_normal((2, G, D)).astype(np.float16)  # codec tiles
        self.VT = (rng.standard_normal((2, G, D)) + 1).astype(np.float16)
        self.KE = rng.standard_normal((H, G + 6, D)).astype(np.float32)  # codec eval
        self.VE = (rng.standard_normal((H, G + 6, D)) + 1).astype(np.float32)
        self.REC = codec.encode(PRESET, self.KT, self.VT)

    def prompt(self, n):
        start = 100_000 * next(self.starts)
        return list(range(start, start + n))

    def fresh(self):
        return self.s.create_sequence(self.prompt(3)).id

    def mine(self):
        return sorted((x["sequence_id"], x["tokens"], x["tail_tokens"], x["quant_blocks"])
                      for x in self.s.list_sequences()["sequences"] if x["session_id"] == self.s.id)

    def state(self, seq):
        st = self.s.stats()
        ok, t = attempt(lambda: self.s.table(seq))
        return self.mine(), {k: st[k] for k in STATE_KEYS}, summary(t) if ok else type(t)

    def appendable(self, seq):
        """Nothing was left staged: one well-formed token commits right after the table."""
        before = self.s.table(seq).tokens
        ok, info = attempt(lambda: self.s.append(seq, [7], self.K1, self.V1))
        assert ok, f"after the refusal the sequence is unusable: {refused(info)}"
        assert info.table.tokens == before + 1, f"then append gave {info.table.tokens} tokens"

    def drop(self, *seqs):
        for q in seqs:
            attempt(lambda: self.s.release(q))

    def judge(self, hostile_call, clean_call, hostile, clean, state, retry=None, writes=False):
        """hostile_call() is refused (state() unchanged, then retry() passes), or it returns
        what clean_call() does; it writes nothing into hostile."""
        before, intact = state(), (lambda: True) if writes else untouched(hostile)
        ok, got = attempt(hostile_call)
        assert intact(), "the call wrote into its input"
        if not ok:
            assert refusal_ok(got), f"raised {refused(got)}"
            assert state() == before, f"refused ({refused(got)}), yet the daemon's state changed"
            return retry() if retry else None
        assert clean is not NO, f"accepted an input with no valid meaning; returned {short(got)}"
        ok, want = attempt(clean_call)
        assert ok, f"accepted, but the clean copy raised {refused(want)}"
        assert_same(got, want)
        return True

    def pure(self, call, hostile, clean, writes=False, session=True):
        """A call that changes nothing, on the sequence R; the daemon's state checked."""
        self.judge(lambda: call(hostile), lambda: call(clean), hostile, clean,
                   (lambda: self.state(self.R)) if session else (lambda: None), writes=writes)

    def write(self, call, hostile, clean, setup=None, retry=None):
        """A call that writes: call(a, hostile) and call(b, clean) on fresh twins a and b."""
        a, b = self.fresh(), self.fresh()
        made = []

        def track(r):  # sequences the call made, to release
            made.extend([r.id] if isinstance(r, kvarn.SequenceInfo) else [])
            return r
        try:
            for q in (a, b):
                if setup:
                    setup(q)
            if self.judge(lambda: track(call(a, hostile)), lambda: track(call(b, clean)), hostile,
                          clean, lambda: self.state(a), lambda: (retry or self.appendable)(a)) is True:
                alive = [any(x[0] == q for x in self.mine()) for q in (a, b)]
                assert alive[0] == alive[1], f"the twins differ: exists {alive}"
                if all(alive):
                    assert_same(self.s.dequantize(a), self.s.dequantize(b), "the dequantized K/V")
        finally:
            self.drop(a, b, *made)


# ---- Cases -----------------------------------------------------------------------------------
CASES = {}  # name -> (run(ctx), deadline in seconds)


def add(name, run, deadline=CASE_DEADLINE_S):
    assert name not in CASES, name
    CASES[name] = (run, deadline)


def add_arrays(entry, variants, valid, base, check, optional=False):
    """entry=label: check(ctx, hostile, clean) for each variant of base(ctx); optional: None valid."""
    for label, make in variants:
        def run(ctx, make=make):
            h, c = make(base(ctx), valid)
            return check(ctx, h, None if optional and h is None else c)
        add(f"{entry}={label}", run)


is_float = lambda dt: dt.kind == "f"  # noqa: E731
is_int = lambda dt: dt.kind in "iu"  # noqa: E731
# K/V of new tokens: append, append_inline, stage (+ commit), each argument hostile.
for _entry, _fn in [("append", lambda s, q, k, v: s.append(q, [1, 2, 3], k, v)),
                    ("append_inline", lambda s, q, k, v: s.append_inline(q, [1, 2, 3], k, v)),
                    ("stage", lambda s, q, k, v: (s.stage(q, k, v), s.commit(q, [1, 2, 3]))[1])]:
    add_arrays(f"{_entry}.keys", FLOATS, is_float, lambda ctx: ctx.K3,
               lambda ctx, h, c, fn=_fn: ctx.write(lambda q, x: fn(ctx.s, q, x, ctx.V3), h, c))
    add_arrays(f"{_entry}.values", FLOATS, is_float, lambda ctx: ctx.V3,
               lambda ctx, h, c, fn=_fn: ctx.write(lambda q, x: fn(ctx.s, q, ctx.K3, x), h, c))

add_arrays("attend.queries", FLOATS, is_float, lambda ctx: ctx.Q,
           lambda ctx, h, c: ctx.pure(lambda x: ctx.s.attend(ctx.R, 0, x), h, c))
add_arrays("attend.out", FLOATS, lambda dt: dt == np.float32, lambda ctx: np.zeros((2 * H, D), np.float32),
           lambda ctx, h, c: ctx.pure(lambda x: ctx.s.attend(ctx.R, 0, ctx.Q, out=x), h, c, writes=True),
           optional=True)
add_arrays("codec.encode.keys", FLOATS, is_float, lambda ctx: ctx.KT,
           lambda ctx, h, c: ctx.pure(lambda x: codec.encode(PRESET, x, ctx.VT), h, c, session=False))
add_arrays("codec.encode.values", FLOATS, is_float, lambda ctx: ctx.VT,
           lambda ctx, h, c: ctx.pure(lambda x: codec.encode(PRESET, ctx.KT, x), h, c, session=False))
add_arrays("codec.eval.keys", FLOATS, is_float, lambda ctx: ctx.KE,
           lambda ctx, h, c: ctx.pure(lambda x: codec.eval(PRESET, x, ctx.VE), h, c, session=False))
add_arrays("codec.eval.queries", FLOATS, is_float, lambda ctx: ctx.Q,
           lambda ctx, h, c: ctx.pure(lambda x: codec.eval(PRESET, ctx.KE, ctx.VE, queries=x), h, c,
                                      session=False), optional=True)
add_arrays("codec.decode.records", RECORDS, lambda dt: dt == np.uint8, lambda ctx: ctx.REC,
           lambda ctx, h, c: ctx.pure(lambda x: codec.decode(PRESET, x), h, c, session=False))


def _fp16_view(ctx):  # fp16 records of D=64 are half those of D=128: the shape must stay
    rec = codec.encode("fp16", *2 * (np.ones((2, 128, D), np.float32),))
    ctx.pure(lambda x: codec.decode("fp16", x), memoryview(rec), rec, session=False)


add("codec.decode.records=memoryview_of_2_fp16_records", _fp16_view)


def raised(results):  # commit_batch returns an item's error: a batch of one that failed refused
    if len(results) == 1 and isinstance(results[0], kvarn.Error):
        raise results[0]
    return results


_staged3 = lambda ctx: dict(setup=lambda q: ctx.s.stage(q, ctx.K3, ctx.V3),  # noqa: E731
                            retry=lambda q: ctx.s.commit(q, [1, 2, 3]))  # staged tokens kept
_ids = lambda ctx: np.array([5, 6, 7], np.uint32)  # noqa: E731
add_arrays("create_sequence.prompt", IDS, is_int, _ids,
           lambda ctx, h, c: ctx.write(lambda q, x: ctx.s.create_sequence(x), h, c))
add_arrays("lookup.prompt", IDS, is_int, _ids, lambda ctx, h, c: ctx.pure(ctx.s.lookup, h, c))
add_arrays("append.token_ids", IDS, is_int, _ids,
           lambda ctx, h, c: ctx.write(lambda q, x: ctx.s.append(q, x, ctx.K3, ctx.V3), h, c))
add_arrays("commit.token_ids", IDS, is_int, _ids,
           lambda ctx, h, c: ctx.write(lambda q, x: ctx.s.commit(q, x), h, c, **_staged3(ctx)))
add_arrays("commit_batch.token_ids", IDS, is_int, _ids,
           lambda ctx, h, c: ctx.write(lambda q, x: raised(ctx.s.commit_batch([(q, x)])), h, c,
                                       **_staged3(ctx)))

# Sequence ids: the hostile value made from the sequence's own id.
_stage1 = lambda ctx, q: ctx.s.stage(q, ctx.K1, ctx.V1)  # noqa: E731
SEQ_WRITES = {
    "fork": lambda ctx, q, x: ctx.s.fork(x),
    "stage": lambda ctx, q, x: (ctx.s.stage(x, ctx.K1, ctx.V1), ctx.s.commit(q, [1]))[1],
    "commit": lambda ctx, q, x: (_stage1(ctx, q), ctx.s.commit(x, [1]))[1],
    "append": lambda ctx, q, x: ctx.s.append(x, [1], ctx.K1, ctx.V1),
    "append_inline": lambda ctx, q, x: ctx.s.append_inline(x, [1], ctx.K1, ctx.V1),
    "release": lambda ctx, q, x: ctx.s.release(x),
    "commit_batch": lambda ctx, q, x: (_stage1(ctx, q), raised(ctx.s.commit_batch([(x, [1])])))[1]}
SEQ_READS = {
    "table": lambda ctx, x: ctx.s.table(x), "attend": lambda ctx, x: ctx.s.attend(x, 0, ctx.Q),
    "dequantize": lambda ctx, x: ctx.s.dequantize(x), "read": lambda ctx, x: ctx.s.read(x, 0)}


def _seq_write(method, make):  # a refused commit leaves its staged token, which must commit
    retry = (lambda ctx, q: ctx.s.commit(q, [1])) if method.startswith("commit") else Ctx.appendable
    return lambda ctx: ctx.write(lambda q, pick: SEQ_WRITES[method](ctx, q, make(q)[0 if pick else 1]),
                                 True, NO if make(0)[1] is NO else False, retry=lambda q: retry(ctx, q))


for _label, _make in SEQS:
    for _m in SEQ_WRITES:
        add(f"{_m}.sequence={_label}", _seq_write(_m, _make))
    for _m, _fn in SEQ_READS.items():
        add(f"{_m}.sequence={_label}",
            lambda ctx, fn=_fn, make=_make: ctx.pure(lambda x: fn(ctx, x), *make(ctx.R)))


def _bool_id(call):
    """A bool is not an id (True is not sequence or block 1): a TypeError, whichever method
    takes the id, as release() always refused it, having changed nothing."""
    def run(ctx):
        q = ctx.fresh()
        try:
            before = ctx.state(q)
            for x in (True, np.True_):
                ok, got = attempt(lambda: call(ctx, q, x))
                assert not ok, f"took {x!r} as an id; returned {short(got)}"
                assert type(got) is TypeError, f"{x!r}: raised {refused(got)}, not a TypeError"
                assert ctx.state(q) == before, f"refused {x!r}, yet the daemon's state changed"
        finally:
            ctx.drop(q)
    return run


for _m, _fn in SEQ_WRITES.items():
    add(f"{_m}.sequence=bool", _bool_id(_fn))
for _m, _fn in SEQ_READS.items():
    add(f"{_m}.sequence=bool", _bool_id(lambda ctx, q, x, fn=_fn: fn(ctx, x)))
add("release.sequences=list_of_bool", _bool_id(lambda ctx, q, x: ctx.s.release([q, x])))
add("dequantize_block.block=bool", _bool_id(lambda ctx, q, x: ctx.s.dequantize_block(x)))
add("block_bytes.block=bool", _bool_id(lambda ctx, q, x: ctx.s.block_bytes(x)))


def _iterable_case(call, hostile, clean, retry=None):
    return lambda ctx: ctx.write(lambda q, pick: call(ctx, q, (hostile if pick else clean)(q)),
                                 True, NO if clean is None else False,
                                 retry=retry and (lambda q: retry(ctx, q)))


for _label, (_h, _c) in {
        "empty_list": (lambda q: [], lambda q: []), "twice": (lambda q: [q, q], None),
        "with_unknown": (lambda q: [q, 2**64 - 1], None), "list_2^64": (lambda q: [q, 2**64], None),
        "generator": (lambda q: (i for i in [q]), lambda q: [q]),
        "raising_generator": (lambda q: (_fail("generator")(None) for _ in [q]), None),
        "set": (lambda q: {q}, lambda q: [q]), "str": (lambda q: str(q), None),
        "numpy_uint64_array": (lambda q: np.array([q], np.uint64), lambda q: [q]),
        "2d_array": (lambda q: np.array([[q]]), None)}.items():
    add(f"release.sequences={_label}", _iterable_case(lambda ctx, q, x: ctx.s.release(x), _h, _c))
for _label, (_h, _c) in {
        "int": (lambda q: 5, None), "none": (lambda q: None, None), "str": (lambda q: "ab", None),
        "one_tuple": (lambda q: [(q,)], None), "triple": (lambda q: [(q, [1], 1)], None),
        "dict": (lambda q: {q: [1]}, None), "list_pair": (lambda q: [[q, [1]]], lambda q: [(q, [1])]),
        "empty": (lambda q: [], lambda q: []),
        "raising_iterator": (lambda q: itertools.chain([(q, [1])], (_fail("iterator")(0) for _ in [0])), None),
        "duplicate_items": (lambda q: [(q, [1])] * 2, lambda q: [(q, [1])] * 2)}.items():
    add(f"commit_batch.items={_label}", _iterable_case(
        lambda ctx, q, x: (_stage1(ctx, q), ctx.s.commit_batch(x))[1], _h, _c,
        retry=lambda ctx, q: ctx.s.commit(q, [1])))  # the refusal kept the staged token

# Other integer arguments: (entry, valid value, None is its default, call(ctx, x)).
INT_ARGS = [
    ("attend.layer", 0, False, lambda ctx, x: ctx.s.attend(ctx.R, x, ctx.Q)),
    ("dequantize.layer", 1, True, lambda ctx, x: ctx.s.dequantize(ctx.R, x)),
    ("dequantize_block.block", None, False, lambda ctx, x: ctx.s.dequantize_block(x)),
    ("dequantize_block.layer", 1, True, lambda ctx, x: ctx.s.dequantize_block(ctx.B, x)),
    ("dequantize_block.head", 1, True, lambda ctx, x: ctx.s.dequantize_block(ctx.B, 0, x)),
    ("block_bytes.block", None, False, lambda ctx, x: ctx.s.block_bytes(x)),
    ("read.layer", 1, False, lambda ctx, x: ctx.s.read(ctx.R, x)),
    ("read.start", 3, False, lambda ctx, x: ctx.s.read(ctx.R, 0, x)),
    ("read.count", 5, True, lambda ctx, x: ctx.s.read(ctx.R, 0, 0, x)),
    ("evict.bytes", 0, False, lambda ctx, x: ctx.s.evict("tenant", bytes=x)),
    ("codec.encode.iterations", 3, False, lambda ctx, x: codec.encode(PRESET, ctx.KT, ctx.VT, iterations=x)),
    ("codec.decode.head_dim", 64, True, lambda ctx, x: codec.decode(PRESET, ctx.REC, head_dim=x)),
    ("codec.eval.iterations", 3, False, lambda ctx, x: codec.eval(PRESET, ctx.KE, ctx.VE, iterations=x)),
    ("codec.eval.random_queries", 3, False,
     lambda ctx, x: codec.eval(PRESET, ctx.KE, ctx.VE, random_queries=x)),
    ("codec.eval.seed", 3, False, lambda ctx, x: codec.eval(PRESET, ctx.KE, ctx.VE, seed=x)),
    ("codec.preset_info.head_dim", 64, False, lambda ctx, x: codec.preset_info(PRESET, x))]


def _int_case(entry, valid, optional, fn, make):
    def run(ctx):
        h, c = make(ctx.B if valid is None else valid)
        c = None if optional and h is None else c
        return ctx.pure(lambda x: fn(ctx, x), h, c, session=not entry.startswith("codec"))
    return run


for _entry, _valid, _opt, _fn in INT_ARGS:
    for _label, _make in INTS + BOOLS:
        add(f"{_entry}={_label}", _int_case(_entry, _valid, _opt, _fn, _make))


def _aliased(ctx, shift):
    """attend's out= sharing memory with its queries (the same rows, or shifted by one)."""
    buf = np.zeros((2 * H + shift, D), np.float32)
    buf[:2 * H] = ctx.Q
    ok, got = attempt(lambda: ctx.s.attend(ctx.R, 0, buf[:2 * H], out=buf[shift:shift + 2 * H]))
    assert ok or refusal_ok(got), f"raised {refused(got)}"
    if ok:
        assert_same(got, ctx.s.attend(ctx.R, 0, ctx.Q), "out (sharing memory with the queries)")


add("attend.out=the_queries_array", lambda ctx: _aliased(ctx, 0))
add("attend.out=overlapping_the_queries", lambda ctx: _aliased(ctx, 1))
for _label, _x in [("str", "yes"), ("none", None), ("int_2", 2), ("numpy_bool", np.bool_(True))]:
    add(f"attend.return_lse={_label}", lambda ctx, x=_x: ctx.pure(
        lambda y: ctx.s.attend(ctx.R, 0, ctx.Q, return_lse=y), x, bool(x)))

# Strings: (entry, valid, any str is a valid value, call(ctx, x)).
STR_ARGS = [
    ("codec.encode.preset", PRESET, False, lambda ctx, x: codec.encode(x, ctx.KT, ctx.VT)),
    ("codec.decode.preset", PRESET, False, lambda ctx, x: codec.decode(x, ctx.REC)),
    ("codec.decode.frame", "storage", False, lambda ctx, x: codec.decode(PRESET, ctx.REC, frame=x)),
    ("codec.eval.presets", PRESET, False, lambda ctx, x: codec.eval(x, ctx.KE, ctx.VE)),
    ("codec.preset_info.preset", PRESET, False, lambda ctx, x: codec.preset_info(x, 64)),
    ("evict.scope", "tenant", False, lambda ctx, x: ctx.s.evict(x)),
    ("evict.tenant", "", True, lambda ctx, x: ctx.s.evict("tenant", tenant=x))]


def _str_case(entry, valid, free, fn, label, make):
    def run(ctx):
        h = make(valid)
        c = {"utf8_bytes": valid, "list": [valid] if entry == "codec.eval.presets" else NO}.get(
            label, h if free and isinstance(h, str) else NO)
        return ctx.pure(lambda x: fn(ctx, x), h, c, session=not entry.startswith("codec"))
    return run


for _entry, _valid, _free, _fn in STR_ARGS:
    for _label, _make in STRS:
        add(f"{_entry}={_label}", _str_case(_entry, _valid, _free, _fn, _label, _make))
for _label, _x, _c in [("zero", 0, 0), ("64", 64, 64), ("str_64", "64", "64"), ("minus_1", -1, NO),
                       ("2^64", 2**64, NO), ("nan", math.nan, NO), ("none", None, NO),
                       ("float", 3.5, NO), ("nul_suffix", "G\0junk", NO), ("surrogate", "\udcff", NO),
                       ("broken_str", sabotaged("BrokenStr", __str__=_fail("__str__")), NO)]:
    add(f"codec.eval.sink_tokens={_label}", lambda ctx, x=_x, c=_c: ctx.pure(
        lambda y: codec.eval(PRESET, ctx.KE, ctx.VE, sink_tokens=y), x, c, session=False))


# open_session: labels, max_sequences, layouts. A refusal leaves the daemon's state alone.
def _session_case(kwargs, valid):
    def run(ctx):
        before = ctx.state(ctx.R)
        ok, got = attempt(lambda: ctx.client.open_session(**kwargs()))
        if not ok:
            assert refusal_ok(got), f"raised {refused(got)}"
            assert ctx.state(ctx.R) == before, f"refused ({refused(got)}), yet the daemon's state changed"
            return
        with got:
            assert valid, f"opened a session for an argument with no valid meaning ({short(kwargs())})"
            assert got.stats()["sessions"] == before[1]["sessions"] + 1
    return run


for _arg in ("tenant", "client_name", "tenant_token", "admin_token"):
    for _label, _make in STRS:
        add(f"open_session.{_arg}={_label}", _session_case(
            lambda a=_arg, make=_make: {"tenant": "t-" + a, "max_sequences": 1, a: make("t")},
            isinstance(_make("t"), (str, bytes))))
for _label, _make in INTS + BOOLS:
    add(f"open_session.max_sequences={_label}", _session_case(
        lambda make=_make: {"tenant": "t-max", "max_sequences": make(1)[0]}, _make(1)[1] is not NO))
for _field, _values in [("model_id", ["", "\0", "m" * 300]), ("num_layers", [0, 1, 3, 2**32 - 1]),
                        ("num_kv_heads", [0, 2**32 - 1]), ("head_dim", [0, 63, 2**31]),
                        ("preset", ["", "bogus", PRESET + "\0"]), ("sink_tokens", [1, 2**32 - 1])]:
    for _x in _values:
        add(f"open_session.layout.{_field}={short(_x)[:12]}", _session_case(
            lambda f=_field, x=_x: {"tenant": "t-layout", "layout": kvarn.Layout(**{**LAYOUT, f: x})},
            False))
for _field in ("num_layers", "head_dim", "sink_tokens"):
    for _label, _make in INTS + BOOLS:
        add(f"Layout.{_field}={_label}", lambda ctx, f=_field, make=_make: ctx.pure(
            lambda x: getattr(kvarn.Layout(**{**LAYOUT, f: x}), f), *make(LAYOUT[f]), session=False))


def _set_field(field, x):
    """layout.field = x: the value set, or the refusal, having left the field as it was."""
    layout = kvarn.Layout(**LAYOUT)
    try:
        setattr(layout, field, x)
    except BaseException:
        assert getattr(layout, field) == LAYOUT[field], f"refused, yet {field} changed"
        raise
    return getattr(layout, field)


for _field in ("num_layers", "num_kv_heads", "head_dim", "sink_tokens"):
    for _label, _make in INTS + BOOLS:
        add(f"Layout.{_field}.setter={_label}", lambda ctx, f=_field, make=_make: ctx.pure(
            lambda x: _set_field(f, x), *make(LAYOUT[f]), session=False))


def _eq_none(obj):  # the careless comparison: False, or a TypeError
    ok, got = attempt(lambda: obj == None)  # noqa: E711
    assert (ok and got is False) or (not ok and refusal_ok(got)), f"== None gave {short(got)}"


add("Layout.__eq__=None", lambda ctx: _eq_none(ctx.s.layout))
add("SequenceTable.__eq__=None", lambda ctx: _eq_none(ctx.s.table(ctx.R)))


# Client against the live daemon. A refused timeout must be named (TypeError/ValueError), not
# reported as the daemon's failure (UNAVAILABLE, DEADLINE_EXCEEDED); an accepted one must work.
def _client_case(kwargs, valid, target=None):
    def run(ctx):
        ok, c = attempt(lambda: kvarn.Client(ctx.target if target is None else target(ctx), **kwargs))
        if not ok:
            named = isinstance(c, (TypeError, ValueError, OverflowError)) and not isinstance(c, kvarn.Error)
            assert named or (target is not None and refusal_ok(c)), f"raised {refused(c)}"
            return
        ok, d = attempt(c.describe)
        assert ok, f"accepted {short(kwargs)}, then describe() raised {refused(d)}"
        assert valid, f"accepted {short(kwargs)} (an argument with no valid meaning)"
    return run


for _arg in ("rpc_timeout", "connect_timeout"):
    for _label, _x in FLOAT_SECONDS:
        add(f"Client.{_arg}={_label}", _client_case({_arg: _x}, _label in ("1e300", "inf", "numpy_float32")))
for _label, _make in STRS:  # the targets that reach the daemon get time to connect
    add(f"Client.target={_label}", _client_case(
        {"connect_timeout": 2.0 if _label in ("utf8_bytes", "nul_suffix") else 0.3}, _label == "utf8_bytes",
        target=lambda ctx, make=_make: make(ctx.target)))
add("Client.target=unix_path_too_long",
    _client_case({"connect_timeout": 0.3}, False, target=lambda ctx: "unix:/" + "a" * 5000))


# Counts past 2^32 in arrays that exist (shared zero pages: nothing is allocated).
def _zero_pages(nbytes):
    try:
        return mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | MAP_NORESERVE)
    except OSError as e:
        raise CaseSkipped(f"no {nbytes >> 40} TiB zero-page mapping here (vm.overcommit_memory=2?): {e}")


def _attend_2_32_heads(ctx):
    n = 2**32 + H  # a multiple of the kv-heads; H as a 32-bit int
    q = np.frombuffer(_zero_pages(n * D * 4), np.float32).reshape(n, D)
    out = np.frombuffer(_zero_pages(n * D * 4), np.float32).reshape(n, D)
    ok, got = attempt(lambda: ctx.s.attend(ctx.R, 0, q, out=out))
    assert ok or refusal_ok(got), f"raised {refused(got)}"
    if ok:
        want = ctx.s.attend(ctx.R, 0, np.zeros((H, D), np.float32))  # zero queries: a row per kv-head
        group = n // H
        for row in (0, 1, H, group - 1, group, n - 1):
            assert np.array_equal(out[row], want[row // group]), \
                f"query head {row} of {n} is not attention over kv-head {row // group}"


add("attend.queries=2^32+2_heads_of_zero_pages", _attend_2_32_heads)
add("stage.keys=2^32+1_tokens_of_zero_pages", lambda ctx: ctx.write(  # 1 as a 32-bit int
    lambda q, kv: ctx.s.stage(q, kv, kv), np.frombuffer(_zero_pages((2**32 + 1) * L * H * D * 2),
                                                        np.float16).reshape(-1, L, H, D), NO))

# ---- The driver (this file as a script) and the tests ----------------------------------------

def driver(target, names):
    global torch
    torch = importlib.import_module("torch") if HAVE_TORCH else None
    ctx = Ctx(target)
    with open("/proc/self/status") as f:  # heap: what the setup took, and 4 GiB
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmData:"))
    cap, hard = (kib << 10) + (4 << 30), resource.getrlimit(resource.RLIMIT_DATA)[1]
    resource.setrlimit(resource.RLIMIT_DATA, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    driven.run_cases(CASES, names, ctx, refused, 600)


def run_driver(target, names):
    return driven.run_driver([sys.executable, os.path.abspath(__file__), target], CASES, names,
                             DRIVER_DEADLINE_S, 15)


@pytest.fixture(scope="module")
def outcomes(daemon):
    return run_driver(daemon.target, list(CASES))


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input(name, outcomes):
    ok, detail = outcomes[name]
    if ok is None:
        pytest.skip(detail)
    assert ok, f"{name}: {detail}"


def test_the_daemon_survived_every_case(daemon, outcomes):
    assert daemon.proc.poll() is None, f"kvarnd exited:\n{daemon.log()[-3000:]}"
    assert kvarn.Client(daemon.target).describe()["epoch"] == daemon.epoch


if __name__ == "__main__":
    driver(sys.argv[1], json.load(sys.stdin))
