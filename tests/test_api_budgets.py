"""The Python API checks a config as the command line does (issue 38): ``mmrft.train(cfg)`` and
``mmrft.evaluate_config(cfg)`` re-check every field's type, refuse attributes that are not keys
(naming the closest one), bound the nesting, and name what a wrong argument should be, all
before anything is written: no run folder. On the old code each case below was a bare
TypeError / AttributeError / RecursionError, some after the run folder and its config.yaml
were written, or was silently ignored (``cfg.train.stepz``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import mmrft
from mmrft.config import RunConfig, validate_config
from mmrft.typecheck import ConfigError


def config(out: Path) -> RunConfig:
    return mmrft.load_config("demo", [f"output_dir={out}", "name=api", "warm_start.steps=0"])


def deep(levels: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(levels):
        out = {"a": out}
    return out


def cyclic() -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["self"] = out
    return out


def _set(cfg: RunConfig, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = cfg
    for name in parents:
        node = getattr(node, name)
    setattr(node, leaf, value)


BAD = [
    ("train.steps", 1.5, r"^train.steps: expected an integer, got 1.5$"),
    ("data.train", 42, r"^data.train: expected a string, got 42$"),
    ("train", None, r"^train: expected the train section \(TrainConfig, or a mapping"),
    ("rollout", "fast", r"^rollout: expected the rollout section"),
    ("train.stepz", 3, r"^unknown config key 'train.stepz'; did you mean 'train.steps'"),
    ("rollout.group_sise", 4, r"^unknown config key 'rollout.group_sise'; did you mean"),
    ("optim.betas", "0.9", r"^optim.betas: expected list\[float\], got '0.9'$"),
    ("rollout.engine", "vllmm", r"^rollout.engine: 'vllmm' is not one of .* did you mean 'vllm'"),
    ("eval.n", "3", r"^eval.n: expected an integer, got '3'$"),
    ("train.seed", True, r"^train.seed: expected an integer, got True$"),
    ("task.params", deep(5000), r"^task.params: nested deeper than 32 levels"),
    ("train.deepspeed", cyclic(), r"^train.deepspeed: nested deeper than 32 levels"),
    ("data.train", [[[[[["x"]]]]]], r"^data.train: expected a string, got \[\[\[\[\.\.\.\]\]\]\]$"),
    ("name", "two\nlines", r"^name: 'two\\nlines' must be a plain folder name"),
    ("name", "a/b", r"^name: 'a/b' must be a plain folder name"),
    ("output_dir", "runs\x00x", r"^output_dir: has a NUL byte"),
    ("data.sampler_params", {"floor": 0.1, "x": deep(40)}, r"^data.sampler_params: nested"),
    ("train.steps", -1, r"^train.steps: must be ≥ 0$"),
]


@pytest.mark.parametrize(
    ("key", "value", "says"), BAD, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BAD)]
)
def test_train_refuses_a_config_changed_in_python_before_writing_anything(
    tmp_path, key, value, says
):
    out = tmp_path / "runs"
    cfg = config(out)
    _set(cfg, key, value)
    with pytest.raises(ConfigError, match=says):
        mmrft.train(cfg)
    assert not out.exists()  # no run folder, no config.yaml


@pytest.mark.parametrize(("key", "value", "says"), BAD[:8], ids=[k for k, _, _ in BAD[:8]])
def test_evaluate_config_refuses_the_same_before_loading_anything(tmp_path, key, value, says):
    cfg = config(tmp_path / "runs")
    _set(cfg, key, value)
    with pytest.raises(ConfigError, match=says):
        mmrft.evaluate_config(cfg)


def test_wrong_argument_types_name_what_is_expected(tmp_path):
    with pytest.raises(
        TypeError, match=r"^mmrft.train: cfg: expected a RunConfig .* got str 'demo'"
    ):
        mmrft.train("demo")
    with pytest.raises(TypeError, match=r"^mmrft.train: cfg: expected a RunConfig .* got dict"):
        mmrft.train({"train": {"steps": 1}})
    with pytest.raises(TypeError, match=r"^mmrft.train: console: expected a rich.console.Console"):
        mmrft.train(config(tmp_path / "runs"), console="loud")
    with pytest.raises(TypeError, match=r"^mmrft.evaluate_config: cfg: expected a RunConfig"):
        mmrft.evaluate_config(None)
    with pytest.raises(TypeError, match=r"^load_config: path: expected a config name"):
        mmrft.load_config(["demo"])
    with pytest.raises(TypeError, match=r"^load_config: overrides: expected a list"):
        mmrft.load_config("demo", {"train.steps": 3})
    assert not (tmp_path / "runs").exists()


def test_what_a_file_may_say_python_may_say_too(tmp_path):
    """An int where a float goes becomes a float, a section given as a mapping becomes its
    section (as in YAML), and a valid config passes unchanged otherwise."""
    cfg = config(tmp_path / "runs")
    cfg.optim.lr = 1
    cfg.train = {"steps": 0, "prompts_per_step": 2}
    cfg.rollout.temperature = 2
    assert validate_config(cfg) is cfg
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.train.steps == 0 and cfg.train.prompts_per_step == 2 and cfg.train.seed == 42
    assert type(cfg.train).__name__ == "TrainConfig" and cfg.rollout.temperature == 2.0
    with pytest.raises(ConfigError, match=r"^unknown config key 'train.stepz'"):
        cfg.train = {"stepz": 1}
        validate_config(cfg)


def test_evaluation_needs_no_training_file(tmp_path):
    """``RunConfig()`` has train.steps 500 and no data.train: a training run refuses it, an
    evaluation does not (and then wants data.test)."""
    cfg = RunConfig()
    cfg.output_dir = str(tmp_path / "runs")
    with pytest.raises(ConfigError, match=r"^data.train: a training file is needed"):
        validate_config(cfg)
    assert validate_config(cfg, "mmrft.evaluate_config", training=False) is cfg
    with pytest.raises(ConfigError, match=r"^data.test: evaluation needs a test file"):
        mmrft.evaluate_config(cfg)
