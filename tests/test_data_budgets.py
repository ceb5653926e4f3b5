"""Budgets on data, media and user input (issue 23): an over-long prompt, a decompression-bomb
image, a long video or audio file, a video that fails only when a step draws it, deep JSON,
unsafe YAML, NUL bytes, run names outside ``output_dir`` and remote media each get one line
naming the place (or a counted skip), never a traceback, a stall or the machine's memory.

Tests that could allocate a lot if a budget regressed run in a child process under an
address-space cap (``RLIMIT_AS``), so a regression fails the test instead of the machine."""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import NO_EVAL, one_error_line, short_run
from rich.console import Console

from mmrft.cli import main
from mmrft.config import DataConfig, load_config
from mmrft.data import (
    MAX_JSON_DEPTH,
    DataBudget,
    DataError,
    read_mmrft_jsonl,
    reading_budget,
    skip_counts,
)
from mmrft.models.qwen_vl import check_media
from mmrft.policy.model import resolve_family
from mmrft.rewards.task import build_task
from mmrft.rollout.collector import BadMediaError, DataStream
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "demo.yaml"
SHAPES = REPO / "assets" / "benchmarks" / "shapes_colour"
VIDEOS = REPO / "assets" / "benchmarks" / "video_direction"
GB = 2**30


def capped(code: str, cap_bytes: int, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python -c code`` with its address space capped at ``cap_bytes``."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def shapes_lines(n: int) -> list[dict]:
    """The first ``n`` shapes lines with absolute image paths."""
    lines = [json.loads(x) for x in (SHAPES / "train.jsonl").read_text().splitlines()[:n]]
    for line in lines:
        part = line["messages"][0]["content"][0]
        part["image"] = str(SHAPES / part["image"])
    return lines


def write_jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def with_question(line: dict, text: str) -> dict:
    line["messages"][0]["content"][1]["text"] = text
    return line


def demo_config(tmp_path: Path, *overrides: str):
    return load_config(DEMO, [f"output_dir={tmp_path / 'runs'}", "name=run", *overrides])


# -- prompt length ------------------------------------------------------------------------------
def test_max_prompt_tokens_defaults_to_the_context_minus_the_completion(tmp_path):
    from mmrft.rollout.setup import data_budget

    cfg = demo_config(tmp_path)
    family = resolve_family(cfg.model)
    processor = family.load_processor(cfg.model.path)
    config = json.loads((Path(cfg.model.path) / "config.json").read_text())
    context = config.get("text_config", config)["max_position_embeddings"]
    expected = context - cfg.rollout.max_new_tokens
    task = build_task(cfg.task.name, cfg.task.params)
    budget = data_budget(cfg, task, family, processor)
    assert budget.max_prompt_tokens == expected
    cfg = demo_config(tmp_path, "data.max_prompt_tokens=77")
    assert data_budget(cfg, task, family, processor).max_prompt_tokens == 77


@pytest.mark.parametrize(
    "config",
    ["demo", "tools/zoom_marks", "learn/video_direction", "learn/audio_pitch", "learn/charts"],
)
def test_prompts_that_differ_only_in_their_files_are_counted_as_their_own(config):
    """The budget renders a conversation once for all samples that differ only in their media
    files; every sample's count equals that of its own rendering (images, videos, audio, the
    tools' description, charts' questions)."""
    from mmrft.rollout.preflight import configured_tools
    from mmrft.rollout.setup import data_budget
    from mmrft.rollout.tool_loop import tool_descriptions, with_tool_descriptions

    cfg = load_config(config, ["data.max_prompt_tokens=1"])  # 1: every prompt counted exactly
    family = resolve_family(cfg.model)
    processor = family.load_processor(str(REPO / cfg.model.path))
    tokenizer = getattr(processor, "tokenizer", processor)
    task = build_task(cfg.task.name, cfg.task.params)
    samples = task.read(REPO / cfg.data.train)[0][:40]
    schemas = tool_descriptions(configured_tools(cfg), cfg.rollout.tools.describe)
    count = data_budget(cfg, task, family, processor).count_tokens
    for sample in samples:
        annotated = sample.copy()
        family.annotate(annotated)
        conversation = with_tool_descriptions(task.prompt(annotated, family), annotated, schemas)
        text = family.render(processor, [conversation], True)[0]
        own = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert count(sample) == own, sample.id
    assert len({s.media()[0] for s in samples}) == len(samples)  # every sample its own file


def test_the_tools_description_counts_toward_the_prompt_budget(tmp_path):
    """A tool rollout prompts with the tools described in a system message; the budget counts
    it (a prompt that fits alone is over with it), and a row with ``meta.tools: false`` is
    counted without it, as it is rolled out."""
    from mmrft.rollout.setup import data_budget
    from mmrft.rollout.tool import tool_schemas
    from mmrft.rollout.tool_loop import describe_tools

    cfg = demo_config(tmp_path, "rollout.tools.names=[crop]")
    family = resolve_family(cfg.model)
    processor = family.load_processor(cfg.model.path)
    task = build_task(cfg.task.name, cfg.task.params)
    sample = task.read(REPO / cfg.data.train)[0][0]
    tokens = data_budget(
        load_config(DEMO, ["data.max_prompt_tokens=1"]), task, family, processor
    ).count_tokens
    counted = data_budget(cfg, task, family, processor).count_tokens
    annotated = sample.copy()
    family.annotate(annotated)
    described = describe_tools(task.prompt(annotated, family), tool_schemas(["crop"]))
    text = family.render(processor, [described], True)[0]
    exact = len(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert counted(sample) >= exact  # the default budget: a byte bound (bytes ≥ tokens)
    cfg.data.max_prompt_tokens = 1  # every prompt over it: counted exactly
    assert data_budget(cfg, task, family, processor).count_tokens(sample) == exact
    assert exact > tokens(sample) + 50  # the description is long
    no_tools = sample.copy()
    no_tools.meta = {**no_tools.meta, "tools": False}
    assert data_budget(cfg, task, family, processor).count_tokens(no_tools) == tokens(sample)
    cfg.rollout.tools.describe = False  # the data's prompts describe the tools themselves
    assert data_budget(cfg, task, family, processor).count_tokens(sample) == tokens(sample)


def test_an_over_long_prompt_names_its_line_its_length_and_the_key(tmp_path):
    """Tokens of the rendered prompt count (a text under the character bound); skipped and
    counted under data.on_error=skip."""
    from mmrft.rollout.setup import read_data

    lines = shapes_lines(3)
    with_question(lines[1], "what colour " * 2500)  # ~5000 tokens, 30 k characters
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    cfg = demo_config(tmp_path, f"data.train={path}", "data.test=")
    task = build_task(cfg.task.name, cfg.task.params)
    family = resolve_family(cfg.model)
    with pytest.raises(DataError) as info:
        read_data(cfg, task, family)
    message = str(info.value)
    assert message.startswith(f"{path}:2: prompt over data.max_prompt_tokens (")
    assert " tokens > " in message and "\n" not in message
    before = skip_counts()
    cfg.data.on_error = "skip"
    train, _ = read_data(cfg, task, family)
    assert [s.id for s in train] == [lines[0]["id"], lines[2]["id"]]
    assert skip_counts() - before == {"prompt over data.max_prompt_tokens": 1}


def test_a_300_kb_question_stops_before_the_model_loads(tmp_path):
    """The issue's 300 KB question (150 k tokens) drove the trainer to 23 GB; now it is one
    line with exit status 2, refused by its length in characters before anything is
    tokenised, and no weights are loaded. Under a 6 GB address-space cap."""
    lines = shapes_lines(2)
    with_question(lines[1], "why " * 75_000)
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    result = capped(
        f"""
        import sys
        from mmrft.cli import main
        sys.exit(main(["train", "{DEMO}", "output_dir={tmp_path / "runs"}",
                       "data.train={path}", "data.test="]))
        """,
        6 * GB,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    error = one_error_line(result.stderr)
    assert f"{path}:2: prompt over data.max_prompt_tokens (300,000 characters > " in error
    assert "run: model" not in result.stdout  # the banner printed after the weights load


# -- media by header -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """A 13000 × 13000 PNG of a few KB (1 bit per pixel, all black): 507 MB once decoded to
    RGB."""
    from PIL import Image

    path = tmp_path_factory.mktemp("bomb") / "bomb.png"
    Image.new("1", (13_000, 13_000)).save(path, optimize=True)
    assert path.stat().st_size < 200_000
    return path


def test_a_decompression_bomb_is_refused_by_its_header(tmp_path, bomb):
    """Read with the family's media check (which decodes images) under the default budget and
    a 1 GB address-space cap: refused before anything is decoded, naming line and size."""
    line = shapes_lines(1)[0]
    line["messages"][0]["content"][0]["image"] = str(bomb)
    path = write_jsonl(tmp_path / "train.jsonl", [line])
    result = capped(
        f"""
        from mmrft.data import DataBudget, DataError, read_mmrft_jsonl, reading_budget
        from mmrft.models.qwen_vl import check_media
        budget = DataBudget(max_image_pixels={DataConfig().max_image_pixels})
        try:
            with reading_budget(budget):
                read_mmrft_jsonl("{path}", check=check_media)
        except DataError as exc:
            print(exc)
        with reading_budget(budget):
            samples, stats = read_mmrft_jsonl("{path}", on_error="skip", check=check_media)
        print(len(samples), dict(stats.skipped))
        """,
        1 * GB,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    error, skipped = result.stdout.splitlines()
    assert error.startswith(f"{path}:1: {bomb}: image over data.max_image_pixels (13000×13000 ")
    assert skipped == "0 {'image over data.max_image_pixels': 1}"


def write_clip(path: Path, seconds: float, fps: int = 10, size: int = 64, faststart=False):
    """An H.264 mp4 of ``seconds`` × ``fps`` frames (a moving green bar)."""
    av = pytest.importorskip("av", reason="PyAV writes the test clips")
    import numpy as np

    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(round(seconds * fps)):
            image = np.zeros((size, size, 3), np.uint8)
            image[size // 4 : size // 2, i % (size - 16) : i % (size - 16) + 16, 1] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def video_line(video: Path) -> dict:
    return {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "video", "video": str(video)}, {"type": "text", "text": "?"}],
            }
        ],
        "target": "up",
    }


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        (DataBudget(max_video_seconds=2.5), "video over data.max_video_seconds (3.0 s > 2.5 s;"),
        (DataBudget(max_video_frames=20), "video over data.max_video_frames (30 frames > 20;"),
        (
            DataBudget(max_image_pixels=64 * 63),
            "video frame over data.max_image_pixels (64×64 = 4,096 pixels > 4,032;",
        ),
    ],
)
def test_video_duration_frames_and_frame_size_come_from_the_container(tmp_path, budget, reason):
    clip = write_clip(tmp_path / "clip.mp4", seconds=3.0)
    path = write_jsonl(tmp_path / "train.jsonl", [video_line(clip)])
    with pytest.raises(DataError) as info, reading_budget(budget):
        read_mmrft_jsonl(path)
    assert str(info.value).startswith(f"{path}:1: {clip}: {reason}")
    with reading_budget(DataBudget(max_video_seconds=3.5, max_video_frames=30)):
        assert len(read_mmrft_jsonl(path)[0]) == 1


def test_audio_length_comes_from_the_header(tmp_path):
    soundfile = pytest.importorskip("soundfile")
    import numpy as np

    wav = tmp_path / "two.wav"
    soundfile.write(wav, np.zeros(32_000, dtype=np.float32), 16_000)
    line = video_line(wav)
    line["messages"][0]["content"][0] = {"type": "audio", "audio": str(wav)}
    path = write_jsonl(tmp_path / "train.jsonl", [line])
    with pytest.raises(DataError) as info, reading_budget(DataBudget(max_audio_seconds=1.5)):
        read_mmrft_jsonl(path)
    assert str(info.value).startswith(
        f"{path}:1: {wav}: audio over data.max_audio_seconds (2.0 s > 1.5 s;"
    )
    with reading_budget(DataBudget(max_audio_seconds=2.5)):
        assert len(read_mmrft_jsonl(path)[0]) == 1


def test_the_default_budgets_admit_every_bundled_dataset():
    defaults = DataConfig()
    budget = DataBudget(
        max_prompt_tokens=4096 - 512,
        max_image_pixels=defaults.max_image_pixels,
        max_video_seconds=defaults.max_video_seconds,
        max_video_frames=defaults.max_video_frames,
        max_audio_seconds=defaults.max_audio_seconds,
        allow_remote_media=defaults.allow_remote_media,
    )
    benchmarks = REPO / "assets" / "benchmarks"
    files = sorted(p for p in benchmarks.glob("*/*.jsonl") if p.stem in ("train", "test"))
    assert len(files) >= 20
    for file in files:
        with reading_budget(budget):
            samples, stats = read_mmrft_jsonl(file)
        assert samples and not stats.skipped, file


# -- media that fail when a step draws them ------------------------------------------------------
@pytest.fixture(scope="module")
def cut_video_data(tmp_path_factory) -> Path:
    """Four video_direction lines; line 2's video is written with its index first and cut in
    half: its header is intact (the start-up probe passes), its frames are not."""
    folder = tmp_path_factory.mktemp("cut")
    lines = [json.loads(x) for x in (VIDEOS / "train.jsonl").read_text().splitlines()[:4]]
    for line in lines:
        part = line["messages"][0]["content"][0]
        part["video"] = str(VIDEOS / part["video"])
    whole = write_clip(folder / "whole.mp4", seconds=4.0, fps=6, faststart=True).read_bytes()
    (folder / "cut.mp4").write_bytes(whole[: len(whole) // 2])
    lines[1]["messages"][0]["content"][0]["video"] = str(folder / "cut.mp4")
    return write_jsonl(folder / "train.jsonl", lines)


def video_run(tmp_path: Path, data: Path, name: str, *overrides: str):
    return load_config(
        DEMO,
        [
            *short_run(tmp_path, name, group=4, new_tokens=6),
            "task.name=video_qa",
            "task.params={think: none}",
            "reward.verifiers=[{name: format, params: {think: none}}, {name: accuracy}]",
            f"data.train={data}",
            "data.test=",
            "train.completions_every=1",
            *NO_EVAL,
            "checkpoint.every=1",
            "checkpoint.keep_last=2",
            "model.video.min_frames=2",
            "model.video.max_frames=4",
            "model.video.min_pixels=3136",
            "model.video.max_pixels=3136",
            *overrides,
        ],
    )


def step_texts(run_dir: Path, step: int) -> list[str]:
    rows = [json.loads(x) for x in (run_dir / "completions.jsonl").read_text().splitlines()]
    return [json.dumps(r, sort_keys=True) for r in rows if r["step"] == step]


def test_a_video_that_fails_when_drawn_is_skipped_replaced_and_resumed_exactly(
    tmp_path, cut_video_data
):
    """data.on_error=skip: the step stays full, train.log names the dataset line, the console
    prints the skip count at the end, and the checkpoint keeps the bad sample. Under raise the
    run stops with failure.json naming the sample and its line; resume=auto skips it (and says
    so) and its step 2 equals the skipping run's: the replacement is a pure function of the
    draw position and the bad set."""
    from mmrft.runtime.checkpoint import load_trainer_state
    from mmrft.training.trainer import train

    out = io.StringIO()
    summary = train(
        video_run(tmp_path, cut_video_data, "skip", "data.on_error=skip"),
        Console(file=out, width=400),
    )
    skip_dir = Path(summary["run_dir"])
    metrics = [json.loads(x) for x in (skip_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout/generated"] for m in metrics] == [8.0, 8.0]
    log = (skip_dir / "train.log").read_text()
    assert f"skipped {cut_video_data}:2 (sample video_direction-train-0001)" in log
    assert "skipped samples (data.on_error=skip; each named in train.log): " in out.getvalue()
    assert "media failed when drawn ×1" in out.getvalue()
    last = sorted((skip_dir / "checkpoints").iterdir())[-1]
    assert load_trainer_state(last)["bad_samples"] == [1]

    cfg = video_run(tmp_path, cut_video_data, "raise")
    with pytest.raises(BadMediaError) as info:
        train(cfg, Console(file=io.StringIO()))
    assert str(info.value).startswith(f"{cut_video_data}:2: ")
    failure = json.loads((tmp_path / "raise" / "failure.json").read_text())
    assert failure["step"] == 2 and failure["samples"] == ["video_direction-train-0001"]
    assert failure["bad_media"][0]["where"] == f"{cut_video_data}:2"
    out = io.StringIO()
    train(video_run(tmp_path, cut_video_data, "raise"), Console(file=out, width=400))
    assert "stopped the last run on sample video_direction-train-0001" in out.getvalue()
    assert step_texts(tmp_path / "raise", 2) == step_texts(skip_dir, 2)


def test_replacements_are_a_pure_function_of_position_and_bad_set():
    stream = DataStream(10, seed=3)
    plain = [stream.index_at(p) for p in range(30)]
    knew = DataStream(10, seed=3, bad={plain[4]})
    learnt = DataStream(10, seed=3)
    assert learnt.take(4) == plain[:4]
    learnt.bad.add(plain[4])
    assert learnt.take(26) == knew.take(30)[4:]
    assert plain[4] not in [knew.index_at(p) for p in range(100)]
    assert [knew.index_at(p) for p in range(30)] == [knew.index_at(p) for p in range(30)]
    with pytest.raises(DataError, match="every one of the 10 training samples"):
        DataStream(10, seed=3, bad=set(range(10))).index_at(0)


# -- user errors: one line, exit status 2, naming the place --------------------------------------
def test_json_nested_100000_deep_is_one_line_in_train_and_verify(tmp_path, capsys):
    deep = "[" * 100_000 + "]" * 100_000
    train_file = tmp_path / "train.jsonl"
    train_file.write_text(json.dumps(shapes_lines(1)[0]) + "\n" + deep + "\n")
    code = main(["train", str(DEMO), f"output_dir={tmp_path / 'runs'}", f"data.train={train_file}"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{train_file}:2: not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels)" in err
    assert main(["eval", str(DEMO), f"data.test={train_file}"]) == 2
    err = capsys.readouterr().err
    assert f"{train_file}:2: not valid JSON (nested deeper" in err and "Traceback" not in err
    listed = tmp_path / "train.json"
    listed.write_text("[\n" + json.dumps(shapes_lines(1)[0]) + ",\n" + deep + "\n]")
    with pytest.raises(DataError, match=rf"^{listed}:3: not valid JSON \(nested deeper"):
        read_mmrft_jsonl(listed)
    verify = tmp_path / "verify.jsonl"
    verify.write_text('{"completion": "a", "target": "a"}\n' + deep + "\n")
    assert main(["verify", "accuracy", str(verify)]) == 2
    err = capsys.readouterr().err
    assert f"{verify}:2: not valid JSON (nested deeper" in err and "Traceback" not in err
    ordinary = tmp_path / "nested.jsonl"  # nesting within the bound, and brackets in strings
    line = {**shapes_lines(1)[0], "meta": {"deep": json.loads("[" * 50 + "]" * 50), "s": "[" * 500}}
    ordinary.write_text(json.dumps(line) + "\n")
    assert len(read_mmrft_jsonl(ordinary)[0]) == 1


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("train:\n  steps: [1, 2\nname: x\n", 3, "not valid YAML ("),
        ("name: !!python/object/apply:os.system ['touch {marker}']\n", 1, "no !!python/"),
        ("train:\n  seed: 1\n  steps: abc\n", 3, "train.steps: expected an integer, got 'abc'"),
        ("train:\n  stepz: 3\n", 2, "unknown config key 'train.stepz'; did you mean"),
    ],
)
def test_yaml_errors_unsafe_tags_and_wrong_types_are_one_line_with_file_and_line(
    tmp_path, capsys, text, line, problem
):
    marker = tmp_path / "marker"
    config = tmp_path / "bad.yaml"
    config.write_text(text.format(marker=marker))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}:{line}: " in err and problem in err and "Traceback" not in err
    assert not marker.exists()


def test_a_nul_byte_a_wrong_type_or_bad_utf8_names_the_line(tmp_path):
    lines = shapes_lines(2)
    lines[1]["messages"][0]["content"][0]["image"] = str(SHAPES / "images" / "a\x00.png")
    path = write_jsonl(tmp_path / "nul.jsonl", lines)
    with pytest.raises(DataError, match=rf"^{path}:2: messages\[0\]\.content\[0\]: NUL byte"):
        read_mmrft_jsonl(path)
    lines = shapes_lines(2)
    lines[1]["messages"][0]["content"] = 5
    path = write_jsonl(tmp_path / "type.jsonl", lines)
    with pytest.raises(DataError, match=rf"^{path}:2: messages\[0\]\.content must be a string"):
        read_mmrft_jsonl(path)
    latin = tmp_path / "latin.jsonl"  # a line that is not UTF-8
    latin.write_bytes(json.dumps(shapes_lines(1)[0]).encode() + b'\n{"id": "caf\xe9"}\n')
    with pytest.raises(DataError, match=rf"^{latin}:2: not UTF-8 text \(at byte 12\)"):
        read_mmrft_jsonl(latin)
    flat = tmp_path / "flat.jsonl"  # the standard columns, a NUL in the image column
    flat.write_text(json.dumps({"question": "q", "answer": "a", "image": "x\x00.png"}) + "\n")
    task = build_task("classification", {"think": "none"})
    with pytest.raises(DataError, match=rf"^{flat}:1: NUL byte in a media path"):
        task.read(flat)


@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "a/b", "..", "a\\b"])
def test_the_run_name_stays_inside_output_dir(tmp_path, name):
    with pytest.raises(ConfigError, match=r"^name: .* must be a plain folder name"):
        load_config(DEMO, [f"output_dir={tmp_path}", f"name={name}"])


def test_remote_media_need_the_opt_in_whatever_on_error_says(tmp_path):
    from mmrft.rollout.setup import read_data

    lines = shapes_lines(2)
    lines[1]["messages"][0]["content"][0]["image"] = "http://example.invalid/cat.png"
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    for on_error in ("raise", "skip"):
        cfg = demo_config(tmp_path, f"data.train={path}", "data.test=", f"data.on_error={on_error}")
        family = resolve_family(cfg.model)
        with pytest.raises(DataError) as info:
            read_data(cfg, build_task(cfg.task.name, cfg.task.params), family)
        assert str(info.value).startswith(f"{path}:2: remote media 'http://example.invalid/")
        assert "data.allow_remote_media=true" in str(info.value)
    cfg = demo_config(tmp_path, f"data.train={path}", "data.test=", "data.allow_remote_media=true")
    train, _ = read_data(cfg, build_task(cfg.task.name, cfg.task.params), resolve_family(cfg.model))
    assert len(train) == 2


def test_skipped_lines_reach_the_process_skip_counts(tmp_path):
    lines = shapes_lines(2)
    lines[1]["messages"][0]["content"][0]["image"] = str(tmp_path / "missing.png")
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    before = skip_counts()
    read_mmrft_jsonl(path, on_error="skip", check=check_media)
    assert skip_counts() - before == {"image file not found": 1}
