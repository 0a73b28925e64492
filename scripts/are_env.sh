#!/usr/bin/env bash
# Make the interpreter environment that runs Meta's Agents Research Environments (ARE)
# for benchmark=are: the scenario's apps, its event loop and its judge run in a host-side
# process under this interpreter (milo_ray/benchmarks/are/host.py), never in the harness's
# sandbox. ARE pins pydantic, numpy and litellm exactly, at versions that conflict with
# milo_ray's, hence an environment of its own (about 740 MB installed).
#
#   scripts/are_env.sh [VENV_DIR]      default: ~/.cache/milo_ray/are-venv
#
# PYTHON_ARE names the interpreter to build it from (default: python3.11, else python3 if
# it is >= 3.10). The host process imports ARE and milo_ray.benchmarks.are.host only (no
# Ray, Hydra or langchain), so milo_ray comes from this checkout through a .pth file.
set -euo pipefail

ARE_VERSION="1.2.0"
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$HOME/.cache/milo_ray/are-venv}"
ok() { [[ -n "$1" ]] && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; }
py="${PYTHON_ARE:-}"
if [[ -z "$py" ]]; then
  for cand in "$(command -v python3.11 || true)" "$(command -v python3.12 || true)" "$(command -v python3 || true)"; do
    if ok "$cand"; then py="$cand"; break; fi
  done
fi
if ! ok "$py"; then
  echo "are_env.sh: no Python >= 3.10 found; set PYTHON_ARE=/path/to/python3" >&2
  exit 2
fi

"$py" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "meta-agents-research-environments==$ARE_VERSION"
"$venv/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/milo_ray_checkout.pth", "w").write(sys.argv[1] + "\n")' "$repo"
"$venv/bin/python" -c 'import are.simulation; import milo_ray.benchmarks.are.host; print("ARE", "'"$ARE_VERSION"'", "imports")'
echo "ARE interpreter: $venv/bin/python  (export MILO_RAY_ARE_PYTHON=$venv/bin/python)"
