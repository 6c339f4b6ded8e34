"""Time-parallel across processes (gloo on localhost): the same results and residual histories
as the single-process solve. One spawn per rank count, several cases inside it."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mgrit_gru
from mgrit_gru import trace
from mgrit_gru.distributed import (
    TimeGroup,
    gather_time,
    scatter_time,
    time_max,
    time_mean,
    time_slices,
)
from mgrit_gru.kernels import load as load_kernels
from mgrit_gru.layer.solve import step_kind
from mgrit_gru.projection import comparable, expand

CASES = [
    # (T, layers, bidirectional, variable lengths, MGRIT options)
    (203, 2, False, False, dict(cfactor=4, levels=3, tol=1e-12, max_iters=60)),
    (256, 1, False, False, dict(cfactor=8, tol=1e-12, max_iters=60, relax="F", levels=2)),
    (97, 1, False, False, dict(cfactor=4, levels=1)),  # serial: a pipeline over the ranks
    (150, 1, False, False, dict(cfactor=4)),  # default tol: iterates must match, not just converge
    # the reverse direction's padding sits at the front (T=203: 1 padding step, 3 levels)
    (203, 2, True, False, dict(cfactor=4, levels=3, tol=1e-12, max_iters=60)),
    (150, 1, True, True, dict(cfactor=4, tol=1e-12, max_iters=60)),
    (97, 2, True, True, dict(cfactor=4, levels=1)),
    (181, 1, False, True, dict(cfactor=4)),
    # the chunk-map coarse corrections: factors and secant pairs gathered over the ranks
    (203, 1, True, True, dict(cfactor=4, levels=3, tol=1e-12, max_iters=60, coarse="frozen")),
    (150, 2, False, False, dict(cfactor=4, tol=1e-12, max_iters=60, coarse="secant")),
    (181, 1, True, False, dict(cfactor=4, tol=1e-12, max_iters=60, relax="FCFCF")),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _grads(module, x, h0, wy, wh, loss_h, lengths=None):
    x = x.detach().clone().requires_grad_()
    h0 = h0.detach().clone().requires_grad_()
    if type(module) is torch.nn.GRU and lengths is not None:  # torch takes them packed
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        y, hn = module(packed, h0)
        y = torch.nn.utils.rnn.pad_packed_sequence(y, total_length=x.shape[0])[0]
    elif lengths is not None:
        y, hn = module(x, h0, lengths=lengths)
    else:
        y, hn = module(x, h0)
    loss = (y * wy).sum() + (hn * wh).sum() * loss_h
    loss.backward()
    return y.detach(), hn.detach(), x.grad, h0.grad, [p.grad.clone() for p in module.parameters()]


def _worker(rank: int, size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    replicated, root = TimeGroup(), TimeGroup(coarse="root")
    try:
        # every case with the coarse levels solved on every rank; two also on one rank
        for tg, (T, layers, bidir, varlen, opts) in [(replicated, c) for c in CASES] + [
            (root, CASES[0]),
            (root, CASES[5]),
        ]:
            torch.manual_seed(0)
            # the cost guard runs in one process only (ranks' meters count their own slices)
            options = mgrit_gru.MGRIT(**opts, guard=mgrit_gru.Guard(cost=False))
            kw = dict(num_layers=layers, bidirectional=bidir)
            single = mgrit_gru.GRU(3, 5, solver=options, **kw)
            with torch.no_grad():
                for name, p in single.named_parameters():
                    if name.startswith("bias_hh"):
                        p[5:10] += 2.0  # some memory: the coarse grid matters
            multi = mgrit_gru.GRU(3, 5, solver=options, time_group=tg, **kw)
            multi.load_state_dict(single.state_dict())
            D, B = 2 if bidir else 1, 3
            x, h0 = torch.randn(T, B, 3), torch.randn(D * layers, B, 5)
            wy, wh = torch.randn(T, B, D * 5), torch.randn(D * layers, B, 5)
            # the lengths end on several ranks' slices, one sequence is whole
            lengths = torch.tensor([T, T // 2, T // 3]) if varlen else None
            m = options.cfactor
            with trace.record(steps=T, cfactor=m) as single_trace:
                ref = _grads(single, x, h0, wy, wh, 1.0, lengths)
            y_r, hn_r, dx_r, dh0_r, dp_r = ref
            if opts.get("tol", 1.0) <= 1e-12 or options.num_levels(T) == 1:  # and torch.nn.GRU
                cudnn = torch.nn.GRU(3, 5, **kw)
                cudnn.load_state_dict(single.state_dict())
                for a, b in zip(ref, _grads(cudnn, x, h0, wy, wh, 1.0, lengths)):
                    for u, v in zip(a, b) if isinstance(a, list) else [(a, b)]:
                        assert (u - v).abs().max() < 1e-8, (T, bidir, varlen)
            with trace.record() as rank_trace:
                y, hn, dx, dh0, dp = _grads(
                    multi,
                    scatter_time(x, tg, m),
                    h0,
                    scatter_time(wy, tg, m),
                    wh,
                    float(rank == 0),
                    lengths,
                )
            if tg.coarse == "replicated":
                # the projection's premise: each rank's work and messages are those that
                # one process's trace, expanded to the group, says it has
                want = comparable(expand(single_trace, size)[rank])
                got = comparable(rank_trace.events)
                assert any(e[0] == "message" for e in got) and any(e[0] == "work" for e in got)
                first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
                assert got == want, (T, bidir, varlen, opts, first, len(got), len(want))
            t0, t1 = time_slices(T, size, m)[rank]
            assert y.shape[0] == t1 - t0
            errors = {
                "y": (gather_time(y, tg, T, m) - y_r).abs().max(),
                "h_n": (hn - hn_r).abs().max(),
                "dx": (gather_time(dx, tg, T, m) - dx_r).abs().max(),
                "dh0": (dh0 - dh0_r).abs().max(),
                "dparams": max((a - b).abs().max() for a, b in zip(dp, dp_r)),
            }
            bad = {k: float(v) for k, v in errors.items() if v > 1e-10}
            assert not bad, f"rank {rank} {tg.coarse} T={T} {bidir=} {varlen=} {opts}: {bad}"
            for a, b in zip(
                single.last_stats.forward + single.last_stats.backward,
                multi.last_stats.forward + multi.last_stats.backward,
            ):
                assert a.iterations == b.iterations and a.fell_back == b.fell_back, (a, b)
                assert len(a.residuals) == len(b.residuals)
                for ra, rb in zip(a.residuals, b.residuals):
                    assert abs(ra - rb) <= 1e-9 * max(ra, 1e-300) + 1e-14, (a, b)
        _pooled_heads_and_auto_cfactor(replicated)
        _lstm_time_parallel(replicated, rank, size)
    finally:
        dist.destroy_process_group()


LSTM_CASES = [
    # (T, layers, bidirectional, variable lengths, proj_size, MGRIT options)
    (203, 2, True, True, 0, dict(cfactor=4, levels=3, tol=1e-12, max_iters=60)),  # secant
    (150, 1, False, False, 0, dict(cfactor=4, tol=1e-12, max_iters=60, coarse="frozen")),
    (97, 1, True, True, 0, dict(cfactor=4, levels=1)),  # serial: a pipeline over the ranks
    # projected: h0 enters at each sequence's first real step, on whichever rank holds it
    (173, 2, True, True, 3, dict(cfactor=4, levels=3, tol=1e-12, max_iters=60)),
    (61, 1, True, False, 2, dict(cfactor=4, levels=1)),
]


def _lstm_run(module, x, state0, wy, wh, loss_h, lengths):
    """Outputs and every gradient of one LSTM call (torch's takes the lengths packed)."""
    x = x.detach().clone().requires_grad_()
    state = [t.clone().requires_grad_() for t in state0]
    if type(module) is torch.nn.LSTM and lengths is not None:
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        y, (hn, cn) = module(packed, tuple(state))
        y = torch.nn.utils.rnn.pad_packed_sequence(y, total_length=x.shape[0])[0]
    elif type(module) is torch.nn.LSTM:
        y, (hn, cn) = module(x, tuple(state))
    else:
        y, (hn, cn) = module(x, tuple(state), lengths=lengths)
    ((y * wy).sum() + ((hn * wh[..., : hn.shape[-1]]).sum() + (cn * wh).sum()) * loss_h).backward()
    grads = [x.grad, state[0].grad, state[1].grad] + [p.grad for p in module.parameters()]
    return [y.detach(), hn.detach(), cn.detach()] + grads


def _lstm_time_parallel(tg, rank: int, size: int) -> None:
    """mgrit_gru.LSTM on a time group equals one process's and torch.nn.LSTM's (outputs, h_n,
    c_n, every gradient); each rank's trace is the expansion of one process's."""
    for T, layers, bidir, varlen, proj, opts in LSTM_CASES:
        torch.manual_seed(1)
        options = mgrit_gru.MGRIT(**opts, guard=mgrit_gru.Guard(cost=False))
        kw = dict(num_layers=layers, bidirectional=bidir, proj_size=proj)
        ref = torch.nn.LSTM(3, 5, **kw)
        single = mgrit_gru.LSTM.from_torch(ref, solver=options)
        multi = mgrit_gru.LSTM(3, 5, solver=options, time_group=tg, **kw)
        multi.load_state_dict(ref.state_dict())
        D, B, m = 2 if bidir else 1, 3, options.cfactor
        x, h0, c0 = (
            torch.randn(T, B, 3),
            torch.randn(D * layers, B, proj or 5),
            torch.randn(D * layers, B, 5),
        )
        wy, wh = torch.randn(T, B, D * (proj or 5)), torch.randn(D * layers, B, 5)
        lengths = torch.tensor([T, T // 2, T // 3]) if varlen else None

        with trace.record(steps=T, cfactor=m) as single_trace:
            want = _lstm_run(single, x, (h0, c0), wy, wh, 1.0, lengths)
        for a, b in zip(want, _lstm_run(ref, x, (h0, c0), wy, wh, 1.0, lengths)):
            assert (a - b).abs().max() < 1e-8, (T, bidir, varlen, opts)
        with trace.record() as rank_trace:
            xs, wys = scatter_time(x, tg, m), scatter_time(wy, tg, m)
            got = _lstm_run(multi, xs, (h0, c0), wys, wh, float(rank == 0), lengths)
        assert comparable(rank_trace.events) == comparable(expand(single_trace, size)[rank])
        for k in (0, 3):  # y and dx are this rank's slices
            got[k] = gather_time(got[k], tg, T, m)
        for name, a, b in zip(["y", "h_n", "c_n", "dx", "dh0", "dc0"] + ["dparam"] * 99, got, want):
            assert (a - b).abs().max() < 1e-10, (rank, name, T, bidir, varlen, opts)


def _pooled_heads_and_auto_cfactor(tg) -> None:
    """The default options (cfactor "auto", derived by every rank from the global shape) and
    heads on the mean / max over every rank's steps (a loss every rank computes from global
    values counts once per rank: divided by the group's size): gradients equal to one
    process's mean / amax, with and without lengths."""
    torch.manual_seed(0)
    single = mgrit_gru.GRU(3, 5, batch_first=True, solver="serial")
    multi = mgrit_gru.GRU(3, 5, batch_first=True, solver=mgrit_gru.MGRIT(), time_group=tg)
    multi.load_state_dict(single.state_dict())
    T, B = 301, 3
    x, w = torch.randn(B, T, 3), torch.randn(5)
    m = multi.time_cfactor(T, B)
    assert m == mgrit_gru.MGRIT().resolve(T, B, 5, ranks=tg.size, kind=step_kind()).cfactor
    for lengths in (None, torch.tensor([T, 200, 7])):
        for pool in ("mean", "max"):
            xs = x.clone().requires_grad_()
            y, _ = single(xs)
            if lengths is not None:
                valid = (torch.arange(T)[None, :] < lengths[:, None]).unsqueeze(-1)
                y = y.masked_fill(~valid, float("-inf")) if pool == "max" else y * valid
            ref = (
                y.amax(1)
                if pool == "max"
                else y.sum(1) / (T if lengths is None else lengths[:, None])
            )
            (ref @ w).sum().backward()
            xl = scatter_time(x, tg, multi, dim=1).clone().requires_grad_()
            y, _ = multi(xl, lengths=lengths)
            reduce = time_max if pool == "max" else time_mean
            got = reduce(y, tg, T, m, lengths)
            assert (got - ref).abs().max() < 1e-10
            ((got @ w).sum() / tg.size).backward()
            dx = gather_time(xl.grad, tg, T, multi, dim=1)
            assert (dx - xs.grad).abs().max() < 1e-10, (pool, lengths)


@pytest.mark.parametrize("ranks", [2, 3])
def test_time_parallel_equals_single_process(ranks):
    mp.spawn(_worker, args=(ranks, _free_port()), nprocs=ranks, join=True)


def _fault_worker(rank: int, size: int, port: int) -> None:
    import time

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=timedelta(seconds=10))
    torch.set_num_threads(1)
    tg = TimeGroup(roll_call_s=2.0)
    opts = mgrit_gru.MGRIT(cfactor=4)
    # 1. ranks that built different models are stopped at the start, with the culprit named
    torch.manual_seed(rank)  # rank 1 gets other weights
    gru = mgrit_gru.GRU(3, 5, solver=opts, time_group=tg)
    x = scatter_time(torch.randn(64, 2, 3), tg, 4)
    with pytest.raises(ValueError, match=r"rank\(s\) \[1\] hold other weights than rank 0"):
        gru(x)
    # ... and ranks that would cut other chunks (cfactor="auto" follows the steps that run:
    # one rank on the compiled sweeps, the other on the PyTorch steps)
    if load_kernels(build=False) is not None:
        torch.manual_seed(0)
        kind = "pytorch" if rank == 1 else "auto"
        gru = mgrit_gru.GRU(3, 5, solver=mgrit_gru.MGRIT(), time_group=tg, kernels=kind)
        with pytest.raises(ValueError, match=r"\[1\] hold other options .* kind of steps"):
            gru(x)
    # 2. a rank that dies: the survivor gets an error naming the failure, not a hang
    torch.manual_seed(0)
    gru = mgrit_gru.GRU(3, 5, solver=opts, time_group=tg)
    if rank == 1:
        os._exit(0)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 0: .* failed; rank\(s\) \[1\] did not answer"):
        gru(x)
    assert time.monotonic() - start < 30.0
    dist.destroy_process_group()  # its threads stopped before the interpreter's exit


def test_mismatch_and_dead_rank_give_clear_errors():
    mp.spawn(_fault_worker, args=(2, _free_port()), nprocs=2, join=True)


def _hang_worker(rank: int, size: int, port: int) -> None:
    import time

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=timedelta(seconds=3))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tg = TimeGroup(roll_call_s=1.0)
    gru = mgrit_gru.GRU(3, 5, solver=mgrit_gru.MGRIT(cfactor=4), time_group=tg)
    x = scatter_time(torch.randn(64, 2, 3), tg, 4)
    gru(x)  # one good call first
    if rank == 2:  # alive, but stuck elsewhere: the others time out and name it
        time.sleep(9.0)
        os._exit(0)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"failed; rank\(s\) \[2\] did not answer.*hang"):
        gru(x)[0].sum().backward()
    assert time.monotonic() - start < 8.0  # the 3 s timeout plus the 1 s roll call
    # rank 0 hosts the rendezvous store: it stays until the other survivor's roll call is over
    store = dist.distributed_c10d._get_default_store()
    store.set(f"hang-test/done/{rank}", "1")
    if rank == 0:
        store.wait([f"hang-test/done/{r}" for r in (0, 1)], timedelta(seconds=30))
    dist.destroy_process_group()


def test_hung_rank_is_named_within_the_timeout():
    mp.spawn(_hang_worker, args=(3, _free_port()), nprocs=3, join=True)


def _train_worker(rank: int, size: int, port: int, out: str) -> None:
    from pathlib import Path

    from mgrit_gru.app.config import TrainConfig
    from mgrit_gru.app.train import train

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=timedelta(seconds=60))
    cfg = TrainConfig(
        dataset="adding",
        length=120,
        max_train=48,
        max_test=16,
        hidden=6,
        bidirectional=True,
        batch_size=16,
        epochs=2,
        threads=1,  # the defaults otherwise: solver auto, cfactor auto, mean pooling
        time_parallel=size,
    )
    rows = train(cfg, Path(out) / "parallel", progress=False, log=lambda *a: None)
    if rank == 0:
        single = train(
            cfg.replace(time_parallel=1), Path(out) / "single", progress=False, log=lambda *a: None
        )
        for a, b in zip(rows, single):
            for key in ("train_loss", "test_loss", "train_acc", "test_acc"):
                assert abs(a[key] - b[key]) < 1e-5, (key, a[key], b[key])
    dist.barrier()
    dist.destroy_process_group()
    # the group is freed: none of its threads runs on into the interpreter's exit (they could
    # abort the process there); nothing of the run may hold it, nor torch modules imported
    # after it (torch._dynamo's, at the first optimizer)
    assert not _backend_threads(), _backend_threads()


def _backend_threads() -> list[str]:
    """The names of this process's gloo and TCPStore threads (on Linux; elsewhere none)."""
    names = []
    for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # a thread that has just ended
            pass
    return [n for n in names if "gloo" in n or "tcpstore" in n]


def test_time_parallel_training_matches_single_process(tmp_path):
    mp.spawn(_train_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    assert (tmp_path / "parallel" / "checkpoint.pt").exists()
    assert len((tmp_path / "parallel" / "metrics.jsonl").read_text().splitlines()) == 2


def _mesh_worker(rank: int, size: int, port: int) -> None:
    from mgrit_gru.distributed import data_time_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    data_group, tg = data_time_mesh(2, 2)
    replica = dist.get_rank(data_group)  # which half of the batch
    torch.manual_seed(0)
    opts = mgrit_gru.MGRIT(cfactor=4, tol=1e-12, max_iters=60, guard=mgrit_gru.Guard(cost=False))
    single = mgrit_gru.GRU(3, 5, solver=opts)
    multi = mgrit_gru.GRU(3, 5, solver=opts, time_group=tg)
    multi.load_state_dict(single.state_dict())
    T = 90
    x, h0 = torch.randn(T, 4, 3), torch.randn(1, 4, 5)
    wy, wh = torch.randn(T, 4, 5), torch.randn(1, 4, 5)
    y_r, hn_r, dx_r, dh0_r, dp_r = _grads(single, x, h0, wy, wh, 1.0)
    rows = slice(2 * replica, 2 * replica + 2)
    first = float(tg.rank == 0)
    y, hn, dx, dh0, dp = _grads(
        multi,
        scatter_time(x[:, rows], tg, 4),
        h0[:, rows],
        scatter_time(wy[:, rows], tg, 4),
        wh[:, rows],
        first,
    )
    for grad in dp:  # the data-parallel reduction
        dist.all_reduce(grad, group=data_group)
    assert (gather_time(y, tg, T, 4) - y_r[:, rows]).abs().max() < 1e-10
    assert (hn - hn_r[:, rows]).abs().max() < 1e-10
    assert (gather_time(dx, tg, T, 4) - dx_r[:, rows]).abs().max() < 1e-10
    assert (dh0 - dh0_r[:, rows]).abs().max() < 1e-10
    assert max((a - b).abs().max() for a, b in zip(dp, dp_r)) < 1e-10
    dist.destroy_process_group()


def test_data_by_time_mesh():
    mp.spawn(_mesh_worker, args=(4, _free_port()), nprocs=4, join=True)


# A rank of `mgrit-gru train --time-parallel 2` under torchrun that is killed (SIGKILL) as its
# second epoch starts; the other is left to find out.
_KILLED_RANK = """
import os, signal, sys
if os.environ.get("RANK") == "1":
    from mgrit_gru.app import train
    real = train._train_epoch
    def epoch(cfg, model, optimizer, data, number, *args, **kwargs):
        if number == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(cfg, model, optimizer, data, number, *args, **kwargs)
    train._train_epoch = epoch
from mgrit_gru.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_rank_under_torchrun_is_one_line_and_resumable(tmp_path):
    """Real processes: torchrun, two ranks, rank 1 killed in epoch 2. Rank 0 says it in one
    line of the library's (the lost rank, how to resume; no gloo traceback) and exits with 3;
    resuming with the command it names finishes the run."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "killed.py"
    script.write_text(_KILLED_RANK)
    run = tmp_path / "run"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    args = ["train", "--time-parallel", "2", "--dataset", "adding", "--length", "64"]
    args += ["--max-train", "32", "--max-test", "16", "--hidden", "8", "--batch-size", "16"]
    args += ["--epochs", "2", "--cfactor", "4", "--threads", "1", "--timeout", "20"]
    args += ["--out", str(run), "--no-progress", "--no-speed-check"]
    env = {**os.environ, "MGRIT_GRU_CALIBRATION": "builtin", "OMP_NUM_THREADS": "1"}
    port = ["--master-port", str(_free_port())]
    done = subprocess.run(
        [torchrun, "--nproc-per-node", "2", *port, str(script), *args],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    out = done.stdout + done.stderr
    ours = [line for line in out.splitlines() if line.startswith("mgrit-gru train: error:")]
    assert done.returncode != 0 and len(ours) == 1, out
    assert "time-parallel rank 0" in ours[0] and "rank(s) [1] did not answer" in ours[0]
    assert f"-m mgrit_gru.cli train --resume {run}" in ours[0]
    assert "distributed_c10d.py" not in out  # no gloo traceback of the surviving rank
    resumed = subprocess.run(
        [torchrun, "--nproc-per-node", "2", *port, "-m", "mgrit_gru.cli", "train", "--resume",
         str(run), "--no-progress", "--no-speed-check"],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_the_gradients_are_summed_over_the_ranks_in_one_message():
    """The layer's parameter and start-state gradients go over the ranks in one all-reduce
    (one message and one wait, not five), each tensor back in place with its own shape."""
    from mgrit_gru.layer.autograd import _sum_together

    class TwoAlike:  # two ranks holding the same values: a sum doubles them
        calls = 0

        def sum_(self, tensor):
            self.calls += 1
            return tensor.mul_(2)

    comm = TwoAlike()
    grads = (
        torch.randn(6, 3),
        torch.randn(6, 2),
        torch.randn(6),
        torch.randn(6),
        torch.randn(4, 2),
    )
    want = [2 * g for g in grads]
    _sum_together(comm, grads)
    assert comm.calls == 1
    assert all(torch.equal(g, w) for g, w in zip(grads, want))
