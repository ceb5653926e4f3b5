"""A missing or corrupt image is named with the dataset's file:line and the media path, and is
found before any model is loaded (issue 12, item 7)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from mmrft.cli import main
from mmrft.data import DataError, read_mmrft_jsonl
from mmrft.models.qwen_vl import Qwen25VL, check_media
from mmrft.rewards.task import build_task, read_split

REPO = Path(__file__).resolve().parents[1]
SHAPES = REPO / "assets" / "benchmarks" / "shapes_colour"


@pytest.fixture
def broken(tmp_path) -> dict[str, Path]:
    """A copy of four shapes lines whose lines 2-4 point at a missing, a corrupt and a truncated
    image (line 1 is good)."""
    images = tmp_path / "images"
    images.mkdir()
    good = SHAPES / "images" / "train-0000.png"
    shutil.copy(good, images / "good.png")
    (images / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    (images / "truncated.png").write_bytes(good.read_bytes()[:60])
    lines = [json.loads(x) for x in (SHAPES / "train.jsonl").read_text().splitlines()[:4]]
    for line, name in zip(lines, ["good", "missing", "corrupt", "truncated"]):
        line["messages"][0]["content"][0]["image"] = f"images/{name}.png"
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {"jsonl": path, "images": images}


@pytest.mark.parametrize(("line", "name"), [(2, "missing"), (3, "corrupt"), (4, "truncated")])
def test_a_bad_image_names_the_dataset_line_and_the_image(broken, line, name):
    path = broken["jsonl"]
    text = path.read_text().splitlines()
    path.write_text(text[0] + "\n" + text[line - 1] + "\n")  # the good line, then the bad one
    with pytest.raises(DataError) as info:
        read_mmrft_jsonl(path, check=check_media)
    message = str(info.value)
    assert message.startswith(f"{path}:2: {broken['images'] / f'{name}.png'}: "), message


def test_skipped_lines_are_counted_by_reason(broken):
    samples, stats = read_mmrft_jsonl(broken["jsonl"], on_error="skip", check=check_media)
    assert len(samples) == 1 and stats.read == 4
    assert stats.skipped == {"image file not found": 1, "corrupt or unreadable image": 2}


def test_read_split_needs_the_family_not_the_model(broken, monkeypatch):
    family = Qwen25VL()
    for loader in ("load_model", "load_processor"):
        monkeypatch.setattr(family, loader, lambda *a, **k: pytest.fail("the model was loaded"))
    task = build_task("classification", {"think": "none"})
    with pytest.raises(DataError, match=r"train\.jsonl:2: .*missing\.png: image file not found"):
        read_split(task, family, broken["jsonl"])
    samples = read_split(task, family, broken["jsonl"], on_error="skip")
    assert [s.meta["box_frame"] for s in samples] == ["input_pixels"]  # annotated by the family
    only_bad = broken["jsonl"].with_name("bad.jsonl")
    only_bad.write_text("".join(broken["jsonl"].read_text().splitlines(True)[1:]))
    with pytest.raises(DataError, match="no usable samples"):
        read_split(task, family, only_bad, on_error="skip")


def train_args(tmp_path: Path, data: Path) -> list[str]:
    return [
        "train",
        f"output_dir={tmp_path}",
        "name=data",
        "warm_start.steps=0",
        "train.steps=1",
        f"data.train={data}",
        "eval.before=false",
        "eval.after=false",
    ]


def test_train_names_the_bad_line_and_image_and_exits_2(broken, tmp_path, capsys):
    assert main(train_args(tmp_path, broken["jsonl"])) == 2
    err = capsys.readouterr().err
    assert f"{broken['jsonl']}:2: {broken['images'] / 'missing.png'}: image file not found" in err
    assert "Traceback" not in err


def test_train_reports_bad_data_before_loading_the_model(broken, tmp_path, capsys, monkeypatch):
    import mmrft.training.setup

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(mmrft.training.setup, "load_policy", no_model)
    assert main(train_args(tmp_path, broken["jsonl"])) == 2
    assert f"{broken['jsonl']}:2: " in capsys.readouterr().err


# -- hostile media values in parquet rows (issue 38) ---------------------------------------------


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ({"bytes": b"\x89PNG\r\n\x1a\n", "path": "x.p\x00ng"}, "NUL byte in a media path"),
        ({"bytes": None, "path": "x\x00.png"}, "NUL byte in a media path"),
        ("x\x00.png", "NUL byte in a media path"),
        ({"bytes": "not bytes", "path": "x.png"}, "a media value's 'bytes' must be bytes"),
    ],
    ids=["bytes-and-nul-path", "nul-path", "nul-string", "bytes-as-text"],
)
def test_a_parquet_media_value_with_a_nul_byte_is_one_line(tmp_path, monkeypatch, image, says):
    """Stored bytes with a NUL in their path were written to a cache file named by its suffix:
    ValueError 'embedded null byte', a traceback, on the old code (JSONL paths already said
    it in one line). Under data.on_error=skip the row is skipped and counted."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from mmrft.data.readers import parse_mmrft_record, read_records, standard_or_project

    monkeypatch.setenv("MMRFT_CACHE", str(tmp_path / "cache"))
    rows = [{"question": "what?", "answer": "a", "image": image}]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)

    def parse(record, base, where):
        return parse_mmrft_record(standard_or_project(record, base, where), base, where)

    with pytest.raises(DataError, match=rf"^{re.escape(str(path))} row 1: {re.escape(says)}"):
        read_records(path, parse)
    kept, stats = read_records(path, parse, on_error="skip")
    assert kept == [] and stats.read == 1 and stats.kept == 0
