"""Tiny Qwen3-generation checkpoints: Qwen3-VL (dense and MoE).

Built by :func:`mmrft.models.tiny.build_tiny` (``mmrft make-tiny``) with the machinery of
:mod:`mmrft.models.tiny` (a byte-level BPE tokenizer trained here, fan-in weight init, atomic
writes); this module holds what differs from the Qwen2 generation:

* the Qwen3 tokenizer layout: Qwen2.5-VL's special tokens, then as added (not special) tokens
  the Qwen2.5 extras and ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``
  (so ``<think>`` is one token, as in the real Qwen3 tokenizers);
* the Qwen3-VL Instruct chat template without its tool-calling branch: no default system
  prompt, ``<|vision_start|><|image_pad|><|vision_end|>`` per image part (``<|video_pad|>``
  per video part);
* patch 16 × merge 2 (inputs are multiples of 32 px), interleaved mRoPE (sections 2/3/3 of
  head_dim/2 = 8) and DeepStack: the outputs of vision blocks 0 and 1 are added to the hidden
  states of LLM layers 0 and 1 at the image-token positions;
* ``qwen3_vl_moe``: the same with a sparse MoE text MLP (4 experts of width 32, 2 per token)
  in every layer.
"""

from __future__ import annotations

from typing import Any

from mmrft.models.tiny import base as tiny

QWEN3_EXTRA = (*tiny.QWEN2_5_VL_EXTRA, "<tool_response>", "</tool_response>", "<think>", "</think>")

# Qwen3-VL-*-Instruct chat_template.json, the branch without tools.
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].content is string %}{{- messages[0].content }}{%- else %}"
    "{%- for content in messages[0].content %}{%- if 'text' in content %}{{- content.text }}"
    "{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- set image_count = namespace(value=0) %}{%- set video_count = namespace(value=0) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}{%- if message.content is string %}"
    "{{- message.content }}{%- else %}{%- for content in message.content %}"
    "{%- if content.type == 'image' or 'image' in content or 'image_url' in content %}"
    "{%- set image_count.value = image_count.value + 1 %}"
    "{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif content.type == 'video' or 'video' in content %}"
    "{%- set video_count.value = video_count.value + 1 %}"
    "{%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}{%- if message.content is string %}"
    "{{- message.content }}{%- else %}{%- for item in message.content %}"
    "{%- if 'text' in item %}{{- item.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def extend(template: str, old: str, new: str) -> str:
    """``template`` with its one ``old`` span replaced by ``new`` (a variant of a template)."""
    if template.count(old) != 1:
        raise ValueError(f"the template has {template.count(old)} copies of {old!r}")
    return template.replace(old, new)


# Text part of the tiny Qwen3 models: tiny.TEXT's widths with 4 heads of an explicit head_dim
# 16 (Qwen3 decouples it from hidden_size / heads; mRoPE sections 2/3/3 sum to 16 / 2) and
# interleaved mRoPE.
QWEN3_TEXT = {
    **{k: v for k, v in tiny.TEXT.items() if k != "rope_parameters"},
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_parameters": {
        **tiny.TEXT["rope_parameters"],
        "mrope_section": [2, 3, 3],
        "mrope_interleaved": True,
    },
}
QWEN3_VISION = {
    **tiny.VISION,
    "out_hidden_size": tiny.TEXT["hidden_size"],
    "num_position_embeddings": 64,  # an 8 × 8 table, interpolated to each image's grid
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "deepstack_visual_indexes": [0, 1],
}
# The "learner" size (built and pre-trained by scripts/make_learner.py): a
# Qwen3-VL of about 1.6 M parameters with room to learn what the tiny models cannot (boxes,
# chart values, clip events; docs/learning.md). Qwen3-VL rather than Qwen2.5-VL: its vision
# tower adds a learned absolute position table to the patches, so a visual token carries where
# it is; Qwen2.5-VL's tower has rotary (relative) positions only. Text 128 wide, 4 layers, 4
# heads of 32 (2 KV heads); vision 64 wide, 4 blocks, DeepStack from blocks 1–3.
LEARNER_TEXT = {
    **QWEN3_TEXT,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "head_dim": 32,
    "rope_parameters": {**QWEN3_TEXT["rope_parameters"], "mrope_section": [4, 6, 6]},
}
LEARNER_VISION = {
    **QWEN3_VISION,
    "depth": 4,
    "hidden_size": 64,
    "intermediate_size": 192,
    "out_hidden_size": LEARNER_TEXT["hidden_size"],
    "deepstack_visual_indexes": [1, 2, 3],
}
MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
}


def train_qwen3_tokenizer(chat_template: str) -> Any:
    """A ``Qwen2TokenizerFast`` in the Qwen3 layout (see the module docstring)."""

    special = tiny.QWEN2_VL_SPECIAL
    raw = tiny.train_bpe(tiny.corpus("qwen2_5_vl"), special, QWEN3_EXTRA)
    return tiny.qwen_tokenizer(raw, list(special[1:]), 262144, chat_template)


HALF = [0.5, 0.5, 0.5]  # Qwen3-VL's image mean and std


def vision_processors(patch_size: int = 16) -> tuple[Any, Any]:
    """The Qwen2-VL image processor and Qwen3-VL video processor with the tiny budget and the
    Qwen3-VL normalisation (mean = std = 0.5)."""
    from transformers import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    image = Qwen2VLImageProcessor(**pixel_budget(patch_size))
    video = Qwen3VLVideoProcessor(
        patch_size=patch_size,
        size={"shortest_edge": tiny.TINY_MIN_PIXELS, "longest_edge": tiny.TINY_MAX_PIXELS * 8},
        image_mean=HALF,
        image_std=HALF,
    )
    return image, video


def pixel_budget(patch_size: int = 16) -> dict[str, Any]:
    """Keyword arguments of a Qwen2-VL image or video processor: ``patch_size``, the tiny pixel
    budget and Qwen3-VL's normalisation."""
    return {
        "patch_size": patch_size,
        "min_pixels": tiny.TINY_MIN_PIXELS,
        "max_pixels": tiny.TINY_MAX_PIXELS,
        "image_mean": HALF,
        "image_std": HALF,
    }


def vl_processor(tokenizer: Any, chat_template: str) -> Any:
    """``Qwen3VLProcessor`` of ``tokenizer`` with :func:`vision_processors`."""
    from transformers import Qwen3VLProcessor

    image, video = vision_processors()
    return Qwen3VLProcessor(
        image_processor=image,
        tokenizer=tokenizer,
        video_processor=video,
        chat_template=chat_template,
    )


def build_qwen3_vl(family: str, seed: int, size: str = "tiny") -> tuple[Any, Any]:
    """The tiny Qwen3-VL (``size="learner"``: :data:`LEARNER_TEXT`, dense only)."""
    from transformers import (
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
    )

    tokenizer = train_qwen3_tokenizer(QWEN3_VL_CHAT_TEMPLATE)
    processor = vl_processor(tokenizer, QWEN3_VL_CHAT_TEMPLATE)
    sizes, vision = (
        (LEARNER_TEXT, LEARNER_VISION) if size == "learner" else (QWEN3_TEXT, QWEN3_VISION)
    )
    text = {**sizes, "rope_parameters": dict(sizes["rope_parameters"])}
    text |= tiny.qwen_token_ids(tokenizer)
    moe = family == "qwen3_vl_moe"
    if moe:
        text |= MOE
    config_cls = Qwen3VLMoeConfig if moe else Qwen3VLConfig
    config = config_cls(
        text_config=text,
        vision_config=dict(vision),
        **tiny.qwen_vision_ids(tokenizer),
    )
    model_cls = Qwen3VLMoeForConditionalGeneration if moe else Qwen3VLForConditionalGeneration
    return tiny.instantiate(model_cls, config, seed, **tiny.qwen_generation(tokenizer)), processor


# Qwen3-Omni: Qwen3's layout, then its audio tokens (special).
QWEN3_OMNI_AUDIO = (
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
QWEN3_OMNI_NAMED = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
# Qwen3-Omni-*-Instruct chat template without tools: Qwen3-VL's, plus
# <|audio_start|><|audio_pad|><|audio_end|> per audio part.
QWEN3_OMNI_CHAT_TEMPLATE = extend(
    QWEN3_VL_CHAT_TEMPLATE,
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}{%- endfor %}{%- endif %}",
    "{%- elif content.type == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "<|audio_start|><|audio_pad|><|audio_end|>"
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}{%- endfor %}{%- endif %}",
)


def build_qwen3_omni(seed: int) -> tuple[Any, Any]:
    """The Qwen3-Omni *thinker*: audio encoder (chunks of ``2·n_window`` = 100 mel frames, 13
    tokens per chunk), Qwen3-VL's vision encoder with DeepStack, and a sparse-MoE decoder with
    interleaved TMRoPE; ``Qwen3OmniMoeProcessor`` with the tiny Whisper front end of
    :mod:`mmrft.models.tiny`."""
    from tokenizers import AddedToken
    from transformers import (
        Qwen2VLVideoProcessor,
        Qwen3OmniMoeProcessor,
        Qwen3OmniMoeThinkerConfig,
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    special = tiny.QWEN2_VL_SPECIAL
    lines = tiny.corpus("qwen2_5_vl") + tiny.audio_corpus()
    raw = tiny.train_bpe(lines, special, QWEN3_EXTRA)
    raw.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in QWEN3_OMNI_AUDIO]
    )
    tokenizer = tiny.qwen_tokenizer(raw, {**QWEN3_OMNI_NAMED}, 65536, QWEN3_OMNI_CHAT_TEMPLATE)
    image, _ = vision_processors()
    video = Qwen2VLVideoProcessor(**pixel_budget())
    processor = Qwen3OmniMoeProcessor(
        image_processor=image,
        video_processor=video,
        feature_extractor=tiny.build_feature_extractor(),
        tokenizer=tokenizer,
        chat_template=QWEN3_OMNI_CHAT_TEMPLATE,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (*special, *QWEN3_OMNI_AUDIO)}
    text = {**QWEN3_TEXT, "rope_parameters": dict(QWEN3_TEXT["rope_parameters"])}
    text |= tiny.qwen_token_ids(tokenizer) | MOE
    audio = {
        **tiny.AUDIO_ENCODER,
        "n_window": 50,
        "n_window_infer": 400,
        "conv_chunksize": 500,
        "downsample_hidden_size": 16,
        "output_dim": tiny.TEXT["hidden_size"],
    }
    user = tokenizer.encode("user", add_special_tokens=False)
    config = Qwen3OmniMoeThinkerConfig(
        text_config=text,
        vision_config=dict(QWEN3_VISION),
        audio_config=audio,
        audio_token_id=ids["<|audio_pad|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        audio_start_token_id=ids["<|audio_start|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        user_token_id=user[0] if len(user) == 1 else None,
        position_id_per_seconds=13,
        tie_word_embeddings=True,
    )
    model = tiny.instantiate(
        Qwen3OmniMoeThinkerForConditionalGeneration, config, seed, **tiny.qwen_generation(tokenizer)
    )
    return model, processor


# Qwen3.5's split: Qwen2's with combining marks (\p{M}) kept inside words.
QWEN3_5_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen3.5 chat template without tools: Qwen3-VL's, and the generation prompt opens a think
# block (``<think>\n``), or writes an empty one with ``enable_thinking=False``.
QWEN3_5_CHAT_TEMPLATE = extend(
    QWEN3_VL_CHAT_TEMPLATE,
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}",
)


def build_qwen3_5(seed: int) -> tuple[Any, Any]:
    """Qwen3.5: a hybrid decoder (a Gated DeltaNet linear-attention layer, then a gated full
    attention layer with partial interleaved mRoPE: half of each 32-wide head rotates, sections
    2/3/3), Qwen3-VL's vision encoder without DeepStack, ``Qwen3_5Tokenizer``."""
    from transformers import (
        Qwen3_5Config,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5Tokenizer,
    )

    special = tiny.QWEN2_VL_SPECIAL
    raw = tiny.train_bpe(tiny.corpus("qwen2_5_vl"), special, QWEN3_EXTRA, QWEN3_5_PRETOKENIZE_REGEX)
    tokenizer = tiny.qwen_tokenizer(
        raw, list(special[1:]), 262144, QWEN3_5_CHAT_TEMPLATE, cls=Qwen3_5Tokenizer
    )
    processor = vl_processor(tokenizer, QWEN3_5_CHAT_TEMPLATE)
    text = {
        **{k: v for k, v in QWEN3_TEXT.items() if k != "rope_parameters"},
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "layer_types": ["linear_attention", "full_attention"],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
            "partial_rotary_factor": 0.5,
        },
        **tiny.qwen_token_ids(tokenizer),
    }
    vision = {k: v for k, v in QWEN3_VISION.items() if k != "deepstack_visual_indexes"}
    config = Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        **tiny.qwen_vision_ids(tokenizer),
    )
    model = tiny.instantiate(
        Qwen3_5ForConditionalGeneration, config, seed, **tiny.qwen_generation(tokenizer)
    )
    return model, processor


def build(family: str, seed: int, size: str = "tiny") -> tuple[Any, Any]:
    """``(model, processor)`` of the tiny ``family`` (see the module docstring); ``size``:
    ``"learner"`` for ``qwen3_vl``."""
    if size != "tiny" and family != "qwen3_vl":
        raise ValueError(f"size {size!r} exists for qwen3_vl only")
    if family == "qwen3_5":
        return build_qwen3_5(seed)
    if family in ("qwen3_vl", "qwen3_vl_moe"):
        return build_qwen3_vl(family, seed, size)
    if family == "qwen3_omni":
        return build_qwen3_omni(seed)
    raise ValueError(f"tiny.qwen3 builds no {family!r}")
