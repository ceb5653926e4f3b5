"""The evaluation layer: greedy evaluation on a task's metrics, and what a run shows of itself.

What it is: evaluation (:mod:`.evaluate`: ``mmrft eval``, ``results.json``,
``predictions.jsonl``, tables), run logs (:mod:`.runlog`: ``metrics.jsonl``, completions,
progress, heartbeat), reports (:mod:`.report`: ``report.png`` / ``report.md``, run
comparisons), trackers (:mod:`.tracking`: TensorBoard, W&B) and the readable view of a prepared
prompt (:mod:`.prompt_view`).

It sits under :mod:`mmrft.training` because a training run evaluates and logs through it; it never
imports the training loop (the set-up both share is :mod:`mmrft.rollout.setup`).

May import: every layer below (base, runtime, data, models, rewards, policy, rollout).
Exports: its modules; ``mmrft.evaluate_config`` is :func:`.evaluate.evaluate_config`.
"""
