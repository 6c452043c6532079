"""What the kvarn Python package tests share: a live kvarnd from the build, K/V data.

The daemon is started as tests/integration/harness.cc starts it (a Unix socket in a fresh
temporary directory, metrics on an ephemeral loopback port, a unique instance name, the host
backend, a small model layout) and is ready once its log says ``event=kvarnd_started``: a
reader thread drains its output and signals that line (or the daemon's exit), and the fixture
waits for the signal with a deadline. The daemon dies with the test process
(PR_SET_PDEATHSIG), so a crashed test leaves none behind. conftest.py makes fixtures of it.

Environment (CTest sets them, python/CMakeLists.txt): KVARN_KVARND, KVARN_KVARNCTL,
KVARN_BUILD_DIR; PYTHONPATH names build/python.
"""

import os
import pathlib

import numpy as np

from kvarn import local

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("KVARN_BUILD_DIR", REPO / "build"))
KVARND = os.environ.get("KVARN_KVARND", str(BUILD_DIR / "bin" / "kvarnd"))
KVARNCTL = os.environ.get("KVARN_KVARNCTL", str(BUILD_DIR / "bin" / "kvarnctl"))

# The integration tests' small layout (tests/integration/harness.cc SmallLayout).
LAYOUT = dict(model_id="py-model", num_layers=2, num_kv_heads=2, head_dim=64,
              preset="kvarn_k4v2_g64", sink_tokens=64)
G = 64  # tile tokens of kvarn_k4v2_g64
class Daemon(local.LocalDaemon):
    """kvarnd from the build with the tests' small layout (kvarn.local.LocalDaemon)."""

    def __init__(self, extra_flags=(), socket_path=None):
        flags = [
            f"--model_id={LAYOUT['model_id']}",
            f"--num_layers={LAYOUT['num_layers']}",
            f"--num_kv_heads={LAYOUT['num_kv_heads']}",
            f"--head_dim={LAYOUT['head_dim']}",
            f"--preset={LAYOUT['preset']}",
            f"--sink_tokens={LAYOUT['sink_tokens']}",
            "--capacity=16MiB",
            "--default_tail_slots=8",
            "--grace_ms=100",
            "--log_level=info",
            *extra_flags,
        ]
        super().__init__(flags, kvarnd=KVARND, socket_path=socket_path)


def tokens(first, n):
    """n consecutive token ids from first, as a list."""
    return list(range(first, first + n))


def make_kv(n, seed, dtype=np.float16):
    """K/V of n tokens, (n, num_layers, num_kv_heads, head_dim): standard normal keys; values
    with a per-channel mean, as real V has (so attention outputs do not average to zero)."""
    rng = np.random.default_rng(seed)
    shape = (n, LAYOUT["num_layers"], LAYOUT["num_kv_heads"], LAYOUT["head_dim"])
    keys = rng.standard_normal(shape).astype(dtype)
    mean = 1.5 * rng.standard_normal(LAYOUT["head_dim"])
    values = (rng.standard_normal(shape) + mean).astype(dtype)
    return keys, values


def rel_l2(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))
