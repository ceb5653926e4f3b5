"""The zoom_sites benchmark (scripts/make_benchmarks.py) and the recipe that reads it
(configs/tools/zoom_sites.yaml): the data regenerates, the labels and sites are balanced, the
site's crop holds the mark, the scripted "look closer" call crops exactly ``meta.zoom_box`` in
the tiny model's frame, and a fixed pixel reader finds the dot's colour in that crop but not
at the base view (benchmarks/zoom_oracle.py's reader)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import tiny_policy
from PIL import Image

from mmrft.data import Sample

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "assets" / "benchmarks" / "zoom_sites"
PIXELS = 3136  # the recipe's base view: 56 × 56 px


def load(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def generator():
    return load("make_benchmarks", REPO / "scripts" / "make_benchmarks.py")


def records(split: str) -> list[dict]:
    return [json.loads(line) for line in (FOLDER / f"{split}.jsonl").read_text().splitlines()]


def inside(inner: list[int], outer: list[int]) -> bool:
    return (
        outer[0] <= inner[0]
        and outer[1] <= inner[1]
        and inner[2] <= outer[2]
        and inner[3] <= outer[3]
    )


@pytest.mark.slow  # make test-slow: 10-16 s of make test's ten minutes
def test_test_split_regenerates(tmp_path):
    make = generator()
    make.generate("zoom_sites", tmp_path, ["test"])
    assert make.differences(FOLDER, tmp_path / "zoom_sites", partial=True) == []


def test_balanced_and_the_site_crop_holds_the_mark():
    make = generator()
    for split, n in make.BENCHMARKS["zoom_sites"].splits.items():
        rows = records(split)
        assert len(rows) == n
        for counter in (
            Counter(r["target"] for r in rows),
            Counter(r["meta"]["site"] for r in rows),
            Counter((r["target"], r["meta"]["site"]) for r in rows),
        ):
            assert max(counter.values()) - min(counter.values()) <= 1, counter
        for r in rows:
            meta = r["meta"]
            assert meta["zoom_box"] == make.zoom_sites_box(meta["site"])
            assert inside(meta["dot_box"], meta["target_box"])
            assert inside(meta["target_box"], meta["zoom_box"])


def sample(index: int) -> Sample:
    record = records("train")[index]
    part = record["messages"][0]["content"][0]
    part["image"] = str(FOLDER / part["image"])
    return Sample(record["id"], record["messages"], record["target"], record["meta"])


def test_the_scripted_call_crops_the_zoom_box_in_the_model_frame():
    from mmrft.rollout.tool_loop import demonstration_call

    make = generator()
    policy = tiny_policy(f"model.min_pixels={PIXELS}", f"model.max_pixels={PIXELS}")
    for index in range(4):
        s = sample(index)
        call = demonstration_call(s, policy.family, ["crop"])
        body = json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert body["arguments"]["bbox_2d"] == list(make.ZOOM_SITES_BOXES[s.meta["site"]])


def test_the_dot_is_read_in_the_crop_and_not_at_the_base_view():
    """benchmarks/zoom_oracle.py's fixed reader (the pixel under the dot's centre) on the test
    split at the recipe's 3136-pixel budget: chance at the base view, every dot in the crop."""
    pytest.importorskip("qwen_vl_utils")
    oracle = load("zoom_oracle", REPO / "benchmarks" / "zoom_oracle.py")
    base = crop = 0
    rows = records("test")
    for r in rows:
        meta = r["meta"]
        with Image.open(FOLDER / r["messages"][0]["content"][0]["image"]) as opened:
            image = opened.convert("RGB")
        centre = oracle.box_centre(meta["dot_box"])
        view = oracle.model_view(image, PIXELS)
        base += (
            oracle.read_colour(oracle.pixel_under(view, centre, image.size), meta["choices"])
            == r["target"]
        )
        left, top, right, bottom = meta["zoom_box"]
        region = image.crop((left, top, right, bottom))
        zoomed = oracle.model_view(region, PIXELS)
        point = (centre[0] - left, centre[1] - top)
        crop += (
            oracle.read_colour(oracle.pixel_under(zoomed, point, region.size), meta["choices"])
            == r["target"]
        )
    assert base / len(rows) <= 0.4
    assert crop == len(rows)


def test_a_crop_too_elongated_for_the_pixel_budget_is_refused():
    """At the recipe's 3136-pixel budget a crop longer than 4 × its width cannot keep one
    28-px patch group across (Qwen's smart_resize floors that side to 0 px and the
    observation failed to load, ending the run); it is refused as box_aspect_ratio, and a
    square crop of the same area still runs."""
    from mmrft.rollout.tool import ToolCall, ToolContext, run_tool_call

    image = Image.new("RGB", (840, 840), "white")
    context = ToolContext(
        images=[image], input_sizes=[(56, 56)], box_frame="input_pixels", max_pixels=PIXELS
    )
    refused = run_tool_call(ToolCall("crop", {"bbox_2d": [10, 10, 12, 40]}), context)
    assert (refused.ok, refused.reason) == (False, "box_aspect_ratio")  # 30 × 450 px
    square = run_tool_call(ToolCall("crop", {"bbox_2d": [10, 10, 20, 20]}), context)
    assert square.ok and square.images[0].size == (55, 55)  # fitted to the 3136-pixel budget
