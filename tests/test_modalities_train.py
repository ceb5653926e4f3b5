"""A short training run and an evaluation run per modality on CPU with the tiny models, and
one training step of every paper recipe with its tiny stand-in.

Each modality run goes through :func:`mmrft.training.trainer.train` with overrides on
``configs/demo.yaml`` (as ``tests/test_trainer.py`` does): no warm start, 2 RL steps of 2
prompts × 4 completions, a few new tokens, an evaluation of 2 test samples after RL, and a
plugin length reward so that advantages are non-zero for a random model. It checks that the run
finished, ``metrics.jsonl`` has steps 1 and 2, the evaluation wrote its predictions with the
task's metrics, and the final checkpoint loads with the family's transformers class.

The recipe runs load each ``configs/recipes/*.yaml`` as written and substitute only what a CPU
test must: the matching tiny model, ``device=cpu``, ``float32``, the bundled data of the same
modality (in the recipe's own dataset format where a bundled file has it) and tiny sizes.

Runs that only repeat what tests/test_smoke.py trains by default (the same recipe or family,
task and data format, two steps and an evaluation) carry the ``slow`` marker: SMOKED and the
recipes outside OWN_FORMAT; ``-m slow`` runs them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import NO_EVAL, length_plugin, short_run

from mmrft.config import load_config
from mmrft.smoke import SMALL_MEDIA
from mmrft.training.trainer import train

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "assets" / "models"
BENCH = REPO / "assets" / "benchmarks"

# The transformers class that loads each tiny model's checkpoint.
LOADERS = {
    "tiny-qwen2_5_vl": "AutoModelForImageTextToText",
    "tiny-qwen2_vl": "AutoModelForImageTextToText",
    "tiny-qwen2_audio": "Qwen2AudioForConditionalGeneration",
    "tiny-qwen2_5_omni": "Qwen2_5OmniThinkerForConditionalGeneration",
    **{
        f"tiny-{family}": "AutoModelForImageTextToText"
        for family in (
            "qwen3_vl",
            "qwen3_vl_moe",
            "qwen3_5",
            "qwen3_omni",
            "internvl",
            "gemma3",
            "glm4v",
            "gemma4",
        )
    },
}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    return length_plugin(tmp_path_factory.mktemp("plugins"))


def assert_finished(summary: dict, model: str, metric: str) -> Path:
    """The run finished: 2 logged steps, eval predictions and metrics, a loadable checkpoint."""
    run = Path(summary["run_dir"])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "train/reward" in m] == [1, 2]
    predictions = run / "eval" / "after" / "predictions.jsonl"
    assert len(predictions.read_text().splitlines()) == 2
    results = json.loads((run / "eval" / "after" / "results.json").read_text())
    assert metric in results["metrics"] and "format_fail" in results["metrics"]
    assert summary["metric"].endswith(f"/{metric}") and summary["steps"] == 2
    checkpoint = run / "checkpoints" / "step-000002"
    import transformers

    loaded = getattr(transformers, LOADERS[model]).from_pretrained(checkpoint)
    assert sum(p.numel() for p in loaded.parameters()) > 0
    return run


def modality(
    name: str,
    model: str,
    task: str,
    folder: str,
    metric: str = "accuracy",
    check: str = "{name: accuracy}",
    think: str = "none",
    files: tuple[str, str] = ("train.jsonl", "test.jsonl"),
    fmt: str = "mmrft",
    params: str = "",
) -> tuple[str, ...]:
    """(id, model, task, params, train file, test file, format, reward verifiers, primary
    metric) of a run on the bundled ``folder``: format (with ``think``), the task's ``check``
    and the length plugin as rewards."""
    verifiers = f"[{{name: format, params: {{think: {think}}}}}, {check}, {{name: test_length}}]"
    train, test = (f"{folder}/{file}" for file in files)
    return (name, model, task, f"{{think: {think}{params}}}", train, test, fmt, verifiers, metric)


QWEN25 = "tiny-qwen2_5_vl"
R1_AQA = ("r1_aqa_train.jsonl", "r1_aqa_test.jsonl")
MODALITIES = [
    modality("video-temporal", QWEN25, "temporal_grounding", "video_temporal", "R1@0.5",
             "{name: temporal_iou}"),
    modality("video-qa", QWEN25, "video_qa", "video_direction",
             files=("video_r1_train.json", "video_r1_test.json"), fmt="video_r1"),
    modality("audio-qa-qwen2_audio", "tiny-qwen2_audio", "audio_qa", "audio_pitch"),
    modality("audio-counting-omni", "tiny-qwen2_5_omni", "counting", "audio_beeps"),
    modality("audio-qa-omni", "tiny-qwen2_5_omni", "audio_qa", "audio_pitch", think="optional",
             files=R1_AQA, fmt="r1_aqa"),
    modality("audio-counting-qwen2_audio", "tiny-qwen2_audio", "counting", "audio_beeps"),
    modality("detection", QWEN25, "detection", "shapes_detection", "AP50", "{name: detection}"),
    modality("chart-qa", QWEN25, "chart_qa", "charts", "relaxed_accuracy",
             "{name: accuracy, params: {rel_tol: 0.05}}"),
    modality("chart-to-code", QWEN25, "chart_to_code", "charts", "low_level",
             "{name: chart_code, params: {timeout_s: 5.0}}",
             files=("code_train.jsonl", "code_test.jsonl"), params=", timeout_s: 5.0"),
]  # fmt: skip


GROUNDING = modality("", "", "grounding", "shapes_grounding", "acc@0.5", "{name: iou}")[2:]
VIDEO_QA = MODALITIES[1][2:]
AUDIO_QA = MODALITIES[4][2:]
# The newer families, every modality each takes: grounding for images (boxes in the family's
# frame), Video-R1 QA for videos, R1-AQA for audio.
FAMILY_MODALITIES = [
    (f"{kind}-{family}", f"tiny-{family}", *spec)
    for family, kinds in [
        ("qwen3_vl", ("image", "video")),
        ("qwen3_vl_moe", ("image",)),
        ("qwen3_5", ("image", "video")),
        ("qwen3_omni", ("image", "video", "audio")),
        ("internvl", ("image", "video")),
        ("gemma3", ("image",)),
        ("glm4v", ("image", "video")),
        ("gemma4", ("image", "video", "audio")),
    ]
    for kind, spec in (("image", GROUNDING), ("video", VIDEO_QA), ("audio", AUDIO_QA))
    if kind in kinds
]


# Runs that `-m slow` adds: by default each one's family, task and data format train for two
# steps and evaluate in tests/test_smoke.py::test_every_recipe_smokes_by_name_from_outside_the_checkout
# (the recipe named here), and the family's checkpoint loads with its transformers class in
# another run of this test (the same family, another modality).
SMOKED = {
    "video-qa": "video_r1",
    "chart-qa": "chart_qa",
    "chart-to-code": "chart_to_code",
    "image-qwen3_vl": "qwen3_vl_rec",
    "video-qwen3_5": "qwen3_5_video_r1",
    "audio-qwen3_omni": "qwen3_omni_aqa",
    "image-internvl": "internvl_rec",
    "image-glm4v": "glm4v_rec",
    "audio-gemma4": "gemma4_aqa",
}


@pytest.mark.parametrize(
    ("model", "task", "params", "train_file", "test_file", "fmt", "verifiers", "metric"),
    [
        pytest.param(*m[1:], id=m[0], marks=[pytest.mark.slow] if m[0] in SMOKED else [])
        for m in MODALITIES + FAMILY_MODALITIES
    ],
)
def test_two_steps_and_eval(
    tmp_path, plugin, model, task, params, train_file, test_file, fmt, verifiers, metric
):
    """Two GRPO steps, then an evaluation of 2 test samples (both splits in ``fmt``). The runs
    in SMOKED are slow-only (their default coverage is named there)."""
    cfg = load_config(
        REPO / "configs/demo.yaml",
        [
            *short_run(tmp_path, "run", group=4, new_tokens=6),
            f"model.path={MODELS / model}",
            *SMALL_MEDIA,
            f"task.name={task}",
            f"task.params={params}",
            f"data.train={BENCH / train_file}",
            f"data.test={BENCH / test_file}",
            f"data.format={fmt}",
            "data.max_test_samples=2",
            "eval.before=false",
            "eval.after=true",
            "eval.every=0",
            "checkpoint.every=0",
            "checkpoint.keep_last=1",
            "train.completions_every=1",
            "optim.lr=1e-3",
            f"plugins=[{plugin}]",
            f"reward.verifiers={verifiers}",
        ],
    )
    summary = train(cfg)
    assert_finished(summary, model, metric)


# -- the paper recipes, one step each with their tiny stand-ins ------------------------------------
def chartqa_files(tmp_path: Path) -> list[str]:
    """The bundled charts in ChartQA's own layout: ``<split>.json`` lists of {imgname, query,
    label} with the images in ``png/`` beside them."""
    (tmp_path / "png").symlink_to(BENCH / "charts" / "images")
    out = []
    for split in ("train", "test"):
        items = []
        for line in (BENCH / "charts" / f"{split}.jsonl").read_text().splitlines():
            record = json.loads(line)
            image, text = record["messages"][0]["content"]
            label = record["target"]
            items.append(
                {"imgname": Path(image["image"]).name, "query": text["text"], "label": str(label)}
            )
        (tmp_path / f"{split}.json").write_text(json.dumps(items))
        out.append(f"data.{split}={tmp_path / f'{split}.json'}")
    return out


def deepeyes_files(tmp_path: Path) -> list[str]:
    """The bundled zoom benchmark as DeepEyes' parquet rows (the user turn with <image>, the
    image as stored bytes, reward_model.ground_truth, env_name switching the tool on)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = BENCH / "zoom_marks"
    out = []
    for split in ("train", "test"):
        rows = []
        for line in (folder / f"{split}.jsonl").read_text().splitlines()[:8]:
            record = json.loads(line)
            image, text = record["messages"][0]["content"]
            rows.append(
                {
                    "prompt": [
                        {"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": f"<image>\n{text['text']}"},
                    ],
                    "images": [{"bytes": (folder / image["image"]).read_bytes(), "path": None}],
                    "reward_model": {"ground_truth": record["target"], "style": "model"},
                    "env_name": "visual_toolbox_v2",
                    "extra_info": {"index": record["id"]},
                }
            )
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{split}.parquet")
        out.append(f"data.{split}={tmp_path / f'{split}.parquet'}")
    return out


def refcoco_files(tmp_path: Path) -> list[str]:
    """The bundled grounding benchmark as VLM-R1's REC lines (image relative to image_root)."""
    out = [f"task.params.image_root={BENCH / 'shapes_grounding' / 'images'}"]
    for split in ("train", "test"):
        lines = []
        for line in (BENCH / "shapes_grounding" / f"{split}.jsonl").read_text().splitlines():
            record = json.loads(line)
            image, text = record["messages"][0]["content"]
            lines.append(
                json.dumps(
                    {
                        "image": Path(image["image"]).name,
                        "problem": text["text"],
                        "normal_caption": text["text"],
                        "solution": record["target"],
                    }
                )
            )
        (tmp_path / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        out.append(f"data.{split}={tmp_path / f'{split}.jsonl'}")
    return out


def bundled(train: str, test: str, *extra: str) -> Callable[[Path], list[str]]:
    return lambda tmp_path: [f"data.train={BENCH / train}", f"data.test={BENCH / test}", *extra]


# recipe: (tiny model of the same family, data overrides: bundled data of the same modality in the
# recipe's own dataset format)
RECIPES: dict[str, tuple[str, Callable[[Path], list[str]]]] = {
    "mmr1_variance": ("tiny-qwen2_5_vl", bundled("charts/train.jsonl", "charts/test.jsonl")),
    "noisyrollout_geometry": (
        "tiny-qwen2_5_vl",
        bundled("charts/train.jsonl", "charts/test.jsonl"),
    ),
    "thinklite_hard": ("tiny-qwen2_5_vl", bundled("charts/train.jsonl", "charts/test.jsonl")),
    # judged recipes: the served judge becomes --smoke's local tiny judge (the test swaps it)
    "caprl": ("tiny-qwen2_5_vl", bundled("charts/train.jsonl", "charts/test.jsonl")),
    "vqa_judge": ("tiny-qwen2_5_vl", bundled("charts/train.jsonl", "charts/test.jsonl")),
    "visual_rft_detection": (
        "tiny-qwen2_vl",
        bundled("shapes_detection/train.jsonl", "shapes_detection/test.jsonl"),
    ),
    "visual_rft_fewshot_cls": (
        "tiny-qwen2_vl",
        bundled("shapes_kind/train.jsonl", "shapes_kind/test.jsonl"),
    ),
    "r1v_counting": (
        "tiny-qwen2_vl",
        bundled("shapes_counting/train.jsonl", "shapes_counting/test.jsonl"),
    ),
    "video_r1": (
        "tiny-qwen2_5_vl",
        bundled(
            "video_direction/video_r1_train.json",
            "video_direction/video_r1_test.json",
            f"task.params.media_root={BENCH / 'video_direction'}",
        ),
    ),
    "time_r1": (
        "tiny-qwen2_5_vl",
        bundled(
            "video_temporal/charades_sta_train.txt",
            "video_temporal/charades_sta_test.txt",
            f"task.params.video_root={BENCH / 'video_temporal' / 'videos'}",
        ),
    ),
    "r1_aqa": (
        "tiny-qwen2_audio",
        bundled(
            "audio_pitch/r1_aqa_train.jsonl",
            "audio_pitch/r1_aqa_test.jsonl",
            f"task.params.audio_root={BENCH / 'audio_pitch'}",
        ),
    ),
    "chart_qa": ("tiny-qwen2_5_vl", chartqa_files),
    "chart_to_code": (
        "tiny-qwen2_5_vl",
        bundled("charts/code_train.jsonl", "charts/code_test.jsonl"),
    ),
    "vlm_r1_rec": ("tiny-qwen2_5_vl", refcoco_files),
    "opd_qwen2_5_vl": ("tiny-qwen2_5_vl", refcoco_files),  # the tiny model its own teacher
    # the newer families' recipes
    "qwen3_vl_rec": ("tiny-qwen3_vl", refcoco_files),
    "internvl_rec": ("tiny-internvl", refcoco_files),
    "glm4v_rec": ("tiny-glm4v", refcoco_files),
    "gemma3_counting": (
        "tiny-gemma3",
        bundled("shapes_counting/train.jsonl", "shapes_counting/test.jsonl"),
    ),
    "qwen3_omni_aqa": (
        "tiny-qwen3_omni",
        bundled(
            "audio_pitch/r1_aqa_train.jsonl",
            "audio_pitch/r1_aqa_test.jsonl",
            f"task.params.audio_root={BENCH / 'audio_pitch'}",
        ),
    ),
    "gemma4_aqa": (
        "tiny-gemma4",
        bundled(
            "audio_pitch/r1_aqa_train.jsonl",
            "audio_pitch/r1_aqa_test.jsonl",
            f"task.params.audio_root={BENCH / 'audio_pitch'}",
        ),
    ),
    # the tool recipes: multi-turn rollouts (the tiny model's first turns rarely call a tool)
    "deepeyes": ("tiny-qwen2_5_vl", deepeyes_files),
    "mgpo": ("tiny-qwen2_5_vl", bundled("zoom_marks/train.jsonl", "zoom_marks/test.jsonl")),
    "video_mtr": ("tiny-qwen2_5_vl", bundled("zoom_video/train.jsonl", "zoom_video/test.jsonl")),
    "qwen3_5_video_r1": (
        "tiny-qwen3_5",
        bundled(
            "video_direction/video_r1_train.json",
            "video_direction/video_r1_test.json",
            f"task.params.media_root={BENCH / 'video_direction'}",
        ),
    ),
}

TINY_SIZES = [
    "device=cpu",
    "model.dtype=float32",
    *SMALL_MEDIA,
    "model.video.total_pixels=null",
    "warm_start.steps=0",
    "train.steps=1",
    "train.prompts_per_step=2",
    "train.micro_batch_size=4",
    "rollout.group_size=2",
    "rollout.batch_size=8",
    "rollout.max_new_tokens=4",
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "data.max_test_samples=2",
    "checkpoint.every=0",
]


# The recipes whose own dataset format --smoke replaces with the project's (no bundled file in
# theirs): their one-step runs here are the default suite's training runs in those formats.
OWN_FORMAT = {"chart_qa", "deepeyes", "vlm_r1_rec"}


def test_every_recipe_has_a_tiny_run():
    recipes = {p.stem for p in (REPO / "configs" / "recipes").glob("*.yaml")}
    assert recipes == set(RECIPES), sorted(recipes ^ set(RECIPES))


@pytest.mark.parametrize(
    "recipe",
    [pytest.param(r, marks=[] if r in OWN_FORMAT else [pytest.mark.slow]) for r in sorted(RECIPES)],
)
def test_recipe_runs_one_step_with_its_tiny_model(tmp_path, recipe):
    """The recipe as written (task and params, verifiers, group-relative settings, β > 0 with its
    reference model, gradient checkpointing, data format) with only model, device, data and
    sizes replaced.

    By default only the recipes in OWN_FORMAT (data in the recipe's own format, which --smoke
    replaces); `-m slow` runs the others, whose recipe, tiny model and data format train for two
    steps and evaluate by default in
    tests/test_smoke.py::test_every_recipe_smokes_by_name_from_outside_the_checkout."""
    from mmrft.smoke import _judge_overrides

    model, data = RECIPES[recipe]
    path = REPO / "configs" / "recipes" / f"{recipe}.yaml"
    paper = load_config(path)
    judged = _judge_overrides(paper, [])  # a served judge: the local tiny one instead
    cfg = load_config(
        path,
        [
            f"output_dir={tmp_path / 'runs'}",
            "name=recipe",
            f"model.path={MODELS / model}",
            *([f"teacher.path={MODELS / model}"] if paper.teacher.path else []),
            *TINY_SIZES,
            *data(tmp_path),
            *judged,
        ],
    )
    if judged:  # everything of the reward but the judges' backend as the recipe says
        paper.reward.verifiers, paper.eval.verifiers = cfg.reward.verifiers, cfg.eval.verifiers
    # the paper's settings that the tiny run keeps
    assert cfg.task.name == paper.task.name
    assert cfg.task.params.get("think") == paper.task.params.get("think")
    assert set(paper.task.params) <= set(cfg.task.params)
    assert cfg.reward == paper.reward and cfg.algorithm == paper.algorithm
    assert cfg.data.format == paper.data.format and cfg.data.on_error == paper.data.on_error
    assert cfg.model.gradient_checkpointing == paper.model.gradient_checkpointing
    summary = train(cfg)
    run = Path(summary["run_dir"])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "train/reward" in m] == [1]
    assert (run / "checkpoints" / "step-000001" / "config.json").is_file()


# -- Video-R1's T-GRPO temporal contrast -----------------------------------------------------------
ALWAYS_PLUGIN = """
from mmrft import verifier

@verifier("test_always", low=0.0, high=1.0)
def always(completions, samples):
    \"\"\"1 for every completion: every ordered group beats its shuffled one (p = 1 ≥ 0.8·p̃).\"\"\"
    return [1.0 for _ in completions]
"""


def test_video_qa_temporal_contrast_two_steps(tmp_path, plugin, monkeypatch):
    """Two steps with ``algorithm.temporal_contrast`` on three Video-R1 video items and one image
    item: the video prompts get G/2 completions on shuffled frames each (seeded permutations, not
    the identity), the bonus reaches the reward as ``train/reward/temporal``, the image prompt
    gets no contrast, and the temporal metrics are logged."""
    from mmrft import video as V

    always = tmp_path / "always_plugin.py"
    always.write_text(ALWAYS_PLUGIN)
    items = json.loads((BENCH / "video_direction" / "video_r1_train.json").read_text())[:3]
    image = BENCH / "shapes_colour" / "images" / "test-0000.png"
    items.append({**items[0], "data_type": "image", "path": str(image), "problem_id": 99})
    train_file = tmp_path / "mixed.json"
    train_file.write_text(json.dumps(items))
    orders: dict[int, list[int]] = {}
    shuffle = V.shuffle_frames

    def spy(frames, seed):
        out, order = shuffle(frames, seed)
        assert orders.setdefault(seed, order) == order
        return out, order

    monkeypatch.setattr(V, "shuffle_frames", spy)
    cfg = load_config(
        REPO / "configs/demo.yaml",
        [
            *short_run(tmp_path, "run", group=4, new_tokens=6),
            f"model.path={MODELS / 'tiny-qwen2_5_vl'}",
            *SMALL_MEDIA,
            "task.name=video_qa",
            "task.params={think: none}",
            f"task.params.media_root={BENCH / 'video_direction'}",
            f"data.train={train_file}",
            "data.test=",
            "data.format=video_r1",
            *NO_EVAL,
            "checkpoint.every=0",
            "train.completions_every=1",
            f"plugins=[{plugin}, {always}]",
            "reward.verifiers=[{name: format, params: {think: none}}, {name: accuracy},"
            " {name: test_length}, {name: test_always}]",
            "algorithm.temporal_contrast.enabled=true",
            "algorithm.temporal_contrast.verifier=test_always",
            "algorithm.temporal_contrast.skip_decided=false",
        ],
    )
    summary = train(cfg)
    run = Path(summary["run_dir"])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # 4 prompts over 2 steps, one per item: 3 video prompts × 2 shuffled completions
    assert sum(m["rollout/temporal_generated"] for m in metrics) == 6
    assert all(m["rollout/generated"] == 8 for m in metrics)  # shuffled ones are not trained on
    for m in metrics:
        assert m["train/reward/temporal"] == pytest.approx(0.3)  # every video group: +α
        assert m["train/temporal_bonus_rate"] == 1.0
        assert m["train/temporal_shuffled_accuracy"] == 1.0
    assert len(orders) == 3 and all(o != sorted(o) for o in orders.values())
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    by_kind = {("image" if r["media"][0].endswith(".png") else "video"): r for r in rows}
    assert by_kind["image"]["scores"]["temporal"] is None
    assert by_kind["video"]["scores"]["temporal"] == pytest.approx(0.3)
    assert by_kind["video"]["reward"] == pytest.approx(
        sum(v for v in by_kind["video"]["scores"].values())
    )
