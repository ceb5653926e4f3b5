"""Rewards from a model (:mod:`mmrft.rewards.judges`: an HTTP endpoint or a local model).

* ``judge``: a judge grades the answer against the question and the reference;
* ``caption_qa``: CapRL's reward (CapRL, 2025): a text-only judge answers
  the sample's questions from the policy's caption alone; the reward is its accuracy.
"""

from __future__ import annotations

import string
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mmrft.data import Sample
from mmrft.rewards import Score, verifier
from mmrft.rewards.answers import normalise_text, parse_number, tagged_answer
from mmrft.rewards.judges import (
    DEFAULT_TEMPLATE,
    HTTPJudge,
    JudgeUnavailable,
    Reply,
    Request,
    build_backend,
    cache_key,
    check_params,
    check_template,
    current_cache,
    quote,
    render,
    verdict_rule,
)

T = TypeVar("T")

CAPTION_TEMPLATE = (
    "Here is a description of an image:\n\n{caption}\n\nUsing only this description, answer the "
    "question.\nQuestion: {question}\n{options}"
)


_BACKENDS: dict[tuple[Any, ...], Any] = {}
"""The judge of each verifier configuration (backend and parameters) in this process: one
HTTP client (connection pool, rate limit, gate) for every batch it scores, not one per batch."""


def _client(backend: str, **params: Any) -> Any:
    """The backend with the parameters that apply to it, built once per configuration
    (``ValueError`` naming what is missing or out of range). Every number of the verifier is
    checked, whichever backend uses it (:data:`mmrft.rewards.judges.PARAM_RANGES`)."""
    check_params(params)
    if backend == "http":
        if not params["base_url"] or not params["model"]:
            raise ValueError("backend http needs base_url (…/v1) and model")
        keep = ("base_url", "model", "api_key_env", "concurrency", "timeout_s", "budget_s")
        keep += ("retries", "rpm", "tpm", "max_tokens")
    elif backend == "local":
        if not params["path"]:
            raise ValueError("backend local needs path (a model folder or hub id)")
        keep = ("path", "device", "batch_size", "max_tokens")
    else:
        raise ValueError(f"backend '{backend}': choose http or local")
    key = (backend, *((k, params[k]) for k in keep))
    if key not in _BACKENDS:
        _BACKENDS[key] = build_backend(backend, {k: params[k] for k in keep})
    return _BACKENDS[key]


def _ask(client: Any, requests: dict[str, Request], labels: list[str] | None) -> dict[str, Reply]:
    """One reply per distinct request from a local judge (label probabilities when ``labels``
    is given); raises :class:`JudgeUnavailable`, naming the endpoint, when every call failed."""
    keys = list(requests)
    if not keys:
        return {}
    batch = [requests[k] for k in keys]
    replies = client.label_probabilities(batch, labels) if labels else client.complete(batch)
    return _answered(client, keys, replies)


async def _ask_http(client: HTTPJudge, requests: dict[str, Request]) -> dict[str, Reply]:
    """:func:`_ask` for an HTTP judge, awaited on the caller's event loop."""
    keys = list(requests)
    if not keys:
        return {}
    return _answered(client, keys, await client.acomplete([requests[k] for k in keys]))


def _answered(client: Any, keys: list[str], replies: list[Reply]) -> dict[str, Reply]:
    """The replies by key; :class:`JudgeUnavailable` when every one of them failed."""
    failures = [r.error for r in replies if r.error is not None]
    if len(failures) == len(keys):
        raise JudgeUnavailable(
            f"every call to judge {client.name} failed ({len(keys)} calls; "
            f"{max(set(failures), key=failures.count)})"
        )
    return dict(zip(keys, replies))


async def _then(replies: Awaitable[dict[str, Reply]], finish: Callable[[dict], T]) -> T:
    """``finish(await replies)``: the HTTP backend's verifier result, awaited by the reward."""
    return finish(await replies)


def _finish(
    client: Any,
    requests: dict[str, Request],
    finish: Callable[[dict[str, Reply]], T],
    labels: list[str] | None = None,
) -> T | Awaitable[T]:
    """``finish(replies)`` of the requests: an awaitable for an HTTP judge (an async verifier,
    awaited on the reward's event loop), the result itself for a local one."""
    if isinstance(client, HTTPJudge):
        return _then(_ask_http(client, requests), finish)
    return finish(_ask(client, requests, labels))


def _judged_text(completion: str, answer_tag: str, max_chars: int) -> tuple[str | None, str | None]:
    """What the judge reads of a completion: its ``<answer_tag>`` content (without a tag, the
    whole completion); ``(None, reason)`` when it has none or when that text is over
    ``max_chars`` (``judge answer too long``)."""
    text, reason = tagged_answer(completion, answer_tag)
    if text is not None and len(text) > max_chars:
        return None, "judge answer too long"
    return text, reason


@verifier("judge", low=0.0, high=1.0, isolate=False)
def judge(
    completions: list[str],
    samples: list[Sample],
    *,
    backend: str = "http",
    base_url: str = "",
    model: str = "",
    api_key_env: str = "",
    path: str = "",
    device: str = "cpu",
    template: str = DEFAULT_TEMPLATE,
    verdict: Any = "tag",
    answer_tag: str = "answer",
    max_answer_chars: int = 1000,
    media: bool = False,
    concurrency: int = 8,
    timeout_s: float = 60.0,
    budget_s: float = 600.0,
    retries: int = 3,
    rpm: int = 0,
    tpm: int = 0,
    max_tokens: int = 256,
    batch_size: int = 8,
    cache: bool = True,
) -> list[Score] | Awaitable[list[Score]]:
    """A judge's verdict on each answer, mapped to [0, 1]. Range [0, 1].

    The answer is the completion's ``<answer_tag>`` content (``answer_tag: ""``: the whole
    completion), at most ``max_answer_chars`` characters (longer → 0, ``judge answer too long``,
    as DeepEyes caps answers against judge hacking), quoted as data into ``template``
    (``{question}``, ``{target}``, ``{answer}``), with the sample's images when ``media``.
    ``verdict``: a verdict rule (mmrft.rewards.judges.VerdictRule) kind or mapping (``tag`` of 0–10 by
    default; ``{kind: label, labels: {yes: 1, no: 0}}``; ``{kind: json, field: score, low: 1,
    high: 5}``; ``{kind: prob, labels: {yes: 1, no: 0}}`` for a local judge). ``backend: http``
    takes ``base_url`` (…/v1), ``model``, ``api_key_env`` (the *name* of the environment variable
    holding the key), ``concurrency``, ``timeout_s`` per attempt, ``budget_s`` per batch,
    ``retries``, ``rpm`` / ``tpm``, ``max_tokens``; ``backend: local`` takes ``path``, ``device``,
    ``batch_size``, ``max_tokens``. Every number is range-checked at start-up
    (``mmrft.rewards.judges.PARAM_RANGES``: ``timeout_s`` in (0, 3600] seconds per attempt,
    request to the end of the body; ``budget_s`` in (0, 86400]; ``retries`` 0–20;
    ``concurrency`` 1–1024; ``max_answer_chars`` 1–1,000,000; ...), ``base_url`` must be
    http(s) without credentials. A reply body over 1 MB is not read further (``judge
    response_too_large``). Verdicts are cached (``cache``) in the run directory, replies
    scrubbed of keys; a failed call scores 0 with ``judge <why>``; if every call of a batch
    fails, the run stops.
    With ``backend: http`` this is an async verifier (it returns the awaitable of its
    requests, awaited on the reward's event loop); with ``backend: local`` a sync one.
    """
    rule = verdict_rule(verdict)
    check_template(template)
    if rule.kind == "prob" and backend != "local":
        raise ValueError("verdict kind 'prob' needs backend local (the judge's log-probs)")
    client = _client(**{k: v for k, v in locals().items() if k not in ("completions", "samples")})
    scores: list[Score | None] = [None] * len(completions)
    waiting: dict[str, list[int]] = {}  # cache key → the completions that need that verdict
    requests: dict[str, Request] = {}
    store = current_cache() if cache else None
    identity = f"judge:{backend}:{base_url or path}:{model}:{rule}"
    for i, (completion, sample) in enumerate(zip(completions, samples)):
        answer, reason = _judged_text(completion, answer_tag, max_answer_chars)
        if answer is None:
            scores[i] = Score(0.0, reason=reason)
            continue
        text = render(template, sample.text(), sample.target, answer)
        images = sample.media("image") if media else []
        key = cache_key(identity, template, text, "\n".join(images))
        known = store.get(key) if store is not None else None
        if known is not None:
            scores[i] = Score(known["score"])
            continue
        waiting.setdefault(key, []).append(i)
        requests[key] = Request(text, images)

    def finish(replies: dict[str, Reply]) -> list[Score]:
        fresh = []
        for key, reply in replies.items():
            if reply.error is not None:
                score, reason = None, f"judge {reply.error}"
            elif reply.scores is not None:
                expected = sum(p * rule.labels[label] for label, p in reply.scores.items())
                score, reason = min(1.0, max(0.0, expected)), None
            else:
                score, why = rule.parse(reply.text or "")
                reason = f"judge unparsable: {why}" if why else None
            if score is not None:
                fresh.append({"key": key, "score": score, "reply": reply.text})
            for i in waiting[key]:
                scores[i] = Score(score) if score is not None else Score(0.0, reason=reason)
        if store is not None:
            store.put(fresh)
        return [s if s is not None else Score(0.0, reason="judge no verdict") for s in scores]

    return _finish(client, requests, finish, list(rule.labels) if rule.kind == "prob" else None)


def questions_of(sample: Sample) -> list[dict[str, Any]]:
    """The questions a caption is scored on: ``meta.questions`` (a list of ``{question,
    options?, answer}``), else the sample's own question, options (``meta.choices``) and target."""
    listed = sample.meta.get("questions")
    if isinstance(listed, list) and listed:
        return [q for q in listed if isinstance(q, dict) and "question" in q and "answer" in q]
    return [
        {"question": sample.text(), "options": sample.meta.get("choices"), "answer": sample.target}
    ]


def _question_prompt(caption: str, question: dict[str, Any]) -> tuple[str, list[str], str]:
    """The judge's message for one question, the option letters (empty for an open question)
    and the right answer (a letter, or the reference text)."""
    options = [str(o) for o in question.get("options") or []]
    letters = list(string.ascii_uppercase[: len(options)])
    if options:
        listing = "Options:\n" + "\n".join(f"{k}. {o}" for k, o in zip(letters, options))
        listing += "\nReply with the letter of the right option alone."
        answer = str(question["answer"])
        right = letters[options.index(answer)] if answer in options else answer.strip().upper()
    else:
        listing, right = "Reply with the answer alone, in a few words.", str(question["answer"])
    text = CAPTION_TEMPLATE.format(
        caption=quote(caption), question=question["question"], options=listing
    )
    return text, letters, right


def _correct(reply: Reply, letters: list[str], right: str) -> float | None:
    """1/0 for a reply to one question (the probability of the right letter for label
    probabilities), ``None`` when the reply holds no single answer."""
    if reply.scores is not None:
        return reply.scores.get(right, 0.0)
    text = (reply.text or "").strip()
    if letters:
        found = {c for c in letters if c in text.replace(".", " ").replace(")", " ").split()}
        return float(found == {right}) if len(found) == 1 else None
    number, target = parse_number(text)[0], parse_number(right)[0]
    if number is not None and target is not None:
        return float(abs(number - target) <= 1e-6 * max(1.0, abs(target)))
    return float(normalise_text(text) == normalise_text(right)) if text else None


@verifier("caption_qa", low=0.0, high=1.0, isolate=False)
def caption_qa(
    completions: list[str],
    samples: list[Sample],
    *,
    backend: str = "http",
    base_url: str = "",
    model: str = "",
    api_key_env: str = "",
    path: str = "",
    device: str = "cpu",
    answer_tag: str = "",
    max_answer_chars: int = 4000,
    concurrency: int = 8,
    timeout_s: float = 60.0,
    budget_s: float = 600.0,
    retries: int = 3,
    rpm: int = 0,
    tpm: int = 0,
    max_tokens: int = 16,
    batch_size: int = 8,
    cache: bool = True,
) -> list[Score] | Awaitable[list[Score]]:
    """CapRL: the share of the sample's questions a text-only judge answers right from the
    caption alone (the completion, or its ``<answer_tag>`` content). Range [0, 1].

    Questions: ``meta.questions`` or the sample's own (:func:`questions_of`); multiple choice is
    answered by letter, open questions compared as numbers or normalised text. A local judge
    scores multiple choice by the probability of the right letter among the letters. Backend
    parameters as ``judge``'s. A caption over ``max_answer_chars`` scores 0 (``judge answer too
    long``), as does a reply without one answer (``judge unparsable``) or a failed call.
    Async with ``backend: http``, sync with ``backend: local`` (as ``judge``).
    """
    client = _client(**{k: v for k, v in locals().items() if k not in ("completions", "samples")})
    store = current_cache() if cache else None
    identity = f"caption_qa:{backend}:{base_url or path}:{model}"
    scores: list[Score | None] = [None] * len(completions)
    plans: dict[int, list[tuple[str, list[str], str]]] = {}
    requests: dict[str, Request] = {}
    probabilities: dict[str, list[str]] = {}
    for i, (completion, sample) in enumerate(zip(completions, samples)):
        caption, reason = _judged_text(completion, answer_tag, max_answer_chars)
        if caption is None:
            scores[i] = Score(0.0, reason=reason)
            continue
        plans[i] = []
        for question in questions_of(sample):
            text, letters, right = _question_prompt(caption.strip(), question)
            key = cache_key(identity, CAPTION_TEMPLATE, text, right)
            plans[i].append((key, letters, right))
            if store is not None and store.get(key) is not None:
                continue
            requests[key] = Request(text)
            if backend == "local" and letters:
                probabilities[key] = letters
    asked = {k: r for k, r in requests.items() if k not in probabilities}

    def finish(replies: dict[str, Reply]) -> list[Score]:
        by_letters: dict[tuple[str, ...], dict[str, Request]] = {}
        for key, letters in probabilities.items():  # a local judge's letter probabilities
            by_letters.setdefault(tuple(letters), {})[key] = requests[key]
        for letters, group in by_letters.items():
            replies.update(_ask(client, group, list(letters)))
        fresh = []
        for i, plan in plans.items():
            values, reason = [], None
            for key, letters, right in plan:
                known = store.entries.get(key) if store is not None else None
                if known is not None:
                    values.append(known["score"])
                    continue
                reply = replies[key]
                value = None if reply.error else _correct(reply, letters, right)
                if value is None:
                    reason = (
                        f"judge {reply.error}" if reply.error else "judge unparsable: no one answer"
                    )
                    values.append(0.0)
                    continue
                fresh.append({"key": key, "score": value, "reply": reply.text})
                values.append(value)
            mean = sum(values) / len(values) if values else 0.0
            scores[i] = Score(mean, reason=reason if mean <= 0.0 else None)
        if store is not None:
            store.put(fresh)
        return [s if s is not None else Score(0.0, reason="no questions") for s in scores]

    return _finish(client, asked, finish)
