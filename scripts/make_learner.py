"""Build the learner: a small Qwen3-VL pre-trained here on the bundled generators' data.

    python scripts/make_learner.py                          # assets/models/learner-qwen3_vl
    python scripts/make_learner.py --steps 300 --out /tmp/learner --only shapes_grounding

The tiny models (0.2 M parameters, 4–16 visual tokens) cannot learn boxes, chart values or clip
events at all: their supervised ceilings on those tasks are at chance (docs/learning.md). The
learner is the tiny Qwen3-VL's architecture made wider and deeper (``size="learner"`` in
:mod:`mmrft.models.tiny.qwen3`: about 1.6 M parameters), then pre-trained, as a real VLM is
before anyone runs RL on it:

1. **data**: a *pretraining* split of each benchmark in :data:`MIXTURE` (so far grounding and
   detection) or each that ``--only`` names (any benchmark with a learning recipe; outside
   :data:`MIXTURE` with ``--samples``), drawn by the bundled generators
   (scripts/make_benchmarks.py) at seeds of its own (chunk ``c`` of benchmark ``i`` at
   ``[PRETRAIN_SEED, i, c]``), never the benchmarks' train or test splits (checked: no
   pretraining image equals a test image), written under ``--cache`` once by ``--workers``
   processes;
2. **form** (``--form``): ``task`` (the default) trains on each task's own prompt (template,
   instructions, the family's box instruction) answered ``<answer>reference</answer>``, as the
   instruction-tuned checkpoints RL papers start from, so the learner's RL recipes need no
   format warm start and "before RL" is the pretrained model's level; ``bare`` trains on the
   bare question ("the green cross") answered by the bare reference (``{"bbox_2d": [...]}``),
   leaving the prompt and the answer format to a warm start (measured: a random-label warm
   start then wipes the skill, docs/learning.md);
3. **training**: supervised next-token loss on the answer tokens; each step one benchmark's
   batch (round robin over :data:`MIXTURE`), each benchmark at its learning recipe's media budget
   (configs/learn/NAME.yaml); AdamW, linear warm-up then cosine decay; fixed seeds, so the same
   command on the same CPU and thread count writes the same weights;
4. **output**: ``--out`` (a ``save_pretrained`` folder) and ``--out/pretraining.json`` (the
   command, steps, seconds, threads, CPU, the loss curve per benchmark; with ``--init``, the
   record of the learner it continued under ``init``).

The committed learner is three runs, each continuing the last (docs/learning.md has their
curves and times, about 100 + 52 + 38 minutes on 2 cores)::

    python scripts/make_learner.py --out runs/stage1
    python scripts/make_learner.py --init runs/stage1 --only shapes_grounding --steps 6000 \
        --lr 3e-4 --eval-every 1000 --out runs/stage2
    python scripts/make_learner.py --init runs/stage2 --only shapes_grounding --samples 80000 \
        --steps 6000 --lr 2e-4 --eval-every 1000

The charts learner (assets/models/learner-qwen3_vl-charts, the ``charts`` recipe's model)
continues the committed learner on fresh charts only (12 minutes to draw them with 2 workers,
then about 50 minutes of training on 2 cores)::

    python scripts/make_learner.py --init assets/models/learner-qwen3_vl --only charts \
        --samples 24000 --steps 6000 --lr 5e-4 --eval-every 1000 \
        --out assets/models/learner-qwen3_vl-charts

then stored in bfloat16 to keep the committed assets within 60 MB (tests/test_assets_budget.py;
held-out accuracy unchanged): ``AutoModelForImageTextToText.from_pretrained(OUT)
.to(torch.bfloat16).save_pretrained(OUT)``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mmrft.config import load_config  # noqa: E402
from mmrft.evaluation.runlog import cpu_model  # noqa: E402
from mmrft.models.tiny.base import build_tiny, save_checkpoint  # noqa: E402
from mmrft.policy.model import Policy, completion_logps  # noqa: E402
from mmrft.rollout.base import Sampling  # noqa: E402
from mmrft.rollout.hf import HFEngine  # noqa: E402
from mmrft.rollout.preflight import preflight  # noqa: E402
from mmrft.rollout.setup import read_data  # noqa: E402
from mmrft.runtime.device import seed_everything  # noqa: E402
from mmrft.training.warm_start import answer_completion  # noqa: E402

PRETRAIN_SEED = 7001
# benchmark → samples in its pretraining split (each benchmark's learning recipe,
# configs/learn/NAME.yaml, gives the task and the media budget)
MIXTURE = {"shapes_grounding": 40000, "shapes_detection": 20000}
DEFAULT_OUT = REPO / "assets" / "models" / "learner-qwen3_vl"
DEFAULT_CACHE = REPO / "runs" / "learner-data"


def generators():
    """scripts/make_benchmarks.py, imported once from its file (scripts/ is not a package)."""
    if "make_benchmarks" in sys.modules:
        return sys.modules["make_benchmarks"]
    spec = importlib.util.spec_from_file_location(
        "make_benchmarks", REPO / "scripts" / "make_benchmarks.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_benchmarks"] = module
    spec.loader.exec_module(module)
    return module


CHUNK = (
    1000  # samples per generator call: chunk c of a benchmark draws at [PRETRAIN_SEED, index, c]
)


def write_chunk(job: tuple[str, Path, int, int]) -> None:
    """Chunk ``c`` of ``name``'s pretraining split: ``n`` samples into ``folder`` as split
    ``pretrain<c>`` (a worker process's job)."""
    name, folder, c, n = job
    make = generators()
    index = list(make.BENCHMARKS).index(name)
    rng = np.random.default_rng([PRETRAIN_SEED, index, c])
    make.BENCHMARKS[name].write(folder, f"pretrain{c:03d}", n, rng)


def pretraining_split(name: str, n: int, cache: Path, workers: int = 1) -> Path:
    """``cache/name/pretrain.jsonl``: ``n`` samples drawn by ``name``'s generator in chunks of
    :data:`CHUNK` (chunk ``c`` at ``[PRETRAIN_SEED, index of name, c]``, so the split does not
    depend on ``workers``, the processes that draw them); written once, kept while ``n`` and
    the generator are unchanged (the stamp holds ``n`` and the digest of the bundled
    ``test.jsonl``, which the generator writes again whenever its output changes)."""
    import multiprocessing

    folder = cache / name
    stamp = folder / "pretrain.n"
    test = REPO / "assets" / "benchmarks" / name / "test.jsonl"
    key = f"{n} {hashlib.sha256(test.read_bytes()).hexdigest()[:16]}"
    if stamp.is_file() and stamp.read_text() == key:
        return folder / "pretrain.jsonl"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    jobs = [(name, folder, c, min(CHUNK, n - c * CHUNK)) for c in range(math.ceil(n / CHUNK))]
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            pool.map(write_chunk, jobs)
    else:
        for job in jobs:
            write_chunk(job)
    with open(folder / "pretrain.jsonl", "w") as out:
        for _, _, c, _ in jobs:
            chunk = folder / f"pretrain{c:03d}.jsonl"
            out.write(chunk.read_text())
            chunk.unlink()
    check_disjoint(folder, REPO / "assets" / "benchmarks" / name)
    stamp.write_text(key)
    return folder / "pretrain.jsonl"


def check_disjoint(pretrain: Path, benchmark: Path) -> None:
    """Refuse a pretraining split that holds any of the benchmark's test media (same bytes)."""

    def digests(folder: Path, prefix: str) -> set[bytes]:
        return {
            hashlib.sha256(p.read_bytes()).digest()
            for p in folder.rglob(f"{prefix}*")
            if p.is_file()
        }

    shared = digests(pretrain, "pretrain") & digests(benchmark, "test")
    if shared:
        raise SystemExit(
            f"{pretrain}: {len(shared)} pretraining media equal test media of {benchmark}"
        )


FORMS = ("task", "bare")


@dataclass
class Benchmark:
    """One benchmark of the mixture as its learning recipe reads it with the learner."""

    train: list  # the pretraining split's samples
    test: list  # the benchmark's test split (evaluated, never trained on)
    family: Any
    task: Any
    max_new_tokens: int  # the recipe's evaluation budget


def load_benchmark(name: str, split: Path, model: Path, held_out: int | None = None) -> Benchmark:
    """The pretraining split and the benchmark's test split read by ``name``'s learning recipe
    (configs/learn/NAME.yaml: its task, model family, media and token budgets) with the learner
    at ``model``; ``held_out``: only the test split's first N samples (a quick check)."""
    overrides = [f"model.path={model}", f"data.train={split}"]
    if held_out is not None:
        overrides.append(f"data.max_test_samples={held_out}")
    cfg = load_config(f"learn/{name}", overrides)
    task, family = preflight(cfg)
    train, test = read_data(cfg, task, family)
    budget = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    return Benchmark(train, test, family, task, budget)


def training_pair(sample, bench: Benchmark, form: str) -> tuple[list[dict], str]:
    """``(conversation, answer text)`` of one sample in ``form`` (see the module docstring)."""
    if form == "task":
        prompt = bench.task.prompt(sample, bench.family)
        return prompt, answer_completion(bench.task.reference_answer(sample))
    return sample.messages, bench.task.reference_answer(sample)


def held_out(model, processor, bench: Benchmark, form: str) -> float:
    """The task's strict held-out metric on ``bench``'s test split, greedy, with the recipe's
    evaluation budget, the prompts in ``form`` (a bare completion is scored as if it were the
    answer block's content)."""
    policy = Policy(bench.family, model, processor)
    sampling = Sampling(bench.max_new_tokens, greedy=True)
    conversations = [training_pair(s, bench, form)[0] for s in bench.test]
    with torch.no_grad():
        rollouts = HFEngine(policy, 100).generate(conversations, 1, sampling)
    texts = rollouts.texts
    if form == "bare":
        texts = [answer_completion(t.strip()) for t in texts]
    records = bench.task.evaluate(texts, bench.test)
    return float(bench.task.aggregate(records)[bench.task.primary_metric])


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0.1·lr at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def evaluate_only(args: argparse.Namespace) -> dict:
    """The held-out metric of an existing learner (``--eval-only MODEL``) on each benchmark."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    names = benchmark_names(args.only)  # before any weights are loaded
    torch.set_num_threads(args.threads)
    model = AutoModelForImageTextToText.from_pretrained(args.eval_only, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(args.eval_only)
    metrics = {}
    for name in names:
        split = REPO / "assets" / "benchmarks" / name / "train.jsonl"  # read, not trained on
        bench = load_benchmark(name, split, Path(args.eval_only), args.held_out)
        metric = held_out(model, processor, bench, args.form)
        metrics[name] = {bench.task.primary_metric: metric}
    return metrics


def benchmark_names(only: list[str] | None) -> list[str]:
    """The benchmarks ``--only`` names (default: those of :data:`MIXTURE`), each a bundled
    benchmark with a learning recipe."""
    known = set(generators().BENCHMARKS)
    for name in only or []:
        if name not in known:
            raise SystemExit(f"--only {name}: no such benchmark (scripts/make_benchmarks.py)")
        if not (REPO / "configs" / "learn" / f"{name}.yaml").is_file():
            raise SystemExit(f"--only {name}: no learning recipe configs/learn/{name}.yaml")
    return only or list(MIXTURE)


def pretraining_mixture(only: list[str] | None, samples: int | None) -> dict[str, int]:
    """benchmark → pretraining samples: ``samples``, else :data:`MIXTURE`'s count (a
    benchmark outside it needs ``samples``)."""
    mixture = {}
    for name in benchmark_names(only):
        mixture[name] = samples or MIXTURE.get(name, 0)
        if not mixture[name]:
            raise SystemExit(f"--only {name}: not in MIXTURE, give --samples")
    return mixture


def pretrain(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    mixture = pretraining_mixture(args.only, args.samples)
    out = Path(args.out)
    start = Path(tempfile.mkdtemp(prefix="learner-init-"))
    if args.init:  # continued pretraining of an earlier learner
        shutil.rmtree(start)
        shutil.copytree(args.init, start)
    else:
        build_tiny("qwen3_vl", start, seed=args.seed, size="learner")
    data = {}
    for name, n in mixture.items():
        split = pretraining_split(name, n, Path(args.cache), args.workers)
        data[name] = load_benchmark(name, split, start, args.held_out)
        print(f"{name}: {len(data[name].train)} pretraining samples", flush=True)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(start, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(start)
    model.train()
    end_of_turn = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng = random.Random(args.seed)
    names = list(data)
    curve: dict[str, list[list[float]]] = {name: [] for name in names}
    recent: dict[str, list[float]] = {name: [] for name in names}
    held_out_curve: list[list] = []  # [step, {benchmark: {metric: value}}]
    eval_seconds = 0.0

    def evaluate_and_save(done: int) -> dict:
        """Held-out metrics after ``done`` steps; the weights and the record written to ``out``
        (a kill loses at most ``--eval-every`` steps)."""
        nonlocal eval_seconds
        t_eval = time.perf_counter()
        model.eval()
        metrics = {}
        for name, bench in data.items():
            metric = held_out(model, processor, bench, args.form)
            metrics[name] = {bench.task.primary_metric: metric}
            print(
                f"step {done}: {name} held-out {bench.task.primary_metric} {metric:.3f} "
                f"({args.form} prompts)",
                flush=True,
            )
        model.train()
        held_out_curve.append([done, metrics])
        save_checkpoint(model, processor, out)
        eval_seconds += time.perf_counter() - t_eval
        record = {
            "command": "python scripts/make_learner.py " + " ".join(sys.argv[1:]),
            "init": json.loads((Path(args.init) / "pretraining.json").read_text())
            if args.init
            else None,
            "parameters": sum(p.numel() for p in model.parameters()),
            "mixture": mixture,
            "form": args.form,
            "steps": args.steps,
            "steps_done": done,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "seed": args.seed,
            "threads": args.threads,
            "seconds": round(time.perf_counter() - t0 - eval_seconds, 1),  # training only
            "eval_seconds": round(eval_seconds, 1),
            "cpu": cpu_model(),
            "held_out": metrics,
            "held_out_curve": held_out_curve,
            "loss": curve,
        }
        (out / "pretraining.json").write_text(json.dumps(record, indent=1) + "\n")
        return record

    t0 = time.perf_counter()
    for step in range(args.steps):
        name = names[step % len(names)]
        bench = data[name]
        batch = [bench.train[rng.randrange(len(bench.train))] for _ in range(args.batch_size)]
        conversations, answers = zip(*(training_pair(s, bench, args.form) for s in batch))
        prepared = bench.family.prepare(processor, list(conversations), add_generation_prompt=True)
        rows = bench.family.split_rows(prepared, processor)
        completions = [
            processor.tokenizer.encode(a, add_special_tokens=False) + [end_of_turn] for a in answers
        ]
        logps, mask, _ = completion_logps(Policy(bench.family, model, processor), rows, completions)
        loss = -(logps * mask).sum() / mask.sum()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recent[name].append(loss.item())
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            for key in names:
                if recent[key]:
                    curve[key].append([step + 1, float(np.mean(recent[key]))])
                    recent[key] = []
            losses = ", ".join(f"{k} {curve[k][-1][1]:.3f}" for k in names if curve[k])
            print(
                f"step {step + 1}/{args.steps} ({time.perf_counter() - t0:.0f} s): {losses}",
                flush=True,
            )
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            evaluate_and_save(step + 1)
    record = evaluate_and_save(args.steps)
    shutil.rmtree(start, ignore_errors=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output model folder")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="pretraining data folder")
    parser.add_argument(
        "--workers", type=int, default=2, help="processes drawing the pretraining data"
    )
    parser.add_argument(
        "--only", nargs="+", help="benchmarks to pretrain on (default: those of MIXTURE)"
    )
    parser.add_argument(
        "--samples", type=int, help="pretraining samples per benchmark (default: MIXTURE's)"
    )
    parser.add_argument(
        "--form", choices=FORMS, default="task", help="task prompts (default) or bare questions"
    )
    parser.add_argument("--steps", type=int, default=12000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument(
        "--eval-every", type=int, default=2000, help="held-out metrics and weights every N steps"
    )
    parser.add_argument(
        "--init", metavar="MODEL", help="continue from this learner (default: random)"
    )
    parser.add_argument("--eval-only", metavar="MODEL", help="only evaluate an existing learner")
    parser.add_argument(
        "--held-out",
        type=int,
        metavar="N",
        help="evaluate on the first N test samples of each benchmark (default: all; a quick check)",
    )
    args = parser.parse_args()
    if args.eval_only:
        print(json.dumps(evaluate_only(args)))
        return
    record = pretrain(args)
    print(json.dumps({k: v for k, v in record.items() if k != "loss"}))


if __name__ == "__main__":
    main()
