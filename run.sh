#!/usr/bin/env bash
# The main job on its built-in default: train a GRU classifier on sequential MNIST with MGRIT
# (creates .venv on first use). Arguments go to the mgrit-gru command line instead, e.g.
# ./run.sh compare --dataset acsf1, ./run.sh bench.
source "$(dirname "$0")/scripts/env.sh"
if [ $# -eq 0 ]; then set -- train; fi
exec mgrit-gru "$@"
