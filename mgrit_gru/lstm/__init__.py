"""The LSTM as a time-stepping problem (cell math; see cell.py)."""
