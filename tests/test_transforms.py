"""PyTorch 2 conventions: a model holding the layers compiles (torch.compile), and torch.func
transforms (grad, jacrev, vmap) see through them. References: the same model run eagerly,
torch.nn.GRU, and autograd."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.func import functional_call, grad, jacrev, vmap

import mgrit_gru

SOLVERS = ["serial", "auto", mgrit_gru.MGRIT(cfactor=4)]


class Classifier(torch.nn.Module):
    """A head on the mean of the outputs plus the final states (every output path used)."""

    def __init__(self, solver, hidden=5, **kwargs):
        super().__init__()
        self.rnn = mgrit_gru.GRU(3, hidden, solver=solver, **kwargs)
        self.head = torch.nn.Linear(self.rnn.hidden_size * (1 + self.rnn.bidirectional), 2)

    def forward(self, x, lengths=None):
        kwargs = {} if lengths is None else {"lengths": lengths}
        y, h_n = self.rnn(x, **kwargs)
        return self.head(y.mean(0)) + h_n.sum(0).sum(-1, keepdim=True)


def _loss_and_grads(model, x, lengths=None, call=None):
    """The loss of ``call`` (default: ``model``) and the gradients of ``model``'s parameters."""
    model.zero_grad()
    loss = (model if call is None else call)(x, lengths).square().sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("solver", SOLVERS, ids=["serial", "auto", "mgrit"])
def test_compiled_model_matches_eager(solver):
    """torch.compile of a model that contains the layer: forward and backward equal eager's
    over calls of several lengths (which once crashed for serial and recompiled past dynamo's
    limit for MGRIT: the layer now runs eagerly inside the compiled model)."""
    torch._dynamo.reset()
    model = Classifier(solver)
    compiled = torch.compile(model, backend="aot_eager")
    for T in (30, 17, 30, 41, 17, 30, 9, 23):
        x = torch.randn(T, 4, 3)
        lengths = torch.tensor([T, T - 2, T, 3]) if T == 23 else None
        loss, grads = _loss_and_grads(model, x, lengths)
        loss_c, grads_c = _loss_and_grads(model, x, lengths, compiled)
        torch.testing.assert_close(loss_c, loss, rtol=1e-9, atol=1e-12)
        for name in grads:
            torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-7, atol=1e-10)
    assert model.rnn.last_stats is not None and model.rnn.last_stats.backward


@pytest.mark.slow
def test_compiled_with_inductor_runs_forward_and_backward():
    """The default backend (inductor) compiles the rest of the model, forward and backward."""
    if not any(shutil.which(cxx) for cxx in ("g++", "clang++", "c++")):  # pragma: no cover
        pytest.skip("no C++ compiler for inductor")
    torch._dynamo.reset()
    model = Classifier("serial").float()
    x = torch.randn(12, 2, 3, dtype=torch.float32)
    loss, grads = _loss_and_grads(model, x)
    loss_c, grads_c = _loss_and_grads(model, x, call=torch.compile(model))
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("solver", SOLVERS, ids=["serial", "auto", "mgrit"])
def test_func_grad_equals_autograd(solver):
    """torch.func.grad through functional_call gives autograd's parameter gradients (of
    torch.nn.GRU's weights copied into the layer), and last_stats says how it was solved."""
    model = Classifier(solver, num_layers=2, bidirectional=True)
    ref = Classifier("serial", num_layers=2, bidirectional=True)
    ref.load_state_dict(model.state_dict())
    ref.rnn = model.rnn.to_torch()  # the reference: torch.nn.GRU under plain autograd
    x = torch.randn(13, 3, 3)
    params = {n: p.detach() for n, p in model.named_parameters()}
    grads = grad(lambda p: functional_call(model, p, (x,)).square().sum())(params)
    _, expected = _loss_and_grads(ref, x)
    for name, g in grads.items():
        torch.testing.assert_close(g, expected[name], rtol=1e-9, atol=1e-12)
    stats = model.rnn.last_stats
    assert len(stats.forward) == 4 and all(s.levels == 1 for s in stats.forward)
    if solver != "serial":
        assert "torch.func" in stats.summary()


def test_func_jacrev_and_vmap_match_torch_gru():
    """jacrev of the outputs w.r.t. the input equals autograd's Jacobian of torch.nn.GRU (with
    lengths: the padded steps' rows are zero), and vmap over unbatched sequences equals the
    batched call."""
    gru = mgrit_gru.GRU(3, 4, solver="auto")
    ref = gru.to_torch()
    x = torch.randn(7, 2, 3)
    jac = jacrev(lambda x: gru(x)[0])(x)
    expected = torch.autograd.functional.jacobian(lambda x: ref(x)[0], x)
    torch.testing.assert_close(jac, expected, rtol=1e-9, atol=1e-12)
    lengths = torch.tensor([7, 4])
    jac = jacrev(lambda x: gru(x, lengths=lengths)[1])(x)
    of_second = jac[0, 1, :, :, 1]  # d h_n of sequence 1 / d its input steps (H, T, I)
    assert of_second[:, 4:].abs().max() == 0 and of_second[:, :4].abs().max() > 0
    batched, h_n = gru(x)
    each, each_h = vmap(gru, in_dims=1, out_dims=1)(x)
    torch.testing.assert_close(each, batched, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(each_h, h_n, rtol=1e-12, atol=1e-12)
