"""The per-machine calibration of the cost model: fit, cache, choice of table, CLI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from mgrit_gru import calibrate, cost
from mgrit_gru.cli import main
from mgrit_gru.layer.solve import step_kind
from mgrit_gru.options import auto_cfactor

ROW = {
    "step": (12.0, 0.5),
    "fused": (10.0, 0.8),
    "adjoint": (5.0, 0.25),
    "sweep": (2.0, 0.3),
    "sweep_adjoint": (1.5, 0.2),
}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Every test gets an empty cache folder of its own and a fresh cost-model state."""
    monkeypatch.setenv(cost.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(cost.ENV, "builtin")  # as conftest sets it for the whole suite
    cost.reset()
    yield
    cost.reset()


def _cached_mode(monkeypatch):
    monkeypatch.setenv(cost.ENV, "cached")  # the default outside the test suite
    cost.reset()


def test_fit_recovers_known_overhead_and_cost_per_row():
    o, c = 32.0, 0.4
    points = [(r, o + c * r) for r in calibrate.ROWS]
    assert calibrate.fit(points) == pytest.approx((o, c))
    # relative noise of 2%, alternating: the intercept stays close (relative weighting)
    noisy = [(r, t * (1.02 if i % 2 else 0.98)) for i, (r, t) in enumerate(points)]
    fo, fc = calibrate.fit(noisy)
    assert fo == pytest.approx(o, rel=0.1) and fc == pytest.approx(c, rel=0.05)
    assert calibrate.fit([(8, 1.0), (2048, 1000.0)])[0] == 0.0  # o clamped at 0
    # the table at H = 64, or scaled from the nearest H
    assert calibrate.at_h64({32: (1.0, 9.0), 64: (2.0, 0.5)}) == (2.0, 0.5)
    o128, c128 = calibrate.at_h64({128: (3.0, 0.4 * cost.row_scale(128))})
    assert (o128, c128) == (3.0, pytest.approx(0.4))


def test_builtin_without_a_cache_and_when_asked(monkeypatch):
    assert cost.active().origin == "builtin" and cost.table() is cost.BUILTIN
    calibrate.save(ROW)  # a cache for this machine: MGRIT_GRU_CALIBRATION=builtin ignores it
    assert cost.mode() == "builtin" and cost.active().origin == "builtin"
    assert cost.overhead_rows(64) == pytest.approx(80.0)


def test_cache_round_trip_keyed_by_machine_and_torch(tmp_path, monkeypatch):
    _cached_mode(monkeypatch)
    path = cost.cache_path()
    assert path == tmp_path / "cache" / "calibration.json"
    assert cost.active().origin == "builtin"  # nothing cached yet
    other = {"Some other CPU | torch 0.1 | threads 1 | cpu": {"cpu": {"step": [1, 1]}}}
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(other))
    cost.reload()
    assert cost.active().origin == "builtin"  # another machine's entry is not ours
    entry = calibrate.save(ROW, form="quick")
    data = json.loads(path.read_text())
    key = cost.machine_key()
    assert set(data) == set(other) | {key} and data[key] == entry
    assert cost.cpu_name() in key and torch.__version__ in key and "threads 1" in key
    assert entry["cpu_name"] == cost.cpu_name() and entry["threads"] == 1 and entry["measured"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["calibration.json"]  # no tmp left
    now = cost.active()
    assert now.origin == "cached" and now.path == str(path) and cost.cpu_name() in now.describe()
    assert now.table["cpu"] == ROW and now.table["cuda"] == cost.BUILTIN["cuda"]
    assert cost.overhead_rows(64) == pytest.approx(24.0)
    weights = cost.WEIGHT_ROWS * 0.25 * (2**2 - 1)  # the pass over W_hh grows as H^2
    assert cost.step_us("adjoint", 10, 128) == pytest.approx(
        5.0 + weights + 0.25 * 10 * cost.row_scale(128)
    )
    # another CPU or another torch: not this machine's entry
    monkeypatch.setattr(cost, "cpu_name", lambda: "Intel Xeon Test")
    cost.reload()
    assert cost.active().origin == "builtin"
    monkeypatch.undo()
    _cached_mode(monkeypatch)
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    cost.reload()
    assert cost.active().origin == "builtin"


def test_unusable_caches_fall_back_to_builtin(monkeypatch):
    _cached_mode(monkeypatch)
    path = cost.cache_path()
    path.parent.mkdir(parents=True)
    for text in ("{not json", "[1, 2]", json.dumps({cost.machine_key(): {"cpu": {"step": 1}}})):
        path.write_text(text)
        cost.reload()
        assert cost.active().origin == "builtin"
    bad = {k: [1.0, 0.0] for k in cost.KINDS}  # c = 0
    path.write_text(json.dumps({cost.machine_key(): {"cpu": bad}}))
    cost.reload()
    assert cost.active().origin == "builtin"
    with pytest.raises(calibrate.CalibrationError):
        calibrate.save({**ROW, "step": (1.0, -1.0)})


def test_environment_override(monkeypatch):
    _cached_mode(monkeypatch)
    calibrate.save(ROW)
    assert cost.active().origin == "cached"
    monkeypatch.setenv(cost.ENV, "builtin")
    assert cost.active().origin == "builtin" and cost.overhead_rows(64) == pytest.approx(80.0)
    monkeypatch.setenv(cost.ENV, "cached")
    assert cost.active().origin == "cached"  # read once, the override checked at every use
    monkeypatch.setenv(cost.ENV, "bultin")
    with pytest.raises(ValueError, match="MGRIT_GRU_CALIBRATION"):
        cost.table()


def test_pinned_table_drives_the_decisions():
    meter_before = cost.Meter(64)
    with cost.use(ROW) as now:
        assert now.origin == "pinned" and cost.active() is now
        assert cost.overhead_rows(64) == pytest.approx(24.0)
        assert auto_cfactor(16384, 4, 64) == 256  # sqrt(28 * 65536 / 24) = 276
        meter = cost.Meter(64)
    assert cost.active().origin == "builtin" and auto_cfactor(16384, 4, 64) == 128
    meter.add("step", 10)
    meter_before.add("step", 10)
    assert meter.spent == pytest.approx(17.0) and meter_before.spent == pytest.approx(36.0)
    with pytest.raises(ValueError):
        cost.use({"step": (1.0, 1.0)})


def test_a_quick_real_measurement_is_positive_and_finite():
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    fits = calibrate.measure_fits(hidden=(32,), rows=(2, 128, 1024), rounds=2)
    assert set(fits) == set(cost.KINDS) and all(set(f) == {32} for f in fits.values())
    assert all(math.isfinite(o) and math.isfinite(c) for f in fits.values() for o, c in f.values())
    # the caller's threads, dtype (float64 here) and random numbers are left alone
    assert torch.get_num_threads() == threads and torch.get_default_dtype() == torch.float64
    assert torch.equal(torch.get_rng_state(), rng)
    with calibrate._measuring():
        points = calibrate.time_points("fused", 16, (2, 64, 1024), rounds=1)
    assert [r for r, _ in points] == [2, 64] and all(0 < t < 1e6 for _, t in points)


def test_calibrate_command(monkeypatch, capsys):
    monkeypatch.setattr(calibrate, "measure", lambda quick=True, log=None: dict(ROW))
    assert main(["calibrate"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "cached in" in out and "this machine" in out and "built-in" in out
    # the chunk lengths from the o/c of the steps this process runs: the compiled sweeps' (a
    # few rows' worth of fixed cost: long chunks), else the PyTorch steps'
    step = step_kind()
    assert f'cfactor="auto" (o/c of "{step}" drives it' in out
    big, small = {"sweep": ("512 built-in: 512", "256 built-in: 512")}.get(
        step, ("256 built-in: 128", "128 built-in: 64")
    )
    assert f"T=16384 B=4 H=64 this machine: {big}" in out
    assert f"T=784 B=32 H=64 this machine: {small}" in out
    entry = json.loads(cost.cache_path().read_text())[cost.machine_key()]
    assert entry["cpu"] == {k: list(v) for k, v in ROW.items()} and entry["form"] == "quick"
    assert main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert "in use: built-in" in out and "not used" in out  # builtin asked: the built-in table
    _cached_mode(monkeypatch)
    assert main(["calibrate", "--show"]) == 0
    assert "in use: this machine's calibration" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["calibrate", "--quick", "--full"])


def test_calibrate_show_without_a_cache(capsys):
    assert main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert "in use: built-in" in out and "no calibration cached" in out
    assert "step" in out and "80.0" in out


class _Cfg:
    solver, device, time_parallel = "auto", "cpu", 1


def test_a_training_run_measures_once_records_and_resumes_alike(tmp_path, monkeypatch):
    _cached_mode(monkeypatch)
    calls, lines = [], []
    monkeypatch.setattr(
        calibrate, "measure", lambda quick=True, log=None: calls.append(quick) or dict(ROW)
    )
    run = tmp_path / "run"
    now = calibrate.for_run(_Cfg(), run, resume=False, log=lines.append)
    assert calls == [True] and len(lines) == 1 and str(cost.cache_path()) in lines[0]
    assert now.origin == "pinned" and cost.overhead_rows(64) == pytest.approx(24.0)
    record = json.loads((run / calibrate.RUN_FILE).read_text())
    assert record["origin"] == "cached" and record["cpu"] == {k: list(v) for k, v in ROW.items()}
    calibrate.for_run(_Cfg(), tmp_path / "run2", resume=False, log=lines.append)
    assert calls == [True] and len(lines) == 1  # cached: measured once per machine
    # the cache changes (a new calibration); the run resumes with its own table
    calibrate.save({k: (o * 2, c) for k, (o, c) in ROW.items()})
    cost.reset()
    assert cost.overhead_rows(64) == pytest.approx(48.0)
    calibrate.for_run(_Cfg(), run, resume=True)
    assert cost.overhead_rows(64) == pytest.approx(24.0)
    # a run without a record (from before calibrations) resumes with the built-in table
    calibrate.for_run(_Cfg(), tmp_path / "old", resume=True)
    assert cost.active().origin == "builtin" and not (tmp_path / "old").exists()


def test_runs_that_need_no_calibration(tmp_path, monkeypatch):
    _cached_mode(monkeypatch)
    monkeypatch.setattr(calibrate, "measure", lambda **kw: pytest.fail("measured"))
    for solver, device in (("serial", "cpu"), ("torch", "cpu"), ("auto", "cuda:0")):
        cfg = _Cfg()
        cfg.solver, cfg.device = solver, device
        calibrate.for_run(cfg, tmp_path / solver, resume=False)
        assert not (tmp_path / solver).exists()
    cfg = _Cfg()
    cfg.time_parallel = 2  # ranks decide alike: the built-in table
    assert calibrate.for_run(cfg, tmp_path / "tp", resume=False).origin == "builtin"
    # MGRIT_GRU_CALIBRATION=builtin: nothing measured, the built-in table recorded
    monkeypatch.setenv(cost.ENV, "builtin")
    cost.reset()
    assert calibrate.for_run(_Cfg(), tmp_path / "t", resume=False).table is cost.BUILTIN
    assert json.loads((tmp_path / "t" / calibrate.RUN_FILE).read_text())["origin"] == "builtin"


def test_a_refused_run_folder_is_left_alone(tmp_path):
    (tmp_path / "file").write_text("x")
    calibrate.for_run(_Cfg(), tmp_path / "file", resume=False)
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "checkpoint.pt").write_text("x")
    calibrate.for_run(_Cfg(), tmp_path / "held", resume=False)
    assert sorted(p.name for p in (tmp_path / "held").iterdir()) == ["checkpoint.pt"]
    assert (tmp_path / "file").read_text() == "x"


# -- the thread count the model prices at ------------------------------------------------------


def test_sweep_blocks_are_the_compiled_sweeps_own():
    # the constants the model mirrors, read from the C++ source the sweeps are built from
    header = (Path(cost.__file__).parent / "kernels" / "common.h").read_text()
    for name, value in (
        ("BLOCKS", cost.SWEEP_BLOCKS),
        ("BLOCK_ROWS", cost.BLOCK_ROWS),
        ("PARALLEL_WORK", cost.PARALLEL_WORK),
    ):
        match = re.search(rf"constexpr int64_t {name} = ([^;]+);", header)
        assert match and eval(match.group(1), {}) == value, name
    # over_blocks: about R / 16 rows a block, whole groups of four, at most 256
    assert cost.sweep_blocks(4) == (1, 4)
    assert cost.sweep_blocks(100) == (13, 8)
    assert cost.sweep_blocks(4096 * 4) == (64, 256)


def test_threads_speed_up_only_sweeps_with_many_blocks():
    eff = cost.THREAD_EFFICIENCY
    # the serial solve's sweep over B = 4 rows is one block: one thread whatever the count
    assert cost.thread_share("sweep", 4, 16384, 64, 2) == 1.0
    # MGRIT's sweeps over T / m x B rows: every thread, each at the measured efficiency
    assert cost.thread_share("sweep", 4096 * 4, 3, 64, 2) == pytest.approx(2 * eff)
    assert cost.thread_share("sweep_adjoint", 4096 * 4, 3, 64, 4) == pytest.approx(4 * eff)
    # 13 blocks on 4 threads: the busiest thread runs 4 of them
    assert cost.thread_share("sweep", 100, 1000, 64, 4) == pytest.approx(100 / 32 * eff)
    # below the work that opens a parallel region, and torch's own steps: one thread
    assert cost.thread_share("sweep", 16, 2, 64, 2) == 1.0  # 2048 < 4096
    assert cost.thread_share("step", 4096, 3, 64, 2) == 1.0
    one = cost.step_us("sweep", 4096, 64, steps=3)
    assert cost.step_us("sweep", 4096, 64, threads=2, steps=3) < one
    assert cost.serial_us("sweep", 16384, 4, 64, threads=2) == cost.serial_us("sweep", 16384, 4, 64)
    # so two threads make MGRIT's first relaxation, not the serial solve, cheaper
    first = [cost.first_relaxation_us("sweep", 16, 1024, 4, 64, threads=t) for t in (1, 2)]
    assert first[1] < first[0] / 1.5


def test_pricing_threads_pinned_from_the_environment_or_torch(monkeypatch):
    monkeypatch.setenv(cost.THREADS_ENV, "3")
    assert cost.pricing_threads() == 3 and cost.pricing_threads(time_group=True) == 1
    cost.pin_threads(2)
    assert cost.pricing_threads() == 2
    cost.reset()
    monkeypatch.delenv(cost.THREADS_ENV)
    assert cost.pricing_threads() == torch.get_num_threads()
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(cost.THREADS_ENV, bad)
        with pytest.raises(ValueError, match=cost.THREADS_ENV):
            cost.pricing_threads()
    with pytest.raises(ValueError, match="at least 1"):
        cost.pin_threads(0)


def test_a_run_records_its_threads_and_resumes_with_them(tmp_path, monkeypatch):
    _cached_mode(monkeypatch)
    monkeypatch.setattr(calibrate, "measure", lambda quick=True, log=None: dict(ROW))
    cfg = _Cfg()
    cfg.threads = 2
    calibrate.for_run(cfg, tmp_path / "run", resume=False, log=lambda line: None)
    assert cost.pricing_threads() == 2
    assert json.loads((tmp_path / "run" / calibrate.RUN_FILE).read_text())["threads"] == 2
    cost.reset()
    calibrate.for_run(_Cfg(), tmp_path / "run", resume=True)  # resumed at another --threads
    assert cost.pricing_threads() == 2
    calibrate.for_run(_Cfg(), tmp_path / "old", resume=True)  # recorded before: one thread
    assert cost.pricing_threads() == 1
