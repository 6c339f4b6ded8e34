"""Applications on top of the library: datasets, training, reports (the ``mgrit-gru`` CLI)."""
