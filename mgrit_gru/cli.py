"""The ``mgrit-gru`` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed

from . import bench, calibrate
from .app.config import TrainConfig, add_config_arguments, given_overrides, with_recipe
from .app.datasets import DatasetError
from .app.speed import speed_line
from .projection import cli as projection_cli


def _train(args: argparse.Namespace) -> None:
    from .app import train

    overrides = given_overrides(args)
    if not args.resume:
        overrides = with_recipe(overrides)
    if args.resume:
        run = Path(args.resume)
        if args.out and Path(args.out) != run:
            raise train.RunError("--resume continues the run in its own folder; drop --out")
        cfg = train.resume_config(run, overrides)
    else:
        cfg = TrainConfig(**overrides)
        run = Path(args.out) if args.out else train.default_run_dir(cfg)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1 and cfg.time_parallel == 1:  # each process would train the same run alone
        raise train.RunError(
            f"started by torchrun with {world} processes but without --time-parallel: each "
            f"would train the same run into the same folder; add --time-parallel {world} (one "
            "sequence split over the processes), or run mgrit-gru train without torchrun"
        )
    made = [] if args.resume else _new_folders(run)  # what this command creates
    try:
        calibrate.for_run(cfg, run, bool(args.resume))  # this machine's cost model, pinned
        with _ranks_report_failures(cfg, run):
            history = train.train(cfg, run, resume=bool(args.resume), progress=not args.no_progress)
    except BaseException:
        _remove_unstarted(made)
        raise
    if cfg.time_parallel > 1 and torch.distributed.get_rank() != 0:
        return  # rank 0 writes the report
    try:
        _finish_run(args, cfg, run, history)
    except KeyboardInterrupt:  # after the training: what is saved, and how to finish
        raise train.Interrupted(
            f"Ctrl-C while the run's report was written; the training finished and "
            f"{run / train.CHECKPOINT} holds it: mgrit-gru train --resume {run} writes the report"
        ) from None


# What a run folder holds before its training has done anything: a train that fails on its
# arguments (an unknown --dataset, a --length the data refuses) takes them away again.
UNSTARTED = ("calibration.json", "config.json")


def _new_folders(run: Path) -> list[Path]:
    """The folders, ``run`` and those above it, that do not exist yet (innermost first)."""
    new = []
    for folder in (run, *run.parents):
        if folder.exists():
            break
        new.append(folder)
    return new


def _remove_unstarted(made: list[Path]) -> None:
    """Remove the folders this command made (``made``, innermost first) where they hold
    nothing but :data:`UNSTARTED` files (a checkpoint, a log or anything else keeps them)."""
    for folder in made:
        try:
            if not folder.is_dir() or any(
                p.name not in UNSTARTED or not p.is_file() for p in folder.iterdir()
            ):
                return
            for name in UNSTARTED:
                (folder / name).unlink(missing_ok=True)
            folder.rmdir()
        except OSError:
            return


@contextlib.contextmanager
def _ranks_report_failures(cfg: TrainConfig, run: Path):
    """A --time-parallel run: a lost rank is one line with how to resume (exit 3). A rank
    that died leaves its partners' exchanges failing (mgrit_gru.distributed names the
    ranks); torchrun then stops the survivors with SIGTERM, which says so too."""
    from .distributed import TimeGroup, TimeParallelError

    if cfg.time_parallel == 1:
        yield
        return
    rank = os.environ.get("RANK", "?")

    def stopped(signum, frame):
        who = "another rank died or was killed"
        if torch.distributed.is_initialized():  # which ranks are gone: they miss a roll call
            missing = TimeGroup(roll_call_s=2.0).roll_call()
            if missing:
                who = f"rank(s) {missing} did not answer a roll call: they died or were killed"
        raise TimeParallelError(
            f"time-parallel rank {rank}: stopped by SIGTERM (torchrun stops every rank once "
            f"one has failed; {who})"
        )

    old = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    except TimeParallelError as exc:
        resume = (
            f"torchrun --nproc-per-node {cfg.time_parallel} -m mgrit_gru.cli train --resume {run}"
        )
        raise TimeParallelError(
            f"{exc}; the last finished epoch is saved: resume with {resume}"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, old)


NO_SPEED_CHECK = "no-speed-check"  # a run folder's marker of --no-speed-check


def _finish_run(args: argparse.Namespace, cfg: TrainConfig, run: Path, history) -> None:
    """A finished run's closing speed check, report and last lines."""
    from .app import report, train

    speed = None
    # --no-speed-check holds for the run: a resumption without the flag keeps it
    marker = run / NO_SPEED_CHECK
    skip = args.no_speed_check or marker.exists()
    if args.no_speed_check and not marker.exists():
        marker.write_text("mgrit-gru train --no-speed-check: no closing speed check\n")
    if cfg.time_parallel == 1 and not skip:
        try:
            speed = train.measure_speed(cfg, run)
        except KeyboardInterrupt:  # the training is done and saved: report it all the same
            speed = {"skipped": "interrupted by Ctrl-C"}
        else:
            train.write_json(run / "speed.json", speed)
    data_line = history and train.load_data(cfg).describe()
    path = report.write_run_report(run, cfg, history, data_line, speed)
    if speed is not None and "skipped" in speed:
        raise train.Interrupted(
            f"Ctrl-C during the closing speed check, which is skipped; the training itself "
            f"finished: {run / train.CHECKPOINT} holds the trained model; report: {path}"
        )
    if speed is not None:
        print(speed_line(speed))
    print(f"report: {path}")


def _compare(args: argparse.Namespace) -> None:
    from .app import train

    overrides = with_recipe(given_overrides(args))
    own = overrides.pop("solver", "auto")  # the solver under comparison
    if own in ("serial", "torch"):
        raise ValueError("compare: --solver names the solver to compare: auto or mgrit")
    if overrides.get("budget_forward") is not None:
        own = "mgrit"  # a budget is MGRIT's
    base = TrainConfig(**overrides, solver=own)
    if args.resume and not args.out:
        raise ValueError("compare --resume continues the comparison in --out: name that folder")
    out = Path(args.out) if args.out else train.default_run_dir(base, "compare")
    solvers = ["serial", own] + (["torch"] if args.with_torch else [])
    calibrate.for_run(base, out, bool(args.resume))
    try:
        _compare_all(args, overrides, base, out, solvers)
    except train.Interrupted as exc:  # say how to continue the comparison, not one run
        saved = str(exc).split(": continue with")[0]
        raise train.Interrupted(
            f"{saved}; continue the comparison with the same options and --resume --out {out}"
        ) from None
    except KeyboardInterrupt:  # between runs or while a report is written
        raise train.Interrupted(
            f"Ctrl-C; what the comparison's runs finished is saved in {out}: continue it with "
            f"the same options and --resume --out {out}"
        ) from None


def _compare_all(args, overrides: dict, base: TrainConfig, out: Path, solvers: list[str]):
    from .app import report, train

    dataset = train.load_data(base).describe()
    if not args.seeds:
        runs = _compare_runs(base, out, solvers, args, dataset)
        path = report.write_compare_report(out, runs, dataset)
        print(f"report: {path}")
        return
    if len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds: repeated seed in {args.seeds}")
    if "seed" in overrides:
        raise ValueError("give either --seed or --seeds")
    per_seed = {}
    for seed in args.seeds:
        folder = out / f"seed-{seed}"
        cfg = base.replace(seed=seed)
        runs = _compare_runs(cfg, folder, solvers, args, dataset)
        report.write_compare_report(folder, runs, dataset)
        per_seed[seed] = runs
    path = report.write_seeds_report(out, per_seed, dataset)
    print(f"report: {path}")


def _compare_runs(base: TrainConfig, out: Path, solvers: list[str], args, dataset: str) -> dict:
    """Train one run per solver, their epochs interleaved (epoch 1 of each, then epoch 2 of
    each, ...: each run pauses at its checkpoint and continues exactly), so that a change in
    the machine's speed during the comparison falls on every solver alike."""
    from .app import report, train

    cfgs = {solver: base.replace(solver=solver) for solver in solvers}
    print(f"== {', '.join(solvers)} (seed {base.seed}), epochs interleaved ==")
    print(dataset)
    histories: dict[str, list[dict]] = {}
    for epoch in range(1, base.epochs + 1):
        for solver, cfg in cfgs.items():
            folder = out / solver
            resume = (epoch > 1 or args.resume) and (folder / train.CHECKPOINT).exists()
            histories[solver] = train.train(
                cfg,
                folder,
                resume=resume,
                progress=not args.no_progress,
                stop_after=epoch,
                log=lambda text, s=solver: text.startswith("epoch") and print(f"{s}: {text}"),
            )
    runs = {}
    for solver, cfg in cfgs.items():
        report.write_run_report(out / solver, cfg, histories[solver], dataset)
        runs[solver] = (cfg, histories[solver])
    return runs


def _eval(args: argparse.Namespace) -> None:
    from .app import train

    train.evaluate_run(Path(args.run), args.dataset)


class _Parser(argparse.ArgumentParser):
    """Bad command lines get one line on stderr (no usage dump) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _training_parser(sub, name: str, helptext: str, out_help: str, func):
    p = sub.add_parser(name, help=helptext)
    add_config_arguments(p)
    p.add_argument("--out", help=out_help)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mgrit-gru", description="GRU and LSTM training parallel in time with MGRIT"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("bench", help="time torch.nn.GRU (or LSTM), serial and MGRIT side by side")
    bench.add_arguments(p)
    p.set_defaults(func=bench.run)
    p = sub.add_parser("calibrate", help="measure this machine's step costs for the cost model")
    calibrate.add_arguments(p)
    p.set_defaults(func=calibrate.run)
    p = sub.add_parser(
        "project",
        help="projected training step at many time-parallel ranks or on a GPU (from a trace "
        "recorded here, replayed on a modelled machine)",
    )
    projection_cli.add_arguments(p)
    p.set_defaults(func=projection_cli.run)

    p = _training_parser(
        sub,
        "train",
        "train a GRU or LSTM sequence classifier (default: a GRU on smnist, solver auto)",
        "run folder (default: runs/DATASET-SOLVER-TIME)",
        _train,
    )
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR exactly")
    p.add_argument(
        "--no-speed-check",
        action="store_true",
        help="skip the closing comparison of the training step against torch.nn.GRU (LSTM) and the "
        "serial solver (same batches, final weights)",
    )
    p = _training_parser(
        sub,
        "compare",
        "the same training with the serial solver and --solver (auto or mgrit), one report",
        "folder for the runs and the report (default: runs/DATASET-compare-TIME)",
        _compare,
    )
    p.add_argument(
        "--with-torch",
        action="store_true",
        help="also train with torch.nn.GRU (torch.nn.LSTM with --model lstm)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted comparison in --out with the same options: runs found "
        "there continue exactly (finished ones are kept), missing ones are trained",
    )
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        metavar="SEED",
        help="repeat the comparison for each seed (folders seed-S) and summarise: mean and "
        "spread of the accuracy gap and of the time ratio",
    )

    p = sub.add_parser("eval", help="evaluate a run's saved model on a test split")
    p.add_argument("run", help="run folder")
    p.add_argument("--dataset", help="another dataset of the same shape (default: the run's)")
    p.set_defaults(func=_eval)
    return parser


# torch's warnings that tell a command's user nothing to act on, kept out of its output:
# torch.nn.LSTM with proj_size (the speed check's and --solver torch's baseline) runs torch's
# own loop instead of oneDNN's, and says so in the middle of the progress lines.
QUIET = (r"LSTM with projections is not supported with oneDNN",)


def main(argv: list[str] | None = None) -> int:
    from .app.train import Interrupted
    from .distributed import TimeParallelError
    from .layer.solve import DivergenceError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            for message in QUIET:
                warnings.filterwarnings("ignore", message=message, category=UserWarning)
            args.func(args)
    except Interrupted as exc:
        print(f"mgrit-gru {args.command}: {exc}", file=sys.stderr)
        return 130  # the shell's code for a run stopped by Ctrl-C
    except KeyboardInterrupt:  # anywhere else: one line, never a traceback or exit 0
        print(
            f"mgrit-gru {args.command}: interrupted by Ctrl-C; nothing of this command was "
            "kept beyond what it had saved: run it again (train and compare: with --resume)",
            file=sys.stderr,
        )
        return 130
    except TimeParallelError as exc:  # a rank died or hung: its partner says so, once
        print(f"mgrit-gru {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 3
    except (ValueError, TypeError, OSError, DatasetError, DivergenceError) as exc:
        print(f"mgrit-gru {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
        return f"{type(exc).__name__}: {text}"
    return text


if __name__ == "__main__":
    sys.exit(main())
