"""The built-in verifiers format, accuracy and iou: contract, anti-hacking cases, doctests."""

from __future__ import annotations

import threading

import pytest
from helpers import check_doctests, check_registered
from helpers import run_verifier as run

from mmrft.data import Sample
from mmrft.plugins import VERIFIERS
from mmrft.rewards.reward import build_reward
from mmrft.typecheck import ConfigError


def values(scores) -> list[float]:
    return [s.value for s in scores]


def reasons(scores) -> list[str | None]:
    return [s.reason for s in scores]


@pytest.mark.parametrize(
    "module",
    [
        "mmrft.rewards.answers",
        "mmrft.rewards.boxes",
        "mmrft.verifiers.format",
        "mmrft.verifiers.accuracy",
        "mmrft.verifiers.iou",
    ],
)
def test_docstring_examples_run(module):
    check_doctests(module)


@pytest.mark.parametrize("name", ["format", "accuracy", "iou"])
def test_registered_with_range_and_doc(name):
    check_registered(name)


# -- format ----------------------------------------------------------------------------------
S = Sample("s", [])


@pytest.mark.parametrize(
    "text",
    [
        "<think>a</think><answer>b</answer>",
        "<think>\nline 1\nline 2\n</think>\n\n<answer>\nmulti\nline\n</answer>\n",
        "  <think></think> <answer>b</answer>  ",
    ],
)
def test_format_accepts(text):
    assert values(run("format", [text], [S])) == [1.0]


# (completion, reason) pairs, checked by test_rejects
FORMAT_REJECTS = [
    ("just B", "no answer tag"),
    ("<think>the answer is B</think>", "no answer tag"),
    ("<answer>b</answer>", "no think tag"),
    ("<think>a</think><answer>b</answer><answer>c</answer>", "several answer tags"),
    ("<think>a</think><think>a</think><answer>b</answer>", "several think tags"),
    ("<think>a</think><answer>b", "unclosed answer tag"),
    ("<think>a<answer>b</answer>", "unclosed think tag"),
    ("<think>a<answer>b</answer></think>", "nested or misordered tags"),
    ("<answer>b</answer><think>a</think>", "nested or misordered tags"),
    ("Sure! <think>a</think><answer>b</answer>", "text outside tags"),
    ("<think>a</think>junk<answer>b</answer>", "text outside tags"),
    ("<think>a</think><answer>b</answer> trailing", "text outside tags"),
    ("<think>a</think><answer>  </answer>", "empty answer"),
]


def test_format_think_modes():
    both, bare = "<think>a</think><answer>b</answer>", "<answer>b</answer>"
    assert values(run("format", [both, bare], [S, S], think="optional")) == [1.0, 1.0]
    scores = run("format", [both, bare], [S, S], think="none")
    assert values(scores) == [0.0, 1.0]
    assert scores[0].reason == "think not allowed"


def test_format_custom_pattern():
    scores = run(
        "format",
        ["<answer>B</answer>", "<answer>BB</answer>"],
        [S, S],
        pattern=r"<answer>[A-D]</answer>",
    )
    assert values(scores) == [1.0, 0.0]
    assert scores[1].reason == "pattern mismatch"


def test_format_bad_pattern_fails_at_bind():
    with pytest.raises(ConfigError, match="regular expression"):
        VERIFIERS.get("format").bind({"pattern": "(unclosed"})
    with pytest.raises(ConfigError, match="think"):
        VERIFIERS.get("format").bind({"think": "sometimes"})


# -- accuracy --------------------------------------------------------------------------------
MC = Sample("mc", [], target="green", meta={"choices": ["red", "green", "blue", "yellow"]})


def answer(text: str) -> str:
    return f"<think>thinking</think><answer>{text}</answer>"


@pytest.mark.parametrize("text", ["B", "(b)", "green", "Green.", "B. green", "Option B"])
def test_accuracy_choice_correct(text):
    assert values(run("accuracy", [answer(text)], [MC])) == [1.0]


@pytest.mark.parametrize("target", ["green", "B", 1])
def test_accuracy_choice_target_forms(target):
    sample = Sample("mc", [], target=target, meta=MC.meta)
    assert values(run("accuracy", [answer("B"), answer("green"), answer("A")], [sample] * 3)) == [
        1.0,
        1.0,
        0.0,
    ]


ACCURACY_REJECTS = [
    (answer("A"), "wrong option"),
    (answer("A, B, C, D"), "several options"),  # listing every option
    (answer("red, green, blue, yellow"), "several options"),
    (answer("B or C"), "several options"),
    (answer("Gorgeous green"), "no option matched"),
    ("<think>the answer is B</think>", "no answer tag"),  # right answer only in the think
    ("<think>x</think><answer></answer>", "empty answer"),
    ("<answer>B</answer><answer>B</answer>", "several answer tags"),
]


def test_accuracy_choice_first_letter_is_not_a_letter_answer():
    sample = Sample("mc", [], target="A", meta={"choices": ["a dog", "a cat"]})
    scores = run("accuracy", [answer("A dog is shown"), answer("Apple"), answer("A")], [sample] * 3)
    assert values(scores) == [0.0, 0.0, 1.0]


def test_accuracy_choice_bad_target_is_reported():
    sample = Sample("mc", [], target="purple", meta=MC.meta)
    assert reasons(run("accuracy", [answer("A")], [sample])) == ["target not among choices"]


def test_accuracy_exact_is_equality_not_substring():
    sample = Sample("e", [], target="red car")
    texts = ["The red car.", "RED  CAR", "red", "a red car parked", "car", "red car, blue car"]
    scores = run("accuracy", [answer(t) for t in texts], [sample] * len(texts))
    assert values(scores) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert scores[2].reason == "wrong answer"


def test_accuracy_exact_list_of_accepted_answers():
    sample = Sample("e", [], target=["sofa", "couch"])
    assert values(run("accuracy", [answer("Couch"), answer("chair")], [sample] * 2)) == [1.0, 0.0]


def test_accuracy_number():
    sample = Sample("n", [], target=12)
    texts = ["12", "12.0", "twelve", "There are 12 cubes.", "13", "12 or 13", "many"]
    scores = run("accuracy", [answer(t) for t in texts], [sample] * len(texts))
    assert values(scores) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert reasons(scores)[4:] == ["wrong number", "several numbers", "no number"]


def test_accuracy_number_string_target_and_tolerances():
    sample = Sample("n", [], target="100")
    texts = [answer("104"), answer("106")]
    assert values(run("accuracy", texts, [sample] * 2)) == [0.0, 0.0]
    assert values(run("accuracy", texts, [sample] * 2, rel_tol=0.05)) == [1.0, 0.0]
    assert values(run("accuracy", texts, [sample] * 2, abs_tol=6)) == [1.0, 1.0]


def test_accuracy_partial_within_ranks_near_misses():
    """Shaping: with w = 3 a count off by k scores max(0, 1 − k/3); exact is still 1 and an
    unparsable answer still 0 with its reason."""
    sample = Sample("n", [], target=4)
    texts = ["4", "3", "6", "1", "9", "many", "3 or 4"]
    scores = run("accuracy", [answer(t) for t in texts], [sample] * len(texts), partial_within=3)
    assert values(scores) == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0, 0.0, 0.0, 0.0])
    assert reasons(scores) == [None] + ["wrong number"] * 4 + ["no number", "several numbers"]


def test_accuracy_auto_mode_is_per_sample():
    samples = [MC, Sample("n", [], target=3), Sample("e", [], target="cat")]
    completions = [answer("B"), answer("three"), answer("Cat")]
    assert values(run("accuracy", completions, samples)) == [1.0, 1.0, 1.0]


def test_accuracy_explicit_mode_overrides_auto():
    sample = Sample("n", [], target="3")
    assert values(run("accuracy", [answer("three")], [sample], mode="exact")) == [0.0]
    assert values(run("accuracy", [answer("three")], [sample], mode="number")) == [1.0]


def test_accuracy_no_target():
    assert reasons(run("accuracy", [answer("x")], [Sample("x", [])])) == ["no target"]


def test_accuracy_custom_answer_tag():
    sample = Sample("e", [], target="cat")
    assert values(run("accuracy", ["<final>cat</final>"], [sample], answer_tag="final")) == [1.0]


@pytest.mark.parametrize(
    ("target", "text", "expected"),
    [
        ("\\frac{1}{2}", "0.5", 1.0),
        ("1/2", "\\frac{1}{2}", 1.0),
        ("4", "$2+2$", 1.0),
        ("x^2", "x^2", 1.0),
        ("4", "5", 0.0),
    ],
)
def test_accuracy_math(target, text, expected):
    sample = Sample("m", [], target=target)
    assert values(run("accuracy", [answer(text)], [sample], mode="math")) == [expected]


def test_accuracy_math_guards():
    sample = Sample("m", [], target="4")
    assert reasons(run("accuracy", [answer("1+" * 600 + "1")], [sample], mode="math")) == [
        "answer too long"
    ]
    assert values(run("accuracy", [answer("")], [sample], mode="math")) == [0.0]


def math_in_a_thread(completion: str, sample: Sample, wait_s: float) -> list:
    """Score ``completion`` with accuracy's math mode in a thread other than the main one,
    waiting up to ``wait_s`` seconds: a list with the scores once the thread has them."""
    out = []
    worker = threading.Thread(
        target=lambda: out.append(run("accuracy", [completion], [sample], mode="math"))
    )
    worker.start()
    worker.join(wait_s)
    return out


def test_accuracy_math_in_a_worker_thread():
    """math_verify's signal timeouts only work in the main thread; the guard must still work."""
    sample = Sample("m", [], target="\\frac{1}{2}")
    out = math_in_a_thread(answer("0.5"), sample, wait_s=30)
    assert values(out[0]) == [1.0]


@pytest.mark.parametrize(
    "params",
    [
        {"rel_tol": -0.1},
        {"abs_tol": float("nan")},
        {"partial_within": -1},
        {"mode": "fuzzy"},
        {"answer_tag": "<a>"},
    ],
)
def test_accuracy_bad_params_fail_at_bind(params):
    with pytest.raises(ConfigError):
        VERIFIERS.get("accuracy").bind(params)


# -- iou -------------------------------------------------------------------------------------
def grounding(frame: str = "norm1000", target=(100, 100, 200, 200), **meta) -> Sample:
    meta = {"image_size": [400, 400], "box_frame": frame, **meta}
    return Sample("g", [], target=list(target), meta=meta)


def box_answer(box: str) -> str:
    return f"<think>the cup</think><answer>{box}</answer>"


def test_iou_continuous_and_parts():
    sample = grounding()  # target in pixels = norm1000 [250, 250, 500, 500]
    completions = [
        box_answer('{"bbox_2d": [250, 250, 500, 500]}'),
        box_answer('{"bbox_2d": [375, 250, 625, 500]}'),  # half shifted: IoU 1/3
    ]
    scores = run("iou", completions, [sample] * 2)
    assert values(scores) == pytest.approx([1.0, 1 / 3])
    assert scores[1].parts == {"iou": pytest.approx(1 / 3)}


def test_iou_threshold():
    sample = grounding()
    completions = [box_answer("[250, 250, 500, 500]"), box_answer("[375, 250, 625, 500]")]
    scores = run("iou", completions, [sample] * 2, threshold=0.5)
    assert values(scores) == [1.0, 0.0]
    assert scores[1].parts["iou"] == pytest.approx(1 / 3)


def test_iou_whole_image_box_scores_low_for_a_small_target():
    sample = grounding(target=(10, 10, 30, 30))  # 400 px² of a 160,000 px² image
    (score,) = run("iou", [box_answer("[0, 0, 1000, 1000]")], [sample])
    assert score.value == pytest.approx(400 / 160_000)
    assert run("iou", [box_answer("[0, 0, 1000, 1000]")], [sample], threshold=0.5)[0].value == 0.0


IOU_REJECTS = [
    ("[1100, 1100, 1500, 1500]", "box outside image"),
    ("[-300, 0, -100, 200]", "box outside image"),
    ("[500, 500, 250, 250]", "degenerate box"),  # inverted
    ("[250, 250, 250, 500]", "degenerate box"),  # zero width
    ("[250, 250, 500, 500], [0, 0, 10, 10]", "several boxes"),
    ("the cup on the left", "no box"),
    ("[600, 600, 700, 700]", "no overlap"),
]


@pytest.mark.parametrize(
    ("name", "completion", "sample", "reason"),
    [
        *(("format", text, S, reason) for text, reason in FORMAT_REJECTS),
        *(("accuracy", completion, MC, reason) for completion, reason in ACCURACY_REJECTS),
        *(("iou", box_answer(box), grounding(), reason) for box, reason in IOU_REJECTS),
    ],
)
def test_rejects(name, completion, sample, reason):
    """Each verifier scores its (completion, reason) cases 0 with that reason."""
    (score,) = run(name, [completion], [sample])
    assert (score.value, score.reason) == (0.0, reason)


def test_iou_box_in_think_only_scores_zero():
    completion = '<think>{"bbox_2d": [250, 250, 500, 500]}</think>'
    assert reasons(run("iou", [completion], [grounding()])) == ["no answer tag"]


def test_iou_clips_to_image_within_the_edge_tolerance():
    # 400-px image, norm1000: the tolerance is 5 % of the side, 50 units (20 px) past an edge
    sample = grounding(target=(300, 300, 400, 400))
    for edge in ("1040", "1050"):  # 16 px and 20 px past the edge: clipped to 400, IoU 1
        (score,) = run("iou", [box_answer(f"[750, 750, {edge}, {edge}]")], [sample])
        assert (score.value, score.reason) == (pytest.approx(1.0), None)
    # just past the tolerance, and far past it: the minimum with a reason, never clipped
    for box in ("[750, 750, 1051, 1000]", "[750, 750, 1200, 1200]", "[-60, 750, 1000, 1000]"):
        (score,) = run("iou", [box_answer(box)], [sample])
        assert (score.value, score.reason) == (0.0, "box outside image"), box


def test_iou_box_far_outside_the_image_scores_the_minimum():
    # the reported case: [9, 9, 9111, 91] on a 112-px image, clipped it would be [9, 9, 112, 91]
    # (IoU 0.74 with this target) and thresholded a hit; it must be a miss with a reason
    sample = grounding("pixels", target=(9, 9, 85, 91), image_size=[112, 112])
    for threshold in (None, 0.5):
        (score,) = run("iou", [box_answer("[9, 9, 9111, 91]")], [sample], threshold=threshold)
        assert (score.value, score.reason) == (0.0, "box outside image")
    # 5 % of 112 px = 5.6 px of slack: x2 = 117 is clipped and scored, x2 = 118 is not
    (score,) = run("iou", [box_answer("[9, 9, 117, 91]")], [sample])
    assert score.value == pytest.approx(76 / 103) and score.reason is None
    (score,) = run("iou", [box_answer("[9, 9, 118, 91]")], [sample])
    assert (score.value, score.reason) == (0.0, "box outside image")
    # the same box written in the norm1000 frame: 81339 ≫ 1050
    sample = grounding("norm1000", target=(9, 9, 85, 91), image_size=[112, 112])
    (score,) = run("iou", [box_answer("[80, 80, 81339, 812]")], [sample])
    assert (score.value, score.reason) == (0.0, "box outside image")


def test_iou_float_boxes_and_key_case():
    sample = grounding(frame="norm1")
    completions = [
        box_answer('{"Position": [0.25, 0.25, 0.5, 0.5]}'),
        box_answer('{"position": [0.25, 0.25, 0.5, 0.5]}'),
        box_answer('```json\n[{"bbox_2d": [0.25, 0.25, 0.5, 0.5], "label": "cup"}]\n```'),
    ]
    assert values(run("iou", completions, [sample] * 3)) == pytest.approx([1.0, 1.0, 1.0])


def test_iou_input_pixels_frame():
    # Original 400×400, model input 812×812 (Qwen2.5-VL-style resize): scale 400/812.
    sample = grounding(frame="input_pixels", input_size=[812, 812])
    (score,) = run("iou", [box_answer('{"bbox_2d": [203, 203, 406, 406]}')], [sample])
    assert score.value == pytest.approx(1.0)
    # The same numbers read as norm1000 would be a different box: frames are never mixed.
    (wrong,) = run(
        "iou", [box_answer('{"bbox_2d": [203, 203, 406, 406]}')], [sample], frame="norm1000"
    )
    assert wrong.value < 0.5


def test_iou_data_problems_are_reasons_not_crashes():
    no_frame = Sample("g", [], target=[1, 1, 2, 2], meta={"image_size": [4, 4]})
    no_input = grounding(frame="input_pixels")
    bad_target = grounding(target=(5, 5, 1, 1))
    no_size = Sample("g", [], target=[1, 1, 2, 2], meta={"box_frame": "pixels"})
    scores = run("iou", [box_answer("[1, 1, 2, 2]")] * 4, [no_frame, no_input, bad_target, no_size])
    assert values(scores) == [0.0] * 4
    assert reasons(scores) == [
        "no box frame",
        "meta has no valid 'input_size' [w, h]",
        "bad target box",
        "no image size",
    ]


def test_iou_bad_threshold_fails_at_bind():
    with pytest.raises(ConfigError, match="threshold"):
        VERIFIERS.get("iou").bind({"threshold": 2})
    with pytest.raises(ConfigError, match="threshold"):
        VERIFIERS.get("iou").bind({"threshold": 0})
    with pytest.raises(ConfigError, match="frame"):
        VERIFIERS.get("iou").bind({"frame": "norm100"})


def test_unknown_param_suggests_closest_name():
    with pytest.raises(ConfigError, match="did you mean 'threshold'"):
        VERIFIERS.get("iou").bind({"treshold": 0.5})
    with pytest.raises(ConfigError, match="did you mean 'rel_tol'"):
        VERIFIERS.get("accuracy").bind({"reltol": 0.1})


def test_weighted_reward_with_the_three_verifiers():
    reward = build_reward([{"name": "format"}, {"name": "accuracy", "weight": 2.0}])
    assert reward.range == (0.0, 3.0)
    out = reward([answer("B"), "<answer>B</answer>", "B"], [MC] * 3)
    assert out.total == [3.0, 2.0, 0.0]
    assert out.reasons["format/no think tag"] == 1
    assert out.reasons["accuracy/no answer tag"] == 1


def test_accuracy_math_timeouts_score_zero(monkeypatch):
    from math_verify.errors import TimeoutException
    from mmrft.verifiers import accuracy as module

    def times_out(*args):
        raise TimeoutException("Operation timed out!")

    monkeypatch.setattr(module, "_math_equal", times_out)
    sample = Sample("m", [], target="4")
    assert reasons(run("accuracy", [answer("4")], [sample], mode="math")) == ["math timed out"]


def test_accuracy_math_hang_in_a_worker_thread_is_abandoned(monkeypatch):
    from mmrft.verifiers import accuracy as module

    release = threading.Event()
    monkeypatch.setattr(module, "_math_equal", lambda *args: release.wait(10) or (True, ""))
    monkeypatch.setattr(module, "MATH_TIMEOUT_S", 0.05)
    out = math_in_a_thread(answer("4"), Sample("m", [], target="4"), wait_s=5)
    release.set()
    assert reasons(out[0]) == ["math timed out"]
