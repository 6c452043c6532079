"""Fixtures of the kvarn Python package tests (kvtest.py has the daemon and the helpers).

``daemon`` (one kvarnd per test module), ``client`` (connected to it), ``tenant`` (a label
of its own per test, so tests share no prefix-cache entries) and ``session`` (a session of
that tenant, closed after the test).
"""

import itertools

import pytest

import kvarn
from kvtest import Daemon


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon):
    return kvarn.Client(daemon.target)


_tenants = itertools.count()


@pytest.fixture
def tenant():
    """A tenant label of its own: no prefix-cache entries shared with other tests."""
    return f"py-tenant-{next(_tenants)}"


@pytest.fixture
def session(client, tenant):
    with client.open_session(tenant, max_sequences=4) as s:
        yield s
