"""The training layer: the GRPO loop and what only training needs.

What it is: the loop, top to bottom (:mod:`.trainer`: set-up, collect → advantages → update →
log / eval / checkpoint), the supervised warm start, resuming and the config guard, and the
weights and optimizer state a run saves and loads.

May import: every layer below (base, runtime, data, models, rewards, policy, rollout,
evaluation).
Only the top (:mod:`mmrft.cli`, :mod:`mmrft.smoke`, the Python API) imports it.
Exports: its modules; the Python API's ``mmrft.train`` is :func:`.trainer.train` (the layer is
named ``training`` so that it does not shadow that function).
"""
