"""The detection verifier and its parser: modes, frames, labels, anti-hacking, adversarial input."""

from __future__ import annotations

import json
import random

import pytest
from helpers import check_doctests, check_registered, fast_score
from mmrft.verifiers.detection import MAX_CHARS_PER_BOX, Detection, parse_detections

from mmrft.data import Sample
from mmrft.plugins import VERIFIERS
from mmrft.typecheck import ConfigError

A, B = [0, 0, 100, 100], [200, 200, 300, 300]  # two objects, original pixels of a 400×400 image


def scene(target=(A, B), frame: str = "pixels", **meta) -> Sample:
    return Sample(
        "d", [], target=list(target), meta={"image_size": [400, 400], "box_frame": frame, **meta}
    )


def run(completions: list[str], samples: list[Sample] | Sample | None = None, **params) -> list:
    """Call the verifier through the same path training uses (bind, then call)."""
    if samples is None or isinstance(samples, Sample):
        samples = [samples or scene()] * len(completions)
    return VERIFIERS.get("detection").bind(params)(completions, samples)


def value(completion: str, sample: Sample | None = None, **params) -> float:
    return run([completion], sample, **params)[0].value


def answer(body: str) -> str:
    return f"<think>two objects</think><answer>{body}</answer>"


def vrft(*boxes_confs) -> str:
    """A Visual-RFT answer: [{'Position': [...], 'Confidence': c}, ...]."""
    items = [f"{{'Position': {list(box)}, 'Confidence': {conf}}}" for box, conf in boxes_confs]
    return answer("[" + ", ".join(items) + "]")


def test_docstring_examples_run():
    check_doctests("mmrft.verifiers.detection")


def test_registered_with_range_and_doc():
    check_registered("detection")


# -- parsing -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        "[{'Position': [0, 0, 100, 100], 'Confidence': 0.9}, {'Position': [200, 200, 300, 300], 'Confidence': 0.9}]",
        '[{"position": [0, 0, 100, 100], "confidence": 0.9}, {"POSITION": [200, 200, 300, 300], "CONFIDENCE": "0.9"}]',
        '```json\n[\n  {"bbox_2d": [0, 0, 100, 100], "label": "cup"},\n  {"bbox_2d": [200.0, 200.0, 300.0, 300.0], "label": "cup"}\n]\n```',
        "[[0, 0, 100, 100], [200, 200, 300, 300]]",
        "(0,0),(100,100) and (200,200),(300,300)",
        '{"objects": [{"bbox": [0, 0, 100, 100]}, {"box": [200, 200, 300, 300]}]}',
    ],
)
def test_accepted_forms(body):
    assert value(answer(body)) == pytest.approx(1.0 if "0.9" not in body else (1 + 0.9) / 2)


def test_parse_detections_fields():
    dets, reason = parse_detections(
        "[{'Position': [1, 2, 3, 4], 'Confidence': 0.25}, {\"bbox_2d\": [5, 6, 7.5, 8], "
        '"label": "red cup", "score": 0.5}, [9, 10, 11, 12]]'
    )
    assert reason is None
    assert dets == [
        Detection((1.0, 2.0, 3.0, 4.0), 0.25, None),
        Detection((5.0, 6.0, 7.5, 8.0), 0.5, "red cup"),
        Detection((9.0, 10.0, 11.0, 12.0), None, None),
    ]


@pytest.mark.parametrize("body", ["[]", "```json\n[]\n```", "[ ]", "None", "null", "no objects"])
def test_explicit_empty_answers(body):
    assert parse_detections(body) == ([], None)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("a cup on the left", "no box"),
        ("[1, 2, 3]", "no box"),  # a list of three numbers is not a box
        ('{"bbox_2d": [1, 2, 3, 4], "bbox": [5, 6, 7, 8]}', "several boxes in one object"),
        ("{'Position': [1, 2, 3, 4], 'Confidence': 1.5}", "bad confidence"),
        ("{'Position': [1, 2, 3, 4], 'Confidence': -0.1}", "bad confidence"),
        ("{'Position': [1, 2, 3, 4], 'Confidence': NaN}", "bad confidence"),
        ("{'Position': [1, 2, 3, 4], 'Confidence': 'high'}", "bad confidence"),
        ("{'Position': [1, 2, 3, 4], 'Confidence': 0.5, 'score': 0.9}", "bad confidence"),
        (
            '{"bbox_2d": [1, 2, 3, 4], "label": "cat", "class": "dog"}',
            "several labels in one object",
        ),
    ],
)
def test_parse_rejects(body, reason):
    assert parse_detections(body) == (None, reason)
    (score,) = run([answer(body)])
    assert (score.value, score.reason) == (0.0, reason)


# -- visual_rft mode -----------------------------------------------------------------------------
def test_visual_rft_formula_by_hand():
    # p1 matches A (IoU 1), p2 matches B (IoU 2/3), p3 matches nothing.
    completion = vrft(
        ([0, 0, 100, 100], 0.9), ([200, 200, 300, 350], 0.6), ([350, 0, 400, 50], 0.3)
    )
    iou_part = (1 + 2 / 3) / 3  # Σ matched IoU / max(#gt, #pred)
    confidence_part = (0.9 + 0.6 + (1 - 0.3)) / 3
    (score,) = run([completion])
    assert score.value == pytest.approx(iou_part * (1 + confidence_part) / 2)
    assert score.parts == pytest.approx(
        {"iou": iou_part, "confidence": confidence_part, "precision": 2 / 3, "recall": 1.0}
    )
    (paper,) = run([completion], confidence_combine="sum")
    assert paper.value == pytest.approx((iou_part + confidence_part) / 2)
    assert value(completion, confidence_weight=0.0) == pytest.approx(iou_part)
    assert value(completion, confidence_weight=3.0) == pytest.approx(
        iou_part * (1 + 3 * confidence_part) / 4
    )


def test_visual_rft_matches_by_descending_confidence():
    # Both predictions overlap A; the confident one (IoU 0.9) is matched first, the exact but
    # unconfident one finds A taken. In answer order the exact box would have taken A.
    sample = scene(target=[A])
    completion = vrft(([0, 0, 100, 100], 0.2), ([0, 0, 100, 90], 0.9))
    (score,) = run([completion], sample)
    assert score.parts["iou"] == pytest.approx(0.9 / 2)
    assert score.parts["confidence"] == pytest.approx((0.9 + 0.8) / 2)


def test_visual_rft_iou_gate_is_strict():
    sample = scene(target=[A])
    half = vrft(([0, 0, 100, 50], 1.0))  # IoU exactly 0.5: not > 0.5
    (score,) = run([half], sample)
    assert (score.value, score.reason) == (0.0, "no match")
    assert value(half, sample, iou_threshold=0.4) == pytest.approx(0.5)
    assert value(half, sample, mode="ap") == pytest.approx(1.0)  # AP uses COCO's IoU ≥ t


def test_missing_confidence_counts_as_one():
    assert value(answer("[[0, 0, 100, 100], [200, 200, 300, 300]]")) == 1.0
    # An unmatched box without confidence is a confident false positive.
    (score,) = run([answer("[[0, 0, 100, 100], [350, 350, 400, 400]]")], scene(target=[A]))
    assert score.parts["confidence"] == pytest.approx(0.5)


# -- ap mode -------------------------------------------------------------------------------------
def test_ap_mode_by_hand():
    # Ranked: false positive (0.95), A (0.9), B (0.8): precision 1/2 at recall 1/2, 2/3 at
    # recall 1; monotone from the right → 2/3 at every recall point. Length factor 2/3.
    completion = vrft(([350, 0, 400, 50], 0.95), ([0, 0, 100, 100], 0.9), (B, 0.8))
    (score,) = run([completion], mode="ap")
    assert score.parts["ap"] == pytest.approx(2 / 3)
    assert score.parts["length_factor"] == pytest.approx(2 / 3)
    assert score.value == pytest.approx(4 / 9)
    # The same boxes with the false positive ranked last: AP 1, still × 2/3.
    completion = vrft(([350, 0, 400, 50], 0.1), ([0, 0, 100, 100], 0.9), (B, 0.8))
    assert value(completion, mode="ap") == pytest.approx(2 / 3)
    # One of two objects, nothing else: recall reaches 1/2 only (51 of 101 recall points).
    assert value(vrft((A, 0.9)), mode="ap") == pytest.approx(51 / 101)


# -- frames --------------------------------------------------------------------------------------
def test_frames():
    # A and B in Qwen2-VL's 0–1000 frame of a 400×400 image.
    norm = "[[0, 0, 250, 250], [500, 500, 750, 750]]"
    assert value(answer(norm), scene(frame="norm1000")) == 1.0
    assert (
        value(answer("[[0, 0, 0.25, 0.25], [0.5, 0.5, 0.75, 0.75]]"), scene(frame="norm1")) == 1.0
    )
    # Qwen2.5-VL: pixels of the resized input (812×812 here), scale 400/812.
    resized = scene(frame="input_pixels", input_size=[812, 812])
    assert value(answer("[[0, 0, 203, 203], [406, 406, 609, 609]]"), resized) == pytest.approx(1.0)
    # An explicit frame overrides meta["box_frame"]; mixing frames scores ~0, never silently 1.
    assert value(answer(norm), scene(frame="norm1000"), frame="pixels") < 0.1


def test_boxes_are_clipped_to_the_image_within_the_edge_tolerance():
    # 400-px image: up to 5 % of the side (20 px) past an edge is clipped and scored
    sample = scene(target=[[300, 300, 400, 400]])
    assert value(answer("[[300, 300, 420, 420]]"), sample) == pytest.approx(1.0)
    assert value(answer("[[300, 300, 420, 420]]"), sample, mode="ap") == pytest.approx(1.0)
    # further past an edge, wholly off the image, or the reported [9, 9, 9111, 91]: the
    # answer scores the minimum with a reason, even beside a correct box
    for far in ("[300, 300, 480, 480]", "[500, 500, 600, 600]", "[9, 9, 9111, 91]"):
        for mode in ("visual_rft", "ap"):
            (score,) = run([answer(f"[[300, 300, 400, 400], {far}]")], sample, mode=mode)
            assert (score.value, score.reason) == (0.0, "box outside image"), (far, mode)
    # the norm1000 frame: 1050 is the last value accepted (1000 + 50)
    norm = scene(target=[[300, 300, 400, 400]], frame="norm1000")
    assert value(answer("[[750, 750, 1050, 1050]]"), norm) == pytest.approx(1.0)
    (score,) = run([answer("[[750, 750, 1051, 1000]]")], norm)
    assert (score.value, score.reason) == (0.0, "box outside image")


# -- labels --------------------------------------------------------------------------------------
def test_match_labels():
    sample = scene(target=[{"box": A, "label": "cup"}, {"bbox": B, "label": "Red Car"}])
    right = answer(
        '[{"bbox_2d": [0, 0, 100, 100], "label": "cup"}, {"bbox_2d": [200, 200, 300, 300], "label": "the red car"}]'
    )
    swapped = answer(
        '[{"bbox_2d": [0, 0, 100, 100], "label": "red car"}, {"bbox_2d": [200, 200, 300, 300], "label": "cup"}]'
    )
    unlabelled = answer("[[0, 0, 100, 100], [200, 200, 300, 300]]")
    for mode in ("visual_rft", "ap"):
        assert value(right, sample, mode=mode, match_labels=True) == pytest.approx(1.0)
        assert value(swapped, sample, mode=mode, match_labels=True) == 0.0
        assert value(unlabelled, sample, mode=mode, match_labels=True) == 0.0
        # Class-agnostic by default: labels are ignored.
        assert value(swapped, sample, mode=mode) == pytest.approx(1.0)
    (score,) = run([right], scene(), match_labels=True)  # target boxes without labels
    assert (score.value, score.reason) == (0.0, "target has no labels")


# -- "no objects" targets ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["visual_rft", "ap"])
def test_no_objects_target(mode):
    empty = scene(target=[])
    assert value(answer("[]"), empty, mode=mode) == 1.0
    assert value(answer("None"), empty, mode=mode) == 1.0
    (boxes,) = run([vrft(([0, 0, 10, 10], 0.01))], empty, mode=mode)
    assert (boxes.value, boxes.reason) == (0.0, "boxes for no objects")
    (garbage,) = run([answer("there is nothing here, I think")], empty, mode=mode)
    assert (garbage.value, garbage.reason) == (0.0, "no box")  # only an explicit [] counts


@pytest.mark.parametrize("mode", ["visual_rft", "ap"])
def test_no_boxes_for_objects(mode):
    (score,) = run([answer("[]")], mode=mode)
    assert (score.value, score.reason) == (0.0, "no boxes")


# -- anti-hacking: whole-image boxes and box spamming -------------------------------------------
SMALL = scene(target=[[10, 10, 50, 50], [300, 300, 340, 340]])  # two small objects


@pytest.mark.parametrize("conf", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("mode", ["visual_rft", "ap"])
def test_whole_image_box_scores_zero(mode, conf):
    whole = vrft(([0, 0, 400, 400], conf))
    assert value(whole, SMALL, mode=mode) == 0.0
    # Even stacked with copies: nothing matches.
    assert value(vrft(*[([0, 0, 400, 400], conf)] * 5), SMALL, mode=mode) == 0.0


def test_the_paper_sum_rewards_unconfident_junk_and_product_does_not():
    """The reason for the default: under the paper's sum a box at confidence 0 earns the whole
    confidence term (docs/reference.md pitfall 6)."""
    whole = vrft(([0, 0, 400, 400], 0.0))
    assert value(whole, SMALL, confidence_combine="sum") == pytest.approx(0.5)
    assert value(whole, SMALL) == 0.0
    assert value(whole, SMALL, confidence_combine="sum") > value(answer("[]"), SMALL)


def spam(n: int, conf: float, seed: int = 0) -> list:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        x, y = rng.uniform(0, 360), rng.uniform(0, 360)
        out.append(([round(x, 1), round(y, 1), round(x + 40, 1), round(y + 40, 1)], conf))
    return out


@pytest.mark.parametrize("conf", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("mode", ["visual_rft", "ap"])
def test_box_spamming_scores_low(mode, conf):
    honest = vrft(([10, 10, 50, 50], 1.0), ([300, 300, 340, 340], 1.0))
    # The two right boxes (confident) buried in 98 others.
    spammed = vrft(([10, 10, 50, 50], 1.0), ([300, 300, 340, 340], 1.0), *spam(98, conf))
    # A grid over the whole image: some cell overlaps each object.
    grid = vrft(
        *[([x, y, x + 40, y + 40], conf) for x in range(0, 400, 40) for y in range(0, 400, 40)]
    )
    # The right box repeated.
    repeated = vrft(*[([10, 10, 50, 50], conf)] * 50)
    assert value(honest, SMALL, mode=mode) == 1.0
    for hack in (spammed, grid, repeated):
        assert value(hack, SMALL, mode=mode) <= 0.05


def test_more_than_max_boxes_scores_zero():
    completion = vrft(*spam(101, 0.5))
    (score,) = run([completion], SMALL)
    assert (score.value, score.reason) == (0.0, "too many boxes")
    assert run([completion], SMALL, max_boxes=200)[0].reason != "too many boxes"


# -- data problems and params -------------------------------------------------------------------
def test_data_problems_are_reasons_not_crashes():
    good = answer("[[0, 0, 100, 100]]")
    samples = [
        scene(target="[0, 0, 100, 100]"),
        scene(target=[[100, 100, 0, 0]]),
        scene(target=[{"label": "cup"}]),
        Sample("d", [], target=[A], meta={"box_frame": "pixels"}),
        Sample("d", [], target=[A], meta={"image_size": [400, 400]}),
        scene(frame="input_pixels"),
    ]
    scores = run([good] * len(samples), samples)
    assert [s.value for s in scores] == [0.0] * len(samples)
    assert [s.reason for s in scores] == [
        "bad target",
        "bad target",
        "bad target",
        "no image size",
        "no box frame",
        "meta has no valid 'input_size' [w, h]",
    ]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"iou_threshold": 0}, "iou_threshold"),
        ({"iou_threshold": 1.0}, "iou_threshold"),
        ({"confidence_weight": -1}, "confidence_weight"),
        ({"confidence_weight": float("nan")}, "confidence_weight"),
        ({"max_boxes": 0}, "max_boxes"),
        ({"mode": "map"}, "mode"),
        ({"confidence_combine": "mean"}, "confidence_combine"),
        ({"frame": "norm100"}, "frame"),
        ({"answer_tag": "<a>"}, "answer_tag"),
        ({"match_label": True}, "did you mean 'match_labels'"),
    ],
)
def test_bad_params_fail_at_bind(params, match):
    with pytest.raises(ConfigError, match=match):
        VERIFIERS.get("detection").bind(params)


# -- adversarial corpus --------------------------------------------------------------------------
RIGHT = "[[0, 0, 100, 100], [200, 200, 300, 300]]"


@pytest.mark.parametrize(
    ("completion", "reason"),
    [
        ("", "no answer tag"),
        ("<answer></answer>", "empty answer"),
        ("<answer> \n </answer>", "empty answer"),
        (f"<think>the boxes are {RIGHT}</think>", "no answer tag"),  # right boxes in the think only
        (f"<think>{RIGHT}</think>{RIGHT}", "no answer tag"),
        (f"<answer>{RIGHT}</answer><answer>{RIGHT}</answer>", "several answer tags"),
        (f"<answer>{RIGHT}", "unclosed answer tag"),
        (answer("[[nan, 0, 100, 100]]"), "no box"),
        (answer("[[0, 0, 1e999, 100]]"), "degenerate box"),  # inf
        (answer("[[0, 0, 100, 100], [200, 200, 100, 100]]"), "degenerate box"),  # inverted
        (answer("[[0, 0, 0, 100]]"), "degenerate box"),  # zero width
        (answer("[{'Position': [0, 0, 100, 100], 'Confidence': inf}]"), "bad confidence"),
        (answer('[{"bbox_2d": [0, 0, 100, 100}, {"bbox_2d": "garbage"}]]'), "no box"),
        (answer("{{{{[[[[ ]]]] }}} :::"), "no box"),
    ],
)
def test_adversarial_corpus(completion, reason):
    (score,) = run([completion])
    assert (score.value, score.reason) == (0.0, reason)


def test_huge_numbers_are_rejected_not_crashing():
    # 1e300 on every side lies far outside the image: rejected, not clipped to the whole image.
    (score,) = run([answer("[[-1e300, -1e300, 1e300, 1e300]]")], SMALL)
    assert (score.value, score.reason) == (0.0, "box outside image")
    (score,) = run([answer("[[0, 0, 1e308, 1e308]]")], SMALL, frame="norm1")  # × 400: inf
    assert (score.value, score.reason) == (0.0, "degenerate box")


def test_truncated_json_keeps_the_complete_objects():
    truncated = answer("[{'Position': [0, 0, 100, 100], 'Confidence': 1.0}, {'Position': [200, 2")
    (score,) = run([truncated])
    assert score.value == pytest.approx(0.5)  # one of two objects


def test_every_input_scores_in_range_and_never_raises():
    rng = random.Random(7)
    alphabet = "[]{}(),:'\" 0123456789.-eEnaNinfPositionConfidencebbox_2dlabel\n"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200))) for _ in range(300)]
    for mode in ("visual_rft", "ap"):
        for combine in ("product", "sum"):
            scores = run([answer(t) for t in texts], SMALL, mode=mode, confidence_combine=combine)
            assert all(0.0 <= s.value <= 1.0 for s in scores)
            assert all(s.reason for s in scores if s.value == 0.0)


CAP = 1000 + MAX_CHARS_PER_BOX * 100  # the default length bound (max_boxes = 100)


def adversarial_bodies(n: int) -> list[tuple[str, float]]:
    """Junk of about ``n`` characters and the visual_rft score it should get."""
    return [
        (RIGHT + " " + "blah " * (n // 5), 1.0),  # right boxes, then long prose
        (("[{'Position': [1, 2, 300, 400], 'Confidence': 0.5}, " * n)[:n], 0.0),
        (("[1, 2, 300, 400], " * n)[:n], 0.0),
        ("(1,2),(3,4)," * (n // 12), 0.0),
        ("[[1,2],[" * (n // 8), 0.0),
        ("{" * n, 0.0),
        ("[" * n, 0.0),
        ("(" * n, 0.0),
        ("[ " * (n // 2), 0.0),
        ("1," * (n // 2), 0.0),
        ("9" * n, 0.0),
        (("{'Position': [1,2,3,4" * n)[:n], 0.0),
        ("[" * ((n - len(RIGHT)) // 2) + RIGHT + "]" * ((n - len(RIGHT)) // 2), 1.0),
        (json.dumps([{"bbox_2d": [0, 0, 100, 100], "label": "x" * (n - 50)}]), 0.5),
    ]


@pytest.mark.parametrize(("body", "expected"), adversarial_bodies(CAP - 100))
@pytest.mark.parametrize("mode", ["visual_rft", "ap"])
def test_answers_up_to_the_length_bound_parse_fast(body, expected, mode):
    assert CAP - 1000 < len(body) <= CAP
    score = fast_score(lambda: run([answer(body)], mode=mode)[0])
    if mode == "visual_rft":
        assert score.value == pytest.approx(expected)


@pytest.mark.parametrize(("body", "expected"), adversarial_bodies(100_000))
def test_100_kb_answers_score_fast(body, expected):
    score = fast_score(lambda: run([answer(body)])[0])
    assert (score.value, score.reason) == (0.0, "answer too long")
