"""The newer model families on their committed tiny checkpoints (offline, CPU): Qwen3-VL (dense
and MoE), Qwen3.5, the Qwen3-Omni thinker, InternVL 3, Gemma 3, GLM-4.1V.

Per family: the checkpoint loads with the Auto classes and carries the family's real processor
and special tokens; the chat template renders the real layout; ``prepare`` left-pads and makes
as many placeholder tokens as the media need; re-collated rows give the same logits; the
training forward equals generation's log-probs; generation never writes a media placeholder;
the vision tower is what freezing and LoRA skip; the build is deterministic. Group-shared
exactness is in ``tests/test_group.py``, training runs in ``tests/test_modalities_train.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmrft.models import tiny
from mmrft.models.family import MediaBudget, family_for_model_type
from mmrft.models.gemma import Gemma3, Gemma4
from mmrft.models.glm import GLM4V
from mmrft.models.internvl import InternVL
from mmrft.models.qwen_audio import Qwen3Omni, qwen3_omni_audio_tokens
from mmrft.models.qwen_vl import Qwen3VL, Qwen35
from mmrft.policy.group import check_attention, packing
from mmrft.policy.model import Policy, completion_logps
from mmrft.rollout.base import cut_at_stop

ASSETS = Path(__file__).resolve().parents[1] / "assets"
# family -> (adapter, model_type, processor class, one image part's rendered user turn)
FAMILIES = {
    "qwen3_vl": (Qwen3VL, "qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_vl_moe": (Qwen3VL, "qwen3_vl_moe", "Qwen3VLProcessor"),
    "qwen3_5": (Qwen35, "qwen3_5", "Qwen3VLProcessor"),
    "qwen3_omni": (Qwen3Omni, "qwen3_omni_moe_thinker", "Qwen3OmniMoeProcessor"),
    "internvl": (InternVL, "internvl", "InternVLProcessor"),
    "gemma3": (Gemma3, "gemma3", "Gemma3Processor"),
    "glm4v": (GLM4V, "glm4v", "Glm4vProcessor"),
    "gemma4": (Gemma4, "gemma4", "Gemma4Processor"),
}
# The prompt of one image and "Hi", as each family's real chat template renders it.
RENDERED = {
    "qwen3_vl": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n"
    "<|im_start|>assistant\n",
    "qwen3_5": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "qwen3_omni": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n"
    "<|im_start|>assistant\n",
    "internvl": "<|im_start|>user\n<IMG_CONTEXT>\nHi<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<bos><start_of_turn>user\n<start_of_image>Hi<end_of_turn>\n<start_of_turn>model\n",
    "glm4v": "[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>Hi<|assistant|>\n",
    "gemma4": "<bos><|turn>user\n<|image|>Hi<turn|>\n<|turn>model\n",
}
SMALL = MediaBudget(min_pixels=3136, max_pixels=112 * 112)


@pytest.fixture(scope="module")
def loaded() -> dict[str, tuple]:
    out = {}
    for name, (cls, _, _) in FAMILIES.items():
        family = cls(SMALL)
        path = str(ASSETS / "models" / f"tiny-{name}")
        out[name] = (family, family.load_processor(path), family.load_model(path).eval())
    return out


def conversation(*images: str, text: str = "What colour is the shape?") -> list[dict]:
    parts = [{"type": "image", "image": image} for image in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def image_token_count(name: str, batch, processor) -> int:
    """The placeholder tokens the images of ``batch`` must have, from the media tensors."""
    if "image_grid_thw" in batch:  # Qwen-style grids: one token per 2 × 2 patches
        return int(batch["image_grid_thw"].prod(-1).sum()) // 4
    if "image_position_ids" in batch:  # Gemma 4: one token per 3 × 3 real (not padding) patches
        return int((batch["image_position_ids"] != -1).all(-1).sum()) // 9
    return len(batch["pixel_values"]) * int(processor.image_seq_length)  # tiles / images


def test_model_types_resolve_to_their_family() -> None:
    for cls, model_type, _ in FAMILIES.values():
        assert family_for_model_type(model_type) is cls
    assert family_for_model_type("qwen3_omni_moe") is Qwen3Omni  # released thinker + talker
    assert family_for_model_type("qwen3_5_moe") is Qwen35
    for cls, _, _ in FAMILIES.values():
        assert cls.box_frame == "norm1000" and "1000" in cls.box_instruction


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tiny_loads_offline_with_auto_classes(name: str) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    _, model_type, processor_class = FAMILIES[name]
    path = ASSETS / "models" / f"tiny-{name}"
    assert sum(p.stat().st_size for p in path.iterdir()) < 3_000_000
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path)
    assert type(processor).__name__ == processor_class
    assert model.config.model_type == model_type
    tok = processor.tokenizer
    assert model.config.get_text_config().vocab_size == len(tok)
    assert tok.eos_token_id in model.generation_config.eos_token_id
    family = FAMILIES[name][0]()
    for token_id in family.suppress_token_ids(processor):  # media tokens are single added tokens
        token = tok.convert_ids_to_tokens(token_id)
        assert tok.encode(token, add_special_tokens=False) == [token_id], token


@pytest.mark.parametrize("name", list(RENDERED))
def test_chat_template_renders_the_real_layout(loaded: dict, name: str) -> None:
    family, processor, _ = loaded[name]
    parts = [{"type": "image", "image": "x.png"}, {"type": "text", "text": "Hi"}]
    [text] = family.render(processor, [[{"role": "user", "content": parts}]], True)
    assert text == RENDERED[name]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_prepare_left_pads_with_one_placeholder_per_visual_token(
    loaded: dict, images: dict, name: str
) -> None:
    family, processor, _ = loaded[name]
    long = "How many shapes are there in the image? Answer with a number."
    convs = [conversation(images["small"]), conversation(images["wide"], text=long)]
    batch = family.prepare(processor, convs)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    token = next(iter(family.media_tokens.values()))
    token_id = processor.tokenizer.convert_tokens_to_ids(token)
    assert int((ids == token_id).sum()) == image_token_count(name, batch, processor)
    assert (mask[0] == 0).any() and mask[:, -1].all()  # left padding
    pad = processor.tokenizer.pad_token_id
    assert (ids[mask == 0] == pad).all()
    if name.startswith("qwen3"):  # 112 × 84 → 128 × 96 (multiples of 32)
        assert family.input_size(112, 84) == (128, 96)
        assert batch["image_grid_thw"][-1].tolist() == [1, 6, 8]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_recollated_rows_give_the_same_logits(loaded: dict, images: dict, name: str) -> None:
    family, processor, model = loaded[name]
    convs = [
        conversation(images["wide"], images["small"]),
        conversation(images["small"], text="Hi"),
    ]
    batch = family.prepare(processor, convs)
    rows = family.split_rows(batch, processor)
    collated = family.collate_rows(rows[::-1], processor.tokenizer.pad_token_id)
    with torch.no_grad():
        full = model(**batch).logits[:, -1]
        again = model(**collated).logits[:, -1]
    assert torch.allclose(full.flip(0), again, atol=1e-5)


def sample(family, processor, model, batch, seed: int = 0):
    """Sample with generate(output_logits=True): completions and the sampler's log-probs."""
    torch.manual_seed(seed)
    tok = processor.tokenizer
    stop = list(model.generation_config.eos_token_id)
    out = model.generate(
        **batch,
        max_new_tokens=8,
        do_sample=True,
        suppress_tokens=family.suppress_token_ids(processor),
        eos_token_id=stop,
        pad_token_id=tok.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[:, batch["input_ids"].shape[1] :]
    logps = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)
    sampled = logps.gather(-1, new.unsqueeze(-1)).squeeze(-1)
    return [cut_at_stop(ids, stop)[0] for ids in new.tolist()], sampled, new


@pytest.mark.parametrize("name", list(FAMILIES))
def test_training_forward_equals_generation_logprobs(loaded: dict, images: dict, name: str) -> None:
    """completion_logps on split and re-collated rows (reversed) = generate()'s log-probs of
    its own samples; no sample holds a media placeholder."""
    family, processor, model = loaded[name]
    batch = family.prepare(
        processor, [conversation(images["small"]), conversation(images["wide"], text="Hi")]
    )
    completions, sampled, new = sample(family, processor, model, batch)
    assert not set(new.flatten().tolist()) & set(family.suppress_token_ids(processor))
    rows = family.split_rows(batch, processor)
    with torch.no_grad():
        logps, mask, _ = completion_logps(
            Policy(family, model, processor), rows[::-1], completions[::-1]
        )
    logps, mask = logps.flip(0), mask.flip(0).bool()
    assert mask.any()
    assert torch.allclose(logps[mask], sampled[:, : logps.shape[1]][mask], atol=1e-5)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_vision_tower_is_what_freezing_and_lora_skip(loaded: dict, name: str) -> None:
    from mmrft.config import ModelConfig
    from mmrft.policy.model import lora_targets

    family, _, model = loaded[name]
    tower = {id(p) for p in family.vision_parameters(model)}
    names = [n for n, p in model.named_parameters() if id(p) in tower]
    assert names and len(tower) < len(list(model.parameters()))
    assert not any("language_model" in n or "lm_head" in n for n in names)
    cfg = ModelConfig(freeze_vision=True)
    cfg.lora.target_modules = ["q_proj", "v_proj"]
    skipped = {id(m) for m in family.vision_tower(model).modules()}
    targets = lora_targets(model, family, cfg)
    modules = dict(model.named_modules())
    assert targets and not any(id(modules[t]) in skipped for t in targets)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_build_is_deterministic(tmp_path: Path, name: str) -> None:
    import transformers

    built = tiny.build_tiny(name, tmp_path / name)
    committed = ASSETS / "models" / f"tiny-{name}"
    config = json.loads((committed / "config.json").read_text())
    if config["transformers_version"] == transformers.__version__:  # else: rerun make-tiny
        assert tiny.tree_digest(built) == tiny.tree_digest(committed)


@pytest.mark.parametrize("name", ["qwen3_vl", "qwen3_omni"])
def test_deepstack_feeds_the_decoder(loaded: dict, images: dict, name: str) -> None:
    """DeepStack is live in the tiny models: zeroing the deepstack mergers changes the logits
    (so the group-shared exactness tests cover it)."""
    family, processor, model = loaded[name]
    batch = family.prepare(processor, [conversation(images["wide"])])
    mergers = [m for n, m in model.named_modules() if n.endswith("merger_list")]
    assert mergers
    with torch.no_grad():
        before = model(**batch).logits
        saved = [p.detach().clone() for m in mergers for p in m.parameters()]
        for m in mergers:
            for p in m.parameters():
                p.zero_()
        after = model(**batch).logits
        for p, value in zip([p for m in mergers for p in m.parameters()], saved):
            p.copy_(value)
    assert not torch.allclose(before, after)


def test_qwen3_5_continues_completions_from_the_prompt_cache(loaded: dict) -> None:
    """Qwen3.5's linear-attention layers take the prefix path; gradient checkpointing (which
    drops the cache) is refused with the keys to change; the other families pack."""
    _, _, model = loaded["qwen3_5"]
    assert packing(model) == "prefix"
    assert all(packing(loaded[n][2]) == "block" for n in FAMILIES if n != "qwen3_5")
    model.activation_checkpointing_enable()
    try:
        with pytest.raises(ValueError, match="model.gradient_checkpointing=false"):
            check_attention(model)
    finally:
        model.activation_checkpointing_disable()
    check_attention(model)


def test_gemma3_prompt_attention_is_bidirectional_within_each_image(
    loaded: dict, images: dict
) -> None:
    family, processor, model = loaded["gemma3"]
    batch = family.prepare(processor, [conversation(images["small"], images["wide"])])
    [row] = family.split_rows(batch, processor)
    allowed = family.prompt_attention(model, row)
    image = (row["token_type_ids"] == 1).nonzero().flatten().tolist()
    first, second = image[:4], image[4:]
    assert len(image) == 8 and allowed[first[0], first[-1]]  # forward within an image
    assert not allowed[first[-1], second[0]] and allowed[second[0], first[-1]]  # causal between
    text = [i for i in range(len(allowed)) if i not in image]
    assert not allowed[text[0], text[1]] and allowed[text[1], text[0]]
    assert family.attention_layers(model) == {"full_attention": None, "sliding_attention": 8}


def test_qwen3_omni_audio_tokens_follow_the_chunked_encoder() -> None:
    """13 tokens per 100 mel frames, three stride-2 reductions for the rest."""
    assert qwen3_omni_audio_tokens(torch.tensor(100)).item() == 13
    assert qwen3_omni_audio_tokens(torch.tensor(170)).item() == 13 + 9
    assert qwen3_omni_audio_tokens(torch.tensor(1000)).item() == 130


def test_internvl_tiles_follow_the_pixel_budget(loaded: dict, images: dict) -> None:
    """``max_pixels // tile²`` tiles per image (4 here), plus a thumbnail when tiled."""
    family, processor, _ = loaded["internvl"]
    assert family.max_tiles(processor) == 4
    batch = family.prepare(processor, [conversation(images["wide"])])
    assert len(batch["pixel_values"]) == 5  # a 2 × 2 grid for 4 : 3 (closest ratio) + thumbnail
    one = InternVL(MediaBudget(3136, 3136))
    assert len(one.prepare(processor, [conversation(images["wide"])])["pixel_values"]) == 1


@pytest.mark.parametrize(
    ("name", "token", "expected"),
    [
        ("qwen3_omni", "<|audio_pad|>", [13, 13 + 9]),  # 100 and 170 mel frames, chunks of 100
        ("gemma4", "<|audio|>", [25, 43]),  # one token per 40 ms (ceil)
    ],
)
def test_audio_placeholders_match_each_clip(
    loaded: dict, tmp_path: Path, name: str, token: str, expected: list[int]
) -> None:
    """A 1 s and a 1.7 s clip (16 kHz) in one batch: one placeholder run per clip, of the
    encoder's length, and the rows split back to one clip each."""
    import numpy as np
    import soundfile as sf

    family, processor, _ = loaded[name]
    clips = []
    for seconds in (1.0, 1.7):
        path = tmp_path / f"{seconds}.wav"
        t = np.arange(int(16000 * seconds)) / 16000
        sf.write(path, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
        parts = [{"type": "audio", "audio": str(path)}, {"type": "text", "text": "What?"}]
        clips.append([{"role": "user", "content": parts}])
    batch = family.prepare(processor, clips)
    token_id = processor.tokenizer.convert_tokens_to_ids(token)
    assert (batch["input_ids"] == token_id).sum(-1).tolist() == expected
    rows = family.split_rows(batch, processor)
    assert [len(r["input_features"]) for r in rows] == [1, 1]
