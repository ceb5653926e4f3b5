"""What a run writes and how it reports itself: ``metrics.jsonl``, ``completions.jsonl`` and
``warm_start.jsonl`` (:class:`RunLog`), the merged metrics of several processes, the file log,
the progress bars, and three watchdogs: :class:`Heartbeat` (a hanging run says what it waits
on), :class:`NoSignalWatch` (a run whose groups carry no reward variance says so, and why) and
:class:`GracefulStop` (Ctrl-C stops after the current step with an exact checkpoint)."""

from __future__ import annotations

import json
import logging
import platform
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from mmrft.runtime import distributed

log = logging.getLogger("mmrft")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, e.g. ``Intel(R) Xeon(R) Processor``), else
    what the platform module knows: figures measured on one CPU can move on another."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class RunLog:
    """metrics.jsonl and completions.jsonl of a run directory."""

    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    trackers: list[Any] = field(default_factory=list)
    enabled: bool = True  # False on ranks > 0: only rank 0 writes

    def truncate_after(self, step: int) -> None:
        """On resume: forget lines of steps after the checkpoint (they will be redone)."""
        if not self.enabled:
            return
        if step < 0:  # a new run: the last run's warm start goes too
            (self.run_dir / "warm_start.jsonl").unlink(missing_ok=True)
        for name in ("metrics.jsonl", "completions.jsonl"):
            path = self.run_dir / name
            if path.exists():
                keep = [
                    line
                    for line in path.read_text().splitlines()
                    if json.loads(line).get("step", 0) <= step
                ]
                path.write_text("".join(line + "\n" for line in keep))
        path = self.run_dir / "metrics.jsonl"
        self.history = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )

    def metrics(self, step: int, values: dict[str, float]) -> None:
        record = {"step": step, **{k: float(v) for k, v in values.items()}}
        self.history.append(record)
        if not self.enabled:
            return
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        for tracker in self.trackers:
            tracker.log(step, values)

    def warm_start(self, losses: list[float]) -> None:
        """``warm_start.jsonl``: the supervised loss of every warm-start step (the report's
        warm-start panel)."""
        if not self.enabled or not losses:
            return
        with (self.run_dir / "warm_start.jsonl").open("w") as f:
            for step, loss in enumerate(losses, start=1):
                f.write(json.dumps({"step": step, "loss": float(loss)}) + "\n")

    def completions(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with (self.run_dir / "completions.jsonl").open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}, ensure_ascii=False) + "\n")
        for tracker in self.trackers:
            tracker.log_completions(step, rows)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


class NoSignalWatch:
    """Notices runs that learn nothing: after ``steps`` consecutive steps in which no group had
    reward variance (``rollout/frac_zero_std`` = 1, so every advantage is 0), :meth:`update`
    returns a warning naming the most frequent reasons for minimum scores over those steps
    (``train/reasons/<verifier>/<reason>`` counts), and again every ``steps`` steps while it
    lasts. A step with any variance starts the count again. ``steps = 0``: never."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.run = 0
        self.reasons: Counter = Counter()

    def update(self, frac_zero_std: float, reasons: dict[str, float]) -> str | None:
        if not self.steps:
            return None
        if frac_zero_std < 1.0:
            self.run = 0
            self.reasons.clear()
            return None
        self.run += 1
        self.reasons.update({k: float(v) for k, v in reasons.items()})
        if self.run % self.steps:
            return None
        top = ", ".join(f"{reason} ×{n:g}" for reason, n in self.reasons.most_common(3))
        return (
            f"no group had reward variance in the last {self.run} steps: every advantage is 0 "
            f"and nothing is learned; most frequent reasons: {top or 'none (equal nonzero rewards)'}"
        )


def progress_bar(console: Any, transient: bool = False) -> Progress:
    """The progress display of RL steps, the warm start and evaluations: a description, the
    bar, ``done/total``, a free ``info`` field (every task must be added with ``info=``), time
    spent and left."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
    )


@contextmanager
def quiet_libraries(verbose: bool = True) -> Iterator[None]:
    """With ``verbose=False`` (the Python API's): nothing on stdout/stderr from the libraries
    mmrft drives while the block runs: transformers' and huggingface_hub's progress bars off,
    transformers' log records and Python warnings sent through :mod:`logging` (train.log)
    instead of its own stderr handler, and the ``mmrft`` logger kept off Python's last-resort
    stderr handler when nothing listens. Restored on exit; ``verbose=True`` changes nothing."""
    if verbose:
        yield
        return
    import warnings

    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from transformers.utils import logging as hf_logging

    bars_hf, bars_hub = hf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    hf_root = hf_logging._get_library_root_logger()
    hf_handlers, hf_propagate = list(hf_root.handlers), hf_root.propagate
    ours, silent = logging.getLogger("mmrft"), None
    if not ours.hasHandlers():
        silent = logging.NullHandler()
        ours.addHandler(silent)
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    for handler in hf_handlers:
        hf_root.removeHandler(handler)
    hf_root.propagate = True
    try:
        with warnings.catch_warnings():
            warnings.showwarning = lambda message, category, filename, lineno, *_: ours.warning(
                "%s: %s (%s:%d)", category.__name__, message, filename, lineno
            )
            yield
    finally:
        hf_root.propagate = hf_propagate
        for handler in hf_handlers:
            hf_root.addHandler(handler)
        if bars_hf:
            hf_logging.enable_progress_bar()
        if bars_hub:
            enable_progress_bars()
        if silent is not None:
            ours.removeHandler(silent)


def media_counters() -> dict[str, float]:
    """Running counts of media the budgets changed (clips truncated, videos given fewer frames
    or pixels), so nothing is shortened silently."""
    from mmrft.data.audio import AUDIO_STATS
    from mmrft.data.video import video_stats

    video = video_stats()
    return {
        "data/audio_truncated": float(AUDIO_STATS.get("truncated", 0)),
        "data/video_fps_lowered": float(video.get("fps_lowered", 0)),
        "data/video_pixels_lowered": float(video.get("pixels_lowered", 0)),
    }


COUNT_METRICS = (
    "rollout/generated",
    "rollout/kept",
    "rollout/discarded",
    "rollout/temporal_generated",
    "throughput/",
    "train/reasons/",
)


def merge_rank_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """One metrics line for all ranks: counts are summed, everything else averaged (ranks hold
    equal numbers of prompts, so the mean of means is the global mean)."""
    gathered = distributed.gather_objects(metrics)
    if len(gathered) == 1:
        return metrics
    keys = sorted({k for m in gathered for k in m})
    out = {}
    for key in keys:
        values = [m[key] for m in gathered if key in m]
        out[key] = sum(values) if key.startswith(COUNT_METRICS) else sum(values) / len(values)
    return out


class Heartbeat:
    """A daemon thread that logs a warning naming the current phase and how long it has run,
    every ``seconds``, while a phase lasts longer than that: a run that hangs says on what."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.current = "start"
        self.since = time.monotonic()
        self._stop = threading.Event()

    def phase(self, name: str) -> None:
        self.current, self.since = name, time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(self.seconds):
            waited = time.monotonic() - self.since
            if waited >= self.seconds:
                log.warning("still in %s after %.0f s", self.current, waited)

    def __enter__(self) -> Heartbeat:
        if self.seconds > 0:
            threading.Thread(target=self._watch, name="mmrft:heartbeat", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


class GracefulStop:
    """Turn the first Ctrl-C (SIGINT) or SIGTERM into a request to stop after the current step,
    so the checkpoint then written is exact; a second signal interrupts at once."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        log.warning(
            "%s received: stopping after this step (send again to abort now)", self.requested
        )

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def attach_file_log(path: Path) -> None:
    """Send the ``mmrft`` logger's records (INFO and up) to ``path`` (replacing an earlier file)."""
    detach_file_log()
    root = logging.getLogger("mmrft")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def detach_file_log() -> None:
    """Stop sending the ``mmrft`` logger's records to a file (:func:`attach_file_log`), and
    close it."""
    root = logging.getLogger("mmrft")
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
            handler.close()
