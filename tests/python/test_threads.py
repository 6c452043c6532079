"""Many Python threads against one kvarn.Session, its Client and kvarn.codec.

The bindings release the GIL around every blocking call and document that methods may be
called from any thread; each call holds the C++ Session for its duration. The cases:

* shared_session_matches_serial: threads share one session, each with its own sequences
  (some sharing a prompt prefix), and run create, append past tile boundaries, stage+commit,
  attend (with and without out=, with lse), read, dequantize, fork, commit_batch and release,
  several rounds; every result equals, bit for bit, the same work run serially in one thread.
* close_*: a session closed (close() from two threads, a ``with`` block, or its last reference
  dropped) while other threads are inside calls, or its Client dropped: calls in flight
  complete correctly or raise kvarn.NotFoundError "this session is closed", later calls raise
  it, and once the threads are joined the daemon no longer has the session.
* numpy_kv_written_during_*, *queries*_written_during_attend: inputs (and out=) written by
  another thread while a call runs without the GIL: the call reads one of the values each
  element held and writes into no input. torch_kv_set/resized_during_append: the keys'
  tensor re-pointed (``set_``) or grown (``resize_``) in the middle of the call, after the
  call took it (a hook in the values' conversion; from another thread this would race with
  torch's own reads of the tensor): the call reads the storage it took, never freed memory,
  and the storage cannot be resized under it (docs/python.md, Threads).
* codec_threads_match_serial: kvarn.codec encode, decode and eval on shared and separate
  inputs from many threads give exactly the serial results.
* exit_with_threads_in_calls_*: the interpreter exits normally while daemon threads are inside
  binding calls: exit status 0, no abort, within a deadline.

Every case runs in a driver process (this file as a script, against the module's kvarnd) under
a deadline (faulthandler.dump_traceback_later), as test_hostile_inputs.py runs its cases: a
case that crashes or hangs the driver fails under its own name and a new driver goes on.
Threads meet at Barriers, Conditions and Events, never at sleeps, and every join has a deadline.
"""

import gc
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

import kvarn
from kvarn import codec
import driven
from driven import CaseSkipped
from kvtest import G, LAYOUT, tokens

L, H, D = LAYOUT["num_layers"], LAYOUT["num_kv_heads"], LAYOUT["head_dim"]
PRESET = LAYOUT["preset"]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
JOIN_S = 20.0  # every join's deadline
CASE_DEADLINE_S = 40.0
DRIVER_DEADLINE_S = 200.0
EXIT_DEADLINE_S = 30.0
TIMING = {"encode_gbps", "decode_gbps", "encode_seconds", "decode_seconds"}
# Tail K/V come back through one rotation and fp16 rounding (test_session.py FP16_PARTS: 2e-3
# relative); 0.05 absolute is far above that for values of magnitude ~5, and far below the
# distance 4 between the two values a racing writer alternates.
TAIL_TOL = 0.05
_LEFT_OPEN = None  # exit_scenario's session, left open at exit
torch = None  # the driver imports it (kvarn looks for tensors only once the program has)

# K/V as a function of the token id, so that sequences sharing a prompt prefix hold the same
# K/V in it (as a model's do), whichever of them appended it.
_rng = np.random.default_rng(20)
M = 509
KTAB = _rng.standard_normal((M, L, H, D)).astype(np.float16)
VTAB = (_rng.standard_normal((M, L, H, D)) + 1.5 * _rng.standard_normal(D)).astype(np.float16)


def kv(ids):
    i = np.asarray(ids) % M
    return KTAB[i], VTAB[i]


def queries(seed):
    return np.random.default_rng(seed).standard_normal((2 * H, D)).astype(np.float32)


def summary(t):
    return (t.tokens, t.has_sink, len(t.quant_blocks), t.tail_tokens)


def assert_same(got, want, where="result"):
    """Bit for bit: arrays by dtype, shape and bytes; dicts less the timing keys."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: {type(got).__name__}, not an array"
        assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{where}: {got.dtype} {got.shape}"
        assert got.tobytes() == want.tobytes(), f"{where} differs from the serial run's"
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {got!r:.200}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, dict):
        assert set(got) - TIMING == set(want) - TIMING, f"{where} keys: {sorted(got)}"
        for k in set(want) - TIMING:
            assert_same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, float) and want != want:  # NaN
        assert isinstance(got, float) and got != got, f"{where}: {got!r}, not NaN"
    else:
        assert got == want, f"{where}: {got!r:.200}; serially {want!r:.200}"


def run_threads(*targets):
    """Runs each target in a thread, joins each with a deadline, re-raises the first error."""
    errors = []

    def guarded(f):
        def run():
            try:
                f()
            except BaseException as e:  # noqa: BLE001 (re-raised in the caller)
                errors.append(e)
        return run
    threads = [threading.Thread(target=guarded(f), daemon=True) for f in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    hung = sum(t.is_alive() for t in threads)
    assert not hung, f"{hung} of {len(threads)} threads still running after {JOIN_S} s"
    if errors:
        raise errors[0]


def live_session_ids(observer):
    return {row["session_id"] for row in observer.stats()["session_info"]}


def near_one_of(got, *candidates, tol=TAIL_TOL):
    """Each element within tol of the same element of one of the candidates."""
    return np.all(np.min([np.abs(got - c.astype(np.float32)) for c in candidates], axis=0) <= tol)


# ---- Cases -----------------------------------------------------------------------------------
CASES = {}  # name -> (run(target), deadline in seconds)


def case(name, deadline=CASE_DEADLINE_S):
    def register(run):
        assert name not in CASES, name
        CASES[name] = (run, deadline)
        return run
    return register


# 1. One session, many threads, each with its own sequences: the serial results, bit for bit.
THREADS, ROUNDS = 4, 8
PREFIX = tokens(9_000_000, 2 * G + 5)


def round_of_work(s, t, r):
    """Thread t's round r on session s; returns everything it read."""
    base = 1_000_000 * (t + 1) + 10_000 * r
    prompt = (PREFIX + tokens(base, 20 + 7 * r + 3 * t) if (t + r) % 2 == 0
              else tokens(base, 140 + 11 * r + 5 * t))
    log = []
    seq, cached, _ = s.create_sequence(prompt)
    assert cached % G == 0 and cached < len(prompt), f"adopted {cached} of {len(prompt)} tokens"
    rest = prompt[cached:]
    info = s.append(seq, rest, *kv(rest))  # past tile boundaries: appended in parts
    log.append(summary(info.table))
    # The rest of the tile in two stages and one commit: it seals.
    ids = tokens(base + 1000, G - info.table.tail_tokens)
    k, v = kv(ids)
    for part in (slice(0, len(ids) // 2), slice(len(ids) // 2, len(ids))):
        if part.stop > part.start:
            s.stage(seq, k[part], v[part])
    info = s.commit(seq, ids)
    log.append((info.sealed, summary(info.table)))
    ids = tokens(base + 2000, 10)
    log.append(summary(s.append(seq, ids, *kv(ids)).table))
    q = queries(1000 * t + r)
    for layer in range(L):
        out = np.full((2 * H, D), np.nan, np.float32)
        assert s.attend(seq, layer, q, out=out) is out
        log += [s.attend(seq, layer, q), out, *s.attend(seq, layer, q, return_lse=True)]
        log += list(s.read(seq, layer))
    log += list(s.dequantize(seq))
    fork = s.fork(seq).id
    ids = tokens(base + 3000, 5)
    log.append(summary(s.append(fork, ids, *kv(ids)).table))
    log += [s.attend(fork, 0, q), *s.dequantize(fork)]
    a, b = tokens(base + 4000, 3), tokens(base + 5000, 4)
    s.stage(seq, *kv(a))
    s.stage(fork, *kv(b))
    results = s.commit_batch([(seq, a), (fork, b)])
    assert not any(isinstance(x, kvarn.Error) for x in results), f"commit_batch: {results}"
    log.append([summary(x.table) for x in results])
    log += [s.attend(seq, 1, q), s.attend(fork, 1, q), summary(s.table(fork))]
    s.release([seq, fork])
    return log


@case("shared_session_matches_serial")
def _shared_session(target):
    client = kvarn.Client(target)
    logs = {}
    with client.open_session("threads-shared", max_sequences=2 * THREADS) as s:
        start = threading.Barrier(THREADS)

        def thread(t):
            start.wait(JOIN_S)
            logs[t] = [round_of_work(s, t, r) for r in range(ROUNDS)]
        run_threads(*[lambda t=t: thread(t) for t in range(THREADS)])
        assert s.list_sequences()["sequences"] == [] or all(
            x["session_id"] != s.id for x in s.list_sequences()["sequences"]), "sequences left"
    # The same work in one thread, on a session of another tenant (its own prefix cache).
    with client.open_session("threads-serial", max_sequences=2) as s:
        for r in range(ROUNDS):
            for t in range(THREADS):
                assert_same(logs[t][r], round_of_work(s, t, r), f"thread {t} round {r}")


# 2. Closing a session while other threads are inside calls.
WORKERS = 4
READ_PROMPT = tokens(7_000_000, 2 * G + 10)
Q = queries(7)


class Fixture:
    """Per worker, a sequence to read (the same prompt and K/V: a cached prefix and a tail) and
    what reading it gives, and a sequence to write to. Calls on one sequence are serialized
    by the caller (the daemon refuses concurrent ones), so each worker has its own."""

    def __init__(self, s, workers):
        self.reads = []
        for _ in range(workers):  # the prefix is adopted from the cache after the first
            seq, cached, _ = s.create_sequence(READ_PROMPT)
            s.append(seq, READ_PROMPT[cached:], *kv(READ_PROMPT[cached:]))
            self.reads.append((seq, s.attend(seq, 0, Q), s.dequantize(seq, 1),
                               s.read(seq, 1, G - 3, 9), summary(s.table(seq))))
        self.writes = [s.create_sequence(tokens(8_000_000 + 1000 * w, 3)).id for w in range(workers)]
        self.tokens = [0] * workers


def one_call(s, fx, w, n):
    """Worker w's n-th call on s; asserts its result. Raises what the call raises."""
    seq, attended, deq1, read1, table = fx.reads[w]
    mine = fx.writes[w]
    op = n % 10
    if op == 0:
        assert_same(s.attend(seq, 0, Q), attended, "attend")
    elif op == 1:
        out = np.full_like(attended, np.nan)
        s.attend(seq, 0, Q, out=out)
        assert_same(out, attended, "attend out=")
    elif op == 2:
        assert_same(list(s.dequantize(seq, 1)), list(deq1), "dequantize")
    elif op == 3:
        assert_same(list(s.read(seq, 1, G - 3, 9)), list(read1), "read")
    elif op == 4:
        assert summary(s.table(seq)) == table
    elif op == 5:
        assert s.stats()["sessions"] >= 1
    elif op == 6:
        ids = tokens(100 + n, 3)
        info = s.append(mine, ids, *kv(ids))
        fx.tokens[w] += 3
        assert info.table.tokens == fx.tokens[w], (info.table.tokens, fx.tokens[w])
    elif op == 7:
        ids = tokens(200 + n, 1)
        s.stage(mine, *kv(ids))
        info = s.commit(mine, ids)
        fx.tokens[w] += 1
        assert info.table.tokens == fx.tokens[w], (info.table.tokens, fx.tokens[w])
    elif op == 8:
        child = s.fork(seq)
        assert summary(child.table) == table
        s.release(child.id)
    else:
        ids = tokens(300 + n, 1)
        s.stage(mine, *kv(ids))
        (info,) = s.commit_batch([(mine, ids)])
        assert not isinstance(info, kvarn.Error), info
        fx.tokens[w] += 1
        assert info.table.tokens == fx.tokens[w]


def is_closed_error(e):
    return isinstance(e, kvarn.NotFoundError) and "closed" in e.message


AFTER_CLOSE = [lambda s: s.id, lambda s: s.stats(), lambda s: s.table(1), lambda s: s.fork(1),
               lambda s: s.attend(1, 0, Q), lambda s: s.dequantize(1), lambda s: s.read(1, 0),
               lambda s: s.create_sequence([1, 2]), lambda s: s.release(1),
               lambda s: s.commit_batch([(1, [1])]), lambda s: s.stage(1, *kv([1])),
               lambda s: s.append(1, [1], *kv([1])), lambda s: s.dequantize_block(0),
               lambda s: s.block_bytes(0), lambda s: s.list_sequences(), lambda s: s.evict()]


def closing_case(how, iterations=20):
    """Workers call into a session until it is closed `how`, `iterations` times with random
    timing: the close comes after a random number of completed calls (seeded by the case and
    the iteration, so a failure replays)."""
    def run(target):
        observer = kvarn.Client(target).open_session("threads-observer", observer=True)
        for it in range(iterations):
            rng = random.Random(f"{how}-{it}")
            client = kvarn.Client(target)
            s = client.open_session("threads-close", max_sequences=3 * WORKERS)
            sid = s.id
            fx = Fixture(s, WORKERS)
            ref = weakref.ref(s)
            done = threading.Condition()
            calls = [0]
            closing, closed = threading.Event(), threading.Event()  # before close(), after it
            start = threading.Barrier(WORKERS + 1)
            offset = rng.randrange(10)

            def worker(w):
                # "del": each worker holds the session until it returns, the last one to
                # return destroys it; otherwise the workers share the case's reference.
                held = ref()
                start.wait(JOIN_S)
                n, after = offset + w, 0
                while after < 3:  # three calls once close() has returned (or the drop)
                    x = held if how == "del" else s
                    closed_before = closed.is_set() and how != "del"
                    try:
                        one_call(x, fx, w, n)
                        assert not closed_before, f"a call made after close() succeeded (op {n % 10})"
                    except kvarn.Error as e:
                        assert is_closed_error(e), f"op {n % 10} raised {type(e).__name__}: {e}"
                        assert closing.is_set(), f"op {n % 10}: {e} before the close"
                        assert x.closed
                    del x
                    n += 1
                    after += closed.is_set()
                    with done:
                        calls[0] += 1
                        done.notify_all()

            def wait_calls(k):
                with done:
                    assert done.wait_for(lambda: calls[0] >= k, JOIN_S), f"only {calls[0]} calls made"

            def closer():
                start.wait(JOIN_S)
                wait_calls(rng.randrange(3 * WORKERS))
                if how == "close":  # from two threads at once: idempotent
                    closing.set()
                    run_threads(s.close, s.close)
                elif how == "with":
                    with s:
                        closing.set()
                elif how == "client":  # the session keeps its client alive; calls go on
                    nonlocal client
                    client = None
                    gc.collect()
                    wait_calls(calls[0] + 2 * WORKERS)
                    closing.set()
                    s.close()
                closed.set()
            if how == "del":
                # The case's reference is dropped while the workers run; the session is
                # destroyed by whichever worker lets go of it last, right after a call.
                keep = [s]
                del s
                threads = [lambda w=w: worker(w) for w in range(WORKERS)]

                def dropper():
                    start.wait(JOIN_S)
                    wait_calls(rng.randrange(3 * WORKERS))
                    keep.clear()
                    gc.collect()
                    closed.set()
                run_threads(*threads, dropper)
                gc.collect()
                assert ref() is None, "the session outlived its last reference"
            else:
                run_threads(*[lambda w=w: worker(w) for w in range(WORKERS)], closer)
                assert s.closed and not s.alive and repr(s) == "Session(closed)"
                for i, call in enumerate(AFTER_CLOSE):
                    try:
                        call(s)
                        raise AssertionError(f"call {i} after close() returned")
                    except kvarn.Error as e:
                        assert is_closed_error(e), f"call {i} after close() raised {e!r}"
                del s
            assert sid not in live_session_ids(observer), \
                f"iteration {it}: the daemon still has session {sid} once every call returned"
    return run


for _how in ("close", "with", "del", "client"):
    case(f"close_{_how}_while_threads_are_in_calls")(closing_case(_how))


# 3. Arrays written, resized or re-pointed by another thread while a call runs without the GIL.
RACE_ITERATIONS = 60


class Racer:
    """Runs step() in a loop on a thread until stopped; started once it has stepped once."""

    def __init__(self, step):
        self.step, self.stop, self.steps = step, threading.Event(), 0
        self.stepped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            self.step()
            self.steps += 1
            self.stepped.set()

    def __enter__(self):
        self.thread.start()
        assert self.stepped.wait(JOIN_S), "the racing thread did not start"
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive(), "the racing thread did not stop"


def _kv_written(call):
    """call(s, seq, ids, k, v) appends ids with k, v while another thread flips them between
    two values 4 apart: each element of what the pool holds is one of them."""
    def run(target):
        with kvarn.Client(target).open_session("threads-kv-written", max_sequences=2) as s:
            for it in range(RACE_ITERATIONS):
                ids = tokens(6_000_000 + 1000 * it, 40)  # a tail, no seal: fp16 throughout
                ak, av = kv(ids)
                bk, bv = (ak + 4).astype(np.float16), (av - 4).astype(np.float16)
                k, v = ak.copy(), av.copy()

                def flip():
                    np.copyto(k, bk)
                    np.copyto(v, bv)
                    np.copyto(k, ak)
                    np.copyto(v, av)
                seq = s.create_sequence(ids).id
                with Racer(flip):
                    call(s, seq, ids, k, v)
                got_k, got_v = s.dequantize(seq)
                assert near_one_of(got_k, ak, bk) and near_one_of(got_v, av, bv), \
                    f"iteration {it}: K/V that neither value holds"
                s.release(seq)
    return run


case("numpy_kv_written_during_append")(_kv_written(lambda s, q, ids, k, v: s.append(q, ids, k, v)))
case("numpy_kv_written_during_append_inline")(
    _kv_written(lambda s, q, ids, k, v: s.append_inline(q, ids, k, v)))
case("numpy_kv_written_during_stage")(
    _kv_written(lambda s, q, ids, k, v: (s.stage(q, k, v), s.commit(q, ids))))


def _reader(s):
    """A sequence with a sink, a quantized tile and a tail, and attention over it."""
    p = tokens(5_000_000, 2 * G + 20)
    seq, cached, _ = s.create_sequence(p)
    s.append(seq, p[cached:], *kv(p[cached:]))
    return seq


@case("queries_and_out_written_during_attend")
def _queries_written(target):
    with kvarn.Client(target).open_session("threads-q-written", max_sequences=2) as s:
        seq = _reader(s)
        qa, qb = queries(1), queries(2)
        want = s.attend(seq, 0, qa)
        q, out = qa.copy(), np.zeros_like(want)

        def scribble():
            np.copyto(q, qb)
            out.fill(np.nan)
            np.copyto(q, qa)
        with Racer(scribble):
            for _ in range(20 * RACE_ITERATIONS):
                got = s.attend(seq, 0, q)
                assert got.shape == want.shape and np.isfinite(got).all(), "attend over torn queries"
                s.attend(seq, 0, q, out=out)
                now = q.copy()  # one read of each element, racing the writer
                assert np.all((now == qa) | (now == qb)), "the call wrote into its queries"
        assert_same(s.attend(seq, 0, q, out=out), want, "attend once the writer stopped")


def _torch():
    if torch is None:
        raise CaseSkipped("torch is not installed")
    return torch


class MidCall:
    """Values whose conversion (numpy's __array__, called after the call took the keys) first
    runs hook(): the keys are changed in the middle of the call, before its GIL-free part."""

    def __init__(self, values, hook):
        self.values, self.hook = values, hook

    def __array__(self, dtype=None):
        self.hook()
        return self.values


@case("torch_kv_set_during_append")
def _torch_set_kv(target):
    """The keys' tensor re-pointed at other storage (set_) mid-call, its old storage's last
    other owner gone: the call still reads the storage it took (never freed memory)."""
    t = _torch()
    with kvarn.Client(target).open_session("threads-torch-set", max_sequences=2) as s:
        for it in range(RACE_ITERATIONS // 3):  # each collects garbage: slow
            ids = tokens(3_000_000 + 1000 * it, 40)
            ak, av = (a.astype(np.float32) for a in kv(ids))
            k = t.tensor(ak)

            def repoint():
                k.set_(t.tensor(ak + 4))
                gc.collect()
                np.full(ak.shape, -7, np.float32)  # reuse the memory a freed storage held
            seq = s.create_sequence(ids).id
            s.append(seq, ids, k, MidCall(av, repoint))
            got_k, got_v = s.dequantize(seq)
            assert near_one_of(got_k, ak) and near_one_of(got_v, av), \
                f"iteration {it}: the keys are not those the call took"
            s.release(seq)


@case("torch_kv_resized_during_append")
def _torch_resized(target):
    """resize_ past the storage would reallocate it and free the memory the call reads: the
    binding's view (torch's Tensor.numpy()) pins the storage while it lives, so resize_
    raises instead."""
    t = _torch()
    with kvarn.Client(target).open_session("threads-torch-resize", max_sequences=2) as s:
        for it in range(RACE_ITERATIONS):
            ids = tokens(4_000_000 + 1000 * it, 40)
            ak, av = (a.astype(np.float32) for a in kv(ids))
            k = t.tensor(ak)  # owns its storage: resizable until a call takes it
            refused = []

            def grow():
                try:
                    k.resize_((64 * len(ids),) + tuple(k.shape[1:]))
                except RuntimeError as e:
                    refused.append(str(e))
            seq = s.create_sequence(ids).id
            s.append(seq, ids, k, MidCall(av, grow))
            assert refused and "not resizable" in refused[0], f"resize_ mid-call: {refused}"
            got_k, _ = s.dequantize(seq)
            assert near_one_of(got_k, ak), f"iteration {it}: the keys are not those the call took"
            s.release(seq)


@case("torch_queries_written_during_attend")
def _torch_queries_written(target):
    """A torch query tensor written (copy_) by another thread during attend."""
    t = _torch()
    with kvarn.Client(target).open_session("threads-torch-q", max_sequences=2) as s:
        seq = _reader(s)
        qa, qb = t.tensor(queries(3)), t.tensor(queries(4))
        want = s.attend(seq, 0, qa.numpy())
        q = qa.clone()

        def scribble():
            q.copy_(qb)
            q.copy_(qa)
        with Racer(scribble):
            for _ in range(20 * RACE_ITERATIONS):
                got = s.attend(seq, 0, q)
                assert isinstance(got, t.Tensor) and bool(t.isfinite(got).all()), "torn attend"
                now = q.clone()  # one read of each element, racing the writer
                assert bool(((now == qa) | (now == qb)).all()), "the call wrote into its queries"
        assert_same(s.attend(seq, 0, q).numpy(), want, "attend once the writer stopped")


# 4. The codec from many threads: the serial results.
CODEC_PRESETS = [PRESET, "kivi_k2v2_g64", "hadamard_k4v4_g64"]


def codec_work(k, v):
    """k, v: (H, 3G, D)."""
    out = []
    for p in CODEC_PRESETS:
        rec = codec.encode(p, k.reshape(-1, G, D), v.reshape(-1, G, D))
        out += [rec, *codec.decode(p, rec), *codec.decode(p, rec, frame="storage")]
    out.append(codec.eval(CODEC_PRESETS, k, v, sink_tokens=0, random_queries=4, iterations=2))
    out.append(codec.preset_info(PRESET, D))
    return out


@case("codec_threads_match_serial")
def _codec(target):
    rng = np.random.default_rng(5)
    inputs = [(rng.standard_normal((H, 3 * G, D)).astype(np.float32),
               (rng.standard_normal((H, 3 * G, D)) + 1).astype(np.float32)) for _ in range(THREADS + 1)]
    serial = [codec_work(*x) for x in inputs]
    start = threading.Barrier(THREADS)

    def thread(t):
        start.wait(JOIN_S)
        for r in range(3):  # the shared input (0) and this thread's own
            for i in (0, t + 1):
                assert_same(codec_work(*inputs[i]), serial[i], f"thread {t} round {r} input {i}")
    run_threads(*[lambda t=t: thread(t) for t in range(THREADS)])


# 5. The interpreter exits normally while daemon threads are inside binding calls.
def exit_scenario(target, variant):
    """This file as `... exit TARGET VARIANT`: daemon threads looping in calls, then the main
    thread returns (with the session open, closed, or dropped)."""
    client = kvarn.Client(target)
    s = client.open_session(f"threads-exit-{os.getpid()}", max_sequences=8)
    seqs = [_reader(s) for _ in range(5)]  # one per thread: calls on a sequence are serialized
    q = queries(5)
    k = np.random.default_rng(5).standard_normal((H, G, D)).astype(np.float32)
    rec = codec.encode(PRESET, k, k)

    def appender(s):  # a sequence of its own, grown and released
        x = s.create_sequence(tokens(2_000_000, 3)).id
        ids = tokens(2_100_000, 2 * G + 5)
        s.append(x, ids, *kv(ids))
        s.release(x)
    calls = [
        lambda s: s.attend(seqs[0], 0, q), lambda s: s.dequantize(seqs[1]),
        lambda s: s.read(seqs[2], 1), lambda s: s.release(s.fork(seqs[3]).id),
        lambda s: s.attend(seqs[4], 1, q), lambda s: s.stats(),
        lambda s: codec.decode(PRESET, rec), appender]
    ready = threading.Barrier(len(calls) + 1)

    def loop(call, s):
        call(s)
        ready.wait()
        while True:
            try:
                call(s)
            except kvarn.NotFoundError:  # closed by the main thread
                pass
    for c in calls:
        threading.Thread(target=loop, args=(c, s), daemon=True).start()
    ready.wait(JOIN_S)  # every thread has made a call and is making the next
    if variant == "open":  # left to the interpreter's teardown
        global _LEFT_OPEN
        _LEFT_OPEN = s
    elif variant == "closed":
        s.close()
    del s, client  # "dropped": only the threads hold the session
    print("main returns", flush=True)


def _exit_case(variant, runs=5):
    def run(target):
        for i in range(runs):
            try:
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "exit", target, variant],
                                   capture_output=True, text=True, timeout=EXIT_DEADLINE_S)
            except subprocess.TimeoutExpired as e:
                raise AssertionError(f"run {i}: the interpreter did not exit within "
                                     f"{EXIT_DEADLINE_S} s:\n{e.stderr}") from None
            assert "main returns" in p.stdout, f"run {i}: the script failed:\n{p.stderr[-2000:]}"
            why = (f"was killed by {signal.Signals(-p.returncode).name}" if p.returncode < 0
                   else f"exited with status {p.returncode}")
            assert p.returncode == 0, f"run {i}: at exit the interpreter {why}:\n{p.stderr[-2000:]}"
    return run


for _variant in ("open", "closed", "dropped"):
    case(f"exit_with_threads_in_calls_session_{_variant}")(_exit_case(_variant))


# ---- The driver (this file as a script) and the tests ----------------------------------------

def driver(target, names):
    global torch
    torch = importlib.import_module("torch") if HAVE_TORCH else None
    driven.run_cases(CASES, names, target, lambda e: f"{type(e).__name__}: {e}", 1500)


def run_driver(target, names):
    return driven.run_driver([sys.executable, os.path.abspath(__file__), "driver", target],
                             CASES, names, DRIVER_DEADLINE_S, 25)


@pytest.fixture(scope="module")
def outcomes(daemon):
    return run_driver(daemon.target, list(CASES))


@pytest.mark.parametrize("name", list(CASES))
def test_threads(name, outcomes):
    ok, detail = outcomes[name]
    if ok is None:
        pytest.skip(detail)
    assert ok, f"{name}: {detail}"


def test_the_daemon_survived_every_case(daemon, outcomes):
    assert daemon.proc.poll() is None, f"kvarnd exited:\n{daemon.log()[-3000:]}"
    assert kvarn.Client(daemon.target).describe()["epoch"] == daemon.epoch


if __name__ == "__main__":
    if sys.argv[1] == "exit":
        exit_scenario(sys.argv[2], sys.argv[3])
    else:
        driver(sys.argv[2], json.load(sys.stdin))
