"""Strict answer parsing: tags, normalisation, options, numbers (incl. anti-hacking cases)."""

from __future__ import annotations

import pytest

from mmrft.rewards.answers import (
    choice_index,
    extract_answer,
    is_number_literal,
    match_choice,
    normalise_text,
    parse_number,
)

CHOICES = ["red", "green", "blue", "yellow"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>B</answer>", ("B", None)),
        ("<think>hmm</think>\n<answer>  red car \n</answer>", ("red car", None)),
        ("<answer>\nline one\nline two\n</answer>", ("line one\nline two", None)),
        ("the answer is B", (None, "no answer tag")),
        ("<think>the answer is B</think>", (None, "no answer tag")),
        ("B</answer>", (None, "no answer tag")),
        ("<answer>A</answer><answer>B</answer>", (None, "several answer tags")),
        ("<answer>A<answer>B</answer>", (None, "several answer tags")),
        ("<answer>B", (None, "unclosed answer tag")),
        ("</answer>B<answer>", (None, "unclosed answer tag")),
        ("<answer></answer>", (None, "empty answer")),
        ("<answer>  \n </answer>", (None, "empty answer")),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_custom_tag():
    assert extract_answer("<box>[1,2,3,4]</box>", tag="box") == ("[1,2,3,4]", None)
    assert extract_answer("<answer>x</answer>", tag="box") == (None, "no answer tag")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Red Car.", "red car"),
        ('  "an   apple"  ', "apple"),
        ("'Blue'", "blue"),
        ("a", "a"),  # an article alone is kept
        ("The", "the"),
        ("(B)", "b"),
        ("", ""),
        ("!!!", ""),
    ],
)
def test_normalise_text(text, expected):
    assert normalise_text(text) == expected


@pytest.mark.parametrize(
    "answer",
    ["B", "b", "(B)", "(b)", "B.", "B)", "B:", "[B]", "**B**", "Option B", "option b", "Choice B"],
)
def test_match_choice_letter_forms(answer):
    assert match_choice(answer, CHOICES) == (1, None)


@pytest.mark.parametrize(
    "answer",
    ["green", "Green.", "the green", '"GREEN"', "B. green", "(B) green", "B: Green", "B, green"],
)
def test_match_choice_text_and_letter_with_text(answer):
    assert match_choice(answer, CHOICES) == (1, None)


@pytest.mark.parametrize(
    ("answer", "choices"),
    [
        ("Apple", ["apple pie", "banana"]),  # first letter is A, but it is a word
        ("A dog", ["a cat", "a bird"]),  # "A" is an article here, not option A
        ("Answer", CHOICES),
        ("greenish", CHOICES),  # no substring match
        ("it is green I think", CHOICES),
        ("gre", CHOICES),  # no prefix match
        ("E", CHOICES),  # a letter beyond the options
        ("I think A", CHOICES),
        ("B. purple", CHOICES),  # letter with a text naming no option
    ],
)
def test_match_choice_no_match(answer, choices):
    assert match_choice(answer, choices) == (None, "no option matched")


@pytest.mark.parametrize(
    "answer",
    [
        "A or B",
        "A, B, C, D",  # every option by letter
        "red, green, blue, yellow",  # every option by text
        "red green blue yellow",
        "red and green",
        "A/B",
        "B. red",  # letter and text disagree
        "maybe red, maybe green",
    ],
)
def test_match_choice_several(answer):
    assert match_choice(answer, CHOICES) == (None, "several options")


def test_match_choice_exact_text_beats_word_containment():
    choices = ["red", "dark red", "salt and pepper"]
    assert match_choice("dark red", choices) == (1, None)
    assert match_choice("salt and pepper", choices) == (2, None)


def test_match_choice_letter_text_conflict():
    # Option C's text is "A": a bare "A" names both option A (letter) and option C (text).
    assert match_choice("A", ["x", "y", "A"]) == (None, "several options")
    assert match_choice("anything", []) == (None, "no option matched")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("green", 1),
        ("Green", 1),
        ("B", 1),
        ("(B)", 1),
        (1, 1),
        (7, None),
        ("purple", None),
        (True, None),
    ],
)
def test_choice_index(target, expected):
    assert choice_index(target, CHOICES) == expected


def test_choice_index_prefers_option_text_over_letter():
    assert choice_index("A", ["x", "y", "A"]) == 2


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("3", 3.0),
        ("-3", -3.0),
        ("−3", -3.0),  # unicode minus
        ("+3", 3.0),
        ("2.5", 2.5),
        (".5", 0.5),
        ("1,234", 1234.0),
        ("1,234,567.25", 1234567.25),
        ("50%", 50.0),
        ("2.5e3", 2500.0),
        ("three", 3.0),
        ("Twenty", 20.0),
        ("zero", 0.0),
        ("There are 7 cubes.", 7.0),
        ("7 (seven)", 7.0),
        ("x2 is 5", 5.0),
    ],
)
def test_parse_number(answer, expected):
    assert parse_number(answer) == (expected, None)


@pytest.mark.parametrize(
    "answer", ["3 or 4", "1,2,3", "3-4", "1/2", "12:30", "two or three", "3 and 5"]
)
def test_parse_number_several(answer):
    assert parse_number(answer) == (None, "several numbers")


@pytest.mark.parametrize("answer", ["", "none", "many", "lots of them"])
def test_parse_number_none(answer):
    assert parse_number(answer) == (None, "no number")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, True),
        (2.5, True),
        ("3", True),
        ("-2.5", True),
        ("1,234", True),
        ("40%", True),
        (True, False),
        ("three apples", False),
        ("red", False),
        (None, False),
    ],
)
def test_is_number_literal(value, expected):
    assert is_number_literal(value) is expected
