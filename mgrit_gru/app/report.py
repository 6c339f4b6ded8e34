"""Run reports: PNG plots and a report.md beside them (opened by nothing)."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..options import AUTO_TOL
from .config import TrainConfig, torch_module_name
from .speed import count

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
    (``backward_tol`` None: the same as ``tol``; both on the relative residual)."""
    rows = [r for r in history if r.get("fwd_residuals_last_batch")]
    if not rows:
        return None
    fig, ax = _figure(
        "MGRIT residual per iteration (last batch of each epoch)",
        "relaxation / V-cycle",
        "max C-point residual",
        log=True,
    )
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, Normalize
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # every epoch's line in its own shade, the shades keyed by a colour bar (a legend entry
    # per epoch would not fit); the legend says which style is which pass
    cmap = ListedColormap(colormaps["viridis"](np.linspace(0.0, 0.85, 256)))
    epochs = [r["epoch"] for r in rows]
    norm = Normalize(min(epochs), max(epochs) if max(epochs) > min(epochs) else min(epochs) + 1)
    styles = (
        ("fwd_residuals_last_batch", "-", "forward"),
        ("bwd_residuals_last_batch", "--", "adjoint"),
    )
    for r in rows:
        for key, style, _ in styles:
            values = [max(v, 1e-17) for v in r.get(key, [])]
            if values:
                shade = cmap(norm(r["epoch"]))
                ax.plot(range(len(values)), values, style, marker=".", color=shade)
    passes = [Line2D([], [], ls=style, color="0.3", label=name) for _, style, name in styles]
    bar = ax.figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax)
    bar.set_label("epoch")
    bar.locator = MaxNLocator(integer=True)
    bar.update_ticks()
    tols = []
    if backward_tol is None or backward_tol == tol:
        if tol:
            label = f"tol {tol:g} (fwd, bwd)"
            tols.append(ax.axhline(tol, color="tab:red", lw=1, alpha=0.7, label=label))
    else:
        if tol:
            label = f"fwd tol {tol:g}"
            tols.append(ax.axhline(tol, color="tab:red", lw=1, alpha=0.7, label=label))
        label = f"bwd tol {backward_tol:g}"
        tols.append(
            ax.axhline(backward_tol, color="tab:red", ls="--", lw=1, alpha=0.7, label=label)
        )
    ax.legend(handles=passes + tols, fontsize=8)  # the passes' styles are not lines drawn
    return fig


def _fmt(value) -> str:
    """A config value as written, never rounded away (1e-05 stays 1e-05)."""
    return repr(value) if isinstance(value, float) else str(value)


def write_run_report(
    run: Path, cfg: TrainConfig, history: list[dict], dataset: str, speed: dict | None = None
) -> Path:
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
    mgrit = cfg.solver in ("mgrit", "auto")

    def tol_line(tol):  # the app trains in float32: "auto" is AUTO_TOL there
        return AUTO_TOL if tol == "auto" else tol

    residuals = plot_residuals(
        run / "residuals.png",
        history,
        tol_line(cfg.tol) if mgrit and cfg.budget is None else None,
        tol_line(cfg.backward_tol) if mgrit and cfg.budget is None else None,
    )
    last = history[-1]
    serial = "test_acc_serial" in last
    budget = cfg.budget
    # a budget's estimated relative gradient error per epoch (runs since 2026-12-05)
    estimated = any("budget_grad_err_est" in r for r in history)
    lines = [
        f"# Training run: {cfg.dataset}, solver {cfg.solver_run}"
        + (f" on {cfg.time_parallel} time-parallel ranks" if cfg.time_parallel > 1 else "")
        + (f", budget {budget.forward}/{budget.backward} cycles" if budget else "")
        + (
            f" at least (adaptive: up to {budget.max_forward}/{budget.max_backward}, "
            f"gradient error bound {budget.theta:g})"
            if budget is not None and budget.adaptive
            else ""
        ),
        "",
        dataset,
        "",
        f"Final (epoch {last['epoch']}): test accuracy **{last['test_acc']:.4f}**"
        + (
            f" with the budget it trained with, **{last['test_acc_serial']:.4f}** with the same "
            "weights solved exactly (serial)"
            if serial
            else ""
        )
        + f", test loss {last['test_loss']:.4f}, train accuracy {last['train_acc']:.4f}; "
        f"{statistics.mean(r['train_time_s'] for r in history):.1f} s per training epoch.",
        "",
        "| epoch | train loss | train acc | test loss | test acc | "
        + ("test acc serial | " if serial else "")
        + "train s | seq/s | fwd it | bwd it | fwd res max | bwd res max | fallbacks | "
        "MGRIT share fwd/bwd |" + (" est. grad err |" if estimated else ""),
        "|---" * (13 + serial + estimated) + "|",
    ]
    for r in history:
        share = "-"
        if "mgrit_share_fwd" in r and mgrit:
            share = f"{100 * r['mgrit_share_fwd']:.0f}% / {100 * r['mgrit_share_bwd']:.0f}%"
        lines.append(
            f"| {r['epoch']} | {r['train_loss']:.4f} | {r['train_acc']:.4f} | "
            f"{r['test_loss']:.4f} | {r['test_acc']:.4f} | "
            + (f"{r.get('test_acc_serial', float('nan')):.4f} | " if serial else "")
            + f"{r['train_time_s']:.1f} | "
            f"{r['seq_per_s']:.0f} | {r['fwd_iters_mean']:.2f} | {r['bwd_iters_mean']:.2f} | "
            f"{_residual_cell(r, 'fwd')} | {_residual_cell(r, 'bwd')} | {r['fallbacks']} | "
            f"{share} |"
            + (f" {r.get('budget_grad_err_est', float('nan')):.2g} |" if estimated else "")
        )
    if mgrit:
        lines += [
            "",
            "res max: the largest final residual of the solves whose result MGRIT gave (-: "
            "none); fell back N: MGRIT tries that stopped and gave way to the serial solve "
            "(their residuals are not counted); fallbacks: training steps with such a try."
            + (
                " est. grad err: the budget's estimated relative error of the gradient (its "
                "forward's and adjoint's errors, each its residual times the ratio that an exact "
                "check every few calls measures; docs/convergence.md)."
                if estimated
                else ""
            ),
        ]
    if speed is not None:
        lines += ["", "## Speed", "", speed_text(speed)]
    lines += ["", f"![loss]({plots['loss']})", "", f"![accuracy]({plots['accuracy']})", ""]
    if residuals:
        lines += [f"![residuals]({residuals})", ""]
    lines += ["## Config", "", "| option | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in cfg.to_dict().items()]
    path = run / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _residual_cell(row: dict, direction: str) -> str:
    """An epoch's largest residual of what MGRIT gave in one pass ("fwd", "bwd"), and the
    count of its tries that fell back to the serial solve."""
    share = row.get(f"mgrit_share_{direction}")
    cell = "-" if share == 0 else f"{row[f'{direction}_residual_max']:.1e}"
    fell_back = row.get(f"{direction}_fell_back", 0)
    return cell + (f" (fell back {fell_back})" if fell_back else "")


def speed_text(speed: dict) -> str:
    """The speed check as a sentence and a table (report.md)."""
    if "skipped" in speed:
        return f"Speed check skipped ({speed['skipped']}); the training itself finished."
    ms, own = speed["step_ms"], speed["solver"]
    names = {"torch": torch_module_name(speed.get("model", "gru")), "serial": "serial solver"}
    names.update(mgrit="MGRIT", auto="auto")
    rows = [f"| {names.get(n, n)} | {t:.1f} | {t / ms[own]:.2f}x |" for n, t in ms.items()]
    text = (
        f"One training step (forward and backward of the loss) on the first {speed['batches']} "
        f"training batches with the final weights, each solver timed interleaved, "
        f"{count(speed['repeats'], 'repeat')}, {count(speed['threads'], 'thread')} (median). "
        "Speed-up of this "
        f"run's solver ({own}) over each:\n\n| solver | ms per step | speed-up of {own} |\n"
        "|---|---|---|\n" + "\n".join(rows)
    )
    if speed.get("mgrit_share") is not None:
        text += f"\n\nMGRIT gave {100 * speed['mgrit_share']:.0f}% of the solves in these steps."
    return text


def candidate(solvers) -> str:
    """The solver a comparison is about: the one that is neither serial nor torch."""
    return next((s for s in solvers if s not in ("serial", "torch")), "serial")


def _total(history: list[dict]) -> float:
    return sum(r["train_time_s"] for r in history)


def write_compare_report(
    out: Path, runs: dict[str, tuple[TrainConfig, list[dict]]], dataset: str
) -> Path:
    """One report for runs that differ only in the solver: curves on the same axes, times
    per run and per epoch against serial (and torch.nn.GRU), the share of MGRIT solves."""

    def series(key):
        return {
            solver: {
                "x": [r["epoch"] for r in h],
                "y": [r[key] for r in h],
                "color": COLORS.get(solver, COLORS["mgrit"]),
            }
            for solver, (_, h) in runs.items()
        }

    plots = [
        _curves(out / "compare_test_accuracy.png", "test accuracy", "accuracy", series("test_acc")),
        _curves(
            out / "compare_train_loss.png", "training loss", "cross-entropy", series("train_loss")
        ),
    ]
    totals = {s: _total(h) for s, (_, h) in runs.items()}
    own = candidate(runs)
    cfg = next(iter(runs.values()))[0]
    lines = [
        f"# Solver comparison on {cfg.dataset}",
        "",
        dataset,
        "",
        f"Same model ({cfg.model.upper()}), initial weights, data order and seed; only the "
        "solver differs. Times "
        "are the training epochs' (evaluation aside); a speed-up is the other's time over "
        f"{own}'s. The solvers' epochs alternate (epoch 1 of each, then epoch 2, ...), so a "
        "change in the machine's speed falls on all of them alike.",
        "",
        "| solver | final test acc | best test acc | final train loss | train s (total) | "
        f"{own}'s speed-up over it | mean fwd it | mean bwd it | fallbacks | MGRIT share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cycles(solver, h, direction):  # the exact solvers run no MGRIT cycle: "-", not 0.00
        exact = solver in ("serial", "torch")
        return "-" if exact else f"{statistics.mean(r[f'{direction}_iters_mean'] for r in h):.2f}"

    for solver, (_, h) in runs.items():
        share = "-"
        if solver not in ("serial", "torch") and h and "mgrit_share_fwd" in h[0]:
            share = f"{100 * statistics.mean(r['mgrit_share_fwd'] for r in h):.0f}% fwd, "
            share += f"{100 * statistics.mean(r['mgrit_share_bwd'] for r in h):.0f}% bwd"
        lines.append(
            f"| {solver} | {h[-1]['test_acc']:.4f} | {max(r['test_acc'] for r in h):.4f} | "
            f"{h[-1]['train_loss']:.4f} | {totals[solver]:.1f} | "
            f"{totals[solver] / totals[own]:.2f}x | "
            f"{cycles(solver, h, 'fwd')} | {cycles(solver, h, 'bwd')} | "
            f"{sum(r['fallbacks'] for r in h)} | {share} |"
        )
    if own != "serial" and "serial" in runs:
        gap = runs[own][1][-1]["test_acc"] - runs["serial"][1][-1]["test_acc"]
        lines += [
            "",
            f"Final test accuracy, {own} minus serial: {100 * gap:+.2f} percentage points.",
            "",
            f"Per epoch ({own} against the others; speed-up = their epoch time over {own}'s):",
            "",
            "| epoch | "
            + " | ".join(f"{s} s" for s in runs)
            + " | speed-up over serial | "
            + ("speed-up over torch | " if "torch" in runs else "")
            + "MGRIT share fwd / bwd | mean fwd / bwd cycles |",
            "|---" * (len(runs) + 4 + ("torch" in runs)) + "|",
        ]
        for i, row in enumerate(runs[own][1]):
            t = {s: h[i]["train_time_s"] for s, (_, h) in runs.items() if i < len(h)}
            lines.append(
                f"| {row['epoch']} | "
                + " | ".join(f"{t[s]:.1f}" for s in runs if s in t)
                + f" | {t['serial'] / t[own]:.2f}x | "
                + (f"{t['torch'] / t[own]:.2f}x | " if "torch" in t else "")
                + f"{100 * row.get('mgrit_share_fwd', 0):.0f}% / "
                f"{100 * row.get('mgrit_share_bwd', 0):.0f}% | "
                f"{row['fwd_iters_mean']:.1f} / {row['bwd_iters_mean']:.1f} |"
            )
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
    """The same comparison repeated over seeds: per seed the final test accuracies, the gap
    to serial, the total training time against serial and torch.nn.GRU and the slowest epoch
    against serial; then mean ± sample standard deviation."""
    seeds = list(per_seed)
    solvers = list(next(iter(per_seed.values())))
    own = candidate(solvers)
    cfg = next(iter(per_seed.values()))["serial"][0]

    def final_acc(seed, solver):
        return 100 * per_seed[seed][solver][1][-1]["test_acc"]

    def total(seed, solver):
        return _total(per_seed[seed][solver][1])

    def worst_epoch(seed):
        pairs = zip(per_seed[seed]["serial"][1], per_seed[seed][own][1])
        return min(s["train_time_s"] / o["train_time_s"] for s, o in pairs)

    with_torch = "torch" in solvers
    lines = [
        f"# Solver comparison on {cfg.dataset} over {len(seeds)} seeds",
        "",
        dataset,
        "",
        "Per seed: same model, initial weights and data order for every solver; the seed "
        "changes all of them. Accuracies in percent; gaps in percentage points; times are the "
        f"training epochs' sums; a speed-up is the other's time over {own}'s. The solvers' "
        "epochs alternate within a seed.",
        "",
        "| seed | "
        + " | ".join(f"{s} final test acc" for s in solvers)
        + f" | {own} - serial | "
        + " | ".join(f"{s} train s" for s in solvers)
        + " | speed-up over serial | slowest epoch vs serial |"
        + (" speed-up over torch |" if with_torch else ""),
        "|---" * (2 * len(solvers) + 4 + with_torch) + "|",
    ]
    gaps, speedups, worst, over_torch = [], [], [], []
    for seed in seeds:
        gap = final_acc(seed, own) - final_acc(seed, "serial")
        speed = total(seed, "serial") / total(seed, own)
        gaps.append(gap)
        speedups.append(speed)
        worst.append(worst_epoch(seed))
        if with_torch:
            over_torch.append(total(seed, "torch") / total(seed, own))
        lines.append(
            f"| {seed} | "
            + " | ".join(f"{final_acc(seed, s):.1f}" for s in solvers)
            + f" | {gap:+.1f} | "
            + " | ".join(f"{total(seed, s):.1f}" for s in solvers)
            + f" | {speed:.2f}x | {worst[-1]:.2f}x |"
            + (f" {over_torch[-1]:.2f}x |" if with_torch else "")
        )
    n = len(seeds)
    lines += ["", f"Over the {n} seeds (mean ± sample standard deviation):", ""]
    for s in solvers:
        lines.append(f"- {s}: final test accuracy {_spread([final_acc(k, s) for k in seeds])} %")
    lines.append(f"- {own} minus serial: {_spread(gaps, True)} percentage points")
    if with_torch:
        exact = [final_acc(k, "serial") - final_acc(k, "torch") for k in seeds]
        lines.append(
            f"- serial minus {torch_module_name(cfg.model)} (two exact solvers): "
            f"{_spread(exact, True)} percentage points"
        )
    lines.append(f"- {own}'s speed-up over serial (total training time): {_spread(speedups)}x")
    lines.append(f"- slowest epoch of {own} against serial's: {_spread(worst)}x")
    if with_torch:
        lines.append(
            f"- {own}'s speed-up over {torch_module_name(cfg.model)}: {_spread(over_torch)}x"
        )
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
