"""The format verifier: is the completion laid out as ``<think>…</think><answer>…</answer>``?"""

from __future__ import annotations

import re
from typing import Literal

import regex

from mmrft.data import Sample
from mmrft.rewards import Score, verifier

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_THINK_ANSWER = re.compile(r"\s*<think>.*</think>\s*<answer>(.*)</answer>\s*", re.DOTALL)
_ANSWER_ONLY = re.compile(r"\s*<answer>(.*)</answer>\s*", re.DOTALL)
PATTERN_TIMEOUT_S = 1.0
"""Seconds a user ``pattern`` may spend on one completion (the ``regex`` engine's own
timeout, which stops a backtracking match such as ``(a|aa)*`` on ``aaa…!``); over it the
completion scores 0 with reason ``pattern timed out``."""


def _check(text: str, think: str) -> Score:
    counts = {tag: text.count(tag) for tag in _TAGS}
    if counts["<answer>"] == 0 and counts["</answer>"] == 0:
        return Score(0.0, reason="no answer tag")
    if counts["<answer>"] > 1 or counts["</answer>"] > 1:
        return Score(0.0, reason="several answer tags")
    if counts["<think>"] > 1 or counts["</think>"] > 1:
        return Score(0.0, reason="several think tags")
    if counts["<answer>"] != counts["</answer>"]:
        return Score(0.0, reason="unclosed answer tag")
    if counts["<think>"] != counts["</think>"]:
        return Score(0.0, reason="unclosed think tag")
    has_think = counts["<think>"] == 1
    if think == "required" and not has_think:
        return Score(0.0, reason="no think tag")
    if think == "none" and has_think:
        return Score(0.0, reason="think not allowed")
    positions = [text.index(tag) for tag in _TAGS if counts[tag]]
    if positions != sorted(positions):
        return Score(0.0, reason="nested or misordered tags")
    match = (_THINK_ANSWER if has_think else _ANSWER_ONLY).fullmatch(text)
    if match is None:
        return Score(0.0, reason="text outside tags")
    if not match.group(1).strip():
        return Score(0.0, reason="empty answer")
    return Score(1.0)


@verifier("format", low=0.0, high=1.0)
def check_format(
    completions: list[str],
    samples: list[Sample],
    *,
    think: Literal["required", "optional", "none"] = "required",
    pattern: str | None = None,
) -> list[Score]:
    """1 if the completion has the required layout, else 0 with the reason. Range [0, 1].

    Layout (tags exactly as written, lower case), with only whitespace around the blocks:

    * ``think="required"``: ``<think>…</think>`` then ``<answer>…</answer>``;
    * ``think="optional"``: the same, or the answer block alone;
    * ``think="none"``: the answer block alone (a think block scores 0).

    Each tag appears at most once, in that order (duplicated, nested or unclosed tags score 0)
    and the answer is not empty. The think block may be empty. Reasons: ``no answer tag``,
    ``several answer tags``, ``several think tags``, ``unclosed answer tag``,
    ``unclosed think tag``, ``no think tag``, ``think not allowed``,
    ``nested or misordered tags``, ``text outside tags``, ``empty answer``.

    ``pattern`` replaces all of this with a custom regular expression that must match the
    whole completion (``fullmatch``, ``DOTALL``; the ``regex`` package, whose syntax is
    ``re``'s plus extensions); reason ``pattern mismatch``, or ``pattern timed out`` past
    ``PATTERN_TIMEOUT_S`` on one completion. A pattern that does not compile is a
    configuration error at start-up.

    >>> from mmrft.data import Sample
    >>> s = Sample("q1", [])
    >>> good = "<think>two red shapes</think>\\n<answer>2</answer>"
    >>> [x.value for x in check_format([good, "<answer>2</answer>"], [s, s])]
    [1.0, 0.0]
    >>> check_format(["<answer>2</answer><answer>3</answer>"], [s], think="optional")[0].reason
    'several answer tags'
    """
    compiled = None
    if pattern is not None:
        try:
            compiled = regex.compile(pattern, regex.DOTALL)
        except regex.error as exc:
            raise ValueError(
                f"pattern {pattern!r} is not a valid regular expression: {exc}"
            ) from None
    scores = []
    for text in completions:
        if compiled is not None:
            try:
                ok = compiled.fullmatch(text, timeout=PATTERN_TIMEOUT_S) is not None
            except TimeoutError:
                scores.append(Score(0.0, reason="pattern timed out"))
                continue
            scores.append(Score(1.0) if ok else Score(0.0, reason="pattern mismatch"))
        else:
            scores.append(_check(text, think))
    return scores
