"""The LSTM as a time-stepping problem: its cell (cell.py), one layer's MGRIT solves on
the problem-agnostic core (solve.py) and ``mgrit_gru.LSTM`` (module.py)."""
