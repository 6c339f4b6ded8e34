"""MGRIT on trained networks: checkpoints of real training runs, cycles per coarse correction,
and the training step against the serial solver and torch.nn.GRU (torch.nn.LSTM for the
LSTM checkpoints: ``--datasets smnist-lstm acsf1-lstm``).

    python benchmarks/trained_models.py [--datasets smnist acsf1] [--threads 1] [--batches 3]
        [--cfactors 32 64] [--coarse implicit frozen secant] [--relax FCF FCFCF]
        [--cache runs/trained-models] [--json PATH] [--quick]

1. Checkpoints (made once, cached in --cache, an ignored folder; delete it to regenerate).
   Each data set is trained with the serial solver (exact, deterministic on the CPU) by the
   training application, and its checkpoint is kept at the listed epochs (0 = the initial
   weights). The recipes (``RECIPES`` below, written to ``recipe.json`` beside them): smnist
   with hidden 64, batch 32, Adam at a constant 5e-3, clip 1, the last state, 10 epochs;
   ACSF1 the same with batch 10 for 30 epochs. The LSTMs (``LSTM_RECIPES``): mean pooling,
   forget-gate bias +2, Adam at a constant 2e-3 (ACSF1: 5e-3 for 60 epochs, batch 10),
   trained by torch.nn.LSTM; they have no implicit coarse step, so its rows are skipped.
2. Cycles: for each checkpoint, on its first ``--batches`` training batches, one training
   step (forward and backward of the cross-entropy) per MGRIT setting with no guard and a cap
   of 40 cycles, so that the cycles to the default tolerance show: forward / adjoint cycles
   (the largest over the batches), and the errors against the serial solve (logits, relative
   gradient).
3. Time: the same steps timed, interleaved repeat by repeat in one process, for
   torch.nn.GRU, the serial solver, solver="auto" and each MGRIT setting as a user runs it
   (``MGRIT(...)``'s default guard: a solve that diverges, or stops at its cycle cap, falls
   back; no cost guard). Medians, ratios against serial and torch, fallbacks, and the errors.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from mgrit_gru import MGRIT, Auto, Guard
from mgrit_gru.app.config import TrainConfig
from mgrit_gru.app.train import Classifier, load_checkpoint, load_data, train

# The training recipes, pinned (the app's defaults may change): the last state, Adam at a
# constant 5e-3 without warm-up, clip 1, hidden 64, torch.nn.GRU's initialisation, seed 0, the
# serial solver.
_BEFORE = dict(warmup=0.0, update_bias=0.0)  # the defaults when these checkpoints were measured
_PINNED = dict(pool="last", lr=5e-3, schedule="constant", **_BEFORE)
RECIPES = {
    "smnist": dict(dataset="smnist", epochs=10, keep=(0, 3, 6, 10), **_PINNED),
    "acsf1": dict(dataset="acsf1", batch_size=10, epochs=30, keep=(0, 10, 20, 30), **_PINNED),
}
# LSTMs (mgrit_gru.LSTM), trained by torch.nn.LSTM (exact, and faster than the library's
# serial LSTM loop), on smnist and on a second data set, ACSF1: mean pooling, the forget-gate
# bias +2 (--update-bias), Adam at a constant 2e-3 without warm-up (a constant rate, so that
# the checkpoints of one run at its kept epochs are those of a longer one).
_LSTM = dict(
    model="lstm", solver_for_training="torch", pool="mean", lr=2e-3, schedule="constant",
    warmup=0.0, update_bias=2.0,
)  # fmt: skip
LSTM_RECIPES = {
    "smnist-lstm": dict(dataset="smnist", epochs=10, keep=(0, 3, 10), **_LSTM),
    # ACSF1 at 2e-3 barely leaves chance in 30 epochs (test accuracy 22%): 5e-3 for 60
    "acsf1-lstm": dict(
        dataset="acsf1", batch_size=10, epochs=60, keep=(0, 30, 60), **{**_LSTM, "lr": 5e-3}
    ),
    # smnist-lstm's recipe with projections (h of 32 values from 64 cells), trained by the
    # library's serial solve (exact; torch's CPU LSTM runs projections about 10x slower)
    "smnist-lstm-proj": dict(
        dataset="smnist",
        epochs=10,
        keep=(0, 3, 10),
        proj_size=32,
        **{**_LSTM, "solver_for_training": "serial"},
    ),  # fmt: skip
}
# Heads other than the last state (benchmarks/loss_shapes.py): the incoming gradient is spread
# over the steps, and the adjoint state is hundreds of times larger than any single part of it.
_SPREAD = dict(lr=3e-3, schedule="constant", **_BEFORE)
POOLED = {
    "smnist-mean": dict(dataset="smnist", epochs=10, keep=(5, 10), pool="mean", **_SPREAD),
    "smnist-max": dict(dataset="smnist", epochs=10, keep=(10,), pool="max", **_SPREAD),
    "acsf1-mean": dict(
        dataset="acsf1", batch_size=10, epochs=30, keep=(30,), pool="mean", **_SPREAD
    ),
}
NO_GUARD = Guard(patience=40, cost=False)
CYCLES_HEADER = (
    f"{'data':>6} {'epoch':>5} {'setting':<24} {'fwd':>10} {'bwd':>10} {'|dlogit|':>9} "
    f"{'rel dgrad':>9}"
)
TIME_HEADER = (
    f"{'data':>6} {'epoch':>5} {'solver':<24} {'ms':>8} {'x serial':>8} {'x torch':>8} "
    f"{'f/b it':>7} {'fb':>4} {'|dlogit|':>9} {'rel dgrad':>9}"
)
CAP = 40


ALL = {**RECIPES, **POOLED, **LSTM_RECIPES}


def recipe_config(name: str, threads: int) -> TrainConfig:
    skip = ("keep", "solver_for_training")
    spec = {k: v for k, v in ALL[name].items() if k not in skip}
    solver = ALL[name].get("solver_for_training", "serial")
    return TrainConfig(**spec, solver=solver, seed=0, threads=threads)


def make_checkpoints(name: str, cache: Path, threads: int, log=print) -> list[Path]:
    """The checkpoints of ``name``'s recipe at its kept epochs, trained if not cached."""
    cfg = recipe_config(name, threads)
    keep = ALL[name]["keep"]
    folder = cache / name
    wanted = [folder / f"epoch-{e}" for e in keep]
    if all((w / "checkpoint.pt").exists() for w in wanted):
        cache_batches(folder)
        return wanted
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "recipe.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    run = folder / "run"
    for epoch, dest in zip(keep, wanted):
        dest.mkdir()
        if epoch == 0:  # the initial weights, as train() makes them
            data = load_data(cfg)
            torch.manual_seed(cfg.seed)
            model = Classifier(cfg, data.features, data.num_classes)
            state = {"config": cfg.to_dict(), "epoch": 0, "model": model.state_dict()}
            torch.save(state, dest / "checkpoint.pt")
            continue
        log(f"training {name} to epoch {epoch} ({cfg.solver} solver, seed 0)")
        train(cfg.replace(epochs=epoch), run, resume=(run / "checkpoint.pt").exists(), log=log)
        shutil.copy(run / "checkpoint.pt", dest / "checkpoint.pt")
    cache_batches(folder)
    return wanted


def cache_batches(folder: Path, count: int = 3) -> None:
    """Save the first ``count`` training batches beside a data set's checkpoints, so that
    the timing runs where the data packages are not installed (a lent GPU machine)."""
    target = folder / "batches.pt"
    if target.exists():
        return
    cfg = TrainConfig.from_dict(json.loads((folder / "recipe.json").read_text()))
    data = load_data(cfg)
    torch.save(
        {"batches": batches_of(cfg, data, count), "features": data.features,
         "classes": data.num_classes},
        target,
    )  # fmt: skip


def load_cached(folder: Path, device="cpu"):
    """A checkpoint folder's models and its data set's cached batches, on ``device``."""
    state = torch.load(folder / "checkpoint.pt", map_location="cpu", weights_only=True)
    cfg = TrainConfig.from_dict(state["config"])
    cached = torch.load(folder.parent / "batches.pt", weights_only=True)
    models = []
    for solver in ("serial", "torch"):
        m = Classifier(cfg.replace(solver=solver), cached["features"], cached["classes"])
        m.load_state_dict(state["model"])
        models.append(m.to(device))
    batches = [(x.to(device), y.to(device)) for x, y in cached["batches"]]
    return cfg, models[0], models[1], batches, int(state["epoch"])


def load_model(path: Path):
    state = (
        load_checkpoint(path)
        if (path / "config.json").exists()
        else torch.load(path / "checkpoint.pt", weights_only=True)
    )
    cfg = TrainConfig.from_dict(state["config"])
    data = load_data(cfg)
    model = Classifier(cfg.replace(solver="serial"), data.features, data.num_classes)
    model.load_state_dict(state["model"])
    torch_model = Classifier(cfg.replace(solver="torch"), data.features, data.num_classes)
    torch_model.load_state_dict(state["model"])
    return cfg, data, model, torch_model, int(state["epoch"])


def batches_of(cfg, data, count):
    rows = [torch.arange(i * cfg.batch_size, (i + 1) * cfg.batch_size) for i in range(count)]
    return [(data.x_train[r], data.y_train[r]) for r in rows]


def step(model, x, y):
    """One training step's forward and backward: logits and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    logits = model(x)
    F.cross_entropy(logits, y).backward()
    return logits.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def with_solver(model, solver):
    model.rnn.solver = solver
    return model


def rel(a, b) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def settings(args, model: str = "gru") -> dict[str, MGRIT]:
    out = {}
    for coarse in args.coarse:
        if coarse == "implicit" and model == "lstm":
            continue  # the LSTM has no implicit coarse step
        for m in args.cfactors:
            m = m if m == "auto" else int(m)
            for relax in args.relax:
                out[f"{coarse} m={m} {relax}"] = MGRIT(cfactor=m, relax=relax, coarse=coarse)
    return out


def cycles_table(name, epoch, model, batches, opts: dict[str, MGRIT], log=print) -> list[dict]:
    with_solver(model, "serial")
    exact = [step(model, x, y) for x, y in batches]
    rows = []
    for label, o in opts.items():
        unguarded = o.replace(guard=NO_GUARD, max_iters=CAP, on_unconverged="warn")
        with_solver(model, unguarded)
        fwd, bwd, y_err, g_err = [], [], 0.0, 0.0
        for (x, y), (logits, grad) in zip(batches, exact):
            got, g = step(model, x, y)
            s = model.rnn.last_stats
            fwd.append(s.forward_iterations if s.forward[0].converged else None)
            bwd.append(s.backward_iterations if s.backward[0].converged else None)
            y_err, g_err = max(y_err, (got - logits).abs().max().item()), max(g_err, rel(g, grad))
        row = {
            "dataset": name,
            "epoch": epoch,
            "setting": label,
            "fwd_cycles": fwd,
            "bwd_cycles": bwd,
            "logit_err": y_err,
            "grad_err": g_err,
        }
        rows.append(row)
        log(
            f"{name:>6} {epoch:>5} {label:<24} {_cycles(fwd):>10} {_cycles(bwd):>10} "
            f"{y_err:>9.1e} {g_err:>9.1e}"
        )
    return rows


def _cycles(values) -> str:
    """The largest over the batches; '>CAP' where a batch did not converge within CAP."""
    if any(v is None for v in values):
        return f">{CAP}"
    return str(max(values))


def time_table(name, epoch, model, torch_model, batches, opts, repeats, log=print, device=None):
    """Interleaved timing. solver="auto" runs on its own copy of the model, warmed up by ten
    steps (what it learns there stays, as in training). On CUDA every timing waits for the
    queued kernels on both ends."""

    def wait():
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    auto_model = copy.deepcopy(model)
    auto_model.rnn.solver = Auto()
    for k in range(10):
        step(auto_model, *batches[k % len(batches)])
    torch_name = f"torch.nn.{type(torch_model.rnn).__name__}"
    models = {torch_name: (torch_model, None), "serial": (model, MGRIT.serial())}
    models["auto"] = (auto_model, None)
    models.update({label: (model, o) for label, o in opts.items()})
    with_solver(model, "serial")
    exact = [step(model, x, y) for x, y in batches]
    times = {k: [] for k in models}
    info = {k: {"fallbacks": 0, "fwd": [], "bwd": [], "y_err": 0.0, "g_err": 0.0} for k in models}
    for label, (m, solver) in models.items():  # warm-up, and what each computes
        if solver is not None:
            with_solver(m, solver)
        for (x, y), (logits, grad) in zip(batches, exact):
            got, g = step(m, x, y)
            i = info[label]
            i["y_err"] = max(i["y_err"], (got - logits).abs().max().item())
            i["g_err"] = max(i["g_err"], rel(g, grad))
            s = getattr(m.rnn, "last_stats", None)
            if s is not None:
                i["fallbacks"] += sum(t.abandoned for t in s.solves)
                i["fwd"].append(s.forward_iterations)
                i["bwd"].append(s.backward_iterations)
    for _ in range(repeats):
        for x, y in batches:
            for label, (m, solver) in models.items():
                if solver is not None:
                    with_solver(m, solver)
                wait()
                start = time.perf_counter()
                step(m, x, y)
                wait()
                times[label].append(time.perf_counter() - start)
    serial = statistics.median(times["serial"])
    torch_t = statistics.median(times[torch_name])
    rows = []
    for label, ts in times.items():
        t = statistics.median(ts)
        i = info[label]
        row = {
            "dataset": name,
            "epoch": epoch,
            "solver": label,
            "step_ms": 1e3 * t,
            "x_serial": serial / t,
            "x_torch": torch_t / t,
            "fallbacks": i["fallbacks"],
            "fwd_cycles_max": max(i["fwd"], default=0),
            "bwd_cycles_max": max(i["bwd"], default=0),
            "logit_err": i["y_err"],
            "grad_err": i["g_err"],
        }
        if label == "auto":
            row["mgrit_share"] = auto_model.rnn.last_stats.mgrit_share
        rows.append(row)
        log(
            f"{name:>6} {epoch:>5} {label:<24} {row['step_ms']:>8.1f} {row['x_serial']:>8.2f} "
            f"{row['x_torch']:>8.2f} {row['fwd_cycles_max']:>3}/{row['bwd_cycles_max']:<3} "
            f"{row['fallbacks']:>4} {row['logit_err']:>9.1e} {row['grad_err']:>9.1e}"
        )
    return rows


def summarise(data: dict) -> str:
    """The tables of docs/measurements.md from a --json file: cycles at cfactor 32 on the trained
    checkpoints, each setting's mean training-step time over all checkpoints against serial
    (the default is the least), and per checkpoint serial, torch.nn.GRU, auto and MGRIT()."""
    out = []
    cyc = data.get("cycles", [])
    if cyc:
        trained = sorted({(r["dataset"], r["epoch"]) for r in cyc if r["epoch"] > 0})
        out += ["cycles to tol at cfactor 32, forward / adjoint (largest over the batches):", ""]
        out.append("| coarse, relax | " + " | ".join(f"{d} ep {e}" for d, e in trained) + " |")
        out.append("|---" * (len(trained) + 1) + "|")
        for coarse in ("implicit", "frozen", "secant"):
            for relax in ("FCF", "FCFCF"):
                label = f"{coarse} m=32 {relax}"
                cells = []
                for d, e in trained:
                    r = next((r for r in cyc if (r["dataset"], r["epoch"], r["setting"]) ==
                              (d, e, label)), None)  # fmt: skip
                    cells.append("-" if r is None else f"{_cycles(r['fwd_cycles'])} / "
                                 f"{_cycles(r['bwd_cycles'])}")  # fmt: skip
                out.append(f"| {coarse}, {relax} | " + " | ".join(cells) + " |")
        out.append("")
    rows = data.get("time", [])
    if rows:
        serial = {(r["dataset"], r["epoch"]): r["step_ms"] for r in rows if r["solver"] == "serial"}
        torch_ms = {
            (r["dataset"], r["epoch"]): r["step_ms"]
            for r in rows
            if r["solver"].startswith("torch.nn.")
        }
        ratio: dict[str, list[float]] = {}
        for r in rows:
            ratio.setdefault(r["solver"], []).append(
                r["step_ms"] / serial[r["dataset"], r["epoch"]]
            )
        out += ["training-step time / serial's, over the checkpoints (mean, worst):", ""]
        out += ["| solver | mean | worst | best |", "|---|---|---|---|"]
        for label, v in sorted(ratio.items(), key=lambda kv: sum(kv[1])):
            out.append(f"| {label} | {sum(v) / len(v):.2f} | {max(v):.2f} | {min(v):.2f} |")
        out += ["", "per checkpoint: ms per training step (x serial's speed, x torch's):"]
        out += ["", "| data | epoch | serial | torch | auto | MGRIT() | MGRIT() fallbacks |"]
        out.append("|---|---|---|---|---|---|---|")
        default = "secant m=auto FCF"
        for d, e in sorted(serial):
            get = {r["solver"]: r for r in rows if (r["dataset"], r["epoch"]) == (d, e)}

            def cell(k, get=get):
                r = get.get(k)
                return "-" if r is None else (
                    f"{r['step_ms']:.0f} ({r['x_serial']:.2f}x, {r['x_torch']:.2f}x)"
                )  # fmt: skip

            fb = get[default]["fallbacks"] if default in get else "-"
            out.append(
                f"| {d} | {e} | {serial[d, e]:.0f} | {torch_ms[d, e]:.0f}"
                f" | {cell('auto')} | {cell(default)} | {fb} |"
            )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--datasets",
        nargs="+",
        default=list(RECIPES),
        choices=list(RECIPES) + list(LSTM_RECIPES),
        help="checkpoint families: the GRUs (default) or the LSTMs (smnist-lstm acsf1-lstm; "
        "smnist-lstm-proj: with projections)",
    )
    p.add_argument("--cache", default="runs/trained-models", help="checkpoint folder")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--train-threads", type=int, default=2, help="threads to train checkpoints")
    p.add_argument("--batches", type=int, default=3, help="training batches per checkpoint")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median)")
    p.add_argument("--cfactors", nargs="+", default=["auto", "32", "64"], help="ints or auto")
    p.add_argument("--coarse", nargs="+", default=["implicit", "frozen", "secant"])
    p.add_argument("--relax", nargs="+", default=["FCF", "FCFCF"])
    p.add_argument("--epochs", type=int, nargs="+", help="only these checkpoint epochs")
    p.add_argument("--no-cycles", action="store_true", help="skip the cycles table")
    p.add_argument("--no-time", action="store_true", help="skip the timing table")
    p.add_argument("--json", help="write all rows as JSON")
    p.add_argument("--summary", metavar="JSON", help="only print the docs' tables from a --json")
    args = p.parse_args()
    if args.summary:
        print(summarise(json.loads(Path(args.summary).read_text())))
        return
    warnings.simplefilter("ignore")  # fallbacks are counted in the table
    cache = Path(args.cache)
    paths = {}
    for name in args.datasets:
        torch.set_num_threads(args.train_threads)
        paths[name] = make_checkpoints(name, cache, args.train_threads)
    torch.set_num_threads(args.threads)
    print(
        f"trained_models: threads={torch.get_num_threads()} batches={args.batches} "
        f"repeats={args.repeats} torch {torch.__version__}; tol auto (float32: 1e-5 on the "
        "relative residual, forward and adjoint); checkpoints in " + str(cache)
    )
    out = {"cycles": [], "time": []}
    loaded = {}
    for name, folders in paths.items():
        for folder in folders:
            cfg, data, model, torch_model, epoch = load_model(folder)
            if args.epochs and epoch not in args.epochs:
                continue
            loaded[name, epoch] = (cfg, model, torch_model, batches_of(cfg, data, args.batches))
    if not args.no_cycles:
        print(f"\nCycles to tol without guard (cap {CAP}; largest over the batches)")
        print(CYCLES_HEADER)
        for (name, epoch), (_, model, _, batches) in loaded.items():
            opts = settings(args, model.rnn._cell.name)
            out["cycles"] += cycles_table(name, epoch, model, batches, opts)
    if not args.no_time:
        print("\nTraining step (forward + backward), medians; MGRIT rows as MGRIT(...) runs them")
        print(TIME_HEADER)
        for (name, epoch), (_, model, torch_model, batches) in loaded.items():
            opts = settings(args, model.rnn._cell.name)
            out["time"] += time_table(name, epoch, model, torch_model, batches, opts, args.repeats)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
