#!/usr/bin/env bash
# Lint and the whole test suite (creates .venv on first use).
source "$(dirname "$0")/scripts/env.sh"
ruff check mgrit_gru tests benchmarks
ruff format --check mgrit_gru tests benchmarks
python -m pytest "$@"
