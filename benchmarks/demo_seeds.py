"""The demo at many seeds: does ``make demo``'s recipe learn every colour at every seed?

    python benchmarks/demo_seeds.py --seeds 10-19             # train.seed 10 … 19, one at a time
    python benchmarks/demo_seeds.py --seeds 0-4 --jobs 2 train.threads=1

Each seed is ``mmrft train demo train.seed=S`` (``configs/demo.yaml``, the recipe ``make demo``
runs at seed 0) in a process of its own, writing ``--out/seed-S/``. From each run's held-out
predictions after RL (``eval/after/predictions.jsonl``) the script takes the accuracy over the
200 test images and per true colour, and writes ``--out/demo_seeds.md`` (one row per seed:
after RL, each colour, the worst colour, RL seconds; a header naming the CPU, threads, commit,
other load and the command) and ``--out/demo_seeds.json``. It passes (exit 0) when every seed
ends with accuracy ≥ ``--min-after`` (0.95) and every colour ≥ ``--min-colour`` (0.9): the
check of ``tests/test_demo_learns.py``, whose failure it guards against is a colour never
learnt while the mean still looks like learning.

``--jobs N`` runs N seeds at a time; each keeps ``train.threads`` (the demo's 2 unless
overridden), so the figures are those of ``--jobs 1`` (the thread count sets the order of a
float reduction; the CPU model too, hence the header).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

from learning import BESIDE, OtherLoad, commit

REPO = Path(__file__).resolve().parents[1]


def per_answer_accuracy(run_dir: Path, test_file: Path) -> dict[str, float]:
    """Held-out accuracy after RL for each true answer (the test file's ``target``), from the
    run's ``eval/after/predictions.jsonl``."""
    truth = {}
    for line in test_file.read_text().splitlines():
        row = json.loads(line)
        truth[row["id"]] = row["target"]
    right: dict[str, list[float]] = defaultdict(list)
    for line in (run_dir / "eval" / "after" / "predictions.jsonl").read_text().splitlines():
        prediction = json.loads(line)
        right[truth[prediction["id"]]].append(prediction["accuracy"])
    return {answer: sum(v) / len(v) for answer, v in sorted(right.items())}


def seed_range(text: str) -> list[int]:
    """``"10-19"`` → 10 … 19; ``"3"`` → [3]; ``"0,3,5"`` → [0, 3, 5]."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


def run_seed(seed: int, out: Path, overrides: list[str], test_file: Path) -> dict:
    """``mmrft train demo`` at ``seed`` in a child process; its summary.json and per-colour
    accuracy. The child's output goes to ``--out/seed-S.log``."""
    name = f"seed-{seed}"
    command = [sys.executable, "-m", "mmrft.cli", "train", "demo", *overrides]
    command += [f"train.seed={seed}", f"output_dir={out}", f"name={name}"]
    with open(out / f"{name}.log", "w") as log:
        done = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"seed {seed} failed (exit {done.returncode}); its log: {log.name}")
    summary = json.loads((out / name / "summary.json").read_text())
    return {"seed": seed, **summary, "colours": per_answer_accuracy(out / name, test_file)}


def table(rows: list[dict], min_after: float, min_colour: float) -> str:
    colours = sorted({c for r in rows for c in r["colours"]})
    lines = [
        "| seed | after RL | " + " | ".join(colours) + " | worst colour | held | RL seconds |",
        "|---" * (len(colours) + 5) + "|",
    ]
    for r in rows:
        worst = min(r["colours"], key=r["colours"].get)
        held = r["after"] >= min_after and r["colours"][worst] >= min_colour
        cells = " | ".join(f"{r['colours'].get(c, float('nan')):.2f}" for c in colours)
        lines.append(
            f"| {r['seed']} | {r['after']:.3f} | {cells} | {worst} {r['colours'][worst]:.2f} | "
            f"{'yes' if held else '**no**'} | {r['train_seconds']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from mmrft.config import load_config
    from mmrft.evaluation.runlog import cpu_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="10-19", help="e.g. 10-19, or 0,3,5 (default 10-19)")
    parser.add_argument("--out", default=str(REPO / "runs" / "demo_seeds"), help="output folder")
    parser.add_argument("--jobs", type=int, default=1, help="seeds at a time (default 1)")
    parser.add_argument("--min-after", type=float, default=0.95)
    parser.add_argument("--min-colour", type=float, default=0.9)
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every seed")
    args = parser.parse_args(argv)
    seeds = seed_range(args.seeds)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config("demo", args.overrides)  # a typo fails here, at once
    threads, test_file = cfg.train.threads, Path(cfg.data.test)
    load, started = OtherLoad(), time.perf_counter()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda s: run_seed(s, out, args.overrides, test_file), seeds))
    other = load.cores()
    shared = "other load unknown" if other is None else f"other load {other:.2f} cores"
    if other is not None and other > BESIDE:
        shared += " (measured beside other jobs: RL seconds say nothing about speed)"
    header = (
        f"Measured {date.today().isoformat()} on {cpu_model()} ({platform.machine()}), "
        f"{threads} thread(s) per run, {args.jobs} run(s) at a time, {shared}, commit "
        f"{commit()}, {time.perf_counter() - started:.0f} s in all; command: "
        f"`{' '.join(['python benchmarks/demo_seeds.py', *sys.argv[1:]])}`"
    )
    text = table(rows, args.min_after, args.min_colour)
    (out / "demo_seeds.md").write_text(header + "\n\n" + text + "\n")
    (out / "demo_seeds.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(header + "\n\n" + text)
    held = all(
        r["after"] >= args.min_after and min(r["colours"].values()) >= args.min_colour for r in rows
    )
    print(f"every seed held: {'yes' if held else 'no'} (wrote {out / 'demo_seeds.md'})")
    return 0 if held else 1


if __name__ == "__main__":
    raise SystemExit(main())
