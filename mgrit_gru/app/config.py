"""The training configuration: one frozen dataclass; the CLI's flags are generated from it."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

from ..options import (
    COARSE_CHOICES,
    COARSE_GATES_CHOICES,
    GRADIENT_CHOICES,
    MGRIT,
    ON_DIVERGENCE_CHOICES,
    ON_UNCONVERGED_CHOICES,
    RELAX_CHOICES,
    AdaptiveBudget,
    Auto,
    Budget,
    Guard,
    Implicit,
)
from .datasets import LOADERS, SYNTHETIC_DEFAULT_LENGTH


def _opt(default: Any, helptext: str, *choices: str) -> Any:
    """A config field with its --help sentence (and, for a string, its legal values)."""
    metadata: dict[str, Any] = {"help": helptext}
    if choices:
        metadata["choices"] = choices
    return field(default=default, metadata=metadata)


# Fields that do not change what a run computes: a resumed run may give them anew.
NOT_TRAINING = ("threads", "timeout")

# What a run did before a field existed, where that differs from the field's default now.
BEFORE_FIELD = {
    "schedule": "constant",
    "coarse": "implicit",
    "pool": "last",
    "warmup": 0.0,
    "update_bias": 0.0,
}

# --recipe presets: option values under the ones given on the command line.
RECIPES = {
    # Moon & Cyr 2022 (TorchBraid): the implicit GRU, 3 levels, coarsening 4, 2 forward FCF
    # cycles and 1 adjoint cycle with F-relaxation, no fallback; coarse steps inject the
    # gates at their interval's start, as in their code.
    "torchbraid": dict(
        solver="mgrit",
        cell="implicit",
        levels=3,
        cfactor=4,
        relax="FCF",
        coarse="implicit",
        coarse_gates="inject",
        budget_forward=2,
        budget_backward=1,
        budget_backward_relax="F",
    ),
    # The same budget with this library's defaults: classic cell, cfactor auto, secant
    # coarse correction, every level's relaxation FCF; adaptive since 2026-12-05: at least
    # 2/1 cycles, more where the gradient's estimated error would pass 0.1 (the fixed one
    # fell far behind serial training on ArrowHead and OSULeaf with a max-pooled head,
    # docs/measurements.md, "Adaptive-budget training"); --budget-theta none: the fixed 2/1.
    "budget": dict(solver="mgrit", budget_forward=2, budget_backward=1, budget_theta=0.1),
}


def with_recipe(overrides: dict) -> dict:
    """The options of ``overrides["recipe"]`` (if any) under those given explicitly (an
    unknown recipe is refused by :class:`TrainConfig`)."""
    return {**RECIPES.get(overrides.get("recipe"), {}), **overrides}


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on. Stored as config.json in the run folder and in
    every checkpoint; a resumed run must match it (but for :data:`NOT_TRAINING`)."""

    dataset: str = _opt(
        "smnist",
        f"dataset: a built-in one ({', '.join(LOADERS)}) or npz:PATH, your own arrays: "
        "x_train, x_test (N, T, F) or (N, T); y_train, y_test (N,) integer labels (other "
        "values than 0..K-1 become classes 0..K-1 in sorted order); for unequal lengths "
        "lengths_train, lengths_test (N,) integers in 1..T (steps past a length are padding, "
        "NaN allowed there)",
    )
    recipe: Optional[str] = _opt(
        None,
        "a preset whose options apply under the ones given: torchbraid (the paper's "
        "fixed-budget training: implicit cell, 3 levels, cfactor 4, 2 forward / 1 adjoint "
        "cycles) or budget (at least the same cycles with this library's defaults, more "
        "where the gradient's estimated error would pass 0.1: --budget-theta none for the "
        "fixed 2/1)",
    )
    length: Optional[int] = _opt(
        None,
        "sequence length T of the synthetic tasks adding and recall "
        f"(default there: {SYNTHETIC_DEFAULT_LENGTH}); refused for real data sets",
    )
    max_train: Optional[int] = _opt(None, "train on the first N training sequences only")
    max_test: Optional[int] = _opt(None, "evaluate on the first N test sequences only")
    model: str = _opt(
        "gru",
        "the recurrent layers: gru (mgrit_gru.GRU) or lstm (mgrit_gru.LSTM: the same solver "
        "options but the GRU-only --cell implicit, --coarse implicit and --budget-gradient "
        "unrolled)",
        "gru",
        "lstm",
    )
    hidden: int = _opt(64, "hidden units per recurrent layer and direction")
    proj_size: int = _opt(
        0,
        "--model lstm only: each layer's output h of this many values, projected from its "
        "hidden units (torch.nn.LSTM's proj_size; smaller than --hidden); 0: no projection",
    )
    layers: int = _opt(1, "stacked recurrent layers")
    bidirectional: bool = _opt(False, "a second direction that reads the sequence backward")
    dropout: float = _opt(
        0.0,
        "dropout probability on the outputs of every recurrent layer but the last (needs "
        "--layers >= 2, as in torch.nn.GRU)",
    )
    update_bias: float = _opt(
        2.0,
        "added at initialisation to every layer's update-gate bias (GRU: b_hz; LSTM: the "
        "forget gate's b_hf): the initial network then keeps its state longer (sigmoid(2) = "
        "0.88 of it per step), which shortens the loss plateau of long sequences; 0: torch's "
        "initialisation",
    )
    cell: str = _opt(
        "classic",
        "the GRU's update: classic (torch.nn.GRU) or implicit (Moon & Cyr 2022)",
        "classic",
        "implicit",
    )
    pool: str = _opt(
        "mean",
        "what the classifier's head reads: the last state, or the mean or max of the last "
        "layer's outputs over each sequence's steps",
        "last",
        "mean",
        "max",
    )
    solver: str = _opt(
        "auto",
        "how the recurrent layers are solved: auto (MGRIT or the serial solve per layer and "
        "pass, whichever the cost model says is faster), mgrit (always MGRIT), serial (exact "
        "sequential, same kernels) or torch (torch.nn.GRU / torch.nn.LSTM, as a reference)",
        "auto",
        "mgrit",
        "serial",
        "torch",
    )
    cfactor: Union[int, str] = _opt(
        "auto",
        "MGRIT chunk length (coarsening factor, an int >= 2) or auto (chosen per call from "
        "T, batch and hidden size)",
    )
    levels: Union[int, str] = _opt(
        "auto", "MGRIT time grids (an int; auto: coarsen until <= cfactor coarse steps)"
    )
    relax: str = _opt(
        "FCF", f"MGRIT relaxation: F followed by CF repeated ({', '.join(RELAX_CHOICES)}, ...)"
    )
    coarse: str = _opt(
        "secant",
        "MGRIT's coarse correction: implicit GRU steps, frozen-gate chunk maps, or those with "
        "a multisecant correction",
        *COARSE_CHOICES,
    )
    tol: Union[float, str] = _opt(
        "auto",
        "MGRIT forward tolerance on the relative residual (largest C-point residual / the "
        "states' size there); auto: 1e-5 in float32, the rounding floor in float64",
    )
    max_iters: Union[int, str] = _opt(
        "auto", "cap on MGRIT forward cycles per call (auto: 10 for 1e-5, 2 per digit more)"
    )
    backward_tol: Union[float, str, None] = _opt(
        None, "adjoint tolerance, the same kind of relative residual (none: --tol)"
    )
    backward_max_iters: Union[int, str, None] = _opt(
        None, "cap on adjoint cycles per call (none: --max-iters)"
    )
    coarse_gates: str = _opt(
        "average",
        "what a coarse implicit step reads: the input gates averaged over its interval, or "
        "injected from its first step",
        *COARSE_GATES_CHOICES,
    )
    patience: int = _opt(
        4, "MGRIT cycles without a new smallest residual before a solve counts as diverged"
    )
    cost_guard: bool = _opt(
        False,
        "with --solver mgrit, stop a solve once finishing it is predicted to cost more than "
        "the serial solve, and solve serially (--solver auto always does)",
    )
    on_divergence: str = _opt(
        "fallback",
        "a diverging (or cost-stopped) MGRIT solve: fall back to serial; also skip MGRIT in "
        "the next 1, 2, 4 ... 64 calls (backoff); or stop",
        *ON_DIVERGENCE_CHOICES,
    )
    on_unconverged: str = _opt(
        "fallback",
        "an MGRIT solve at --max-iters above --tol: fall back to serial (warns once), keep "
        "its result (warn), or stop (raise)",
        *ON_UNCONVERGED_CHOICES,
    )
    budget_forward: Optional[int] = _opt(
        None,
        "train with a fixed number of forward MGRIT cycles instead of --tol (the paper's "
        "way; none: to tolerance); needs --budget-backward too",
    )
    budget_backward: Optional[int] = _opt(None, "fixed number of adjoint cycles of a budget")
    budget_backward_relax: Optional[str] = _opt(
        None, "the adjoint's relaxation under a budget (none: --relax)"
    )
    budget_gradient: str = _opt(
        "adjoint",
        "a budget's gradient: the adjoint at the inexact states (the paper's) or the exact "
        "gradient of the budgeted forward (unrolled through its cycles)",
        *GRADIENT_CHOICES,
    )
    budget_clamp: bool = _opt(
        False,
        "under a budget, clamp the C-points to [-1, 1] after each forward coarse correction "
        "(--budget-clamp)",
    )
    budget_theta: Optional[float] = _opt(
        None,
        "an adaptive budget: each solve's cycles chosen so that the gradient's estimated "
        "relative error stays below this bound (e.g. 0.1; --budget-forward/--budget-backward "
        "are then the least cycles); none: the fixed budget, which warns when its estimate "
        "stays above 0.1",
    )
    budget_max_cycles: int = _opt(8, "an adaptive budget's cap on the cycles of one solve")
    budget_check_every: int = _opt(
        16,
        "an adaptive budget's calls of a layer and pass between two exact checks (a serial "
        "solve beside the budget's, which calibrates its error estimate)",
    )
    eval_serial: bool = _opt(
        True,
        "a budget run also tests its weights with the exact serial solve each epoch "
        "(--no-eval-serial: only with its budget)",
    )
    keep_gates: bool = _opt(
        True, "keep the gates for the backward (--no-keep-gates: recompute them)"
    )
    early_exit: bool = _opt(
        True,
        "end a relaxation sweep once its chunks have forgotten their new start "
        "(--no-early-exit: run every sweep to the end)",
    )
    optimizer: str = _opt("adam", "the optimiser", "adam", "sgd", "rmsprop")
    lr: float = _opt(2e-3, "learning rate (the peak of the schedule)")
    warmup: float = _opt(
        1.0,
        "epochs of linear learning-rate warm-up from 0 at the start of the run (multiplies "
        "--schedule; 0: none)",
    )
    schedule: str = _opt(
        "cosine",
        "learning-rate schedule over the run's steps: cosine (from --lr down to 0 at the last "
        "step of --epochs) or constant",
        "cosine",
        "constant",
    )
    weight_decay: float = _opt(0.0, "L2 weight decay of the optimiser (0: none)")
    clip: float = _opt(1.0, "clip the gradient's global norm to this (0: off)")
    epochs: int = _opt(20, "training epochs (with --resume: train on up to this many)")
    batch_size: int = _opt(32, "sequences per training step")
    seed: int = _opt(0, "seed of the initial weights, the data order and dropout")
    device: str = _opt("cpu", "torch device: cpu or cuda[:N]")
    threads: Optional[int] = _opt(
        2, "torch CPU threads (none: torch's default, usually one per core)"
    )
    time_parallel: int = _opt(
        1, "ranks sharing each sequence in time (run under torchrun --nproc-per-node P)"
    )
    timeout: float = _opt(
        60.0, "seconds a time-parallel rank waits for the others before it fails and names them"
    )

    def __post_init__(self) -> None:
        positive = ["hidden", "layers", "epochs", "batch_size", "time_parallel", "patience"]
        if self.cfactor != "auto":
            positive.append("cfactor")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{_flag(name)} must be a positive integer, got {value!r}")
        if isinstance(self.proj_size, bool) or not isinstance(self.proj_size, int):
            raise ValueError(f"--proj-size must be an integer, got {self.proj_size!r}")
        if self.proj_size and self.model != "lstm":
            raise ValueError("--proj-size is for --model lstm only (torch.nn.GRU has none)")
        if not 0 <= self.proj_size < self.hidden:
            raise ValueError(
                f"--proj-size must lie in [0, --hidden) = [0, {self.hidden}), got {self.proj_size}"
            )
        for name in ("length", "max_train", "max_test", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"--{_flag(name)} must be a positive integer, got {value!r}")
        if not isinstance(self.update_bias, (int, float)) or not math.isfinite(self.update_bias):
            raise ValueError(f"--update-bias must be a finite number, got {self.update_bias!r}")
        for name in ("lr", "warmup", "weight_decay", "clip", "dropout", "timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"--{_flag(name)} must be a finite number >= 0, got {value!r}")
        if self.lr == 0:
            raise ValueError("--lr must be > 0")
        if self.timeout == 0:
            raise ValueError("--timeout must be > 0")
        if self.dropout >= 1:
            raise ValueError(f"--dropout must be < 1, got {self.dropout}")
        for f in fields(self):
            legal = f.metadata.get("choices")
            if legal and getattr(self, f.name) not in legal:
                raise ValueError(
                    f"--{_flag(f.name)}: invalid value {getattr(self, f.name)!r}; choose one of "
                    f"{', '.join(legal)}"
                )
        if self.recipe is not None and self.recipe not in RECIPES:
            raise ValueError(
                f"--recipe: invalid value {self.recipe!r}; choose one of {', '.join(RECIPES)}"
            )
        if (self.budget_forward is None) != (self.budget_backward is None):
            raise ValueError("--budget-forward and --budget-backward go together")
        if self.budget_forward is not None and self.solver not in ("mgrit", "serial", "torch"):
            raise ValueError(
                "a budget (--budget-forward/--budget-backward) needs --solver mgrit: the "
                "automatic choice solves to a tolerance"
            )
        if self.budget_theta is not None and self.budget_forward is None:
            raise ValueError(
                "--budget-theta (an adaptive budget) needs --budget-forward and "
                "--budget-backward (its least cycles) or --recipe budget"
            )
        if self.budget_theta is not None and self.budget_gradient == "unrolled":
            source = ", set by --recipe budget" if self.recipe == "budget" else ""
            raise ValueError(
                f"--budget-gradient unrolled differentiates a fixed budget's cycles; the "
                f"adaptive budget (--budget-theta {self.budget_theta}{source}) solves the "
                "adjoint: add --budget-theta none"
            )
        if self.model == "lstm":
            gru_only = {
                "--cell implicit": self.cell == "implicit",
                "--coarse implicit": self.coarse == "implicit" and self.solver != "serial",
                "--budget-gradient unrolled": self.budget is not None
                and self.budget_gradient == "unrolled",
            }
            asked = [flag for flag, given in gru_only.items() if given]
            if asked:
                source = f" (set by --recipe {self.recipe})" if self.recipe else ""
                verb = "is" if len(asked) == 1 else "are"
                raise ValueError(
                    f"--model lstm: {' and '.join(asked)}{source} {verb} for the GRU only "
                    "(the LSTM has no implicit step)"
                )
        self.solver_options()  # MGRIT validates its own fields
        if self.time_parallel > 1 and self.solver == "torch":
            raise ValueError("--time-parallel needs --solver mgrit or serial")

    @property
    def solver_run(self) -> str:
        """The solver the run actually uses: ``--solver auto`` across time-parallel ranks is
        MGRIT (the automatic choice is off there; the ranks must decide alike)."""
        if self.time_parallel > 1 and self.solver == "auto":
            return "mgrit"
        return self.solver

    @property
    def budget(self) -> Optional[Budget]:
        """The fixed cycle budget of a --budget-forward/--budget-backward run, else None."""
        if self.budget_forward is None or self.solver != "mgrit":
            return None
        if self.budget_theta is not None:
            return AdaptiveBudget(
                self.budget_forward,
                self.budget_backward,
                self.budget_backward_relax,
                self.budget_gradient,
                self.budget_clamp,
                theta=self.budget_theta,
                every=self.budget_check_every,
                max_forward=max(self.budget_max_cycles, self.budget_forward),
                max_backward=max(self.budget_max_cycles, self.budget_backward),
            )
        return Budget(
            self.budget_forward,
            self.budget_backward,
            self.budget_backward_relax,
            self.budget_gradient,
            self.budget_clamp,
        )

    def mgrit_options(self) -> MGRIT:
        return MGRIT(
            cfactor=self.cfactor,
            levels=self.levels,
            relax=self.relax,
            coarse=Implicit(self.coarse_gates) if self.coarse == "implicit" else self.coarse,
            tol=self.tol,
            max_iters=self.max_iters,
            backward_tol=self.backward_tol,
            backward_max_iters=self.backward_max_iters,
            guard=Guard(self.patience, self.cost_guard),
            on_divergence=self.on_divergence,
            on_unconverged=self.on_unconverged,
            budget=self.budget,
            keep_gates=self.keep_gates,
            early_exit=self.early_exit,
        )

    def solver_options(self):
        """The GRU's ``solver=``: an MGRIT or Auto object (torch: the serial one, unused)."""
        if self.solver == "serial":
            return MGRIT.serial().replace(keep_gates=self.keep_gates)
        if self.solver == "auto":
            return Auto(self.mgrit_options())
        return self.mgrit_options()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """A stored config. Fields it lacks get what runs did before they existed (for a
        field whose default has changed since: ``BEFORE_FIELD``), else their default."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}")
        return cls(**{**{k: v for k, v in BEFORE_FIELD.items() if k not in data}, **data})

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


def torch_module_name(model: str) -> str:
    """torch's module of a ``--model``: ``torch.nn.GRU`` or ``torch.nn.LSTM``."""
    return "torch.nn." + model.upper()


def parse_device(text: str):
    """``--device`` text -> torch.device, with a ValueError that names the problem."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise ValueError(f"--device {text!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here")
    return device


def same_device(a: str, b: str) -> bool:
    """Whether two --device texts name the same device ("cpu" and "cpu:0", "cuda" and
    "cuda:0" do)."""
    import torch

    try:
        da, db = torch.device(a), torch.device(b)
    except RuntimeError:
        return a == b
    if da.type != db.type:
        return False
    return da.type == "cpu" or (da.index or 0) == (db.index or 0)


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _parse_optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)

    return parse


def int_or_auto(text: str) -> Union[int, str]:
    return "auto" if text == "auto" else int(text)


def float_or_auto(text: str) -> Union[float, str]:
    return "auto" if text == "auto" else float(text)


# --help's groups: the field that opens each (the fields follow in the dataclass's order).
GROUPS = {
    "dataset": "data",
    "model": "model",
    "solver": "solver",
    "budget_forward": "cycle budget (instead of a tolerance): fixed, or adaptive (--budget-theta)",
    "eval_serial": "solver details",
    "optimizer": "optimisation",
    "device": "machine and time-parallel ranks",
}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per TrainConfig field, in the named groups of ``GROUPS``. Flags not given
    stay absent from the namespace, so the caller can tell which were given (for --resume)."""
    group = parser
    for f in fields(TrainConfig):
        if f.name in GROUPS:
            group = parser.add_argument_group(GROUPS[f.name])
        flag = "--" + _flag(f.name)
        default = f.default
        helptext = f.metadata.get("help", "")
        shown = "none" if default is None else default
        helptext = f"{helptext} (default: {shown})".strip()
        if f.type in ("bool", bool):
            group.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=helptext,
            )
            continue
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "help": helptext}
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        kind = {"int": int, "float": float, "str": str}
        if f.name in ("levels", "cfactor", "max_iters", "backward_max_iters"):
            kwargs["type"] = _parse_optional(int_or_auto) if default is None else int_or_auto
        elif f.name in ("tol", "backward_tol"):
            kwargs["type"] = _parse_optional(float_or_auto) if default is None else float_or_auto
        elif str(f.type).startswith("Optional["):
            inner = str(f.type)[len("Optional[") : -1]
            kwargs["type"] = _parse_optional(kind[inner])
        else:
            kwargs["type"] = kind[str(f.type)]
        group.add_argument(flag, **kwargs)


def given_overrides(args: argparse.Namespace) -> dict:
    """The TrainConfig fields set on the command line."""
    return {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
