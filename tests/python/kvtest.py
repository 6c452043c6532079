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

import ctypes
import itertools
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import threading

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("KVARN_BUILD_DIR", REPO / "build"))
KVARND = os.environ.get("KVARN_KVARND", str(BUILD_DIR / "bin" / "kvarnd"))
KVARNCTL = os.environ.get("KVARN_KVARNCTL", str(BUILD_DIR / "bin" / "kvarnctl"))

# The integration tests' small layout (tests/integration/harness.cc SmallLayout).
LAYOUT = dict(model_id="py-model", num_layers=2, num_kv_heads=2, head_dim=64,
              preset="kvarn_k4v2_g64", sink_tokens=64)
G = 64  # tile tokens of kvarn_k4v2_g64
START_TIMEOUT_S = 20.0

_instances = itertools.count()


def _die_with_parent():
    # In the child before exec: SIGKILL when the test process goes away.
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Daemon:
    """A kvarnd process serving a Unix socket in its own temporary directory."""

    def __init__(self, extra_flags=(), socket_path=None):
        self.dir = tempfile.mkdtemp(prefix="kvpy.", dir="/tmp")
        self.socket_path = socket_path or os.path.join(self.dir, "kvarnd.sock")
        self.instance = f"py-{os.getpid()}-{next(_instances)}"
        self.lines = []
        self.fields = {}
        self._started = threading.Event()
        flags = [
            f"--listen={self.socket_path}",
            "--metrics=127.0.0.1:0",
            f"--instance={self.instance}",
            "--backend=host",
            f"--model_id={LAYOUT['model_id']}",
            f"--num_layers={LAYOUT['num_layers']}",
            f"--num_kv_heads={LAYOUT['num_kv_heads']}",
            f"--head_dim={LAYOUT['head_dim']}",
            f"--preset={LAYOUT['preset']}",
            f"--sink_tokens={LAYOUT['sink_tokens']}",
            "--capacity=16MiB",
            "--default_tail_slots=8",
            "--grace_ms=100",
            "--drain_ms=1000",
            "--log_level=info",
            *extra_flags,
        ]
        self.proc = subprocess.Popen([KVARND, *flags], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, preexec_fn=_die_with_parent)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._started.wait(START_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"kvarnd did not start within {START_TIMEOUT_S} s:\n{self.log()}")
        if not self.fields:
            self.stop()
            raise RuntimeError(f"kvarnd exited at start (status {self.proc.poll()}):\n{self.log()}")
        if int(self.fields["pid"]) != self.proc.pid:
            self.stop()
            raise RuntimeError(f"kvarnd_started names pid {self.fields['pid']}, not {self.proc.pid}")

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if not self.fields and "event=kvarnd_started" in line:
                self.fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
                self._started.set()
        self._started.set()  # exited: the waiter sees no fields

    @property
    def target(self):
        return "unix:" + self.socket_path

    @property
    def epoch(self):
        return int(self.fields["epoch"])

    def log(self):
        return "".join(self.lines)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)


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
