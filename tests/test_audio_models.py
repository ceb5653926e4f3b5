"""Tiny Qwen2-Audio / Qwen2.5-Omni thinker checkpoints and their family adapters (offline, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from helpers import chat_text, family_fixtures
from PIL import Image

from mmrft.data import DataError, Sample
from mmrft.data.audio import AUDIO_STATS
from mmrft.models import tiny
from mmrft.models.family import family_for_model_type
from mmrft.models.qwen_audio import (
    AudioBudget,
    Qwen2Audio,
    Qwen25Omni,
    audio_token_count,
    check_media,
)
from mmrft.plugins import MODEL_FAMILIES
from mmrft.policy.model import Policy, completion_logps
from mmrft.rollout.base import Sampling, cut_at_stop, stop_token_ids
from mmrft.rollout.hf import HFEngine
from mmrft.typecheck import ConfigError

ASSETS = Path(__file__).resolve().parents[1] / "assets"
FAMILIES = {"qwen2_audio": Qwen2Audio, "qwen2_5_omni": Qwen25Omni}
MODEL_CLASSES = {
    "qwen2_audio": "Qwen2AudioForConditionalGeneration",
    "qwen2_5_omni": "Qwen2_5OmniThinkerForConditionalGeneration",
}
PROCESSORS = {"qwen2_audio": "Qwen2AudioProcessor", "qwen2_5_omni": "Qwen2_5OmniProcessor"}


model_dirs, loaded = family_fixtures(FAMILIES)


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A 1 s mono wav at 8 kHz, a 1.7 s stereo flac at 44.1 kHz, a 12 s wav, an image."""
    folder = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    t = np.arange(8000) / 8000
    sf.write(folder / "short.wav", (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 8000)
    sf.write(folder / "long.flac", rng.uniform(-0.3, 0.3, (74970, 2)).astype(np.float32), 44100)
    sf.write(folder / "twelve.wav", rng.uniform(-0.1, 0.1, 12 * 16000).astype(np.float32), 16000)
    Image.new("RGB", (112, 84), (30, 70, 225)).save(folder / "wide.png")
    return {
        "short": str(folder / "short.wav"),
        "long": str(folder / "long.flac"),
        "twelve": str(folder / "twelve.wav"),
        "image": str(folder / "wide.png"),
    }


def conversation(audio: str, text: str = "What is the main sound in the audio?") -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "audio", "audio": audio}, {"type": "text", "text": text}],
        }
    ]


def sample_and_score(family, processor, model, batch, seed: int = 0):
    """Sample with generate(output_logits=True); return (completions, sampler log-probs)."""
    torch.manual_seed(seed)
    stop = [processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id]
    out = model.generate(
        **batch,
        max_new_tokens=6,
        do_sample=True,
        suppress_tokens=family.suppress_token_ids(processor),
        eos_token_id=stop,
        pad_token_id=processor.tokenizer.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[:, batch["input_ids"].shape[1] :]
    logps = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)
    sampled = logps.gather(-1, new.unsqueeze(-1)).squeeze(-1)
    completions = [cut_at_stop(ids, stop)[0] for ids in new.tolist()]
    return completions, sampled


def test_families_registered() -> None:
    assert MODEL_FAMILIES.get("qwen2_audio") is Qwen2Audio
    assert MODEL_FAMILIES.get("qwen2_5_omni") is Qwen25Omni
    assert family_for_model_type("qwen2_audio") is Qwen2Audio
    assert family_for_model_type("qwen2_5_omni") is Qwen25Omni  # released checkpoints
    assert family_for_model_type("qwen2_5_omni_thinker") is Qwen25Omni  # what mmrft saves
    assert Qwen25Omni.box_frame == "input_pixels" and "pixel" in Qwen25Omni.box_instruction
    assert audio_token_count(100) == 25 and audio_token_count(1000) == 250


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tiny_loads_offline_with_auto_processor(model_dirs: dict[str, Path], name: str) -> None:
    import transformers
    from transformers import AutoProcessor

    path = model_dirs[name]
    assert sum(p.stat().st_size for p in path.iterdir()) < 3_000_000
    processor = AutoProcessor.from_pretrained(path)
    model = getattr(transformers, MODEL_CLASSES[name]).from_pretrained(path)
    assert type(processor).__name__ == PROCESSORS[name]
    extractor = processor.feature_extractor
    assert type(extractor).__name__ == "WhisperFeatureExtractor"
    assert (extractor.sampling_rate, extractor.feature_size) == (16000, tiny.TINY_MEL_BINS)
    tok = processor.tokenizer
    assert model.config.text_config.vocab_size == len(tok)
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tok.pad_token_id]
    assert model.config.audio_token_id == tok.convert_tokens_to_ids("<|AUDIO|>")
    special = tiny.SPECIAL_TOKENS[name]
    for token in special:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] >= len(tok) - len(special) - 8, token
    for word in ("audio", "sound", "What", "beeps", "pitch", "red", "circle"):
        assert len(tok.encode(" " + word, add_special_tokens=False)) == 1, word
    for word in tiny.AUDIO_ANSWERS:  # the demo's answers: "<answer" ">word" "</" "answer" ">"
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word
        assert len(tok.encode(f"<answer>{word}</answer>", add_special_tokens=False)) == 5, word
    if name == "qwen2_5_omni":
        assert model.config.model_type == "qwen2_5_omni_thinker"
        assert processor.image_token == "<|IMAGE|>" and processor.audio_bos_token == "<|audio_bos|>"
        assert model.config.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_bos|>")


def test_chat_templates_match_the_real_ones(loaded: dict) -> None:
    _, processor, _ = loaded["qwen2_audio"]
    text = chat_text(processor, conversation("a.wav", "Hi"))
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    _, processor, _ = loaded["qwen2_5_omni"]
    parts = [
        {"type": "image", "image": "x.png"},
        {"type": "audio", "audio": "a.wav"},
        {"type": "text", "text": "Hi"},
    ]
    text = chat_text(processor, [{"role": "user", "content": parts}])
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|vision_bos|><|IMAGE|><|vision_eos|><|audio_bos|><|AUDIO|><|audio_eos|>Hi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("name", list(FAMILIES))
def test_prepare_batch_with_two_lengths(loaded: dict, media: dict, name: str) -> None:
    family, processor, model = loaded[name]
    batch = family.prepare(processor, [conversation(media["short"]), conversation(media["long"])])
    assert set(batch) == {"input_ids", "attention_mask", "input_features", "feature_attention_mask"}
    frames = (tiny.QWEN2_AUDIO_SECONDS if name == "qwen2_audio" else tiny.TINY_AUDIO_SECONDS) * 100
    assert batch["input_features"].shape == (2, tiny.TINY_MEL_BINS, frames)
    assert batch["input_features"].dtype == torch.float32
    # 1 s → 100 frames → 25 tokens; 1.7 s (44.1 kHz resampled) → 170 frames → 42 tokens
    assert batch["feature_attention_mask"].sum(-1).tolist() == [100, 170]
    ids, mask = batch["input_ids"], batch["attention_mask"]
    audio_id = processor.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    assert (ids == audio_id).sum(-1).tolist() == [25, 42]
    pad = processor.tokenizer.pad_token_id
    n_pad = int((mask[0] == 0).sum())
    assert n_pad == 42 - 25 and (ids[0, :n_pad] == pad).all() and mask[:, -1].all()  # left padding
    suppress = family.suppress_token_ids(processor)
    assert len(suppress) == (3 if name == "qwen2_audio" else 8)
    out = model.generate(
        **batch, max_new_tokens=4, do_sample=True, suppress_tokens=suppress, pad_token_id=pad
    )
    new = out[:, ids.shape[1] :]
    assert new.shape == (2, 4) and not any(t in suppress for t in new.flatten().tolist())


@pytest.mark.parametrize("name", list(FAMILIES))
def test_split_collate_is_exact_in_any_order(loaded: dict, media: dict, name: str) -> None:
    family, processor, model = loaded[name]
    convs = [
        conversation(media["long"]),
        [{"role": "user", "content": "No audio here."}],
        [
            {
                "role": "user",
                "content": [
                    {"type": "audio", "audio": media["short"]},
                    {"type": "text", "text": "and"},
                    {"type": "audio", "audio_url": media["long"]},
                ],
            }
        ],
    ]
    batch = family.prepare(processor, convs)
    rows = family.split_rows(batch, processor)
    assert [len(r["input_features"]) for r in rows] == [1, 0, 2]
    collated = family.collate_rows(rows[::-1], processor.tokenizer.pad_token_id)
    assert torch.equal(collated["input_features"][0], batch["input_features"][1])  # row 2 first
    assert torch.equal(collated["input_features"][2], batch["input_features"][0])
    with torch.no_grad():
        full = model(**batch).logits[:, -1]
        again = model(**collated).logits[:, -1]
    assert torch.allclose(full, again.flip(0), atol=1e-5)
    batch["input_ids"][0, -5] = processor.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    with pytest.raises(RuntimeError, match="audio tokens and audio features do not match"):
        family.split_rows(batch, processor)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sampler_and_trainer_logprobs_agree(loaded: dict, media: dict, name: str) -> None:
    """completion_logps on split + re-collated rows = generate()'s log-probs of its samples."""
    family, processor, model = loaded[name]
    batch = family.prepare(
        processor, [conversation(media["short"]), conversation(media["long"], "Hi")]
    )
    completions, sampled = sample_and_score(family, processor, model, batch)
    rows = family.split_rows(batch, processor)
    policy = Policy(family, model, processor)
    with torch.no_grad():
        logps, mask, _ = completion_logps(policy, rows[::-1], completions[::-1])
    logps, mask = logps.flip(0), mask.flip(0).bool()
    width = logps.shape[1]
    assert torch.allclose(logps[mask], sampled[:, :width][mask], atol=1e-5)


def test_rollout_engine_and_bfloat16_training_forward(model_dirs: dict, media: dict) -> None:
    """The hf engine and completion_logps run an audio model in bf16 (input_features are cast
    to the model dtype through media_keys)."""
    family = Qwen2Audio()
    path = str(model_dirs["qwen2_audio"])
    policy = Policy(family, family.load_model(path, dtype="bfloat16"), family.load_processor(path))
    assert "<|im_end|>" in policy.tokenizer.convert_ids_to_tokens(stop_token_ids(policy))
    rollouts = HFEngine(policy, batch_size=4).generate(
        [conversation(media["short"])], 2, Sampling(max_new_tokens=3)
    )
    assert len(rollouts.completion_ids) == 2 and len(rollouts.prompt_rows) == 2
    policy.model.train()
    logps, mask, _ = completion_logps(policy, rollouts.prompt_rows, rollouts.completion_ids)
    assert logps.dtype == torch.float32 and torch.isfinite(logps[mask.bool()]).all()
    (-(logps * mask).sum()).backward()
    grads = [p.grad for p in family.vision_parameters(policy.model) if p.grad is not None]
    assert grads and all(torch.isfinite(g.float()).all() for g in grads)


def test_omni_images_video_and_audio_in_one_batch(
    loaded: dict, media: dict, tmp_path: Path
) -> None:
    family, processor, model = loaded["qwen2_5_omni"]
    frames = []
    for i in range(4):
        frames.append(str(tmp_path / f"frame{i}.png"))
        Image.new("RGB", (56, 56), (60 * i, 0, 0)).save(frames[-1])
    video = {"type": "video", "video": frames, "sample_fps": 1.0}
    video |= {"min_pixels": 3136, "max_pixels": 3136}
    image = {"type": "image", "image": media["image"]}
    convs = [
        [{"role": "user", "content": [image, *conversation(media["short"])[0]["content"]]}],
        [{"role": "user", "content": [video, {"type": "text", "text": "Q"}]}],
        conversation(media["long"]),
    ]
    batch = family.prepare(processor, convs)
    assert set(batch) == {
        "input_ids",
        "attention_mask",
        "input_features",
        "feature_attention_mask",
        "pixel_values",
        "image_grid_thw",
        "pixel_values_videos",
        "video_grid_thw",
        "video_second_per_grid",
    }
    assert batch["image_grid_thw"].tolist() == [[1, 6, 8]]  # 112×84 → 8×6 patches of 14 px
    assert family.input_size(112, 84) == (112, 84)
    assert batch["video_grid_thw"].tolist() == [[2, 4, 4]]
    assert batch["video_second_per_grid"].tolist() == [2.0]  # temporal patch 2 / 1 fps
    rows = family.split_rows(batch, processor)
    assert [len(r["input_features"]) for r in rows] == [1, 0, 1]
    assert [len(r["image_grid_thw"]) for r in rows] == [1, 0, 0]
    assert [len(r["video_second_per_grid"]) for r in rows] == [0, 1, 0]
    collated = family.collate_rows([rows[1], rows[2], rows[0]], processor.tokenizer.pad_token_id)
    with torch.no_grad():
        full = model(**batch).logits[:, -1]
        again = model(**collated).logits[:, -1]
    assert torch.allclose(full[[1, 2, 0]], again, atol=1e-5)
    completions, sampled = sample_and_score(family, processor, model, batch, seed=3)
    with torch.no_grad():
        logps, mask, _ = completion_logps(Policy(family, model, processor), rows, completions)
    mask = mask.bool()
    assert torch.allclose(logps[mask], sampled[:, : logps.shape[1]][mask], atol=1e-5)


def test_audio_budget_truncates_or_rejects(model_dirs: dict, media: dict) -> None:
    # the tiny Omni's 10 s window (tiny Qwen2-Audio keeps the released 30 s one)
    path = str(model_dirs["qwen2_5_omni"])
    family = Qwen25Omni()  # 30 s budget, capped by the tiny window of 10 s
    processor = family.load_processor(path)
    assert family.max_audio_seconds(processor) == tiny.TINY_AUDIO_SECONDS
    before = AUDIO_STATS["truncated"]
    batch = family.prepare(processor, [conversation(media["twelve"])])
    assert batch["feature_attention_mask"].sum().item() == 1000  # 10 s of frames
    assert AUDIO_STATS["truncated"] == before + 1
    short = Qwen25Omni(audio=AudioBudget(max_seconds=2.0))
    assert (
        short.prepare(processor, [conversation(media["long"])])["feature_attention_mask"].sum()
        == 170
    )
    assert (
        short.prepare(processor, [conversation(media["twelve"])])["feature_attention_mask"].sum()
        == 200
    )
    strict = Qwen25Omni(audio=AudioBudget(max_seconds=5.0, policy="error"))
    with pytest.raises(DataError, match=r"twelve\.wav.*longer than the 5 s limit"):
        strict.prepare(processor, [conversation(media["twelve"])])
    with pytest.raises(DataError, match=r"twelve\.wav"):
        strict.check_media(Sample("s", conversation(media["twelve"])))
    strict.check_media(Sample("s", conversation(media["long"])))
    window = Qwen25Omni(audio=AudioBudget(max_seconds=None, policy="error"))
    window.load_processor(path)  # the processor's 10 s window is the bound
    with pytest.raises(DataError, match=r"twelve\.wav.*10 s limit"):
        window.check_media(Sample("s", conversation(media["twelve"])))
    with pytest.raises(ValueError, match="policy"):
        AudioBudget(policy="skip")  # type: ignore[arg-type]


def test_missing_or_broken_audio_names_the_file(loaded: dict, media: dict, tmp_path: Path) -> None:
    family, processor, _ = loaded["qwen2_5_omni"]
    missing = tmp_path / "nope.wav"
    renamed = tmp_path / "text.wav"
    renamed.write_text("not audio")
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), 16000)
    for bad in (missing, renamed, empty):
        pattern = str(bad).replace(".", r"\.")
        with pytest.raises(DataError, match=pattern):
            family.prepare(processor, [conversation(media["short"]), conversation(str(bad))])
        with pytest.raises(DataError, match=pattern):
            check_media(Sample("s", conversation(str(bad))))
    with pytest.raises(DataError, match="URLs are not fetched"):
        family.prepare(processor, [conversation("https://example.com/a.wav")])
    good = Sample("g", conversation(media["long"]))
    check_media(good)
    assert good.meta["audio_duration"] == pytest.approx(1.7, abs=1e-3)


def test_qwen2_audio_rejects_image_parts(loaded: dict, media: dict) -> None:
    family, processor, _ = loaded["qwen2_audio"]
    parts = [{"type": "image", "image": media["image"]}, {"type": "text", "text": "Q"}]
    with pytest.raises(DataError, match="audio and text only"):
        family.prepare(processor, [[{"role": "user", "content": parts}]])
    text_only = family.prepare(processor, [[{"role": "user", "content": "Hi"}]])
    assert set(text_only) == {"input_ids", "attention_mask"}


def test_family_checks_the_checkpoint(model_dirs: dict) -> None:
    with pytest.raises(ConfigError, match="model_type 'qwen2_5_omni_thinker'"):
        Qwen2Audio().load_model(str(model_dirs["qwen2_5_omni"]))
    with pytest.raises(ConfigError, match="Qwen2_5OmniProcessor"):
        Qwen25Omni().load_processor(str(model_dirs["qwen2_audio"]))
    with pytest.raises(ConfigError, match="Qwen2AudioProcessor"):
        Qwen2Audio().load_processor(str(ASSETS / "models" / "tiny-qwen2_5_vl"))


def test_vision_tower_is_the_encoders(loaded: dict) -> None:
    family, _, model = loaded["qwen2_audio"]
    names = [
        n
        for n, p in model.named_parameters()
        if id(p) in {id(q) for q in family.vision_parameters(model)}
    ]
    assert names and all(n.startswith("model.audio_tower.") for n in names)
    family, _, model = loaded["qwen2_5_omni"]
    tower = {id(p) for p in family.vision_parameters(model)}
    names = [n for n, p in model.named_parameters() if id(p) in tower]
    assert {n.split(".")[1] for n in names} == {"visual", "audio_tower"}
    assert len(tower) < len(list(model.parameters()))


def test_released_omni_layout_loads_as_thinker(loaded: dict, media: dict, tmp_path: Path) -> None:
    """Released Qwen2.5-Omni checkpoints are model_type qwen2_5_omni (thinker + talker); the
    family loads their thinker."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration
    from transformers.utils import logging as hf_logging

    family, processor, thinker = loaded["qwen2_5_omni"]
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # default talker token ids lie outside the tiny vocab
    try:
        config = Qwen2_5OmniConfig(
            thinker_config=thinker.config.to_dict(), enable_audio_output=False
        )
        full = Qwen2_5OmniForConditionalGeneration(config)
        full.thinker.load_state_dict(thinker.state_dict())
        full.save_pretrained(tmp_path)
        processor.save_pretrained(tmp_path)
        assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2_5_omni"
        again = family.load_model(str(tmp_path)).eval()
    finally:
        hf_logging.set_verbosity(verbosity)
    batch = family.prepare(processor, [conversation(media["short"])])
    with torch.no_grad():
        assert torch.equal(thinker(**batch).logits, again(**batch).logits)


def test_build_is_deterministic(tmp_path: Path) -> None:
    import transformers

    for name in FAMILIES:
        first = tiny.build_tiny(name, tmp_path / f"a-{name}", seed=0)
        committed = ASSETS / "models" / f"tiny-{name}"
        if (committed / "config.json").is_file():  # stale assets: rerun `mmrft make-tiny`
            built_with = json.loads((committed / "config.json").read_text())["transformers_version"]
            if built_with == transformers.__version__:
                assert tiny.tree_digest(committed) == tiny.tree_digest(first)
    second = tiny.build_tiny("qwen2_audio", tmp_path / "b", seed=0)
    assert tiny.tree_digest(second) == tiny.tree_digest(tmp_path / "a-qwen2_audio")
    other = tiny.build_tiny("qwen2_audio", tmp_path / "c", seed=1)
    assert (other / "model.safetensors").read_bytes() != (second / "model.safetensors").read_bytes()


def test_omni_video_follows_the_configured_budget(model_dirs: dict, media: dict) -> None:
    """``model.video`` reaches the Omni family (build_family), and with ``max_prompt_tokens``
    the video's fps and pixels are lowered until the whole prompt (text, audio and video
    tokens) fits, as for Qwen2.5-VL."""
    from mmrft.config import ModelConfig
    from mmrft.data.video import VideoBudget, video_stats
    from mmrft.models.family import build_family

    cfg = ModelConfig(path=str(model_dirs["qwen2_5_omni"]))
    cfg.video.max_frames = 6
    family = build_family(Qwen25Omni, cfg)
    assert family.video.max_frames == 6 and family.audio.max_seconds == cfg.audio.max_seconds
    processor = family.load_processor(str(model_dirs["qwen2_5_omni"]))
    clip = ASSETS / "benchmarks" / "video_temporal" / "videos" / "test-0000.mp4"  # 4 s
    video = {"type": "video", "video": str(clip)}
    conv = [
        {
            "role": "user",
            "content": [video, *conversation(media["short"])[0]["content"]],
        }
    ]
    video_pad = processor.tokenizer.convert_tokens_to_ids("<|VIDEO|>")
    free = Qwen25Omni(video=VideoBudget(max_pixels=12544, max_frames=16)).prepare(processor, [conv])
    full_length = free["input_ids"].shape[1]
    before = video_stats().get("fps_lowered", 0)
    limit = full_length - int((free["input_ids"] == video_pad).sum()) // 2
    fitted = Qwen25Omni(
        video=VideoBudget(max_pixels=12544, max_frames=16, max_prompt_tokens=limit)
    ).prepare(processor, [conv])
    assert fitted["input_ids"].shape[1] <= limit < full_length
    assert fitted["video_grid_thw"][0, 0] < free["video_grid_thw"][0, 0]  # fewer frames
    assert int(fitted["feature_attention_mask"].sum()) == int(free["feature_attention_mask"].sum())
    assert video_stats()["fps_lowered"] > before
    # seconds per temporal patch follow the lowered fps
    assert fitted["video_second_per_grid"][0] > free["video_second_per_grid"][0]
