"""``grid_walk``: a visual environment that needs several steps (:mod:`mmrft.rollout.environment`).

The model sees an N × N grid as an image centred on a red cell (the walker), with a green
cell (the goal), and moves the walker one cell per call of ``up()``, ``down()``, ``left()`` or
``right()`` (four tools without arguments: a call is ``<tool_call>{"name": "up"}</tool_call>``,
14 tokens of the tiny byte-level tokenizer where ``move(direction)``'s was 39); after every move
it sees the grid again. The episode ends when the walker stands on the goal, with the reward
``shortest / moves`` (1 for a shortest walk, less for detours); a move off the grid is refused
(``off_grid``) and costs a turn, as does any failed call.

A sample names its start in ``meta``: ``grid`` (N, default 3), ``walker`` and ``goal`` as
``[column, row]`` from the top-left cell ``[0, 0]``; the bundled ``grid_walk`` benchmark
(``scripts/make_benchmarks.py``) draws them. The image (:func:`render`) is the walker's view, ``2N − 1`` cells of ``CELL`` px
per side: at N = 3, 28 × 28 px, one visual token of the Qwen-VL families.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from mmrft.rollout import Environment, Observation, ToolFailure, environment

CELL = 5
"""Pitch of the view (pixels): 4-px cells between 1-px lines, so the 5 × 5-cell view of a 3 × 3
grid fills 28 × 28 px, one visual token of the Qwen-VL families (a 2 × 2 group of 14-px
patches)."""
TOKEN = 28
"""Side of one visual token of the Qwen-VL families (pixels); the image is a multiple of it."""
WALKER, GOAL, FLOOR, WALL, LINE = (
    (220, 30, 30),
    (30, 170, 50),
    (235, 235, 235),
    (60, 60, 60),
    (150, 150, 150),
)
STEPS = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}


def render(size: int, walker: tuple[int, int], goal: tuple[int, int]) -> Any:
    """What the model sees: the walker's view, ``2·size − 1`` cells per side centred on the
    walker (egocentric, as MiniGrid's agent view), so the whole grid is in it wherever the
    walker stands: the walker's cell red in the centre, the goal's green, the grid's other cells
    light, cells beyond the grid's edge dark, 1-px grey lines between cells, :data:`CELL` px per
    cell, padded with line colour to a multiple of :data:`TOKEN` px (28 × 28 at size 3).

    Small and egocentric on purpose, for the tiny models: they have no absolute positions in
    their vision tower nor for image tokens (RoPE only), so where a square is can be read
    inside one visual token (the patch embedding weighs each pixel of a patch apart) but not
    across tokens, and in the walker's view the way is where the green cell lies, a linear
    function of the pixels (docs/tools.md#environments: on an 84 × 84 px grid, nine tokens, the
    tiny Qwen2.5-VL did not learn the way even from shortest-walk demonstrations)."""
    from PIL import Image, ImageDraw

    view, centre = 2 * size - 1, size - 1
    side = -(-(view * CELL + 1) // TOKEN) * TOKEN
    image = Image.new("RGB", (side, side), LINE)
    draw = ImageDraw.Draw(image)
    for vx in range(view):
        for vy in range(view):
            x, y = walker[0] + vx - centre, walker[1] + vy - centre
            inside = 0 <= x < size and 0 <= y < size
            colour = FLOOR if inside else WALL
            if (x, y) == tuple(goal):
                colour = GOAL
            if (vx, vy) == (centre, centre):
                colour = WALKER
            box = [vx * CELL + 1, vy * CELL + 1, (vx + 1) * CELL - 1, (vy + 1) * CELL - 1]
            draw.rectangle(box, colour)
    return image


def _cell(value: Any, size: int, what: str) -> tuple[int, int]:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and 0 <= v < size for v in value)
    ):
        raise ValueError(f"meta.{what} must be [column, row] inside a {size} × {size} grid")
    return int(value[0]), int(value[1])


DEMO_MOVES = 4
"""Calls of a demonstrated episode (it stops earlier where a move reaches the goal): the
recipe's ``rollout.tools.max_turns``."""

_demonstrations = itertools.count()


def call_text(direction: str) -> str:
    """The model's text of one move: ``<tool_call>{"name": "up"}</tool_call>``."""
    return f'<tool_call>{{"name": "{direction}"}}</tool_call>'


def demonstrate(sample: Any, reference: str) -> list[str]:
    """A warm start's scripted episode: a random walk of :data:`DEMO_MOVES` moves, the first in
    the direction ``reference`` (the answer the warm start pairs with the sample: another
    sample's under ``labels: random``), each later one drawn uniformly from the four directions
    (a seeded draw from the sample's id, the reference and a running count), whatever the grid
    shows. It teaches the call's format, also after an observation and after a refused move, and
    not the way: every move is as likely as under the random policy
    (``benchmarks/grid_walk_random.py``)."""
    first = reference if reference in STEPS else "right"
    rng = random.Random(f"{sample.id}|{first}|{next(_demonstrations)}")
    return [call_text(first)] + [call_text(rng.choice(list(STEPS))) for _ in range(DEMO_MOVES - 1)]


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
        self.shortest = self._distance()
        self.moves = 0
        self._report()
        return Observation(ok=True, text="", images=[render(self.size, self.walker, self.goal)])

    def up(self) -> Observation:
        """Move the red square one cell up."""
        return self._move("up")

    def down(self) -> Observation:
        """Move the red square one cell down."""
        return self._move("down")

    def left(self) -> Observation:
        """Move the red square one cell left."""
        return self._move("left")

    def right(self) -> Observation:
        """Move the red square one cell right."""
        return self._move("right")

    def _distance(self) -> int:
        return abs(self.walker[0] - self.goal[0]) + abs(self.walker[1] - self.goal[1])

    def _report(self) -> None:
        """The episode's state after every call, finished or not: ``moves``, ``shortest``,
        ``distance`` (cells, Manhattan, walker to goal) and ``progress`` = ``1 − distance /
        shortest`` clipped to [0, 1], the share of the way covered (the ``environment_progress``
        verifier's reading: 1 at the goal, 0 at the start or farther)."""
        distance = self._distance()
        self.state = {
            "moves": self.moves,
            "shortest": self.shortest,
            "distance": distance,
            "progress": max(0.0, 1.0 - distance / self.shortest),
        }

    def _move(self, direction: str) -> Observation:
        dx, dy = STEPS[direction]
        x, y = self.walker[0] + dx, self.walker[1] + dy
        self.moves += 1
        if not (0 <= x < self.size and 0 <= y < self.size):
            self._report()
            raise ToolFailure("off_grid", f"You cannot move {direction}: the grid ends there.")
        self.walker = (x, y)
        self._report()
        if self.walker == self.goal:
            self.finish(reward=self.shortest / self.moves)
            return Observation(ok=True, text="You reached the green square.")
        image = render(self.size, self.walker, self.goal)
        return Observation(ok=True, text=f"You moved {direction}.", images=[image])
