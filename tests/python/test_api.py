"""The package's surface: every public name documented, blocking calls release the GIL."""

import inspect
import threading
import time

import pytest

import kvarn
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
