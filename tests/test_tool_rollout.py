"""Multi-turn tool rollouts (mmrft/rollout/tool_loop.py) through the hf engine, scripted.

A scripted engine forces whole trajectories (call → observation → another call → answer) while
the log-probs stay the model's, so every check is exact: the token stream equals the chat
template's rendering of the final conversation (no separator lost at a turn boundary), the
loss mask covers the model's tokens only, each observation's image has its placeholder count
and pixel rows, the sampler's log-probs equal the training forward's (group-shared and
per-completion) on every turn, later images change later log-probs (the model sees them),
and hostile calls and budgets end or continue trajectories with named reasons.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import ScriptedEngine, tiny_policy, zoom_sample

from mmrft.config import load_config
from mmrft.data import Sample
from mmrft.policy.group import rollout_logps
from mmrft.policy.model import load_policy
from mmrft.policy.trajectory import joined_row
from mmrft.rollout.base import Sampling
from mmrft.rollout.collector import build_tool_loop
from mmrft.rollout.hf import HFEngine
from mmrft.rollout.tool import enabled_tools
from mmrft.rollout.tool_loop import LoopLimits, ToolLoop
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
ZOOM = REPO / "assets" / "benchmarks" / "zoom_marks"
MODEL = REPO / "assets" / "models" / "tiny-qwen2_5_vl"
PIXELS = 12544  # 112 × 112 input: the zoom benchmark's base view


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(f"model.min_pixels={PIXELS}", f"model.max_pixels={PIXELS}")


sample = zoom_sample


def tokens(policy, text: str) -> list[int]:
    return policy.tokenizer.encode(text, add_special_tokens=False)


def end_id(policy) -> int:
    return policy.tokenizer.convert_tokens_to_ids("<|im_end|>")


def call_text(box: list[float], name: str = "crop") -> str:
    import json

    return (
        f'<tool_call>{{"name": "{name}", "arguments": {json.dumps({"bbox_2d": box})}}}</tool_call>'
    )


def input_box(policy, s: Sample) -> list[int]:
    """The sample's target box grown to 200 px, in the Qwen2.5-VL input frame (input pixels)."""
    W, H = s.meta["image_size"]
    w, h = policy.family.input_size(W, H)
    x1, y1, x2, y2 = s.meta["target_box"]
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    box = [max(0, cx - 100), max(0, cy - 100), min(W, cx + 100), min(H, cy + 100)]
    return [
        round(box[0] * w / W),
        round(box[1] * h / H),
        round(box[2] * w / W),
        round(box[3] * h / H),
    ]


def loop(policy, **limits) -> ToolLoop:
    return ToolLoop(
        policy.family,
        policy.processor,
        enabled_tools(["crop", "image_zoom_in", "rotate"]),
        LoopLimits(**limits),
    )


def conversation(s: Sample, tool_loop: ToolLoop) -> list[dict]:
    return tool_loop.with_tools([dict(m) for m in s.messages])


SAMPLING = Sampling(max_new_tokens=96, temperature=1.0)


def run_script(policy, scripts, n=2, group_shared=True, samples=None, **limits):
    tool_loop = loop(policy, **limits)
    engine = ScriptedEngine(policy, scripts, group_shared=group_shared)
    samples = samples or [sample(0)]
    convs = [conversation(s, tool_loop) for s in samples]
    return tool_loop, tool_loop.run(engine, convs, samples, n, SAMPLING), convs


# ---------------------------------------------------------------------------------------------


def test_call_observation_call_answer_token_stream(policy):
    """Trajectory 0: crop → crop → answer; trajectory 1 answers at once. The token stream is
    the template's rendering of the final conversation, byte for byte."""
    s = sample(0)
    box = input_box(policy, s)
    answer = tokens(policy, "<answer>green</answer>") + [end_id(policy)]
    call_1 = tokens(policy, "I zoom. " + call_text(box))  # ends at </tool_call> (a stop token)
    call_2 = tokens(policy, call_text([0, 0, 60, 60], "image_zoom_in"))
    scripts = [[call_1, answer], [call_2], [answer]]
    tool_loop, out, convs = run_script(policy, scripts)
    first, second = out.trajectories
    assert [t.stop for t in out.trajectories] == ["answer", "answer"]
    assert len(first.turns) == 3 and len(second.turns) == 1
    assert [c["ok"] for c in first.calls] == [True, True], first.calls
    assert out.texts[0] == "<answer>green</answer>"
    assert first.images == 2 and second.images == 0

    # the stream: exactly the chat template's rendering of the whole conversation
    tok = policy.tokenizer
    prompt = out.prompts[out.prompt_index[0]]
    stream = tok.decode(torch.cat([prompt["input_ids"], torch.tensor(first.ids)]))
    history = [
        *convs[0],
        {"role": "assistant", "content": "I zoom. " + call_text(box)},
        *tool_loop.template.messages([_obs(first, 0)]),
        {"role": "assistant", "content": call_text([0, 0, 60, 60], "image_zoom_in")},
        *tool_loop.template.messages([_obs(first, 1)]),
        {"role": "assistant", "content": "<answer>green</answer>"},
    ]
    rendered = policy.processor.apply_chat_template(history, tokenize=False)
    expanded = _expand_placeholders(rendered, first, prompt, policy)
    assert stream == expanded.removesuffix("\n")

    # loss mask: the model's tokens only; the '<|im_end|>' after a '</tool_call>' stop is the
    # template's (0), the one closing the answer the model's (1)
    model_tokens = len(call_1) + len(call_2) + len(answer)
    assert sum(first.loss_mask) == model_tokens
    assert first.loss_mask[: len(call_1)] == [1] * len(call_1)
    assert first.loss_mask[len(call_1)] == 0 and first.ids[len(call_1)] == end_id(policy)
    assert [t.tokens for t in first.turns] == [len(call_1), len(call_2), len(answer)]
    assert first.loss_mask[-len(answer) :] == [1] * len(answer)
    assert second.loss_mask == [1] * len(answer)

    # media: per observation, one placeholder run whose length is the grid's tokens, and the
    # pixel rows of that grid
    grids = torch.cat(first.media["image_grid_thw"])
    pixels = torch.cat(first.media["pixel_values"])
    image_pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert first.ids.count(image_pad) == int(grids.prod(-1).sum()) // 4
    assert pixels.shape[0] == int(grids.prod(-1).sum())
    types = torch.tensor(first.token_types)
    assert torch.equal(types == 1, torch.tensor(first.ids) == image_pad)


def _obs(trajectory, k):
    from mmrft.rollout.tool import Observation

    call = trajectory.calls[k]
    return Observation(ok=call["ok"], text=call["text"], images=[None] * call["images"])


def _expand_placeholders(text, trajectory, prompt, policy):
    """The rendered text with each ``<|image_pad|>`` repeated as many times as its image's
    tokens (the processor's expansion)."""
    grids = [*prompt["image_grid_thw"], *torch.cat(trajectory.media["image_grid_thw"])]
    parts = text.split("<|image_pad|>")
    out = parts[0]
    for grid, rest in zip(grids, parts[1:]):
        out += "<|image_pad|>" * (int(grid.prod()) // 4) + rest
    return out


def check_sampler_equals_trainer(policy, out, indices: list[int], label=None) -> list:
    """On every model token of the trajectories ``indices``, the sampler's log-probs equal the
    trainer's, in both training paths (group-shared prefix and per-trajectory); the masks."""
    masks = []
    for shared in (True, False):
        with torch.no_grad():
            logps, mask, _ = rollout_logps(policy, out, indices, group_shared=shared)
        sampler = torch.zeros_like(logps)
        for i, values in enumerate(out.logprobs):
            sampler[i, : len(values)] = torch.tensor(values)
        gap = (logps - sampler).abs().mul(mask).max()
        assert torch.allclose(logps * mask, sampler * mask, atol=2e-4), (label, shared, gap)
        masks.append(mask)
    return masks


def test_sampler_logps_equal_training_forward(policy):
    """On every model token of every turn, sampler = trainer log-probs, in both training
    paths, with trajectories of different lengths and media counts in one batch."""
    s = sample(0)
    box = input_box(policy, s)
    answer = tokens(policy, "<answer>red</answer>") + [end_id(policy)]
    call_1 = tokens(policy, call_text(box))
    scripts = [[call_1, answer, call_1], [answer, call_1], [answer]]
    _, out, _ = run_script(policy, scripts, n=3)
    assert [t.images for t in out.trajectories] == [1, 0, 2]
    for mask in check_sampler_equals_trainer(policy, out, list(range(3))):
        assert mask.sum().item() == sum(sum(t.loss_mask) for t in out.trajectories)


def test_later_images_are_seen(policy):
    """The turn after an observation depends on the observation's pixels: other pixels,
    other log-probs (a model that 'does not see' later images would give the same)."""
    s = sample(0)
    answer = tokens(policy, "<answer>red</answer>") + [end_id(policy)]
    scripts = [[tokens(policy, call_text(input_box(policy, s)))], [answer]]
    _, out, _ = run_script(policy, scripts, n=1)
    trajectory = out.trajectories[0]
    with torch.no_grad():
        logps, _, _ = rollout_logps(policy, out, [0], group_shared=True)
        trajectory.media["pixel_values"] = [
            torch.randn_like(v) for v in trajectory.media["pixel_values"]
        ]
        changed, _, _ = rollout_logps(policy, out, [0], group_shared=True)
    last = slice(len(trajectory.ids) - len(answer), len(trajectory.ids))
    assert not torch.allclose(logps[0, last], changed[0, last], atol=1e-4)


def test_positions_of_continuation_are_the_whole_rows(policy):
    """The engine continues from the joined row, and the family's positions over it put the
    observation's image on a (t, h, w) grid: its height and width axes differ."""
    s = sample(0)
    scripts = [[tokens(policy, call_text(input_box(policy, s)))], [[end_id(policy)]]]
    _, out, _ = run_script(policy, scripts, n=1)
    trajectory = out.trajectories[0]
    row = joined_row(out.prompts[0], trajectory, policy.family.token_keys)
    positions = policy.family.rope_positions(policy.model, row)
    lp = len(out.prompts[0]["input_ids"])
    image = torch.tensor(trajectory.token_types) == 1
    obs_positions = positions[:, lp:][:, image]
    assert obs_positions.shape[1] > 0
    assert not torch.equal(obs_positions[1], obs_positions[2])  # h and w axes differ
    # text after the image continues past every position before it
    after = positions[:, lp:][:, len(trajectory.ids) - 1]
    assert int(after.min()) > int(obs_positions.max())


@pytest.mark.parametrize(
    "body, reason",
    [
        ('{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3', "bad_json"),
        ('{"name": "teleport", "arguments": {}}', "unknown_tool"),
        ('{"name": "crop", "arguments": {"bbox_2d": [0, 0, 1e9, 1e9]}}', "box_outside_image"),
        ('{"name": "crop", "arguments": {"bbox_2d": [0, 0, NaN, 5]}}', "bad_argument"),
        ('{"name": "crop", "arguments": {}}', "missing_argument"),
    ],
)
def test_hostile_calls_become_observations(policy, body, reason):
    """A broken call is answered with a failed observation (its reason recorded), and the
    trajectory goes on to its answer."""
    answer = tokens(policy, "<answer>red</answer>") + [end_id(policy)]
    scripts = [[tokens(policy, f"<tool_call>{body}</tool_call>")], [answer]]
    _, out, _ = run_script(policy, scripts, n=1)
    trajectory = out.trajectories[0]
    assert trajectory.stop == "answer"
    assert [c["reason"] for c in trajectory.calls] == [reason]
    assert trajectory.images == 0 and "pixel_values" not in trajectory.media
    assert out.texts[0] == "<answer>red</answer>"


def test_a_call_every_turn_ends_at_max_turns(policy):
    s = sample(0)
    call = tokens(policy, call_text(input_box(policy, s)))
    scripts = [[call]] * 3
    tool_loop, out, _ = run_script(policy, scripts, n=1, max_turns=3, max_media=8)
    trajectory = out.trajectories[0]
    assert trajectory.stop == "max_turns" and len(trajectory.turns) == 3
    assert trajectory.images == 2  # the last turn's call is not run
    metrics = tool_loop.metrics()
    assert metrics["rollout/tools/stop/max_turns"] == 1.0
    assert metrics["rollout/tools/turns_mean"] == 3.0


@pytest.mark.parametrize(
    "limits, reason",
    [({"max_media": 1}, "max_media"), ({"max_tokens": 60}, "max_tokens")],
)
def test_budgets_cut_before_media_are_added(policy, limits, reason):
    """An observation over a budget is not appended: no placeholder without its pixels, and
    the training forward still runs on the cut trajectory."""
    s = sample(0)
    call = tokens(policy, call_text(input_box(policy, s)))
    scripts = [[call], [call]]
    _, out, _ = run_script(policy, scripts, n=1, **limits)
    trajectory = out.trajectories[0]
    assert trajectory.stop == reason
    image_pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    grids = trajectory.media.get("image_grid_thw", [])
    assert trajectory.ids.count(image_pad) == sum(int(g.prod(-1).sum()) // 4 for g in grids)
    with torch.no_grad():
        logps, mask, _ = rollout_logps(policy, out, [0], group_shared=True)
    assert torch.isfinite(logps).all() and mask.sum() == sum(trajectory.loss_mask)


def test_truncated_turn_runs_no_call(policy):
    """A turn cut by its token limit ends the trajectory ('length'); its half call is not run."""
    s = sample(0)
    long_call = tokens(policy, call_text(input_box(policy, s)))
    tool_loop = loop(policy)
    engine = ScriptedEngine(policy, [[long_call]])
    conv = conversation(s, tool_loop)
    out = tool_loop.run(engine, [conv], [s], 1, Sampling(max_new_tokens=10))
    trajectory = out.trajectories[0]
    assert trajectory.stop == "length" and not trajectory.calls and out.truncated == [True]


def test_start_up_errors_name_the_key(policy):
    cfg = load_config(
        None, [f"model.path={MODEL}", "train.steps=0", "rollout.tools.names=[crop, zoom]"]
    )
    with pytest.raises(ConfigError, match=r"rollout.tools.names: .*'zoom'"):
        build_tool_loop(cfg, policy, HFEngine(policy, 4))

    class NoTurns:
        name = "vllm"

    cfg = load_config(None, [f"model.path={MODEL}", "train.steps=0", "rollout.tools.names=[crop]"])
    with pytest.raises(ConfigError, match="cannot continue trajectories"):
        build_tool_loop(cfg, policy, NoTurns())


def test_a_sample_without_tools_gets_no_tool_prompt_and_runs_no_call(policy):
    """meta.tools false (DeepEyes' no-tool rows): no tool description, a call is plain text."""
    s = sample(0)
    s.meta["tools"] = False
    tool_loop = loop(policy)
    assert tool_loop.with_tools(s.messages, s) == s.messages
    scripts = [[tokens(policy, call_text(input_box(policy, s)))]]
    engine = ScriptedEngine(policy, scripts)
    out = tool_loop.run(engine, [s.messages], [s], 1, SAMPLING)
    trajectory = out.trajectories[0]
    assert trajectory.stop == "answer" and not trajectory.calls and len(trajectory.turns) == 1


def test_demonstration_call_crops_around_the_target_in_the_family_frame(policy):
    """The scripted call: a quarter-image square around meta.target_box, in Qwen2.5-VL's
    input-pixel frame; run through the loop's own code, it crops that region."""
    import json

    from mmrft.rollout.tool_loop import demonstration_call

    s = sample(0)
    call = demonstration_call(s, policy.family, ["crop"])
    box = json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]
    W, H = s.meta["image_size"]
    w, _ = policy.family.input_size(W, H)
    x1, _, x2, _ = box["bbox_2d"]
    assert abs((x2 - x1) * W / w - min(W, H) / 4) < 2 * W / w  # a quarter of the shorter side
    tx1, ty1, tx2, ty2 = s.meta["target_box"]
    crop = loop(policy).demonstration(s, [call]).calls[0]["info"]["box_px"]
    assert crop[0] <= tx1 and crop[1] <= ty1 and crop[2] >= tx2 and crop[3] >= ty2
    assert demonstration_call(s, policy.family, ["rotate"]) is None


def test_demonstration_call_fetches_the_zoom_span_or_the_widened_target_span(policy):
    """In time: ``meta.zoom_span`` as it is when a sample names it (audio_zoom's window around
    the stated time), else the target span widened by 0.25 s within the duration."""
    import json

    from mmrft.rollout.tool_loop import demonstration_call

    def arguments(meta: dict, tools: list[str]) -> dict:
        call = demonstration_call(Sample("s", [], "low", meta), policy.family, tools)
        return json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))

    span = {"target_span": [3.1, 3.46], "duration": 8.4}
    assert arguments({**span, "zoom_span": [2.2, 4.2]}, ["audio_clip"]) == {
        "name": "audio_clip",
        "arguments": {"start_s": 2.2, "end_s": 4.2},
    }
    assert arguments(span, ["audio_clip"])["arguments"] == {"start_s": 2.85, "end_s": 3.71}
    assert arguments({"target_span": [0.1, 8.3], "duration": 8.4}, ["video_frames"]) == {
        "name": "video_frames",
        "arguments": {"start_s": 0.0, "end_s": 8.4, "n": 8},
    }
    assert demonstration_call(Sample("s", [], "low", span), policy.family, ["crop"]) is None
    # a 1-s window is video_frames' default interval and frame count: start_s alone
    one = arguments({**span, "zoom_span": [4.3, 5.3]}, ["video_frames"])
    assert one == {"name": "video_frames", "arguments": {"start_s": 4.3}}
    from mmrft.plugins import TOOLS

    schema = TOOLS.get("video_frames").parameters["properties"]
    assert "start_s + 1" in schema["end_s"]["description"]
    assert "default 8" in schema["n"]["description"]


def test_random_demonstration_calls_keep_the_size_and_spread_over_the_image_and_clip(policy):
    """``warm_start.calls: random``: the scripted call's region keeps its size and lands
    uniformly inside the image or clip, whatever the target: the format, not where to look."""
    import json
    import random
    from collections import Counter

    from mmrft.rewards.boxes import from_pixels
    from mmrft.rollout.tool_loop import demonstration_call

    def arguments(s: Sample, tools: list[str], rng: random.Random) -> dict:
        call = demonstration_call(s, policy.family, tools, rng)
        return json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))[
            "arguments"
        ]

    rng = random.Random(0)
    meta = {"zoom_span": [4.3, 5.3], "target_span": [4.3, 4.6], "duration": 9.0}
    spans = [arguments(Sample("s", [], "red", meta), ["video_frames"], rng) for _ in range(400)]
    starts = [a["start_s"] for a in spans]
    assert all(list(a) == ["start_s"] for a in spans)  # 1 s, 8 frames: video_frames' defaults
    assert min(starts) >= 0.0 and max(starts) <= 8.0
    assert all(round(v, 1) == v for v in starts)  # the stated times' grid
    assert min(starts) < 1.0 and max(starts) > 7.0  # spread over the clip, not near 4.3
    assert sum(abs(v - 4.3) < 0.5 for v in starts) < 0.25 * len(starts)

    s = sample(0)
    boxes = [arguments(s, ["crop"], rng)["bbox_2d"] for _ in range(200)]
    target = json.loads(
        demonstration_call(s, policy.family, ["crop"])
        .removeprefix("<tool_call>")
        .removesuffix("</tool_call>")
    )["arguments"]["bbox_2d"]
    side = target[2] - target[0]
    w, h = policy.family.input_size(*s.meta["image_size"])
    assert all(abs((b[2] - b[0]) - side) <= 1 and b[0] >= 0 and b[2] <= w + 1 for b in boxes)
    assert all(b[1] >= 0 and b[3] <= h + 1 for b in boxes)
    assert len({tuple(b) for b in boxes}) > 100

    # a sample naming the places one may look (zoom_sites' four sites): one of them, uniformly
    sites = [[x, y, x + 30, y + 30] for y in (195, 615) for x in (195, 615)]
    meta = {"zoom_box": sites[2], "zoom_choices": sites, "image_size": [840, 840]}
    named = Sample("sites", s.messages, "red", meta)
    picked = [tuple(arguments(named, ["crop"], rng)["bbox_2d"]) for _ in range(200)]
    meta["input_size"] = list(policy.family.input_size(840, 840))
    framed = {tuple(round(v) for v in from_pixels(b, policy.family.box_frame, meta)) for b in sites}
    assert set(picked) == framed and max(Counter(picked).values()) < 0.4 * len(picked)


def test_random_demonstration_calls_refuse_a_clip_without_its_duration(policy):
    """A clip sample with no ``meta.duration`` cannot have a random call: it fails, naming the
    sample (before the first warm-start step), rather than keep its target window."""
    import random

    from mmrft.rollout.tool_loop import demonstration_call
    from mmrft.training.warm_start import check_random_calls

    meta = {"zoom_span": [4.3, 5.3], "target_span": [4.3, 4.6]}
    no_duration = Sample("clip-7", [], "red", meta)
    with pytest.raises(ValueError, match="clip-7.*meta.duration"):
        demonstration_call(no_duration, policy.family, ["video_frames"], random.Random(0))
    assert demonstration_call(no_duration, policy.family, ["video_frames"])  # the target call
    tools = ToolLoop(
        policy.family, policy.processor, enabled_tools(["crop", "video_frames"]), LoopLimits()
    )
    fine = Sample("clip-8", [], "red", {**meta, "duration": 9.0})
    check_random_calls([fine, sample(0)], tools)
    with pytest.raises(ValueError, match="1 of 3 training samples.*clip-7"):
        check_random_calls([fine, no_duration, sample(0)], tools)


def test_any_choice_loss_is_the_summed_probability_of_the_places_by_hand():
    """``warm_start.calls: any``: a sample's call loss is -log of the summed probability of
    its places' calls, its other tokens averaged over its demonstrations; moving probability
    between the places at a constant sum leaves the loss unchanged (never which place)."""
    import math

    from mmrft.training.warm_start import any_choice_nll

    logps = torch.tensor([[-1.0, -2.0, -0.5], [-2.0, -2.0, -1.5], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]])
    calls = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0]])
    total, tokens = any_choice_nll(logps, mask, calls, [2, 1])
    first = -math.log(math.exp(-3.0) + math.exp(-4.0)) + (0.5 + 1.5) / 2
    assert total.item() == pytest.approx(first + 2.0) and tokens.item() == pytest.approx(5.0)
    # a single demonstration per sample: the plain sum of its trained tokens
    plain, count = any_choice_nll(logps, mask, calls, [1, 1, 1])
    assert plain.item() == pytest.approx(3.5 + 5.5 + 2.0) and count.item() == 8.0
    # the places' call probabilities 0.3 + 0.1 or 0.2 + 0.2: the same loss
    spread = [
        torch.tensor([[math.log(a), 0.0], [math.log(b), 0.0]]) for a, b in ((0.3, 0.1), (0.2, 0.2))
    ]
    two = torch.ones(2, 2, dtype=torch.long)
    first_only = torch.tensor([[1, 0], [1, 0]])
    losses = [any_choice_nll(x, two, first_only, [2])[0].item() for x in spread]
    assert losses[0] == pytest.approx(losses[1]) == pytest.approx(-math.log(0.4))
    # no call tokens trained (train_on answer): the answers' mean, no log(places) offset
    none = torch.zeros_like(calls)
    answer_only, _ = any_choice_nll(logps, mask, none, [2, 1])
    assert answer_only.item() == pytest.approx((3.5 + 5.5) / 2 + 2.0)


def test_any_choice_demonstrations_crop_every_named_place(policy):
    """``warm_start.calls: any`` demonstrates one call per place of ``meta.zoom_choices``
    (boxes: zoom_box; spans: zoom_span); a sample with a target but no choices fails before
    the first step, naming it."""
    import json

    from mmrft.rewards.boxes import from_pixels
    from mmrft.rollout.tool_loop import demonstration_call
    from mmrft.training.warm_start import check_call_choices, choice_samples

    sites = [[x, y, x + 30, y + 30] for y in (195, 615) for x in (195, 615)]
    meta = {"zoom_box": sites[2], "zoom_choices": sites, "image_size": [840, 840]}
    named = Sample("sites", sample(0).messages, "red", meta)
    copies = choice_samples(named)
    calls = [demonstration_call(c, policy.family, ["crop"]) for c in copies]
    boxes = [json.loads(c.removeprefix("<tool_call>").removesuffix("</tool_call>")) for c in calls]
    framed_meta = {**meta, "input_size": list(policy.family.input_size(840, 840))}
    assert [b["arguments"]["bbox_2d"] for b in boxes] == [
        [round(v) for v in from_pixels(s, policy.family.box_frame, framed_meta)] for s in sites
    ]
    spans = Sample("clip", [], "A", {"zoom_span": [1.0, 2.0], "zoom_choices": [[0, 1], [3, 4]]})
    assert [c.meta["zoom_span"] for c in choice_samples(spans)] == [[0, 1], [3, 4]]
    assert choice_samples(sample(0)) == [sample(0)]  # no choices named: itself
    tools = loop(policy)
    check_call_choices([named, Sample("plain", [], "red", {})], tools)  # no target: direct answer
    with pytest.raises(ValueError, match="1 of 2 training samples.*no meta.zoom_choices"):
        check_call_choices([named, sample(0)], tools)
    odd = Sample("odd", [], "red", {**meta, "zoom_choices": [[1, 2, 3]]})
    with pytest.raises(ValueError, match="odd.*boxes or spans"):
        check_call_choices([odd], tools)


def test_warm_start_train_on_masks_the_answer_or_the_calls(policy):
    """``warm_start.train_on``: a demonstration's loss on every model turn, the last turn only
    (a reader's pre-training) or every turn but the last (the call's format); observation
    tokens never."""
    from mmrft.rollout.tool_loop import demonstration_call
    from mmrft.training.warm_start import trained_turns

    s = sample(0)
    call = demonstration_call(s, policy.family, ["crop"])
    t = loop(policy).demonstration(s, [call, "<answer>red</answer>"])
    assert len(t.turns) == 2 and t.calls[0]["ok"]
    assert sum(u.tokens + u.observation_tokens for u in t.turns) == len(t.ids)
    first = t.turns[0].tokens + t.turns[0].observation_tokens
    every, answer, calls = (trained_turns(t, k) for k in ("all", "answer", "calls"))
    assert every == t.loss_mask
    assert sum(answer) == t.turns[1].tokens and not any(answer[:first])
    assert sum(calls) == t.turns[0].tokens and not any(calls[first:])
    assert [a + c for a, c in zip(answer, calls)] == t.loss_mask


@pytest.fixture(scope="module")
def video_policy():
    return tiny_policy(
        "model.video.fps=2.0",
        "model.video.min_frames=4",
        "model.video.max_frames=4",
        "model.video.min_pixels=3136",
        "model.video.max_pixels=3136",
    )


def video_sample() -> Sample:
    import json

    folder = REPO / "assets" / "benchmarks" / "zoom_video"
    record = json.loads((folder / "train.jsonl").read_text().splitlines()[0])
    record["messages"][0]["content"][0]["video"] = str(
        folder / record["messages"][0]["content"][0]["video"]
    )
    return Sample(record["id"], record["messages"], record["target"], record["meta"])


def test_video_frames_come_back_as_a_video_and_log_probs_agree(video_policy):
    """Trajectory 0 asks for 1,000 frames (refused: too_many_frames), then for 4 frames of
    the flash (a video: video placeholders, token type 2, its own time step), then answers;
    sampler = trainer log-probs on every model token, both training paths."""
    policy = video_policy
    tool_loop = ToolLoop(
        policy.family, policy.processor, enabled_tools(["video_frames"]), LoopLimits()
    )
    s = video_sample()
    start, end = s.meta["target_span"]
    greedy_call = (
        f'{{"name": "video_frames", "arguments": {{"start_s": {start}, "end_s": {end}, "n": 4}}}}'
    )
    too_many = '{"name": "video_frames", "arguments": {"start_s": 0, "end_s": 9, "n": 1000}}'
    answer = tokens(policy, "<answer>A</answer>") + [end_id(policy)]
    scripts = [
        [tokens(policy, f"<tool_call>{too_many}</tool_call>"), answer],
        [tokens(policy, f"<tool_call>{greedy_call}</tool_call>")],
        [answer],
    ]
    engine = ScriptedEngine(policy, scripts)
    out = tool_loop.run(engine, [tool_loop.with_tools(s.messages, s)], [s], 2, SAMPLING)
    first, second = out.trajectories
    assert [c["reason"] for c in first.calls] == ["too_many_frames", None]
    assert first.videos == 1 and first.images == 0 and second.calls == []
    video_pad = policy.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    types = torch.tensor(first.token_types)
    assert torch.equal(types == 2, torch.tensor(first.ids) == video_pad)
    grid = torch.cat(first.media["video_grid_thw"])
    assert int((types == 2).sum()) == int(grid.prod(-1).sum()) // 4
    assert first.media["second_per_grid_ts"][0].item() > 0
    check_sampler_equals_trainer(policy, out, [0, 1])


@pytest.mark.parametrize("model", ["tiny-qwen2_vl", "tiny-qwen3_vl", "tiny-qwen3_5"])
def test_other_qwen_families_run_the_same_loop(model):
    """Qwen2-VL and Qwen3-VL (norm1000 boxes, their own templates and patch sizes) and Qwen3.5
    (linear-attention layers: the prefix path of the training forward): a crop call, its
    observation, an answer; sampler = trainer log-probs in both training paths."""
    cfg = load_config(
        None,
        [
            f"model.path={REPO / 'assets' / 'models' / model}",
            f"model.min_pixels={PIXELS}",
            f"model.max_pixels={PIXELS}",
            "train.steps=0",
        ],
    )
    policy = load_policy(cfg.model, torch.device("cpu"))
    s = sample(0)
    box = [400, 400, 700, 700]  # norm1000 for these families
    answer = tokens(policy, "<answer>red</answer>") + [end_id(policy)]
    scripts = [[tokens(policy, call_text(box)), answer], [answer]]
    _, out, _ = run_script(policy, scripts, n=2)
    first = out.trajectories[0]
    assert first.calls[0]["ok"], first.calls
    assert first.images == 1 and out.trajectories[1].images == 0
    W = s.meta["image_size"][0]
    assert first.calls[0]["info"]["box_px"][0] == int(0.4 * W)  # norm1000 → original pixels
    check_sampler_equals_trainer(policy, out, [0, 1], model)
