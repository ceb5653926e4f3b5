"""Synchronous vs asynchronous rollouts on the CPU demo, side by side in one run.

    python benchmarks/async.py                       # 300 steps (the demo's), seed 0
    python benchmarks/async.py --steps 100 --seeds 2
    python benchmarks/async.py --quick               # 40 steps, timing only (no learning claim)

Each variant is ``mmrft train demo`` with the same data, model and seed, and one change:

* ``sync``: ``rollout.max_staleness=0`` (generate, then update);
* ``k=1``: one step off (``rollout.max_staleness=1``): the rollout thread samples step t + 1
  while the trainer updates step t;
* ``k=2``: ``rollout.max_staleness=2``;
* ``k=1 partial``: ``k=1`` with ``rollout.partial_rollouts=true``;

all with ``algorithm.tis_cap=2`` (the correction the asynchronous runs need; the synchronous run
gets it too, where it only absorbs the engine's rounding, so the loss is the same in all).
``--threads`` sets ``train.threads`` (torch's intra-op threads, which each of the two Python
threads of an asynchronous run uses): the default 1 gives each side one of this machine's two
cores; the demo's own setting is 2.

Printed per variant (mean over seeds): RL seconds (the loop's wall time, ``train_seconds``, with
the final evaluation but no intermediate one), steps per second and its ratio to ``sync``, the
share of the loop each side idles (trainer: waiting for its batch, ``time/wait_s``, or in a
synchronous run the rollout and verifier time; rollout side: waiting at the gate,
``time/rollout_idle_s``, or in a synchronous run the update time), the mean lag of the trained
tokens, and the held-out accuracy after RL at equal steps (min and max over seeds). The last
line is JSON with the same figures.

Caveat: on 2 CPU cores both sides compete for the same cores, so the overlap can only hide the
idle share of the other side; with generation and training on separate devices (a served
engine, several GPUs) the hidden share is the whole of the shorter side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VARIANTS = {
    "sync": ["rollout.max_staleness=0"],
    "k=1": ["rollout.max_staleness=1"],
    "k=2": ["rollout.max_staleness=2"],
    "k=1 partial": ["rollout.max_staleness=1", "rollout.partial_rollouts=true"],
}


def run_variant(name: str, seed: int, steps: int, threads: int, out: Path) -> dict[str, float]:
    """One ``mmrft train demo`` run; its summary and the sums of its per-step timings."""
    run_name = f"{name.replace('=', '').replace(' ', '-')}-s{seed}"
    overrides = [
        f"output_dir={out}",
        f"name={run_name}",
        f"train.steps={steps}",
        f"train.seed={seed}",
        f"train.threads={threads}",
        "algorithm.tis_cap=2",
        "eval.every=0",
        "eval.before=false",
        "checkpoint.every=0",
        *VARIANTS[name],
    ]
    cmd = [sys.executable, "-m", "mmrft.cli", "train", "demo", *overrides]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run_dir = out / run_name
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    rows = [r for r in rows if "time/step_s" in r]

    def total(key: str) -> float:
        return sum(r.get(key, 0.0) for r in rows)

    seconds = summary["train_seconds"]
    if name == "sync":
        trainer_idle = total("time/rollout_s") + total("time/reward_s")
        rollout_idle = total("time/update_s")
    else:
        trainer_idle = total("time/wait_s")
        rollout_idle = total("time/rollout_idle_s")
    lags = [r["rollout/lag_mean"] for r in rows if "rollout/lag_mean" in r]
    return {
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "trainer_idle": trainer_idle / seconds,
        "rollout_idle": rollout_idle / seconds,
        "lag_mean": statistics.mean(lags) if lags else 0.0,
        "stale_dropped": total("rollout/stale_dropped"),
        "accuracy": float(summary["after"]),
    }


def main() -> None:
    from mmrft.evaluation.runlog import cpu_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="40 steps, one seed: timing only")
    parser.add_argument("--only", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    steps, seeds = (40, 1) if args.quick else (args.steps, args.seeds)
    out = args.out or Path(tempfile.mkdtemp(prefix="mmrft-async-"))
    print(f"{cpu_model()}; train.threads={args.threads}; {steps} steps; seeds 0-{seeds - 1}")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in args.only}
    for seed in range(seeds):
        for name in args.only:  # interleaved, so a slow spell of the machine hits every variant
            results[name].append(run_variant(name, seed, steps, args.threads, out))
    base = (
        statistics.mean(r["steps_per_s"] for r in results.get("sync", []))
        if "sync" in results
        else None
    )
    print(
        f"{'variant':<12} {'RL s':>7} {'steps/s':>8} {'ratio':>6} {'trainer idle':>13} "
        f"{'rollout idle':>13} {'lag':>5} {'accuracy [min, max]':>20}"
    )
    table = {}
    for name, runs in results.items():
        mean = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
        accuracy = [r["accuracy"] for r in runs]
        mean["accuracy_min"], mean["accuracy_max"] = min(accuracy), max(accuracy)
        mean["speed_ratio"] = mean["steps_per_s"] / base if base else float("nan")
        table[name] = {k: round(v, 4) for k, v in mean.items()}
        print(
            f"{name:<12} {mean['seconds']:>7.1f} {mean['steps_per_s']:>8.3f} "
            f"{mean['speed_ratio']:>6.2f} {mean['trainer_idle']:>13.0%} {mean['rollout_idle']:>13.0%} "
            f"{mean['lag_mean']:>5.2f} {mean['accuracy']:>8.3f} [{min(accuracy):.3f}, {max(accuracy):.3f}]"
        )
    print(json.dumps(table))


if __name__ == "__main__":
    main()
