"""Agent programs as a workload: DAGs of LLM calls and tool waits, revealed online
(``ProgramSource``), their generators and file formats, and program metrics (docs/programs.md).
"""

from fleetsim.programs.config import ProgramWorkloadConfig, build_programs
from fleetsim.programs.dag import Call, Program, check_program
from fleetsim.programs.formats import dump_jsonl, load_jsonl, load_weka
from fleetsim.programs.metrics import program_summary, slo_scale
from fleetsim.programs.source import ProgramCall, ProgramSource, ProgramState, program_call
from fleetsim.programs.standalone import CallTimer, critical_path_s

__all__ = [
    "Call",
    "CallTimer",
    "Program",
    "ProgramCall",
    "ProgramSource",
    "ProgramState",
    "ProgramWorkloadConfig",
    "build_programs",
    "check_program",
    "critical_path_s",
    "dump_jsonl",
    "load_jsonl",
    "load_weka",
    "program_call",
    "program_summary",
    "slo_scale",
]
