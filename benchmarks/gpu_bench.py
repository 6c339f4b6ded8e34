"""The GPU part of benchmarks/gpu_check.sh: correctness on CUDA, the table against cuDNN, the
cost model's CUDA constants, the early exit's host reads, a CUDA-graph trial and the trained
checkpoints. Every part runs under one deadline and writes what it has as it goes.

    python3 benchmarks/gpu_bench.py --out DIR [--deadline-s 420] [--dry-run]

--dry-run: the same parts on the CPU with tiny sizes (under a minute), so that the script is
exercised where no GPU is (the test suite runs it).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mgrit_gru  # noqa: E402
from mgrit_gru import MGRIT, cost  # noqa: E402
from mgrit_gru.gru import cell  # noqa: E402
from mgrit_gru.layer.solve import step_kind  # noqa: E402
from mgrit_gru.projection import LINKS, Machine, expand, machines, replay  # noqa: E402
from mgrit_gru.projection.record import record_step  # noqa: E402


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class Report:
    """Rows and lines, written to DIR/bench.json and DIR/bench.txt after every part."""

    def __init__(self, out: Path, meta: dict) -> None:
        self.out, self.data, self.lines = out, {"meta": meta, "failures": []}, []

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def put(self, key: str, value) -> None:
        self.data[key] = value
        self.save()

    def fail(self, what: str) -> None:
        self.data["failures"].append(what)
        self.line(f"FAILED: {what}")

    def save(self) -> None:
        (self.out / "bench.json").write_text(json.dumps(self.data, indent=1))
        (self.out / "bench.txt").write_text("\n".join(self.lines) + "\n")


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int = 3) -> float:
    """Median seconds of ``fn()`` over ``repeats`` after one warm-up, waiting for the queue."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def problem(T, B, I, H, device, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.GRU(I, H).to(device, dtype)
    x = torch.randn(T, B, I, device=device, dtype=dtype)
    w = torch.randn(T, B, H, device=device, dtype=dtype)
    return ref, x, w


def train_step(module, x, w, amp=None):
    x = x.detach().requires_grad_()
    module.zero_grad(set_to_none=True)
    ctx = torch.autocast(x.device.type, dtype=amp) if amp else torch.autocast("cpu", enabled=False)
    with ctx:
        y, h = module(x)
        loss = (y.float() * w).sum() + h.float().sum()
    loss.backward()
    return y.detach(), x.grad


def forward(module, x, amp=None):
    ctx = torch.autocast(x.device.type, dtype=amp) if amp else torch.autocast("cpu", enabled=False)
    with torch.no_grad(), ctx:
        return module(x)[0]


# -- 1. correctness on the device ----------------------------------------------------------


def correctness(report: Report, device, sizes) -> None:
    """The device's serial and MGRIT solves against the CPU's float64 serial solve."""
    report.line(
        "== correctness: CUDA results against the CPU float64 serial solve (cuDNN's TF32 off: "
        "torch.backends.cudnn.allow_tf32 = False)"
    )
    rows = []
    for T, B, H in sizes:
        ref, x, w = problem(T, B, 8, H, torch.device("cpu"), torch.float64)
        exact = mgrit_gru.GRU.from_torch(ref, solver="serial")
        y0, g0 = train_step(exact, x, w)
        for name, solver, bound in (
            ("serial", "serial", 1e-4),
            ("mgrit", MGRIT(), 1e-3),
            ("mgrit frozen FCFCF", MGRIT(coarse="frozen", relax="FCFCF"), 1e-3),
            ("auto", "auto", 1e-3),
        ):
            module = mgrit_gru.GRU.from_torch(ref, solver=solver).to(device, torch.float32)
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                y, g = train_step(module, x.to(device, torch.float32), w.to(device, torch.float32))
            err_y = (y.double().cpu() - y0).abs().max().item()
            err_g = ((g.double().cpu() - g0).norm() / g0.norm()).item()
            ok = err_y < bound and err_g < 10 * bound
            rows.append({"T": T, "B": B, "H": H, "solver": name, "y_err": err_y, "dx_rel": err_g})
            report.line(
                f"  T={T:>6} B={B:>3} H={H:>4} {name:<20} max|dy| {err_y:.1e}  rel dx {err_g:.1e}"
                + ("" if ok else "  <-- beyond tolerance")
            )
            if not ok:
                report.fail(f"correctness {name} T={T} B={B} H={H}: {err_y:.1e} / {err_g:.1e}")
    report.put("correctness", rows)


def refused(report: Report, rows: list, shape: dict, name: str, exc: Exception) -> None:
    """A solver that raised at this shape: recorded as a row with its error."""
    text = " ".join(str(exc).split())[:160]
    rows.append({**shape, "solver": name, "error": text})
    report.line(f"  {shape} {name}: raised {type(exc).__name__}: {text}")


# -- 2. the table against cuDNN ------------------------------------------------------------

PIECE = 32768  # the pieced baseline's piece length


class Pieced(torch.nn.Module):
    """torch.nn.GRU run over pieces of PIECE steps, each starting from the last one's h_n:
    the same result as one call, in shapes cuDNN takes."""

    def __init__(self, gru: torch.nn.GRU) -> None:
        super().__init__()
        self.gru = gru

    def forward(self, x):
        h, ys = None, []
        for piece in x.split(PIECE):
            y, h = self.gru(piece, h)
            ys.append(y)
        return torch.cat(ys), h


def table(report: Report, device, budget: Budget, grid, serial_max_T: int) -> None:
    """Forward and training step of torch.nn.GRU (cuDNN on CUDA), the serial solver and
    MGRIT (defaults; and solver="auto"), fp32 and bf16 autocast. The serial rows run up to
    serial_max_T (a Python loop of T steps); beyond they are left out, not estimated."""
    report.line("== table: ms per call (median of 3); x cuDNN = torch.nn.GRU's time / this")
    report.line(
        f"{'T':>7} {'B':>3} {'H':>4} {'dtype':>5} {'solver':<10} {'fwd ms':>9} {'train ms':>9} "
        f"{'x cuDNN f':>9} {'x cuDNN t':>9} {'it f/b':>7}"
    )
    rows = []
    for T, B, H in grid:
        for amp_name, amp in (("fp32", None), ("bf16", torch.bfloat16)):
            if budget.left() < 30:
                report.line(f"  (deadline: stopped before T={T} B={B} H={H} {amp_name})")
                report.put("table", rows)
                return
            ref, x, w = problem(T, B, 32, H, device)
            # where cuDNN refuses T (>= 65536 on the H200), what a user would do instead:
            # torch.nn.GRU over 32768-step pieces, carrying the hidden state
            base_name = "cuDNN" if T <= PIECE else "cuDNN pieces"
            solvers = {base_name: ref if T <= PIECE else Pieced(ref)}
            solvers["mgrit"] = mgrit_gru.GRU.from_torch(ref, solver=MGRIT())
            budget21 = MGRIT(budget=mgrit_gru.Budget())
            solvers["budget 2/1"] = mgrit_gru.GRU.from_torch(ref, solver=budget21)
            solvers["auto"] = mgrit_gru.GRU.from_torch(ref, solver="auto")
            if T <= serial_max_T:
                solvers["serial"] = mgrit_gru.GRU.from_torch(ref, solver="serial")
            base = {}
            for name, module in solvers.items():
                try:
                    fwd = timed(functools.partial(forward, module, x, amp), device)
                    step = timed(functools.partial(train_step, module, x, w, amp), device)
                except RuntimeError as exc:  # cuDNN refuses some shapes: a row, not the end
                    refused(report, rows, {"T": T, "B": B, "H": H, "dtype": amp_name}, name, exc)
                    continue
                stats = getattr(module, "last_stats", None)
                its = "-" if stats is None else f"{stats.forward_iterations}/"
                its += "" if stats is None else f"{stats.backward_iterations}"
                if name.startswith("cuDNN"):
                    base = {"fwd": fwd, "train": step}
                base = base or {"fwd": float("nan"), "train": float("nan")}
                row = {
                    "T": T,
                    "B": B,
                    "H": H,
                    "dtype": amp_name,
                    "solver": name,
                    "fwd_ms": 1e3 * fwd,
                    "train_ms": 1e3 * step,
                    "x_cudnn_fwd": base["fwd"] / fwd,
                    "x_cudnn_train": base["train"] / step,
                    "iterations": its,
                }
                rows.append(row)
                report.line(
                    f"{T:>7} {B:>3} {H:>4} {amp_name:>5} {name:<10} {1e3 * fwd:>9.2f} "
                    f"{1e3 * step:>9.2f} {row['x_cudnn_fwd']:>9.2f} {row['x_cudnn_train']:>9.2f} "
                    f"{its:>7}"
                )
            report.put("table", rows)
            solvers.clear()
            if device.type == "cuda":
                torch.cuda.empty_cache()


# -- 3. the cost model's constants ---------------------------------------------------------


def _repeat(fn, times: int) -> None:
    for _ in range(times):
        fn()


def calibrate(report: Report, device, rows_list, H: int) -> None:
    """Time one library step and one adjoint step against their rows; fit o + c * rows."""
    report.line(f"== calibration of mgrit_gru.cost on {device.type} (H={H}): o + c * rows")
    fits = {}
    for kind in ("step", "adjoint"):
        pts = []
        for rows in rows_list:
            h = torch.rand(rows, H, device=device) - 0.5
            gx, w_hh = torch.randn(rows, 3 * H, device=device), torch.randn(3 * H, H, device=device)
            b, out = torch.randn(H, device=device), torch.empty(rows, H, device=device)
            C, D = torch.rand(rows, 3 * H, device=device), torch.rand(rows, H, device=device)
            if kind == "step":
                fn = functools.partial(cell.step, h, gx, w_hh, b, "classic", out=out)
            else:
                fn = functools.partial(cell.adjoint_step, h, D, C, w_hh, out=out)
            reps = 50
            pts.append((rows, 1e6 * timed(functools.partial(_repeat, fn, reps), device) / reps))
        (r0, t0), (r1, t1) = pts[len(pts) // 2], pts[-1]
        c = max((t1 - t0) / (r1 - r0), 1e-9)
        o = max(pts[0][1] - c * pts[0][0], 0.0)
        scale = (H / 64) ** cost.H_EXPONENT
        fits[kind] = (round(o, 2), c / scale)
        report.line(
            f"  {kind:<8} " + "  ".join(f"{r}:{t:.1f}us" for r, t in pts) + f"  -> o={o:.1f} us, "
            f"c={c / scale:.2e} us/row at H=64"
        )
    report.line(
        f'  CALIBRATION["{device.type}"] = {{"step": {fits["step"]}, "adjoint": '
        f"{fits['adjoint']}, ...}}  (model now: {cost.CALIBRATION.get(device.type)})"
    )
    report.put(f"calibration_H{H}", {k: list(v) for k, v in fits.items()})


# -- 4. the early exit's host reads and 5. CUDA graphs -------------------------------------


def early_exit(report: Report, device, T: int, B: int, H: int) -> None:
    """MGRIT with and without early exit (whose check reads one number to the host every
    few steps: a stream synchronisation on CUDA)."""
    ref, x, w = problem(T, B, 32, H, device)
    res = {}
    for flag in (True, False):
        module = mgrit_gru.GRU.from_torch(ref, solver=MGRIT(cfactor=64, early_exit=flag))
        res[flag] = timed(functools.partial(train_step, module, x, w), device)
    report.line(
        f"== early exit at T={T} B={B} H={H}: on {1e3 * res[True]:.2f} ms, off "
        f"{1e3 * res[False]:.2f} ms (ratio {res[False] / res[True]:.2f})"
    )
    report.put("early_exit", {"on_ms": 1e3 * res[True], "off_ms": 1e3 * res[False]})


def _graphed(fn):
    """``fn`` captured once in a CUDA graph (after a warm-up that compiles its kernels): the
    replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def graphs(report: Report, device, steps: int, rows: int, H: int) -> None:
    """A level's F-sweep (``steps`` library steps over ``rows`` states) eager against one
    CUDA-graph replay. Only measured here; the library adopts graphs if this pays."""
    if device.type != "cuda":
        report.line("== CUDA graphs: no CUDA device (dry run)")
        report.put("graphs", None)
        return
    u = torch.zeros(steps + 1, rows, H, device=device)
    gx = torch.randn(steps, rows, 3 * H, device=device)
    w_hh, b = torch.randn(3 * H, H, device=device) / H**0.5, torch.randn(H, device=device)

    def sweep():
        for j in range(steps):
            cell.step(u[j], gx[j], w_hh, b, "classic", out=u[j + 1])

    eager = timed(sweep, device)
    replay = timed(_graphed(sweep), device)
    report.line(
        f"== CUDA graphs: F-sweep of {steps} steps x {rows} rows, H={H}: eager "
        f"{1e3 * eager:.2f} ms, graph replay {1e3 * replay:.2f} ms ({eager / replay:.1f}x)"
    )
    report.put("graphs", {"eager_ms": 1e3 * eager, "replay_ms": 1e3 * replay})


# -- 6. the trained checkpoints ------------------------------------------------------------


def trained(report: Report, device, cache: Path, repeats: int, limit=None) -> None:
    """benchmarks/trained_models.py's timing on the device, from its cached checkpoints and
    batches (no data package needed); ``limit``: the first few checkpoints only."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import trained_models as tm

    found = sorted(cache.glob("*/epoch-*/checkpoint.pt"))[:limit]
    if not found:
        report.line(f"== trained checkpoints: none in {cache} (run trained_models.py, carry it)")
        report.put("trained", None)
        return
    report.line("== trained checkpoints: training step on the device")
    report.line(tm.TIME_HEADER)
    rows = []
    for path in found:
        cfg, model, torch_model, batches, epoch = tm.load_cached(path.parent, device)
        rows += tm.time_table(
            cfg.dataset,
            epoch,
            model,
            torch_model,
            batches,
            {"mgrit default": MGRIT()},
            repeats,
            log=report.line,
            device=device,
        )
        report.put("trained", rows)


# -- 7. what the projection's device model needs (mgrit-gru project) ------------------------


class _CountOps:
    """Counts the aten operators dispatched inside a ``with`` block (each is one or more
    kernels on CUDA)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.n += 1
                return func(*args, **(kwargs or {}))

        self.n, self.mode = 0, Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _kernels(fn, device) -> Optional[int]:
    """CUDA kernels that ``fn()`` launches (the profiler's CUDA activity); None off CUDA or
    where the profiler cannot see kernels."""
    if device.type != "cuda":
        return None
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        sync(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            sync(device)
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:  # no CUPTI: the operator count stands in
        return None


def machine(report: Report, device, H: int) -> None:
    """Launch latency (a tiny in-place op, back to back), a host read, memory bandwidth (a
    large copy) and a GEMM's rate at the bulk shapes of a layer (rows x 3H x I)."""
    tiny = torch.zeros(1, device=device)
    n = 2000

    def ops():
        for _ in range(n):
            tiny.add_(1.0)

    op_us = 1e6 * timed(ops, device) / n
    view_us = machines.op_us(device.type)[1]

    def reads():
        for _ in range(200):
            float(tiny)

    read_us = 1e6 * timed(reads, device) / 200
    numel = (1 << 26) if device.type == "cuda" else (1 << 20)
    src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
    copy_s = timed(lambda: dst.copy_(src), device)
    bw = 2 * 4 * numel / copy_s / 1e9
    rows = (1 << 18) if device.type == "cuda" else (1 << 12)
    a, b = torch.randn(rows, 32, device=device), torch.randn(32, 3 * H, device=device)
    gemm_s = timed(lambda: a @ b, device)
    out = {
        "op_us": op_us,
        "view_us": view_us,
        "host_read_us": read_us,
        "copy_GBps": bw,
        "gemm_rows": rows,
        "gemm_GFLOPs": 2 * rows * 32 * 3 * H / gemm_s / 1e9,
        "gemm_us": 1e6 * gemm_s,
    }
    report.line(
        f"== machine: {op_us:.2f} us per tiny op (back to back), {view_us:.2f} us per view, "
        f"{read_us:.1f} us per host "
        f"read, copy {bw:.0f} GB/s, GEMM {rows}x32x{3 * H}: {out['gemm_GFLOPs']:.0f} GFLOP/s"
    )
    report.put("machine", out)


def kernels(report: Report, device, H: int, T: int) -> None:
    """Operators (and CUDA kernels) per library step, per adjoint step and per training step
    of the serial solver and MGRIT, at B=4, I=32."""
    rows = 4 * 64
    h = torch.rand(rows, H, device=device) - 0.5
    gx, w_hh = torch.randn(rows, 3 * H, device=device), torch.randn(3 * H, H, device=device)
    b, out_ = torch.randn(H, device=device), torch.empty(rows, H, device=device)
    C, D = torch.rand(rows, 3 * H, device=device), torch.rand(rows, H, device=device)
    calls = {
        "step": functools.partial(cell.step, h, gx, w_hh, b, "classic", out=out_),
        "adjoint": functools.partial(cell.adjoint_step, h, D, C, w_hh, out=out_),
    }
    ref, x, w = problem(T, 4, 32, H, device)
    for name, solver in (("serial", "serial"), ("mgrit", MGRIT()), ("cuDNN", None)):
        module = ref if solver is None else mgrit_gru.GRU.from_torch(ref, solver=solver)
        calls[f"train {name} T={T}"] = functools.partial(train_step, module, x, w)
    res = {}
    for name, fn in calls.items():
        fn()
        with _CountOps() as c:
            fn()
        res[name] = {"ops": c.n, "kernels": _kernels(fn, device)}
        report.line(f"== kernels: {name}: {c.n} operators, {res[name]['kernels']} CUDA kernels")
    report.put("kernels", res)


def sweeps(report: Report, device, rows_list, H: int) -> None:
    """The library's step and adjoint step as the solves run them (an F-relaxation through
    the cycle: indexing, the meter, the loop), per row count: the device model's steps. The
    PyTorch steps ("step", "adjoint"), the compiled sweeps of the device ("sweep",
    "sweep_adjoint": Triton on CUDA, C++ on the CPU; one call per sweep) and, on CUDA, the
    compiled sweep replayed from a CUDA graph ("... graph")."""
    from mgrit_gru import calibrate as cal

    report.line(f"== sweeps on {device.type} (H={H}): us per step as the solves run them")
    fits = {}
    for kind in ("step", "adjoint", "sweep", "sweep_adjoint"):
        names = [kind] + (
            [f"{kind} graph"] if kind.startswith("sweep") and device.type == "cuda" else []
        )
        pts: dict = {name: [] for name in names}
        for rows in rows_list:
            fn, per = cal._sweep(kind, rows, H, 32, device.type)
            pts[kind].append((rows, 1e6 * timed(fn, device) / per))
            if len(names) > 1:
                pts[names[1]].append((rows, 1e6 * timed(_graphed(fn), device) / per))
        for name, p in pts.items():
            fits[name] = machines.fit(p)
            report.line(
                f"  {name:<19} "
                + "  ".join(f"{r}:{t:.2f}us" for r, t in p)
                + f"  -> o={fits[name][0]:.2f} us, c={fits[name][1]:.2e} us/row"
            )
    report.put(f"sweeps_H{H}", {k: list(v) for k, v in fits.items()})


def predicted_ms(step, T: int, cfactor: int) -> tuple[float, list]:
    """The H200 model's prediction (mgrit_gru.projection) for one traced step, and the
    trace's events (recorded here, on the device)."""
    t, _ = record_step(step, steps=T, cfactor=cfactor)
    pred = replay(expand(t, 1), Machine(machines.H200, LINKS["shm"]))
    return 1e3 * pred.seconds, t


def projection_rows(report: Report, device, budget: Budget, Ts, serial_max_T: int) -> None:
    """Training steps at the projection's shape (B=4, I=32, H=64): cuDNN, the serial solver,
    MGRIT on its defaults (tolerance) and with a fixed budget (2 forward / 1 adjoint cycles),
    with the cycles and chunk length each used: the measured side of the projection's
    validation (``mgrit-gru project --device cuda``)."""
    report.line(
        "== projection rows: training step ms (median of 3), B=4 I=32 H=64; predicted_ms: "
        "the H200 model of mgrit_gru.projection on the trace recorded here"
    )
    rows, traces = [], {}
    for T in Ts:
        if budget.left() < 20:
            report.line(f"  (deadline: stopped before T={T})")
            break
        ref, x, w = problem(T, 4, 32, 64, device)
        solvers = {"cuDNN": None, "mgrit": MGRIT(), "budget": MGRIT(budget=mgrit_gru.Budget())}
        if T <= serial_max_T:
            solvers["serial"] = "serial"
        for name, solver in solvers.items():
            module = ref if solver is None else mgrit_gru.GRU.from_torch(ref, solver=solver)
            try:
                step = timed(functools.partial(train_step, module, x, w), device)
            except RuntimeError as exc:  # cuDNN refuses some shapes: a row, not the end
                refused(report, rows, {"T": T, "B": 4, "I": 32, "H": 64}, name, exc)
                report.put("projection", rows)
                continue
            stats = getattr(module, "last_stats", None)
            row = {"T": T, "B": 4, "I": 32, "H": 64, "solver": name, "train_ms": 1e3 * step}
            if stats is not None and name != "serial":
                kind = step_kind(None, device.type)  # the steps the module ran: its rule
                row["cfactor"] = solver.resolve(T, 4, 64, device.type, kind=kind).cfactor
                row["forward_cycles"] = stats.forward_iterations
                row["adjoint_cycles"] = stats.backward_iterations
            if stats is not None:
                m = row.get("cfactor", T)
                row["predicted_ms"], t = predicted_ms(
                    functools.partial(train_step, module, x, w), T, m
                )
                if T <= 16384:
                    traces[f"{T} {name}"] = {
                        "meta": t.meta,
                        "events": [asdict(e) for e in t.events],
                    }
                    (report.out / "traces.json").write_text(json.dumps(traces))
            rows.append(row)
            report.line(f"  {row}")
            report.put("projection", rows)


PROJECTION_T = [1024, 4096, 16384, 65536]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--deadline-s", type=float, default=400.0)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--cache", default=str(ROOT / "runs" / "trained-models"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.deadline_s)
    dry = args.dry_run or not torch.cuda.is_available()
    device = torch.device("cpu" if dry else "cuda")
    meta = {
        "device": torch.cuda.get_device_name(0) if not dry else "cpu (dry run)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dry_run": dry,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    report = Report(out, meta)
    report.line(f"gpu_bench: {meta}")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for the comparisons
    if dry:
        torch.set_num_threads(1)
        parts = [
            (lambda: correctness(report, device, [(64, 2, 8)]), 10),
            (lambda: table(report, device, budget, [(64, 1, 8), (256, 2, 8)], 256), 10),
            (lambda: calibrate(report, device, [16, 64, 256], 8), 5),
            (lambda: early_exit(report, device, 256, 2, 8), 5),
            (lambda: graphs(report, device, 16, 64, 8), 1),
            (lambda: trained(report, device, Path(args.cache), 1, limit=1), 10),
            (lambda: machine(report, device, 8), 2),
            (lambda: kernels(report, device, 8, 64), 2),
            (lambda: sweeps(report, device, [4, 16], 8), 2),
            (lambda: projection_rows(report, device, budget, [64, 128], 128), 5),
        ]
    else:
        grid = [
            (T, B, H) for T in (4096, 16384, 65536, 262144) for B in (1, 16) for H in (64, 128, 256)
        ]
        grid.sort(key=lambda s: s[0] * s[1] * s[2] ** 2)
        parts = [
            (lambda: correctness(report, device, [(4096, 4, 64), (16384, 16, 128)]), 40),
            (lambda: calibrate(report, device, [64, 1024, 16384, 131072], 128), 20),
            (lambda: calibrate(report, device, [16, 256, 4096, 65536], 64), 20),
            (lambda: early_exit(report, device, 65536, 16, 128), 30),
            (lambda: graphs(report, device, 128, 4096, 128), 20),
            (lambda: machine(report, device, 64), 10),
            (lambda: kernels(report, device, 64, 1024), 15),
            (lambda: sweeps(report, device, [4, 64, 1024, 4096, 16384], 64), 20),
            (lambda: sweeps(report, device, [16, 1024, 4096, 16384], 128), 20),
            (lambda: projection_rows(report, device, budget, PROJECTION_T, 16384), 60),
            (lambda: trained(report, device, Path(args.cache), 3), 60),
            (lambda: table(report, device, budget, grid, 16384), 60),
        ]
    for part, needs in parts:
        if budget.left() < needs:
            report.line(f"(deadline: {budget.left():.0f} s left, part skipped)")
            continue
        try:
            part()
        except Exception as exc:  # a part that breaks is data; the others still run
            report.fail(f"{type(exc).__name__}: {exc}")
            report.line(traceback.format_exc())
    report.save()
    return 1 if report.data["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
