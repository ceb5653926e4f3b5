"""Rollout time of the ``hf`` and ``vllm`` engines side by side, on the same policy and prompts.

    .venv-vllm/bin/python benchmarks/engines.py          # after `make test-vllm` built .venv-vllm

The bench model (``mmrft make-tiny --bench``, 41 M parameters), the work of
``benchmarks/vs_trl.py``: P = 2 prompts × G = 8 completions of exactly 32 tokens
(``ignore_eos``), temperature 1, for 224 × 224 images and for 16-frame 224-pixel videos; 2
threads. Each engine generates the same batch ``ROUNDS`` times, alternating; before each vLLM
round the policy's weights are pushed into it (``sync_weights``, timed apart), which also drops
its prefix, encoder and multimodal caches, as after every training step, so no round reuses
the last one's prompt or media work. Printed: the median seconds per batch, their ratio, and
the push's seconds. The ``hf`` engine is group-shared (one prefill per
prompt, its KV cache copied for each completion); vLLM shares the prompt's cached blocks
between the ``n = G`` samples of a request (paged attention) and runs its own CPU kernels. The
last line is JSON: ``{"image": {"hf_s": …, "vllm_s": …, "push_s": …, "speedup": …}, "video":
{…}}``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
ROUNDS = 4


def main() -> None:
    import torch
    from vs_trl import NEW_TOKENS, THREADS, G, P, make_data, mmrft_overrides

    from mmrft.config import VLLMConfig, load_config
    from mmrft.data import Sample
    from mmrft.models.tiny.base import bench_model
    from mmrft.policy.model import load_policy
    from mmrft.rewards.task import build_task
    from mmrft.rollout.base import Sampling
    from mmrft.rollout.hf import HFEngine
    from mmrft.rollout.vllm import VLLMEngine

    torch.set_num_threads(THREADS)
    path = bench_model(REPO / "assets")
    data = make_data(Path(tempfile.gettempdir()) / "mmrft-bench-data")
    sampling = Sampling(NEW_TOKENS, temperature=1.0, ignore_eos=True)
    # one policy with the image and the video budgets of vs_trl.py, one engine of each kind
    overrides = {
        kind: [
            o
            for o in mmrft_overrides(kind, data[kind], Path(tempfile.gettempdir()), 1)
            if not o.startswith("reward.")
        ]
        for kind in ("image", "video")
    }
    budget = [o for o in overrides["video"] if o.startswith("model.")]
    policy = load_policy(load_config(None, overrides["image"] + budget).model, torch.device("cpu"))
    engines = {
        "hf": HFEngine(policy, P * G),
        "vllm": VLLMEngine(
            policy,
            VLLMConfig(kv_cache_gb=1.0, max_model_len=2048, seed=0),
            {"image": 1, "video": 1},
            str(path),
        ),
    }
    out = {}
    for kind in ("image", "video"):
        cfg = load_config(None, overrides[kind])
        task = build_task(cfg.task.name, cfg.task.params)
        samples: list[Sample] = task.read(data[kind], fmt=cfg.data.format)[0][:P]
        conversations = [task.prompt(s, policy.family) for s in samples]
        seconds: dict[str, list[float]] = {name: [] for name in [*engines, "push"]}
        for _ in range(ROUNDS + 1):  # the first round warms both up and is not counted
            for name, engine in engines.items():
                if name == "vllm":  # as after a training step's weight push: nothing cached
                    started = time.perf_counter()
                    engine.sync_weights()
                    seconds["push"].append(time.perf_counter() - started)
                started = time.perf_counter()
                rollouts = engine.generate(conversations, G, sampling)
                seconds[name].append(time.perf_counter() - started)
                assert all(len(c) == NEW_TOKENS for c in rollouts.completion_ids)
        hf, vllm, push = (statistics.median(seconds[n][1:]) for n in ("hf", "vllm", "push"))
        out[kind] = {
            "hf_s": round(hf, 3),
            "vllm_s": round(vllm, 3),
            "push_s": round(push, 3),
            "speedup": round(hf / vllm, 2),
        }
        print(
            f"{kind}: hf {hf:.2f} s, vllm {vllm:.2f} s per batch of {P} × {G} × {NEW_TOKENS} "
            f"tokens ({hf / vllm:.2f}×); weight push {push:.2f} s",
            flush=True,
        )
    engines["vllm"].close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
