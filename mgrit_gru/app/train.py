"""Training GRU and LSTM sequence classifiers: the loop, metrics, atomic checkpoints, exact
resume."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..layer.control import budget_memory
from ..layer.module import Recurrent
from ..lstm.module import LSTM
from ..module import GRU
from ..options import MGRIT
from .config import NOT_TRAINING, TrainConfig, parse_device, same_device
from .datasets import SYNTHETIC, Dataset, load

CHECKPOINT = "checkpoint.pt"
FORMAT = "mgrit-gru-checkpoint-1"


class RunError(ValueError):
    """A run that cannot start or continue: bad run folder, checkpoint or option."""


class Interrupted(Exception):
    """Training stopped at a user's Ctrl-C, after saving where it was."""


class Classifier(nn.Module):
    """GRU or LSTM layers (``--model``), then a linear head on the last layer's final state h
    (both directions), or on the mean or max of its outputs over each sequence's own steps
    (``--pool``)."""

    def __init__(self, cfg: TrainConfig, features: int, classes: int, time_group=None) -> None:
        super().__init__()
        shape = dict(batch_first=True, dropout=cfg.dropout, bidirectional=cfg.bidirectional)
        args = (features, cfg.hidden, cfg.layers)
        solver = cfg.solver_options()
        if cfg.model == "lstm":
            shape["proj_size"] = cfg.proj_size
            rnn = LSTM(*args, **shape, solver=solver, time_group=time_group)
        else:
            rnn = GRU(*args, **shape, solver=solver, cell=cfg.cell, time_group=time_group)
        self.time_group, self.pool = time_group, cfg.pool
        if cfg.solver == "torch":  # same initial weights as the MGRIT/serial models
            if cfg.cell != "classic":
                raise RunError("--solver torch supports only --cell classic")
            with torch.random.fork_rng(devices=[]):  # leave the head's init unchanged
                torch_rnn = rnn._TORCH(*args, **shape)
            torch_rnn.load_state_dict(rnn.state_dict())
            rnn = torch_rnn
        self.rnn = rnn
        self.directions = 2 if cfg.bidirectional else 1
        self.head = nn.Linear((cfg.proj_size or cfg.hidden) * self.directions, classes)
        if cfg.update_bias:  # a longer initial memory: rows H..2H, the GRU's z, the LSTM's f
            with torch.no_grad():
                for name, p in self.rnn.named_parameters():
                    if name.startswith("bias_hh"):
                        p[cfg.hidden : 2 * cfg.hidden] += cfg.update_bias

    def forward(self, x: Tensor, lengths: Optional[Tensor] = None) -> Tensor:
        if self.time_group is not None:  # this rank's slice of time, the global lengths
            from ..distributed import scatter_time, time_max, time_mean

            m = self.rnn.time_cfactor(x.shape[1], x.shape[0])  # the same on every rank
            local = scatter_time(x, self.time_group, m, dim=1)
            y, h_n = self.rnn(local, lengths=lengths)
            if self.pool in ("mean", "max"):  # over every rank's steps
                reduce = time_mean if self.pool == "mean" else time_max
                return self.head(reduce(y, self.time_group, x.shape[1], m, lengths))
        elif lengths is None:
            y, h_n = self.rnn(x)
        elif isinstance(self.rnn, Recurrent):
            y, h_n = self.rnn(x, lengths=lengths)
        else:
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            y, h_n = self.rnn(packed)
            y, _ = pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])
        if isinstance(h_n, tuple):  # an LSTM's (h_n, c_n): the head reads h
            h_n = h_n[0]
        return self.head(pooled(self.pool, y, h_n, lengths, self.directions))


def pooled(pool: str, y: Tensor, h_n: Tensor, lengths: Optional[Tensor], directions: int):
    """The classifier's features ``(B, D * H)``: the last layer's final state (``"last"``),
    or the ``"mean"`` / ``"max"`` of its outputs ``y`` ``(B, T, D * H)`` over each sequence's
    own steps (padded steps excluded)."""
    B = y.shape[0]
    if pool == "last":
        return h_n[-directions:].transpose(0, 1).reshape(B, -1)
    if lengths is None:
        return y.mean(1) if pool == "mean" else y.amax(1)
    valid = torch.arange(y.shape[1], device=y.device)[None, :] < lengths.to(y.device)[:, None]
    if pool == "mean":
        total = (y * valid.unsqueeze(-1).to(y.dtype)).sum(1)
        return total / lengths.to(y.device, y.dtype).unsqueeze(-1)
    return y.masked_fill(~valid.unsqueeze(-1), float("-inf")).amax(1)


def _subset(data: Dataset, cfg: TrainConfig) -> Dataset:
    if cfg.max_train:
        data.x_train, data.y_train = data.x_train[: cfg.max_train], data.y_train[: cfg.max_train]
        if data.len_train is not None:
            data.len_train = data.len_train[: cfg.max_train]
    if cfg.max_test:
        data.x_test, data.y_test = data.x_test[: cfg.max_test], data.y_test[: cfg.max_test]
        if data.len_test is not None:
            data.len_test = data.len_test[: cfg.max_test]
    if cfg.batch_size > len(data.y_train):
        raise RunError(
            f"--batch-size {cfg.batch_size} is larger than the training set "
            f"({len(data.y_train)} sequences)"
        )
    return data


def load_data(cfg: TrainConfig) -> Dataset:
    return _subset(load(cfg.dataset, seed=cfg.seed, length=cfg.length), cfg)


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    kinds = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop}
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    return kinds[cfg.optimizer](params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _device(cfg: TrainConfig) -> torch.device:
    return parse_device(cfg.device)


@dataclass
class EpochStats:
    """Solver statistics accumulated over the batches of an epoch."""

    fwd_iters: float = 0.0
    bwd_iters: float = 0.0
    fwd_iters_max: int = 0
    bwd_iters_max: int = 0
    fwd_res_max: float = 0.0  # of the solves MGRIT gave (an abandoned try's is not used)
    bwd_res_max: float = 0.0
    fallbacks: int = 0  # batches with an MGRIT try that fell back to the serial solve
    fell_back: tuple = (0, 0)  # forward, backward MGRIT tries that fell back
    batches: int = 0
    last_fwd_residuals: tuple = ()
    last_bwd_residuals: tuple = ()
    solves: tuple = (0, 0)  # forward, backward solves (layers x directions per batch)
    by_mgrit: tuple = (0, 0)  # of them, those whose result came from MGRIT
    cost_stops: int = 0  # MGRIT solves that the cost guard stopped

    def add(self, stats) -> None:
        if stats is None:
            return
        self.batches += 1
        self.fwd_iters += stats.forward_iterations
        self.bwd_iters += stats.backward_iterations
        self.fwd_iters_max = max(self.fwd_iters_max, stats.forward_iterations)
        self.bwd_iters_max = max(self.bwd_iters_max, stats.backward_iterations)
        self.fwd_res_max = max(self.fwd_res_max, mgrit_residual(stats.forward))
        self.bwd_res_max = max(self.bwd_res_max, mgrit_residual(stats.backward))
        self.fallbacks += int(any(s.abandoned for s in stats.solves))
        passes = (stats.forward, stats.backward)
        self.fell_back = tuple(
            a + sum(s.abandoned for s in p) for a, p in zip(self.fell_back, passes)
        )
        self.solves = tuple(a + len(p) for a, p in zip(self.solves, passes))
        self.by_mgrit = tuple(a + sum(s.by_mgrit for s in p) for a, p in zip(self.by_mgrit, passes))
        self.cost_stops += sum(s.stopped == "cost" for s in stats.solves)
        if stats.forward:
            self.last_fwd_residuals = stats.forward[-1].residuals
        if stats.backward:
            self.last_bwd_residuals = stats.backward[-1].residuals

    def share(self, i: int) -> float:
        """The share of forward (0) or backward (1) solves that MGRIT gave."""
        return self.by_mgrit[i] / self.solves[i] if self.solves[i] else 0.0

    def as_dict(self) -> dict:
        n = max(self.batches, 1)
        return {
            "fwd_iters_mean": self.fwd_iters / n,
            "fwd_iters_max": self.fwd_iters_max,
            "bwd_iters_mean": self.bwd_iters / n,
            "bwd_iters_max": self.bwd_iters_max,
            "fwd_residual_max": self.fwd_res_max,
            "bwd_residual_max": self.bwd_res_max,
            "fallbacks": self.fallbacks,
            "fwd_fell_back": self.fell_back[0],
            "bwd_fell_back": self.fell_back[1],
            "mgrit_share_fwd": self.share(0),
            "mgrit_share_bwd": self.share(1),
            "cost_stops": self.cost_stops,
            "fwd_residuals_last_batch": list(self.last_fwd_residuals),
            "bwd_residuals_last_batch": list(self.last_bwd_residuals),
        }


def mgrit_residual(solves) -> float:
    """The largest final residual of the solves whose result MGRIT gave (0: none)."""
    return max((s.residual for s in solves if s.by_mgrit), default=0.0)


def mgrit_figures(solves) -> str:
    """A pass's solves of one call for the progress bar: MGRIT's cycles and residual where
    MGRIT gave the result, else how it was solved."""
    used = [s for s in solves if s.by_mgrit]
    if used:
        return f"{max(s.iterations for s in used)}it {mgrit_residual(used):.0e}"
    return "fell back" if any(s.abandoned for s in solves) else "serial"


def learning_rate(cfg: TrainConfig, step: int, per_epoch: int) -> float:
    """The learning rate of training step ``step`` (counted from 0 over the whole run): a
    function of the step alone, so a resumed run follows the same schedule. Cosine decays
    from --lr to 0 over --epochs (a run resumed with more epochs stretches the rest); a
    --warmup of w epochs multiplies it by a ramp that reaches 1 after w epochs' steps."""
    rate = cfg.lr
    if cfg.schedule == "cosine":
        total = max(cfg.epochs * per_epoch, 1)
        rate = 0.5 * cfg.lr * (1.0 + math.cos(math.pi * min(step, total) / total))
    ramp = cfg.warmup * per_epoch
    return rate * min(1.0, (step + 1) / ramp) if ramp > 0 else rate


def _batches(n: int, size: int, order: Optional[Tensor] = None):
    idx = torch.arange(n) if order is None else order
    for start in range(0, n, size):
        yield idx[start : start + size]


def _lengths(lengths: Optional[Tensor], rows: Tensor, device) -> Optional[Tensor]:
    return None if lengths is None else lengths[rows].to(device)


@torch.no_grad()
def evaluate(model: Classifier, x, y, lengths, batch_size: int, device) -> tuple[float, float]:
    model.eval()
    total_loss, correct = 0.0, 0
    for rows in _batches(len(y), batch_size):
        logits = model(x[rows].to(device), _lengths(lengths, rows, device))
        target = y[rows].to(device)
        total_loss += F.cross_entropy(logits, target, reduction="sum").item()
        correct += int((logits.argmax(1) == target).sum())
    return total_loss / len(y), correct / len(y)


def evaluate_serially(model: Classifier, data, cfg: TrainConfig, device) -> tuple[float, float]:
    """:func:`evaluate` with the model's recurrent layers solved exactly (its own solver
    untouched)."""
    with model.rnn.using(MGRIT.serial()):
        return evaluate(model, data.x_test, data.y_test, data.len_test, cfg.batch_size, device)


# -- run folder -----------------------------------------------------------------------------


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give; mkstemp's own is 0600


def atomic_write_bytes(path: Path, write: Callable) -> None:
    """Write via a temporary file in the same folder, fsync, then rename: a crash leaves the
    old file or the new one, never half of one. The file gets the permissions of a plain
    ``open()`` (readable by the group under the usual umask)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, data) -> None:
    atomic_write_bytes(path, lambda f: f.write(json.dumps(data, indent=1).encode()))


def write_metrics(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    atomic_write_bytes(path, lambda f: f.write(text.encode()))


def save_checkpoint(
    run: Path, cfg, model, optimizer, epoch, history, partial=None, labels=None
) -> None:
    """``epoch`` whole epochs done; ``partial``: the position inside the next one (an
    interrupted epoch: its next batch and what it has summed so far), or None. ``labels``:
    the data set's labels of classes 0..K-1 where they differ from 0..K-1 (npz), or None."""
    state = {
        "format": FORMAT,
        "config": cfg.to_dict(),
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "history": history,
    }
    if isinstance(model.rnn, Recurrent):  # what solver="auto" has learnt: a resume continues it
        state["solver_state"] = model.rnn.solver_state()
    if partial is not None:
        state["partial"] = partial
    if labels is not None:
        state["label_values"] = labels
    atomic_write_bytes(run / CHECKPOINT, lambda f: torch.save(state, f))


def load_checkpoint(run: Path) -> dict:
    path = run / CHECKPOINT
    if not path.is_file():
        raise RunError(f"no checkpoint in {run} (expected {path})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch's advice (weights_only=False) is wrong for a damaged file
        raise RunError(
            f"corrupted checkpoint {path}: it cannot be read as a checkpoint "
            f"({type(exc).__name__}); restore it from a copy or start the run anew"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise RunError(f"{path} is not a {FORMAT} file")
    missing = {"config", "epoch", "model", "optimizer", "rng", "history"} - set(state)
    if missing:
        raise RunError(f"corrupted checkpoint {path}: missing {sorted(missing)}")
    return state


def read_config(run: Path) -> TrainConfig:
    path = run / "config.json"
    if not path.is_file():
        raise RunError(f"{run} is not a run folder (no config.json)")
    try:
        return TrainConfig.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, ValueError, TypeError) as exc:
        raise RunError(f"{path}: unreadable config ({exc})") from exc


FREE_ON_RESUME = ("epochs", *NOT_TRAINING)


def resume_config(run: Path, overrides: dict) -> TrainConfig:
    """The stored config of ``run``. --epochs may change (to train longer), and so may the
    options that do not change what is computed (--threads, --timeout, the spelling of
    --device; the cost model keeps pricing at the run's first thread count, recorded in its
    calibration.json); any other option must match the run's."""
    cfg = read_config(run)
    clash = {
        k: v
        for k, v in overrides.items()
        if k not in FREE_ON_RESUME
        and getattr(cfg, k) != v
        and not (k == "device" and same_device(cfg.device, v))
    }
    if clash:
        listed = ", ".join(
            f"--{k.replace('_', '-')} {v} (run has {getattr(cfg, k)})" for k, v in clash.items()
        )
        raise RunError(f"--resume {run}: options differ from the run's config: {listed}")
    return cfg.replace(**{k: v for k, v in overrides.items() if k in FREE_ON_RESUME})


def _training_part(config: dict) -> dict:
    """A config's fields that decide what a run computes."""
    skip = FREE_ON_RESUME + ("device",)
    return {k: v for k, v in config.items() if k not in skip}


def default_run_dir(cfg: TrainConfig, kind: Optional[str] = None) -> Path:
    """runs/DATASET-KIND-TIME; ``kind``: the run's solver unless given (compare: "compare")."""
    name = cfg.dataset.replace("npz:", "npz-").replace("/", "_")
    return Path("runs") / f"{name}-{kind or cfg.solver_run}-{time.strftime('%Y%m%d-%H%M%S')}"


# -- the loop -------------------------------------------------------------------------------


def train(
    cfg: TrainConfig,
    run: Path,
    *,
    resume: bool = False,
    log=print,
    progress: bool = True,
    stop_after: Optional[int] = None,
) -> list[dict]:
    """Train (or continue) the run in folder ``run``; returns the per-epoch metrics.
    ``stop_after``: return once that many epochs of the run are done (its checkpoint then
    continues exactly, as after Ctrl-C between epochs: ``compare`` interleaves runs so)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = _device(cfg)
    tg = _time_group(cfg)
    main = tg is None or tg.rank == 0  # the one process that writes files and logs
    if not main:
        progress, log = False, _quiet
    state = None
    if resume:
        state = load_checkpoint(run)
        try:  # a run from before a config field existed gets its default
            saved = TrainConfig.from_dict(state["config"])
        except (TypeError, ValueError) as exc:
            raise RunError(f"checkpoint in {run} holds an invalid config: {exc}") from exc
        if _training_part(saved.to_dict()) != _training_part(cfg.to_dict()) or not same_device(
            saved.device, cfg.device
        ):
            raise RunError(f"checkpoint in {run} was written by another config than config.json")
        done = int(state["epoch"]) + (1 if state.get("partial") else 0)
        if cfg.epochs < done:
            raise RunError(
                f"--resume {run}: the run has trained {done} epoch(s) already; --epochs "
                f"{cfg.epochs} would cut it short (give --epochs {done} or more)"
            )
    else:
        if run.exists() and not run.is_dir():
            raise RunError(f"--out {run}: a file of that name exists; name a folder")
        if (run / CHECKPOINT).exists():
            raise RunError(f"{run} already holds a run; use --resume {run} or another --out")
        if main:
            run.mkdir(parents=True, exist_ok=True)
    data = load_data(cfg)
    log(data.describe())
    labels = data.meta.get("label_values")  # class i is label labels[i] (npz), or None
    torch.manual_seed(cfg.seed)
    model = Classifier(cfg, data.features, data.num_classes, tg).to(device)
    optimizer = make_optimizer(cfg, model.parameters())
    history: list[dict] = []
    start = 0
    if state is not None:
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise RunError(f"checkpoint in {run} does not fit the model: {exc}") from exc
        torch.set_rng_state(state["rng"])
        if isinstance(model.rnn, Recurrent):
            model.rnn.load_solver_state(state.get("solver_state", {}))
        history, start = list(state["history"]), int(state["epoch"])
        partial = state.get("partial")
        if main:
            write_metrics(run / "metrics.jsonl", history)  # drop rows past the checkpoint
        if start >= cfg.epochs:
            log(f"{run}: already trained for {start} epochs")
    else:
        partial = None
    if main:
        write_json(run / "config.json", cfg.to_dict())
    with _StopOnCtrlC(enabled=tg is None) as ctrl_c:
        end = cfg.epochs if stop_after is None else min(cfg.epochs, stop_after)
        for epoch in range(start, end):
            row = _train_epoch(
                cfg, model, optimizer, data, epoch, device, progress, log, partial, ctrl_c
            )
            partial = None
            if "partial" in row:  # Ctrl-C: save the position inside this epoch, then stop
                save_checkpoint(run, cfg, model, optimizer, epoch, history, row["partial"], labels)
                raise Interrupted(
                    f"interrupted in epoch {epoch + 1} after {row['partial']['batch']} of "
                    f"{row['partial']['batches']} training steps; {run / CHECKPOINT} holds "
                    f"the run up to that step: continue with mgrit-gru train --resume {run}"
                )
            history.append(row)
            if main:
                save_checkpoint(run, cfg, model, optimizer, epoch + 1, history, labels=labels)
                write_metrics(run / "metrics.jsonl", history)
            if ctrl_c.requested:
                raise Interrupted(
                    f"interrupted after epoch {epoch + 1}, which {run / CHECKPOINT} holds: "
                    f"continue with mgrit-gru train --resume {run}"
                )
    return history


class _StopOnCtrlC:
    """While training, a first Ctrl-C asks the loop to stop after the current training step
    (it then saves its position); a second one stops at once, unsaved. Only in the main
    thread of a single process: time-parallel ranks must stop together, so there Ctrl-C
    keeps its usual effect."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._old = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\nCtrl-C: stopping after this training step and saving the run "
            "(Ctrl-C again stops at once, unsaved)",
            file=sys.stderr,
        )

    def __enter__(self) -> _StopOnCtrlC:
        if self.enabled:
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            signal.signal(signal.SIGINT, self._old)


def _quiet(*args, **kwargs) -> None:
    pass


def _time_group(cfg: TrainConfig):
    """The TimeGroup of a --time-parallel run (torchrun's environment), or None."""
    if cfg.time_parallel == 1:
        return None
    from ..distributed import init_time_parallel

    if not dist.is_initialized() and "RANK" not in os.environ:
        raise RunError(
            f"--time-parallel {cfg.time_parallel} runs under torchrun: torchrun "
            f"--nproc-per-node {cfg.time_parallel} -m mgrit_gru.cli train "
            f"--time-parallel {cfg.time_parallel} ..."
        )
    tg = init_time_parallel(timeout_s=cfg.timeout)
    if tg.size != cfg.time_parallel:
        raise RunError(f"--time-parallel {cfg.time_parallel} but {tg.size} processes started")
    return tg


def _train_epoch(
    cfg, model, optimizer, data, epoch, device, progress, log, partial=None, ctrl_c=None
) -> dict:
    """One epoch: its metrics row. ``partial``: resume inside the epoch where an interrupted
    run stopped. If ``ctrl_c`` asks to stop, the epoch ends after the current step and the
    row is ``{"partial": ...}``: the position and sums to resume from."""
    from tqdm import tqdm

    model.train()
    order = torch.randperm(
        len(data.y_train), generator=torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
    )
    solver = EpochStats()
    total_loss, correct, seen, first, before = 0.0, 0, 0, 0, 0.0
    if partial is not None:
        solver = EpochStats(**partial["solver"])
        total_loss, correct, seen = partial["loss_sum"], partial["correct"], partial["seen"]
        first, before = partial["batch"], partial["train_time_s"]
    start = time.perf_counter() - before
    batches = list(_batches(len(order), cfg.batch_size, order))
    memory = budget_memory(model.rnn) if cfg.budget is not None else None
    if memory is not None and partial is None:
        memory.take()  # this epoch's budget statistics from here (not the last evaluation's)
    bar = tqdm(
        batches,
        desc=f"epoch {epoch + 1}/{cfg.epochs}",
        disable=not progress,
        leave=True,
        mininterval=1.0,
        dynamic_ncols=True,
        initial=first,
    )
    for index, rows in enumerate(batches[first:], start=first):
        if ctrl_c is not None and ctrl_c.requested:
            bar.close()
            return {
                "partial": {
                    "batch": index,
                    "batches": len(batches),
                    "loss_sum": total_loss,
                    "correct": correct,
                    "seen": seen,
                    "train_time_s": time.perf_counter() - start,
                    "solver": dataclasses.asdict(solver),
                }
            }
        x = data.x_train[rows].to(device)
        target = data.y_train[rows].to(device)
        logits = model(x, _lengths(data.len_train, rows, device))
        loss = F.cross_entropy(logits, target)
        optimizer.zero_grad(set_to_none=True)
        tg = model.time_group
        if tg is None:
            loss.backward()
        else:  # every rank holds the same loss: backpropagate 1/P of it, then sum the head's
            (loss / tg.size).backward()
            for p in model.head.parameters():
                try:
                    dist.all_reduce(p.grad, group=tg.group)
                except RuntimeError as exc:  # a rank died or hangs: name it, as the solve does
                    raise tg.failed("the head's gradient sum", exc) from exc
        if cfg.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, epoch * len(batches) + index, len(batches))
        optimizer.step()
        if not math.isfinite(loss.item()):
            raise RunError(f"epoch {epoch + 1}: the loss became {loss.item()}; lower --lr")
        solver.add(getattr(model.rnn, "last_stats", None))
        total_loss += loss.item() * len(rows)
        correct += int((logits.argmax(1) == target).sum())
        seen += len(rows)
        elapsed = time.perf_counter() - start
        postfix = {
            "loss": f"{total_loss / seen:.3f}",
            "acc": f"{correct / seen:.3f}",
            "seq/s": f"{seen / elapsed:.0f}",
        }
        if solver.batches and cfg.solver != "serial":
            stats = model.rnn.last_stats
            postfix["fwd"] = mgrit_figures(stats.forward)
            postfix["bwd"] = mgrit_figures(stats.backward)
            postfix["mgrit"] = f"{100 * solver.share(0):.0f}%/{100 * solver.share(1):.0f}%"
        if memory is not None:  # the budget's estimated relative gradient error so far
            postfix["gerr"] = f"{memory.current()['grad_err_est']:.1e}"
        bar.set_postfix(postfix, refresh=False)
        bar.update()
    bar.close()
    train_time = time.perf_counter() - start
    budget_row = {}
    if memory is not None:  # cycles spent and the estimated gradient error, this epoch
        budget_row = {f"budget_{k}": v for k, v in memory.take().items()}
    eval_start = time.perf_counter()
    test_loss, test_acc = evaluate(
        model, data.x_test, data.y_test, data.len_test, cfg.batch_size, device
    )
    serial_eval = {}
    if cfg.budget is not None and cfg.eval_serial:  # the same weights, solved exactly
        loss_s, acc_s = evaluate_serially(model, data, cfg, device)
        serial_eval = {"test_loss_serial": loss_s, "test_acc_serial": acc_s}
    row = {
        "epoch": epoch + 1,
        "train_loss": total_loss / seen,
        "train_acc": correct / seen,
        "test_loss": test_loss,
        "test_acc": test_acc,
        "train_time_s": train_time,
        "eval_time_s": time.perf_counter() - eval_start,
        "seq_per_s": seen / train_time,
        **serial_eval,
        **solver.as_dict(),
        **budget_row,
    }
    log(
        f"epoch {epoch + 1}: train loss {row['train_loss']:.4f} acc {row['train_acc']:.3f} | "
        f"test loss {test_loss:.4f} acc {test_acc:.3f}"
        + (f" (serial: acc {row['test_acc_serial']:.3f})" if serial_eval else "")
        + f" | {train_time:.1f} s"
        + (
            f" | fwd it {row['fwd_iters_mean']:.1f} bwd it {row['bwd_iters_mean']:.1f}"
            if solver.batches
            else ""
        )
        + (
            f" | budget: {row['budget_fwd_cycles_mean']:.1f}/{row['budget_bwd_cycles_mean']:.1f}"
            f" cycles, est. gradient error {row['budget_grad_err_est']:.2g}"
            if budget_row
            else ""
        )
    )
    return row


def measure_speed(cfg: TrainConfig, run: Path) -> dict:
    """:func:`mgrit_gru.app.speed.speed_check` on the run's final model (rebuilt from its
    checkpoint, with what its solver has learnt)."""
    from .speed import speed_check

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    state = load_checkpoint(run)
    data = load_data(cfg)
    model = Classifier(cfg, data.features, data.num_classes).to(_device(cfg))
    model.load_state_dict(state["model"])
    if isinstance(model.rnn, Recurrent):
        model.rnn.load_solver_state(state.get("solver_state", {}))
    return speed_check(cfg, model, data)


def evaluate_run(run: Path, dataset: Optional[str] = None, log=print) -> dict:
    """Evaluate the saved model of ``run`` on a dataset's test split."""
    cfg = read_config(run)
    state = load_checkpoint(run)
    trained_on = cfg
    if dataset:  # the run's --length belongs to its own (synthetic) data set
        length = cfg.length if dataset in SYNTHETIC else None
        cfg = cfg.replace(dataset=dataset, max_train=None, max_test=None, length=length)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = _device(cfg)
    data = load(cfg.dataset, seed=cfg.seed, length=cfg.length)
    if cfg.max_test:
        data = _subset(data, cfg.replace(max_train=None, batch_size=1))
    weights = state["model"]
    shape = [weights.get(k, torch.empty(0, 0)).shape for k in ("rnn.weight_ih_l0", "head.weight")]
    features, classes = shape[0][1], shape[1][0]
    if (features, classes) != (data.features, data.num_classes):
        raise RunError(
            f"the model of {run} (trained on {trained_on.dataset}: {features} feature(s), "
            f"{classes} classes) does not fit {cfg.dataset} ({data.features} feature(s), "
            f"{data.num_classes} classes)"
        )
    model = Classifier(cfg, data.features, data.num_classes).to(device)
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise RunError(f"the model of {run} does not fit dataset {cfg.dataset}: {exc}") from exc
    start = time.perf_counter()
    loss, acc = evaluate(model, data.x_test, data.y_test, data.len_test, cfg.batch_size, device)
    result = {
        "run": str(run),
        "dataset": cfg.dataset,
        "epoch": state["epoch"],
        "test_loss": loss,
        "test_acc": acc,
        "time_s": time.perf_counter() - start,
    }
    text = f"{run} (epoch {state['epoch']}) on {cfg.dataset} test: loss {loss:.4f} acc {acc:.3f}"
    if cfg.budget is not None:  # the model is its solver; the exact solve beside it
        loss_s, acc_s = evaluate_serially(model, data, cfg, device)
        result.update(test_loss_serial=loss_s, test_acc_serial=acc_s)
        text += (
            f" with its budget ({cfg.budget.forward} forward / {cfg.budget.backward} adjoint "
            f"cycles); solved exactly: loss {loss_s:.4f} acc {acc_s:.3f}"
        )
    log(text)
    return result
