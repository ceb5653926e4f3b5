"""mmrft against TRL's GRPOTrainer, side by side, on the same model, data and work.

    python benchmarks/vs_trl.py            # 4 runs per side (about 25 min on 2 cores)
    python benchmarks/vs_trl.py --quick    # 2 runs per side, 3 (image) / 2 (video) steps: ~7 min

What runs (each run in its own process, the sides alternating A B A B):

* **image**: TRL 1.x ``GRPOTrainer`` against ``mmrft train`` (group-shared, the default). TRL
  runs twice per round: without gradient checkpointing (its fastest setting) and with it (the
  default of ``GRPOConfig``, its leanest); throughput is compared with the faster, memory
  with the smaller;
* **video**: TRL has no video GRPO, so the baseline is mmrft's own per-completion path
  (``rollout.group_shared=false``: the prompt and its video encoded once per completion, the
  method of every peer) against the group-shared path.

The same work on both sides: the deterministic random-init "bench" Qwen2.5-VL of 41 M
parameters (``mmrft make-tiny --bench``: text 512 wide, 8 layers, head_dim 64; vision 256 wide,
8 deep), fp32, SDPA attention; P = 2 prompts × G = 8 completions per step, every completion
exactly 32 new tokens (end-of-turn masked: TRL ``min_new_tokens``, mmrft
``rollout.ignore_eos``), temperature 1; the same rendered prompt text; 224 × 224 images (64
visual tokens) or 16-frame 224-pixel videos (512 visual tokens); a reward with in-group
variance (a hash of the completion text in [0, 1]) so both sides run the full update; β = 0,
one optimizer update per batch (μ = 1), AdamW, the whole batch in one micro-batch; 2 threads.

TRL's settings are its best honest CPU ones: fp32 (no bf16 on this CPU), the 16 completions in
one ``generate`` call and one micro-batch (``per_device_train_batch_size=16``,
``generation_batch_size=16``), gradient checkpointing off (``trl``) or on (``trl-ckpt``), no
prompt truncation, dropout off, logging every step, no checkpoints, no evaluation. mmrft runs
with its defaults (no gradient checkpointing).

Measured per run: seconds per step (the median over the steps after the first, which pays for
warm-up: wall clock between consecutive step ends, so everything a step does is counted) and
peak resident memory (``VmHWM`` of the worker process). Ratios: throughput = mmrft steps/s ÷
baseline steps/s (> 1: mmrft faster), memory = mmrft peak RSS ÷ baseline (< 1: mmrft smaller),
each from the medians over runs. The last line printed is JSON:
``{"image": {"throughput_ratio": R, "memory_ratio": M}, "video": {...}}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
P, G, NEW_TOKENS, THREADS = 2, 8, 32, 2
SIDE = 224  # pixels: 224 / 14 = 16 patches a side, 8 × 8 = 64 visual tokens after the merge
FRAMES = 16
SAMPLES = 64  # distinct prompts (each step draws P of them)


# ---------------------------------------------------------------------------------------------
# Shared by both sides


def bench_reward(text: str) -> float:
    """A reward in [0, 1] that varies within every group: a hash of the completion text."""
    return (zlib.crc32(text.encode("utf-8")) % 1000) / 1000.0


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


STEPS_ONLY = [
    "data.test=",
    "warm_start.steps=0",
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "checkpoint.every=0",
]
"""A run timed for its RL steps alone: no test split, warm start, evaluation or periodic
checkpoint (also benchmarks/gpu.py's)."""
FIXED_WORK = [
    "rollout.ignore_eos=true",
    "rollout.temperature=1.0",
    "algorithm.beta=0.0",
    "optim.lr=1e-6",
    "optim.warmup_steps=0",
]
"""The same work every step: completions run to max_new_tokens, plain sampling, no KL term (no
reference model), a learning rate too small to change what is sampled."""


def make_data(folder: Path) -> dict[str, Path]:
    """Deterministic images (224 × 224 PNG) and videos (16 frames of 224 × 224 at 8 fps): a
    coloured square on a noisy background, moving in the videos; mmrft datasets for both."""
    import numpy as np
    from PIL import Image

    sys.path.insert(0, str(REPO / "scripts"))
    from make_benchmarks import save_mp4

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    colours = {
        "red": (220, 40, 40),
        "green": (40, 200, 60),
        "blue": (40, 80, 220),
        "yellow": (230, 210, 40),
    }
    names = list(colours)
    image_lines, video_items = [], []
    for i in range(SAMPLES):
        colour = names[i % 4]
        x, y = rng.integers(20, SIDE - 80, size=2)
        frames = []
        for t in range(FRAMES):
            pixels = rng.integers(0, 60, size=(SIDE, SIDE, 3), dtype=np.uint8)
            dx = 3 * t if i % 2 == 0 else -3 * t
            pixels[y : y + 48, max(0, x + dx) : max(0, x + dx) + 48] = colours[colour]
            frames.append(pixels)
        image = folder / f"image-{i:03d}.png"
        if not image.exists():
            Image.fromarray(frames[0]).save(image)
        video = folder / f"video-{i:03d}.mp4"
        if not video.exists():
            save_mp4(np.stack(frames), 8, video)
        image_lines.append(
            {
                "id": f"bench-{i:03d}",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "image": str(image)},
                            {"type": "text", "text": "What colour is the shape?"},
                        ],
                    }
                ],
                "target": colour,
                "meta": {"choices": names, "image_size": [SIDE, SIDE]},
            }
        )
        video_items.append(
            {
                "problem_id": i,
                "problem": "Which direction does the square move?",
                "data_type": "video",
                "problem_type": "multiple choice",
                "options": ["A. right", "B. left", "C. up", "D. down"],
                "solution": f"<answer>{'A' if i % 2 == 0 else 'B'}</answer>",
                "path": str(video),
                "data_source": "bench",
            }
        )
    images = folder / "images.jsonl"
    images.write_text("".join(json.dumps(line) + "\n" for line in image_lines))
    videos = folder / "videos.json"
    videos.write_text(json.dumps(video_items))
    return {"image": images, "video": videos}


def mmrft_overrides(modality: str, data: Path, out: Path, steps: int) -> list[str]:
    """The mmrft run config of the benchmark (the same work as the TRL side)."""
    common = [
        f"model.path={REPO / 'assets' / 'models' / 'bench-qwen2_5_vl'}",
        "model.attn_implementation=sdpa",
        f"data.train={data}",
        *STEPS_ONLY,
        "checkpoint.keep_last=1",
        f"rollout.group_size={G}",
        f"rollout.max_new_tokens={NEW_TOKENS}",
        f"rollout.batch_size={P * G}",
        f"rollout.micro_group={G}",
        *FIXED_WORK,
        "algorithm.updates_per_batch=1",
        f"train.steps={steps}",
        f"train.prompts_per_step={P}",
        f"train.micro_batch_size={P * G}",
        f"train.threads={THREADS}",
        "train.completions_every=0",
        "train.trackers=[]",
        "reward.verifiers=[{name: bench_hash}]",
        f"output_dir={out}",
        "name=run",
    ]
    if modality == "image":
        side = SIDE * SIDE
        return [
            *common,
            "task.name=classification",
            "task.params={think: none}",
            f"model.min_pixels={side}",
            f"model.max_pixels={side}",
        ]
    return [
        *common,
        "task.name=video_qa",
        "task.params={think: none}",
        "data.format=video_r1",
        "model.video.fps=8.0",
        f"model.video.min_frames={FRAMES}",
        f"model.video.max_frames={FRAMES}",
        f"model.video.min_pixels={SIDE * SIDE}",
        f"model.video.max_pixels={SIDE * SIDE}",
    ]


# ---------------------------------------------------------------------------------------------
# Workers (one process per run)


def run_mmrft(modality: str, data: Path, steps: int, group_shared: bool) -> dict:
    import torch

    torch.set_num_threads(THREADS)
    from mmrft.config import load_config
    from mmrft.rewards import Score, verifier
    from mmrft.training import trainer

    @verifier("bench_hash", low=0.0, high=1.0)
    def bench_hash(completions, samples):
        return [Score(bench_reward(c)) for c in completions]

    stamps: list[float] = []
    log_step = trainer.log_step

    def timed_log_step(*args, **kwargs):
        out = log_step(*args, **kwargs)
        stamps.append(time.perf_counter())
        return out

    trainer.log_step = timed_log_step
    with tempfile.TemporaryDirectory() as out:
        overrides = mmrft_overrides(modality, data, Path(out), steps)
        overrides.append(f"rollout.group_shared={str(group_shared).lower()}")
        cfg = load_config(None, overrides)
        trainer.train(cfg)
        metrics = [
            json.loads(x) for x in (Path(out) / "run" / "metrics.jsonl").read_text().splitlines()
        ]
    return {
        "step_s": [b - a for a, b in itertools.pairwise(stamps)],
        "peak_rss_mb": peak_rss_mb(),
        "breakdown": {
            key: statistics.median(m[key] for m in metrics[1:] if key in m)
            for key in (
                "time/rollout_s",
                "time/rollout_encode_s",
                "time/rollout_prefill_s",
                "time/rollout_decode_s",
                "time/update_s",
                "time/forward_backward_s",
                "time/optimizer_s",
            )
            if any(key in m for m in metrics[1:])
        },
        "len_mean": statistics.mean(m["rollout/len_mean"] for m in metrics),
    }


def run_trl(data: Path, steps: int, checkpointing: bool) -> dict:
    import torch

    torch.set_num_threads(THREADS)
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mmrft.config import load_config
    from mmrft.policy.model import resolve_family
    from mmrft.rewards.task import build_task

    # the very prompt text mmrft renders for the same samples
    overrides = mmrft_overrides("image", data, Path(tempfile.gettempdir()), steps)
    cfg = load_config(None, [o for o in overrides if not o.startswith("reward.")])
    task = build_task(cfg.task.name, cfg.task.params)
    family = resolve_family(cfg.model)
    samples, _ = task.read(data)
    rows = []
    for sample in samples:
        conversation = task.prompt(sample, family)
        image_path = next(
            p["image"] for m in conversation for p in m["content"] if p.get("type") == "image"
        )
        prompt = [
            {
                "role": m["role"],
                "content": [
                    {"type": "image"}
                    if p.get("type") == "image"
                    else {"type": "text", "text": p["text"]}
                    for p in m["content"]
                ],
            }
            for m in conversation
        ]
        rows.append({"prompt": prompt, "image": Image.open(image_path).convert("RGB")})
    dataset = Dataset.from_list(rows)

    path = str(REPO / "assets" / "models" / "bench-qwen2_5_vl")
    processor = AutoProcessor.from_pretrained(path, padding_side="left")
    side = SIDE * SIDE
    processor.image_processor.size = (
        type(processor.image_processor.size)(shortest_edge=side, longest_edge=side)
        if not isinstance(processor.image_processor.size, dict)
        else {"shortest_edge": side, "longest_edge": side}
    )
    model = AutoModelForImageTextToText.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    )

    def reward(completions, **kwargs):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [bench_reward(t) for t in texts]

    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            learning_rate=1e-6,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_steps=steps,
            per_device_train_batch_size=P * G,
            gradient_accumulation_steps=1,
            num_generations=G,
            generation_batch_size=P * G,
            num_iterations=1,
            max_completion_length=NEW_TOKENS,
            generation_kwargs={"min_new_tokens": NEW_TOKENS},
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            loss_type="grpo",
            scale_rewards="group",
            disable_dropout=True,
            gradient_checkpointing=checkpointing,
            logging_steps=1,
            save_strategy="no",
            eval_strategy="no",
            report_to=[],
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=args,
            train_dataset=dataset,
            processing_class=processor,
            callbacks=[Stamp()],
        )
        trainer.train()
        history = trainer.state.log_history
    lengths = [h["completions/mean_length"] for h in history if "completions/mean_length" in h]
    return {
        "step_s": [b - a for a, b in itertools.pairwise(stamps)],
        "peak_rss_mb": peak_rss_mb(),
        "len_mean": statistics.mean(lengths) if lengths else None,
    }


def worker(args: argparse.Namespace) -> None:
    if args.worker.startswith("trl"):
        out = run_trl(Path(args.data), args.steps, checkpointing=args.worker == "trl-ckpt")
    else:
        out = run_mmrft(args.modality, Path(args.data), args.steps, args.worker == "mmrft")
    print("RESULT " + json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# The driver


def launch(side: str, modality: str, data: Path, steps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    cmd = [sys.executable, __file__, "--worker", side, "--modality", modality]
    cmd += ["--data", str(data), "--steps", str(steps)]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    lines = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{side} {modality} failed:\n{result.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def compare(name: str, baselines: list[str], ours: str, runs: int, steps: int, data: Path) -> dict:
    """Runs every side ``runs`` times, alternating; ratios against the fastest baseline for
    throughput and the leanest for memory (each baseline at its best on that metric)."""
    sides = [*baselines, ours]
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for r in range(runs):
        for side in sides:  # alternating A B A B
            out = launch(side, name, data, steps)
            results[side].append(out)
            print(
                f"  {name} run {r + 1}/{runs} {side:<24} "
                f"median {statistics.median(out['step_s']):6.2f} s/step, "
                f"peak RSS {out['peak_rss_mb']:7.0f} MB, mean length {out['len_mean']}",
                flush=True,
            )
    summary = {}
    for side, outs in results.items():
        medians = [statistics.median(o["step_s"]) for o in outs]
        summary[side] = {
            "s_per_step": statistics.median(medians),
            "s_per_step_range": [min(medians), max(medians)],
            "peak_rss_mb": statistics.median(o["peak_rss_mb"] for o in outs),
        }
        if "breakdown" in outs[0]:
            summary[side]["breakdown"] = outs[-1]["breakdown"]
    fastest = min(summary[b]["s_per_step"] for b in baselines)
    leanest = min(summary[b]["peak_rss_mb"] for b in baselines)
    ratios = {
        "throughput_ratio": round(fastest / summary[ours]["s_per_step"], 3),
        "memory_ratio": round(summary[ours]["peak_rss_mb"] / leanest, 3),
    }
    print(f"{name}: {json.dumps(summary)}", flush=True)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 runs per side, fewer steps")
    parser.add_argument("--worker", choices=["trl", "trl-ckpt", "mmrft", "mmrft-per-completion"])
    parser.add_argument("--modality", choices=["image", "video"], default="image")
    parser.add_argument("--data")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--only", choices=["image", "video"], help="run one comparison only")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from mmrft.models.tiny.base import bench_model

    bench_model(REPO / "assets")
    data = make_data(Path(tempfile.gettempdir()) / "mmrft-bench-data")
    runs = 2 if args.quick else 4
    started = time.time()
    out = {}
    if args.only in (None, "image"):
        print("image: TRL GRPOTrainer vs mmrft", flush=True)
        out["image"] = compare(
            "image", ["trl", "trl-ckpt"], "mmrft", runs, 3 if args.quick else 8, data["image"]
        )
    if args.only in (None, "video"):
        print("video: mmrft per-completion vs mmrft group-shared", flush=True)
        out["video"] = compare(
            "video", ["mmrft-per-completion"], "mmrft", runs, 2 if args.quick else 4, data["video"]
        )
    print(f"({time.time() - started:.0f} s)", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
