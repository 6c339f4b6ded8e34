"""One recurrent layer as MGRIT problems, for any cell: the forward and adjoint solves, the
control around them (guard, fallback, automatic choice), the autograd glue and the module
base that ``mgrit_gru.GRU`` and ``mgrit_gru.LSTM`` share. A cell (:mod:`mgrit_gru.gru`,
:mod:`mgrit_gru.lstm`) supplies its step, linearisation and gradients as a :class:`Cell`."""
