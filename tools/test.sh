#!/usr/bin/env bash
# Installs everything the tests need, then runs them all. This is the README's test command and exactly
# what CI runs (.ci/run). Safe to rerun: the project venv (.venv, in the clone) is reused, and the heavy
# torch/torch_xla environments are created once under the user's cache folder and reused by every clone.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | { grep -v "is ignored" || true; }

# torch 2.9.0 + torch-xla 2.9.0 (target 2.9) and torch 2.6.0 + torch-xla 2.6.1 (target sagemaker).
tools/xla_envs.sh all

# One pytest-xdist worker per core (XLA_MIGRATE_TEST_WORKERS sets another count, 0 for none); a test file's tests
# stay in one worker, since a file's cases share their migrations and torch_xla runs.
exec .venv/bin/python -m pytest -n "${XLA_MIGRATE_TEST_WORKERS:-auto}" --dist loadfile "$@"
