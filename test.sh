#!/usr/bin/env bash
# Lint and the whole test suite (creates .venv on first use), then the equivalence tests once
# more on the PyTorch steps (the suite runs on the default kernels: compiled where built).
source "$(dirname "$0")/scripts/env.sh"
ruff check mgrit_gru tests benchmarks
ruff format --check mgrit_gru tests benchmarks
if [ $# -eq 0 ]; then
    # the whole suite in two worker processes of one thread each (tests/conftest.py)
    python -m pytest -n 2
    MGRIT_GRU_KERNELS=pytorch python -m pytest -n 2 tests/test_equivalence.py tests/test_lstm_module.py
else
    python -m pytest "$@"
fi
