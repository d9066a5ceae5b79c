"""The layers of docs/architecture.md hold: import-linter's contracts (pyproject.toml, [tool.importlinter]) pass,
so an import that points up a layer, a cycle between modules, or a rule importing past the rule contract fails
the test command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.exists(), "import-linter is missing: pip install -e '.[test]'"
    # From the repository root: the contracts name the top-level transforms/ folder as `transforms`.
    done = subprocess.run([str(lint_imports), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout and "3 kept" in done.stdout, done.stdout
