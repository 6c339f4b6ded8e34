"""Traces, their expansion to P ranks and their replay on a modelled machine; `mgrit-gru
project`. (That real ranks record what the expansion says: tests/test_distributed.py.)"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

import mgrit_gru
from mgrit_gru import trace as tr
from mgrit_gru.cli import main
from mgrit_gru.distributed import chunk_spans, time_slices
from mgrit_gru.projection import Device, Link, Machine, expand, record_step, replay, training_step
from mgrit_gru.trace import Event, Trace

# A device whose costs are easy to add up by hand: 10 us + 1 us per row per step, 1 us per
# operator between steps, bulk 100 us + 2 us per row.
TOY = Device(
    "toy",
    "cpu",
    {k: (10.0, 1.0) for k in ("step", "adjoint", "fused", "sweep", "sweep_adjoint")},
    op_us=1.0,
    bulk={k: (100.0, 2.0) for k in ("gates", "coefficients", "forcing", "gradients")},
)
LINK = Link("toy link", 5.0, 1e-3, "made up")  # 5 us + 1 us per KB... 1e-3 GB/s: 1 us/byte


def _trace(solver="budget", T=256, B=2, m=16, count_ops=False):
    torch.set_default_dtype(torch.float32)
    step = training_step(T, B, 3, 8, solver, cfactor=m)
    return record_step(step, count_ops, steps=T, cfactor=m)


def test_trace_counts_what_the_solve_ran():
    t, stats = _trace("budget")
    assert stats.forward_iterations >= 1 and stats.backward_iterations >= 1
    summary = t.summary()
    n = 256 // 16
    # every coarse correction of the forward gathers its C-points (plus the final C-points)
    assert summary["messages"]["gather"] >= stats.forward_iterations + 1
    # a sweep is one event: its calls add up to the level-0 steps, over all n chunks at once
    work0 = [e for e in t.of(tr.WORK) if e.level == 0]
    assert work0 and all(e.rows % n == 0 for e in work0)
    assert all(e.calls >= 1 for e in work0)
    assert {e.kind for e in t.of(tr.BULK)} == {"gates", "coefficients", "forcing", "gradients"}
    serial, _ = _trace("serial", m=256)
    serial_work = serial.of(tr.WORK)
    assert all(e.level == tr.SERIAL for e in serial_work)
    adjoint = ("adjoint", "sweep_adjoint")  # the PyTorch steps', the compiled sweeps'
    assert sum(e.calls for e in serial_work if e.kind not in adjoint) == 256
    assert sum(e.calls for e in serial_work if e.kind in adjoint) == 256


def test_recording_is_off_outside_a_block_and_not_nested():
    assert not tr.active()
    tr.work("step", 4, 8)  # a no-op
    with tr.record() as t:
        with pytest.raises(RuntimeError, match="already being recorded"):
            with tr.record():
                pass
    assert t.events == [] and not tr.active()


def test_trace_round_trips_through_json(tmp_path):
    t, _ = _trace("mgrit", count_ops=True)
    assert sum(e.ops for e in t.events) > 0 and sum(e.views for e in t.events) > 0
    t.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert back.events == t.events and back.meta == t.meta


@pytest.mark.parametrize("P", [1, 2, 3, 5])
def test_expansion_splits_the_work_and_keeps_the_coarse_levels(P):
    t, _ = _trace("budget", T=250, m=8)  # 32 chunks, the last one short
    ranks = expand(t, P)
    counts = [c1 - c0 for c0, c1 in chunk_spans(250, P, 8)]
    lengths = [t1 - t0 for t0, t1 in time_slices(250, P, 8)]
    for i, e in enumerate(t.events):
        got = [ranks[r][i] for r in range(P)]
        if e.what == tr.WORK and e.level == 0:
            assert sum(g.rows for g in got) == e.rows
            assert [g.rows for g in got] == [e.rows // 32 * c for c in counts]
        elif e.what == tr.WORK:
            assert all(g == e for g in got)  # coarse levels: whole, on every rank
        elif e.what == tr.BULK:
            assert [g.rows for g in got] == [e.rows // 250 * n for n in lengths]
        elif e.what == tr.MESSAGE and e.kind == tr.GATHER:
            assert all(g.rows == max(counts) for g in got)
        elif e.what == tr.MESSAGE and e.kind == tr.SHIFT:
            peers = [g.peer for g in got]
            assert (
                sorted(p for p in peers if p is not None) == list(range(P))[1:]
                or sorted(p for p in peers if p is not None) == list(range(P))[:-1]
            )


def test_replay_of_one_rank_adds_up_the_costs():
    t, _ = _trace("budget")
    got = replay(expand(t, 1), Machine(TOY, LINK))
    want = sum(TOY.cost_us(e)[1] for e in t.events)
    assert math.isclose(got.seconds, 1e-6 * want, rel_tol=1e-12)
    assert got.split["comm"] == got.split["wait"] == 0.0 and got.messages == 0


def _msg(kind, peer=None, nbytes=8):
    return Event(tr.MESSAGE, kind, 1, 1, 0, 0, nbytes, None, peer)


def test_replay_of_messages_by_hand():
    """Two ranks: rank 0 works 10 + 1 * 4 us, rank 1 10 + 1 * 8 us; then a shift (0 -> 1)
    of 8 bytes (5 us + 8 us), then an all-reduce of 8 bytes (2 * 1 hop * 5 us + 2 * 8 * 1/2
    us)."""
    r0 = [Event(tr.WORK, "step", 4), _msg(tr.SHIFT, peer=1), _msg(tr.SUM)]
    r1 = [Event(tr.WORK, "step", 8), _msg(tr.SHIFT, peer=None), _msg(tr.SUM)]
    got = replay([r0, r1], Machine(TOY, LINK))
    # rank 0 sends at 14 (done 27); rank 1 receives at 14 + 13 = 27 while free at 18 + 13
    shift_end = [14 + 13, max(18 + 13, 14 + 13)]
    reduce = 2 * 5 + 2 * 8 * 0.5
    assert math.isclose(got.seconds, 1e-6 * (max(shift_end) + reduce), rel_tol=1e-12)
    assert got.messages == 2


def test_replay_of_a_serial_pipeline():
    """A serial solve over 3 ranks: each waits for the previous rank's end state."""
    ranks = []
    for r in range(3):
        ranks.append(
            [
                _msg(tr.RECV_PREV, peer=r - 1 if r else None),
                Event(tr.WORK, "adjoint", 1, 100, level=tr.SERIAL),
                _msg(tr.SEND_NEXT, peer=r + 1 if r < 2 else None),
            ]
        )
    got = replay(ranks, Machine(TOY, LINK))
    work, hop = 100 * (10 + 1), 5 + 8
    assert math.isclose(got.seconds, 1e-6 * (3 * work + 2 * hop), rel_tol=1e-12)


def test_cli_project_json(capsys):
    assert main(["project", "--T", "512", "--ranks", "1", "2", "4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["solver"] for r in rows} >= {"serial", "torch.nn.GRU", "mgrit", "budget"}
    for r in rows:
        assert {"ranks", "solver", "train_ms"} <= set(r) and r["projected"] is True
        assert r["train_ms"] > 0 and r["validation"]
    mgrit = {(r["ranks"], r["link"]): r for r in rows if r["solver"] == "budget"}
    assert mgrit[(4, "InfiniBand HDR")]["train_ms"] < mgrit[(1, None)]["train_ms"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--T", "1"], "--T must be at least 2"),
        (["--T", "64", "--ranks", "0"], r"--ranks \[0\]"),
        (["--T", "64", "--ranks", "128"], r"each must lie in 1..T=64"),
        (["--T", "64", "--device", "cuda", "--ranks", "1", "2"], "models one GPU"),
        (["--T", "64", "--checkpoint", "no/such/run"], "no/such/run"),
        (["--T", "64", "--ranks", "1", "--batch", "99999999999"], "recording the training step"),
    ],
)
def test_cli_project_bad_input(argv, message, capsys):
    assert main(["project", *argv]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # before it at most the note that it measures the CPU
    assert "Traceback" not in err and last.startswith("mgrit-gru project: error: ")
    assert re.search(message, last), err


def test_drift_warning_names_the_table_it_compared_against():
    """A slow step against the built-in table (no calibration for these kernels on this
    machine: none yet, or the kernels rebuilt since) says so and how to measure one; against
    this machine's calibration, that the machine is loaded."""
    from mgrit_gru.projection.cli import drift_warning

    builtin, cached = drift_warning(2.04, "builtin"), drift_warning(2.04, "cached")
    assert "2.0x" in builtin and "built-in cost table" in builtin
    assert "mgrit-gru calibrate" in builtin
    assert "this machine's calibration" in cached and "loaded" in cached
    assert "this machine's calibration says" not in builtin


def test_projection_of_the_gpu_uses_its_measured_model(capsys):
    assert main(["project", "--T", "256", "--ranks", "1", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "PROJECTED" in out and "H200" in out and "model validation" in out


def test_trace_hooks_leave_results_alone():
    torch.manual_seed(0)
    # a trace counts the PyTorch steps' work: the kernels that run while one records
    gru = mgrit_gru.GRU(3, 6, solver=mgrit_gru.MGRIT(cfactor=8), kernels="pytorch")
    x = torch.randn(100, 2, 3)
    y0, _ = gru(x)
    with tr.record(count_ops=True):
        y1, _ = gru(x)
    assert torch.equal(y0, y1)


def test_cli_project_defaults_fit_the_shape(capsys):
    """The default ranks stop at T/2; --device cuda alone projects one GPU."""
    assert main(["project", "--T", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert max(r["ranks"] for r in rows) == 8
    assert main(["project", "--T", "64", "--device", "cuda", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["ranks"] for r in rows} == {1}


def test_scaling_benchmark_dry_run():
    """benchmarks/scaling.py (the paper's experiment on real ranks) end to end at P = 1, 2
    on a tiny shape: every row printed, the real ranks' traces equal to one process's
    expanded, the measured split of the slowest rank beside the projection's, the ranks'
    slices solved alone beside each row of two ranks, and under it both ranks' longest event
    kinds (``--events``)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "benchmarks/scaling.py", "--dry-run", "--events", "3"],
        capture_output=True, text=True, cwd=root, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    lines = run.stdout.splitlines()
    rows = [line.split() for line in lines if line.strip().startswith("256 ")]
    assert {(r[1], r[2]) for r in rows} >= {("budget", "1"), ("budget", "2"), ("mgrit", "2")}
    assert "TRACE DIFFERS" not in run.stdout and "comm" in run.stdout
    for r in (r for r in rows if r[1] in ("budget", "mgrit")):  # each P-rank row: its ranks'
        # slices alone, and the P-rank step over that
        if r[2] == "1":
            assert r[9:11] == ["-", "-"], r
        else:
            assert float(r[9]) > 0 and float(r[10]) == pytest.approx(
                float(r[5]) / float(r[9]), 0.02
            )
    two = [i for i, line in enumerate(lines) if line.split()[:3] == ["256", "mgrit", "2"]]
    events = lines[two[0] + 1 : two[0] + 3]  # rank 0's and rank 1's, three kinds each
    assert [e.split(":")[0].strip() for e in events] == ["rank 0", "rank 1"], run.stdout
    entry = r"(work|bulk|message|phase) [\w ]+ -?\d+: \d+x [\d.]+ ms"
    assert all(re.fullmatch(rf"\s*rank \d: {entry}(, {entry}){{2}}", e) for e in events), events


def test_threads_share_the_sweeps_rows_and_the_passes():
    """One process on several threads: a compiled sweep over many rows costs its rows shared
    in the kernels' blocks (cost.thread_share), a serial sweep over B = 4 rows (one block) the
    same as at one thread, a pass over the sequence its rows at 0.8 of a thread each, the
    operators between steps one thread's."""
    import dataclasses

    from mgrit_gru import cost

    two = dataclasses.replace(TOY, threads=2)
    wide = Event(tr.WORK, "sweep", 1024, 63, 64, 0)
    serial = Event(tr.WORK, "sweep", 4, 1000, 64, tr.SERIAL)
    bulk = Event(tr.BULK, "gradients", 65536, 1, 64)
    ops = Event(tr.MESSAGE, tr.SUM, 1, 1, 0, 3)
    share = cost.thread_share("sweep", 1024, 63, 64, 2)
    assert share == pytest.approx(2 * cost.THREAD_EFFICIENCY)
    assert two.cost_us(wide)[1] == pytest.approx(63 * (10.0 + 1024 / share))
    assert two.cost_us(serial) == TOY.cost_us(serial)
    assert two.cost_us(bulk)[1] == pytest.approx(100.0 + 2.0 * 65536 / share)
    assert two.cost_us(ops) == TOY.cost_us(ops)
    # a sweep's measured extra beyond the calibrated step: per call the host's (one thread),
    # per row its rows' own, shared with them; a serial sweep has none
    windowed = dataclasses.replace(two, windows={"sweep": (3.0, 0.5)})
    assert windowed.cost_us(wide)[1] == pytest.approx(63 * (10.0 + 3.0 + 1.5 * 1024 / share))
    assert windowed.cost_us(serial) == two.cost_us(serial)


def test_cli_project_threads(capsys):
    """--threads: one process per thread count, the serial rows at each, x serial against
    the one-thread serial solve; ranks and a GPU are refused with it."""
    argv = ["project", "--T", "512", "--batch", "4", "--threads", "1", "2", "16"]
    assert main([*argv, "--solvers", "mgrit", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    serial = {r["threads"]: r for r in rows if r["solver"] == "serial"}
    mgrit = {r["threads"]: r for r in rows if r["solver"] == "mgrit"}
    assert set(serial) == set(mgrit) == {1, 2, 16}
    assert serial[1]["x_serial"] == pytest.approx(1.0, rel=1e-3)
    assert mgrit[16]["train_ms"] < mgrit[2]["train_ms"] < mgrit[1]["train_ms"]
    assert {r["ranks"] for r in rows} == {1}
    assert mgrit[16]["device"].endswith("16 threads)") and serial[1]["device"].endswith("1 thread)")
    assert all("threads" in r for r in rows)  # torch.nn.GRU's row too (measured at one)
    refused = (
        (["--ranks", "2"], "without --ranks"),
        (["--device", "cuda"], "CPU"),
        (["--link", "ib"], "drop --link"),
    )
    for bad, message in refused:
        assert main([*argv, *bad]) == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_threads_benchmark_dry_run(cell, tmp_path):
    """benchmarks/threads.py end to end on a tiny shape (T = 512, B = 2, threads 1 and 2, one
    round): a row per solver and thread count with its ratios, MGRIT's timed split, for
    either cell; the LSTM refuses the GRU checkpoints."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "rows.json"
    argv = [sys.executable, "benchmarks/threads.py", "--dry-run", "--cell", cell]
    predict = ["--predict"] if cell == "gru" else []  # the model beside each row (the GRU's)
    run = subprocess.run(
        [*argv, "--solvers", "serial", "mgrit", "--json", str(out), "--events", "3", *predict],
        capture_output=True, text=True, cwd=root, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert run.stdout.startswith(f"# {cell.upper()};")
    rows = json.loads(out.read_text())
    assert {(r["solver"], r["threads"]) for r in rows} == {
        (s, t) for s in ("serial", "mgrit") for t in (1, 2)
    }
    for r in rows:
        assert r["ms"] > 0 and r["W"] > 0 and r["vs_serial"] > 0
        assert (r["split_ms"] is not None) == (r["solver"] == "mgrit")
        assert (r["passes"] is not None) == (r["solver"] == "mgrit")
        assert (r["predicted_ms"] is not None and r["predicted_ms"] > 0) == (cell == "gru")
    for r in rows:  # whole-sequence passes: each direction at least its first sweep
        if r["solver"] == "mgrit":
            forward, backward = (float(x) for x in r["passes"].split(" (")[0].split(" / "))
            assert forward >= 0.9 and backward >= 0.9, r["passes"]
    lines = run.stdout.splitlines()  # two table rows and three events each at 1 and 2 threads
    assert sum(line.startswith("| random | 512 | 2 | none | mgrit |") for line in lines) == 8
    if cell == "lstm":
        bad = subprocess.run(
            [*argv, "--weights", "trained"], capture_output=True, text=True, cwd=root, timeout=120
        )
        assert bad.returncode == 2 and "random weights" in bad.stderr
        for flag in ("--sweeps", "--predict"):
            bad = subprocess.run(
                [*argv, flag], capture_output=True, text=True, cwd=root, timeout=120
            )
            assert bad.returncode == 2 and "not with --cell lstm" in bad.stderr
