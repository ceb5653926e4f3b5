"""The GPU check: one command that turns a lent GPU into figures, and keeps that path alive on CPU.

    python benchmarks/gpu.py                    # on a GPU machine: every stage, into $OUT or --out
    python benchmarks/gpu.py --only env tests   # some stages
    python benchmarks/gpu.py --cpu --tiny       # every stage on CPU with the tiny models (a test)

Stages (each writes its part of ``gpu.json`` and ``gpu.md`` in the output folder, with the
command line that reproduces each row):

* ``env``: GPU, driver, torch / transformers / accelerate / peft versions, bf16, SDPA backends
  and FlexAttention, and whether mmrft and what it imports load;
* ``tests``: ``pytest -m gpu tests/test_gpu.py`` (bf16 numerics of the group-shared forward
  against the per-completion one, block-sparse attention, greedy parity with ``generate``,
  sampler = trainer log-probs, a checkpoint that reloads), its summary line and log;
* ``steps``: GRPO steps of ``mmrft train`` in bf16 at real sizes: the released architectures'
  configs (``benchmarks/gpu_models.json``: Qwen2.5-VL-3B and -7B, Qwen3-VL-4B) with random
  weights, on VLM-R1's shape (8 prompts × G 8, one 640 × 640 image each: 400 k pixels, 529
  visual tokens; every completion ``--new-tokens`` long), for group-shared against
  per-completion, gradient checkpointing on and off, full and LoRA. Each run in its own process;
  per run: seconds per step (median after the first) split into rollout / update, completion
  tokens per second, peak GPU memory, and model FLOPs utilisation;
* ``long_context``: the packed group-shared forward + backward at Video-R1's lengths (a prompt
  of ``--prompt-tokens`` tokens, 8 completions of ``--completion-tokens``), with the dense
  mask (SDPA), the block-sparse FlexAttention mask and the per-completion forward: seconds and
  peak memory. The prompt is text (random ids): the attention pattern and lengths are the
  video's, the vision tower's cost is left out (it is the same on every side).

MFU = model FLOPs ÷ (seconds × the GPU's dense bf16 peak), with model FLOPs = 2·N per token of
every forward (rollout prefill and decode, no-grad forwards) + 6·N per token trained, N the
parameters that the token passes (the language model; the vision tower's share is small at
529 tokens and left out), counting what each path computes (the group-shared path computes a
prompt once per micro group). Attention FLOPs are left out, so MFU is a lower bound.

With ``--cpu --tiny`` every stage runs on the CPU with the bundled tiny Qwen2.5-VL, float32,
tiny shapes; ``tests/test_gpu_check.py`` runs it in the default test suite so the script cannot
rot between lent GPUs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vs_trl import FIXED_WORK, STEPS_ONLY, bench_reward, peak_rss_mb

REPO = Path(__file__).resolve().parents[1]
STAGES = ("env", "tests", "steps", "long_context")
# dense bf16 peak FLOP/s by device name (NVIDIA's data sheets, SXM parts)
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "B200": 2250e12}
PROMPTS, GROUP = 8, 8


def peak_flops(name: str) -> float | None:
    """The dense bf16 peak of the device called ``name``, or ``None`` when unknown."""
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


# ---------------------------------------------------------------------------------------------
# env


def stage_env(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    report: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": "cpu",
    }
    for name in ("transformers", "accelerate", "peft", "trl", "deepspeed", "vllm"):
        try:
            report[name] = importlib.import_module(name).__version__
        except Exception as exc:  # a missing or broken package is a finding, not a crash
            report[name] = f"missing ({type(exc).__name__})"
    if torch.cuda.is_available() and not args.cpu:
        props = torch.cuda.get_device_properties(0)
        report.update(
            device=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            bf16=torch.cuda.is_bf16_supported(),
            flash_sdp=torch.backends.cuda.flash_sdp_enabled(),
            mem_efficient_sdp=torch.backends.cuda.mem_efficient_sdp_enabled(),
            peak_bf16_tflops=(peak_flops(props.name) or 0) / 1e12 or None,
        )
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            report["driver"] = smi.stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            report["driver"] = None
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401

        report["flex_attention"] = True
    except ImportError:
        report["flex_attention"] = False
    imports = {}
    for module in (
        "mmrft",
        "mmrft.training.trainer",
        "mmrft.policy.group",
        "mmrft.models.attention",
        "peft",
    ):
        try:
            importlib.import_module(module)
            imports[module] = "ok"
        except Exception as exc:
            imports[module] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    report["imports"] = imports
    return report


# ---------------------------------------------------------------------------------------------
# tests


def stage_tests(args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        "gpu",
        "tests/test_gpu.py",
        "-p",
        "no:cacheprovider",
    ]
    env = {**os.environ, "MMRFT_TEST_DEVICE": "cpu" if args.cpu else "cuda"}
    if args.tiny:  # the quickest subset: enough to show that the file runs
        command += ["-k", "bf16 and image and sdpa and qwen2_5_vl"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    (args.out / "gpu_tests.log").write_text(done.stdout + done.stderr)
    lines = [x for x in done.stdout.splitlines() if x.strip()]
    return {
        "returncode": done.returncode,
        "summary": lines[-1] if lines else done.stderr[-300:],
        "seconds": round(time.perf_counter() - start, 1),
        "command": ("MMRFT_TEST_DEVICE=cpu " if args.cpu else "")
        + shlex.join(command[1:]).replace("-m pytest", "python -m pytest", 1),
    }


# ---------------------------------------------------------------------------------------------
# models and data


def build_model(name: str, cache: Path, device: str) -> Path:
    """A checkpoint folder of ``name``: the bundled tiny model (``tiny``), or a released
    architecture of ``benchmarks/gpu_models.json`` with random bf16 weights drawn on ``device``
    (the tiny model's tokenizer, processor and special-token ids; built once into ``cache``)."""
    if name == "tiny":
        return REPO / "assets" / "models" / "tiny-qwen2_5_vl"
    spec = json.loads((REPO / "benchmarks" / "gpu_models.json").read_text())[name]
    folder = cache / name
    if (folder / "model.safetensors.index.json").is_file() or (
        folder / "model.safetensors"
    ).is_file():
        return folder
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    tiny = REPO / "assets" / "models" / spec["tiny"]
    data = json.loads((tiny / "config.json").read_text())
    for part in ("text_config", "vision_config"):
        data[part].update(spec[part])
    data["tie_word_embeddings"] = spec["tie_word_embeddings"]
    data["text_config"]["tie_word_embeddings"] = spec["tie_word_embeddings"]
    data["dtype"] = "bfloat16"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data, indent=2))
    config = AutoConfig.from_pretrained(folder)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    model.generation_config = AutoModelForImageTextToText.from_pretrained(tiny).generation_config
    model.save_pretrained(folder)
    AutoProcessor.from_pretrained(tiny).save_pretrained(folder)
    del model
    return folder


def make_images(folder: Path, side: int, count: int) -> Path:
    """``count`` samples of the bundled colour task with their images resized to ``side`` ×
    ``side`` pixels, as an mmrft JSONL in ``folder``."""
    from PIL import Image

    bench = REPO / "assets" / "benchmarks" / "shapes_colour"
    records = [json.loads(x) for x in (bench / "train.jsonl").read_text().splitlines()[:count]]
    folder.mkdir(parents=True, exist_ok=True)
    for record in records:
        for message in record["messages"]:
            for part in message["content"]:
                if part.get("type") == "image":
                    image = folder / Path(part["image"]).name
                    Image.open(bench / part["image"]).convert("RGB").resize((side, side)).save(
                        image
                    )
                    part["image"] = str(image)
        record["meta"]["image_size"] = [side, side]
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    return data


def prompt_length(model: Path, data: Path) -> int:
    """Tokens of the first sample's prompt as the model gets it (media placeholders included)."""
    from mmrft.config import load_config
    from mmrft.policy.model import resolve_family
    from mmrft.rewards.task import build_task

    cfg = load_config(None, [f"model.path={model}", "train.steps=0"])
    family = resolve_family(cfg.model)
    processor = family.load_processor(str(model))
    task = build_task("classification", {"think": "none"})
    sample = task.read(data)[0][0]
    batch = family.prepare(processor, [task.prompt(sample, family)])
    return int(batch["input_ids"].shape[1])


# ---------------------------------------------------------------------------------------------
# steps


def step_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The (model, mode) runs of the steps stage."""
    if args.tiny:
        return [
            {"model": "tiny", "group_shared": g, "checkpointing": c, "lora": lo}
            for g, c, lo in [(True, False, False), (False, True, True)]
        ]
    runs = [
        {"model": "qwen2_5_vl_3b", "group_shared": g, "checkpointing": c, "lora": lo}
        for g, c, lo in [
            (True, True, False),
            (False, True, False),
            (True, False, False),
            (False, False, False),
            (True, True, True),
            (False, True, True),
        ]
    ]
    runs += [
        {"model": m, "group_shared": g, "checkpointing": True, "lora": False}
        for m in ("qwen2_5_vl_7b", "qwen3_vl_4b")
        for g in (True, False)
    ]
    return [r for r in runs if not args.models or r["model"] in args.models]


def step_overrides(
    run: dict[str, Any], args: argparse.Namespace, model: Path, data: Path, out: Path
) -> list[str]:
    side = args.image_side
    return [
        f"model.path={model}",
        f"model.dtype={'float32' if args.cpu else 'bfloat16'}",
        f"device={'cpu' if args.cpu else 'cuda'}",
        "model.attn_implementation=sdpa",
        f"model.min_pixels={side * side}",
        f"model.max_pixels={side * side}",
        f"model.gradient_checkpointing={str(run['checkpointing']).lower()}",
        f"model.lora.enabled={str(run['lora']).lower()}",
        f"rollout.group_shared={str(run['group_shared']).lower()}",
        "task.name=classification",
        "task.params={think: none}",
        f"data.train={data}",
        *STEPS_ONLY,
        f"rollout.group_size={args.group}",
        f"train.prompts_per_step={args.prompts}",
        f"rollout.max_new_tokens={args.new_tokens}",
        *FIXED_WORK,
        f"train.steps={args.steps}",
        "train.completions_every=0",
        "reward.verifiers=[{name: bench_hash}]",
        f"output_dir={out}",
        "name=run",
    ]


def worker_steps(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One steps run, in this process: build the model and data, train, read the figures."""
    import torch

    import mmrft

    device = "cpu" if args.cpu else "cuda"
    register_bench_reward()
    model = build_model(run["model"], args.cache, device)
    with tempfile.TemporaryDirectory() as tmp:
        data = make_images(Path(tmp) / "data", args.image_side, max(args.prompts * 2, 16))
        overrides = step_overrides(run, args, model, data, Path(tmp))
        cfg = mmrft.load_config(None, overrides)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        mmrft.train(cfg)
        prompt_tokens = prompt_length(model, data)
        metrics = [
            json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
        ]
        config = json.loads((Path(model) / "config.json").read_text())
    steady = metrics[1:] or metrics

    def median(key: str) -> float | None:
        values = [m[key] for m in steady if key in m]
        return statistics.median(values) if values else None

    rollout, update = median("time/rollout_s"), median("time/update_s")
    step = median("time/step_s") or (
        (rollout or 0) + (update or 0) + (median("time/reward_s") or 0)
    )
    text = config.get("text_config", config)
    n_lm = language_model_parameters(text)
    completions = args.prompts * args.group
    completion_tokens = completions * args.new_tokens
    prompts_computed = args.prompts if run["group_shared"] else completions
    flops = (
        2 * n_lm * (prompts_computed * prompt_tokens + completion_tokens)  # rollout
        + 6 * n_lm * (prompts_computed * prompt_tokens + completion_tokens)  # update
    )
    peak = peak_flops(torch.cuda.get_device_name(0)) if device == "cuda" else None
    return {
        **run,
        "seconds_per_step": step,
        "rollout_s": rollout,
        "update_s": update,
        "completion_tokens_per_s": completion_tokens / step if step else None,
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if device == "cuda"
        else None,
        "peak_rss_gib": round(peak_rss_mb() / 1024, 2),
        "mfu": flops / (step * peak) if step and peak else None,
        "parameters_lm": n_lm,
        "prompt_tokens": prompt_tokens,
        "command": "mmrft train " + shlex.join(overrides),
    }


def register_bench_reward() -> None:
    """``bench_hash``: a reward in [0, 1] from a hash of the completion's text
    (``benchmarks/vs_trl.py``'s), so that every group has reward variance and every step runs
    the full update (a random-weight model's answers would otherwise all score 0)."""
    from mmrft.rewards import Score, verifier

    @verifier("bench_hash", low=0.0, high=1.0)
    def bench_hash(completions, samples):
        return [Score(bench_reward(c)) for c in completions]


def language_model_parameters(text: dict[str, Any]) -> int:
    """Parameters a token passes in the language model (embedding row excluded, the output
    projection included), from a text config: Σ layers (attention + SwiGLU MLP) + the head."""
    h, layers, vocab = text["hidden_size"], text["num_hidden_layers"], text["vocab_size"]
    heads, kv = (
        text["num_attention_heads"],
        text.get("num_key_value_heads", text["num_attention_heads"]),
    )
    head_dim = text.get("head_dim") or h // heads
    attention = h * head_dim * (heads + 2 * kv) + heads * head_dim * h
    mlp = 3 * h * text["intermediate_size"]
    return layers * (attention + mlp) + h * vocab


def stage_steps(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for run in step_runs(args):
        results.append(launch("steps", run, args))
        print(
            f"steps {run}: {results[-1].get('seconds_per_step', results[-1].get('error'))}",
            flush=True,
        )
    return results


# ---------------------------------------------------------------------------------------------
# long_context


def worker_long_context(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One forward + backward of G completions behind one long prompt, on one path."""
    import torch

    from mmrft.config import load_config
    from mmrft.policy.group import group_logps
    from mmrft.policy.model import completion_logps, load_policy

    device = torch.device("cpu" if args.cpu else "cuda")
    model = build_model(args.long_model, args.cache, device.type)
    attention = "block_sparse" if run["path"] == "block_sparse" else "sdpa"
    cfg = load_config(
        None,
        [
            f"model.path={model}",
            f"model.dtype={'float32' if args.cpu else 'bfloat16'}",
            f"model.attn_implementation={attention}",
            "model.gradient_checkpointing=true",
            "train.steps=0",
        ],
    )
    policy = load_policy(cfg.model, device)
    generator = torch.Generator().manual_seed(0)
    vocab = min(len(policy.tokenizer), 1000)
    prompt = {"input_ids": torch.randint(10, vocab, (args.prompt_tokens,), generator=generator)}
    prompt["attention_mask"] = torch.ones_like(prompt["input_ids"])
    comps = [
        torch.randint(10, vocab, (args.completion_tokens,), generator=generator).tolist()
        for _ in range(args.group)
    ]
    timings = []
    for _ in range(2):  # the first pays for compilation and allocation
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        policy.model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        if run["path"] == "per_completion":
            logps, mask, _ = completion_logps(policy, [prompt] * args.group, comps)
        else:
            logps, mask, _ = group_logps(policy, [prompt], [0] * args.group, comps, args.group)
        (logps * mask).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - start)
    L = args.prompt_tokens + args.group * args.completion_tokens
    return {
        **run,
        "model": args.long_model,
        "row_tokens": L,
        "seconds": round(timings[-1], 3),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if device.type == "cuda"
        else None,
        "peak_rss_gib": round(peak_rss_mb() / 1024, 2),
        "dense_mask_gib": round(L * L / 2**30, 2) if run["path"] == "dense" else 0.0,
        "command": (
            f"python benchmarks/gpu.py --only long_context --long-model {args.long_model} "
            f"--prompt-tokens {args.prompt_tokens} --completion-tokens {args.completion_tokens}"
        ),
    }


def stage_long_context(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for path in ("per_completion", "dense", "block_sparse"):
        results.append(launch("long_context", {"path": path}, args))
        print(
            f"long_context {path}: {results[-1].get('seconds', results[-1].get('error'))}",
            flush=True,
        )
    return results


# ---------------------------------------------------------------------------------------------
# driver


WORKERS = {"steps": worker_steps, "long_context": worker_long_context}


def launch(kind: str, run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker in a fresh process (clean peak memory; a crash or OOM is a row, not the
    end of the check); with ``--tiny``, in this process (the CPU check: seconds matter, peak
    memory does not)."""
    if args.tiny:
        try:
            return WORKERS[kind](run, args)
        except Exception as exc:
            return {**run, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    command = [
        sys.executable,
        __file__,
        "--worker",
        kind,
        "--run",
        json.dumps(run),
        *args.passthrough,
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=args.worker_timeout
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {**run, "error": f"exit {done.returncode}: {' | '.join(tail)[-500:]}"}
    return json.loads(lines[-1][len("RESULT ") :])


def markdown(report: dict[str, Any]) -> str:
    env = report.get("env", {})
    out = [f"# GPU check ({env.get('device', '?')}, {report['date']}, commit {report['commit']})\n"]
    out.append(f"`{report['command']}`\n")
    if env:
        out.append("| " + " | ".join(k for k in env if k != "imports") + " |")
        out.append("|" + "---|" * (len(env) - 1))
        out.append("| " + " | ".join(str(v) for k, v in env.items() if k != "imports") + " |\n")
        out.append("imports: " + ", ".join(f"{k} {v}" for k, v in env["imports"].items()) + "\n")
    if "tests" in report:
        t = report["tests"]
        out.append(f"tests: `{t['command']}` → {t['summary']} ({t['seconds']} s)\n")
    if "steps" in report:
        out.append(
            "| model | path | checkpointing | LoRA | s/step | rollout s | update s | tokens/s | peak GPU GiB | MFU |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in report["steps"]:
            path = "group-shared" if r["group_shared"] else "per-completion"
            if "error" in r:
                out.append(
                    f"| {r['model']} | {path} | {r['checkpointing']} | {r['lora']} | {r['error']} ||||||"
                )
                continue
            out.append(
                f"| {r['model']} | {path} | {r['checkpointing']} | {r['lora']} | {fmt(r['seconds_per_step'])} "
                f"| {fmt(r['rollout_s'])} | {fmt(r['update_s'])} | {fmt(r['completion_tokens_per_s'], 0)} "
                f"| {fmt(r['peak_gpu_gib'])} | {fmt(r['mfu'], 3)} |"
            )
        out.append("\nEach row: `mmrft train …` as in `gpu.json` (`command`).\n")
    if "long_context" in report:
        out.append(
            "| path | row tokens | s (forward + backward) | peak GPU GiB | peak RSS GiB | dense mask GiB |"
        )
        out.append("|---|---|---|---|---|---|")
        for r in report["long_context"]:
            if "error" in r:
                out.append(f"| {r['path']} | {r['error']} ||||")
                continue
            out.append(
                f"| {r['path']} | {r['row_tokens']} | {fmt(r['seconds'], 3)} | {fmt(r['peak_gpu_gib'])} "
                f"| {fmt(r['peak_rss_gib'])} | {fmt(r['dense_mask_gib'])} |"
            )
    return "\n".join(out) + "\n"


def fmt(value: Any, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "runs/gpu"))
    parser.add_argument("--only", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (float32)")
    parser.add_argument("--tiny", action="store_true", help="the bundled tiny model, tiny shapes")
    parser.add_argument("--models", nargs="+", help="steps: only these models")
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "mmrft-gpu-models"
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    parser.add_argument("--group", type=int, default=GROUP)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--image-side", type=int, default=644, help="pixels (a multiple of 28)")
    parser.add_argument("--long-model", default="qwen2_5_vl_3b")
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--completion-tokens", type=int, default=1024)
    parser.add_argument("--worker-timeout", type=int, default=900)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.steps, args.prompts, args.group, args.new_tokens = 2, 2, 4, 8
        args.image_side, args.long_model = 56, "tiny"
        args.prompt_tokens, args.completion_tokens = 200, 60
    keep = ("--cpu", "--tiny")
    values = (
        "--cache",
        "--steps",
        "--prompts",
        "--group",
        "--new-tokens",
        "--image-side",
        "--long-model",
        "--prompt-tokens",
        "--completion-tokens",
    )
    args.passthrough = [a for a in keep if getattr(args, a[2:].replace("-", "_"))]
    for name in values:
        args.passthrough += [name, str(getattr(args, name[2:].replace("-", "_")))]
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        result = WORKERS[args.worker](json.loads(args.run), args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit.stdout.strip() or "unknown",
        "command": "python benchmarks/gpu.py " + shlex.join(sys.argv[1:] if argv is None else argv),
    }
    stages = {
        "env": stage_env,
        "tests": stage_tests,
        "steps": stage_steps,
        "long_context": stage_long_context,
    }
    for name in STAGES:
        if name in args.only:
            start = time.perf_counter()
            report[name] = stages[name](args)
            print(f"{name}: done in {time.perf_counter() - start:.0f} s", flush=True)
            (args.out / "gpu.json").write_text(json.dumps(report, indent=2))  # kept if cut off
    (args.out / "gpu.json").write_text(json.dumps(report, indent=2))
    (args.out / "gpu.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
