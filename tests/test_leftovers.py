"""Issue 39, item 7: docs and CLI leftovers (api.md's kernels= lists and LSTM signature, the
projection's validation band, a failed train's run folder, plurals, file modes, the
no-speed-check marker, torch's oneDNN notice)."""

from __future__ import annotations

import os
import re
import stat
import warnings
from pathlib import Path

import pytest
import torch

from mgrit_gru import calibrate, cost, kernels
from mgrit_gru.app import report, speed
from mgrit_gru.cli import NO_SPEED_CHECK, main
from mgrit_gru.projection import cli as projection_cli

DOCS = Path(__file__).resolve().parent.parent / "docs"
TINY = ["--dataset", "adding", "--length", "20", "--max-train", "16", "--max-test", "8"]
TINY += ["--hidden", "4", "--epochs", "1", "--batch-size", "8", "--threads", "1"]


@pytest.fixture(autouse=True)
def _float32():
    torch.set_default_dtype(torch.float32)  # the app trains in float32 (conftest restores it)


def _paragraph(text: str, start: str) -> str:
    at = text.index(start)
    return text[at : text.find("\n\n", at)]


def test_api_names_every_kernels_value_and_the_lstm_takes_kernels():
    api = (DOCS / "api.md").read_text()
    listed = _paragraph(api, "`kernels=` picks what runs the steps")
    for value in kernels.CHOICES:
        assert f'`"{value}"`' in listed, value
    stats = _paragraph(api, "adjoint: `residuals`")
    ran = re.search(r"`kernels` \(what ran the steps: ([^,]*(?:, [^,]*)*?) or \"torch\"", stats)
    for value in ("compiled", "triton", "pytorch"):
        assert f'"{value}"' in ran.group(1), value
    lstm = _paragraph(api, "`mgrit_gru.LSTM(input_size")
    signature = lstm[: lstm.index(")`")]
    assert "kernels=None" in signature and "time_group=None" in signature


@pytest.mark.parametrize("cpu", ["AMD EPYC", "Intel Xeon Test CPU"])
def test_project_prints_the_current_band_and_whether_this_cpu_is_validated(
    cpu, monkeypatch, capsys
):
    monkeypatch.setattr(cost, "cpu_name", lambda: cpu)
    assert main(["project", "--T", "64", "--ranks", "1"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "validation" in ln)
    docs = (DOCS / "projection.md").read_text()
    for band in re.findall(r"\d\.\d\d-\d\.\d\d", projection_cli.VALIDATION["cpu"]):
        assert band in docs  # the band the docs hold now (0.89-0.94 at two ranks)
    assert "0.74-1.33" not in line and "0.89-0.94" in line and "AMD EPYC" in line
    assert ("not validated" in line) == (cpu != "AMD EPYC")


@pytest.mark.parametrize(
    "bad", [["--dataset", "nosuch"], ["--length", "1"], ["--dataset", "adding", "--length", "0"]]
)
def test_a_train_that_fails_on_its_arguments_leaves_no_run_folder(bad, tmp_path, capsys):
    run = tmp_path / "runs" / "new"
    argv = ["train", *TINY, *bad, "--out", str(run), "--no-progress", "--no-speed-check"]
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err
    assert not run.exists() and not run.parent.exists()  # the folders it made are gone
    # a folder that was there before is left as it was
    kept = tmp_path / "mine"
    kept.mkdir()
    assert main([*argv[:-4], "--out", str(kept), "--no-progress", "--no-speed-check"]) == 2
    assert kept.is_dir()


def test_counts_are_plural_only_above_one():
    assert speed.count(1, "thread") == "1 thread" and speed.count(2, "thread") == "2 threads"
    result = {"threads": 1, "batches": 8, "step_ms": {"auto": 2.0, "serial": 3.0}}
    result.update(solver="auto", repeats=1, kernels=["compiled"])
    line = speed.speed_line(result)
    assert "1 thread," in line and "1 threads" not in line
    text = report.speed_text(result)
    assert "1 thread (median)" in text and "1 repeat," in text
    assert "1 threads" not in text and "1 repeats" not in text


def test_calibration_files_are_written_like_the_run_s_other_files(tmp_path, monkeypatch):
    old = os.umask(0o022)
    try:
        path = tmp_path / "calibration.json"
        calibrate.write_json_atomic(path, {"a": 1})
        plain = tmp_path / "plain.json"
        plain.write_text("{}")
        assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_the_no_speed_check_marker_is_documented():
    cli = (DOCS / "cli.md").read_text()
    assert f"`{NO_SPEED_CHECK}`" in cli and "--resume" in _paragraph(cli, "MGRIT gave (forward")


def test_a_projected_lstm_run_prints_no_onednn_notice(tmp_path, capsys):
    argv = ["train", *TINY, "--model", "lstm", "--proj-size", "2", "--out", str(tmp_path / "r")]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main([*argv, "--no-progress"]) == 0  # with the speed check: torch.nn.LSTM
    out = capsys.readouterr()
    assert "oneDNN" not in out.out + out.err
    assert not [w for w in seen if "oneDNN" in str(w.message)]
