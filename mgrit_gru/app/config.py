"""The training configuration: one frozen dataclass; the CLI's flags are generated from it."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

from ..options import COARSE_GATES_CHOICES, MGRIT, ON_DIVERGENCE_CHOICES, RELAX_CHOICES


def _choice(*values: str) -> Any:
    return {"choices": values}


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on. Stored as config.json in the run folder and in
    every checkpoint; a resumed run must match it."""

    dataset: str = field(default="smnist", metadata={"help": "dataset name or npz:PATH"})
    length: Optional[int] = field(default=None, metadata={"help": "T of the synthetic tasks"})
    max_train: Optional[int] = field(default=None, metadata={"help": "use the first N train"})
    max_test: Optional[int] = field(default=None, metadata={"help": "use the first N test"})
    hidden: int = 64
    layers: int = 1
    bidirectional: bool = False
    dropout: float = 0.0
    cell: str = field(default="classic", metadata=_choice("classic", "implicit"))
    solver: str = field(default="mgrit", metadata=_choice("mgrit", "serial", "torch"))
    cfactor: Union[int, str] = field(
        default=32, metadata={"help": "int >= 2 or auto (chosen per call from T and batch)"}
    )
    levels: Union[int, str] = field(default="auto", metadata={"help": "int or auto"})
    relax: str = field(default="FCF", metadata=_choice(*RELAX_CHOICES))
    tol: float = 1e-5
    max_iters: int = 10
    backward_tol: Optional[float] = None
    backward_max_iters: Optional[int] = None
    coarse_gates: str = field(default="average", metadata=_choice(*COARSE_GATES_CHOICES))
    on_divergence: str = field(
        default="fallback",
        metadata={
            **_choice(*ON_DIVERGENCE_CHOICES),
            "help": "a diverging MGRIT solve: fall back to serial; also skip MGRIT in the next "
            "1, 2, 4 ... 64 calls (backoff); or stop",
        },
    )
    keep_gates: bool = field(
        default=True,
        metadata={"help": "keep the gates for the backward (--no-keep-gates: recompute them)"},
    )
    early_exit: bool = field(
        default=True,
        metadata={
            "help": "end a relaxation sweep once its chunks have forgotten their new start "
            "(--no-early-exit: run every sweep to the end)"
        },
    )
    optimizer: str = field(default="adam", metadata=_choice("adam", "sgd", "rmsprop"))
    lr: float = 5e-3
    weight_decay: float = 0.0
    clip: float = field(default=1.0, metadata={"help": "gradient-norm clip (0: off)"})
    epochs: int = 10
    batch_size: int = 32
    seed: int = 0
    device: str = "cpu"
    threads: Optional[int] = field(default=2, metadata={"help": "torch threads (none: default)"})
    time_parallel: int = field(
        default=1, metadata={"help": "ranks sharing each sequence in time (run under torchrun)"}
    )

    def __post_init__(self) -> None:
        positive = ["hidden", "layers", "epochs", "batch_size", "time_parallel"]
        if self.cfactor != "auto":
            positive.append("cfactor")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{_flag(name)} must be a positive integer, got {value!r}")
        for name in ("length", "max_train", "max_test", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"--{_flag(name)} must be a positive integer, got {value!r}")
        for name in ("lr", "weight_decay", "clip", "dropout", "tol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"--{_flag(name)} must be a finite number >= 0, got {value!r}")
        if self.lr == 0:
            raise ValueError("--lr must be > 0")
        if self.dropout >= 1:
            raise ValueError(f"--dropout must be < 1, got {self.dropout}")
        for f in fields(self):
            legal = f.metadata.get("choices")
            if legal and getattr(self, f.name) not in legal:
                raise ValueError(
                    f"--{_flag(f.name)}: invalid value {getattr(self, f.name)!r}; choose one of "
                    f"{', '.join(legal)}"
                )
        self.solver_options()  # MGRIT validates its own fields
        if self.time_parallel > 1 and self.solver == "torch":
            raise ValueError("--time-parallel needs --solver mgrit or serial")
        if self.time_parallel > 1 and self.cfactor == "auto":
            raise ValueError("--time-parallel needs an integer --cfactor, not auto")

    def solver_options(self) -> MGRIT:
        if self.solver == "serial":
            return MGRIT.serial().replace(keep_gates=self.keep_gates)
        return MGRIT(
            cfactor=self.cfactor,
            levels=self.levels,
            relax=self.relax,
            tol=self.tol,
            max_iters=self.max_iters,
            backward_tol=self.backward_tol,
            backward_max_iters=self.backward_max_iters,
            coarse_gates=self.coarse_gates,
            on_divergence=self.on_divergence,
            keep_gates=self.keep_gates,
            early_exit=self.early_exit,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}")
        return cls(**data)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


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


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _parse_optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)

    return parse


def int_or_auto(text: str) -> Union[int, str]:
    return "auto" if text == "auto" else int(text)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per TrainConfig field. Flags not given stay absent from the namespace, so
    the caller can tell which were given (for --resume)."""
    for f in fields(TrainConfig):
        flag = "--" + _flag(f.name)
        default = f.default
        helptext = f.metadata.get("help", "")
        helptext = f"{helptext} (default: {default})".strip()
        if f.type in ("bool", bool):
            parser.add_argument(
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
        if f.name in ("levels", "cfactor"):
            kwargs["type"] = int_or_auto
        elif str(f.type).startswith("Optional["):
            inner = str(f.type)[len("Optional[") : -1]
            kwargs["type"] = _parse_optional(kind[inner])
        else:
            kwargs["type"] = kind[str(f.type)]
        parser.add_argument(flag, **kwargs)


def given_overrides(args: argparse.Namespace) -> dict:
    """The TrainConfig fields set on the command line."""
    return {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
