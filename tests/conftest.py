import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "tests", ROOT / "tools", ROOT / "benchmarks"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))


# Property-test budgets: `dev` while working, `ci` in CI (fixed seed, bounded time), `nightly` for long runs.
# Choose one with pytest's --hypothesis-profile NAME.
try:
    import os

    from hypothesis import HealthCheck, settings

    _common = {"deadline": None, "suppress_health_check": list(HealthCheck), "print_blob": True}
    settings.register_profile("dev", max_examples=200, **_common)
    settings.register_profile("ci", max_examples=2000, derandomize=True, **_common)
    settings.register_profile("nightly", max_examples=50_000, **_common)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:  # hypothesis comes with the test extra; without it the property tests fail to import
    pass


# Under pytest-xdist (tools/test.sh) the proof tier runs in the workers; each sends its summary lines
# (tests/xla/conftest.py) and the main process prints them together at the end.
_XLA_TIER_LINES: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _XLA_TIER_LINES.extend(getattr(node, "workeroutput", {}).get("xla_tier", []))


def pytest_terminal_summary(terminalreporter):
    if _XLA_TIER_LINES:
        terminalreporter.write_sep("-", "xla tier (pytest-xdist workers)")
        for line in _XLA_TIER_LINES:
            terminalreporter.write_line(line)


# pytest-xdist hands the test files to its workers in collection order: the longest files start first (the xla
# tier's torch_xla runs, the 5 MB script, the property tests), so the run does not end with one worker alone on
# a long file while the other is idle. A stable sort: the order inside each file is kept.
_LONG_FIRST = ("tests/xla/", "tests/test_bad_input.py", "tests/test_properties.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not item.nodeid.startswith(_LONG_FIRST))
