"""Generate the bundled synthetic benchmarks under ``assets/benchmarks/`` (deterministic).

    python scripts/make_benchmarks.py                    # (re)write every benchmark
    python scripts/make_benchmarks.py --only shapes_colour
    python scripts/make_benchmarks.py --check            # regenerate in a temp dir, compare

Each benchmark is ``<name>/{train,test}.jsonl`` plus ``<name>/images/<split>-NNNN.png`` in the
project's JSONL format (media paths relative to the JSONL file, ``meta.image_size = [W, H]``):

* ``shapes_colour`` (task ``classification``, the CPU demo): one big shape (circle, square or
  triangle, side 20–38 px) of one of 4 saturated colours on a white or light-gray speckled
  56×56 background; target the colour name; classes balanced.
* ``shapes_kind`` (``classification``): one shape among circle/square/triangle/cross, random
  colour, 56×56; target the kind; classes balanced.
* ``shapes_counting`` (``counting``): 1–6 non-overlapping shapes of one kind on 84×84; target
  the count (int); counts balanced; ``meta.count_range = [1, 6]``.
* ``shapes_grounding`` (``grounding``): 2–4 non-overlapping shapes with distinct
  (colour, kind) on 112×112; the question is the expression ("the red circle"); target the
  tight box of that shape, absolute pixels ``[x1, y1, x2, y2]`` of the image, edges inclusive
  of the drawn pixels (pixel ``x`` spans ``[x, x + 1)``).

Shapes are rasterised with numpy (pixel-centre tests), not PIL's drawing, so pixels depend on
the seeds only. PNGs are lossless palette images written with fixed parameters and no metadata
chunks, so a rerun gives identical bytes with the same Pillow/zlib; ``--check`` compares JSONL
bytes and decoded RGB pixels, which stay comparable across zlib builds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "assets" / "benchmarks"

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 225),
    "yellow": (240, 200, 0),
}
KINDS = ("circle", "square", "triangle", "cross")
SPLITS = {"train": 800, "test": 200}
Array = np.ndarray


# -- drawing ---------------------------------------------------------------------------------
def shape_mask(kind: str, x0: int, y0: int, side: int, width: int, height: int) -> Array:
    """Boolean ``(height, width)`` mask of a shape inscribed in the square
    ``[x0, x0 + side) × [y0, y0 + side)`` (pixels, x right, y down), by pixel-centre tests."""
    ys, xs = np.mgrid[0:height, 0:width]
    px, py = xs + 0.5, ys + 0.5
    cx, cy, half = x0 + side / 2, y0 + side / 2, side / 2
    dx, dy = np.abs(px - cx), np.abs(py - cy)
    if kind == "circle":
        return dx**2 + dy**2 <= half**2
    if kind == "square":
        return (dx <= half) & (dy <= half)
    if kind == "triangle":  # apex up, base at the bottom of the square
        depth = py - y0  # 0 at the apex, side at the base
        return (depth >= 0) & (depth <= side) & (dx <= depth / 2)
    if kind == "cross":
        arm = side / 6
        return ((dx <= half) & (dy <= arm)) | ((dx <= arm) & (dy <= half))
    raise ValueError(f"unknown shape kind {kind!r}")


def tight_box(mask: Array) -> list[int]:
    """``[x1, y1, x2, y2]`` in pixels with ``x2``/``y2`` exclusive (pixel x spans [x, x+1))."""
    ys, xs = np.nonzero(mask)
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]


def background(rng: np.random.Generator, width: int, height: int) -> Array:
    """White or light-gray canvas with sparse gray speckles (≈3 % of pixels)."""
    base = 255 if rng.random() < 0.5 else int(rng.integers(215, 236))
    gray = np.full((height, width), base, dtype=np.int16)
    speckle = rng.random((height, width)) < 0.03
    gray[speckle] -= rng.integers(10, 41, size=int(speckle.sum()), dtype=np.int16)
    return np.repeat(np.clip(gray, 0, 255).astype(np.uint8)[:, :, None], 3, axis=2)


def paint(image: Array, mask: Array, colour: str, rng: np.random.Generator) -> None:
    """Fill ``mask`` with ``colour`` jittered by up to ±15 per channel (stays saturated)."""
    jitter = rng.integers(-15, 16, size=3)
    image[mask] = np.clip(np.array(COLOURS[colour]) + jitter, 0, 255).astype(np.uint8)


def place(
    rng: np.random.Generator, sides: list[int], width: int, height: int, gap: int = 3
) -> list[tuple[int, int]]:
    """Top-left corners for squares of the given sides, inside the image and ``gap`` px apart."""
    while True:  # restart when a layout gets stuck; a few tries suffice at these densities
        corners: list[tuple[int, int]] = []
        for side in sides:
            for _ in range(200):
                x0 = int(rng.integers(1, width - side))
                y0 = int(rng.integers(1, height - side))
                if all(
                    x0 + side + gap <= x
                    or x + s + gap <= x0
                    or y0 + side + gap <= y
                    or y + s + gap <= y0
                    for (x, y), s in zip(corners, sides)
                ):
                    corners.append((x0, y0))
                    break
            else:
                break
        if len(corners) == len(sides):
            return corners


def balanced(rng: np.random.Generator, values: list, n: int) -> list:
    """``n`` labels cycling through ``values`` (counts differ by at most 1), shuffled."""
    labels = [values[i % len(values)] for i in range(n)]
    return [labels[i] for i in rng.permutation(n)]


# -- benchmarks ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One generated sample before it is written: pixels, question, target, extra meta."""

    pixels: Array
    question: str
    target: object
    meta: dict


def single_shape(
    rng: np.random.Generator, size: int, kind: str, colour: str, sides: tuple[int, int]
) -> Array:
    image = background(rng, size, size)
    side = int(rng.integers(sides[0], sides[1] + 1))
    ((x0, y0),) = place(rng, [side], size, size)
    paint(image, shape_mask(kind, x0, y0, side, size, size), colour, rng)
    return image


def make_colour(rng: np.random.Generator, n: int) -> list[Item]:
    colours = list(COLOURS)
    items = []
    for colour in balanced(rng, colours, n):
        kind = KINDS[int(rng.integers(0, 3))]  # circle, square, triangle
        pixels = single_shape(rng, 56, kind, colour, (20, 38))
        items.append(Item(pixels, "What colour is the shape?", colour, {"choices": colours}))
    return items


def make_kind(rng: np.random.Generator, n: int) -> list[Item]:
    kinds = list(KINDS)
    items = []
    for kind in balanced(rng, kinds, n):
        colour = list(COLOURS)[int(rng.integers(0, len(COLOURS)))]
        pixels = single_shape(rng, 56, kind, colour, (22, 40))
        items.append(Item(pixels, "What kind of shape is in the image?", kind, {"choices": kinds}))
    return items


def make_counting(rng: np.random.Generator, n: int) -> list[Item]:
    items = []
    for count in balanced(rng, [1, 2, 3, 4, 5, 6], n):
        size = 84
        kind = KINDS[int(rng.integers(0, len(KINDS)))]
        image = background(rng, size, size)
        sides = [int(s) for s in rng.integers(12, 21, size=count)]
        for (x0, y0), side in zip(place(rng, sides, size, size), sides):
            colour = list(COLOURS)[int(rng.integers(0, len(COLOURS)))]
            paint(image, shape_mask(kind, x0, y0, side, size, size), colour, rng)
        items.append(
            Item(image, "How many shapes are in the image?", count, {"count_range": [1, 6]})
        )
    return items


def make_grounding(rng: np.random.Generator, n: int) -> list[Item]:
    pairs = [(c, k) for c in COLOURS for k in KINDS]
    items = []
    for count in balanced(rng, [2, 3, 4], n):
        size = 112
        image = background(rng, size, size)
        chosen = [pairs[i] for i in rng.choice(len(pairs), size=count, replace=False)]
        sides = [int(s) for s in rng.integers(18, 35, size=count)]
        boxes = []
        for (x0, y0), side, (colour, kind) in zip(place(rng, sides, size, size), sides, chosen):
            mask = shape_mask(kind, x0, y0, side, size, size)
            paint(image, mask, colour, rng)
            boxes.append(tight_box(mask))
        target = int(rng.integers(0, count))
        colour, kind = chosen[target]
        items.append(Item(image, f"the {colour} {kind}", boxes[target], {}))
    return items


def save_png(pixels: Array, path: Path) -> None:
    """Save RGB ``pixels`` as a palette PNG (lossless: the palette holds every colour used,
    sorted) with fixed zlib settings and no metadata, so the bytes depend on the pixels only."""
    flat = pixels.reshape(-1, 3).astype(np.uint32)
    keys = (flat[:, 0] << 16) | (flat[:, 1] << 8) | flat[:, 2]
    colours, index = np.unique(keys, return_inverse=True)
    if len(colours) > 256:
        raise ValueError(f"{path}: {len(colours)} colours do not fit a palette")
    palette = np.stack([colours >> 16, (colours >> 8) & 255, colours & 255], axis=1)
    image = Image.fromarray(index.reshape(pixels.shape[:2]).astype(np.uint8), "P")
    image.putpalette(palette.astype(np.uint8).tobytes())
    image.save(path, format="PNG", optimize=False, compress_level=9)


@dataclass(frozen=True)
class Benchmark:
    """A bundled benchmark: its seed, the task that reads it, and the function that makes it."""

    seed: int
    task: str
    make: Callable[[np.random.Generator, int], list[Item]]


BENCHMARKS: dict[str, Benchmark] = {
    "shapes_colour": Benchmark(101, "classification", make_colour),
    "shapes_kind": Benchmark(102, "classification", make_kind),
    "shapes_counting": Benchmark(103, "counting", make_counting),
    "shapes_grounding": Benchmark(104, "grounding", make_grounding),
}


def generate(name: str, out: Path) -> None:
    """Write benchmark ``name`` to ``out/<name>/`` (replacing what is there)."""
    benchmark = BENCHMARKS[name]
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "images").mkdir(parents=True)
    for split_index, (split, n) in enumerate(SPLITS.items()):
        rng = np.random.default_rng([benchmark.seed, split_index])
        lines = []
        for i, item in enumerate(benchmark.make(rng, n)):
            relative = f"images/{split}-{i:04d}.png"
            save_png(item.pixels, folder / relative)
            height, width = item.pixels.shape[:2]
            record = {
                "id": f"{name}-{split}-{i:04d}",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "image": relative},
                            {"type": "text", "text": item.question},
                        ],
                    }
                ],
                "target": item.target,
                "meta": {**item.meta, "image_size": [width, height]},
            }
            lines.append(json.dumps(record) + "\n")
        (folder / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")


# -- checking --------------------------------------------------------------------------------
def differences(expected: Path, actual: Path) -> list[str]:
    """Files that differ between two benchmark folders: JSONL by bytes, PNG by decoded pixels."""
    names = {p.relative_to(expected) for p in expected.rglob("*") if p.is_file()}
    names |= {p.relative_to(actual) for p in actual.rglob("*") if p.is_file()}
    out = []
    for name in sorted(names):
        a, b = expected / name, actual / name
        if not (a.is_file() and b.is_file()):
            out.append(
                f"{name}: only in {'the committed files' if a.is_file() else 'the new files'}"
            )
        elif name.suffix == ".png":
            with Image.open(a) as ia, Image.open(b) as ib:
                if ia.size != ib.size or ia.convert("RGB").tobytes() != ib.convert("RGB").tobytes():
                    out.append(f"{name}: pixels differ")
        elif a.read_bytes() != b.read_bytes():
            out.append(f"{name}: bytes differ")
    return out


def check(names: list[str], out: Path) -> list[str]:
    """Regenerate ``names`` in a temp dir and list differences from ``out``."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            generate(name, Path(tmp))
            problems += [f"{name}/{d}" for d in differences(out / name, Path(tmp) / name)]
    return problems


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="benchmarks folder")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="benchmarks to make")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    if args.check:
        problems = check(names, args.out)
        for line in problems:
            print(line)
        print("unchanged" if not problems else f"{len(problems)} file(s) differ")
        return 1 if problems else 0
    for name in names:
        generate(name, args.out)
        print(f"{name}: {folder_size(args.out / name) / 1e6:.2f} MB")
    print(f"total: {folder_size(args.out) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
