"""The command line, run in-process through mmrft.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

from mmrft.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_verify_prints_one_json_line_per_input_in_order(tmp_path, capsys):
    lines = [
        {
            "completion": "<answer>red</answer>",
            "target": "red",
            "meta": {"choices": ["red", "blue"]},
        },
        {"completion": "red", "target": "red", "meta": {"choices": ["red", "blue"]}},
        {
            "completion": "<answer>red or blue</answer>",
            "target": "red",
            "meta": {"choices": ["red", "blue"]},
        },
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["verify", "accuracy", str(path)]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [o["score"] for o in out] == [1.0, 0.0, 0.0]
    assert out[0]["reason"] is None
    assert out[1]["reason"] == "no answer tag"
    assert out[2]["reason"] == "several options"


def test_verify_iou_with_params(tmp_path, capsys):
    meta = {"image_size": [100, 100], "box_frame": "pixels"}
    path = tmp_path / "in.jsonl"
    path.write_text(
        json.dumps(
            {
                "completion": "<answer>[10, 10, 50, 50]</answer>",
                "target": [10, 10, 50, 50],
                "meta": meta,
            }
        )
        + "\n"
        + json.dumps(
            {
                "completion": "<answer>[0, 0, 100, 100]</answer>",
                "target": [10, 10, 50, 50],
                "meta": meta,
            }
        )
        + "\n"
    )
    assert main(["verify", "iou", str(path), "threshold=0.5"]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [o["score"] for o in out] == [1.0, 0.0]


def test_user_errors_exit_2_with_a_message(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text('{"completion": "x"}\n')
    assert main(["verify", "accuracy", str(path)]) == 2
    assert "in.jsonl:1: needs 'completion' and 'target'" in capsys.readouterr().err
    assert main(["verify", "acuracy", str(path)]) == 2
    assert "did you mean 'accuracy'" in capsys.readouterr().err
    assert main(["verify", "iou", str(path), "treshold=0.5"]) == 2
    assert "did you mean 'threshold'" in capsys.readouterr().err
    assert main(["train", "rollout.group_sise=3"]) == 2
    assert "did you mean 'rollout.group_size'" in capsys.readouterr().err


def test_list(capsys):
    for what, expected in [
        ("tasks", "grounding"),
        ("verifiers", "iou"),
        ("models", "qwen2_5_vl"),
        ("configs", "demo.yaml"),
    ]:
        assert main(["list", what]) == 0
        assert expected in capsys.readouterr().out


def test_help_config_lists_every_key(capsys):
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "rollout.group_size" in out and "algorithm.clip_high" in out


def test_eval_writes_results_and_predictions(tmp_path, capsys):
    out_dir = tmp_path / "eval"
    code = main(
        [
            "eval",
            "demo",
            f"model={REPO / 'assets/models/tiny-qwen2_5_vl'}",
            "data.max_test_samples=5",
            "--out",
            str(out_dir),
        ]
    )
    assert code == 0
    results = json.loads((out_dir / "results.json").read_text())
    assert results["task"] == "classification" and "accuracy" in results["metrics"]
    predictions = (out_dir / "predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 5
    assert {"id", "completion", "parsed", "score", "reason"} <= set(json.loads(predictions[0]))


def test_missing_image_is_named_or_skipped(tmp_path, capsys):
    bench = REPO / "assets/benchmarks/shapes_colour/test.jsonl"
    lines = bench.read_text().splitlines()[:3]
    broken = json.loads(lines[1])
    broken["messages"][0]["content"][0]["image"] = str(tmp_path / "missing.png")
    data = tmp_path / "test.jsonl"
    for i, line in enumerate(lines):
        record = json.loads(line) if i != 1 else broken
        for part in record["messages"][0]["content"]:
            if part["type"] == "image" and not Path(part["image"]).is_absolute():
                part["image"] = str(bench.parent / part["image"])
        with data.open("a") as f:
            f.write(json.dumps(record) + "\n")
    base = ["eval", "demo", f"data.test={data}", "--out", str(tmp_path / "o")]
    assert main(base) == 2
    assert "missing.png" in capsys.readouterr().err
    assert main([*base, "data.on_error=skip"]) == 0
    assert len((tmp_path / "o" / "predictions.jsonl").read_text().splitlines()) == 2


def test_report_one_run_and_a_comparison(tmp_path, capsys):
    for name, offset in (("a", 0.0), ("b", 0.5)):
        run = tmp_path / name
        run.mkdir()
        lines = [
            {
                "step": s,
                "train/reward": offset + s / 10,
                "train/reward/format": 1.0,
                "train/kl": 0.01 * s,
                "train/entropy": 1.0,
                "rollout/len_mean": 6.0,
                "time/rollout_s": 0.2,
                "time/update_s": 0.1,
            }
            for s in range(1, 6)
        ] + [{"step": 5, "eval/classification/accuracy": 0.5 + offset}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        (run / "summary.json").write_text(
            json.dumps(
                {"metric": "eval/classification/accuracy", "before": 0.25, "after": 0.5 + offset}
            )
        )
    assert (
        main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")])
        == 0
    )
    for path in (
        tmp_path / "a" / "report.png",
        tmp_path / "a" / "report.md",
        tmp_path / "cmp" / "comparison.png",
    ):
        assert path.is_file() and path.stat().st_size > 0
    table = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "| after | 0.5 | 1 |" in table
    assert "last eval/classification/accuracy" in table
    assert main(["report", str(tmp_path / "missing")]) == 2
