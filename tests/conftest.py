"""Shared fixtures. Tests are offline and CPU-only; slow ones carry the `slow` marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (make test: a worker per core) each worker's torch threads spin-wait at
# every parallel region while the other worker holds the core (OpenMP's default wait policy):
# two short demo runs side by side took 75 s each instead of 19 s alone. Waiting passively, two
# side by side take 23 s each. Set before torch is imported (here: before the test modules);
# the processes the tests start inherit it. A single-process run keeps the default (spinning
# is a little faster alone: 19-21 s against 23 s). A worker per core also means one torch thread
# per worker (OMP_NUM_THREADS=1, read when torch is imported; runs whose config names
# train.threads keep it): two workers of two threads each on two cores took 300 s of wall
# clock where one thread each took 190 s, on the same 27 training tests.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "assets"


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two plain PNGs for the model-family tests: ``small`` 56 × 56 red, ``wide`` 112 × 84 blue."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    paths = {}
    for name, size, colour in [
        ("small", (56, 56), (220, 30, 30)),
        ("wide", (112, 84), (30, 70, 225)),
    ]:
        Image.new("RGB", size, colour).save(folder / f"{name}.png")
        paths[name] = str(folder / f"{name}.png")
    return paths
