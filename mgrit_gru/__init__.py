"""mgrit-gru: GRU layers trained parallel in time with multigrid reduction in time (MGRIT)."""

from .gru.solve import DivergenceError as DivergenceError
from .gru.solve import DivergenceWarning as DivergenceWarning
from .module import GRU as GRU
from .options import MGRIT as MGRIT
from .stats import RunStats as RunStats
from .stats import SolveStats as SolveStats

__all__ = ["GRU", "MGRIT", "RunStats", "SolveStats", "DivergenceError", "DivergenceWarning"]
__version__ = "0.1.0"
