"""What the layer solve needs from a recurrent cell: the protocol a cell package implements.

The solve (:mod:`mgrit_gru.layer.solve`) knows a layer as a time-stepping problem on a state
``u`` of ``state * H`` values per row (the GRU's ``h``; the LSTM's ``[h, c]``), driven by
input gates ``W_ih x + bias`` of ``gates * H`` values per step, all computed in one GEMM. A
cell supplies the step, its vector-Jacobian product in the form

    J^T lam = adjoint_step(lam, D, C)       D: (..., state * H), C: (..., coeffs * H)

where ``D`` is the diagonal part that survives with the gates frozen (the factor of the
frozen-gate chunk maps; 1 on an identity step, where ``C`` is 0), the gate gradients from the
adjoint, and optional extras: a fused serial loop, an implicit variant for implicit coarse
steps, a reference layer in plain autograd code. A new cell is a package that provides one
object with these members; nothing in the solve, the autograd glue or the module base names a
cell.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Optional, Protocol

from torch import Tensor


class Linearisation(NamedTuple):
    """The adjoint coefficients of steps: ``D`` (diagonal, ``state * H``), ``C``
    (``coeffs * H``) and ``extra`` (what the cell's gate gradients need besides them, or
    None)."""

    D: Tensor
    C: Tensor
    extra: Optional[Tensor]


class Cell(Protocol):
    name: str  # "gru", "lstm": in error messages and a time group's configuration check
    gates: int  # blocks of H in the input gates (W_ih has gates * H rows)
    state: int  # blocks of H in the state u; the output y is its first block, h
    kept: int  # blocks of H that a step keeps for linearise_kept
    coeffs: int  # blocks of H in C
    extra: int  # blocks of H in Linearisation.extra (0: None)
    fused: bool  # fused_forward may run this cell's serial forward
    fused_complete: bool  # its points hold every block of the state (else only h inside)
    fused_adjoint: bool  # fused_vjp may run this cell's serial adjoint
    implicit: Optional[Cell]  # the variant that steps an Implicit coarse level, or None
    # the cost model (mgrit_gru.cost) is measured on GRU steps: per kind of step ("step",
    # "adjoint", "fused", "fused_adjoint", "sweep", "sweep_adjoint"), (the GRU kind it is
    # measured against, overhead multiplier, per-row multiplier[, a serial kernel's fixed
    # cost per call in units of that kind's overhead]); {} for the GRU itself
    costs: dict
    # optional: beside the compiled CPU sweeps the serial solve takes torch's kernel where the
    # cost model prices it lower: the cost.SERIAL_KINDS entries of (torch's forward, torch's
    # adjoint, the sweeps' forward, the sweeps' adjoint); the cell then has
    # fused_forward_graph(x, u0, w_ih, w_hh, b_ih, b_hh) -> (points, graph), its forward under
    # autograd, whose graph fused_vjp runs back through. Absent or None: the sweeps always.
    # serial_kinds: Optional[tuple[str, str, str, str]]
    # which kernels run its sweeps (mgrit_gru.kernels.CHOICES), None: the process default
    kernels: Optional[str]

    def fold_bias(self, b_ih: Optional[Tensor], b_hh: Optional[Tensor], H: int):
        """The bias added to every step's input gates."""

    def recurrent_bias(self, b_hh: Optional[Tensor], H: int) -> Optional[Tensor]:
        """The part of ``b_hh`` that :meth:`step` applies itself (not folded)."""

    def step(self, u, gx, w_hh, rb, dt=None, out=None, keep=None, factor=None) -> Tensor:
        """One step of states ``u`` with input gates ``gx``; ``dt`` ``(..., 1)``: the step size
        (0: identity). ``keep`` receives the step's gates (``kept * H``), ``factor`` its
        frozen-gate diagonal factor (``state * H``)."""

    def kernel_forward(
        self, kernel, x0, out, gx, w_hh, rb, g, keep, factor, dt, pad, j0, check=()
    ) -> None:
        """Steps ``j0 .. j0 + S - 1`` by the compiled kernels ``kernel``, what
        :func:`mgrit_gru.kernels.compiled_for` chose (``kernel.name``): the C++ module
        (``"compiled"``), whose functions for this cell the cell calls, or the Triton token
        (``"triton"``), on which the cell launches its own Triton sweeps (in its folder's
        ``<cell>_triton.py``); the layer passes either on as it is. ``out[s] = step(state_s) +
        g[s]`` from ``x0`` ``(1, n, B, state * H)``, ``out`` ``(S, n, B, state * H)``; the
        other arguments as :meth:`step`'s for those steps (views ``(S, n, B, .)``, ``dt``
        expanded), ``pad`` ``(chunk, lo, hi)``: that chunk's steps ``lo <= j < hi`` are identity
        steps (``(-1, 0, 0)``: none). ``check`` ``(stored, change)`` (the C++ module only; empty:
        none): an early exit's check fused into the sweep: ``out[S - 1]``'s states before the
        sweep are set aside in ``stored`` ``(n, B, state * H)`` and ``change`` (one value) gets
        the largest absolute difference of the new ones from them."""

    def kernel_adjoint(self, kernel, x0, out, D, C, w_hh, g, check=()) -> None:
        """Adjoint steps by the compiled kernels (as :meth:`kernel_forward`, ``check``
        too): ``out[s] = adjoint_step(state_s) + g[s]``."""

    def kernel_vjp(self, kernel, points, kept, dt, w_hh, d_out, d_last) -> tuple:
        """The serial adjoint in one compiled call (as :meth:`kernel_forward`) from the
        forward's ``points`` ``(T + 1, B, state * H)`` and kept gates ``(T, B, kept * H)``,
        ``dt`` ``(T, B)`` or None, the gradients ``d_out`` ``(T, B, state * H)`` of the states
        after every step and ``d_last`` of the last: ``(d_gx, d_gh, du0, sums)``, the gate
        pre-activations' gradients of every step ``(T, B, gates * H)`` (of the input side, of
        ``W_hh h + b_hh``), and ``sums`` ``(db_ih, db_hh)``, their sums over the ``T B`` rows
        (the biases' gradients) where the kernel took them, else None."""

    # optional, the whole-sequence passes around MGRIT's adjoint sweeps in one compiled call
    # each, where compiled_passes(kernel) is True (absent or False: the PyTorch code per block):
    # compiled_passes(kernel) -> bool
    # kernel_coefficients(kernel, points, kept, dt, D, C, extra) -> None
    #     linearise_kept of steps k = 0 .. T - 1 (points (T, B, .), kept gates, dt (T, B) or
    #     None) written in reversed time: D[T - 1 - k], C[T - 1 - k]; extra[k] forward.
    # kernel_gate_grads(kernel, lam_rev, C_rev, extra, buffer) -> (d_gx, d_gh, sums)
    #     gate_grads of steps k = 0 .. T - 1 from lam_{k+1} = lam_rev[T - 1 - k] and the
    #     coefficients as kernel_coefficients wrote them, (T, B, gates * H) each, written into
    #     buffer(name)'s work buffers (one for both where they are the same, as the LSTM's);
    #     sums: their sums over the T B rows (db_ih, db_hh) where the kernel took them, or None.

    def linearise(self, u, gx, w_hh, rb, dt=None, out_C=None) -> Linearisation: ...

    def linearise_kept(self, u, kept, dt=None, out_C=None) -> Linearisation: ...

    def adjoint_step(self, lam, D, C, w_hh, out=None) -> Tensor: ...

    def gate_grads(self, lam_next, C, extra, out=None) -> tuple[Tensor, Tensor]:
        """``(d_gx, d_gh)``: the gradients of the input gates and of ``W_hh h + b_hh``."""

    def fused_forward(self, x, u0, w_ih, w_hh, b_ih, b_hh) -> Optional[Tensor]:
        """All points ``(T + 1, B, state * H)`` by a library kernel, or None (refused)."""

    def complete_points(self, points, x, w_ih, w_hh, b_ih, b_hh) -> Tensor:
        """A copy of a fused forward's points with the blocks it left out (other than h, at
        the inner points; ``fused_complete`` False) filled in. A copy: the points are the
        layer's output too, which autograd forbids changing in place."""

    def fused_vjp(
        self, x, u0, w_ih, w_hh, b_ih, b_hh, d_states, d_last, graph=None
    ) -> Optional[tuple]:
        """``(dx, du0, dW_ih, dW_hh, db_ih, db_hh)`` of one layer by a library kernel's own
        backward, from the gradients of the states after every step (their other blocks
        than h zero) and of the last state; None where the kernel refuses the shape.
        ``graph``: a ``fused_forward_graph``'s, run back through (else the forward runs
        again under autograd)."""

    def reference_layer(self, x, u0, w_ih, w_hh, b_ih, b_hh, mask) -> tuple[Tensor, Tensor]:
        """``(states (T, B, state * H), u_n)`` in plain autograd code, step by step."""

    def state_clamp(self, u0: Tensor) -> Callable[[Tensor], Tensor]:
        """``Budget(clamp=True)``'s projection of coarse states onto the states' range."""
