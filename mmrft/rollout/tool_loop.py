"""Multi-turn tool rollouts ("thinking with images"): trajectories and the tool loop.

A trajectory is what follows the prompt when the model may call tools between turns::

    prompt row │ turn 1 (model) │ observation 1 │ turn 2 (model) │ … │ last turn (model)
               └──────────────── completion_ids: one token stream ──────────────────┘
    loss mask                1 1 1 … 1        0 0 … 0        1 1 … 1          1 1 … 1

Rules that keep sampler and trainer on the same tokens (the faults other frameworks' users
report: drifting separators, image-count mismatches, unseen late images):

* **Append-only.** The model's tokens are kept exactly as sampled; history is never decoded
  and re-tokenised. The training forward sees the very ids the engine continued from.
* **Observations are the chat template's delta** (:class:`ObservationTemplate`): what the
  template writes after an assistant turn (its close, e.g. ``<|im_end|>\\n``, less the part the
  model sampled itself) then the tool turn with one placeholder block per returned image or
  clip, then the next assistant header. It is tokenised alone with its media by the family
  (:meth:`mmrft.models.family.ModelFamily.observation_row`: the family's own resizing and video
  budget) and appended with loss mask 0 (and token types 1/2 on its placeholders).
* **Calls in the template's syntax.** Turns are read, and scripted calls written, in the
  syntax the chat template writes (:func:`call_syntax`: Qwen's ``<tool_call>`` JSON, or Gemma
  4's ``<|tool_call>call:NAME{…}<tool_call|>``, whose observations are the template's own
  response blocks); a closing tag that is one token also ends a turn.
* **Budgets before media.** An observation joins a trajectory only after the token budget
  (``rollout.tools.max_tokens``) and the media budgets (``max_media``,
  ``max_visual_tokens``) passed; a trajectory they cut ends without it, so no image is ever
  appended to a turn that does not get its placeholders. What a tool returns is bounded
  before it is rendered or tokenised (:func:`mmrft.rollout.tool.run_tool_call`): its text to
  :data:`CHARS_PER_TOKEN` characters per token the trajectory has left (cut, with a note),
  its images and clips to one more than the media the trajectory may still add.
* **Tools in a worker process.** The loop's tools run in its tool worker process
  (:func:`mmrft.rollout.tool.tool_pool`), started at the first call, killed at a call's
  ``timeout_s``, memory-capped; :meth:`ToolLoop.close` stops it (the collector's close, or
  exit).
* **Positions over the final sequence.** The engine continues a trajectory from its whole
  row (:func:`joined_row`) with the family's position function (mRoPE for Qwen-VL), and the
  training forward computes them over the same whole sequence, so turn-k tokens sit where the
  sampler put them.

The loop (:class:`ToolLoop`) is a collector stage: turn 1 is the engine's ordinary
group-shared ``generate`` (one encoding of the original media per group); every later turn
continues all trajectories that called a tool in one batch (:meth:`Engine.continue_rows`).
A trajectory ends (``Trajectory.stop``) with:

==================  ===========================================================================
``answer``          a turn ended without a tool call
``length``          a turn hit its token limit without ending (its call, if any, is not run)
``max_turns``       the last allowed turn still called a tool
``max_tokens``      the next observation would pass ``max_tokens``
``max_media``       the next observation would pass ``max_media`` images and clips
``max_visual_tokens`` … or ``max_visual_tokens``
``env_done``        the environment ended the episode (:mod:`mmrft.rollout.environment`)
``env_lost``        the environment's instance is gone (its worker was stopped by a call)
==================  ===========================================================================

With an environment (``rollout.tools.environment``) the tools are its methods and each
trajectory calls its own instance (:class:`~mmrft.rollout.environment.EnvironmentRunner`), reset
on the sample before turn 1: the reset's observation joins the prompt.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmrft.data import Sample
from mmrft.models.family import TOOLS_ROLE
from mmrft.policy.trajectory import Trajectory, _short, joined_row
from mmrft.rollout.tool import (
    GEMMA4_CALLS,
    QWEN_CALLS,
    WORKER_MEMORY_MB,
    CallSyntax,
    Observation,
    ParseError,
    ToolCall,
    ToolContext,
    ToolSpec,
    run_tool_call,
    tool_pool,
    tool_schemas,
)

log = logging.getLogger(__name__)

STOPS = (
    "answer",
    "length",
    "max_turns",
    "max_tokens",
    "max_media",
    "max_visual_tokens",
    "env_done",
    "env_lost",
)

CHARS_PER_TOKEN = 32
"""Characters of a tool's text kept per token the trajectory has left (before tokenising):
more than any tokenizer of the supported families averages per token, so a text cut by it
would not have fitted anyway, and a tool returning tens of MB costs at most this many
characters per remaining token to render and tokenise."""


# ---------------------------------------------------------------------------------------------
# Observations as the chat template's delta


def template_source(processor: Any) -> str:
    """The chat template text of a processor (or its tokenizer); ``""`` when it has none."""
    for owner in (processor, getattr(processor, "tokenizer", None)):
        template = getattr(owner, "chat_template", None)
        if isinstance(template, str):
            return template
        if isinstance(template, dict):  # named templates
            return "\n".join(str(t) for t in template.values())
    return ""


def renders_tools(processor: Any) -> bool:
    """Whether the processor's chat template writes tool descriptions itself (it reads a
    ``tools`` variable, as ``apply_chat_template(..., tools=...)`` passes it)."""
    return re.search(r"{[{%][^}]*\btools\b", template_source(processor)) is not None


def single_token(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` where the tokenizer holds it as one token, else ``None``."""
    token_id = tokenizer.convert_tokens_to_ids(text)
    if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
        return token_id
    return None


def tools_system_text(schemas: list[dict[str, Any]]) -> str:
    """Qwen's function-calling instructions (the ``# Tools`` block its chat templates write
    from ``tools=``) for a template that has none."""
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def call_syntax(processor: Any, describe: bool = True) -> CallSyntax:
    """The syntax the model writes tool calls in (:class:`~mmrft.rollout.tool.CallSyntax`):
    Gemma 4's ``<|tool_call>call:NAME{...}<tool_call|>`` where the chat template describes
    the tools itself (:func:`renders_tools`) and writes calls as ``<|tool_call>`` (Gemma 4's
    released templates), else Qwen's ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
    (what the Qwen text of :func:`tools_system_text` asks for). ``describe`` off: the data's
    prompts describe the tools (DeepEyes': in Qwen's form), so calls are read in Qwen's."""
    if (
        describe
        and renders_tools(processor)
        and GEMMA4_CALLS.open_tag in template_source(processor)
    ):
        return GEMMA4_CALLS
    return QWEN_CALLS


class ObservationTemplate:
    """The chat template's rendering of tool observations, as text to append (module
    docstring). The observation turn is the template's ``tool`` role when the template knows
    tool responses (Qwen3-VL, Qwen3.5, Gemma 4), else a ``user`` turn whose content wraps each
    response in ``<tool_response>`` … ``</tool_response>`` (the Qwen form; DeepEyes' prompts),
    media first. Checked at construction: the rendered history must be a prefix of the history
    with the observation, and the delta must hold one placeholder block per medium (a
    template whose ``tool`` role drops images, as Gemma 4's first released one does, gets
    the ``user`` turn).

    With a native call syntax (``syntax`` not Qwen's: Gemma 4's) the turn before the
    observation is an assistant message whose calls are ``tool_calls`` (:meth:`call_message`)
    and each observation a ``tool`` message answering its call by id and name, so the template
    writes its own response blocks (Gemma 4: ``<|tool_response>response:NAME{value:…}
    <tool_response|>`` inside the model's turn, no new turn).

    Attributes:
        close: what the template writes after a turn that called tools, before the
            observation (Qwen: the turn's end, ``<|im_end|>\\n``; Gemma 4's calls:
            ``<|tool_response>``).
        end_of_turn: the token that ends a turn without calls (``<|im_end|>``, ``<turn|>``).
        call_end: the token that ends a turn with calls where no stop token did (the first
            of :attr:`close`: ``end_of_turn`` for Qwen's syntax).
        role: ``tool`` or ``user``.

    Raises :class:`~mmrft.typecheck.ConfigError` when the family's template cannot render an
    observation that way.
    """

    MARK = "MMRFT-ASSISTANT-TURN"

    def __init__(self, family: Any, processor: Any, syntax: CallSyntax = QWEN_CALLS) -> None:
        from mmrft.typecheck import ConfigError

        self.family, self.processor, self.syntax = family, processor, syntax
        self.native = syntax.name != QWEN_CALLS.name  # calls as tool_calls, not as text
        self.question = {"role": "user", "content": [{"type": "text", "text": "question"}]}
        # a plain string: GLM-4.1V's template writes a list content of an assistant turn
        # as its Python repr
        answer = self._render([self.question, {"role": "assistant", "content": self.MARK}], False)
        self.answer_close = answer[answer.rindex(self.MARK) + len(self.MARK) :]
        self.close = self.answer_close
        probe_call = [ToolCall("probe", {})]
        if self.native:  # what follows the call's closing tag
            called = self._render(self._history({}, probe_call), False)
            at = called.rfind(syntax.close_tag)
            if at < 0:
                raise ConfigError(
                    f"rollout.tools: the chat template of model family '{family.name}' does "
                    f"not write tool_calls as {syntax.open_tag} … {syntax.close_tag}"
                )
            self.close = called[at + len(syntax.close_tag) :]
        source = template_source(processor)
        roles = ["tool", "user"] if "tool_response" in source else ["user"]
        tokenizer = getattr(processor, "tokenizer", processor)
        # the placeholder the template writes for one image part: what it renders for a user
        # turn with an image, less what it renders for the same turn without it
        image_block = self._image_block()
        problems = []
        for role in roles:
            self.role = role
            probe = Observation(ok=True, text="probe", images=[None, None])  # type: ignore[list-item]
            try:
                text = self.render([probe], calls=probe_call)
            except Exception as exc:  # a template that cannot render the role
                problems.append(f"role '{role}': {type(exc).__name__}: {exc}")
                continue
            if image_block and text.count(image_block) != 2:
                problems.append(f"role '{role}': 2 images gave {text.count(image_block)} blocks")
                continue
            encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
            self.end_of_turn = int(encode(self.answer_close + text)[0])
            self.call_end = int(encode(self.close + text)[0])
            return
        raise ConfigError(
            f"rollout.tools: the chat template of model family '{family.name}' cannot render a "
            f"tool observation ({'; '.join(problems)}); tokenizer {type(tokenizer).__name__}"
        )

    def _render(self, conversation: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.family.render(self.processor, [conversation], generation_prompt)[0]

    def _image_block(self) -> str:
        """The text the template writes for one image part of a user turn (``""`` when it
        cannot tell: the family takes no images)."""

        def user(parts: list[dict[str, Any]]) -> str:
            content = [*parts, {"type": "text", "text": "question"}]
            return self._render([{"role": "user", "content": content}], False)

        try:
            with_image, without = user([{"type": "image"}]), user([])
        except Exception:  # an audio-only family's template
            return ""
        start = next(
            (i for i, (a, b) in enumerate(zip(with_image, without)) if a != b), len(without)
        )
        tail = len(with_image) - len(without)
        return with_image[start : start + tail].strip()

    @staticmethod
    def _names(calls: list[Any] | None, n: int) -> list[str]:
        """The tool name each of ``n`` observations answers: its call's (a
        :class:`~mmrft.rollout.tool.ParseError` where the name could be read), else
        ``unknown`` (the name Gemma 4's template writes for an unnamed response)."""
        calls = list(calls or [])[:n]
        names = [getattr(c, "name", "") or "unknown" for c in calls]
        return names + ["unknown"] * (n - len(names))

    def call_message(self, text: str, calls: list[Any]) -> dict[str, Any]:
        """The assistant message of a turn with ``calls`` (parsed calls or
        :class:`~mmrft.rollout.tool.ParseError`), as a conversation holds it: Qwen's syntax
        ``{"role": "assistant", "content": text}`` (the calls are in the text); a native one
        ``text`` outside the calls as ``content`` and the calls as ``tool_calls`` (ids
        ``call_0``, ``call_1``, …, arguments as parsed), which the template writes back in
        its syntax (what the model wrote, where it wrote it as the template does)."""
        if not self.native:
            return {"role": "assistant", "content": text}
        syntax, outside, pos = self.syntax, [], 0
        while (start := text.find(syntax.open_tag, pos)) >= 0:
            outside.append(text[pos:start])
            end = text.find(syntax.close_tag, start)
            if end < 0:
                pos = len(text)
                break
            pos = end + len(syntax.close_tag)
        outside.append(text[pos:])
        names = self._names(calls, len(calls))
        tool_calls = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": dict(getattr(call, "arguments", {}))},
            }
            for i, (call, name) in enumerate(zip(calls, names))
        ]
        return {"role": "assistant", "content": "".join(outside).strip(), "tool_calls": tool_calls}

    def messages(
        self, observations: list[Observation], calls: list[Any] | None = None
    ) -> list[dict[str, Any]]:
        """The observation turn(s) as chat messages with placeholder media parts; with a
        native call syntax each ``tool`` message answers its call of ``calls`` (by id
        ``call_<i>`` and name)."""

        def media(obs: Observation) -> list[dict[str, Any]]:
            # each with its key: Qwen2-Audio's template tests `'audio' in part`
            return (
                [{"type": "image", "image": ""} for _ in obs.images]
                + [{"type": "video", "video": ""} for _ in obs.videos]
                + [{"type": "audio", "audio": ""} for _ in obs.audios]
            )

        if self.role == "tool" and self.native:
            names = self._names(calls, len(observations))
            return [
                {
                    "role": "tool",
                    "tool_call_id": f"call_{i}",
                    "name": name,
                    "content": [*media(o), {"type": "text", "text": o.text}],
                }
                for i, (o, name) in enumerate(zip(observations, names))
            ]
        if self.role == "tool":
            return [
                {"role": "tool", "content": [*media(o), {"type": "text", "text": o.text}]}
                for o in observations
            ]
        content: list[dict[str, Any]] = []
        for i, obs in enumerate(observations):
            opening = ("\n" if i else "") + "<tool_response>\n"
            content += [{"type": "text", "text": opening}, *media(obs)]
            content.append({"type": "text", "text": obs.text + "\n</tool_response>"})
        return [{"role": "user", "content": content}]

    def render(
        self,
        observations: list[Observation],
        earlier: dict[str, int] | None = None,
        calls: list[Any] | None = None,
    ) -> str:
        """The text that follows the assistant turn's *close*: the observation turn(s) and the
        next assistant header (none where the template continues the model's turn: Gemma 4's
        tool responses). ``earlier``: media parts before them by kind (``image``, ``video``,
        ``audio``), for templates that number media (Qwen2-Audio's "Audio 2:"); ``calls``:
        the turn's calls (a native syntax names each response after its call)."""
        calls = calls if calls is not None else [None] * len(observations)
        history = self._history(earlier or {}, calls)
        before = self._render(history, False)
        full = self._render(history + self.messages(observations, calls), True)
        if not full.startswith(before):
            raise ValueError("the chat template re-renders earlier turns when a tool turn is added")
        return full[len(before) :]

    def _history(self, earlier: dict[str, int], calls: list[Any]) -> list[dict[str, Any]]:
        """The probe history: a user turn holding ``earlier`` media placeholders, then the
        assistant turn that made ``calls`` (Qwen's syntax: a marked text)."""
        media = [
            {"type": kind, kind: ""} for kind in ("image", "video", "audio")
            for _ in range(earlier.get(kind, 0))
        ]  # fmt: skip
        user = {"role": "user", "content": [*media, *self.question["content"]]}
        if self.native:
            return [user, self.call_message("", calls)]
        return [user, {"role": "assistant", "content": self.MARK}]

    def delta(
        self,
        observations: list[Observation],
        sampled_close: str,
        earlier: dict[str, int] | None = None,
        calls: list[Any] | None = None,
    ) -> str:
        """The whole text to append after a turn: the template's close then :meth:`render`,
        less ``sampled_close`` at its start (what the model already wrote of it: its
        end-of-turn token, e.g. ``<|im_end|>``; GLM-4.1V's turns end at the next turn's
        ``<|user|>``, which the template writes as the observation turn's opening; a Gemma 4
        call turn that ended on ``<|tool_response>``)."""
        text = self.close + self.render(observations, earlier, calls)
        if sampled_close and text.startswith(sampled_close):
            text = text[len(sampled_close) :]
        return text

    @staticmethod
    def media_parts(observations: list[Observation]) -> list[dict[str, Any]]:
        """The observations' media as content parts, in placeholder order."""
        parts: list[dict[str, Any]] = []
        for obs in observations:
            parts += [{"type": "image", "image": im} for im in obs.images]
            parts += [clip.part() for clip in obs.videos]
            parts += [clip.part() for clip in obs.audios]
        return parts


# ---------------------------------------------------------------------------------------------
# The loop


@dataclass
class LoopLimits:
    """Per-trajectory budgets (``rollout.tools``): turns, tokens after the prompt, images and
    clips added, visual tokens added (0 = unbounded)."""

    max_turns: int = 5
    max_tokens: int = 0
    max_media: int = 4
    max_visual_tokens: int = 0


class ToolLoop:
    """Multi-turn rollouts with tools, as a collector stage (module docstring).

    Args:
        family / processor: the policy's, for observation rendering and tokenising.
        tools: the enabled tools by name (:func:`mmrft.rollout.tool.enabled_tools`, aliases included).
        limits: the budgets.
        context_kwargs: extra :meth:`ToolContext.from_sample` arguments.
        describe: describe the tools in a system message (:meth:`with_tools`).
        worker_memory_mb: the tool worker's memory cap (MiB beyond what it holds after loading
            the tools; None = no cap), :func:`mmrft.rollout.tool.tool_pool`.

    Attributes:
        schemas: the tools' descriptions :meth:`with_tools` prepends (none when ``describe``
            is off).
        syntax: the syntax calls are read and written in (:func:`call_syntax`: Qwen's, or
            Gemma 4's where the template describes the tools and writes calls so).
        tool_call_token: the id of the syntax's closing tag (``</tool_call>``,
            ``<tool_call|>``) when it is one token (a turn may also end there); ``None``
            otherwise (turns end at end-of-turn).
        counts: what :meth:`metrics` reports, since its last call.
    """

    def __init__(
        self,
        family: Any,
        processor: Any,
        tools: dict[str, ToolSpec],
        limits: LoopLimits,
        context_kwargs: dict[str, Any] | None = None,
        describe: bool = True,
        worker_memory_mb: int | None = WORKER_MEMORY_MB,
        environment: Any = None,
    ) -> None:
        from mmrft.rollout.environment import EnvironmentRunner

        self.env = None if environment is None else EnvironmentRunner(environment, worker_memory_mb)
        if environment is not None:
            tools = environment.tools
        self.family, self.processor, self.tools, self.limits = family, processor, tools, limits
        self.pool = None if environment is not None else tool_pool(tools, worker_memory_mb)
        self.schemas = tool_descriptions(tools, describe)
        self.native_tools = renders_tools(processor)  # the template's tools= (else Qwen's text)
        self.syntax = call_syntax(processor, describe)
        self.template = ObservationTemplate(family, processor, self.syntax)
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.tag_ids = {  # the syntax's tags that are single tokens, by id
            token_id: tag
            for tag in self.syntax.tags
            if (token_id := single_token(self.tokenizer, tag)) is not None
        }
        self.tool_call_token = single_token(self.tokenizer, self.syntax.close_tag)
        self.token_key = family.token_keys[0] if family.token_keys else None
        self.context_kwargs = {**audio_context(family, processor), **(context_kwargs or {})}
        self.counts: Counter = Counter()

    def close(self) -> None:
        """Stop the tool (or environment) worker process, if one started (idempotent; also
        done at exit)."""
        if self.pool is not None:
            self.pool.close()
        if self.env is not None:
            self.env.close()

    # -- prompts -------------------------------------------------------------------------------
    def with_tools(
        self, conversation: list[dict[str, Any]], sample: Sample | None = None
    ) -> list[dict[str, Any]]:
        """``conversation`` with the tools described in a system message (prepended to the
        system message it has): Qwen's function-calling form from the tools' schemas. Unchanged
        when ``describe`` is off or the sample switches tools off (``meta.tools: false``)."""
        return with_tool_descriptions(conversation, sample, self.schemas, self.native_tools)

    # -- one rollout ---------------------------------------------------------------------------
    def run(
        self,
        engine: Any,
        conversations: list[list[dict[str, Any]]],
        samples: list[Sample],
        n: int,
        sampling: Any,
    ) -> Any:
        """``len(conversations) × n`` trajectories, group-contiguous, as
        :class:`~mmrft.rollout.Rollouts` whose ``completion_ids`` are the whole token streams,
        ``texts`` the last turns' texts and ``trajectories`` the :class:`Trajectory` records."""
        import dataclasses
        import time

        from mmrft.rollout.base import Rollouts

        start = time.perf_counter()
        stops = tuple(sampling.stop_token_ids) + (
            (self.tool_call_token,) if self.tool_call_token is not None else ()
        )
        sampling = dataclasses.replace(sampling, stop_token_ids=stops)
        G = len(conversations) * n
        budget = self.limits.max_tokens or self.limits.max_turns * sampling.max_new_tokens + 4096
        base = [ToolContext.from_sample(s, self.family, **self.context_kwargs) for s in samples]
        contexts: list[ToolContext | None] = [_copy_context(base[i // n]) for i in range(G)]
        for i in range(G):  # a sample without tools: its calls are text, the turn an answer
            if not offers_tools(samples[i // n]):
                contexts[i] = None
        trajectories = [Trajectory() for _ in range(G)]
        keys: list[str | None] = [None] * G
        if self.env is not None:  # one instance per trajectory; the reset joins the prompt
            conversations = self._reset(conversations, samples, n, trajectories, keys, budget)
        for i, t in enumerate(trajectories):
            t.prompt_media = media_counts(conversations[i // n])
        first = engine.generate(conversations, n, sampling)
        if first.logprobs is None:
            for t in trajectories:
                t.logprobs = None
        tool_seconds = 0.0
        texts = [""] * G
        truncated = [False] * G
        # turn 1's results, then each later turn's, as (trajectory, ids, logprobs, truncated)
        results = [
            (
                i,
                first.completion_ids[i],
                None if first.logprobs is None else first.logprobs[i],
                first.truncated[i],
            )
            for i in range(G)
        ]
        timings = Counter(first.timings)
        while results:  # every trajectory ends by max_turns at the latest
            continuing = []
            for i, ids, logprobs, cut in results:
                seconds = time.perf_counter()
                if self.step(trajectories[i], contexts[i], ids, logprobs, cut, budget, keys[i]):
                    continuing.append(i)
                elif keys[i] is not None and self.env is not None:
                    self.env.close_keys([keys[i]])
                tool_seconds += time.perf_counter() - seconds
                texts[i], truncated[i] = trajectories[i].turns[-1].text, cut
            if not continuing:
                break
            rows = [
                joined_row(
                    first.prompts[first.prompt_index[i]], trajectories[i], self.family.token_keys
                )
                for i in continuing
            ]
            remaining = min(budget - len(trajectories[i].ids) for i in continuing)
            step = dataclasses.replace(
                sampling, max_new_tokens=max(1, min(sampling.max_new_tokens, remaining))
            )
            more = engine.continue_rows(rows, step)
            for key, value in more.timings.items():
                timings[key] += value
            results = [
                (
                    i,
                    more.completion_ids[k],
                    None if more.logprobs is None else more.logprobs[k],
                    more.truncated[k],
                )
                for k, i in enumerate(continuing)
            ]
        out = Rollouts(prompts=first.prompts, prompt_index=list(first.prompt_index))
        out.completion_ids = [t.ids for t in trajectories]
        out.texts = texts
        out.truncated = truncated
        out.logprobs = (
            None
            if any(t.logprobs is None for t in trajectories)
            else [t.logprobs for t in trajectories]  # type: ignore[misc]
        )
        out.trajectories = trajectories
        # tool_s: the tools and the observations' rendering and tokenising (outside the model)
        out.timings = {**timings, "tool_s": tool_seconds}
        out.seconds = time.perf_counter() - start
        self._count(trajectories)
        return out

    def _reset(
        self,
        conversations: list[list[dict[str, Any]]],
        samples: list[Sample],
        n: int,
        trajectories: list[Trajectory],
        keys: list[str | None],
        budget: int,
    ) -> list[list[dict[str, Any]]]:
        """Reset one environment instance per trajectory (``keys``, ``Trajectory.environment``)
        and return the conversations with each sample's first observation added to its last
        user message. A group's ``n`` resets must give the same observation (the prompt is
        shared); a failed reset stops the run naming the sample."""
        assert self.env is not None
        name = self.env.spec.name
        out = []
        for k, (conversation, sample) in enumerate(zip(conversations, samples)):
            context = ToolContext.from_sample(sample, self.family, **self.context_kwargs)
            limits = (budget * CHARS_PER_TOKEN, self.limits.max_media)
            first: Observation | None = None
            for j in range(n):
                i = k * n + j
                keys[i] = self.env.new_key()
                step = self._start_episode(keys[i], sample, context, limits)
                obs = step.observation
                if first is None:
                    first = obs
                elif not _same_observation(first, obs):
                    raise RuntimeError(
                        f"environment '{name}': reset(sample) gave the trajectories of sample "
                        f"'{sample.id}' different first observations; it must depend on the "
                        "sample only (the first observation is the group's shared prompt: draw "
                        "randomness from a seed in sample.meta)"
                    )
                trajectories[i].environment = {"name": name, "calls": 0, **step.status}
            assert first is not None
            out.append(_with_observation(conversation, first))
        return out

    def _decode(self, ids: list[int]) -> str:
        """The turn's text without special tokens, but with the tool-call tags where they are
        single tokens (InternVL's tokenizer marks ``<tool_call>`` special: skipping it would
        hide every call)."""
        tags = self.tag_ids
        if not tags.keys() & set(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        pieces, run = [], []
        for token in [*ids, None]:
            if token is None or token in tags:
                pieces.append(self.tokenizer.decode(run, skip_special_tokens=True))
                pieces.append(tags.get(token, ""))
                run = []
            else:
                run.append(token)
        return "".join(pieces)

    def example_call(self, sample: Sample) -> str | None:
        """One valid call on ``sample`` (a smoke run's scripted turn): with an environment, the
        first turn of its demonstration for the sample's target; else the first enabled tool,
        by name, whose declared example (:attr:`mmrft.rollout.tool.ToolSpec.example`) gives
        arguments for the sample's media; written in the loop's :attr:`syntax` (Qwen's
        ``<tool_call>{"name", "arguments"}</tool_call>``, Gemma 4's ``<|tool_call>call:…``).
        ``None`` when the sample switches tools off or no tool has an example for it."""
        if not offers_tools(sample):
            return None
        if self.env is not None:  # the first turn of the environment's scripted episode
            demonstrate = self.env.spec.demonstration
            turns = demonstrate(sample, str(sample.target)) if demonstrate else []
            return self.syntax.rewrite(turns[0]) if turns else None
        context = ToolContext.from_sample(sample, self.family, **self.context_kwargs)
        for name in sorted(self.tools):
            example = self.tools[name].example
            if example is None:
                continue
            try:
                arguments = example(context)
            except Exception as exc:  # an example that cannot run here: try the next tool
                log.info("tool %s: no example call on sample %s (%s)", name, sample.id, exc)
                continue
            if arguments is not None:
                return self.syntax.write(name, arguments)
        return None

    def step(
        self,
        t: Trajectory,
        context: ToolContext | None,
        ids: list[int],
        logprobs: list[float] | None,
        cut: bool,
        budget: int,
        key: str | None = None,
    ) -> bool:
        """Append one model turn to ``t``, then run its tool calls and append their
        observation; True when the trajectory continues (else ``t.stop`` says why). A ``None``
        context (the sample has no tools) runs no call. ``key``: the trajectory's environment
        instance, which runs the calls."""
        text = self._decode(ids)
        record = t.add_turn(list(ids), None if logprobs is None else list(logprobs), text, cut)
        if cut:
            t.stop = "length"
            return False
        ended_on_call = self.tool_call_token is not None and ids[-1] == self.tool_call_token
        calls = self.syntax.parse(text, closed_by_stop=ended_on_call) if context else []
        if not calls:
            t.stop = "answer"
            return False
        if len(t.turns) >= self.limits.max_turns:
            t.stop = "max_turns"
            return False
        left = max(0, budget - len(t.ids))  # tokens the observations may still take
        limits = (left * CHARS_PER_TOKEN, max(0, self.limits.max_media - t.media_added))
        if key is not None:
            return self._environment_step(t, context, calls, key, limits, ids, budget)
        observations = [
            run_tool_call(
                c,
                context,
                self.tools,
                pool=self.pool,
                max_text_chars=limits[0],
                max_media=limits[1],
            )
            for c in calls
        ]
        record.calls = [_call_record(c, o) for c, o in zip(calls, observations)]
        t.stop = self._append(t, context, observations, ids, budget, calls)
        return not t.stop

    def _environment_step(
        self,
        t: Trajectory,
        context: ToolContext,
        calls: list[Any],
        key: str,
        limits: tuple[int, int],
        ids: list[int],
        budget: int,
    ) -> bool:
        """The turn's calls on the trajectory's environment instance, in order, until one ends
        the episode (``env_done``) or loses it (``env_lost``); else their observations are
        appended as tools' are."""
        assert self.env is not None and t.environment is not None
        observations = []
        for call in calls:
            if isinstance(call, ParseError):
                obs = Observation.fail(call.reason, f"Tool call refused: {call.message}.")
                status: dict[str, Any] = {}
            else:
                step = self.env.call(key, call, context, limits)
                obs, status = step.observation, step.status
                t.environment["calls"] += 1
            t.environment.update(status)
            observations.append(obs)
            if status.get("done"):
                break
        t.turns[-1].calls = [_call_record(c, o) for c, o in zip(calls, observations)]
        if t.environment.get("lost"):
            t.stop = "env_lost"
        elif t.environment.get("done"):
            t.stop = "env_done"
        else:
            t.stop = self._append(t, context, observations, ids, budget, calls)
        return not t.stop

    def with_start(
        self, conversation: list[dict[str, Any]], sample: Sample
    ) -> list[dict[str, Any]]:
        """The prompt a trajectory of ``sample`` starts from: :meth:`with_tools`, and with an
        environment its reset's observation (an instance reset and closed for it)."""
        conversation = self.with_tools(conversation, sample)
        if self.env is None:
            return conversation
        key = self.env.new_key()
        context = ToolContext.from_sample(sample, self.family, **self.context_kwargs)
        try:
            step = self._start_episode(key, sample, context, (None, self.limits.max_media))
        finally:
            self.env.close_keys([key])
        return _with_observation(conversation, step.observation)

    def _start_episode(
        self, key: str, sample: Sample, context: ToolContext, limits: tuple[int | None, int]
    ) -> Any:
        """Reset the environment's instance ``key`` on ``sample``; a failed reset stops the run
        naming the sample (the episode has no start to show the model)."""
        assert self.env is not None
        step = self.env.reset(key, sample, context, limits)
        if not step.observation.ok:
            raise RuntimeError(
                f"environment '{self.env.spec.name}' could not start an episode on sample "
                f"'{sample.id}': {step.observation.reason}: {step.observation.text}"
            )
        return step

    def demonstration(self, sample: Sample, turns: list[str]) -> Trajectory:
        """The trajectory of scripted turn texts (a warm start's demonstration: e.g. a crop of
        the target, then the answer), built exactly as the loop builds a sampled one: each
        text's calls written in the loop's syntax (scripts write Qwen's form:
        :meth:`~mmrft.rollout.tool.CallSyntax.rewrite`), the text tokenised, the closing tag
        (where it is one token) or the end of turn closing it, its calls run and their
        observations appended (with an environment, on an instance of its own, reset on
        ``sample``: its prompt is :meth:`with_start`'s). No sampler log-probs."""
        end = self.template.end_of_turn
        t = Trajectory(logprobs=None, prompt_media=media_counts(sample.messages))
        context = ToolContext.from_sample(sample, self.family, **self.context_kwargs)
        budget = self.limits.max_tokens or 1 << 30
        key = None
        if self.env is not None:
            key = self.env.new_key()
            step = self._start_episode(key, sample, context, (None, self.limits.max_media))
            t.environment = {"name": self.env.spec.name, "calls": 0, **step.status}
            start = media_counts([{"role": "user", "content": step.observation.content()}])
            t.prompt_media = {k: v + start[k] for k, v in t.prompt_media.items()}
        for text in turns:
            text = self.syntax.rewrite(text)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if self.tool_call_token is None or not ids or ids[-1] != self.tool_call_token:
                ids.append(self.template.call_end if self.syntax.open_tag in text else end)
            if not self.step(t, context, ids, None, False, budget, key):
                break
        if key is not None and self.env is not None:
            self.env.close_keys([key])
        return t

    def _append(
        self,
        t: Trajectory,
        context: ToolContext,
        observations: list[Observation],
        ids: list[int],
        budget: int,
        calls: list[Any],
    ) -> str:
        """Render, tokenise and budget-check the observations of ``calls``; append them to
        ``t`` and their images to ``context``. Returns the stop reason when a budget refuses
        them, ``""``."""
        last = self.tokenizer.decode(ids[-1:], skip_special_tokens=False)
        text = self.template.delta(observations, last, t.media_so_far(), calls)
        parts = self.template.media_parts(observations)
        row = self.family.observation_row(self.processor, text, parts)
        n_images = sum(len(o.images) for o in observations)
        n_videos = sum(len(o.videos) for o in observations)
        n_audios = sum(len(o.audios) for o in observations)
        types = row.get(self.token_key) if self.token_key else None
        visual = int((types != 0).sum()) if types is not None else 0
        limits = self.limits
        if len(t.ids) + len(row["input_ids"]) + 1 > budget:
            return "max_tokens"
        if t.media_added + n_images + n_videos + n_audios > limits.max_media:
            return "max_media"
        if limits.max_visual_tokens and t.visual_tokens + visual > limits.max_visual_tokens:
            return "max_visual_tokens"
        t.add_observation(row, self.token_key)
        t.images += n_images
        t.videos += n_videos
        t.audios += n_audios
        t.visual_tokens += visual
        grids = row.get("image_grid_thw")  # (t, h, w) in patches: the input size of each
        image_at = 0
        for obs in observations:
            for image in obs.images:
                size = None
                if grids is not None and image_at < len(grids):
                    _, h, w = (int(v) for v in grids[image_at])
                    patch = getattr(self.family, "patch_size", 14)
                    size = (w * patch, h * patch)
                context.add_image(image, size)
                image_at += 1
        return ""

    # -- metrics -------------------------------------------------------------------------------
    def _count(self, trajectories: list[Trajectory]) -> None:
        c = self.counts
        for t in trajectories:
            c["trajectories"] += 1
            c["turns"] += len(t.turns)
            c["used_tool"] += int(t.used_tool)
            c[f"stop/{t.stop}"] += 1
            if t.environment is not None:
                c["episodes"] += 1
                c["episode_reward"] += t.environment.get("reward") or 0.0
            for call in t.calls:
                c["calls"] += 1
                c["calls_ok"] += int(call["ok"])
                c[f"calls/{self._call_key(call['name'])}"] += 1
                if not call["ok"]:
                    c[f"failed/{call['reason']}"] += 1

    def _call_key(self, name: str | None) -> str:
        """A call's name as a metric key: an enabled tool's name, ``(unparsed)`` or
        ``(unknown)``. A name the model wrote is untrusted: one metric per name it invents would
        grow the metrics without bound (a run's log had over a thousand such keys)."""
        if not name:
            return "(unparsed)"
        return name if name in self.tools else "(unknown)"

    def metrics(self, prefix: str = "rollout/tools") -> dict[str, float]:
        """Since the last call, and resets: ``turns_mean`` (model turns per trajectory),
        ``use_rate`` (share of trajectories with a successful call), ``call_success``
        (successful / all calls), ``calls_per_trajectory``, and per trajectory
        ``calls/<tool>`` (calls of each enabled tool; ``(unknown)`` and ``(unparsed)`` for the
        rest), ``failed/<reason>`` (failed calls by reason)
        and ``stop/<reason>`` (the share that ended so)."""
        c, self.counts = self.counts, Counter()
        n = c["trajectories"]
        if not n:
            return {}
        out = {
            f"{prefix}/turns_mean": c["turns"] / n,
            f"{prefix}/use_rate": c["used_tool"] / n,
            f"{prefix}/calls_per_trajectory": c["calls"] / n,
        }
        if c["calls"]:
            out[f"{prefix}/call_success"] = c["calls_ok"] / c["calls"]
        if c["episodes"]:  # an environment's: its reward, 0 for an unfinished episode
            out[f"{prefix}/episode_reward"] = c["episode_reward"] / c["episodes"]
        for key, value in c.items():
            if key.startswith(("calls/", "failed/", "stop/")):
                out[f"{prefix}/{key}"] = value / n
        return out


DEMO_CROP_SCALE = 2.0
"""A demonstration crop's side over the target box's longer side (at least)."""

DEMO_CROP_SHARE = 0.25
"""A demonstration crop's side over the image's shorter side (at least): a 4× zoom, so the
crop only has to land within a quarter of the image of the target, a precision a policy that
sees the image at a small pixel budget can reach."""


def demonstration_call(
    sample: Sample, family: Any, tools: list[str], rng: random.Random | None = None
) -> str | None:
    """The tool call of a scripted "look closer" policy on ``sample``, or ``None`` when it
    has no target to look at with the enabled ``tools``:

    * ``meta.target_box`` (pixels of the original image) and ``crop`` or ``image_zoom_in``
      enabled: the square around its centre of side max(``DEMO_CROP_SCALE`` × the box's
      longer side, ``DEMO_CROP_SHARE`` × the image's shorter side, 28 px), shifted inside the
      image, written in the family's box frame (:func:`mmrft.rewards.boxes.from_pixels`, rounded to
      integers); ``meta.zoom_box`` instead, when the sample names the region to crop itself
      (pixels of the original image, taken as it is);
    * ``meta.target_span`` (seconds) and ``video_frames`` enabled: the span widened by 0.25 s
      on each side (within ``meta.duration``), 8 frames (a 1-s interval as ``start_s`` alone,
      the tool's defaults); with ``audio_clip`` enabled, that
      interval of the audio; ``meta.zoom_span`` instead, when the sample names the interval to
      fetch itself (seconds, taken as it is: e.g. a window around a time the question states,
      which a policy can read from the prompt, where the target span cannot be).

    With ``rng`` the region keeps its size and moves to a uniformly random place inside the
    image (pixels, then framed) or the clip (``meta.duration``; the start rounded to 0.1 s):
    a call of the right format that says nothing about where the target is. A crop sample that
    names the places a policy may look (``meta.zoom_choices``: boxes in pixels of the original
    image, one of them the target's) gets one of those instead, uniformly: where one looks on
    such images, never which one.
    """
    from mmrft.rewards.boxes import from_pixels

    meta = dict(sample.meta)
    if meta.get("image_size") and not meta.get("input_size"):  # a sample no family annotated
        meta["input_size"] = list(family.input_size(*(int(v) for v in meta["image_size"])))
    crop = next((n for n in ("crop", "image_zoom_in") if n in tools), None)
    if crop and (meta.get("zoom_box") or meta.get("target_box")) and meta.get("image_size"):
        if meta.get("zoom_box"):
            box = [float(v) for v in meta["zoom_box"]]
        else:
            x1, y1, x2, y2 = (float(v) for v in meta["target_box"])
            width, height = (float(v) for v in meta["image_size"])
            side = max(
                DEMO_CROP_SCALE * max(x2 - x1, y2 - y1), DEMO_CROP_SHARE * min(width, height), 28.0
            )
            side = min(side, width, height)
            cx = min(max((x1 + x2) / 2, side / 2), width - side / 2)
            cy = min(max((y1 + y2) / 2, side / 2), height - side / 2)
            box = [cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2]
        if rng is not None and meta.get("zoom_choices"):
            box = [float(v) for v in rng.choice(meta["zoom_choices"])]
        elif rng is not None:
            width, height = (float(v) for v in meta["image_size"])
            w, h = min(box[2] - box[0], width), min(box[3] - box[1], height)
            x, y = rng.uniform(0.0, width - w), rng.uniform(0.0, height - h)
            box = [x, y, x + w, y + h]
        framed = [round(v) for v in from_pixels(box, family.box_frame, meta)]
        arguments: dict[str, Any] = {"bbox_2d": framed}
        return f'<tool_call>{{"name": "{crop}", "arguments": {json.dumps(arguments)}}}</tool_call>'
    clip = next((n for n in ("video_frames", "audio_clip") if n in tools), None)
    if clip and (meta.get("zoom_span") or meta.get("target_span")):
        if meta.get("zoom_span"):
            start_s, end_s = (float(v) for v in meta["zoom_span"])
        else:
            start, end = (float(v) for v in meta["target_span"])
            duration = float(meta.get("duration") or end + 0.25)
            start_s, end_s = max(0.0, start - 0.25), min(duration, end + 0.25)
        if rng is not None:
            if not meta.get("duration"):  # a random place needs the clip's length
                raise ValueError(
                    f"sample {sample.id!r}: a random demonstration call (warm_start.calls: "
                    "random) on a clip needs meta.duration (seconds); it has none"
                )
            length = min(end_s - start_s, float(meta["duration"]))
            start_s = math.floor(rng.uniform(0.0, float(meta["duration"]) - length) * 10) / 10
            end_s = start_s + length
        arguments = {"start_s": round(start_s, 2), "end_s": round(end_s, 2)}
        if clip == "video_frames" and abs(end_s - start_s - 1.0) < 1e-6:
            # video_frames' defaults (tools/video.py: 1 s from start_s, 8 frames): the short call
            arguments = {"start_s": round(start_s, 2)}
        elif clip == "video_frames":
            arguments["n"] = 8
        return f'<tool_call>{{"name": "{clip}", "arguments": {json.dumps(arguments)}}}</tool_call>'
    return None


def describe_tools(
    conversation: list[dict[str, Any]], schemas: list[dict[str, Any]], native: bool = False
) -> list[dict[str, Any]]:
    """``conversation`` with the tools of ``schemas`` described: with ``native`` (a template
    that writes them, :func:`renders_tools`) by a leading
    :data:`~mmrft.models.family.TOOLS_ROLE` message, so the template's own ``tools=`` branch
    renders them; else in a system message (:func:`tools_system_text`, appended to the system
    message it has, else a new one)."""
    if native:
        # "content": libraries that read every message's content (qwen-vl-utils) find one
        return [{"role": TOOLS_ROLE, "content": "", "tools": schemas}, *conversation]
    text = tools_system_text(schemas)
    if conversation and conversation[0].get("role") == "system":
        first = conversation[0]
        content = first["content"]
        if isinstance(content, str):
            merged: Any = f"{content}\n\n{text}"
        else:
            merged = [*content, {"type": "text", "text": "\n\n" + text}]
        return [{**first, "content": merged}, *conversation[1:]]
    # a plain string: GLM-4.1V's template writes a system message's content as it is
    return [{"role": "system", "content": text}, *conversation]


def tool_descriptions(tools: dict[str, ToolSpec], describe: bool) -> list[dict[str, Any]]:
    """The schemas a prompt describes the enabled ``tools`` with, sorted by name; none when
    ``describe`` is off (the data's prompts describe the tools themselves)."""
    return tool_schemas(sorted(tools), tools) if describe else []


def with_tool_descriptions(
    conversation: list[dict[str, Any]],
    sample: Sample | None,
    schemas: list[dict[str, Any]],
    native: bool = False,
) -> list[dict[str, Any]]:
    """``conversation`` with ``schemas`` described (:func:`describe_tools`); unchanged when there
    are none or ``sample`` switches tools off (:func:`offers_tools`)."""
    if not schemas or not offers_tools(sample):
        return conversation
    return describe_tools(conversation, schemas, native)


def offers_tools(sample: Sample | None) -> bool:
    """Whether the tools are offered for ``sample``: unless its ``meta.tools`` is false (a
    per-row switch, e.g. DeepEyes' no-tool subset)."""
    return sample is None or sample.meta.get("tools", True) is not False


def audio_context(family: Any, processor: Any) -> dict[str, Any]:
    """:meth:`ToolContext.from_sample` arguments of an audio family: the rate of its feature
    extractor (Hz) and the longest clip it takes (:meth:`max_audio_seconds`); none otherwise."""
    extractor = getattr(processor, "feature_extractor", None)
    if extractor is None or not hasattr(family, "max_audio_seconds"):
        return {}
    return {
        "audio_rate": int(extractor.sampling_rate),
        "max_audio_seconds": float(family.max_audio_seconds(processor)),
    }


def media_counts(conversation: list[dict[str, Any]]) -> dict[str, int]:
    """The media parts of ``conversation`` by kind (``image``, ``video``, ``audio``): a part's
    ``type``, else its key, as the chat templates tell them."""
    counts = dict.fromkeys(("image", "video", "audio"), 0)
    for message in conversation:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in counts and isinstance(part, dict):
                kind = next((k for k in counts if k in part or f"{k}_url" in part), None)
            if kind in counts:
                counts[kind] += 1
    return counts


def _same_observation(a: Observation, b: Observation) -> bool:
    """Equal text and media, pixel for pixel."""
    if a.text != b.text or [len(a.images), len(a.videos), len(a.audios)] != [
        len(b.images),
        len(b.videos),
        len(b.audios),
    ]:
        return False
    pairs = list(zip(a.images, b.images))
    pairs += [(x, y) for p, q in zip(a.videos, b.videos) for x, y in zip(p.frames, q.frames)]
    same_audio = all(
        p.sampling_rate == q.sampling_rate and np.array_equal(p.waveform, q.waveform)
        for p, q in zip(a.audios, b.audios)
    )
    return same_audio and all(x.size == y.size and x.tobytes() == y.tobytes() for x, y in pairs)


def _with_observation(
    conversation: list[dict[str, Any]], observation: Observation
) -> list[dict[str, Any]]:
    """``conversation`` with ``observation``'s media and text added to its last user message."""
    out = list(conversation)
    for at in range(len(out) - 1, -1, -1):
        if out[at].get("role") == "user":
            content = out[at]["content"]
            parts = (
                [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
            )
            extra = [p for p in observation.content() if p.get("type") != "text" or p["text"]]
            out[at] = {**out[at], "content": [*parts, *extra]}
            return out
    raise ValueError("a conversation without a user message cannot take an environment's start")


def _copy_context(context: ToolContext) -> ToolContext:
    """A trajectory's own context: the sample's images shared, its own list to append to."""
    import dataclasses

    return dataclasses.replace(
        context, images=list(context.images), input_sizes=list(context.input_sizes)
    )


def _call_record(call: Any, obs: Observation) -> dict[str, Any]:
    if isinstance(call, ParseError):
        name, arguments = "", call.raw
    else:
        name = call.name
        try:
            arguments = json.dumps(call.arguments, ensure_ascii=False, allow_nan=True)
        except (TypeError, ValueError):
            arguments = repr(call.arguments)
    return {
        "name": name,
        "arguments": _short(arguments),
        "ok": obs.ok,
        "reason": obs.reason,
        "text": _short(obs.text),
        "images": len(obs.images),
        "videos": len(obs.videos),
        "audios": len(obs.audios),
        "info": obs.info,
    }
