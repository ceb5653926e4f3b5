"""Several processes (gloo on CPU) train like one process on the same global batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ranks import free_port, run_ranks

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = [
    "train.steps=1",
    "train.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=6",
    "train.micro_batch_size=3",  # several micro-batches per rank
    "algorithm.updates_per_batch=2",  # stored old log-probs, a real ratio
    "algorithm.clip_low=0.05",
    "algorithm.clip_high=0.05",
    "optim.lr=1e-2",
    "algorithm.beta=0",  # the demo's KL term needs a reference model these checks do not build
]


def rank_batch(expanded: list, rollouts, rewards: torch.Tensor, share: list[int]):
    """The StepBatch of one rank's ``share`` (completion indices) of a generated global batch,
    with what ``grpo_update`` reads (``scored`` is not)."""
    from mmrft.rollout.collector import StepBatch

    return StepBatch(
        samples=[expanded[i] for i in share],
        rollouts=rollouts.select(share),
        rewards=rewards[share],
        generated=rollouts,
        generated_samples=expanded,
        scored=None,
    )


def one_update(world: int, rank: int) -> dict[str, torch.Tensor]:
    """Build the same global batch on every rank, train on this rank's groups, return params."""
    from mmrft.algorithms import group_advantages
    from mmrft.config import load_config
    from mmrft.policy.model import load_policy
    from mmrft.rewards.task import build_task
    from mmrft.rollout.base import Sampling
    from mmrft.rollout.hf import HFEngine
    from mmrft.training.setup import lr_lambda
    from mmrft.training.update import grpo_update

    torch.set_num_threads(1)
    cfg = load_config(REPO / "configs/demo.yaml", OVERRIDES)
    task = build_task(cfg.task.name, cfg.task.params)
    policy = load_policy(cfg.model, torch.device("cpu"))
    samples, _ = task.read(REPO / cfg.data.train)
    samples = samples[:4]
    for s in samples:
        policy.family.annotate(s)
    torch.manual_seed(0)
    engine = HFEngine(policy, batch_size=64)
    rollouts = engine.generate([task.prompt(s, policy.family) for s in samples], 4, Sampling(6))
    expanded = [s for s in samples for _ in range(4)]
    rewards = torch.tensor([min(len(t), 20) / 20 for t in rollouts.texts])
    advantages = group_advantages(rewards, 4)
    share = list(range(rank * 16 // world, (rank + 1) * 16 // world))  # whole groups
    batch = rank_batch(expanded, rollouts, rewards, share)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    # SGD, whose step is linear in the gradient: what is compared is the summed gradient. (With
    # AdamW the same gradients up to float rounding give updates equal to ~1e-4, because Adam
    # divides tiny gradients by their own tiny scale.)
    optimizer = torch.optim.SGD(params, lr=cfg.optim.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    stats = grpo_update(policy, None, optimizer, scheduler, batch, advantages[share], cfg, step=1)
    assert stats["clip_frac/total"] >= 0
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}


def _worker(rank: int, world: int, out_dir: str) -> None:
    torch.save(one_update(world, rank), Path(out_dir) / f"rank{rank}.pt")


def test_two_processes_match_one_process_on_the_same_global_batch(tmp_path):
    run_ranks(_worker, str(tmp_path))
    rank0 = torch.load(tmp_path / "rank0.pt")
    rank1 = torch.load(tmp_path / "rank1.pt")
    single = one_update(1, 0)
    for key, value in single.items():
        torch.testing.assert_close(
            rank0[key], rank1[key], rtol=0, atol=0, msg=f"ranks differ at {key}"
        )
        torch.testing.assert_close(
            rank0[key], value, rtol=1e-5, atol=1e-7, msg=f"2 ranks ≠ 1 process at {key}"
        )
    from mmrft.config import load_config
    from mmrft.policy.model import load_policy

    initial = load_policy(
        load_config(REPO / "configs/demo.yaml", OVERRIDES).model, torch.device("cpu")
    )
    initial = initial.model.state_dict()
    assert any(not torch.equal(initial[k], single[k]) for k in initial if k in single), (
        "nothing trained"
    )


def torchrun(tmp_path: Path, nproc: int, steps: int) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
    ]
    if nproc == 1:
        cmd = [sys.executable]
    cmd += [
        "-m", "mmrft.cli", "train", "demo", f"output_dir={tmp_path}", "name=ws",
        "warm_start.steps=3", f"train.steps={steps}", "train.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=6", "eval.before=false", "eval.after=false", "checkpoint.every=1",
        "train.threads=1",
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_checkpoints_do_not_depend_on_the_world_size(tmp_path):
    torchrun(tmp_path, 2, steps=2)  # two processes write step 2
    torchrun(tmp_path, 1, steps=3)  # one process resumes it
    torchrun(tmp_path, 2, steps=4)  # and two processes resume that
    lines = [json.loads(x) for x in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "train/reward" in m] == [1, 2, 3, 4]
    log = (tmp_path / "ws" / "train.log").read_text()
    assert "resuming on 1" in log and "resuming on 2" in log


def _two_threads_worker(rank: int, world: int, out_dir: str) -> None:
    """The main thread all-reduces numbers on the default group while a second thread
    gathers objects on the side group, both at once, many times."""
    import threading

    from mmrft.runtime import distributed

    side = distributed.side_group()
    gathered: list = []

    def other() -> None:
        with distributed.collectives_on(side):
            for i in range(200):
                gathered.append(distributed.gather_objects({"rank": rank, "i": i}))
            gathered.append(distributed.broadcast_object(f"from {rank}"))

    thread = threading.Thread(target=other)
    thread.start()
    sums = [distributed.sum_scalar(float(rank + i)) for i in range(200)]
    thread.join()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps([sums, gathered]))


def test_a_second_thread_runs_its_collectives_on_a_group_of_its_own(tmp_path):
    """What lets the asynchronous collector run on several processes (mmrft.rollout.ahead): the
    rollout thread's reductions and the trainer's never pair up with each other."""
    run_ranks(_two_threads_worker, str(tmp_path))
    for rank in (0, 1):
        sums, gathered = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert sums == [float(1 + 2 * i) for i in range(200)]
        assert gathered[:200] == [[{"rank": 0, "i": i}, {"rank": 1, "i": i}] for i in range(200)]
        assert gathered[200] == "from 0"
