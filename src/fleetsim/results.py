"""Result files: every command that writes results writes them here, as a set, atomically.

A results folder (``run``, ``sweep``, ``plan --out``) is built in a hidden temporary folder
beside it and swapped in whole once complete, so the folder always holds either the complete
old set or the complete new set: never a mix, never a stray ``.tmp``, never stale point
folders. A failure or Ctrl-C before the swap removes the temporary folder and leaves the old
results as they were; SIGINT and SIGTERM are held back during the swap itself. Single files
(``--plot``, ``report --out``) are written to a temporary name and renamed into place.
Where results go is checked before any work (``check_out_dir``, ``check_out_file``).
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import to_json

RESULT_NAMES = frozenset({
    "summary.json", "config.json", "requests.csv",  # run, and each sweep point
    "error.txt",  # a failed sweep point
    "sweep.csv", "sweep.json", "points",  # sweep
    "plan.json",  # plan
    "report.html",  # report, written into the folder it reports on
    "repro.json", "figure.png", "runs",  # repro
    "scoreboard.json", "scoreboard.html", "figures",  # repro all
    "timeline.csv", "gantt.png",  # rl run
    "elastic_timeline.json",  # run with [elastic]
    "evolution_timeline.json",  # run with [elastic] planner = "evolve"
})
"""Names fleetsim writes in a results folder; a folder holding anything else is not replaced."""
TMP_PREFIX = ".fleetsim-"
REQUEST_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s",
                   "tpot_s", "itl_mean_s", "itl_p99_s", "itl_max_s", "e2e_s",
                   "queueing_delay_s", "preemptions", "swaps", "prefix_hit_tokens", "replica_id",
                   "prefill_replica_id", "kv_transfer_s", "finished", "unfinished_reason")
"""requests.csv: one row per request that arrived, finished or not (``finished`` 0 with the
state it was left in, e.g. ``running at until_s``); latencies it had not reached are empty."""


# ---- checks before the work ---------------------------------------------------------------
def add_force_flag(parser: Any) -> None:
    """``--force``, which every command writing a results folder takes: without it a folder
    holding earlier results is refused (``check_out_dir(out, force=args.force)``)."""
    parser.add_argument("--force", action="store_true",
                        help="replace the earlier results in the --out folder (else refused)")


def check_out_dir(out: Path, flag: str = "--out", force: bool | None = None) -> None:
    """Fail now, not after the simulation, if ``out`` cannot become a results folder.

    ``force`` False: a folder holding earlier results is refused (pass --force to replace
    them); None: replaced without asking (commands without a --force flag)."""
    if out.exists() and not out.is_dir():
        raise FleetsimInputError(flag, str(out), "it is a file; give a folder path")
    if out.is_dir() and force is False and any(
            p.name in RESULT_NAMES for p in out.iterdir()):
        raise FleetsimInputError(flag, str(out), "holds earlier results; pass --force to "
                                 "replace them, or give another --out folder")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir()
                         if p.name not in RESULT_NAMES and not p.name.startswith(TMP_PREFIX))
        if foreign:
            raise FleetsimInputError(
                flag, str(out), f"the folder holds {foreign[0]!r}, which fleetsim did not "
                f"write, and results replace the whole folder; give a new folder")
    _check_can_create_in(out.parent, flag, out)


def fresh_out_dir(base: Path) -> Path:
    """The folder of a command run without ``--out``: ``base`` while it holds no results, else
    the first free ``base-2``, ``base-3``, ... A bare command thus always runs (right after
    ``make run`` too) and never replaces earlier results; ``--out`` keeps the refuse-to-replace
    rule."""
    def taken(path: Path) -> bool:
        return path.exists() and (not path.is_dir() or any(True for _ in path.iterdir()))

    if not taken(base):
        return base
    n = 2
    while taken(base.with_name(f"{base.name}-{n}")):
        n += 1
    return base.with_name(f"{base.name}-{n}")


def check_out_file(path: Path, flag: str) -> None:
    """Fail now if the file ``path`` cannot be written (a folder, or an unwritable place)."""
    if path.is_dir():
        raise FleetsimInputError(flag, str(path), "it is a folder; give a file path")
    _check_can_create_in(path.parent, flag, path)


def _check_can_create_in(parent: Path, flag: str, target: Path) -> None:
    anc = Path(os.path.abspath(parent))
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise FleetsimInputError(flag, str(target),
                                 f"{anc} is a file, not a folder; give a path under a folder")
    try:  # the only reliable test (access() says yes to root on a read-only mount)
        os.rmdir(tempfile.mkdtemp(prefix=TMP_PREFIX + "probe-", dir=anc))
    except OSError as err:
        raise FleetsimInputError(flag, str(target), f"cannot write in {anc} "
                                 f"({err.strerror or err}); give a writable folder") from None


# ---- the atomic folder --------------------------------------------------------------------
class StagedFolder:
    """``with StagedFolder(out) as tmp:`` write the files into ``tmp``; on a clean exit ``tmp``
    replaces ``out`` whole, on an exception (Ctrl-C included) it is removed and ``out`` is
    untouched. ``discard()`` inside the block drops the new set on a clean exit too."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path: Path | None = None
        self._discard = False

    def __enter__(self) -> Path:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{self.out.name}.",
                                          dir=self.out.parent))
        # mkdtemp makes 0700 (private while staged); the results folder it becomes gets
        # what mkdir would have given it: 0777 less the umask.
        os.chmod(self.path, 0o777 & ~current_umask())
        return self.path

    def discard(self) -> None:
        self._discard = True

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self.path is not None
        if kind is not None or self._discard:
            shutil.rmtree(self.path, ignore_errors=True)
            if isinstance(err, OSError):  # a full disk, say: one line, old results kept
                raise FleetsimInputError(
                    "--out", str(self.out), f"writing the results failed ({err.strerror or err}"
                    f"); the folder keeps its earlier results") from None
            return
        swap_in(self.path, self.out)


def swap_in(new: Path, out: Path) -> None:
    """Make folder ``new`` be ``out``; the old ``out`` (if any) is deleted afterwards."""
    with _signals_held():
        if not out.exists():
            os.rename(new, out)
            return
        if _exchange(new, out):  # one atomic step: out is the old set, then the new one
            shutil.rmtree(new, ignore_errors=True)
            return
        old = new.with_name(new.name + ".old")
        os.rename(out, old)
        os.rename(new, out)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Linux renameat2(RENAME_EXCHANGE); False where the kernel, libc or filesystem lacks it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    return int(fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)) == 0


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT/SIGTERM arriving now are delivered when the block ends, not in its middle."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (/proc), else by
    setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_file(path: Path, data: str | bytes, flag: str = "--out") -> None:
    """One file, atomically: a temporary name in the same folder, then a rename. A failed
    write (a full disk) is one line naming ``flag``; the earlier file is left as it was."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", dir=path.parent)
    except OSError as err:
        raise _write_failed(flag, path, err) from None
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise _write_failed(flag, path, err) from None
        raise


def _write_failed(flag: str, path: Path, err: OSError) -> FleetsimInputError:
    return FleetsimInputError(flag, str(path), f"writing it failed ({err.strerror or err}); "
                              f"free space or give another path (an earlier file there is "
                              f"unchanged)")


# ---- the files ----------------------------------------------------------------------------
def write_json(path: Path, data: Any) -> None:
    """Strict JSON (a NaN or infinity is an error naming where it is), indented."""
    path.write_text(to_json(data) + "\n", encoding="utf-8")


def write_requests_csv(path: Path, req: dict[str, Any], unfinished: Sequence[Any] = ()) -> None:
    """One row per request that arrived, by request id: the finished ones (``req``, the
    recorder's columns) and the ``unfinished`` ``Request`` objects. NaN (a one-token TPOT,
    a latency not reached) is empty."""
    import numpy as np

    from fleetsim.metrics.summary import per_request_latencies
    from fleetsim.serving.request import STATE_NAMES, itl_stats

    if unfinished:
        extra: dict[str, list[Any]] = {k: [] for k in req}
        for r in unfinished:
            p99, mx = itl_stats(r)
            values = {
                "request_id": r.id, "replica_id": -1 if r.replica_id is None else r.replica_id,
                "arrival_s": r.arrival_s, "num_prompt_tokens": r.num_prompt_tokens,
                "num_output_tokens": r.num_output_tokens,
                "first_scheduled_s": r.first_scheduled_s, "first_token_s": r.first_token_s,
                "finish_s": float("nan"), "num_preemptions": r.num_preemptions,
                "num_prefix_hit_tokens": r.num_prefix_hit_tokens,
                "num_computed_tokens": r.num_computed_tokens_total,
                "num_recomputed_tokens": r.num_recomputed_tokens,
                "prefill_replica_id": (-1 if r.replica_id is None else r.replica_id)
                if r.prefill_replica_id is None else r.prefill_replica_id,
                "kv_transfer_s": r.kv_transfer_s, "num_swaps": r.num_swaps,
                "last_token_s": r.last_token_s, "itl_p99_s": p99, "itl_max_s": mx}
            for k in extra:
                extra[k].append(values[k])
        req = {k: np.concatenate((v, np.asarray(extra[k], dtype=v.dtype))) for k, v in req.items()}
        reasons = [""] * (len(req["request_id"]) - len(unfinished)) + [
            f"{STATE_NAMES[r.state]} at until_s" for r in unfinished]
    else:
        reasons = [""] * len(req["request_id"])
    n_done = len(req["request_id"]) - len(unfinished)
    finished = np.arange(len(req["request_id"])) < n_done
    lat = per_request_latencies(req)
    order = req["request_id"].argsort(kind="stable")
    cols = (req["request_id"], req["arrival_s"], req["num_prompt_tokens"],
            req["num_output_tokens"], lat["ttft_s"], lat["tpot_s"], lat["itl_mean_s"],
            lat["itl_p99_s"], lat["itl_max_s"], lat["e2e_s"],
            lat["queueing_s"], req["num_preemptions"], req["num_swaps"],
            req["num_prefix_hit_tokens"], req["replica_id"], req["prefill_replica_id"],
            req["kv_transfer_s"], finished.astype(np.int64), np.asarray(reasons, dtype=object))
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(REQUEST_COLUMNS)
        lists = [c[order].tolist() for c in cols]
        for row in zip(*lists, strict=True):
            w.writerow(["" if isinstance(x, float) and x != x else
                        (f"{x:.6f}" if isinstance(x, float) else x) for x in row])


def write_run_files(folder: Path, summary: dict[str, Any], config: dict[str, Any],
                    requests: dict[str, Any], unfinished: Sequence[Any] = ()) -> None:
    """``summary.json``, ``config.json`` and ``requests.csv`` of one run into ``folder``."""
    write_json(folder / "summary.json", summary)
    write_json(folder / "config.json", config)
    write_requests_csv(folder / "requests.csv", requests, unfinished)
    if "elastic" in summary:  # the deployment changes of an elastic run, in time order
        write_json(folder / "elastic_timeline.json", summary["elastic"]["timeline"])
        if "evolution" in summary["elastic"]:  # which policy served when, and why
            write_json(folder / "evolution_timeline.json", summary["elastic"]["evolution"])


@dataclass(frozen=True, slots=True)
class RequestRows:
    """The per-request columns of a kept run (``requests.csv``), where a ``RunResult`` has
    ``records.requests``."""

    requests: Mapping[str, Any]


@dataclass(frozen=True, slots=True, eq=False)
class RunFiles:
    """What is written of a run kept apart from its simulation, shaped as a ``RunResult``
    (``summary``, ``config``, ``records.requests``): a serving run that came back from a
    helper process, an RL rollout, or a run that is not a serving simulation (an MoE pass
    model, a SoC run: ``records`` None, no ``requests.csv``)."""

    summary: dict[str, Any]
    config: dict[str, Any]
    records: RequestRows | None = None


def write_run(out: Path, summary: dict[str, Any], config: dict[str, Any],
              requests: dict[str, Any], unfinished: Sequence[Any] = ()) -> None:
    """A run's results folder, replaced as a set."""
    with StagedFolder(out) as tmp:
        write_run_files(tmp, summary, config, requests, unfinished)
