"""report.png is readable: labelled axes, readable legends, the chance level, the evaluation
before and after RL marked, the warm start shown, one colour per run in a comparison."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.colors import to_hex

from mmrft.evaluation.report import RunData, figure, report_runs


def fake_run(path: Path, offset: float = 0.0, warm: bool = True) -> Path:
    path.mkdir()
    lines = [
        {
            "step": s,
            "train/reward": 1 + offset + s / 10,
            "train/reward/format": 1.0,
            "train/reward/accuracy": offset + s / 10,
            "train/entropy": 1.0 - s / 10,
            "rollout/len_mean": 6.0,
            "time/rollout_s": 0.2,
            "time/reward_s": 0.01,
            "time/update_s": 0.1,
        }
        for s in range(1, 6)
    ]
    lines.insert(
        0, {"step": 0, "eval/classification/accuracy": 0.25, "eval/classification/format_fail": 0.0}
    )
    lines.append(
        {
            "step": 5,
            "eval/classification/accuracy": 0.5 + offset,
            "eval/classification/format_fail": 0.0,
        }
    )
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = {
        "metric": "eval/classification/accuracy",
        "chance": 0.25,
        "before": 0.25,
        "after": 0.5 + offset,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    if warm:
        (path / "warm_start.jsonl").write_text(
            "".join(json.dumps({"step": k, "loss": 3.0 / k}) + "\n" for k in range(1, 4))
        )
    return path


def panels(fig) -> dict[str, object]:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_one_run_report_is_readable(tmp_path):
    run = fake_run(tmp_path / "demo")
    fig = figure({"demo": RunData.read(run)}, "demo")
    axes = panels(fig)
    assert set(axes) >= {
        "training reward (mean over the step's completions)",
        "evaluation on the test split",
        "warm start (supervised, before RL)",
        "policy entropy",
        "completion length",
        "time per RL step",
    }
    for title, ax in axes.items():
        assert ax.get_xlabel() and ax.get_ylabel(), title
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert all("/" not in label for label in labels), (title, labels)  # no raw metric keys
        assert min(t.get_fontsize() for t in ax.get_legend().get_texts()) >= 8
    reward = axes["training reward (mean over the step's completions)"]
    assert [t.get_text() for t in reward.get_legend().get_texts()] == [
        "total",
        "accuracy",
        "format",
    ]
    evaluation = axes["evaluation on the test split"]
    assert evaluation.get_ylabel() == "accuracy"
    chance = [line for line in evaluation.get_lines() if line.get_label() == "chance (0.25)"]
    assert chance and list(chance[0].get_ydata()) == [0.25, 0.25]
    notes = [t.get_text() for t in evaluation.texts]
    assert "before RL 0.250" in notes and "after RL 0.500" in notes
    assert axes["warm start (supervised, before RL)"].get_xlabel() == "warm-start step"
    plt.close(fig)
    report_runs([run])
    assert (run / "report.png").stat().st_size > 0


def test_comparison_gives_each_run_one_colour_and_nothing_overlaps(tmp_path):
    """Colour names the run (one figure legend with before → after), line style the series
    (each panel's legend once, in black); no legend or note covers another or a panel."""
    a, b = fake_run(tmp_path / "a"), fake_run(tmp_path / "b", offset=0.3, warm=False)
    fig = figure({"a": RunData.read(a), "b": RunData.read(b)}, "a vs b")
    (legend,) = fig.legends
    runs = {
        t.get_text(): to_hex(h.get_color()) for t, h in zip(legend.texts, legend.legend_handles)
    }
    assert list(runs) == ["a (0.250 → 0.500)", "b (0.250 → 0.800)"]
    assert len(set(runs.values())) == 2
    for title, ax in panels(fig).items():
        colours = {to_hex(line.get_color()) for line in ax.get_lines()} - {to_hex("gray")}
        assert colours <= set(runs.values()), title
        if title != "warm start (supervised, before RL)":  # run b has no warm start
            assert colours == set(runs.values()), title
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert len(labels) == len(set(labels)) and all(":" not in x for x in labels), labels
    reward = panels(fig)["training reward (mean over the step's completions)"]
    assert [t.get_text() for t in reward.get_legend().get_texts()] == [
        "total",
        "accuracy",
        "format",
    ]
    assert {to_hex(h.get_color()) for h in reward.get_legend().legend_handles} == {"#000000"}
    assert not panels(fig)["evaluation on the test split"].texts  # the values are in the legend

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [("run legend", legend.get_window_extent(renderer))]
    boxes.append(("title", fig._suptitle.get_window_extent(renderer)))
    boxes += [(ax.get_title(), ax.get_tightbbox(renderer)) for ax in panels(fig).values()]
    for i, (name, box) in enumerate(boxes):
        for other, box2 in boxes[i + 1 :]:
            assert not box.overlaps(box2), (name, other)
    plt.close(fig)


def test_tool_rollouts_get_turn_and_call_panels(tmp_path):
    """Runs with tools: turns and call-success curves (training and evaluation), and the
    evaluation panel keeps the task's metrics only."""
    run = fake_run(tmp_path / "tools")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        if "train/reward" in line:
            line.update({"rollout/tools/turns_mean": 1.5, "rollout/tools/use_rate": 0.5})
            line["rollout/tools/call_success"] = 0.25
        elif "eval/classification/accuracy" in line:
            line.update({"eval/classification/tools/turns_mean": 2.0})
            line["eval/classification/tools/calls/crop"] = 1.0
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    fig = figure({"tools": RunData.read(run)}, "tools")
    axes = panels(fig)
    turns = [t.get_text() for t in axes["tool rollouts: turns"].get_legend().get_texts()]
    assert sorted(turns) == ["turns", "turns (evaluation)"]
    calls = [t.get_text() for t in axes["tool rollouts: calls"].get_legend().get_texts()]
    assert set(calls) == {"calls that succeeded", "trajectories with a successful call"}
    evaluation = [
        t.get_text() for t in axes["evaluation on the test split"].get_legend().get_texts()
    ]
    assert not any("turns" in label or "crop" in label for label in evaluation)
    plt.close(fig)


def test_describe_run_names_model_task_device_data_and_tools():
    """One line like training's banner; a hostile path with markup brackets and spaces stays
    verbatim (the caller escapes it for rich); one sample is singular; tools are named."""
    from mmrft.config import RunConfig
    from mmrft.evaluation.report import describe_run

    cfg = RunConfig()
    cfg.model.path = "/m/[bold]odd name[/bold]"
    cfg.data.test = "/d/t e s t.jsonl"
    cfg.task.name = "grounding"
    line = describe_run(cfg, "qwen2_5_vl", "cuda:0", 1)
    assert line == (
        f"eval: model /m/[bold]odd name[/bold] (qwen2_5_vl, {cfg.model.dtype}); task grounding; "
        "device cuda:0; 1 sample of /d/t e s t.jsonl"
    )
    cfg.rollout.tools.names = ["crop", "zoom"]
    line = describe_run(cfg, "qwen2_5_vl", "cpu", 40)
    assert line.endswith(
        f"40 samples of /d/t e s t.jsonl; tools crop, zoom (at most {cfg.rollout.tools.max_turns} turns)"
    )
    assert "\n" not in line


def test_a_distillation_run_gets_the_reverse_kl_panel(tmp_path):
    run = fake_run(tmp_path / "distill")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        if "train/reward" in line:
            line.update({"distill/reverse_kl": 0.5 / line["step"], "distill/teacher_agree": 0.5})
            line["time/teacher_forward_s"] = 0.05
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    fig = figure({"distill": RunData.read(run)}, "distill")
    axes = panels(fig)
    labels = [t.get_text() for t in axes["on-policy distillation"].get_legend().get_texts()]
    assert sorted(labels) == ["reverse KL to the teacher", "tokens at the teacher's argmax"]
    times = [t.get_text() for t in axes["time per RL step"].get_legend().get_texts()]
    assert "teacher" in times
    plt.close(fig)


def test_a_run_with_a_harness_gets_the_benchmarks_panel(tmp_path):
    run = fake_run(tmp_path / "harness")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        if any(k.startswith("eval/") for k in line):
            line.update({"harness/mmmu_val/acc": 0.3, "harness/mmmu_val/acc_stderr": 0.01})
            line["harness/chartqa/relaxed_overall"] = 0.5
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    fig = figure({"harness": RunData.read(run)}, "harness")
    legend = panels(fig)["lmms-eval benchmarks (eval.harness)"].get_legend()
    assert sorted(t.get_text() for t in legend.get_texts()) == [
        "chartqa/relaxed_overall",
        "mmmu_val/acc",
    ]  # stderrs left out
    plt.close(fig)
