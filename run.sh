#!/usr/bin/env bash
# The main job on its built-in default (creates .venv on first use). Extra arguments go to the
# mgrit-gru command line, e.g. ./run.sh bench --T 4096.
source "$(dirname "$0")/scripts/env.sh"
if [ $# -eq 0 ]; then set -- bench; fi
exec mgrit-gru "$@"
