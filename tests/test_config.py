import re
from pathlib import Path

import pytest

from mmrft.config import (
    RunConfig,
    check_config,
    help_table,
    load_config,
    parse_override,
    to_yaml,
    validate_config,
)
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


@pytest.mark.parametrize(
    ("override", "said"),
    [
        (
            "optim.betas=[0.9, 1.5]",
            r"^optim\.betas: each must be in \[0, 1\) .*got \[0\.9, 1\.5\]$",
        ),
        ("optim.betas=[-0.1, 0.999]", r"^optim\.betas: each must be in \[0, 1\)"),
        ("optim.weight_decay=-0.01", r"^optim\.weight_decay: must be ≥ 0$"),
        ("optim.max_grad_norm=-1", r"^optim\.max_grad_norm: must be ≥ 0 \(0 = no clipping\)$"),
        ("optim.warmup_steps=-5", r"^optim\.warmup_steps: must be ≥ 0$"),
    ],
)
def test_optimizer_settings_are_checked_before_the_model_loads(override, said):
    """AdamW refuses such betas only when it is built, after the weights loaded; a negative
    clipping norm or decay is never meant."""
    with pytest.raises(ConfigError, match=said):
        load_config("demo", [override])


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
    if "lmms_eval" in path.parts:
        pytest.skip("an lmms-eval task (tests/test_harness.py runs it), not a run config")
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


# -- config names, paths, presets, the start-up diff (issue 13) -----------------------------------
def test_bundled_configs_load_by_name_and_hints_name_only_loadable_configs():
    from mmrft.config import config_names, resolve_config_path

    recipes = sorted((REPO / "configs" / "recipes").glob("*.yaml"))
    for path in recipes:
        for name in (path.stem, f"{path.stem}.yaml", f"recipes/{path.stem}"):
            assert resolve_config_path(name) == path
    assert resolve_config_path("demo") == REPO / "configs" / "demo.yaml"
    learn = sorted((REPO / "configs" / "learn").glob("*.yaml"))
    assert learn  # the CPU learning recipes (benchmarks/learning.py) load as learn/NAME
    for path in learn:
        for name in (f"learn/{path.stem}", f"learn/{path.stem}.yaml"):
            assert resolve_config_path(name) == path
    names = config_names()
    assert "multi_gpu" not in names  # launcher configs are not run configs
    with pytest.raises(ConfigError, match=r"config 'time_r2' not found; did you mean 'time_r1'"):
        resolve_config_path("time_r2")
    for wrong in ("recipes/chart_q", "deepspeed_zero3", "zzz"):  # near, a launcher config, far
        with pytest.raises(ConfigError) as info:
            resolve_config_path(wrong)
        hint = str(info.value).rsplit(";", 1)[1]
        hinted = set(re.findall(r"[a-z0-9_/]+", hint)) - {"did", "you", "mean", "or", "valid"}
        assert hinted and hinted <= set(names), hint
    for name in names:
        load_config(name)  # every name a hint may give loads


def test_relative_paths_anchor_at_the_config_file_or_the_current_directory(tmp_path, monkeypatch):
    """Written in a config file, data/model paths and task.params.*_root are relative to the file;
    on the command line, to the current directory; output_dir always to the current directory;
    hub ids stay as written."""
    config_dir, work = tmp_path / "project" / "configs", tmp_path / "elsewhere"
    config_dir.mkdir(parents=True)
    work.mkdir()
    path = config_dir / "mine.yaml"
    path.write_text(
        "model:\n  path: Qwen/Qwen2-VL-2B-Instruct\n"
        "data:\n  train: ../data/train.jsonl\n  test: /abs/test.jsonl\n"
        "task:\n  name: grounding\n  params: {image_root: ../images, think: none}\n"
        "plugins: [my_rewards.py, some.module]\n"
        "output_dir: out\n"
    )
    monkeypatch.chdir(work)
    cfg = load_config(path)
    project = (tmp_path / "project").resolve()
    assert cfg.model.path == "Qwen/Qwen2-VL-2B-Instruct"
    assert cfg.data.train == str(project / "data" / "train.jsonl")
    assert cfg.data.test == "/abs/test.jsonl"
    assert cfg.task.params == {"image_root": str(project / "images"), "think": "none"}
    assert cfg.plugins == [str(config_dir.resolve() / "my_rewards.py"), "some.module"]
    assert cfg.output_dir == str(work.resolve() / "out")
    cfg = load_config(path, ["data.train=mine.jsonl", "task.params.image_root=img", "model.path=m"])
    assert cfg.data.train == str(work.resolve() / "mine.jsonl")
    assert cfg.task.params["image_root"] == str(work.resolve() / "img")
    assert cfg.model.path == str(work.resolve() / "m")
    # the default model is the bundled tiny one wherever the command runs
    assert load_config(None, ["train.steps=0"]).model.path == str(
        REPO / "assets" / "models" / "tiny-qwen2_5_vl"
    )
    # the demo runs from any directory: its paths are relative to configs/
    demo = load_config("demo")
    assert Path(demo.model.path).is_dir() and Path(demo.data.train).is_file()
    assert demo.output_dir == str(work.resolve() / "runs")


def test_dapo_preset_is_dapo():
    """DAPO (arXiv:2503.14476): clip-higher, token-level loss, dynamic sampling, soft overlong
    punishment over the last fifth of the length budget, no KL; explicit keys still win."""
    algo = load_config(None, ["algorithm.preset=dapo", "train.steps=0"]).algorithm
    assert (algo.clip_low, algo.clip_high, algo.agg_mode) == (0.2, 0.28, "token-mean")
    assert algo.dynamic_sampling and algo.beta == 0.0
    assert algo.overlong_buffer == RunConfig().rollout.max_new_tokens // 5
    algo = load_config(
        None,
        [
            "algorithm.preset=dapo",
            "rollout.max_new_tokens=20480",
            "algorithm.dynamic_sampling=false",
            "train.steps=0",
        ],
    ).algorithm
    assert algo.overlong_buffer == 4096 and not algo.dynamic_sampling


def test_config_diff_shows_only_what_differs_from_the_defaults():
    from mmrft.config import config_diff

    cfg = load_config(None, ["train.steps=0", "rollout.group_size=4", "task.params={think: none}"])
    diff = config_diff(cfg)
    assert diff["rollout"] == {"group_size": 4}
    assert diff["train"] == {"steps": 0}
    assert diff["task"] == {"params": {"think": "none"}}
    assert "optim" not in diff and "algorithm" not in diff


# ---------------------------------------------------------------------------------------------
# Budgets (issue 38): nesting, run names, paths, argument types


def nested(levels: int) -> dict:
    out: dict = {"leaf": 1}
    for _ in range(levels):
        out = {"a": out}
    return out


@pytest.mark.parametrize(
    "text",
    [
        "task:\n params:\n" + "".join(" " * (i + 2) + "a:\n" for i in range(1000)),
        "task:\n  params:\n    x: " + "[" * 5000 + "]" * 5000 + "\n",
        to_yaml({"task": {"params": nested(40)}}),
        "task:\n  params:\n    a: &a [*a]\n",  # a list that holds itself
        "task:\n  params:\n    a: &a [x, x, x, x, x, x, x, x, x]\n"  # "billion laughs"
        + "".join(
            f"    {b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi")
        ),
    ],
    ids=["block-1000", "flow-5000", "block-40", "self-alias", "billion-laughs"],
)
def test_a_config_nested_thousands_deep_is_one_line(tmp_path, text):
    """The old reader raised RecursionError (a traceback) on the first two; the third loaded,
    deeper than any config needs; the self-holding list was a RecursionError when written, and
    the billion laughs expanded 9⁹ values when config.yaml was written."""
    with pytest.raises(
        ConfigError,
        match=r"c.yaml(:\d+: task.params)?: (nested deeper than 32 levels|holds more than)",
    ):
        load_config(write(tmp_path, "train:\n  steps: 0\n" + text))


@pytest.mark.parametrize(
    "override",
    [
        "task.params={x: " + "[" * 5000 + "]" * 5000 + "}",
        "train.deepspeed." + ".".join(["a"] * 3000) + "=1",
        "task.params=" + "{a: " * 40 + "1" + "}" * 40,
    ],
    ids=["flow-5000", "dotted-3000", "flow-40"],
)
def test_an_override_nested_thousands_deep_is_one_line(override):
    with pytest.raises(ConfigError, match=r"nested deeper than 32 levels"):
        load_config(None, ["train.steps=0", override])


def test_a_config_nested_within_the_limit_loads():
    cfg = load_config(None, ["train.steps=0", "task.params=" + "{a: " * 29 + "1" + "}" * 29])
    assert cfg.task.params["a"]["a"]["a"]


@pytest.mark.parametrize(
    "name", ["a\nb", "a\rb", "tab\there", "bell\x07", "del\x7f", "nul\x00", "x" * 256, "é" * 128]
)
def test_a_run_name_with_control_characters_or_too_long_is_refused(name):
    cfg = load_config(None, ["train.steps=0"])
    cfg.name = name
    with pytest.raises(ConfigError, match=r"^name: .* must be a plain folder name"):
        check_config(cfg)


def test_a_run_name_with_a_newline_is_refused_from_a_file(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml:1: name: 'one\\ntwo' must be a plain folder"):
        load_config(write(tmp_path, 'name: "one\\ntwo"\ntrain:\n  steps: 0\n'))
    assert load_config(None, ["train.steps=0", "name=ünïcode-ok_1.2"]).name == "ünïcode-ok_1.2"


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("output_dir", 'output_dir: "x\\0y"\n'),
        ("data.train", 'data:\n  train: "x\\0y"\n'),
        ("data.media_root", 'data:\n  media_root: "x\\0y"\n'),
        ("model.path", 'model:\n  path: "x\\0y"\n'),
    ],
)
def test_a_nul_byte_in_a_path_key_is_refused(tmp_path, key, text):
    with pytest.raises(ConfigError, match=rf"{key}: has a NUL byte"):
        load_config(write(tmp_path, "train:\n  steps: 0\n" + text))


def test_load_config_names_what_its_arguments_should_be():
    with pytest.raises(TypeError, match=r"^load_config: path: expected a config name or file path"):
        load_config(42)
    with pytest.raises(TypeError, match=r"^load_config: overrides: expected a list of 'key=value'"):
        load_config("demo", "train.steps=3")
    with pytest.raises(TypeError, match=r"^load_config: overrides: .* got list \[3\]"):
        load_config("demo", [3])
    assert load_config(Path(REPO / "configs" / "demo.yaml"), ("train.steps=0",)).train.steps == 0


def test_a_number_past_the_float_range_is_one_line():
    cfg = load_config(None, ["train.steps=0"])
    cfg.optim.lr = 10**400
    with pytest.raises(
        ConfigError, match=r"^optim.lr: an integer of about 401 digits is too large for a number"
    ):
        validate_config(cfg)


# --- task.params belong to their task (issue 39): a new task.name on the command line does not
# inherit the config file's params; a param a task refuses names where it was set


def _task_params(path, overrides):
    cfg = load_config(path, ["train.steps=0", *overrides])
    return cfg, cfg.task.params


def test_a_new_task_on_the_command_line_drops_the_files_task_params(monkeypatch):
    from mmrft.rewards.task import build_task

    monkeypatch.chdir(REPO)
    demo = REPO / "configs" / "demo.yaml"
    # the README's TRL-style path over the implicit demo.yaml (task classification, think: none)
    cfg, params = _task_params(demo, ["task.name=prompt"])
    assert params == {}
    assert cfg.task.param_sources == {}
    assert build_task(cfg.task.name, params, "", cfg.task.param_sources).template == "{question}"
    # the params given with the new task are kept, wherever they stand on the command line
    for order in (
        ["task.params.template={question}!", "task.name=prompt"],
        ["task.name=prompt", "task.params.template={question}!"],
        ["task={name: prompt, params: {template: '{question}!'}}"],
    ):
        cfg, params = _task_params(demo, order)
        assert params == {"template": "{question}!"}, order
        assert cfg.task.param_sources == {"template": "the command line: task.params.template"}
    # the same task named again, or none: file and command line merge key by key
    cfg, params = _task_params(demo, ["task.name=classification", "task.params.lettered=true"])
    assert params == {"think": "none", "lettered": True}
    assert cfg.task.param_sources == {
        "think": "configs/demo.yaml: task.params.think",
        "lettered": "the command line: task.params.lettered",
    }
    assert _task_params(demo, ["task.params.think=optional"])[1] == {"think": "optional"}
    assert _task_params(demo, ["task.system_prompt=Be brief."])[1] == {"think": "none"}


def test_a_file_without_task_name_has_the_default_task(tmp_path):
    path = write(tmp_path, "task:\n  params: {think: none}\n")
    assert _task_params(path, ["task.name=prompt"])[1] == {}
    assert _task_params(path, ["task.name=classification"])[1] == {"think": "none"}
    assert _task_params(path, [])[1] == {"think": "none"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task.name=prompt", "task.params=[1, 2]"], r"task.params: expected a mapping"),
        (["task.name=prompt", "task=3"], r"^task: expected a mapping"),
        (["task.params=7", "task.name=prompt"], r"task.params: expected a mapping"),
    ],
)
def test_a_malformed_task_on_the_command_line_is_still_refused(tmp_path, overrides, message):
    """A new task.name must not wash away a wrong task.params the command line gives."""
    path = write(tmp_path, "task:\n  name: classification\n  params: {think: none}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path, overrides)


def test_a_task_param_the_task_refuses_names_where_it_was_set(tmp_path):
    from mmrft.rewards.task import build_task

    path = write(tmp_path, "task:\n  name: prompt\n  params: {think: none}\n")
    cfg = load_config(path, ["train.steps=0"])
    with pytest.raises(
        ConfigError,
        match=rf"^task 'prompt': unknown parameter 'think'; .*\(set by {re.escape(str(path))}: "
        r"task.params.think\)$",
    ):
        build_task(cfg.task.name, cfg.task.params, "", cfg.task.param_sources)
    cfg = load_config(path, ["train.steps=0", "task.params.template=3"])  # from the command line
    with pytest.raises(ConfigError, match=r"\(set by the command line: task.params.template\)$"):
        build_task("prompt", {"template": 3}, "", cfg.task.param_sources)
    path = write(tmp_path, "task:\n  name: classification\n  params: {think: sometimes}\n")
    cfg = load_config(path, ["train.steps=0"])
    with pytest.raises(ConfigError, match=r"think.*\(set by .*c.yaml: task.params.think\)$"):
        build_task(cfg.task.name, cfg.task.params, "", cfg.task.param_sources)
