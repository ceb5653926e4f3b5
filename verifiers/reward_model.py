"""``reward_model``: a scalar reward model's score of (prompt, answer) (:mod:`mmrft.rewards.judges`)."""

from __future__ import annotations

import math

from mmrft.data import Sample
from mmrft.rewards import Score, verifier
from mmrft.rewards.answers import tagged_answer
from mmrft.rewards.judges import LocalScorer, check_params
from mmrft.typecheck import check_number


@verifier("reward_model", low=0.0, high=1.0, isolate=False)
def reward_model(
    completions: list[str],
    samples: list[Sample],
    *,
    path: str = "",
    device: str = "cpu",
    batch_size: int = 8,
    answer_tag: str = "",
    normalise: str = "sigmoid",
    temperature: float = 1.0,
    low: float = -10.0,
    high: float = 10.0,
) -> list[Score]:
    """A sequence-classification reward model's score of (question, answer), mapped to [0, 1].
    Range [0, 1].

    The answer is the whole completion (``answer_tag``: its tag's content; without one → 0 with
    the reason). ``normalise``: ``sigmoid`` = σ(s / ``temperature``); ``clip`` = (clip(s, low,
    high) − low) / (high − low); ``rank`` = the completion's rank among its batch's scores
    divided by (n − 1) (ties share their mean rank; 0.5 for a batch of one).

    Checked at start-up: ``batch_size`` 1–4096, ``temperature`` in (0, 1e6], ``low`` and
    ``high`` finite (|x| ≤ 1e12) with ``low < high``. The model's scores are checked before
    use: one per answer (else the verifier raises: the model is broken), each finite (a NaN or
    infinite score gives that answer 0 with reason ``reward model score not finite``, and is
    left out of the ranks); when none of a batch is finite the verifier raises rather than
    train on zeros.
    """
    if not path:
        raise ValueError("reward_model needs path (a sequence-classification model, 1 label)")
    if normalise not in ("sigmoid", "clip", "rank"):
        raise ValueError(f"normalise '{normalise}': choose sigmoid, clip or rank")
    check_params({"batch_size": batch_size})
    check_number("temperature", temperature, 0, 1e6, open_low=True)
    check_number("low", low, -1e12, 1e12)
    check_number("high", high, -1e12, 1e12)
    if not low < high:
        raise ValueError(f"low ({low:g}) must be below high ({high:g})")
    scores: list[Score | None] = [None] * len(completions)
    pairs, where = [], []
    for i, (completion, sample) in enumerate(zip(completions, samples)):
        answer, reason = tagged_answer(completion, answer_tag)
        if answer is None:
            scores[i] = Score(0.0, reason=reason)
            continue
        pairs.append((sample.text(), answer))
        where.append(i)
    given = LocalScorer(path, device, batch_size).score(pairs) if pairs else []
    if len(given) != len(pairs):
        raise ValueError(f"reward model {path} gave {len(given)} scores for {len(pairs)} answers")
    finite = [
        isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in given
    ]
    if pairs and not any(finite):
        raise ValueError(f"reward model {path} gave no finite score for {len(pairs)} answers")
    for i, ok in zip(where, finite):
        if not ok:
            scores[i] = Score(0.0, reason="reward model score not finite")
    where = [i for i, ok in zip(where, finite) if ok]
    raw = [float(s) for s, ok in zip(given, finite) if ok]
    if normalise == "sigmoid":
        values = [1.0 / (1.0 + math.exp(-max(-700.0, min(700.0, s / temperature)))) for s in raw]
    elif normalise == "clip":
        values = [(min(high, max(low, s)) - low) / (high - low) for s in raw]
    else:
        order = sorted(raw)
        n = len(raw)
        values = [
            0.5 if n == 1 else (order.index(s) + (order.count(s) - 1) / 2) / (n - 1) for s in raw
        ]
    for i, value, s in zip(where, values, raw):
        scores[i] = Score(value, parts={"raw": s})
    return [s if s is not None else Score(0.0, reason="no answer") for s in scores]
