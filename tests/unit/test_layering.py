"""Dependencies point one way (STYLE.md section 2): check every module's fleetsim imports."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "fleetsim"

# Every package and top-level module -> the fleetsim packages and modules it may import
# (besides itself and the shared leaf modules). Engine first, then what builds on it, then
# the front ends. A new package or module must be added here.
ALLOWED = {
    "core": set(),
    "hardware": set(),
    "models": set(),
    "workloads": set(),
    "perf": {"hardware", "models"},
    "serving": {"core", "perf", "workloads"},
    "policies": {"serving", "esp"},
    "metrics": {"serving"},
    "moe": {"hardware", "models", "perf"},
    "esp": {"hardware", "models", "perf"},
    "programs": {"core", "serving", "policies", "workloads", "perf", "models", "hardware",
                 "metrics"},
    "config": {"elastic_config", "hardware", "metrics", "models", "moe", "policies",
               "programs", "workloads"},
    "elastic_config": set(),
    "expert_pool": {"config", "hardware", "metrics", "models", "moe", "perf", "policies",
                    "serving", "workloads"},
    "soc_pools": {"config", "hardware", "models", "perf", "serving"},
    "soc_run": {"config", "models", "policies", "run", "serving", "workloads"},
    "run": {"config", "esp", "expert_pool", "hardware", "metrics", "models", "moe", "native",
            "perf", "policies", "programs", "serving", "soc_pools", "workloads"},
    "configdoc": {"config"},
    "vllm_json": {"metrics"},
    # moe: plan's wide-EP axis checks a layout as run() would (search/dp_axis.py)
    "search": {"config", "hardware", "metrics", "models", "moe", "perf", "policies",
               "programs", "results", "run", "serving", "workloads"},
    "sweep": {"config", "run", "results"},
    "results": {"metrics", "serving"},
    "report": {"results"},
    "rl": {"core", "serving", "perf", "models", "hardware", "workloads", "config", "run",
           "metrics", "results", "inputs", "registry", "policies", "programs"},
    # policies: Autopoiesis lists the evolve planner's policy space (its best-in-hindsight arm);
    # no serving: a reproduction builds configs, never a plug-in on the engine's views
    "repro": {"config", "expert_pool", "run", "moe", "workloads", "metrics", "perf", "models",
              "hardware", "rl", "programs", "soc_pools", "soc_run", "esp", "policies",
              "results"},
    "live": {"config", "core", "hardware", "inputs", "metrics", "models", "perf", "policies",
             "results", "run", "serving", "vllm_json", "workloads"},
    "calibrate": {"config", "hardware", "models", "perf", "results", "run", "vllm_json",
                  "workloads"},
    "native": set(),
    "__init__": {"native"},
    "cli": None,  # the front end may import anything
    "__main__": None,  # `python -m fleetsim`: the front end's other door
}
LEAVES = {"errors", "configutil", "formatting", "inputs", "output", "registry",
          "memo"}  # shared helpers


def fleetsim_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "fleetsim" and len(parts) > 1:
                found.add(parts[1])
    return found


def _unit_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_every_package_and_module_is_layered():
    units = {_unit_of(p) for p in SRC.rglob("*.py")} - LEAVES
    assert units <= set(ALLOWED), f"add to ALLOWED: {sorted(units - set(ALLOWED))}"


@pytest.mark.parametrize("package", sorted(k for k, v in ALLOWED.items() if v is not None))
def test_package_imports_only_what_it_may(package):
    bad = {}
    paths = list((SRC / package).rglob("*.py")) or [SRC / f"{package}.py"]
    for path in paths:
        if path.name == "cli.py":
            continue  # a package's command-line front end sits with the CLI layer
        extra = fleetsim_imports(path) - ALLOWED[package] - LEAVES - {package}
        if extra:
            bad[str(path.relative_to(SRC))] = sorted(extra)
    assert not bad, f"imports against the layering: {bad}"


# Cached: three tests read every module's imports (each parse of the whole package took about
# 1.7 s); the sources do not change during a run.
@functools.cache
def _all_imports(path: Path) -> frozenset[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return frozenset(found)


def _runtime_imports(path: Path) -> frozenset[str]:
    """Modules ``path`` imports outside ``if TYPE_CHECKING:`` blocks."""
    found = set()

    def visit(node: ast.AST) -> None:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            for inner in node.orelse:
                visit(inner)
            return
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return frozenset(found)


# Types the compiler reads and Python never imports: mypyc's native ints (``i64``), imported
# under ``if TYPE_CHECKING:`` (a plain ``int`` at run time).
COMPILER_TYPES = frozenset({"mypy_extensions"})


def test_core_is_the_standard_library_and_itself():
    """The event kernel and the process kernel on it know nothing of the package, nor need
    anything beyond Python at run time (core/ is the bottom layer: every other package may
    use it); the compiler's native int type is imported for the type checker only."""
    bad = {}
    for path in (SRC / "core").rglob("*.py"):
        runtime = _runtime_imports(path)
        typing_only = (_all_imports(path) - runtime) & COMPILER_TYPES
        extra = {m for m in _all_imports(path) - typing_only
                 if m.split(".")[0] not in sys.stdlib_module_names
                 and not m.startswith("fleetsim.core")}
        if extra:
            bad[path.name] = sorted(extra)
    assert not bad, f"core/ imports beyond the standard library and itself: {bad}"
    assert (SRC / "core" / "process.py").exists()


def test_one_process_kernel_in_core():
    """SimPy-style processes run on ``core.process`` only: no package keeps a kernel of its
    own, and code imports it from core (``rl.process`` stays as a re-export for old imports)."""
    shim = SRC / "rl" / "process.py"
    offenders = []
    for path in SRC.rglob("*.py"):
        if path == shim or path.relative_to(SRC).parts[0] == "core":
            continue
        text = path.read_text()
        if "fleetsim.rl.process" in _all_imports(path) or "PROCESS_RESUME: Final" in text:
            offenders.append(str(path.relative_to(SRC)))
    assert not offenders, f"use fleetsim.core.process: {offenders}"


def test_only_serving_reaches_a_replica():
    """No outsider inside a replica: code outside ``serving/`` goes through the cluster, the
    KV placement service and the plug-in contract, never ``Replica`` itself."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).parts[0] == "serving":
            continue
        if "fleetsim.serving.replica" in _all_imports(path):
            offenders.append(str(path.relative_to(SRC)))
    assert not offenders, f"import Replica only inside serving/: {offenders}"


def test_nothing_under_src_reads_the_wall_clock():
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "cli.py":
            continue
        if path.relative_to(SRC).parts[0] == "live":
            continue  # live servers run in real time by nature (docs/live.md)
        text = path.read_text()
        needles = ("time.time(", "time.perf_counter(", "time.monotonic(", "datetime.now(",
                   "import time")
        offenders.extend(f"{path.relative_to(SRC)}: {n}" for n in needles if n in text)
    assert not offenders


def _advances_a_clock(tree: ast.AST) -> list[int]:
    """Lines where a loop moves a clock forward: inside a ``while``, an assignment to a name
    or attribute called ``now``/``now_s``/``clock`` (the shape of a simulation loop)."""
    lines = []
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.While):
            continue
        for node in ast.walk(loop):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AugAssign) else [])
            for t in targets:
                name = t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", "")
                if name in ("now", "now_s", "clock", "clock_s"):
                    lines.append(node.lineno)
    return lines


def test_detector_finds_a_simulation_loop():
    loop = ast.parse("while heap:\n    self.now = heap.pop()\n")
    assert _advances_a_clock(loop) == [2]
    assert _advances_a_clock(ast.parse("for x in y:\n    now_s = x\n")) == []


def test_esp_has_no_simulation_loop_of_its_own():
    """LoongServe runs on the one engine: ``esp/`` holds its cost model, DP and rules, the
    group planner (``policies/esp.py``) plans, and only ``core/`` and ``serving/`` advance
    simulated time (the ESP loop, ``esp/engine.py``, is gone and must not come back)."""
    assert not (SRC / "esp" / "engine.py").exists()
    paths = [*(SRC / "esp").rglob("*.py"), *(SRC / "policies").rglob("*.py"),
             *(SRC / "repro").glob("loongserve*.py")]
    offenders = {str(p.relative_to(SRC)): lines for p in paths
                 if (lines := _advances_a_clock(ast.parse(p.read_text())))}
    assert not offenders, f"a simulation loop outside serving/ and core/: {offenders}"
    for path in (SRC / "esp").rglob("*.py"):
        imports = _all_imports(path)
        assert not {"heapq", "fleetsim.core", "fleetsim.serving"} & {
            m if m == "heapq" else ".".join(m.split(".")[:2]) for m in imports}, path.name


def test_repro_holds_no_event_loop_or_step_model():
    """A reproduction is data plus a short function: no event loop of its own (a heap of
    events) and no step model in ``repro/``; mechanisms live in ``moe/``, ``serving/`` or
    ``policies/`` and run on the engine (ExpertPlex's private loop was folded in)."""
    offenders = []
    for path in (SRC / "repro").rglob("*.py"):
        text = path.read_text()
        if "heapq" in _all_imports(path) or "def step_time_s" in text or "def split(" in text:
            offenders.append(path.name)
    assert not offenders, f"move the mechanism out of repro/: {offenders}"
    assert not (SRC / "repro" / "expertplex_sim.py").exists()


def test_the_soc_runs_on_the_one_engine():
    """The SoC on the one engine (issue 20, step 5): its device is in ``hardware/``, its cost
    model and calibration in ``perf/``, ``cluster.soc`` builds its pools (``soc_pools.py``),
    Agent.xpu's scheduler is a batching policy (``policies/agent_xpu.py``), and none of them
    advances a clock. The SoC's own loop (``soc/``) is gone, and nothing imports it, the
    tests and benchmarks included."""
    # Source files, not the folder: a checkout that ran the old code keeps an untracked
    # soc/__pycache__ after pulling.
    assert not list((SRC / "soc").glob("*.py")), "soc/ was retired: build on cluster.soc"
    on_engine = [SRC / "hardware" / "soc.py", SRC / "soc_pools.py", SRC / "soc_run.py",
                 SRC / "serving" / "agent_flows.py", SRC / "workloads" / "agent_traffic.py",
                 SRC / "policies" / "agent_xpu.py", *(SRC / "perf").glob("soc*.py")]
    offenders = {str(p.relative_to(SRC)): lines for p in on_engine
                 if (lines := _advances_a_clock(ast.parse(p.read_text())))}
    assert not offenders, f"a simulation loop outside serving/ and core/: {offenders}"
    root = SRC.parent.parent
    users = sorted(str(p.relative_to(root)) for folder in ("src", "tests", "benchmarks")
                   for p in (root / folder).rglob("*.py")
                   if any(m.startswith("fleetsim.soc.") or m == "fleetsim.soc"
                          for m in _all_imports(p)))
    assert users == [], f"build on cluster.soc, not soc/: {users}"


# -- repro/ is data plus a short compare (issue 20, step 7) -------------------------------
PLUG_IN_VIEWS = {"BalanceView", "Placement", "ReplicaView", "ClusterView", "GroupView",
                 "KVView", "StepPlan"}
"""What a policy or planner is written against: a module importing one defines a mechanism."""
SHARED_HELPERS = {"crossing_rate": "metrics/slo.py", "attainment": "metrics/slo.py",
                  "slo_met": "metrics/slo.py", "sweep_rates": "repro/sweep.py",
                  "RateSweep": "repro/sweep.py", "RunFiles": "results.py",
                  "RequestRows": "results.py"}


def _interpolations(tree: ast.AST) -> list[int]:
    """Lines of ``a + (b - c) * d / e``: a value interpolated between two swept points (the
    shape of every SLO crossing the entries once carried)."""
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add)
            and isinstance(n.right, ast.BinOp) and isinstance(n.right.op, ast.Div)
            and isinstance(n.right.left, ast.BinOp) and isinstance(n.right.left.op, ast.Mult)
            and isinstance(n.right.left.left, ast.BinOp)
            and isinstance(n.right.left.left.op, ast.Sub)]


def _slo_checks(tree: ast.AST) -> list[int]:
    """Lines comparing something ``<=`` a name with an ``slo`` part (``ttft_slo``,
    ``TPOT_SLO_S``): a request checked against its SLO, the body of an attainment."""
    def parts(node: ast.AST) -> set[str]:
        names = {getattr(x, "id", None) or getattr(x, "attr", "") for x in ast.walk(node)}
        return {p for name in names for p in name.lower().split("_")}
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Compare) and any(isinstance(o, ast.LtE) for o in n.ops)
            and any("slo" in parts(c) for c in n.comparators)]


def _imported_names(tree: ast.AST) -> set[str]:
    return {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}


def _repro_offences(tree: ast.AST, name: str) -> list[str]:
    found = [f"imports {v}" for v in sorted(_imported_names(tree) & PLUG_IN_VIEWS)]
    found += [f"interpolates at line {n} (use metrics.slo.crossing_rate)"
              for n in _interpolations(tree)]
    found += [f"checks an SLO at line {n} (use metrics.slo.attainment)"
              for n in _slo_checks(tree)]
    if name != "frame.py":
        found += [f"builds RunFiles at line {n.lineno} (use ReproContext.keep)"
                  for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and getattr(n.func, "id", None) == "RunFiles"]
    return found


def test_repro_holds_no_mechanism_crossing_attainment_or_run_files_of_its_own():
    """An entry is data plus a short ``compare``: no planner written against a plug-in view
    (mechanisms live in ``policies/``, ``moe/``, ``rl/``, ``workloads/``), no SLO crossing or
    attainment of its own (``metrics/slo.py``), and every run it keeps goes through
    ``ReproContext`` (``run``, ``run_many``, ``keep``; rate sweeps ``repro/sweep.py``)."""
    offenders = {p.name: found for p in sorted((SRC / "repro").glob("*.py"))
                 if (found := _repro_offences(ast.parse(p.read_text()), p.name))}
    assert not offenders, f"move it out of repro/ or use the shared helper: {offenders}"


def test_the_shared_helpers_are_defined_once():
    """One SLO crossing, one attainment, one rate-sweep harness, one RunFiles in src/: a
    second definition under the same name is a copy coming back."""
    where: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.FunctionDef | ast.ClassDef)
                    and node.name in SHARED_HELPERS):
                where.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    assert where == {k: [v] for k, v in SHARED_HELPERS.items()}


PLANTED = {
    # FastServe's crossing as it was (repro/fastserve.py before issue 20, step 7)
    "crossing": """
def crossing_rate(rates, values, slo):
    best = None
    for i, (rate, value) in enumerate(zip(rates, values, strict=True)):
        if value is None or value > slo:
            if best is not None and value is not None:
                prev = values[i - 1]
                best = rates[i - 1] + (rate - rates[i - 1]) * (slo - prev) / (value - prev)
            return best
        best = rate
    return best
""",
    # LoongServe's ablation attainment as it was (repro/loongserve_ablation.py)
    "attainment": """
def attainment(arrival, first, finish, prompt, out, fit):
    ok = 0
    for a, f, e, n, o in zip(arrival, first, finish, prompt, out, strict=True):
        ttft_slo = max(TTFT_TOL * fit.predict_s(4, n, n * n), TTFT_FLOOR_S)
        tpot = (e - f) / (o - 1) if o > 1 else 0.0
        ok += f - a <= ttft_slo and tpot <= TPOT_SLO_S
    return ok / len(arrival)
""",
    # UltraEP's planner as it was (repro/ultraep.py)
    "planner": """
from fleetsim.moe.placement import BalanceView, Placement, static_phy2log
def ultraep_planner(within_domain):
    def plan(view: BalanceView) -> Placement:
        return plan_view(view, None, 0.01, within_node=within_domain)
    return plan
""",
    # a run kept by hand (repro/heddle.py as it was)
    "run_files": """
def run_kept(ctx, policy, label, result):
    ctx.runs[(policy, label)] = RunFiles(result.summary, result.config,
                                         RequestRows(result.records.requests))
""",
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_the_repro_rule_catches_each_copy_it_replaced(kind):
    found = _repro_offences(ast.parse(PLANTED[kind]), "entry.py")
    assert found, kind
    clean = "def compare(ctx):\n    return ctx.run('a', '1', {'slots_per_gpu': 1 <= 2})\n"
    assert _repro_offences(ast.parse(clean), "entry.py") == []
