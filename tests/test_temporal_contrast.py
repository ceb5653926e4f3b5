"""Video-R1's T-GRPO as the collector's auxiliary rollout stage (mmrft.rollout.collector.TemporalContrast
and its metrics), with a stub rollout engine: which prompts get shuffled-frame completions, how they are seeded, what
the bonus adds to the reward, and how several ranks' counts combine. The 2-step training run is
in tests/test_modalities_train.py; the pure bonus in tests/test_algorithms.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from mmrft import collector, runlog
from mmrft import video as V
from mmrft.config import load_config
from mmrft.data import Sample
from mmrft.models.qwen_vl import Qwen25VL
from mmrft.rewards.reward import build_reward
from mmrft.rewards.task import build_task
from mmrft.rollout.base import Rollouts, Sampling
from mmrft.runtime import distributed
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "assets" / "benchmarks" / "video_direction" / "video_r1_train.json"
G = 4


class StubEngine:
    """Returns the queued texts, one list per conversation, and records the calls."""

    def __init__(self, answers: list[list[str]]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list, int]] = []

    def generate(self, conversations: list, n: int, sampling: Sampling) -> Rollouts:
        self.calls.append((conversations, n))
        out = Rollouts(seconds=0.5)
        for _ in conversations:
            texts = self.answers.pop(0)
            assert len(texts) == n
            out.prompts.append({})
            for text in texts:
                out.add(len(out.prompts) - 1, [0], text, False)
        return out


@pytest.fixture
def setup():
    task = build_task("video_qa", {"think": "none"})
    samples, _ = task.read(DATA, fmt="video_r1")
    video = samples[:4]
    image = Sample(
        "img",
        [
            {
                "role": "user",
                "content": [{"type": "image", "image": "/x.png"}, {"type": "text", "text": "Q"}],
            }
        ],
        target=video[0].target,
        meta=dict(video[0].meta),
    )
    # groups: s0 all correct, s1 1/4, s2 2/4, image all correct, s3 none correct
    batch = [video[0], video[1], video[2], image, video[3]]
    reward = build_reward([{"name": "accuracy"}])

    def right(s: Sample) -> str:
        return f"<answer>{task.reference_answer(s)}</answer>"

    wrong = "<answer>none of them</answer>"
    pattern = [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    texts = [right(s) if ok else wrong for s, row in zip(batch, pattern) for ok in row]
    expanded = [s for s in batch for _ in range(G)]
    return SimpleNamespace(
        task=task, batch=batch, reward=reward, texts=texts, expanded=expanded, right=right
    )


def run(setup, engine: StubEngine, *overrides: str):
    cfg = load_config(
        None,
        [
            "train.steps=0",
            f"rollout.group_size={G}",
            "algorithm.temporal_contrast.enabled=true",
            *overrides,
        ],
    )
    scored = setup.reward(setup.texts, setup.expanded)
    before = list(scored.total)
    rollouts = Rollouts(seconds=1.0)
    (stage,) = collector.build_auxiliaries(cfg, setup.reward)
    family = Qwen25VL()
    rnd = collector.Round(
        samples=setup.batch,
        positions=[100, 101, 102, 103, 104],
        conversations=[setup.task.prompt(s, family) for s in setup.batch],
        rollouts=rollouts,
        scored=scored,
        group_size=G,
    )
    collect = collector.Collector(
        cfg,
        setup.task,
        SimpleNamespace(family=family),
        engine,
        setup.reward,
        samples=[],
        source=collector.DataStream(1, 0),
        auxiliaries=[stage],
    )
    collect.run_auxiliary(stage, rnd, 1)
    counts = dict(stage.counts)
    added = [round(a - b, 6) for a, b in zip(scored.total, before)]
    return scored, added, counts, rollouts


def test_only_undecided_video_groups_are_sampled_and_get_the_bonus(setup):
    b = setup.batch
    # s1 (p 0.25) faces p̃ = 1: no bonus; s2 (p 0.5) faces p̃ = 0: bonus to its 2 correct answers
    engine = StubEngine([[setup.right(b[1])] * 2, ["<answer>?</answer>"] * 2])
    scored, added, counts, rollouts = run(setup, engine)
    assert len(engine.calls) == 1
    conversations, n = engine.calls[0]
    assert n == G // 2 and len(conversations) == 2  # s0 and s3 are decided, the image has none
    seeds = [c[0]["content"][0][V.SHUFFLE_KEY] for c in conversations]
    expected = [
        V.with_shuffled_frames(setup.task.prompt(b[i], Qwen25VL()), collector.shuffle_seed(42, p))
        for i, p in ((1, 101), (2, 102))
    ]
    assert conversations == expected and seeds[0] != seeds[1]
    assert V.SHUFFLE_KEY not in b[1].messages[0]["content"][0]  # the sample is untouched
    temporal = [s.value if s is not None else None for s in scored.scores["temporal"]]
    assert temporal == [0.3] * 4 + [0.0] * 4 + [0.3, 0.3, 0.0, 0.0] + [None] * 4 + [0.0] * 4
    assert added == [t or 0.0 for t in temporal]
    assert rollouts.seconds == 1.5  # the shuffled generation counts as rollout time
    assert {k: counts[k] for k in ("generated", "groups", "bonus_groups", "sampled_groups")} == {
        "generated": 4,
        "groups": 4,
        "bonus_groups": 2,
        "sampled_groups": 2,
    }
    assert (counts["ordered_sum"], counts["ordered_n"]) == (3.0, 8)
    assert (counts["shuffled_sum"], counts["shuffled_n"]) == (2.0, 4)


def test_every_video_group_sampled_without_skipping(setup):
    b = setup.batch
    answers = [[setup.right(b[0])] * 3, [setup.right(b[1])] * 3, ["x"] * 3, ["x"] * 3]
    engine = StubEngine(answers)
    _, added, counts, _ = run(
        setup,
        engine,
        "algorithm.temporal_contrast.skip_decided=false",
        "algorithm.temporal_contrast.shuffled_per_prompt=3",
    )
    assert [len(c) for c, _ in engine.calls] == [4] and engine.calls[0][1] == 3
    # the same rewards as with skipping: decided groups do not depend on their shuffled answers
    assert added == [0.3] * 4 + [0.0] * 4 + [0.3, 0.3, 0.0, 0.0] + [0.0] * 4 + [0.0] * 4
    assert counts["generated"] == 12 and counts["shuffled_sum"] == 6.0


def test_metrics_combine_every_rank(monkeypatch):
    mine = {"generated": 4, "groups": 4, "bonus_groups": 2, "ordered_sum": 3.0, "ordered_n": 8}
    mine |= {"shuffled_sum": 2.0, "shuffled_n": 4}
    other = [2, 1, 1.0, 4, 0.0, 2]  # groups … shuffled_n of another rank
    monkeypatch.setattr(distributed, "gather_objects", lambda values: [values, other])
    stage = collector.TemporalContrast(
        load_config(None, ["train.steps=0"]).algorithm.temporal_contrast,
        G,
        42,
        build_reward([{"name": "accuracy"}]),
    )
    stage.counts.update(mine)
    out = stage.metrics()
    assert out == {
        "rollout/temporal_generated": 4.0,  # this rank's; summed by merge_rank_metrics
        "train/temporal_bonus_rate": 3 / 6,
        "train/temporal_ordered_accuracy": 4.0 / 12,
        "train/temporal_shuffled_accuracy": 2.0 / 6,
    }
    ranks = [{"rollout/temporal_generated": 4.0}, {"rollout/temporal_generated": 6.0}]
    monkeypatch.setattr(distributed, "gather_objects", lambda metrics: ranks)
    assert runlog.merge_rank_metrics(ranks[0])["rollout/temporal_generated"] == 10.0


def test_no_video_groups_log_only_the_count(monkeypatch):
    stage = collector.TemporalContrast(
        load_config(None, ["train.steps=0"]).algorithm.temporal_contrast,
        G,
        42,
        build_reward([{"name": "accuracy"}]),
    )
    assert stage.metrics() == {"rollout/temporal_generated": 0.0}
    assert stage.counts == {}  # reset for the next step


def test_shuffle_seed_is_a_pure_function_of_seed_and_position():
    assert collector.shuffle_seed(42, 7) == collector.shuffle_seed(42, 7)
    assert len({collector.shuffle_seed(42, p) for p in range(100)}) == 100
    assert collector.shuffle_seed(42, 7) != collector.shuffle_seed(43, 7)
    assert collector.shuffle_seed(-1, 7) >= 0


def test_verifier_must_be_one_of_the_run_verifiers():
    reward = build_reward([{"name": "format"}, {"name": "accuracy"}])
    cfg = load_config(
        None,
        [
            "train.steps=0",
            "algorithm.temporal_contrast.enabled=true",
            "algorithm.temporal_contrast.verifier=acuracy",
        ],
    )
    with pytest.raises(
        ConfigError, match=r"algorithm.temporal_contrast.verifier: 'acuracy'.*'accuracy'"
    ):
        collector.build_auxiliaries(cfg, reward)
    cfg.algorithm.temporal_contrast.enabled = False
    assert collector.build_auxiliaries(cfg, reward) == []  # off: not checked
