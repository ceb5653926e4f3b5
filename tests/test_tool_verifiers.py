"""Verifiers that read tool trajectories (verifiers/tools.py), on hand-built trajectories, and
the opt-in: a verifier without a ``trajectories`` parameter is called as before."""

from __future__ import annotations

import pytest

from mmrft.data import Sample
from mmrft.plugins import VERIFIERS
from mmrft.policy.trajectory import Trajectory
from mmrft.rewards.reward import build_reward


def sample(**meta) -> Sample:
    return Sample("s", [], "red", {"choices": ["red", "green"], **meta})


def trajectory(*calls: dict) -> Trajectory:
    t = Trajectory()
    t.add_turn([1, 2], None, "call", False)
    t.turns[-1].calls = [
        {"name": "crop", "ok": True, "reason": None, "info": {}, **call} for call in calls
    ]
    t.add_turn([3], None, "<answer>red</answer>", False)
    return t


def values(name: str, completions, samples, trajectories, **params):
    bound = VERIFIERS.get(name).bind(params)
    return [
        None if s is None else (s.value, s.reason)
        for s in bound(completions, samples, "", trajectories)
    ]


RIGHT, WRONG = "<answer>red</answer>", "<answer>green</answer>"


def test_tool_bonus_needs_a_successful_call_and_a_right_answer():
    used, failed = trajectory({}), trajectory({"ok": False, "reason": "bad_json"})
    got = values(
        "tool_bonus", [RIGHT, WRONG, RIGHT, RIGHT], [sample()] * 4, [used, used, failed, None]
    )
    assert got == [
        (1.0, None),
        (0.0, "tool used, answer wrong"),
        (0.0, "no successful tool call"),
        (0.0, "no tool rollout"),
    ]


def test_deepeyes_weights_give_its_reward_range():
    reward = build_reward(
        [
            {"name": "format", "weight": 0.2, "params": {"think": "none"}},
            {"name": "accuracy", "weight": 0.8},
            {"name": "tool_bonus", "weight": 1.2},
        ]
    )
    assert reward.range == (0.0, 2.2)
    scored = reward([RIGHT], [sample()], trajectories=[trajectory({})])
    assert scored.total == [pytest.approx(2.2)]


def test_crop_contains_target_in_original_pixels():
    target = [100, 100, 120, 120]
    inside = trajectory({"info": {"box_px": [90, 90, 130, 130], "image_index": 0}})
    half = trajectory({"info": {"box_px": [110, 90, 130, 130], "image_index": 0}})
    of_crop = trajectory({"info": {"box_px": [90, 90, 130, 130], "image_index": 1}})
    got = values(
        "crop_contains_target",
        [RIGHT] * 4,
        [sample(target_box=target)] * 3 + [sample()],
        [inside, half, of_crop, inside],
    )
    assert got == [(1.0, None), (0.0, "crop misses the target"), (0.0, "no crop"), None]
    loose = values(
        "crop_contains_target", [RIGHT], [sample(target_box=target)], [half], min_cover=0.5
    )
    assert loose == [(1.0, None)]


def test_clip_overlap_is_the_tiou_when_correct():
    fetched = trajectory({"name": "video_frames", "info": {"span_s": [1.0, 3.0]}})
    got = values(
        "clip_overlap", [RIGHT, WRONG], [sample(target_span=[2.0, 4.0])] * 2, [fetched, fetched]
    )
    assert got[0] == (pytest.approx(1 / 3), None) and got[1] == (0.0, "answer wrong")


def test_clip_overlap_centre_measure_grades_a_miss_by_its_distance():
    """measure="centre": 1 − |centre gap| / within_s, floored at 0, also for a clip that
    misses the target (tIoU 0 there); the best of several calls; bad parameters refused."""
    target = sample(target_span=[4.0, 4.4])  # centre 4.2

    def got(*spans, **params):
        calls = [{"name": "video_frames", "info": {"span_s": list(sp)}} for sp in spans]
        return values(
            "clip_overlap", [WRONG], [target], [trajectory(*calls)],
            only_when_correct=False, **params,
        )[0][0]  # fmt: skip

    assert got([6.0, 7.0], measure="centre") == pytest.approx(1 - 2.3 / 3)  # misses
    assert got([6.0, 7.0]) == 0.0  # the same clip's tIoU
    assert got([3.7, 4.7], measure="centre") == pytest.approx(1.0)
    assert got([0.0, 1.0], measure="centre", within_s=2.0) == 0.0  # floored
    assert got([6.0, 7.0], [4.0, 5.0], measure="centre") == pytest.approx(1 - 0.3 / 3)
    for bad in ({"measure": "iou"}, {"within_s": 0.0}):
        with pytest.raises(ValueError):
            got([4.0, 5.0], **bad)


def test_clip_overlap_counts_audio_clips():
    heard = trajectory({"name": "audio_clip", "info": {"span_s": [2.0, 4.0]}})
    got = values("clip_overlap", [RIGHT], [sample(target_span=[2.0, 4.0])], [heard])
    assert got == [(1.0, None)]


def test_span_contains_target_in_seconds():
    def fetched(name, start, end, ok=True):
        return trajectory({"name": name, "ok": ok, "info": {"span_s": [start, end]}})

    target = sample(target_span=[3.1, 3.5])
    got = values(
        "span_contains_target",
        [WRONG] * 6,  # the answer does not matter
        [target] * 5 + [sample()],
        [
            fetched("audio_clip", 2.9, 3.7),
            fetched("video_frames", 3.3, 4.0),  # half of the span
            fetched("audio_clip", 2.9, 3.7, ok=False),  # a refused call fetched nothing
            fetched("crop", 2.9, 3.7),  # not a clip tool
            None,
            fetched("audio_clip", 2.9, 3.7),
        ],
    )
    assert got == [
        (1.0, None),
        (0.0, "clip misses the target"),
        (0.0, "no clip fetched"),
        (0.0, "no clip fetched"),
        (0.0, "no tool rollout"),
        None,
    ]
    half = values(
        "span_contains_target",
        [RIGHT],
        [target],
        [fetched("video_frames", 3.3, 4.0)],
        min_cover=0.5,
    )
    assert half == [(1.0, None)]
    with pytest.raises(ValueError, match="min_cover"):
        values("span_contains_target", [RIGHT], [target], [None], min_cover=0)


def test_tool_failures_penalty_is_capped():
    bad = {"ok": False, "reason": "unknown_tool"}
    got = values(
        "tool_failures", [RIGHT] * 2, [sample()] * 2, [trajectory(bad), trajectory(*[bad] * 9)]
    )
    assert got == [(-0.25, "failed calls"), (-1.0, "failed calls")]


def test_verifiers_without_trajectories_are_called_as_before():
    assert not VERIFIERS.get("accuracy").wants_trajectories
    assert VERIFIERS.get("tool_bonus").wants_trajectories
    reward = build_reward([{"name": "accuracy"}])
    assert reward([RIGHT], [sample()], trajectories=[trajectory()]).total == [1.0]
