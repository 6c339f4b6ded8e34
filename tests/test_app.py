"""The training application on small data: datasets, npz validation, train/resume/eval, CLI."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import APP_SMALL, flags

from mgrit_gru.app import datasets
from mgrit_gru.app.config import TrainConfig
from mgrit_gru.app.train import RunError, evaluate_run, load_checkpoint, train
from mgrit_gru.cli import main

SMALL = {**APP_SMALL, "dropout": 0.0}


@pytest.fixture(autouse=True)
def _float32():
    torch.set_default_dtype(torch.float32)  # the app trains in float32


@pytest.mark.parametrize(
    "name,shape,classes,unequal",
    [
        ("smnist", (4000, 784, 1), 10, False),
        ("psmnist", (4000, 784, 1), 10, False),
        ("acsf1", (100, 1460, 1), 10, False),
        ("osuleaf", (200, 427, 1), 6, False),
        ("plaid", (537, 1344, 1), 11, True),
        ("adding", (2000, 1000, 2), 10, False),
        ("recall", (2000, 1000, 9), 8, False),
    ],
)
def test_builtin_datasets(name, shape, classes, unequal):
    try:
        data = datasets.load(name)
    except datasets.DatasetError as exc:
        if "pip install" in str(exc):
            pytest.skip(str(exc))
        raise
    assert tuple(data.x_train.shape) == shape and data.x_train.dtype == torch.float32
    assert data.y_train.dtype == torch.long and len(data.y_train) == shape[0]
    assert data.x_test.shape[1:] == data.x_train.shape[1:]
    for y in (data.y_train, data.y_test):
        assert 0 <= int(y.min()) and int(y.max()) < classes
    assert data.num_classes == classes
    assert (data.len_train is not None) == unequal
    assert torch.isfinite(data.x_train).all()
    if not unequal:  # standardised on the training split
        assert abs(float(data.x_train.mean())) < 1e-3
        assert abs(float(data.x_train.std()) - 1) < 1e-2
    else:
        assert int(data.len_train.min()) >= 1 and int(data.len_train.max()) == shape[1]
        n = int(data.len_train[0])
        assert torch.all(data.x_train[0, n:] == 0)


def test_fixed_splits_and_permutation():
    a, b = datasets.load("smnist"), datasets.load("psmnist")
    assert torch.equal(a.y_train, b.y_train)
    assert not torch.equal(a.x_train, b.x_train)
    assert torch.allclose(a.x_train.sum(1), b.x_train.sum(1), atol=1e-2)  # same pixels, moved
    assert torch.equal(datasets.load("psmnist").x_train, b.x_train)


def test_synthetic_tasks_any_length_and_seeded():
    a = datasets.load("recall", length=50, seed=3)
    assert a.seq_len == 50 and torch.equal(
        a.x_train, datasets.load("recall", length=50, seed=3).x_train
    )
    assert not torch.equal(a.x_train, datasets.load("recall", length=50, seed=4).x_train)


def _npz(tmp_path, **arrays):
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return f"npz:{path}"


def test_npz_dataset(tmp_path):
    rng = np.random.default_rng(0)
    name = _npz(
        tmp_path,
        x_train=rng.normal(size=(20, 30)),
        y_train=rng.integers(0, 3, 20),
        x_test=rng.normal(size=(10, 30)),
        y_test=rng.integers(0, 3, 10),
    )
    data = datasets.load(name)
    assert tuple(data.x_train.shape) == (20, 30, 1) and data.num_classes >= 2


@pytest.mark.parametrize(
    "arrays,match",
    [
        (
            dict(x_train=np.zeros((4, 5)), y_train=np.zeros(4, int), x_test=np.zeros((2, 5))),
            r"missing key\(s\) \['y_test'\]",
        ),
        (
            dict(
                x_train=np.array([np.zeros(3), np.zeros(4)], dtype=object),
                y_train=np.zeros(2, int),
                x_test=np.zeros((2, 3)),
                y_test=np.zeros(2, int),
            ),
            r"x_train is ragged or not numeric",
        ),
        (
            dict(
                x_train=np.full((4, 5), np.nan),
                y_train=np.zeros(4, int),
                x_test=np.zeros((2, 5)),
                y_test=np.zeros(2, int),
            ),
            r"x_train contains NaN",
        ),
        (
            dict(
                x_train=np.zeros((4, 5)),
                y_train=np.array([0, 1, -1, 0]),
                x_test=np.zeros((2, 5)),
                y_test=np.zeros(2, int),
            ),
            r"labels must be >= 0",
        ),
        (
            dict(
                x_train=np.zeros((4, 5)),
                y_train=np.zeros(3, int),
                x_test=np.zeros((2, 5)),
                y_test=np.zeros(2, int),
            ),
            r"x_train has 4 sequences but y_train 3 labels",
        ),
        (
            dict(
                x_train=np.zeros((4, 5)),
                y_train=np.zeros(4) + 0.5,
                x_test=np.zeros((2, 5)),
                y_test=np.zeros(2, int),
            ),
            r"y_train must be a 1-D integer array",
        ),
    ],
)
def test_npz_validation(tmp_path, arrays, match):
    name = _npz(tmp_path, **arrays) if "ragged" not in match else None
    if name is None:
        path = tmp_path / "data.npz"
        np.savez(path, allow_pickle=True, **arrays)
        name = f"npz:{path}"
    with pytest.raises(datasets.DatasetError, match=match):
        datasets.load(name)


def test_npz_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(datasets.DatasetError, match="no such file"):
        datasets.load(f"npz:{tmp_path / 'nope.npz'}")
    with pytest.raises(datasets.DatasetError, match="unknown dataset 'mnist'; choose one of"):
        datasets.load("mnist")


def test_missing_package_names_the_install():
    with pytest.raises(datasets.DatasetError, match="pip install --no-deps no_such_pkg"):
        datasets.package_file("no_such_pkg", "x.csv")


def test_train_writes_metrics_checkpoint_report(tmp_path):
    cfg = TrainConfig(**SMALL)
    run = tmp_path / "run"
    assert main(["train", *flags(SMALL), "--out", str(run), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    for key in ("train_loss", "test_acc", "train_time_s", "fwd_iters_mean", "bwd_residual_max"):
        assert key in rows[0]
    assert json.loads((run / "config.json").read_text()) == cfg.to_dict()
    state = load_checkpoint(run)
    assert state["epoch"] == 2 and state["config"] == cfg.to_dict()
    report = (run / "report.md").read_text()
    for png in ("loss.png", "accuracy.png", "residuals.png"):
        assert (run / png).stat().st_size > 1000 and f"({png})" in report
    assert not list(run.glob("*.tmp"))


def test_resume_equals_uninterrupted(tmp_path):
    # a constant rate: the run is stopped by asking for 1 epoch and extended to 3 (with the
    # cosine schedule an extension stretches the schedule; an interrupted run keeps it)
    cfg = TrainConfig(**{**SMALL, "epochs": 3, "layers": 2, "schedule": "constant"})
    straight = train(cfg, tmp_path / "a", progress=False, log=lambda *a: None)
    train(cfg.replace(epochs=1), tmp_path / "b", progress=False, log=lambda *a: None)
    # continue: only --epochs may change
    assert main(["train", "--resume", str(tmp_path / "b"), "--epochs", "3", "--no-progress"]) == 0
    resumed = [
        json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().split("\n") if x
    ]
    keys = ("train_loss", "train_acc", "test_loss", "test_acc")
    assert [[r[k] for k in keys] for r in straight] == [[r[k] for k in keys] for r in resumed]


def test_resume_refuses_corrupted_or_mismatched(tmp_path, capsys):
    run = tmp_path / "run"
    train(TrainConfig(**{**SMALL, "epochs": 1}), run, progress=False, log=lambda *a: None)
    assert main(["train", "--resume", str(run), "--hidden", "16"]) == 2
    assert (
        "options differ from the run's config: --hidden 16 (run has 8)" in capsys.readouterr().err
    )
    ckpt = run / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:200])
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 2
    assert "corrupted checkpoint" in capsys.readouterr().err
    with pytest.raises(RunError, match="already holds a run"):
        train(TrainConfig(**SMALL), run, progress=False)
    with pytest.raises(RunError, match="no checkpoint"):
        train(TrainConfig(**SMALL), tmp_path / "empty", resume=True, progress=False)


def test_eval_and_compare(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *flags(SMALL), "--out", str(out), "--with-torch", "--no-progress"]) == 0
    report = (out / "report.md").read_text()
    for solver in ("serial", "mgrit", "torch"):
        assert f"| {solver} |" in report and (out / solver / "checkpoint.pt").exists()
    assert "percentage points" in report and (out / "compare_test_accuracy.png").exists()
    summary = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| ")}
    for exact in ("| serial", "| torch"):  # no MGRIT cycles: "-", not 0.00
        assert summary[exact].split(" | ")[6:8] == ["-", "-"], summary[exact]
    # same init and data order: serial and MGRIT agree closely after 2 epochs
    rows = {
        s: json.loads((out / s / "metrics.jsonl").read_text().splitlines()[-1])
        for s in ("serial", "mgrit", "torch")
    }
    assert abs(rows["serial"]["train_loss"] - rows["mgrit"]["train_loss"]) < 1e-3
    assert abs(rows["serial"]["train_loss"] - rows["torch"]["train_loss"]) < 1e-3
    # the runs' epochs were interleaved (paused and continued): each equals a plain run
    alone = tmp_path / "alone"
    assert main(["train", *flags({**SMALL, "solver": "serial"}), "--out", str(alone),
                 "--no-progress", "--no-speed-check"]) == 0  # fmt: skip
    plain = [json.loads(line) for line in (alone / "metrics.jsonl").read_text().splitlines()]
    inter = [
        json.loads(line) for line in (out / "serial" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [(r["train_loss"], r["test_acc"]) for r in plain] == [
        (r["train_loss"], r["test_acc"]) for r in inter
    ]
    assert "epochs interleaved" in capsys.readouterr().out
    assert main(["eval", str(out / "mgrit")]) == 0
    assert "test: loss" in capsys.readouterr().out
    result = evaluate_run(out / "serial", log=lambda *a: None)
    assert result["test_acc"] == pytest.approx(rows["serial"]["test_acc"])


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--dataset", "nope"], "unknown dataset 'nope'"),
        (["train", "--dataset", "npz:/no/such.npz"], "no such file"),
        (["train", *flags({**SMALL, "batch_size": 1000})], "--batch-size 1000 is larger than"),
        (["train", "--hidden", "0"], "--hidden must be a positive integer"),
        (["train", "--cfactor", "1"], "invalid cfactor=1"),
        (["eval", "/no/such/run"], "is not a run folder"),
    ],
)
def test_cli_errors_exit_2_with_one_line(argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "r")] if argv[0] == "train" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--hiden", "3"], "unrecognized arguments: --hiden 3"),
        (["train", "--solver", "fast"], "invalid choice: 'fast'"),
        (["train", "--epochs", "two"], "invalid int value: 'two'"),
        (["train", "--cfactor", "fast"], "invalid int_or_auto value: 'fast'"),
        (["nope"], "invalid choice: 'nope'"),
    ],
)
def test_bad_command_line_exits_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_train_with_cfactor_auto(tmp_path):
    """`--cfactor auto` reaches the solver, which picks the chunk length per call."""
    import argparse

    from mgrit_gru.app.config import add_config_arguments, given_overrides

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args([*flags({**SMALL, "epochs": 1}), "--cfactor", "auto"])
    cfg = TrainConfig(**given_overrides(args))
    assert cfg.cfactor == "auto" and cfg.mgrit_options().cfactor == "auto"
    rows = train(cfg, tmp_path / "run", progress=False, log=lambda *a: None)
    assert rows[0]["fwd_iters_mean"] >= 0


def test_train_on_unequal_lengths(tmp_path):
    """PLAID: variable-length sequences go through the module as lengths=, both directions."""
    cfg = TrainConfig(
        dataset="plaid",
        max_train=24,
        max_test=12,
        hidden=6,
        batch_size=12,
        epochs=1,
        cfactor=8,
        threads=1,
        bidirectional=True,
    )
    try:
        rows = train(cfg, tmp_path / "run", progress=False, log=lambda *a: None)
    except datasets.DatasetError as exc:
        pytest.skip(str(exc))
    assert rows[0]["fwd_iters_mean"] >= 0 and 0 <= rows[0]["test_acc"] <= 1


def test_resume_a_run_from_before_a_config_field_existed(tmp_path):
    """Runs written before `keep_gates` and `early_exit` existed resume with their defaults."""
    run = tmp_path / "old"
    train(TrainConfig(**{**SMALL, "epochs": 1}), run, progress=False, log=lambda *a: None)
    old = TrainConfig(**{**SMALL, "epochs": 1}).to_dict()
    del old["keep_gates"], old["early_exit"]
    (run / "config.json").write_text(json.dumps(old))
    state = load_checkpoint(run)
    state["config"] = old
    torch.save(state, run / "checkpoint.pt")
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    assert load_checkpoint(run)["epoch"] == 2
    resumed = TrainConfig.from_dict(json.loads((run / "config.json").read_text()))
    assert resumed.mgrit_options().early_exit and resumed.mgrit_options().keep_gates


def test_compare_over_seeds_summarises_the_gap(tmp_path, capsys):
    out = tmp_path / "seeds"
    small = {k: v for k, v in SMALL.items() if k != "seed"}
    argv = ["compare", *flags({**small, "epochs": 1}), "--out", str(out), "--no-progress"]
    assert main([*argv, "--seeds", "3", "4"]) == 0
    report = (out / "report.md").read_text()
    finals = {}
    for seed in (3, 4):
        for solver in ("serial", "mgrit"):
            row = json.loads((out / f"seed-{seed}" / solver / "metrics.jsonl").read_text())
            assert (
                json.loads((out / f"seed-{seed}" / solver / "config.json").read_text())["seed"]
                == seed
            )
            finals[seed, solver] = 100 * row["test_acc"]
        gap = finals[seed, "mgrit"] - finals[seed, "serial"]
        assert (
            f"| {seed} | {finals[seed, 'serial']:.1f} | {finals[seed, 'mgrit']:.1f} | {gap:+.1f} |"
            in report
        )
    assert "mgrit minus serial:" in report and "standard error" in report
    # an interrupted comparison continues: seed 4's serial run lost, seed 5 never started
    shutil.rmtree(out / "seed-4" / "serial")
    kept = (out / "seed-3" / "mgrit" / "metrics.jsonl").read_text()
    assert main([*argv, "--seeds", "3", "4", "5", "--resume"]) == 0
    assert (out / "seed-3" / "mgrit" / "metrics.jsonl").read_text() == kept  # not retrained
    again = json.loads((out / "seed-4" / "serial" / "metrics.jsonl").read_text())
    assert 100 * again["test_acc"] == finals[4, "serial"]  # the same run, retrained
    assert "| 5 |" in (out / "report.md").read_text()
    assert main([*argv, "--seeds", "3", "--resume", "--lr", "0.5"]) == 2  # other options
    assert "another config" in capsys.readouterr().err
    assert main(["compare", *flags({**small, "epochs": 1}), "--seeds", "3", "--resume"]) == 2
    assert "name that folder" in capsys.readouterr().err
    assert main([*argv, "--seeds", "3", "3"]) == 2
    assert "repeated seed" in capsys.readouterr().err
    assert main([*argv, "--seeds", "5", "--seed", "1"]) == 2
    assert "either --seed or --seeds" in capsys.readouterr().err


def test_cosine_schedule_is_a_function_of_the_step():
    from mgrit_gru.app.train import learning_rate

    cfg = TrainConfig(**{**SMALL, "epochs": 4, "lr": 0.01, "warmup": 0.0})
    rates = [learning_rate(cfg, step, 3) for step in range(13)]
    assert rates[0] == 0.01 and rates[12] == 0.0 and rates[6] == pytest.approx(0.005)
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    flat = cfg.replace(schedule="constant")
    assert {learning_rate(flat, s, 3) for s in range(13)} == {0.01}
    # runs from before the schedule existed kept a constant rate, and resume that way
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("schedule", "coarse", "warmup")}
    assert TrainConfig.from_dict(old).schedule == "constant"
    assert TrainConfig.from_dict(old).coarse == "implicit"
    assert TrainConfig.from_dict(old).warmup == 0.0  # and without a warm-up


def test_update_bias_lengthens_the_initial_memory():
    from mgrit_gru.app.train import Classifier

    cfg = TrainConfig(**{**SMALL, "layers": 2, "bidirectional": True})
    torch.manual_seed(0)
    plain = Classifier(cfg.replace(update_bias=0.0), 1, 3)
    torch.manual_seed(0)
    biased = Classifier(cfg.replace(update_bias=2.0), 1, 3)
    H = cfg.hidden
    for (name, a), (_, b) in zip(plain.named_parameters(), biased.named_parameters()):
        shift = torch.zeros_like(a)
        if name.startswith("rnn.bias_hh"):  # every layer and direction, the z block only
            shift[H : 2 * H] = 2.0
        torch.testing.assert_close(b - a, shift)
    old = {k: v for k, v in cfg.to_dict().items() if k != "update_bias"}
    assert TrainConfig.from_dict(old).update_bias == 0.0  # runs from before it: torch's init
    with pytest.raises(ValueError, match="--update-bias must be a finite number"):
        cfg.replace(update_bias=float("nan"))


def test_warmup_ramps_the_schedule_linearly():
    from mgrit_gru.app.train import learning_rate

    cfg = TrainConfig(**{**SMALL, "epochs": 4, "lr": 0.01, "warmup": 1.0})
    cold = cfg.replace(warmup=0.0)
    ramp = [learning_rate(cfg, s, 4) / learning_rate(cold, s, 4) for s in range(4)]
    assert ramp == pytest.approx([0.25, 0.5, 0.75, 1.0])  # the first epoch's 4 steps
    assert [learning_rate(cfg, s, 4) for s in range(4, 16)] == [
        learning_rate(cold, s, 4) for s in range(4, 16)
    ]
    assert learning_rate(cfg.replace(schedule="constant"), 1, 4) == pytest.approx(0.005)
    with pytest.raises(ValueError, match="--warmup must be a finite number >= 0"):
        cfg.replace(warmup=-1.0)


@pytest.mark.parametrize("pool", ["last", "mean", "max"])
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("solver", ["serial", "mgrit"])
def test_pooling_equals_a_torch_gru_classifier(pool, varlen, solver):
    """--pool: the head reads the last state or the mean/max of the outputs over each
    sequence's own steps; every step's output then carries the loss gradient. Logits and
    every gradient equal the same classifier on torch.nn.GRU (float64)."""
    from conftest import tight

    from mgrit_gru.app.train import Classifier

    torch.set_default_dtype(torch.float64)
    cfg = TrainConfig(hidden=5, layers=2, bidirectional=True, pool=pool, solver="torch")
    torch.manual_seed(0)
    ref = Classifier(cfg, 3, 4)
    ours = Classifier(cfg.replace(solver=solver), 3, 4)
    ours.load_state_dict(ref.state_dict())
    if solver == "mgrit":
        ours.rnn.solver = tight(cfactor=4)
    x, y = torch.randn(6, 50, 3), torch.tensor([0, 1, 2, 3, 1, 2])
    lengths = torch.tensor([50, 13, 27, 50, 1, 40]) if varlen else None
    grads = []
    for model in (ref, ours):
        xi = x.clone().requires_grad_()
        logits = model(xi, lengths)
        loss = torch.nn.functional.cross_entropy(logits, y)
        grads.append([logits, *torch.autograd.grad(loss, [xi, *model.parameters()])])
    for a, b in zip(*grads):
        assert (a - b).abs().max() < (1e-12 if solver == "serial" else 1e-8)


def test_lstm_trains_resumes_evaluates_and_compares(tmp_path, capsys):
    """--model lstm through the whole application: a run with the closing speed check (whose
    reference row is torch.nn.LSTM), an exact resume, eval, and a comparison with torch's
    module; the LSTM's forget-gate bias gets --update-bias."""
    small = {**SMALL, "model": "lstm", "layers": 2, "schedule": "constant", "pool": "last"}
    run = tmp_path / "run"
    argv = ["train", *flags({**small, "epochs": 1}), "--out", str(run), "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "torch.nn.LSTM" in out and "torch.nn.GRU" not in out
    state = load_checkpoint(run)
    assert (
        "rnn.weight_hh_l1" in state["model"] and state["model"]["rnn.weight_hh_l0"].shape[0] == 32
    )
    bias = state["config"]["update_bias"]
    straight = train(
        TrainConfig(**{**small, "epochs": 2}), tmp_path / "a", progress=False, log=lambda *a: None
    )
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    resumed = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["test_acc"] for r in straight] == [r["test_acc"] for r in resumed]
    capsys.readouterr()
    # the projection knows the GRU only: an LSTM run is refused in one line
    assert main(["project", "--T", "64", "--ranks", "1", "--checkpoint", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "is a --model lstm run" in err.strip().splitlines()[-1]
    assert main(["eval", str(run)]) == 0
    compare = tmp_path / "cmp"
    argv = ["compare", *flags({**small, "epochs": 1}), "--with-torch", "--out", str(compare)]
    assert main([*argv, "--no-progress"]) == 0
    report = (compare / "report.md").read_text()
    assert "Same model (LSTM)" in report and "| torch |" in report
    # the initial forget-gate bias (rows H..2H of bias_hh) carries --update-bias
    torch.manual_seed(0)
    from mgrit_gru.app.train import Classifier

    model = Classifier(TrainConfig(**small), 2, 10)
    f = model.rnn.bias_hh_l0[8:16]
    assert bias == 2.0 and f.min() > 2.0 - 1 / 8**0.5 - 1e-6


@pytest.mark.parametrize("pool", ["last", "mean"])
def test_projected_lstm_classifier_equals_torchs_and_trains(pool, tmp_path):
    """--model lstm --proj-size: the classifier's LSTM has torch's projection (weight_hr,
    outputs and h_n of proj_size values, the head on them); logits and every gradient equal
    the same classifier on torch.nn.LSTM(proj_size=...) in float64 (padded, both directions,
    two layers); a run trains, saves weight_hr and evaluates."""
    from conftest import tight

    from mgrit_gru.app.train import Classifier

    torch.set_default_dtype(torch.float64)
    cfg = TrainConfig(
        model="lstm", hidden=6, proj_size=3, layers=2, bidirectional=True, pool=pool,
        solver="torch",
    )  # fmt: skip
    torch.manual_seed(0)
    ref = Classifier(cfg, 3, 4)
    assert isinstance(ref.rnn, torch.nn.LSTM) and ref.rnn.proj_size == 3
    ours = Classifier(cfg.replace(solver="mgrit"), 3, 4)
    ours.load_state_dict(ref.state_dict())
    ours.rnn.solver = tight(cfactor=4)
    x, y = torch.randn(5, 40, 3), torch.tensor([0, 1, 2, 3, 1])
    lengths = torch.tensor([40, 13, 27, 1, 33])
    grads = []
    for model in (ref, ours):
        logits = model(x, lengths)
        loss = torch.nn.functional.cross_entropy(logits, y)
        grads.append([logits, *torch.autograd.grad(loss, list(model.parameters()))])
    for a, b in zip(*grads):
        assert (a - b).abs().max() < 1e-10
    torch.set_default_dtype(torch.float32)
    run = tmp_path / "run"
    small = {**SMALL, "model": "lstm", "proj_size": 4, "epochs": 1, "schedule": "constant"}
    assert main(["train", *flags(small), "--out", str(run), "--no-progress"]) == 0
    state = load_checkpoint(run)["model"]
    assert state["rnn.weight_hr_l0"].shape == (4, SMALL["hidden"])
    assert state["head.weight"].shape[1] == 4 * (2 if SMALL.get("bidirectional") else 1)
    assert main(["eval", str(run)]) == 0


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--proj-size", "4"], "--proj-size is for --model lstm only"),
        (["--model", "lstm", "--proj-size", "99"], "--proj-size must lie in [0, --hidden)"),
        (["--model", "lstm", "--proj-size", "-1"], "--proj-size must lie in [0, --hidden)"),
    ],
)
def test_bad_proj_size_is_refused(extra, message, capsys, tmp_path):
    argv = ["train", *flags({**SMALL, "model": "gru"}), *extra, "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--cell", "implicit"], "--model lstm: --cell implicit is for the GRU only"),
        (["--coarse", "implicit"], "--coarse implicit is for the GRU only"),
        (
            ["--budget-forward", "2", "--budget-backward", "1", "--budget-gradient", "unrolled"],
            "--budget-gradient unrolled is for the GRU only",
        ),
        (
            ["--recipe", "torchbraid"],
            "--cell implicit and --coarse implicit (set by --recipe torchbraid) are for the GRU",
        ),
    ],
)
def test_lstm_refuses_gru_only_options(extra, message, capsys, tmp_path):
    argv = ["train", *flags(SMALL), "--model", "lstm", *extra, "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_budget_without_solver_mgrit_is_refused():
    """Budget flags under the default solver (auto) were once dropped without a word."""
    with pytest.raises(ValueError, match="needs --solver mgrit"):
        TrainConfig(budget_forward=2, budget_backward=1)
    assert TrainConfig(budget_forward=2, budget_backward=1, solver="mgrit").budget is not None


def test_a_time_parallel_run_is_named_for_the_solver_it_runs():
    """--solver auto across time-parallel ranks is MGRIT (the choice is off there): the run's
    folder and report say mgrit, not auto."""
    from mgrit_gru.app.train import default_run_dir

    cfg = TrainConfig(time_parallel=2)
    assert cfg.solver == "auto" and cfg.solver_run == "mgrit"
    assert "-mgrit-" in default_run_dir(cfg).name
    assert TrainConfig().solver_run == "auto" and "-auto-" in default_run_dir(TrainConfig()).name


def test_the_residual_plot_keys_every_epoch():
    """Every epoch's residual line is keyed (a colour bar of epochs; the legend says which
    line style is which pass), not only the first and the last."""
    from mgrit_gru.app import report

    history = [
        {"epoch": e, "fwd_residuals_last_batch": [1e-2, 1e-6], "bwd_residuals_last_batch": [1e-3]}
        for e in range(1, 8)
    ]
    fig = report.residual_figure(history, 1e-5)
    ax, bar = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["forward", "adjoint"] and not any("epoch" in t for t in labels)
    assert bar.get_ylabel() == "epoch" and bar.get_ylim() == (1.0, 7.0)
