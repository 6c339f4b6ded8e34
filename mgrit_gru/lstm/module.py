"""``mgrit_gru.LSTM``: a drop-in ``torch.nn.LSTM`` whose layers are solved parallel in time,
on the same layer solve, options and module base as ``mgrit_gru.GRU``."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from .. import trace
from ..core.cycle import LocalComm
from ..layer.module import InputError, Recurrent
from ..options import MGRIT, Auto
from .cell import LSTMCell
from .projection import FIRST_STEP, SummedGradient, first_steps, needs_h0, solve_projected


class LSTM(Recurrent, nn.LSTM):
    """Multi-layer LSTM with ``torch.nn.LSTM``'s constructor, parameters (names, shapes,
    ``state_dict`` keys) and call: ``output, (h_n, c_n) = lstm(input, (h0, c0))``.

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
        device, dtype: as in ``torch.nn.LSTM``.
        proj_size: as in ``torch.nn.LSTM``: ``> 0`` makes the LSTM with projections
            (``h = W_hr (o * tanh(c))`` of ``proj_size`` values; ``weight_hr_l[k]``), solved
            as the plain LSTM on ``[o * tanh(c), c]`` with the recurrent weight ``W_hh W_hr``
            (:mod:`mgrit_gru.lstm.projection`).
        solver: as ``mgrit_gru.GRU``'s: ``"auto"`` (default), ``"mgrit"``, ``"serial"``, an
            :class:`mgrit_gru.MGRIT` or :class:`mgrit_gru.Auto`. The coarse corrections are
            the frozen-gate and secant chunk maps (``coarse="secant"``, the default, or
            ``"frozen"``); the GRU's ``"implicit"`` is refused.
        time_group: a :class:`mgrit_gru.distributed.TimeGroup`, as for ``mgrit_gru.GRU``
            (each rank passes its slice of the input and the same ``(h0, c0)``).

    Call: input ``(T, B, input_size)`` (``(B, T, ·)`` if batch_first, ``(T, input_size)``
    unbatched, or a ``PackedSequence``; or padded with ``lengths=`` ``(B,)``), ``(h0, c0)``
    each ``(D * num_layers, B, hidden_size)`` (h0's last size ``proj_size`` if it is > 0);
    output ``(T, B, D * hidden_size)`` (``D * proj_size``), ``(h_n, c_n)`` like ``(h0,
    c0)``. ``last_stats`` as for ``mgrit_gru.GRU``.
    """

    _NAME = "LSTM"
    _TORCH = nn.LSTM

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
        device=None,
        dtype=None,
        *,
        solver: Union[str, MGRIT, Auto] = "auto",
        time_group=None,
        kernels: Optional[str] = None,
    ) -> None:
        super().__init__(
            LSTMCell(),
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            device,
            dtype,
            solver=solver,
            time_group=time_group,
            kernels=kernels,
            proj_size=proj_size,
        )

    @classmethod
    def from_torch(
        cls,
        module: nn.LSTM,
        *,
        solver: Union[str, MGRIT, Auto] = "auto",
        kernels: Optional[str] = None,
    ) -> LSTM:
        """A copy of a ``torch.nn.LSTM`` (same weights, device and dtype)."""
        return cls._copy_of(module, solver=solver, kernels=kernels)

    def _check_exportable(self, export: str) -> None:
        if self.proj_size and export == "ONNX export":
            raise RuntimeError(
                "LSTM: ONNX has no LSTM with projections (torch.nn.LSTM(proj_size=...) does "
                "not export either): deploy it with torch.export.export or torch.jit.trace, or "
                "use proj_size=0"
            )
        super()._check_exportable(export)

    def _initial_state(self, hx, batch: Optional[int], device) -> Tensor:
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(
                f"LSTM: hx must be a pair (h0, c0) of tensors, got {type(hx).__name__}"
                + (f" of length {len(hx)}" if isinstance(hx, (tuple, list)) else "")
            )
        dims = [t.dim() for t in hx if isinstance(t, Tensor)]
        want = 3 if batch is not None else 2
        if len(dims) == 2 and dims != [want, want]:  # torch's check and words for the pair
            kind = "batched 3-D" if batch is not None else "unbatched 2-D"
            raise InputError(
                f"LSTM: For {kind} input, hx and cx should also be {want}-D but got "
                f"({dims[0]}-D, {dims[1]}-D) tensors"
            )
        h0 = self._check_state("h0", hx[0], batch, device, "[0]", self._output_size)
        c0 = self._check_state("c0", hx[1], batch, device, "[1]")
        return torch.cat([h0, c0], dim=-1)

    def _final_state(self, u_n: Tensor, batched: bool) -> tuple[Tensor, Tensor]:
        H = self._output_size
        h_n, c_n = u_n[..., :H], u_n[..., H:]
        if not batched:
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return h_n, c_n

    def _layer(self, call, x, h0, weights) -> tuple[Tensor, Tensor]:
        if not self.proj_size:
            return super()._layer(call, x, h0, weights)
        layer, reverse = call.where
        w_hr = getattr(self, f"weight_hr_l{layer}" + ("_reverse" if reverse else ""))
        w_hr = w_hr.to(x.dtype)
        entry = None
        if needs_h0(h0[..., : self.proj_size], call.transformed):
            at_start = not reverse or call.mask is None  # every sequence starts at step 0
            # a trace stands for time-parallel ranks (mgrit_gru.projection): it records their
            # way, through the input
            alone = call.tg is None and not trace.active()
            if alone and at_start and x.shape[0] > 1:
                entry = FIRST_STEP
            else:
                t0, steps = (0, x.shape[0]) if call.tg is None else (call.tg.start, call.tg.steps)

                def entry() -> Tensor:
                    return first_steps(x.shape[0], t0, steps, call.lengths, reverse, x)

        # one process: the identity, traced as the sum a time group would run
        comm = LocalComm(reverse) if call.tg is None else call.tg.comm(reverse=reverse)

        def summed(t: Tensor) -> Tensor:
            return t if call.transformed else SummedGradient.apply(t, comm)

        def solve(*args, rest: bool = False):
            mask = call.mask
            here = call._replace(mask=mask[1:]) if rest and mask is not None else call
            return self._solve(here, *args)

        return solve_projected(solve, x, h0, weights, w_hr, entry, summed)
