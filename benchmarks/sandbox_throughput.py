"""Throughput of rendering model-written matplotlib code: naive subprocess vs SandboxPool.

Times a GRPO group of 8 chart renders (different code per completion) three ways on this
machine and prints the wall times and ratios; no asserts:

* naive: ``subprocess.run([python, "-c", code])`` one after another (no isolation at all);
* pool, cold: ``SandboxPool(preload=("matplotlib.pyplot",))`` created, servers started and
  the 8 jobs run, i.e. what the first reward call of a run pays;
* pool, warm: the same pool scoring the next group (every later reward call);

and the sandbox's own cost per job (an empty program), with and without the private root.

Usage: ``python benchmarks/sandbox_throughput.py [--group 8] [--workers N] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from mmrft.rewards.sandbox import SandboxJob, SandboxPool

CHART = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
x = np.linspace(0, 10, 200)
fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3), dpi=80)
a.plot(x, np.sin(x + {k}), label="sin")
a.plot(x, np.cos(x * {k}), "--", label="cos")
a.legend(); a.set_title("completion {k}"); a.grid(True)
b.bar(["q1", "q2", "q3", "q4"], [3, 1 + {k}, 4, 2], color=["C0", "C1", "C2", "C3"])
b.set_ylabel("value")
fig.tight_layout()
fig.savefig("{out}")
"""


def naive(group: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        for k in range(group):
            code = CHART.format(k=k, out=os.path.join(tmp, f"{k}.png"))
            subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp)
        return time.perf_counter() - start


def jobs(group: int) -> list[SandboxJob]:
    return [
        SandboxJob(CHART.format(k=k, out="chart.png"), outputs=("chart.png",), timeout_s=30)
        for k in range(group)
    ]


def pooled(group: int, workers: int | None, repeat: int) -> tuple[float, list[float], dict]:
    start = time.perf_counter()
    with SandboxPool(workers, preload=("matplotlib.pyplot",)) as pool:
        results = pool.map(jobs(group))
        cold = time.perf_counter() - start
        failed = [r.reason for r in results if not r.ok]
        if failed:
            raise SystemExit(f"renders failed: {failed}\n{results[0].stderr}")
        warm = []
        for _ in range(repeat):
            start = time.perf_counter()
            results = pool.map(jobs(group))
            warm.append(time.perf_counter() - start)
            assert all(r.ok for r in results)
        return cold, warm, {"workers": pool.workers, "isolation": results[0].isolation}


def overhead(disable: tuple[str, ...], n: int = 20) -> float:
    """Median wall time of an empty job on a warm one-worker pool: the sandbox's own cost (three
    forks, namespaces, the private root's mounts, Landlock, the result's trip back)."""
    with SandboxPool(1) as pool:
        pool.run("pass")
        times = []
        for _ in range(n):
            start = time.perf_counter()
            result = pool.run(SandboxJob("pass", disable=disable))
            times.append(time.perf_counter() - start)
            assert result.ok, result.reason
        return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    naive_s = [naive(args.group) for _ in range(args.repeat)]
    cold, warm, info = pooled(args.group, args.workers, args.repeat)
    n, w = statistics.median(naive_s), statistics.median(warm)
    iso = info["isolation"]
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print(f"group of {args.group} matplotlib renders, median of {args.repeat}")
    print(f"  naive subprocess.run, sequential : {n:6.2f} s  ({n / args.group:.3f} s/render)")
    print(f"  SandboxPool({info['workers']}) cold (incl. start) : {cold:6.2f} s")
    print(
        f"  SandboxPool({info['workers']}) warm               : {w:6.2f} s  ({w / args.group:.3f} s/render)"
    )
    print(f"  speed-up warm: {n / w:.1f}x   cold: {n / cold:.1f}x")
    print(
        f"  sandbox isolation: namespaces={iso['namespaces']} writes={iso['writes']} landlock_abi={iso['landlock_abi']}"
    )
    print(f"  reads: {iso.get('reads')}")
    full, no_root = overhead(()), overhead(("mountns",))
    print(
        f"  empty job, warm: {1000 * full:.0f} ms ({1000 * no_root:.0f} ms without the private root)"
    )


if __name__ == "__main__":
    main()
