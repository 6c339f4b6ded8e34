"""What a new user hit (issue 14): each test failed on the code before its fix."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import threading
import warnings

import numpy as np
import pytest
import torch
from conftest import APP_SMALL, flags, make_ref, tight

import mgrit_gru
from mgrit_gru.app.config import TrainConfig
from mgrit_gru.app.train import load_checkpoint, train
from mgrit_gru.cli import build_parser, main

SMALL = APP_SMALL


def _quiet(*args, **kwargs):
    pass


# -- wrong results ---------------------------------------------------------------------------


def _penalty_grads(module, x, lengths=None, head=None):
    """A gradient penalty: d/dparams of |d out / dx|^2 (+ out), with create_graph."""
    x = x.detach().clone().requires_grad_()
    kwargs = {} if lengths is None else {"lengths": lengths}
    if lengths is not None and type(module) is torch.nn.GRU:  # torch takes them packed
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        y, _ = module(packed)
        y = torch.nn.utils.rnn.pad_packed_sequence(y, total_length=x.shape[0])[0]
    else:
        y, _ = module(x, **kwargs)
    out = y.sum() if head is None else head(y).sum()
    (gx,) = torch.autograd.grad(out, x, create_graph=True)
    loss = (gx**2).sum() + 0.1 * y.square().sum()
    return torch.autograd.grad(loss, [x, *module.parameters()])


@pytest.mark.parametrize(
    "solver,layers,bidirectional,head,lengths",
    [
        ("serial", 1, False, False, False),
        ("mgrit", 2, True, False, False),
        ("mgrit", 1, False, True, False),
        ("serial", 1, True, False, True),
    ],
)
def test_double_backward_equals_torch(solver, layers, bidirectional, head, lengths):
    """Gradient penalties (create_graph=True) get torch.nn.GRU's second derivatives, with and
    without a trainable layer after the GRU (the case that was silently wrong)."""
    ref = make_ref(3, 5, layers=layers, bidirectional=bidirectional)
    opts = "serial" if solver == "serial" else tight(cfactor=4)
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    x = torch.randn(23, 3, 3)
    lens = torch.tensor([23, 9, 17]) if lengths else None
    lin = torch.nn.Linear(5 * (2 if bidirectional else 1), 1) if head else None
    expected = _penalty_grads(ref, x, lens, lin)
    got = _penalty_grads(ours, x, lens, lin)
    for a, b in zip(expected, got):
        assert (a - b).abs().max() < 1e-9


def test_double_backward_through_the_implicit_cell():
    """No torch reference has the implicit cell: second derivatives against finite
    differences of the first (gradgradcheck)."""
    gru = mgrit_gru.GRU(2, 3, cell="implicit", solver="serial")
    x = torch.randn(6, 2, 2, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: gru(x)[0], (x,))


def _inference_then_train(gru: mgrit_gru.GRU, T_infer: int, T_train: int) -> None:
    with torch.inference_mode():
        gru(torch.randn(T_infer, 4, 3))
    x = torch.randn(T_train, 4, 3, requires_grad=True)
    y, h = gru(x)
    (y.sum() + h.sum()).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("solver", ["serial", "mgrit"])
def test_inference_mode_does_not_poison_later_training(solver):
    """A first call under torch.inference_mode (a validation sanity check) or a longer one
    than before must leave no inference tensors in the work-buffer pool."""
    _inference_then_train(mgrit_gru.GRU(3, 8, solver=solver), 3000, 3000)
    gru = mgrit_gru.GRU(3, 8, solver=solver)
    _inference_then_train(gru, 100, 100)
    _inference_then_train(gru, 5000, 5000)  # longer under inference mode: the pool grows


def test_work_buffers_stay_per_thread():
    gru = mgrit_gru.GRU(3, 8)
    errors = []

    def other():
        try:
            _inference_then_train(gru, 2000, 2000)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert not errors
    _inference_then_train(gru, 3000, 3000)


def test_report_keeps_the_value_of_small_numbers(f32, tmp_path):
    cfg = TrainConfig(**{**SMALL, "epochs": 1, "tol": 1e-5})
    argv = [*flags({**SMALL, "epochs": 1}), "--tol", "1e-5", "--out", str(tmp_path / "r")]
    assert main(["train", *argv]) == 0
    report = (tmp_path / "r" / "report.md").read_text()
    assert f"| tol | {cfg.tol!r} |" in report and "| tol | 0.0000 |" not in report


def test_resume_refuses_fewer_epochs_and_writes_nothing(f32, tmp_path, capsys):
    run = tmp_path / "run"
    train(TrainConfig(**{**SMALL, "epochs": 2}), run, progress=False, log=_quiet)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main(["train", "--resume", str(run), "--epochs", "1"]) == 2
    assert "trained 2 epoch(s) already" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


# -- failures that must be one clear line ----------------------------------------------------


def _one_line_error(argv, capsys, code=2) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_npz_that_is_not_an_archive(f32, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((4, 5)))
    (tmp_path / "notes.txt").write_text("hello")
    for name in ("x.npy", "notes.txt"):
        argv = ["train", "--dataset", f"npz:{tmp_path / name}", "--out", str(tmp_path / "r")]
        assert "not an .npz archive" in _one_line_error(argv, capsys)


@pytest.mark.parametrize(
    "arrays,match",
    [
        (dict(x_train=np.zeros((0, 5))), "x_train is empty"),
        (dict(x_test=np.zeros((2, 0))), "x_test is empty"),
        (dict(y_test=np.array([0, 3])), r"y_test holds label\(s\) \[3\] that y_train never"),
    ],
)
def test_npz_empty_splits_and_unseen_labels(tmp_path, arrays, match):
    from mgrit_gru.app import datasets

    base = dict(
        x_train=np.random.rand(4, 5),
        y_train=np.array([0, 1, 0, 1]),
        x_test=np.random.rand(2, 5),
        y_test=np.array([0, 1]),
    )
    base.update(arrays)
    if base["x_train"].shape[0] == 0:
        base["y_train"] = np.zeros(0, int)
    np.savez(tmp_path / "d.npz", **base)
    with pytest.raises(datasets.DatasetError, match=match):
        datasets.load(f"npz:{tmp_path / 'd.npz'}")


def test_out_naming_an_existing_file(f32, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    err = _one_line_error(["train", *flags(SMALL), "--out", str(tmp_path / "f")], capsys)
    assert "a file of that name exists" in err


def test_checkpoint_of_random_bytes(f32, tmp_path, capsys):
    run = tmp_path / "run"
    train(TrainConfig(**{**SMALL, "epochs": 1}), run, progress=False, log=_quiet)
    (run / "checkpoint.pt").write_bytes(os.urandom(2000))
    err = _one_line_error(["train", "--resume", str(run), "--epochs", "2"], capsys)
    assert "corrupted checkpoint" in err and "weights_only" not in err


def test_divergence_raise_is_one_line(f32, tmp_path, capsys):
    argv = [*flags({**SMALL, "epochs": 1}), "--out", str(tmp_path / "r"), "--no-progress"]
    # a chaotic network: this learning rate blows the weights up within the first steps,
    # and over 100 chunks its forward solve then makes no progress
    argv += ["--solver", "mgrit", "--no-cost-guard", "--on-divergence", "raise"]
    argv += ["--lr", "50", "--clip", "0", "--length", "400", "--cfactor", "4"]
    assert main(["train", *argv]) == 2
    # (where rounding lets the chaotic run reach a cycle cap first, ConvergenceWarnings come
    # before it: warnings, not the error's lines)
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and errors[0] == lines[-1], lines
    assert "solve diverged" in errors[0] and not any("Traceback" in line for line in lines)


def test_int_input_names_the_conversion():
    gru = mgrit_gru.GRU(3, 4)
    # torch's ValueError and words, and the TypeError it was; the conversion named
    for error in (TypeError, ValueError):
        with pytest.raises(
            error, match=r"RNN input dtype \(torch.int64\) .*floating-point .*x.to\("
        ):
            gru(torch.ones(5, 2, 3, dtype=torch.int64))


def test_eval_on_another_dataset_names_the_mismatch(f32, tmp_path, capsys):
    run = tmp_path / "run"
    train(TrainConfig(**{**SMALL, "epochs": 1}), run, progress=False, log=_quiet)
    err = _one_line_error(["eval", str(run), "--dataset", "osuleaf"], capsys)
    assert "--length" not in err and "does not fit osuleaf" in err


def test_solver_can_be_assigned_as_text():
    gru = mgrit_gru.GRU(3, 4)
    gru.solver = "serial"
    assert gru.solver.is_serial
    gru(torch.randn(7, 2, 3))
    with pytest.raises(ValueError, match="unknown solver='fast'"):
        gru.solver = "fast"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_solve_in_float32(dtype):
    """float16/bfloat16 models compute in float32 (the tolerance is below their resolution)
    and return their own dtype; MGRIT converges as in float32."""
    ref = make_ref(3, 8, dtype=torch.float32)
    gru = mgrit_gru.GRU.from_torch(ref, solver=mgrit_gru.MGRIT(cfactor=32)).to(dtype)
    for seed in range(4):
        torch.manual_seed(seed)
        gru(torch.randn(300, 2, 3, dtype=dtype))
        stats = gru.last_stats
        assert stats.converged and stats.forward_iterations <= 2 and not stats.fell_back
    x = torch.randn(300, 2, 3, dtype=dtype, requires_grad=True)
    y, h = gru(x)
    assert y.dtype == dtype and h.dtype == dtype
    y.float().sum().backward()
    assert x.grad.dtype == dtype and gru.weight_hh_l0.grad.dtype == dtype
    with torch.no_grad():
        exact, _ = mgrit_gru.GRU.from_torch(ref, solver="serial")(x.detach().float())
    assert (y.float() - exact).abs().max() < 1e-2  # the output rounding of the half dtype


def test_ctrl_c_saves_the_position_and_resume_is_exact(f32, tmp_path, monkeypatch, capsys):
    """A Ctrl-C during an epoch stops after that step, saves the position inside the epoch
    and exits with one line (code 130); --resume then gives the uninterrupted run's metrics."""
    cfg = {**SMALL, "epochs": 2}
    straight = train(TrainConfig(**cfg), tmp_path / "a", progress=False, log=_quiet)
    steps = {"n": 0}
    real_step = torch.optim.Adam.step

    def step(self, *args, **kwargs):
        steps["n"] += 1
        if steps["n"] == 2:  # the user presses Ctrl-C during the second step
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", step)
    run = tmp_path / "b"
    assert main(["train", *flags(cfg), "--out", str(run), "--no-progress"]) == 130
    notice, err = capsys.readouterr().err.strip().splitlines()
    assert notice.startswith("Ctrl-C: stopping after this training step")
    assert "after 2 of 3 training steps" in err and f"--resume {run}" in err
    state = load_checkpoint(run)
    assert state["epoch"] == 0 and state["partial"]["batch"] == 2
    monkeypatch.setattr(torch.optim.Adam, "step", real_step)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    resumed = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    keys = ("train_loss", "train_acc", "test_loss", "test_acc", "fwd_iters_mean")
    assert [[r[k] for k in keys] for r in straight] == [[r[k] for k in keys] for r in resumed]


# -- torch.nn.GRU conventions ------------------------------------------------------------------


def test_torch_gru_conventions():
    ref = make_ref(3, 4, layers=2, bidirectional=True)
    gru = mgrit_gru.GRU.from_torch(ref)
    gru.flatten_parameters()
    assert [[p.shape for p in ws] for ws in gru.all_weights] == [
        [p.shape for p in ws] for ws in ref.all_weights
    ]
    assert gru._all_weights == ref._all_weights
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        mgrit_gru.GRU(3, 4, dropout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(RuntimeError, match=r"torch.jit.script.*gru.to_torch\(\)"):
            torch.jit.script(gru)
    back = gru.to_torch()
    x = torch.randn(6, 2, 3)
    assert torch.allclose(back(x)[0], ref(x)[0], atol=1e-14)


def test_run_files_are_readable_by_the_group(f32, tmp_path):
    old = os.umask(0o022)
    try:
        run = tmp_path / "run"
        train(TrainConfig(**{**SMALL, "epochs": 1}), run, progress=False, log=_quiet)
    finally:
        os.umask(old)
    for name in ("checkpoint.pt", "metrics.jsonl", "config.json"):
        assert (run / name).stat().st_mode & stat.S_IRGRP, name


def test_resume_accepts_other_threads_and_device_spelling(f32, tmp_path):
    run = tmp_path / "run"
    train(TrainConfig(**{**SMALL, "epochs": 1}), run, progress=False, log=_quiet)
    argv = ["train", "--resume", str(run), "--epochs", "2", "--threads", "2", "--no-progress"]
    assert main([*argv, "--device", "cpu:0", "--timeout", "30"]) == 0
    assert load_checkpoint(run)["epoch"] == 2


def test_every_flag_is_explained():
    parser = build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in subs.items():
        for action in sub._actions:
            if action.dest in ("help",) or not action.option_strings:
                continue
            text = (action.help or "").split("(default")[0].strip()
            assert len(text) >= 8, f"mgrit-gru {name} {action.option_strings[0]}: {action.help!r}"


def test_bench_columns_follow_what_was_measured(f32, capsys):
    argv = ["bench", "--T", "20", "--batch", "2", "--input", "3", "--hidden", "4"]
    argv += ["--repeats", "1", "--settings", "default", "--no-torch", "--no-memory"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    table = out.split("\n     T ")[1]
    assert " nan " not in table and "x torch" not in table and "peak MB" not in table
    assert "it f/b = MGRIT cycles" in out


def test_residual_plot_marks_the_tolerance(tmp_path):
    from mgrit_gru.app import report

    history = [
        {"epoch": 1, "fwd_residuals_last_batch": [1e-2, 1e-6], "bwd_residuals_last_batch": [1e-3]}
    ]
    fig = report.residual_figure(history, tol=1e-5, backward_tol=1e-3)
    ys = {line.get_ydata()[0] for line in fig.axes[0].get_lines()}
    assert 1e-5 in ys and 1e-3 in ys
    styles = {report.STYLES[s][:2] for s in ("mgrit", "serial", "torch")}
    assert len(styles) == 3  # coinciding curves stay visible


def test_ctrl_c_in_compare_says_how_to_continue_it_and_resume_is_exact(
    f32, tmp_path, monkeypatch, capsys
):
    """A Ctrl-C during a comparison names compare --resume (not one run's train --resume);
    continuing gives every solver the metrics of an uninterrupted comparison."""
    cfg = {**SMALL, "epochs": 2}
    argv = ["compare", *flags(cfg), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    steps = {"n": 0}
    real_step = torch.optim.Adam.step

    def step(self, *args, **kwargs):
        steps["n"] += 1
        if steps["n"] == 5:  # in the second solver's first epoch (3 steps an epoch)
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", step)
    out = tmp_path / "b"
    assert main([*argv, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"--resume --out {out}" in err and "train --resume" not in err
    monkeypatch.setattr(torch.optim.Adam, "step", real_step)
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    keys = ("train_loss", "train_acc", "test_loss", "test_acc")
    for solver in ("serial", "mgrit"):
        rows = [
            [[json.loads(x)[k] for k in keys] for x in (run / solver / "metrics.jsonl").open()]
            for run in (tmp_path / "a", out)
        ]
        assert rows[0] == rows[1] and len(rows[0]) == 2


# -- issue 15: compare's default folder, own data, Ctrl-C in the speed check, stats --------


def test_compare_without_out_names_its_folder(tmp_path, monkeypatch):
    """The README's `compare --dataset acsf1 --batch-size 10 --epochs 30` (no --out) failed
    at once: its folder name went through a config check that rejected solver "compare"."""
    from mgrit_gru import cli
    from mgrit_gru.app.train import default_run_dir

    name = default_run_dir(TrainConfig(dataset="acsf1"), "compare").name
    assert name.startswith("acsf1-compare-")
    seen = {}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "_compare_all", lambda args, o, base, out, s: seen.update(out=out))
    argv = ["compare", "--dataset", "acsf1", "--batch-size", "10", "--epochs", "30"]
    assert main(argv) == 0
    assert seen["out"].parent.name == "runs" and seen["out"].name.startswith("acsf1-compare-")


def _own_data(tmp_path, **changes) -> str:
    rng = np.random.default_rng(0)
    arrays = dict(
        x_train=rng.normal(size=(12, 6, 2)),
        y_train=np.array([0, 1, 2] * 4),
        x_test=rng.normal(size=(6, 6, 2)),
        y_test=np.array([0, 1, 2] * 2),
    )
    arrays.update(changes)
    np.savez(tmp_path / "own.npz", **{k: v for k, v in arrays.items() if v is not None})
    return f"npz:{tmp_path / 'own.npz'}"


def test_npz_sparse_labels_become_classes_0_to_k(f32, tmp_path):
    """Labels {0, 1e6, 2e6} made a 2,000,001-class head; now 3 classes, the labels kept in
    the data set's meta, its description and the checkpoint."""
    from mgrit_gru.app import datasets

    values = np.array([2_000_000, 0, 1_000_000])
    name = _own_data(tmp_path, y_train=np.tile(values, 4), y_test=np.tile(values, 2))
    data = datasets.load(name)
    assert data.num_classes == 3 and data.meta["label_values"] == [0, 1_000_000, 2_000_000]
    assert data.y_train[:3].tolist() == [2, 0, 1]
    assert "labels 0, 1000000, 2000000 as classes 0..2" in data.describe()
    cfg = TrainConfig(dataset=name, solver="serial", hidden=4, batch_size=6, epochs=1)
    train(cfg, tmp_path / "run", progress=False, log=_quiet)
    state = load_checkpoint(tmp_path / "run")
    assert state["model"]["head.weight"].shape[0] == 3
    assert state["label_values"] == [0, 1_000_000, 2_000_000]
    plain = datasets.load(_own_data(tmp_path))  # labels 0..K-1 stay as they are
    assert "label_values" not in plain.meta and plain.num_classes == 3


def test_npz_lengths_and_unknown_keys(tmp_path):
    """lengths_train/lengths_test give unequal lengths (NaN padding allowed past them); an
    unknown key is named in one warning with the known keys."""
    from mgrit_gru.app import datasets

    x = np.random.default_rng(1).normal(size=(12, 6, 2))
    n_train = np.array([6, 3, 1, 4] * 3)
    x[1, 3:] = np.nan  # padding
    name = _own_data(tmp_path, x_train=x, lengths_train=n_train, lengths_test=np.full(6, 6))
    data = datasets.load(name)
    assert data.len_train.tolist() == n_train.tolist() and data.len_test.tolist() == [6] * 6
    assert torch.isfinite(data.x_train).all() and (data.x_train[1, 3:] == 0).all()
    assert "unequal lengths" in data.describe()
    full = datasets.load(_own_data(tmp_path, lengths_train=np.full(12, 6), lengths_test=[6] * 6))
    assert full.len_train is None and full.len_test is None  # every length T: equal lengths
    with pytest.warns(UserWarning, match=r"unknown key\(s\) \['lens'\]; the known keys are .*"):
        datasets.load(_own_data(tmp_path, lens=np.ones(12, int)))
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "lengths_train" in help_text and "lengths_test" in help_text


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(lengths_train=np.full(12, 6)), r"lengths_train needs lengths_test too"),
        (dict(lengths_train=np.full(12, 7), lengths_test=np.full(6, 6)), r"must lie in 1\.\.6"),
        (dict(lengths_train=np.full(11, 6), lengths_test=np.full(6, 6)), r"shape \(12,\)"),
        (dict(x_train=np.full((12, 6, 2), np.nan)), r"NaN or Inf \(pad unequal lengths and"),
        (
            dict(x_train=np.full((12, 6, 2), np.nan), lengths_train=[1] * 12, lengths_test=[6] * 6),
            r"x_train contains NaN or Inf within the sequences' lengths",
        ),
    ],
)
def test_npz_lengths_refused_one_line(tmp_path, changes, match):
    from mgrit_gru.app import datasets

    with pytest.raises(datasets.DatasetError, match=match):
        datasets.load(_own_data(tmp_path, **changes))


def test_length_is_refused_for_npz(f32, tmp_path, capsys):
    argv = ["train", "--dataset", _own_data(tmp_path), "--length", "50", "--out", str(tmp_path)]
    err = _one_line_error(argv, capsys)
    assert "--length applies to the synthetic tasks only" in err and "npz:" in err


def test_ctrl_c_in_the_closing_speed_check(f32, tmp_path, monkeypatch, capsys):
    """Ctrl-C in train's closing speed check: no traceback; the report is written (its
    speed section says the check was skipped) and the message names the checkpoint."""
    from mgrit_gru.app import train as train_module

    def interrupted(cfg, run):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "measure_speed", interrupted)
    run = tmp_path / "run"
    argv = ["train", *flags({**SMALL, "epochs": 1}), "--out", str(run), "--no-progress"]
    assert main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "training itself finished" in err and str(run / "checkpoint.pt") in err
    assert "Speed check skipped (interrupted by Ctrl-C)" in (run / "report.md").read_text()
    assert load_checkpoint(run)["epoch"] == 1 and not (run / "speed.json").exists()


def test_residual_max_counts_only_what_mgrit_gave():
    """An MGRIT try that fell back to the serial solve adds no residual (its 1.3e+03 was
    reported as the epoch's); it is counted apart. The progress bar says the same."""
    from mgrit_gru.app import report
    from mgrit_gru.app.train import EpochStats, mgrit_figures
    from mgrit_gru.stats import RunStats, SolveStats

    fwd = SolveStats("forward", 0, False, 40, 3, 2, (1e-2, 3e-7), True, False)
    bwd = SolveStats("backward", 0, False, 40, 1, 5, (1e-1, 1.3e3), True, True, stopped="cap")
    epoch = EpochStats()
    epoch.add(RunStats([fwd], [bwd]))
    skipped = SolveStats("backward", 0, False, 40, 1, 0, (), True, True, skipped=True)
    epoch.add(RunStats([fwd], [skipped]))
    row = epoch.as_dict()
    assert row["fwd_residual_max"] == 3e-7 and row["bwd_residual_max"] == 0.0
    assert (row["fwd_fell_back"], row["bwd_fell_back"], row["fallbacks"]) == (0, 1, 1)
    assert report._residual_cell(row, "fwd") == "3.0e-07"
    assert report._residual_cell(row, "bwd") == "- (fell back 1)"
    assert mgrit_figures([fwd]) == "2it 3e-07"
    assert mgrit_figures([bwd]) == "fell back" and mgrit_figures([skipped]) == "serial"


@pytest.mark.parametrize("reentrant", [False, True])
def test_last_stats_under_activation_checkpointing(reentrant):
    """torch.utils.checkpoint recomputes the forward in the backward: the adjoint solves
    still land in last_stats (non-reentrant lost them to the recomputation's record)."""
    from torch.utils.checkpoint import checkpoint

    gru = mgrit_gru.GRU(3, 6, num_layers=2, bidirectional=True, solver=tight(cfactor=4))
    x = torch.randn(24, 2, 3, requires_grad=True)
    y, h = checkpoint(gru, x, use_reentrant=reentrant)
    stats = gru.last_stats
    assert len(stats.forward) == 4 and not stats.backward
    (y.sum() + h.sum()).backward()
    assert gru.last_stats is stats
    assert len(stats.forward) == 4 and len(stats.backward) == 4
    assert all(s.by_mgrit for s in stats.backward)


def test_a_failed_rank_is_one_line_and_exit_code_3(monkeypatch, capsys, tmp_path):
    """A time-parallel rank that dies or hangs: its partner's error (a chain of a gloo error
    and the roll call's verdict) reaches the user as one line, with its own exit code."""
    from mgrit_gru.app import train as train_module
    from mgrit_gru.distributed import TimeParallelError

    def dead(*args, **kwargs):
        try:
            raise RuntimeError("Connection closed by peer\n[gloo/transport/tcp]")
        except RuntimeError as exc:
            raise TimeParallelError(
                "time-parallel rank 0: the residual reduction failed; rank(s) [1] did not "
                f"answer a roll call within 5 s: they died or are hanging ({exc})"
            ) from exc

    monkeypatch.setattr(train_module, "train", dead)
    argv = ["train", *flags({**SMALL, "epochs": 1}), "--out", str(tmp_path / "r")]
    err = _one_line_error(argv, capsys, code=3)
    assert "rank(s) [1] did not answer" in err and "Traceback" not in err


def test_speed_line_says_why_auto_solved_serially(f32):
    """The closing speed line explains a low MGRIT share in words: the cycles these weights
    need and what a cycle costs against a serial sweep."""
    from mgrit_gru.app.speed import _why_serial, speed_line
    from mgrit_gru.app.train import Classifier

    cfg = TrainConfig(**{**SMALL, "solver": "auto"})
    torch.manual_seed(0)
    model = Classifier(cfg, 2, 10)
    with torch.no_grad():
        model.rnn.bias_hh_l0[cfg.hidden : 2 * cfg.hidden] += 3.0  # long memory: cycles
    x, y = torch.randn(8, 300, 2), torch.randint(0, 10, (8,))
    why = _why_serial(model, (x, None, y))
    assert re.search(r"need \d+ forward / \d+ adjoint cycles here", why), why
    assert re.search(r"one cycle at batch 8 costs about [\d.]+ serial sweeps", why), why
    result = {
        "solver": "auto",
        "batches": 1,
        "threads": 1,
        "step_ms": {"auto": 2.0, "serial": 2.0},
        "mgrit_share": 0.0,
        "why": why,
    }
    line = speed_line(result)
    assert "MGRIT gave 0% of the solves (the rest were solved serially: these weights" in line


# In a fresh process: the report phase's Ctrl-C is a real SIGINT (imports included).
_CTRL_C_IN_REPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background
# job of a shell starts with SIGINT ignored)
from mgrit_gru.app import report
real = report.write_run_report
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered while the report is made
    return real(*args, **kwargs)
report.write_run_report = interrupted
from mgrit_gru.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_while_the_report_is_written_in_a_real_process(tmp_path):
    """A real SIGINT while train writes its report: one line, exit 130, what to run next;
    `--resume` then writes the report; never a traceback or exit 0."""
    import subprocess
    import sys

    run = tmp_path / "run"
    argv = ["train", *flags({**SMALL, "epochs": 1}), "--out", str(run), "--no-progress"]
    argv += ["--no-speed-check"]
    env = {**os.environ, "MGRIT_GRU_CALIBRATION": "builtin"}
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_IN_REPORT, *argv],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    err = done.stderr.strip()
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert f"mgrit-gru train --resume {run}" in err and "writes the report" in err
    assert not (run / "report.md").exists() and load_checkpoint(run)["epoch"] == 1
    assert main(["train", "--resume", str(run), "--no-speed-check", "--no-progress"]) == 0
    assert (run / "report.md").exists()


def test_torchrun_without_time_parallel_is_refused(tmp_path, monkeypatch, capsys):
    """Under torchrun (WORLD_SIZE > 1) without --time-parallel every process would train the
    same run into one folder: refused in one line that names the fix; nothing is written."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    run = tmp_path / "run"
    argv = ["train", *flags({**SMALL, "epochs": 1}), "--out", str(run), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "add --time-parallel 2" in err
    assert not run.exists()


def test_resume_keeps_no_speed_check(f32, tmp_path, capsys):
    """A run started with --no-speed-check resumes without the check, flag or not."""
    run = tmp_path / "run"
    argv = ["train", *flags({**SMALL, "epochs": 1}), "--out", str(run), "--no-progress"]
    assert main([*argv, "--no-speed-check"]) == 0
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "speed:" not in out and not (run / "speed.json").exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
