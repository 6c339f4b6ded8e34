"""The LSTM as a time-stepping problem: its cell (cell.py) and one layer's MGRIT solves
(solve.py) on the problem-agnostic core; the module is still to come."""
