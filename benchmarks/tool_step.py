"""Where the time of a multi-turn tool step goes: generation per turn, tools, training forward.

    python benchmarks/tool_step.py                 # tools/zoom_marks, 8 prompts × G 8, 3 repeats
    python benchmarks/tool_step.py --prompts 4 --group 4 --repeats 1

One RL step's rollouts of ``configs/tools/zoom_marks.yaml`` (tiny Qwen2.5-VL, 1000–2000 px
images at a 112 × 112 base view, the ``crop`` tool) on the ``hf`` engine, then the update's
forward and backward over the whole trajectories, timed part by part:

* turn 1: the group-shared ``generate`` (media encoder, prefill, decode) of ``prompts × G``
  completions. The tiny model's first turn is *forced* to a valid crop call (its tokens
  chosen for it, its log-probs computed; the tiny model has not learnt to call), so every
  trajectory runs the tool and continues, the shape of a trained policy's step;
* tools: the crop calls, plus rendering and tokenising each observation with its image
  (``tool_s``: all the loop does outside the model);
* turn 2: ``continue_rows`` of every trajectory from its whole row (prefill with both images,
  decode), sampled freely;
* the training forward + backward over the trajectories (loss mask on the model's tokens),
  group-shared (packed behind one prompt per group) and per-completion.

Printed: seconds per part (median over ``--repeats``), the share of the step's rollout time
spent outside the model, and the CPU. Nothing here is a peer comparison (no peer runs
multi-turn tool rollouts on this model); it is where to optimise next.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CALL = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [10, 10, 60, 60]}}</tool_call>'


def forced_engine(policy, batch_size: int):
    """The hf engine whose ``generate`` (turn 1) writes :data:`CALL`; later turns sample."""
    from mmrft.rollout.hf import HFEngine

    call = policy.tokenizer.encode(CALL, add_special_tokens=False)

    class FirstTurnCall(HFEngine):
        forcing = False

        def generate(self, conversations, n, sampling):
            self.forcing = True
            try:
                return super().generate(conversations, n, sampling)
            finally:
                self.forcing = False

        def _next_tokens(self, logits, sampling, completions, t, seen=None):
            if not self.forcing:
                return super()._next_tokens(logits, sampling, completions, t, seen)
            token = call[t] if t < len(call) else self.stop_ids[0]
            tokens = torch.full((logits.shape[0],), token, dtype=torch.long)
            return tokens, torch.log_softmax(logits, dim=-1)[:, token]

    return FirstTurnCall(policy, batch_size)


def main(argv: list[str] | None = None) -> int:
    from mmrft.evaluation.runlog import cpu_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from mmrft.config import load_config
    from mmrft.policy.group import rollout_logps
    from mmrft.policy.model import load_policy
    from mmrft.rewards.task import build_task
    from mmrft.rollout.base import Sampling
    from mmrft.rollout.collector import build_tool_loop
    from mmrft.rollout.setup import read_data

    cfg = load_config("tools/zoom_marks", ["train.steps=1", "data.max_test_samples=1"])
    task = build_task(cfg.task.name, cfg.task.params)
    from mmrft.policy.model import resolve_family

    family = resolve_family(cfg.model)
    samples, _ = read_data(cfg, task, family)
    samples = samples[: args.prompts]
    policy = load_policy(cfg.model, torch.device("cpu"), family=family)
    engine = forced_engine(policy, cfg.rollout.batch_size)
    loop = build_tool_loop(cfg, policy, engine)
    sampling = Sampling(cfg.rollout.max_new_tokens, cfg.rollout.temperature)
    conversations = [loop.with_tools(task.prompt(s, family), s) for s in samples]

    parts: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        parts.setdefault(name, []).append(seconds)

    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = loop.run(engine, conversations, samples, args.group, sampling)
        total = time.perf_counter() - t0
        timings = out.timings
        record("rollout total", total)
        record("  model: encode", timings.get("encode_s", 0.0))
        record("  model: prefill", timings.get("prefill_s", 0.0))
        record("  model: decode", timings.get("decode_s", 0.0))
        record("  outside the model (tools, observations)", timings.get("tool_s", 0.0))
        indices = list(range(len(out.completion_ids)))
        for shared in (True, False):
            policy.model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            logps, mask, _ = rollout_logps(policy, out, indices, group_shared=shared)
            (logps * mask).sum().div(mask.sum()).backward()
            name = "group-shared" if shared else "per-completion"
            record(f"training forward + backward ({name})", time.perf_counter() - t0)
        used = sum(t.used_tool for t in out.trajectories) / len(out.trajectories)
        turns = sum(len(t.turns) for t in out.trajectories) / len(out.trajectories)

    print(
        f"tool step of tools/zoom_marks: {args.prompts} prompts × G {args.group}, "
        f"{args.threads} threads, {cpu_model()}; median of {args.repeats}; "
        f"trajectories with a successful call {used:.2f}, turns per trajectory {turns:.2f}"
    )
    print("| part | seconds |")
    print("|---|---|")
    medians = {name: statistics.median(values) for name, values in parts.items()}
    for name, value in medians.items():
        print(f"| {name} | {value:.2f} |")
    outside = medians["  outside the model (tools, observations)"]
    print(f"share of the rollout outside the model: {outside / medians['rollout total']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
