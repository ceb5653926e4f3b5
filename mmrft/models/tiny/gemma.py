"""Tiny Gemma 3 checkpoint (``model_type`` ``gemma3``, ``Gemma3ForConditionalGeneration``).

Built by :func:`mmrft.models.tiny.build_tiny` with the shared machinery of
:mod:`mmrft.models.tiny`; what is Gemma's:

* tokenizer: a SentencePiece-style BPE trained here (spaces become ``▁`` at the start of the
  next piece, byte fallback), wrapped in ``GemmaTokenizer``, with Gemma 3's control tokens first
  (``<pad>`` = 0, ``<eos>`` = 1, ``<bos>`` = 2, ``<unk>`` = 3, ``<mask>`` = 4,
  ``<start_of_turn>``, ``<end_of_turn>``), then the learned vocabulary, then
  ``<start_of_image>``, ``<end_of_image>`` and last ``<image_soft_token>`` (as in the real
  vocabulary, 255999, 256000 and 262144), named ``boi_token`` / ``eoi_token`` /
  ``image_token`` (what ``Gemma3Processor`` reads). The chat template writes ``<bos>`` itself,
  so prompts are tokenised without special tokens. Generation stops on ``<eos>`` or
  ``<end_of_turn>`` (gemma-3-*-it generation_config);
* chat template: gemma-3-*-it's (the system message is folded into the first user turn, the
  assistant role is ``model``, ``<start_of_image>`` per image part; the processor expands it
  to ``\\n\\n<start_of_image>`` + ``<image_soft_token>`` × 4 + ``<end_of_image>\\n\\n``);
* ``Gemma3ImageProcessor`` resizing every image to 56 × 56 (the real ones: 896 × 896);
* SigLIP (patch 14 → 4 × 4 patches, average-pooled to 2 × 2 = 4 soft tokens; the real
  64 × 64 → 256) and a Gemma 3 decoder of 2 layers, one sliding-window layer (window 8 tokens,
  RoPE θ 10⁴) and one global layer (θ 10⁶), as the real 5 : 1 interleave in miniature; the
  window is small so that prompts of the tests are longer than it.
"""

from __future__ import annotations

from typing import Any

from mmrft.models.tiny import base as tiny

GEMMA_CONTROL = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>")
GEMMA3_IMAGE = ("<start_of_image>", "<end_of_image>")
GEMMA3_NAMED = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
# gemma-3-*-it chat_template.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n    {%- set loop_messages = messages -%}\n'
    "{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate '
    'user/assistant/user/assistant/...") }}\n    {%- endif -%}\n'
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n    {%- else -%}\n'
    "        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n    {%- endif -%}\n'
    "    {{ '<end_of_turn>\\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n{%- endif -%}\n"
)
IMAGE_SIDE = 56
SOFT_TOKENS = 4  # per image: (56 / 14 / 2)²


# Gemma 4: turn markers in the base vocabulary, then the media tokens in their real order
# (<|image> 255999, <|audio> 256000, then 258880 … 258884).
GEMMA4_CONTROL = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|think|>")
GEMMA4_MEDIA = (
    "<|image>",
    "<|audio>",
    "<|image|>",
    "<|audio|>",
    "<image|>",
    "<audio|>",
    "<|video|>",
)
GEMMA4_NAMED = {
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "image_token": "<|image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "audio_token": "<|audio|>",
}
# The layout of gemma-4-*-it's chat template (turn markers, a system turn of its own, the
# assistant role as "model", one placeholder per media part), without its tool and thinking
# branches.
GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<|turn>' + role + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<|image|>' }}"
    "{%- elif item['type'] == 'video' -%}{{ '<|video|>' }}"
    "{%- elif item['type'] == 'audio' -%}{{ '<|audio|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '<turn|>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\\n' }}{%- endif -%}"
)


def train_gemma_tokenizer(
    trailing: tuple[str, ...],
    named: dict[str, str],
    template: str,
    control: tuple[str, ...] = GEMMA_CONTROL,
) -> Any:
    """A ``GemmaTokenizer``: the control tokens, a BPE trained on :func:`tiny.corpus`, then
    ``trailing`` special tokens (see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer
    from transformers import GemmaTokenizer

    raw = Tokenizer(BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    raw.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    trainer = BpeTrainer(
        vocab_size=tiny.BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in control],
    )
    lines = tiny.corpus("qwen2_5_vl") + ["user\nmodel\n"] * 20
    raw.train_from_iterator(lines, trainer=trainer)
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in trailing])
    tokenizer = GemmaTokenizer(
        tokenizer_object=raw,
        extra_special_tokens={**named},
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    tokenizer.chat_template = template
    return tokenizer


def token_ids(ids: dict[str, int]) -> dict[str, int]:
    """The pad, eos and bos fields of a Gemma text config (``ids``: token → id)."""
    return {
        "pad_token_id": ids["<pad>"],
        "eos_token_id": ids["<eos>"],
        "bos_token_id": ids["<bos>"],
    }


def instantiate(cls: Any, config: Any, seed: int, ids: dict[str, int], end_of_turn: str) -> Any:
    """:func:`tiny.instantiate` with Gemma's generation config: ``<bos>``, ``<pad>``, and
    generation stops on ``<eos>`` or ``end_of_turn``."""
    return tiny.instantiate(
        cls,
        config,
        seed,
        bos_token_id=ids["<bos>"],
        pad_token_id=ids["<pad>"],
        eos_token_id=[ids["<eos>"], ids[end_of_turn]],
    )


def build(family: str, seed: int) -> tuple[Any, Any]:
    """``(model, processor)`` of the tiny Gemma 3 (see the module docstring)."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
    )

    if family == "gemma4":
        return build_gemma4(seed)
    if family != "gemma3":
        raise ValueError(f"tiny.gemma builds no {family!r}")
    tokenizer = train_gemma_tokenizer(
        (*GEMMA3_IMAGE, "<image_soft_token>"), GEMMA3_NAMED, GEMMA3_CHAT_TEMPLATE
    )
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}),
        tokenizer=tokenizer,
        image_seq_length=SOFT_TOKENS,
        chat_template=GEMMA3_CHAT_TEMPLATE,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (*GEMMA_CONTROL, *GEMMA3_IMAGE)}
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "max_position_embeddings": 4096,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        **token_ids(ids),
    }
    vision = {
        **tiny.VIT,
        "image_size": IMAGE_SIDE,
        "patch_size": 14,
        "vision_use_head": False,
    }
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=SOFT_TOKENS,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=tokenizer.convert_tokens_to_ids("<image_soft_token>"),
        tie_word_embeddings=True,
    )
    model = instantiate(Gemma3ForConditionalGeneration, config, seed, ids, "<end_of_turn>")
    return model, processor


def build_gemma4(seed: int) -> tuple[Any, Any]:
    """Gemma 4 in miniature: ``Gemma4Processor`` (aspect-preserving images of up to 70 soft
    tokens of 3 × 3 patches of 8 px, the smallest budget it takes; one such block per video
    frame; 16-bin log-mel audio, 25 tokens per second), a vision encoder, an audio encoder,
    and a decoder of 4 layers (sliding window 8 / full, alternating) whose last two reuse the
    keys and values of the first two (KV sharing), with per-layer token embeddings (width 8) and
    bidirectional attention within each image or frame (``use_bidirectional_attention =
    "vision"``, the setting of the larger released checkpoints)."""
    from transformers import (
        Gemma4AudioFeatureExtractor,
        Gemma4Config,
        Gemma4ForConditionalGeneration,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )

    tokenizer = train_gemma_tokenizer(
        GEMMA4_MEDIA, GEMMA4_NAMED, GEMMA4_CHAT_TEMPLATE, control=GEMMA4_CONTROL
    )
    vision_kwargs = {"patch_size": 8, "max_soft_tokens": 70, "pooling_kernel_size": 3}
    processor = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(feature_size=tiny.TINY_MEL_BINS),
        image_processor=Gemma4ImageProcessor(**vision_kwargs),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(**vision_kwargs),
        image_seq_length=70,
        chat_template=GEMMA4_CHAT_TEMPLATE,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (*GEMMA4_CONTROL, *GEMMA4_MEDIA)}
    text = {
        "vocab_size": len(tokenizer),
        "vocab_size_per_layer_input": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "hidden_size_per_layer_input": 8,
        "num_kv_shared_layers": 2,
        "use_bidirectional_attention": "vision",
        **token_ids(ids),
    }
    vision = {
        **tiny.VIT,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "patch_size": 8,
        "pooling_kernel_size": 3,
        "position_embedding_size": 256,
    }
    audio = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "subsampling_conv_channels": [tiny.TINY_MEL_BINS, 4],
        "output_proj_dims": 32,
    }
    config = Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        boa_token_id=ids["<|audio>"],
        eoa_token_index=ids["<audio|>"],
        audio_token_id=ids["<|audio|>"],
        tie_word_embeddings=True,
    )
    model = instantiate(Gemma4ForConditionalGeneration, config, seed, ids, "<turn|>")
    return model, processor
