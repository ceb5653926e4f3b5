"""Plugin: ``grid_walk_shortest``, the ``grid_walk`` environment whose warm-start demonstration
is a *shortest* walk: the way, not only the call's format. Supervised on purpose, to make a
teacher for on-policy distillation (``benchmarks/distill.py --task grid_walk``); never the warm
start of an RL recipe, whose before-RL policy must not know the way.

    mmrft train tools/grid_walk plugins=[benchmarks/grid_walk_teacher.py] \\
        rollout.tools.environment=grid_walk_shortest warm_start.steps=300 train.steps=0
"""

from __future__ import annotations

from typing import Any

from mmrft.tools.grid import GridWalk, call_text

from mmrft.rollout import environment


def shortest_walk(sample: Any, reference: str) -> list[str]:
    """The calls of a shortest walk from ``meta.walker`` to ``meta.goal``: the columns first
    when ``reference`` (an optimal first move, the sample's target under ``labels:
    target``; another sample's under ``labels: random``) is left or right, else the rows
    first. The reference only picks between the two orders: every walk is a shortest one."""
    (wx, wy), (gx, gy) = sample.meta["walker"], sample.meta["goal"]
    columns = ["right"] * (gx - wx) if gx > wx else ["left"] * (wx - gx)
    rows = ["down"] * (gy - wy) if gy > wy else ["up"] * (wy - gy)
    moves = columns + rows if reference in ("left", "right") else rows + columns
    return [call_text(direction) for direction in moves]


@environment("grid_walk_shortest", timeout_s=5.0, isolate=False, demonstration=shortest_walk)
class GridWalkShortest(GridWalk):
    """grid_walk with a shortest-walk demonstration (a teacher's supervised warm start)."""

    up, down, left, right = GridWalk.up, GridWalk.down, GridWalk.left, GridWalk.right
