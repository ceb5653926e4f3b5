import math

import pytest

from mmrft import Sample, Score, verifier
from mmrft.rewards.reward import build_reward
from mmrft.rewards.verifier import NonFiniteRewardError
from mmrft.typecheck import ConfigError


@verifier("test_const", low=0.0, high=2.0)
def const(completions, samples, *, value: float = 1.0):
    return [value for _ in completions]


@verifier("test_parts")
def parts(completions, samples):
    return [Score(0.5, parts={"a": 0.25}) if c else None for c in completions]


def samples(n):
    return [Sample(id=f"s{i}", messages=[]) for i in range(n)]


def test_weighted_sum_range_and_metrics():
    reward = build_reward(
        [{"name": "test_const", "weight": 2.0}, {"name": "test_parts", "weight": 1.0}]
    )
    assert reward.range == (0.0, 5.0)
    out = reward(["x", ""], samples(2))
    assert out.total == [2.5, 2.0]  # None ("not applicable") adds nothing
    metrics = out.metrics()
    assert metrics["train/reward"] == pytest.approx(2.25)
    assert metrics["train/reward/test_parts"] == 0.5  # mean over applicable only
    assert metrics["train/reward/test_parts/a"] == 0.25


def test_float_minimum_gets_a_reason():
    reward = build_reward([{"name": "test_const", "params": {"value": 0.0}}])
    out = reward(["x"], samples(1))
    assert out.reasons["test_const/minimum"] == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_reward_stops_naming_verifier_and_sample(bad):
    reward = build_reward([{"name": "test_const", "params": {"value": bad}}])
    with pytest.raises(
        NonFiniteRewardError, match=r"verifier 'test_const' returned .* for sample 's0'"
    ):
        reward(["x"], samples(1))


def test_bad_reward_specs():
    with pytest.raises(ConfigError, match="listed twice"):
        build_reward([{"name": "test_const"}, {"name": "test_const"}])
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['wieght'\]"):
        build_reward([{"name": "test_const", "wieght": 1}])
    with pytest.raises(ConfigError, match="weight"):
        build_reward([{"name": "test_const", "weight": "heavy"}])
    with pytest.raises(ConfigError, match="at least one"):
        build_reward([])


@verifier("test_sleepy")
def sleepy(completions, samples, *, seconds: float = 0.0):
    import time

    if completions:
        time.sleep(seconds)
    return [1.0 for _ in completions]


def test_verifier_over_budget_scores_zero_with_reason_or_stops(caplog):
    from mmrft.rewards.verifier import VerifierTimeoutError

    specs = [{"name": "test_sleepy", "params": {"seconds": 2.0}}, {"name": "test_const"}]
    reward = build_reward(specs, timeout_s=0.2)
    out = reward(["x", "y"], samples(2), context="step 7")
    assert out.scores["test_sleepy"][0].reason == "timeout"
    assert out.total == [1.0, 1.0]  # the other verifier still counts
    assert "verifier 'test_sleepy' exceeded its 0.2s budget step 7" in caplog.text
    assert "s0, s1" in caplog.text
    stopping = build_reward(specs, timeout_s=0.2, on_timeout="stop")
    with pytest.raises(VerifierTimeoutError, match=r"test_sleepy.*step 3.*s0"):
        stopping(["x"], samples(1), context="step 3")


# -- group-aware verifiers --------------------------------------------------------------------

GROUP_CALLS: list[list[str]] = []


@verifier("test_group_rank", group=True)
def group_rank(completions, samples, *, mode: str = "rank"):
    """1 for the longest completion of the group, 0 for the others; hostile modes break the
    contract."""
    if mode not in ("rank", "short", "nan", "high", "text"):
        raise ValueError(f"unknown mode {mode!r}")
    GROUP_CALLS.append(list(completions))
    if not completions:
        return []
    if mode == "short":
        return [1.0]
    if mode == "nan":
        return [float("nan")] * len(completions)
    if mode == "high":
        return [2.0] * len(completions)
    if mode == "text":
        return ["best"] * len(completions)
    longest = max(len(c) for c in completions)
    return [Score(1.0) if len(c) == longest else Score(0.0) for c in completions]


def grouped_samples(groups: int, size: int) -> list[Sample]:
    return [s for s in samples(groups) for _ in range(size)]


def test_group_verifier_is_called_once_per_group():
    reward = build_reward([{"name": "test_group_rank"}], isolation="process")
    assert reward.pool is None  # group-aware verifiers run in this process
    GROUP_CALLS.clear()
    out = reward(["a", "bbb", "cc", "dd", "d", "x"], grouped_samples(2, 3), group_size=3)
    assert GROUP_CALLS == [["a", "bbb", "cc"], ["dd", "d", "x"]]
    assert out.total == [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    # without a group size: each run of completions of one sample is a group
    GROUP_CALLS.clear()
    ids = [Sample(id=i, messages=[]) for i in ["p", "p", "q", "q", "q"]]
    assert reward(["a", "bb", "c", "c", "c"], ids).total == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert GROUP_CALLS == [["a", "bb"], ["c", "c", "c"]]


def test_group_size_must_divide_the_batch():
    reward = build_reward([{"name": "test_group_rank"}], isolation="inline")
    with pytest.raises(ValueError, match="groups of 2"):
        reward(["a", "b", "c"], grouped_samples(1, 3), group_size=2)


@pytest.mark.parametrize(
    "mode, error, match",
    [
        ("short", "VerifierError", "returned 1 results for a group of 3 completions"),
        ("nan", "NonFiniteRewardError", "returned nan"),
        ("high", "VerifierError", "outside its declared range"),
        ("text", "VerifierError", "not a number"),
    ],
)
def test_hostile_group_verifier_is_stopped_like_others(mode, error, match):
    from mmrft import rewards

    reward = build_reward([{"name": "test_group_rank", "params": {"mode": mode}}])
    with pytest.raises(getattr(rewards, error), match=match) as info:
        reward(["a", "b", "c"], grouped_samples(1, 3), context="at step 4", group_size=3)
    assert info.value.verifier == "test_group_rank" and info.value.step == 4


def test_group_verifier_parameters_are_checked_at_start_up():
    with pytest.raises(ConfigError, match="unknown mode"):
        build_reward([{"name": "test_group_rank", "params": {"mode": "best"}}])


def test_group_verifier_alone_takes_the_group_size():
    # score_one is how auxiliary stages (T-GRPO's shuffled completions, n per prompt) score
    reward = build_reward([{"name": "test_group_rank"}], isolation="inline")
    GROUP_CALLS.clear()
    scores = reward.score_one("test_group_rank", ["a", "bb", "c", "d"], samples(4), group_size=2)
    assert [s.value for s in scores] == [0.0, 1.0, 1.0, 1.0]
    assert GROUP_CALLS == [["a", "bb"], ["c", "d"]]
