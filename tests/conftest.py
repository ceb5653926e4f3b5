"""Shared fixtures. Tests are offline and CPU-only; slow ones carry the `slow` marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "assets"


@pytest.fixture
def repo() -> Path:
    return REPO
