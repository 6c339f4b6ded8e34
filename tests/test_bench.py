"""mgrit-gru bench on tiny sizes: the table, the JSON, and its errors."""

from __future__ import annotations

import json

import pytest
import torch

import mgrit_gru
from mgrit_gru import memory
from mgrit_gru.cli import main


@pytest.fixture(autouse=True)
def _float32():
    torch.set_default_dtype(torch.float32)


def test_bench_table_and_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    argv = [
        "bench",
        "--T",
        "20",
        "70",
        "--batch",
        "2",
        "--input",
        "3",
        "--hidden",
        "4",
        "--repeats",
        "1",
        "--settings",
        "default",
        "cfactor=4,tol=1e-7",
        "--json",
        str(path),
        "--no-memory",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "threads=1" in out and "x torch" in out
    data = json.loads(path.read_text())
    rows = data["rows"]
    assert [r["solver"] for r in rows[:4]] == [
        "torch.nn.GRU",
        "serial",
        "mgrit(default)",
        "mgrit(cfactor=4,tol=1e-07)",
    ]
    assert {r["T"] for r in rows} == {20, 70} and len(rows) == 8
    for r in rows:
        assert r["train_s"] > 0 and r["fwd_s"] > 0
        assert r["max_abs_y_err"] < 1e-5 and r["rel_grad_err"] < 1e-4
    serial = [r for r in rows if r["solver"] == "serial"][0]
    assert serial["speedup_vs_serial"] == 1.0 and serial["max_abs_y_err"] == 0.0
    assert data["meta"]["threads"] == 1
    assert all(r["peak_mb"] is None for r in rows)


@pytest.mark.skipif(not memory.supported("cpu"), reason="needs Linux /proc/self/clear_refs")
def test_peak_memory_probe_measures_the_step():
    small = memory.step_peak_mb("mgrit", 512, 4, 8, 32, setting="cfactor=8")
    large = memory.step_peak_mb("mgrit", 16384, 4, 8, 32, setting="cfactor=8")
    torch_large = memory.step_peak_mb("torch", 16384, 4, 8, 32)
    # a step at T=16384 holds at least its outputs, their gradient and the saved states
    assert large - small > 3 * 16384 * 4 * 32 * 4 / 2**20
    assert torch_large > 3 * 16384 * 4 * 32 * 4 / 2**20


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--settings", "cfactr=4"], "bad MGRIT setting 'cfactr=4'"),
        (["--settings", "cfactor=1"], "invalid cfactor=1"),
        (["--device", "bogus"], "--device 'bogus'"),
        (["--T", "0"], "--T values must be >= 1"),
    ],
)
def test_bench_errors(extra, message, capsys):
    assert main(["bench", "--T", "10", "--repeats", "1", *extra]) == 2
    assert message in capsys.readouterr().err


def test_bench_under_autocast_reports_errors_against_fp32(tmp_path):
    """--autocast bf16: every row runs under autocast and the errors are against the serial
    solve without it. The library's solves stay fp32 under autocast: its serial row is exact,
    its MGRIT row within the solver's tolerance."""
    path = tmp_path / "amp.json"
    argv = ["bench", "--T", "64", "--batch", "2", "--input", "3", "--hidden", "8"]
    argv += ["--repeats", "1", "--settings", "cfactor=8,tol=1e-7", "--autocast", "bf16"]
    assert main([*argv, "--json", str(path)]) == 0
    rows = {r["solver"]: r for r in json.loads(path.read_text())["rows"]}
    assert rows["serial"]["max_abs_y_err"] == 0.0 and rows["serial"]["rel_grad_err"] == 0.0
    assert rows["mgrit(cfactor=8,tol=1e-07)"]["rel_grad_err"] < 1e-4
    assert all(r["peak_mb"] is None for r in rows.values())
    assert json.loads(path.read_text())["meta"]["autocast"] == "bf16"


def test_bench_float64_errors_keep_float64_precision(tmp_path):
    """The errors of a float64 bench are computed in float64 (an exact row reads 0, a tight
    MGRIT row far below float32's resolution)."""
    path = tmp_path / "f64.json"
    argv = ["bench", "--T", "64", "--batch", "2", "--input", "3", "--hidden", "8", "--no-torch"]
    argv += ["--repeats", "1", "--settings", "cfactor=8,tol=1e-12,max_iters=50"]
    assert main([*argv, "--dtype", "float64", "--no-memory", "--json", str(path)]) == 0
    rows = {r["solver"]: r for r in json.loads(path.read_text())["rows"]}
    assert rows["serial"]["rel_grad_err"] == 0.0
    mgrit = rows["mgrit(cfactor=8,tol=1e-12,max_iters=50)"]
    assert mgrit["max_abs_y_err"] < 1e-12 and mgrit["rel_grad_err"] < 1e-12


def test_bench_projected_lstm(tmp_path, capsys):
    """--model lstm --proj-size: torch.nn.LSTM(proj_size=...) against the library's serial
    solve and MGRIT, in float64 (torch's row agrees to rounding: the same problem); the
    projection's size in the header; the memory probe builds the same problem."""
    path = tmp_path / "proj.json"
    argv = ["bench", "--model", "lstm", "--proj-size", "3", "--T", "64", "--batch", "2"]
    argv += ["--input", "3", "--hidden", "8", "--repeats", "1", "--dtype", "float64"]
    argv += ["--settings", "cfactor=8,tol=1e-12,max_iters=50", "--no-memory"]
    assert main([*argv, "--json", str(path)]) == 0
    assert "hidden=8 proj_size=3 float64" in capsys.readouterr().out
    rows = {r["solver"]: r for r in json.loads(path.read_text())["rows"]}
    assert rows["torch.nn.LSTM"]["max_abs_y_err"] < 1e-13
    assert rows["torch.nn.LSTM"]["rel_grad_err"] < 1e-12
    mgrit = rows["mgrit(cfactor=8,tol=1e-12,max_iters=50)"]
    assert mgrit["fwd_iters"] > 0 and mgrit["rel_grad_err"] < 1e-11
    if memory.supported("cpu"):
        assert memory.step_peak_mb("serial", 64, 2, 3, 8, model="lstm", proj_size=3) > 0
    assert main(["bench", "--T", "10", "--repeats", "1", "--proj-size", "3"]) == 2
    assert "--proj-size 3: needs --model lstm" in capsys.readouterr().err


def test_bench_settings_name_a_budget():
    from mgrit_gru.bench import parse_setting

    opts = parse_setting("cfactor=8,budget_forward=2,budget_backward=1,budget_gradient=unrolled")
    assert opts.cfactor == 8
    assert opts.budget == mgrit_gru.Budget(forward=2, backward=1, gradient="unrolled")
    with pytest.raises(ValueError, match="Budget"):
        parse_setting("budget_forward=-1")


def test_time_parallel_rows_resolve_the_automatic_settings():
    """Across ranks the split needs a number and the choice is off: the bench's default
    settings give MGRIT with the cfactor that "auto" picks for the shape."""
    from mgrit_gru.bench import time_parallel_options
    from mgrit_gru.layer.solve import step_kind
    from mgrit_gru.options import auto_cfactor

    for spec in ("auto", "default"):
        opts = time_parallel_options(spec, 65536, 4, 64)
        m = auto_cfactor(65536, 4, 64, kind=step_kind())
        assert isinstance(opts, mgrit_gru.MGRIT) and opts.cfactor == m
        assert opts == mgrit_gru.MGRIT(cfactor=opts.cfactor)
    assert time_parallel_options("cfactor=32,relax=F", 4096, 4, 64).cfactor == 32
