"""Problem-agnostic MGRIT: grids, chunk layout, the FAS V-cycle."""

from .cycle import Propagator, SolveResult, solve
from .grid import Grid, build_grids, chunk_view, flat_points, pad_steps, to_chunks

__all__ = [
    "Grid",
    "Propagator",
    "SolveResult",
    "build_grids",
    "chunk_view",
    "flat_points",
    "pad_steps",
    "solve",
    "to_chunks",
]
