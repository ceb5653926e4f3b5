"""Where and how reproducibly a process computes: the torch device a config names
(:func:`pick_device`) and the seeds of every random generator (:func:`seed_everything`). Training
and evaluation call both before anything else.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from mmrft.typecheck import ConfigError


def pick_device(name: str) -> torch.device:
    """``device`` as a torch device (``auto``: CUDA when there is one). A CPU run tells
    DeepSpeed so (``DS_ACCELERATOR=cpu``), which transformers imports when it saves a
    checkpoint: DeepSpeed would otherwise warn on every run that it fell back to the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device: 'cuda' requested but no CUDA device is available here; use device=cpu "
            "(or auto)"
        )
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
