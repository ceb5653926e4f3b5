"""The ``vllm`` engine: a vLLM engine in the trainer's own process (``rollout.engine: vllm``).

One engine per process, colocated with the policy it samples for (under torchrun or accelerate
each rank has its own): vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), loads the
policy's checkpoint once at start-up, and afterwards receives the policy's weights in memory
after every optimizer step (:meth:`VLLMEngine.sync_weights`: ``load_weights`` on the live
vLLM model through its in-place reload, LoRA merged out of place, prefix cache reset),
never through a file.

What the engine sees is what the trainer sees:

* the prompt text of the same chat template, and the media *as the family loaded them*
  (images resized by the family's pixel budget, video frames sampled and resized by its video
  budget, audio decoded at the processor's rate and cut by its audio budget), with the
  processor told not to resize again (:meth:`mmrft.models.family.ModelFamily.engine_inputs`);
* the trainer's own prepared prompt row of every group (one processor call), which the
  training forward uses;
* a parity check (:meth:`VLLMEngine.check_parity`) run at start-up on a few training prompts:
  vLLM's processed prompt token ids (media placeholders expanded) must equal the trainer's,
  token for token, or the run stops naming the sample, the first differing position and the
  placeholder counts of both sides.

Sampling: ``n = G`` completions per prompt in one request (vLLM shares the prompt's prefill
across them and, with prefix caching, across steps); media placeholder tokens are excluded
(``allowed_token_ids``), so a completion can never add an image token ("image features and
image tokens do not match"); every request gets its own seed drawn from torch's RNG, so the
samples are a function of the run's checkpointed RNG state (exact resume). The sampler's
log-probs are vLLM's raw log-probs (``logprobs_mode="raw_logprobs"``: the model's log-softmax
before temperature and filtering, the quantity the training forward computes); the trainer
logs their gap to its own (``rollout/logp_gap_mean`` / ``_max``) and can correct for it
(``algorithm.tis_cap``).

On GPU, ``rollout.vllm.sleep`` frees the engine's weights copy and KV cache between rollouts
(vLLM sleep mode, level 1) so the update has the memory. vLLM's CPU build is tested here
(``make test-vllm``); its GPU build is what users run on GPUs (``pip install 'mmrft[vllm]'``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import torch

from mmrft.policy.model import Policy, merged_weights
from mmrft.rollout.base import Rollouts, Sampling, stop_token_ids
from mmrft.rollout.preflight import VLLM_MISSING
from mmrft.runtime import distributed
from mmrft.typecheck import ConfigError

log = logging.getLogger(__name__)


class EngineParityError(ConfigError):
    """The engine would see other prompt tokens than the trainer (the message says where)."""


class VLLMEngine:
    """vLLM in this process, sampling for ``policy`` (see the module docstring).

    Args:
        policy: the trained policy (its checkpoint path is what vLLM loads first).
        settings: ``rollout.vllm`` (:class:`mmrft.config.VLLMConfig`).
        limits: the most images / videos / audio clips one prompt holds (vLLM reserves its
            encoder budget for them), e.g. ``{"image": 2}``.
        path: the checkpoint directory vLLM loads at start-up.
    """

    name = "vllm"

    def __init__(
        self,
        policy: Policy,
        settings: Any,
        limits: dict[str, int],
        path: str,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in this process
        try:
            from vllm import LLM
        except ImportError:
            raise ConfigError(VLLM_MISSING["vllm"]) from None
        self.policy = policy
        self.settings = settings
        self.stop_ids = stop_token_ids(policy)
        suppress = set(policy.family.suppress_token_ids(policy.processor))
        vocab = policy.model.get_output_embeddings().weight.shape[0]
        self.allowed = [i for i in range(vocab) if i not in suppress]
        self.allowed_no_stop = [i for i in self.allowed if i not in set(self.stop_ids)]
        cuda = policy.device.type == "cuda"
        self.sleeping = False
        self.sleep = bool(settings.sleep) and cuda
        eager = settings.enforce_eager if settings.enforce_eager is not None else not cuda
        kwargs: dict[str, Any] = {
            "model": path,
            "dtype": str(policy.model.dtype).removeprefix("torch."),
            "gpu_memory_utilization": settings.gpu_memory_utilization,
            "enforce_eager": eager,
            "seed": settings.seed,
            "enable_prefix_caching": True,
            "logprobs_mode": "raw_logprobs",
            "limit_mm_per_prompt": {k: max(1, v) for k, v in limits.items()},
            "mm_processor_kwargs": policy.family.engine_processor_kwargs(),
            "enable_sleep_mode": self.sleep,
        }
        if distributed.world_size() > 1:
            # one engine per rank on the trainer's own process group (as TRL's colocate mode):
            # vLLM's external-launcher backend reads the rank layout from the environment
            os.environ.update(
                RANK=str(distributed.rank()),
                LOCAL_RANK=os.environ.get("LOCAL_RANK", str(distributed.rank())),
                WORLD_SIZE=str(distributed.world_size()),
            )
            kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        if settings.max_model_len:
            kwargs["max_model_len"] = settings.max_model_len
        if settings.kv_cache_gb:
            kwargs["kv_cache_memory_bytes"] = int(settings.kv_cache_gb * 2**30)
        started = time.perf_counter()
        self.llm = LLM(**kwargs)
        log.info("vLLM engine ready in %.1f s (%s)", time.perf_counter() - started, path)

    # -- generation ------------------------------------------------------------------------
    def generate(
        self, conversations: list[list[dict[str, Any]]], n: int, sampling: Sampling
    ) -> Rollouts:
        policy = self.policy
        start = time.perf_counter()
        self._wake()
        prompts, inputs = policy.family.engine_inputs(policy.processor, conversations)
        # one seed per request from torch's RNG: samples follow the run's (checkpointed) RNG;
        # greedy decoding draws none (evaluation on one rank must not move its stream)
        seeds = (
            [None] * len(conversations)
            if sampling.greedy
            else torch.randint(0, 2**31 - 1, (len(conversations),)).tolist()
        )
        params = [self._params(sampling, n, seed) for seed in seeds]
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        out = Rollouts(prompts=prompts)
        for k, output in enumerate(outputs):
            for completion in output.outputs:
                ids = list(completion.token_ids)
                logprobs = [lp[token].logprob for lp, token in zip(completion.logprobs, ids)]
                text = policy.tokenizer.decode(ids, skip_special_tokens=True)
                out.add(k, ids, text, completion.finish_reason == "length", logprobs)
        self._rest()
        out.seconds = time.perf_counter() - start
        return out

    def _params(self, sampling: Sampling, n: int, seed: int | None) -> Any:
        """vLLM's ``SamplingParams`` for ``sampling`` (greedy: temperature 0, no filters), ``n``
        completions per prompt, sampler log-probs of the chosen tokens."""
        from vllm import SamplingParams

        return SamplingParams(
            **sampling_fields(sampling, n, seed, self.stop_ids, self.allowed, self.allowed_no_stop)
        )

    def continue_rows(self, rows: list[dict[str, Any]], sampling: Sampling) -> Rollouts:
        """One completion per prepared row (a prompt and a tool trajectory so far,
        :func:`mmrft.rollout.tool_loop.joined_row`), from the row's exact token ids: each
        medium's placeholders are sent as one (:func:`engine_prompt_ids`) with the row's
        ``engine_media`` (the media as the family loaded them), vLLM's processor expands them
        again, and the
        expanded prompt must be the row, token for token (else :class:`EngineParityError`:
        the engine would continue another sequence than the trainer trains on)."""
        policy = self.policy
        start = time.perf_counter()
        self._wake()
        tokenizer = policy.tokenizer
        pads = collapsed_tokens(policy)
        requests = []
        for row in rows:
            ids = engine_prompt_ids(row, pads)
            data = row.get("engine_media") or {}
            request: dict[str, Any] = {"prompt_token_ids": ids}
            if data:
                request["multi_modal_data"] = data
            requests.append(request)
        seeds = (
            [None] * len(rows)
            if sampling.greedy
            else torch.randint(0, 2**31 - 1, (len(rows),)).tolist()
        )
        params = [self._params(sampling, 1, seed) for seed in seeds]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        out = Rollouts(prompts=list(rows))
        for k, (row, output) in enumerate(zip(rows, outputs)):
            check_trajectory_parity(self.name, row["input_ids"].tolist(), output.prompt_token_ids)
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [lp[token].logprob for lp, token in zip(completion.logprobs, ids)]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            out.add(k, ids, text, completion.finish_reason == "length", logprobs)
        self._rest()
        out.seconds = time.perf_counter() - start
        return out

    # -- weights ---------------------------------------------------------------------------
    def current_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The policy's full weights under transformers' names, LoRA merged out of place
        (inside ``distributed.gathered`` when it is sharded)."""
        return merged_weights(self.policy.model)

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Load the policy's current weights into the engine (in memory): :meth:`load_weights`."""
        with distributed.gathered(self.policy.model):  # sharded: every rank takes part
            self.load_weights(self.current_weights())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load ``weights`` (checkpoint-format names; a snapshot the asynchronous collector
        took, or the policy's own) into the engine and drop the caches the old weights
        computed."""
        if self.sleep and self.sleeping:
            self.llm.wake_up(tags=["weights"])
        # vLLM's in-place reload (layer by layer): restores each layer's checkpoint-format
        # parameters, loads, then redoes the post-load processing (the CPU backend repacks its
        # GEMM weights there), and drops the encoder and multimodal caches
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={
                "weights_iterator": list(weights),
                "is_checkpoint_format": True,
            },
        )
        self.drop_caches()
        if self.sleep and self.sleeping:
            self.llm.sleep(level=1)

    def drop_caches(self) -> None:
        """Drop every cache derived from the weights, on both sides of the engine (the
        scheduler's and the model runner's): prefixes, encoder outputs, multimodal items."""
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_mm_cache()

    def close(self) -> None:
        """Shut the engine down and release vLLM's process-wide state (its process groups),
        so another engine can start later in this process; idempotent."""
        if getattr(self, "llm", None) is None:
            return
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        if distributed.world_size() == 1:  # under a launcher the process group is the trainer's
            cleanup_dist_env_and_memory()

    def _wake(self) -> None:
        if self.sleep and self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def _rest(self) -> None:
        if self.sleep:  # free the engine's memory for the update (GPU only)
            self.llm.sleep(level=1)
            self.sleeping = True

    # -- parity ----------------------------------------------------------------------------
    def check_parity(self, conversations: list[list[dict[str, Any]]], ids: list[str]) -> None:
        """Raise :class:`EngineParityError` unless vLLM's processed prompt of every
        conversation (placeholders expanded) is the trainer's, token for token."""
        from vllm import SamplingParams

        policy = self.policy
        prompts, inputs = policy.family.engine_inputs(policy.processor, conversations)
        self._wake()
        outputs = self.llm.generate(
            inputs, SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), use_tqdm=False
        )
        self._rest()
        placeholders = set(policy.family.suppress_token_ids(policy.processor))
        for sample_id, row, output in zip(ids, prompts, outputs):
            check_prompt_parity(
                self.name,
                f"sample '{sample_id}'",
                row["input_ids"].tolist(),
                output.prompt_token_ids,
                placeholders,
            )


def sampling_fields(
    sampling: Sampling,
    n: int,
    seed: int | None,
    stop_ids: list[int],
    allowed: list[int],
    allowed_no_stop: list[int],
) -> dict[str, Any]:
    """vLLM ``SamplingParams`` fields for ``sampling`` (greedy: temperature 0, no filters):
    ``n`` completions, the sampled tokens' log-probs (``logprobs=0``), only ``allowed`` tokens
    (``allowed_no_stop`` under ``ignore_eos``), ``stop_ids`` plus the sampling's own stop
    tokens, no detokenisation. Shared by the in-process and the served engine."""
    greedy = sampling.greedy
    return {
        "n": n,
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_p": 1.0 if greedy else sampling.top_p,
        "top_k": 0 if greedy else sampling.top_k,
        "min_p": 0.0 if greedy else sampling.min_p,
        "repetition_penalty": 1.0 if greedy else sampling.repetition_penalty,
        "max_tokens": sampling.max_new_tokens,
        "stop_token_ids": [*stop_ids, *sampling.stop_token_ids],
        "ignore_eos": sampling.ignore_eos,
        "allowed_token_ids": allowed_no_stop if sampling.ignore_eos else allowed,
        "logprobs": 0,
        "seed": seed,
        "detokenize": False,
    }


def first_difference(mine: list[int], theirs: list[int]) -> int:
    """The first position where two token lists differ (the shorter length when one is a
    prefix of the other)."""
    return next(
        (i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs))
    )


def check_prompt_parity(
    engine: str, what: str, mine: list[int], theirs: Any, placeholders: set[int]
) -> None:
    """Raise :class:`EngineParityError` unless the engine's processed prompt ``theirs``
    (placeholders expanded) is the trainer's ``mine``, token for token; the message names
    ``what`` (e.g. ``sample 'a'``), the first differing position and both placeholder counts."""
    theirs = list(theirs)
    if mine == theirs:
        return
    count = lambda tokens: sum(t in placeholders for t in tokens)  # noqa: E731
    raise EngineParityError(
        f"rollout.engine={engine}: the engine's prompt for {what} differs from the trainer's at "
        f"token {first_difference(mine, theirs)} ({len(theirs)} tokens with {count(theirs)} "
        f"media placeholders, the trainer's {len(mine)} with {count(mine)}); the engine and "
        "the trainer must process media with the same budgets (model.min_pixels / "
        "max_pixels, model.video.*, model.audio.*) and the same chat template"
    )


def check_trajectory_parity(engine: str, mine: list[int], theirs: Any) -> None:
    """Raise :class:`EngineParityError` unless the engine's expanded prompt of a continued
    tool trajectory is the trainer's row, token for token."""
    theirs = list(theirs)
    if mine == theirs:
        return
    raise EngineParityError(
        f"rollout.engine={engine}: a tool trajectory's prompt differs from the trainer's at "
        f"token {first_difference(mine, theirs)} ({len(theirs)} tokens against {len(mine)}): "
        "the engine expanded the media of the observations differently"
    )


def collapsed_tokens(policy: Policy) -> set[int]:
    """The media placeholder ids whose runs a request carries as one placeholder (vLLM's
    processor expands each again from the media): the family's media tokens and the ids it
    never samples."""
    tokenizer = policy.tokenizer
    media = {tokenizer.convert_tokens_to_ids(t) for t in policy.family.media_tokens.values()}
    placeholders = set(policy.family.suppress_token_ids(policy.processor))
    return (media - {None, tokenizer.unk_token_id}) | placeholders


def engine_prompt_ids(row: dict[str, Any], collapse: set[int]) -> list[int]:
    """The ids an engine is sent for a prepared row: its ``engine_ids`` (the chat template's
    text tokenised, one placeholder per medium, which the engine's processor expands again:
    every family's own layout, Qwen3-VL's timestamped video steps included) when the row has
    them, else its ids with each placeholder run collapsed (:func:`collapse_runs`)."""
    engine_ids = row.get("engine_ids")
    if engine_ids is not None:
        return [int(t) for t in engine_ids]
    return collapse_runs(row["input_ids"].tolist(), collapse)


def collapse_runs(ids: list[int], tokens: set[int]) -> list[int]:
    """``ids`` with every run of one of ``tokens`` shortened to a single token (a media
    placeholder before the engine's processor expands it)."""
    out: list[int] = []
    for token in ids:
        if token in tokens and out and out[-1] == token:
            continue
        out.append(token)
    return out
