"""The GRU as a time-stepping problem: cell math and its MGRIT forward/adjoint problems."""
