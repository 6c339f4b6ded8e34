"""Time grids of the MGRIT hierarchy and the chunk layout of states on them.

Level l has ``N`` real time steps. Unless it is the coarsest level, its steps are cut into
``n = ceil(N / m)`` chunks of ``m`` steps, padded to ``M = n * m`` steps with identity steps
(at the end, or at the front for a problem that runs backward in time, so that its chunks
line up with the forward problem's). Chunk starts are the C-points; the next level has one
step per chunk, so ``N_{l+1} = n_l``. The coarsest level is one chunk of all its steps.

States of a level are held in *chunk layout*: a tensor ``u`` of shape ``(m, n, *S)`` where
``u[j, c]`` is point ``c * m + j``, plus ``uend`` of shape ``S``, the last point ``M``. Step
``k = c * m + j`` maps point ``k`` to point ``k + 1``. With the position inside a chunk as the
leading axis, ``u[j]`` (all chunks at once) is contiguous, so one batched step is one GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass(frozen=True)
class Grid:
    """One level: ``N`` real steps as ``n`` chunks of ``m`` steps; real steps start at ``off``."""

    N: int
    m: int
    n: int
    off: int = 0

    @property
    def M(self) -> int:
        return self.m * self.n


def build_grids(steps: int, cfactor: int, levels: int, front: bool = False) -> list[Grid]:
    """The hierarchy for ``steps`` fine steps. Coarsening stops early when a level has no more
    than ``cfactor`` steps (a coarser level would be one interval: nothing left to solve)."""
    if steps < 1:
        raise ValueError(f"build_grids: need at least one time step, got {steps}")
    grids = []
    N = steps
    for level in range(levels):
        if level == levels - 1 or N <= cfactor:
            grids.append(Grid(N=N, m=N, n=1))
            break
        n = -(-N // cfactor)
        M = n * cfactor
        grids.append(Grid(N=N, m=cfactor, n=n, off=(M - N) if front else 0))
        N = n
    return grids


def to_chunks(flat: Tensor, grid: Grid) -> Tensor:
    """``(M, *S)`` in time order -> ``(m, n, *S)`` chunk layout (a contiguous copy)."""
    return flat.view(grid.n, grid.m, *flat.shape[1:]).transpose(0, 1).contiguous()


def chunk_view(flat: Tensor, grid: Grid) -> Tensor:
    """``(M, *S)`` in time order -> a ``(m, n, *S)`` strided view (no copy)."""
    return flat.view(grid.n, grid.m, *flat.shape[1:]).transpose(0, 1)


def flat_points(u: Tensor, uend: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """Chunk layout ``(m, n, *S)`` plus the last point -> all ``M + 1`` points in time order."""
    m, n = u.shape[:2]
    if out is None:
        out = u.new_empty((m * n + 1, *u.shape[2:]))
    out[: m * n].view(n, m, *u.shape[2:]).copy_(u.transpose(0, 1))
    out[m * n] = uend
    return out


def pad_steps(flat: Tensor, grid: Grid, fill: float = 0.0) -> Tensor:
    """Pad ``N`` real per-step values ``(N, *S)`` to ``(M, *S)``, at the front when ``grid.off``."""
    if grid.M == grid.N:
        return flat
    out = flat.new_full((grid.M, *flat.shape[1:]), fill)
    out[grid.off : grid.off + grid.N] = flat
    return out


def chunk_ends(u: Tensor, uend: Tensor) -> Tensor:
    """The C-points 1..n (each chunk's end point) as a new ``(n, *S)`` tensor."""
    return torch.cat([u[0, 1:], uend.unsqueeze(0)])
