#!/usr/bin/env bash
# Creates (or reuses) the torch/torch_xla virtual environments the proof tier runs migrated scripts in.
# They live outside the clone, under the user's cache folder, keyed by their pinned versions, because each
# is 6-7 GB and CI clones the repository afresh every time.
#
# Usage: tools/xla_envs.sh [current|sagemaker|all]   (prints "<name> <python path>" per environment)
set -euo pipefail

cache_root="${XLA_MIGRATE_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/xla-migrate/envs}"
python_bin="${PYTHON:-python3}"

declare -A PINS=(
  [current]="torch==2.9.0 torch-xla==2.9.0"
  [sagemaker]="torch==2.6.0 torch-xla==2.6.1"
)

make_env() {
  local name=$1 pins=${PINS[$1]}
  local key
  key=$(echo "$pins" | tr ' =' '-_' )
  local dir="$cache_root/$key"
  mkdir -p "$cache_root"
  # One creator at a time: a second run (another clone's CI, a parallel test session) waits for the first
  # instead of deleting the environment it is installing.
  exec {lock}>"$dir.lock"
  flock "$lock"
  # The marker is written last, so an interrupted install is redone instead of trusted.
  if [[ ! -f "$dir/.complete" ]]; then
    echo "creating $name environment in $dir ($pins)" >&2
    rm -rf "$dir"
    "$python_bin" -m venv "$dir"
    # (The filter drops pip's notes about unreachable local package mirrors some machines configure.)
    "$dir/bin/python" -m pip install -q --disable-pip-version-check $pins 2>&1 | { grep -v "is ignored" || true; } >&2
    "$dir/bin/python" -c "import torch, torch_xla" >&2
    touch "$dir/.complete"
  fi
  exec {lock}>&-
  echo "$name $dir/bin/python"
}

which=${1:-all}
if [[ $which == all ]]; then
  make_env current
  make_env sagemaker
else
  make_env "$which"
fi
