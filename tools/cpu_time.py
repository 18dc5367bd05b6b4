"""Run a command and print the CPU time it cost, counting every process it started.

``/usr/bin/time`` and ``time`` count only the descendants their child waited for: a
multiprocessing forkserver, its workers (``repro all``, a sweep, ``repro NAME``'s helpers) and
Ray's daemons outlive their parent and are never counted (a README case of ``repro all --quick``
read 3.9 s where it cost 67 s). Here this process becomes the child subreaper (Linux
``prctl(PR_SET_CHILD_SUBREAPER)``), so orphans are re-parented to it and reaped, and their
time joins ``RUSAGE_CHILDREN``. On a shared machine compare this, not wall time:

    FLEETSIM_PURE=1 python tools/cpu_time.py python -m pytest -q tests/unit/test_repro.py
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tools/cpu_time.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("cpu_time: prctl(PR_SET_CHILD_SUBREAPER) failed: orphans are not counted",
              file=sys.stderr)
    start_s = time.monotonic()
    rc = subprocess.call(argv)
    direct = resource.getrusage(resource.RUSAGE_CHILDREN)
    while True:  # the orphans re-parented here; returns once the last has exited
        try:
            os.wait()
        except ChildProcessError:
            break
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"cpu_time: {usage.ru_utime + usage.ru_stime:.1f} s CPU (user {usage.ru_utime:.1f}, "
          f"sys {usage.ru_stime:.1f}); {direct.ru_utime + direct.ru_stime:.1f} s as time(1) "
          f"counts it; wall {time.monotonic() - start_s:.1f} s; exit {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
