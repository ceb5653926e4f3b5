"""The zoom_slots benchmark (scripts/make_benchmarks.py) and the recipe that reads it
(configs/tools/zoom_slots.yaml): the data regenerates, targets and slots are balanced, the
base view (the recipe's 8 uniform frames, as the video reader samples them) shows the dark
disc on both frames of the marked slot and never the flash, the marked slot's window holds
the whole flash, and the scripted "look closer" call fetches exactly that window."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_policy
from test_zoom_sites import generator

from mmrft.data import Sample
from mmrft.data.video import frame_indices

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "assets" / "benchmarks" / "zoom_slots"


def records(split: str) -> list[dict]:
    return [json.loads(line) for line in (FOLDER / f"{split}.jsonl").read_text().splitlines()]


@pytest.mark.slow  # make test-slow: the test split's 64 clips encoded again
def test_test_split_regenerates(tmp_path):
    make = generator()
    make.generate("zoom_slots", tmp_path, ["test"])
    assert make.differences(FOLDER, tmp_path / "zoom_slots", partial=True) == []


def test_balanced_and_the_window_holds_the_flash():
    make = generator()
    for split, n in make.BENCHMARKS["zoom_slots"].splits.items():
        rows = records(split)
        assert len(rows) == n
        for counter in (
            Counter(r["target"] for r in rows),
            Counter(r["meta"]["slot"] for r in rows),
            Counter((r["target"], r["meta"]["slot"]) for r in rows),
        ):
            assert max(counter.values()) - min(counter.values()) <= 1, counter
        for r in rows:
            meta = r["meta"]
            start, end = meta["zoom_span"]
            assert meta["zoom_span"] == make.zoom_slots_span(meta["slot"])
            assert meta["zoom_choices"] == [make.zoom_slots_span(k) for k in range(4)]
            assert start <= meta["target_span"][0] < meta["target_span"][1] <= end


def coloured(frame: np.ndarray) -> int:
    """Pixels of a saturated colour (the flash; everything else is gray)."""
    return int((frame.max(-1).astype(int) - frame.min(-1).astype(int) > 80).sum())


def dark(frame: np.ndarray) -> int:
    """Pixels of the dark disc (gray 60; the clutter is 100 or lighter)."""
    return int((frame.mean(-1) < 80).sum())


def test_the_base_view_shows_the_slot_and_never_the_flash():
    """Decoded clips of the test split at the recipe's 8 uniform frames (the indices the
    video reader samples): no saturated pixel on any, the dark disc on exactly the two frames
    of the marked slot; the frames inside the flash's span show it."""
    make = generator()
    for r in records("test")[:24]:
        meta = r["meta"]
        frames, _, _ = make.read_mp4(FOLDER / r["messages"][0]["content"][0]["video"])
        base = frame_indices(len(frames), 8)
        assert all(coloured(frames[i]) == 0 for i in base)
        marked = [dark(frames[i]) > 2000 for i in base]
        slot = meta["slot"]
        assert marked == [k // 2 == slot for k in range(8)], (r["id"], marked)
        first, last = (round(t * meta["fps"]) for t in meta["target_span"])
        assert all(coloured(frames[i]) > 1000 for i in range(first, last))


def test_the_scripted_call_fetches_the_marked_window():
    from mmrft.rollout.tool_loop import demonstration_call

    policy = tiny_policy()
    for r in records("train")[:4]:
        s = Sample(r["id"], r["messages"], r["target"], r["meta"])
        call = demonstration_call(s, policy.family, ["video_frames"])
        body = json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert body["arguments"] == {"start_s": r["meta"]["zoom_span"][0]}
