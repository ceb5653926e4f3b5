"""``mmrft train <recipe> --smoke``: every bundled recipe runs by name, from a directory outside
the checkout, with no other override: its family's tiny model on CPU, the recipe's settings
otherwise, two steps and a two-sample evaluation; with the user's data when it is there."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mmrft.cli import main
from mmrft.config import config_names, load_config
from mmrft.smoke import HTTP_ONLY, JUDGES, SANDBOXED, model_family, smoke_overrides
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "assets" / "benchmarks"
RECIPES = sorted(p.stem for p in (REPO / "configs" / "recipes").glob("*.yaml"))


@pytest.mark.parametrize(
    ("path", "family"),
    [
        ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_5_vl"),
        ("Video-R1/Qwen2.5-VL-7B-COT-SFT", "qwen2_5_vl"),
        ("Qwen/Qwen2-VL-2B-Instruct", "qwen2_vl"),
        ("Qwen/Qwen2-Audio-7B-Instruct", "qwen2_audio"),
        ("Qwen/Qwen2.5-Omni-7B", "qwen2_5_omni"),
        ("Qwen/Qwen3-VL-30B-A3B-Instruct", "qwen3_vl"),
        ("Qwen/Qwen3.5-27B", "qwen3_5"),
        ("Qwen/Qwen3-Omni-30B-A3B-Instruct", "qwen3_omni"),
        ("OpenGVLab/InternVL3-2B-hf", "internvl"),
        ("google/gemma-3-4b-it", "gemma3"),
        ("google/gemma-4-E4B-it", "gemma4"),
        ("/ckpt/my-run/step-500", None),
        (str(REPO / "assets" / "models" / "tiny-qwen2_vl"), "qwen2_vl"),  # config.json
    ],
)
def test_model_family_without_loading_the_model(path, family):
    cfg = load_config(None, [f"model.path={path}", "train.steps=0"])
    if family is None:
        with pytest.raises(ConfigError, match="cannot tell the model family.*set model.family"):
            model_family(cfg)
        cfg.model.family = "qwen2_vl"
        assert model_family(cfg) == "qwen2_vl"
    else:
        assert model_family(cfg) == family


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_smokes_by_name_from_outside_the_checkout(
    tmp_path, monkeypatch, capsys, recipe
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    paper = load_config(recipe)
    overrides, _ = smoke_overrides(paper)
    smoke = load_config(recipe, overrides)
    # what the recipe keeps: task, verifiers, algorithm (the overlong buffer scaled to 8 tokens),
    # data format when a bundled file has it, model switches
    assert smoke.task.name == paper.task.name
    assert smoke.task.params.get("think") == paper.task.params.get("think")
    assert [v["name"] for v in smoke.reward.verifiers] == [
        v["name"] for v in paper.reward.verifiers
    ]
    for ours, theirs in zip(smoke.reward.verifiers, paper.reward.verifiers):
        if ours["name"] in JUDGES:  # a served judge becomes a local tiny one, nothing else
            assert ours["params"]["backend"] == "local"
            kept = {k: v for k, v in theirs.get("params", {}).items() if k not in HTTP_ONLY}
            assert {k: ours["params"][k] for k in kept if k != "backend"} == {
                k: v for k, v in kept.items() if k != "backend"
            }
        else:
            assert ours == theirs
    assert (smoke.reward.timeout_s, smoke.reward.isolation) == (
        paper.reward.timeout_s,
        paper.reward.isolation,
    )
    assert smoke.algorithm.beta == paper.algorithm.beta
    assert smoke.algorithm.temporal_contrast == paper.algorithm.temporal_contrast
    assert smoke.model.gradient_checkpointing == paper.model.gradient_checkpointing
    assert smoke.data.on_error == paper.data.on_error
    assert (smoke.device, smoke.model.dtype, smoke.train.steps) == ("cpu", "float32", 2)
    assert main(["train", recipe, "--smoke"]) == 0
    # the last line says which stages ran: a tool recipe's scripted call and the model's
    # next turn, a judge recipe's verdicts, a code recipe's sandbox runs
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.match(r"smoke: stages run: rollout \(hf\) [1-9]\d* completions", line), line
    if paper.rollout.tools.names:
        calls = r"tool calls [1-9]\d* \([1-9]\d* scripted, [1-9]\d* ran without error\)"
        assert re.search(calls + r"; later turns [1-9]", line), line
    if any(v["name"] in JUDGES for v in paper.reward.verifiers):
        assert re.search(r"judge calls [1-9]", line), line
    if any(v["name"] in SANDBOXED for v in paper.reward.verifiers):  # the reference program
        assert re.search(r"sandbox runs [1-9]", line), line
    run = tmp_path / "runs" / f"{recipe}-smoke"  # named as the user named the recipe
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "train/reward" in m] == [1, 2]
    predictions = (run / "eval" / "after" / "predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 2
    assert (run / "checkpoints" / "step-000002" / "config.json").is_file()
    assert not (REPO / "runs" / f"{recipe}-smoke").exists()


def test_smoke_keeps_the_users_data_and_their_overrides(tmp_path, monkeypatch, capsys):
    """The user's data (here VLM-R1's conversations layout, relative to the current directory)
    is what a smoke run reads, and the command line's overrides beat the smoke settings."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    lines = []
    for line in (BENCH / "shapes_grounding" / "train.jsonl").read_text().splitlines()[:6]:
        record = json.loads(line)
        image, text = record["messages"][0]["content"]
        lines.append(
            {
                "image": Path(image["image"]).name,
                "conversations": [
                    {"from": "human", "value": "<image>" + text["text"]},
                    {"from": "gpt", "value": json.dumps(record["target"])},
                ],
            }
        )
    Path("rec.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    code = main(
        [
            "train",
            "vlm_r1_rec",
            "--smoke",
            "data.train=rec.jsonl",
            "data.test=rec.jsonl",
            "data.format=conversations",
            f"data.media_root={BENCH / 'shapes_grounding' / 'images'}",
            "train.steps=1",
            "train.completions_every=1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert f"--smoke: data: {tmp_path / 'rec.jsonl'}" in out
    run = tmp_path / "runs" / "vlm_r1_rec-smoke"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "train/reward" in m] == [1]
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert rows and {r["id"] for r in rows} <= {str(n) for n in range(1, 7)}  # rec.jsonl's lines


def test_every_bundled_config_name_smokes_or_says_why():
    """Every name `mmrft train NAME --smoke` takes resolves to a tiny model."""
    for name in config_names():
        overrides, notes = smoke_overrides(load_config(name))
        assert any(o.startswith("model.path=") for o in overrides) and notes


def test_smoke_does_not_ask_to_raise_its_own_budget(tmp_path, monkeypatch, capsys):
    """--smoke cuts completions to 8 tokens; it says so instead of warning to raise the
    budget it set itself."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "time_r1", "--smoke"]) == 0
    out = capsys.readouterr().out
    assert "Raise rollout.max_new_tokens" not in out and "smoke run:" in out


def test_data_named_on_the_command_line_but_absent_gets_the_bundled_stand_in(tmp_path, monkeypatch):
    """The README's smoke line names the user's /data files; on a machine without them the
    bundled examples stand in (the command line's other overrides still win)."""
    monkeypatch.chdir(tmp_path)
    argv = [
        "train",
        "vlm_r1_rec",
        "--smoke",
        "task.params.image_root=/nonexistent/coco",
        "data.train=/nonexistent/train.jsonl",
        "data.test=/nonexistent/val.jsonl",
        "train.seed=7",
    ]
    assert main(argv) == 0
    saved = (tmp_path / "runs" / "vlm_r1_rec-smoke" / "config.yaml").read_text()
    assert "/nonexistent/train" not in saved and "/nonexistent/val" not in saved
    assert "seed: 7" in saved


def test_smoke_evaluates_lmms_eval_on_its_bundled_local_task():
    """A config's lmms-eval tasks (which download from the Hub) become the bundled local one, two
    samples; a best-checkpoint metric of the harness follows."""
    pytest.importorskip("lmms_eval")
    harness = [
        "eval.harness=lmms_eval",
        "eval.harness_tasks=[mmmu_val, chartqa]",
        "checkpoint.keep_best=harness/mmmu_val/mmmu_acc",
    ]
    cfg = load_config("vlm_r1_rec", harness)
    overrides, notes = smoke_overrides(cfg, "vlm_r1_rec")
    smoke = load_config("vlm_r1_rec", [*harness, *overrides])
    assert smoke.eval.harness_tasks == ["mmrft_shapes_colour"] and smoke.eval.harness_limit == 2
    assert smoke.checkpoint.keep_best == "harness/mmrft_shapes_colour/acc"
    assert any("mmmu_val, chartqa → mmrft_shapes_colour" in n for n in notes)


def test_smoke_puts_a_served_teacher_in_process() -> None:
    """teacher.server.url (a server the smoke run cannot reach) becomes the tiny model as an
    in-process teacher: the distillation path runs."""
    served = ["teacher.server.url=http://teacher.example:8000"]
    cfg = load_config("opd_qwen2_5_vl", served)
    overrides, notes = smoke_overrides(cfg, "opd_qwen2_5_vl")
    smoke = load_config("opd_qwen2_5_vl", [*served, *overrides])
    assert smoke.teacher.server.url is None and smoke.teacher.path == smoke.model.path
    assert any("(served at http://teacher.example:8000)" in n for n in notes)
