"""An LLM that writes deployment planners: the optional proposer of the evolving planner
(``evolve.py``), Autopoiesis's policy rewriting (arXiv 2604.07144) against any
OpenAI-compatible ``/chat/completions`` endpoint.

The code that comes back runs under limits, and a policy that breaks them is discarded with
its reason (``PolicyRejected``); nothing it does ends the run:

* **imports:** ``math`` only; builtins: a fixed list of pure ones (no ``open``, ``eval``,
  ``exec``, ``getattr``, ``__import__`` of anything else);
* **time per call:** a budget of executed lines per ``plan`` call (and for loading the
  code), counted by a trace function: the simulator reads no clock, so a line count stands in
  for time and stays deterministic for the same code;
* **a valid plan:** {(pool, role): replicas >= 0} over the run's pools and roles.

These limits contain mistakes (an exception, a loop, an invalid plan, a stray import); they
are not a sandbox against hostile code (Python cannot give one in-process), so point the
proposer only at a model you would let write code on this machine.
"""

from __future__ import annotations

import builtins
import json
import math
import re
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from fleetsim.serving.contract import Deployment, MonitorWindow, PoolState

ROLES = ("mixed", "prefill", "decode")
CODE_FILE = "<llm-policy>"
PROMPT = """Write a Python deployment planner for an LLM serving cluster.
Define `class Planner:` with a method `plan(self, pools, window, now_s)` returning a dict
{(pool_name, role): number_of_replicas} (role: "mixed", "prefill" or "decode"; int >= 0;
pools left out keep their count). It is called every monitoring interval.
- pools: list of objects with .name, .role, .max_replicas (GPU room),
  .num_replicas_by_role (dict role -> replicas now), .num_gpus_per_replica
- window (the last interval): .interval_s, .num_arrivals, .mean_prompt_tokens,
  .mean_output_tokens, .mean_ttft_s, .mean_itl_s (NaN when nothing finished), .num_waiting,
  .num_in_flight_by_role (dict role -> requests in flight)
The goal: meet TTFT <= {ttft_s} s and time per output token <= {tpot_s} s for 99% of
requests with as few GPU-seconds as possible. You may `import math` and nothing else; keep
state in attributes. Last interval: {context}
The policy serving now: {incumbent}. Reply with one ```python code block only."""


class PolicyRejected(Exception):
    """An LLM-written policy broke a limit; ``str()`` is the reason."""


_SAFE_BUILTINS = {name: getattr(builtins, name) for name in (
    "abs", "all", "any", "bool", "dict", "enumerate", "filter", "float", "int", "isinstance",
    "len", "list", "map", "max", "min", "range", "reversed", "round", "set", "sorted", "str",
    "sum", "tuple", "zip", "object", "ValueError", "ZeroDivisionError", "Exception",
    "__build_class__", "property", "staticmethod", "super")}


def _import(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (),
            level: int = 0) -> Any:
    if name != "math":
        raise PolicyRejected(f"imports {name!r} (only math is allowed)")
    return math


def ask(url: str, model: str, prompt: str, timeout_s: float) -> str:
    """The reply's text; raises ``OSError`` (``URLError``, timeouts) or ``ValueError``."""
    # Imported here: urllib.request pulls in http.client, email and ssl (about 30 ms of every
    # run's start-up otherwise), and only a run with an LLM proposer asks.
    import urllib.request

    body = json.dumps({"model": model, "temperature": 0,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (user's URL)
        reply = json.loads(resp.read())
    try:
        return str(reply["choices"][0]["message"]["content"])
    except (KeyError, IndexError, TypeError) as err:
        raise ValueError(f"not a chat completion: {str(reply)[:80]}") from err


def extract_code(text: str) -> str:
    m = re.search(r"```(?:python)?\n(.*?)```", text, re.S)
    return m.group(1) if m else text


class _Budget:
    """Counts executed lines of the policy's code; raises past ``max_lines``."""

    def __init__(self, max_lines: int) -> None:
        self.max_lines = max_lines
        self.num_lines = 0

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != CODE_FILE:
            return None  # only the policy's own lines count
        if event == "line":
            self.num_lines += 1
            if self.num_lines > self.max_lines:
                raise PolicyRejected(f"ran past its budget of {self.max_lines} lines per call "
                                     f"(a loop?)")
        return self.trace


def _limited(fn: Any, max_lines: int, *args: Any) -> Any:
    budget = _Budget(max_lines)
    old = sys.gettrace()
    sys.settrace(budget.trace)
    try:
        return fn(*args)
    except PolicyRejected:
        raise
    except Exception as err:  # noqa: BLE001 - whatever the code raised is its reason
        raise PolicyRejected(f"raised {type(err).__name__}: {err}") from None
    finally:
        sys.settrace(old)


class LlmPlanner:
    """A planner from LLM-written code, each call under the limits (module docstring)."""

    def __init__(self, code: str, max_lines: int) -> None:
        self.code = code
        self.max_lines = max_lines
        try:
            compiled = compile(code, CODE_FILE, "exec")
        except SyntaxError as err:
            raise PolicyRejected(f"does not compile: {err.msg} (line {err.lineno})") from None
        scope: dict[str, Any] = {"__builtins__": {**_SAFE_BUILTINS, "__import__": _import},
                                 "__name__": "llm_policy"}
        _limited(exec, max_lines, compiled, scope)
        cls = scope.get("Planner")
        if not isinstance(cls, type) or not callable(getattr(cls, "plan", None)):
            raise PolicyRejected("defines no class Planner with a plan method")
        self.inner = _limited(cls, max_lines)

    def plan(self, pools: Sequence[PoolState], window: MonitorWindow,
             now_s: float) -> Deployment:
        plan = _limited(self.inner.plan, self.max_lines, pools, window, now_s)
        names = {p.name for p in pools}
        if not isinstance(plan, dict):
            raise PolicyRejected(f"returned {type(plan).__name__}, not a dict")
        for key, n in plan.items():
            if not (isinstance(key, tuple) and len(key) == 2 and key[0] in names
                    and key[1] in ROLES and type(n) is int and n >= 0):
                raise PolicyRejected(f"returned an invalid plan entry {key!r}: {n!r} (pools "
                                     f"{sorted(names)}, roles {list(ROLES)}, ints >= 0)")
        return dict(plan)


def window_context(window: MonitorWindow) -> str:
    return (f"{window.num_arrivals} arrivals in {window.interval_s:g} s, mean prompt "
            f"{window.mean_prompt_tokens:.0f} and output {window.mean_output_tokens:.0f} "
            f"tokens, mean TTFT {window.mean_ttft_s:.3f} s, mean ITL {window.mean_itl_s:.4f} s, "
            f"{window.num_waiting} waiting")
