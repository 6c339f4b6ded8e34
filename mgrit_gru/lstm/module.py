"""``mgrit_gru.LSTM``: a drop-in ``torch.nn.LSTM`` whose layers are solved parallel in time,
on the same layer solve, options and module base as ``mgrit_gru.GRU``."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from ..layer.module import Recurrent
from ..options import MGRIT, Auto
from .cell import LSTMCell


class LSTM(Recurrent, nn.LSTM):
    """Multi-layer LSTM with ``torch.nn.LSTM``'s constructor, parameters (names, shapes,
    ``state_dict`` keys) and call: ``output, (h_n, c_n) = lstm(input, (h0, c0))``.

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
        device, dtype: as in ``torch.nn.LSTM``.
        proj_size: must be 0: a projected LSTM (``h = W_hr (o * tanh(c))``) is refused at
            construction; use ``torch.nn.LSTM`` for it.
        solver: as ``mgrit_gru.GRU``'s: ``"auto"`` (default), ``"mgrit"``, ``"serial"``, an
            :class:`mgrit_gru.MGRIT` or :class:`mgrit_gru.Auto`. The coarse corrections are
            the frozen-gate and secant chunk maps (``coarse="secant"``, the default, or
            ``"frozen"``); the GRU's ``"implicit"`` is refused.
        time_group: a :class:`mgrit_gru.distributed.TimeGroup`, as for ``mgrit_gru.GRU``
            (each rank passes its slice of the input and the same ``(h0, c0)``).

    Call: input ``(T, B, input_size)`` (``(B, T, ·)`` if batch_first, ``(T, input_size)``
    unbatched, or a ``PackedSequence``; or padded with ``lengths=`` ``(B,)``), ``(h0, c0)``
    each ``(D * num_layers, B, hidden_size)``; output ``(T, B, D * hidden_size)``, ``(h_n,
    c_n)`` like ``(h0, c0)``. ``last_stats`` as for ``mgrit_gru.GRU``.
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
        if proj_size != 0:
            raise ValueError(
                f"LSTM: proj_size={proj_size!r} is not supported (the projected LSTM's state "
                "is not solved here); use proj_size=0 or torch.nn.LSTM"
            )
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
        )
        self.proj_size = 0

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

    def _initial_state(self, hx, batch: Optional[int], device) -> Tensor:
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(
                f"LSTM: hx must be a pair (h0, c0) of tensors, got {type(hx).__name__}"
                + (f" of length {len(hx)}" if isinstance(hx, (tuple, list)) else "")
            )
        h0 = self._check_state("h0", hx[0], batch, device, "[0]")
        c0 = self._check_state("c0", hx[1], batch, device, "[1]")
        return torch.cat([h0, c0], dim=-1)

    def _final_state(self, u_n: Tensor, batched: bool) -> tuple[Tensor, Tensor]:
        H = self.hidden_size
        h_n, c_n = u_n[..., :H], u_n[..., H:]
        if not batched:
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return h_n, c_n
