"""The training layer: the GRPO loop and what only training needs.

What it is: the loop, top to bottom (:mod:`.trainer`: set-up, collect → advantages → update →
log / eval / checkpoint); the set-up it starts from (:mod:`.setup`: the :class:`~.setup.Run`
it holds, optimizer and LR schedule); the body of one policy update (:mod:`.update`:
micro-batches → forward → policy loss + KL → backward → step); the supervised warm start and
the reference it leaves (:mod:`.warm_start`); resuming and the config guard, the weights and
random state a resumed run starts from (:mod:`.resume`).

May import: every layer below (base, runtime, data, models, rewards, policy, rollout,
evaluation).
Only the top (:mod:`mmrft.cli`, :mod:`mmrft.smoke`, the Python API) imports it.
Exports: its modules; the Python API's ``mmrft.train`` is :func:`.trainer.train` (the layer is
named ``training`` so that it does not shadow that function).
"""
