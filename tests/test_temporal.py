"""The temporal_iou verifier and its interval parser: forms, checks, variants, adversarial input."""

from __future__ import annotations

import random

import pytest
from helpers import check_doctests, check_registered, fast_score, fastest
from mmrft.verifiers.temporal import MAX_ANSWER_CHARS, parse_interval, temporal_iou

from mmrft.data import Sample
from mmrft.plugins import VERIFIERS
from mmrft.typecheck import ConfigError

SAMPLE = Sample("t", [], target=[12.5, 17.8], meta={"duration": 30.0})


def run(completions: list[str], samples: list[Sample] | None = None, **params) -> list:
    """Call the verifier through the same path training uses (bind, then call)."""
    samples = samples or [SAMPLE] * len(completions)
    return VERIFIERS.get("temporal_iou").bind(params)(completions, samples)


def answer(text: str) -> str:
    return f"<think>the person opens the door</think><answer>{text}</answer>"


def test_docstring_examples_run():
    check_doctests("mmrft.verifiers.temporal")


def test_registered_with_range_and_doc():
    check_registered("temporal_iou")


# -- forms ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "12.5 to 17.8",
        "[12.5, 17.8]",
        "(12.5, 17.8)",
        "12.5s - 17.8s",
        "12.5 - 17.8 seconds",
        "12.5-17.8",
        "12.5 – 17.8",  # en dash
        "from 12.5 to 17.8",
        "The event happens from 12.5 to 17.8 seconds.",
        "00:12.5 to 00:17.8",
        "0:00:12.5 to 0:00:17.80",
        "12.5 sec until 17.8 sec",
        "12500ms to 17800ms",
        "between 12.5 and\n17.8",  # multi-line
        '{"start": 12.5, "end": 17.8}',
    ],
)
def test_forms_give_the_same_interval(text):
    assert parse_interval(text, duration=30.0) == ((12.5, pytest.approx(17.8)), None)
    assert run([answer(text)])[0].value == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("text", "interval"),
    [
        ("01:05 to 01:12.5", (65.0, 72.5)),
        ("1:00:00 to 1:00:30.25", (3600.0, 3630.25)),
        ("65 to 01:12", (65.0, 72.0)),  # a plain number next to a clock is seconds
        ("1 to 2 minutes", (60.0, 120.0)),  # one unit written applies to both
        ("2 min to 3", (120.0, 180.0)),
        ("1.5 min - 90.5 s", (90.0, 90.5)),
        (".5 to 3", (0.5, 3.0)),
        ("1e1 to 2e1", (10.0, 20.0)),
    ],
)
def test_time_formats(text, interval):
    assert parse_interval(text) == (interval, None)


# -- checks --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("17.8 to 12.5", "reversed interval"),
        ("12.5 to 12.5", "empty interval"),
        ("-2 to 5", "negative time"),
        ("from 3 to -1", "negative time"),
        ("12.5 to 32", "outside video"),  # beyond duration + 1 s tolerance
        ("30 to 31", "outside video"),  # starts at the end of the video
        ("45 to 50", "outside video"),
        ("10 to 1e300", "outside video"),  # huge number
        ("10 to 1e999", "bad time"),  # overflows to inf
        ("10 to " + "9" * 400, "bad time"),
        ("01:75 to 02:00", "bad time"),
        ("1:75:00 to 2:00:00", "bad time"),
        ("12.5", "no interval"),
        ("the door opens", "no interval"),
        ("nan to 17.8", "no interval"),
        ("12.5 to inf", "no interval"),
        ("12.5 to 17.8, i.e. 5.3 s", "extra numbers"),
        ("12.5 to 17.8 and 20 to 25", "several intervals"),
        ("[[1, 2], [3, 4], [5, 6]]", "several intervals"),
    ],
)
def test_rejects_with_reason(text, reason):
    assert parse_interval(text, duration=30.0) == (None, reason)
    (score,) = run([answer(text)])
    assert (score.value, score.reason) == (0.0, reason)


@pytest.mark.parametrize("text", [".2.2 to 3", "0.2 to .2.2", "..5 to 1", "1.2.3 to 4", "3.4."])
def test_dotted_junk_is_no_interval(text):
    # ".2.2" crashed the verifier (float(".2.2")) in a CPU training run of video_temporal
    assert parse_interval(text, duration=30.0) == (None, "no interval")


def test_random_time_like_answers_never_raise():
    """Answers built from the characters of times, units and separators, as a sampling
    policy writes them: every one scores in [0, 1], a zero with a reason."""
    rng = random.Random(0)
    pieces = list("0123456789.:-−eE ,[]") + ["to", "s", "sec", "min", "h", " - ", "..", "::"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))) for _ in range(3000)]
    for score in run([answer(t) for t in texts], [SAMPLE] * len(texts)):
        assert 0.0 <= score.value <= 1.0
        assert score.value > 0 or score.reason


def test_end_within_tolerance_is_clipped():
    assert parse_interval("20 to 30.6", duration=30.0) == ((20.0, 30.0), None)
    assert parse_interval("20 to 30.6", duration=30.0, tolerance=0.0) == (None, "outside video")
    (score,) = run([answer("20 to 30.6")], [Sample("t", [], [20.0, 30.0], {"duration": 30.0})])
    assert score.value == 1.0
    (strict,) = run([answer("20 to 30.6")], [SAMPLE], tolerance=0.0)
    assert strict.reason == "outside video"


def test_minus_is_a_separator_only_right_after_the_start():
    assert parse_interval("12.5 -17.8") == ((12.5, 17.8), None)
    assert parse_interval("-12.5 - 17.8") == (None, "negative time")
    assert parse_interval("at 3 and then -1") == (None, "negative time")


# -- scores --------------------------------------------------------------------------------------
def test_tiou_and_parts():
    sample = Sample("t", [], target=[10.0, 20.0], meta={"duration": 40.0})
    (score,) = run([answer("15 to 25")], [sample])
    assert score.value == pytest.approx(1 / 3)
    assert score.parts == {
        "tiou": pytest.approx(1 / 3),
        "start_error_s": pytest.approx(5.0),
        "end_error_s": pytest.approx(5.0),
    }
    (miss,) = run([answer("25 to 30")], [sample])
    assert (miss.value, miss.reason) == (0.0, "no overlap")


def test_time_r1_variant():
    sample = Sample("t", [], target=[10.0, 20.0], meta={"duration": 40.0})
    texts = [answer("10 to 20"), answer("12 to 22"), answer("0 to 40")]
    scores = run(texts, [sample] * 3, variant="time_r1")
    # tIoU × (1 − |Δs|/D)(1 − |Δe|/D)
    assert [s.value for s in scores] == pytest.approx(
        [1.0, (8 / 12) * (1 - 2 / 40) * (1 - 2 / 40), (10 / 40) * (1 - 10 / 40) * (1 - 20 / 40)]
    )
    # Among equal tIoUs the closer boundaries win: the variant's point.
    a, b = run([answer("5 to 20"), answer("10 to 25")], [sample] * 2, variant="time_r1")
    assert temporal_iou((5, 20), (10, 20)) == temporal_iou((10, 25), (10, 20))
    assert a.value == pytest.approx(b.value)
    assert all(0.0 <= s.value <= 1.0 for s in scores)


def test_threshold_turns_tiou_into_recall():
    sample = Sample("t", [], target=[10.0, 20.0], meta={"duration": 40.0})
    texts = [answer("10 to 20"), answer("12 to 20"), answer("15 to 25")]
    scores = run(texts, [sample] * 3, threshold=0.5)
    assert [s.value for s in scores] == [1.0, 1.0, 0.0]
    assert scores[2].parts["tiou"] == pytest.approx(1 / 3)


def test_data_problems_are_reasons_not_crashes():
    samples = [
        Sample("t", [], target=[20.0, 10.0], meta={"duration": 30.0}),
        Sample("t", [], target="12 to 17", meta={"duration": 30.0}),
        Sample("t", [], target=[12.5, 17.8], meta={}),
        Sample("t", [], target=[12.5, 17.8], meta={"duration": float("nan")}),
    ]
    scores = run([answer("12.5 to 17.8")] * 4, samples)
    assert [s.value for s in scores] == [0.0] * 4
    assert [s.reason for s in scores] == ["bad target", "bad target", "no duration", "no duration"]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"threshold": 0}, "threshold"),
        ({"threshold": 1.5}, "threshold"),
        ({"variant": "time_r1", "threshold": 0.5}, "threshold applies"),
        ({"variant": "giou"}, "variant"),
        ({"tolerance": -1}, "tolerance"),
        ({"tolerance": float("inf")}, "tolerance"),
        ({"answer_tag": "<a>"}, "answer_tag"),
    ],
)
def test_bad_params_fail_at_bind(params, match):
    with pytest.raises(ConfigError, match=match):
        VERIFIERS.get("temporal_iou").bind(params)


# -- adversarial corpus --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "reason"),
    [
        ("", "no answer tag"),
        ("<answer></answer>", "empty answer"),
        ("<answer>   \n </answer>", "empty answer"),
        ("<think>it is 12.5 to 17.8</think>", "no answer tag"),  # right answer only in the think
        ("<think>12.5 to 17.8</think> 12.5 to 17.8", "no answer tag"),
        ("<answer>12.5 to 17.8</answer><answer>12.5 to 17.8</answer>", "several answer tags"),
        ("<answer>12.5 to 17.8", "unclosed answer tag"),
        ("<answer><answer>12.5 to 17.8</answer></answer>", "several answer tags"),
        (answer('{"start": NaN, "end": Infinity}'), "no interval"),
        (answer("{{{[[[ 12.5 ]]]}}} garbage ::: ---"), "no interval"),
        (answer("12.5 to 17.8 " * 3), "several intervals"),
    ],
)
def test_adversarial_corpus(completion, reason):
    (score,) = run([completion])
    assert (score.value, score.reason) == (0.0, reason)


def adversarial_bodies(n: int) -> list[tuple[str, float]]:
    """Junk of about ``n`` characters and the score it should get."""
    return [
        ("12.5 to 17.8 " + "blah " * (n // 5), 1.0),  # a right answer in long prose
        ("12.5 to 17.8. " + "Really. " * (n // 8), 1.0),
        ("1 " * (n // 2), 0.0),
        ("9" * n, 0.0),
        ("1:" * (n // 2), 0.0),
        ("-1:" * (n // 3), 0.0),
        ("1.1" * (n // 3), 0.0),
        ("{" * n, 0.0),
        ("[" * n, 0.0),
        ("- " * (n // 2), 0.0),
        ("a1 " * (n // 3), 0.0),
        ("a.1 " * (n // 4), 0.0),
        ("." * n, 0.0),
    ]


@pytest.mark.parametrize(("body", "expected"), adversarial_bodies(MAX_ANSWER_CHARS - 100))
def test_answers_up_to_the_length_bound_parse_fast(body, expected):
    assert MAX_ANSWER_CHARS - 1000 < len(body) <= MAX_ANSWER_CHARS
    score = fast_score(lambda: run([answer(body)])[0])
    assert score.value == pytest.approx(expected)


@pytest.mark.parametrize(("body", "expected"), adversarial_bodies(100_000))
def test_100_kb_answers_score_fast(body, expected):
    score = fast_score(lambda: run([answer(body)])[0])
    assert (score.value, score.reason) == (0.0, "answer too long")


def test_parse_of_100_kb_is_fast_without_the_bound():
    """The parser itself is linear with a small constant, bound or not."""
    for body, _ in adversarial_bodies(100_000):
        best, _ = fastest(lambda body=body: parse_interval(body, duration=30.0), repeats=3)
        assert best < 0.05, f"{body[:10]!r}: {best * 1000:.1f} ms"
