"""The vLLM rollout engine on this machine's CPU (``make test-vllm``; marker ``vllm``).

These run in ``.venv-vllm`` (vLLM's CPU build, see requirements-vllm.txt) on the committed tiny
models (head_dim 32, the smallest vLLM's CPU attention accepts): Qwen2.5-VL for images and
videos, Qwen2-VL for images, Qwen2-Audio for audio. They check that
the engine sees what the trainer sees (prompt token parity; greedy completions equal to the
``hf`` engine's; sampler log-probs equal to the training forward's within 1e-3), that weights
pushed after an optimizer step are the ones it samples with, that the parity check stops a
mismatched media budget, and that training and evaluation run with ``rollout.engine=vllm``.
The served engine (``rollout.engine=vllm_server``, vLLM's own server process started from this
virtualenv) passes the same checks, continues tool trajectories, trains against a server given
by URL, and stops a run whose server is killed, which ``checkpoint.resume=auto`` then finishes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from mmrft.config import ServerConfig, VLLMConfig, load_config  # noqa: E402
from mmrft.policy.group import rollout_logps  # noqa: E402
from mmrft.policy.model import load_policy, merged_weights  # noqa: E402
from mmrft.rewards import Score, verifier  # noqa: E402
from mmrft.rollout.base import Sampling  # noqa: E402
from mmrft.rollout.hf import HFEngine  # noqa: E402
from mmrft.rollout.served import ServedEngine, ServerError  # noqa: E402
from mmrft.rollout.vllm import EngineParityError, VLLMEngine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SIDE = 112 * 112  # 16 visual tokens per image, 4 per video frame pair
BUDGET = [
    f"model.min_pixels={SIDE}",
    f"model.max_pixels={SIDE}",
    "model.video.fps=4.0",
    "model.video.min_frames=4",
    "model.video.max_frames=4",
    f"model.video.min_pixels={SIDE}",
    f"model.video.max_pixels={SIDE}",
]
SETTINGS = VLLMConfig(kv_cache_gb=0.25, max_model_len=1024, seed=0)


@verifier("test_vllm_length", low=0.0, high=1.0)
def length_reward(completions, samples):
    """A reward with variance inside every group, so each step trains."""
    return [Score(min(len(c), 30) / 30) for c in completions]


MODELS = REPO / "assets" / "models"


@pytest.fixture(scope="module")
def model_path() -> Path:
    return MODELS / "tiny-qwen2_5_vl"


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, list[str]]:
    """Two images and two 8-frame videos (a square moving right / left) at 112 px, and two
    one-second clips (a 440 Hz and an 880 Hz tone) at 16 kHz."""
    import sys

    import numpy as np
    from PIL import Image

    sys.path.insert(0, str(REPO / "scripts"))
    from make_benchmarks import save_mp4

    folder = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    import soundfile

    out: dict[str, list[str]] = {"image": [], "video": [], "audio": []}
    for i, colour in enumerate([(220, 40, 40), (40, 80, 220)]):
        frames = []
        for t in range(8):
            pixels = rng.integers(0, 60, size=(112, 112, 3), dtype=np.uint8)
            x = 30 + (6 * t if i == 0 else -3 * t)
            pixels[40:72, x : x + 32] = colour
            frames.append(pixels)
        Image.fromarray(frames[0]).save(folder / f"image-{i}.png")
        save_mp4(np.stack(frames), 4, folder / f"video-{i}.mp4")
        out["image"].append(str(folder / f"image-{i}.png"))
        out["video"].append(str(folder / f"video-{i}.mp4"))
        t = np.arange(16000) / 16000
        soundfile.write(
            folder / f"tone-{i}.wav", 0.5 * np.sin(2 * np.pi * 440 * (i + 1) * t), 16000
        )
        out["audio"].append(str(folder / f"tone-{i}.wav"))
    return out


def conversations(media: dict[str, list[str]], kind: str) -> list[list[dict]]:
    question = {
        "image": "What colour is the shape?",
        "video": "Which way does it move?",
        "audio": "Is the tone high or low?",
    }[kind]
    return [
        [
            {
                "role": "user",
                "content": [{"type": kind, kind: path}, {"type": "text", "text": question}],
            }
        ]
        for path in media[kind]
    ]


@pytest.fixture(scope="module")
def setup(model_path):
    cfg = load_config(None, [f"model.path={model_path}", "train.steps=0", *BUDGET])
    policy = load_policy(cfg.model, torch.device("cpu"))
    # room for the images and clips a tool trajectory adds (test_tool_trajectory_*)
    engine = VLLMEngine(policy, SETTINGS, {"image": 3, "video": 3}, str(model_path))
    return policy, engine


@pytest.mark.parametrize("kind", ["image", "video"])
def test_greedy_completions_equal_the_hf_engine(setup, media, kind) -> None:
    policy, engine = setup
    greedy = Sampling(12, greedy=True)
    hf = HFEngine(policy, 8).generate(conversations(media, kind), 1, greedy)
    vllm = engine.generate(conversations(media, kind), 1, greedy)
    assert vllm.completion_ids == hf.completion_ids
    assert [r["input_ids"].tolist() for r in vllm.prompts] == [
        r["input_ids"].tolist() for r in hf.prompts
    ]


def largest_logprob_gap(policy, out) -> float:
    """max |sampler log-prob − training forward's log-prob| over every completion token."""
    with torch.no_grad():
        rows = list(range(len(out.completion_ids)))
        logps, mask, _ = rollout_logps(policy, out, rows, group_shared=True)
    sampler = torch.zeros_like(logps)
    for i, values in enumerate(out.logprobs):
        sampler[i, : len(values)] = torch.tensor(values)
    return float(((logps - sampler) * mask).abs().max())


def check_against_hf(engine, policy, convs) -> None:
    """Prompt parity, greedy completions equal to the hf engine's, and sampled completions'
    log-probs within 1e-3 of the training forward's."""
    engine.check_parity(convs, ["a", "b"])
    greedy = Sampling(12, greedy=True)
    hf = HFEngine(policy, 8).generate(convs, 1, greedy)
    assert engine.generate(convs, 1, greedy).completion_ids == hf.completion_ids
    torch.manual_seed(0)
    out = engine.generate(convs, 2, Sampling(10, top_p=0.9, top_k=50))
    assert largest_logprob_gap(policy, out) <= 1e-3


@pytest.mark.parametrize("kind", ["image", "video"])
def test_sampler_logprobs_equal_the_training_forward(setup, media, kind) -> None:
    policy, engine = setup
    torch.manual_seed(0)
    out = engine.generate(conversations(media, kind), 4, Sampling(10, top_p=0.9, top_k=50))
    assert out.prompt_index == [0, 0, 0, 0, 1, 1, 1, 1] and len(out.prompts) == 2
    assert largest_logprob_gap(policy, out) <= 1e-3
    suppressed = set(policy.family.suppress_token_ids(policy.processor))
    assert not any(t in suppressed for ids in out.completion_ids for t in ids)


def test_the_same_seeds_give_the_same_samples(setup, media) -> None:
    _, engine = setup
    torch.manual_seed(7)
    a = engine.generate(conversations(media, "image"), 3, Sampling(8))
    torch.manual_seed(7)
    b = engine.generate(conversations(media, "image"), 3, Sampling(8))
    assert a.completion_ids == b.completion_ids


# -- multi-turn tool trajectories ----------------------------------------------------------------


def tool_rows(policy, kind: str, video: str | None = None):
    """A zoom benchmark sample's prompt row (as the vLLM engine prepares it, with its media) and
    the trajectory of a scripted call with its observation (a crop, or frames as a video).
    ``video``: another prompt video for the video case (default: the zoom video itself, 9 s
    at 20 fps sampled to 4 frames)."""
    from mmrft.rollout.tool import enabled_tools
    from mmrft.rollout.tool_loop import LoopLimits, ToolLoop

    bench, tool, call = {
        "image": (
            "zoom_marks",
            "crop",
            '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [10, 10, 60, 60]}}</tool_call>',
        ),
        "video": (
            "zoom_video",
            "video_frames",
            '<tool_call>{"name": "video_frames", "arguments": {"start_s": 0.5, "end_s": 1.5, '
            '"n": 4}}</tool_call>',
        ),
        "audio": (
            "audio_zoom",
            "audio_clip",
            '<tool_call>{"name": "audio_clip", "arguments": {"start_s": 4.0, "end_s": 5.5}}'
            "</tool_call>",
        ),
    }[kind]
    folder = REPO / "assets" / "benchmarks" / bench
    record = json.loads((folder / "train.jsonl").read_text().splitlines()[0])
    for part in record["messages"][0]["content"]:
        if part["type"] in ("image", "video", "audio"):
            part[part["type"]] = str(folder / part[part["type"]])
    from mmrft.data import Sample

    if video is not None:
        record["messages"][0]["content"][0]["video"] = video
        record["meta"].pop("duration", None)
    sample = Sample(record["id"], record["messages"], record["target"], record["meta"])
    loop = ToolLoop(policy.family, policy.processor, enabled_tools([tool]), LoopLimits(max_turns=3))
    conversation = loop.with_tools(sample.messages, sample)
    rows, _ = policy.family.engine_inputs(policy.processor, [conversation])
    trajectory = loop.demonstration(sample, [call])
    assert trajectory.calls[0]["ok"], trajectory.calls
    return loop, sample, conversation, rows[0], trajectory


@pytest.mark.parametrize("kind", ["image", "video"])
def test_tool_trajectory_continues_exactly(setup, media, kind) -> None:
    """vLLM continues a trajectory (prompt, call, observation with a new image or clip) from
    its exact ids: its expanded prompt is the trainer's row, greedy equals the hf engine, and
    its log-probs of the new turn equal the training forward's over the whole trajectory."""
    policy, engine = setup
    check_tool_continuation(policy, engine, kind)


def check_tool_continuation(policy, engine, kind: str) -> None:
    """:func:`test_tool_trajectory_continues_exactly` for ``engine`` on ``policy``'s family."""
    from mmrft.policy.trajectory import joined_row
    from mmrft.rollout.base import Rollouts

    _, _, _, prompt, trajectory = tool_rows(policy, kind)
    row = joined_row(prompt, trajectory, policy.family.token_keys)
    greedy = Sampling(10, greedy=True)
    assert engine.continue_rows([row], greedy).completion_ids == (
        HFEngine(policy, 4).continue_rows([row], greedy).completion_ids
    )
    torch.manual_seed(0)
    out = engine.continue_rows([row], Sampling(10, top_k=50))
    trajectory.add_turn(out.completion_ids[0], out.logprobs[0], out.texts[0], out.truncated[0])
    rollouts = Rollouts(prompts=[prompt], prompt_index=[0], completion_ids=[trajectory.ids])
    rollouts.texts, rollouts.truncated = [out.texts[0]], [False]
    rollouts.trajectories = [trajectory]
    n = len(out.completion_ids[0])
    for shared in (True, False):
        with torch.no_grad():
            logps, _, _ = rollout_logps(policy, rollouts, [0], group_shared=shared)
        mine = logps[0, len(trajectory.ids) - n : len(trajectory.ids)]
        assert float((mine - torch.tensor(out.logprobs[0])).abs().max()) <= 1e-3


def test_tool_loop_runs_on_the_vllm_engine(setup) -> None:
    """The loop's first turn by vLLM's generate, later turns (if the tiny model calls) by
    continue_rows; every trajectory ends with a named reason."""
    policy, engine = setup
    loop, sample, conversation, _, _ = tool_rows(policy, "image")
    torch.manual_seed(0)
    out = loop.run(engine, [conversation], [sample], 4, Sampling(16, temperature=1.0))
    assert len(out.trajectories) == 4 and all(t.stop for t in out.trajectories)
    assert out.logprobs is not None and all(
        len(lp) == len(ids) for lp, ids in zip(out.logprobs, out.completion_ids)
    )


def harness_matches_hf(policy, engine, tmp_path, monkeypatch) -> None:
    """lmms-eval's bundled local task (eval.harness) through ``engine``: the same greedy
    answers and scores as through the hf engine."""
    pytest.importorskip("lmms_eval")
    from mmrft.evaluation.harness import Harness

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    harness = Harness(["mmrft_shapes_colour"], [], 6, 6, 12, 0, "tiny")
    answers = []
    for on in (engine, HFEngine(policy, 6)):
        result = harness.run(policy, on)
        docs = result.samples["mmrft_shapes_colour"]
        answers.append(([d["filtered_resps"] for d in docs], result.metrics))
    assert answers[0] == answers[1] and len(answers[0][0]) == 6


def test_lmms_eval_runs_through_the_vllm_engine(setup, tmp_path, monkeypatch) -> None:
    harness_matches_hf(*setup, tmp_path, monkeypatch)


def test_sparsely_sampled_video_logprobs(setup) -> None:
    """A video sampled far below its native rate (9 s at 20 fps, 4 frames: 4.5 s per frame
    step, temporal positions 9 apart): vLLM's log-probs equal the trainer's. They were 0.15
    apart while the trainer took transformers 5.x's mRoPE, which starts the text after a video
    inside the video's positions (mmrft.models.qwen_vl.reference_rope_index)."""
    policy, engine = setup
    video = REPO / "assets" / "benchmarks" / "zoom_video" / "videos" / "train-0000.mp4"
    conversation = [
        {
            "role": "user",
            "content": [
                {"type": "video", "video": str(video)},
                {"type": "text", "text": "Colour?"},
            ],
        }
    ]
    torch.manual_seed(0)
    out = engine.generate([conversation], 4, Sampling(10, top_k=50))
    assert largest_logprob_gap(policy, out) <= 1e-3


# Every other family whose tiny model vLLM's CPU build runs (head_dim ≥ 32; Qwen3.5's Gated
# DeltaNet layers run in bf16 only there: "CPU GDN attention requires BF16"), with the medium of
# its tool observation. Qwen3-VL is the learner (the tiny one has head_dim 16).
OTHER_FAMILIES = [
    ("tiny-qwen2_vl", "image"),
    ("tiny-qwen2_audio", "audio"),
    ("tiny-glm4v", "image"),
    ("learner-qwen3_vl", "video"),
]


@pytest.mark.parametrize(("model", "kind"), OTHER_FAMILIES)
def test_other_families_greedy_logprobs_and_tool_turns(media, model, kind) -> None:
    """Qwen2-VL and GLM-4.1V (images), Qwen3-VL (videos) and Qwen2-Audio (audio, each clip as
    the trainer's feature extractor read it): greedy tokens equal the hf engine's, sampler
    log-probs the training forward's; and a tool trajectory whose observation is a crop, a
    clip of video frames or an audio clip continues exactly (the expanded prompt is the
    trainer's row, greedy = hf, log-probs = the training forward's)."""
    path = MODELS / model
    cfg = load_config(None, [f"model.path={path}", "train.steps=0", *BUDGET])
    policy = load_policy(cfg.model, torch.device("cpu"))
    # a second engine in the process replaces vLLM's process-wide groups, so this test runs
    # after the module engine's last use
    engine = VLLMEngine(policy, SETTINGS, {kind: 2}, str(path))
    check_against_hf(engine, policy, conversations(media, kind))
    check_tool_continuation(policy, engine, kind)


def test_pushed_weights_are_the_ones_sampled(model_path, media) -> None:
    """After an optimizer step the engine's greedy output changes, and equals the hf engine's
    on the updated policy (with LoRA: the adapters merged out of place)."""
    cfg = load_config(
        None,
        [f"model.path={model_path}", "train.steps=0", *BUDGET, "model.lora.enabled=true"],
    )
    policy = load_policy(cfg.model, torch.device("cpu"))
    engine = VLLMEngine(policy, SETTINGS, {"image": 1, "video": 1}, str(model_path))
    convs = conversations(media, "image")
    greedy = Sampling(10, greedy=True)
    before = engine.generate(convs, 1, greedy).completion_ids
    with torch.no_grad():  # a large step on every LoRA matrix
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.5)
    base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n}
    engine.sync_weights()
    after = engine.generate(convs, 1, greedy).completion_ids
    assert after != before
    assert after == HFEngine(policy, 8).generate(convs, 1, greedy).completion_ids
    unchanged = {n: p for n, p in policy.model.named_parameters() if "lora_" not in n}
    assert all(torch.equal(base[n], unchanged[n]) for n in base)  # merged out of place


def test_parity_check_stops_a_mismatched_pixel_budget(model_path, media, monkeypatch) -> None:
    cfg = load_config(None, [f"model.path={model_path}", "train.steps=0", *BUDGET])
    policy = load_policy(cfg.model, torch.device("cpu"))
    # the engine's processor gets a smaller pixel budget than the trainer's: it resizes the
    # images again and writes fewer image placeholders
    monkeypatch.setattr(
        policy.family,
        "engine_processor_kwargs",
        lambda: {"min_pixels": 784, "max_pixels": SIDE // 4},
    )
    engine = VLLMEngine(policy, SETTINGS, {"image": 1, "video": 1}, str(model_path))
    with pytest.raises(
        EngineParityError, match=r"sample 'a' differs from the trainer's.*placeholders"
    ):
        engine.check_parity(conversations(media, "image"), ["a", "b"])


def write_dataset(folder: Path, media: dict[str, list[str]], kind: str) -> Path:
    if kind == "image":
        path = folder / "images.jsonl"
        lines = [
            {
                "id": f"img-{i}",
                "messages": conversations({"image": [m]}, "image")[0],
                "target": name,
                "meta": {"choices": ["red", "blue", "green", "yellow"], "image_size": [112, 112]},
            }
            for i, (m, name) in enumerate(zip(media["image"], ["red", "blue"]))
        ]
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return path
    path = folder / "videos.json"
    items = [
        {
            "problem_id": i,
            "problem": "Which way does the square move?",
            "data_type": "video",
            "problem_type": "multiple choice",
            "options": ["A. right", "B. left"],
            "solution": f"<answer>{'A' if i == 0 else 'B'}</answer>",
            "path": m,
            "data_source": "test",
        }
        for i, m in enumerate(media["video"])
    ]
    path.write_text(json.dumps(items))
    return path


@pytest.mark.parametrize("kind", ["image", "video", "image-ahead"])
def test_three_training_steps_and_an_evaluation(model_path, media, tmp_path, kind) -> None:
    """Three steps through the colocated engine and an evaluation; ``image-ahead`` one step
    ahead (rollout.max_staleness=1: vLLM generates in the rollout thread from snapshots of
    the weights; steps 2 and 3 were sampled one update behind)."""
    from mmrft.training.trainer import train

    ahead = kind.endswith("-ahead")
    kind = kind.removesuffix("-ahead")

    data = write_dataset(tmp_path, media, kind)
    task = (
        ["task.name=classification"]
        if kind == "image"
        else ["task.name=video_qa", "data.format=video_r1"]
    )
    cfg = load_config(
        None,
        [
            f"model.path={model_path}",
            *BUDGET,
            *task,
            "task.params={think: none}",
            "reward.verifiers=[{name: test_vllm_length}]",
            f"data.train={data}",
            f"data.test={data}",
            "rollout.engine=vllm",
            "rollout.vllm.kv_cache_gb=0.25",
            "rollout.vllm.max_model_len=1024",
            *(["rollout.max_staleness=1", "algorithm.tis_cap=2", "optim.lr=1e-2"] if ahead else []),
            "rollout.group_size=4",
            "rollout.max_new_tokens=8",
            "train.steps=3",
            "train.prompts_per_step=2",
            "train.micro_batch_size=8",
            "train.completions_every=1",
            "warm_start.steps=0",
            "eval.before=false",
            "eval.max_new_tokens=8",
            "checkpoint.every=0",
            f"output_dir={tmp_path}",
            "name=run",
        ],
    )
    summary = train(cfg)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    if ahead:
        assert [m["rollout/lag_max"] for m in steps] == [0.0, 1.0, 1.0]
        assert steps[0]["rollout/logp_gap_max"] <= 1e-3
        assert all(m["rollout/logp_gap_mean"] > 1e-3 for m in steps[1:])
    else:
        assert all(m["rollout/logp_gap_max"] <= 1e-3 for m in steps)
    assert all(m["train/grad_norm"] > 0 for m in steps)
    assert summary["after"] is not None
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"  # in-process


PLUGIN = """
from mmrft import Score, verifier


@verifier("test_vllm_length_plugin", low=0.0, high=1.0)
def length(completions, samples):
    return [Score(min(len(c), 30) / 30) for c in completions]
"""


def two_ranks(model_path, media, tmp_path, port: int, name: str, *extra: str) -> list[dict]:
    """``mmrft train`` under torchrun, two ranks of one thread on a small image run
    (``extra`` overrides last); the metrics lines of its training steps."""
    import subprocess
    import sys

    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    data = write_dataset(tmp_path, {**media, "image": media["image"] * 2}, "image")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
        "-m", "mmrft.cli", "train", f"model.path={model_path}", *BUDGET, "task.name=classification",
        "task.params={think: none}", f"plugins=[{plugin}]",
        "reward.verifiers=[{name: test_vllm_length_plugin}]", f"data.train={data}", "data.test=",
        "rollout.vllm.kv_cache_gb=0.25", "rollout.vllm.max_model_len=1024",
        "rollout.group_size=4", "rollout.max_new_tokens=8", "train.prompts_per_step=2",
        "train.micro_batch_size=8", "train.threads=1", "warm_start.steps=0", "eval.before=false",
        "checkpoint.every=0", f"output_dir={tmp_path}", f"name={name}", *extra,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if "train/reward" in m]


@pytest.mark.parametrize(
    "held",
    [[], ["train.sharding=fsdp_full"], ["train.sharding=fsdp_full", "model.lora.enabled=true"]],
    ids=["replicated", "fsdp_full", "fsdp_full-lora"],
)
def test_two_ranks_each_run_their_own_engine(model_path, media, tmp_path, held) -> None:
    """Under torchrun every rank gets its own in-process engine on the trainer's process group
    (vLLM's external launcher), samples its share, and receives the weights of the update:
    replicated, or sharded with FSDP2 (every rank gathers the parameters, LoRA merged), the
    sampler's log-probs equal the trainer's."""
    steps = two_ranks(
        model_path, media, tmp_path, 29571, "ranks", "rollout.engine=vllm", "train.steps=2", *held
    )
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["rollout/generated"] == 8 for m in steps)  # 2 ranks × 1 prompt × G = 4
    assert all(m["rollout/logp_gap_max"] <= 1e-3 for m in steps)


def test_two_ranks_one_step_ahead_each_with_its_own_server(model_path, media, tmp_path) -> None:
    """Under torchrun with rollout.max_staleness=1 every rank starts its own server and runs a
    rollout thread (its collectives on a group of its own) that samples step t + 1 while the
    trainers update step t: step 1 at lag 0 with the sampler's log-probs the trainer's, later
    steps at lag 1, both ranks' groups in every step."""
    ahead = ["rollout.max_staleness=1", "algorithm.tis_cap=2", "optim.lr=1e-2"]
    steps = two_ranks(
        model_path, media, tmp_path, 29572, "ahead", "rollout.engine=vllm_server",
        "train.steps=3", *ahead,
    )  # fmt: skip
    assert [m["rollout/lag_max"] for m in steps] == [0.0, 1.0, 1.0]
    assert all(m["rollout/generated"] == 8 for m in steps)  # 2 ranks × 1 prompt × G = 4
    assert steps[0]["rollout/logp_gap_max"] <= 1e-3
    assert all(m["rollout/stale_dropped"] == 0 for m in steps)


# -- the served engine (rollout.engine=vllm_server): vLLM's own server process -------------------


def served_settings(tmp: Path, **overrides) -> ServerConfig:
    """A started server's settings with its log under ``tmp`` (kept there when it fails)."""
    return ServerConfig(log=str(tmp / "server.log"), **overrides)


def test_a_killed_server_stops_the_run_and_resume_continues(
    model_path, media, tmp_path, monkeypatch
) -> None:
    """The server is SIGKILLed before step 2's rollout (after step 1's checkpoint): the run
    stops with an error naming the server, its fate and its log; checkpoint.resume=auto
    continues from step 1 with a fresh server and finishes."""
    import signal

    from mmrft.training.trainer import train

    data = write_dataset(tmp_path, media, "image")
    overrides = [
        f"model.path={model_path}",
        *BUDGET,
        "task.name=classification",
        "task.params={think: none}",
        "reward.verifiers=[{name: test_vllm_length}]",
        f"data.train={data}",
        "data.test=",
        "rollout.engine=vllm_server",
        "rollout.vllm.kv_cache_gb=0.25",
        "rollout.vllm.max_model_len=1024",
        f"rollout.server.log={tmp_path / 'server.log'}",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "train.steps=2",
        "train.prompts_per_step=2",
        "train.micro_batch_size=8",
        "warm_start.steps=0",
        "eval.before=false",
        "checkpoint.every=1",
        f"output_dir={tmp_path}",
        "name=run",
    ]
    pushes, killed = [], []
    sync, generate = ServedEngine.sync_weights, ServedEngine.generate

    def counted_sync(self) -> None:
        sync(self)
        pushes.append(self.push_timings["total_s"])

    def kill_before_step_2(self, *args, **kwargs):
        if len(pushes) == 2 and not killed:  # the start-up push and step 1's
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            killed.append(self.url)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(ServedEngine, "sync_weights", counted_sync)
    monkeypatch.setattr(ServedEngine, "generate", kill_before_step_2)
    with pytest.raises(ServerError) as info:
        train(load_config(None, overrides))
    message = str(info.value)
    assert killed and f"the vLLM server at {killed[0]}: generating 2 prompts × 4" in message
    assert "was killed by SIGKILL" in message and "last lines of its log" in message
    assert "checkpoint.resume=auto" in message
    run_dir = tmp_path / "run"
    assert [p.name for p in (run_dir / "checkpoints").glob("step-*")] == ["step-000001"]

    monkeypatch.undo()
    summary = train(load_config(None, [*overrides, "checkpoint.resume=auto"]))
    assert summary is not None
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2]  # step 2 by the resumed run
    assert all(m["rollout/logp_gap_max"] <= 1e-3 for m in steps)
    assert all(m["train/grad_norm"] > 0 for m in steps)


def started_server(model_path: Path, folder: Path, *overrides: str):
    """The tiny model loaded here with ``overrides`` and a server started for it (its log in
    ``folder``), room for three images and three videos a prompt."""
    cfg = load_config(None, [f"model.path={model_path}", "train.steps=0", *BUDGET, *overrides])
    policy = load_policy(cfg.model, torch.device("cpu"))
    engine = ServedEngine(
        policy, SETTINGS, served_settings(folder), {"image": 3, "video": 3}, str(model_path)
    )
    return policy, engine


@pytest.fixture(scope="module")
def served(model_path, tmp_path_factory):
    """A LoRA policy (fresh adapters: the base model's outputs; no dropout, so that its
    forward is deterministic) and a server started for it, shared by the tests below (a server
    takes a while to start on two cores)."""
    lora = ["model.lora.enabled=true", "model.lora.dropout=0"]
    policy, engine = started_server(model_path, tmp_path_factory.mktemp("served"), *lora)
    yield policy, engine
    engine.close()
    assert engine.proc.poll() is not None


@pytest.mark.parametrize("kind", ["image", "video"])
def test_served_greedy_and_logprobs_equal_the_trainers(served, media, kind) -> None:
    """The server sees the trainer's tokens and media: parity, greedy completions equal to
    the hf engine's, sampler log-probs equal to the training forward's within 1e-3."""
    policy, engine = served
    convs = conversations(media, kind)
    engine.check_parity(convs, ["a", "b"])
    greedy = Sampling(12, greedy=True)
    hf = HFEngine(policy, 8).generate(convs, 1, greedy)
    out = engine.generate(convs, 1, greedy)
    assert out.completion_ids == hf.completion_ids
    assert [r["input_ids"].tolist() for r in out.prompts] == [
        r["input_ids"].tolist() for r in hf.prompts
    ]
    torch.manual_seed(0)
    out = engine.generate(convs, 4, Sampling(10, top_p=0.9, top_k=50))
    assert out.prompt_index == [0, 0, 0, 0, 1, 1, 1, 1] and len(out.prompts) == 2
    assert largest_logprob_gap(policy, out) <= 1e-3
    suppressed = set(policy.family.suppress_token_ids(policy.processor))
    assert not any(t in suppressed for ids in out.completion_ids for t in ids)


def test_lmms_eval_runs_through_the_served_engine(served, tmp_path, monkeypatch) -> None:
    harness_matches_hf(*served, tmp_path, monkeypatch)


def test_served_tool_trajectory_continues_exactly(served, media) -> None:
    """continue_rows: the server expands a trajectory with a new image to the trainer's row,
    and its greedy turn equals the hf engine's."""
    from mmrft.policy.trajectory import joined_row

    policy, engine = served
    _, _, _, prompt, trajectory = tool_rows(policy, "image")
    row = joined_row(prompt, trajectory, policy.family.token_keys)
    greedy = Sampling(10, greedy=True)
    assert engine.continue_rows([row], greedy).completion_ids == (
        HFEngine(policy, 4).continue_rows([row], greedy).completion_ids
    )


def assert_push_is_sampled(policy, engine, convs) -> None:
    """A large step on every trained matrix, then ``sync_weights``: the engine's greedy tokens
    change and equal the hf engine's on the updated policy, and its sampled log-probs are the
    training forward's within 1e-3."""
    greedy = Sampling(10, greedy=True)
    before = engine.generate(convs, 1, greedy).completion_ids
    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.5)
    engine.sync_weights()
    after = engine.generate(convs, 1, greedy).completion_ids
    assert after != before
    assert after == HFEngine(policy, 8).generate(convs, 1, greedy).completion_ids
    torch.manual_seed(0)
    out = engine.generate(convs, 4, Sampling(10, top_k=50))
    assert largest_logprob_gap(policy, out) <= 1e-3


def test_served_pushed_weights_are_the_ones_sampled(served, media) -> None:
    """After a large step on every LoRA matrix and sync_weights (merged weights through
    /dev/shm and the server's reload), the server's greedy tokens and log-probs are the
    updated policy's."""
    policy, engine = served
    assert_push_is_sampled(policy, engine, conversations(media, "image"))
    timings = engine.push_timings
    print(
        f"weight push: {timings['bytes'] / 1e6:.1f} MB in {timings['total_s']:.3f} s "
        f"(write {timings['write_s']:.3f} s, reload {timings['reload_s']:.3f} s) "
        f"to {engine.weights_dir}"
    )


def test_served_lora_push_samples_the_updated_adapter(model_path, media, tmp_path) -> None:
    """rollout.server.push=lora: a server started with --enable-lora gets only the adapter
    after a large step on every LoRA matrix, and samples the updated policy: greedy tokens
    equal to the hf engine's, log-probs to the training forward's within 1e-3."""
    lora = ["model.lora.enabled=true", "model.lora.dropout=0", "model.freeze_vision=true"]
    cfg = load_config(None, [f"model.path={model_path}", "train.steps=0", *BUDGET, *lora])
    policy = load_policy(cfg.model, torch.device("cpu"))
    settings = served_settings(tmp_path, push="lora")
    engine = ServedEngine(policy, SETTINGS, settings, {"image": 3, "video": 3}, str(model_path))
    try:
        engine.sync_weights()  # the fresh adapter: the base model's outputs
        convs = conversations(media, "image")
        greedy = Sampling(10, greedy=True)
        before = engine.generate(convs, 1, greedy).completion_ids
        assert before == HFEngine(policy, 8).generate(convs, 1, greedy).completion_ids
        assert_push_is_sampled(policy, engine, convs)
        full = sum(t.numel() * t.element_size() for _, t in merged_weights(policy.model))
        print(
            f"adapter push: {engine.push_timings['bytes'] / 1e6:.2f} MB (full weights "
            f"{full / 1e6:.2f} MB) in {engine.push_timings['total_s']:.3f} s"
        )
    finally:
        engine.close()


def test_two_training_steps_pushing_the_adapter(model_path, media, tmp_path) -> None:
    """mmrft train with rollout.server.push=lora: the trainer starts its server with LoRA on,
    pushes the adapter at start-up and after each step; the sampler's log-probs stay the
    trainer's."""
    from mmrft.training.trainer import train

    data = write_dataset(tmp_path, media, "image")
    cfg = load_config(
        None,
        [
            f"model.path={model_path}", *BUDGET, "task.name=classification",
            "task.params={think: none}", "reward.verifiers=[{name: test_vllm_length}]",
            f"data.train={data}", "data.test=", "rollout.engine=vllm_server",
            "rollout.server.push=lora", f"rollout.server.log={tmp_path / 'server.log'}",
            "rollout.vllm.kv_cache_gb=0.25", "rollout.vllm.max_model_len=1024",
            "model.lora.enabled=true", "model.freeze_vision=true", "optim.lr=1e-2",
            "rollout.group_size=4", "rollout.max_new_tokens=8", "train.prompts_per_step=2",
            "train.micro_batch_size=8", "train.steps=2", "warm_start.steps=0",
            "eval.before=false", "checkpoint.every=0", f"output_dir={tmp_path}", "name=adapter",
        ],
    )  # fmt: skip
    train(cfg)
    lines = [
        json.loads(x) for x in (tmp_path / "adapter" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [m for m in lines if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["rollout/logp_gap_max"] <= 1e-3 for m in steps)
    assert all(m["train/grad_norm"] > 0 for m in steps)
    assert "--enable-lora" in (tmp_path / "server.log").read_text()


def served_run(engine, model_path, media, tmp_path, name: str, *extra: str):
    """A small image run through the module's server at its URL (``extra`` overrides last)."""
    data = write_dataset(tmp_path, media, "image")
    return load_config(
        None,
        [
            f"model.path={model_path}",
            *BUDGET,
            "task.name=classification",
            "task.params={think: none}",
            "reward.verifiers=[{name: test_vllm_length}]",
            f"data.train={data}",
            f"data.test={data}",
            "rollout.engine=vllm_server",
            f"rollout.server.url={engine.url}",
            "rollout.group_size=4",
            "rollout.max_new_tokens=8",
            "train.prompts_per_step=2",
            "train.micro_batch_size=8",
            "warm_start.steps=0",
            "eval.before=false",
            "eval.max_new_tokens=8",
            "checkpoint.every=0",
            f"output_dir={tmp_path}",
            f"name={name}",
            *extra,
        ],
    )


def test_two_training_steps_on_a_server_at_a_url(served, model_path, media, tmp_path) -> None:
    """mmrft train with rollout.server.url: the module's running server (its weights are the
    trainer's from the start-up push on), two steps and an evaluation."""
    from mmrft.training.trainer import train

    _, engine = served
    summary = train(served_run(engine, model_path, media, tmp_path, "run", "train.steps=2"))
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["rollout/logp_gap_max"] <= 1e-3 for m in steps)
    assert all(m["train/grad_norm"] > 0 for m in steps)
    assert summary["after"] is not None
    assert engine.proc.poll() is None  # a server at a URL is not the run's to stop


def test_one_step_ahead_through_the_server(served, model_path, media, tmp_path) -> None:
    """rollout.max_staleness=1 on the served engine: the rollout thread samples step t + 1 on
    the server while the trainer updates step t, the weights reaching the server as snapshots.
    Step 1 samples the start weights (lag 0: the sampler's log-probs are the trainer's); later
    steps were sampled one update behind (lag 1), so the gap is the update's, which the
    truncated importance weights correct."""
    from mmrft.training.trainer import train

    _, engine = served
    ahead = ["rollout.max_staleness=1", "algorithm.tis_cap=2", "optim.lr=1e-2"]
    train(
        served_run(
            engine,
            model_path,
            media,
            tmp_path,
            "ahead",
            *ahead,
            "train.steps=3",
            "eval.after=false",
        )
    )
    lines = (tmp_path / "ahead" / "metrics.jsonl").read_text().splitlines()
    steps = [m for m in map(json.loads, lines) if "train/reward" in m]
    assert [m["rollout/lag_max"] for m in steps] == [0.0, 1.0, 1.0]
    assert steps[0]["rollout/logp_gap_max"] <= 1e-3
    assert all(m["rollout/logp_gap_mean"] > 1e-3 for m in steps[1:])
    assert all(m["rollout/stale_dropped"] == 0 for m in steps)


def test_the_http_judge_through_vllms_own_server(served, tmp_path) -> None:
    """The ``judge`` verifier's http backend against vLLM's OpenAI chat route (the module's
    server, serving the tiny model): every call is answered (HTTP 200, the reply parsed, the
    judge's text kept), so each score is a verdict in range or, as the random tiny model mostly
    writes no verdict, the minimum with reason 'judge unparsable'; never a transport failure.
    Then two training steps with the judge in the reward and as an evaluation metric."""
    import urllib.request

    import mmrft
    from mmrft.rewards.judges import HTTPJudge, Request

    _, engine = served
    with urllib.request.urlopen(engine.url + "/v1/models", timeout=30) as reply:
        name = json.loads(reply.read())["data"][0]["id"]
    judge = HTTPJudge(base_url=engine.url + "/v1", model=name, max_tokens=8, retries=0)
    replies = judge.complete([Request(f"Is {n} a prime? Answer yes or no.") for n in (2, 4, 7)])
    assert all(r.error is None and isinstance(r.text, str) for r in replies), replies

    params = {"base_url": engine.url + "/v1", "model": name, "answer_tag": "", "max_tokens": 8}
    entry = {"name": "judge", "params": params}
    cfg = mmrft.load_config(
        "demo",
        [
            "train.steps=2",
            "warm_start.steps=2",
            "train.prompts_per_step=2",
            "rollout.group_size=4",
            "eval.before=false",
            "data.max_test_samples=4",
            f"output_dir={tmp_path}",
            "name=judged",
            f"reward.verifiers=[{{name: format, params: {{think: none}}}}, {json.dumps(entry)}]",
            f"eval.verifiers=[{json.dumps(entry)}]",
        ],
    )
    mmrft.train(cfg)
    run = tmp_path / "judged"
    results = json.loads((run / "eval" / "after" / "results.json").read_text())
    assert "verifier/judge" in results["metrics"]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(0.0 <= m["train/reward/judge"] <= 1.0 for m in steps)


@pytest.mark.parametrize(("model", "kind"), OTHER_FAMILIES)
def test_served_other_families_greedy_logprobs_and_tool_turns(media, model, kind, tmp_path) -> None:
    """The families of test_other_families_greedy_logprobs_and_tool_turns through a started
    server (clips sent as float WAV): parity, greedy tokens equal to the hf engine's, log-probs
    the training forward's, and a tool trajectory with a crop, frames or an audio clip
    continued exactly."""
    path = MODELS / model
    cfg = load_config(None, [f"model.path={path}", "train.steps=0", *BUDGET])
    policy = load_policy(cfg.model, torch.device("cpu"))
    engine = ServedEngine(policy, SETTINGS, served_settings(tmp_path), {kind: 2}, str(path))
    try:
        check_against_hf(engine, policy, conversations(media, kind))
        check_tool_continuation(policy, engine, kind)
    finally:
        engine.close()


# -- a teacher served by vLLM (teacher.server.url): on-policy distillation ---------------------


@pytest.fixture(scope="module")
def teacher_server(model_path, tmp_path_factory):
    """vLLM's server of the tiny model as a frozen teacher (nothing is pushed to it), and the
    same checkpoint loaded here: the in-process teacher it must equal."""
    policy, engine = started_server(model_path, tmp_path_factory.mktemp("teacher"))
    yield policy, engine
    engine.close()


def assert_scores_equal_the_in_process_teacher(policy, engine, model_path, rollouts) -> None:
    """The served teacher's log-probs of every model token equal the in-process teacher's
    training forward within 1e-3, and its argmax agreement is the same."""
    from mmrft.algorithms import argmax_match
    from mmrft.rollout.served_teacher import ServedTeacher, padded_scores

    cfg = load_config(
        None,
        [f"model.path={model_path}", "train.steps=0", *BUDGET, f"teacher.server.url={engine.url}"],
    )
    teacher = ServedTeacher(cfg, policy)
    indices = list(range(len(rollouts.completion_ids)))
    scores = teacher.score(rollouts, indices)
    with torch.no_grad():
        logps, mask, agree = rollout_logps(
            policy, rollouts, indices, group_shared=True, token_stat=argmax_match
        )
    served_logps, served_agree = padded_scores(scores, indices, logps)
    assert int(mask.sum()) > 8
    assert float(((served_logps - logps).abs() * mask).max()) <= 1e-3
    assert int(((served_agree != agree) * mask).sum()) == 0


@pytest.mark.parametrize("kind", ["image", "video"])
def test_a_served_teacher_scores_like_the_in_process_one(teacher_server, media, kind) -> None:
    """Sampled completions of the hf engine (its rows keep their media for the server) scored
    by the served teacher: the in-process teacher's log-probs and argmax agreement."""
    policy, engine = teacher_server
    torch.manual_seed(0)
    out = HFEngine(policy, 8, keep_media=True).generate(
        conversations(media, kind), 4, Sampling(10, top_p=0.9)
    )
    assert_scores_equal_the_in_process_teacher(policy, engine, MODELS / "tiny-qwen2_5_vl", out)


def test_a_served_teacher_scores_a_tool_trajectory(teacher_server) -> None:
    """A tool trajectory with an image observation: the whole stream and both images go to the
    server; the model's tokens get the in-process teacher's log-probs."""
    from mmrft.rollout.base import Rollouts

    policy, engine = teacher_server
    _, _, _, prompt, trajectory = tool_rows(policy, "image")
    rollouts = Rollouts(
        prompts=[prompt],
        prompt_index=[0],
        completion_ids=[trajectory.ids],
        texts=[""],
        truncated=[False],
        trajectories=[trajectory],
    )
    assert_scores_equal_the_in_process_teacher(policy, engine, MODELS / "tiny-qwen2_5_vl", rollouts)


def teacher_run(model_path, media, tmp_path) -> list[str]:
    """The overrides of a two-step distillation + reward run on the image dataset."""
    data = write_dataset(tmp_path, media, "image")
    return [
        f"model.path={model_path}",
        *BUDGET,
        "task.name=classification",
        "task.params={think: none}",
        "reward.verifiers=[{name: test_vllm_length}]",
        f"data.train={data}",
        "data.test=",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "train.steps=2",
        "train.prompts_per_step=2",
        "train.micro_batch_size=8",
        "train.threads=1",
        "optim.lr=1e-2",
        "warm_start.steps=0",
        "eval.before=false",
        "checkpoint.every=0",
        f"output_dir={tmp_path}",
    ]


def test_training_with_a_served_teacher_equals_the_in_process_teacher(
    teacher_server, model_path, media, tmp_path
) -> None:
    """Two steps of distillation + reward with the hf rollout engine: teacher.server.url and
    teacher.path (the same checkpoint) log the same rewards, reverse KL and agreement."""
    from mmrft.training.trainer import train

    _, engine = teacher_server
    common = teacher_run(model_path, media, tmp_path)
    runs = {}
    for name, teacher in (
        ("served", f"teacher.server.url={engine.url}"),
        ("local", f"teacher.path={model_path}"),
    ):
        train(load_config(None, [*common, f"name={name}", teacher]))
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        runs[name] = [json.loads(x) for x in lines if '"train/reward"' in x]
    served, local = runs["served"], runs["local"]
    assert [m["step"] for m in served] == [1, 2]
    assert served[1]["distill/reverse_kl"] > 1e-3  # step 1 moved the student off its teacher
    for a, b in zip(served, local):
        assert a["train/reward"] == pytest.approx(b["train/reward"], abs=1e-6)
        for key in ("distill/reverse_kl", "distill/teacher_agree"):
            assert a[key] == pytest.approx(b[key], abs=1e-3), key
        assert a["time/teacher_forward_s"] > 0


def test_a_served_teacher_one_step_ahead_with_a_lora_student(
    teacher_server, model_path, media, tmp_path
) -> None:
    """Asynchronous rollouts (max_staleness 1, the teacher scores at update time) and a LoRA
    student: both steps get the teacher's per-token signal, and it moves the student off it."""
    from mmrft.training.trainer import train

    _, engine = teacher_server
    extra = [
        f"teacher.server.url={engine.url}",
        "model.lora.enabled=true",
        "rollout.max_staleness=1",
        "algorithm.tis_cap=2",
        "name=ahead",
    ]
    train(load_config(None, [*teacher_run(model_path, media, tmp_path), *extra]))
    lines = (tmp_path / "ahead" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(x) for x in lines if '"train/reward"' in x]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(0.0 <= m["distill/teacher_agree"] <= 1.0 for m in steps)
    assert steps[0]["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-3)  # the student is it
    # step 2 trains on tokens the start weights (= the teacher) sampled, one update old: the
    # per-token estimate is then −KL(π_teacher ‖ π_θ) ≤ 0 in expectation, not 0: a signal
    assert abs(steps[1]["distill/reverse_kl"]) > 1e-3 and steps[1]["rollout/lag_max"] == 1
