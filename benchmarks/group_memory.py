"""Peak memory against the group size G: micro groups keep it flat.

    python benchmarks/group_memory.py           # G = 8, 16, 32, 64
    python benchmarks/group_memory.py --steps 3

Each G runs ``mmrft train`` in its own process on the bench model (``mmrft make-tiny
--bench``) with the image work of ``benchmarks/vs_trl.py`` (one 224 × 224 prompt per step,
32 new tokens each), and rounds of at most 8 completions everywhere: ``rollout.batch_size=8``
(completions decoded together), ``rollout.micro_group=8`` (completions per packed training
row) and ``train.micro_batch_size=8`` (completions per forward/backward). The advantages
still use the whole group. Printed: peak resident memory (``VmHWM``) and seconds per step for
each G, and the spread of the peaks (max / min − 1; the target is within 10 %). The last line
is JSON: ``{"peak_rss_mb": {"8": …, …}, "spread": s}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from vs_trl import THREADS, make_data, mmrft_overrides, peak_rss_mb  # noqa: E402

ROUND = 8


def worker(group_size: int, steps: int, data: Path) -> None:
    import torch

    torch.set_num_threads(THREADS)
    from vs_trl import bench_reward

    from mmrft.config import load_config
    from mmrft.rewards import Score, verifier
    from mmrft.training import trainer

    @verifier("bench_hash", low=0.0, high=1.0)
    def bench_hash(completions, samples):
        return [Score(bench_reward(c)) for c in completions]

    with tempfile.TemporaryDirectory() as out:
        overrides = mmrft_overrides("image", data, Path(out), steps)
        overrides += [
            f"rollout.group_size={group_size}",
            f"rollout.batch_size={ROUND}",
            f"rollout.micro_group={ROUND}",
            f"train.micro_batch_size={ROUND}",
            "train.prompts_per_step=1",
        ]
        trainer.train(load_config(None, overrides))
        lines = (Path(out) / "run" / "metrics.jsonl").read_text().splitlines()
        steps_s = [json.loads(x)["time/step_s"] for x in lines]
    print("RESULT " + json.dumps({"peak_rss_mb": peak_rss_mb(), "step_s": steps_s}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--groups", default="8,16,32,64")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, Path(args.data))
        return

    from mmrft.models.tiny.base import bench_model

    bench_model(REPO / "assets")
    data = make_data(Path(tempfile.gettempdir()) / "mmrft-bench-data")["image"]
    started, peaks = time.time(), {}
    for group in [int(g) for g in args.groups.split(",")]:
        cmd = [sys.executable, __file__, "--worker", str(group), "--steps", str(args.steps)]
        result = subprocess.run(
            [*cmd, "--data", str(data)], cwd=REPO, capture_output=True, text=True
        )
        lines = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
        if result.returncode != 0 or not lines:
            raise RuntimeError(f"G={group} failed:\n{result.stderr[-4000:]}")
        out = json.loads(lines[-1][len("RESULT ") :])
        peaks[str(group)] = round(out["peak_rss_mb"], 1)
        print(
            f"G = {group:3d}: peak RSS {out['peak_rss_mb']:7.0f} MB, "
            f"{statistics.median(out['step_s'][1:] or out['step_s']):6.2f} s/step",
            flush=True,
        )
    spread = max(peaks.values()) / min(peaks.values()) - 1.0
    print(f"spread of the peaks: {100 * spread:.1f} % ({time.time() - started:.0f} s)")
    print(json.dumps({"peak_rss_mb": peaks, "spread": round(spread, 4)}))


if __name__ == "__main__":
    main()
