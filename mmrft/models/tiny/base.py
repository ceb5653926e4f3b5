"""Deterministic tiny checkpoints of every model family, for tests and the CPU demo.

``mmrft make-tiny`` calls :func:`build_all`, which writes ``assets/models/tiny-<family>`` for
every family of :data:`FAMILIES`: the newer ones (Qwen3-VL dense and MoE, Qwen3.5, the Qwen3-Omni
thinker, InternVL 3, Gemma 3, Gemma 4, GLM-4.1V) by the ``build`` of their module in
:data:`NEXT_BUILDERS` (``mmrft/models/tiny_*.py``, documented there), with this module's
tokenizer training (:func:`train_bpe`), corpus, fan-in init and atomic writes
(:func:`save_checkpoint`); the Qwen2 generation here:

* ``assets/models/tiny-qwen2_5_vl`` (``model_type`` ``qwen2_5_vl``, boxes in input pixels),
* ``assets/models/tiny-qwen2_vl`` (``model_type`` ``qwen2_vl``, boxes 0–1000 normalised),
* ``assets/models/tiny-qwen2_audio`` (``model_type`` ``qwen2_audio``: Whisper-style audio
  encoder + Qwen2 decoder, ``Qwen2AudioProcessor``),
* ``assets/models/tiny-qwen2_5_omni`` (``model_type`` ``qwen2_5_omni_thinker``: the Qwen2.5-Omni
  *thinker* only, i.e. audio encoder + Qwen2.5-VL vision encoder + decoder with TMRoPE, saved as
  ``Qwen2_5OmniThinkerForConditionalGeneration``; ``Qwen2_5OmniProcessor``). The real
  Qwen2.5-Omni checkpoints are ``qwen2_5_omni`` (thinker + talker + token2wav); the thinker class
  loads those as well, and the family adapter accepts both model types.

Each is a real Hugging Face checkpoint: the real config, model, processor, image-processor,
video-processor and feature-extractor (``WhisperFeatureExtractor``) classes, a few layers with
random weights, and a byte-level BPE tokenizer *trained here* with the ``tokenizers`` library on
a small built-in corpus (prompt words, colours, shapes, digits, JSON punctuation, think/answer
tags; for the audio families also sound words and the audio-QA prompt phrases), carrying the
family's real special tokens and chat template. Nothing is downloaded.

The audio families share one tiny audio front end: 16 kHz, 16 mel bins (the real models use
128), 10 ms hop, 10 s windows (``chunk_length``; the real ones are 30 s, so the encoders' position
tables are 500 instead of 1500 frames), except tiny Qwen2-Audio, which keeps the released 30 s
window because vLLM's Qwen2-Audio takes exactly 3000 mel frames per clip. One second of audio
becomes 25 ``<|AUDIO|>`` tokens, as in the real models.

Determinism: fixed seeds, a corpus generated in a fixed order, no timestamps; building twice
gives byte-identical files with the same library versions (:func:`tree_digest` checks it).

Tokenizer facts the trainer relies on (same ids in both models, same layout as the real
Qwen tokenizers: BPE vocabulary first, added tokens after it):

* ``<|endoftext|>`` is the pad token (and the ``bos_token_id`` in the configs, as in the real
  checkpoints; the tokenizer adds no BOS);
* ``<|im_end|>`` is the eos token: generation stops on ``[<|im_end|>, <|endoftext|>]``
  (``generation_config.json``), as for the real Instruct checkpoints.
* The real pre-tokenizer is kept (digits are split one by one, ``<think>`` becomes ``<think``
  + ``>``), so sequences match what the real tokenizers do, only with a smaller vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mmrft.models.family import one_box_instruction

log = logging.getLogger(__name__)

VL_FAMILIES = ("qwen2_5_vl", "qwen2_vl")
AUDIO_FAMILIES = ("qwen2_audio", "qwen2_5_omni")
# The newer families: each built by ``build(family, seed) -> (model, processor)`` of its module.
NEXT_BUILDERS = {
    "qwen3_vl": "mmrft.models.tiny.qwen3",
    "qwen3_vl_moe": "mmrft.models.tiny.qwen3",
    "glm4v": "mmrft.models.tiny.glm",
    "internvl": "mmrft.models.tiny.internvl",
    "gemma3": "mmrft.models.tiny.gemma",
    "gemma4": "mmrft.models.tiny.gemma",
    "qwen3_omni": "mmrft.models.tiny.qwen3",
    "qwen3_5": "mmrft.models.tiny.qwen3",
}
FAMILIES = VL_FAMILIES + AUDIO_FAMILIES + tuple(NEXT_BUILDERS)

# The Qwen2-VL / Qwen2.5-VL Instruct chat template (chat_template.json of both releases): a
# default system prompt only when the first message is not a system message; one
# <|vision_start|><|image_pad|><|vision_end|> per image part (<|video_pad|> per video part).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Special tokens of the real Qwen2-VL tokenizer, in id order after the BPE vocabulary
# (151643 … 151656 in the real one). All are `special`; the 13 after <|endoftext|> are the
# real tokenizer_config's additional_special_tokens.
QWEN2_VL_SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Qwen2.5-VL adds these (151657 … 151664) as added tokens that are *not* special.
QWEN2_5_VL_EXTRA = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Special tokens of the real Qwen2-Audio-7B(-Instruct) tokenizer, in id order after the BPE
# vocabulary (151643 … 151648 in the real one; config.audio_token_index = 151646).
QWEN2_AUDIO_SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
)
# Special tokens of the real Qwen2.5-Omni tokenizer (151643 … 151656): Qwen2.5-VL's layout with
# <|object_ref_start|>, <|object_ref_end|>, <|box_start|> renamed to the audio tokens and the
# vision tokens renamed (<|vision_bos|>, <|IMAGE|>, <|VIDEO|>, ...). The Qwen2.5 extras
# (QWEN2_5_VL_EXTRA) follow as non-special added tokens. The first six are Qwen2-Audio's.
QWEN2_5_OMNI_SPECIAL = (
    *QWEN2_AUDIO_SPECIAL,
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
)
# Named multimodal tokens of the Qwen2.5-Omni tokenizer_config (Qwen2_5OmniProcessor reads
# tokenizer.image_token, tokenizer.audio_bos_token, ...).
QWEN2_5_OMNI_NAMED = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}
SPECIAL_TOKENS = {
    "qwen2_5_vl": QWEN2_VL_SPECIAL,
    "qwen2_vl": QWEN2_VL_SPECIAL,
    "qwen2_audio": QWEN2_AUDIO_SPECIAL,
    "qwen2_5_omni": QWEN2_5_OMNI_SPECIAL,
}

# The Qwen2-Audio-7B-Instruct chat template (its tokenizer's chat_template): "Audio k: " and the
# audio placeholder, then a newline, per audio part.
QWEN2_AUDIO_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}Audio {{ audio_count.value }}: "
    "<|audio_bos|><|AUDIO|><|audio_eos|>\n{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The Qwen2.5-Omni-7B chat template (chat_template.json): images, audio and videos in part order,
# no separators; default system prompt "You are a helpful assistant." (the speech-output system
# prompt of the model card is only needed for the talker, which mmrft does not use).
QWEN2_5_OMNI_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}{% if add_audio_id %}Audio "
    "{{ audio_count.value }}: {% endif %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# tokenizer_config model_max_length of the real checkpoints.
MODEL_MAX_LENGTH = {
    "qwen2_5_vl": 131072,
    "qwen2_vl": 32768,
    "qwen2_audio": 8192,
    "qwen2_5_omni": 32768,
}
CHAT_TEMPLATES = {
    "qwen2_5_vl": CHAT_TEMPLATE,
    "qwen2_vl": CHAT_TEMPLATE,
    "qwen2_audio": QWEN2_AUDIO_CHAT_TEMPLATE,
    "qwen2_5_omni": QWEN2_5_OMNI_CHAT_TEMPLATE,
}

# Tiny audio front end (WhisperFeatureExtractor): rate (Hz), mel bins, hop (samples) and window
# (seconds). Frames per window = 10 s × 16000 / 160 = 1000; the encoders halve that (conv
# stride 2) to 500 positions and pool again, so 1 s of audio = 100 frames = 25 LLM tokens.
TINY_SAMPLING_RATE = 16000
TINY_MEL_BINS = 16
TINY_HOP = 160
TINY_AUDIO_SECONDS = 10
TINY_AUDIO_POSITIONS = TINY_AUDIO_SECONDS * TINY_SAMPLING_RATE // TINY_HOP // 2
# tiny Qwen2-Audio: the released 30 s window (3000 frames, 1500 positions), which vLLM's
# Qwen2-Audio requires of every clip's features
QWEN2_AUDIO_SECONDS = 30
QWEN2_AUDIO_POSITIONS = QWEN2_AUDIO_SECONDS * TINY_SAMPLING_RATE // TINY_HOP // 2
AUDIO_ENCODER = {
    "d_model": 32,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "num_mel_bins": TINY_MEL_BINS,
    "max_source_positions": TINY_AUDIO_POSITIONS,
}

BPE_VOCAB_SIZE = 1536  # byte alphabet (256) + merges; added tokens come after
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Image budget of the tiny processors (pixels): the bundled benchmarks are 56–112 px a side.
TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 112 * 112

# Text part of the tiny Qwen2-VL, Qwen2.5-VL, Qwen2-Audio and Qwen2.5-Omni models.
# head_dim = 64 / 2 = 32, the smallest head vLLM's CPU attention accepts (so `rollout.engine:
# vllm` runs on these models), and the mRoPE sections (temporal, height, width) sum to
# head_dim / 2 = 16. One KV head: grouped-query attention stays in the path. DECODER: the
# sizes alone (GLM-4.1V's tiny decoder has them too).
DECODER = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
}
TEXT = {
    **DECODER,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "mrope_section": [4, 6, 6],
    },
    "hidden_act": "silu",
    "use_cache": True,
}
# Vision tower of the tiny Qwen2.5-VL, Qwen2.5-Omni, Qwen3 and GLM-4.1V models (the Qwen2-VL
# style encoder's names): 2 blocks 32 wide with 2 heads.
VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2}
# The same tower in the ViT names of the tiny Gemma and InternVL models.
VIT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
# Tiny Qwen2.5-VL / Qwen2.5-Omni vision: VISION, windowed attention but for the last block.
QWEN2_5_VISION = {
    **VISION,
    "out_hidden_size": TEXT["hidden_size"],
    "fullatt_block_indexes": [1],
    "window_size": 112,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}

COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "cyan", "white", "black", "gray")
SHAPES = ("circle", "square", "triangle", "cross", "star")
_WORD_TEXT = (
    "a about above after all an and answer any are as at be below between big biggest box "
    "bottom but by can colour color colours colors coordinates corner count did do does each "
    "exactly final find first for from give given has have how if image images in inside is it "
    "its kind large largest left letter locate many more most no not number object objects of on "
    "one only option options or other output picture pixel pixels please question reasoning "
    "right say see shape shapes should show single small smallest step tags than that the their "
    "them then there these this to top two under what where which with write you your yes "
    "think thinking json bbox describe background image_size point points region "
    "JSON The It I A B C D width height relative normalised integers"
)
WORDS = _WORD_TEXT.split()
QUESTIONS = (
    "What colour is the shape?",
    "What color is the shape?",
    "What colour is the {shape}?",
    "What kind of shape is in the image?",
    "What shape is in the image?",
    "How many shapes are in the image?",
    "How many shapes are there in the image?",
    "How many {colour} shapes are there?",
    "How many {shape}s are in the image?",
    "Is there a {colour} {shape} in the image?",
    "Which shape is {colour}?",
)
FORMAT = (
    "First think about the question inside <think> </think> tags, then give the final answer "
    "inside <answer> </answer> tags.",
    "You may think inside <think> </think> tags first; give the final answer inside "
    "<answer> </answer> tags.",
    "Give only the final answer inside <answer> </answer> tags.",
    "Answer with the option letter only.",
    "Answer with a single word.",
    "Answer with a number.",
)
BOX_INSTRUCTIONS = (  # the families' box_instruction (mmrft.models.qwen_vl)
    one_box_instruction("input_pixels"),
    one_box_instruction("norm1000"),
)

# Audio-QA vocabulary for the audio families' tokenizers (sound events, speech, music, tones).
_AUDIO_WORD_TEXT = (
    "audio sound sounds clip recording hear heard listen hearing speech speaker speaking music "
    "musical instrument instruments noise silence silent tone tones beep beeps pitch high higher "
    "highest low lower lowest loud louder loudest quiet quieter long longer short shorter "
    "duration second seconds frequency Hz first last third same different dog barking cat bird "
    "car engine rain water piano guitar drum violin man woman child singing laughing crying "
    "emotion happy sad angry calm source event events choose choices following falling rising "
    "steady change changes does there then"
)
AUDIO_WORDS = _AUDIO_WORD_TEXT.split()
AUDIO_QUESTIONS = (
    "What is the main sound in the audio?",
    "What sound source can be heard?",
    "Which instrument is playing?",
    "What emotion does the speaker convey?",
    "How many beeps are in the audio?",
    "How many tones can you hear?",
    "Is the second tone higher than the first?",
    "Which tone is louder, the first or the second?",
    "Is the pitch high or low?",
    "How many beeps are there?",
    "How does the pitch of the tone change?",
)
# Single-word answers of the audio demo tasks (pitch contour, comparisons).
AUDIO_ANSWERS = ("falling", "rising", "steady", "high", "low", "louder", "quieter", "yes", "no")
# R1-AQA's prompt (Qwen2-Audio GRPO on AVQA): question, options, answer tag.
AQA_TEMPLATE = (
    "{question} Please choose the answer from the following options: {options}. "
    "Output the final answer in <answer> </answer>."
)


def audio_corpus() -> list[str]:
    """Extra tokenizer corpus lines of the audio families, in a fixed order."""
    lines: list[str] = []
    words = sorted(set(AUDIO_WORDS))
    for _ in range(6):
        lines.append(" ".join(words))
        lines.append(" ".join(w.capitalize() for w in words))
        lines.append("\n".join(words))
    answers = ("dog barking", "piano", "high", "low", "the first", "the second", "happy", "rain")
    for i, question in enumerate(AUDIO_QUESTIONS):
        options = [answers[(i + k) % len(answers)] for k in range(4)]
        for _ in range(4):
            lines.append(question)
            lines.append(AQA_TEMPLATE.format(question=question, options=str(options)))
        lines.append(f"<answer>{options[0]}</answer>")
        lines.append(f"<think>I hear {options[1]}.</think><answer>{options[1]}</answer>")
    for n in range(11):
        lines.append(f"There are {n} beeps in the audio. <answer>{n}</answer>")
    for answer in AUDIO_ANSWERS:
        lines += [f"<answer>{answer}</answer>", f"The pitch is {answer}."] * 6
    lines += ["Options: falling, rising, steady, rising then falling"] * 6
    lines += ["Audio 1: \nAudio 2: \n"] * 10
    return lines


def corpus(family: str = "qwen2_5_vl") -> list[str]:
    """The tokenizer training corpus: prompts, answers and word lists, in a fixed order.

    Frequencies are chosen so that the words the CPU demo trains on become single tokens,
    with and without a leading space. The audio families add :func:`audio_corpus` at the end
    (the Qwen-VL corpus, hence the Qwen-VL tiny models, are unchanged by it).
    """
    lines: list[str] = [DEFAULT_SYSTEM_PROMPT] * 20
    lines += ["system\nuser\nassistant\n"] * 20
    # Word lists: bare, spaced and capitalised forms.
    vocab_words = sorted(set(WORDS) | set(COLOURS) | set(SHAPES))
    for _ in range(6):
        lines.append(" ".join(vocab_words))
        lines.append(" ".join(w.capitalize() for w in vocab_words))
        lines.append("\n".join(vocab_words))
    lines += [" ".join(str(n) for n in range(21))] * 10
    # Questions with format instructions, and answers.
    for colour in COLOURS:
        for shape in SHAPES:
            for question in QUESTIONS:
                lines.append(question.format(colour=colour, shape=shape))
            lines.append(f"Locate the {colour} {shape} in the image.")
            lines.append(f"Locate the {colour} {shape}. {BOX_INSTRUCTIONS[0]}")
            lines.append(f"the {colour} {shape}\n{BOX_INSTRUCTIONS[1]}")
            lines.append(
                f"<think>The shape is a {colour} {shape}.</think><answer>{colour}</answer>"
            )
            lines.append(
                f"<think>I see one {shape}. It is {colour}.</think>\n<answer>{shape}</answer>"
            )
            lines.append(f"<answer>{colour}</answer>")
            lines.append(f"<answer>{shape}</answer>")
    for instruction in FORMAT:
        lines += [instruction] * 12
    for instruction in BOX_INSTRUCTIONS:
        lines += [instruction] * 12
    for n in range(21):
        lines.append(f"<think>I count {n} shapes.</think><answer>{n}</answer>")
        lines.append(f"There are {n} shapes in the image. <answer>{n}</answer>")
    for i in range(60):  # boxes: pixel and 0–1000 coordinates
        x1, y1 = (7 * i) % 80, (11 * i) % 80
        x2, y2 = x1 + 12 + i % 30, y1 + 9 + (3 * i) % 30
        lines.append(f'<answer>{{"bbox_2d": [{x1}, {y1}, {x2}, {y2}]}}</answer>')
        lines.append(f'{{"bbox_2d": [{x1 * 9}, {y1 * 9}, {x2 * 9}, {y2 * 9}]}}')
        lines.append(f"<|box_start|>({x1 * 9},{y1 * 9}),({x2 * 9},{y2 * 9})<|box_end|>")
    # Multiple choice, as the classification task lists options: "Options: a, b, c" or
    # lettered, one per line ("A. red").
    letters = "ABCD"
    for group in (COLOURS, SHAPES):
        for i in range(len(group)):
            options = [group[(i + k) % len(group)] for k in range(4)]
            lines.append("Options: " + ", ".join(options))
            lettered = "\n".join(f"{letters[k]}. {o}" for k, o in enumerate(options))
            lines.append(f"Options:\n{lettered}\nAnswer with the option letter only.")
            lines.append(f"<answer>{letters[i % 4]}</answer>")
    if family in AUDIO_FAMILIES:
        lines += audio_corpus()
    return lines


def train_bpe(
    lines: list[str],
    special: tuple[str, ...],
    extra: tuple[str, ...] = (),
    regex: str = PRETOKENIZE_REGEX,
    vocab_size: int = BPE_VOCAB_SIZE,
) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``lines`` (Qwen's layout: NFC, the
    ``regex`` split, byte-level), then the ``special`` tokens (special, in order) and the
    ``extra`` added tokens (not special) after the learned vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    raw = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    raw.train_from_iterator(lines, trainer=trainer)
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if extra:
        raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra])
    return raw


def qwen_tokenizer(
    raw: Any,
    extra_special: list[str] | dict[str, str],
    model_max_length: int,
    chat_template: str,
    cls: Any = None,
    **named: str,
) -> Any:
    """A tokenizer in the Qwen layout around the trained ``raw`` (:func:`train_bpe`): ``cls``
    (``Qwen2TokenizerFast`` by default), no BOS, ``<|im_end|>`` ends a turn, ``<|endoftext|>``
    pads, ``extra_special`` its additional special tokens (a list, or named tokens), ``named``
    the processor's named tokens (``image_token``, ...)."""
    from transformers import Qwen2TokenizerFast

    tokenizer = (cls or Qwen2TokenizerFast)(
        tokenizer_object=raw,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        extra_special_tokens=extra_special,
        errors="replace",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        **named,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def train_tokenizer(family: str) -> Any:
    """A ``Qwen2TokenizerFast`` trained on :func:`corpus` with the family's special tokens."""
    special = SPECIAL_TOKENS[family]
    extra = QWEN2_5_VL_EXTRA if family in ("qwen2_5_vl", "qwen2_5_omni") else ()
    raw = train_bpe(corpus(family), special, extra)
    named = QWEN2_5_OMNI_NAMED if family == "qwen2_5_omni" else {}
    return qwen_tokenizer(
        raw, list(special[1:]), MODEL_MAX_LENGTH[family], CHAT_TEMPLATES[family], **named
    )


def build_processor(family: str, tokenizer: Any) -> Any:
    """The family's real processor around ``tokenizer`` with a small image/video/audio budget."""
    from transformers import (
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    if family in AUDIO_FAMILIES:
        return build_audio_processor(family, tokenizer)
    image_processor = Qwen2VLImageProcessor(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    video_processor = Qwen2VLVideoProcessor(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    cls = Qwen2_5_VLProcessor if family == "qwen2_5_vl" else Qwen2VLProcessor
    return cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )


def build_feature_extractor(seconds: int = TINY_AUDIO_SECONDS) -> Any:
    """The tiny Whisper log-mel front end shared by the audio families (see the constants),
    padding or cutting each clip to a window of ``seconds``."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(
        feature_size=TINY_MEL_BINS,
        sampling_rate=TINY_SAMPLING_RATE,
        hop_length=TINY_HOP,
        chunk_length=seconds,
        n_fft=400,
        padding_value=0.0,
        return_attention_mask=True,
    )


def build_audio_processor(family: str, tokenizer: Any) -> Any:
    """``Qwen2AudioProcessor`` or ``Qwen2_5OmniProcessor`` (+ Qwen2-VL image/video processors)."""
    from transformers import (
        Qwen2_5OmniProcessor,
        Qwen2AudioProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    if family == "qwen2_audio":
        return Qwen2AudioProcessor(
            feature_extractor=build_feature_extractor(QWEN2_AUDIO_SECONDS),
            tokenizer=tokenizer,
            chat_template=QWEN2_AUDIO_CHAT_TEMPLATE,
        )
    return Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(
            min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS
        ),
        video_processor=Qwen2VLVideoProcessor(
            min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS
        ),
        feature_extractor=build_feature_extractor(),
        tokenizer=tokenizer,
        chat_template=QWEN2_5_OMNI_CHAT_TEMPLATE,
    )


def build_audio_config(family: str, tokenizer: Any) -> Any:
    """``Qwen2AudioConfig`` or ``Qwen2_5OmniThinkerConfig`` with tiny sizes.

    Qwen2-Audio: the real model unties ``lm_head`` and uses 1-D RoPE (θ = 10 000) in a Qwen2
    decoder. Omni thinker: Qwen2.5-VL's decoder (mRoPE sections 4/6/6 of head_dim/2 = 16, θ = 10⁶,
    tied embeddings as in the tiny VL models), its vision encoder, and an audio encoder that
    attends within windows of ``2·n_window`` = 100 mel frames (1 s; the real one: 2 s).
    """
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2AudioConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS[family]}
    token_ids = qwen_token_ids(tokenizer)
    if family == "qwen2_audio":
        text = {
            **{k: v for k, v in TEXT.items() if k != "rope_parameters"},
            "model_type": "qwen2",
            "max_position_embeddings": 8192,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "tie_word_embeddings": False,
            **token_ids,
        }
        audio = {
            **AUDIO_ENCODER,
            "max_source_positions": QWEN2_AUDIO_POSITIONS,
            "model_type": "qwen2_audio_encoder",
        }
        config = Qwen2AudioConfig(
            audio_config=audio, text_config=text, audio_token_index=ids["<|AUDIO|>"]
        )
        config.architectures = ["Qwen2AudioForConditionalGeneration"]
        return config
    text = {**TEXT, "rope_parameters": dict(TEXT["rope_parameters"]), **token_ids}
    text["tie_word_embeddings"] = True
    vision = dict(QWEN2_5_VISION)
    audio = {**AUDIO_ENCODER, "n_window": 50, "output_dim": TEXT["hidden_size"]}
    user = tokenizer.encode("user", add_special_tokens=False)
    config = Qwen2_5OmniThinkerConfig(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        audio_token_index=ids["<|AUDIO|>"],
        image_token_index=ids["<|IMAGE|>"],
        video_token_index=ids["<|VIDEO|>"],
        audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"],
        vision_start_token_id=ids["<|vision_bos|>"],
        vision_end_token_id=ids["<|vision_eos|>"],
        user_token_id=user[0] if len(user) == 1 else None,
        position_id_per_seconds=25,
        seconds_per_chunk=2,
        tie_word_embeddings=True,
    )
    config.architectures = ["Qwen2_5OmniThinkerForConditionalGeneration"]
    return config


# The "bench" size (``mmrft make-tiny --bench``): a random-init Qwen2.5-VL of about 41 M
# parameters for the performance benchmarks (benchmarks/vs_trl.py): text 512 wide, 8 layers,
# 8 heads of 64, vision tower 256 wide and 8 deep. Too large to commit (165 MB); built on demand.
BENCH_TEXT = {
    **TEXT,
    "hidden_size": 512,
    "intermediate_size": 1792,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "rope_parameters": {**TEXT["rope_parameters"], "mrope_section": [8, 12, 12]},
}
BENCH_VISION = {
    "depth": 8,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_heads": 4,
    "fullatt_block_indexes": [3, 7],
}
# Sizes other than the tiny one: text and vision-tower settings, and the one family each is
# built for (the learner's sizes live with the Qwen3 builder, mmrft.models.tiny.qwen3).
SIZE_FAMILIES = {"bench": "qwen2_5_vl", "learner": "qwen3_vl"}


def build_config(family: str, tokenizer: Any, size: str = "tiny") -> Any:
    """The real config class with tiny sizes (``size="bench"``: :data:`BENCH_TEXT`, Qwen2.5-VL
    only); ``vocab_size`` = ``len(tokenizer)``."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    if family in AUDIO_FAMILIES:
        return build_audio_config(family, tokenizer)
    if size not in ("tiny", "bench") or (size == "bench" and family != "qwen2_5_vl"):
        raise ValueError(f"size {size!r} of {family}: see SIZE_FAMILIES")
    sizes, vision_sizes = (BENCH_TEXT, BENCH_VISION) if size == "bench" else (TEXT, {})
    text = {
        **sizes,
        "rope_parameters": dict(sizes["rope_parameters"]),
        **qwen_token_ids(tokenizer),
    }
    common = qwen_vision_ids(tokenizer)
    if family == "qwen2_5_vl":
        vision = {
            **QWEN2_5_VISION,
            "out_hidden_size": sizes["hidden_size"],
            "tokens_per_second": 2,
            **vision_sizes,
        }
        config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)
    else:
        vision = {
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": TEXT["hidden_size"],
            "mlp_ratio": 2,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        }
        config = Qwen2VLConfig(text_config=text, vision_config=vision, **common)
    config.architectures = [
        "Qwen2_5_VLForConditionalGeneration"
        if family == "qwen2_5_vl"
        else "Qwen2VLForConditionalGeneration"
    ]
    return config


# transformers initialises weights with N(0, 0.02), a scale tuned for hidden sizes in the
# thousands. At hidden 64 it leaves attention uniform and the image's share of the answer
# logits near 0.5 %, so even supervised training on the bundled colour task stays at chance
# for 150 steps (measured); N(0, 0.1) ≈ 1/√64 (fan-in scale) reaches 98 % in the same steps.
INIT_STD = 0.1


def instantiate(cls: Any, config: Any, seed: int, **generation: Any) -> Any:
    """``cls(config)`` (its name written as ``config.architectures``), seeded, float32, in eval
    mode, with fan-in weights (:func:`reinit_fan_in`) and ``GenerationConfig(**generation)``."""
    import torch
    from transformers import GenerationConfig

    config.architectures = [cls.__name__]
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32).eval()
    reinit_fan_in(model, seed)
    model.generation_config = GenerationConfig(**generation)
    return model


def qwen_token_ids(tokenizer: Any) -> dict[str, int]:
    """Token-id fields of a Qwen text config (pad = bos = ``<|endoftext|>``, eos = ``<|im_end|>``)."""
    pad, eos = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    return {
        "vocab_size": len(tokenizer),
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
    }


def qwen_vision_ids(tokenizer: Any) -> dict[str, Any]:
    """The media-token fields of a Qwen-VL config (the ``<|vision_start|>`` …
    ``<|video_pad|>`` ids of :data:`QWEN2_VL_SPECIAL`), with tied embeddings."""
    fields = {
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
    }
    ids = {field: tokenizer.convert_tokens_to_ids(token) for field, token in fields.items()}
    return {**ids, "tie_word_embeddings": True}


def qwen_generation(tokenizer: Any) -> dict[str, Any]:
    """The Qwen Instruct generation config: ``<|endoftext|>`` pads (and is the BOS id),
    generation stops on ``<|im_end|>`` or ``<|endoftext|>``."""
    pad, eos = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    return {"bos_token_id": pad, "pad_token_id": pad, "eos_token_id": [eos, pad]}


def reinit_fan_in(model: Any, seed: int) -> None:
    """Redraw every weight matrix (≥ 2-D) from N(0, INIT_STD), in name order, seeded; norms
    and biases keep transformers' init."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() >= 2:
                param.normal_(0.0, INIT_STD, generator=generator)


def build_tiny(family: str, out_dir: Path, seed: int = 0, size: str = "tiny") -> Path:
    """Write a tiny ``family`` checkpoint (model, tokenizer, processor) to ``out_dir``
    (``size``: ``"bench"`` or ``"learner"``, the families of :data:`SIZE_FAMILIES`; random
    weights either way).

    ``out_dir`` is replaced. Returns ``out_dir``. Same ``seed`` → same bytes.
    """
    import importlib

    from transformers import (
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5OmniThinkerForConditionalGeneration,
        Qwen2AudioForConditionalGeneration,
        Qwen2VLForConditionalGeneration,
    )

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; choose from {', '.join(FAMILIES)}")
    if size != "tiny" and size not in SIZE_FAMILIES:
        raise ValueError(f"unknown size {size!r}; choose from tiny, {', '.join(SIZE_FAMILIES)}")
    if size != "tiny" and SIZE_FAMILIES[size] != family:
        raise ValueError(f"the {size} size exists for {SIZE_FAMILIES[size]} only, not {family}")
    if family in NEXT_BUILDERS:
        builder = importlib.import_module(NEXT_BUILDERS[family])
        args = {"size": size} if size != "tiny" else {}
        model, processor = builder.build(family, seed, **args)
        return save_checkpoint(model, processor, Path(out_dir))
    tokenizer = train_tokenizer(family)
    processor = build_processor(family, tokenizer)
    config = build_config(family, tokenizer, size=size)
    cls = {
        "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
        "qwen2_vl": Qwen2VLForConditionalGeneration,
        "qwen2_audio": Qwen2AudioForConditionalGeneration,
        "qwen2_5_omni": Qwen2_5OmniThinkerForConditionalGeneration,
    }[family]
    model = instantiate(cls, config, seed, **qwen_generation(tokenizer))
    return save_checkpoint(model, processor, Path(out_dir))


def save_checkpoint(model: Any, processor: Any, out_dir: Path) -> Path:
    """Write ``model`` (safetensors) and ``processor`` into ``out_dir``, replacing it.

    Written into a fresh temp folder beside the target, then swapped in, so a failed build
    never leaves a half-written checkpoint behind. Files are 0644, the folder 0755.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


BENCH_MODEL = "bench-qwen2_5_vl"


def bench_model(assets_dir: Path, rebuild: bool = False) -> Path:
    """``assets_dir/models/bench-qwen2_5_vl``, built on first use (not committed)."""
    folder = Path(assets_dir) / "models" / BENCH_MODEL
    if rebuild or not (folder / "config.json").is_file():
        build_tiny("qwen2_5_vl", folder, size="bench")
    return folder


def build_all(assets_dir: Path) -> list[Path]:
    """Build every tiny model under ``assets_dir/models/tiny-<family>``."""
    return [build_tiny(f, Path(assets_dir) / "models" / f"tiny-{f}") for f in FAMILIES]


def tree_digest(folder: Path) -> str:
    """SHA-256 over the relative paths and bytes of every file under ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def describe(folder: Path) -> dict[str, Any]:
    """Path, model_type, vocabulary and size in bytes of a built checkpoint (for the CLI)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
    return {
        "path": str(folder),
        "model_type": config["model_type"],
        "vocab_size": config["text_config"]["vocab_size"],
        "bytes": size,
        "digest": tree_digest(folder),
    }
