"""What does ``grid_walk`` pay a policy that does not look? Exact figures, no sampling.

    python benchmarks/grid_walk_random.py                    # the bundled test split, 4 turns
    python benchmarks/grid_walk_random.py --max-turns 6 --split DIR/test.jsonl

For every start of the split (``meta.grid``, ``walker``, ``goal``) and ``rollout.tools.max_turns``
= ``--max-turns`` model turns, i.e. at most ``max_turns - 1`` moves (one call per turn; a call in
the last allowed turn ends the trajectory unrun, ``max_turns``; an off-grid move is refused but
counts as a move, as ``tools/grid.py`` counts it), three policies:

* **random**: each move uniform over up, down, left, right. Success and the episode's reward
  (``shortest / moves`` on reaching the goal, 0 otherwise) computed exactly by dynamic
  programming over the walker's cell.
* **walls only**: each move uniform over the moves that stay on the grid: a policy that has
  learnt where the edges are and nothing of the goal.
* **best blind sequence**: the one fixed sequence of moves (the same for every start, as a
  policy that ignores the image and the observations would write) with the highest mean reward
  on the split: what a model could reach without looking at the grid at all.
* **shortest**: a shortest walk (reward 1, success 1), the ceiling.

Prints a table and, with ``--json``, writes it.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from mmrft.tools.grid import STEPS  # the environment's own moves

ROOT = Path(__file__).resolve().parent.parent


def distance(a: tuple, b: tuple) -> int:
    """Cells between two cells on the grid (Manhattan): a shortest walk's moves."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _move(size: int, cell: tuple[int, int], direction: str) -> tuple[int, int]:
    dx, dy = STEPS[direction]
    x, y = cell[0] + dx, cell[1] + dy
    return (x, y) if 0 <= x < size and 0 <= y < size else cell  # refused: stays, move counted


def random_policy(
    size: int, walker: tuple, goal: tuple, turns: int, walls: bool = False
) -> tuple[float, float]:
    """(P(reach the goal within ``turns`` moves), E[reward]) of uniform random moves (with
    ``walls``: uniform over the moves that stay on the grid)."""
    shortest = distance(walker, goal)
    alive = {tuple(walker): 1.0}  # probability of each cell, goal not reached yet
    success = reward = 0.0
    for moves in range(1, turns + 1):
        nxt: dict[tuple[int, int], float] = {}
        for cell, p in alive.items():
            ends = [_move(size, cell, d) for d in STEPS]
            if walls:
                ends = [c for c in ends if c != cell]
            for c in ends:
                q = p / len(ends)
                if c == tuple(goal):
                    success += q
                    reward += q * shortest / moves
                else:
                    nxt[c] = nxt.get(c, 0.0) + q
        alive = nxt
    return success, reward


def blind_sequence(size: int, walker: tuple, goal: tuple, moves: tuple[str, ...]) -> float:
    """The reward of a fixed sequence of moves (it stops at the goal)."""
    shortest = distance(walker, goal)
    cell = tuple(walker)
    for k, d in enumerate(moves, 1):
        cell = _move(size, cell, d)
        if cell == tuple(goal):
            return shortest / k
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--split", default=str(ROOT / "assets/benchmarks/grid_walk/test.jsonl"))
    ap.add_argument("--max-turns", type=int, default=4, help="rollout.tools.max_turns (moves + 1)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    starts = []
    for line in Path(args.split).read_text().splitlines():
        meta = json.loads(line)["meta"]
        starts.append((int(meta.get("grid", 3)), tuple(meta["walker"]), tuple(meta["goal"])))
    n, moves_left = len(starts), args.max_turns - 1
    rand = [random_policy(s, w, g, moves_left) for s, w, g in starts]
    walled = [random_policy(s, w, g, moves_left, walls=True) for s, w, g in starts]
    best, best_reward = (), -1.0
    for moves in itertools.product(STEPS, repeat=moves_left):
        r = sum(blind_sequence(s, w, g, moves) for s, w, g in starts) / n
        if r > best_reward:
            best, best_reward = moves, r
    best_success = sum(blind_sequence(s, w, g, best) > 0 for s, w, g in starts) / n
    by_shortest: dict[int, list] = {}
    for (_, w, g), (p, r) in zip(starts, rand):
        by_shortest.setdefault(distance(w, g), []).append((p, r))
    rows = {
        "split": args.split,
        "n": n,
        "max_turns": args.max_turns,
        "moves": moves_left,
        "random": {"success": sum(p for p, _ in rand) / n, "reward": sum(r for _, r in rand) / n},
        "random_by_shortest": {
            k: {
                "n": len(v),
                "success": sum(p for p, _ in v) / len(v),
                "reward": sum(r for _, r in v) / len(v),
            }
            for k, v in sorted(by_shortest.items())
        },
        "walls_only": {
            "success": sum(p for p, _ in walled) / n,
            "reward": sum(r for _, r in walled) / n,
        },
        "best_blind_sequence": {
            "moves": list(best),
            "success": best_success,
            "reward": best_reward,
        },
        "shortest": {"success": 1.0, "reward": 1.0},
    }
    print(f"{n} starts of {args.split}, max_turns {args.max_turns}: at most {moves_left} moves")
    print(f"{'policy':<40} {'success':>8} {'reward':>8}")
    print(
        f"{'random (uniform moves)':<40} {rows['random']['success']:>8.3f} {rows['random']['reward']:>8.3f}"
    )
    for k, v in rows["random_by_shortest"].items():
        label = f"  shortest walk {k} (n {v['n']})"
        print(f"{label:<40} {v['success']:>8.3f} {v['reward']:>8.3f}")
    label = "walls only (uniform over on-grid moves)"
    print(f"{label:<40} {rows['walls_only']['success']:>8.3f} {rows['walls_only']['reward']:>8.3f}")
    label = f"best blind sequence {' '.join(best)}"
    print(f"{label:<40} {best_success:>8.3f} {best_reward:>8.3f}")
    print(f"{'shortest walk':<40} {1.0:>8.3f} {1.0:>8.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
