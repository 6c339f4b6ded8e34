"""``mgrit_gru.GRU``: a drop-in ``torch.nn.GRU`` whose layers are solved parallel in time."""

from __future__ import annotations

from typing import Optional, Union

from torch import Tensor, nn

from .gru.cell import CELLS, GRUCell
from .layer.module import HALF as HALF
from .layer.module import TRANSFORMED as TRANSFORMED
from .layer.module import Recurrent
from .options import MGRIT, Auto
from .stats import SolveStats


class GRU(Recurrent, nn.GRU):
    """Multi-layer GRU with ``torch.nn.GRU``'s constructor, call, parameters and outputs.

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
        device, dtype: as in ``torch.nn.GRU``.
        solver: ``"auto"`` (default: per layer, direction and pass MGRIT or the serial solve,
            whichever the cost model says is faster; :class:`mgrit_gru.Auto`), ``"mgrit"``
            (MGRIT with default options), ``"serial"`` (exact sequential solve) or an
            :class:`mgrit_gru.MGRIT` / :class:`mgrit_gru.Auto` object.
        cell: ``"classic"`` (``torch.nn.GRU``'s math) or ``"implicit"`` (the implicit GRU of
            Moon & Cyr 2022 as the model, dt = 1).
        time_group: a :class:`mgrit_gru.distributed.TimeGroup`: time-parallel across its ranks.
            Each rank passes its slice of x (:func:`mgrit_gru.distributed.scatter_time`) and
            the same h0, and gets its slice of y and the global h_n; gradients of the
            parameters and h0 are summed over the group.
        kernels: which kernels run the sweeps: ``"auto"`` (the compiled kernels where
            they serve the tensors: C++ on the CPU, Triton on CUDA; else PyTorch's steps),
            ``"compiled"``, ``"triton"``, ``"pytorch"`` (the reference), or None (default):
            the process's ``MGRIT_GRU_KERNELS``, else ``"auto"`` (:mod:`mgrit_gru.kernels`).

    Call: ``y, h_n = gru(x, h0=None)`` with x ``(T, B, input_size)`` (``(B, T, ·)`` if
    batch_first, or unbatched ``(T, input_size)``) and h0 ``(D * num_layers, B, hidden_size)``;
    y ``(T, B, D * hidden_size)``, h_n like h0 (D = 2 if bidirectional else 1).

    After each call ``last_stats`` (a :class:`mgrit_gru.RunStats`) holds the forward residual
    history of every layer and direction; its backward entries fill in when autograd runs.
    """

    _NAME = "GRU"
    _TORCH = nn.GRU
    _UNROLLED = True

    def __init__(
        self,
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
        cell: str = "classic",
        time_group=None,
        kernels: Optional[str] = None,
        proj_size: int = 0,
    ) -> None:
        if proj_size != 0:  # torch's words: GRU(proj_size=...) is refused there too
            raise ValueError("GRU: proj_size argument is only supported for LSTM, not RNN or GRU")
        if cell not in CELLS:
            raise ValueError(f"GRU: unknown cell={cell!r}; choose one of {CELLS}")
        super().__init__(
            GRUCell(cell),
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
        self.cell = cell

    def to_torch(self) -> nn.GRU:
        """A ``torch.nn.GRU`` with these weights (same device and dtype); classic cell only."""
        if self.cell != "classic":
            raise ValueError("GRU.to_torch: torch.nn.GRU has no implicit cell")
        return super().to_torch()

    @classmethod
    def from_torch(
        cls,
        module: nn.GRU,
        *,
        solver: Union[str, MGRIT, Auto] = "auto",
        cell: str = "classic",
        kernels: Optional[str] = None,
    ) -> GRU:
        """A copy of a ``torch.nn.GRU`` (same weights, device and dtype)."""
        return cls._copy_of(module, solver=solver, cell=cell, kernels=kernels)

    def _extra_repr_tail(self) -> str:
        return "" if self.cell == "classic" else f", cell={self.cell!r}"

    def _check_exportable(self, export: str) -> None:
        if self.cell != "classic":
            raise RuntimeError(
                f"GRU: {export} needs torch's GRU op, and torch has no implicit cell: run "
                "cell='implicit' eagerly (in Python), or train cell='classic' to export it"
            )
        super()._check_exportable(export)

    def _initial_state(self, hx, batch: Optional[int], device) -> Tensor:
        return self._check_state("h0", hx, batch, device)

    def _final_state(self, u_n: Tensor, batched: bool) -> Tensor:
        return u_n if batched else u_n.squeeze(1)

    def _unrolled_layer(self, x, h0, weights, solver, record, where, mask):
        """One layer and direction by :func:`mgrit_gru.gru.unrolled.layer` (autograd records
        the cycles); its stats go into ``record``."""
        from .gru import unrolled

        y, h_n, residuals, levels = unrolled.layer(
            x, h0, *weights, self.cell, solver, where[1], mask
        )
        record.forward.append(
            SolveStats(
                "forward", *where, x.shape[0], levels, solver.budget.forward, tuple(residuals),
                False, False,
            )
        )  # fmt: skip
        return y, h_n
