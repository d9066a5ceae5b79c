#!/usr/bin/env bash
# Creates (or reuses) the torch/torch_xla virtual environments the proof tier runs migrated scripts in.
# They live outside the clone, under the user's cache folder, keyed by their pinned versions, because each
# is 6-7 GB and CI clones the repository afresh every time.
#
# Usage: tools/xla_envs.sh [current|sagemaker|hf|all]   (prints "<name> <python path>" per environment)
set -euo pipefail

cache_root="${XLA_MIGRATE_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/xla-migrate/envs}"
python_bin="${PYTHON:-python3}"

declare -A PINS=(
  [current]="torch==2.9.0 torch-xla==2.9.0"
  [sagemaker]="torch==2.6.0 torch-xla==2.6.1"
  [hf]="torch==2.9.0 torch-xla==2.9.0 transformers==4.57.1 accelerate==1.11.0"
)
# An environment layered on another: its own venv sees the base's packages through a .pth file and installs
# only what the base lacks (the Hugging Face Trainer's proof needs transformers, which the two others must not
# get, and a second 7 GB copy of torch would be a waste). Pip leaves the base untouched: a package the base
# has at another version is installed into the layer, never uninstalled from the base.
declare -A BASE=(
  [hf]=current
)

make_env() {
  local name=$1 pins=${PINS[$1]}
  local key lock
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
    if [[ -n ${BASE[$name]:-} ]]; then
      local base_python base_site site
      base_python=$(make_env "${BASE[$name]}" | cut -d' ' -f2-)
      base_site=$("$base_python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
      site=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
      echo "import site; site.addsitedir('$base_site')" > "$site/_xla_migrate_base.pth"
    fi
    # (The filter drops pip's notes about unreachable local package mirrors some machines configure.)
    "$dir/bin/python" -m pip install -q --disable-pip-version-check $pins 2>&1 | { grep -v "is ignored" || true; } >&2
    "$dir/bin/python" -c "import torch, torch_xla" >&2
    if [[ -n ${BASE[$name]:-} ]]; then "$dir/bin/python" -c "import transformers, accelerate" >&2; fi
    touch "$dir/.complete"
  fi
  exec {lock}>&-
  echo "$name $dir/bin/python"
}

which=${1:-all}
if [[ $which == all ]]; then
  make_env current
  make_env sagemaker
  make_env hf
else
  make_env "$which"
fi
