"""The same equivalence checks on CUDA tensors; skipped where no CUDA device is present."""

from __future__ import annotations

import pytest
import torch
from conftest import make_ref, max_errors, tight

import mgrit_gru

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("solver", ["serial", "mgrit"])
def test_cuda_equals_torch_float64(solver):
    ref = make_ref(3, 6, layers=2, bidirectional=True, zbias=2.0).cuda()
    opts = "serial" if solver == "serial" else tight(cfactor=8)
    ours = mgrit_gru.GRU.from_torch(ref, solver=opts)
    assert ours.weight_hh_l0.is_cuda
    x, h0 = torch.randn(500, 3, 3, device="cuda"), torch.randn(4, 3, 6, device="cuda")
    assert max(max_errors(ref, ours, x, h0)) < (1e-10 if solver == "serial" else 1e-8)


def test_cuda_packed_and_float32_default_solver():
    ref = make_ref(3, 16, dtype=torch.float32).cuda()
    ours = mgrit_gru.GRU.from_torch(ref)
    x = torch.randn(4000, 4, 3, device="cuda", dtype=torch.float32)
    lengths = torch.tensor([4000, 3000, 17, 2500])
    with torch.no_grad():
        y, hn = ours(x, lengths=lengths)
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        _, hn_ref = ref(packed)
    assert (hn - hn_ref).abs().max() < 1e-4
    assert torch.all(y[17:, 2] == 0)
