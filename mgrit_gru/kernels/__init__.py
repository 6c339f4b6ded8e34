"""Which kernels run a cell's sweeps, and the compiled CPU ones' build.

A sweep (steps ``j0 .. j1`` of every chunk, or of the one serial chunk) runs either as the
per-step PyTorch code of the cell (the reference, ``"pytorch"``) or as one call into a
compiled kernel (``"compiled"``): C++ for CPU tensors, Triton for CUDA tensors, in each
cell's folder (``gru/gru_cpu.cpp``, ``gru/gru_triton.py``, and the LSTM's likewise).
``kernels="auto"`` (the default) takes the compiled kernel where one serves the tensors'
device and dtype (float32, float64 on the CPU) and the PyTorch code elsewhere; on CUDA it runs
the PyTorch code until a GPU has run the Triton sweeps (:data:`TRITON_BY_DEFAULT`):
``"compiled"`` opts in there (float32, bfloat16, float16; float64 by ``"triton"``).
``"triton"`` asks for the Triton kernels by name: on CUDA tensors of any of those dtypes and
float64, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1`` before triton
is imported: how the tests run them on a machine without a GPU).

The choice, per module ``mgrit_gru.GRU(..., kernels=...)`` / ``mgrit_gru.LSTM(...)``, or for
the whole process by the environment variable ``MGRIT_GRU_KERNELS`` (``auto``, ``compiled``,
``triton``, ``pytorch``; a module's own choice wins over it). ``"compiled"`` or ``"triton"``
where no such kernel can run is an error that says why; ``"auto"`` then runs the PyTorch code,
and the solve statistics say which kernels ran (``SolveStats.kernels``).

The build: :func:`build` compiles the C++ sources with ``torch.utils.cpp_extension`` (g++
and ninja; ``-O3 -march=native``) into ``$MGRIT_GRU_BUILD`` or ``~/.cache/mgrit-gru/kernels``,
in a folder named after the sources, torch's version and the CPU, so that another CPU or a
changed source builds anew. The README's set-up builds it (``python -m mgrit_gru.kernels``,
about a minute); a process that finds no build compiles it at its first compiled sweep.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import threading
import warnings
from pathlib import Path
from typing import Optional

import torch

ENV, BUILD_ENV = "MGRIT_GRU_KERNELS", "MGRIT_GRU_BUILD"
CHOICES = ("auto", "compiled", "triton", "pytorch")
_ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    _ROOT / "kernels" / "bindings.cpp",
    _ROOT / "gru" / "gru_cpu.cpp",
    _ROOT / "lstm" / "lstm_cpu.cpp",
)
HEADERS = (_ROOT / "kernels" / "common.h",)
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp-simd", "-std=c++17")
DTYPES = (torch.float32, torch.float64)

_lock = threading.Lock()
_module = None
_error: Optional[str] = None


def check(value, where: str = "kernels") -> str:
    """``value`` as one of :data:`CHOICES` (case and surrounding blanks aside), or a
    ValueError naming them."""
    choice = value.strip().lower() if isinstance(value, str) else value
    if choice not in CHOICES:
        raise ValueError(f"{where}={value!r}: choose one of {CHOICES}")
    return choice


def process_default() -> str:
    """``MGRIT_GRU_KERNELS`` (default ``auto``)."""
    value = os.environ.get(ENV, "")
    return check(value, ENV) if value.strip() else "auto"


def _key() -> str:
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.name.encode() + path.read_bytes())
    from ..cost import cpu_name

    # the sources' folder too: a build records its sources' paths, and another checkout of
    # the same code would rebuild it in place (under a process that has it loaded)
    where = f"{_ROOT}|{torch.__version__}|{cpu_name()}|{platform.machine()}|{FLAGS}"
    digest.update(where.encode())
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    folder = os.environ.get(BUILD_ENV)
    base = Path(folder) if folder else Path.home() / ".cache" / "mgrit-gru" / "kernels"
    return base / _key()


def _missing_tools() -> Optional[str]:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None and shutil.which("g++") is None:
        return "no C++ compiler (c++ or g++) on PATH"
    ninja = Path(sys.executable).with_name("ninja")
    if shutil.which("ninja") is None and not ninja.exists():
        return "no ninja on PATH (pip install ninja)"
    return None


def load(build: bool = True):
    """The compiled module, built if needed and ``build``; None (and :func:`error` says why)
    where it cannot be built or loaded."""
    global _module, _error
    if _module is not None or _error is not None:
        return _module
    with _lock:
        if _module is not None or _error is not None:
            return _module
        missing = _missing_tools()
        if missing:
            _error = missing
            return None
        folder = build_dir()
        name = f"mgrit_gru_cpu_{folder.name}"
        built = any(folder.glob(f"{name}*.so"))
        if not built and not build:
            return None
        if not built:
            warnings.warn(
                "mgrit_gru: compiling the CPU kernels for this machine once (about a minute; "
                "`python -m mgrit_gru.kernels` does it ahead)",
                stacklevel=3,
            )
        ninja_dir = str(Path(sys.executable).parent)
        if ninja_dir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = ninja_dir + os.pathsep + os.environ.get("PATH", "")
        try:
            from torch.utils import cpp_extension

            folder.mkdir(parents=True, exist_ok=True)
            _module = cpp_extension.load(
                name=name,
                sources=[str(s) for s in SOURCES],
                extra_cflags=list(FLAGS),
                build_directory=str(folder),
                verbose=False,
            )
        except Exception as exc:  # a failed build: the PyTorch path runs; error() says why
            lines = str(exc).strip().splitlines()
            last = lines[-1].rstrip(".") if lines else type(exc).__name__
            _error = f"the build failed: {last}"
            warnings.warn(
                f"mgrit_gru: the CPU kernels could not be built ({_error}); the PyTorch steps "
                "run instead (python -m mgrit_gru.kernels says more)",
                stacklevel=3,
            )
        return _module


def error() -> Optional[str]:
    """Why the compiled kernels are unavailable (None while they are, or before a load)."""
    return _error


def compiled_for(choice: str, t: torch.Tensor):
    """The compiled module to run sweeps on ``t``'s device and dtype under ``choice`` (a
    resolved :data:`CHOICES` value), or None for the PyTorch code. ``"compiled"`` and
    ``"triton"`` raise where no such kernel serves ``t``."""
    if choice == "pytorch":
        return None
    if choice == "triton" or t.device.type == "cuda":
        return _triton_for(choice, t)
    fits = t.device.type == "cpu" and t.dtype in DTYPES
    module = load() if fits else None
    if module is None and choice == "compiled":
        why = (
            f"no compiled kernel for {t.device.type} tensors of {t.dtype}"
            if not fits
            else f"the CPU kernels are unavailable: {_error}"
        )
        raise RuntimeError(f"mgrit_gru: kernels='compiled': {why}; use kernels='auto' or 'pytorch'")
    return module


# float64 on the GPU: the Triton kernels serve it when asked by name ("triton"); "auto" and
# "compiled" leave it to the PyTorch code (fp64 products are slow on most GPUs anyway)
_TRITON_AUTO = (torch.float32, torch.bfloat16, torch.float16)


# "auto" takes the Triton sweeps on CUDA only once a GPU has run them (benchmarks/gpu_check.sh
# with tests/test_cuda.py): until then "compiled" / "triton" opt in, and "auto" runs the
# PyTorch steps there, which have run on an H200.
TRITON_BY_DEFAULT = False


def _triton_for(choice: str, t: torch.Tensor):
    from . import gpu

    if choice == "auto" and not TRITON_BY_DEFAULT:
        return None
    why = gpu.error(t.device)
    if why is None and t.dtype not in (gpu.DTYPES if choice == "triton" else _TRITON_AUTO):
        why = f"no Triton kernel for {t.dtype} under kernels={choice!r}"
    if why is None:
        return gpu.kernels()
    if choice == "auto":
        return None
    raise RuntimeError(f"mgrit_gru: kernels={choice!r}: {why}; use kernels='auto' or 'pytorch'")
