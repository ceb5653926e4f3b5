"""On-policy distillation against GRPO on CPU: RL steps and seconds to the teacher's level.

    python benchmarks/distill.py                      # the demo task, seeds 0-2, into runs/distill/
    python benchmarks/distill.py --seeds 1 --distill-steps 100
    python benchmarks/distill.py --task grid_walk     # where GRPO alone stays at random: runs/distill-grid_walk/

``--task demo`` (colour classification, one answer token):

1. **teacher**: ``mmrft train demo`` at ``--teacher-seed`` (the recipe ``make demo`` runs: the
   tiny Qwen2.5-VL, a format-only warm start, 600 GRPO steps), its final checkpoint; its
   held-out accuracy ``T`` after RL must be ≥ 0.95, else the script stops.
2. **students**, at each seed S (``train.seed``): the same tiny model and the same format-only
   warm start (random labels: before RL at chance), then
   - ``grpo``: the demo recipe as it is (format + accuracy rewards, KL β = 0.04 to the warm
     start, 600 steps);
   - ``distill-sampled`` and ``distill-full``: pure on-policy distillation from the teacher
     (``teacher.path``, ``algorithm.reward_coef=0``: the verifiers score and log but do not
     enter the loss; β = 0, the teacher is the anchor), ``--distill-steps`` steps, with the
     per-token estimate in the advantage (``algorithm.distill_loss=sampled``) and with the
     exact KL over the whole distribution (``full``);
   both with the held-out evaluation every ``--eval-every`` steps.

``--task grid_walk`` (the ``grid_walk`` environment, ``configs/tools/grid_walk.yaml``: up to
three moves, one call per turn, the grid's image after every move):

1. **teacher**: the recipe's model with a *supervised* warm start on shortest walks
   (``benchmarks/grid_walk_teacher.py``'s ``grid_walk_shortest``, 300 steps, no RL): the way,
   which no RL recipe's warm start may show; its held-out episode reward ``T`` must be ≥ 0.95.
2. **students** from the recipe's format-only warm start (a random walk: before RL near the
   random policy's 0.163, ``benchmarks/grid_walk_random.py``):
   - ``grpo``: the recipe as it is (the environment's reward), ``--grpo-steps`` steps;
   - ``distill-full``: pure distillation, exact KL (as above), at lr 3e-3 (the recipe's 1e-3
     left it at 0.20 after 75 steps, seed 0);
   - ``distill-full+reward``: the exact KL and the environment's reward in one loss
     (``algorithm.reward_coef=1``, ``distill_coef=1``).

3. For each run: the first evaluated step whose held-out metric (accuracy; the episode reward
   on ``grid_walk``) is within 0.05 of ``T``, the RL seconds to it (the sum of ``time/step_s`` up
   to that step: rollouts, verifiers, teacher and updates, the evaluations left out) and the
   metric after RL (on ``grid_walk`` also the success rate, episodes that reached the goal).
   Written to ``--out/distill.md`` (with the CPU, threads, commit and command),
   ``--out/distill.json`` and ``--out/distill.png`` (held-out metric against RL step, every run).

The claim it checks (docs/algorithms.md): distillation reaches the teacher's level within 0.05
in fewer RL steps and less RL time than GRPO alone, at every seed (exit 0 when one of the
distillation methods does).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from learning import commit, eval_curve  # noqa: E402  (benchmarks/ is not a package)

WITHIN = 0.05

DISTILL = ["algorithm.beta=0"]  # the teacher is the anchor: no KL to the warm start
TASKS: dict[str, dict[str, Any]] = {
    "demo": {
        "recipe": "demo",
        "out": "distill",
        "teacher_made": "the demo recipe",
        "metric": "eval/classification/accuracy",
        "success": None,
        "chance": ("chance", 0.25),
        "teacher": [],  # the recipe itself, RL included
        "methods": {
            "grpo": [],
            "distill-sampled": [
                *DISTILL,
                "algorithm.reward_coef=0",
                "algorithm.distill_loss=sampled",
            ],
            "distill-full": [*DISTILL, "algorithm.reward_coef=0", "algorithm.distill_loss=full"],
        },
        "grpo_steps": None,  # the recipe's 600
    },
    "grid_walk": {
        "recipe": "tools/grid_walk",
        "out": "distill-grid_walk",
        "teacher_made": "a shortest-walk warm start (no RL)",
        "metric": "eval/prompt/reward",
        "success": "eval/prompt/tools/stop/env_done",
        "chance": ("random moves", 0.163),  # benchmarks/grid_walk_random.py, the test split
        "teacher": [
            f"plugins=[{REPO / 'benchmarks' / 'grid_walk_teacher.py'}]",
            "rollout.tools.environment=grid_walk_shortest",
            "warm_start.steps=300",
            "warm_start.labels=target",
            "train.steps=0",
        ],
        "methods": {
            "grpo": [],
            "distill-full": [
                *DISTILL,
                "algorithm.reward_coef=0",
                "algorithm.distill_loss=full",
                "optim.lr=3e-3",  # at the recipe's 1e-3: 0.20 after 75 steps (seed 0)
            ],
            "distill-full+reward": [
                *DISTILL,
                "algorithm.reward_coef=1",
                "algorithm.distill_coef=1",
                "algorithm.distill_loss=full",
            ],
        },
        "grpo_steps": 600,
    },
}
"""Per task: the recipe, the held-out metric (and the success rate where there is one), the
level of a policy that does not look, how the teacher is made from the recipe, the students'
overrides."""


def train_recipe(recipe: str, out: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """``mmrft train <recipe>`` in this process into ``out/name``; returns its summary."""
    from mmrft.config import load_config
    from mmrft.training.trainer import train

    cfg = load_config(recipe, [f"output_dir={out}", f"name={name}", *overrides])
    return train(cfg, verbose=False)


def train_in_child(recipe: str, out: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """:func:`train_recipe` in a process of its own (``--jobs``): its output in
    ``out/name.log``, its summary read from ``out/name/summary.json``."""
    code = "import sys; from mmrft.cli import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, "train", recipe, f"output_dir={out}", f"name={name}"]
    with open(out / f"{name}.log", "w") as log:
        done = subprocess.run([*command, *overrides], stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"run {name} failed (exit {done.returncode}); its log: {out / name}.log")
    return json.loads((out / name / "summary.json").read_text())


def curve(run_dir: Path, metric: str) -> tuple[list[tuple[int, float]], dict[int, float]]:
    """``([(step, held-out metric)], {step: seconds of that RL step})`` of a run."""
    from mmrft.evaluation.report import read_history

    seconds = {h["step"]: h["time/step_s"] for h in read_history(run_dir) if "time/step_s" in h}
    return list(zip(*eval_curve(run_dir, metric))), seconds


def reached(run_dir: Path, goal: float, metric: str, success: str | None) -> dict[str, Any]:
    """The first evaluated step at ``metric`` ≥ ``goal`` and the RL seconds to it (None if
    never), the metric before and after RL (and the success rate there), and the curve."""
    evals, seconds = curve(run_dir, metric)
    step = next((s for s, v in evals if v >= goal), None)
    successes = eval_curve(run_dir, success)[1] if success else []
    return {
        "step": step,
        "seconds": None
        if step is None
        else round(float(sum(t for s, t in seconds.items() if s <= step)), 1),
        "before": evals[0][1] if evals else None,
        "after": evals[-1][1] if evals else None,
        "success_before": successes[0] if successes else None,
        "success_after": successes[-1] if successes else None,
        "curve": evals,
        "rl_seconds": round(sum(seconds.values()), 1),
    }


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "never"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(task: str, teacher: dict[str, Any], rows: list[dict[str, Any]], goal: float) -> str:
    spec = TASKS[task]
    lines = [
        f"Teacher: {spec['teacher_made']} at seed {teacher['seed']}, held-out {spec['metric']} "
        f"{teacher['after']:.3f}; goal: ≥ {goal:.3f} (within {WITHIN} of the teacher); "
        f"{spec['chance'][0]}: {spec['chance'][1]}.",
        "",
        "| seed | method | RL steps | before RL | after RL | success before / after | first step at the goal | RL seconds to it | RL seconds in all |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        success = (
            f"{fmt(r['success_before'])} / {fmt(r['success_after'])}"
            if r.get("success_after") is not None
            else "–"
        )
        lines.append(
            f"| {r['seed']} | {r['method']} | {r['steps']} | {fmt(r['before'])} | {fmt(r['after'])} | "
            f"{success} | {fmt(r['step'])} | {fmt(r['seconds'], 1)} | {r['rl_seconds']:.1f} |"
        )
    return "\n".join(lines)


def plot(task: str, rows: list[dict[str, Any]], teacher: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    colours = dict(zip(TASKS[task]["methods"], palette))
    for r in rows:
        steps, values = zip(*r["curve"]) if r["curve"] else ((), ())
        label = f"{r['method']}" if r["seed"] == rows[0]["seed"] else None
        ax.plot(steps, values, color=colours[r["method"]], alpha=0.8, label=label)
    ax.axhline(teacher, color="black", linestyle="--", label=f"teacher {teacher:.3f}")
    name, level = TASKS[task]["chance"]
    ax.axhline(level, color="grey", linestyle=":", label=f"{name} {level}")
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"held-out {TASKS[task]['metric'].rsplit('/', 1)[-1]}")
    ax.set_title(f"{task}: on-policy distillation vs GRPO (one line per seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from mmrft.evaluation.runlog import cpu_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="demo")
    parser.add_argument(
        "--out", default=None, help="default runs/distill (demo), runs/distill-<task>"
    )
    parser.add_argument("--seeds", type=int, default=3, help="student seeds 0 … N−1")
    parser.add_argument("--teacher-seed", type=int, default=0)
    parser.add_argument("--distill-steps", type=int, default=300)
    parser.add_argument(
        "--grpo-steps", type=int, default=None, help="GRPO's steps (default: the task's)"
    )
    parser.add_argument(
        "--methods", default="", help="comma-separated subset of the task's methods (default all)"
    )
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="students trained at a time, each in a process of its own (pass train.threads=1 "
        "on 2 cores; the thread count, not --jobs, sets the figures)",
    )
    parser.add_argument(
        "--min-teacher", type=float, default=0.95, help="the teacher's least held-out level"
    )
    parser.add_argument(
        "overrides", nargs="*", help="key=value for every run, e.g. train.threads=1"
    )
    args = parser.parse_args(argv)
    spec = TASKS[args.task]
    chosen = args.methods.split(",") if args.methods else list(spec["methods"])
    if set(chosen) - set(spec["methods"]):  # before the teacher trains
        parser.error(f"--methods: {args.task} has {', '.join(spec['methods'])}")
    out = Path(args.out or REPO / "runs" / spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    teacher_name = f"teacher-s{args.teacher_seed}"
    summary = train_recipe(
        spec["recipe"],
        out,
        teacher_name,
        [f"train.seed={args.teacher_seed}", *spec["teacher"], *args.overrides],
    )
    teacher_after = summary["after"]
    checkpoints = sorted((out / teacher_name / "checkpoints").glob("step-*"))
    teacher = {"seed": args.teacher_seed, "after": teacher_after, "path": str(checkpoints[-1])}
    print(f"teacher: {teacher}", flush=True)
    if teacher_after < args.min_teacher:
        print(
            f"the teacher reached {teacher_after:.3f} < {args.min_teacher}; no comparison",
            file=sys.stderr,
        )
        return 1
    goal = teacher_after - WITHIN
    every = f"eval.every={args.eval_every}"
    grpo_steps = args.grpo_steps or spec["grpo_steps"]
    grpo = [f"train.steps={grpo_steps}"] if grpo_steps else []  # else the recipe's
    distill = [f"teacher.path={teacher['path']}", f"train.steps={args.distill_steps}"]
    methods = {
        method: [every, *extra, *(grpo if method == "grpo" else distill)]
        for method, extra in spec["methods"].items()
        if method in chosen
    }
    runs = [(seed, method) for seed in range(args.seeds) for method in methods]

    def student(seed: int, method: str) -> dict[str, Any]:
        name = f"{method}-s{seed}"
        train_one = train_in_child if args.jobs > 1 else train_recipe
        run = train_one(
            spec["recipe"], out, name, [f"train.seed={seed}", *methods[method], *args.overrides]
        )
        row = {
            "seed": seed,
            "method": method,
            "steps": run["steps"],
            **reached(out / name, goal, spec["metric"], spec["success"]),
        }
        print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
        return row

    if args.jobs > 1:  # the children train; these threads wait on them
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(lambda run: student(*run), runs))  # in the order of runs
    else:  # in this process's main thread (the trainer's signal handlers need it)
        rows = [student(*run) for run in runs]

    header = (
        f"`python benchmarks/distill.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
        f"at commit {commit()}, {cpu_model()}, {time.perf_counter() - t0:.0f} s in all"
    )
    text = table(args.task, teacher, rows, goal)
    (out / "distill.md").write_text(f"{header}\n\n{text}\n")
    (out / "distill.json").write_text(
        json.dumps(
            {"task": args.task, "teacher": teacher, "goal": goal, "rows": rows, "header": header},
            indent=1,
        )
        + "\n"
    )
    plot(args.task, rows, teacher_after, out / "distill.png")
    print(header)
    print(text)
    by = {(r["seed"], r["method"]): r for r in rows}
    verdicts = {}
    for method in (m for m in methods if m != "grpo"):
        verdicts[method] = all(
            by[s, method]["step"] is not None
            and (
                by[s, "grpo"]["step"] is None
                or (
                    by[s, method]["step"] < by[s, "grpo"]["step"]
                    and by[s, method]["seconds"] < by[s, "grpo"]["seconds"]
                )
            )
            for s in range(args.seeds)
        )
        print(
            f"{method} reached the goal in fewer steps and seconds than GRPO at every seed: {verdicts[method]}"
        )
    return 0 if any(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
