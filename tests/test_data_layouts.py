"""Datasets in other layouts and containers, with no code: ``data.fields`` (a field mapping),
VLM-R1's ``conversations`` layout, JSON lists, parquet and Hugging Face ``datasets``
directories (images as files or as stored bytes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrft.cli import main
from mmrft.data import DataError, answer_value
from mmrft.rewards.task import build_task
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
COLOUR = REPO / "assets" / "benchmarks" / "shapes_colour"
GROUNDING = REPO / "assets" / "benchmarks" / "shapes_grounding"
FIELDS = {
    "id": "uid",
    "question": "problem",
    "answer": "solution",
    "image": "images",
    "options": "choices",
    "category": "meta.subject",
}


def bundled(folder: Path, n: int) -> list[tuple[dict, str, str]]:
    """The first ``n`` test records of a bundled benchmark with their image's file name and
    their question text."""
    out = []
    for line in (folder / "test.jsonl").read_text().splitlines()[:n]:
        record = json.loads(line)
        image, text = record["messages"][0]["content"]
        out.append((record, Path(image["image"]).name, text["text"]))
    return out


def easyr1_records(n: int = 4) -> list[dict]:
    """The bundled colour questions in an EasyR1 / R1-V-like flat layout: image paths relative
    to the images folder, the answer in answer tags, a nested category."""
    out = []
    for record, image, text in bundled(COLOUR, n):
        out.append(
            {
                "uid": record["id"],
                "problem": f"<image>{text}",
                "solution": f"<answer> {record['target']} </answer>",
                "images": [image],
                "choices": record["meta"]["choices"],
                "meta": {"subject": "colour" if len(out) % 2 else "hue"},
            }
        )
    return out


def check_colour(samples, n: int = 4) -> None:
    expected = [json.loads(line) for line in (COLOUR / "test.jsonl").read_text().splitlines()[:n]]
    assert [s.id for s in samples] == [e["id"] for e in expected]
    for sample, line in zip(samples, expected):
        assert sample.text() == "What colour is the shape?"  # the <image> placeholder is gone
        assert sample.target == line["target"] and sample.meta["choices"] == line["meta"]["choices"]
        (image,) = sample.media("image")
        original = COLOUR / line["messages"][0]["content"][0]["image"]
        assert Path(image).read_bytes() == original.read_bytes()  # the file, or a stored copy
    assert [s.meta["category"] for s in samples] == ["hue", "colour", "hue", "colour"]


def test_answer_values_are_unwrapped_and_parsed():
    assert answer_value("<answer> 3 </answer>") == 3
    assert answer_value("[10, 20.5, 30, 40]") == [10, 20.5, 30, 40]
    assert answer_value(" red ") == "red" and answer_value("3 apples") == "3 apples"
    assert answer_value(["a"]) == ["a"]


def test_field_mapping_reads_jsonl_and_json_lists(tmp_path):
    task = build_task("classification", {"think": "none"})
    records = easyr1_records()
    lines = tmp_path / "train.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in records))
    array = tmp_path / "train.json"
    array.write_text(json.dumps(records, indent=2))
    for path in (lines, array):
        samples, stats = task.read(path, fields=FIELDS, media_root=COLOUR / "images")
        assert stats.kept == 4
        check_colour(samples)


def test_field_mapping_errors_name_the_key_and_the_record(tmp_path):
    task = build_task("classification", {"think": "none"})
    records = easyr1_records(2)
    del records[1]["solution"]
    path = tmp_path / "train.json"
    path.write_text(json.dumps(records, indent=1))
    with pytest.raises(DataError, match=r"train.json:\d+ \(item 1\): no field 'solution'"):
        task.read(path, fields=FIELDS, media_root=COLOUR / "images")
    with pytest.raises(ConfigError, match="data.fields: map answer too"):
        task.read(path, fields={"question": "problem"})
    with pytest.raises(ConfigError, match="data.fields.*not 'refcoco'"):
        build_task("grounding").read(path, fmt="refcoco", fields=FIELDS)


def test_parquet_with_paths_and_with_stored_image_bytes(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    monkeypatch.setenv("MMRFT_CACHE", str(tmp_path / "cache"))
    task = build_task("classification", {"think": "none"})
    records = easyr1_records()
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "paths.parquet")
    samples, _ = task.read(tmp_path / "paths.parquet", fields=FIELDS, media_root=COLOUR / "images")
    check_colour(samples)
    for record in records:  # images inside the file, as datasets writes an Image column
        data = (COLOUR / "images" / record["images"][0]).read_bytes()
        record["images"] = [{"bytes": data, "path": None}]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "bytes.parquet")
    samples, _ = task.read(tmp_path / "bytes.parquet", fields=FIELDS)
    for sample, record in zip(samples, records):
        (image,) = sample.media("image")
        assert image.startswith(str(tmp_path / "cache" / "media")) and image.endswith(".png")
        assert Path(image).read_bytes() == record["images"][0]["bytes"]
    # a folder of parquet files (a hub snapshot's data/): read in name order
    (tmp_path / "snapshot").mkdir()
    (tmp_path / "bytes.parquet").rename(tmp_path / "snapshot" / "train-00000-of-00001.parquet")
    again, _ = task.read(tmp_path / "snapshot", fields=FIELDS)
    assert [s.media() for s in again] == [s.media() for s in samples]


def test_hugging_face_datasets_directory(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("MMRFT_CACHE", str(tmp_path / "cache"))
    records = easyr1_records()
    columns = {key: [r[key] for r in records] for key in records[0]}
    columns["images"] = [str(COLOUR / "images" / r["images"][0]) for r in records]
    ds = datasets.Dataset.from_dict(columns).cast_column("images", datasets.Image())
    ds.save_to_disk(str(tmp_path / "colour"))
    task = build_task("classification", {"think": "none"})
    fields = {**FIELDS, "image": "images"}
    samples, stats = task.read(tmp_path / "colour", fields=fields)
    assert stats.kept == 4
    check_colour(samples)
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "splits"))
    with pytest.raises(DataError, match=r"holds the splits train, test; name one as .*:train"):
        task.read(tmp_path / "splits", fields=fields)
    samples, _ = task.read(tmp_path / "splits" / "test", fields=fields)
    assert len(samples) == 4
    samples, _ = task.read(f"{tmp_path / 'splits'}:test", fields=fields)  # folder:split
    check_colour(samples)
    with pytest.raises(DataError, match=r"no split 'tset'.*test"):
        task.read(f"{tmp_path / 'splits'}:tset", fields=fields)
    # standard column names (problem, solution, images, choices, uid): no mapping at all
    samples, _ = task.read(f"{tmp_path / 'splits'}:train")
    assert [s.target for s in samples] == [s.target for s in check_samples(records)]


def vlm_r1_conversations(n: int = 3) -> list[dict]:
    """The bundled grounding questions in VLM-R1's conversations layout."""
    return [
        {
            "id": record["id"],
            "image": image,
            "conversations": [
                {"from": "human", "value": f"<image>{text}"},
                {"from": "gpt", "value": json.dumps(record["target"])},
            ],
        }
        for record, image, text in bundled(GROUNDING, n)
    ]


def test_vlm_r1_conversations_layout(tmp_path):
    path = tmp_path / "rec.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in vlm_r1_conversations()))
    task = build_task("grounding", {"think": "none"})
    samples, stats = task.read(path, fmt="conversations", media_root=GROUNDING / "images")
    expected = [json.loads(line) for line in (GROUNDING / "test.jsonl").read_text().splitlines()]
    assert stats.kept == 3
    for sample, line in zip(samples, expected):
        assert (
            sample.id == line["id"] and sample.text() == line["messages"][0]["content"][1]["text"]
        )
        assert sample.target == line["target"] and sample.meta["image_size"] == [112, 112]
        assert Path(sample.media("image")[0]).is_file()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"image": "x.png", "conversations": [{"from": "gpt", "value": "1"}]}) + "\n"
    )
    with pytest.raises(DataError, match=r"bad.jsonl:1: 'conversations' needs a human turn"):
        task.read(bad, fmt="conversations")


def test_mmrft_eval_reads_a_mapped_parquet_file_from_the_command_line(tmp_path, capsys):
    """End to end: the config keys reach the reader (data.fields, data.media_root, a parquet
    test split given relative to the current directory)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(easyr1_records()), tmp_path / "test.parquet")
    fields = "{" + ", ".join(f"{k}: {v}" for k, v in FIELDS.items()) + "}"
    code = main(
        [
            "eval",
            "demo",
            f"data.test={tmp_path / 'test.parquet'}",
            f"data.fields={fields}",
            f"data.media_root={COLOUR / 'images'}",
            "eval.max_new_tokens=4",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    predictions = (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 4


def test_deepeyes_parquet_rows_with_the_per_row_tool_switch(tmp_path, monkeypatch):
    """DeepEyes' released rows: the user turn with an <image> placeholder, the images as stored
    bytes, reward_model.ground_truth; env_name switches the tool per row."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    monkeypatch.setenv("MMRFT_CACHE", str(tmp_path / "cache"))
    image = (COLOUR / "images" / "test-0000.png").read_bytes()
    rows = [
        {
            "data_source": "vstar",
            "prompt": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "<image>\nWhat is the colour of the cup?"},
            ],
            "images": [{"bytes": image, "path": "cup.png"}],
            "ability": "visual_search",
            "env_name": env,
            "reward_model": {"ground_truth": truth, "style": "model"},
            "extra_info": {"index": k, "answer": truth},
        }
        for k, (env, truth) in enumerate([("visual_toolbox_v2", "red"), ("", "42")])
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "deepeyes.parquet")
    task = build_task("chart_qa", {"think": "required"})
    samples, _ = task.read(tmp_path / "deepeyes.parquet", fmt="deepeyes")
    assert [s.id for s in samples] == ["0", "1"]
    assert [s.target for s in samples] == ["red", 42]
    assert [s.meta["tools"] for s in samples] == [True, False]
    assert samples[0].text() == "What is the colour of the cup?"
    (path,) = samples[0].media("image")
    assert Path(path).read_bytes() == image and samples[0].meta["data_source"] == "vstar"
    with pytest.raises(DataError, match="reward_model.ground_truth"):
        from mmrft.data import from_deepeyes

        from_deepeyes({"prompt": [{"role": "user", "content": "q"}]}, tmp_path, "row 1")


def test_standard_column_names_need_no_mapping(tmp_path):
    """EasyR1's problem/solution/images and TRL's prompt/solution/image, and the common
    question/answer/image, are read without data.fields; an unknown layout's error says how."""
    task = build_task("classification", {"think": "none"})
    expected = [json.loads(line) for line in (COLOUR / "test.jsonl").read_text().splitlines()[:2]]
    layouts = {
        "easyr1": lambda r, image, text: {
            "uid": r["id"], "problem": f"<image>{text}", "solution": r["target"],
            "images": [str(COLOUR / "images" / image)], "choices": r["meta"]["choices"],
        },
        "trl": lambda r, image, text: {
            "id": r["id"], "prompt": text, "solution": f"<answer>{r['target']}</answer>",
            "image": str(COLOUR / "images" / image), "options": r["meta"]["choices"],
        },
        "common": lambda r, image, text: {
            "id": r["id"], "question": text, "answer": r["target"],
            "image": str(COLOUR / "images" / image), "choices": r["meta"]["choices"],
        },
    }  # fmt: skip
    for name, make in layouts.items():
        path = tmp_path / f"{name}.jsonl"
        rows = [make(r, image, text) for r, image, text in bundled(COLOUR, 2)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        samples, _ = task.read(path)
        assert [s.id for s in samples] == [e["id"] for e in expected], name
        assert [s.target for s in samples] == [e["target"] for e in expected], name
        assert all(s.text() == "What colour is the shape?" for s in samples), name
        assert all(len(s.media("image")) == 1 for s in samples), name
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"q": "What colour?", "a": "red"}) + "\n")
    with pytest.raises(DataError, match="standard columns.*data.fields"):
        task.read(odd)


def check_samples(records: list[dict]) -> list:
    """The targets the EasyR1-like records mean (answer tags removed)."""
    from mmrft.data import Sample, answer_value

    return [Sample(r["uid"], [], answer_value(r["solution"])) for r in records]


def test_a_mapping_per_split(tmp_path):
    """data.fields may give each split its own mapping; a mixed form is refused at start-up."""
    from mmrft.config import load_config
    from mmrft.policy.model import resolve_family
    from mmrft.rollout.setup import read_data
    from mmrft.typecheck import ConfigError

    rows = [(r, image, text) for r, image, text in bundled(COLOUR, 2)]
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    for path, (question, answer, image) in [
        (train, ("q", "a", "img")),
        (test, ("text", "label", "pic")),
    ]:
        records = [
            {
                question: t,
                answer: r["target"],
                image: str(COLOUR / "images" / i),
                "opts": r["meta"]["choices"],
            }
            for r, i, t in rows
        ]
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    fields = (
        "data.fields={train: {question: q, answer: a, image: img, options: opts}, "
        "test: {question: text, answer: label, image: pic, options: opts}}"
    )
    cfg = load_config("demo", [f"data.train={train}", f"data.test={test}", fields])
    task = build_task(cfg.task.name, cfg.task.params)
    train_samples, test_samples = read_data(cfg, task, resolve_family(cfg.model))
    assert (
        [s.target for s in train_samples]
        == [s.target for s in test_samples]
        == [r["target"] for r, _, _ in rows]
    )
    with pytest.raises(ConfigError, match="one per split"):
        load_config("demo", ["data.fields={train: {question: q}, answer: a}"])
