"""Build the compiled engine: copy ``src/fleetsim`` to ``build/native/fleetsim`` and compile
``fleetsim.native.NATIVE_MODULES`` there with mypyc. See ``src/fleetsim/native.py``.

Never fails the caller: when mypyc or a C compiler is missing, or compilation fails, it says
so in one line, records why in the manifest and fleetsim runs the pure-Python sources.

    python tools/build_native.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from fleetsim.native import (
    BUILD_DIR,
    MANIFEST,
    NATIVE_MODULES,
    PACKAGE_DIR,
    build_tag,
    source_digest,
)


def main() -> int:
    start = time.perf_counter()
    digest = source_digest()  # of the sources as they are when the copy is taken
    shutil.rmtree(BUILD_DIR, ignore_errors=True)
    shutil.copytree(PACKAGE_DIR, BUILD_DIR / "fleetsim",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    log = BUILD_DIR / "build.log"
    cmd = [sys.executable, "-m", "mypyc", *(f"fleetsim/{m}" for m in NATIVE_MODULES)]
    with log.open("w") as out:
        try:
            # No fused multiply-add: the compiled engine must round exactly as Python does
            # (fast-forward's bit-exactness, and equal results from both builds).
            env = {**os.environ, "CFLAGS": f"{os.environ.get('CFLAGS', '')} -ffp-contract=off"}
            done = subprocess.run(cmd, cwd=BUILD_DIR, stdout=out, stderr=subprocess.STDOUT,
                                  check=False, env=env)
            ok, reason = done.returncode == 0, f"mypyc exited {done.returncode}"
        except OSError as err:
            ok, reason = False, str(err)
    manifest = {"ok": ok, "tag": build_tag(), "digest": digest,
                "modules": list(NATIVE_MODULES)}
    if ok:
        shutil.rmtree(BUILD_DIR / "build", ignore_errors=True)  # mypyc's C intermediates
    else:
        manifest["reason"] = reason
    (BUILD_DIR / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    took = time.perf_counter() - start
    if ok:
        print(f"compiled engine: {len(NATIVE_MODULES)} modules with mypyc in {took:.0f} s "
              f"({BUILD_DIR})")
    else:
        print(f"compiled engine not built ({reason}; see {log}): fleetsim runs pure Python")
    return 0


if __name__ == "__main__":
    sys.exit(main())
