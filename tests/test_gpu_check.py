"""benchmarks/gpu_check.sh in its dry run: the GPU check cannot rot while no GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run_writes_its_results(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("versions.txt", "tests.txt", "bench.txt", "bench.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["meta"]["dry_run"] and not data["failures"]
    assert {r["solver"] for r in data["correctness"]} >= {"serial", "mgrit", "auto"}
    assert {r["solver"] for r in data["table"]} >= {"cuDNN", "serial", "mgrit", "auto"}
    assert set(data["calibration_H8"]) == {"step", "adjoint"}
    assert "on_ms" in data["early_exit"]
    assert "gpu_check: tests rc=0, bench rc=0, scaling rc=skipped" in done.stdout
    assert not (tmp_path / "scaling.txt").exists()  # skipped, and said so


def test_gpu_check_refuses_unknown_arguments():
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--fast"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "unknown argument --fast" in done.stderr
