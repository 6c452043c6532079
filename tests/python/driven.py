"""Cases run in driver processes, each under its own deadline: what test_hostile_inputs.py
and test_threads.py share.

A test module keeps its cases in a dict, name -> (run(arg), deadline in seconds), and runs
itself as a script (the driver) over the names it is given on stdin. The driver prints one
JSON line as each case starts and one with its result (ok: true, false, or null for a skip);
faulthandler ends it past a case's deadline with every thread's traceback on stderr. The
pytest side (run_driver) reads those lines; a case that crashes or hangs the driver fails
under its own name, with the end of the driver's stderr, and a new driver goes on with the
cases after it.
"""

import faulthandler
import json
import signal
import subprocess
import sys
import time


class CaseSkipped(Exception):
    """This machine cannot run the case (reported as a skip)."""


def emit(**m):
    print(json.dumps(m), flush=True)


def run_cases(cases, names, arg, describe, detail_chars):
    """The driver's loop: runs cases[name][0](arg) for each name under its deadline.
    describe(e) words an unexpected exception."""
    faulthandler.enable()
    for name in names:
        run, deadline = cases[name]
        emit(start=name)
        print(f"--- case {name}", file=sys.stderr, flush=True)  # run_driver shows what follows
        faulthandler.dump_traceback_later(deadline, exit=True)
        t0 = time.monotonic()
        try:
            run(arg)
            ok, detail = True, ""
        except CaseSkipped as e:
            ok, detail = None, str(e)
        except AssertionError as e:
            ok, detail = False, str(e)
        except Exception as e:  # noqa: BLE001 (the case's own error, reported)
            ok, detail = False, f"unexpected {describe(e)}"
        faulthandler.cancel_dump_traceback_later()
        emit(case=name, ok=ok, detail=detail[:detail_chars], seconds=round(time.monotonic() - t0, 2))


def run_driver(argv, cases, names, deadline_s, tail_lines):
    """Runs the named cases in driver processes started with argv (the names on stdin) until
    each has a result: {name: (ok, detail)}."""
    results, pending = {}, list(names)
    while pending:
        try:
            p = subprocess.run(argv, input=json.dumps(pending), capture_output=True, text=True,
                               timeout=deadline_s)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, err, rc = (e.stdout or b"").decode(), (e.stderr or b"").decode(errors="replace"), None
        running = None
        for line in out.splitlines():
            if line.startswith("{"):
                m = json.loads(line)
                if "start" in m:
                    running = m["start"]
                else:
                    results[m["case"]], running = (m["ok"], m["detail"]), None
        pending = [n for n in pending if n not in results]
        if not pending:
            break
        why = (f"hung: no result within {cases[running][1]} s" if "Timeout (" in err and running
               else f"hung: the driver passed its {deadline_s} s deadline" if rc is None
               else f"crashed the driver ({signal.Signals(-rc).name})" if rc < 0
               else f"ended the driver (exit status {rc})")
        tail = "\n".join(err.rsplit(f"--- case {running}\n", 1)[-1].splitlines()[-tail_lines:])
        if running is None:
            for n in pending:
                results[n] = (False, f"the driver {why} before this case:\n{tail}")
            break
        results[running] = (False, f"{why}:\n{tail}")
        pending.remove(running)
    return results
