"""Tiny GLM-4.1V checkpoint (``model_type`` ``glm4v``).

Built by :func:`mmrft.models.tiny.build_tiny` with the shared machinery of
:mod:`mmrft.models.tiny`; what is GLM's:

* tokenizer: a byte-level BPE trained here with GLM-4's cl100k-style split (digits in groups
  of up to three), then GLM-4.1V's special tokens in their real id order
  (``<|endoftext|>`` … ``<|video|>``, 151329 … 151344 in the real vocabulary) and the thinking
  and box tokens; ``<|endoftext|>`` pads, and generation stops on ``<|endoftext|>``,
  ``<|user|>`` or ``<|observation|>`` (GLM-4.1V-9B-Thinking's generation_config);
* chat template: GLM-4.1V-9B-Thinking's ``chat_template.jinja`` (``[gMASK]<sop>``, role tags,
  ``<|begin_of_image|><|image|><|end_of_image|>`` per image part and
  ``<|begin_of_video|><|video|><|end_of_video|>`` per video part, which ``Glm4vProcessor``
  expands to one ``<|begin_of_image|>…<|end_of_image|>{seconds}`` block per temporal patch);
* ``Glm4vImageProcessor`` / ``Glm4vVideoProcessor`` (patch 14, merge 2, temporal patch 2,
  CLIP normalisation) with the tiny pixel budget;
* the decoder: 2 layers, 2 heads of 32 with one key-value head, partial rotary (half of each
  head) with 3-D mRoPE sections 2/3/3, as GLM-4.1V (sections 8/12/12 of 64 rotary dims).
"""

from __future__ import annotations

from typing import Any

from mmrft.models.glm import GLM_MEDIA_TOKENS
from mmrft.models.tiny import base as tiny

# cl100k-style split of the GLM-4 tokenizer (numbers in groups of at most three digits).
GLM_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
GLM4V_SPECIAL = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    *GLM_MEDIA_TOKENS,  # <|begin_of_image|> … <|video|>
    "<think>",
    "</think>",
    "<|begin_of_box|>",
    "<|end_of_box|>",
)
# GLM-4.1V-9B-Thinking chat_template.jinja.
GLM4V_CHAT_TEMPLATE = (
    "[gMASK]<sop>\n{%- for msg in messages %}\n    {%- if msg.role == 'system' %}\n<|system|>\n"
    "{{ msg.content }}\n    {%- elif msg.role == 'user' %}\n<|user|>{{ '\\n' }}\n\n"
    "        {%- if msg.content is string %}\n{{ msg.content }}\n        {%- else %}\n"
    "            {%- for item in msg.content %}\n"
    "                {%- if item.type == 'video' or 'video' in item %}\n"
    "<|begin_of_video|><|video|><|end_of_video|>\n"
    "                {%- elif item.type == 'image' or 'image' in item %}\n"
    "<|begin_of_image|><|image|><|end_of_image|>\n"
    "                {%- elif item.type == 'text' %}\n{{ item.text }}\n"
    "                {%- endif %}\n            {%- endfor %}\n        {%- endif %}\n"
    "    {%- elif msg.role == 'assistant' %}\n        {%- if msg.metadata %}\n"
    "<|assistant|>{{ msg.metadata }}\n{{ msg.content }}\n        {%- else %}\n<|assistant|>\n"
    "{{ msg.content }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_glm_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` (tokenizers backend) in GLM-4.1V's layout."""
    from transformers import PreTrainedTokenizerFast

    raw = tiny.train_bpe(tiny.corpus("qwen2_5_vl"), GLM4V_SPECIAL, regex=GLM_PRETOKENIZE_REGEX)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=list(GLM4V_SPECIAL[1:]),
        model_max_length=65536,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    tokenizer.chat_template = GLM4V_CHAT_TEMPLATE
    return tokenizer


def build(family: str, seed: int) -> tuple[Any, Any]:
    """``(model, processor)`` of the tiny GLM-4.1V (see the module docstring)."""
    from transformers import (
        Glm4vConfig,
        Glm4vForConditionalGeneration,
        Glm4vImageProcessor,
        Glm4vProcessor,
        Glm4vVideoProcessor,
    )

    if family != "glm4v":
        raise ValueError(f"tiny.glm builds no {family!r}")
    tokenizer = train_glm_tokenizer()
    budget = {"shortest_edge": tiny.TINY_MIN_PIXELS, "longest_edge": tiny.TINY_MAX_PIXELS}
    processor = Glm4vProcessor(
        image_processor=Glm4vImageProcessor(size=budget),
        tokenizer=tokenizer,
        video_processor=Glm4vVideoProcessor(size=budget, max_image_size=budget),
        chat_template=GLM4V_CHAT_TEMPLATE,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GLM4V_SPECIAL}
    pad = ids["<|endoftext|>"]
    text = {
        **tiny.DECODER,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "partial_rotary_factor": 0.5,
        },
        "vocab_size": len(tokenizer),
        "pad_token_id": pad,
        "eos_token_id": [pad, ids["<|user|>"], ids["<|observation|>"]],
    }
    vision = {
        **tiny.VISION,
        "image_size": 112,  # an 8 × 8 position table, interpolated to each image's grid
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
    }
    config = Glm4vConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
        tie_word_embeddings=False,
    )
    stop = [pad, ids["<|user|>"], ids["<|observation|>"]]
    model = tiny.instantiate(
        Glm4vForConditionalGeneration, config, seed, pad_token_id=pad, eos_token_id=stop
    )
    return model, processor
