"""Tool rollouts in every model family (hf engine), scripted as in test_tool_rollout.py.

For each family that takes images: a crop call, its observation (the crop as an image in the
family's own tool turn), then an answer, beside a trajectory that answers at once. Checked:

* the token stream (prompt + trajectory) decodes to what the family's processor makes of the
  final conversation rendered by its chat template (tool turns included, placeholders
  expanded), so no separator is lost or doubled at a turn boundary;
* the loss mask holds exactly the model's tokens;
* sampler = trainer log-probs on every model token, group-shared and per-completion paths;
* the turn after the observation depends on the observation's pixels (the model sees it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ScriptedEngine, zoom_sample

from mmrft.config import load_config
from mmrft.policy.group import rollout_logps
from mmrft.policy.model import load_policy
from mmrft.rollout.base import Sampling
from mmrft.rollout.tool import Observation, enabled_tools
from mmrft.rollout.tool_loop import LoopLimits, ToolLoop

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "assets" / "models"
PIXELS = 12544

IMAGE_FAMILIES = [
    "tiny-internvl",
    "tiny-glm4v",
    "tiny-gemma3",
    "tiny-gemma4",
    "tiny-qwen2_5_omni",
    "tiny-qwen3_omni",
]


def load(model: str):
    cfg = load_config(
        None,
        [
            f"model.path={MODELS / model}",
            f"model.min_pixels={PIXELS}",
            f"model.max_pixels={PIXELS}",
            "train.steps=0",
        ],
    )
    return load_policy(cfg.model, torch.device("cpu"))


def call_text(box: list[int]) -> str:
    return f'<tool_call>{{"name": "crop", "arguments": {json.dumps({"bbox_2d": box})}}}</tool_call>'


def family_box(policy, sample) -> list[int]:
    """A 300-px square around the sample's target in the family's box frame."""
    W, H = sample.meta["image_size"]
    x1, y1, x2, y2 = sample.meta["target_box"]
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    box = [max(0, cx - 150), max(0, cy - 150), min(W, cx + 150), min(H, cy + 150)]
    if policy.family.box_frame == "norm1000":
        return [round(box[0] * 1000 / W), round(box[1] * 1000 / H),
                round(box[2] * 1000 / W), round(box[3] * 1000 / H)]  # fmt: skip
    w, h = policy.family.input_size(W, H)
    return [round(box[0] * w / W), round(box[1] * h / H),
            round(box[2] * w / W), round(box[3] * h / H)]  # fmt: skip


def encode(policy, text: str) -> list[int]:
    return policy.tokenizer.encode(text, add_special_tokens=False)


def check_sampler_equals_trainer(policy, out, indices, label) -> None:
    for shared in (True, False):
        with torch.no_grad():
            logps, mask, _ = rollout_logps(policy, out, indices, group_shared=shared)
        sampler = torch.zeros_like(logps)
        for i, values in enumerate(out.logprobs):
            sampler[i, : len(values)] = torch.tensor(values)
        gap = (logps - sampler).abs().mul(mask).max()
        assert torch.allclose(logps * mask, sampler * mask, atol=2e-4), (label, shared, gap)
        assert mask.sum() == sum(sum(out.trajectories[i].loss_mask) for i in indices)


@pytest.fixture(scope="module", params=IMAGE_FAMILIES)
def run(request):
    """(model, policy, loop, out, conversation, (call ids, answer ids)) of a crop → answer
    trajectory and an answer-at-once trajectory of zoom_marks sample 0."""
    policy = load(request.param)
    yield from crop_run(request.param, policy)


def crop_run(model, policy):
    loop = ToolLoop(policy.family, policy.processor, enabled_tools(["crop"]), LoopLimits())
    sample = zoom_sample(0)
    end = loop.template.end_of_turn
    answer = encode(policy, "<answer>red</answer>") + [end]
    call = encode(policy, "I zoom. " + call_text(family_box(policy, sample)))
    if loop.tool_call_token is None:
        call = call + [end]
    scripts = [[call, answer], [answer]]
    engine = ScriptedEngine(policy, scripts, group_shared=True)
    conversation = loop.with_tools([dict(m) for m in sample.messages])
    sampling = Sampling(max_new_tokens=96, temperature=1.0)
    out = loop.run(engine, [conversation], [sample], 2, sampling)
    yield model, policy, loop, out, conversation, (call, answer)
    loop.close()


def test_the_stream_is_the_templates_rendering(run):
    check_stream(*run)


def check_stream(model, policy, loop, out, conversation, scripts):
    call, answer = scripts
    first, second = out.trajectories
    assert [t.stop for t in out.trajectories] == ["answer", "answer"], model
    assert first.calls[0]["ok"], (model, first.calls)
    assert first.images == 1 and second.images == 0
    # the final conversation, its crop as the image of the tool turn
    observation = tool_observation(policy, loop, call)
    assert observation.text == first.calls[0]["text"]
    [crop] = observation.images
    messages = loop.template.messages([observation])
    for message in messages:
        message["content"] = [
            {"type": "image", "image": crop} if part.get("type") == "image" else part
            for part in message["content"]
        ]
    history = [
        *conversation,
        {"role": "assistant", "content": loop._decode(call)},
        *messages,
        {"role": "assistant", "content": "<answer>red</answer>"},
    ]
    whole = policy.family.prepare(policy.processor, [history], add_generation_prompt=False)
    expected = policy.tokenizer.decode(whole["input_ids"][0][whole["attention_mask"][0].bool()])
    prompt = out.prompts[out.prompt_index[0]]["input_ids"]
    stream = policy.tokenizer.decode(torch.cat([prompt, torch.tensor(first.ids)]))
    at = next((i for i, (a, b) in enumerate(zip(stream, expected)) if a != b), len(stream))
    assert at == len(stream), (model, stream[at - 60 : at + 60], expected[at - 60 : at + 60])
    assert expected[len(stream) :].strip() == "", (model, expected[len(stream) :])
    # the loss mask: the model's tokens only
    assert sum(first.loss_mask) == len(call) + len(answer)
    assert first.loss_mask[: len(call)] == [1] * len(call)
    assert first.loss_mask[-len(answer) :] == [1] * len(answer)
    assert second.loss_mask == [1] * len(answer)


def tool_observation(policy, loop, call: list[int]) -> Observation:
    """The observation the loop's tool gave for ``call`` on sample 0 (the tools are pure)."""
    from mmrft.rollout.tool import ToolContext, parse_tool_calls, run_tool_call

    [parsed] = parse_tool_calls(loop._decode(call), closed_by_stop=False)
    context = ToolContext.from_sample(zoom_sample(0), policy.family)
    return run_tool_call(parsed, context, loop.tools)


def test_sampler_equals_trainer(run):
    model, policy, _, out, _, _ = run
    check_sampler_equals_trainer(policy, out, [0, 1], model)


def test_the_observation_is_seen(run):
    model, policy, _, out, _, (_, answer) = run
    first = out.trajectories[0]
    key = next(k for k in ("pixel_values", "pixel_values_images") if k in first.media)
    saved = first.media[key]
    with torch.no_grad():
        logps, _, _ = rollout_logps(policy, out, [0], group_shared=True)
        first.media[key] = [torch.randn_like(v) for v in saved]
        try:
            changed, _, _ = rollout_logps(policy, out, [0], group_shared=True)
        finally:
            first.media[key] = saved
    last = slice(len(first.ids) - len(answer), len(first.ids))
    assert not torch.allclose(logps[0, last], changed[0, last], atol=1e-4), model


def test_observation_runs_attend_both_ways_in_the_dense_and_block_sparse_layouts():
    """A packed row [prompt | c1 | c2] where c1 holds an image run: its tokens attend to each
    other both ways, to nothing of c2, and the rule FlexAttention evaluates (``allowed``)
    equals the dense mask at every (query, key)."""
    from mmrft.policy.group import RowLayout

    segment = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 2, 2, -1]])
    runs = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0]])
    prompt = torch.ones(1, 3, 3, dtype=torch.bool).tril()
    layout = RowLayout(segment, prompt, runs)
    dense = layout.dense()[0]
    L = segment.shape[1]
    q, k = torch.arange(L)[:, None], torch.arange(L)[None, :]
    assert torch.equal(layout.allowed(torch.zeros(1, 1, dtype=torch.long), q, k), dense)
    assert dense[4, 6] and dense[6, 4] and dense[5, 6]  # the run, both ways
    assert not dense[3, 4] and dense[7, 6] and not dense[6, 7]  # causal outside the run
    assert not dense[8, 4] and dense[8, 0] and not dense[4, 8]  # completions apart
    causal = RowLayout(segment, prompt).dense()[0]
    assert torch.equal(
        dense & ~causal,
        torch.zeros_like(dense).index_put_(
            (torch.tensor([4, 4, 5]), torch.tensor([5, 6, 6])), torch.tensor(True)
        ),
    )


# -- audio from tools ------------------------------------------------------------------------
AUDIO_FAMILIES = ["tiny-qwen2_audio", "tiny-qwen2_5_omni", "tiny-qwen3_omni"]


def audio_sample(index: int = 0):
    """Training sample ``index`` of the bundled audio_beeps benchmark, its path absolute."""
    from mmrft.data import Sample

    folder = REPO / "assets" / "benchmarks" / "audio_beeps"
    record = json.loads((folder / "train.jsonl").read_text().splitlines()[index])
    for part in record["messages"][0]["content"]:
        if part["type"] == "audio":
            part["audio"] = str(folder / part["audio"])
    return Sample(record["id"], record["messages"], record["target"], record["meta"])


@pytest.fixture(scope="module", params=AUDIO_FAMILIES)
def audio_run(request):
    """An audio_clip call → answer trajectory and an answer-at-once one, on audio_beeps 0."""
    policy = load(request.param)
    loop = ToolLoop(policy.family, policy.processor, enabled_tools(["audio_clip"]), LoopLimits())
    sample = audio_sample(0)
    end = loop.template.end_of_turn
    answer = encode(policy, "<answer>3</answer>") + [end]
    body = json.dumps({"name": "audio_clip", "arguments": {"start_s": 0.1, "end_s": 0.6}})
    call = encode(policy, f"<tool_call>{body}</tool_call>")
    if loop.tool_call_token is None:
        call = call + [end]
    engine = ScriptedEngine(policy, [[call, answer], [answer]], group_shared=True)
    conversation = loop.with_tools([dict(m) for m in sample.messages])
    sampling = Sampling(max_new_tokens=64, temperature=1.0)
    out = loop.run(engine, [conversation], [sample], 2, sampling)
    yield request.param, policy, loop, out, conversation, sample, (call, answer)
    loop.close()


def test_an_audio_clip_is_the_templates_audio_turn(audio_run):
    """The clip comes back as audio of the tool turn at the model's rate (the interval of the
    original file), the stream is the processor's rendering of the whole conversation (the
    clip numbered after the prompt's: "Audio 2:" in Qwen2-Audio's template)."""
    from mmrft.data.audio import load_audio
    from mmrft.rollout.tool import ToolContext, parse_tool_calls, run_tool_call

    model, policy, loop, out, conversation, sample, (call, answer) = audio_run
    first, second = out.trajectories
    assert [t.stop for t in out.trajectories] == ["answer", "answer"], model
    assert first.calls[0]["ok"] and first.calls[0]["audios"] == 1, (model, first.calls)
    assert first.audios == 1 and second.audios == 0 and first.images == 0
    [parsed] = parse_tool_calls(loop._decode(call), closed_by_stop=False)
    context = ToolContext.from_sample(sample, policy.family, **loop.context_kwargs)
    observation = run_tool_call(parsed, context, loop.tools)
    [clip] = observation.audios
    rate = policy.processor.feature_extractor.sampling_rate
    whole_file = load_audio(sample.media("audio")[0], rate)
    assert clip.sampling_rate == rate
    assert np.array_equal(clip.waveform, whole_file[round(0.1 * rate) : round(0.6 * rate)])
    messages = loop.template.messages([observation])
    for message in messages:
        message["content"] = [
            clip.part() if part.get("type") == "audio" else part for part in message["content"]
        ]
    history = [
        *conversation,
        {"role": "assistant", "content": loop._decode(call)},
        *messages,
        {"role": "assistant", "content": "<answer>3</answer>"},
    ]
    whole = policy.family.prepare(policy.processor, [history], add_generation_prompt=False)
    expected = policy.tokenizer.decode(whole["input_ids"][0][whole["attention_mask"][0].bool()])
    prompt = out.prompts[out.prompt_index[0]]["input_ids"]
    stream = policy.tokenizer.decode(torch.cat([prompt, torch.tensor(first.ids)]))
    at = next((i for i, (a, b) in enumerate(zip(stream, expected)) if a != b), len(stream))
    assert at == len(stream), (model, stream[at - 60 : at + 60], expected[at - 60 : at + 60])
    assert expected[len(stream) :].strip() == "", (model, expected[len(stream) :])
    if model == "tiny-qwen2_audio":
        assert "Audio 2:" in stream and stream.count("Audio 1:") == 1
    assert sum(first.loss_mask) == len(call) + len(answer)


def test_audio_sampler_equals_trainer(audio_run):
    model, policy, _, out, *_ = audio_run
    check_sampler_equals_trainer(policy, out, [0, 1], model)


def test_the_audio_is_heard(audio_run):
    """Other features in the clip's rows: other log-probs of the answer after it."""
    model, policy, _, out, _, _, (_, answer) = audio_run
    first = out.trajectories[0]
    saved = first.media["input_features"]
    with torch.no_grad():
        logps, _, _ = rollout_logps(policy, out, [0], group_shared=True)
        first.media["input_features"] = [torch.randn_like(v) for v in saved]
        try:
            changed, _, _ = rollout_logps(policy, out, [0], group_shared=True)
        finally:
            first.media["input_features"] = saved
    last = slice(len(first.ids) - len(answer), len(first.ids))
    assert not torch.allclose(logps[0, last], changed[0, last], atol=1e-4), model


@pytest.mark.parametrize(
    "returned, says",
    [
        (lambda: np.zeros((2, 800), np.float32), "not a non-empty 1-D numpy array"),
        (lambda: np.zeros(0, np.float32), "not a non-empty 1-D numpy array"),
        (lambda: np.array(["a"] * 800), "not numbers"),
        (lambda: np.full(800, np.nan, np.float32), "NaN or infinite"),
        (lambda: np.zeros(16000 * 3, np.float32), "over the 2 s limit"),
        (lambda: [0.0] * 800, "not a non-empty 1-D numpy array"),
    ],
)
def test_hostile_audio_returns_are_tool_errors(returned, says):
    """A tool (model-facing code a user wrote) returning malformed audio gets a tool_error
    naming what is wrong, never an exception or a clip the processor chokes on."""
    from mmrft.rollout.tool import AudioClip, ToolContext, call_checked

    context = ToolContext(audio="x.wav", audio_rate=16000, max_audio_seconds=2.0)
    obs = call_checked(
        "Tool 't'",
        lambda: Observation(ok=True, text="", audios=[AudioClip(returned(), 16000)]),
        context,
        None,
        None,
    )
    assert not obs.ok and obs.reason == "tool_error" and says in obs.text, obs.text
    wrong_rate = call_checked(
        "Tool 't'",
        lambda: Observation(ok=True, text="", audios=[AudioClip(np.zeros(800), 8000)]),
        context,
        None,
        None,
    )
    assert wrong_rate.reason == "tool_error" and "8000 Hz" in wrong_rate.text
    fine = call_checked(
        "Tool 't'",
        lambda: Observation(ok=True, text="", audios=[AudioClip(np.full(800, 3.0), 16000)] * 5),
        context,
        None,
        1,
    )
    assert fine.ok and len(fine.audios) == 2  # max_media + 1 kept
    assert fine.audios[0].waveform.dtype == np.float32 and fine.audios[0].waveform.max() == 1.0


@pytest.mark.parametrize(
    "arguments, reason",
    [
        ({"start_s": 0.5, "end_s": 0.5}, "bad_argument"),
        ({"start_s": 30.0, "end_s": 31.0}, "interval_outside_audio"),
        ({"start_s": 0.0, "end_s": 2.5}, "clip_too_long"),
    ],
)
def test_audio_clip_refuses_bad_intervals(arguments, reason):
    from mmrft.rollout.tool import ToolCall, ToolContext, enabled_tools, run_tool_call

    sample = audio_sample(0)
    context = ToolContext(audio=sample.media("audio")[0], max_audio_seconds=2.0)
    obs = run_tool_call(ToolCall("audio_clip", arguments), context, enabled_tools(["audio_clip"]))
    assert not obs.ok and obs.reason == reason, obs
    none = run_tool_call(
        ToolCall("audio_clip", {"start_s": 0, "end_s": 1}),
        ToolContext(),
        enabled_tools(["audio_clip"]),
    )
    assert none.reason == "bad_argument" and "no audio" in none.text
    past_end = run_tool_call(
        ToolCall("audio_clip", {"start_s": 0.5, "end_s": 1.9}),
        context,
        enabled_tools(["audio_clip"]),
    )
    duration = sample.meta["duration"]
    assert past_end.ok and f"ends at {duration:.2f} s" in past_end.text
    assert past_end.audios[0].seconds == pytest.approx(duration - 0.5, abs=1e-3)


# A chat template that writes tool descriptions itself, in a form of its own (not Qwen's).
NATIVE_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\nFUNCTIONS: ' + (tools | tojson) + '<|im_end|>\\n' }}"
    "{%- endif %}"
)


def test_a_template_that_writes_tools_gets_them_as_tools():
    """A chat template with its own ``tools=`` branch: the tools reach it as ``tools`` (its
    own form), not as Qwen's system text, and the whole rollout renders as that template's
    conversation."""
    from mmrft.models.tiny.qwen3 import QWEN3_VL_CHAT_TEMPLATE
    from mmrft.rollout.tool_loop import renders_tools

    policy = load("tiny-qwen3_vl")
    assert not renders_tools(policy.processor)
    policy.processor.chat_template = NATIVE_TOOLS + QWEN3_VL_CHAT_TEMPLATE
    assert renders_tools(policy.processor)
    runs = crop_run("tiny-qwen3_vl (tools=)", policy)
    model, policy, loop, out, conversation, scripts = next(runs)
    assert conversation[0] == {"role": "tools", "content": "", "tools": loop.schemas}
    prompt = policy.tokenizer.decode(out.prompts[0]["input_ids"])
    assert prompt.startswith("<|im_start|>system\nFUNCTIONS: [{") and "# Tools" not in prompt
    assert out.trajectories[0].calls[0]["ok"]
    check_stream(model, policy, loop, out, conversation, scripts)
    check_sampler_equals_trainer(policy, out, [0, 1], model)
    runs.close()


def test_qwen2_5_vl_text_after_a_sparse_video_starts_past_its_last_frame_step():
    """The reference mRoPE (Qwen's code, vLLM): a video of 2 frame steps 4.5 s apart (4
    frames of a 9-s clip) at 2 tokens per second has temporal positions 0 and 9 past its start,
    and the text after it starts at the largest position + 1 (transformers 5.x starts it at
    start + max(h, w), inside the video's positions). Images and dense videos are unchanged."""
    policy = load("tiny-qwen2_5_vl")
    owner = __import__("mmrft.models.qwen_vl", fromlist=["rope_module"]).rope_module(policy.model)
    video_pad = policy.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    grid = torch.tensor([[2, 8, 8]])  # 2 steps of 8 × 8 patches: 2 × 4 × 4 = 32 tokens
    ids = torch.tensor([[7] * 5 + [video_pad] * 32 + [7] * 3])
    types = (ids == video_pad).int() * 2
    positions, delta = owner.get_rope_index(
        ids, types, video_grid_thw=grid, second_per_grid_ts=torch.tensor([4.5])
    )
    t, h, w = positions[:, 0]
    assert t[:5].tolist() == [0, 1, 2, 3, 4]
    assert sorted(set(t[5:37].tolist())) == [5, 14]  # 5 + ⌊k · 4.5 · 2⌋, k = 0, 1
    assert sorted(set(h[5:37].tolist())) == [5, 6, 7, 8]
    assert t[37:].tolist() == h[37:].tolist() == w[37:].tolist() == [15, 16, 17]
    assert int(delta) == 18 - 40
    # dense (Δ ≤ the grid's sides): the same as transformers' own
    for seconds in (0.5, 1.0):
        mine, _ = owner.get_rope_index(
            ids, types, video_grid_thw=grid, second_per_grid_ts=torch.tensor([seconds])
        )
        theirs, _ = type(owner).get_rope_index(
            owner, ids, types, video_grid_thw=grid, second_per_grid_ts=torch.tensor([seconds])
        )
        assert torch.equal(mine, theirs), seconds
    image_pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    ids = torch.tensor([[7] * 3 + [image_pad] * 16 + [7] * 2 + [image_pad] * 4 + [7] * 2])
    types = (ids == image_pad).int()
    grids = torch.tensor([[1, 8, 8], [1, 4, 4]])
    mask = torch.ones_like(ids)
    mine = owner.get_rope_index(ids, types, image_grid_thw=grids, attention_mask=mask)
    theirs = type(owner).get_rope_index(
        owner, ids, types, image_grid_thw=grids, attention_mask=mask
    )
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))  # images: as transformers
