"""lmms-eval on the model already in memory: its benchmarks inside a training run and from
``mmrft eval`` (``eval.harness: lmms_eval``).

lmms-eval (Zhang et al. 2024, github.com/EvolvingLMMs-Lab/lmms-eval) runs the benchmarks
multimodal papers report (MMMU, MathVista, ChartQA, Video-MME, MMAU, ...) against a *model
adapter*: an object with ``generate_until`` and ``loglikelihood``. :func:`adapter` builds one
backed by the run's policy and rollout engine, so a task runs on the weights being trained,
with the family's own chat template, media budgets and engine (``hf``, or the run's vLLM
engine holding the current weights), and is never loaded a second time.

- ``generate_until``: each request's visuals (``doc_to_visual``: PIL images, video and image
  file paths, audio as ``{"array", "sampling_rate"}``) go first in one user turn, then the
  request's text (lmms-eval's ``<image>`` placeholders removed), as lmms-eval's own Qwen-VL
  adapters build it. Greedy unless the task asks for ``do_sample`` with a temperature > 0; the
  task's ``max_new_tokens`` (else ``eval.max_new_tokens``); the text is cut at the first of
  the task's ``until`` strings (``"\\n\\n"`` ignored, as lmms-eval's Qwen adapters do, so that
  a reasoning model's paragraphs are not cut).
- ``loglikelihood``: ``log p(continuation | prompt)`` summed over the continuation's tokens,
  the prompt rendered with the generation prompt and the continuation's tokens appended, from
  the policy's forward (any engine), with whether greedy decoding would produce it.

:class:`Harness` runs a list of tasks (``eval.harness_tasks``) with lmms-eval's own
``simple_evaluate`` (its task loading, filters, metrics and aggregation), returns the metrics
as ``harness/<task>/<metric>`` and writes lmms-eval's own output files (``<date>_results.json``
and ``<date>_samples_<task>.jsonl`` under a folder named after the model), so the numbers
compare with published ones. Local task folders (``eval.harness_include``) are indexed beside
the bundled ones (``configs/lmms_eval``); lmms-eval's ~2000 built-in tasks are indexed only
when a task is not found there (indexing them takes seconds).

In a distributed run the harness runs on rank 0 alone (like the task's evaluation, on the
gathered weights) and lmms-eval is shown a single process: every benchmark sample is
evaluated once. The training run's random streams (Python, NumPy, torch) are restored after
lmms-eval seeds them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import tempfile
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrft.algorithms import argmax_match
from mmrft.config import CONFIG_DIR, eval_budget
from mmrft.policy.model import Policy, completion_logps
from mmrft.rollout.base import Engine, Sampling
from mmrft.typecheck import ConfigError

log = logging.getLogger(__name__)

HARNESSES = ("lmms_eval",)
INSTALL_HINT = 'pip install -e ".[eval]"  (or: pip install "lmms-eval>=0.7")'
# lmms-eval task folders that ship with mmrft: local tasks over the bundled benchmarks
BUNDLED_TASKS = CONFIG_DIR / "lmms_eval"
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm")
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")


def require_lmms_eval() -> None:
    """Raise a one-line :class:`ConfigError` with the pip line when lmms-eval is missing."""
    try:
        import lmms_eval  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"eval.harness=lmms_eval: lmms-eval is not installed ({exc}); {INSTALL_HINT}"
        ) from None


# --------------------------------------------------------------------------- the model adapter


def to_conversation(visuals: list[Any] | None, text: str, media_dir: Path) -> list[dict[str, Any]]:
    """One user turn: the visuals (in order), then ``text`` without lmms-eval's ``<image>``
    placeholders. PIL images stay PIL images; paths become image / video / audio parts by
    their suffix; an audio dict ``{"array", "sampling_rate"}`` is written to a WAV file in
    ``media_dir`` (mmrft's audio families read files). Anything else is a ValueError naming
    its type."""
    parts: list[dict[str, Any]] = []
    for visual in visuals or []:
        if visual is None:
            continue
        if isinstance(visual, (str, Path)):
            path = str(visual)
            suffix = Path(path).suffix.lower()
            kind = (
                "video"
                if suffix in VIDEO_SUFFIXES
                else "audio"
                if suffix in AUDIO_SUFFIXES
                else "image"
            )
            parts.append({"type": kind, kind: path})
        elif isinstance(visual, dict) and "array" in visual and "sampling_rate" in visual:
            import numpy as np
            import soundfile

            handle, path = tempfile.mkstemp(suffix=".wav", dir=media_dir)
            os.close(handle)
            soundfile.write(path, np.asarray(visual["array"]), int(visual["sampling_rate"]))
            parts.append({"type": "audio", "audio": path})
        elif hasattr(visual, "convert") and hasattr(visual, "size"):  # a PIL image
            parts.append({"type": "image", "image": visual.convert("RGB")})
        else:
            raise ValueError(
                f"lmms-eval visual of type {type(visual).__name__}: mmrft takes PIL images, "
                "image / video / audio file paths and audio {array, sampling_rate} dicts"
            )
    text = text.replace("<image>", "").strip()
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def sampling_of(gen_kwargs: dict[str, Any], default_max_new_tokens: int) -> Sampling:
    """The engine's :class:`Sampling` for an lmms-eval request's ``generation_kwargs``:
    greedy unless ``do_sample`` (or no ``do_sample`` key) with ``temperature`` > 0."""
    max_new = int(gen_kwargs.get("max_new_tokens") or default_max_new_tokens)
    temperature = float(gen_kwargs.get("temperature") or 0.0)
    sample = bool(gen_kwargs.get("do_sample", temperature > 0)) and temperature > 0
    if not sample:
        return Sampling(max_new, greedy=True)
    top_p = gen_kwargs.get("top_p")
    return Sampling(max_new, temperature=temperature, top_p=float(top_p) if top_p else 1.0)


def cut_at_until(text: str, until: Any) -> str:
    """``text`` up to the first of the stop strings ``until`` (a string or a list; ``"\\n\\n"``
    ignored, as lmms-eval's Qwen-VL adapters do)."""
    stops = [until] if isinstance(until, str) else list(until or [])
    for stop in stops:
        if stop and stop != "\n\n":
            text = text.split(stop)[0]
    return text


def adapter(policy: Policy, engine: Engine, batch_size: int, max_new_tokens: int) -> Any:
    """An lmms-eval model (``lmms_eval.api.model.lmms``, the "simple" interface) backed by
    ``policy`` and ``engine``: ``generate_until`` through the engine, ``batch_size`` prompts
    per call, ``max_new_tokens`` when the task names none; ``loglikelihood`` from the policy's
    forward. Requires lmms-eval."""
    from lmms_eval.api.model import lmms

    class MMRFTModel(lmms):
        """lmms-eval's model interface over an mmrft policy and rollout engine."""

        is_simple = True

        def __init__(self) -> None:
            super().__init__()
            self.policy, self.engine = policy, engine
            self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
            self._media = tempfile.TemporaryDirectory(prefix="mmrft-lmms-eval-")

        @property
        def device(self) -> Any:
            return self.policy.device

        def _doc(self, task: str, split: str, doc_id: int) -> Any:
            return self.task_dict[task][split][doc_id]

        def generate_until(self, requests: list[Any]) -> list[str]:
            media = Path(self._media.name)
            conversations, settings = [], []
            for request in requests:
                context, gen_kwargs, doc_to_visual, doc_id, task, split = request.args
                visuals = doc_to_visual(self._doc(task, split, doc_id)) if doc_to_visual else []
                conversations.append(to_conversation(visuals, context, media))
                settings.append(dict(gen_kwargs or {}))
            answers: list[str] = [""] * len(requests)
            # one engine call per run of requests with the same generation settings
            groups: dict[str, list[int]] = {}
            for i, kwargs in enumerate(settings):
                key = json.dumps({k: v for k, v in kwargs.items() if k != "until"}, default=str)
                groups.setdefault(key, []).append(i)
            for indices in groups.values():
                sampling = sampling_of(settings[indices[0]], self.max_new_tokens)
                for begin in range(0, len(indices), self.batch_size):
                    chunk = indices[begin : begin + self.batch_size]
                    rollouts = self.engine.generate([conversations[i] for i in chunk], 1, sampling)
                    for i, text in zip(chunk, rollouts.texts):
                        answers[i] = cut_at_until(text, settings[i].get("until"))
            return answers

        def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
            import torch

            family, processor = self.policy.family, self.policy.processor
            media = Path(self._media.name)
            out = []
            for request in requests:
                context, target, doc_to_visual, doc_id, task, split = request.args
                doc = self._doc(task, split, doc_id)
                continuation = target if isinstance(target, str) else target(doc)
                visuals = doc_to_visual(doc) if doc_to_visual else []
                conversation = to_conversation(visuals, context, media)
                rows = family.split_rows(family.prepare(processor, [conversation]), processor)
                ids = self.policy.tokenizer.encode(continuation, add_special_tokens=False)
                if not ids:
                    out.append((0.0, True))
                    continue
                with torch.no_grad():
                    logps, _, match = completion_logps(
                        self.policy, rows, [ids], token_stat=argmax_match
                    )
                out.append((float(logps.sum()), bool(match.bool().all())))  # type: ignore[union-attr]
            return out

        def generate_until_multi_round(self, requests: list[Any]) -> list[str]:
            raise NotImplementedError(
                "mmrft's lmms-eval adapter has no multi-round generation (generate_until and "
                "loglikelihood tasks run)"
            )

    return MMRFTModel()


# --------------------------------------------------------------------------- running tasks


@dataclass
class HarnessResult:
    """One harness evaluation: ``metrics`` (``harness/<task>/<metric>``: every number lmms-eval
    reports per task, a metric's filter added as ``<metric>/<filter>`` when it is not
    ``none``), lmms-eval's ``results`` dict (its results file's content, without the samples),
    its per-task ``samples`` and the wall-clock ``seconds``."""

    metrics: dict[str, float]
    results: dict[str, Any]
    samples: dict[str, list[Any]] = field(default_factory=dict)
    seconds: float = 0.0
    model_name: str = "mmrft"

    def write(self, directory: Path) -> Path:
        """lmms-eval's own output files in ``directory`` (as its CLI's ``--output_path
        directory --log_samples``): ``<model>/<date>_results.json`` and
        ``<model>/<date>_samples_<task>.jsonl``; returns the results file."""
        from lmms_eval.loggers import EvaluationTracker

        tracker = EvaluationTracker(output_path=str(directory))
        tracker.general_config_tracker.log_experiment_args(
            model_source="mmrft",
            model_args=f"pretrained={self.model_name}",
            system_instruction=None,
            chat_template=None,
            fewshot_as_multiturn=False,
        )
        date = self.results["date"]  # simple_evaluate's datetime_str
        tracker.save_results_aggregated(
            results=dict(self.results), samples=self.samples, datetime_str=date
        )
        for task, samples in self.samples.items():
            tracker.save_results_samples(task_name=task, samples=samples)
        folder = directory / tracker.general_config_tracker.model_name_sanitized
        return folder / f"{date.replace(':', '-')}_results.json"


def flatten_results(results: dict[str, Any]) -> dict[str, float]:
    """lmms-eval's ``results["results"]`` (``{task: {"acc,none": 0.5, "acc_stderr,none": ...,
    "alias": ...}}``) as ``{"harness/<task>/acc": 0.5, "harness/<task>/acc_stderr": ...}``:
    numbers only (``"N/A"`` stderrs and aliases left out), ``,none`` dropped, another filter
    kept as ``/<filter>``."""
    flat = {}
    for task, values in (results.get("results") or {}).items():
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            name, _, filt = key.partition(",")
            metric = name if filt in ("", "none") else f"{name}/{filt}"
            flat[f"harness/{task}/{metric}"] = float(value)
    return flat


@contextlib.contextmanager
def kept_random_state() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's (CPU and CUDA) random states on exit: lmms-eval
    seeds all three, and a training run's sampling must not move."""
    import numpy as np
    import torch

    py, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(np_state)


@contextlib.contextmanager
def single_process() -> Iterator[None]:
    """Show lmms-eval one process while rank 0 of a distributed run evaluates alone: its rank
    and world size come from ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` (unset here, which it
    reads as 0 / 1 / 0; restored after), and ``simple_evaluate`` waits on a barrier of every rank when a process
    group exists, which the other ranks (waiting in mmrft's own barrier) never reach: its
    module sees a ``torch`` whose ``distributed.is_initialized()`` is False for the call."""
    import lmms_eval.evaluator as evaluator
    import torch
    import torch.distributed

    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ.pop(name, None)
    patched = torch.distributed.is_available() and torch.distributed.is_initialized()
    if patched:
        shim = types.SimpleNamespace(**vars(torch.distributed))
        shim.is_initialized = lambda: False
        view = types.ModuleType("torch")
        view.__dict__.update(vars(torch))
        view.distributed = shim  # type: ignore[attr-defined]
        evaluator.torch = view  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if patched:
            evaluator.torch = torch  # type: ignore[attr-defined]
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def quiet_lmms_eval(level: str = "WARNING") -> None:
    """lmms-eval logs through loguru at DEBUG to stderr by default; keep ``level`` and up."""
    import sys

    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=level)


class Harness:
    """The harness of one run (``eval.harness*`` keys): lmms-eval's task index built once,
    then :meth:`run` at every evaluation.

    Args:
        tasks: lmms-eval task (or group) names, e.g. ``["mmmu_val", "chartqa"]``.
        include: local task folders indexed beside the bundled ones.
        limit: at most this many samples per task (a float in (0, 1): that fraction); None: all.
        batch_size: prompts per engine call.
        max_new_tokens: the completion budget of a task that names none.
        seed: lmms-eval's random seeds (Python, NumPy, torch, few-shot), the run's ``train.seed``.
        model_name: the name the results carry (lmms-eval's ``pretrained=``), e.g. the model path.
    """

    def __init__(
        self,
        tasks: list[str],
        include: list[str],
        limit: float | None,
        batch_size: int,
        max_new_tokens: int,
        seed: int,
        model_name: str,
    ) -> None:
        require_lmms_eval()
        if not tasks:
            raise ConfigError(
                "eval.harness_tasks: eval.harness=lmms_eval needs at least one task, e.g. "
                "eval.harness_tasks=[mmrft_shapes_colour] (a bundled local task) or [mmmu_val]"
            )
        quiet_lmms_eval()
        self.tasks, self.limit, self.seed = list(tasks), limit, seed
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
        self.model_name = model_name
        self.task_manager = self._index([str(BUNDLED_TASKS), *map(str, include)])

    def _index(self, include: list[str]) -> Any:
        """lmms-eval's task index of the local folders, with its built-in tasks only when a
        named task is not among the local ones; ConfigError naming an unknown task."""
        from lmms_eval.tasks import TaskManager

        for folder in include:
            if not Path(folder).is_dir():
                raise ConfigError(f"eval.harness_include: {folder} is not a folder")
        manager = TaskManager("WARNING", include_path=include, include_defaults=False)
        if all(t in manager.all_tasks for t in self.tasks):
            return manager
        manager = TaskManager("WARNING", include_path=include)
        unknown = [t for t in self.tasks if t not in manager.all_tasks]
        if unknown:
            import difflib

            hints = [
                f"{t} (closest: {', '.join(difflib.get_close_matches(t, manager.all_tasks, 3))})"
                for t in unknown
            ]
            raise ConfigError(
                f"eval.harness_tasks: unknown lmms-eval task {'; '.join(hints)}; local task "
                "folders go in eval.harness_include"
            )
        return manager

    def run(self, policy: Policy, engine: Engine, log_samples: bool = True) -> HarnessResult:
        """Every task on ``policy`` through ``engine`` (greedy unless a task asks otherwise);
        the random states of the caller are kept."""
        from lmms_eval.evaluator import simple_evaluate
        from lmms_eval.utils import get_datetime_str

        start = time.perf_counter()
        lm = adapter(policy, engine, self.batch_size, self.max_new_tokens)
        with lm._media, kept_random_state(), single_process():  # the media folder removed after
            results = simple_evaluate(
                model=lm,
                model_args=f"pretrained={self.model_name}",
                tasks=list(self.tasks),
                limit=self.limit,
                batch_size=self.batch_size,
                device=str(policy.device),
                log_samples=log_samples,
                task_manager=self.task_manager,
                verbosity="WARNING",
                random_seed=self.seed,
                numpy_random_seed=self.seed,
                torch_random_seed=self.seed,
                fewshot_random_seed=self.seed,
                bootstrap_iters=0,  # no bootstrap stderr: seconds per evaluation in the loop
                # not "accelerate": it would build an Accelerator (and a process group) of its own
                distributed_executor_backend="torchrun",
                datetime_str=get_datetime_str(),
            )
        samples = results.pop("samples", None) or {}
        seconds = time.perf_counter() - start
        return HarnessResult(flatten_results(results), results, samples, seconds, self.model_name)


def build_harness(cfg: Any) -> Harness | None:
    """The :class:`Harness` of a config's ``eval.harness*`` keys (``None`` when off): its
    budgets are the evaluation's (``eval.batch_size``, ``eval.max_new_tokens`` or
    ``rollout.max_new_tokens``), its seed ``train.seed``, its results named by ``model.path``."""
    if not cfg.eval.harness:
        return None
    return Harness(
        cfg.eval.harness_tasks,
        cfg.eval.harness_include,
        cfg.eval.harness_limit,
        cfg.eval.batch_size,
        eval_budget(cfg),
        cfg.train.seed,
        cfg.model.path,
    )
