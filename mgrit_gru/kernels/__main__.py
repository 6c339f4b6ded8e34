"""``python -m mgrit_gru.kernels``: build the compiled CPU kernels now (the README's set-up
runs it); prints where they are, or why they cannot be built (exit 0 either way: the PyTorch
code runs without them)."""

import sys
import warnings

from . import build_dir, error, load

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    module = load()
if module is None:
    print(f"mgrit-gru: compiled CPU kernels unavailable ({error()}); the PyTorch code runs")
else:
    print(f"mgrit-gru: compiled CPU kernels ready in {build_dir()}")
sys.exit(0)
