"""A kvarnd of one's own: started from the build (or PATH) on a temporary socket.

    with kvarn.local.LocalDaemon(layout_flags) as d:
        client = kvarn.Client(d.target)

Used by ``python3 -m kvarn.lm`` when no ``--target`` is given and by the package's tests. The
daemon runs as a child that dies with this process (PR_SET_PDEATHSIG), is ready when it logged
``event=kvarnd_started`` (waited on with a deadline), and is stopped with SIGTERM.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from typing import Dict, List, Optional, Sequence

START_TIMEOUT_S = 30.0
_instances = itertools.count()


def find_kvarnd() -> str:
    """$KVARN_KVARND, else the build's bin/kvarnd next to this package (build/python/kvarn ->
    build/bin), else an installed one (<prefix>/bin beside lib/python3/...), else PATH."""
    env = os.environ.get("KVARN_KVARND")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "..", "..", "bin", "kvarnd"),
                  os.path.join(here, "..", "..", "..", "..", "bin", "kvarnd")]
    for c in candidates:
        if os.access(c, os.X_OK):
            return os.path.normpath(c)
    found = shutil.which("kvarnd")
    if found:
        return found
    raise FileNotFoundError("kvarnd not found: build it (deploy/build.sh), set KVARN_KVARND, "
                            "or pass --target to use a running one")


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalDaemon:
    """kvarnd on a Unix socket in a fresh temporary directory, host backend."""

    def __init__(self, flags: Sequence[str] = (), kvarnd: Optional[str] = None,
                 socket_path: Optional[str] = None):
        self.dir = tempfile.mkdtemp(prefix="kvarnd.", dir="/tmp")
        self.socket_path = socket_path or os.path.join(self.dir, "kvarnd.sock")
        self.instance = f"py-{os.getpid()}-{next(_instances)}"
        self.lines: List[str] = []
        self.fields: Dict[str, str] = {}
        self._started = threading.Event()
        argv = [kvarnd or find_kvarnd(), f"--listen={self.socket_path}", "--metrics=127.0.0.1:0",
                f"--instance={self.instance}", "--backend=host", "--drain_ms=1000", *flags]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=_die_with_parent)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._started.wait(START_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"kvarnd did not start within {START_TIMEOUT_S} s:\n{self.log()}")
        if not self.fields:
            status = self.proc.poll()
            self.stop()
            raise RuntimeError(f"kvarnd exited at start (status {status}):\n{self.log()}")
        if int(self.fields["pid"]) != self.proc.pid:
            self.stop()
            raise RuntimeError(f"kvarnd_started names pid {self.fields['pid']}, not {self.proc.pid}")

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if not self.fields and "event=kvarnd_started" in line:
                self.fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
                self._started.set()
        self._started.set()  # it exited: the waiter finds no fields

    @property
    def target(self) -> str:
        return "unix:" + self.socket_path

    @property
    def epoch(self) -> int:
        return int(self.fields["epoch"])

    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalDaemon":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
