"""Build the clip reader: the tiny Qwen2.5-VL pre-trained here to read the colour of a flash in
a clip a ``video_frames`` call fetched, and to write that call anywhere in a video, never where.

    python scripts/make_reader.py                 # assets/models/reader-qwen2_5_vl
    python scripts/make_reader.py --read-steps 40 --call-steps 20 --clips 200 --out /tmp/reader

Why: RL through the tool loop did not teach the tiny model to read the fetched clip in 600 tool
steps (docs/tools.md, zoom_video), while the same model reads such clips after a few hundred
single-turn steps. A real VLM reads what it is shown before anyone runs RL on it; this is that
pre-training, on clips of its own, so that what RL with ``tools/zoom_video`` must teach is the
tool's use: which interval to fetch for the time the question states.

1. **data**: ``--clips`` clips drawn by the ``zoom_video`` generator (scripts/make_benchmarks.py)
   at the pretraining seeds of scripts/make_learner.py, never the benchmark's train or test
   clips (checked: no pretraining video equals a test video), written under ``--cache``;
2. **reading** (``--read-steps``): ``mmrft train tools/zoom_video`` as a warm start alone,
   each sample's trajectory the scripted call on ``meta.zoom_span`` (the 1-s window from the
   stated time), its observation, then the true colour, the loss on the answer turn only
   (``warm_start.train_on=answer``): it learns to read the clip, never to write that call;
3. **calling** (``--call-steps``): the same from (2) with the call moved to a random place of
   the clip (``warm_start.calls=random``, the window's length kept) and the loss on every turn:
   the call's format and answering after its observation (the true colour: read when the window
   holds the flash, a guess when it does not), nothing about where the flash is;
4. **output**: ``--out`` (a ``save_pretrained`` folder) and ``--out/pretraining.json`` (the
   commands, steps, seconds, threads, CPU, each phase's warm-start loss curve).

Fixed seeds (``train.seed``), so the same command on the same CPU and thread count writes the
same weights.
"""

from __future__ import annotations

import argparse
import json
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

DEFAULT_OUT = REPO / "assets" / "models" / "reader-qwen2_5_vl"
DEFAULT_CACHE = REPO / "runs" / "learner-data"
BASE = REPO / "assets" / "models" / "tiny-qwen2_5_vl"


def phase(
    name: str, model: Path, split: Path, work: Path, steps: int, lr: float, args, *how: str
) -> tuple[dict, Path]:
    """One warm start alone (``train.steps=0``, no evaluation) of ``tools/zoom_video`` from
    ``model`` on ``split``; returns its record (command, seconds, losses every 20 steps,
    checkpoint) and its checkpoint folder."""
    overrides = [
        f"model.path={model}",
        f"data.train={split}",
        "warm_start.labels=target",
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
    if mmrft(["train", "tools/zoom_video", *overrides]) != 0:
        raise SystemExit(f"the {name} phase failed: see {work / name / 'train.log'}")
    losses = [
        json.loads(line)["loss"]
        for line in (work / name / "warm_start.jsonl").read_text().splitlines()
    ]
    checkpoint = work / name / "checkpoints" / "step-000000"
    shown = checkpoint.relative_to(REPO) if checkpoint.is_relative_to(REPO) else checkpoint
    return {
        "command": "mmrft train tools/zoom_video " + " ".join(overrides),
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
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output model folder")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="pretraining clips folder")
    parser.add_argument("--work", default=str(REPO / "runs" / "reader"), help="phases' run folders")
    parser.add_argument("--clips", type=int, default=2000, help="pretraining clips")
    parser.add_argument("--read-steps", type=int, default=1200, help="steps of reading")
    parser.add_argument("--read-lr", type=float, default=3e-3, help="lr of reading")
    parser.add_argument("--call-steps", type=int, default=300, help="steps of random calls")
    parser.add_argument("--call-lr", type=float, default=1e-3, help="lr of random calls")
    parser.add_argument("--batch-size", type=int, default=16, help="clips per step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="processes drawing the clips")
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work / "read", ignore_errors=True)
    shutil.rmtree(work / "call", ignore_errors=True)
    split = pretraining_split("zoom_video", args.clips, Path(args.cache), args.workers)
    read, read_checkpoint = phase(
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
    call, call_checkpoint = phase(
        "call",
        read_checkpoint,
        split,
        work,
        args.call_steps,
        args.call_lr,
        args,
        "warm_start.calls=random",
        "warm_start.train_on=all",
    )
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(call_checkpoint, out)
    record = {
        "command": "python scripts/make_reader.py " + " ".join(sys.argv[1:]),
        "base": str(BASE.relative_to(REPO)),
        "clips": args.clips,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "cpu": cpu_model(),
        "phases": {"read": read, "call": call},
    }
    (out / "pretraining.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out} ({read['seconds'] + call['seconds']:.0f} s of training)")


if __name__ == "__main__":
    main()
