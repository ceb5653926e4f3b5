"""Tiny InternVL 3 checkpoint (``model_type`` ``internvl``, the transformers-native layout of
the ``OpenGVLab/InternVL3-*-hf`` releases).

Built by :func:`mmrft.models.tiny.build_tiny` with the shared machinery of
:mod:`mmrft.models.tiny`; what is InternVL's:

* tokenizer: Qwen2.5's layout (InternVL3's language model is Qwen2.5) with InternVL's added
  special tokens ``<img>``, ``</img>``, ``<IMG_CONTEXT>``, ``<quad>``, ``</quad>``, ``<ref>``,
  ``</ref>``, ``<box>``, ``</box>`` and the HF conversion's ``<video>``, named on the tokenizer
  as ``start_image_token`` / ``end_image_token`` / ``context_image_token`` / ``video_token``
  (what ``InternVLProcessor`` reads);
* chat template: the one transformers' InternVL conversion writes (no default system prompt,
  ``<IMG_CONTEXT>\\n`` per image part, ``<video>\\n`` per video part), which the processor
  expands to ``<img>`` + ``<IMG_CONTEXT>`` × 4 per tile + ``</img>`` (and one
  ``FrameN: <img>…</img>`` per video frame);
* ``GotOcr2ImageProcessor`` with dynamic tiling (``crop_to_patches``: up to 4 tiles of
  56 × 56 plus a thumbnail; the real ones are up to 12 tiles of 448 × 448) and
  ``InternVLVideoProcessor`` (one 56 × 56 tile per frame);
* InternViT (patch 14, 56 px tiles → 4 × 4 patches, pixel shuffle 0.5 → 4 tokens per tile; the
  real 448 px tiles give 256) and a Qwen2 decoder with 1-D RoPE.
"""

from __future__ import annotations

from typing import Any

from mmrft.models.tiny import base as tiny

INTERNVL_EXTRA = (
    *tiny.QWEN2_5_VL_EXTRA,
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<quad>",
    "</quad>",
    "<ref>",
    "</ref>",
    "<box>",
    "</box>",
    "<video>",
)
INTERNVL_NAMED = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "{{ '<IMG_CONTEXT>\\n' }}{% elif content['type'] == 'video' %}{{ '<video>\\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\\n' }}{% endif %}"
)
TILE = 56  # tile side (pixels); InternVL3: 448
MAX_TILES = 4  # InternVL3 model card: max_num = 12
TOKENS_PER_TILE = (TILE // 14) ** 2 // 4


def build(family: str, seed: int) -> tuple[Any, Any]:
    """``(model, processor)`` of the tiny InternVL 3 (see the module docstring)."""
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
    )

    if family != "internvl":
        raise ValueError(f"tiny.internvl builds no {family!r}")
    special = tiny.QWEN2_VL_SPECIAL
    raw = tiny.train_bpe(tiny.corpus("qwen2_5_vl"), special)
    from tokenizers import AddedToken

    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in INTERNVL_EXTRA])
    tokenizer = tiny.qwen_tokenizer(raw, {**INTERNVL_NAMED}, 16384, INTERNVL_CHAT_TEMPLATE)
    size = {"height": TILE, "width": TILE}
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(
            size=size, crop_to_patches=True, min_patches=1, max_patches=MAX_TILES
        ),
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(size=size),
        image_seq_length=TOKENS_PER_TILE,
        chat_template=INTERNVL_CHAT_TEMPLATE,
    )
    pad, eos = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    text = {
        **{k: v for k, v in tiny.TEXT.items() if k != "rope_parameters"},
        "num_attention_heads": 4,  # head_dim 16
        "num_key_value_heads": 2,
        "model_type": "qwen2",
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "vocab_size": len(tokenizer),
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "tie_word_embeddings": True,
    }
    vision = {
        **tiny.VIT,
        "image_size": [TILE, TILE],
        "patch_size": [14, 14],
    }
    config = InternVLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=TOKENS_PER_TILE,
        downsample_ratio=0.5,
        tie_word_embeddings=True,
    )
    model = tiny.instantiate(
        InternVLForConditionalGeneration, config, seed, **tiny.qwen_generation(tokenizer)
    )
    return model, processor
