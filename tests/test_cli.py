"""The command line, run in-process through mmrft.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    # a malformed meta or messages field is the input's fault, named with its line, for every
    # verifier (iou and temporal_iou read meta, svg reads messages)
    path.write_text('{"completion": "x", "target": [0, 1], "meta": "x"}\n')
    for name in ("iou", "temporal_iou"):
        assert main(["verify", name, str(path)]) == 2
        assert "in.jsonl:1: 'meta' must be a JSON object" in capsys.readouterr().err
    path.write_text('{"completion": "x", "target": [0, 1], "messages": "x"}\n')
    assert main(["verify", "svg", str(path)]) == 2
    assert "in.jsonl:1: 'messages' must be a list" in capsys.readouterr().err
    assert main(["train", "rollout.group_sise=3"]) == 2
    assert "did you mean 'rollout.group_size'" in capsys.readouterr().err


def test_list(capsys):
    for what, expected in [
        ("tasks", "grounding"),
        ("verifiers", "iou"),
        ("samplers", "curriculum"),
        ("models", "qwen2_5_vl"),
        ("configs", "configs/recipes/time_r1.yaml"),
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
    assert {"id", "target", "completion", "parsed", "score", "reason"} <= set(
        json.loads(predictions[0])
    )
    test = (REPO / "assets/benchmarks/shapes_colour/test.jsonl").read_text().splitlines()
    assert json.loads(predictions[0])["target"] == json.loads(test[0])["target"]


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


def test_report_one_run_and_a_comparison(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a comparison without --out goes to the current directory
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
    assert not (tmp_path / "a" / "report.png").exists()  # --out: nothing written elsewhere
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
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


def verify_lines(tmp_path: Path, capsys, name: str, lines: list[dict], *params: str) -> list:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["verify", name, str(path), *params]) == 0
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def test_verify_detection(tmp_path, capsys):
    meta = {"image_size": [100, 100], "box_frame": "pixels"}
    target = [[10, 10, 50, 50], [60, 60, 90, 90]]
    both = '[{"bbox_2d": [10, 10, 50, 50]}, {"bbox_2d": [60, 60, 90, 90]}]'
    lines = [
        {"completion": f"<answer>{both}</answer>", "target": target, "meta": meta},
        {
            "completion": '<answer>[{"bbox_2d": [10, 10, 50, 50]}]</answer>',
            "target": target,
            "meta": meta,
        },
        {"completion": "<answer>[]</answer>", "target": [], "meta": meta},
        {"completion": "<answer>boxes!</answer>", "target": target, "meta": meta},
    ]
    out = verify_lines(tmp_path, capsys, "detection", lines)
    assert [o["score"] for o in out] == [1.0, 0.5, 1.0, 0.0]
    assert out[3]["reason"] and out[0]["reason"] is None
    ap = verify_lines(tmp_path, capsys, "detection", lines[:2], "mode=ap")
    assert ap[0]["score"] == 1.0 and 0 < ap[1]["score"] < 1


def test_verify_temporal_iou(tmp_path, capsys):
    meta = {"duration": 40.0}
    lines = [
        {"completion": "<answer>10.0 to 20.0</answer>", "target": [10, 20], "meta": meta},
        {"completion": "<answer>00:15 - 00:25</answer>", "target": [10, 20], "meta": meta},
        {"completion": "<answer>20 to 10</answer>", "target": [10, 20], "meta": meta},
    ]
    out = verify_lines(tmp_path, capsys, "temporal_iou", lines)
    assert [o["score"] for o in out] == [1.0, 1 / 3, 0.0]
    assert out[2]["reason"] == "reversed interval" and out[1]["parts"]["start_error_s"] == 5.0
    r1 = verify_lines(tmp_path, capsys, "temporal_iou", lines, "threshold=0.5")
    assert [o["score"] for o in r1] == [1.0, 0.0, 0.0]


def test_verify_chart_code(tmp_path, capsys):
    pytest.importorskip("skimage")
    reference = "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 3], color='red')\n"
    meta = {"image_size": [160, 120]}
    lines = [
        {
            "completion": f"<answer>```python\n{reference}```</answer>",
            "target": reference,
            "meta": meta,
        },
        {
            "completion": "<answer>import os\nos._exit(3)</answer>",
            "target": reference,
            "meta": meta,
        },
    ]
    out = verify_lines(tmp_path, capsys, "chart_code", lines, "timeout_s=5")
    assert out[0]["score"] == 1.0 and out[0]["parts"]["exec"] == 1.0
    assert out[1]["score"] == 0.0 and out[1]["reason"] and out[1]["parts"] == {"exec": 0.0}


def test_verify_svg(tmp_path, capsys):
    cairosvg = pytest.importorskip("cairosvg")
    pytest.importorskip("skimage")
    drawing = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64">'
        '<rect width="64" height="64" fill="white"/><circle cx="32" cy="32" r="20" fill="blue"/></svg>'
    )
    image = tmp_path / "target.png"
    cairosvg.svg2png(bytestring=drawing.encode(), write_to=str(image))
    meta = {"image": str(image)}
    lines = [
        {"completion": f"<answer>{drawing}</answer>", "target": drawing, "meta": meta},
        {"completion": "<answer><svg broken</answer>", "target": drawing, "meta": meta},
    ]
    out = verify_lines(tmp_path, capsys, "svg", lines, "length_weight=0.1")
    assert out[0]["score"] == pytest.approx(1.0, abs=1e-6) and out[0]["parts"]["sim"] > 0.99
    assert out[1]["score"] == -1.0 and out[1]["reason"]


BRACKETS_PLUGIN = """
from mmrft import verifier

@verifier("test_brackets", low=0.0, high=1.0)
def brackets(completions, samples, *, pattern: str = "[a-z]+"):
    \"\"\"Scores a box [x1, y1, x2, y2] of an image [W, H] in [start, end].\"\"\"
    return [0.0 for _ in completions]
"""


def test_brackets_survive_in_list_and_error_messages(tmp_path, capsys, monkeypatch):
    """Rich reads [a-z]+ or [x1, y1, x2, y2] as markup and drops it unless it is escaped."""
    monkeypatch.setenv("COLUMNS", "400")
    plugin = tmp_path / "brackets.py"
    plugin.write_text(BRACKETS_PLUGIN)
    assert main(["list", "verifiers", "--plugin", str(plugin)]) == 0
    out = capsys.readouterr().out
    assert "pattern: str = '[a-z]+'" in out
    assert "a box [x1, y1, x2, y2] of an image [W, H] in [start, end]" in out
    bench = REPO / "assets/benchmarks/shapes_grounding"
    bad = tmp_path / "bad.jsonl"
    line = json.loads((bench / "train.jsonl").read_text().splitlines()[0])
    line["messages"][0]["content"][0]["image"] = str(
        bench / line["messages"][0]["content"][0]["image"]
    )
    bad.write_text(json.dumps({**line, "target": "left"}) + "\n")
    assert main(["eval", "demo", "task.name=grounding", f"data.test={bad}"]) == 2
    err = capsys.readouterr().err
    assert "'target' must be a box [x1, y1, x2, y2] in pixels" in err


def test_the_banner_says_what_runs_and_what_it_builds_on(tmp_path, capsys):
    """Overrides alone build on the demo config and the first line says so; the banner names
    model, task, device, processes and trainable parameters even when they are defaults; a
    second run of the same command says the run is finished."""
    command = [
        "train",
        "train.steps=1",
        "warm_start.steps=0",
        "eval.before=false",
        "eval.after=false",
        "model.lora.enabled=true",
        f"output_dir={tmp_path}",
    ]
    assert main(command) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("no config given: building on demo.yaml")
    for part in ("run: model", "tiny-qwen2_5_vl", "task classification", "device cpu", "1 process"):
        assert part in out, part
    assert "trainable parameters" in out and "LoRA r=64" in out
    assert main(command) == 0
    # rich wraps the line at the run folder's path, whose length varies (xdist adds popen-gwN/)
    assert "is finished" in " ".join(capsys.readouterr().out.split())


def test_a_warm_start_alone_saves_its_model(tmp_path, capsys):
    """``train.steps=0`` with a warm start and no evaluation: supervised training alone (a
    reader's pre-training); it ends with a loadable checkpoint and no report to draw."""
    from transformers import AutoModelForImageTextToText

    command = ["train", "demo", "train.steps=0", "warm_start.steps=2", "eval.before=false"]
    assert main([*command, "eval.after=false", f"output_dir={tmp_path}", "name=sft"]) == 0
    run = tmp_path / "sft"
    assert len((run / "warm_start.jsonl").read_text().splitlines()) == 2
    assert not (run / "metrics.jsonl").exists() and not (run / "report.png").exists()
    AutoModelForImageTextToText.from_pretrained(run / "checkpoints" / "step-000000")
    assert "summary:" in capsys.readouterr().out


def test_failures_a_user_causes_are_one_line_with_exit_2(tmp_path, capsys, monkeypatch):
    """No CUDA device, vLLM not installed, a run folder given to eval, a missing extra."""
    import importlib.util

    import torch

    base = ["train", "demo", "train.steps=1", "warm_start.steps=0", f"output_dir={tmp_path}"]
    if not torch.cuda.is_available():
        assert main([*base, "device=cuda", "name=cuda"]) == 2
        err = capsys.readouterr().err
        assert "no CUDA device" in err and "Traceback" not in err
    if importlib.util.find_spec("vllm") is None:
        assert main([*base, "rollout.engine=vllm", "name=vllm", "eval.before=false"]) == 2
        err = capsys.readouterr().err
        assert "pip install 'mmrft[vllm]'" in err and "Traceback" not in err
    assert main([*base, "name=run", "eval.before=false", "eval.after=false"]) == 0
    capsys.readouterr()
    assert main(["eval", "demo", f"model={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "it is a run folder" in err and "checkpoints/step-000001" in err

    from mmrft import audio
    from mmrft.typecheck import ConfigError

    real = importlib.import_module

    def no_soundfile(name, *args, **kwargs):
        if name == "soundfile":
            raise ImportError("No module named 'soundfile'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_soundfile)
    with pytest.raises(ConfigError, match=r"pip install 'mmrft\[audio\]'"):
        audio.decode_audio("x.wav")


def test_version_and_list_alone(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("mmrft ")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for title in ("tasks", "verifiers", "tools", "configs"):
        assert title in out


def test_list_tools_says_where_each_runs_and_whether_it_has_an_example(tmp_path, capsys):
    plugin = tmp_path / "here_tool.py"
    plugin.write_text(
        "from mmrft.rollout import tool\n"
        "EMPTY = {'type': 'object', 'properties': {}}\n"
        "@tool('test_cli_here', isolate=False, parameters=EMPTY)\n"
        "def here(context):\n"
        "    return 'hello'\n"
    )
    from mmrft.plugins import load_plugins

    load_plugins([str(plugin)])
    assert main(["list", "tools"]) == 0
    rows = {
        line.split("│")[1].strip(): line
        for line in capsys.readouterr().out.splitlines()
        if "│" in line and line.split("│")[1].strip()
    }
    assert "worker" in rows["crop"] and "yes" in rows["crop"]
    assert "trainer" in rows["test_cli_here"] and "│ no " in rows["test_cli_here"]


def test_sampled_evaluation_reports_pass_at_k(tmp_path):
    """eval.n = 4: four sampled completions per sample, pass@1/2/4 by the unbiased estimator,
    the same samples twice; mmrft eval's default folder is not a training evaluation's name."""
    from mmrft.evaluation.evaluate import pass_at_k

    assert pass_at_k([1, 0, 0, 0, 1, 1, 1, 1], 4) == {
        "pass@1": pytest.approx((0.25 + 1.0) / 2),
        "pass@2": pytest.approx((0.5 + 1.0) / 2),
        "pass@4": 1.0,
    }
    assert pass_at_k([0.3, 1.0], 2) == {}  # a continuous metric has none
    model = f"model={REPO / 'assets/models/tiny-qwen2_5_vl'}"
    args = ["eval", "demo", model, "data.max_test_samples=3", "eval.n=4", f"output_dir={tmp_path}"]
    assert main(args) == 0
    folder = tmp_path / "demo" / "eval" / "of-tiny-qwen2_5_vl"
    results = json.loads((folder / "results.json").read_text())
    assert {"pass@1", "pass@2", "pass@4"} <= set(results["metrics"])
    first = (folder / "predictions.jsonl").read_text()
    assert len(first.splitlines()) == 12
    assert main(args) == 0
    assert (folder / "predictions.jsonl").read_text() == first  # seeded: the same samples


def test_verifier_plugins_as_evaluation_metrics(tmp_path):
    """eval.verifiers: a plugin verifier scores the evaluation's completions as a metric."""
    plugin = tmp_path / "length.py"
    plugin.write_text(
        "from mmrft import verifier\n\n"
        "@verifier('test_eval_length', low=0.0, high=1.0)\n"
        "def length(completions, samples):\n"
        "    return [min(len(c), 10) / 10 for c in completions]\n"
    )
    model = f"model={REPO / 'assets/models/tiny-qwen2_5_vl'}"
    args = [
        "eval", "demo", model, "data.max_test_samples=3", f"plugins=[{plugin}]",
        "eval.verifiers=[{name: test_eval_length}, {name: format, params: {think: none}}]",
        "--out", str(tmp_path / "e"),
    ]  # fmt: skip
    assert main(args) == 0
    metrics = json.loads((tmp_path / "e" / "results.json").read_text())["metrics"]
    assert 0.0 <= metrics["verifier/test_eval_length"] <= 1.0
    assert "verifier/format" in metrics and "accuracy" in metrics
    bad = [*args[:-2], "eval.verifiers=[{name: test_eval_lenght}]"]
    assert main(bad) == 2  # an unknown name fails at start-up, with the closest one


def test_list_is_clean_text(capsys):
    """No reStructuredText markup, each verifier's range once, every task described."""
    assert main(["list", "verifiers"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out and ":func:" not in out
    assert "Range [" not in out and "[-1, 0]" in out  # tool_failures' range, in its column
    assert main(["list", "tasks"]) == 0
    out = capsys.readouterr().out
    from mmrft.plugins import TASKS

    builtin = {n for n in TASKS.names() if TASKS.get(n).__module__.startswith("mmrft.tasks")}
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("│ ") and line.split("│")[1].strip() in builtin
    ]
    assert len(rows) == len(builtin)  # (plugins other tests registered may lack one)
    assert all(line.rstrip().split("│")[-2].strip() for line in rows)  # a description each


def test_a_native_crash_of_mmrft_train_prints_the_python_stacks():
    """What a rank that aborts in native code ("terminate called ...", a decoder's SIGSEGV)
    leaves behind: every thread's Python stack, not only the signal."""
    import subprocess
    import sys

    from mmrft.cli import report_native_crashes

    report_native_crashes()  # under pytest's captured stderr: a no-op, not an error
    code = (
        "from mmrft.cli import report_native_crashes\n"
        "report_native_crashes()\n"
        "def decode():\n"
        "    import os\n"
        "    os.abort()\n"
        "decode()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Fatal Python error: Aborted" in done.stderr
    assert "line 5 in decode" in done.stderr, done.stderr[-600:]


def test_eval_says_what_it_runs_without_transformers_bars(tmp_path, capsys):
    """`mmrft eval` prints a model/device line before evaluating, no transformers ``Loading
    weights`` bar, and the result's title (task, model, test file) on a line of its own, not
    wrapped inside the table's narrow width."""
    model = REPO / "assets/models/tiny-qwen2_5_vl"
    test = REPO / "assets/benchmarks/shapes_colour/test.jsonl"
    args = ["eval", "demo", f"model={model}", "data.max_test_samples=3", "--out", str(tmp_path)]
    assert main(args) == 0
    captured = capsys.readouterr()
    out = " ".join(captured.out.split())
    assert f"eval: model {model} (qwen2_5_vl, float32); task classification; device cpu" in out
    assert f"3 samples of {test}" in out
    assert out.index("eval: model") < out.index("accuracy")
    assert f"classification: {model} on {test}" in out  # each path whole, not cut at a column
    assert "Loading weights" not in captured.err and "Loading weights" not in captured.out


def test_no_weight_bars_restores_the_settings_it_found():
    """transformers' bars come back after the block (also when it raises); the hub's download
    bars stay on inside it, and stay off after it when they were off before."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from transformers.utils import logging as hf_logging

    from mmrft.models.family import no_weight_bars

    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
    with pytest.raises(RuntimeError), no_weight_bars():
        assert not hf_logging.is_progress_bar_enabled()
        assert not are_progress_bars_disabled()  # downloads still show
        raise RuntimeError("a failed load")
    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
    disable_progress_bars()
    try:
        with no_weight_bars():
            assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
        assert hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
    finally:
        enable_progress_bars()


def test_make_demo_says_what_it_installs_before_the_quiet_install():
    """The install recipe announces what it installs and that it takes minutes, before pip."""
    lines = (REPO / "Makefile").read_text().split("$(STAMP): pyproject.toml\n", 1)[1]
    recipe = lines.split("\n\n", 1)[0].splitlines()
    pip = next(i for i, line in enumerate(recipe) if "pip install" in line)
    said = [line for line in recipe[:pip] if line.strip().startswith("@echo")]
    assert said and "a few minutes" in said[0] and "installing" in said[0]
    assert any("installed" in line for line in recipe[pip + 1 :] if "@echo" in line)


def test_the_demo_checkpoints_while_it_trains():
    """A kill before the end of the demo keeps a checkpoint to resume from."""
    from mmrft.config import load_config

    cfg = load_config("demo", [])
    assert 0 < cfg.checkpoint.every < cfg.train.steps


@pytest.mark.slow
def test_checkpoints_do_not_change_what_is_learnt(tmp_path):
    """Saving draws no random numbers: a run that checkpoints every step logs the same metrics
    and ends with the same weights as one that checkpoints only at the end."""
    from safetensors.torch import load_file

    def run(every: int) -> tuple[list[dict], dict]:
        name = f"every{every}"
        args = ["train", "demo", "train.steps=3", "warm_start.steps=2", "eval.before=false"]
        args += ["eval.after=false", "eval.every=0", f"checkpoint.every={every}"]
        assert main([*args, f"output_dir={tmp_path}", f"name={name}"]) == 0
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        clock = ("time/", "throughput/")  # wall-clock measures differ between runs
        kept = [{k: v for k, v in json.loads(x).items() if not k.startswith(clock)} for x in lines]
        return kept, load_file(tmp_path / name / "checkpoints/step-000003/model.safetensors")

    (metrics_a, weights_a), (metrics_b, weights_b) = run(0), run(1)
    assert len(metrics_a) == 3 and metrics_a == metrics_b
    assert weights_a.keys() == weights_b.keys()
    assert all(bool((weights_a[k] == weights_b[k]).all()) for k in weights_a)
