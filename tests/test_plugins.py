import textwrap

import pytest

from mmrft.plugins import TASKS, VERIFIERS, PluginError, UnknownNameError, load_plugin
from mmrft.rewards.reward import build_reward
from mmrft.rewards.task import build_task
from mmrft.typecheck import ConfigError


def test_builtins_register_through_the_public_api():
    for name in ("format", "accuracy", "iou"):
        assert name in VERIFIERS
    for name in ("classification", "counting", "grounding"):
        assert name in TASKS


def test_unknown_names_list_the_closest():
    with pytest.raises(UnknownNameError, match=r"unknown verifier 'iuo'; did you mean 'iou'"):
        VERIFIERS.get("iuo")
    with pytest.raises(ConfigError, match=r"task.name: unknown task 'grounding2'.*'grounding'"):
        build_task("grounding2")
    with pytest.raises(
        ConfigError, match=r"reward.verifiers\[0\].name: unknown verifier 'acuracy'.*'accuracy'"
    ):
        build_reward([{"name": "acuracy"}])


def test_file_plugin_registers_a_verifier_and_a_task(tmp_path):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(
        textwrap.dedent(
            '''
            from mmrft import Score, Task, task, verifier

            @verifier("test_length_bonus", low=0.0, high=1.0)
            def length_bonus(completions, samples, *, target_len: int = 10):
                """1 when the completion is at most target_len characters."""
                if target_len <= 0:
                    raise ValueError("target_len must be > 0")
                return [Score(1.0) if len(c) <= target_len else Score(0.0, reason="too long") for c in completions]

            @task("test_echo")
            class Echo(Task):
                pass
            '''
        )
    )
    load_plugin(str(plugin))
    reward = build_reward(
        [{"name": "test_length_bonus", "weight": 0.5, "params": {"target_len": 3}}]
    )
    out = reward(["abc", "abcdef"], [None, None])  # the verifier ignores samples
    assert out.total == [0.5, 0.0]
    assert out.reasons["test_length_bonus/too long"] == 1
    assert build_task("test_echo").name == "test_echo"
    # parameter checks happen at start-up: names, types, then values
    with pytest.raises(
        ConfigError, match=r"unknown parameter 'target_length'; did you mean 'target_len'"
    ):
        build_reward([{"name": "test_length_bonus", "params": {"target_length": 3}}])
    with pytest.raises(ConfigError, match=r"target_len: expected an integer"):
        build_reward([{"name": "test_length_bonus", "params": {"target_len": "x"}}])
    with pytest.raises(ConfigError, match=r"target_len must be > 0"):
        build_reward([{"name": "test_length_bonus", "params": {"target_len": 0}}])


def test_dotted_module_plugin(tmp_path, monkeypatch):
    (tmp_path / "dotted_plugin_mod.py").write_text(
        "from mmrft import verifier\n@verifier('test_dotted')\ndef f(completions, samples):\n    return [1.0 for _ in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    load_plugin("dotted_plugin_mod")
    assert "test_dotted" in VERIFIERS


def test_missing_plugins_fail_clearly(tmp_path):
    with pytest.raises(PluginError, match="plugin file not found"):
        load_plugin(str(tmp_path / "nope.py"))
    with pytest.raises(PluginError, match="plugin module 'no_such_module_xyz' not found"):
        load_plugin("no_such_module_xyz")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(PluginError, match="broken.py failed to import: boom"):
        load_plugin(str(broken))


def test_tasks_and_verifiers_are_not_top_level_packages():
    import importlib.util

    import mmrft.tasks
    import mmrft.verifiers

    assert mmrft.tasks.__name__ == "mmrft.tasks"
    assert importlib.util.find_spec("tasks") is None or "mmrft" not in str(
        importlib.util.find_spec("tasks").origin
    )
    assert mmrft.verifiers.__name__ == "mmrft.verifiers"


def test_entry_point_plugins_load_with_the_builtins(tmp_path, monkeypatch):
    """An installed package exposing the `mmrft.plugins` entry-point group is imported when the
    registry first loads (simulated with a dist-info folder on sys.path)."""
    import importlib.metadata

    import mmrft.plugins as plugins

    package = tmp_path / "ep_plugin_pkg.py"
    package.write_text(
        "from mmrft import verifier\n@verifier('test_from_entry_point')\ndef f(completions, samples):\n    return [1.0 for _ in completions]\n"
    )
    dist = tmp_path / "ep_plugin_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-plugin-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mmrft.plugins]\nmine = ep_plugin_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(plugins, "_builtins_loaded", False)
    assert "test_from_entry_point" in VERIFIERS


def test_a_plain_function_without_its_decorator_gets_a_hint(tmp_path):
    """A reward function written TRL-style, never registered: the unknown-name error says to
    decorate it."""
    from mmrft.plugins import load_plugin
    from mmrft.rewards.reward import build_reward
    from mmrft.typecheck import ConfigError

    plugin = tmp_path / "plain_reward.py"
    plugin.write_text(
        "def plain_len(completions, samples):\n    return [0.0 for _ in completions]\n"
    )
    load_plugin(str(plugin))
    with pytest.raises(
        ConfigError,
        match=r"defines a function 'plain_len' that is not registered.*@verifier\(\"plain_len\"\)",
    ):
        build_reward([{"name": "plain_len"}])
