"""Reusable work buffers for temporaries that live within one solve.

On the CPU a large fresh tensor is paid for in page faults on first touch: writing 50 MB into
new memory took 23 ms here against 4.5 ms into memory already mapped. The solves therefore take
their large temporaries from a per-thread pool keyed by name, grown on demand and kept between
calls (like cuDNN's workspace). CUDA tensors come from torch's caching allocator as usual.
``release()`` frees the pool. A :func:`buffer` must never escape the solve that took it.

The pool is per thread and keyed by dtype and by whether inference mode is on: a tensor made
under ``torch.inference_mode()`` can never again be written outside it, so a call there (a
validation loop) must not hand its buffers to a later training call.

Tensors that live from a forward to its backward (the kept gates) are *leased* instead:
:func:`lease` hands out a pooled tensor that no one else holds, :func:`give_back` returns it
once its last reader is done. One that is never given back (a graph dropped before its
backward) is simply freed with its owner.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor

_local = threading.local()


def _pool(inference: bool | None = None) -> dict:
    pools = getattr(_local, "pools", None)
    if pools is None:
        pools = _local.pools = {}
    if inference is None:
        inference = torch.is_inference_mode_enabled()
    return pools.setdefault(inference, {})


def buffer(name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised tensor of ``shape`` with ``like``'s dtype and device."""
    if like.device.type != "cpu":
        return like.new_empty(shape)
    numel = math.prod(shape)
    key = (name, like.dtype)
    flat = _pool().get(key)
    if flat is None or flat.numel() < numel:
        flat = torch.empty(numel, dtype=like.dtype)
        _pool()[key] = flat
    return flat[:numel].view(shape)


MAX_FREE = 8  # leased tensors kept for reuse, per dtype


def lease(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised tensor of ``shape`` that the caller owns until :func:`give_back`."""
    if like.device.type != "cpu":
        return like.new_empty(shape)
    numel = math.prod(shape)
    free = _pool().setdefault(("lease", like.dtype), [])
    fits = [i for i, flat in enumerate(free) if flat.numel() >= numel]
    if fits:  # the smallest that fits, keeping larger ones for larger requests
        best = min(fits, key=lambda i: free[i].numel())
        return free.pop(best)[:numel].view(shape)
    if len(free) >= MAX_FREE:  # none fits: drop the smallest, it may never fit again
        # by position: list.remove would compare tensors with ==, elementwise
        free.pop(min(range(len(free)), key=lambda i: free[i].numel()))
    return torch.empty(shape, dtype=like.dtype)


def give_back(tensor: Tensor) -> None:
    """Return a tensor from :func:`lease`; the caller must not use it afterwards."""
    if tensor.device.type != "cpu":
        return
    free = _pool(tensor.is_inference()).setdefault(("lease", tensor.dtype), [])
    if len(free) < MAX_FREE:
        base = tensor if tensor._base is None else tensor._base
        free.append(base.view(-1))


def release() -> None:
    """Free every pooled buffer of this thread."""
    getattr(_local, "pools", {}).clear()


def held_bytes() -> int:
    """Bytes currently held by this thread's pool."""
    return sum(
        t.numel() * t.element_size()
        for pool in getattr(_local, "pools", {}).values()
        for v in pool.values()
        for t in (v if isinstance(v, list) else [v])
    )
