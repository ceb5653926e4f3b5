"""Asynchronous rollouts (mmrft.rollout.ahead): versions, the gate, the correction's inputs, drops,
errors, resume, and k = 0 through the rollout thread equal to the synchronous path."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import pytest
import torch
from test_sharding import _needs
from test_trainer import tiny_config, weights

from mmrft.data import Sample
from mmrft.rewards.reward import RewardBreakdown
from mmrft.rollout.ahead import AheadCollector, drop_groups, lag_stats, rollout_copy, stale_groups
from mmrft.rollout.base import Rollouts
from mmrft.rollout.collector import Collector, StepBatch
from mmrft.rollout.hf import HFEngine
from mmrft.training import setup as training_setup
from mmrft.training import trainer
from mmrft.training.update import sampler_logps, training_forward
from mmrft.typecheck import ConfigError

# ---------------------------------------------------------------------------------------------
# Pure pieces, hand-computed


def test_stale_groups_and_lag_by_hand():
    versions = [[3, 3], [3], [1, 3], [3, 3]]  # two groups of 2; group 1 holds a version-1 token
    assert stale_groups(versions, 2, current=3, bound=1) == [1]
    assert stale_groups(versions, 2, current=3, bound=2) == []
    assert stale_groups(versions, 2, current=5, bound=1) == [0, 1]
    # lags 0,0 | 0 | 2,0 | 0,0 → mean 2/7, max 2
    assert lag_stats(versions, 3) == pytest.approx((2 / 7, 2.0))
    assert lag_stats([], 3) == (0.0, 0.0)


def test_drop_groups_keeps_the_others_and_everything_generated():
    samples = [Sample(id=f"s{g}", messages=[], target="") for g in range(3) for _ in range(2)]
    rollouts = Rollouts(prompts=[{}, {}, {}], prompt_index=[0, 0, 1, 1, 2, 2])
    for i in range(6):
        rollouts.add(i // 2, [i], f"c{i}", False, [-0.1 * i], [i // 2])
    rollouts.prompt_index = [0, 0, 1, 1, 2, 2]
    batch = StepBatch(
        samples=samples,
        rollouts=rollouts,
        rewards=torch.arange(6.0),
        generated=rollouts,
        generated_samples=samples,
        scored=RewardBreakdown(total=[0.0] * 6, scores={}, reasons={}),
    )
    out = drop_groups(batch, [1], 2)
    assert [s.id for s in out.samples] == ["s0", "s0", "s2", "s2"]
    assert out.rewards.tolist() == [0.0, 1.0, 4.0, 5.0]
    assert out.rollouts.texts == ["c0", "c1", "c4", "c5"]
    assert out.rollouts.token_versions == [[0], [0], [2], [2]]
    assert out.generated is rollouts and len(out.generated_samples) == 6


# ---------------------------------------------------------------------------------------------
# The rollout thread on a scripted schedule


class ScriptedEngine(HFEngine):
    """The real ``hf`` engine, whose calls wait until the test releases them: the test decides
    how generation interleaves with the updates. ``entered[c]`` is set when call ``c`` starts
    (with the version it samples with in ``versions_at_entry``)."""

    def __init__(self, policy, calls: int = 8) -> None:
        super().__init__(policy, batch_size=8)
        self.entered = [threading.Event() for _ in range(calls)]
        self.release = [threading.Event() for _ in range(calls)]
        self.versions_at_entry: list[int] = []
        self.calls = 0

    def generate(self, conversations, n, sampling):
        call = self.calls
        self.calls += 1
        self.versions_at_entry.append(self.version)
        self.entered[call].set()
        assert self.release[call].wait(60), f"call {call} never released"
        return super().generate(conversations, n, sampling)


HASH_PLUGIN = """
from mmrft import verifier

@verifier("test_ahead_hash", low=0.0, high=1.0)
def spread(completions, samples):
    \"\"\"A deterministic score that differs between completions: rewards vary in a group.\"\"\"
    return [sum(map(ord, c)) % 7 / 6 for c in completions]
"""


def config(tmp_path, *extra: str):
    """The trainer tests' tiny run, rewarded by ``test_ahead_hash`` (so updates move)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    plugin = tmp_path / "hash_plugin.py"
    plugin.write_text(HASH_PLUGIN)
    return tiny_config(
        tmp_path, f"plugins=[{plugin}]", "reward.verifiers=[{name: test_ahead_hash}]", *extra
    )


@contextlib.contextmanager
def scripted_run(tmp_path, partial: bool = False, staleness: int = 1):
    """A set-up run whose collector is the rollout thread over a :class:`ScriptedEngine`:
    ``(run, engine)``; on the way out every engine call is released and the run closed."""
    cfg = config(
        tmp_path,
        f"rollout.max_staleness={staleness}",
        "algorithm.tis_cap=2",
        f"rollout.partial_rollouts={str(partial).lower()}",
        "optim.lr=5e-2",
        "rollout.max_new_tokens=8",
    )
    run = training_setup.setup(cfg)
    copy = rollout_copy(run.policy)
    engine = ScriptedEngine(copy)
    inner = Collector(
        cfg,
        run.task,
        copy,
        engine,
        run.reward,
        run.train_samples,
        run.stream,
        run.collector.collector.auxiliaries,
    )
    run.collector.close()
    run.collector = AheadCollector(inner, run.policy, staleness, partial)
    try:
        yield run, engine
    finally:
        for event in engine.release:
            event.set()
        run.collector.close()
        run.reward.close()


def train_on(run, batch, step):
    advantage = trainer.advantages(run, batch, step, trainer.Heartbeat(0))
    return trainer.update(run, batch, advantage, step)  # pushes version `step` to the thread


def sampler_gap(policy, batch, cfg) -> float:
    """Largest |log π(y_t) − sampler log-prob| over the batch's tokens under ``policy``."""
    indices = list(range(len(batch.rollouts.completion_ids)))
    with torch.no_grad():
        logps, mask, _ = training_forward(policy, batch.rollouts, indices, cfg, False)
    sampler = sampler_logps(batch.rollouts, indices, logps)
    return float(((logps - sampler).abs() * mask).max())


def test_one_step_ahead_records_versions_and_the_samplers_weights(tmp_path):
    with scripted_run(tmp_path) as (run, engine):
        ahead = run.collector
        ahead.sync_weights(0)
        ahead.start(1, 3)
        engine.release[0].set()
        b1 = ahead.collect(1)
        assert {v for vs in b1.rollouts.token_versions for v in vs} == {0}
        assert b1.counts["rollout/lag_max"] == 0.0
        # batch 2 starts at version 0 (the gate allows it: 0 ≥ 2 − 1 − 1), then update 1 runs
        assert engine.entered[1].wait(60)
        version_0 = rollout_copy(run.policy)
        train_on(run, b1, 1)
        engine.release[1].set()
        b2 = ahead.collect(2)
        assert engine.versions_at_entry[:2] == [0, 0]
        assert {v for vs in b2.rollouts.token_versions for v in vs} == {0}
        assert b2.counts["rollout/lag_mean"] == 1.0 and b2.counts["rollout/stale_dropped"] == 0
        # the correction's input: the sampler's log-probs are version 0's, not the trainer's
        assert sampler_gap(version_0, b2, run.cfg) < 1e-4
        assert sampler_gap(run.policy, b2, run.cfg) > 1e-3
        # batch 3 may start once version 1 exists; it samples with version 1
        assert engine.entered[2].wait(60)
        stats = train_on(run, b2, 2)
        assert stats["rollout/logp_gap_mean"] > 0  # what the importance weights correct
        engine.release[2].set()
        b3 = ahead.collect(3)
        assert engine.versions_at_entry == [0, 0, 1]
        assert b3.counts["rollout/lag_max"] == 1.0
        # the checkpoint after step 2 keeps the state from before step 3: position 2 × 2
        assert ahead.resume_state(2)["data_position"] == 2 * 2


def test_the_gate_holds_the_rollout_thread_k_updates_ahead(tmp_path):
    with scripted_run(tmp_path) as (run, engine):
        ahead = run.collector
        ahead.sync_weights(0)
        ahead.start(1, 3)
        for c in range(3):
            engine.release[c].set()
        b1 = ahead.collect(1)
        assert engine.entered[1].wait(60)
        # batch 3 needs version 1: the thread waits at the gate with batch 2 done
        assert not engine.entered[2].wait(1.0)
        train_on(run, b1, 1)
        assert engine.entered[2].wait(60)
        assert ahead.collect(2).counts["rollout/lag_max"] == 1.0


def test_partial_rollouts_continue_under_the_new_weights(tmp_path):
    with scripted_run(tmp_path, partial=True) as (run, engine):
        ahead = run.collector
        ahead.sync_weights(0)
        ahead.start(1, 2)
        engine.release[0].set()
        b1 = ahead.collect(1)
        assert engine.entered[1].wait(60)  # batch 2 entered at version 0 ...
        train_on(run, b1, 1)  # ... version 1 arrives before its first decode step
        engine.release[1].set()
        b2 = ahead.collect(2)
        versions = b2.rollouts.token_versions
        assert all(vs[0] == 0 for vs in versions)  # the first token: sampled at entry
        assert all(set(vs[1:]) <= {1} for vs in versions)  # later ones: the new weights
        assert any(len(vs) > 1 for vs in versions)
        assert 0 < b2.counts["rollout/lag_mean"] < 1.0


def test_groups_older_than_the_bound_are_dropped_and_counted(tmp_path):
    real_generate = HFEngine.generate

    def aged(self, conversations, n, sampling):  # the first group reports version −5
        out = real_generate(self, conversations, n, sampling)
        for i in range(n):
            out.token_versions[i] = [-5] * len(out.token_versions[i])
        return out

    with scripted_run(tmp_path) as (run, engine):
        ahead = run.collector
        engine.release[0].set()
        ahead.sync_weights(0)
        engine.generate = aged.__get__(engine)
        ahead.start(1, 1)
        batch = ahead.collect(1)
        G = run.cfg.rollout.group_size
        assert batch.counts["rollout/stale_dropped"] == G
        assert len(batch.samples) == len(batch.generated_samples) - G
        assert batch.counts["rollout/lag_max"] == 0.0


# ---------------------------------------------------------------------------------------------
# Whole runs


def metrics(summary) -> list[dict]:
    text = (Path(summary["run_dir"]) / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_staleness_zero_through_the_rollout_thread_equals_the_synchronous_path(
    tmp_path, monkeypatch
):
    sync = trainer.train(config(tmp_path / "sync", "optim.lr=5e-2", "algorithm.tis_cap=2"))
    real = training_setup.Collector

    def threaded(cfg, task, policy, engine, reward, samples, source, auxiliaries):
        copy = rollout_copy(policy)
        inner = real(
            cfg,
            task,
            copy,
            HFEngine(copy, cfg.rollout.batch_size),
            reward,
            samples,
            source,
            auxiliaries,
        )
        return AheadCollector(inner, policy, 0)

    monkeypatch.setattr(training_setup, "Collector", threaded)
    ahead = trainer.train(config(tmp_path / "ahead", "optim.lr=5e-2", "algorithm.tis_cap=2"))

    def lines(summary):
        rows = metrics(summary)
        keep = ("train/reward", "loss", "rollout/logp_gap_max")
        return [{k: r[k] for k in r if k.startswith(keep)} for r in rows]

    assert lines(ahead) == lines(sync)
    last = lambda s: weights(next((tmp_path / s["run_dir"]).glob("checkpoints/step-*3")))  # noqa: E731
    for name, tensor in last(sync).items():
        assert torch.equal(tensor, last(ahead)[name]), name


def test_a_run_one_step_ahead_trains_checkpoints_and_resumes(tmp_path):
    cfg = config(
        tmp_path, "rollout.max_staleness=1", "algorithm.tis_cap=2", "train.steps=4", "optim.lr=5e-2"
    )
    summary = trainer.train(cfg)
    rows = metrics(summary)
    steps = [r for r in rows if "rollout/lag_max" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert steps[0]["rollout/lag_max"] == 0.0
    assert all(r["rollout/lag_max"] <= 1.0 and r["rollout/stale_dropped"] == 0 for r in steps)
    state = torch.load(
        next((tmp_path / "smoke/checkpoints").glob("step-*2")) / "trainer_state.pt",
        weights_only=False,
    )
    assert state["data_position"] == 2 * 2  # before step 3, though the thread ran ahead
    # a longer run resumes from step 4 and regenerates from the saved state
    more = config(
        tmp_path, "rollout.max_staleness=1", "algorithm.tis_cap=2", "train.steps=5", "optim.lr=5e-2"
    )
    trainer.train(more)
    rows = metrics(summary)
    assert [r["step"] for r in rows if "rollout/lag_max" in r] == [1, 2, 3, 4, 5]


def test_a_verifier_error_in_the_rollout_thread_stops_the_run_at_its_step(tmp_path):
    plugin = tmp_path / "boom.py"
    plugin.write_text(
        "from mmrft import verifier\n"
        "calls = [0]\n"
        "@verifier('test_ahead_boom', low=0.0, high=1.0, isolate=False)\n"
        "def boom(completions, samples):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 3:  # call 1 is the start-up probe\n"
        "        raise ValueError('boom')\n"
        "    return [0.5] * len(completions)\n"
    )
    cfg = tiny_config(
        tmp_path,
        "rollout.max_staleness=1",
        "algorithm.tis_cap=2",
        f"plugins=[{plugin}]",
        "reward.verifiers=[{name: test_ahead_boom}]",
        "reward.isolation=inline",
    )
    with pytest.raises(Exception, match="boom"):
        trainer.train(cfg)
    failure = json.loads((tmp_path / "smoke/failure.json").read_text())
    assert failure["step"] == 2


def test_bad_settings_fail_at_start_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.tis_cap"):
        tiny_config(tmp_path, "rollout.max_staleness=1")
    with pytest.raises(ConfigError, match="rollout.partial_rollouts"):
        tiny_config(tmp_path, "rollout.partial_rollouts=true")
    with pytest.raises(ConfigError, match="rollout.max_staleness"):
        tiny_config(
            tmp_path, "rollout.max_staleness=1", "algorithm.tis_cap=2", "rollout.group_shared=false"
        )


# ---------------------------------------------------------------------------------------------
# Several processes: the rollout thread's collectives on a group of their own


def _threaded_collector(cfg, task, policy, engine, reward, samples, source, auxiliaries):
    """The trainer's Collector replaced by the rollout thread at k = 0 (the trainer itself
    takes the plain collector for k = 0): made by setup() after the policy was sharded, so
    the rollout copy is loaded from a fresh model; the first snapshot fills it."""
    from mmrft.policy.model import load_policy

    copy = load_policy(cfg.model, torch.device("cpu"), trainable=False)
    inner = Collector(
        cfg, task, copy, HFEngine(copy, cfg.rollout.batch_size), reward, samples, source,
        auxiliaries,
    )  # fmt: skip
    return AheadCollector(inner, policy, 0)


def _train_worker(rank: int, world: int, runs: list) -> None:
    """Each (config, threaded) of ``runs`` in turn on this rank, in one process (one start-up
    of torch and transformers for all of them; a run after the first is a fresh trainer, as a
    new launch). After each run rank 0 records the checkpoints it finds, before a later run
    may remove them: ``checkpoints-after-run-<i>.json`` beside the run, each checkpoint's
    trainer_state.pt mtime (ns) and data position."""
    torch.set_num_threads(1)
    plain = training_setup.Collector
    for i, (cfg, threaded) in enumerate(runs):
        training_setup.Collector = _threaded_collector if threaded else plain
        trainer.train(cfg)
        if rank == 0:
            run_dir = Path(cfg.output_dir) / cfg.name
            found = {}
            for state in sorted(run_dir.glob("checkpoints/*/trainer_state.pt")):
                position = torch.load(state, weights_only=False)["data_position"]
                found[state.parent.name] = [state.stat().st_mtime_ns, position]
            (run_dir / f"checkpoints-after-run-{i}.json").write_text(json.dumps(found))


def train_on_two(*runs: tuple) -> list[dict]:
    """``runs``: (config, threaded) pairs, run in turn on the same two ranks; their summaries."""
    from ranks import run_ranks

    run_ranks(_train_worker, list(runs))
    return [
        json.loads((Path(cfg.output_dir) / cfg.name / "summary.json").read_text())
        for cfg, _ in runs
    ]


@pytest.mark.parametrize("sharding", [pytest.param("none", marks=pytest.mark.slow), "fsdp_full"])
def test_two_processes_staleness_zero_through_the_rollout_thread_equal_synchronous(
    tmp_path, sharding
):
    """Two ranks, k = 0 through the rollout thread (its reductions on the side group, the
    snapshot gathered from the shards) equal two synchronous ranks: metrics and weights."""
    extra = ("optim.lr=5e-2", "algorithm.tis_cap=2", "train.prompts_per_step=4", "train.threads=1")
    sharded = (f"train.sharding={sharding}", "data.sampler=variance")  # stats reduced each step
    sync, ahead = train_on_two(
        (config(tmp_path / "sync", *extra, *sharded), False),
        (config(tmp_path / "ahead", *extra, *sharded), True),
    )

    def lines(summary):
        keep = ("train/reward", "loss", "rollout/logp_gap_max", "rollout/generated")
        return [{k: r[k] for k in r if k.startswith(keep)} for r in metrics(summary)]

    assert lines(ahead) == lines(sync) and len(lines(sync)) >= 3
    last = lambda s: weights(next(Path(s["run_dir"]).glob("checkpoints/step-*3")))  # noqa: E731
    for name, tensor in last(sync).items():
        assert torch.equal(tensor, last(ahead)[name]), name


AHEAD_SHARDING = [
    pytest.param(("train.sharding=none",), id="none"),
    pytest.param(("train.sharding=fsdp_full",), id="fsdp_full", marks=pytest.mark.slow),
    pytest.param(
        ("train.sharding=fsdp_full", "model.lora.enabled=true"),
        id="fsdp_full_lora",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        ("train.sharding=deepspeed_zero3",),
        id="deepspeed_zero3",
        marks=[pytest.mark.slow, *_needs("deepspeed_zero3")],  # skipped without DeepSpeed
    ),
]


@pytest.mark.parametrize("sharding", AHEAD_SHARDING)
def test_two_processes_one_step_ahead_train_checkpoint_and_resume(tmp_path, sharding):
    """Two ranks one step ahead (each its own rollout thread on its share of the prompts) under
    each way of holding the policy: lags, counts, checkpoint, and a resume that does not run
    the checkpointed steps again."""
    extra = (
        "rollout.max_staleness=1",
        "algorithm.tis_cap=2",
        "optim.lr=5e-2",
        "train.prompts_per_step=4",
        "train.threads=1",
        *sharding,
    )
    # 4 steps, then a new launch to 5 that resumes from step 4
    summary, _ = train_on_two(
        (config(tmp_path, *extra, "train.steps=4"), False),
        (config(tmp_path, *extra, "train.steps=5"), False),
    )
    rows = [r for r in metrics(summary) if "rollout/lag_max" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0]["rollout/lag_max"] == 0.0
    assert all(r["rollout/lag_max"] <= 1.0 and r["rollout/stale_dropped"] == 0 for r in rows)
    assert all(r["rollout/generated"] == 4 * 4 for r in rows)  # both ranks' groups counted
    run_dir = Path(summary["run_dir"])
    first, second = (
        json.loads((run_dir / f"checkpoints-after-run-{i}.json").read_text()) for i in (0, 1)
    )
    step2, step4 = (next(k for k in first if k.endswith(f"{n:06d}")) for n in (2, 4))
    assert first[step2][1] == 2 * 4  # before step 3, though the threads ran ahead
    assert second[step4] == first[step4]  # steps 1-4 were not run again
