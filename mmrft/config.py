"""The typed run config: defaults ← preset ← YAML ← ``key=value`` overrides.

Every field is documented once, here, in its ``help`` metadata; defaults come from the papers'
recipes (docs/reference.md; the paper in the help text) unless noted. An unknown key is an
error that names it and suggests the closest valid key; a wrong type names the key and the
expected type. ``mmrft train --help-config`` prints this table. At start-up the keys that differ from the defaults are
printed (:func:`config_diff`); the whole resolved config is saved as ``config.yaml`` in the run
directory. Relative paths are anchored as :func:`load_config` says.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from mmrft.plugins import did_you_mean
from mmrft.typecheck import ConfigError, coerce, shown, type_name

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load`` that also reads ``1e-6`` as a float (YAML 1.1 demands ``1.0e-6``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def yaml_error(file: Path, exc: yaml.YAMLError) -> str:
    """One line for a YAML error: ``file:line: problem`` (``!!python/...`` tags are refused by
    the safe loader, and say so)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{file}:{mark.line + 1}" if mark is not None else str(file)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if "could not determine a constructor" in str(exc):
        problem = "a YAML tag that configs may not use (only plain YAML is read: no !!python/…)"
    return f"{where}: not valid YAML ({' '.join(str(problem).split())})"


CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "demo.yaml"


def _f(default: Any, help: str) -> Any:
    """A dataclass field with a default (copied when mutable) and its one help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help})
    return field(default=default, metadata={"help": help})


# The media distortions of rollout.perturb.kinds (NoisyRollout; mmrft.data.distort applies them).
IMAGE_KINDS = ("noise", "blur", "crop", "jitter")
VIDEO_KINDS = ("frame_drop", "frame_jitter")
AUDIO_KINDS = ("audio_noise",)
KINDS = IMAGE_KINDS + VIDEO_KINDS + AUDIO_KINDS


def require_deepspeed(mode: str) -> None:
    """Fail at start-up, naming the extra, when DeepSpeed is not installed (found by name:
    importing it takes seconds, and torch with it)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            f"train.sharding: '{mode}' needs DeepSpeed (pip install 'mmrft[deepspeed]'); "
            "or use 'fsdp_full' / 'fsdp_grad_op', which need only torch"
        )


@dataclass
class LoraConfig:
    enabled: bool = _f(False, "Train LoRA adapters (peft) instead of all weights.")
    r: int = _f(64, "LoRA rank.")
    alpha: int = _f(128, "LoRA alpha (scale = alpha / r).")
    dropout: float = _f(
        0.0,
        "LoRA dropout. 0 by default in RL: with dropout the trainer's log-probs differ from the "
        "sampler's (measured up to 0.69 nats on the tiny model after a push) and between two "
        "forwards of the same batch, so importance ratios move without any update (SFT recipes "
        "often use 0.05).",
    )
    target_modules: list[str] = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "Module names that get adapters (language model only unless vision is unfrozen).",
    )


@dataclass
class VideoConfig:
    fps: float = _f(2.0, "Frames sampled per second of video (Video-R1 / qwen-vl-utils default 2).")
    min_frames: int = _f(4, "Fewest frames sampled from a video.")
    max_frames: int = _f(16, "Most frames sampled from a video (Video-R1 trains with 16).")
    min_pixels: int = _f(3136, "Lower bound on resized frame H·W (pixels).")
    max_pixels: int = _f(100352, "Upper bound on resized frame H·W (pixels; Video-R1: 128·28·28).")
    total_pixels: int | None = _f(
        None, "Bound on the sum of H·W over a video's frames (pixels); None = none."
    )
    max_prompt_tokens: int | None = _f(
        None,
        "Prompt length limit (tokens); a video that would exceed it gets fewer frames, then fewer pixels, instead of failing.",
    )


@dataclass
class AudioConfig:
    max_seconds: float | None = _f(
        30.0, "Longest audio clip (seconds); the feature extractor's window caps it too."
    )
    policy: Literal["truncate", "error"] = _f(
        "truncate",
        "A longer clip: keep its start and count it in the log, or stop with an error naming the file.",
    )


@dataclass
class ModelConfig:
    path: str = _f(
        str(REPO_ROOT / "assets" / "models" / "tiny-qwen2_5_vl"),
        "Checkpoint directory (save_pretrained layout) or a Hugging Face hub id; default: the bundled tiny Qwen2.5-VL.",
    )
    family: str = _f("auto", "Model family adapter; 'auto' reads config.json's model_type.")
    dtype: Literal["float32", "bfloat16", "float16"] = _f(
        "float32", "Weights dtype. The papers train in bfloat16 on GPUs; CPU runs use float32."
    )
    attn_implementation: str | None = _f(
        None,
        "'sdpa', 'eager', 'flash_attention_2', or 'block_sparse' (SDPA, and FlexAttention with a block mask that skips masked blocks in the group-shared training forward, CUDA; the same function through SDPA elsewhere); None = transformers' default.",
    )
    min_pixels: int = _f(3136, "Lower bound on resized image H·W in pixels (56·56).")
    max_pixels: int = _f(
        401408, "Upper bound on resized image H·W in pixels (512·28·28, as the papers)."
    )
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward to save memory.")
    freeze_vision: bool = _f(
        False, "Freeze the vision tower (train the language model and merger only)."
    )
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA settings."})
    video: VideoConfig = field(
        default_factory=VideoConfig, metadata={"help": "Video sampling and token budget."}
    )
    audio: AudioConfig = field(
        default_factory=AudioConfig, metadata={"help": "Audio length policy."}
    )


@dataclass
class DataConfig:
    train: str = _f(
        "",
        "Training dataset file (JSONL). A relative path means the config file's folder when written in a config file, the current directory when given on the command line.",
    )
    test: str = _f("", "Held-out dataset file used by evaluation.")
    format: str = _f(
        "mmrft",
        "Record layout: 'mmrft' (the project's records, or any flat layout through data.fields), 'conversations' (LLaVA / VLM-R1: from human / gpt), or one of the task's own formats ('refcoco', 'charades', 'video_r1', ...). 'mmrft' and 'conversations' are read from JSON lines, a JSON list, parquet, a Hugging Face datasets directory (save_to_disk) or a folder of such files.",
    )
    fields: dict[str, Any] = _f(
        {},
        "Which key of a record holds what, for a layout that is not mmrft's: question, answer, image, video, audio (a path, a list of paths, or stored bytes), options (→ meta.choices), id; any other name copies that key into meta (e.g. {question: problem, answer: solution, image: image_path}). Dotted keys read nested objects; '<image>' placeholders are removed from the question; an answer in <answer> tags or written as JSON ('3', '[1, 2, 3, 4]') is unwrapped. Splits laid out differently take one mapping each: {train: {...}, test: {...}}.",
    )
    media_root: str = _f(
        "",
        "Folder that relative media paths of the mmrft / conversations layouts are relative to; empty = the dataset file's folder.",
    )
    on_error: Literal["raise", "skip"] = _f(
        "raise",
        "A bad line or a missing/corrupt image: stop with an error naming the file, or skip it and count it in the log.",
    )
    max_train_samples: int | None = _f(None, "Use at most this many training samples (None = all).")
    max_test_samples: int | None = _f(None, "Evaluate at most this many test samples (None = all).")
    max_prompt_tokens: int | None = _f(
        None,
        "Longest prompt (tokens of its rendered text, with the tools' system message when rollout.tools describes them; media count as their placeholders), checked when the data is read, before the model loads; a longer one is an error naming file:line (or skipped and counted under on_error=skip); a text over 32 characters per token is refused without tokenising it. None = the model's context (max_position_embeddings of its config) minus rollout.max_new_tokens.",
    )
    max_image_pixels: int | None = _f(
        89_478_485,
        "Largest source image or video frame (W·H pixels), read from the file header before decoding (a decompression bomb is refused without being decoded); the default is PIL's own Image.MAX_IMAGE_PIXELS, above which PIL only warns. None = no bound.",
    )
    max_video_seconds: float | None = _f(
        3600.0, "Longest video (seconds), from the container's metadata. None = no bound."
    )
    max_video_frames: int | None = _f(
        360_000,
        "Most frames in a video file (frames, from the container's metadata; 1 h at 100 fps). None = no bound.",
    )
    max_audio_seconds: float | None = _f(
        1200.0,
        "Longest audio file (seconds), from its header (soundfile info), before it is decoded; model.audio.max_seconds then cuts what the model hears. None = no bound.",
    )
    allow_remote_media: bool = _f(
        False,
        "Media given as http(s):// URLs are fetched at run time only when true; false = a dataset naming one stops at start-up with its file:line.",
    )
    sampler: str = _f(
        "uniform",
        "Which prompts each step draws (docs/data.md): 'uniform' (every prompt once per epoch in a seeded order), 'variance' (MMR1: weighted by recent reward variance and answer diversity), 'difficulty' (prompts always or never solved are set aside for a while), 'curriculum' (easy to hard over steps), or a registered @sampler plugin.",
    )
    sampler_params: dict[str, Any] = _f(
        {},
        "Keyword parameters of data.sampler, checked at start-up (e.g. {floor: 0.1} for variance, {readmit_after: 20} for difficulty, {by: meta, key: level, schedule: linear} for curriculum).",
    )
    stats_ema: float = _f(
        0.5,
        "Weight α of a prompt's newest group in its exponential means of reward and accuracy (m ← (1 − α)·m + α·x), in (0, 1]; the statistics land in prompt_stats.jsonl at each checkpoint.",
    )
    stats_verifier: str = _f(
        "",
        "Verifier whose score, normalised to its range, is a completion's correctness in the per-prompt accuracy statistic; empty = the first of the run's verifiers other than format; 'reward' = the total reward normalised to its range.",
    )


@dataclass
class TaskConfig:
    name: str = _f("classification", "Registered task name (`mmrft list tasks`).")
    params: dict[str, Any] = _f(
        {},
        "Keyword parameters of the task (e.g. think: none). They belong to the task: a command line that names another task than the config file's (task.name=prompt over demo.yaml's classification) drops the file's task.params and keeps only those it sets itself.",
    )
    system_prompt: str = _f(
        "",
        "A system message before every prompt (training, evaluation, warm start) unless the sample has its own; empty = the chat template's default.",
    )
    param_sources: ClassVar[dict[str, str]] = {}
    """Where each of ``params`` was set (``configs/demo.yaml: task.params.think``, ``the
    command line: task.params.template``), filled by :func:`load_config`; not a config key."""


@dataclass
class RewardConfig:
    verifiers: list[dict[str, Any]] = _f(
        [],
        "List of {name, weight, params}; empty = the task's default verifiers (format + task check, weights 1).",
    )
    timeout_s: float = _f(
        300.0, "Time budget of one verifier call on one batch (seconds); 0 = none."
    )
    on_timeout: Literal["zero", "stop"] = _f(
        "zero",
        "A verifier call over its budget: score the completions that time out alone (the batch is re-scored one at a time) the verifier's minimum with reason 'timeout' (logged with the sample ids), or stop the run.",
    )
    isolation: Literal["process", "inline"] = _f(
        "process",
        "Where verifiers run: worker processes killed at reward.timeout_s (a call stuck in C code cannot stall the run), or inline in the trainer's process (debugging; the budget is then kept by a thread, which such a call outlives).",
    )
    workers: int = _f(
        1, "Verifier worker processes under reward.isolation=process; a batch is split among them."
    )
    worker_memory_mb: int | None = _f(
        4096,
        "Memory (MiB) a verifier worker process may map beyond what it holds after loading the verifiers (RLIMIT_AS, Linux): a completion that makes a verifier allocate past it scores the verifier's minimum with reason 'memory' (found by re-scoring alone, as a timeout is) instead of calling the kernel's OOM killer onto the trainer. None = no cap.",
    )


@dataclass
class VLLMConfig:
    gpu_memory_utilization: float = _f(
        0.3,
        "Share of the device's memory vLLM reserves for its weights copy and KV cache (colocated with the trainer, so well below vLLM's own 0.9); on CPU a share of RAM (0.05–0.1 serve the tiny and bench models).",
    )
    kv_cache_gb: float | None = _f(
        None,
        "The engine's KV cache size in GiB, set explicitly (vLLM's kv_cache_memory_bytes) instead of derived from gpu_memory_utilization; on CPU vLLM subtracts the whole process's resident memory (the trainer's model and optimizer included) from the share, so a colocated CPU run should set this.",
    )
    max_model_len: int | None = _f(
        None, "Longest prompt + completion the engine accepts (tokens); None = the model's own."
    )
    enforce_eager: bool | None = _f(
        None,
        "Eager execution (no compilation or CUDA graphs); None = eager on CPU, compiled on GPU.",
    )
    sleep: bool = _f(
        False,
        "GPU only: free the engine's weights copy and KV cache between rollouts (vLLM sleep mode, level 1) so the update has the memory.",
    )
    seed: int | None = _f(
        None,
        "The engine's global seed; None = train.seed + rank. Every request also gets its own seed from torch's RNG, so samples follow the run's checkpointed RNG state.",
    )


@dataclass
class ServerConfig:
    """vLLM's OpenAI-compatible server as the rollout engine (``rollout.engine=vllm_server``,
    :mod:`mmrft.rollout.served`); the engine settings (dtype, seed, KV cache, lengths) are
    ``rollout.vllm``'s."""

    url: str | None = _f(
        None,
        "Base URL of a running vLLM server (http://host:port), started as docs/performance.md#the-served-engine shows; None = mmrft starts one on this machine from the same virtualenv and stops it when the run ends.",
    )
    host: str = _f("127.0.0.1", "Address a server mmrft starts listens on.")
    port: int = _f(0, "Port of a server mmrft starts; 0 = a free port.")
    start_timeout_s: float = _f(
        300.0,
        "Seconds a started server may take to answer /health (model loading and memory profiling included) before the run stops with the end of its log.",
    )
    request_timeout_s: float = _f(
        600.0,
        "Seconds one HTTP call to the server may take (a batch's generation, a weight reload) before the run stops naming the server.",
    )
    weights_dir: str | None = _f(
        None,
        "Directory the policy's weights are written to (safetensors, LoRA merged) after every optimizer step for the server to reload; None = a new directory in /dev/shm when it has room, else in the system's temporary directory. A server on another node needs a directory both machines see.",
    )
    extra_args: list[str] = _f(
        [],
        "More `vllm serve` arguments for a server mmrft starts, e.g. ['--max-num-seqs', '64'].",
    )
    log: str | None = _f(
        None,
        "File a started server's stdout and stderr go to (appended); None = server.log in a new temporary directory, removed when the run ends cleanly and kept (its path in the error) when the server fails.",
    )
    push: Literal["full", "lora"] = _f(
        "full",
        "What goes to the server after every optimizer step: 'full' (all weights, LoRA merged, reloaded in place) or 'lora' (with model.lora.enabled: only the adapter, loaded with vLLM's LoRA support, --enable-lora; the server keeps model.path's base weights, which LoRA never changes). 'lora' moves r·(in+out) numbers per adapted linear instead of the whole model; vLLM then samples through its LoRA kernels.",
    )
    devices: str | None = _f(
        None,
        "GPUs of a server mmrft starts (its CUDA_VISIBLE_DEVICES, e.g. '1' or '4,5,6,7' with --tensor-parallel-size 4 in extra_args), so generation runs on devices of its own beside the trainer's; None = the trainer's environment.",
    )


@dataclass
class ToolsConfig:
    """Multi-turn rollouts with tools (:mod:`mmrft.rollout.tool_loop`); off while ``names`` is empty."""

    names: list[str] = _f(
        [],
        "Tools the model may call (registered names, e.g. [crop] or [image_zoom_in]; `mmrft list tools`); empty (and no environment) = single-turn rollouts.",
    )
    environment: str | None = _f(
        None,
        "A stateful environment instead of tools (`mmrft list environments`; docs/tools.md#environments): one instance per trajectory, reset on the sample (its first observation joins the prompt), whose methods are the tools the model may call; it may end the episode with a reward in [0, 1] that the environment_reward verifier reads. Budgets and isolation as for tools (its worker process, timeout, memory cap). None = none.",
    )
    max_turns: int = _f(
        5,
        "Model turns per trajectory (DeepEyes: 5); a call in the last turn ends it with reason max_turns.",
    )
    max_tokens: int = _f(
        0,
        "Tokens of a trajectory after the prompt, model and observation tokens together; an observation that would pass it ends the trajectory (reason max_tokens) and is not added; each turn also gets at most rollout.max_new_tokens; 0 = max_turns × rollout.max_new_tokens + 4096.",
    )
    max_media: int = _f(
        4, "Images and clips tools may add to one trajectory (reason max_media past it)."
    )
    max_visual_tokens: int = _f(
        0,
        "Visual tokens tools may add to one trajectory (reason max_visual_tokens past it); 0 = no bound beyond max_tokens.",
    )
    describe: bool = _f(
        True,
        "Tell the model which tools exist, from the tools' JSON schemas: through the chat template's own tools= when it writes them, else a system message in Qwen's function-calling form (the '# Tools' block Qwen's templates write from tools=); off when the data's prompts describe the tools themselves.",
    )
    worker_memory_mb: int | None = _f(
        4096,
        "Memory (MiB) the tool worker process may map beyond what it holds after loading the tools (RLIMIT_AS, Linux): a call that allocates past it is a failed call with reason 'memory', never the kernel's OOM killer in the trainer. None = no cap.",
    )

    @property
    def active(self) -> bool:
        """Whether rollouts are multi-turn (tools named or an environment)."""
        return bool(self.names or self.environment)


@dataclass
class PerturbConfig:
    """NoisyRollout's rollout perturbation (Liu et al. 2025, arXiv:2504.13055; :mod:`mmrft.rollout.perturb`)."""

    share: float = _f(
        0.0,
        "Share of each group's completions sampled on a distorted copy of the prompt's media and trained on with the clean prompt (NoisyRollout, arXiv:2504.13055): m = round(share × rollout.group_size) clipped to [1, G − 1]; advantages are over the whole group, the update conditions every completion on the clean prompt; logged as train/reward/clean and train/reward/perturbed. 0 = off.",
    )
    kinds: list[str] = _f(
        ["noise"],
        "Distortions, applied in this order: noise, blur, crop, jitter (images, and every frame of a video), frame_drop, frame_jitter (videos), audio_noise (audio); each keeps the media's size (docs/algorithms.md#noisyrollout).",
    )
    strength: float = _f(
        0.5,
        "Distortion strength s₀ at step 0, in [0, 1] (0 = identity; noise: pixel std s × 255, blur: σ = s × max(H, W)/20 px, crop: side 1 − s/2, jitter: factors in [1 − s, 1 + s], frame_drop: drop probability s, audio_noise: std s × RMS).",
    )
    strength_end: float = _f(
        0.0, "Strength reached at anneal_steps and kept after, in [0, strength]."
    )
    anneal: Literal["constant", "linear", "cosine", "sigmoid"] = _f(
        "sigmoid",
        "Annealing of the strength from strength to strength_end over anneal_steps: s(t) = s_end + (s₀ − s_end)(1 − λ(t/T)), λ constant 0, linear x, cosine (1 − cos πx)/2, sigmoid (NoisyRollout's shape, λ(½) = ½).",
    )
    anneal_steps: int = _f(0, "Steps T of the annealing; 0 = train.steps.")
    seed: int | None = _f(
        None,
        "Seed of the distortions (each a pure function of it, the step and the prompt's data position, so resumes and world sizes distort alike); None = train.seed.",
    )


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm", "vllm_server"] = _f(
        "hf",
        "Generation engine: 'hf' (the policy itself with transformers, group-shared by default), 'vllm' (an in-process vLLM engine colocated with the trainer, weights pushed after every optimizer step; pip install 'mmrft[vllm]'; rollout.vllm.*) or 'vllm_server' (vLLM's own server process, started by mmrft or reached at rollout.server.url; weights pushed through a safetensors directory after every optimizer step; rollout.vllm.* and rollout.server.*).",
    )
    vllm: VLLMConfig = field(
        default_factory=VLLMConfig,
        metadata={"help": "The vLLM engine (rollout.engine=vllm or vllm_server)."},
    )
    server: ServerConfig = field(
        default_factory=ServerConfig,
        metadata={"help": "The served vLLM engine's process (rollout.engine=vllm_server)."},
    )
    group_size: int = _f(8, "Completions per prompt, G (papers: 8; 4 for 7B models).")
    temperature: float = _f(1.0, "Sampling temperature (papers: 0.9–1.0).")
    top_p: float = _f(1.0, "Nucleus sampling threshold.")
    top_k: int = _f(0, "Top-k sampling; 0 disables.")
    min_p: float = _f(
        0.0,
        "Min-p sampling: keep the tokens whose probability is at least min_p × the most likely one's (after temperature, top-k, top-p); 0 disables.",
    )
    repetition_penalty: float = _f(
        1.0,
        "Repetition penalty on tokens already in the prompt or the completion (a positive logit divided by it, a negative one multiplied, before temperature; transformers' and vLLM's rule); 1 disables, > 1 discourages repeats. Sampling only: log-probs and the loss use the model's own distribution.",
    )
    max_new_tokens: int = _f(512, "Maximum completion length in tokens.")
    batch_size: int = _f(
        64,
        "Completions decoded together (and, group-shared, prompts prefilled together): the rollout's memory is set by it, not by group_size.",
    )
    group_shared: bool = _f(
        True,
        "One encoding per group: each prompt's media and layers run once for its G completions, in generation (prefill once, decode the G continuations from its KV cache) and in every training forward (the completions packed behind one copy of the prompt); log-probs and gradients equal the per-completion path's. false = the per-completion path (every peer's method). Needs attention 'sdpa' or 'eager'.",
    )
    micro_group: int = _f(
        8,
        "Completions of one group per packed training row (Infinite Sampling's micro groups, arXiv:2506.22950): a larger group is forwarded in rounds, each with its own copy of the prompt, so activation memory does not grow with group_size; 0 = the whole group in one row.",
    )
    ignore_eos: bool = _f(
        False,
        "Never end a completion early: end-of-turn tokens are not sampled, so every completion is max_new_tokens long (for benchmarks; vLLM's ignore_eos, transformers' min_new_tokens).",
    )
    timeout_s: float = _f(
        0.0,
        "Time budget of one generate() call (seconds; transformers max_time); completions cut by it count as truncated; 0 = none.",
    )
    tools: ToolsConfig = field(
        default_factory=ToolsConfig,
        metadata={"help": "Multi-turn rollouts with tools (crop, video_frames, ...)."},
    )
    perturb: PerturbConfig = field(
        default_factory=PerturbConfig,
        metadata={"help": "NoisyRollout: a share of each group sampled on distorted media."},
    )
    max_staleness: int = _f(
        0,
        "Asynchronous rollouts: step t's completions may be sampled by weights up to this many updates older than the ones step t updates (t − 1), so generating the next steps overlaps the update (a rollout thread with its own copy of the weights, docs/algorithms.md#asynchronous-rollouts); the loss corrects the gap with algorithm.tis_cap (required). 0 = synchronous: generate, then update.",
    )
    partial_rollouts: bool = _f(
        False,
        "With max_staleness > 0: weights pushed while a batch decodes are loaded between two decode steps, so a completion cut by an update continues under the new weights (each token's version is recorded); false = a batch samples with the weights it started with.",
    )


@dataclass
class TemporalContrastConfig:
    """Video-R1's T-GRPO (Feng et al. 2025, arXiv:2503.21776); formula in
    :func:`mmrft.algorithms.temporal_contrast_bonus`."""

    enabled: bool = _f(
        False,
        "T-GRPO temporal contrast (Video-R1, arXiv:2503.21776): also sample completions of each video prompt with its frames shuffled; when the ordered group's accuracy p ≥ ratio × the shuffled accuracy p̃, its correct completions get +bonus (logged as train/reward/temporal). Prompts without a video get none; shuffled completions are not trained on.",
    )
    bonus: float = _f(0.3, "α: reward added to each correct ordered completion (Video-R1: 0.3).")
    ratio: float = _f(0.8, "μ: the bonus is granted when p ≥ μ·p̃ (Video-R1: 0.8).")
    shuffled_per_prompt: int | None = _f(
        None,
        "Completions sampled per prompt on the shuffled frames; None = rollout.group_size // 2 (Video-R1's code: 4 for G = 8).",
    )
    verifier: str = _f(
        "accuracy",
        "Reward verifier whose raw score (before its weight) is the correctness signal; it must be one of the run's verifiers.",
    )
    correct_above: float = _f(
        0.1,
        "A completion is correct when that verifier scores above this (Video-R1's code: accuracy > 0.1).",
    )
    skip_decided: bool = _f(
        True,
        "Sample shuffled completions only for groups whose bonus depends on them (some correct and p < ratio × the verifier's maximum); the rewards are identical, fewer completions are generated, and train/temporal_shuffled_accuracy covers only the groups sampled.",
    )


@dataclass
class AlgorithmConfig:
    preset: Literal["grpo", "dr_grpo", "dapo", "bnpo", "gspo"] | None = _f(
        None,
        "Fill the fields below from a paper's recipe (docs/algorithms.md); explicit keys still win. 'dapo' is the whole of DAPO: clip-higher, token-mean loss, dynamic sampling, overlong shaping over the last fifth of rollout.max_new_tokens, β = 0.",
    )
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"] = _f(
        "grpo",
        "Advantage estimator: GRPO (r−mean)/(std+eps) (arXiv:2402.03300), Dr.GRPO mean-only (2503.20783), RLOO (2402.14740), REINFORCE++ (2501.03262).",
    )
    eps: float = _f(1e-4, "Added to the group std in GRPO advantages (R1-V / open-r1 use 1e-4).")
    clip_low: float = _f(0.2, "Lower clip ε_low of the importance ratio (PPO).")
    clip_high: float = _f(0.2, "Upper clip ε_high (DAPO clip-higher uses 0.28, arXiv:2503.14476).")
    ratio_level: Literal["token", "sequence"] = _f(
        "token", "Importance ratio per token, or per sequence (GSPO, arXiv:2507.18071)."
    )
    agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = _f(
        "token-mean", "Loss aggregation over tokens and sequences of the whole optimizer step."
    )
    beta: float = _f(
        0.0,
        "KL coefficient β against the reference model; 0 = no reference model is loaded (papers: 0.04).",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = _f(
        "k3", "KL estimator (Schulman 2020); k3 as in GRPO."
    )
    kl_mode: Literal["loss", "reward"] = _f(
        "loss",
        "'loss': β·KL per token in the loss (GRPO); 'reward': r_i − β·Σ_t KL_t folded into the reward before advantages (PPO-RLHF style).",
    )
    entropy_coef: float = _f(0.0, "Entropy bonus coefficient (subtracted from the loss).")
    mask_truncated_completions: bool = _f(
        False,
        "Completions cut by the length limit (tool trajectories cut by a budget too) are left out of the loss: their tokens weigh 0 and leave the token denominator, as TRL's mask_truncated_completions; they still count in their group's advantages.",
    )
    tis_cap: float = _f(
        0.0,
        "Truncated importance sampling for an engine whose log-probs differ from the trainer's (vLLM): each token's loss is weighted by min(π_old/π_sampler, cap), detached (Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL training'); 0 = off. Needs an engine that reports log-probs.",
    )
    dual_clip: float | None = _f(
        None,
        "Dual-clip constant c > 1 bounding the loss of negative advantages (Ye et al. 2020, arXiv:1912.09729); None = off.",
    )
    updates_per_batch: int = _f(
        1,
        "Optimizer updates μ per rollout batch; > 1 reuses the batch with stored old log-probs and a real clipped ratio (PPO epochs).",
    )
    dynamic_sampling: bool = _f(
        False,
        "DAPO dynamic sampling (arXiv:2503.14476): drop groups whose rewards are all equal and refill from the next prompts.",
    )
    max_sampling_tries: int = _f(
        3, "Dynamic sampling: rollout rounds per step before training on the groups kept so far."
    )
    overlong_buffer: int = _f(
        0,
        "DAPO soft overlong punishment: completions longer than max_new_tokens − buffer lose up to overlong_penalty linearly; 0 = off.",
    )
    overlong_penalty: float = _f(1.0, "Largest overlong punishment (reward units).")
    temporal_contrast: TemporalContrastConfig = field(
        default_factory=TemporalContrastConfig,
        metadata={"help": "Video-R1's T-GRPO ordered-vs-shuffled frames bonus."},
    )
    distill_coef: float = _f(
        1.0,
        "With teacher.path (on-policy distillation, docs/algorithms.md): weight λ_D of the per-token advantage −(log π_old − log π_teacher) of each sampled token, the negative per-token reverse KL to the teacher on the policy's own samples (Agarwal et al. 2024, GKD; Qwen3; Thinking Machines 2025); added to λ_R·A_i in the clipped surrogate. Must be > 0 with a teacher.",
    )
    reward_coef: float = _f(
        1.0,
        "Weight λ_R of the verifiers' group advantage A_i in the per-token advantage λ_R·A_i + λ_D·d_{i,t}. With a teacher, 0 = pure distillation (the verifiers still score and log every completion; they do not enter the loss); without one it must stay 1.",
    )
    distill_loss: Literal["sampled", "full"] = _f(
        "sampled",
        "With teacher.path: 'sampled' puts the teacher's verdict on each sampled token into its advantage (λ_D·d_{i,t}, the per-token reverse-KL estimate, as the published on-policy distillation recipes); 'full' adds λ_D·KL(π_θ ‖ π_teacher) over the whole next-token distribution at every position the policy reached to the loss (GKD with β = 1, arXiv:2306.13649): exact, no sampling variance, the teacher's logits of one micro-batch in memory (the teacher runs beside each micro-batch's forward).",
    )
    distill_discount: float = _f(
        0.0,
        "γ ∈ [0, 1]: the distillation advantage of token t is Σ_{k≥t} γ^(k−t) d_{i,k} (future tokens' reverse KL too); 0 = each token's own term only, as the published on-policy distillation recipes.",
    )


@dataclass
class TeacherServerConfig:
    """A teacher served by vLLM (``teacher.server.url``, :mod:`mmrft.rollout.served_teacher`)."""

    url: str | None = _f(
        None,
        "Base URL (http://host:port) of a running vLLM server of the teacher, started with `vllm serve TEACHER --enable-scale-out` (docs/algorithms.md#a-served-teacher); it returns the log-probs of the policy's sampled tokens (prompt_logprobs on its token-in route), so a large teacher lives on other GPUs. teacher.path then names the same checkpoint for the start-up tokenizer and processor check only (its weights are not loaded); unset, the path the server reports is used. Only algorithm.distill_loss=sampled. None = the teacher is in process (teacher.path).",
    )
    request_timeout_s: float = _f(
        600.0,
        "Seconds one scoring request to the teacher's server may take before the run stops naming the server.",
    )


@dataclass
class TeacherConfig:
    """The frozen teacher of on-policy distillation (``algorithm.distill_coef``)."""

    path: str | None = _f(
        None,
        "Checkpoint directory or hub id of a frozen teacher of the policy's model family and tokenizer (checked at start-up: token ids must mean the same text); it scores every sampled token of the policy (on-policy distillation, docs/algorithms.md). Loaded and sharded like the KL reference (train.sharding), unless teacher.server.url serves it. None (and no server) = no teacher.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] | None = _f(
        None, "Teacher weights dtype; None = model.dtype."
    )
    attn_implementation: str | None = _f(
        None, "The teacher's attention implementation; None = model.attn_implementation."
    )
    server: TeacherServerConfig = field(
        default_factory=TeacherServerConfig,
        metadata={"help": "A teacher served by vLLM instead of loaded in process."},
    )

    @property
    def enabled(self) -> bool:
        """Whether the run has a teacher (in process or served)."""
        return bool(self.path or self.server.url)


@dataclass
class OptimConfig:
    lr: float = _f(1e-6, "Peak learning rate for AdamW (papers: 1e-6 for full fine-tuning).")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    betas: list[float] = _f([0.9, 0.99], "AdamW betas.")
    schedule: Literal["constant", "cosine"] = _f("constant", "LR schedule after warm-up.")
    warmup_steps: int = _f(0, "Linear warm-up steps.")
    max_grad_norm: float = _f(1.0, "Gradient clipping norm; 0 disables.")


@dataclass
class TrainConfig:
    steps: int = _f(500, "Optimizer steps of RL.")
    prompts_per_step: int = _f(
        16,
        "Prompts per optimizer step; each gets group_size completions (papers: 1 × 2 accum × 8 GPUs).",
    )
    micro_batch_size: int = _f(
        16,
        "Completions per forward/backward (gradient accumulation splits the step into micro-batches).",
    )
    seed: int = _f(42, "Seed of python, numpy and torch RNGs and the data order.")
    log_every: int = _f(1, "Write metrics every N steps.")
    heartbeat_s: float = _f(
        600.0,
        "Log a warning naming the phase (rollout, verifier, update, eval, checkpoint) and step when one lasts longer than this (seconds); 0 = off.",
    )
    completions_every: int = _f(
        10, "Write sample completions with their rendered prompt and rewards every N steps."
    )
    warn_no_signal_steps: int = _f(
        10,
        "Warn on the console when for this many steps in a row no group had reward variance (every advantage 0: nothing is learned), naming the most frequent reasons for minimum scores; repeated every as many steps while it lasts; 0 = off.",
    )
    threads: int | None = _f(None, "torch CPU threads (None = torch's default).")
    sharding: Literal["none", "fsdp_full", "fsdp_grad_op", "deepspeed_zero2", "deepspeed_zero3"] = (
        _f(
            "none",
            "How several processes hold the model: 'none' replicates parameters and optimizer states on every process; 'fsdp_full' shards parameters, gradients and optimizer states with FSDP2 and frees gathered parameters after each layer's forward (ZeRO-3); 'fsdp_grad_op' shards the same but keeps a layer's gathered parameters from forward to backward (ZeRO-2's traffic, more memory); 'deepspeed_zero2' / 'deepspeed_zero3' use DeepSpeed's ZeRO engine (pip install mmrft[deepspeed]; every process must run the same media kinds in each pass). An accelerate config of distributed_type FSDP or DEEPSPEED sets it. One process: ignored. See mmrft/runtime/distributed.py and mmrft/runtime/zero.py.",
        )
    )
    deepspeed: dict[str, Any] = _f(
        {},
        "DeepSpeed zero_optimization settings merged over mmrft's (e.g. offload_optimizer: {device: cpu}, offload_param: {device: cpu}, reduce_bucket_size, stage3_* keys); the stage comes from train.sharding. Filled from an accelerate DeepSpeed config's offload devices and deepspeed_config_file.",
    )
    trackers: list[Literal["tensorboard", "wandb"]] = _f(
        [], "Experiment trackers beside metrics.jsonl (pip install mmrft[track])."
    )
    wandb_project: str = _f("mmrft", "W&B project name.")
    wandb_mode: Literal["offline", "online", "disabled"] = _f(
        "offline", "W&B mode; offline needs no account (wandb sync uploads later)."
    )


@dataclass
class WarmStartConfig:
    steps: int = _f(0, "Supervised warm-start steps before RL (0 = none).")
    lr: float = _f(1e-3, "Learning rate of the warm start.")
    batch_size: int = _f(16, "Samples per warm-start step.")
    labels: Literal["random", "target"] = _f(
        "random",
        "'random': answers drawn from other samples' targets, which teaches only the answer format and keeps accuracy at chance; 'target': ordinary SFT on the ground truth.",
    )
    demonstrations: bool = _f(
        False,
        "With rollout.tools: each warm-start completion is a tool trajectory of a scripted 'look closer' policy: a call on the sample's target (meta target_box: a crop around it; meta target_span: video_frames over it), its observation, then the answer (by warm_start.labels); samples without a target answer directly. Trained on the model's tokens only.",
    )
    calls: Literal["target", "random", "any"] = _f(
        "target",
        "Where a demonstration's scripted call looks: 'target' the sample's region (meta zoom_box / target_box, zoom_span / target_span); 'random' a region of the same size at a uniformly random place of the image or clip (seeded by train.seed; one of meta zoom_choices when a sample names them; a clip needs meta duration): the call's format without where to look; 'any' every place of meta zoom_choices at once, the call's loss -log of the summed probability of those calls: the format and the places, the choice among them left to the model (samples with a target need zoom_choices).",
    )
    train_on: Literal["all", "answer", "calls"] = _f(
        "all",
        "Which model turns of a demonstration carry the loss: 'all'; 'answer' the last turn only (reading what the calls fetched: a reader's pre-training; it teaches answering at a turn's start, so on its own it makes a model stop calling: a 60-step warm start so, random labels, gave RL a use rate of 0); 'calls' every turn but the last (the call's format, the answer left to the model).",
    )


@dataclass
class EvalConfig:
    every: int = _f(0, "Evaluate the test split every N RL steps (0 = only before and after).")
    before: bool = _f(True, "Evaluate before RL (after any warm start).")
    after: bool = _f(True, "Evaluate after RL.")
    batch_size: int = _f(32, "Prompts per greedy generate() call.")
    max_new_tokens: int | None = _f(
        None, "Completion budget for evaluation (None = rollout.max_new_tokens)."
    )
    n: int = _f(
        1,
        "Completions per test sample: 1 = greedy; n > 1 samples n at eval.temperature (seeded by train.seed, the training RNG untouched) and reports pass@k for k = 1, 2, 4, … ≤ n.",
    )
    temperature: float = _f(1.0, "Sampling temperature of evaluation with eval.n > 1.")
    verifiers: list[dict[str, Any]] = _f(
        [],
        "Verifiers also scored on the evaluation's completions, as metrics verifier/<name> (the mean of each; the same {name, params} entries as reward.verifiers, plugins included); the task's own metrics are unchanged.",
    )
    harness: Literal["", "lmms_eval"] = _f(
        "",
        "A standard evaluation harness run at every evaluation (before, every eval.every steps, after) on the model in memory and in `mmrft eval`: 'lmms_eval' (pip install -e \".[eval]\"); '' = none. Metrics harness/<task>/<metric>; lmms-eval's own results and samples files under each evaluation's folder.",
    )
    harness_tasks: list[str] = _f(
        [],
        "lmms-eval task or group names (e.g. [mmmu_val, chartqa]); the bundled local tasks (configs/lmms_eval, e.g. mmrft_shapes_colour) need no download.",
    )
    harness_limit: float | None = _f(
        None,
        "At most this many samples per harness task (a number in (0, 1): that fraction of each); None = all.",
    )
    harness_include: list[str] = _f(
        [],
        "Folders of local lmms-eval task YAML files, indexed beside the bundled configs/lmms_eval.",
    )


@dataclass
class CheckpointConfig:
    every: int = _f(100, "Save a checkpoint every N steps (0 = only at the end).")
    keep_last: int = _f(2, "Keep the newest N step checkpoints.")
    keep_best: str = _f(
        "",
        "A metric logged at evaluation (eval/<task>/<metric>, harness/<task>/<metric>, verifier/...): the weights of the evaluation where it was best so far are kept in <run dir>/best (with best.json: metric, value, step); '' = off.",
    )
    keep_best_mode: Literal["max", "min"] = _f(
        "max", "'max': higher is better (accuracy); 'min': lower is better (format_fail)."
    )
    resume: str = _f(
        "auto",
        "'auto' resumes from the newest complete checkpoint in the run directory, and refuses when the config changed in a key that changes the run (naming each); 'force' resumes all the same; 'never' starts over; or a checkpoint path. `resume=` is short for this key.",
    )


@dataclass
class RunConfig:
    name: str = _f(
        "",
        "Run name; empty = <task>__<model>__<seed>. A plain folder name: no '/', '\\', '..' or control characters (a newline), at most 255 bytes.",
    )
    output_dir: str = _f(
        "runs",
        "Parent directory of run directories (run dir = output_dir/name); a relative path means the current directory.",
    )
    device: Literal["auto", "cpu", "cuda"] = _f(
        "auto", "Where to train; 'auto' = cuda if available."
    )
    plugins: list[str] = _f([], "User plugins to import: file.py paths or dotted modules.")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "The policy model."})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "Datasets."})
    task: TaskConfig = field(default_factory=TaskConfig, metadata={"help": "Task adapter."})
    reward: RewardConfig = field(
        default_factory=RewardConfig, metadata={"help": "Verifiers and weights."}
    )
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "Sampling."})
    algorithm: AlgorithmConfig = field(
        default_factory=AlgorithmConfig, metadata={"help": "GRPO-family loss."}
    )
    teacher: TeacherConfig = field(
        default_factory=TeacherConfig,
        metadata={"help": "On-policy distillation's teacher (algorithm.distill_coef)."},
    )
    optim: OptimConfig = field(
        default_factory=OptimConfig, metadata={"help": "Optimizer and schedule."}
    )
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "Training loop."})
    warm_start: WarmStartConfig = field(
        default_factory=WarmStartConfig, metadata={"help": "Optional supervised warm start."}
    )
    eval: EvalConfig = field(
        default_factory=EvalConfig, metadata={"help": "Evaluation on the test split."}
    )
    checkpoint: CheckpointConfig = field(
        default_factory=CheckpointConfig, metadata={"help": "Checkpoints and resume."}
    )


# ---------------------------------------------------------------------------------------------
# Building and validating


def _from_dict(cls: type, data: dict[str, Any], prefix: str) -> Any:
    if not isinstance(data, dict):
        where = prefix.removesuffix(".") or "config"  # prefix: "" or "section."
        raise ConfigError(f"{where}: expected a mapping, got {shown(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in fields:
            valid = [f"{prefix}{k}" for k in fields]
            raise ConfigError(f"unknown config key '{full}'; {did_you_mean(full, valid)}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _from_dict(hint, value, f"{full}.")
        else:
            kwargs[key] = coerce(value, hint, full)
    return cls(**kwargs)


MAX_CONFIG_DEPTH = 32
"""Deepest nesting of mappings and lists a config may hold, sections included (the bundled
configs nest at most 5 deep: a verifier's parameters, a tool's settings). Deeper input is
refused with one line; unbounded, Python's YAML reader, ``config.yaml`` and the config diff
would recurse into a RecursionError."""


MAX_CONFIG_VALUES = 100_000
"""Most values (mappings, lists and scalars, a YAML alias counted each time it is used) one
config value may hold: a "billion laughs" file of nested aliases is refused, not expanded."""


def check_depth(value: Any, key: str, limit: int = MAX_CONFIG_DEPTH) -> None:
    """Refuse ``value`` when its mappings and lists nest more than ``limit`` deep (a mapping
    that holds itself counts as endless) or hold more than :data:`MAX_CONFIG_VALUES` values,
    naming ``key`` (for a whole config, ``""``: the key where it happened, two levels down)
    and the path down to the limit. Iterative: any depth is checked without recursion."""
    stack: list[tuple[Any, int, str]] = [(value, 0, key)]
    seen = 0
    while stack:
        node, depth, where = stack.pop()
        seen += 1
        if isinstance(node, Mapping):
            children = [(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()]
        elif isinstance(node, (list, tuple)):
            children = [(v, f"{where}[{i}]") for i, v in enumerate(node)]
        else:
            continue
        too_deep = bool(children) and depth >= limit
        if too_deep or seen > MAX_CONFIG_VALUES:
            head = key or re.match(r"[^.\[]*(\.[^.\[]+)?", where).group()  # type: ignore[union-attr]
            at = where if len(where) <= 120 else where[:120] + "…"
            what = (
                f"nested deeper than {limit} levels of mappings and lists (at {at})"
                if too_deep
                else f"holds more than {MAX_CONFIG_VALUES} values (YAML aliases count each "
                "time they are used)"
            )
            raise ConfigError(f"{head or 'config'}: {what}")
        stack.extend((child, depth + 1, at) for child, at in children)


def validate_config(
    cfg: Any, where: str = "mmrft.train", console: Any = None, training: bool = True
) -> RunConfig:
    """Check a config built or changed in Python as :func:`load_config` checks a file, before
    anything is written (the Python API's ``train`` and ``evaluate_config`` call it): every
    field's type as ``mmrft train --help-config`` shows it (an int where a float goes becomes a
    float, a section given as a mapping becomes its section), no attribute that is not a key
    (``cfg.train.stepz = 3``: the closest valid key is named), nesting at most
    :data:`MAX_CONFIG_DEPTH` deep, then :func:`check_config` (``training=False``: an
    evaluation, which needs no training file). A bad value or key is a
    :class:`ConfigError`; a ``cfg`` that is no :class:`RunConfig`, or a ``console`` without a
    ``print``, a :class:`TypeError` naming ``where`` and what it expects. Returns ``cfg``."""
    if not isinstance(cfg, RunConfig):
        raise TypeError(
            f"{where}: cfg: expected a RunConfig (mmrft.load_config(...) or "
            f"mmrft.config.RunConfig()), got {type(cfg).__name__} {shown(cfg)}"
        )
    if console is not None and not callable(getattr(console, "print", None)):
        raise TypeError(
            f"{where}: console: expected a rich.console.Console or None, got "
            f"{type(console).__name__} {shown(console)}"
        )
    _check_section(cfg, RunConfig, "")
    check_config(cfg, training)
    return cfg


def _check_section(node: Any, cls: type, prefix: str) -> None:
    """:func:`validate_config` of one section, in place."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for name in vars(node):
        if name not in hints:
            full = f"{prefix}{name}"
            valid = [f"{prefix}{k}" for k in names]
            raise ConfigError(f"unknown config key '{full}'; {did_you_mean(full, valid)}")
    for name in names:
        full, value, hint = f"{prefix}{name}", getattr(node, name), hints[name]
        if dataclasses.is_dataclass(hint):
            if isinstance(value, Mapping):
                check_depth(value, full)
                setattr(node, name, _from_dict(hint, dict(value), f"{full}."))
            elif type(value) is hint:
                _check_section(value, hint, f"{full}.")
            else:
                raise ConfigError(
                    f"{full}: expected the {full} section ({hint.__name__}, or a mapping of its "
                    f"keys), got {shown(value)}"
                )
        else:
            check_depth(value, full)
            setattr(node, name, coerce(value, hint, full))


def check_config(cfg: RunConfig, training: bool = True) -> None:
    """Cross-field checks that no single type can express (run by ``load_config``, and again by
    the trainer after a launcher's settings were applied); ``training=False`` skips the one an
    evaluation does not need (a training file)."""

    def need(ok: bool, key: str, message: str) -> None:
        if not ok:
            raise ConfigError(f"{key}: {message}")

    need(
        cfg.rollout.group_size >= 2,
        "rollout.group_size",
        "needs at least 2 completions per prompt (advantages are relative to the group)",
    )
    need(cfg.rollout.temperature > 0, "rollout.temperature", "must be > 0 for sampling")
    need(0 < cfg.rollout.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    need(cfg.rollout.max_new_tokens > 0, "rollout.max_new_tokens", "must be > 0")
    need(0 <= cfg.rollout.min_p < 1, "rollout.min_p", "must be in [0, 1)")
    need(cfg.rollout.repetition_penalty > 0, "rollout.repetition_penalty", "must be > 0 (1 = off)")
    need(cfg.eval.n >= 1, "eval.n", "must be ≥ 1 (1 = greedy)")
    per_split = {k for k, v in cfg.data.fields.items() if isinstance(v, dict)}
    need(
        not per_split or per_split == set(cfg.data.fields) <= {"train", "test"},
        "data.fields",
        "either one mapping {role: key, ...} or one per split {train: {...}, test: {...}}",
    )
    need(cfg.eval.temperature > 0, "eval.temperature", "must be > 0 for sampling")
    need(cfg.rollout.batch_size > 0, "rollout.batch_size", "must be > 0")
    need(cfg.rollout.micro_group >= 0, "rollout.micro_group", "must be ≥ 0 (0 = the whole group)")
    need(
        0 < cfg.rollout.vllm.gpu_memory_utilization <= 1,
        "rollout.vllm.gpu_memory_utilization",
        "must be in (0, 1]",
    )
    need(cfg.algorithm.tis_cap >= 0, "algorithm.tis_cap", "must be ≥ 0 (0 = off)")
    need(cfg.rollout.max_staleness >= 0, "rollout.max_staleness", "must be ≥ 0 (0 = synchronous)")
    if cfg.rollout.max_staleness:
        need(
            cfg.algorithm.tis_cap > 0,
            "algorithm.tis_cap",
            f"rollout.max_staleness={cfg.rollout.max_staleness} trains on completions sampled by "
            "older weights; set algorithm.tis_cap (e.g. 2.0) so the loss corrects for it",
        )
        need(
            cfg.rollout.engine != "hf" or cfg.rollout.group_shared,
            "rollout.max_staleness",
            "asynchronous rollouts on rollout.engine=hf need rollout.group_shared=true (the "
            "path that reports its sampling log-probs)",
        )
        need(
            cfg.rollout.engine == "hf" or not cfg.rollout.partial_rollouts,
            "rollout.partial_rollouts",
            "takes new weights between two decode steps, which only rollout.engine=hf can",
        )
    else:
        need(
            not cfg.rollout.partial_rollouts,
            "rollout.partial_rollouts",
            "needs rollout.max_staleness > 0 (a synchronous step never changes weights mid-batch)",
        )
    need(
        not (cfg.rollout.engine in ("vllm", "vllm_server") and cfg.rollout.timeout_s),
        "rollout.timeout_s",
        "bounds the hf engine's generate() only; vLLM has no time budget (set it to 0)",
    )
    check_server(cfg.rollout.server, need)
    need(
        cfg.rollout.server.push != "lora" or cfg.model.lora.enabled,
        "rollout.server.push",
        "'lora' pushes the LoRA adapter; set model.lora.enabled=true or push 'full'",
    )
    need(cfg.train.prompts_per_step > 0, "train.prompts_per_step", "must be > 0")
    need(0 < cfg.data.stats_ema <= 1, "data.stats_ema", "must be in (0, 1]")
    need(cfg.train.micro_batch_size > 0, "train.micro_batch_size", "must be > 0")
    need(cfg.train.steps >= 0, "train.steps", "must be ≥ 0")
    need(cfg.optim.lr > 0, "optim.lr", "must be > 0")
    need(len(cfg.optim.betas) == 2, "optim.betas", "needs two numbers")
    need(
        all(0 <= b < 1 for b in cfg.optim.betas),
        "optim.betas",
        f"each must be in [0, 1) (AdamW's β1, β2), got {list(cfg.optim.betas)}",
    )
    need(cfg.optim.weight_decay >= 0, "optim.weight_decay", "must be ≥ 0")
    need(cfg.optim.max_grad_norm >= 0, "optim.max_grad_norm", "must be ≥ 0 (0 = no clipping)")
    need(cfg.optim.warmup_steps >= 0, "optim.warmup_steps", "must be ≥ 0")
    need(0 <= cfg.algorithm.clip_low < 1, "algorithm.clip_low", "must be in [0, 1)")
    need(cfg.algorithm.clip_high >= 0, "algorithm.clip_high", "must be ≥ 0")
    need(cfg.algorithm.beta >= 0, "algorithm.beta", "must be ≥ 0")
    check_distillation(cfg, need)
    check_harness(cfg, need)
    need(
        cfg.algorithm.dual_clip is None or cfg.algorithm.dual_clip > 1,
        "algorithm.dual_clip",
        "must be > 1 (or null)",
    )
    need(cfg.algorithm.updates_per_batch >= 1, "algorithm.updates_per_batch", "must be ≥ 1")
    need(cfg.algorithm.max_sampling_tries >= 1, "algorithm.max_sampling_tries", "must be ≥ 1")
    need(
        0 <= cfg.algorithm.overlong_buffer < cfg.rollout.max_new_tokens,
        "algorithm.overlong_buffer",
        "must be in [0, rollout.max_new_tokens)",
    )
    tc = cfg.algorithm.temporal_contrast
    need(tc.bonus >= 0, "algorithm.temporal_contrast.bonus", "must be ≥ 0")
    need(tc.ratio >= 0, "algorithm.temporal_contrast.ratio", "must be ≥ 0")
    need(
        tc.shuffled_per_prompt is None or tc.shuffled_per_prompt >= 1,
        "algorithm.temporal_contrast.shuffled_per_prompt",
        "must be ≥ 1 (or null for rollout.group_size // 2)",
    )
    check_perturb(cfg, need)
    need(
        not (cfg.rollout.tools.names and cfg.rollout.tools.environment),
        "rollout.tools.environment",
        "an environment's methods are its tools: leave rollout.tools.names empty with it",
    )
    need(cfg.reward.timeout_s >= 0, "reward.timeout_s", "must be ≥ 0")
    need(cfg.reward.workers >= 1, "reward.workers", "must be ≥ 1")
    need(
        cfg.reward.worker_memory_mb is None or cfg.reward.worker_memory_mb >= 64,
        "reward.worker_memory_mb",
        "must be ≥ 64 (MiB) or null (no cap)",
    )
    need(
        cfg.rollout.tools.worker_memory_mb is None or cfg.rollout.tools.worker_memory_mb >= 64,
        "rollout.tools.worker_memory_mb",
        "must be ≥ 64 (MiB) or null (no cap)",
    )
    need(cfg.train.warn_no_signal_steps >= 0, "train.warn_no_signal_steps", "must be ≥ 0")
    need(cfg.checkpoint.keep_last >= 1, "checkpoint.keep_last", "must be ≥ 1")
    if cfg.train.sharding.startswith("deepspeed"):
        require_deepspeed(cfg.train.sharding)
    need(
        not cfg.train.deepspeed or cfg.train.sharding.startswith("deepspeed"),
        "train.deepspeed",
        f"DeepSpeed settings given but train.sharding is '{cfg.train.sharding}'; set deepspeed_zero2 or deepspeed_zero3",
    )
    need(
        cfg.model.min_pixels <= cfg.model.max_pixels,
        "model.min_pixels",
        "must not exceed model.max_pixels",
    )
    need(
        bool(cfg.data.train) or cfg.train.steps == 0 or not training,
        "data.train",
        "a training file is needed when train.steps > 0",
    )
    need(
        not re.search(r"[/\\\x00-\x1f\x7f]", cfg.name)
        and cfg.name not in (".", "..")
        and len(cfg.name.encode("utf-8", "surrogatepass")) <= 255,
        "name",
        f"{shown(cfg.name)} must be a plain folder name inside output_dir (no '/', '\\', '..', "
        "control characters such as a newline, or absolute path; at most 255 bytes)",
    )
    for key in ("output_dir", *PATH_KEYS):
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        need(
            not (isinstance(value, str) and "\x00" in value),
            key,
            "has a NUL byte, which no file path may hold",
        )
    for key in (
        "max_prompt_tokens",
        "max_image_pixels",
        "max_video_seconds",
        "max_video_frames",
        "max_audio_seconds",
    ):
        value = getattr(cfg.data, key)
        need(value is None or value > 0, f"data.{key}", "must be > 0 (or null for no bound)")


def check_distillation(cfg: RunConfig, need: Any) -> None:
    """``teacher`` and the distillation keys of ``algorithm`` (``need(ok, key, message)``)."""
    algo, teacher = cfg.algorithm, cfg.teacher.enabled
    need(0 <= algo.distill_discount <= 1, "algorithm.distill_discount", "must be in [0, 1]")
    need(algo.reward_coef >= 0, "algorithm.reward_coef", "must be ≥ 0")
    need(
        algo.distill_loss == "sampled" or algo.distill_discount == 0,
        "algorithm.distill_discount",
        "applies to distill_loss 'sampled' (the full KL is exact at each position)",
    )
    if teacher:
        need(
            algo.distill_coef > 0,
            "algorithm.distill_coef",
            "must be > 0 with teacher.path (for verifiable rewards alone, remove teacher.path)",
        )
    else:
        need(
            algo.reward_coef == 1.0,
            "algorithm.reward_coef",
            "weighs the verifiers against a teacher; without teacher.path it must be 1 "
            "(scale optim.lr instead)",
        )
    if cfg.teacher.server.url:
        need(
            algo.distill_loss == "sampled",
            "algorithm.distill_loss",
            "'full' needs the teacher's whole next-token distribution at every position, which "
            "a served teacher does not return (it scores the sampled tokens): use 'sampled', "
            "or teacher.path alone for an in-process teacher",
        )
        need(
            is_base_url(cfg.teacher.server.url),
            "teacher.server.url",
            f"{cfg.teacher.server.url!r} must be a base URL http://host:port (no path)",
        )
        need(
            cfg.teacher.server.request_timeout_s > 0,
            "teacher.server.request_timeout_s",
            "must be > 0",
        )


def eval_budget(cfg: RunConfig) -> int:
    """The evaluation's completion budget: ``eval.max_new_tokens``, else ``rollout.max_new_tokens``."""
    return cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens


def check_harness(cfg: RunConfig, need: Any) -> None:
    """``eval.harness*`` and ``checkpoint.keep_best`` (``need(ok, key, message)``); whether
    lmms-eval is installed is checked here too (its package found, not imported)."""
    import importlib.util

    ev = cfg.eval
    if ev.harness:
        need(
            importlib.util.find_spec("lmms_eval") is not None,
            "eval.harness",
            'lmms-eval is not installed: pip install -e ".[eval]" (or: pip install "lmms-eval>=0.7")',
        )
        need(
            bool(ev.harness_tasks),
            "eval.harness_tasks",
            "names no task; e.g. eval.harness_tasks=[mmrft_shapes_colour] (bundled, local) or [mmmu_val]",
        )
    else:
        need(
            not ev.harness_tasks,
            "eval.harness_tasks",
            "is set but eval.harness is not; add eval.harness=lmms_eval",
        )
    limit = ev.harness_limit
    need(
        limit is None or (limit > 0 and (limit < 1 or float(limit).is_integer())),
        "eval.harness_limit",
        f"must be a whole number of samples or a fraction in (0, 1), got {limit}",
    )
    best = cfg.checkpoint.keep_best
    need(
        not best or best.startswith(("eval/", "harness/", "verifier/")),
        "checkpoint.keep_best",
        f"must name a metric logged at evaluation (eval/<task>/<metric> or harness/<task>/<metric>), got {best!r}",
    )
    need(
        not best.startswith("harness/") or bool(ev.harness),
        "checkpoint.keep_best",
        f"{best} is a harness metric but eval.harness is not set",
    )


def check_perturb(cfg: RunConfig, need: Any) -> None:
    """``rollout.perturb`` checks (``need(ok, key, message)`` raises naming the key)."""
    p = cfg.rollout.perturb
    need(0 <= p.share < 1, "rollout.perturb.share", f"must be in [0, 1) (0 = off), got {p.share}")
    need(0 <= p.strength <= 1, "rollout.perturb.strength", f"must be in [0, 1], got {p.strength}")
    need(
        0 <= p.strength_end <= p.strength,
        "rollout.perturb.strength_end",
        f"must be in [0, rollout.perturb.strength={p.strength}], got {p.strength_end}",
    )
    need(p.anneal_steps >= 0, "rollout.perturb.anneal_steps", "must be ≥ 0 (0 = train.steps)")
    unknown = [k for k in p.kinds if k not in KINDS]
    need(not unknown, "rollout.perturb.kinds", f"unknown {unknown}; valid: {', '.join(KINDS)}")
    need(len(set(p.kinds)) == len(p.kinds), "rollout.perturb.kinds", "lists a distortion twice")
    if p.share > 0:
        need(bool(p.kinds), "rollout.perturb.kinds", "needs at least one distortion")
        need(
            not cfg.rollout.tools.active,
            "rollout.perturb.share",
            "perturbed rollouts are single-turn; set it to 0 with rollout.tools.names",
        )
        need(
            not cfg.rollout.max_staleness,
            "rollout.perturb.share",
            "perturbed completions report no sampler log-probs, which asynchronous rollouts "
            "(rollout.max_staleness > 0) need for their correction; set one of them to 0",
        )


def is_base_url(url: str) -> bool:
    """``http(s)://host[:port]`` with no path (an IPv6 host in brackets)."""
    pattern = r"https?://(\[[0-9a-fA-F:.]+\]|[^/\s:\[\]]+)(:\d{1,5})?/?"
    return re.fullmatch(pattern, url) is not None


def check_server(server: ServerConfig, need: Any) -> None:
    """``rollout.server`` checks (``need(ok, key, message)`` raises naming the key)."""
    url = server.url
    need(
        url is None or is_base_url(url),
        "rollout.server.url",
        f"{url!r} must be a base URL http://host:port (no path), or null to start a server",
    )
    need(0 <= server.port <= 65535, "rollout.server.port", "must be in [0, 65535] (0 = a free one)")
    need(bool(server.host.strip()), "rollout.server.host", "must not be empty")
    need(server.start_timeout_s > 0, "rollout.server.start_timeout_s", "must be > 0")
    need(server.request_timeout_s > 0, "rollout.server.request_timeout_s", "must be > 0")
    need(
        url is None or not server.extra_args,
        "rollout.server.extra_args",
        "applies to a server mmrft starts; with rollout.server.url set, give the flags to the "
        "server you start",
    )
    need(
        all(isinstance(a, str) and a for a in server.extra_args),
        "rollout.server.extra_args",
        "must be non-empty strings",
    )
    devices = server.devices
    need(
        devices is None or re.fullmatch(r"\d+(,\d+)*", devices) is not None,
        "rollout.server.devices",
        f"{devices!r} must be device indices separated by commas, e.g. '1' or '4,5,6,7'",
    )
    need(
        url is None or devices is None,
        "rollout.server.devices",
        "applies to a server mmrft starts; a server at rollout.server.url uses its own",
    )


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: '{key}' is not a section")
        node = child
    node[keys[-1]] = value


SHORT_KEYS = {"resume": "checkpoint.resume"}
"""Override keys that stand for a longer one (what messages tell the user to type)."""


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``key.sub=value``; the value is read as a YAML scalar/list (``1e-4``, ``[a, b]``, ``null``).
    A short key (:data:`SHORT_KEYS`, e.g. ``resume``) stands for its full name."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key=value")
    key, raw = text.split("=", 1)
    key = SHORT_KEYS.get(key.strip(), key.strip())
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except RecursionError:
        raise ConfigError(
            f"override {key}: nested deeper than {MAX_CONFIG_DEPTH} levels of mappings and lists"
        ) from None
    return key, value


def config_names() -> dict[str, Path]:
    """The bundled run configs by the name ``mmrft train NAME`` takes: ``configs/NAME.yaml``,
    then ``configs/recipes/NAME.yaml`` (a top-level config wins a clash), and the CPU learning
    recipes ``configs/learn/NAME.yaml`` as ``learn/NAME`` (benchmarks/learning.py runs them)
    and the CPU tool-rollout recipes ``configs/tools/NAME.yaml`` as ``tools/NAME``. Launcher
    configs (``configs/accelerate/``) are not run configs and are left out."""
    names: dict[str, Path] = {}
    for folder in (CONFIG_DIR, CONFIG_DIR / "recipes"):
        for path in sorted(folder.glob("*.yaml")):
            names.setdefault(path.stem, path)
    for group in ("learn", "tools"):
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            names.setdefault(f"{group}/{path.stem}", path)
    return names


def resolve_config_path(name: str | Path | None) -> Path:
    """A config file path as given (relative to the current directory), else a bundled config by
    name: ``NAME``, ``NAME.yaml``, ``recipes/NAME``, ``learn/NAME`` or ``tools/NAME`` (:func:`config_names`). The hint of an
    unknown name lists only names that load."""
    if name is None:
        return DEFAULT_CONFIG
    path = Path(name).expanduser()
    if path.is_file():
        return path
    names = config_names()
    stem = str(name).removesuffix(".yaml").removesuffix(".yml")
    for candidate in (stem, stem.removeprefix("configs/").removeprefix("recipes/")):
        if candidate in names:
            return names[candidate]
    if path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        hint = f"no such file, and no bundled config of that name; {did_you_mean(path.stem, names)}"
    else:
        hint = did_you_mean(stem, names)
    raise ConfigError(f"config '{name}' not found; {hint}")


# Keys whose values are filesystem paths, anchored by :func:`load_config`: written in a config
# file they are relative to that file's folder (the file says where its data is); given on the
# command line, to the current directory. ``output_dir`` always means the current directory
# (where this user wants runs), and so do plugin paths given on the command line.
PATH_KEYS = (
    "model.path",
    "teacher.path",
    "data.train",
    "data.test",
    "data.media_root",
    "rollout.server.weights_dir",
    "rollout.server.log",
)
PATH_PARAM_SUFFIXES = ("_root", "_dir", "_path", "_file")
"""``task.params`` whose names end like this are paths too (``image_root``, ``video_root``, ...)."""


def _is_hub_id(value: str) -> bool:
    """``org/name`` with nothing else: a Hugging Face hub id rather than a relative path."""
    parts = value.split("/")
    return len(parts) == 2 and all(parts) and not value.startswith((".", "~"))


def anchor_path(value: str, base: Path, hub_id_ok: bool = False) -> str:
    """``value`` made absolute against ``base`` when it is a relative local path (``~``
    expanded); URLs, empty strings and, with ``hub_id_ok``, hub ids (``Qwen/Qwen2-VL-2B``) that
    do not exist under ``base`` are kept as written, and so is a value with a NUL byte (no path:
    :func:`check_config` refuses it by its key)."""
    if not value or "://" in value or "\x00" in value:
        return value
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    anchored = (base / path).resolve()
    if hub_id_ok and _is_hub_id(value) and not anchored.exists():
        return value
    return str(anchored)


def _anchor_tree(tree: dict[str, Any], base: Path) -> None:
    """Anchor the path-valued keys of one config layer (a YAML file or the overrides) at
    ``base``, in place."""
    for dotted in PATH_KEYS:
        *parents, key = dotted.split(".")
        node: Any = tree
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(key), str):
            hub_id_ok = dotted in ("model.path", "teacher.path")
            node[key] = anchor_path(node[key], base, hub_id_ok=hub_id_ok)
    params = (tree.get("task") or {}).get("params") if isinstance(tree.get("task"), dict) else None
    if isinstance(params, dict):
        for key, value in params.items():
            if key.endswith(PATH_PARAM_SUFFIXES) and isinstance(value, str):
                params[key] = anchor_path(value, base)
    for section in ("reward", "eval"):  # plain reward functions: FILE.py:FUNCTION
        entries = (
            (tree.get(section) or {}).get("verifiers")
            if isinstance(tree.get(section), dict)
            else None
        )
        for entry in entries if isinstance(entries, list) else []:
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and ".py:" in name:
                source, function = name.rsplit(":", 1)
                entry["name"] = f"{anchor_path(source, base)}:{function}"
    evaluation = tree.get("eval")
    if isinstance(evaluation, dict) and isinstance(evaluation.get("harness_include"), list):
        evaluation["harness_include"] = [
            anchor_path(p, base) if isinstance(p, str) else p for p in evaluation["harness_include"]
        ]
    plugins = tree.get("plugins")
    if isinstance(plugins, list):
        tree["plugins"] = [
            anchor_path(p, base)
            if isinstance(p, str) and (p.endswith(".py") or "/" in p or "\\" in p)
            else p
            for p in plugins
        ]


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> RunConfig:
    """defaults ← algorithm preset ← YAML file ← ``key=value`` overrides, validated.

    Paths (:data:`PATH_KEYS`, ``task.params.*_root`` and the like, plugin files) come out
    absolute: relative ones in the YAML file against the file's folder, on the command line
    against the current directory; ``output_dir`` against the current directory.

    ``task.params`` belong to their task: when the overrides name another task
    (``task.name=prompt`` over a file whose task is ``classification``, the default task when
    the file names none), the file's ``task.params`` are dropped and only those the overrides
    set (``task.params.template=...``, in any order) are kept; when they name the file's task
    or none, file and overrides merge key by key. Where each param came from is recorded in
    ``cfg.task.param_sources`` (``configs/demo.yaml: task.params.think``), which a task's
    parameter error names.
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            "load_config: path: expected a config name or file path (str or pathlib.Path) or "
            f"None, got {type(path).__name__} {shown(path)}"
        )
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides):
        raise TypeError(
            "load_config: overrides: expected a list of 'key=value' strings, got "
            f"{type(overrides).__name__} {shown(overrides)}"
        )
    tree: dict[str, Any] = {}
    if path is not None:
        file = resolve_config_path(path)
        try:
            tree = yaml_load(file.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:  # a syntax error, or a tag safe_load refuses (!!python/…)
            raise ConfigError(yaml_error(file, exc)) from None
        except RecursionError:  # PyYAML's reader recurses once per level
            raise ConfigError(
                f"{file}: nested deeper than {MAX_CONFIG_DEPTH} levels of mappings and lists"
            ) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{file}: not UTF-8 text (byte {exc.start + 1})") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: a config file must be a YAML mapping")
        _anchor_tree(tree, file.resolve().parent)
    # the file's task and params as the file has them (the overrides below edit them in place)
    was = _section(tree, "task").get("name", TaskConfig.name)
    file_params = dict(_section(_section(tree, "task"), "params"))
    cmdline: dict[str, Any] = {}  # what the overrides set, on their own
    for item in overrides:  # each replaces what it names, its paths anchored at the cwd
        key, value = parse_override(item)
        layer: dict[str, Any] = {}
        _set_dotted(layer, key, value)
        _anchor_tree(layer, Path.cwd())
        for name in key.split("."):
            layer = layer[name]
        _set_dotted(tree, key, layer)
        _set_dotted(cmdline, key, layer)
    given_task = _section(cmdline, "task")
    given_params = _section(given_task, "params")
    if "name" in given_task and given_task["name"] != was and isinstance(tree.get("task"), dict):
        dropped = sorted(set(file_params) - set(given_params))
        if dropped:
            log.info(
                "task.name=%s replaces the config file's task '%s': its task.params %s "
                "are dropped (they belong to that task)",
                given_task["name"],
                was,
                ", ".join(dropped),
            )
        if "params" in given_task:  # what the command line set, checked as it stands
            tree["task"]["params"] = given_task["params"]
        else:
            tree["task"].pop("params", None)
        file_params = {}
    preset = (tree.get("algorithm") or {}).get("preset")
    if preset is not None:
        from mmrft.algorithms import LOSS_PRESETS

        if preset not in LOSS_PRESETS:
            raise ConfigError(
                f"algorithm.preset: unknown preset '{preset}'; {did_you_mean(str(preset), LOSS_PRESETS)}"
            )
        max_new_tokens = (tree.get("rollout") or {}).get("max_new_tokens")
        if not isinstance(max_new_tokens, int):
            max_new_tokens = RolloutConfig.max_new_tokens
        tree["algorithm"] = {**preset_fields(preset, max_new_tokens), **tree["algorithm"]}
    try:
        check_depth(tree, "")
        cfg = _from_dict(RunConfig, tree, "")
        cfg.output_dir = anchor_path(cfg.output_dir, Path.cwd())
        if isinstance(cfg.task.params, dict):
            cfg.task.param_sources = {
                key: f"the command line: task.params.{key}"
                if key in given_params
                else f"{_shown_path(file)}: task.params.{key}"
                for key in cfg.task.params
                if key in given_params or (path is not None and key in file_params)
            }
        check_config(cfg)
    except ConfigError as exc:  # a key the file sets (not the command line): its file:line
        given = {parse_override(o)[0] for o in overrides}
        line = None if path is None else _key_line(file, str(exc), given)
        raise ConfigError(f"{file}:{line}: {exc}" if line else str(exc)) from None
    return cfg


def _section(tree: Any, key: str) -> dict[str, Any]:
    """``tree[key]`` when both are mappings, else an empty mapping (a malformed section is
    refused later, by :func:`_from_dict`, naming its key)."""
    value = tree.get(key) if isinstance(tree, dict) else None
    return value if isinstance(value, dict) else {}


def _shown_path(file: Path) -> str:
    """``file`` relative to the current directory when it lies under it, else as it is."""
    try:
        return str(file.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(file)


def _key_line(file: Path, message: str, overridden: set[str]) -> int | None:
    """The line of ``file`` that sets the key a :class:`ConfigError` message starts with
    (``train.steps: ...``, ``unknown config key 'train.stepz'``), ``None`` when the file does
    not set it or the command line overrode it."""
    found = re.match(r"unknown config key '([\w.]+)'|([\w.]+): ", message)
    key = found and (found.group(1) or found.group(2))
    if not key or any(key == k or key.startswith(f"{k}.") for k in overridden):
        return None
    node = yaml.compose(file.read_text(encoding="utf-8"), Loader=_Loader)
    line = None
    for name in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            return None
        match = next(((k, v) for k, v in node.value if k.value == name), None)
        if match is None:
            return None
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def preset_fields(name: str, max_new_tokens: int) -> dict[str, Any]:
    """The ``algorithm`` fields that ``algorithm.preset=name`` sets.

    The loss settings are :data:`mmrft.algorithms.LOSS_PRESETS` (TRL's ``loss_type`` names).
    ``dapo`` is the whole of DAPO (Yu et al. 2025, arXiv:2503.14476, §3): clip-higher and the
    token-level loss, plus dynamic sampling (groups whose rewards are all equal are dropped and
    refilled) and the soft overlong punishment with its cache zone at the paper's proportion
    (L_cache = 4096 of L_max = 20480, i.e. the last fifth of ``rollout.max_new_tokens``), and
    no KL term (β = 0). Explicit keys still win over all of these.
    """
    from mmrft.algorithms import LOSS_PRESETS

    fields = dict(LOSS_PRESETS[name])
    if name == "dapo":
        fields.update(dynamic_sampling=True, overlong_buffer=max_new_tokens // 5, beta=0.0)
    return fields


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Any) -> str:
    """YAML of a config (or of a plain mapping such as :func:`config_diff`'s)."""
    data = cfg if isinstance(cfg, dict) else to_dict(cfg)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def config_diff(cfg: Any, default: Any = None) -> dict[str, Any]:
    """The keys of ``cfg`` whose values differ from the defaults, as a nested mapping (what the
    start-up print shows; ``config.yaml`` holds the whole config)."""
    if default is None:
        default = type(cfg)()
        if isinstance(default, RunConfig):  # as load_config anchors it
            default.output_dir = anchor_path(default.output_dir, Path.cwd())
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value, base = getattr(cfg, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(value):
            sub = config_diff(value, base)
            if sub:
                out[f.name] = sub
        elif value != base:
            out[f.name] = value
    return out


def resolve_path(path: str) -> Path:
    """A data or model path as the config holds it (``~`` expanded). :func:`load_config` made
    relative paths absolute; a relative one left (a config built in code) means the current
    directory."""
    return Path(path).expanduser()


def help_table(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every leaf field, for ``--help-config`` and docs/config.md (scripts/config_reference.py)."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            rows.extend(help_table(hint, f"{prefix}{f.name}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append(
            (f"{prefix}{f.name}", type_name(hint), repr(default), f.metadata.get("help", ""))
        )
    return rows
