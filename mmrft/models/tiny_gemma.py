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

from mmrft.models import tiny

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


def train_gemma_tokenizer(trailing: tuple[str, ...], named: dict[str, str], template: str) -> Any:
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
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in GEMMA_CONTROL],
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


def build(family: str, seed: int) -> tuple[Any, Any]:
    """``(model, processor)`` of the tiny Gemma 3 (see the module docstring)."""
    import torch
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        GenerationConfig,
    )

    if family != "gemma3":
        raise ValueError(f"tiny_gemma builds no {family!r}")
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
        "pad_token_id": ids["<pad>"],
        "eos_token_id": ids["<eos>"],
        "bos_token_id": ids["<bos>"],
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
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
    config.architectures = ["Gemma3ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    tiny.reinit_fan_in(model, seed)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<bos>"],
        pad_token_id=ids["<pad>"],
        eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]],
    )
    return model, processor
