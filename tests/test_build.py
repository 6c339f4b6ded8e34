"""The build of the compiled CPU kernels leaves no trap, says why it cannot run, and ships
(issue 39, items 1, 6 and 9), with real processes:

- a build killed a few seconds into its compile (SIGTERM to the Python process, as `timeout`
  sends it, its compilers left running; or SIGKILL) leaves a lock and leftovers; the next
  process neither hangs nor crashes, says in one line that the earlier build was interrupted,
  and builds anew (here with a compiler that fails at once: the PyTorch steps run, with one
  warning naming the command that rebuilds; the wheel test below rebuilds for real);
- a damaged cached build (a truncated library: a Bus error when loaded; a folder holding
  only torch's empty ``lock``: a wait forever) is refused by its manifest, not loaded;
- no compiler on PATH: one warning per process saying why and how to get the kernels;
- a wheel built from the repository carries the C++ sources, and installed into a fresh
  virtual environment outside the checkout it builds them and runs a compiled sweep.

Every build here goes to a temporary ``MGRIT_GRU_BUILD``: the user's cache is never touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from mgrit_gru import kernels

ROOT = Path(__file__).resolve().parents[1]
# a fresh Python imports torch in 5-15 s on these loaded 2-core machines; a hang is forever
TIMEOUT_S = 180

# the first-use path: a serial GRU on "auto", as a user's first call runs it
SWEEP = (
    "import torch, mgrit_gru\n"
    "g = mgrit_gru.GRU(3, 4, solver='serial')\n"
    "g(torch.randn(5, 1, 3))\n"
    "g(torch.randn(7, 2, 3))\n"
    "print(g.last_stats.forward[0].kernels)\n"
)

needs_a_compiler = pytest.mark.skipif(
    kernels._missing_tools() is not None, reason=f"cannot build here: {kernels._missing_tools()}"
)


def _env(build: Path, **extra: str) -> dict:
    env = {**os.environ, kernels.BUILD_ENV: str(build), "PYTHONWARNINGS": "always", **extra}
    env.pop(kernels.ENV, None)  # "auto"
    env.pop("PYTHONPATH", None)
    return env


def _run(argv: list, env: dict, cwd=None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{argv[1:]} hung for {TIMEOUT_S} s: {exc.stderr!r}")


def _lines(text: str, words: str) -> list[str]:
    return [line for line in text.splitlines() if words in line]


def _kill_a_build(build: Path, how: signal.Signals, python: str = sys.executable, cwd=None):
    """Start ``python -m mgrit_gru.kernels`` into ``build`` and kill it (``how``, to the Python
    process alone) a few seconds after its compilers start. Returns the dead builder's pid and
    its session (the orphaned ninja and compilers: the caller kills them when done)."""
    build.mkdir(parents=True, exist_ok=True)
    log = build.parent / "killed-builder.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [python, "-m", "mgrit_gru.kernels"],
            env=_env(build),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        # torch writes the build's ninja file right before ninja starts the compilers
        while not list(build.glob("*.tmp-*/build.ninja")):
            if proc.poll() is not None:
                pytest.fail(f"the build ended before it was killed: {log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail("the build did not start compiling")
            time.sleep(0.1)
        time.sleep(3)  # a few seconds into the compile
        assert proc.poll() is None, "the build ended before it was killed"
        os.kill(proc.pid, how)
        proc.wait(timeout=60)
    except BaseException:
        _kill_session(proc.pid)
        raise
    return proc.pid


def _kill_session(sid: int) -> None:
    """SIGKILL every process of the session the builder started (its orphaned ninja and
    compilers: ninja gives each compiler a process group of its own, not a session)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                os.kill(int(stat.parent.name), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            pass


def _state(build: Path) -> tuple[list[str], str]:
    """The names under ``build`` and the text of its build lock."""
    locks = list(build.glob("*.lock"))
    return sorted(p.name for p in build.iterdir()), locks[0].read_text() if locks else ""


@needs_a_compiler
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_killed_build_leaves_no_trap(tmp_path, how):
    """The next process, in the same build folder: no hang, no crash; one line that the
    earlier build (its pid) was interrupted, then a build anew that fails here at once (CXX
    is /bin/false): the PyTorch steps, one warning naming the command that rebuilds. The first
    GRU call after a SIGTERM (its compilers still running), the build command after a
    SIGKILL."""
    build = tmp_path / "build"
    pid = _kill_a_build(build, getattr(signal, how))
    try:
        names, lock = _state(build)
        assert any(".tmp-" in n for n in names) and f"process {pid}" in lock, (names, lock)
        assert not kernels._validated(build / kernels.build_key())[0]
        if how == "SIGTERM":
            done = _run([sys.executable, "-c", SWEEP], _env(build, CXX="/bin/false"))
            assert done.returncode == 0 and done.stdout.split() == ["torch"], done
        else:
            argv = [sys.executable, "-m", "mgrit_gru.kernels"]
            done = _run(argv, _env(build, CXX="/bin/false"))
            assert done.returncode == 0, done
            assert "compiled CPU kernels unavailable (the build failed" in done.stdout
    finally:
        _kill_session(pid)
    said = _lines(done.stderr, "was interrupted")
    assert len(said) == 1 and f"process {pid} " in said[0], done.stderr
    failed = _lines(done.stderr, "could not be built")
    assert len(failed) == 1 and "`python -m mgrit_gru.kernels --rebuild`" in failed[0]
    names, lock = _state(build)
    assert lock == "" and names == [f"{kernels.build_key()}.lock"], names  # leftovers cleared


def _copy_of_this_build(tmp_path: Path) -> Path:
    """A copy of the build this process runs (skip where none), under a new MGRIT_GRU_BUILD."""
    if kernels.load() is None:
        pytest.skip(f"no compiled kernels here: {kernels.error()}")
    build = tmp_path / "build"
    shutil.copytree(kernels.build_dir(), build / kernels.build_key())
    return build


def test_a_truncated_library_is_refused_not_loaded(tmp_path):
    """A cached library cut short (a full disk, a copy interrupted) killed the process with a
    Bus error when loaded; its size against the manifest refuses it, in one line, and the
    build starts anew (failing here at once: the PyTorch steps run)."""
    build = _copy_of_this_build(tmp_path)
    folder = build / kernels.build_key()
    library = kernels._validated(folder)[0]
    size = library.stat().st_size
    with open(library, "r+b") as f:
        f.truncate(size // 2)
    done = _run([sys.executable, "-c", SWEEP], _env(build, CXX="/bin/false"))
    assert done.returncode == 0 and done.stdout.split() == ["torch"], done
    refused = _lines(done.stderr, "are refused")
    assert len(refused) == 1, done.stderr
    assert f"has {size // 2} bytes, the build recorded {size}" in refused[0]
    assert len(_lines(done.stderr, "could not be built")) == 1
    assert not folder.exists()  # the damaged build is gone, not left for the next process


def test_a_folder_with_torchs_stale_lock_is_refused_not_waited_on(tmp_path):
    """The trap of the issue made by hand: the build folder holding only the empty ``lock``
    of torch's builder (what a killed build left before): refused at once, no wait."""
    build = tmp_path / "build"
    folder = build / kernels.build_key()
    folder.mkdir(parents=True)
    (folder / "lock").touch()
    done = _run([sys.executable, "-c", SWEEP], _env(build, CXX="/bin/false"))
    assert done.returncode == 0 and done.stdout.split() == ["torch"], done
    refused = _lines(done.stderr, "are refused")
    assert len(refused) == 1 and "no build.json" in refused[0], done.stderr


def test_the_manifest_checks_size_and_content(tmp_path):
    """In process: a complete copy validates; one changed byte (same size) fails its SHA-256;
    a missing manifest or library is named."""
    build = _copy_of_this_build(tmp_path)
    folder = build / kernels.build_key()
    library, problem, name = kernels._validated(folder)
    assert library is not None and problem is None and name.startswith("mgrit_gru_cpu_")
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))
    assert "differs from the build's SHA-256" in kernels._validated(folder)[1]
    library.unlink()
    assert "is missing" in kernels._validated(folder)[1]
    (folder / kernels.MANIFEST).write_text("{")
    assert "unreadable build.json" in kernels._validated(folder)[1]
    (folder / kernels.MANIFEST).unlink()
    assert "no build.json" in kernels._validated(folder)[1]
    assert kernels._validated(tmp_path / "none") == (None, None, "")


def test_no_compiler_warns_once_per_process(tmp_path):
    """No compiler on PATH, kernels="auto": the PyTorch steps run (GRU and LSTM, several
    calls), with one warning in the process that says why and how to get the kernels (even
    with every warning shown)."""
    code = SWEEP + (
        "l = mgrit_gru.LSTM(3, 5, 2, solver=mgrit_gru.MGRIT(cfactor=4))\n"
        "l(torch.randn(9, 3, 3))\n"
        "l(torch.randn(11, 2, 3))\n"
        "print(l.last_stats.forward[0].kernels)\n"
    )
    env = _env(tmp_path / "build", PATH=str(tmp_path), CXX="no-such-c++")
    done = _run([sys.executable, "-c", code], env)
    assert done.returncode == 0 and done.stdout.split() == ["torch", "pytorch"], done
    said = _lines(done.stderr, "mgrit_gru:")
    assert len(said) == 1, done.stderr
    assert "no C++ compiler (c++ or g++) on PATH" in said[0]
    assert "install g++" in said[0] and "`python -m mgrit_gru.kernels`" in said[0]
    assert not (tmp_path / "build").exists()


# --- a package that carries its kernels ----------------------------------------------------

KERNEL_FILES = [
    *(str(p.relative_to(ROOT)) for p in (*kernels.SOURCES, *kernels.HEADERS)),
    "mgrit_gru/kernels/gpu.py",
    "mgrit_gru/gru/gru_triton.py",
    "mgrit_gru/lstm/lstm_triton.py",
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel`` of a copy of the repository's package (no build files in the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "mgrit_gru", src / "mgrit_gru", ignore=shutil.ignore_patterns("__pycache__")
    )
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist")]
    try:
        import setuptools

        local = int(setuptools.__version__.split(".")[0]) >= 77  # pyproject's build needs
    except ImportError:
        local = False
    argv += ["--no-build-isolation", "--no-index"] if local else []
    done = subprocess.run([*argv, str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (path,) = (tmp / "dist").glob("mgrit_gru-*.whl")
    return path


def test_the_wheel_carries_the_kernel_sources(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in KERNEL_FILES if f not in names]
    assert not missing, f"{wheel.name} lacks {missing}"


@needs_a_compiler
def test_installed_from_the_wheel_it_finds_its_build_and_runs_compiled(wheel, tmp_path):
    """The wheel installed (not editable) into a fresh virtual environment outside the
    checkout (torch and the other dependencies from this one, through a .pth file) computes
    the checkout's build key from the sources it carries (so a build from them is the
    checkout's build: the real compile, and killed compiles, are the other tests'), loads
    that build from a cache of its own and runs compiled sweeps."""
    checkout_build = kernels.build_dir()
    if kernels.load() is None or not checkout_build.is_dir():
        pytest.skip("the checkout's kernels did not build here")
    venv, build = tmp_path / "venv", tmp_path / "build"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = Path(torch.__file__).resolve().parents[1]  # torch, numpy, ninja, ... of this venv
    (Path(site) / "mgrit_gru_test_deps.pth").write_text(f"{deps}\n")
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    install += ["--ignore-installed", "--prefix", str(venv), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    build.mkdir()
    shutil.copytree(checkout_build, build / checkout_build.name)
    code = (
        "import torch, mgrit_gru\n"
        "from mgrit_gru import kernels\n"
        f"assert mgrit_gru.__file__.startswith({site!r}), mgrit_gru.__file__\n"
        "assert all(p.is_file() for p in (*kernels.SOURCES, *kernels.HEADERS))\n"
        "print(kernels.build_key())\n"
        "for cls in (mgrit_gru.GRU, mgrit_gru.LSTM):\n"
        "    m = cls(3, 6, solver=mgrit_gru.MGRIT(cfactor=4), kernels='compiled')\n"
        "    x = torch.randn(33, 2, 3, requires_grad=True)\n"
        "    m(x)[0].square().sum().backward()\n"
        "    print(sorted({s.kernels for s in m.last_stats.forward + m.last_stats.backward}))\n"
    )
    done = subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        env=_env(build),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")
    assert out[0] == kernels.build_key() == checkout_build.name, done.stdout
    assert out[1:3] == ["['compiled']", "['compiled']"], done
    assert "compiling" not in done.stderr, done.stderr  # loaded, not built again
