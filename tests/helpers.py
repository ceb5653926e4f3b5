"""Checks and builders several test files share (imported as ``helpers``: pytest puts tests/ on
``sys.path``, as for ``ranks``)."""

from __future__ import annotations

import contextlib
import doctest
import importlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "assets"

T = TypeVar("T")

LENGTH_PLUGIN = """
from mmrft import verifier

@verifier("test_length", low=0.0, high=1.0)
def length(completions, samples):
    \"\"\"Completion length / 20, capped at 1: varies inside every group of a random model.\"\"\"
    return [min(len(c), 20) / 20 for c in completions]
"""


def length_plugin(folder: Path) -> Path:
    """Write the ``test_length`` verifier plugin (a reward that varies inside every group of a
    random model, so advantages are non-zero) into ``folder``; its path."""
    path = folder / "length_plugin.py"
    path.write_text(LENGTH_PLUGIN)
    return path


# -- verifier contract ---------------------------------------------------------------------------
def check_doctests(module: str) -> None:
    """The module's docstring examples exist and pass."""
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0
    assert result.failed == 0


def check_registered(name: str, low: float = 0.0, high: float = 1.0) -> None:
    """The verifier is registered with its range, its doc states the range and has an example,
    and an empty batch gives an empty list."""
    from mmrft.plugins import VERIFIERS

    def number(x: float) -> str:
        return f"−{-x:g}" if x < 0 else f"{x:g}"

    spec = VERIFIERS.get(name)
    assert (spec.low, spec.high) == (low, high)
    assert f"Range [{number(low)}, {number(high)}]" in spec.doc
    assert ">>>" in spec.doc
    assert spec.bind({})([], []) == []


def run_verifier(name: str, completions: list[str], samples: list, **params) -> list:
    """Call a registered verifier through the same path training uses (bind, then call)."""
    from mmrft.plugins import VERIFIERS

    return VERIFIERS.get(name).bind(params)(completions, samples)


def check_evaluate(task: Any, sample: Any, cases: dict[str, tuple]) -> list:
    """``task.evaluate_one(completion, sample)`` gives ``(score, reason, parsed)`` for each
    ``completion: (score, reason, parsed)`` of ``cases``; the records."""
    records = []
    for completion, expected in cases.items():
        record = task.evaluate_one(completion, sample)
        assert (record.score, record.reason, record.parsed) == expected, completion
        records.append(record)
    return records


def changed(item: dict, changes: dict) -> dict:
    """``item`` with ``changes`` applied; a change to None drops the field."""
    out = {**item, **changes}
    return {k: v for k, v in out.items() if v is not None}


# -- tiny models ---------------------------------------------------------------------------------
def tiny_model_dirs(families: Any, tmp_path_factory: Any) -> dict[str, Path]:
    """The committed tiny models of ``families`` (built into a temp dir if the assets are
    missing)."""
    from mmrft.models import tiny

    dirs = {f: ASSETS / "models" / f"tiny-{f}" for f in families}
    if not all((d / "config.json").is_file() for d in dirs.values()):
        out = tmp_path_factory.mktemp("assets")
        dirs = {f: tiny.build_tiny(f, out / f"tiny-{f}") for f in families}
    return dirs


def family_fixtures(families: dict[str, type]) -> tuple:
    """Two module-scoped fixtures for ``families`` (name: family class): ``model_dirs``, the
    committed tiny models (built into a temp dir if the assets are missing), and ``loaded``,
    ``name: (family, processor, model in eval mode)``. Use as
    ``model_dirs, loaded = family_fixtures(FAMILIES)`` in a test module."""
    import pytest

    @pytest.fixture(scope="module")
    def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
        return tiny_model_dirs(families, tmp_path_factory)

    @pytest.fixture(scope="module")
    def loaded(model_dirs: dict[str, Path]) -> dict[str, tuple]:
        out = {}
        for name, cls in families.items():
            family = cls()
            path = str(model_dirs[name])
            out[name] = (family, family.load_processor(path), family.load_model(path).eval())
        return out

    return model_dirs, loaded


# -- short training runs -------------------------------------------------------------------------
def short_run(output_dir: Any, name: str, steps: int = 2, group: int = 2, new_tokens: int = 4):
    """The overrides of a short CPU training run: its output folder and name, no warm start,
    ``steps`` RL steps of 2 prompts × ``group`` completions of at most ``new_tokens`` tokens."""
    return [
        f"output_dir={output_dir}",
        f"name={name}",
        "warm_start.steps=0",
        f"train.steps={steps}",
        "train.prompts_per_step=2",
        f"rollout.group_size={group}",
        f"rollout.max_new_tokens={new_tokens}",
    ]


NO_EVAL = ["eval.before=false", "eval.after=false"]
"""No evaluation before or after RL."""


# -- speed ---------------------------------------------------------------------------------------
def fastest(call: Any, repeats: int = 5) -> tuple[float, Any]:
    """The fastest of ``repeats`` calls of ``call()`` in seconds (the machine may be busy) and
    what the last call returned."""
    import time

    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = call()
        best = min(best, time.perf_counter() - start)
    return best, result


def fast_score(call: Any, limit: float = 0.05) -> Any:
    """The score ``call()`` returns, checking that the fastest of 5 calls took under ``limit``
    seconds."""
    seconds, score = fastest(call)
    assert seconds < limit, f"{seconds * 1000:.1f} ms"
    return score


def chat_text(processor: Any, messages: list[dict], prompt: bool = True) -> str:
    """The processor's chat template applied to ``messages`` as text (with the assistant's
    generation prompt unless ``prompt`` is false)."""
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)


# Peak RSS from VmHWM, the high-water mark of this process's own memory since it started:
# ru_maxrss would also count the parent's, which Linux carries across fork and exec.
_MEASURED_CLI = """
import json, sys, time
from mmrft.cli import main
start = time.monotonic()
status = main(sys.argv[1:])
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
print(json.dumps({"status": status, "seconds": time.monotonic() - start, "peak_mb": peak}),
      file=sys.stderr)
"""


def verify_measured(
    verifier: str, lines: list[dict], folder: Path, *params: str, timeout_s: float
) -> tuple[dict, dict, subprocess.CompletedProcess]:
    """``mmrft verify VERIFIER`` over ``lines`` (written to ``folder/completions.jsonl``) in a
    fresh process, run in ``folder``: its scores by id, its stats (``status``, ``seconds``,
    ``peak_mb``: the verifying process alone, not its children) and the process. A hang past
    ``timeout_s`` fails the test instead of blocking the suite."""
    data = folder / "completions.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED_CLI, "verify", verifier, str(data), *params],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=folder,
    )
    stats = json.loads(proc.stderr.strip().splitlines()[-1])
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {row.get("id"): row for row in rows}, stats, proc


def tiny_policy(*overrides: str) -> Any:
    """The bundled tiny Qwen2.5-VL (``assets/models/tiny-qwen2_5_vl``) loaded as a policy on the
    CPU, with ``overrides`` (``key=value``) applied to the config it is loaded from."""
    import torch

    from mmrft.config import load_config
    from mmrft.policy.model import load_policy

    model = ASSETS / "models" / "tiny-qwen2_5_vl"
    cfg = load_config(None, [f"model.path={model}", "train.steps=0", *overrides])
    return load_policy(cfg.model, torch.device("cpu"))


def zoom_sample(index: int = 0) -> Any:
    """Training sample ``index`` of the bundled zoom_marks benchmark, its image path absolute."""
    from mmrft.data import Sample

    folder = ASSETS / "benchmarks" / "zoom_marks"
    record = json.loads((folder / "train.jsonl").read_text().splitlines()[index])
    for part in record["messages"][0]["content"]:
        if part["type"] == "image":
            part["image"] = str(folder / part["image"])
    return Sample(record["id"], record["messages"], record["target"], record["meta"])


def one_error_line(stderr: str) -> str:
    """The one ``error:`` line a command that failed printed on ``stderr``, with no traceback
    beside it (asserted)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


# -- HTTP servers on 127.0.0.1 -------------------------------------------------------------------
class LocalServer:
    """An HTTP server on 127.0.0.1 at a free port, answering in a thread of its own with one
    daemon thread per request (a stalled request never holds up the test's end). Subclasses
    build their handler and call :meth:`serve`; :meth:`close` stops it and frees the port."""

    url: str

    def serve(self, handler: type[BaseHTTPRequestHandler], path: str = "") -> None:
        """Start answering with ``handler``; :attr:`url` is ``http://127.0.0.1:<port>path``."""
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_after(server: T) -> Iterator[T]:
    """A fixture's body (``yield from closed_after(Server())``): the server, closed after the
    test."""
    with contextlib.closing(server):
        yield server


def ScriptedEngine(policy, scripts: list[list[list[int]]], group_shared: bool = True):
    """The hf engine with its tokens chosen by a script: ``scripts[call][completion]`` is the
    token list of that completion in the engine's ``call``-th call (``generate`` first, then
    each ``continue_rows``); log-probs are the model's for those tokens. (A factory: this
    module does not import torch at import time.)"""
    import torch

    from mmrft.rollout.hf import HFEngine

    class Scripted(HFEngine):
        def __init__(self) -> None:
            super().__init__(policy, batch_size=64, group_shared=group_shared)
            self.scripts = scripts
            self.call = -1

        def generate(self, conversations, n, sampling):
            self.call += 1
            return super().generate(conversations, n, sampling)

        def continue_rows(self, rows, sampling):
            self.call += 1
            return super().continue_rows(rows, sampling)

        def _next_tokens(self, logits, sampling, completions, t, seen=None):
            script = self.scripts[self.call]
            end = self.stop_ids[0]
            tokens = torch.tensor(
                [script[c][t] if t < len(script[c]) else end for c in completions]
            )
            raw = torch.log_softmax(logits, dim=-1)
            return tokens, raw.gather(1, tokens[:, None])[:, 0]

    return Scripted()
