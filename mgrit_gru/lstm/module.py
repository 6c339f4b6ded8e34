"""``mgrit_gru.LSTM``: torch.nn.LSTM's constructor, parameters and call, each layer and
direction solved by MGRIT (:mod:`mgrit_gru.lstm.solve`), forward and adjoint.

A first version: dense input (batched or not), layers, bidirectional, batch_first, dropout,
``(h0, c0)``; ``solver="serial"`` or ``MGRIT(...)`` (to its tolerance; a solve that stops at
its cycle cap is redone serially, with one warning). Not yet: PackedSequence and lengths,
``proj_size``, budgets, the automatic choice, time-parallel ranks (each refused with one
line).
"""

from __future__ import annotations

import math
import warnings
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layer.control import ConvergenceWarning
from ..options import MGRIT
from . import solve

DEFAULT_TOL = {torch.float64: 1e-12}  # else 1e-5 (32-bit arithmetic)


class _Layer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh, options, owner):
        tol, iters = owner._stopping(x.dtype)
        with torch.no_grad():
            points, result = solve.forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, options, tol, iters)
            if not result.converged:
                owner._unconverged("forward")
                points, _ = solve.forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, MGRIT.serial())
        ctx.save_for_backward(x, points, w_ih, w_hh, b_ih, b_hh)
        ctx.options, ctx.owner = options, owner
        H = w_hh.shape[1]
        T = x.shape[0]
        return points[1:, :, :H].clone(), points[T, :, :H].clone(), points[T, :, H:].clone()

    @staticmethod
    def backward(ctx, d_y, d_hn, d_cn):
        x, points, w_ih, w_hh, b_ih, b_hh = ctx.saved_tensors
        tol, iters = ctx.owner._stopping(x.dtype)
        args = (points, x, w_ih, w_hh, b_ih, b_hh, d_y, d_hn, d_cn)
        *grads, result = solve.backward(*args, ctx.options, tol, iters)
        if not result.converged:
            ctx.owner._unconverged("backward")
            *grads, _ = solve.backward(*args, MGRIT.serial())
        dx, dh0, dc0, dw_ih, dw_hh, db = grads
        return (
            dx,
            dh0,
            dc0,
            dw_ih,
            dw_hh,
            None if b_ih is None else db,
            None if b_hh is None else db,
            None,
            None,
        )


class LSTM(nn.Module):
    """Multi-layer LSTM with ``torch.nn.LSTM``'s constructor, parameters (same names, shapes
    and ``state_dict`` keys) and call: ``output, (h_n, c_n) = lstm(input, (h0, c0))`` with
    input ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``, or ``(T, I)`` unbatched).

    Args (beyond torch.nn.LSTM's): ``solver``: ``"serial"`` (the exact sequential solve) or a
    :class:`mgrit_gru.MGRIT` (default ``MGRIT()``; its ``tol="auto"``: 1e-5 in 32-bit
    arithmetic, 1e-12 in float64).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        solver: Union[str, MGRIT, None] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if proj_size:
            raise ValueError("mgrit_gru.LSTM: proj_size is not supported yet; use torch.nn.LSTM")
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"mgrit_gru.LSTM: {name} must be a positive int, got {value!r}")
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"mgrit_gru.LSTM: num_layers must be >= 1, got {num_layers!r}")
        if not 0.0 <= float(dropout) <= 1.0:
            raise ValueError(f"mgrit_gru.LSTM: dropout must lie in [0, 1], got {dropout}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, 0
        self.solver = _options(solver)
        self._warned: set = set()
        factory = {"device": device, "dtype": dtype}
        D = 2 if bidirectional else 1
        for layer in range(num_layers):
            for direction in range(D):
                sfx = f"_l{layer}" + ("_reverse" if direction else "")
                inp = input_size if layer == 0 else hidden_size * D
                shapes = {
                    "weight_ih": (4 * hidden_size, inp),
                    "weight_hh": (4 * hidden_size, hidden_size),
                }
                if bias:
                    shapes.update(bias_ih=(4 * hidden_size,), bias_hh=(4 * hidden_size,))
                for name, shape in shapes.items():
                    setattr(self, name + sfx, nn.Parameter(torch.empty(shape, **factory)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``torch.nn.LSTM``'s initialisation: U(-1/sqrt(H), 1/sqrt(H)) for every parameter."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -bound, bound)

    @classmethod
    def from_torch(cls, module: nn.LSTM, *, solver=None) -> LSTM:
        """A copy of a ``torch.nn.LSTM`` (same weights, device and dtype)."""
        if not isinstance(module, nn.LSTM):
            raise TypeError(
                f"LSTM.from_torch: expected a torch.nn.LSTM, got {type(module).__name__}"
            )
        p = next(module.parameters())
        out = cls(
            module.input_size,
            module.hidden_size,
            module.num_layers,
            module.bias,
            module.batch_first,
            module.dropout,
            module.bidirectional,
            module.proj_size,
            solver=solver,
            device=p.device,
            dtype=p.dtype,
        )
        out.load_state_dict(module.state_dict())
        return out

    def to_torch(self) -> nn.LSTM:
        """The same network as a ``torch.nn.LSTM``."""
        p = next(self.parameters())
        out = nn.LSTM(
            self.input_size,
            self.hidden_size,
            self.num_layers,
            self.bias,
            self.batch_first,
            self.dropout,
            self.bidirectional,
            device=p.device,
            dtype=p.dtype,
        )
        out.load_state_dict(self.state_dict())
        return out

    def _stopping(self, dtype) -> tuple[float, int]:
        opts = self.solver
        tol = opts.tol if not isinstance(opts.tol, str) else DEFAULT_TOL.get(dtype, 1e-5)
        iters = opts.max_iters if not isinstance(opts.max_iters, str) else 100
        return tol, iters

    def _unconverged(self, pass_: str) -> None:
        if pass_ not in self._warned:
            self._warned.add(pass_)
            warnings.warn(
                f"mgrit_gru.LSTM: the MGRIT {pass_} solve stopped at its cycle cap above the "
                "tolerance; such calls are redone by the exact serial solve",
                ConvergenceWarning,
                stacklevel=3,
            )

    def forward(self, input: Tensor, hx: Optional[tuple[Tensor, Tensor]] = None):
        if not isinstance(input, Tensor):
            raise TypeError(
                f"mgrit_gru.LSTM: input must be a Tensor (PackedSequence is not supported yet), "
                f"got {type(input).__name__}"
            )
        if input.dim() not in (2, 3):
            raise ValueError(f"mgrit_gru.LSTM: input must be 2-D or 3-D, got {input.dim()}-D")
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        if x.shape[-1] != self.input_size:
            raise ValueError(
                f"mgrit_gru.LSTM: input has {x.shape[-1]} features, expected {self.input_size}"
            )
        T, B = x.shape[:2]
        D, H = 2 if self.bidirectional else 1, self.hidden_size
        if hx is None:
            h0 = c0 = x.new_zeros(D * self.num_layers, B, H)
        else:
            h0, c0 = hx
            if not batched:
                h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
            want = (D * self.num_layers, B, H)
            for name, t in (("h0", h0), ("c0", c0)):
                if tuple(t.shape) != want:
                    raise ValueError(
                        f"mgrit_gru.LSTM: {name} must have shape {want}, got {tuple(t.shape)}"
                    )
        layer_in, h_n, c_n = x, [], []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(D):
                k = layer * D + direction
                sfx = f"_l{layer}" + ("_reverse" if direction else "")
                w = [
                    getattr(self, n + sfx, None)
                    for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
                ]
                xin = layer_in.flip(0) if direction else layer_in
                y, h, c = _Layer.apply(xin, h0[k], c0[k], *w, self.solver, self)
                outs.append(y.flip(0) if direction else y)
                h_n.append(h)
                c_n.append(c)
            layer_in = torch.cat(outs, -1) if D == 2 else outs[0]
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_in = F.dropout(layer_in, self.dropout, training=True)
        out, h_n, c_n = layer_in, torch.stack(h_n), torch.stack(c_n)
        if not batched:
            return out.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        if self.batch_first:
            out = out.transpose(0, 1)
        return out, (h_n, c_n)


def _options(solver) -> MGRIT:
    if solver is None:
        return MGRIT()
    if solver == "serial":
        return MGRIT.serial()
    if isinstance(solver, MGRIT):
        if solver.budget is not None:
            raise ValueError("mgrit_gru.LSTM: a fixed Budget is not supported yet; use a tolerance")
        return solver
    raise ValueError(
        f"mgrit_gru.LSTM: solver={solver!r}: choose 'serial' or mgrit_gru.MGRIT(...) "
        "(the automatic choice is not available for the LSTM yet)"
    )
