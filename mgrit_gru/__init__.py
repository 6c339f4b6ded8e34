"""mgrit-gru: GRU layers trained parallel in time with multigrid reduction in time (MGRIT)."""

from .layer.control import BudgetWarning as BudgetWarning
from .layer.control import ConvergenceWarning as ConvergenceWarning
from .layer.control import DivergenceError as DivergenceError
from .layer.control import DivergenceWarning as DivergenceWarning
from .lstm.module import LSTM as LSTM
from .module import GRU as GRU
from .options import MGRIT as MGRIT
from .options import AdaptiveBudget as AdaptiveBudget
from .options import Auto as Auto
from .options import Budget as Budget
from .options import Frozen as Frozen
from .options import Guard as Guard
from .options import Implicit as Implicit
from .options import Secant as Secant
from .stats import RunStats as RunStats
from .stats import SolveStats as SolveStats

__all__ = [
    "GRU",
    "LSTM",
    "MGRIT",
    "Auto",
    "AdaptiveBudget",
    "Budget",
    "Frozen",
    "Guard",
    "Implicit",
    "Secant",
    "RunStats",
    "SolveStats",
    "BudgetWarning",
    "ConvergenceWarning",
    "DivergenceError",
    "DivergenceWarning",
]
__version__ = "0.2.0"
