"""A hub id without the hub: an error at once, or the cached copy, never the client's retries."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from mmrft.config import ModelConfig
from mmrft.models.family import go_offline_if_unreachable, resolve_family
from mmrft.typecheck import ConfigError

TINY = Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-qwen2_5_vl"


@pytest.fixture
def closed_hub(monkeypatch, tmp_path):
    """The hub's endpoint is a closed local port and the cache an empty folder; offline mode is
    restored afterwards."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # recorded, so the one set here is undone
    return tmp_path / "hub"


def test_an_unreachable_hub_fails_at_once_naming_the_way_out(closed_hub) -> None:
    start = time.perf_counter()
    with pytest.raises(ConfigError) as caught:
        resolve_family(ModelConfig(path="org/not-cached-model"))
    assert time.perf_counter() - start < 10  # the client's retries take about 25 s
    message = str(caught.value)
    assert "\n" not in message
    assert "127.0.0.1:9" in message and "hf download org/not-cached-model" in message
    assert "not in the Hugging Face cache" in message


def test_an_unreachable_hub_loads_a_cached_model(closed_hub) -> None:
    """The cache's layout (models--org--name/snapshots/<rev>, refs/main) as `hf download`
    leaves it: the family is found from the cached config.json, offline."""
    from huggingface_hub import constants

    repo = closed_hub / "models--org--tiny"
    revision = "0" * 40
    shutil.copytree(TINY, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    start = time.perf_counter()
    family = resolve_family(ModelConfig(path="org/tiny"))
    assert time.perf_counter() - start < 10
    assert family.name == resolve_family(ModelConfig(path=str(TINY))).name
    assert constants.HF_HUB_OFFLINE is True  # later loads (processor, weights) skip the hub too


def test_offline_mode_set_by_the_user_is_reported(monkeypatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert go_offline_if_unreachable() == "HF_HUB_OFFLINE is set"
