"""The bundled benchmarks: regenerated bit-for-bit by scripts/make_benchmarks.py, within budget,
balanced, and with tight grounding boxes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "assets" / "benchmarks"
BUDGET_BYTES = 5_000_000


def load_generator():
    """Import scripts/make_benchmarks.py (not a package) once."""
    if "make_benchmarks" not in sys.modules:
        path = REPO / "scripts" / "make_benchmarks.py"
        spec = importlib.util.spec_from_file_location("make_benchmarks", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["make_benchmarks"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["make_benchmarks"]


def content_hashes(folder: Path) -> dict[str, str]:
    """sha256 per file: JSONL bytes, PNG decoded RGB pixels (independent of the zlib build)."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix == ".png":
            with Image.open(path) as image:
                data = repr(image.size).encode() + image.convert("RGB").tobytes()
        else:
            data = path.read_bytes()
        out[str(path.relative_to(folder))] = hashlib.sha256(data).hexdigest()
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_generator_reproduces_the_committed_files(tmp_path):
    generator = load_generator()
    generator.generate("shapes_colour", tmp_path)
    assert content_hashes(tmp_path / "shapes_colour") == content_hashes(
        BENCHMARKS / "shapes_colour"
    )
    assert generator.differences(BENCHMARKS / "shapes_colour", tmp_path / "shapes_colour") == []


def test_png_bytes_depend_on_pixels_only(tmp_path):
    generator = load_generator()
    pixels = np.random.default_rng(0).integers(0, 4, size=(20, 30, 3), dtype=np.uint8) * 60
    generator.save_png(pixels, tmp_path / "a.png")
    generator.save_png(pixels.copy(), tmp_path / "b.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert (np.asarray(Image.open(tmp_path / "a.png").convert("RGB")) == pixels).all()


def test_sizes_under_budget():
    total = sum(p.stat().st_size for p in BENCHMARKS.rglob("*") if p.is_file())
    assert total < BUDGET_BYTES, f"bundled benchmarks take {total / 1e6:.2f} MB"


@pytest.mark.parametrize(
    "name", ["shapes_colour", "shapes_kind", "shapes_counting", "shapes_grounding"]
)
def test_layout_and_balance(name):
    generator = load_generator()
    assert generator.BENCHMARKS[name].task in {"classification", "counting", "grounding"}
    for split, n in generator.SPLITS.items():
        records = read_jsonl(BENCHMARKS / name / f"{split}.jsonl")
        assert len(records) == n
        assert len({r["id"] for r in records}) == n
        for record in records[:20]:
            image = record["messages"][0]["content"][0]["image"]
            assert not Path(image).is_absolute()
            with Image.open(BENCHMARKS / name / image) as im:
                assert list(im.size) == record["meta"]["image_size"]
        if name == "shapes_grounding":
            continue
        counts = Counter(json.dumps(r["target"]) for r in records)
        assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_grounding_boxes_are_tight():
    """Every edge row/column of the target box holds a shape pixel; the expression is unique."""
    for record in read_jsonl(BENCHMARKS / "shapes_grounding" / "test.jsonl")[:50]:
        x1, y1, x2, y2 = record["target"]
        path = BENCHMARKS / "shapes_grounding" / record["messages"][0]["content"][0]["image"]
        pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
        saturated = pixels.max(axis=2) - pixels.min(axis=2) > 80  # coloured, not gray noise
        inside = saturated[y1:y2, x1:x2]
        assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
        assert record["messages"][0]["content"][1]["text"].startswith("the ")
