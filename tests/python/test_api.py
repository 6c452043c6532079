"""The package's surface: every public name documented, blocking calls release the GIL."""

import inspect
import os
import signal
import threading
import time

import numpy as np
import pytest

import kvarn
import kvtest
from kvarn import codec


def documented(obj):
    """The docstring beyond pybind11's signature line."""
    doc = inspect.getdoc(obj) or ""
    lines = doc.splitlines()
    if lines and "(" in lines[0] and "->" in lines[0]:  # "name(self, ...) -> T"
        lines = lines[1:]
    return "\n".join(lines).strip()


def test_every_public_name_has_a_docstring():
    assert len(documented(kvarn)) > 200 and len(documented(codec)) > 200
    assert documented(kvarn.errors)
    for name in kvarn.__all__:
        assert documented(getattr(kvarn, name)), name
    for cls in (kvarn.Client, kvarn.Session, kvarn.Layout, kvarn.SequenceTable, kvarn.SequenceInfo,
                kvarn.AppendInfo):
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            assert documented(member), f"{cls.__name__}.{name}"
    for name in codec.__all__:
        assert documented(getattr(codec, name)), f"codec.{name}"


def test_blocking_calls_release_the_gil(tmp_path):
    # Connecting to a socket nobody serves blocks for connect_timeout inside C++. With the GIL
    # released, this thread keeps running meanwhile: no gap in its progress comes near the
    # 0.6 s the call blocks.
    done = threading.Event()
    errors = []

    def connect():
        try:
            kvarn.Client(f"unix:{tmp_path}/nobody.sock", connect_timeout=0.6)
        except kvarn.UnavailableError as e:
            errors.append(e)
        done.set()

    t = threading.Thread(target=connect)
    last = time.monotonic()
    start = last
    worst_gap = 0.0
    t.start()
    while not done.is_set():
        now = time.monotonic()
        worst_gap = max(worst_gap, now - last)
        last = now
    t.join()
    assert errors and errors[0].code == "UNAVAILABLE"
    assert time.monotonic() - start >= 0.5, "the call did block"
    assert worst_gap < 0.3, f"this thread stalled {worst_gap:.3f} s: the GIL was held"


def test_the_last_call_closes_a_closed_session_without_the_gil():
    # close() while a call runs leaves the closing to that call (docs/python.md, Threads). Its
    # CloseSession RPC then goes to a kvarnd that does not answer (stopped here) and waits for
    # its deadline (2 s): without the GIL, so this thread keeps running meanwhile.
    with kvtest.Daemon() as d:
        c = kvarn.Client(d.target)
        s = c.open_session("gil-close", layout=kvarn.Layout(**kvtest.LAYOUT))
        seq = s.create_sequence(kvtest.tokens(1, 8)).id
        keys, values = kvtest.make_kv(8, seed=3)
        s.append(seq, kvtest.tokens(1, 8), keys, values)
        heads = kvtest.LAYOUT["num_kv_heads"]
        q = np.ones((heads, kvtest.LAYOUT["head_dim"]), np.float32)
        stopped = []

        class ClosesMidCall:
            # Read by attend after it has taken the session: the call is now its last holder.
            def __array__(self, dtype=None):
                s.close()
                os.kill(d.proc.pid, signal.SIGSTOP)
                stopped.append(True)
                return q

        done = threading.Event()
        result = []

        took = []

        def call():
            try:
                start = time.monotonic()
                result.append(s.attend(seq, 0, ClosesMidCall()))
                took.append(time.monotonic() - start)
            finally:
                done.set()

        t = threading.Thread(target=call)
        try:
            t.start()
            last = time.monotonic()
            worst_gap = 0.0
            deadline = last + 30
            while not done.is_set() and time.monotonic() < deadline:
                now = time.monotonic()
                worst_gap = max(worst_gap, now - last)
                last = now
            # The closing is the call's last step: a stall there ends just before `done`.
            worst_gap = max(worst_gap, time.monotonic() - last)
            t.join(30)
        finally:
            if stopped:
                os.kill(d.proc.pid, signal.SIGCONT)
        assert done.is_set() and not t.is_alive(), "the call did not return"
        assert stopped and len(result) == 1 and np.all(np.isfinite(result[0]))
        assert took[0] >= 1.0, "the closing did not wait for the stopped kvarnd"
        assert worst_gap < 0.6, f"this thread stalled {worst_gap:.3f} s: the closing held the GIL"
        with pytest.raises(kvarn.NotFoundError, match="this session is closed"):
            s.table(seq)
