"""Build a reader: the tiny Qwen2.5-VL pre-trained here to read what a "look closer" call
fetched (the colour of a flash in a ``video_frames`` clip, of a dot in a ``crop``), and to
write the benchmark's call at a random place, never where.

    python scripts/make_reader.py                          # zoom_video: assets/models/reader-zoom_video
    python scripts/make_reader.py --benchmark zoom_sites   # assets/models/reader-zoom_sites
    python scripts/make_reader.py --benchmark zoom_slots --read-steps 600 --call-steps 0
    python scripts/make_reader.py --read-steps 40 --time-steps 20 --call-steps 20 --clips 200 --out /tmp/reader

Why: RL through the tool loop did not teach the tiny model to read the fetched clip or crop
(600 tool steps of zoom_video, 200 of zoom_sites: docs/tools.md), while the same model reads
them after a few hundred single-turn steps. A real VLM reads what it is shown before anyone
runs RL on it; this is that pre-training, on data of its own, so that what RL with
``tools/BENCHMARK`` must teach is the tool's use: where to look.

1. **data**: ``--clips`` samples drawn by the benchmark's generator (scripts/make_benchmarks.py)
   at the pretraining seeds of scripts/make_learner.py, never the benchmark's train or test
   samples (checked: no pretraining video or image equals a test one), written under ``--cache``;
2. **reading** (``--read-steps``): ``mmrft train tools/BENCHMARK`` as a warm start alone,
   each sample's trajectory the scripted call on ``meta.zoom_span`` (zoom_video: the 1-s
   window from the stated time; zoom_slots: the marked slot's 1-s window) or
   ``meta.zoom_box`` (zoom_sites: the marked site), its observation, then the true colour,
   the loss on the answer turn only (``warm_start.train_on=answer``): it learns to read,
   never to write that call;
3. **timing** (zoom_video only, ``--time-steps``, default 0: off): the same clips asked
   :data:`TIMING_QUESTIONS` instead (other questions that state the same time: "How many discs
   are on screen at about 3.4 s?"), each answered by the scripted call on the stated time, the
   loss on the call turn only (``warm_start.train_on=calls``): a tool-using VLM's habit of
   looking where a question points, never on this benchmark's question. Why: the tiny model
   does not learn to copy the stated time into the call in 900 supervised steps of 16
   (docs/tools.md, with ``benchmarks/copy_probe.py``'s measure of that skill alone);
4. **calling** (``--call-steps``): the same on the benchmark's own question with the call
   moved to a random place (``warm_start.calls=random``: the window's length kept, or one of
   the sites ``meta.zoom_choices`` names) and the loss on every turn: the call's format and
   answering after its observation (the true colour: read when the call found the target, a
   guess when not), nothing about where the target is, so that where to look is RL's to teach;
   ``--call-steps 0`` skips it: a reader that reads and has never written a call (what
   ``tools/zoom_sites`` and ``tools/zoom_slots`` start from: their own warm start teaches
   the call, RL the reading of what it fetched);
5. **output**: ``--out`` (a ``save_pretrained`` folder) and ``--out/pretraining.json`` (the
   commands, steps, seconds, threads, CPU, each phase's warm-start loss curve).

Fixed seeds (``train.seed``), so the same command on the same CPU and thread count writes the
same weights.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from make_learner import pretraining_split  # noqa: E402

from mmrft.cli import main as mmrft  # noqa: E402
from mmrft.evaluation.runlog import cpu_model  # noqa: E402

DEFAULT_CACHE = REPO / "runs" / "learner-data"
BASE = REPO / "assets" / "models" / "tiny-qwen2_5_vl"
TIMING_QUESTIONS = (
    "How many discs are on screen at about {time:.1f} s?",
    "What shape appears at about {time:.1f} s?",
    "Which way does the square move at about {time:.1f} s?",
    "Is the light on at about {time:.1f} s?",
    "What is written on the sign at about {time:.1f} s?",
)
"""Questions of other wordings that state a time (the timing phase's; never zoom_video's own)."""


def timing_split(split: Path, seed: int) -> Path:
    """``split`` with each clip's question replaced by one of :data:`TIMING_QUESTIONS` (drawn
    at ``seed``) stating the same ``meta.asked_time``; written beside it as ``timing.jsonl``.
    Only the call turn is trained on it, so its answers are never learnt."""
    rng = random.Random(seed)
    lines = []
    for line in split.read_text().splitlines():
        record = json.loads(line)
        question = rng.choice(TIMING_QUESTIONS).format(time=record["meta"]["asked_time"])
        content = record["messages"][0]["content"]
        texts = [part for part in content if part["type"] == "text"]
        if len(texts) != 1:
            raise ValueError(f"{record['id']}: expected one question text, got {len(texts)}")
        texts[0]["text"] = question
        lines.append(json.dumps(record))
    out = split.with_name("timing.jsonl")
    out.write_text("\n".join(lines) + "\n")
    return out


def phase(
    name: str, model: Path, split: Path, work: Path, steps: int, lr: float, args, *how: str
) -> tuple[dict, Path]:
    """One warm start alone (``train.steps=0``, no evaluation) of ``tools/BENCHMARK`` from
    ``model`` on ``split``; returns its record (command, seconds, losses every 20 steps,
    checkpoint) and its checkpoint folder."""
    overrides = [
        f"model.path={model}",
        f"data.train={split}",
        "warm_start.labels=target",
        # the committed readers were built with the tools described in the system message (the
        # default); the RL recipes now leave it out (faster), but at lr 3e-3 without it the
        # zoom_slots reading loss fell to 0.005 by step 80, then rose to 0.10-0.15 from step 140
        "rollout.tools.describe=true",
        f"warm_start.steps={steps}",
        f"warm_start.lr={lr}",
        f"warm_start.batch_size={args.batch_size}",
        *how,
        "train.steps=0",
        "eval.before=false",
        "eval.after=false",
        f"train.threads={args.threads}",
        f"train.seed={args.seed}",
        f"output_dir={work}",
        f"name={name}",
    ]
    t0 = time.perf_counter()
    if mmrft(["train", f"tools/{args.benchmark}", *overrides]) != 0:
        raise SystemExit(f"the {name} phase failed: see {work / name / 'train.log'}")
    losses = [
        json.loads(line)["loss"]
        for line in (work / name / "warm_start.jsonl").read_text().splitlines()
    ]
    checkpoint = work / name / "checkpoints" / "step-000000"
    shown = checkpoint.relative_to(REPO) if checkpoint.is_relative_to(REPO) else checkpoint
    return {
        "command": f"mmrft train tools/{args.benchmark} " + " ".join(overrides),
        "steps": steps,
        "lr": lr,
        "seconds": round(time.perf_counter() - t0, 1),
        "loss_every_20": [
            round(sum(losses[i : i + 20]) / len(losses[i : i + 20]), 4)
            for i in range(0, len(losses), 20)
        ],
        "checkpoint": str(shown),
    }, checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--benchmark", choices=["zoom_video", "zoom_sites", "zoom_slots"], default="zoom_video"
    )
    parser.add_argument("--out", default=None, help="output model folder")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="pretraining clips folder")
    parser.add_argument("--work", default=None, help="phases' run folders (runs/reader-BENCHMARK)")
    parser.add_argument("--clips", type=int, default=2000, help="pretraining clips or images")
    parser.add_argument("--read-steps", type=int, default=1200, help="steps of reading")
    parser.add_argument("--read-lr", type=float, default=3e-3, help="lr of reading")
    parser.add_argument("--time-steps", type=int, default=0, help="steps of timing (zoom_video)")
    parser.add_argument("--time-lr", type=float, default=1e-3, help="lr of timing")
    parser.add_argument(
        "--call-steps", type=int, default=300, help="steps of random calls (0: a reader only)"
    )
    parser.add_argument("--call-lr", type=float, default=1e-3, help="lr of random calls")
    parser.add_argument("--batch-size", type=int, default=16, help="clips per step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="processes drawing the clips")
    args = parser.parse_args()
    work = Path(args.work or REPO / "runs" / f"reader-{args.benchmark}")
    for name in ("read", "time", "call"):
        shutil.rmtree(work / name, ignore_errors=True)
    if args.time_steps and args.benchmark != "zoom_video":
        parser.error("--time-steps: only zoom_video's questions state a time")
    split = pretraining_split(args.benchmark, args.clips, Path(args.cache), args.workers)
    phases = {}
    phases["read"], checkpoint = phase(
        "read",
        BASE,
        split,
        work,
        args.read_steps,
        args.read_lr,
        args,
        "warm_start.calls=target",
        "warm_start.train_on=answer",
    )
    if args.time_steps:
        phases["time"], checkpoint = phase(
            "time",
            checkpoint,
            timing_split(split, args.seed),
            work,
            args.time_steps,
            args.time_lr,
            args,
            "warm_start.calls=target",
            "warm_start.train_on=calls",
        )
    if args.call_steps:
        phases["call"], checkpoint = phase(
            "call",
            checkpoint,
            split,
            work,
            args.call_steps,
            args.call_lr,
            args,
            "warm_start.calls=random",
            "warm_start.train_on=all",
        )
    out = Path(args.out or REPO / "assets" / "models" / f"reader-{args.benchmark}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(checkpoint, out, ignore=shutil.ignore_patterns("trainer_state.pt"))
    record = {
        "command": "python scripts/make_reader.py " + " ".join(sys.argv[1:]),
        "base": str(BASE.relative_to(REPO)),
        "clips": args.clips,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "cpu": cpu_model(),
        "benchmark": args.benchmark,
        "phases": phases,
    }
    (out / "pretraining.json").write_text(json.dumps(record, indent=1) + "\n")
    seconds = sum(p["seconds"] for p in phases.values())
    print(f"wrote {out} ({seconds:.0f} s of training)")


if __name__ == "__main__":
    main()
