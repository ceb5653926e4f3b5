"""Strict answer parsing shared by the verifiers and by task evaluation.

Every function here reads model output and never raises on it: it returns the parsed value
and ``None``, or ``None`` and a short reason that the run log counts (``"no answer tag"``,
``"several options"``, ...). The rules are deliberately strict (docs/reference.md, "Pitfalls"):

* the answer is the content of exactly one ``<answer>…</answer>`` block; a missing or
  duplicated block is a failure, never a fall-back to the whole completion;
* text matching is normalised *equality*, never a substring test in either direction;
* a multiple-choice answer must name one option; naming several is a failure;
* a letter counts only as a standalone token (``A``, ``(A)``, ``A.``, ``A) text``), never as
  the first character of a word (``Apple``, ``A dog``).
"""

from __future__ import annotations

import math
import re
import string
from typing import Any

ARTICLES = frozenset({"a", "an", "the"})
_STRIP_CHARS = string.punctuation + string.whitespace + "“”‘’«»„‚`´…–—"

NUMBER_WORDS = {
    word: float(value)
    for value, word in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}


def extract_answer(text: str, tag: str = "answer") -> tuple[str | None, str | None]:
    """The stripped content of exactly one ``<tag>…</tag>`` block (may span lines).

    Returns ``(content, None)`` or ``(None, reason)`` with reason one of ``"no answer tag"``,
    ``"several answer tags"``, ``"unclosed answer tag"``, ``"empty answer"``. Tags are matched
    exactly (lower case, no attributes).

    >>> extract_answer("<think>maybe B</think><answer> A\\n</answer>")
    ('A', None)
    >>> extract_answer("<think>the answer is B</think>")
    (None, 'no answer tag')
    """
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    opens, closes = text.count(open_tag), text.count(close_tag)
    if opens == 0:
        return None, "no answer tag"
    if opens > 1 or closes > 1:
        return None, "several answer tags"
    start = text.index(open_tag) + len(open_tag)
    end = text.find(close_tag, start)
    if end < 0:
        return None, "unclosed answer tag"
    content = text[start:end].strip()
    if not content:
        return None, "empty answer"
    return content, None


def check_answer_tag(answer_tag: str) -> None:
    """ValueError unless ``answer_tag`` (a verifier's parameter naming the answer's tag) is a
    non-empty word: letters, digits and underscores."""
    if not answer_tag or not answer_tag.replace("_", "").isalnum():
        raise ValueError(f"answer_tag must be a non-empty word, got {answer_tag!r}")


def tagged_answer(text: str, tag: str) -> tuple[str | None, str | None]:
    """:func:`extract_answer` of ``tag``; with no tag (``""``) the whole ``text``, unstripped.

    >>> tagged_answer("<answer>A</answer>", "answer"), tagged_answer(" a cat ", "")
    (('A', None), (' a cat ', None))
    """
    return extract_answer(text, tag) if tag else (text, None)


def normalise_text(text: str) -> str:
    """Lower case, surrounding punctuation and quotes stripped, articles dropped, spaces collapsed.

    Articles (a, an, the) are dropped only when other words remain, so the answer ``"a"``
    stays ``"a"``.

    >>> normalise_text('  "The  Red Car."  ')
    'red car'
    """
    words = text.lower().strip(_STRIP_CHARS).split()
    kept = [w for w in words if w not in ARTICLES]
    return " ".join(kept or words)


# A standalone option letter, optionally prefixed "option"/"choice": A, (A), [A], A., A:, A).
_BARE_LETTER = re.compile(
    r"(?:(?:option|choice)\s+)?[(\[]?([a-z])[)\]]?[.:]?", re.IGNORECASE | re.ASCII
)
# A letter followed by text: "A. red", "(A) red", "A: red", "A) red", "A, red", "Option A: red".
_LETTER_TEXT = re.compile(
    r"(?:(?:option|choice)\s+)?(?:[(\[]([a-z])[)\]]|([a-z])[.:),])\s*(.+)",
    re.IGNORECASE | re.DOTALL | re.ASCII,
)
_LIST_SEPARATORS = re.compile(r"\s*(?:[,;/&\n]|\bor\b|\band\b)\s*", re.IGNORECASE)


def _strip_markup(answer: str) -> str:
    return answer.strip().strip("*_`\"' ").strip()


def _letter_index(letter: str, n: int) -> int | None:
    index = ord(letter.upper()) - ord("A")
    return index if 0 <= index < n else None


def _text_index(answer: str, normalised_choices: list[str]) -> int | None:
    norm = normalise_text(answer)
    hits = [i for i, c in enumerate(normalised_choices) if norm and c == norm]
    return hits[0] if len(hits) == 1 else None


def _resolve_one(answer: str, choices: list[str]) -> tuple[int | None, bool]:
    """``(index, conflict)`` for an answer naming at most one option; conflict = names two."""
    answer = _strip_markup(answer)
    normalised = [normalise_text(c) for c in choices]
    text_hit = _text_index(answer, normalised)
    bare = _BARE_LETTER.fullmatch(answer)
    if bare:
        letter_hit = _letter_index(bare.group(1), len(choices))
        if letter_hit is not None and text_hit is not None and letter_hit != text_hit:
            return None, True
        return (letter_hit if letter_hit is not None else text_hit), False
    if text_hit is not None:
        return text_hit, False
    with_text = _LETTER_TEXT.fullmatch(answer)
    if with_text:
        letter_hit = _letter_index(with_text.group(1) or with_text.group(2), len(choices))
        said = _text_index(with_text.group(3), normalised)
        if letter_hit is not None and said is not None:
            return (letter_hit, False) if letter_hit == said else (None, True)
    return None, False


def match_choice(answer: str, choices: list[str]) -> tuple[int | None, str | None]:
    """The 0-based index of the one option ``answer`` names, else ``(None, reason)``.

    An option is named by its letter (``A``, ``(A)``, ``A.``, ``A)``, ``Option A``; a bare letter
    is case-insensitive), by its text (normalised equality, see :func:`normalise_text`), or by
    a letter followed by text naming the same option (``A. red``). A letter and a text that
    name different options count as several. Reasons: ``"several options"`` when the answer
    names more than one option (``A or B``, ``red, green``, every option listed),
    ``"no option matched"`` otherwise. Never a substring or first-character test.

    >>> match_choice("(B)", ["red", "green"])
    (1, None)
    >>> match_choice("Apple", ["apple pie", "banana"])
    (None, 'no option matched')
    >>> match_choice("red or green", ["red", "green"])
    (None, 'several options')
    """
    if not choices:
        return None, "no option matched"
    index, conflict = _resolve_one(answer, choices)
    if conflict:
        return None, "several options"
    if index is not None:
        return index, None
    # Not one option: say whether it named several (for the log) or none.
    parts = [p for p in _LIST_SEPARATORS.split(_strip_markup(answer)) if p.strip()]
    named = {i for i, _ in (_resolve_one(p, choices) for p in parts) if i is not None}
    norm = normalise_text(answer)
    for i, choice in enumerate(choices):
        option = normalise_text(choice)
        if option and re.search(rf"(?<!\w){re.escape(option)}(?!\w)", norm):
            named.add(i)
    if len(named) > 1:
        return None, "several options"
    return None, "no option matched"


def choice_index(target: Any, choices: list[str]) -> int | None:
    """The index of the correct option from a dataset target (not model output).

    Resolution order: an ``int`` is a 0-based index; a string equal (normalised) to exactly one
    option's text is that option; otherwise a string that is a single letter (``"B"``,
    ``"(B)"``, ``"B."``) is that letter's option. ``None`` when the target names no option.

    >>> choice_index("green", ["red", "green"]), choice_index("B", ["red", "green"])
    (1, 1)
    """
    if isinstance(target, bool):
        return None
    if isinstance(target, int):
        return target if 0 <= target < len(choices) else None
    if not isinstance(target, str):
        return None
    hit = _text_index(target, [normalise_text(c) for c in choices])
    if hit is not None:
        return hit
    bare = _BARE_LETTER.fullmatch(_strip_markup(target))
    return _letter_index(bare.group(1), len(choices)) if bare else None


_NUMBER = re.compile(
    r"(?<![\w.])([-+−]?)"  # sign; not glued to a word (x2) or a decimal point
    r"((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"  # 1,234 / 12 / 12.5 / .5
    r"(?:[eE]([-+]?\d+))?"  # exponent
    r"(?!\d)",
)
_NUMBER_WORD = re.compile(r"\b(" + "|".join(NUMBER_WORDS) + r")\b", re.IGNORECASE)


def find_numbers(text: str) -> list[float]:
    """Every number in ``text`` in order: digits (with sign, decimals, ``1,234`` thousands,
    exponent; a ``%`` after it is ignored, so ``50%`` is 50) and the words zero to twenty."""
    found: list[tuple[int, float]] = []
    for m in _NUMBER.finditer(text):
        value = float(m.group(2).replace(",", "") + (f"e{m.group(3)}" if m.group(3) else ""))
        found.append((m.start(), -value if m.group(1) in ("-", "−") else value))
    for m in _NUMBER_WORD.finditer(text):
        found.append((m.start(), NUMBER_WORDS[m.group(1).lower()]))
    return [value for _, value in sorted(found)]


def parse_number(answer: str) -> tuple[float | None, str | None]:
    """The one number ``answer`` states (see :func:`find_numbers`), else ``(None, reason)``.

    The same number written twice (``"3 (three)"``) counts once. Reasons: ``"no number"``,
    ``"several numbers"`` (also for ranges and fractions such as ``3-4`` or ``1/2``; use the
    math mode of the accuracy verifier for expressions).

    >>> parse_number("About 1,234.5 m")
    (1234.5, None)
    >>> parse_number("3 or 4")
    (None, 'several numbers')
    """
    values = set(find_numbers(answer))
    if not values:
        return None, "no number"
    if len(values) > 1:
        return None, "several numbers"
    return values.pop(), None


def is_number_literal(value: Any) -> bool:
    """Whether a dataset target is a number: an int/float (not bool) or a string that is
    exactly one numeral (``"3"``, ``"-2.5"``, ``"1,234"``, ``"40%"``)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if not isinstance(value, str):
        return False
    m = _NUMBER.fullmatch(value.strip().rstrip("%").strip())
    return m is not None


MATH_MAX_DIGITS = 100_000
"""A power, factorial or binomial of numbers whose value would have more digits than this is
refused before sympy evaluates it (``9^{9^{9}}`` has 370 million digits; sympy builds
``3^{10^{6}}``, 477,000 digits, in 0.2 s)."""
MATH_MAX_DEPTH = 50
"""Deepest nesting of ``{}``, ``()``, ``[]`` groups read."""

_MATH_TOKEN = re.compile(r"\d+(?:\.\d+)?|\\[A-Za-z]+|\*\*|\S")
_CLOSERS = {"{": "}", "(": ")", "[": "]"}
_LOG10_2 = math.log10(2)
# Tokens that join numbers (a sum or product of numbers is a number) or wrap them.
_JOINERS = frozenset(
    {"+", "-", "−", "*", "/", ",", ";", ":", "=", "<", ">", "|", "'", "~", "\\", "&", "^", "!"}
    | {"**", "\\cdot", "\\times", "\\div", "\\pm", "\\mp", "\\left", "\\right", "\\sqrt"}
    | {"\\quad", "\\qquad", "\\displaystyle", "\\boxed", "\\text", "\\mathrm"}
)
_FRACTIONS = frozenset({"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"})
_BINOMIALS = frozenset({"\\binom", "\\dbinom", "\\tbinom", "\\choose"})


class _TooLarge(Exception):
    pass


_SKIP = object()  # a joining token: no value of its own


def math_too_large(text: str, max_digits: int = MATH_MAX_DIGITS) -> bool:
    """Whether evaluating ``text`` (LaTeX or plain ``**``) would build a number of more than
    ``max_digits`` digits, or nests groups deeper than :data:`MATH_MAX_DEPTH`.

    A cheap upper bound read from the tokens, before sympy sees them: numbers are bounded by
    their digits; a sum, product or fraction of n numbers (each ≥ 1) by their product times
    2^(n−1); ``a^b`` has about ``b · log10 a`` digits, ``n!`` about ``n · log10 n``,
    ``\\binom{n}{k}`` at most ``min(n · log10 2, k · log10 n)``. A letter or an unknown command
    makes an expression symbolic (sympy keeps ``x^{10^{100}}`` as it is), but its numeric
    parts are still bounded (``x^{9^{9^{9}}}`` evaluates the exponent).

    >>> math_too_large("9^{9^{9^{9}}}"), math_too_large("x^{9^{9}}"), math_too_large("2^{100}")
    (True, False, False)
    >>> math_too_large("(10^{7})!"), math_too_large("e^{-x^{2}/2}")
    (True, False)
    """
    tokens = _MATH_TOKEN.findall(text)
    try:
        tree, _ = _math_groups(tokens, 0, None, 0)
        _math_magnitude(tree, math.log10(max_digits))
    except _TooLarge:
        return True
    return False


def _math_groups(tokens: list[str], i: int, closer: str | None, depth: int) -> tuple[list, int]:
    """Tokens as nested lists, one per bracketed group; returns (items, index after)."""
    if depth > MATH_MAX_DEPTH:
        raise _TooLarge
    items: list[Any] = []
    while i < len(tokens):
        token = tokens[i]
        if token == closer:
            return items, i + 1
        if token in _CLOSERS:
            group, i = _math_groups(tokens, i + 1, _CLOSERS[token], depth + 1)
            items.append(group)
        else:
            items.append(token)
            i += 1
    return items, i


def _math_magnitude(items: list, limit: float) -> float | None:
    """An upper bound of log10 |value| of a sequence of terms, or None when symbolic;
    raises _TooLarge where a term's number of digits would exceed 10**limit."""
    terms = []
    i = 0
    while i < len(items):
        value, i = _math_power(items, i, limit)
        if value is not _SKIP:
            terms.append(value)
    if any(t is None for t in terms):
        return None
    return sum(max(t, 0.0) for t in terms) + _LOG10_2 * max(len(terms) - 1, 0)


def _math_power(items: list, i: int, limit: float) -> tuple[Any, int]:
    """One term: an atom with its ``!`` and right-associative ``^`` / ``**``."""
    value, i = _math_atom(items, i, limit)
    while i < len(items) and items[i] == "!":
        if value is not None and value is not _SKIP:  # log10 n! ≤ n · log10 n
            digits = value + math.log10(value) if value > 0 else 0.0
            if digits > limit:
                raise _TooLarge
            value = 10**value * value
        i += 1
    if i < len(items) and items[i] in ("^", "**") and value is not _SKIP:
        exponent, i = _math_power(items, i + 1, limit)
        if exponent is None or value is None:
            return None, i
        if exponent is _SKIP:
            return value, i
        if value > 0:  # digits of a^b ≈ b · log10 a, bounded in log space
            if exponent + math.log10(value) > limit:
                raise _TooLarge
            value = 10**exponent * value
    return value, i


def _math_atom(items: list, i: int, limit: float) -> tuple[Any, int]:
    item = items[i]
    if isinstance(item, list):
        return _math_magnitude(item, limit), i + 1
    if item[0].isdigit():
        whole = item.split(".")[0].lstrip("0")
        return (math.log10(int(whole)) if whole and len(whole) < 300 else len(whole)), i + 1
    if item in _FRACTIONS or item in _BINOMIALS:
        parts = []
        i += 1
        for _ in range(2):
            value, i = _math_atom(items, i, limit) if i < len(items) else (None, i)
            parts.append(None if value is _SKIP else value)
        if None in parts:
            return None, i
        top, bottom = parts
        if item in _FRACTIONS:
            return top + bottom, i
        if top > 0 and min(top + math.log10(_LOG10_2), bottom + math.log10(top)) > limit:
            raise _TooLarge
        return min(10**top * _LOG10_2, 10**bottom * top) if top > 0 else 0.0, i
    if item in _JOINERS:
        return _SKIP, i + 1
    return None, i + 1  # a letter or an unknown command: symbolic
