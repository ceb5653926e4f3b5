"""Group-shared compute (mmrft/policy/group.py, the group-shared hf engine): exact against the
per-completion path, for every family with a tiny model and every modality it takes.

Training forward: log-probs within 1e-5 and parameter gradients within 1e-4 (relative to the
gradient's scale) of the per-completion forward, with completions of very different lengths,
with LoRA, gradient checkpointing, a frozen vision tower and micro-group rounds. Generation:
greedy completions token-identical to transformers ``generate``, and the sampler's log-probs
equal to the training forward's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from mmrft.algorithms import token_entropy
from mmrft.config import load_config
from mmrft.policy.group import check_attention, group_logps, pack, rollout_logps, rounds
from mmrft.policy.model import completion_logps, load_policy
from mmrft.rollout.base import Rollouts, Sampling
from mmrft.rollout.hf import HFEngine

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "assets" / "benchmarks"
IMAGES = sorted((BENCH / "shapes_colour" / "images").glob("*.png"))[:3]
AUDIO = sorted((BENCH / "audio_beeps" / "audio").iterdir())[:2]
VIDEOS = sorted((BENCH / "video_direction" / "videos").iterdir())[:2]
MODELS = {
    "qwen2_vl": "tiny-qwen2_vl",
    "qwen2_5_vl": "tiny-qwen2_5_vl",
    "qwen2_audio": "tiny-qwen2_audio",
    "qwen2_5_omni": "tiny-qwen2_5_omni",
    "qwen3_vl": "tiny-qwen3_vl",
    "qwen3_vl_moe": "tiny-qwen3_vl_moe",
    "glm4v": "tiny-glm4v",
    "internvl": "tiny-internvl",
    "gemma3": "tiny-gemma3",
    "qwen3_omni": "tiny-qwen3_omni",
    "qwen3_5": "tiny-qwen3_5",
    "gemma4": "tiny-gemma4",
}
# (family, modality): each family with every modality it takes
CASES = [
    ("qwen2_vl", "image"),
    ("qwen2_vl", "video"),
    ("qwen2_5_vl", "image"),
    ("qwen2_5_vl", "images"),
    ("qwen2_5_vl", "video"),
    ("qwen2_audio", "audio"),
    ("qwen2_5_omni", "image"),
    ("qwen2_5_omni", "video"),
    ("qwen2_5_omni", "audio"),
    ("qwen2_5_omni", "mixed"),
    ("qwen3_vl", "image"),
    ("qwen3_vl", "images"),
    ("qwen3_vl", "video"),
    ("qwen3_vl_moe", "image"),
    ("glm4v", "image"),
    ("glm4v", "images"),
    ("glm4v", "video"),
    ("internvl", "image"),
    ("internvl", "images"),
    ("internvl", "video"),
    ("gemma3", "image"),
    ("gemma3", "images"),
    ("qwen3_omni", "image"),
    ("qwen3_omni", "video"),
    ("qwen3_omni", "audio"),
    ("qwen3_omni", "mixed"),
    ("qwen3_5", "image"),
    ("qwen3_5", "images"),
    ("qwen3_5", "video"),
    ("gemma4", "image"),
    ("gemma4", "images"),
    ("gemma4", "video"),
    ("gemma4", "audio"),
    ("gemma4", "mixed"),
]
# two prompts; completions of very different lengths (1 to 30 tokens)
LENGTHS = [1, 7, 30, 3, 12, 2]
PROMPT_INDEX = [0, 0, 0, 1, 1, 1]


def load(family: str, *overrides: str):
    cfg = load_config(
        None,
        [f"model.path={REPO / 'assets' / 'models' / MODELS[family]}", "train.steps=0", *overrides],
    )
    return load_policy(cfg.model, torch.device("cpu"))


def part(kind: str, path: Path) -> dict:
    return {"type": kind, kind: str(path)}


def conversations(modality: str) -> list[list[dict]]:
    per_prompt = {
        "image": [[part("image", IMAGES[0])], [part("image", IMAGES[1])]],
        "images": [
            [part("image", IMAGES[0])],
            [part("image", IMAGES[1]), part("image", IMAGES[2])],
        ],
        "video": [[part("video", VIDEOS[0])], [part("video", VIDEOS[1])]],
        "audio": [[part("audio", AUDIO[0])], [part("audio", AUDIO[1])]],
        "mixed": [
            [part("image", IMAGES[0]), part("audio", AUDIO[0])],
            [part("video", VIDEOS[1]), part("audio", AUDIO[1])],
        ],
    }[modality]
    questions = ["What is it?", "Describe what you see and hear, in one long sentence."]
    return [
        [{"role": "user", "content": [*parts, {"type": "text", "text": q}]}]
        for parts, q in zip(per_prompt, questions)
    ]


def prompts_of(policy, modality: str) -> list[dict]:
    batch = policy.family.prepare(policy.processor, conversations(modality))
    return policy.family.split_rows(batch, policy.processor)


def completions(policy, seed: int = 0) -> list[list[int]]:
    """Token ids of ordinary vocabulary entries (no special or media tokens)."""
    rng = random.Random(seed)
    special = set(policy.tokenizer.all_special_ids) | set(
        policy.family.suppress_token_ids(policy.processor)
    )
    vocab = [i for i in range(min(len(policy.tokenizer), 400)) if i not in special]
    return [[rng.choice(vocab) for _ in range(n)] for n in LENGTHS]


def logps_and_grads(policy, prompts, comps, shared: bool, micro_group: int = 0):
    """Per-token log-probs and the gradients of Σ_i w_i Σ_t logp_it (fixed random weights)."""
    policy.model.zero_grad(set_to_none=True)
    if shared:
        logps, mask, _ = group_logps(policy, prompts, PROMPT_INDEX, comps, micro_group)
    else:
        logps, mask, _ = completion_logps(policy, [prompts[i] for i in PROMPT_INDEX], comps)
    weights = torch.linspace(-1.0, 1.5, len(comps))[:, None]
    (logps * mask * weights).sum().backward()
    grads = {
        name: p.grad.detach().clone()
        for name, p in policy.model.named_parameters()
        if p.requires_grad and p.grad is not None
    }
    return logps.detach(), mask, grads


def assert_same(reference, shared) -> None:
    """Log-probs within 1e-5; each parameter's gradient within 1e-4 of its own scale, with a
    floor of 1e-7 of the largest gradient: a gradient that is 0 in exact arithmetic (an
    attention key bias, which the softmax cancels) is float noise of that size in both."""
    logps_a, mask_a, grads_a = reference
    logps_b, mask_b, grads_b = shared
    assert torch.equal(mask_a, mask_b)
    assert float(((logps_a - logps_b) * mask_a).abs().max()) <= 1e-5
    assert grads_a.keys() == grads_b.keys() and grads_a
    largest = max(float(g.abs().max()) for g in grads_a.values())
    nonzero = 0
    for name, g in grads_a.items():
        scale = float(g.abs().max())
        if scale == 0.0:
            assert float(grads_b[name].abs().max()) == 0.0, name
            continue
        nonzero += 1
        tolerance = max(1e-4 * scale, 1e-7 * largest)
        assert float((g - grads_b[name]).abs().max()) <= tolerance, name
    assert nonzero >= len(grads_a) // 2  # most parameters (LoRA's A matrices get 0 at init)


@pytest.mark.parametrize(("family", "modality"), CASES)
def test_logps_and_gradients_equal_the_per_completion_path(family: str, modality: str) -> None:
    policy = load(family)
    prompts = prompts_of(policy, modality)
    comps = completions(policy)
    reference = logps_and_grads(policy, prompts, comps, shared=False)
    assert_same(reference, logps_and_grads(policy, prompts, comps, shared=True))
    tower = {id(p) for p in policy.family.vision_parameters(policy.model)}
    vision = {n for n, p in policy.model.named_parameters() if id(p) in tower}
    assert vision & reference[2].keys(), "the media encoder gets gradients through the prompt"


@pytest.mark.parametrize(
    ("variant", "overrides"),
    [
        ("lora", ["model.lora.enabled=true", "model.lora.r=4", "model.lora.dropout=0"]),
        ("gradient checkpointing", ["model.gradient_checkpointing=true"]),
        ("frozen vision tower", ["model.freeze_vision=true"]),
        ("eager attention", ["model.attn_implementation=eager"]),
        ("block-sparse attention", ["model.attn_implementation=block_sparse"]),
    ],
)
@pytest.mark.parametrize("modality", ["image", "video"])
def test_training_options_keep_the_group_path_exact(variant, overrides, modality) -> None:
    policy = load("qwen2_5_vl", *overrides)
    prompts = prompts_of(policy, modality)
    comps = completions(policy, seed=1)
    reference = logps_and_grads(policy, prompts, comps, shared=False)
    shared = logps_and_grads(policy, prompts, comps, shared=True)
    assert_same(reference, shared)
    if variant == "frozen vision tower":
        assert not any("visual" in name for name in shared[2])


@pytest.mark.parametrize("family", ["gemma4", "qwen3_5"])
def test_lora_and_checkpointing_keep_the_newer_layouts_exact(family: str) -> None:
    """Gemma 4 (per-layer-type masks, KV sharing, LoRA inside its clipped-linear encoders)
    under LoRA + gradient checkpointing; Qwen3.5's prefix path under LoRA (it refuses
    checkpointing, see tests/test_families.py)."""
    overrides = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.dropout=0"]
    if family == "gemma4":
        overrides.append("model.gradient_checkpointing=true")
    policy = load(family, *overrides)
    prompts = prompts_of(policy, "image")
    comps = completions(policy, seed=1)
    reference = logps_and_grads(policy, prompts, comps, shared=False)
    assert_same(reference, logps_and_grads(policy, prompts, comps, shared=True))


def test_micro_group_rounds_are_exact_and_repeat_the_prompt() -> None:
    policy = load("qwen2_5_omni")
    prompts = prompts_of(policy, "mixed")
    comps = completions(policy, seed=2)
    reference = logps_and_grads(policy, prompts, comps, shared=False)
    assert_same(reference, logps_and_grads(policy, prompts, comps, shared=True, micro_group=2))
    assert rounds(PROMPT_INDEX, 2) == [[0, 1], [2], [3, 4], [5]]


def test_rounds_group_by_prompt_in_order_of_appearance() -> None:
    assert rounds([3, 1, 3, 1, 3], 0) == [[0, 2, 4], [1, 3]]
    assert rounds([3, 1, 3, 1, 3], 2) == [[0, 2], [4], [1, 3]]
    assert rounds([], 4) == []


def test_packed_row_layout_by_hand() -> None:
    """One 3-token prompt (1-D positions) with completions [a, b] and [c]."""
    policy = load("qwen2_audio")
    prompt = {"input_ids": torch.tensor([5, 6, 7])}
    inputs, rows, cols, ids, mask, keep = pack(
        policy.family, policy.model, [prompt], [[[11, 12], [13]]], pad_token_id=0
    )
    assert inputs["input_ids"].tolist() == [[5, 6, 7, 11, 12, 13]]
    # both completions continue at position 3
    assert inputs["position_ids"].tolist() == [[0, 1, 2, 3, 4, 3]]
    allowed = inputs["attention_mask"][0, 0].int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],  # a: prompt + itself
        [1, 1, 1, 1, 1, 0],  # b: prompt + a + itself
        [1, 1, 1, 0, 0, 1],  # c: prompt + itself, not a or b
    ]
    # logits kept from position 2 (the last prompt token, predicting a and c) to the end
    assert keep == 4
    assert ids.tolist() == [[11, 12], [13, 0]] and mask.tolist() == [[1, 1], [1, 0]]
    assert rows.tolist() == [[0, 0], [0, 0]]
    assert cols.tolist() == [[0, 1], [0, 0]]  # a at 2, b at 3 (after a); c at 2


def test_flash_attention_is_refused_with_the_key_to_change() -> None:
    policy = load("qwen2_5_vl")
    for module in policy.model.modules():
        config = getattr(module, "config", None)
        if config is not None:
            config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"model.attn_implementation.*rollout.group_shared=false"):
        check_attention(policy.model)


@pytest.mark.parametrize(("family", "modality"), CASES)
def test_greedy_generation_equals_transformers_generate(family: str, modality: str) -> None:
    policy = load(family)
    greedy = Sampling(20, greedy=True)
    reference = HFEngine(policy, 8, group_shared=False).generate(conversations(modality), 1, greedy)
    shared = HFEngine(policy, 8).generate(conversations(modality), 1, greedy)
    assert shared.completion_ids == reference.completion_ids
    assert shared.truncated == reference.truncated and shared.texts == reference.texts
    assert len(shared.prompts) == 2 and set(shared.timings) == {"encode_s", "prefill_s", "decode_s"}


def assert_sampler_equals_training(policy, out) -> None:
    """The engine's sampling log-probs of every completion of ``out`` equal the training
    forward's (group-shared), token by token, within 1e-5."""
    logps, mask, _ = rollout_logps(
        policy, out, list(range(len(out.completion_ids))), group_shared=True
    )
    sampler = torch.zeros_like(logps)
    for i, values in enumerate(out.logprobs):
        sampler[i, : len(values)] = torch.tensor(values)
    assert float(((logps - sampler) * mask).abs().max().detach()) <= 1e-5


@pytest.mark.parametrize(("family", "modality"), [c for c in CASES if c[1] != "images"])
def test_sampler_logprobs_equal_the_training_forward(family: str, modality: str) -> None:
    policy = load(family)
    torch.manual_seed(0)
    # rounds of 3 completions: groups split across rounds, prompts prefilled in 2 chunks
    engine = HFEngine(policy, batch_size=3)
    out = engine.generate(conversations(modality), 4, Sampling(12, top_p=0.95, top_k=40))
    assert len(out.prompts) == 2 and out.prompt_index == [0, 0, 0, 0, 1, 1, 1, 1]
    assert_sampler_equals_training(policy, out)
    assert all(len(c) == 12 or not t for c, t in zip(out.completion_ids, out.truncated))


@pytest.mark.parametrize(
    ("family", "modality"),
    [
        ("qwen2_5_vl", "image"),
        ("qwen3_vl", "video"),
        ("gemma4", "image"),
        ("qwen2_5_omni", "audio"),
    ],
)
def test_scripted_completions_are_the_script_with_the_training_forwards_log_probs(
    family: str, modality: str
) -> None:
    """A smoke run's scripts (HFEngine.script): the chosen completions are the scripts, whole
    (longer than max_new_tokens too), scored in one forward on the prompt's cache; their
    sampler log-probs equal the training forward's, as the sampled ones beside them do."""
    policy = load(family)
    engine = HFEngine(policy, batch_size=3)
    stop = engine.stop_ids[0]
    script = {0: [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, stop]}
    script[5] = [31, 32, 33]  # no stop token: truncated
    engine.script = dict(script)
    torch.manual_seed(0)
    out = engine.generate(conversations(modality), 4, Sampling(12, top_p=0.95, top_k=40))
    assert engine.script is None  # one call only
    assert out.completion_ids[0] == script[0] and out.completion_ids[5] == script[5]
    assert out.truncated[0] is False and out.truncated[5] is True
    assert all(len(out.completion_ids[i]) <= 12 for i in range(8) if i not in script)
    assert_sampler_equals_training(policy, out)


def test_stopped_completions_end_with_the_stop_token_and_leave_the_batch() -> None:
    policy = load("qwen2_5_vl")
    engine = HFEngine(policy, 16)
    torch.manual_seed(3)
    free = engine.generate(conversations("image"), 8, Sampling(30))
    counts: dict[int, int] = {}
    for ids in free.completion_ids:
        for token in ids:
            counts[token] = counts.get(token, 0) + 1
    # the most frequent tokens now end a turn: rows stop at different steps and leave the batch
    engine.stop_ids = [*engine.stop_ids, *sorted(counts, key=counts.get)[-3:]]
    torch.manual_seed(3)
    out = engine.generate(conversations("image"), 8, Sampling(30))
    stopped = [c for c, t in zip(out.completion_ids, out.truncated) if not t]
    assert stopped and all(c[-1] in engine.stop_ids for c in stopped)
    assert all(not any(t in engine.stop_ids for t in c[:-1]) for c in out.completion_ids)
    assert len({len(c) for c in out.completion_ids}) > 2
    # the sampler's log-probs still equal the training forward's after rows left the batch
    assert_sampler_equals_training(policy, out)


def test_rollouts_select_and_extend_keep_one_prompt_per_group() -> None:
    a = Rollouts(prompts=[{"p": 0}, {"p": 1}])
    for k in (0, 0, 1, 1):
        a.add(k, [k], str(k), False, [0.0])
    picked = a.select([2, 3, 0])
    assert picked.prompts == [{"p": 1}, {"p": 0}] and picked.prompt_index == [0, 0, 1]
    picked.extend(a)
    assert picked.prompt_index == [0, 0, 1, 2, 2, 3, 3] and len(picked.prompts) == 4
    assert picked.prompt_rows[3] == {"p": 0} and picked.logprobs is not None


def test_group_backward_is_bitwise_repeatable_on_two_threads() -> None:
    """The first-token logits of a row are read by each of its completions; their gradients
    must add up in a fixed order (parallel atomics gave a different sum on every run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        policy = load("qwen2_5_vl")
        prompts = prompts_of(policy, "image")
        rng = random.Random(4)
        # one row of 64 short completions: its first-token position is read 64 times, by
        # entries on both threads' halves of the work
        comps = [[rng.randrange(10, 400) for _ in range(3)] for _ in range(64)]
        index = [0] * 64
        seen = set()
        for _ in range(8):
            policy.model.zero_grad(set_to_none=True)
            logps, mask, entropy = group_logps(
                policy, prompts, index, comps, token_stat=token_entropy
            )
            ((logps * mask).sum() + (entropy * mask).sum()).backward()
            grads = torch.cat([p.grad.flatten() for p in policy.model.parameters()])
            seen.add(grads.numpy().tobytes())
        assert len(seen) == 1
    finally:
        torch.set_num_threads(threads)


def test_min_p_keeps_tokens_near_the_most_likely():
    """min_p after temperature: with p = (0.5, 0.3, 0.15, 0.05) and min_p 0.4 only the tokens
    with p ≥ 0.2 are ever drawn; the reported log-prob is the raw one."""
    engine = HFEngine.__new__(HFEngine)
    engine.suppress_ids, engine.stop_ids = [], []
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].repeat(4000, 1)
    torch.manual_seed(0)
    tokens, logps = engine._sample(logits, Sampling(4, min_p=0.4))
    assert set(tokens.tolist()) == {0, 1}
    assert torch.allclose(logps, probs.log()[tokens])
    share = (tokens == 0).float().mean().item()
    assert abs(share - 0.5 / 0.8) < 0.03  # renormalised over the kept tokens


def test_repetition_penalty_is_transformers_rule():
    """penalise_repeats equals transformers' RepetitionPenaltyLogitsProcessor on the same
    scores and seen tokens; by hand: 2.0 → 1.0 and −1.0 → −2.0 at penalty 2, unseen kept."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    from mmrft.rollout.base import penalise_repeats

    scores = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    seen = torch.tensor([[True, True, False, False]])
    assert penalise_repeats(scores, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, 3.0]]
    torch.manual_seed(0)
    scores = torch.randn(3, 50)
    input_ids = torch.randint(0, 50, (3, 12))
    seen = torch.zeros(3, 50, dtype=torch.bool).scatter(1, input_ids, True)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(input_ids, scores.clone())
    assert torch.allclose(penalise_repeats(scores, seen, 1.7), expected)


def test_repetition_penalty_decodes_as_transformers_generate() -> None:
    """Near-greedy sampling (temperature 1e-6) with a penalty of 1.5 over prompt and completion:
    the group-shared decoder picks what transformers' generate picks with the same penalty,
    and the penalty changes what is generated. The reported log-probs stay the raw model's."""
    policy = load("qwen2_5_vl")
    penalised = Sampling(20, temperature=1e-6, repetition_penalty=1.5)
    torch.manual_seed(0)
    reference = HFEngine(policy, 8, group_shared=False).generate(
        conversations("image"), 1, penalised
    )
    shared = HFEngine(policy, 8).generate(conversations("image"), 1, penalised)
    assert shared.completion_ids == reference.completion_ids
    free = HFEngine(policy, 8).generate(conversations("image"), 1, Sampling(20, greedy=True))
    assert free.completion_ids != shared.completion_ids
    logps, _, _ = rollout_logps(policy, shared, [0, 1], group_shared=True)
    for i, values in enumerate(shared.logprobs):
        assert torch.allclose(logps[i, : len(values)], torch.tensor(values), atol=1e-5)


def _layout(prompts: list[int], comps: list[list[int]], pad_to: int = 0):
    """A RowLayout of rows [prompt | completions…] (causal prompts), padded to the longest."""
    from mmrft.policy.group import RowLayout

    L = max(max(p + sum(c) for p, c in zip(prompts, comps)), pad_to)
    segment = torch.full((len(prompts), L), -1)
    P = max(prompts)
    prompt = torch.zeros((len(prompts), P, P), dtype=torch.bool)
    for r, (lp, lengths) in enumerate(zip(prompts, comps)):
        segment[r, :lp] = 0
        prompt[r, :lp, :lp] = torch.ones(lp, lp, dtype=torch.bool).tril()
        start = lp
        for j, n in enumerate(lengths, start=1):
            segment[r, start : start + n] = j
            start += n
    return RowLayout(segment, prompt)


def test_block_sparse_mask_is_the_dense_layout_and_skips_masked_blocks() -> None:
    """Rows whose prompts and completions cross tile edges (tiles of 16, lengths not multiples of
    it): the mask as FlexAttention reads it (listed tiles, the rule in partial ones) equals the
    dense layout, completion-on-other-completion tiles are not listed, and a sliding window
    (Gemma's local layers) cuts as the dense rule does."""
    from mmrft.models.attention import dense_mask
    from mmrft.policy.group import block_sparse_mask

    layout = _layout([37, 20], [[40, 33, 50], [90, 5]])
    R, L = layout.segment.shape
    positions = torch.arange(L).repeat(R, 1)
    mask = block_sparse_mask(layout, positions, block=16)
    assert torch.equal(dense_mask(mask)[:, 0], layout.dense())
    tiles = -(-L // 16)
    listed = mask.kv_num_blocks.sum() + mask.full_kv_num_blocks.sum()
    assert int(mask.full_kv_num_blocks.sum()) > 0 and int(listed) < R * tiles * tiles * 0.6
    windowed = block_sparse_mask(layout, positions, window=24, block=16)
    behind = positions[:, :, None] - positions[:, None, :]
    assert torch.equal(dense_mask(windowed)[:, 0], layout.dense() & (behind < 24))


def test_flex_attention_under_the_block_mask_equals_sdpa_under_the_dense_one() -> None:
    """FlexAttention's own (eager, forward-only on CPU) reading of the block mask equals SDPA
    with the dense layout, with grouped-query heads and a length that is not a tile multiple."""
    from torch.nn.attention.flex_attention import flex_attention

    from mmrft.policy.group import block_sparse_mask

    layout = _layout([150, 70], [[60, 90, 3], [200]])
    R, L = layout.segment.shape
    torch.manual_seed(0)
    q = torch.randn(R, 4, L, 16)
    k, v = torch.randn(R, 2, L, 16), torch.randn(R, 2, L, 16)
    mask = block_sparse_mask(layout, torch.arange(L).repeat(R, 1))
    flex = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=layout.dense()[:, None]
    )
    assert float((flex - dense).abs().max()) < 1e-5


def test_block_sparse_keeps_per_layer_windows_exact() -> None:
    """Gemma 3 (sliding-window and full layers, one block mask each; images attending to
    themselves bidirectionally) under block_sparse; Gemma 4, whose KV sharing slices the mask
    by query rows, is refused with the key to change."""
    policy = load("gemma3", "model.attn_implementation=block_sparse")
    prompts = prompts_of(policy, "image")
    comps = completions(policy, seed=1)
    reference = logps_and_grads(policy, prompts, comps, shared=False)
    assert_same(reference, logps_and_grads(policy, prompts, comps, shared=True))
    gemma4 = load("gemma4", "model.attn_implementation=block_sparse")
    with pytest.raises(ValueError, match=r"block_sparse: .*Gemma 4.*attn_implementation=sdpa"):
        check_attention(gemma4.model)
