"""Run reports: PNG plots and a report.md beside them (opened by nothing)."""

from __future__ import annotations

import statistics
from pathlib import Path

from .config import TrainConfig

COLORS = {"mgrit": "tab:blue", "serial": "tab:orange", "torch": "tab:green"}
# Runs of exact solvers often coincide: distinct line styles and markers keep each visible.
STYLES = {"mgrit": ("-", "o", 6), "serial": ("--", "s", 5), "torch": (":", "^", 4)}


def _figure(title: str, xlabel: str, ylabel: str, log: bool = False):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path)
    return path.name


def _curves(path: Path, title: str, ylabel: str, series: dict[str, dict[str, list]]) -> str:
    """``series``: label -> {"x": [...], "y": [...], "style": "-", "color": ...}."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = _figure(title, "epoch", ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for label, s in series.items():
        style, marker, size = STYLES.get(label, (s.get("style", "-"), "o", 3))
        ax.plot(
            s["x"],
            s["y"],
            s.get("style", style),
            marker=marker,
            ms=size,
            mfc="none",
            color=s.get("color"),
            label=label,
        )
    ax.legend()
    return _save(fig, path)


def plot_residuals(
    path: Path, history: list[dict], tol: float | None = None, backward_tol: float | None = None
) -> str | None:
    fig = residual_figure(history, tol, backward_tol)
    return None if fig is None else _save(fig, path)


def residual_figure(history: list[dict], tol: float | None = None, backward_tol=None):
    """The residual histories of the last batch of each epoch, with the tolerances as lines
    (``backward_tol`` None: the same as ``tol``, relative to the incoming gradient)."""
    rows = [r for r in history if r.get("fwd_residuals_last_batch")]
    if not rows:
        return None
    fig, ax = _figure(
        "MGRIT residual per iteration (last batch of each epoch)",
        "relaxation / V-cycle",
        "max C-point residual",
        log=True,
    )
    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    cmap = colormaps["viridis"]
    for i, r in enumerate(rows):
        shade = cmap(0.85 * i / max(1, len(rows) - 1))
        for key, style, name in (
            ("fwd_residuals_last_batch", "-", "fwd"),
            ("bwd_residuals_last_batch", "--", "bwd"),
        ):
            values = [max(v, 1e-17) for v in r.get(key, [])]
            if values:
                label = f"{name} epoch {r['epoch']}" if i in (0, len(rows) - 1) else None
                ax.plot(range(len(values)), values, style, marker=".", color=shade, label=label)
    if backward_tol is None or backward_tol == tol:
        if tol:
            ax.axhline(tol, color="tab:red", lw=1, alpha=0.7, label=f"tol {tol:g} (fwd, bwd)")
    else:
        if tol:
            ax.axhline(tol, color="tab:red", lw=1, alpha=0.7, label=f"fwd tol {tol:g}")
        label = f"bwd tol {backward_tol:g}"
        ax.axhline(backward_tol, color="tab:red", ls="--", lw=1, alpha=0.7, label=label)
    ax.legend(fontsize=8)
    return fig


def _fmt(value) -> str:
    """A config value as written, never rounded away (1e-05 stays 1e-05)."""
    return repr(value) if isinstance(value, float) else str(value)


def write_run_report(run: Path, cfg: TrainConfig, history: list[dict], dataset: str) -> Path:
    epochs = [r["epoch"] for r in history]
    plots = {
        name: _curves(
            run / f"{name}.png",
            name,
            ylabel,
            {
                "train": {"x": epochs, "y": [r[f"train_{key}"] for r in history]},
                "test": {"x": epochs, "y": [r[f"test_{key}"] for r in history], "style": "--"},
            },
        )
        for name, key, ylabel in (
            ("loss", "loss", "cross-entropy"),
            ("accuracy", "acc", "accuracy"),
        )
    }
    residuals = plot_residuals(
        run / "residuals.png",
        history,
        cfg.tol if cfg.solver == "mgrit" else None,
        cfg.backward_tol if cfg.solver == "mgrit" else None,
    )
    last = history[-1]
    lines = [
        f"# Training run: {cfg.dataset}, solver {cfg.solver}",
        "",
        dataset,
        "",
        f"Final (epoch {last['epoch']}): test accuracy **{last['test_acc']:.4f}**, test loss "
        f"{last['test_loss']:.4f}, train accuracy {last['train_acc']:.4f}; "
        f"{statistics.mean(r['train_time_s'] for r in history):.1f} s per training epoch.",
        "",
        "| epoch | train loss | train acc | test loss | test acc | train s | seq/s | fwd it | "
        "bwd it | fwd res max | bwd res max | fallbacks |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in history:
        lines.append(
            f"| {r['epoch']} | {r['train_loss']:.4f} | {r['train_acc']:.4f} | "
            f"{r['test_loss']:.4f} | {r['test_acc']:.4f} | {r['train_time_s']:.1f} | "
            f"{r['seq_per_s']:.0f} | {r['fwd_iters_mean']:.2f} | {r['bwd_iters_mean']:.2f} | "
            f"{r['fwd_residual_max']:.1e} | {r['bwd_residual_max']:.1e} | {r['fallbacks']} |"
        )
    lines += ["", f"![loss]({plots['loss']})", "", f"![accuracy]({plots['accuracy']})", ""]
    if residuals:
        lines += [f"![residuals]({residuals})", ""]
    lines += ["## Config", "", "| option | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in cfg.to_dict().items()]
    path = run / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_compare_report(
    out: Path, runs: dict[str, tuple[TrainConfig, list[dict]]], dataset: str
) -> Path:
    """One report for runs that differ only in the solver: curves on the same axes."""

    def series(key):
        return {
            solver: {
                "x": [r["epoch"] for r in h],
                "y": [r[key] for r in h],
                "color": COLORS.get(solver),
            }
            for solver, (_, h) in runs.items()
        }

    plots = [
        _curves(out / "compare_test_accuracy.png", "test accuracy", "accuracy", series("test_acc")),
        _curves(
            out / "compare_train_loss.png", "training loss", "cross-entropy", series("train_loss")
        ),
    ]
    times = {s: statistics.mean(r["train_time_s"] for r in h) for s, (_, h) in runs.items()}
    base = times.get("serial")
    cfg = next(iter(runs.values()))[0]
    lines = [
        f"# Solver comparison on {cfg.dataset}",
        "",
        dataset,
        "",
        "Same model, initial weights, data order and seed; only the GRU solver differs.",
        "",
        "| solver | final test acc | best test acc | final train loss | s / epoch (train) | "
        "speed-up vs serial | mean fwd it | mean bwd it | fallbacks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for solver, (_, h) in runs.items():
        speed = f"{base / times[solver]:.2f}x" if base else "-"
        lines.append(
            f"| {solver} | {h[-1]['test_acc']:.4f} | {max(r['test_acc'] for r in h):.4f} | "
            f"{h[-1]['train_loss']:.4f} | {times[solver]:.1f} | {speed} | "
            f"{statistics.mean(r['fwd_iters_mean'] for r in h):.2f} | "
            f"{statistics.mean(r['bwd_iters_mean'] for r in h):.2f} | "
            f"{sum(r['fallbacks'] for r in h)} |"
        )
    if "mgrit" in runs and "serial" in runs:
        gap = runs["mgrit"][1][-1]["test_acc"] - runs["serial"][1][-1]["test_acc"]
        lines += [
            "",
            f"Final test accuracy, MGRIT minus serial: {100 * gap:+.2f} percentage points.",
        ]
    lines += [""] + [f"![{p}]({p})" for p in plots]
    lines += ["", "Per-solver runs: " + ", ".join(f"[{s}]({s}/report.md)" for s in runs), ""]
    lines += ["## Config (solver aside)", "", "| option | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in cfg.to_dict().items() if k != "solver"]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _spread(values: list[float], signed: bool = False) -> str:
    mean = f"{statistics.mean(values):+.2f}" if signed else f"{statistics.mean(values):.2f}"
    if len(values) < 2:
        return mean
    return f"{mean} ± {statistics.stdev(values):.2f}"


def write_seeds_report(
    out: Path, per_seed: dict[int, dict[str, tuple[TrainConfig, list[dict]]]], dataset: str
) -> Path:
    """The same comparison repeated over seeds: per seed the final test accuracies, the MGRIT
    minus serial gap and the time per epoch; then mean ± sample standard deviation."""
    seeds = list(per_seed)
    solvers = list(next(iter(per_seed.values())))
    cfg = next(iter(per_seed.values()))["serial"][0]

    def final_acc(seed, solver):
        return 100 * per_seed[seed][solver][1][-1]["test_acc"]

    def epoch_s(seed, solver):
        return statistics.mean(r["train_time_s"] for r in per_seed[seed][solver][1])

    lines = [
        f"# Solver comparison on {cfg.dataset} over {len(seeds)} seeds",
        "",
        dataset,
        "",
        "Per seed: same model, initial weights and data order for every solver; the seed "
        "changes all of them. Accuracies in percent; gaps in percentage points.",
        "",
        "| seed | "
        + " | ".join(f"{s} final test acc" for s in solvers)
        + " | MGRIT - serial | "
        + " | ".join(f"{s} s / epoch" for s in solvers)
        + " | MGRIT speed-up vs serial |",
        "|---" * (2 * len(solvers) + 3) + "|",
    ]
    gaps, speedups = [], []
    for seed in seeds:
        gap = final_acc(seed, "mgrit") - final_acc(seed, "serial")
        speed = epoch_s(seed, "serial") / epoch_s(seed, "mgrit")
        gaps.append(gap)
        speedups.append(speed)
        lines.append(
            f"| {seed} | "
            + " | ".join(f"{final_acc(seed, s):.1f}" for s in solvers)
            + f" | {gap:+.1f} | "
            + " | ".join(f"{epoch_s(seed, s):.1f}" for s in solvers)
            + f" | {speed:.2f}x |"
        )
    n = len(seeds)
    lines += [
        "",
        f"Over the {n} seeds (mean ± sample standard deviation):",
        "",
    ]
    for s in solvers:
        lines.append(f"- {s}: final test accuracy {_spread([final_acc(k, s) for k in seeds])} %")
    lines.append(f"- MGRIT minus serial: {_spread(gaps, True)} percentage points")
    if "torch" in solvers:
        exact = [final_acc(k, "serial") - final_acc(k, "torch") for k in seeds]
        lines.append(
            f"- serial minus torch.nn.GRU (two exact solvers): {_spread(exact, True)} "
            "percentage points"
        )
    lines.append(f"- MGRIT's time per epoch against serial: {_spread(speedups)}x")
    if n > 1:
        sem = statistics.stdev(gaps) / n**0.5
        lines += [
            "",
            f"The gap's standard error over the seeds is {sem:.2f} points: differences well "
            "inside it cannot be told from seed-to-seed variation with this many seeds.",
        ]
    lines += ["", "Per-seed reports: " + ", ".join(f"[{k}](seed-{k}/report.md)" for k in seeds)]
    lines += ["", "## Config (solver and seed aside)", "", "| option | value |", "|---|---|"]
    lines += [
        f"| {k} | {_fmt(v)} |" for k, v in cfg.to_dict().items() if k not in ("solver", "seed")
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
