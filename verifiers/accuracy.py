"""The accuracy verifier: does the answer in the ``<answer>`` block equal the target?"""

from __future__ import annotations

import math
import threading
from typing import Any, Literal

from mmrft.data import Sample
from mmrft.rewards import Score, verifier
from mmrft.rewards.answers import (
    check_answer_tag,
    choice_index,
    extract_answer,
    is_number_literal,
    match_choice,
    math_too_large,
    normalise_text,
    parse_number,
)

Mode = Literal["auto", "exact", "choice", "number", "math"]

MATH_TIMEOUT_S = 3
"""Seconds allowed to each math_verify parse and comparison."""
MATH_MAX_CHARS = 1000
"""Longer math answers score 0 (``answer too long``) without being parsed."""
# Before sympy: answers over MATH_MAX_CHARS, and numbers too large to build
# (mmrft.rewards.answers.math_too_large: 9^{9^{9}}, (10^{7})!) score 0 with a reason. A call that
# still holds the GIL past reward.timeout_s is killed with its worker (mmrft.rewards.pool).


def _score(ok: bool, reason: str) -> Score:
    return Score(1.0) if ok else Score(0.0, reason=reason)


def _auto_mode(sample: Sample) -> str:
    if sample.meta.get("choices"):
        return "choice"
    if is_number_literal(sample.target):
        return "number"
    return "exact"


def _target_number(target: Any) -> float | None:
    if isinstance(target, bool):
        return None
    if isinstance(target, (int, float)):
        return float(target)
    if isinstance(target, str):
        return parse_number(target)[0]
    return None


def _check_choice(answer: str, sample: Sample) -> Score:
    choices = [str(c) for c in sample.meta.get("choices") or []]
    correct = choice_index(sample.target, choices)
    if correct is None:
        return Score(0.0, reason="target not among choices")
    picked, reason = match_choice(answer, choices)
    if picked is None:
        return Score(0.0, reason=reason)
    return _score(picked == correct, "wrong option")


def _check_number(
    answer: str, target: Any, rel_tol: float, abs_tol: float, partial_within: float
) -> Score:
    expected = _target_number(target)
    if expected is None:
        return Score(0.0, reason="target not a number")
    value, reason = parse_number(answer)
    if value is None:
        return Score(0.0, reason=reason)
    error = abs(value - expected)
    if error <= max(abs_tol, rel_tol * abs(expected)):
        return Score(1.0)
    partial = max(0.0, 1.0 - error / partial_within) if partial_within else 0.0
    return Score(partial, reason="wrong number")


def _check_exact(answer: str, target: Any) -> Score:
    accepted = target if isinstance(target, list) else [target]
    norm = normalise_text(answer)
    ok = bool(norm) and any(norm == normalise_text(str(t)) for t in accepted)
    return _score(ok, "wrong answer")


def _math_parse(text: str, timeout: int | None) -> list:
    from math_verify import parse  # imported on first use: it pulls in sympy

    parsed = parse(text, parsing_timeout=timeout, raise_on_error=True)
    return parsed or parse(f"${text}$", parsing_timeout=timeout, raise_on_error=True)


def _math_equal(answer: str, target: str, timeout: int | None) -> tuple[bool, str]:
    """math_verify's verdict, or ``(False, reason)``. Raises math_verify's TimeoutException."""
    from math_verify import verify

    gold = _math_parse(target, timeout)
    if not gold:
        return False, "target not parsable"
    pred = _math_parse(answer, timeout)
    if not pred:
        return False, "unparsable answer"
    return verify(gold, pred, timeout_seconds=timeout, raise_on_error=True), "wrong answer"


def _check_math(answer: str, target: Any) -> Score:
    """math_verify behind a guard that never raises and never hangs.

    math_verify times out with ``signal.alarm``, which only works in the main thread. There
    its own timeouts are used (``MATH_TIMEOUT_S`` per parse and comparison). Elsewhere (a
    reward computed in a worker thread) its timeouts are turned off and the call runs in a
    daemon thread that is abandoned after ``3 × MATH_TIMEOUT_S``: the reward is 0 with reason
    ``math timed out`` and the stray computation finishes in the background.
    """
    from math_verify.errors import TimeoutException

    if len(answer) > MATH_MAX_CHARS:
        return Score(0.0, reason="answer too long")
    if math_too_large(answer):
        return Score(0.0, reason="math too large")
    target_text = str(target)
    if math_too_large(target_text):
        return Score(0.0, reason="target too large")
    if threading.current_thread() is threading.main_thread():
        try:
            ok, reason = _math_equal(answer, target_text, MATH_TIMEOUT_S)
        except TimeoutException:  # a BaseException: `except Exception` would miss it
            return Score(0.0, reason="math timed out")
        except Exception:
            return Score(0.0, reason="unparsable answer")
        return _score(ok, reason)

    result: list[tuple[bool, str]] = []

    def work() -> None:
        try:
            result.append(_math_equal(answer, target_text, None))
        except Exception:
            result.append((False, "unparsable answer"))

    worker = threading.Thread(target=work, name="mmrft-math-verify", daemon=True)
    worker.start()
    worker.join(3 * MATH_TIMEOUT_S)
    if not result:
        return Score(0.0, reason="math timed out")
    return _score(*result[0])


@verifier("accuracy", low=0.0, high=1.0)
def accuracy(
    completions: list[str],
    samples: list[Sample],
    *,
    mode: Mode = "auto",
    rel_tol: float = 0.0,
    abs_tol: float = 0.0,
    partial_within: float = 0.0,
    answer_tag: str = "answer",
) -> list[Score]:
    """1 if the answer equals the target, else 0 with the reason. Range [0, 1].

    The answer is the content of exactly one ``<answer_tag>`` block (:func:`extract_answer`);
    without one the score is 0 — the rest of the completion (the think block) is never read.
    Modes, chosen per sample:

    * ``auto``: ``choice`` when ``meta["choices"]`` is set, ``number`` when the target is a
      number (int/float or a numeral string such as ``"3"``), else ``exact``.
    * ``choice``: the answer must name one option (:func:`match_choice`: its letter, its text,
      or both agreeing; several options score 0). The target is the correct option's text,
      its letter (``"B"``), or its 0-based index (int); text wins when an option's text is
      itself a letter (:func:`choice_index`).
    * ``number``: exactly one number in the answer (:func:`parse_number`), correct when
      |answer − target| ≤ max(abs_tol, rel_tol · |target|); the default tolerances mean
      equality. Reward shaping for training (never for evaluation): with
      ``partial_within`` = w > 0 a wrong number scores max(0, 1 − |answer − target| / w)
      instead of 0, so with w = 3 a count off by one earns 2/3 and one off by three or more
      nothing; a near miss then ranks above a far one within a group.
    * ``exact``: :func:`normalise_text` equality (lower case, articles and surrounding
      punctuation dropped); never a substring test. A list target lists accepted answers.
    * ``math``: ``math_verify.parse`` of target and answer (retried inside ``$…$``), then
      ``math_verify.verify(gold, answer)``; timeouts as in :func:`_check_math`. An answer
      over ``MATH_MAX_CHARS`` characters, or one whose powers, factorials or binomials of
      numbers would exceed ``MATH_MAX_DIGITS`` digits (``9^{9^{9}}``), is refused before
      sympy sees it (:func:`mmrft.rewards.answers.math_too_large`).

    Reasons at 0: those of :func:`extract_answer`, ``wrong option``, ``several options``,
    ``no option matched``, ``wrong number``, ``several numbers``, ``no number``,
    ``wrong answer``, ``unparsable answer``, ``answer too long``, ``math too large``,
    ``math timed out``; data problems: ``no target``, ``target not among choices``,
    ``target not a number``, ``target not parsable``, ``target too large``.

    >>> from mmrft.data import Sample
    >>> s = Sample("q1", [], target="green", meta={"choices": ["red", "green", "blue"]})
    >>> [x.value for x in accuracy(["<answer>B</answer>", "<answer>Green.</answer>"], [s, s])]
    [1.0, 1.0]
    >>> accuracy(["<answer>A, B, C</answer>"], [s])[0].reason
    'several options'
    >>> n = Sample("q2", [], target=12)
    >>> scores = accuracy(["<think>12</think>", "<answer>11.5</answer>"], [n, n], abs_tol=0.5)
    >>> [(x.value, x.reason) for x in scores]
    [(0.0, 'no answer tag'), (1.0, None)]
    """
    for name, value in (
        ("rel_tol", rel_tol),
        ("abs_tol", abs_tol),
        ("partial_within", partial_within),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number ≥ 0, got {value}")
    check_answer_tag(answer_tag)

    scores = []
    for text, sample in zip(completions, samples):
        answer, reason = extract_answer(text, answer_tag)
        if answer is None:
            scores.append(Score(0.0, reason=reason))
            continue
        if sample.target is None:
            scores.append(Score(0.0, reason="no target"))
            continue
        sample_mode = _auto_mode(sample) if mode == "auto" else mode
        if sample_mode == "choice":
            scores.append(_check_choice(answer, sample))
        elif sample_mode == "number":
            scores.append(_check_number(answer, sample.target, rel_tol, abs_tol, partial_within))
        elif sample_mode == "math":
            scores.append(_check_math(answer, sample.target))
        else:
            scores.append(_check_exact(answer, sample.target))
    return scores
