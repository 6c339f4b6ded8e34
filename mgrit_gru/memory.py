"""Peak memory of one training step, measured in a fresh process per solver.

A fresh process, so that nothing earlier (other solvers, pooled work buffers, allocator caches)
is counted or hidden. It builds the model and the data, then records the baseline and runs
one forward + backward:

- CPU (Linux): the growth of the resident set's high-water mark (``VmHWM`` in
  ``/proc/self/status``, reset to the current size through ``/proc/self/clear_refs``), so
  it counts everything the step touched: tensors, work buffers, allocator slack;
- CUDA: ``torch.cuda.max_memory_allocated`` over the baseline (tensors only).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Optional

PROBE = "from mgrit_gru.memory import _probe_main; _probe_main()"


def supported(device: str) -> bool:
    """Whether :func:`step_peak_mb` can measure on ``device`` here."""
    if device.startswith("cuda"):
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def step_peak_mb(
    solver: str,
    T: int,
    batch: int,
    input_size: int,
    hidden: int,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    threads: int = 1,
    seed: int = 0,
    zbias: float = 0.0,
    setting: Optional[str] = None,
    model: str = "gru",
    proj_size: int = 0,
) -> float:
    """Peak memory (MB) of one training step of ``solver`` ("torch", "serial" or "mgrit" with
    ``setting``, a spec of :func:`mgrit_gru.bench.parse_setting`), in a fresh process."""
    spec = dict(
        solver=solver,
        T=T,
        batch=batch,
        input=input_size,
        hidden=hidden,
        dtype=dtype,
        device=device,
        threads=threads,
        seed=seed,
        zbias=zbias,
        setting=setting,
        model=model,
        proj_size=proj_size,
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(spec)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory probe for {solver} at T={T} failed: {done.stderr.strip()}")
    return float(done.stdout.strip().splitlines()[-1])


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"/proc/self/status has no {field}")


def _probe_main() -> None:
    import torch

    from .bench import MODELS, problem

    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["threads"])
    dtype, device = getattr(torch, spec["dtype"]), torch.device(spec["device"])
    ref, x, w_y, w_h = problem(
        spec["T"],
        spec["batch"],
        spec["input"],
        spec["hidden"],
        zbias=spec["zbias"],
        seed=spec["seed"],
        dtype=dtype,
        device=device,
        model=spec.get("model", "gru"),
        proj_size=spec.get("proj_size", 0),
    )
    ours = MODELS[spec.get("model", "gru")][1]
    x.requires_grad_()
    if spec["solver"] == "torch":
        model = ref
    elif spec["solver"] == "serial":
        model = ours.from_torch(ref, solver="serial")
    else:
        from .bench import parse_setting

        model = ours.from_torch(ref, solver=parse_setting(spec["setting"] or "default"))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the high-water mark := the current resident set
        base = _status_mb("VmRSS")
    y, h_n = model(x)
    if isinstance(h_n, tuple):  # an LSTM's (h_n, c_n)
        h_n = h_n[0]
    ((y * w_y).sum() + (h_n * w_h).sum()).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    else:
        peak = _status_mb("VmHWM") - base
    print(f"{peak:.3f}")
