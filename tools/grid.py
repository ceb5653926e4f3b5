"""``grid_walk``: a visual environment that needs several steps (:mod:`mmrft.rollout.environment`).

The model sees an N × N grid as an image, a red square (the walker) and a green square (the
goal), and moves the walker one cell per call of ``move(direction)``; after every move it sees
the grid again. The episode ends when the walker stands on the goal, with the reward
``shortest / moves`` (1 for a shortest walk, less for detours); a move off the grid is refused
(``off_grid``) and costs a turn, as does any failed call.

A sample names its start in ``meta``: ``grid`` (N, default 3), ``walker`` and ``goal`` as
``[column, row]`` from the top-left cell ``[0, 0]``; the bundled ``grid_walk`` benchmark
(``scripts/make_benchmarks.py``) draws them. The image is ``CELL`` px per cell, so at N = 3 it is
84 × 84 px: 9 visual tokens for the Qwen-VL families (28-px patch groups), one per cell.
"""

from __future__ import annotations

from typing import Any, Literal

from mmrft.rollout import Environment, Observation, ToolFailure, environment

CELL = 28
"""Side of one grid cell (pixels)."""
WALKER, GOAL, FLOOR, LINE = (220, 30, 30), (30, 170, 50), (235, 235, 235), (150, 150, 150)
STEPS = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}


def render(size: int, walker: tuple[int, int], goal: tuple[int, int]) -> Any:
    """The grid as an RGB PIL image (``size × CELL`` px per side): floor, lines, the goal's cell
    green, the walker's red square inset by 4 px (over the goal when it stands there)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size * CELL, size * CELL), FLOOR)
    draw = ImageDraw.Draw(image)
    for k in range(1, size):
        draw.line([(k * CELL, 0), (k * CELL, size * CELL)], fill=LINE)
        draw.line([(0, k * CELL), (size * CELL, k * CELL)], fill=LINE)
    gx, gy = goal
    draw.rectangle([gx * CELL + 1, gy * CELL + 1, (gx + 1) * CELL - 1, (gy + 1) * CELL - 1], GOAL)
    wx, wy = walker
    draw.rectangle([wx * CELL + 4, wy * CELL + 4, (wx + 1) * CELL - 5, (wy + 1) * CELL - 5], WALKER)
    return image


def _cell(value: Any, size: int, what: str) -> tuple[int, int]:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and 0 <= v < size for v in value)
    ):
        raise ValueError(f"meta.{what} must be [column, row] inside a {size} × {size} grid")
    return int(value[0]), int(value[1])


DEMO_MOVES = 3
"""Calls of a demonstrated episode (it stops earlier where a move reaches the goal)."""


def demonstrate(sample: Any, reference: str) -> list[str]:
    """A warm start's scripted episode: up to :data:`DEMO_MOVES` moves in the direction
    ``reference`` (the answer the warm start pairs with the sample: another sample's under
    ``labels: random``, which teaches the call's format, also after an observation, and not
    the way)."""
    direction = reference if reference in STEPS else "right"
    call = f'{{"name": "move", "arguments": {{"direction": "{direction}"}}}}'
    return [f"<tool_call>{call}</tool_call>"] * DEMO_MOVES


@environment("grid_walk", timeout_s=5.0, demonstration=demonstrate)
class GridWalk(Environment):
    """Walk the red square onto the green one on a grid shown as an image."""

    def reset(self, sample: Any) -> Observation:
        self.size = int(sample.meta.get("grid", 3))
        if not 2 <= self.size <= 16:
            raise ValueError("meta.grid must be in [2, 16]")
        self.walker = _cell(sample.meta.get("walker"), self.size, "walker")
        self.goal = _cell(sample.meta.get("goal"), self.size, "goal")
        if self.walker == self.goal:
            raise ValueError("meta.walker and meta.goal are the same cell")
        self.shortest = abs(self.walker[0] - self.goal[0]) + abs(self.walker[1] - self.goal[1])
        self.moves = 0
        return Observation(ok=True, text="", images=[render(self.size, self.walker, self.goal)])

    def move(self, direction: Literal["up", "down", "left", "right"]) -> Observation:
        """Move the red square one cell.

        Args:
            direction: the direction to move in
        """
        dx, dy = STEPS[direction]
        x, y = self.walker[0] + dx, self.walker[1] + dy
        self.moves += 1
        if not (0 <= x < self.size and 0 <= y < self.size):
            raise ToolFailure("off_grid", f"You cannot move {direction}: the grid ends there.")
        self.walker = (x, y)
        if self.walker == self.goal:
            self.finish(
                reward=self.shortest / self.moves,
                state={"moves": self.moves, "shortest": self.shortest},
            )
            return Observation(ok=True, text="You reached the green square.")
        image = render(self.size, self.walker, self.goal)
        return Observation(ok=True, text=f"You moved {direction}.", images=[image])
