from pathlib import Path

import pytest

from mmrft.config import RunConfig, help_table, load_config, parse_override, to_yaml
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_yaml_overrides_layering(tmp_path):
    path = write(tmp_path, "optim:\n  lr: 1.0e-5\nrollout:\n  group_size: 4\ntrain:\n  steps: 0\n")
    cfg = load_config(path, ["rollout.group_size=6", "optim.betas=[0.9, 0.95]"])
    assert cfg.optim.lr == 1e-5  # YAML over default
    assert cfg.rollout.group_size == 6  # override over YAML
    assert cfg.optim.betas == [0.9, 0.95]
    assert cfg.rollout.temperature == RunConfig().rollout.temperature  # default kept


def test_unknown_key_names_it_and_suggests_closest(tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown config key 'rollout.group_sise'.*'rollout.group_size'"
    ):
        load_config(write(tmp_path, "rollout:\n  group_sise: 4\n"))
    with pytest.raises(ConfigError, match=r"'optim.lr'"):
        load_config(None, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'rollot'.*'rollout'"):
        load_config(None, ["rollot.group_size=1"])


def test_wrong_type_names_key_and_type():
    with pytest.raises(ConfigError, match=r"optim.lr: expected a number"):
        load_config(None, ["optim.lr=fast"])
    with pytest.raises(ConfigError, match=r"rollout.group_size: expected an integer"):
        load_config(None, ["rollout.group_size=2.5"])
    with pytest.raises(
        ConfigError, match=r"algorithm.advantage: 'grpoo' is not one of.*did you mean 'grpo'"
    ):
        load_config(None, ["algorithm.advantage=grpoo"])


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="rollout.group_size"):
        load_config(None, ["rollout.group_size=1", "train.steps=0"])
    with pytest.raises(ConfigError, match="data.train"):
        load_config(None, ["train.steps=5"])


def test_override_values_parse_as_yaml():
    assert parse_override("a.b=1e-4") == ("a.b", 1e-4)
    assert parse_override("x=null") == ("x", None)
    assert parse_override("x=[a, b]") == ("x", ["a", "b"])
    with pytest.raises(ConfigError):
        parse_override("novalue")


def test_preset_fills_fields_explicit_keys_win():
    cfg = load_config(None, ["algorithm.preset=dapo", "train.steps=0"])
    assert cfg.algorithm.clip_high == pytest.approx(0.28)
    cfg = load_config(None, ["algorithm.preset=dapo", "algorithm.clip_high=0.3", "train.steps=0"])
    assert cfg.algorithm.clip_high == pytest.approx(0.3)


def test_every_field_has_help_and_yaml_round_trip(tmp_path):
    rows = help_table()
    assert all(help_text for _, _, _, help_text in rows), [r[0] for r in rows if not r[3]]
    cfg = load_config(None, ["train.steps=0"])
    again = load_config(write(tmp_path, to_yaml(cfg)))
    assert again == cfg


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("**/*.yaml")), ids=lambda p: p.name)
def test_every_bundled_config_validates(path):
    if path.parent.name == "accelerate":
        pytest.skip("accelerate launcher config, not a run config")
    load_config(path)


def test_temporal_contrast_defaults_checks_and_recipe():
    tc = load_config(None, ["train.steps=0"]).algorithm.temporal_contrast
    assert not tc.enabled  # off unless asked for; the paper's values otherwise
    assert (tc.bonus, tc.ratio, tc.shuffled_per_prompt, tc.verifier) == (0.3, 0.8, None, "accuracy")
    assert tc.correct_above == 0.1 and tc.skip_decided
    cfg = load_config(
        None,
        [
            "train.steps=0",
            "algorithm.temporal_contrast.enabled=true",
            "algorithm.temporal_contrast.shuffled_per_prompt=8",
        ],
    )
    assert cfg.algorithm.temporal_contrast.enabled
    assert cfg.algorithm.temporal_contrast.shuffled_per_prompt == 8
    with pytest.raises(
        ConfigError,
        match=r"unknown config key 'algorithm.temporal_contrast.bonsu'.*"
        r"'algorithm.temporal_contrast.bonus'",
    ):
        load_config(None, ["train.steps=0", "algorithm.temporal_contrast.bonsu=0.3"])
    for key, value in (("ratio", -0.1), ("bonus", -1), ("shuffled_per_prompt", 0)):
        with pytest.raises(ConfigError, match=rf"algorithm.temporal_contrast.{key}: must be"):
            load_config(None, ["train.steps=0", f"algorithm.temporal_contrast.{key}={value}"])
    recipe = load_config(REPO / "configs" / "recipes" / "video_r1.yaml").algorithm
    assert recipe.temporal_contrast.enabled
    assert (recipe.temporal_contrast.bonus, recipe.temporal_contrast.ratio) == (0.3, 0.8)
