"""Gemma 4's native tool calls: ``<|tool_call>call:NAME{args}<tool_call|>`` read and written
(:class:`mmrft.rollout.tool.Gemma4Calls`), and whole tool rollouts of the tiny Gemma 4 under
Gemma 4's released chat templates (copies ship with TRL, a dev dependency: read from its
folder, not imported).

The tiny Gemma 4's tokenizer has no tool tokens; the rollout tests add Gemma 4's
(``<|tool_call>``, ``<tool_call|>``, ``<|"|>``, …, single special tokens as in the released
tokenizer) and grow the model's embeddings to match, so a call turn stops on ``<tool_call|>``
as a real checkpoint's does.
"""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

import pytest
import torch
from helpers import ScriptedEngine, zoom_sample
from test_tool_families import check_sampler_equals_trainer, encode, family_box, load

from mmrft.rollout.base import Sampling
from mmrft.rollout.tool import (
    GEMMA4_CALLS,
    MAX_CALL_BYTES,
    MAX_NESTING,
    QWEN_CALLS,
    ParseError,
    ToolCall,
    ToolContext,
    enabled_tools,
    parse_tool_calls,
    run_tool_call,
    validate_arguments,
)
from mmrft.rollout.tool_loop import LoopLimits, ToolLoop, call_syntax

Q = '<|"|>'


def calls(text: str, **kwargs) -> list:
    return GEMMA4_CALLS.parse(text, **kwargs)


def reasons(text: str, **kwargs) -> list:
    return [getattr(c, "reason", "ok") for c in calls(text, **kwargs)]


def call(body: str) -> str:
    return f"<|tool_call>{body}<tool_call|>"


# -- reading native calls ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "arguments"),
    [
        ("call:crop{bbox_2d:[10,20,30,40]}", {"bbox_2d": [10, 20, 30, 40]}),
        ("call:f{}", {}),
        ("call:f{ }", {}),
        # strings hold quotes, commas, braces, colons, brackets, newlines as text
        (f'call:f{{q:{Q}say "hi", {{x}}: [y]\nz{Q}}}', {"q": 'say "hi", {x}: [y]\nz'}),
        (f"call:f{{q:{Q}}}{Q},n:1}}", {"q": "}", "n": 1}),
        (f"call:f{{e:{Q}{Q}}}", {"e": ""}),
        (
            "call:f{a:42,b:-7,c:1.5,d:-2.5e3,e:1E-05,f:0,t:true,u:false,v:null}",
            dict(a=42, b=-7, c=1.5, d=-2500.0, e=1e-05, f=0, t=True, u=False, v=None),
        ),
        (
            f"call:f{{nested:{{k:{Q}v{Q},deeper:{{n:[1,{{m:true}}]}}}},items:[{Q}a{Q},1,[],[2,[3]]]}}",
            {
                "nested": {"k": "v", "deeper": {"n": [1, {"m": True}]}},
                "items": ["a", 1, [], [2, [3]]],
            },
        ),
        # whitespace between tokens, keys between <|"|> (the template's declarations quote them)
        (f" call:f {{ a : 1 , {Q}b c{Q} : [ 1 , 2 ] }} ", {"a": 1, "b c": [1, 2]}),
        (
            "call:image_zoom_in{bbox_2d:[1,2,3,4],image_index:1}",
            {"bbox_2d": [1, 2, 3, 4], "image_index": 1},
        ),
    ],
)
def test_native_calls_are_read(body, arguments):
    [parsed] = calls("I look closer. " + call(body) + " then answer")
    assert parsed == ToolCall(body.strip()[5 : body.strip().index("{")].strip(), arguments)
    assert all(type(parsed.arguments.get(k)) is type(v) for k, v in arguments.items())


def test_several_calls_and_text_between():
    text = "a" + call("call:up{}") + " b " + call(f"call:say{{t:{Q}x{Q}}}") + "<turn|>"
    assert calls(text) == [ToolCall("up", {}), ToolCall("say", {"t": "x"})]
    assert calls("no calls here") == [] and calls(call("call:f{}").replace("|", "")) == []


def test_the_syntaxes_do_not_read_each_other():
    qwen = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3, 4]}}</tool_call>'
    gemma = call("call:crop{bbox_2d:[1,2,3,4]}")
    assert calls(qwen) == [] and parse_tool_calls(gemma) == []
    assert parse_tool_calls(gemma, syntax=GEMMA4_CALLS) == calls(gemma) == QWEN_CALLS.parse(qwen)


@pytest.mark.parametrize(
    ("text", "expected", "says"),
    [
        (call("call:f{a:b}"), ["bad_json"], "'b' is not a value"),
        (call('call:f{a:"b"}'), ["bad_json"], "is not a value"),
        (call(f"call:f{{a:{Q}b}}"), ["bad_json"], "is not closed"),  # <|"|> unbalanced
        (call(f"call:f{{a:{Q}b{Q}{Q}}}"), ["bad_json"], "expected ',' or '}'"),
        (call("call:f{a:1,}"), ["bad_json"], "expected a key"),
        (call("call:f{a:1 b:2}"), ["bad_json"], "expected ',' or '}'"),
        (call("call:f{a:[1 2]}"), ["bad_json"], "expected ',' or ']'"),
        (call("call:f{a:1}}"), ["bad_json"], "text after"),
        (call("call:f{a:1} trailing"), ["bad_json"], "text after"),
        (call("call:f{a 1}"), ["bad_json"], "expected ':'"),
        (call("call:f{:1}"), ["bad_json"], "expected a key"),
        (call("call:f{a:}"), ["bad_json"], "expected a value"),
        (call("call:f{a:01}"), ["bad_json"], "is not a value"),
        (call("call:f"), ["bad_json"], "no {arguments}"),
        (call("call:{a:1}"), ["bad_json"], "tool name"),
        (call("call:two words{}"), ["bad_json"], "tool name"),
        (call("call:" + "n" * 65 + "{}"), ["bad_json"], "tool name"),
        (call('{"name": "crop", "arguments": {}}'), ["bad_json"], "call:<tool name>"),
        (call("hello"), ["bad_json"], "call:<tool name>"),  # garbage between the tags
        (call(""), ["bad_json"], "call:<tool name>"),
        (call("call:f{a:" + "9" * 5000 + "}"), ["bad_json"], "cannot be read"),
        ("<|tool_call>call:f{a:1}", ["unterminated_tag"], "no <tool_call|>"),
        ("<|tool_call>call:f{a:1}<|tool_call>call:g{}<tool_call|>", ["unterminated_tag", "ok"], ""),
        ("<|tool_call><|tool_call><|tool_call>", ["unterminated_tag"] * 3, ""),
        (call("call:f{}") * 12, ["ok"] * 8 + ["too_many_calls"], "at most 8"),
        (call("call:f{a:" + Q + "x" * (MAX_CALL_BYTES + 1) + Q + "}"), ["payload_too_large"], ""),
        (call("call:f{a:" + Q + "é" * (MAX_CALL_BYTES // 2) + Q + "}"), ["payload_too_large"], ""),
    ],
)
def test_hostile_native_calls_are_reasons_not_exceptions(text, expected, says):
    got = calls(text)
    assert [getattr(c, "reason", "ok") for c in got] == expected, got
    if says:
        assert says in got[-1].message, got[-1].message
    for c in got:
        if isinstance(c, ParseError):
            assert len(c.raw) <= 200


def test_deep_nesting_is_refused_without_recursion():
    for opener in ("[", "{a:"):
        body = "call:f{a:" + opener * 6000
        assert reasons(call(body[:MAX_CALL_BYTES])) == ["bad_json"]
        [deep] = calls(call(body[:MAX_CALL_BYTES]))
        assert f"deeper than {MAX_NESTING}" in deep.message
    fits = "call:f{a:" + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1) + "}"
    assert reasons(call(fits)) == ["ok"]
    over = "call:f{a:" + "[" * MAX_NESTING + "]" * MAX_NESTING + "}"
    assert reasons(call(over)) == ["bad_json"]


def test_a_call_cut_by_its_stop_token_is_read():
    cut = "<|tool_call>call:rotate{angle:180}"
    assert calls(cut, closed_by_stop=True) == [ToolCall("rotate", {"angle": 180})]
    assert reasons(cut) == ["unterminated_tag"]


def test_a_call_thought_about_in_the_reasoning_channel_is_not_a_call():
    text = "<|channel>thought\nI could <|tool_call> zoom in, but no.<channel|><answer>red</answer>"
    assert calls(text) == []
    closed = f"<|channel>thought\n{call('call:f{}')}<channel|>"
    assert calls(closed) == [ToolCall("f", {})]


def test_non_finite_numbers_parse_and_the_argument_check_refuses_them():
    [nan] = calls(call("call:crop{bbox_2d:[NaN,1,2,Infinity]}"))
    assert math.isnan(nan.arguments["bbox_2d"][0]) and nan.arguments["bbox_2d"][3] == math.inf
    schema = enabled_tools(["crop"])["crop"].parameters
    with pytest.raises(Exception, match="finite"):
        validate_arguments(nan.arguments, schema)


def test_random_text_never_raises():
    """Fuzz: strings drawn from the grammar's pieces, tags included; every call is a
    ToolCall or a ParseError with a known reason."""
    pieces = ["<|tool_call>", "<tool_call|>", "call:", "f", "{", "}", "[", "]", ":", ",", Q, "1",
              "-", ".", "e", "true", "null", " ", "\n", '"', "<channel|>", "x" * 50]  # fmt: skip
    rng = random.Random(0)
    known = {"bad_json", "payload_too_large", "unterminated_tag", "too_many_calls"}
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
        for closed in (False, True):
            for c in calls(text, closed_by_stop=closed, max_call_bytes=200):
                assert isinstance(c, ToolCall) or c.reason in known, (text, c)


# -- writing native calls -----------------------------------------------------------------------
def test_written_calls_read_back():
    arguments = {"bbox_2d": [1, 2.5, 3, 4], "Z": 'a "b", }', "image_index": 0,
                 "o": {"B": True, "a": None}, "e": []}  # fmt: skip
    text = GEMMA4_CALLS.write("crop", arguments)
    assert text.startswith(
        "<|tool_call>call:crop{bbox_2d:[1,2.5,3,4],e:[],image_index:0,o:{a:null,B:true},Z:"
    )
    assert calls(text) == [ToolCall("crop", arguments)]
    qwen = QWEN_CALLS.write("crop", {"bbox_2d": [1, 2, 3, 4]})
    assert qwen == '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3, 4]}}</tool_call>'
    assert QWEN_CALLS.parse(qwen) == [ToolCall("crop", {"bbox_2d": [1, 2, 3, 4]})]


def test_scripted_qwen_calls_are_rewritten_in_the_native_syntax():
    """Demonstrations, environments' scripted episodes and smoke calls are written in Qwen's
    form; a Gemma 4 loop rewrites their calls (an unreadable one is left as it is)."""
    text = (
        'I zoom. <tool_call>{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3, 4]}}</tool_call>'
        ' <tool_call>{"name": "up"}</tool_call> <tool_call>{oops</tool_call>'
    )
    assert GEMMA4_CALLS.rewrite(text) == (
        "I zoom. <|tool_call>call:crop{bbox_2d:[1,2,3,4]}<tool_call|>"
        " <|tool_call>call:up{}<tool_call|> <tool_call>{oops</tool_call>"
    )
    assert QWEN_CALLS.rewrite(text) == text


# -- whole rollouts under the released templates ------------------------------------------------
# Gemma 4's tool and reasoning tokens: single special tokens of the released tokenizer
TOOL_TOKENS = ("<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
               "<tool_response|>", Q, "<|channel>", "<channel|>")  # fmt: skip


def released_template(name: str) -> str:
    """A Gemma 4 chat template as released (TRL's copy, read from its package folder)."""
    spec = importlib.util.find_spec("trl")
    path = Path(spec.origin).parent / "chat_templates" / name if spec and spec.origin else None
    if path is None or not path.is_file():
        pytest.skip(f"Gemma 4's released chat template ({name}) ships with TRL, not installed")
    return path.read_text()


@pytest.fixture(scope="module")
def gemma4():
    """The tiny Gemma 4 with Gemma 4's tool tokens added (embeddings grown to match)."""
    from tokenizers import AddedToken

    policy = load("tiny-gemma4")
    tokenizer = policy.tokenizer
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in TOOL_TOKENS], special_tokens=True
    )
    torch.manual_seed(0)
    policy.model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    bundled = policy.processor.chat_template
    yield policy
    policy.processor.chat_template = bundled


def native_run(policy, template: str):
    """(loop, out, conversation, call ids, answer ids, box): a crop → answer trajectory and an
    answer-at-once one of zoom_marks sample 0 under ``template``."""
    policy.processor.chat_template = template
    loop = ToolLoop(policy.family, policy.processor, enabled_tools(["crop"]), LoopLimits())
    sample = zoom_sample(0)
    box = family_box(policy, sample)
    call_ids = encode(policy, GEMMA4_CALLS.write("crop", {"bbox_2d": box}))
    answer = encode(policy, "<answer>red</answer>") + [loop.template.end_of_turn]
    engine = ScriptedEngine(policy, [[call_ids, answer], [answer]], group_shared=True)
    conversation = loop.with_tools([dict(m) for m in sample.messages])
    out = loop.run(
        engine, [conversation], [sample], 2, Sampling(max_new_tokens=96, temperature=1.0)
    )
    return loop, out, conversation, call_ids, answer, box


@pytest.mark.parametrize(
    ("template", "role"),
    [("gemma4.jinja", "user"), ("gemma4_v4.jinja", "tool"), ("gemma4_v5.jinja", "tool")],
)
def test_a_native_rollout_is_the_templates_rendering(gemma4, template, role):
    """The call is Gemma 4's, stops on <tool_call|>, and the stream (prompt + trajectory)
    equals the processor's rendering of the final conversation: the assistant message with
    ``tool_calls``, the crop's ``tool`` message (Gemma 4's ``<|tool_response>response:crop{…}
    <tool_response|>`` in the model's turn, the crop's ``<|image|>`` after it: the templates
    from 905e84b on; the first released template writes a tool message's text only, so the
    crop comes in a user turn), then the answer; sampler = trainer log-probs."""
    policy = gemma4
    loop, out, conversation, call_ids, answer, box = native_run(policy, released_template(template))
    try:
        assert loop.syntax is GEMMA4_CALLS and call_syntax(policy.processor) is GEMMA4_CALLS
        assert loop.tool_call_token == policy.tokenizer.convert_tokens_to_ids("<tool_call|>")
        assert call_ids[-1] == loop.tool_call_token and loop.template.role == role
        assert loop.template.close == "<|tool_response>"
        first, second = out.trajectories
        assert [t.stop for t in out.trajectories] == ["answer", "answer"]
        assert first.calls[0]["ok"] and first.calls[0]["name"] == "crop", first.calls
        assert first.images == 1 and second.images == 0
        prompt = policy.tokenizer.decode(out.prompts[0]["input_ids"])
        assert "<|tool>declaration:crop{" in prompt and "# Tools" not in prompt
        # the final conversation, its crop as the observation's image
        text = loop._decode(call_ids)
        parsed = loop.syntax.parse(text)
        assert parsed == [ToolCall("crop", {"bbox_2d": box})]
        context = ToolContext.from_sample(zoom_sample(0), policy.family)
        observation = run_tool_call(parsed[0], context, loop.tools)
        [crop] = observation.images
        messages = loop.template.messages([observation], parsed)
        for message in messages:
            message["content"] = [
                {"type": "image", "image": crop} if part.get("type") == "image" else part
                for part in message["content"]
            ]
        history = [
            *conversation,
            loop.template.call_message(text, parsed),
            *messages,
            {"role": "assistant", "content": "<answer>red</answer>"},
        ]
        whole = policy.family.prepare(policy.processor, [history], add_generation_prompt=False)
        expected = policy.tokenizer.decode(whole["input_ids"][0][whole["attention_mask"][0].bool()])
        stream = policy.tokenizer.decode(
            torch.cat([out.prompts[0]["input_ids"], torch.tensor(first.ids)])
        )
        at = next((i for i, (a, b) in enumerate(zip(stream, expected)) if a != b), len(stream))
        assert at == len(stream), (stream[at - 80 : at + 80], expected[at - 80 : at + 80])
        assert expected[len(stream) :].strip() == "", expected[len(stream) :]
        # what the template wrote after the call
        after = stream[stream.index("<tool_call|>") + len("<tool_call|>") :]
        response = after[: after.index("<answer>")]
        assert response.startswith("<|tool_response>")
        if role == "tool":  # Gemma 4's response block, the crop after it, the turn goes on
            # (the crop's text decodes with <unk> for the letters the tiny tokenizer lacks)
            assert response.startswith(f"<|tool_response>response:crop{{value:{Q}")
            assert f"{Q}}}<tool_response|><|image>" in response
            assert "<|turn>" not in response and response.count("<|image>") == 1
        else:  # the template writes a tool message's text only: the crop in a user turn
            assert response.startswith("<|tool_response><|turn>user\n<tool_response><|image>")
        assert sum(first.loss_mask) == len(call_ids) + len(answer)
        check_sampler_equals_trainer(policy, out, [0, 1], template)
    finally:
        loop.close()


def test_demonstrations_and_smoke_calls_are_written_natively(gemma4):
    """A warm start's scripted trajectory (written in Qwen's form) and a smoke run's example
    call come out in Gemma 4's syntax, run, and end as a sampled call turn does."""
    from mmrft.rollout.tool_loop import demonstration_call

    policy = gemma4
    policy.processor.chat_template = released_template("gemma4_v5.jinja")
    loop = ToolLoop(policy.family, policy.processor, enabled_tools(["crop"]), LoopLimits())
    try:
        sample = zoom_sample(0)
        example = loop.example_call(sample)
        assert example.startswith("<|tool_call>call:crop{bbox_2d:[") and example.endswith(
            "<tool_call|>"
        )
        scripted = demonstration_call(sample, policy.family, ["crop"])
        t = loop.demonstration(sample, [scripted, "<answer>red</answer>"])
        assert t.stop == "answer" and [c["ok"] for c in t.calls] == [True]
        assert t.ids[t.turns[0].tokens - 1] == loop.tool_call_token
        assert t.turns[0].text == GEMMA4_CALLS.rewrite(scripted)
        assert t.ids[-1] == loop.template.end_of_turn
    finally:
        loop.close()


def test_qwen_calls_where_the_template_does_not_describe_the_tools(gemma4):
    """The bundled tiny template has no tools branch: Qwen's calls, as before; with
    ``rollout.tools.describe`` off the data's prompts describe the tools (in Qwen's form):
    Qwen's calls under the released template too."""
    from mmrft.models.tiny.gemma import GEMMA4_CHAT_TEMPLATE

    gemma4.processor.chat_template = GEMMA4_CHAT_TEMPLATE
    assert call_syntax(gemma4.processor) is QWEN_CALLS
    gemma4.processor.chat_template = released_template("gemma4_v5.jinja")
    assert call_syntax(gemma4.processor) is GEMMA4_CALLS
    assert call_syntax(gemma4.processor, describe=False) is QWEN_CALLS


def test_the_writer_writes_what_the_template_writes(gemma4):
    """A call written by :meth:`Gemma4Calls.write` is the template's rendering of the same
    ``tool_calls`` (key order as ``dictsort``, numbers, strings, nesting), and a turn's text
    keeps the tags and string quotes that decoding would skip as special tokens."""
    policy = gemma4
    policy.processor.chat_template = released_template("gemma4_v5.jinja")
    # (letters the tiny tokenizer has: it decodes "Z" and "-" as <unk>)
    arguments = {"delta": 'a "b", }', "alpha": [1, 2.5, 0.125], "Beta": {"k": True, "j": [{}]}}
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": arguments}}],
    }
    [rendered] = policy.family.render(policy.processor, [[message]], False)
    written = GEMMA4_CALLS.write("f", arguments)
    assert written in rendered, (written, rendered)
    loop = ToolLoop(policy.family, policy.processor, enabled_tools(["crop"]), LoopLimits())
    try:
        assert set(loop.tag_ids.values()) == set(GEMMA4_CALLS.tags)
        assert loop._decode(encode(policy, written)) == written
        assert policy.tokenizer.decode(encode(policy, written), skip_special_tokens=True) != written
    finally:
        loop.close()


def test_each_response_answers_its_call_by_name(gemma4):
    """Two calls in one turn (a crop, then a call whose arguments cannot be read): two
    response blocks in call order, each named after its call (the broken one after the name
    it wrote, a nameless one ``unknown``), both failures the model reads."""
    policy = gemma4
    policy.processor.chat_template = released_template("gemma4_v5.jinja")
    loop = ToolLoop(policy.family, policy.processor, enabled_tools(["crop"]), LoopLimits())
    try:
        sample = zoom_sample(0)
        crop = GEMMA4_CALLS.write("crop", {"bbox_2d": family_box(policy, sample)})
        turn = crop + call("call:crop{bbox_2d:[1,2}") + call("garbage")
        t = loop.demonstration(sample, [turn, "<answer>red</answer>"])
        assert [(c["ok"], c["reason"]) for c in t.calls] == [
            (True, None), (False, "bad_json"), (False, "bad_json")
        ]  # fmt: skip
        stream = policy.tokenizer.decode(t.ids)
        after = stream[stream.index(turn) + len(turn) :]
        blocks = after.split("<tool_response|>")
        assert blocks[0].startswith(f"<|tool_response>response:crop{{value:{Q}")
        assert (
            blocks[1].startswith("<|image>")
            and "<image|><|tool_response>response:crop{" in blocks[1]
        )
        assert "arguments cannot be read" in blocks[1]
        assert blocks[2].startswith(f"<|tool_response>response:unknown{{value:{Q}Tool call refused")
        assert blocks[3] == "<answer>red</answer><turn|>"
    finally:
        loop.close()


@pytest.mark.parametrize(("template", "blocks"), [("gemma4.jinja", 0), ("gemma4_v4.jinja", 2),
                                                  ("gemma4_v5.jinja", 2)])  # fmt: skip
def test_which_released_templates_carry_images_in_a_tool_response(gemma4, template, blocks):
    """A tool message with two image parts: the first released template renders its text
    only (no placeholder, so the loop shows a crop in a user turn); the later ones write one
    ``<|image|>`` per image after the response block."""
    policy = gemma4
    policy.processor.chat_template = released_template(template)
    conversation = [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "crop", "arguments": {}}}
        ]},
        {"role": "tool", "tool_call_id": "call_0", "name": "crop",
         "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "two"}]},
    ]  # fmt: skip
    [text] = policy.family.render(policy.processor, [conversation], True)
    block = f"<|tool_response>response:crop{{value:{Q}two{Q}}}<tool_response|>"
    assert text.endswith(block + "<|image|>" * blocks), text
