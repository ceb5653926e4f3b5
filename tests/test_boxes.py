"""Box parsing, geometry and coordinate frames."""

from __future__ import annotations

import json

import pytest

from mmrft.rewards.boxes import (
    FRAMES,
    box_area,
    box_iou,
    clip_box,
    format_box,
    from_pixels,
    is_degenerate,
    outside_image,
    parse_boxes,
    parse_one_box,
    to_pixels,
)

META = {"image_size": [640, 480], "input_size": [644, 476]}


@pytest.mark.parametrize(
    "text",
    [
        '{"bbox_2d": [10, 20, 30, 40]}',
        '{"bbox": [10, 20, 30, 40], "label": "cat"}',
        '{"box": [10,20,30,40]}',
        '{"position": [10, 20, 30, 40]}',
        "{'Position': [10, 20, 30, 40], 'Confidence': 0.9}",  # Visual-RFT, Python quotes
        '{"POSITION": ["10", "20", "30", "40"]}',
        '[{"bbox_2d": [10, 20, 30, 40], "label": "cup"}]',
        "[10, 20, 30, 40]",
        "[ 10 ,20 , 30,40 ]",
        "[[10, 20], [30, 40]]",
        "(10,20),(30,40)",
        "<|box_start|>(10, 20), (30, 40)<|box_end|>",
        "(10, 20, 30, 40)",
        'The cup is here:\n```json\n{"bbox_2d": [10, 20, 30, 40]}\n```\nDone.',
        '```json\n[\n  {"bbox_2d": [10, 20, 30, 40]}\n]\n```',
    ],
)
def test_parse_boxes_forms(text):
    assert parse_boxes(text) == [[10.0, 20.0, 30.0, 40.0]]


def test_parse_boxes_floats_and_signs():
    assert parse_boxes('{"bbox_2d": [10.5, 20.25, 30.0, 40.75]}') == [[10.5, 20.25, 30.0, 40.75]]
    assert parse_boxes("[0.1, .2, 0.9, 1.]") == [[0.1, 0.2, 0.9, 1.0]]
    assert parse_boxes("[-5, -1e1, 3, 4]") == [[-5.0, -10.0, 3.0, 4.0]]


def test_parse_boxes_case_of_key_does_not_matter():
    assert parse_boxes('{"Position": [1, 2, 3, 4]}') == parse_boxes('{"position": [1, 2, 3, 4]}')


def test_parse_boxes_several_in_order():
    text = '[{"bbox_2d": [1, 2, 3, 4]}, {"bbox_2d": [5.5, 6, 7, 8]}] and (9,10),(11,12)'
    assert parse_boxes(text) == [[1, 2, 3, 4], [5.5, 6, 7, 8], [9, 10, 11, 12]]
    assert parse_boxes("[[1, 2, 3, 4], [5, 6, 7, 8]]") == [[1, 2, 3, 4], [5, 6, 7, 8]]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no box here",
        "[1, 2, 3]",
        "[1, 2, 3, 4, 5]",
        '{"point_2d": [1, 2]}',
        "(1, 2)",
        "[a, b, c, d]",
    ],
)
def test_parse_boxes_none(text):
    assert parse_boxes(text) == []


def test_parse_one_box():
    assert parse_one_box('{"bbox_2d": [1, 2, 3, 4]}') == ([1, 2, 3, 4], None)
    assert parse_one_box("nothing") == (None, "no box")
    assert parse_one_box("[1, 2, 3, 4] [1, 2, 3, 4]") == (None, "several boxes")


def test_parse_boxes_is_fast_on_adversarial_text():
    # Linear-time regex: long runs that almost match must not backtrack badly.
    parse_boxes("[" + " " * 50_000)
    parse_boxes("[1, 2, 3, " * 5_000)
    parse_boxes("(1, 2)" * 10_000)


@pytest.mark.parametrize("frame", FRAMES)
def test_frames_round_trip(frame):
    box = [12.5, 30.0, 600.25, 479.0]
    assert from_pixels(to_pixels(box, frame, META), frame, META) == pytest.approx(box)
    assert to_pixels(from_pixels(box, frame, META), frame, META) == pytest.approx(box)


@pytest.mark.parametrize(
    ("frame", "box", "pixels"),
    [
        ("pixels", [64, 48, 320, 240], [64, 48, 320, 240]),
        ("norm1000", [100, 100, 500, 500], [64, 48, 320, 240]),
        ("norm1", [0.1, 0.1, 0.5, 0.5], [64, 48, 320, 240]),
        ("input_pixels", [322, 238, 644, 476], [320, 240, 640, 480]),
    ],
)
def test_to_pixels_values(frame, box, pixels):
    assert to_pixels(box, frame, META) == pytest.approx(pixels)


def test_frames_need_their_sizes():
    with pytest.raises(ValueError, match="input_size"):
        to_pixels([1, 2, 3, 4], "input_pixels", {"image_size": [640, 480]})
    with pytest.raises(ValueError, match="image_size"):
        to_pixels([1, 2, 3, 4], "norm1000", {})
    with pytest.raises(ValueError, match="unknown box frame"):
        to_pixels([1, 2, 3, 4], "norm100", META)
    assert to_pixels([1, 2, 3, 4], "pixels", {}) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ("pixels", [64, 48, 320, 240]),
        ("norm1000", [100, 100, 500, 500]),
        ("norm1", [0.1, 0.1, 0.5, 0.5]),
        ("input_pixels", [64, 48, 322, 238]),
    ],
)
def test_format_box(frame, expected):
    text = format_box([64, 48, 320, 240], frame, META)
    assert json.loads(text) == {"bbox_2d": expected}
    assert parse_one_box(text)[0] == pytest.approx(expected)


def test_format_box_text():
    assert format_box([64, 48, 320, 240], "norm1000", META) == '{"bbox_2d": [100, 100, 500, 500]}'
    assert (
        format_box([64, 48, 320, 240], "norm1", META) == '{"bbox_2d": [0.100, 0.100, 0.500, 0.500]}'
    )


@pytest.mark.parametrize("frame", FRAMES)
def test_format_then_parse_recovers_the_box(frame):
    box = [64.0, 48.0, 320.0, 240.0]
    parsed, _ = parse_one_box(format_box(box, frame, META))
    # Rounding to ints in the frame moves a coordinate by at most half a frame unit.
    assert to_pixels(parsed, frame, META) == pytest.approx(box, abs=1.0)


def test_geometry():
    assert box_area([0, 0, 10, 5]) == 50
    assert box_area([10, 0, 0, 5]) == 0
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert box_iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    assert box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(1 / 3)
    assert box_iou([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0
    assert clip_box([-5, -5, 700, 500], 640, 480) == [0, 0, 640, 480]


def test_outside_image_tolerance():
    # 640×480: 5 % of the side is 32 px in x and 24 px in y
    assert not outside_image([-32, -24, 672, 504], 640, 480)  # exactly at the tolerance
    assert outside_image([-33, 0, 100, 100], 640, 480)
    assert outside_image([0, 0, 100, 505], 640, 480)
    assert outside_image([9, 9, 9111, 91], 112, 112)  # the reported box
    assert not outside_image([9, 9, 117, 91], 112, 112)  # 5 px past a 112-px image: 5.6 px slack
    assert outside_image([640, 0, 660, 100], 640, 480)  # within the slack but no area inside
    assert not outside_image([0, 0, 1, 1], 640, 480)
    # the same 5 % in every frame: norm1000 1050 is pixels 672 on a 640-px-wide image
    assert to_pixels([0, 0, 1050, 1000], "norm1000", {"image_size": [640, 480]})[2] == 672


def test_is_degenerate():
    assert not is_degenerate([0, 0, 1, 1])
    assert is_degenerate([0, 0, 0, 1])  # zero width
    assert is_degenerate([5, 5, 1, 1])  # inverted
    assert is_degenerate([0, 0, float("inf"), 1])
    assert is_degenerate([0, 0, float("nan"), 1])
    assert is_degenerate([0, 0, 1])
