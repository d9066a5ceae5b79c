"""``xla-migrate verify``: run a migrated script on torch_xla and check it.

The package's API is :mod:`xla_migrate.verify.core`'s (``from xla_migrate import verify; verify.verify(...)``,
as before the package): ``core`` assesses and runs the check, ``run`` runs the scripts, ``paths`` gives each
its import path, ``losses`` compares the losses, ``report`` has the report, ``cli`` the command line; ``child``
and ``child_hooks`` are the loader copied into the checked script's process (never imported here).
"""

from .core import (
    AMP_MARKERS, Analysis, CannotRun, DEFAULT_LOSS_REGEX, EXIT_CANNOT_RUN, EXIT_CLEAN, EXIT_PROBLEM, FP32_TOLERANCE,
    HOW_TO_GET_TORCH_XLA, Interpreter, Interrupted, LATE_COMPILES, Observation, Problem, Process, READ_CAUSE,
    Report, SCHEMA, SCHEMA_VERSION, SITE_WARMUP, Trees, WARMUP_MARKERS, assess, busy_steps, cannot_run_report,
    find_python, finite_and_decreasing, is_amp, likely_cause, loader_source, observe, parse_debug, parse_losses,
    parse_series, read_records, render_text, run_plain, split_compiles, stop_on_signals, verify, warmup_markers,
)

__all__ = [  # core's, which tests/test_verify.py keeps equal
    "AMP_MARKERS", "Analysis", "CannotRun", "DEFAULT_LOSS_REGEX", "EXIT_CANNOT_RUN", "EXIT_CLEAN", "EXIT_PROBLEM",
    "FP32_TOLERANCE", "HOW_TO_GET_TORCH_XLA", "Interpreter", "Interrupted", "LATE_COMPILES", "Observation",
    "Problem", "Process", "READ_CAUSE", "Report", "SCHEMA", "SCHEMA_VERSION", "SITE_WARMUP", "Trees",
    "WARMUP_MARKERS", "assess", "busy_steps", "cannot_run_report", "find_python", "finite_and_decreasing", "is_amp",
    "likely_cause", "loader_source", "observe", "parse_debug", "parse_losses", "parse_series", "read_records",
    "render_text", "run_plain", "split_compiles", "stop_on_signals", "verify", "warmup_markers",
]
