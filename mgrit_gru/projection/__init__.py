"""Projected speed at many ranks or on another device: a training step's trace
(:mod:`mgrit_gru.trace`), expanded to ``P`` ranks and replayed on a modelled machine."""

from .machines import LINKS, Device, Link, Machine, device
from .record import record_step, training_step
from .replay import Replay, comparable, expand, replay

__all__ = [
    "LINKS",
    "Device",
    "Link",
    "Machine",
    "Replay",
    "comparable",
    "device",
    "expand",
    "record_step",
    "replay",
    "training_step",
]
