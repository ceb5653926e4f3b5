"""Stateful environments (mmrft/rollout/environment.py) in the tool loop, scripted.

The bundled ``grid_walk`` environment and hostile ones defined in a plugin file (so that the
environment worker process re-creates them): an instance per trajectory whose state carries
from call to call, the reset's image in the prompt, episodes ended by the environment with its
reward, failures as observations, a call past its time budget losing the worker's episodes,
the instances living in the worker process, and the start-up checks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import ScriptedEngine, tiny_policy

from mmrft.config import load_config
from mmrft.data import Sample
from mmrft.plugins import ENVIRONMENTS, load_plugin
from mmrft.rollout.base import Sampling
from mmrft.rollout.environment import Environment, environment
from mmrft.rollout.tool_loop import LoopLimits, ToolLoop
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
SAMPLING = Sampling(max_new_tokens=48, temperature=1.0)

HOSTILE = '''
import os
import time

from mmrft.rollout import Observation
from mmrft.rollout.environment import Environment, environment


@environment("test_counter", timeout_s=1.0)
class Counter(Environment):
    """Counts the calls of its episode; misbehaves on request."""

    def reset(self, sample):
        self.count = 0
        return f"start {sample.id}"

    def add(self) -> str:
        """Add one and say the count and this process's id."""
        self.count += 1
        if self.count == 3:
            self.finish(reward=0.5, state={"count": self.count})
        return f"count {self.count} pid {os.getpid()}"

    def hang(self) -> str:
        """Sleep past the budget."""
        time.sleep(30)
        return "never"

    def garbage(self) -> str:
        """Return something that is not an observation."""
        return 42

    def crash(self) -> str:
        """Raise."""
        raise RuntimeError("boom")

    def flood(self):
        """Return 10 MB of text and a 4000 x 4000 image."""
        from PIL import Image

        return Observation(ok=True, text="x" * 10_000_000, images=[Image.new("RGB", (4000, 4000))])
'''


@pytest.fixture(scope="module")
def policy():
    return tiny_policy("model.min_pixels=3136", "model.max_pixels=12544")


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugins") / "counter_env.py"
    path.write_text(HOSTILE)
    load_plugin(str(path))
    return ENVIRONMENTS.get("test_counter")


def tokens(policy, text: str) -> list[int]:
    return policy.tokenizer.encode(text, add_special_tokens=False)


def call(policy, name: str, **arguments) -> list[int]:
    import json

    body = json.dumps({"name": name, "arguments": arguments})
    return tokens(policy, f"<tool_call>{body}</tool_call>")


def answer(policy) -> list[int]:
    return tokens(policy, "<answer>done</answer>") + [
        policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]


def grid_sample(walker=(0, 1), goal=(2, 1)) -> Sample:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Walk to the green square."}]}
    ]
    return Sample("g0", messages, "right", {"grid": 3, "walker": list(walker), "goal": list(goal)})


def run(policy, spec, scripts, samples, n, **limits):
    loop = ToolLoop(policy.family, policy.processor, {}, LoopLimits(**limits), environment=spec)
    conversations = [loop.with_tools([dict(m) for m in s.messages]) for s in samples]
    out = loop.run(ScriptedEngine(policy, scripts), conversations, samples, n, SAMPLING)
    metrics = loop.metrics()
    loop.close()
    return out, metrics


def test_grid_walk_episodes_carry_state_and_end_with_the_environments_reward(policy) -> None:
    """Three trajectories of one sample (walker two cells left of the goal): right, right
    (the goal: reward 2/2); left off the grid, then right, right (reward 2/3); right, then an
    answer (not finished). The reset's grid image is in the prompt; each move's new grid is an
    observation; environment_reward scores the episodes, environment_progress the way covered."""
    from mmrft.verifiers.tools import environment_progress, environment_reward

    spec = ENVIRONMENTS.get("grid_walk")
    right, left = call(policy, "right"), call(policy, "left")
    scripts = [[right, left, right], [right, right, answer(policy)], [right]]
    out, metrics = run(policy, spec, scripts, [grid_sample()], 3)
    first, second, third = out.trajectories
    assert out.prompts[0]["image_grid_thw"].shape[0] == 1  # the reset's grid, in the prompt
    assert [t.stop for t in out.trajectories] == ["env_done", "env_done", "answer"]
    assert first.environment["reward"] == 1.0 and first.environment["state"] == {
        "moves": 2,
        "shortest": 2,
        "distance": 0,
        "progress": 1.0,
    }
    assert second.environment["reward"] == pytest.approx(2 / 3)
    assert second.calls[0]["reason"] == "off_grid" and second.calls[0]["ok"] is False
    assert third.environment["done"] is False and third.images == 1  # the grid after a move
    assert [len(t.turns) for t in out.trajectories] == [2, 3, 2]
    assert first.images == 1  # the move before the goal showed the grid; the last one ends
    scores = environment_reward(out.texts, [grid_sample()] * 3, out.trajectories)
    assert [s.value for s in scores] == pytest.approx([1.0, 2 / 3, 0.0])
    assert scores[2].reason == "not finished"
    assert third.environment["state"] == {"moves": 1, "shortest": 2, "distance": 1, "progress": 0.5}
    progress = environment_progress(out.texts, [grid_sample()] * 3, out.trajectories)
    assert [s.value for s in progress] == [1.0, 1.0, 0.5]  # half the way, then an answer
    assert metrics["rollout/tools/stop/env_done"] == pytest.approx(2 / 3)
    assert metrics["rollout/tools/episode_reward"] == pytest.approx((1 + 2 / 3) / 3)


def test_instances_live_in_a_worker_and_keep_their_state(policy, counter) -> None:
    """Each trajectory counts its own calls in the worker process (not this one); the third
    call finishes with the environment's reward and state."""
    add = call(policy, "add")
    scripts = [[add, add], [add, add], [add, answer(policy)], [add]]
    sample = Sample("s", [{"role": "user", "content": "Count."}], "x", {})
    out, _ = run(policy, counter, scripts, [sample], 2)
    texts = [c["text"] for c in out.trajectories[0].calls + out.trajectories[0].turns[1].calls]
    assert [t.split(" pid ")[0] for t in texts[:2]] == ["count 1", "count 2"]
    pids = {int(c["text"].split(" pid ")[1]) for t in out.trajectories for c in t.calls}
    assert len(pids) == 1 and os.getpid() not in pids
    assert out.trajectories[0].stop == "env_done"
    assert out.trajectories[0].environment["reward"] == 0.5
    assert out.trajectories[0].environment["state"] == {"count": 3}
    assert out.trajectories[1].stop == "answer" and out.trajectories[1].environment["calls"] == 2


def test_misbehaving_calls_are_observations(policy, counter) -> None:
    """A method that returns garbage or raises, and a method the environment lacks: failed
    calls with their reasons, and each episode goes on; one that returns 10 MB of text and a
    4000² image: bounded in the worker before it is sent back."""
    names = ["garbage", "crash", "nothing", "flood"]
    scripts = [[call(policy, name) for name in names], [answer(policy)] * 3]
    sample = Sample("s", [{"role": "user", "content": "Count."}], "x", {})
    out, _ = run(policy, counter, scripts, [sample], 4, max_tokens=600)
    records = [t.calls[0] for t in out.trajectories]
    assert [r["reason"] for r in records] == ["tool_error", "tool_error", "unknown_tool", None]
    assert "returned int, not an Observation" in records[0]["text"]
    assert "RuntimeError: boom" in records[1]["text"] and "did you mean" in records[2]["text"]
    assert [t.stop for t in out.trajectories] == ["answer"] * 3 + ["max_tokens"]
    assert records[3]["ok"] and records[3]["images"] == 1  # too long to join: max_tokens
    # what the worker sends back is bounded: the text cut to the characters left, the image
    # downscaled to the family's pixel budget, before anything renders or tokenises them
    from mmrft.rollout.environment import EnvironmentRunner
    from mmrft.rollout.tool import ToolCall, ToolContext

    runner = EnvironmentRunner(counter, None)
    context = ToolContext(max_pixels=12544)
    runner.reset("k", sample, context, (1000, 2))
    obs = runner.call("k", ToolCall("flood", {}), context, (1000, 2)).observation
    runner.close()
    assert obs.ok and len(obs.text) <= 1000 and "[cut: 10000000 characters" in obs.text
    assert obs.images[0].width * obs.images[0].height <= 12544


def test_a_call_past_its_budget_loses_the_workers_episodes(policy, counter) -> None:
    """One trajectory's call hangs: its worker is killed at timeout_s, so the other
    trajectory's instance (in the same worker) is gone too: both end env_lost."""
    scripts = [[call(policy, "hang"), call(policy, "add")], [call(policy, "add")]]
    sample = Sample("s", [{"role": "user", "content": "Count."}], "x", {})
    out, metrics = run(policy, counter, scripts, [sample], 2)
    hung, other = out.trajectories
    assert hung.calls[0]["reason"] == "timeout" and hung.stop == "env_lost"
    assert other.calls[0]["reason"] == "environment_lost" and other.stop == "env_lost"
    assert metrics["rollout/tools/stop/env_lost"] == 1.0


def test_a_group_must_start_from_one_observation(policy, tmp_path) -> None:
    path = tmp_path / "drifting_env.py"
    path.write_text(
        "import itertools\n"
        "from mmrft.rollout.environment import Environment, environment\n"
        "_N = itertools.count()\n"
        "@environment('test_drifting')\n"
        "class Drifting(Environment):\n"
        "    def reset(self, sample):\n"
        "        return f'start {next(_N)}'\n"
        "    def go(self) -> str:\n"
        "        '''Go.'''\n"
        "        return 'went'\n"
    )
    load_plugin(str(path))
    sample = Sample("s", [{"role": "user", "content": "Go."}], "x", {})
    with pytest.raises(RuntimeError, match="different first observations"):
        run(policy, ENVIRONMENTS.get("test_drifting"), [[[], []]], [sample], 2)


def test_registration_checks_the_class() -> None:
    with pytest.raises(TypeError, match="no tool methods"):

        @environment("test_empty")
        class Empty(Environment):
            def reset(self, sample):
                return ""

    with pytest.raises(TypeError, match="tool 'go': no JSON schema"):

        @environment("test_undocumented")
        class Undocumented(Environment):
            def reset(self, sample):
                return ""

            def go(self, where: str) -> str:
                """Go somewhere (no Args section)."""
                return where

    with pytest.raises(TypeError, match="define reset"):

        @environment("test_no_reset")
        class NoReset(Environment):
            def go(self) -> str:
                """Go."""
                return ""


def test_config_names_the_environment_key() -> None:
    with pytest.raises(
        ConfigError, match=r"rollout.tools.environment: .*leave rollout.tools.names"
    ):
        load_config(
            None,
            ["train.steps=0", "rollout.tools.environment=grid_walk", "rollout.tools.names=[crop]"],
        )
    from mmrft.rollout.preflight import configured_tools

    cfg = load_config(None, ["train.steps=0", "rollout.tools.environment=grid_wlak"])
    with pytest.raises(
        ConfigError,
        match=r"rollout.tools.environment: unknown environment 'grid_wlak'; did you mean 'grid_walk'",
    ):
        configured_tools(cfg)


def test_two_training_steps_in_the_grid_environment(tmp_path) -> None:
    """mmrft train with rollout.tools.environment: two steps and an evaluation, the episode
    metrics logged, environment_reward in the reward."""
    import json

    from helpers import short_run

    from mmrft.training.trainer import train

    data = tmp_path / "grid.jsonl"
    rows = [
        {
            "id": f"g{i}",
            "messages": [{"role": "user", "content": "Walk to the green square."}],
            "target": "right",
            "meta": {"grid": 3, "walker": [0, i % 3], "goal": [1, i % 3], "choices": ["up", "down", "left", "right"]},
        }
        for i in range(4)
    ]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        REPO / "configs/demo.yaml",
        [
            *short_run(tmp_path, "grid", steps=2, group=2, new_tokens=8),
            f"data.train={data}",
            f"data.test={data}",
            "rollout.tools.environment=grid_walk",
            "rollout.tools.max_turns=2",
            "reward.verifiers=[{name: environment_reward}]",
            "eval.verifiers=[{name: environment_reward}]",
            "eval.before=false",
            "train.threads=1",
        ],
    )
    summary = train(cfg, verbose=False)
    lines = [
        json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [m for m in lines if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all("rollout/tools/episode_reward" in m for m in steps)
    assert all(
        m["train/reward/environment_reward"] == m["rollout/tools/episode_reward"] for m in steps
    )
    assert torch.isfinite(torch.tensor([m["train/loss"] for m in steps])).all()


def test_a_warm_start_demonstration_plays_the_environments_script(policy) -> None:
    """with_start puts the reset's grid in the prompt; demonstration plays grid_walk's scripted
    random walk (the reference first) on an instance of its own, as the loop would."""
    spec = ENVIRONMENTS.get("grid_walk")
    loop = ToolLoop(policy.family, policy.processor, {}, LoopLimits(), environment=spec)
    sample = grid_sample(walker=(0, 1), goal=(1, 1))
    prompt = loop.with_start([dict(m) for m in sample.messages], sample)
    assert [p["type"] for p in prompt[-1]["content"]] == ["text", "image"]
    done = loop.demonstration(sample, spec.demonstration(sample, "right"))
    wrong = loop.demonstration(sample, spec.demonstration(sample, "up"))
    loop.close()
    assert done.stop == "env_done" and done.environment["reward"] == 1.0
    assert wrong.calls[0]["name"] == "up" and wrong.calls[0]["ok"]  # the reference first
    assert wrong.turns[0].calls[0]["images"] == 1  # the grid after a move
    assert sum(done.loss_mask) == len(done.ids)  # the call, the model's tokens only
    later = [spec.demonstration(sample, "up")[1:] for _ in range(40)]  # not the way: random
    assert {text for walk in later for text in walk} == {
        f'<tool_call>{{"name": "{d}"}}</tool_call>' for d in ("up", "down", "left", "right")
    }


def test_environment_progress_reads_the_reported_share_and_refuses_garbage() -> None:
    """A plugin environment's state is untrusted: a progress that is not a number in [0, 1]
    scores 0 with the reason; none reported is None (not scored); a lost episode 0."""
    from types import SimpleNamespace

    from mmrft.verifiers.tools import environment_progress

    def episode(**environment):
        return SimpleNamespace(environment=environment)

    trajectories = [
        episode(done=False, state={"progress": 0.25}),
        episode(done=True, state={"progress": 1}),
        episode(done=False, state={}),
        episode(done=False, state={"progress": "far"}),
        episode(done=False, state={"progress": 1.5}),
        episode(done=False, state={"progress": float("nan")}),
        episode(done=False, state={"progress": True}),
        episode(done=True, lost=True, state={}),
        None,
    ]
    scores = environment_progress([""] * 9, [grid_sample()] * 9, trajectories)
    assert scores[2] is None
    values = [s.value for i, s in enumerate(scores) if i != 2]
    assert values == [0.25, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    reasons = [scores[i].reason for i in (3, 4, 5, 6, 7, 8)]
    assert reasons[0].startswith("progress not a number") and "outside" in reasons[1]
    assert "outside" in reasons[2] and reasons[3].startswith("progress not a number")
    assert reasons[4:] == ["environment lost", "no environment"]
