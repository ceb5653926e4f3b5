"""Asynchronous verifiers (mmrft/rewards/verifier.py): ``async def`` verifiers under the same contract as
sync ones, run concurrently on the reward's event loop under ``reward.timeout_s``, and scored
while the hf engine decodes the next round (mmrft/rollout/collector.py) without changing what is
sampled."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from mmrft import Sample, Score, verifier
from mmrft.rewards.reward import build_reward
from mmrft.rewards.verifier import NonFiniteRewardError, VerifierError, VerifierTimeoutError
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]

# The same verifier written async and sync, in two plugin files registering one name, so that
# a training run with either logs the same metric names.
TWIN = '''
import asyncio, json, time
from mmrft import Score, verifier


@verifier("test_twin_length", low=0.0, high=1.0)
{kind}def twin_length(completions, samples, *, scale: float = 20.0, log: str = ""):
    """Completion length / scale, capped at 1 (0 for an empty one, reason "empty")."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {{scale}}")
    {pause}
    if log and completions:
        with open(log, "a") as f:
            f.write(json.dumps({{"n": len(completions), "ids": [s.id for s in samples]}}) + "\\n")
    return [
        Score(min(len(c), scale) / scale) if c else Score(0.0, reason="empty") for c in completions
    ]
'''


def twin_plugin(folder: Path, kind: str) -> Path:
    """The twin verifier's plugin file, ``kind`` ``async`` or ``sync``."""
    path = folder / f"twin_{kind}.py"
    if kind == "async":
        path.write_text(TWIN.format(kind="async ", pause="await asyncio.sleep(0.01)"))
    else:
        path.write_text(TWIN.format(kind="", pause="time.sleep(0.01)"))
    return path


def load(path: Path) -> None:
    from mmrft.plugins import load_plugins

    load_plugins([str(path)])


def samples(n: int) -> list[Sample]:
    return [Sample(id=f"s{i}", messages=[], target="x") for i in range(n)]


# -- verifiers registered by this module ------------------------------------------------------

SPANS: dict[str, tuple[float, float]] = {}
CANCELLED: list[str] = []
GROUPS: list[list[str]] = []


def slow(key: str, value: float):
    """An async verifier that sleeps ``seconds``, records its span in SPANS[key], gives
    ``value``."""

    async def slow_verifier(completions, samples, *, seconds: float = 0.3):
        start = time.monotonic()
        await asyncio.sleep(seconds if completions else 0)
        SPANS[key] = (start, time.monotonic())
        return [value for _ in completions]

    return slow_verifier


slow_a = verifier("test_async_slow_a")(slow("a", 1.0))
slow_b = verifier("test_async_slow_b")(slow("b", 0.5))


@verifier("test_async_stuck")
async def stuck(completions, samples):
    """Never returns on a real batch (an endpoint that never answers)."""
    if not completions:
        return []
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        CANCELLED.append("stuck")
        raise
    return [1.0 for _ in completions]


@verifier("test_async_hostile", low=0.0, high=1.0)
async def hostile(completions, samples, *, mode: str = "raise"):
    if mode not in ("raise", "short", "nan", "high"):
        raise ValueError(f"unknown mode {mode!r}")
    if not completions:
        return []
    await asyncio.sleep(0)
    if mode == "raise":
        raise RuntimeError("the endpoint said no")
    if mode == "short":
        return [1.0]
    if mode == "nan":
        return [float("nan")] * len(completions)
    return [2.0] * len(completions)


@verifier("test_async_group_rank", group=True)
async def group_rank(completions, samples, *, short: bool = False):
    """1 for the longest completion of the group, 0 for the others."""
    if not completions:
        return []
    GROUPS.append(list(completions))
    await asyncio.sleep(0.05)
    if short:
        return [1.0]
    longest = max(len(c) for c in completions)
    return [Score(1.0) if len(c) == longest else Score(0.0) for c in completions]


@verifier("test_sync_const", isolate=False)
def sync_const(completions, samples, *, value: float = 0.25):
    return [value for _ in completions]


@verifier("test_sync_raise")
def sync_raise(completions, samples):
    if completions:
        raise KeyError("sync failure")
    return []


# -- the contract ------------------------------------------------------------------------------


def test_an_async_plugin_verifier_scores_like_its_sync_twin(tmp_path):
    completions = ["", "short", "a completion longer than twenty characters", "abc"]
    scored = {}
    for kind in ("async", "sync"):
        load(twin_plugin(tmp_path, kind))
        reward = build_reward([{"name": "test_twin_length", "params": {"scale": 10.0}}])
        try:
            assert reward.is_async == (kind == "async")
            if kind == "async":  # never in a verifier worker, even under isolation: process
                assert reward.pool is None
            scored[kind] = reward(completions, samples(4), context="at step 1")
        finally:
            reward.close()
    assert scored["async"].total == scored["sync"].total == [0.0, 0.5, 1.0, 0.3]
    assert scored["async"].scores == scored["sync"].scores
    assert scored["async"].reasons == scored["sync"].reasons == {"test_twin_length/empty": 1}
    assert scored["async"].metrics() == scored["sync"].metrics()


def test_async_parameters_are_type_checked_and_validated_at_start_up(tmp_path):
    load(twin_plugin(tmp_path, "async"))
    with pytest.raises(ConfigError, match="scale must be > 0"):  # the awaited empty call
        build_reward([{"name": "test_twin_length", "params": {"scale": -1.0}}])
    with pytest.raises(ConfigError, match="scale"):
        build_reward([{"name": "test_twin_length", "params": {"scale": "big"}}])
    with pytest.raises(ConfigError, match="unknown mode"):
        build_reward([{"name": "test_async_hostile", "params": {"mode": "worst"}}])


def test_two_async_verifiers_run_at_the_same_time():
    reward = build_reward(
        [{"name": "test_async_slow_a"}, {"name": "test_async_slow_b", "weight": 2.0}],
        timeout_s=30,
    )
    SPANS.clear()
    out = reward(["x", "y"], samples(2))
    reward.close()
    assert out.total == [2.0, 2.0]
    (a_start, a_end), (b_start, b_end) = SPANS["a"], SPANS["b"]
    assert a_start < b_end and b_start < a_end  # each started before the other ended


def test_sync_pooled_and_async_verifiers_together_keep_configured_order():
    """Async on the loop, sync in-process in a thread, pooled through the workers: the same
    totals, scores and reasons as each verifier alone, in configured order."""
    specs = [
        {"name": "format", "params": {"think": "none"}},  # pooled (a built-in)
        {"name": "test_async_slow_a", "params": {"seconds": 0.05}},
        {"name": "test_sync_const", "weight": 2.0},  # isolate=False: in a budget thread
        {"name": "test_async_slow_b", "params": {"seconds": 0.05}},
    ]
    completions = ["<answer>x</answer>", "no tags"]
    together = build_reward(specs, timeout_s=30)
    alone = [build_reward([spec], timeout_s=30) for spec in specs]
    try:
        assert together.pool is not None and together.pool.names == {"format"}
        out = together(completions, samples(2))
        parts = [r(completions, samples(2)) for r in alone]
    finally:
        for r in [together, *alone]:
            r.close()
    assert list(out.scores) == [s["name"] for s in specs]
    for spec, part in zip(specs, parts):
        assert out.scores[spec["name"]] == part.scores[spec["name"]]
    assert out.total == [sum(p.total[i] for p in parts) for i in range(2)] == [3.0, 2.0]
    assert out.reasons == sum((p.reasons for p in parts), type(out.reasons)())


def test_the_first_failure_in_configured_order_is_raised():
    reward = build_reward(
        [{"name": "test_sync_raise"}, {"name": "test_async_hostile"}], isolation="inline"
    )
    with pytest.raises(VerifierError, match="verifier 'test_sync_raise' raised KeyError"):
        reward(["x"], samples(1), context="at step 5")
    reward.close()


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_an_async_verifier_past_its_budget_is_cancelled_and_scores_the_minimum(caplog):
    specs = [{"name": "test_async_stuck"}, {"name": "test_async_slow_b", "params": {"seconds": 0}}]
    reward = build_reward(specs, timeout_s=0.3)
    CANCELLED.clear()
    start = time.monotonic()
    out = reward(["x", "y"], samples(2), context="at step 7")
    assert time.monotonic() - start < 10
    assert [s.reason for s in out.scores["test_async_stuck"]] == ["timeout", "timeout"]
    assert out.total == [0.5, 0.5]  # the other verifier still counts
    assert "verifier 'test_async_stuck' exceeded its 0.3s budget at step 7" in caplog.text
    assert "s0, s1" in caplog.text
    for _ in range(100):  # the cancellation reaches the coroutine on the reward's loop
        if CANCELLED:
            break
        time.sleep(0.01)
    assert CANCELLED == ["stuck"]
    reward.close()


def test_an_async_verifier_past_its_budget_stops_the_run_under_on_timeout_stop():
    reward = build_reward([{"name": "test_async_stuck"}], timeout_s=0.2, on_timeout="stop")
    with pytest.raises(VerifierTimeoutError, match=r"test_async_stuck.*at step 3.*s0") as info:
        reward(["x"], samples(1), context="at step 3")
    assert info.value.step == 3 and info.value.sample_ids == ["s0"]
    # the same through the background scorer the collector uses
    with pytest.raises(VerifierTimeoutError, match="test_async_stuck"):
        reward.submit(["x"], samples(1), context="at step 4").result(timeout=10)
    reward.close()


@pytest.mark.parametrize(
    "mode, error, match",
    [
        (
            "raise",
            VerifierError,
            "raised RuntimeError: the endpoint said no at step 2 on samples s0",
        ),
        ("short", VerifierError, "returned 1 results for a 2 completions"),
        ("nan", NonFiniteRewardError, "returned nan for sample 's0'"),
        ("high", VerifierError, "outside its declared range"),
    ],
)
def test_a_hostile_async_verifier_is_stopped_naming_itself(mode, error, match):
    reward = build_reward([{"name": "test_async_hostile", "params": {"mode": mode}}])
    with pytest.raises(error, match=match) as info:
        reward(["x", "y"], samples(2), context="at step 2")
    assert info.value.verifier == "test_async_hostile" and info.value.step == 2
    reward.close()


def test_a_group_aware_async_verifier_is_awaited_once_per_group():
    reward = build_reward([{"name": "test_async_group_rank"}], isolation="process")
    assert reward.pool is None  # in this process
    GROUPS.clear()
    out = reward(
        ["a", "bbb", "cc", "dd", "d", "x"], [s for s in samples(2) for _ in range(3)], group_size=3
    )
    assert sorted(GROUPS) == [["a", "bbb", "cc"], ["dd", "d", "x"]]
    assert out.total == [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    short = build_reward([{"name": "test_async_group_rank", "params": {"short": True}}])
    with pytest.raises(VerifierError, match="returned 1 results for a group of 3 completions"):
        short(["a", "b", "c"], [samples(1)[0]] * 3, context="at step 1", group_size=3)
    reward.close()
    short.close()


def test_an_async_plain_reward_function_is_an_async_verifier(tmp_path):
    (tmp_path / "trl_rewards.py").write_text(
        "import asyncio\n\n"
        "async def brevity(completions, solution, **kwargs):\n"
        "    await asyncio.sleep(0)\n"
        "    return [1.0 if len(c) < 4 and s == 'x' else 0.0 for c, s in zip(completions, solution)]\n"
    )
    reward = build_reward([{"name": f"{tmp_path / 'trl_rewards.py'}:brevity"}])
    assert reward.is_async and reward.pool is None
    assert reward(["ab", "abcdef"], samples(2)).total == [1.0, 0.0]
    reward.close()


def test_submitted_batches_are_scored_in_the_background_in_order():
    reward = build_reward([{"name": "test_async_slow_a", "params": {"seconds": 0.05}}])
    futures = [reward.submit(["x"] * (k + 1), samples(k + 1)) for k in range(3)]
    assert [len(f.result(timeout=10).total) for f in futures] == [1, 2, 3]
    assert threading.current_thread() is threading.main_thread()
    reward.close()


# -- overlap with generation ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_policy():
    import torch

    from mmrft.config import ModelConfig
    from mmrft.policy.model import load_policy

    model = ModelConfig(path=str(REPO / "assets/models/tiny-qwen2_5_vl"))
    return load_policy(model, torch.device("cpu"))


@pytest.mark.parametrize("group_shared", [True, False])
def test_the_hf_engine_reports_finished_groups_without_changing_the_samples(
    tiny_policy, group_shared
):
    import torch

    from mmrft.rollout.base import Sampling
    from mmrft.rollout.hf import HFEngine

    conversations = [
        [{"role": "user", "content": [{"type": "text", "text": f"Name colour {k}."}]}]
        for k in range(3)
    ]
    engine = HFEngine(tiny_policy, batch_size=5, group_shared=group_shared)
    sampling = Sampling(max_new_tokens=5, temperature=1.3)
    torch.manual_seed(0)
    plain = engine.generate(conversations, 4, sampling)
    reports = []
    torch.manual_seed(0)
    reported = engine.generate(
        conversations, 4, sampling, on_groups=lambda g, t: reports.append((g, t))
    )
    assert reported.completion_ids == plain.completion_ids
    assert reported.texts == plain.texts
    # rounds of 5 of 12 completions: after 5 group 0, after 10 group 1, after 12 group 2
    assert [g for g, _ in reports] == [[0], [1], [2]]
    assert [t for _, t in reports] == [plain.texts[0:4], plain.texts[4:8], plain.texts[8:12]]


def two_steps(tmp_path: Path, kind: str) -> Path:
    """Two GRPO steps on the tiny model with the twin verifier written ``kind``; 2 prompts × 4
    completions decoded in rounds of 3 (rollout.batch_size < P·G)."""
    import mmrft

    plugin = twin_plugin(tmp_path, kind)
    log = tmp_path / f"{kind}.calls.jsonl"
    twin = {"name": "test_twin_length", "params": {"log": str(log)}}
    cfg = mmrft.load_config(
        REPO / "configs/demo.yaml",
        [
            f"output_dir={tmp_path}",
            f"name={kind}",
            "warm_start.steps=0",
            "train.steps=2",
            "train.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.batch_size=3",
            "rollout.max_new_tokens=6",
            "eval.before=false",
            "eval.after=false",
            "train.completions_every=1",
            f"plugins=[{plugin}]",
            f"reward.verifiers=[{{name: format}}, {json.dumps(twin)}]",
        ],
    )
    mmrft.train(cfg)
    return tmp_path / kind


def measured(line: dict) -> dict:
    """A metrics line without its timings (and what is computed from them)."""
    return {k: v for k, v in line.items() if not k.startswith(("time/", "throughput/", "system/"))}


def test_training_with_an_async_verifier_equals_its_sync_twin_bit_for_bit(tmp_path):
    runs = {kind: two_steps(tmp_path, kind) for kind in ("sync", "async")}
    lines = {
        kind: [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        for kind, run in runs.items()
    }
    assert len(lines["async"]) == 2
    assert [measured(x) for x in lines["async"]] == [measured(x) for x in lines["sync"]]
    assert (
        "train/loss" in lines["async"][0] and "train/reward/test_twin_length" in lines["async"][0]
    )
    completions = {
        kind: [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
        for kind, run in runs.items()
    }
    assert completions["async"] == completions["sync"] and len(completions["async"]) == 16
    # the overlap ran: the async twin saw one group (4 completions) per call, the sync one
    # the step's 8 at once
    calls = {
        kind: [
            json.loads(x)["n"] for x in (tmp_path / f"{kind}.calls.jsonl").read_text().splitlines()
        ]
        for kind in runs
    }
    assert calls["sync"] == [8, 8] and calls["async"] == [4, 4, 4, 4]
