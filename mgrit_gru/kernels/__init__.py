"""Which kernels run a cell's sweeps, and the compiled CPU ones' build.

A sweep (steps ``j0 .. j1`` of every chunk, or of the one serial chunk) runs either as the
per-step PyTorch code of the cell (the reference, ``"pytorch"``) or as one call into a
compiled kernel (``"compiled"``): C++ for CPU tensors, Triton for CUDA tensors, in each
cell's folder (``<cell>/<cell>_cpu.cpp``, ``<cell>/<cell>_triton.py``). This package builds
the C++ module from the cells' sources and chooses; it imports no cell's Triton sweeps (its
``gpu`` module holds only their shared helpers and launch). What it chooses goes to the cell's
``kernel_*`` methods (:class:`mgrit_gru.layer.cell.Cell`): the C++ module, whose functions the
cell calls, or the Triton token (:func:`mgrit_gru.kernels.gpu.kernels`), on which the cell
launches its own Triton sweeps; ``name`` tells them apart (``"compiled"``, ``"triton"``).
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

The build: :func:`load` compiles the C++ sources with ``torch.utils.cpp_extension`` (g++ and
ninja; ``-O3 -march=native``) into ``$MGRIT_GRU_BUILD`` or ``~/.cache/mgrit-gru/kernels``, in
a folder named after the sources, torch's version, the Python and the CPU (:func:`build_dir`),
so that another CPU or a changed source builds anew. The README's set-up builds it (``python
-m mgrit_gru.kernels``, about a minute); a process that finds no build compiles it at its first
compiled sweep. The folder appears only complete (built beside it, then renamed), one process
builds at a time, a killed build is reported and built anew, a cached build is checked against
its manifest before it is loaded, and every failure runs the PyTorch steps with one warning
(the section "the build" below says how).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Optional

import torch

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

ENV, BUILD_ENV = "MGRIT_GRU_KERNELS", "MGRIT_GRU_BUILD"
CHOICES = ("auto", "compiled", "triton", "pytorch")
_ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    _ROOT / "kernels" / "bindings.cpp",
    _ROOT / "gru" / "gru_cpu.cpp",
    _ROOT / "lstm" / "lstm_cpu.cpp",
    _ROOT / "core" / "coarse_cpu.cpp",
)
HEADERS = (_ROOT / "kernels" / "common.h",)
# -fopenmp: ATen's parallel_for is a header template that opens an OpenMP region only where
# the including code is compiled with OpenMP (_OPENMP); without it every sweep ran on one
# thread whatever torch.get_num_threads() said. Linked with -fopenmp, the module needs
# libgomp.so.1, which the loader finds already loaded with torch (one OpenMP runtime and
# thread pool in the process, the one torch.set_num_threads sets).
# (Elsewhere, where the compiler may lack OpenMP, e.g. Apple's clang, the sweeps stay on one
# thread as before.)
_OPENMP = sys.platform.startswith("linux")
# -fno-trapping-math: without it GCC keeps the clamps of the activations' exp (compare and
# select) as branches, since a vector comparison might raise a floating-point exception flag
# that the scalar code would not, and leaves every activation loop scalar (nothing here reads
# those flags). -mprefer-vector-width=256: -march=native names some CPUs (Zen, seen as
# znver1 in a VM) whose tuning splits AVX2 into 16-byte vectors. Measured on the 2-core AMD
# EPYC VM (docs/kernels.md): a sweep step 2.2-2.6 -> 1.3 us per row (H = 64, one thread).
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math")
if platform.machine().lower() in ("x86_64", "amd64"):
    FLAGS += ("-mprefer-vector-width=256",)
FLAGS += ("-fopenmp" if _OPENMP else "-fopenmp-simd", "-std=c++17")
LDFLAGS = ("-fopenmp",) if _OPENMP else ()
DTYPES = (torch.float32, torch.float64)

_lock = threading.Lock()
_module = None
_error: Optional[str] = None
_detail: Optional[str] = None  # a failed build's whole message (the compiler's output)


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


def build_key() -> str:
    """The kernels' build: a hash of their sources, compiler flags, torch, Python, CPU and
    platform (a build folder's name; the cost model's calibration is keyed by it too)."""
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.name.encode() + path.read_bytes())
    from ..cost import cpu_name

    # a finished build folder is never written again (a new build goes to a folder of its own
    # and is renamed into place), so the sources' own folder need not be part of the key: a
    # checkout and an installed copy of the same code share a build; the extension suffix
    # names the Python the module was built for
    abi = sysconfig.get_config_var("EXT_SUFFIX") or sys.implementation.cache_tag
    flags = f"{FLAGS}|{LDFLAGS}"
    where = f"{_LAYOUT}|{torch.__version__}|{abi}|{cpu_name()}|{platform.machine()}|{flags}"
    digest.update(where.encode())
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    """The folder of this machine's build (it exists only once a build is complete)."""
    folder = os.environ.get(BUILD_ENV)
    base = Path(folder) if folder else Path.home() / ".cache" / "mgrit-gru" / "kernels"
    return base / build_key()


_NO_CXX, _NO_NINJA = "no C++ compiler (c++ or g++) on PATH", "no ninja on PATH"
_FIX = {_NO_CXX: "install g++ (e.g. apt-get install g++)", _NO_NINJA: "pip install ninja"}


def _missing_tools() -> Optional[str]:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None and shutil.which("g++") is None:
        return _NO_CXX
    ninja = Path(sys.executable).with_name("ninja")
    if shutil.which("ninja") is None and not ninja.exists():
        return _NO_NINJA
    return None


def load(build: bool = True, fresh: bool = False):
    """The compiled module, built if needed and ``build`` (built anew where ``fresh``); None
    (and :func:`error` says why) where it cannot be built or loaded, which it says once per
    process, in one warning."""
    global _module, _error, _detail
    if _module is not None or _error is not None:
        return _module
    with _lock:
        if _module is not None or _error is not None:
            return _module
        missing = _missing_tools()
        if missing:
            _error = missing
            _warn(
                f"mgrit_gru: {missing}, so the PyTorch steps run instead of the compiled CPU "
                f"kernels; {_FIX[missing]}, then `{COMMAND}` builds them"
            )
            return None
        try:
            _module = _load_or_build(build, fresh)
            if _module is not None:
                # what SolveStats.kernels reports, and how a cell tells it from the Triton token
                # (an attribute, not getattr with a default: a miss on a module costs us)
                _module.name = "compiled"
        except Exception as exc:  # a failed build: the PyTorch path runs; error() says why
            _detail = str(exc).strip()
            lines = _detail.splitlines()
            last = lines[-1].strip().rstrip(".") if lines else type(exc).__name__
            _error = f"the build failed: {last}"
            _warn(
                f"mgrit_gru: the CPU kernels could not be built ({_error}); the PyTorch steps "
                f"run instead; `{COMMAND} --rebuild` builds them anew and says more"
            )
        return _module


def error() -> Optional[str]:
    """Why the compiled kernels are unavailable (None while they are, or before a load)."""
    return _error


def rebuild():
    """Build the kernels anew, whatever is cached (the cached build is replaced once the new
    one is complete), and load them: :func:`load` otherwise."""
    global _module, _error
    with _lock:
        _module, _error = None, None
    return load(build=True, fresh=True)


# --- the build -------------------------------------------------------------------------------
#
# KEY (build_dir()) appears only complete: a build compiles into KEY.tmp-PID-XXXX beside it,
# drops what the module does not need, records the library's size and SHA-256 in MANIFEST and
# renames the folder to KEY. One process at a time builds a KEY: it holds an flock on
# KEY.lock (the kernel drops it when the process dies, however it dies) and writes its pid
# there, which it clears when done; a process that takes the lock and finds a pid there knows
# that build was interrupted, says so, clears its leftovers and builds anew. A cached library
# is loaded only if it matches its manifest (a truncated library would kill the process).

_LAYOUT = "layout 2: KEY renamed in complete, with build.json"
MANIFEST = "build.json"
COMMAND = "python -m mgrit_gru.kernels"
WAIT_NOTICE_S = 5.0  # say which process is building after waiting this long
WAIT_LIMIT_S = 30 * 60.0  # and give up waiting (the PyTorch steps run) after this long


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def _validated(folder: Path) -> tuple[Optional[Path], Optional[str], str]:
    """(the library, None, its module name) where ``folder`` holds a complete build that
    matches its manifest; (None, what is wrong, "") where it holds something else; (None,
    None, "") where there is no such folder."""
    if not folder.exists():
        return None, None, ""
    try:
        record = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        library = folder / record["library"]
        size, digest, module = int(record["size"]), str(record["sha256"]), str(record["module"])
    except FileNotFoundError:
        return None, f"no {MANIFEST}: an unfinished or foreign build", ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"an unreadable {MANIFEST} ({type(exc).__name__})", ""
    try:
        actual = library.stat().st_size
    except OSError:
        return None, f"{library.name} is missing", ""
    if actual != size:
        return None, f"{library.name} has {actual} bytes, the build recorded {size}", ""
    if _sha256(library) != digest:
        return None, f"{library.name} differs from the build's SHA-256", ""
    return library, None, module


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _import(library: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _take_aside(folder: Path, why: Optional[str] = None) -> None:
    """Move ``folder`` out of the way (rename, then delete), saying ``why`` where given."""
    if not folder.exists():
        return
    if why:
        _warn(f"mgrit_gru: the cached CPU kernels in {folder} are refused ({why}); building anew")
    aside = folder.with_name(f"{folder.name}.old-{os.getpid()}-{os.urandom(3).hex()}")
    try:
        folder.rename(aside)
    except FileNotFoundError:  # another process moved it first
        return
    shutil.rmtree(aside, ignore_errors=True)


def _load_or_build(build: bool, fresh: bool):
    folder = build_dir()
    library, _, module = _validated(folder)
    if library is not None and not fresh:
        return _import(library, module)
    if not build:
        return None
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _BuildLock(folder) as previous:
        if previous:
            _warn(
                f"mgrit_gru: an earlier build of the CPU kernels ({previous}) was interrupted; "
                f"its lock and leftovers in {folder.parent} are cleared and the build starts anew"
            )
        library, problem, module = _validated(folder)
        if library is not None and not fresh:  # another process built it meanwhile
            return _import(library, module)
        if problem:
            _take_aside(folder, why=problem)
        for left in folder.parent.glob(f"{folder.name}.*-*"):  # .tmp-, .old-: no one's now
            if left.is_dir():
                shutil.rmtree(left, ignore_errors=True)
        return _build(folder)


def _build(folder: Path):
    from torch.utils import cpp_extension

    _warn(
        f"mgrit_gru: compiling the CPU kernels for this machine once, into {folder} (about a "
        f"minute; `{COMMAND}` does it ahead)"
    )
    ninja_dir = str(Path(sys.executable).parent)
    if ninja_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = ninja_dir + os.pathsep + os.environ.get("PATH", "")
    work = Path(tempfile.mkdtemp(prefix=f"{folder.name}.tmp-{os.getpid()}-", dir=folder.parent))
    try:
        work.chmod(0o755)  # mkdtemp's 0700 would stay with the build once renamed
        module = cpp_extension.load(
            name=f"mgrit_gru_cpu_{folder.name}",
            sources=[str(s) for s in SOURCES],
            extra_cflags=list(FLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(work),
            verbose=False,
        )
        library = Path(module.__file__)
        for item in work.iterdir():  # objects, ninja's files, torch's lock: not needed now
            if item != library:
                shutil.rmtree(item) if item.is_dir() else item.unlink()
        _fsync(library)
        record = {
            "library": library.name,
            "module": module.__name__,
            "size": library.stat().st_size,
            "sha256": _sha256(library),
            "torch": torch.__version__,
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (work / MANIFEST).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        _fsync(work / MANIFEST)
        _take_aside(folder)  # fresh: the build it replaces
        os.rename(work, folder)
        _fsync(folder.parent)
        return module
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _BuildLock:
    """One builder per KEY across processes: an flock on KEY.lock, holding the builder's pid
    while it builds. Entering waits for another builder (saying so after a few seconds) and
    yields a description of the build that held it last and died mid-way, or ""."""

    def __init__(self, folder: Path):
        self.path = folder.with_name(f"{folder.name}.lock")
        self.fd: Optional[int] = None

    def __enter__(self) -> str:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is None:  # no flock here (Windows): builds in separate folders still work
            return ""
        start, told = time.monotonic(), False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited > WAIT_LIMIT_S:
                    raise TimeoutError(
                        f"{self._holder() or 'another process'} has been building the CPU "
                        f"kernels in {self.path.parent} for {waited / 60:.0f} minutes"
                    ) from None
                if waited > WAIT_NOTICE_S and not told:
                    told = True
                    _warn(
                        f"mgrit_gru: waiting for {self._holder() or 'another process'}, which "
                        f"is building the CPU kernels in {self.path.parent}"
                    )
                time.sleep(0.2)
            except OSError:  # a file system without locks: go on without one
                break
        previous = self._holder()
        me = f"process {os.getpid()} on {platform.node()}, started {time.ctime()}"
        self._write(me)
        return previous

    def _holder(self) -> str:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                return f.read().strip()
        except OSError:
            return ""

    def _write(self, text: str) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode(), 0)

    def __exit__(self, *exc) -> None:
        try:
            self._write("")  # a clean end, built or failed: nothing for the next one to report
        finally:
            os.close(self.fd)  # drops the flock


def compiled_for(choice: str, t: torch.Tensor):
    """The compiled kernels to run sweeps on ``t``'s device and dtype under ``choice`` (a
    resolved :data:`CHOICES` value): the C++ module, the Triton token
    (:func:`mgrit_gru.kernels.gpu.kernels`), or None for the PyTorch code. ``"compiled"`` and
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
