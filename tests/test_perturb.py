"""NoisyRollout (mmrft.rollout.perturb): distortions, annealing, group assembly, config checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from mmrft.algorithms import group_advantages
from mmrft.config import IMAGE_KINDS, load_config
from mmrft.data import distort as D
from mmrft.data import video as V
from mmrft.rollout import perturb as P
from mmrft.rollout.base import Rollouts, Sampling
from mmrft.typecheck import ConfigError


def ramp(h: int = 8, w: int = 10) -> torch.Tensor:
    """A uint8 [3, h, w] image with distinct values."""
    base = torch.arange(h * w, dtype=torch.int64).view(h, w)
    return torch.stack([base % 256, (base * 3) % 256, (base * 7) % 256]).to(torch.uint8)


# -- distortions ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", IMAGE_KINDS)
def test_image_kinds_are_deterministic_keep_shape_and_zero_is_identity(kind):
    x = ramp()
    a = D.distort_pixels(x, [kind], 0.6, seed=7)
    b = D.distort_pixels(x, [kind], 0.6, seed=7)
    assert a.shape == x.shape and a.dtype == torch.uint8
    assert torch.equal(a, b)
    assert not torch.equal(a, x)  # strength 0.6 changes something
    assert torch.equal(D.distort_pixels(x, [kind], 0.0, seed=7), x)
    assert torch.equal(x, ramp())  # the input is untouched


def test_noise_is_the_documented_formula():
    x = torch.full((3, 2, 2), 100, dtype=torch.uint8)
    eps = torch.randn((3, 2, 2), generator=torch.Generator().manual_seed(5))
    expected = (100 + 255 * 0.1 * eps).round().clamp(0, 255).to(torch.uint8)
    assert torch.equal(D.distort_pixels(x, ["noise"], 0.1, seed=5), expected)
    assert not torch.equal(D.distort_pixels(x, ["noise"], 0.1, seed=6), expected)


def test_crop_and_blur_of_a_constant_image_are_constant():
    x = torch.full((3, 12, 12), 77, dtype=torch.uint8)
    for kind in ("crop", "blur"):
        assert torch.equal(D.distort_pixels(x, [kind], 1.0, seed=3), x)


def test_jitter_keeps_black_black():
    # brightness, contrast and saturation of an all-black image leave it black
    x = torch.zeros((3, 4, 4), dtype=torch.uint8)
    assert torch.equal(D.distort_pixels(x, ["jitter"], 0.9, seed=1), x)


def test_frame_order_hand_computed():
    assert D.frame_order(4, ["frame_drop"], 1.0, seed=0) == [0, 0, 0, 0]  # every frame dropped
    assert D.frame_order(5, ["frame_drop", "frame_jitter"], 0.0, seed=0) == [0, 1, 2, 3, 4]
    rng = np.random.default_rng(9)  # frame_jitter alone: k = round(1.0 · 4 / 2) = 2
    shift = rng.integers(-2, 3, size=5)
    expected = [min(max(i + int(d), 0), 4) for i, d in enumerate(shift)]
    assert D.frame_order(5, ["frame_jitter"], 1.0, seed=9) == expected
    dropped = np.random.default_rng(4).random(4) < 0.5
    order = [0, 1, 2, 3]
    for i in range(1, 4):
        if dropped[i]:
            order[i] = order[i - 1]
    assert D.frame_order(4, ["frame_drop"], 0.5, seed=4) == order


def test_distort_frames_keeps_count_and_size():
    frames = torch.stack([torch.full((3, 4, 4), i * 10, dtype=torch.uint8) for i in range(4)])
    out = D.distort_frames(frames, ["frame_drop"], 1.0, seed=2)
    assert out.shape == frames.shape
    assert all(torch.equal(out[i], frames[0]) for i in range(4))
    noisy = D.distort_frames(frames, ["noise"], 0.2, seed=2)
    assert noisy.shape == frames.shape and not torch.equal(noisy, frames)
    assert torch.equal(D.distort_frames(frames, ["noise", "frame_jitter"], 0.0, seed=2), frames)


def test_audio_noise_formula():
    w = np.array([0.5, -0.5, 0.5, -0.5], dtype=np.float32)  # rms 0.5
    eps = np.random.default_rng(3).standard_normal(4)
    expected = np.clip(w + 0.2 * 0.5 * eps, -1, 1).astype(np.float32)
    np.testing.assert_array_equal(D.distort_audio(w, 0.2, seed=3), expected)
    np.testing.assert_array_equal(D.distort_audio(w, 0.0, seed=3), w)


def test_video_fetch_applies_the_part_key(monkeypatch):
    frames = torch.stack([torch.full((3, 4, 4), i, dtype=torch.uint8) for i in range(4)])
    monkeypatch.setattr(V, "read_video", lambda *a, **k: (frames, 2.0, {"fps": 2.0}))
    monkeypatch.setattr(V, "processor_metadata", lambda meta: meta)
    spec = {"kinds": ["frame_drop"], "strength": 1.0, "seed": 1}
    out, _, _ = V.fetch_video({"video": "x.mp4", V.PERTURB_KEY: spec})
    assert all(torch.equal(out[i], frames[0]) for i in range(4))
    clean, _, _ = V.fetch_video({"video": "x.mp4"})
    assert torch.equal(clean, frames)


# -- seeds and schedule -----------------------------------------------------------------------


def test_prompt_seed_without_extras_is_the_shuffle_seed():
    from mmrft.rollout.collector import shuffle_seed

    assert D.prompt_seed(42, 17) == shuffle_seed(42, 17)
    assert D.prompt_seed(42, 17, 3) == D.prompt_seed(42, 17, 3) != D.prompt_seed(42, 17, 4)


@pytest.mark.parametrize(
    "schedule, step, expected",
    [
        ("constant", 70, 0.4),
        ("linear", 0, 0.4),
        ("linear", 25, 0.3),
        ("linear", 100, 0.0),
        ("linear", 150, 0.0),
        ("cosine", 50, 0.2),
        ("cosine", 25, 0.4 * (1 - (1 - math.cos(math.pi / 4)) / 2)),
        ("sigmoid", 0, 0.4),
        ("sigmoid", 50, 0.2),
        ("sigmoid", 100, 0.0),
    ],
)
def test_strength_schedule(schedule, step, expected):
    assert P.strength_at(step, 0.4, 0.0, schedule, 100) == pytest.approx(expected, abs=1e-12)


def test_sigmoid_schedule_hand_value_and_end_strength():
    k = P.SIGMOID_SHARPNESS

    def sig(z):
        return 1 / (1 + math.exp(-z))

    lam = (sig(k * (0.25 - 0.5)) - sig(-k / 2)) / (sig(k / 2) - sig(-k / 2))
    assert P.strength_at(25, 0.5, 0.1, "sigmoid", 100) == pytest.approx(0.1 + 0.4 * (1 - lam))
    assert P.strength_at(500, 0.5, 0.1, "linear", 100) == pytest.approx(0.1)
    assert P.strength_at(50, 0.5, 0.1, "linear", 0) == 0.5  # no annealing length: s₀


def test_perturbed_count():
    assert [P.perturbed_count(s, g) for s, g in [(0, 8), (0.5, 8), (0.25, 2), (0.9, 2)]] == [
        0,
        4,
        1,
        1,
    ]


# -- conversations ----------------------------------------------------------------------------


def test_perturbed_conversation_distorts_images_and_tags_videos():
    image = Image.new("RGB", (10, 8), (120, 60, 30))
    conversation = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": image},
                {"type": "video", "video": "/clip.mp4", "fps": 2},
                {"type": "text", "text": "Q"},
            ],
        },
    ]
    out, touched = P.perturbed_conversation(conversation, ["noise", "frame_drop"], 0.3, seed=11)
    again, _ = P.perturbed_conversation(conversation, ["noise", "frame_drop"], 0.3, seed=11)
    assert touched
    parts = out[1]["content"]
    assert parts[0]["image"].size == (10, 8)
    assert np.array_equal(
        np.asarray(parts[0]["image"]), np.asarray(again[1]["content"][0]["image"])
    )
    assert not np.array_equal(np.asarray(parts[0]["image"]), np.asarray(image))
    spec = parts[1][V.PERTURB_KEY]
    assert spec["kinds"] == ["noise", "frame_drop"] and spec["strength"] == 0.3
    assert spec["seed"] == D.prompt_seed(11, 0, 1) and parts[1]["fps"] == 2
    assert parts[2] is conversation[1]["content"][2]
    assert V.PERTURB_KEY not in conversation[1]["content"][1]  # input untouched
    assert conversation[1]["content"][0]["image"] is image

    text_only = [{"role": "user", "content": [{"type": "text", "text": "Q"}]}]
    assert P.perturbed_conversation(text_only, ["noise"], 0.3, seed=1)[1] is False
    video_only = [{"role": "user", "content": [{"type": "video", "video": "/c.mp4"}]}]
    assert P.perturbed_conversation(video_only, ["audio_noise"], 0.3, seed=1)[1] is False


# -- group assembly ---------------------------------------------------------------------------


class StubEngine:
    """One prompt row per conversation (token ids given by ``ids_of``), texts t<k>."""

    def __init__(self, ids_of=lambda conv: [1, 2, 3]) -> None:
        self.calls: list[tuple[list, int]] = []
        self.ids_of = ids_of

    def generate(self, conversations, n, sampling):
        self.calls.append((conversations, n))
        out = Rollouts(seconds=0.25)
        for c in conversations:
            out.prompts.append({"input_ids": torch.tensor(self.ids_of(c)), "tag": id(c)})
            for _ in range(n):
                out.add(len(out.prompts) - 1, [7], f"t{len(out.texts)}", False, logprobs=[-0.5])
        return out


def rows(groups: int, n: int, start: int) -> Rollouts:
    out = Rollouts(seconds=1.0)
    for g in range(groups):
        out.prompts.append({"input_ids": torch.tensor([1, 2, 3])})
        for _ in range(n):
            out.add(g, [start + len(out.texts)], f"x{start + len(out.texts)}", False, [-1.0])
    return out


def test_assembled_groups_point_at_the_clean_rows():
    clean, noisy = rows(2, 3, 0), rows(2, 1, 100)
    out, perturbed = P.assemble_groups(clean, noisy, 3, 1, [True, False])
    assert out.texts == ["x0", "x1", "x2", "x100", "x3", "x4", "x5", "x101"]
    assert out.prompt_index == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(out.prompts) == 2 and out.prompts[0] is clean.prompts[0]
    assert perturbed == [False, False, False, True, False, False, False, False]
    assert out.logprobs is None  # a perturbed completion's log-probs are not the clean policy's
    assert out.seconds == 2.0
    # with no perturbed prompt the sampler log-probs are kept
    kept, flags = P.assemble_groups(rows(1, 1, 0), rows(1, 1, 9), 1, 1, [False])
    assert kept.logprobs == [[-1.0], [-1.0]] and flags == [False, False]


def test_a_distorted_row_that_does_not_fit_fails_clearly():
    clean, noisy = rows(1, 2, 0), rows(1, 1, 10)
    noisy.prompts[0]["input_ids"] = torch.tensor([1, 2, 3, 3])
    with pytest.raises(P.PerturbError, match="sample 's0'.*shape"):
        P.assemble_groups(clean, noisy, 2, 1, [True], ["s0"])


def test_advantages_are_over_the_whole_group():
    clean, noisy = rows(1, 3, 0), rows(1, 1, 10)
    out, perturbed = P.assemble_groups(clean, noisy, 3, 1, [True])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])  # the perturbed completion is correct
    adv = group_advantages(rewards, 4, "grpo", eps=0.0)
    mean, std = 0.5, float(torch.tensor([1.0, 0.0, 0.0, 1.0]).std())
    expected = torch.tensor([(r - mean) / std for r in [1.0, 0.0, 0.0, 1.0]])
    assert torch.allclose(adv, expected)
    assert perturbed[3] and out.prompt_index[3] == 0


def test_stage_generates_g_minus_m_clean_and_m_distorted():
    cfg = load_config(
        None,
        ["train.steps=0", "rollout.group_size=4", "rollout.perturb.share=0.25"],
    )
    stage = P.NoisyRollout(cfg.rollout.perturb, 4, seed=0, steps=10)
    image = Image.new("RGB", (6, 6), (10, 200, 90))
    convs = [
        [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": "a"}],
            }
        ],
        [{"role": "user", "content": [{"type": "text", "text": "b"}]}],
    ]
    engine = StubEngine()
    out = stage.generate(engine, convs, [5, 6], ["a", "b"], step=0, sampling=Sampling(8))
    (clean_call, n_clean), (noisy_call, n_noisy) = engine.calls
    assert (n_clean, n_noisy) == (3, 1) and clean_call is convs
    assert noisy_call[1] is convs[1]  # nothing to distort: the clean conversation
    assert noisy_call[0][0]["content"][0]["image"] is not image
    assert out.perturbed == [False, False, False, True, False, False, False, False]
    assert out.rollouts.prompt_index == [0, 0, 0, 0, 1, 1, 1, 1]
    stage.observe([1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5], out.perturbed)
    metrics = stage.metrics()
    assert metrics["train/reward/clean"] == pytest.approx(4.0 / 7)
    assert metrics["train/reward/perturbed"] == 0.0
    assert metrics["train/perturbed_share"] == pytest.approx(1 / 8)
    assert metrics["train/perturb_strength"] == pytest.approx(0.5)  # sigmoid at step 0


def test_stage_fails_when_distortion_changes_the_tokens():
    cfg = load_config(None, ["train.steps=0", "rollout.group_size=2", "rollout.perturb.share=0.5"])
    stage = P.NoisyRollout(cfg.rollout.perturb, 2, seed=0, steps=10)
    image = Image.new("RGB", (6, 6))
    conv = [{"role": "user", "content": [{"type": "image", "image": image}]}]
    engine = StubEngine(lambda c: [1, 2] if c is conv else [1, 2, 2])
    with pytest.raises(P.PerturbError, match="keep every media size"):
        stage.generate(engine, [conv], [0], ["s"], step=0, sampling=Sampling(8))


# -- config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.perturb.share=1.0", "rollout.perturb.share"),
        ("rollout.perturb.share=-0.1", "rollout.perturb.share"),
        ("rollout.perturb.strength=1.5", "rollout.perturb.strength"),
        ("rollout.perturb.strength_end=0.9", "rollout.perturb.strength_end"),
        ("rollout.perturb.kinds=[noize]", "rollout.perturb.kinds"),
        ("rollout.perturb.kinds=[noise,noise]", "rollout.perturb.kinds"),
        ("rollout.perturb.anneal_steps=-1", "rollout.perturb.anneal_steps"),
        ("rollout.perturb.anneal=step", "rollout.perturb.anneal"),
    ],
)
def test_bad_values_fail_at_start_up_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, ["rollout.perturb.share=0.5", override])


def test_perturb_is_single_turn_and_synchronous():
    with pytest.raises(ConfigError, match="rollout.perturb.share"):
        load_config(None, ["rollout.perturb.share=0.5", "rollout.tools.names=[crop]"])
    with pytest.raises(ConfigError, match="rollout.perturb.share"):
        load_config(
            None,
            ["rollout.perturb.share=0.5", "rollout.max_staleness=1", "algorithm.tis_cap=2.0"],
        )


# -- end to end -------------------------------------------------------------------------------

GROUP_PLUGIN = '''
from mmrft import verifier

@verifier("test_group_size", group=True)
def test_group_size(completions, samples):
    """1 when called with exactly one whole group of 4 completions of one sample."""
    ok = len(completions) == 4 and len({s.id for s in samples}) == 1
    return [1.0 if ok else 0.0 for _ in completions]
'''


def test_training_with_perturbed_rollouts_and_a_group_verifier(tmp_path):
    import json

    from mmrft.config import REPO_ROOT
    from mmrft.training.trainer import train

    plugin = tmp_path / "group_plugin.py"
    plugin.write_text(GROUP_PLUGIN)
    cfg = load_config(
        REPO_ROOT / "configs" / "demo.yaml",
        [
            f"output_dir={tmp_path}",
            "name=noisy",
            "warm_start.steps=0",
            "train.steps=2",
            "train.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "rollout.perturb.share=0.5",
            "rollout.perturb.kinds=[noise,crop]",
            "eval.before=false",
            "eval.after=false",
            "checkpoint.every=0",
            "train.trackers=[]",
            f"plugins=[{plugin}]",
            "reward.verifiers=[{name: format}, {name: test_group_size}]",
        ],
    )
    summary = train(cfg)
    lines = [
        json.loads(x)
        for x in (tmp_path / "noisy" / "metrics.jsonl").read_text().splitlines()
        if "train/reward" in x
    ]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["train/reward/test_group_size"] == 1.0  # called once per whole group
        assert m["train/perturbed_share"] == 0.5
        assert {"train/reward/clean", "train/reward/perturbed"} <= set(m)
        assert m["rollout/generated"] == 8.0
    assert lines[0]["train/perturb_strength"] > lines[1]["train/perturb_strength"] == 0.0
    assert summary["steps"] == 2
