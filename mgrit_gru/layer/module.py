"""The module base of ``mgrit_gru.GRU`` and ``mgrit_gru.LSTM``: torch's RNN constructor,
parameters, checks and call (dense, padded with ``lengths=``, packed; batch_first; unbatched;
layers; bidirectional; dropout; autocast, half precision, ``torch.compile``, ``torch.func``),
each layer and direction solved by :func:`mgrit_gru.layer.autograd.solve_layer` with the
solver options (automatic choice, MGRIT, serial, budgets) and time-parallel ranks."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
import warnings
from typing import NamedTuple, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .. import trace
from ..kernels import check as check_kernels
from ..kernels import process_default as process_kernels
from ..options import MGRIT, Auto, Implicit, as_options
from ..stats import RunStats, SolveStats
from .autograd import solve_layer
from .cell import Cell
from .control import AutoChoice, DivergenceMemory
from .solve import implicit_of, step_kind


class InputError(ValueError, RuntimeError):
    """A call's input or state of the wrong size or shape, or on another device: a
    ValueError, and the RuntimeError that torch's RNNs raise for the same (code that catches
    torch's, and torch's own tests, catch it)."""


class InputTypeError(TypeError, ValueError):
    """An input or state whose dtype is not the parameters': a TypeError, and the ValueError
    that torch's RNNs raise for the same."""


def _eager_under_compile(forward):
    """``forward`` run eagerly inside ``torch.compile`` (torch.compiler.disable): the solve's
    data-dependent control flow (cycles to a tolerance, the automatic choice, statistics)
    would break or recompile a traced graph; torch's RNNs are a graph break too."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return forward if disable is None else disable(forward)


class Recurrent(nn.Module):
    """What ``mgrit_gru.GRU`` and ``mgrit_gru.LSTM`` share: torch's RNN constructor,
    parameters and call around a cell (:class:`mgrit_gru.layer.cell.Cell`) whose layers are
    solved by :func:`mgrit_gru.layer.autograd.solve_layer`. A subclass names its torch
    counterpart and how its initial and final states look (the GRU's ``h``, the LSTM's
    ``(h, c)``: stacked along the last dimension inside).

    A subclass also derives from its torch counterpart (``class GRU(Recurrent,
    torch.nn.GRU)``): ``isinstance(m, torch.nn.GRU)`` and ``torch.nn.RNNBase`` hold, and
    torch's RNNBase members work on it (``_flat_weights`` kept in step with the weights, so
    that ``torch.nn.utils.weight_norm`` and other reparametrisations of RNN weights work as
    on torch; ``check_forward_args``, ``get_expected_hidden_size``, ``permute_hidden``,
    ``mode``, ``proj_size``, ``_apply``, ``__setstate__``). Torch's constructor is not run
    (it would make cuDNN's weight buffer); this one sets what RNNBase's members read.

    The docs below are the GRU's; the LSTM's are its own class's.

    """

    _NAME = "RNN"  # in messages: "GRU", "LSTM"
    _TORCH: type = nn.Module  # torch.nn.GRU, torch.nn.LSTM
    _UNROLLED = False  # has _unrolled_layer: Budget(gradient="unrolled")

    def __init__(
        self,
        cell: Cell,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device=None,
        dtype=None,
        *,
        solver: Union[str, MGRIT, Auto] = "auto",
        time_group=None,
        kernels: Optional[str] = None,
        proj_size: int = 0,
    ) -> None:
        nn.Module.__init__(self)  # not RNNBase's: see the class docstring
        name = self._NAME
        # torch's checks, with torch's exception types and words (code that catches them, and
        # torch's own tests, see the same): a flag that is not a bool would silently mean
        # another layout (batch_first="False" is truthy)
        for field, value in (("bias", bias), ("batch_first", batch_first)):
            if not isinstance(value, bool):
                raise TypeError(
                    f"{name}: {field} should be of type bool, got: {type(value).__name__}"
                )
        for field, value in (
            ("input_size", input_size),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
        ):
            if not isinstance(value, int) or (isinstance(value, bool) and field != "input_size"):
                raise TypeError(
                    f"{name}: {field} should be of type int, got: {type(value).__name__}"
                )
            if value < 1:  # torch's words
                raise ValueError(f"{name}: {field} must be greater than zero, got {value!r}")
        proj_size = _as_size(name, "proj_size", proj_size)
        if proj_size < 0:  # torch's words
            raise ValueError(
                f"{name}: proj_size should be a positive integer or zero to disable "
                f"projections, got {proj_size}"
            )
        if proj_size >= hidden_size:
            raise ValueError(
                f"{name}: proj_size has to be smaller than hidden_size, got proj_size="
                f"{proj_size} and hidden_size={hidden_size}"
            )
        if (
            not isinstance(dropout, (int, float))
            or isinstance(dropout, bool)
            or not (0.0 <= dropout <= 1.0)
        ):
            raise ValueError(
                f"{name}: dropout should be a number in range [0, 1] representing the "
                f"probability of an element being zeroed, got {dropout!r}"
            )
        if dropout > 0 and num_layers == 1:  # torch's warning, word for word
            warnings.warn(
                "dropout option adds dropout after all but last recurrent layer, so non-zero "
                "dropout expects num_layers greater than 1, but got "
                f"dropout={dropout} and num_layers={num_layers}",
                stacklevel=3,
            )
        self._cell = cell
        self.kernels = kernels
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bidirectional
        # what torch's RNNBase members read (its constructor is not run)
        self.mode, self.proj_size, self.dropout_state = name, proj_size, {}
        self.solver = solver
        self.time_group = time_group
        self._divergence = DivergenceMemory()  # for MGRIT(on_divergence="backoff")
        self.last_stats: Optional[RunStats] = None
        factory = {"device": device, "dtype": dtype}
        directions = 2 if bidirectional else 1
        width, out = cell.gates * hidden_size, self._output_size
        self._flat_weights_names: list[str] = []
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else out * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                shapes = [("weight_ih", (width, layer_in)), ("weight_hh", (width, out))]
                if bias:
                    shapes += [("bias_ih", (width,)), ("bias_hh", (width,))]
                if proj_size:  # torch's order: the projection last
                    shapes += [("weight_hr", (proj_size, hidden_size))]
                for kind, shape in shapes:
                    name = kind + suffix
                    setattr(self, name, nn.Parameter(torch.empty(shape, **factory)))
                    self._flat_weights_names.append(name)
        self._all_weights = _grouped(self._flat_weights_names, num_layers * directions)
        self._init_flat_weights()  # RNNBase's: _flat_weights follows every weight
        self.reset_parameters()

    def __setstate__(self, state: dict) -> None:
        """A whole module pickled before these classes derived from torch's (2026-12-05) lacks
        what RNNBase's ``__setstate__`` reads: filled in from its parameter names."""
        names = state.get("_flat_weights_names", [])
        if "_all_weights" not in state and names:
            directions = 2 if state.get("bidirectional") else 1
            state["_all_weights"] = _grouped(names, state.get("num_layers", 1) * directions)
        state.setdefault("mode", self._NAME)
        state.setdefault("dropout_state", {})
        state.setdefault("_flat_weights", [state["_parameters"].get(n) for n in names])
        super().__setstate__(state)

    @property
    def kernels(self) -> Optional[str]:
        """Which kernels run the sweeps (:mod:`mgrit_gru.kernels`): ``"auto"`` (compiled
        where a kernel serves the tensors, else PyTorch), ``"compiled"``, ``"triton"``,
        ``"pytorch"``, or None
        (the default): the process's ``MGRIT_GRU_KERNELS``, else ``"auto"``."""
        return self._cell.kernels

    @kernels.setter
    def kernels(self, value: Optional[str]) -> None:
        if value is not None:
            value = check_kernels(value, f"{self._NAME}: kernels")
        else:  # the process default: a bad MGRIT_GRU_KERNELS is an error here, not later
            process_kernels()
        self._cell.kernels = value

    @property
    def solver(self):
        """The solver options (:class:`mgrit_gru.MGRIT` or :class:`mgrit_gru.Auto`).
        Assigning ``"auto"``, ``"serial"``, ``"mgrit"`` or such an object takes effect from
        the next call."""
        return self._solver

    @solver.setter
    def solver(self, value) -> None:
        self._solver = self._checked(value)
        wait = self._solver.max_wait if isinstance(self._solver, Auto) else Auto().max_wait
        self._choice = AutoChoice(wait)  # a new solver learns anew

    @contextlib.contextmanager
    def using(self, solver):
        """Within the block, solve with ``solver`` (as for ``solver=``); the solver and what
        it has learnt are restored after it (e.g. to test a budget-trained model serially)."""
        saved = self._solver
        self._solver = self._checked(solver)
        try:
            yield self
        finally:
            self._solver = saved

    def _checked(self, value) -> Union[MGRIT, Auto]:
        """``value`` as options, refused where this cell lacks what they ask for."""
        options = as_options(value, self._NAME)
        mgrit = options.mgrit if isinstance(options, Auto) else options
        if isinstance(mgrit.coarse, Implicit):
            implicit_of(self._cell)  # refused where the cell has no implicit step
        unrolled = mgrit.budget is not None and mgrit.budget.gradient == "unrolled"
        if unrolled and not self._UNROLLED:
            raise ValueError(
                f"{self._NAME}: Budget(gradient='unrolled') is available for the GRU only; use "
                "gradient='adjoint' (the default)"
            )
        return options

    def solver_state(self) -> dict:
        """What the solver has learnt from earlier calls (the automatic choice's, the
        backoff's and a cycle budget's per-layer state): plain data for a checkpoint, so that
        a resumed training run makes the choices an uninterrupted one would. Not part of
        ``state_dict`` (whose keys stay torch's)."""
        return {
            "auto": self._choice.state_dict(),
            "backoff": self._divergence.state_dict(),
            "budget": self._divergence.budget.state_dict(),
        }

    def load_solver_state(self, state: dict) -> None:
        self._choice.load_state_dict(state.get("auto", {}))
        self._divergence.load_state_dict(state.get("backoff", {}))
        self._divergence.budget.load_state_dict(state.get("budget", {}))

    def time_cfactor(self, steps: int, batch: int) -> int:
        """The chunk length of a time-parallel call with ``steps`` global time steps and
        ``batch`` sequences (``cfactor="auto"`` resolved from the global shape and the time
        group's size, as on every rank); :func:`mgrit_gru.distributed.scatter_time` takes
        the module in its place."""
        ranks = 1 if self.time_group is None else self.time_group.size
        weight = self.weight_ih_l0
        opts = self._mgrit_options()
        kind = self._step_kind(opts, weight.device.type, weight.dtype)
        return opts.resolve(steps, batch, self.hidden_size, weight.device.type, ranks, kind).cfactor

    def _step_kind(self, opts: MGRIT, device: str, dtype: torch.dtype) -> str:
        """The cost model's kind of this module's fine steps for ``cfactor="auto"``
        (:func:`~mgrit_gru.layer.solve.step_kind`; "step" where the chunk length is given):
        half precision solves in float32; a budget's unrolled gradient and torch.func run the
        PyTorch steps (the unrolled cycles whenever they record a graph)."""
        unrolled = opts.budget is not None and opts.budget.gradient == "unrolled"
        if opts.cfactor != "auto" or unrolled or _functorch_active():
            return "step"
        return step_kind(self._cell.kernels, device, torch.float32 if dtype in HALF else dtype)

    def _mgrit_options(self) -> MGRIT:
        return self.solver.mgrit if isinstance(self.solver, Auto) else self.solver

    @property
    def _output_size(self) -> int:
        """Values per step and direction in the output: ``hidden_size``, or ``proj_size``."""
        return self.proj_size or self.hidden_size

    @property
    def _state_size(self) -> int:
        """Values per row of a layer's initial and final state as the call sees them (the
        output's block first: the GRU's h; the LSTM's [h, c], h of ``proj_size`` values)."""
        return self._output_size + (self._cell.state - 1) * self.hidden_size

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        """As torch's ``all_weights``: per layer and direction, its parameters."""
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """As torch's ``flatten_parameters``; a no-op (no cuDNN weight buffer here)."""

    def __prepare_scriptable__(self):
        name = self._NAME
        raise RuntimeError(
            f"mgrit_gru.{name} cannot be compiled by torch.jit.script: its solver is Python "
            "code around a torch.autograd.Function. For TorchScript export its weights as a "
            f"torch.nn.{name} with {name.lower()}.to_torch() (the same function, solved "
            "serially)"
        )

    def to_torch(self) -> nn.Module:
        """The torch module (``torch.nn.GRU`` / ``torch.nn.LSTM``) with these weights (same
        device and dtype)."""
        return _copy_as(self._TORCH, self)

    def reset_parameters(self) -> None:
        """torch's initialisation: U(-1/sqrt(H), 1/sqrt(H)) for every parameter."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -bound, bound)

    @classmethod
    def _copy_of(cls, module: nn.Module, **extra):
        """A copy of a torch module of this kind (same weights, device and dtype)."""
        name, kind = cls._NAME, cls._TORCH.__name__
        if not isinstance(module, cls._TORCH):
            raise TypeError(
                f"{name}.from_torch: expected a torch.nn.{kind}, got {type(module).__name__}"
            )
        return _copy_as(cls, module, **extra)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            text += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        for name, default in (
            ("bias", True),
            ("batch_first", False),
            ("dropout", 0.0),
            ("bidirectional", False),
        ):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text + self._extra_repr_tail() + f", solver={_short_solver(self.solver)}"

    def _extra_repr_tail(self) -> str:
        return ""

    def _weights(self, layer: int, direction: int) -> list[Optional[Tensor]]:
        suffix = f"_l{layer}" + ("_reverse" if direction else "")
        names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
        return [getattr(self, n + suffix, None) for n in names]

    def _check_input(self, x: Tensor) -> tuple[Tensor, bool, Optional[int]]:
        """``x`` checked; returns it time-major and batched, whether it was batched, and the
        batch size (None unbatched)."""
        name = self._NAME
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: input must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() not in (2, 3):
            raise ValueError(
                f"{name}: expected input of 2 (unbatched: T, {self.input_size}) or 3 dimensions "
                f"(batched), got {x.dim()} with shape {tuple(x.shape)}"
            )
        param = self.weight_ih_l0
        if not x.is_floating_point():  # a ValueError as torch's, and the TypeError it was
            raise InputTypeError(
                f"{name}: RNN input dtype ({x.dtype}) does not match weight dtype "
                f"({param.dtype}): input must be a floating-point tensor; convert it, e.g. "
                f"x.to({param.dtype})"
            )
        self._check_dtype("input", x, f"; convert one of them (e.g. module.to({x.dtype}))")
        if x.shape[-1] != self.input_size:  # torch's words, after the dtype as in torch
            raise InputError(
                f"{name}: input.size(-1) must be equal to input_size. Expected "
                f"{self.input_size}, got {x.shape[-1]}"
            )
        batched = x.dim() == 3
        seq_dim = 1 if (batched and self.batch_first) else 0
        batch = x.shape[1 - seq_dim] if batched else None
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        return x, batched, batch

    def _check_dtype(self, label: str, t: Tensor, advice: str = "") -> None:
        """``t`` in the parameters' dtype, else one line naming both."""
        name, param = self._NAME, self.weight_ih_l0
        if t.dtype != param.dtype:
            raise InputTypeError(
                f"{name}: {label} dtype {t.dtype} does not match the parameters' dtype "
                f"{param.dtype}{advice}"
            )

    def _check_device(self, x: Tensor) -> None:
        """The input on the parameters' device (checked after the states, as torch does),
        in torch's words."""
        param = self.weight_ih_l0
        if x.device != param.device:
            raise InputError(
                f"{self._NAME}: Input and parameter tensors are not at the same device, found "
                f"input tensor at {x.device} and parameter tensor at {param.device}"
            )

    def _check_state(
        self, label: str, t, batch: Optional[int], device, index: str = "", size: int = 0
    ) -> Tensor:
        """One initial-state tensor (``h0``, ``c0``: torch's ``hidden{index}``) checked
        against torch's shape ``(D * num_layers, [B,] size)`` (``size`` 0: the hidden size)
        and the input's ``device``; returned batched."""
        name = self._NAME
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: {label} must be a torch.Tensor, got {type(t).__name__}")
        directions = 2 if self.bidirectional else 1
        expected = (
            (directions * self.num_layers,)
            + ((batch,) if batch is not None else ())
            + (size or self.hidden_size,)
        )
        if t.dim() != len(expected):  # torch's words
            kind = "batched 3-D" if batch is not None else "unbatched 2-D"
            raise InputError(
                f"{name}: For {kind} input, hx should also be {len(expected)}-D but got "
                f"{t.dim()}-D tensor ({label})"
            )
        if tuple(t.shape) != expected:  # torch's words, and which state
            raise InputError(
                f"{name}: Expected hidden{index} size {expected}, got {list(t.shape)} ({label})"
            )
        if t.device != device:
            raise InputError(
                f"{name}: Input and hidden tensors are not at the same device, found input "
                f"tensor at {device} and hidden tensor at {t.device} ({label})"
            )
        self._check_dtype(label, t)
        if not _all_finite(t):
            raise ValueError(f"{name}: {label} contains NaN or Inf")
        return t if batch is not None else t.unsqueeze(1)

    def _initial_state(self, hx, batch: Optional[int], device) -> Optional[Tensor]:
        """The call's initial state as one tensor ``(D * num_layers, B, S)``, or None;
        ``device``: the input's."""
        raise NotImplementedError

    def _final_state(self, u_n: Tensor, batched: bool):
        """The call's final state as torch returns it, from ``(D * num_layers, B, S)``."""
        raise NotImplementedError

    def _check_lengths(self, lengths, B: int, batched: bool) -> Optional[Tensor]:
        if lengths is None:
            return None
        if not batched:
            raise ValueError(f"{self._NAME}: lengths= needs batched input")
        lengths = torch.as_tensor(lengths)
        if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise TypeError(f"{self._NAME}: lengths must be integers, got {lengths.dtype}")
        if tuple(lengths.shape) != (B,):
            raise ValueError(
                f"{self._NAME}: lengths must have shape ({B},), got {tuple(lengths.shape)}"
            )
        return lengths.to("cpu", torch.long)

    def _time_context(self, steps: int, batch: int, lengths: Optional[Tensor], device):
        """The time-parallel view of this call (None without ``time_group``); a collective
        check that the ranks agree on the model, the options and the lengths. The chunk
        length comes from the global shape (``cfactor="auto"``: the same on every rank)."""
        if self.time_group is None:
            if trace.active():  # what a time group's start-up check would exchange
                trace.message(trace.CHECK, torch.empty(5, dtype=torch.float64))
            return None
        from ..distributed import TimeContext

        opts = self._mgrit_options()
        config = f"{opts!r} {self._cell!r} {self.extra_repr()}"
        size = self.time_group.size
        kind = self._step_kind(opts, device.type, self.weight_ih_l0.dtype)
        config += f" steps={kind}"  # ranks with other kernels would cut other chunks
        return TimeContext.for_slice(
            self.time_group,
            steps,
            lambda total: (
                opts.resolve(total, batch, self.hidden_size, device.type, size, kind).cfactor
            ),
            config,
            self.parameters(),
            lengths,
            device,
        )

    def forward(self, input, hx=None, lengths: Optional[Tensor] = None) -> tuple:
        """``y, h_n = module(x, hx)`` as torch's (the LSTM's ``hx`` and ``h_n`` are ``(h, c)``
        pairs); ``x`` may be a ``PackedSequence`` (then
        ``y`` is one too), or padded with ``lengths`` ``(B,)``: past its length a sequence's
        state stays fixed, ``h_n`` is its state at its own end and its outputs are zero (what
        packing the padded input would give; the padding's values are not read: NaN there is
        allowed).

        Inside an autocast region (``torch.autocast``) the solve runs with autocast off, in
        the parameters' dtype: a floating input (and hx) of another dtype, such as bf16 from
        an autocast layer before it, is cast to it; the outputs come in the dtype torch's
        module returns in the same region (torch.nn.LSTM's bf16 on the CPU, for example).

        In a model compiled with ``torch.compile`` this call runs eagerly (a graph break, as
        torch's), the rest of the model compiled. Under ``torch.func`` transforms
        (``grad``, ``jacrev``, ``vmap``, ...) the layers run as plain autograd code, one
        serial step after another, which the transforms can see through; MGRIT is not used
        there, and ``last_stats`` says so.

        Under ``torch.jit.trace``, ``torch.export`` and ONNX export the call is torch's own
        (``torch.nn.GRU.forward`` / ``torch.nn.LSTM.forward``, the exact serial solve): the
        exported graph is torch's, ``lengths=`` is traced as packing the padded input. The
        implicit cell and ``time_group=`` have no torch counterpart and are refused there."""
        export = _exporting()
        if export is not None:
            return self._forward_as_torch(input, hx, lengths, export)
        return self._forward_eager(input, hx, lengths)

    def _forward_as_torch(self, input, hx, lengths, export: str) -> tuple:
        """The call as torch's module makes it (under ``export``: torch.jit.trace,
        torch.export or ONNX export); ``lengths=`` as packing the padded input."""
        name = self._NAME
        self._check_exportable(export)
        torch_forward = self._TORCH.forward
        if lengths is None:
            return torch_forward(self, input, hx)
        if isinstance(input, PackedSequence):
            raise ValueError(f"{name}: pass lengths= or a PackedSequence, not both")
        if not isinstance(input, Tensor) or input.dim() != 3:
            raise ValueError(f"{name}: lengths= needs batched input")
        if torch.compiler.is_exporting():  # torch.export, and ONNX's dynamo=True on it
            raise RuntimeError(
                f"{name}: torch.export cannot record lengths=, which packs the padded input "
                f"(torch.nn.{name} with a PackedSequence fails the same): trace with "
                "torch.jit.trace or torch.onnx.export(..., dynamo=False), or call without "
                "lengths="
            )
        T = input.shape[1 if self.batch_first else 0]
        lengths = torch.as_tensor(lengths)
        if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise TypeError(f"{name}: lengths must be integers, got {lengths.dtype}")
        packed = pack_padded_sequence(
            input, lengths.to("cpu", torch.long), self.batch_first, enforce_sorted=False
        )
        out, h_n = torch_forward(self, packed, hx)
        out, _ = pad_packed_sequence(out, self.batch_first, total_length=T)
        return out, h_n

    def _check_exportable(self, export: str) -> None:
        """One line where this module has no torch counterpart to trace or export as."""
        if self.time_group is not None:
            raise RuntimeError(
                f"{self._NAME}: {export} of a time-parallel module (time_group=) is not "
                f"supported; export a one-process copy: {self._NAME.lower()}.to_torch()"
            )

    @_eager_under_compile
    def _forward_eager(self, input, hx, lengths: Optional[Tensor]) -> tuple:
        """The call solved by this library (every path but tracing and export)."""
        param = self.weight_ih_l0
        if _autocast_enabled(param.device.type):
            want = self._autocast_dtypes(input, hx, lengths)
            with torch.autocast(param.device.type, enabled=False):
                data = input.data if isinstance(input, PackedSequence) else input
                if isinstance(data, Tensor) and data.is_floating_point():
                    input = input.to(param.dtype)
                hx = _map_state(hx, lambda t: t.to(param.dtype))
                out, h_n = self._forward(input, hx, lengths)
            if want is None:
                return out, h_n
            return out.to(want[0]), _cast_state(h_n, want[1:])
        return self._forward(input, hx, lengths)

    def _autocast_dtypes(self, input, hx, lengths) -> Optional[tuple]:
        """The dtypes of torch's outputs (y, then each final state) for a call like this one
        in the autocast region in force: torch's module run on one step of one sequence of
        the same dtypes and kind (packed for ``lengths=``; of equal or unequal lengths, as
        torch's LSTM takes oneDNN's op for the one only), remembered per configuration.
        None for an input or state that is no tensor (the checks after this refuse it)."""
        param = self.weight_ih_l0
        device = param.device
        data = input.data if isinstance(input, PackedSequence) else input
        states = hx if isinstance(hx, (tuple, list)) else (hx,)
        if not isinstance(data, Tensor) or not all(
            t is None or isinstance(t, Tensor) for t in states
        ):
            return None  # the checks after this say what is wrong
        packed = None  # dense, else whether the sequences' lengths are all equal
        if isinstance(input, PackedSequence):
            packed = bool(input.batch_sizes.min() == input.batch_sizes.max())
        elif lengths is not None:
            flat = torch.as_tensor(lengths).flatten()
            packed = flat.numel() == 0 or bool((flat == flat[0]).all())
        key = (
            type(self), self.num_layers, self.bidirectional, bool(self.proj_size), self.bias,
            device.type, torch.get_autocast_dtype(device.type), param.dtype, data.dtype,
            tuple(None if t is None else t.dtype for t in states), packed,
            torch.is_grad_enabled(), torch.backends.mkldnn.is_available()
            and torch._C._get_mkldnn_enabled(),
        )  # fmt: skip
        if key in _AUTOCAST_DTYPES:
            return _AUTOCAST_DTYPES[key]
        directions = 2 if self.bidirectional else 1
        rows = 1 if packed is not False else 2  # two sequences of lengths 2 and 1
        one = torch.zeros(rows, rows, self.input_size, dtype=data.dtype, device=device)
        if packed is not None:
            one = pack_padded_sequence(one, torch.arange(rows, 0, -1), self.batch_first)
        sizes = [self._output_size, self.hidden_size]
        probe_hx = [
            None
            if t is None
            else torch.zeros(directions * self.num_layers, rows, size, dtype=t.dtype, device=device)
            for t, size in zip(states, sizes)
        ]
        probe_hx = None if hx is None else probe_hx[0] if len(probe_hx) == 1 else tuple(probe_hx)
        try:
            with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out, h_n = self._TORCH.forward(self, one, probe_hx)
        except Exception:  # torch's op, autocast to the lower precision, failed to run there
            # (oneDNN's LSTM without bf16 support on this CPU): what it would have returned
            answer = (torch.get_autocast_dtype(device.type),) * (1 + self._cell.state)
        else:
            out = out.data if isinstance(out, PackedSequence) else out
            finals = h_n if isinstance(h_n, tuple) else (h_n,)
            answer = (out.dtype, *(t.dtype for t in finals))
        _AUTOCAST_DTYPES[key] = answer
        return answer

    def _forward(self, input, hx, lengths: Optional[Tensor]) -> tuple:
        name = self._NAME
        packed = isinstance(input, PackedSequence)
        if packed:
            if self.time_group is not None:
                raise ValueError(
                    f"{name}: with time_group= pass this rank's padded time slice and the global "
                    "lengths= (B,), not a PackedSequence"
                )
            if lengths is not None:
                raise ValueError(f"{name}: pass lengths= or a PackedSequence, not both")
            sorted_indices, unsorted_indices = input.sorted_indices, input.unsorted_indices
            batch_sizes = input.batch_sizes
            input, lengths = pad_packed_sequence(input, batch_first=self.batch_first)
        x, batched, batch = self._check_input(input)
        u0 = None if hx is None else self._initial_state(hx, batch, x.device)
        self._check_device(x)
        if x.shape[0] == 0:  # after the states' checks, as torch
            raise InputError(f"{name}: Expected sequence length to be larger than 0 in RNN")
        T, B = x.shape[:2]
        if B == 0 or x.device.type == "meta":  # nothing to solve, or shapes only
            return self._empty_batch(x, u0, batched)
        lengths = self._check_lengths(lengths, B, batched)
        tg = self._time_context(T, B, lengths, x.device)
        t0, steps = (0, T) if tg is None else (tg.start, tg.steps)
        if lengths is not None and (lengths.min() < 1 or lengths.max() > steps):
            raise ValueError(
                f"{name}: lengths must lie in [1, {steps}] (the padded length), got "
                f"min {int(lengths.min())} max {int(lengths.max())}"
            )
        # float16 / bfloat16 models solve in float32: the tolerance of MGRIT (1e-5 by default)
        # lies below their resolution, and a serial sweep in half precision drifts. Parameters,
        # input and h0 are cast (differentiably), the outputs come back in the model's dtype.
        dtype = x.dtype
        if dtype in HALF:
            x = x.float()
            u0 = None if u0 is None else u0.float()
        mask = None
        if lengths is not None and int(lengths.min()) < steps:
            t = torch.arange(t0, t0 + T).unsqueeze(1)  # global time of this slice's steps
            mask = (t < lengths.unsqueeze(0)).to(x.dtype).to(x.device)  # (T, B)
        x = self._finite_input(x, mask, t0, batched)
        out, u_n = self._run(x, u0, mask, tg, lengths)
        out, h_n = out.to(dtype), self._final_state(u_n.to(dtype), batched)
        if packed:
            order = sorted_indices if sorted_indices is not None else torch.arange(B)
            data = pack_padded_sequence(
                out.index_select(1, order.to(out.device)), lengths[order], enforce_sorted=True
            ).data
            return PackedSequence(data, batch_sizes, sorted_indices, unsorted_indices), h_n
        if not batched:
            return out.squeeze(1), h_n
        if self.batch_first:
            out = out.transpose(0, 1)
        return out, h_n

    def _finite_input(self, x: Tensor, mask: Optional[Tensor], t0: int, batched: bool) -> Tensor:
        """``x`` ``(T, B, I)`` refused where a real step holds NaN or Inf (``mask`` ``(T, B)``:
        1 within the sequences' lengths, 0 in the padding; None: every step is real), in one
        line naming the first such step; NaN or Inf in the padding (never read) is zeroed."""
        if _all_finite(x):
            return x
        bad = ~torch.isfinite(x).all(-1)  # (T, B)
        if mask is not None:
            bad = bad & mask.bool()
        if bool(bad.any()):
            t, b = (int(i) for i in bad.nonzero()[0])
            where = f"step {t0 + t}" + (f" of sequence {b}" if batched else "")
            if mask is None:
                raise ValueError(
                    f"{self._NAME}: input contains NaN or Inf (first at {where}); if that is "
                    "padding, pass lengths= (padding is not read), else clean the input"
                )
            raise ValueError(
                f"{self._NAME}: input contains NaN or Inf within the sequences' lengths (first "
                f"at {where}); clean the input or shorten that sequence's length"
            )
        return torch.where(mask.bool().unsqueeze(-1), x, x.new_zeros(()))

    def _empty_batch(self, x: Tensor, u0: Optional[Tensor], batched: bool) -> tuple:
        """An empty batch ``(T, 0, I)``, or a call on the meta device (shapes only), as torch
        answers them: outputs ``(T, B, D * H)`` and final states, joined to the graph
        (backward runs; every gradient is zero)."""
        directions = 2 if self.bidirectional else 1
        H, S = self._output_size, self._state_size
        anchor = x.sum() * 0 + sum(p.sum() for p in self.parameters()) * 0
        if u0 is not None:
            anchor = anchor + u0.sum() * 0
        B = x.shape[1]
        out = x.new_zeros((x.shape[0], B, directions * H)) + anchor
        u_n = x.new_zeros((directions * self.num_layers, B, S)) + anchor
        self.last_stats = RunStats()
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, self._final_state(u_n, batched)

    def _run(
        self, x: Tensor, u0: Optional[Tensor], mask, tg, lengths: Optional[Tensor]
    ) -> tuple[Tensor, Tensor]:
        """All layers and directions: the output ``(T, B, D * H)`` and the final states
        ``(D * num_layers, B, S)``. The reverse direction runs over the flipped padded axis:
        a sequence's padding then comes first, as identity steps (mask 0) that keep its start
        state, so its real steps see the sequence reversed within its length, as in torch.
        ``lengths`` ``(B,)``: the sequences' global lengths, or None (all of the call's)."""
        directions = 2 if self.bidirectional else 1
        B = x.shape[1]
        if u0 is None:
            u0 = x.new_zeros(directions * self.num_layers, B, self._state_size)
        solver = self._mgrit_options()
        if tg is None:
            kind = self._step_kind(solver, x.device.type, x.dtype)
            solver = solver.resolve(x.shape[0], B, self.hidden_size, x.device.type, kind=kind)
        else:  # the chunk length the ranks' slices are aligned to
            solver = solver.replace(cfactor=tg.cfactor)
        if isinstance(self.solver, Auto) and tg is None:
            control = self._choice  # time-parallel ranks run MGRIT: their meters differ
        else:
            # the backoff's memory, which also holds a cycle budget's (its error's estimate)
            keep = solver.on_divergence == "backoff" or solver.budget is not None
            control = self._divergence if keep else None
        record = RunStats()
        if self.last_stats is not None and _in_backward():
            # a checkpoint's recomputation (torch.utils.checkpoint): the adjoint solves of this
            # call (non-reentrant: the first call's ctx; reentrant: this one's) join last_stats
            record.backward = self.last_stats.backward
        else:
            self.last_stats = record
        transformed = _functorch_active()
        if transformed and tg is not None:
            raise ValueError(
                f"{self._NAME}: torch.func transforms are not supported with time_group="
            )
        h_n = []
        layer_in = x
        for layer in range(self.num_layers):
            outs = []
            for direction in range(directions):
                weights = self._weights(layer, direction)
                w_ih, w_hh, b_ih, b_hh = (None if w is None else w.to(x.dtype) for w in weights)
                flip = (lambda t: t.flip(0)) if direction else (lambda t: t)
                x_in, h_in = flip(layer_in), u0[layer * directions + direction]
                m_in, where = None if mask is None else flip(mask), (layer, bool(direction))
                call = _LayerCall(solver, record, where, m_in, lengths, tg, control, transformed)
                y, h_last = self._layer(call, x_in, h_in, (w_ih, w_hh, b_ih, b_hh))
                outs.append(flip(y))
                h_n.append(h_last)
            layer_out = outs[0] if directions == 1 else torch.cat(outs, dim=-1)
            if mask is not None:
                layer_out = layer_out * mask.unsqueeze(-1)  # padded outputs are zero
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_out = F.dropout(layer_out, self.dropout, training=True)
            layer_in = layer_out
        return layer_in, torch.stack(h_n)

    def _layer(self, call: _LayerCall, x, h0, weights) -> tuple[Tensor, Tensor]:
        """One layer and direction: its output ``(T, B, out)`` and final state ``(B, S)``,
        from input ``x`` ``(T, B, .)`` and initial state ``h0`` ``(B, S)`` in this
        direction's time order. A subclass may solve another problem for it (the projected
        LSTM) by :meth:`_solve`."""
        y, h_last = self._solve(call, x, h0, *weights)
        return y[..., : self.hidden_size], h_last  # the state's first block, h

    def _solve(self, call: _LayerCall, x, h0, w_ih, w_hh, b_ih, b_hh) -> tuple[Tensor, Tensor]:
        """The states ``(T, B, state * H)`` and the last ``(B, state * H)`` of one layer of
        the cell, by the path this call takes: torch.func's plain autograd code, a budget's
        unrolled cycles, or the layer solve."""
        cell, where = self._cell, call.where
        if call.transformed:  # torch.func: plain autograd code the transforms can follow
            y, h_last = cell.reference_layer(x, h0, w_ih, w_hh, b_ih, b_hh, call.mask)
            stats = _transformed_stats(call.solver, where[0], where[1], x)
            call.record.forward.append(stats)
            return y, h_last
        if _unrolled(call.solver, call.tg):
            weights = (w_ih, w_hh, b_ih, b_hh)
            return self._unrolled_layer(x, h0, weights, call.solver, call.record, where, call.mask)
        return solve_layer(
            x, h0, w_ih, w_hh, b_ih, b_hh, cell, call.solver, call.record, where, call.mask,
            call.tg, call.control,
        )  # fmt: skip

    def _unrolled_layer(self, x, h0, weights, solver, record, where, mask):
        """One layer and direction differentiated through a budget's cycles
        (``Budget(gradient="unrolled")``): a subclass with ``_UNROLLED`` has it."""
        raise NotImplementedError


class _LayerCall(NamedTuple):
    """What one layer and direction's solve takes besides its data and weights."""

    solver: MGRIT
    record: RunStats
    where: tuple[int, bool]  # (layer, reverse)
    mask: Optional[Tensor]  # (T, B) in this direction's time order, or None
    lengths: Optional[Tensor]  # (B,) the sequences' global lengths, or None: all full
    tg: object  # the call's mgrit_gru.distributed.TimeContext, or None
    control: object  # AutoChoice, DivergenceMemory or None
    transformed: bool  # under a torch.func transform


HALF = (torch.float16, torch.bfloat16)
# torch's output dtypes in an autocast region, per configuration (Recurrent._autocast_dtypes)
_AUTOCAST_DTYPES: dict = {}
TRANSFORMED = "a torch.func transform: the layer ran as plain autograd code"


def _functorch_active() -> bool:
    """Whether a torch.func transform (grad, vjp, jacrev, vmap, ...) is running this call."""
    peek = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def _transformed_stats(solver: MGRIT, layer: int, direction: int, x: Tensor) -> SolveStats:
    """The record of a layer solved serially under a torch.func transform."""
    mgrit = not solver.is_serial
    return SolveStats(
        "forward", layer, bool(direction), x.shape[0], 1, 0, (), True, mgrit, mgrit,
        reason=TRANSFORMED if mgrit else None,
    )  # fmt: skip


def _as_size(name: str, field: str, value) -> int:
    """An integer argument as torch reads it: any integer type (numpy's too, as torch
    takes them); ``False`` is 0, but ``True`` (1, surely not meant) and non-integers are a
    TypeError."""
    if value is True or isinstance(value, float) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: {field} should be of type int, got: {type(value).__name__}")
    return operator.index(value)


def _grouped(names: list[str], groups: int) -> list[list[str]]:
    """The weight names per layer and direction (torch's ``_all_weights``)."""
    per = len(names) // max(groups, 1)
    return [names[i : i + per] for i in range(0, len(names), per)]


def _copy_as(kind, module: nn.Module, **extra) -> nn.Module:
    """A ``kind`` (a torch module or its mgrit_gru counterpart) with ``module``'s
    architecture, device, dtype and weights. The original warned about its dropout already:
    the copy is made quietly."""
    weight = module.weight_ih_l0
    if getattr(module, "proj_size", 0):
        extra["proj_size"] = module.proj_size
    arch = ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        new = kind(
            *(getattr(module, name) for name in arch),
            module.bidirectional,
            device=weight.device,
            dtype=weight.dtype,
            **extra,
        )
    new.load_state_dict(module.state_dict())
    return new


def _short_solver(options) -> str:
    """The solver options as a repr shows them: ``'auto'``, ``'mgrit'``, ``'serial'``
    (the ``solver=`` strings), else the options with their non-default fields only
    (``MGRIT(cfactor=8)``)."""
    for word in ("auto", "mgrit", "serial"):
        if options == as_options(word):
            return repr(word)
    return _changed_fields(options)


def _changed_fields(value, default=None) -> str:
    """``value``'s repr with only the fields that differ from ``default`` (an object of its
    class; else its class's defaults), nested options alike; a value that is not such an
    object as its repr."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return repr(value)
    if type(default) is not type(value):
        try:
            default = type(value)()
        except (TypeError, ValueError):  # no defaults for every field
            return repr(value)
    changed = [
        f"{f.name}={_changed_fields(getattr(value, f.name), getattr(default, f.name))}"
        for f in dataclasses.fields(value)
        if f.repr and getattr(value, f.name) != getattr(default, f.name)
    ]
    return f"{type(value).__name__}({', '.join(changed)})"


def _cast_state(state, dtypes: tuple):
    """The final state (a tensor, or the LSTM's pair) cast to ``dtypes``, one per tensor."""
    if isinstance(state, Tensor):
        return state.to(dtypes[0])
    return tuple(t.to(d) for t, d in zip(state, dtypes))


def _exporting() -> Optional[str]:
    """What is recording this call as a graph of torch's ops, if anything: ONNX export,
    torch.jit.trace or torch.export (not torch.compile, which runs the layers eagerly)."""
    onnx = getattr(torch, "onnx", None)
    if onnx is not None and onnx.is_in_onnx_export():
        return "ONNX export"
    if torch.jit.is_tracing():
        return "torch.jit.trace"
    if torch.compiler.is_exporting():
        return "torch.export"
    return None


def _map_state(hx, fn):
    """``fn`` applied to a floating initial state: a tensor, or each tensor of a tuple."""
    if isinstance(hx, Tensor):
        return fn(hx) if hx.is_floating_point() else hx
    if isinstance(hx, tuple):
        return tuple(_map_state(t, fn) for t in hx)
    return hx


def _unrolled(solver: MGRIT, tg) -> bool:
    """Whether this call differentiates through a budget's cycles."""
    budget = solver.budget
    if budget is None or budget.gradient != "unrolled" or not torch.is_grad_enabled():
        return False
    if tg is not None:
        raise ValueError(
            "Budget(gradient='unrolled') runs in one process; with time_group= use "
            "gradient='adjoint'"
        )
    return not solver.is_serial


def _in_backward() -> bool:
    """Whether autograd is running a backward pass now (a forward called here is a
    checkpoint's recomputation)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def _all_finite(t: Tensor) -> bool:
    """No NaN or Inf in ``t``. One NaN or Inf makes the sum NaN or Inf, so a finite sum proves
    there is none: one reduction (0.1 ms for 2M floats here, where ``isfinite(t).all()`` took
    5 ms). A sum that overflowed from finite values falls to the exact check."""
    if _functorch_active() or t.device.type == "meta":  # vmap cannot branch on values (NaN
        # then propagates as in torch); a meta tensor has none
        return True
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def _autocast_enabled(device_type: str) -> bool:
    if device_type == "meta":  # no autocast there (torch raises for the device type)
        return False
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return torch.is_autocast_enabled()
