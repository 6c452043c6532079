"""Errors: the daemon's status codes as kvarn.Error subclasses with .code, and bad input
rejected with ValueError/TypeError before anything is sent."""

import hashlib
import os
import pickle
import re
import time

import numpy as np
import pytest

import kvarn
from kvtest import G, LAYOUT, Daemon, make_kv, tokens

L, H, D = LAYOUT["num_layers"], LAYOUT["num_kv_heads"], LAYOUT["head_dim"]


def assert_unchanged(session, seq, table):
    """Nothing was staged or committed: the table is as before, and a well-formed append of
    one token lands right after it (a half-staged rejected call would make its commit fail)."""
    assert session.table(seq) == table
    k, v = make_kv(1, seed=99)
    assert session.append(seq, [7], k, v).table.tokens == table.tokens + 1


def test_bad_kv_shapes_and_dtypes_raise_before_anything_is_sent(session):
    seq, _, table = session.create_sequence(tokens(100, 3))
    k, v = make_kv(3, seed=1)
    cases = [
        ((k[..., :63], v), ValueError,
         "keys has shape (3, 2, 2, 63); append needs (tokens, num_layers, num_kv_heads, head_dim) "
         "= (3, 2, 2, 64) for 3 token ids"),
        ((k, v[:2]), ValueError, "values has shape (2, 2, 2, 64)"),
        ((k[:, 0], v[:, 0]), ValueError, "keys has shape (3, 2, 64)"),
        ((k.astype(np.int32), v), TypeError, "keys has dtype int32; expected a float array"),
        ((k, "not an array"), TypeError, "values has dtype <U12"),
    ]
    for (keys, values), exc, message in cases:
        with pytest.raises(exc) as e:
            session.append(seq, tokens(100, 3), keys, values)
        assert message in str(e.value)
        assert not isinstance(e.value, kvarn.Error), "found by the bindings, not the daemon"
    # Wrong number of token ids for the K/V.
    with pytest.raises(ValueError, match=re.escape("append needs (tokens, num_layers, num_kv_heads, "
                                                   "head_dim) = (4, 2, 2, 64) for 4 token ids")):
        session.append(seq, tokens(100, 4), k, v)
    with pytest.raises(ValueError, match="token ids are in"):
        session.append(seq, [1, -2, 3], k, v)
    with pytest.raises(TypeError, match="token ids are integers"):
        session.append(seq, [1.5, 2.0, 3.0], k, v)
    with pytest.raises(ValueError, match="token ids are a 1-D sequence"):
        session.create_sequence(np.zeros((2, 2), np.uint32))
    with pytest.raises(ValueError, match="at least one token"):
        session.stage(seq, k[:0], v[:0])
    assert_unchanged(session, seq, table)


def test_bad_attend_arguments_raise_value_errors(session):
    seq, _, _ = session.create_sequence(tokens(200, 5))
    k, v = make_kv(5, seed=2)
    session.append(seq, tokens(200, 5), k, v)
    q = np.zeros((2 * H, D), np.float32)
    with pytest.raises(ValueError, match=re.escape(
            "queries has shape (3, 64); attend needs (num_query_heads, 64) with num_query_heads a "
            "multiple of the 2 kv-heads")):
        session.attend(seq, 0, q[:3])
    with pytest.raises(ValueError, match=re.escape("queries has shape (4, 32)")):
        session.attend(seq, 0, q[:, :32])
    with pytest.raises(ValueError, match="layer 2 is out of range: the layout has 2 layers"):
        session.attend(seq, 2, q)
    with pytest.raises(ValueError, match="not C-contiguous"):
        session.attend(seq, 0, q, out=np.empty((D, 2 * H), np.float32).T)
    with pytest.raises(ValueError, match="out has dtype float64"):
        session.attend(seq, 0, q, out=np.empty((2 * H, D), np.float64))
    with pytest.raises(ValueError, match=re.escape("out has shape (2, 64); attend writes (4, 64)")):
        session.attend(seq, 0, q, out=np.empty((2, D), np.float32))
    with pytest.raises(TypeError, match="out must be a numpy array"):
        session.attend(seq, 0, q, out=[0.0])
    with pytest.raises(ValueError, match="head 5 is out of range"):
        session.dequantize_block(0, head=5)
    with pytest.raises(ValueError, match="evict scope 'everything'"):
        session.evict("everything")
    with pytest.raises(TypeError, match="a sequence in sequences is str, not an int id"):
        session.release(["1"])
    with pytest.raises(ValueError, match="negative"):
        session.release(-1)
    with pytest.raises(TypeError, match="commit_batch item 0 is not a"):
        session.commit_batch([seq])


def test_nan_kv_is_rejected_by_the_client_with_invalid_argument(session):
    seq, _, table = session.create_sequence(tokens(300, 2))
    k, v = make_kv(2, seed=3)
    k[1, 0, 0, 5] = np.nan
    with pytest.raises(kvarn.InvalidArgumentError) as e:
        session.append(seq, tokens(300, 2), k, v)
    assert e.value.code == "INVALID_ARGUMENT" and e.value.code_value == 3
    assert isinstance(e.value, ValueError)
    assert_unchanged(session, seq, table)


def test_commit_without_staging_is_invalid_argument(session):
    seq, _, table = session.create_sequence(tokens(400, 2))
    with pytest.raises(kvarn.InvalidArgumentError, match="2 token ids for 0 staged tokens"):
        session.commit(seq, [1, 2])
    assert session.table(seq) == table


def test_a_closed_session_raises_not_found(client, tenant):
    s = client.open_session(tenant, max_sequences=1)
    seq, _, _ = s.create_sequence(tokens(500, 3))
    with client.open_session(tenant + "-watcher", max_sequences=1) as watcher:
        sessions = watcher.stats()["sessions"]
        s.close()
        s.close()  # idempotent
        assert s.closed and not s.alive
        assert watcher.stats()["sessions"] == sessions - 1  # closed at the daemon, not just here
        for call in (s.stats, lambda: s.table(seq), lambda: s.create_sequence([1]), lambda: s.id):
            with pytest.raises(kvarn.NotFoundError) as e:
                call()
            assert e.value.code == "NOT_FOUND" and "closed" in e.value.message
        # Its sequence went with it: another session cannot reach it either.
        with pytest.raises(kvarn.NotFoundError):
            watcher.fork(seq)
    with client.open_session(tenant, max_sequences=1) as s2:
        pass
    with pytest.raises(kvarn.NotFoundError):
        s2.lookup([1, 2])


def test_another_sessions_sequence_is_not_found_at_the_daemon(client, tenant):
    with client.open_session(tenant, max_sequences=1) as a, \
            client.open_session(tenant, max_sequences=1) as b:
        seq, _, _ = a.create_sequence(tokens(600, 3))
        # Ids alone grant nothing: the daemon answers another session's id as unknown.
        with pytest.raises(kvarn.NotFoundError) as e:
            b.fork(seq)
        assert e.value.code == "NOT_FOUND" and e.value.code_value == 5
        with pytest.raises(kvarn.NotFoundError):
            b.release([seq])
        assert a.table(seq).tokens == 0  # still A's


def test_admin_operations_without_the_token_are_permission_denied(session):
    with pytest.raises(kvarn.PermissionDeniedError) as e:
        session.evict("all")
    assert e.value.code == "PERMISSION_DENIED"
    with pytest.raises(kvarn.PermissionDeniedError):
        session.evict("bytes", bytes=1 << 20)


def test_a_layout_the_daemon_does_not_serve_is_invalid_argument(client, tenant):
    wrong = kvarn.Layout(**{**LAYOUT, "num_layers": 3})
    with pytest.raises(kvarn.InvalidArgumentError) as e:
        client.open_session(tenant, layout=wrong)
    assert e.value.code == "INVALID_ARGUMENT"


def test_an_unreachable_daemon_is_unavailable(tmp_path):
    with pytest.raises(kvarn.UnavailableError) as e:
        kvarn.Client(f"unix:{tmp_path}/none.sock", connect_timeout=0.2)
    assert e.value.code == "UNAVAILABLE" and "not reachable" in e.value.message
    with pytest.raises(ValueError, match="timeouts"):
        kvarn.Client(f"unix:{tmp_path}/none.sock", connect_timeout=0)


def test_a_wrong_tenant_token_is_unauthenticated(tmp_path):
    tenants = tmp_path / "tenants"
    tenants.write_text(f"alice token_sha256={hashlib.sha256(b'alice-token').hexdigest()}\n")
    os.chmod(tenants, 0o600)
    d = Daemon(extra_flags=[f"--tenants_file={tenants}"])
    try:
        client = kvarn.Client(d.target)
        assert client.describe()["tenants_authenticated"]
        for token in ("wrong-token", ""):
            with pytest.raises(kvarn.UnauthenticatedError) as e:
                client.open_session("alice", tenant_token=token)
            assert e.value.code == "UNAUTHENTICATED" and e.value.code_value == 16
        with pytest.raises(kvarn.UnauthenticatedError):
            client.open_session("mallory", tenant_token="alice-token")
        with client.open_session("alice", tenant_token="alice-token", max_sequences=1) as s:
            assert s.alive
    finally:
        d.stop()


def test_a_restarted_daemon_ends_old_sessions(tenant):
    d = Daemon()
    try:
        client = kvarn.Client(d.target)
        s = client.open_session(tenant, max_sequences=1)
        seq, _, _ = s.create_sequence(tokens(700, 3))
        socket_path = d.socket_path
        d.proc.terminate()
        d.proc.wait(10)
        d2 = Daemon(socket_path=socket_path)  # a new epoch on the same socket
        try:
            # The client's keep-alive stream reconnects (after gRPC's reconnect backoff) and
            # learns that the lease is gone.
            deadline = time.monotonic() + 15
            while s.alive and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not s.alive
            with pytest.raises(kvarn.Error) as e:
                s.fork(seq)
            # A session of the old epoch: stale (reconnect) or unknown to the new daemon.
            assert e.value.code in ("FAILED_PRECONDITION", "NOT_FOUND")
            with kvarn.Client(d2.target).open_session(tenant, max_sequences=1) as fresh:
                assert fresh.epoch == d2.epoch != d.epoch
            s.close()
        finally:
            d2.stop()
    finally:
        d.stop()


def test_errors_carry_their_code_and_survive_pickling():
    e = kvarn.errors._from_status(5, "no sequence 3")
    assert type(e) is kvarn.NotFoundError and isinstance(e, kvarn.Error)
    assert (e.code, e.code_value, e.message) == ("NOT_FOUND", 5, "no sequence 3")
    assert str(e) == "NOT_FOUND: no sequence 3"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is kvarn.NotFoundError and back.code == "NOT_FOUND"
    assert kvarn.errors._from_status(99, "?").code == "UNKNOWN"
    assert kvarn.ResourceExhaustedError("full").code_value == 8
    for name in kvarn.errors.CODE_NAMES.values():
        if name != "OK":
            cls = getattr(kvarn, "".join(w.capitalize() for w in name.split("_")) + "Error")
            assert cls.CODE == name and cls.__doc__
