"""Built-in tools of multi-turn rollouts, shipped as ``mmrft.tools``; each file registers its
tools with ``@tool`` (:mod:`mmrft.rollout.tool`)."""
