"""The media task adapters: temporal_grounding, video_qa, audio_qa, detection, chart_qa.

Readers for every format (bundled files, bad lines → DataError naming file:line, skip-and-count),
strict evaluation on good / bad / adversarial completions, reference answers scoring 1 on every
bundled test sample, chance levels, and the split-level metrics (temporal recall, COCO AP).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import changed, check_evaluate
from PIL import Image

from mmrft.data import DataError, Sample
from mmrft.models.family import MediaBudget
from mmrft.plugins import MODEL_FAMILIES, VERIFIERS
from mmrft.rewards.metrics import coco_map, temporal_recall
from mmrft.rewards.reward import build_reward
from mmrft.rewards.task import build_task
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "assets" / "benchmarks"

# (task, benchmark, file, format, params, samples)
BUNDLED = [
    ("temporal_grounding", "video_temporal", "test.jsonl", "mmrft", {}, 100),
    ("temporal_grounding", "video_temporal", "charades_sta_test.txt", "charades", {}, 100),
    ("video_qa", "video_direction", "test.jsonl", "mmrft", {}, 80),
    ("video_qa", "video_direction", "video_r1_test.json", "video_r1", {}, 80),
    ("audio_qa", "audio_pitch", "test.jsonl", "mmrft", {}, 32),
    ("counting", "audio_beeps", "test.jsonl", "mmrft", {}, 40),
    ("audio_qa", "audio_pitch", "r1_aqa_test.jsonl", "r1_aqa", {}, 32),
    ("audio_qa", "audio_pitch", "mmau_test.json", "mmau", {}, 32),
    ("detection", "shapes_detection", "test.jsonl", "mmrft", {}, 200),
    ("chart_qa", "charts", "test.jsonl", "mmrft", {}, 100),
]


def write_lines(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_json_list(path: Path, items: list) -> Path:
    """A JSON list with item i on line i + 2."""
    path.write_text("[\n" + ",\n".join(json.dumps(x) for x in items) + "\n]\n", encoding="utf-8")
    return path


def families() -> list:
    """One family per box frame: Qwen2-VL (norm1000), Qwen2.5-VL at its default budget, and
    Qwen2.5-VL upscaling every image (input pixels ≠ original pixels)."""
    qwen2 = MODEL_FAMILIES.get("qwen2_vl")
    qwen25 = MODEL_FAMILIES.get("qwen2_5_vl")
    return [qwen2(), qwen25(), qwen25(MediaBudget(min_pixels=200 * 200, max_pixels=300 * 300))]


# -- bundled benchmarks ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("task_name", "benchmark", "file", "fmt", "params", "n"),
    BUNDLED,
    ids=[f"{t}-{f}" for t, _, _, f, _, _ in BUNDLED],
)
def test_reference_answers_score_one(task_name, benchmark, file, fmt, params, n):
    """``evaluate_one("<answer>" + reference + "</answer>")`` scores 1 on every test sample, in
    every box frame for detection; the default reward gives it (nearly) its maximum."""
    task = build_task(task_name, {"think": "none", **params})
    samples, stats = task.read(BENCH / benchmark / file, fmt=fmt)
    assert stats.kept == stats.read == n and not stats.skipped
    reward = build_reward(task.default_verifiers())
    high = sum(w * v.spec.high for v, w in reward.verifiers)
    for family in families() if task_name == "detection" else families()[1:2]:
        for sample in samples:
            family.annotate(sample)
        completions = [f"<answer>{task.reference_answer(s)}</answer>" for s in samples]
        records = [task.evaluate_one(c, s) for c, s in zip(completions, samples)]
        assert all(r.score == 1.0 and r.reason is None for r in records), family.name
        metrics = task.aggregate(records)
        assert metrics[task.primary_metric] == 1.0 and metrics["format_fail"] == 0.0
        totals = reward(completions, samples).total
        # a box rounded to whole frame units has IoU just below 1
        assert min(totals) >= high - (0.1 if task_name == "detection" else 1e-9), family.name


def test_peer_formats_read_the_same_samples_as_the_project_jsonl():
    pairs = [
        ("temporal_grounding", "video_temporal", "charades_sta_test.txt", "charades"),
        ("video_qa", "video_direction", "video_r1_test.json", "video_r1"),
        ("audio_qa", "audio_pitch", "r1_aqa_test.jsonl", "r1_aqa"),
        ("audio_qa", "audio_pitch", "mmau_test.json", "mmau"),
    ]
    for task_name, benchmark, file, fmt in pairs:
        task = build_task(task_name)
        ours, _ = task.read(BENCH / benchmark / "test.jsonl")
        theirs, _ = task.read(BENCH / benchmark / file, fmt=fmt)
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert a.target == b.target, (fmt, a.id)
            assert a.media() == b.media(), (fmt, a.id)
            assert a.meta.get("choices") == b.meta.get("choices")
            if task_name == "temporal_grounding":
                assert a.meta["duration"] == pytest.approx(b.meta["duration"])


def test_chance_levels():
    video_qa = build_task("video_qa")
    samples, _ = video_qa.read(BENCH / "video_direction" / "test.jsonl")
    assert video_qa.chance(samples) == pytest.approx(0.25)
    numeric = Sample("n", [], 3, {"problem_type": "numerical"})
    assert video_qa.chance([*samples, numeric]) is None
    audio = build_task("audio_qa")
    # audio_pitch lists 4 options ("falling", "rising", "steady", "rising then falling") but
    # only "rising" and "falling" are ever correct, and every sample lists both: chance 1/2
    for name, fmt in (("test.jsonl", "mmrft"), ("mmau_test.json", "mmau")):
        pitch, _ = audio.read(BENCH / "audio_pitch" / name, fmt=fmt)
        assert {s.target for s in pitch} == {"rising", "falling"}
        assert all(len(s.meta["choices"]) == 4 for s in pitch)
        assert audio.chance(pitch) == pytest.approx(0.5)
    # with a sample whose target is "x": T = {rising, falling, x}; "x" is one of its 3
    # options → 1, each pitch sample still 1/2
    three = Sample("a", [], "x", {"choices": ["x", "y", "z"]})
    assert audio.chance([three, *pitch]) == pytest.approx((1 + len(pitch) / 2) / (1 + len(pitch)))
    chart = build_task("chart_qa")
    charts, _ = chart.read(BENCH / "charts" / "test.jsonl")
    assert chart.chance(charts) is None  # value questions have no options
    largest = [s for s in charts if s.meta.get("choices")]
    # every category letter the charts show is the answer of some chart: 1 / #choices each
    assert {s.target for s in largest} == set("ABCDE")
    expected = sum(1 / len(s.meta["choices"]) for s in largest) / len(largest)
    assert chart.chance(largest) == pytest.approx(expected)
    assert build_task("temporal_grounding").chance(samples) is None
    assert build_task("detection").chance(samples) is None


# -- temporal grounding ----------------------------------------------------------------------------
VIDEOS = BENCH / "video_temporal" / "videos"  # test-0000.mp4: 4.0 s at 5 fps


def mmrft_line(target, meta, media=("video", "videos/test-0000.mp4"), text="When?", **extra):
    content = [{"type": media[0], media[0]: media[1]}, {"type": "text", "text": text}]
    return {
        "id": extra.pop("id", "s"),
        "messages": [{"role": "user", "content": content}],
        "target": target,
        "meta": meta,
        **extra,
    }


def test_temporal_mmrft_reads_duration_from_the_video_header(tmp_path):
    (tmp_path / "videos").symlink_to(VIDEOS)
    path = write_lines(tmp_path / "d.jsonl", [mmrft_line([0.4, 9.0], {})])
    (sample,), _ = build_task("temporal_grounding").read(path)
    assert sample.meta["duration"] == pytest.approx(4.0)
    assert sample.target == [0.4, 4.0] and sample.meta["end_clipped"] is True


@pytest.mark.parametrize(
    ("target", "meta", "message"),
    [
        ([1.0], {"duration": 4.0}, r"target must be \[start, end\]"),
        ([2.0, 1.0], {"duration": 4.0}, "needs 0 ≤ start < end"),
        ([-1.0, 1.0], {"duration": 4.0}, "needs 0 ≤ start < end"),
        ([5.0, 6.0], {"duration": 4.0}, "starts after the video's end"),
        ([1.0, 2.0], {"duration": 0}, "meta.duration must be a positive number"),
    ],
)
def test_temporal_bad_lines_name_file_and_line(tmp_path, target, meta, message):
    good = mmrft_line([0.0, 1.0], {"duration": 4.0}, id="good")
    path = write_lines(tmp_path / "d.jsonl", [good, mmrft_line(target, meta)])
    task = build_task("temporal_grounding")
    with pytest.raises(DataError, match=rf"d.jsonl:2: .*{message}"):
        task.read(path)
    samples, stats = task.read(path, on_error="skip")
    assert [s.id for s in samples] == ["good"] and sum(stats.skipped.values()) == 1


def test_temporal_mmrft_needs_one_video(tmp_path):
    path = write_lines(
        tmp_path / "d.jsonl", [mmrft_line([0, 1], {"duration": 4}, media=("image", "x.png"))]
    )
    with pytest.raises(DataError, match="d.jsonl:1: .*exactly one video"):
        build_task("temporal_grounding").read(path)


def test_charades_reader(tmp_path):
    path = tmp_path / "charades_sta_test.txt"
    path.write_text(
        "test-0000 0.0 1.8##the green circle appears.\n"
        "\n"
        "test-0000 1.0 4.5##a person turns a light on\n"  # end past the 4 s video: clipped
        "test-0001 0.0 1.0##the blue square appears.\n"
    )
    task = build_task("temporal_grounding", {"video_root": str(VIDEOS)})
    samples, stats = task.read(path, fmt="charades")
    assert stats.kept == stats.read == 3
    first, second, third = samples
    assert [s.id for s in samples] == ["test-0000-1", "test-0000-3", "test-0001-4"]
    assert first.media("video") == [str(VIDEOS / "test-0000.mp4")]
    assert first.text() == 'When does the event "the green circle appears" happen?'
    assert first.target == [0.0, 1.8] and first.meta["duration"] == pytest.approx(4.0)
    assert second.target == [1.0, 4.0] and second.meta["end_clipped"] is True
    assert third.meta["video_id"] == "test-0001"
    family = MODEL_FAMILIES.get("qwen2_5_vl")()
    text = task.prompt(first, family)[-1]["content"][-1]["text"]
    assert text.startswith('The video lasts 4.0 seconds. When does the event "the green circle')
    assert '"start to end"' in text and "<answer> </answer>" in text


def test_charades_default_root_is_the_videos_folder_beside_the_file():
    samples, _ = build_task("temporal_grounding").read(
        BENCH / "video_temporal" / "charades_sta_test.txt", fmt="charades"
    )
    assert samples[0].media("video") == [str(VIDEOS / "test-0000.mp4")]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("test-0000 0.0 1.8 the green circle", "expected '<video id> <start> <end>##<sentence>'"),
        ("test-0000 0.0##the green circle", "expected '<video id>"),
        ("test-0000 a b##the green circle", "start and end must be seconds"),
        ("test-0000 2.0 1.0##reversed", "needs 0 ≤ start < end"),
        ("test-0000 5.0 6.0##late", "starts after the video's end"),
        ("gone 0.0 1.0##no such video", r"video not found \(.*gone.mp4\)"),
    ],
)
def test_charades_bad_lines(tmp_path, line, message):
    path = tmp_path / "sta.txt"
    path.write_text(f"test-0001 0.0 1.0##fine.\n{line}\n")
    task = build_task("temporal_grounding", {"video_root": str(VIDEOS)})
    with pytest.raises(DataError, match=rf"sta.txt:2: .*{message}"):
        task.read(path, fmt="charades")
    samples, stats = task.read(path, fmt="charades", on_error="skip")
    assert len(samples) == 1 and stats.read == 2 and sum(stats.skipped.values()) == 1


def test_charades_corrupt_video_is_named(tmp_path):
    root = tmp_path / "videos"
    root.mkdir()
    (root / "bad.mp4").write_bytes(b"not a video at all")
    path = tmp_path / "sta.txt"
    path.write_text("bad 0.0 1.0##broken.\n")
    with pytest.raises(DataError, match=r"sta.txt:1: unreadable video \(.*bad.mp4"):
        build_task("temporal_grounding").read(path, fmt="charades")
    _, stats = build_task("temporal_grounding").read(path, fmt="charades", on_error="skip")
    assert stats.skipped == {"unreadable video": 1}


def temporal_sample() -> Sample:
    return Sample("t", [], target=[10.0, 20.0], meta={"duration": 40.0})


def test_temporal_evaluate():
    task = build_task("temporal_grounding")
    sample = temporal_sample()
    cases = {
        "<think>..</think><answer>10 to 20</answer>": (1.0, None, 1.0),
        "<answer>00:10 to 00:20</answer>": (1.0, None, 1.0),
        "<answer>From 10.0s to 20.0s.</answer>": (1.0, None, 1.0),
        "<answer>15s - 25s</answer>": (0.0, None, 1 / 3),
        "<answer>12 to 20</answer>": (1.0, None, 0.8),
        "<answer>0 to 40</answer>": (0.0, None, 0.25),  # the whole video: no free recall
        "<think>10 to 20</think>": (0.0, "no answer tag", 0.0),
        "<answer>20 to 10</answer>": (0.0, "reversed interval", 0.0),
        "<answer>10 to 20 or 12 to 22</answer>": (0.0, "several intervals", 0.0),
        "<answer>0 to 100</answer>": (0.0, "outside video", 0.0),
        "<answer>soon</answer>": (0.0, "no interval", 0.0),
        "<answer>10 to 20</answer><answer>1 to 2</answer>": (0.0, "several answer tags", 0.0),
    }
    records = []
    for completion, (score, reason, tiou) in cases.items():
        record = task.evaluate_one(completion, sample)
        records.append(record)
        assert (record.score, record.reason) == (score, reason), completion
        assert record.values["mIoU"] == pytest.approx(tiou), completion
        assert record.values["R1@0.3"] == float(tiou >= 0.3)
        assert record.values["R1@0.7"] == float(tiou >= 0.7)
    assert records[0].parsed == [10.0, 20.0] and records[6].parsed is None
    metrics = task.aggregate(records)
    expected = temporal_recall([r.values["mIoU"] for r in records])
    assert {k: metrics[k] for k in expected} == pytest.approx(expected)
    assert metrics["format_fail"] == pytest.approx(6 / len(records))
    assert task.reference_answer(sample) == "10.0 to 20.0"
    assert task.reference_answer(Sample("r", [], [12.54, 17.8], {})) == "12.54 to 17.8"


def test_temporal_params():
    with pytest.raises(ConfigError, match="video_ext must start with '.'"):
        build_task("temporal_grounding", {"video_ext": "mp4"})
    with pytest.raises(ConfigError, match="reads mmrft, conversations, deepeyes, charades"):
        build_task("temporal_grounding").read(BENCH / "video_temporal" / "test.jsonl", fmt="x")


# -- video QA --------------------------------------------------------------------------------------
def video_r1_item(**changes) -> dict:
    item = {
        "problem_id": 7,
        "problem": "Which direction does the circle move?",
        "data_type": "video",
        "problem_type": "multiple choice",
        "options": ["A. right", "B. up", "C. left", "D. down"],
        "solution": "<answer>C</answer>",
        "path": "./videos/test-0000.mp4",
        "data_source": "test",
    }
    return changed(item, changes)


def test_video_r1_reader_types_each_item(tmp_path):
    path = write_json_list(
        tmp_path / "video_r1.json",
        [
            video_r1_item(),
            video_r1_item(
                problem="How many shapes?",
                problem_type="numerical",
                options=None,
                solution="<answer>3</answer>",
            ),
            video_r1_item(data_type="image", path="./frame.png"),
        ],
    )
    task = build_task("video_qa", {"media_root": str(BENCH / "video_direction")})
    samples, stats = task.read(path, fmt="video_r1")
    assert stats.kept == 3
    mc, numeric, image = samples
    assert [s.id for s in samples] == ["video_r1-0", "video_r1-1", "video_r1-2"]
    assert mc.target == "left" and mc.meta["choices"] == ["right", "up", "left", "down"]
    assert mc.meta["problem_type"] == "multiple choice" and mc.meta["problem_id"] == 7
    assert mc.media("video") == [str(BENCH / "video_direction" / "videos" / "test-0000.mp4")]
    assert numeric.target == 3 and numeric.meta["problem_type"] == "numerical"
    assert "choices" not in numeric.meta
    assert image.media("image") and not image.media("video")
    family = MODEL_FAMILIES.get("qwen2_5_vl")()
    text = task.prompt(mc, family)[-1]["content"][-1]["text"]
    assert "Options:\nA. right\nB. up\nC. left\nD. down\nAnswer with the option's letter" in text
    assert "Answer with a number" in task.prompt(numeric, family)[-1]["content"][-1]["text"]
    assert task.reference_answer(mc) == "C" and task.reference_answer(numeric) == "3"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"problem_type": "OCR"}, "problem_type 'OCR' is not supported"),
        ({"problem_type": "free-form"}, "problem_type 'free-form' is not supported"),
        ({"options": ["right", "up"]}, r"options\[0\] must read 'A. <text>'"),
        ({"options": ["A. right", "C. up"]}, r"options\[1\] must read 'B. <text>'"),
        ({"solution": "C"}, "'solution' has no single <answer> block"),
        ({"solution": "<answer>E</answer>"}, "is not an option letter"),
        ({"problem_type": "numerical", "solution": "<answer>many</answer>"}, "is not a number"),
        ({"path": None}, "missing field 'path'"),
        ({"data_type": "audio"}, "data_type must be 'video' or 'image'"),
    ],
)
def test_video_r1_bad_items_name_file_and_line(tmp_path, changes, message):
    path = write_json_list(tmp_path / "v.json", [video_r1_item(), video_r1_item(**changes)])
    task = build_task("video_qa")
    with pytest.raises(DataError, match=rf"v.json:3 \(item 1\): .*{message}"):
        task.read(path, fmt="video_r1")
    samples, stats = task.read(path, fmt="video_r1", on_error="skip")
    assert len(samples) == 1 and stats.read == 2 and sum(stats.skipped.values()) == 1


def test_video_r1_unsupported_types_are_skipped_and_counted(tmp_path):
    items = [video_r1_item(), video_r1_item(problem_type="OCR"), video_r1_item(problem_type="OCR")]
    path = write_json_list(tmp_path / "v.json", items)
    samples, stats = build_task("video_qa").read(path, fmt="video_r1", on_error="skip")
    assert len(samples) == 1
    assert stats.skipped == {"problem_type 'OCR' is not supported": 2}


def test_json_list_written_on_one_line_gets_distinct_ids_and_item_numbers(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps([video_r1_item(), video_r1_item(), video_r1_item(solution="x")]))
    task = build_task("video_qa", {"media_root": str(BENCH / "video_direction")})
    with pytest.raises(DataError, match=r"one.json:1 \(item 2\): 'solution' has no single"):
        task.read(path, fmt="video_r1")
    samples, stats = task.read(path, fmt="video_r1", on_error="skip")
    assert [s.id for s in samples] == ["one-0", "one-1"]
    assert stats.skipped == {"'solution' has no single <answer> block": 1}


def test_json_list_reader_errors(tmp_path):
    task = build_task("video_qa")
    broken = tmp_path / "broken.json"
    broken.write_text('[\n{"problem": "a"},\n{"problem": \n]\n')
    with pytest.raises(DataError, match=r"broken.json:4: not valid JSON"):
        task.read(broken, fmt="video_r1", on_error="skip")  # no resynchronising inside a list
    jsonl = write_lines(tmp_path / "lines.json", [video_r1_item()])
    with pytest.raises(DataError, match=r"lines.json: expected a JSON list"):
        task.read(jsonl, fmt="video_r1")
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert task.read(empty, fmt="video_r1")[0] == []
    with pytest.raises(DataError, match="dataset file not found"):
        task.read(tmp_path / "nope.json", fmt="video_r1")


@pytest.mark.parametrize(
    ("target", "meta", "message"),
    [
        ("left", {}, "target must be a number, got 'left'"),
        ("purple", {"choices": ["left", "right"]}, "not one of meta.choices"),
        (3, {"choices": ["a"]}, "meta.choices must list 2 to 26"),
        (3, {"problem_type": "numerical", "choices": ["a", "b"]}, "has no meta.choices"),
        (3, {"problem_type": "OCR"}, "meta.problem_type 'OCR' is not one of"),
    ],
)
def test_video_qa_bad_lines(tmp_path, target, meta, message):
    line = mmrft_line(target, meta)
    path = write_lines(tmp_path / "d.jsonl", [line])
    with pytest.raises(DataError, match=rf"d.jsonl:1: .*{message}"):
        build_task("video_qa").read(path)


def video_samples() -> tuple[Sample, Sample]:
    mc = Sample(
        "mc",
        [],
        "left",
        {"choices": ["right", "up", "left", "down"], "problem_type": "multiple choice"},
    )
    numeric = Sample("num", [], 3, {"problem_type": "numerical"})
    return mc, numeric


def test_video_qa_type_defaults_from_the_sample():
    task = build_task("video_qa")
    untyped_mc = Sample("a", [], "up", {"choices": ["down", "up"]})
    untyped_number = Sample("b", [], "4", {})
    assert task.reference_answer(untyped_mc) == "B"
    assert task.reference_answer(untyped_number) == "4"
    assert task.evaluate_one("<answer>4</answer>", untyped_number).score == 1.0
    assert task.evaluate_one("<answer>up</answer>", untyped_mc).score == 1.0


def test_video_qa_evaluate():
    task = build_task("video_qa")
    mc, numeric = video_samples()
    cases = [
        (mc, "<answer>C</answer>", 1.0, None, "left"),
        (mc, "<think>B?</think><answer>left</answer>", 1.0, None, "left"),
        (mc, "<answer>(C) left</answer>", 1.0, None, "left"),
        (mc, "<answer>A</answer>", 0.0, None, "right"),
        (mc, "<answer>A or C</answer>", 0.0, "several options", None),
        (mc, "<answer>right, up, left, down</answer>", 0.0, "several options", None),
        (mc, "<answer>A dog runs left</answer>", 0.0, "no option matched", None),
        (mc, "<answer>3</answer>", 0.0, "no option matched", None),
        (mc, "C", 0.0, "no answer tag", None),
        (numeric, "<answer>3</answer>", 1.0, None, 3),
        (numeric, "<answer>three</answer>", 1.0, None, 3),
        (numeric, "<answer>3.5</answer>", 0.0, None, 3.5),
        (numeric, "<answer>3 or 4</answer>", 0.0, "several numbers", None),
        (numeric, "<answer>C</answer>", 0.0, "no number", None),
    ]
    for sample, completion, score, reason, parsed in cases:
        record = task.evaluate_one(completion, sample)
        assert (record.score, record.reason, record.parsed) == (score, reason, parsed), completion
        assert record.values == {"accuracy": score}


def test_video_qa_reward_reads_each_samples_type():
    """Pitfall 8: a batch mixing types is scored per sample, whatever comes first."""
    task = build_task("video_qa")
    mc, numeric = video_samples()
    reward = build_reward(task.default_verifiers())
    accuracy = VERIFIERS.get("accuracy").bind(task.default_verifiers()[1]["params"])
    for samples in ([mc, numeric], [numeric, mc]):
        right = ["<answer>C</answer>" if s is mc else "<answer>3</answer>" for s in samples]
        wrong = ["<answer>3</answer>" if s is mc else "<answer>C</answer>" for s in samples]
        assert [x.value for x in accuracy(right, samples)] == [1.0, 1.0]
        assert [x.value for x in accuracy(wrong, samples)] == [0.0, 0.0]
        records = task.evaluate(right, samples)
        assert [r.score for r in records] == [1.0, 1.0]
        assert reward(right, samples).total == [1.0, 1.0]  # format needs think: 0 + accuracy 1


# -- audio QA --------------------------------------------------------------------------------------
AUDIO = BENCH / "audio_pitch"


def r1_aqa_line(**changes) -> dict:
    line = {
        "id": 0,
        "question_text": "How does the pitch change?",
        "multi_choice": ["falling", "rising", "steady"],
        "answer": 1,
        "dataset_name": "AVQA",
        "audio_path": "audio/test-0001.wav",
    }
    line.update(changes)
    return {k: v for k, v in line.items() if v is not None}


def test_r1_aqa_reader(tmp_path):
    path = write_lines(tmp_path / "train.jsonl", [r1_aqa_line(), r1_aqa_line(id=1, answer=0)])
    task = build_task("audio_qa", {"audio_root": str(AUDIO), "think": "none"})
    samples, stats = task.read(path, fmt="r1_aqa")
    assert stats.kept == 2
    first = samples[0]
    assert first.id == "0" and first.target == "rising" and samples[1].target == "falling"
    assert first.media("audio") == [str(AUDIO / "audio" / "test-0001.wav")]
    assert first.meta == {"choices": ["falling", "rising", "steady"], "dataset": "AVQA"}
    family = MODEL_FAMILIES.get("qwen2_audio")()
    assert task.prompt(first, family)[-1]["content"] == [
        {"type": "audio", "audio": str(AUDIO / "audio" / "test-0001.wav")},
        {
            "type": "text",
            "text": "How does the pitch change? Please choose the answer from the following "
            "options: ['falling', 'rising', 'steady'].\n"
            "Give only the final answer inside <answer> </answer> tags.",
        },
    ]
    assert task.reference_answer(first) == "rising"
    avqa = write_lines(
        tmp_path / "avqa.jsonl", [r1_aqa_line(question_text="What is in the video?")]
    )
    assert task.read(avqa, fmt="r1_aqa")[0][0].text() == "What is in the audio?"  # as R1-AQA
    other = r1_aqa_line(question_text="What is in the video?", dataset_name="other")
    assert task.read(write_lines(tmp_path / "o.jsonl", [other]), fmt="r1_aqa")[0][0].text() == (
        "What is in the video?"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"answer": 3}, r"'answer' must be the index of an option \(0–2\), got 3"),
        ({"answer": "rising"}, "'answer' must be the index of an option"),
        ({"multi_choice": ["only"]}, "'multi_choice' must list at least 2"),
        ({"question_text": None}, "missing field 'question_text'"),
        ({"audio_path": ""}, "'audio_path' must be a non-empty string"),
    ],
)
def test_r1_aqa_bad_lines(tmp_path, changes, message):
    path = write_lines(tmp_path / "t.jsonl", [r1_aqa_line(id=9), r1_aqa_line(**changes)])
    task = build_task("audio_qa", {"audio_root": str(AUDIO)})
    with pytest.raises(DataError, match=rf"t.jsonl:2: {message}"):
        task.read(path, fmt="r1_aqa")
    samples, stats = task.read(path, fmt="r1_aqa", on_error="skip")
    assert len(samples) == 1 and sum(stats.skipped.values()) == 1


def mmau_item(**changes) -> dict:
    item = {
        "id": "q1",
        "audio_id": "./audio/test-0000.wav",
        "question": "How does the pitch of the tone change?",
        "choices": ["falling", "rising"],
        "answer": "falling",
        "task": "sound",
        "category": "Information Extraction",
        "difficulty": "easy",
    }
    return changed(item, changes)


def test_mmau_reader_and_errors(tmp_path):
    path = write_json_list(
        tmp_path / "mmau.json",
        [mmau_item(), mmau_item(id="q2", answer=None), mmau_item(id="q3", answer="wobbling")],
    )
    task = build_task("audio_qa", {"audio_root": str(AUDIO)})
    with pytest.raises(
        DataError, match=r"mmau.json:3 \(item 1\): missing field 'answer' \(MMAU's test"
    ):
        task.read(path, fmt="mmau")
    samples, stats = task.read(path, fmt="mmau", on_error="skip")
    assert [s.id for s in samples] == ["q1"] and stats.read == 3
    assert sum(stats.skipped.values()) == 2
    assert samples[0].meta["category"] == "Information Extraction"
    assert samples[0].media("audio") == [str(AUDIO / "audio" / "test-0000.wav")]


def test_audio_qa_mmrft_needs_audio_and_valid_target(tmp_path):
    task = build_task("audio_qa")
    image = mmrft_line("a", {"choices": ["a", "b"]}, media=("image", "x.png"))
    with pytest.raises(DataError, match=r"d.jsonl:1: an audio QA sample needs an audio part"):
        task.read(write_lines(tmp_path / "d.jsonl", [image]))
    bad = mmrft_line("c", {"choices": ["a", "b"]}, media=("audio", "x.wav"))
    with pytest.raises(DataError, match=r"e.jsonl:1: target 'c' is not one of meta.choices"):
        task.read(write_lines(tmp_path / "e.jsonl", [bad]))


def test_audio_qa_evaluate():
    task = build_task("audio_qa")
    choices = ["falling", "rising", "steady", "rising then falling"]
    sample = Sample("a", [], "rising", {"choices": choices})
    cases = {
        "<answer>rising</answer>": (1.0, None, "rising"),
        "<answer>Rising.</answer>": (1.0, None, "rising"),
        "<answer>B</answer>": (1.0, None, "rising"),
        "<answer>rising then falling</answer>": (0.0, None, "rising then falling"),
        "<answer>rising or falling</answer>": (0.0, "several options", None),
        "<answer>falling, rising, steady, rising then falling</answer>": (
            0.0,
            "several options",
            None,
        ),
        "<answer>it rises</answer>": (0.0, "no option matched", None),
        "<answer>ris</answer>": (0.0, "no option matched", None),
        "<think>rising</think>": (0.0, "no answer tag", None),
    }
    check_evaluate(task, sample, cases)
    accuracy = VERIFIERS.get("accuracy").bind(task.default_verifiers()[1]["params"])
    assert accuracy(["<answer>rising or falling</answer>"], [sample])[0].value == 0.0


# -- detection -------------------------------------------------------------------------------------
def detection_sample(target=None, frame="pixels", **meta) -> Sample:
    target = [[0, 0, 10, 10], [20, 20, 30, 30]] if target is None else target
    return Sample(
        "d", [], target=target, meta={"image_size": [100, 100], "box_frame": frame, **meta}
    )


def boxes(*items) -> str:
    return (
        "<answer>" + json.dumps([{"bbox_2d": b, "confidence": c} for b, c in items]) + "</answer>"
    )


HALF = 51 / 101  # COCO AP at recall 0.5 with precision 1: 51 of the 101 recall points


def test_detection_evaluate():
    task = build_task("detection", {"max_boxes": 5})
    sample = detection_sample()
    a, b, far = [0, 0, 10, 10], [20, 20, 30, 30], [60, 60, 70, 70]
    cases = [
        (boxes((a, 0.9), (b, 0.8)), 1.0, None),
        (boxes((a, 0.9)), HALF, None),  # half the recall (101-point interpolation)
        (boxes((a, 0.9), (b, 0.8), (far, 0.1)), 1.0, None),  # a low-ranked false positive
        (boxes((far, 0.9), (a, 0.8), (b, 0.7)), pytest.approx(2 / 3), None),  # precision 2/3
        ("<answer>[[0, 0, 10, 10], [20, 20, 30, 30]]</answer>", 1.0, None),  # no confidences
        ("<answer>[{'Position': [0, 0, 10, 10], 'Confidence': 0.9}]</answer>", HALF, None),
        ("<answer>[]</answer>", 0.0, None),  # "none" on an image with instances
        (boxes(([0, 0, 100, 100], 1.0)), 0.0, None),  # a whole-image box matches nothing
        (boxes(*[(a, 0.5)] * 6), 0.0, "too many boxes"),
        (boxes(([10, 0, 0, 10], 0.9)), 0.0, "degenerate box"),
        (boxes((a, 0.9), ([9, 9, 9111, 91], 0.5)), 0.0, "box outside image"),
        (boxes((a, 0.9), (b, 0.8), ([60, 60, 83, 83], 0.1)), 1.0, None),  # 3 px past: clipped
        (boxes((a, 1.5)), 0.0, "bad confidence"),
        ("<answer>a circle at the top</answer>", 0.0, "no box"),
        (json.dumps([{"bbox_2d": a}]), 0.0, "no answer tag"),
    ]
    for completion, score, reason in cases:
        record = task.evaluate_one(completion, sample)
        assert (record.score, record.reason) == (score, reason), completion
        assert record.values["image_ap50"] == record.score
        assert 0.0 <= record.values["detection"] <= 1.0
    perfect = task.evaluate_one(boxes((a, 0.9), (b, 0.8)), sample)
    # Visual-RFT reward: IoU part 1 × (1 + mean confidence 0.85) / 2
    assert perfect.values["detection"] == pytest.approx(0.925)
    assert perfect.parsed == [{"box": a, "score": 0.9}, {"box": b, "score": 0.8}]
    assert perfect.to_json()["target"] == [a, b]
    empty = detection_sample(target=[])
    assert task.evaluate_one("<answer>[]</answer>", empty).score == 1.0
    assert task.evaluate_one(boxes((a, 0.1)), empty).score == 0.0


@pytest.mark.parametrize(
    ("frame", "extra", "answer_box"),
    [
        ("norm1000", {}, [0, 0, 100, 100]),
        ("input_pixels", {"input_size": [200, 200]}, [0, 0, 20, 20]),
        ("norm1", {}, [0, 0, 0.1, 0.1]),
    ],
)
def test_detection_reads_the_family_frame(frame, extra, answer_box):
    task = build_task("detection")
    sample = detection_sample(target=[[0, 0, 10, 10]], frame=frame, **extra)
    record = task.evaluate_one(boxes((answer_box, 1.0)), sample)
    assert record.score == 1.0 and record.parsed[0]["box"] == pytest.approx([0, 0, 10, 10])
    reference = f"<answer>{task.reference_answer(sample)}</answer>"
    assert task.evaluate_one(reference, sample).score == 1.0
    with pytest.raises(ValueError, match="no meta\\['box_frame'\\]"):
        task.evaluate_one("<answer>[]</answer>", Sample("x", [], [], {"image_size": [5, 5]}))


def test_detection_aggregate_is_coco_map_over_the_split():
    task = build_task("detection")
    a, b, c = [0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 70, 60]
    samples = [
        detection_sample(),
        detection_sample(target=[c]),
        detection_sample(target=[]),
        detection_sample(target=[a]),
    ]
    completions = [
        boxes((a, 0.9), ([21, 21, 31, 31], 0.6), ([60, 0, 70, 10], 0.95)),
        boxes(([52, 50, 70, 61], 0.7)),
        boxes((b, 0.3)),  # a false positive on an image without instances
        "<answer>nothing</answer>",  # unparsable: no detections, counted in format_fail
    ]
    records = task.evaluate(completions, samples)
    metrics = task.aggregate(records)
    predictions = [r.parsed or [] for r in records]
    expected = coco_map(predictions, [s.target for s in samples])
    for key in ("mAP", "AP50", "AP75"):
        assert metrics[key] == pytest.approx(expected[key]), key
    assert 0 < metrics["mAP"] < metrics["AP50"] < 1
    assert metrics["format_fail"] == 0.25
    assert metrics["image_ap50"] == pytest.approx(sum(r.score for r in records) / 4)
    assert set(metrics) == {"mAP", "AP50", "AP75", "image_ap50", "detection", "format_fail"}
    nothing = task.aggregate(task.evaluate(["<answer>[]</answer>"], [detection_sample(target=[])]))
    assert math.isnan(nothing["AP50"]) and nothing["image_ap50"] == 1.0


@pytest.mark.parametrize(
    ("target", "meta", "message"),
    [
        ([[1, 2, 3]], {"image_size": [10, 10]}, r"'target\[0\]' must be a box"),
        ([[5, 5, 2, 8]], {"image_size": [10, 10]}, "x1 < x2 and y1 < y2"),
        ([[1, 1, 50, 5]], {"image_size": [10, 10]}, "outside the 10×10 image"),
        ([1, 2, 3, 4], {"image_size": [10, 10]}, r"'target\[0\]' must be a box"),
        ({"box": [1, 1, 2, 2]}, {"image_size": [10, 10]}, "target must be a list of boxes"),
        ([[1, 1, 2, 2]], {"image_size": [10, 10], "count_range": [2, 4]}, "outside count_range"),
        ([[1, 1, 2, 2]], {}, r"image not found \(.*img.png\)"),
    ],
)
def test_detection_bad_lines(tmp_path, target, meta, message):
    line = mmrft_line(target, meta, media=("image", "img.png"))
    path = write_lines(tmp_path / "d.jsonl", [line])
    with pytest.raises(DataError, match=rf"d.jsonl:1: .*{message}"):
        build_task("detection").read(path)
    samples, stats = build_task("detection").read(path, on_error="skip")
    assert samples == [] and sum(stats.skipped.values()) == 1


def test_detection_prompt_asks_for_a_list_in_the_family_frame():
    task = build_task("detection", {"think": "none"})
    sample = detection_sample(target=[])
    sample.messages = [{"role": "user", "content": [{"type": "text", "text": "Find every cat."}]}]
    qwen2, qwen25 = families()[:2]
    text2 = task.prompt(sample, qwen2)[-1]["content"][-1]["text"]
    text25 = task.prompt(sample, qwen25)[-1]["content"][-1]["text"]
    assert text2.startswith(
        'Find every cat. Output a JSON list with one object per instance, [{"bbox_2d"'
    )
    assert "integers from 0 to 1000" in text2 and "integers from 0 to 1000" not in text25
    assert "in pixel coordinates of the image" in text25
    assert "output [] if there is none" in text25
    with pytest.raises(ConfigError, match="max_boxes must be ≥ 1"):
        build_task("detection", {"max_boxes": 0})


# -- chart QA --------------------------------------------------------------------------------------
def test_chart_qa_evaluate():
    task = build_task("chart_qa")
    value = Sample("v", [], 44, {})
    zero = Sample("z", [], "0", {})
    text = Sample("t", [], "Yes", {})
    largest = Sample("l", [], "D", {"choices": ["A", "B", "C", "D", "E"]})
    cases = [
        (value, "<answer>44</answer>", 1.0, None, 44),
        (value, "<answer>46</answer>", 1.0, None, 46),  # within 5 %
        (value, "<answer>41.9</answer>", 1.0, None, 41.9),
        (value, "<answer>47</answer>", 0.0, None, 47),
        (value, "<answer>44%</answer>", 1.0, None, 44),
        (value, "<answer>The value of A is 44.</answer>", 1.0, None, 44),
        (value, "<answer>44 or 45</answer>", 0.0, "several numbers", None),
        (value, "<answer>about forty</answer>", 0.0, "no number", None),
        (value, "<think>44</think>", 0.0, "no answer tag", None),
        (zero, "<answer>0</answer>", 1.0, None, 0),
        (zero, "<answer>0.01</answer>", 0.0, None, 0.01),
        (text, "<answer>yes.</answer>", 1.0, None, "yes"),
        (text, "<answer>yes, no</answer>", 0.0, None, "yes, no"),
        (text, "<answer>y</answer>", 0.0, None, "y"),
        (largest, "<answer>D</answer>", 1.0, None, "D"),
        (largest, "<answer>B</answer>", 0.0, None, "B"),
        (largest, "<answer>A or D</answer>", 0.0, "several options", None),
    ]
    accuracy = VERIFIERS.get("accuracy").bind(task.default_verifiers()[1]["params"])
    for sample, completion, score, reason, parsed in cases:
        record = task.evaluate_one(completion, sample)
        assert (record.score, record.reason, record.parsed) == (score, reason, parsed), completion
        assert record.values == {"relaxed_accuracy": score}
        # the default reward and the evaluation agree on every case
        assert accuracy([completion], [sample])[0].value == score, completion


def test_chartqa_reader(tmp_path):
    (tmp_path / "png").mkdir()
    Image.new("RGB", (40, 30), "white").save(tmp_path / "png" / "a.png")
    items = [
        {"imgname": "a.png", "query": "How many bars?", "label": "4"},
        {"imgname": "a.png", "query": "Is it blue?", "label": "Yes"},
        {"imgname": "a.png", "query": "Share?", "label": 0.57},
        {"imgname": "a.png", "query": "Bad?"},
        {"imgname": "a.png", "query": "Empty?", "label": " "},
    ]
    path = write_json_list(tmp_path / "test_human.json", items)
    task = build_task("chart_qa")
    with pytest.raises(DataError, match=r"test_human.json:5 \(item 3\): missing field 'label'"):
        task.read(path, fmt="chartqa")
    samples, stats = task.read(path, fmt="chartqa", on_error="skip")
    assert [s.target for s in samples] == ["4", "Yes", "0.57"]
    assert samples[0].id == "test_human-0" and sum(stats.skipped.values()) == 2
    assert samples[0].media("image") == [str(tmp_path / "png" / "a.png")]
    assert task.evaluate_one("<answer>0.56</answer>", samples[2]).score == 1.0
    family = MODEL_FAMILIES.get("qwen2_5_vl")()
    assert task.prompt(samples[0], family)[-1]["content"][-1]["text"] == (
        "How many bars?\nAnswer the question using a single word or phrase.\n"
        "First think about the question inside <think> </think> tags, then give the final "
        "answer inside <answer> </answer> tags."
    )


@pytest.mark.parametrize(
    ("target", "meta", "message"),
    [
        (None, {}, r"no answer \(task 'chart_qa' needs one.*task.name=prompt"),
        (True, {}, "target must be a number or a non-empty string"),
        ("Z", {"choices": ["A", "B"]}, "not one of meta.choices"),
    ],
)
def test_chart_qa_bad_lines(tmp_path, target, meta, message):
    path = write_lines(tmp_path / "d.jsonl", [mmrft_line(target, meta, media=("image", "x.png"))])
    with pytest.raises(DataError, match=rf"d.jsonl:1: .*{message}"):
        build_task("chart_qa").read(path)
    with pytest.raises(ConfigError, match=r"rel_tol must be in \[0, 1\)"):
        build_task("chart_qa", {"rel_tol": 1.5})


# -- chart-to-code ---------------------------------------------------------------------------------
def chart_code_samples(n: int) -> list[Sample]:
    pytest.importorskip("skimage")
    task = build_task("chart_to_code")
    samples, stats = task.read(BENCH / "charts" / "code_test.jsonl")
    assert stats.kept == stats.read == 100 and not stats.skipped
    return samples[:n]


def test_chart_to_code_reference_scores_one_and_failures_score_zero():
    """The reference script scores 1 on every metric; a script that raises, one that draws
    nothing and an answer without code score 0 with their reasons, exec_rate counting runs."""
    task = build_task("chart_to_code", {"think": "none"})
    samples = chart_code_samples(4)
    reference = [f"<answer>{task.reference_answer(s)}</answer>" for s in samples]
    records = task.evaluate(reference, samples)
    for record in records:
        assert record.reason is None and record.score == pytest.approx(1.0)
        assert record.values["exec_rate"] == 1.0 and record.values["score"] == pytest.approx(1.0)
        assert record.values["ssim"] == pytest.approx(1.0)
        assert "savefig" in record.parsed
    raises = "<answer>import matplotlib.pyplot as plt\nplt.bar([1], [1])\n1 / 0</answer>"
    blank = "<answer>import matplotlib.pyplot as plt\nplt.figure()</answer>"
    no_code = "<answer></answer>"
    recolour = reference[0].replace(samples[0].meta["colour"], "#000000")
    bad = task.evaluate([raises, blank, no_code, recolour], [*samples[1:], samples[0]])
    assert [r.values["exec_rate"] for r in bad] == [0.0, 1.0, 0.0, 1.0]
    assert bad[0].reason == "exception: ZeroDivisionError" and bad[0].score == 0.0
    assert bad[1].reason == "blank render" and bad[2].parsed is None and bad[2].reason
    assert bad[3].reason is None and bad[3].values["colour"] < 1.0
    assert bad[3].values["text_f1"] == 1.0 and 0.5 < bad[3].score < 1.0
    metrics = task.aggregate(records + bad)
    assert metrics["exec_rate"] == pytest.approx(6 / 8)
    assert metrics["format_fail"] == pytest.approx(3 / 8)
    assert metrics[task.primary_metric] == pytest.approx((4 + bad[3].score) / 8)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"target": ""}, "the target must be the reference code"),
        ({"target": 3}, "the target must be the reference code"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "Draw."}]}]},
            "needs the chart image",
        ),
    ],
)
def test_chart_to_code_bad_lines(tmp_path, changes, message):
    line = json.loads((BENCH / "charts" / "code_test.jsonl").read_text().splitlines()[0])
    line["messages"][0]["content"][0]["image"] = str(BENCH / "charts" / "images" / "test-0000.png")
    path = write_lines(tmp_path / "c.jsonl", [{**line, **changes}])
    with pytest.raises(DataError, match=f"c.jsonl:1: .*{message}"):
        build_task("chart_to_code").read(path)
    samples, stats = build_task("chart_to_code").read(path, on_error="skip")
    assert samples == [] and sum(stats.skipped.values()) == 1


def test_video_qa_corrupt_or_empty_videos_are_named_or_skipped_and_counted(tmp_path):
    """data.on_error through the model family's media check: a corrupt or empty mp4 stops the
    read naming the file, or is skipped and counted; the good clip stays."""
    import shutil

    from mmrft.models.qwen_vl import check_media

    lines = (BENCH / "video_direction" / "test.jsonl").read_text().splitlines()[:3]
    (tmp_path / "videos").mkdir()
    shutil.copy(BENCH / "video_direction" / "videos" / "test-0000.mp4", tmp_path / "videos")
    (tmp_path / "videos" / "test-0001.mp4").write_bytes(b"not a video at all")
    (tmp_path / "videos" / "test-0002.mp4").write_bytes(b"")
    path = tmp_path / "test.jsonl"
    path.write_text("\n".join(lines) + "\n")
    task = build_task("video_qa")
    with pytest.raises(DataError, match=r"test-0001\.mp4"):
        task.read(path, check=check_media)
    samples, stats = task.read(path, on_error="skip", check=check_media)
    assert [s.id for s in samples] == ["video_direction-test-0000"]
    assert sum(stats.skipped.values()) == 2, stats.summary()
