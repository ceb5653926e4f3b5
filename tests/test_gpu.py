"""The GPU path (marked ``gpu``, out of the default run): what only a CUDA device can show.

Run on a GPU machine with ``pytest -m gpu tests/test_gpu.py`` (``benchmarks/gpu.py`` does, and
reports the result). ``MMRFT_TEST_DEVICE=cpu`` runs the same checks on the CPU (bf16 there is
emulated and slow; ``benchmarks/gpu.py --cpu --tiny`` uses it so that this file cannot rot
between lent GPUs).

Tolerances, bf16 (weights and activations; log-softmax in float32):

* group-shared training forward against the per-completion one: |Δ log-prob| ≤ 0.15 for every
  token and ≤ 0.02 on average; every parameter gradient holding at least 1e-3 of the largest
  gradient's norm has cosine similarity ≥ 0.99 with the per-completion gradient. Both paths
  round differently (another summation order, padding in other places), so bf16 equality is
  not expected; the size of the gap is what these bounds watch;
* the same for ``model.attn_implementation=block_sparse`` (FlexAttention's fused kernel on
  CUDA) against the per-completion SDPA forward;
* sampler log-probs against the training forward: |Δ| ≤ 0.15, mean ≤ 0.02 (bf16); in float32
  on the GPU both checks use 1e-4 and greedy completions equal transformers ``generate``'s
  token for token;
* a checkpoint written on the GPU reloads in bf16 and evaluates to the metric the run reported.
"""

from __future__ import annotations

import os

import pytest
import torch
from test_group import MODELS, REPO, completions, conversations, prompts_of

from mmrft.config import load_config
from mmrft.policy.group import group_logps, rollout_logps
from mmrft.policy.model import completion_logps, load_policy
from mmrft.rollout.base import Sampling
from mmrft.rollout.hf import HFEngine

DEVICE = os.environ.get("MMRFT_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="no CUDA device"),
]
CASES = [("qwen2_5_vl", "image"), ("qwen2_5_vl", "video"), ("qwen3_vl", "image")]
PROMPT_INDEX = [0, 0, 0, 1, 1, 1]


def load(family: str, dtype: str, *overrides: str):
    cfg = load_config(
        None,
        [
            f"model.path={REPO / 'assets' / 'models' / MODELS[family]}",
            f"model.dtype={dtype}",
            "train.steps=0",
            *overrides,
        ],
    )
    return load_policy(cfg.model, torch.device(DEVICE))


def logps_and_grads(policy, prompts, comps, shared: bool):
    """Log-probs ``[n, C]`` (float32) and the gradients of Σ_i w_i Σ_t logp_it."""
    policy.model.zero_grad(set_to_none=True)
    if shared:
        logps, mask, _ = group_logps(policy, prompts, PROMPT_INDEX, comps, 0)
    else:
        logps, mask, _ = completion_logps(policy, [prompts[i] for i in PROMPT_INDEX], comps)
    weights = torch.linspace(-1.0, 1.5, len(comps), device=logps.device)[:, None]
    (logps * mask * weights).sum().backward()
    grads = {
        name: p.grad.detach().float().clone()
        for name, p in policy.model.named_parameters()
        if p.grad is not None
    }
    return logps.detach().float(), mask, grads


def assert_close_bf16(reference, other) -> None:
    logps_a, mask_a, grads_a = reference
    logps_b, mask_b, grads_b = other
    assert torch.equal(mask_a, mask_b)
    gap = ((logps_a - logps_b) * mask_a).abs()
    assert float(gap.max()) <= 0.15 and float(gap.sum() / mask_a.sum()) <= 0.02, float(gap.max())
    largest = max(float(g.norm()) for g in grads_a.values())
    checked = 0
    for name, g in grads_a.items():
        if float(g.norm()) < 1e-3 * largest:
            continue
        cosine = torch.nn.functional.cosine_similarity(g.flatten(), grads_b[name].flatten(), 0)
        assert float(cosine) >= 0.99, (name, float(cosine))
        checked += 1
    assert checked >= len(grads_a) // 4


@pytest.mark.parametrize("attention", ["sdpa", "block_sparse"])
@pytest.mark.parametrize(("family", "modality"), CASES)
def test_group_shared_forward_matches_per_completion_in_bf16(family, modality, attention) -> None:
    policy = load(family, "bfloat16")
    prompts = prompts_of(policy, modality)
    comps = [c for c in completions(policy)][: len(PROMPT_INDEX)]
    reference = logps_and_grads(policy, prompts, comps, shared=False)
    if attention != "sdpa":
        state = {k: v.clone() for k, v in policy.model.state_dict().items()}
        policy = load(family, "bfloat16", f"model.attn_implementation={attention}")
        policy.model.load_state_dict(state)
    assert_close_bf16(reference, logps_and_grads(policy, prompts, comps, shared=True))


def sampler_gap(policy, modality: str) -> tuple[torch.Tensor, torch.Tensor]:
    """|sampler log-prob − training forward's| per token of 2 prompts × 4 sampled completions,
    and the completions' mask."""
    torch.manual_seed(0)
    out = HFEngine(policy, 3).generate(conversations(modality), 4, Sampling(12, top_p=0.95))
    logps, mask, _ = rollout_logps(policy, out, list(range(8)), group_shared=True)
    sampler = torch.zeros_like(logps)
    for i, values in enumerate(out.logprobs):
        sampler[i, : len(values)] = torch.tensor(values, device=sampler.device)
    return ((logps.detach() - sampler) * mask).abs(), mask


@pytest.mark.parametrize(("family", "modality"), CASES)
def test_greedy_generation_and_sampler_logprobs_in_float32(family, modality) -> None:
    policy = load(family, "float32")
    greedy = Sampling(20, greedy=True)
    reference = HFEngine(policy, 8, group_shared=False).generate(conversations(modality), 1, greedy)
    shared = HFEngine(policy, 8).generate(conversations(modality), 1, greedy)
    assert shared.completion_ids == reference.completion_ids
    gap, _ = sampler_gap(policy, modality)
    assert float(gap.max()) <= 1e-4


@pytest.mark.parametrize(("family", "modality"), CASES[:1])
def test_sampler_logprobs_in_bf16(family, modality) -> None:
    gap, mask = sampler_gap(load(family, "bfloat16"), modality)
    assert float(gap.max()) <= 0.15 and float(gap.sum() / mask.sum()) <= 0.02


def test_a_bf16_checkpoint_reloads_and_evaluates_as_reported(tmp_path) -> None:
    import mmrft

    overrides = [
        f"device={DEVICE}",
        "model.dtype=bfloat16",
        "train.steps=4",
        "warm_start.steps=10",
        "eval.before=false",
        "data.max_test_samples=16",
        f"output_dir={tmp_path}",
        "name=gpu",
    ]
    summary = mmrft.train(mmrft.load_config("demo", overrides))
    checkpoint = tmp_path / "gpu" / "checkpoints" / "step-000004"
    assert (checkpoint / "model.safetensors").is_file()
    again = mmrft.evaluate_config(
        mmrft.load_config(
            "demo",
            [
                f"device={DEVICE}",
                "model.dtype=bfloat16",
                f"model.path={checkpoint}",
                "data.max_test_samples=16",
            ],
        )
    )
    assert again.metrics["accuracy"] == pytest.approx(summary["after"])
