"""Built-in tasks: readers (project JSONL, VLM-R1 RefCOCO), strict evaluation, chance, reference
answers, default verifiers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import check_evaluate
from PIL import Image

from mmrft.data import DataError, Sample
from mmrft.models.family import MediaBudget
from mmrft.plugins import MODEL_FAMILIES
from mmrft.rewards.reward import build_reward
from mmrft.rewards.task import build_task
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "assets" / "benchmarks"
BUNDLED = {
    "shapes_colour": "classification",
    "shapes_kind": "classification",
    "shapes_counting": "counting",
    "shapes_grounding": "grounding",
}


def write_lines(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def families() -> list:
    """One family per box frame: Qwen2-VL (norm1000), Qwen2.5-VL at its default budget, and
    Qwen2.5-VL upscaling every image (so input pixels ≠ original pixels)."""
    qwen2 = MODEL_FAMILIES.get("qwen2_vl")
    qwen25 = MODEL_FAMILIES.get("qwen2_5_vl")
    return [qwen2(), qwen25(), qwen25(MediaBudget(min_pixels=200 * 200, max_pixels=300 * 300))]


# -- RefCOCO (VLM-R1 rec_jsons_processed) ------------------------------------------------------
def refcoco_line(image: str = "COCO_train2014_000000000001.jpg", **changes) -> dict:
    record = {
        "image": image,
        "problem": "Please provide the bounding box coordinate of the region: the dog on the left",
        "normal_caption": "the dog on the left",
        "solution": [10.5, 20.0, 50.25, 40.0],
        "normalized_solution": [164, 416, 785, 1250],
    }
    record.update(changes)
    return record


@pytest.fixture
def coco(tmp_path: Path) -> Path:
    """An image root with one 64×48 JPEG."""
    root = tmp_path / "train2014"
    root.mkdir()
    Image.new("RGB", (64, 48), (90, 120, 200)).save(root / "COCO_train2014_000000000001.jpg")
    return root


def test_refcoco_reader(tmp_path, coco):
    path = write_lines(
        tmp_path / "refcoco_val.jsonl",
        [refcoco_line(), refcoco_line(normal_caption=" man ", solution=[0, 0, 64, 48], id=7)],
    )
    task = build_task("grounding", {"image_root": str(coco)})
    samples, stats = task.read(path, fmt="refcoco")
    assert stats.kept == 2
    first, second = samples
    assert first.id == "refcoco_val-1" and second.id == "7"
    assert first.text() == "the dog on the left" and second.text() == "man"
    assert first.media("image") == [str(coco / "COCO_train2014_000000000001.jpg")]
    assert first.target == [10.5, 20.0, 50.25, 40.0]
    assert first.meta == {"image_size": [64, 48]}


def test_refcoco_image_root_defaults_to_the_file_folder(coco):
    path = write_lines(coco / "refcoco_val.jsonl", [refcoco_line()])
    samples, _ = build_task("grounding").read(path, fmt="refcoco")
    assert samples[0].meta["image_size"] == [64, 48]


def test_refcoco_missing_field_names_file_and_line(tmp_path, coco):
    bad = refcoco_line()
    del bad["normal_caption"]
    path = write_lines(tmp_path / "refcoco_val.jsonl", [refcoco_line(), bad])
    task = build_task("grounding", {"image_root": str(coco)})
    with pytest.raises(DataError, match=r"refcoco_val.jsonl:2: missing field 'normal_caption'"):
        task.read(path, fmt="refcoco")


def test_refcoco_missing_image_raises_or_is_skipped(tmp_path, coco):
    path = write_lines(
        tmp_path / "refcoco_val.jsonl", [refcoco_line(), refcoco_line(image="gone.jpg")]
    )
    task = build_task("grounding", {"image_root": str(coco)})
    with pytest.raises(DataError, match=r"refcoco_val.jsonl:2: image not found \(.*gone.jpg\)"):
        task.read(path, fmt="refcoco")
    samples, stats = task.read(path, fmt="refcoco", on_error="skip")
    assert len(samples) == 1 and stats.read == 2
    assert stats.skipped == {"image not found": 1}


def test_refcoco_rejects_bad_boxes_and_json_arrays(tmp_path, coco):
    task = build_task("grounding", {"image_root": str(coco)})
    inverted = write_lines(tmp_path / "a.jsonl", [refcoco_line(solution=[50, 20, 10, 40])])
    with pytest.raises(DataError, match=r"a.jsonl:1: 'solution' box .* x1 < x2"):
        task.read(inverted, fmt="refcoco")
    outside = write_lines(tmp_path / "b.jsonl", [refcoco_line(solution=[10, 20, 100, 40])])
    with pytest.raises(DataError, match="outside the 64×48 image"):
        task.read(outside, fmt="refcoco")
    array = tmp_path / "refcoco_val.json"  # VLM-R1 ships JSON lists: read as they are
    array.write_text(json.dumps([refcoco_line(), refcoco_line()], indent=1))
    samples, _ = task.read(array, fmt="refcoco")
    assert [s.id for s in samples] == ["refcoco_val-0", "refcoco_val-1"]
    assert samples[0].target == [10.5, 20.0, 50.25, 40.0]
    with pytest.raises(ConfigError, match="reads mmrft, conversations, deepeyes, refcoco"):
        task.read(array, fmt="coco")


# -- project JSONL readers -------------------------------------------------------------------
def mmrft_line(target, meta, image="img.png", text="Q?") -> dict:
    content = [{"type": "image", "image": image}, {"type": "text", "text": text}]
    return {
        "id": "s",
        "messages": [{"role": "user", "content": content}],
        "target": target,
        "meta": meta,
    }


def test_grounding_reads_image_size_from_header_when_absent(coco):
    path = write_lines(
        coco / "d.jsonl", [mmrft_line([1, 2, 30, 40], {}, image="COCO_train2014_000000000001.jpg")]
    )
    samples, _ = build_task("grounding").read(path)
    assert samples[0].meta["image_size"] == [64, 48]
    missing = write_lines(coco / "e.jsonl", [mmrft_line([1, 2, 30, 40], {}, image="nope.png")])
    with pytest.raises(DataError, match=r"e.jsonl:1: image not found \(.*nope.png\)"):
        build_task("grounding").read(missing)


@pytest.mark.parametrize(
    ("task_name", "target", "meta", "message"),
    [
        ("classification", "red", {}, "meta.choices must list"),
        ("classification", "purple", {"choices": ["red", "blue"]}, "not one of meta.choices"),
        ("counting", "3", {}, "target must be an integer"),
        ("counting", 7, {"count_range": [1, 6]}, "outside count_range"),
        ("grounding", [1, 2, 3], {"image_size": [10, 10]}, "must be a box"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, task_name, target, meta, message):
    path = write_lines(tmp_path / "d.jsonl", [mmrft_line(target, meta)])
    with pytest.raises(DataError, match=rf"d.jsonl:1: .*{message}"):
        build_task(task_name).read(path)
    samples, stats = build_task(task_name).read(path, on_error="skip")
    assert samples == [] and sum(stats.skipped.values()) == 1


# -- strict evaluation ---------------------------------------------------------------------------
def grounding_sample(frame: str, input_size=None) -> Sample:
    meta = {"image_size": [200, 100], "box_frame": frame}
    if input_size:
        meta["input_size"] = input_size
    return Sample("g", [], target=[20, 10, 60, 50], meta=meta)


@pytest.mark.parametrize(
    ("frame", "input_size", "answer"),
    [
        ("pixels", None, "[20, 10, 60, 50]"),
        ("norm1000", None, '{"bbox_2d": [100, 100, 300, 500]}'),
        ("input_pixels", [400, 200], '{"bbox_2d": [40, 20, 120, 100]}'),
    ],
)
def test_grounding_evaluate_reads_the_family_frame(frame, input_size, answer):
    task = build_task("grounding")
    record = task.evaluate_one(
        f"<think>..</think><answer>{answer}</answer>", grounding_sample(frame, input_size)
    )
    assert record.values == {"acc@0.5": 1.0, "iou": pytest.approx(1.0)}
    assert record.score == 1.0 and record.reason is None
    assert record.parsed == pytest.approx([20, 10, 60, 50])


def test_grounding_wrong_object_is_a_box_on_another_listed_object():
    task = build_task("grounding")
    sample = grounding_sample("pixels")
    sample.meta["other_boxes"] = [[100, 10, 140, 50], [150, 60, 190, 95]]
    cases = {  # completion: (acc@0.5, wrong_object)
        "<answer>[20, 10, 60, 50]</answer>": (1.0, 0.0),  # the referred object
        "<answer>[102, 12, 140, 50]</answer>": (0.0, 1.0),  # IoU 0.9 with another object
        "<answer>[70, 10, 95, 50]</answer>": (0.0, 0.0),  # background: neither
        "<answer>[120, 10, 160, 50]</answer>": (0.0, 0.0),  # IoU 1/3 with the other: a miss
        "<answer>left</answer>": (0.0, 0.0),  # unparsable: a format failure, not an object
    }
    for completion, (correct, wrong) in cases.items():
        values = task.evaluate_one(completion, sample).values
        assert (values["acc@0.5"], values["wrong_object"]) == (correct, wrong), completion
    # Without meta.other_boxes the value is absent, not 0: nothing to compare with.
    plain = task.evaluate_one("<answer>[102, 12, 140, 50]</answer>", grounding_sample("pixels"))
    assert "wrong_object" not in plain.values


def test_grounding_other_boxes_are_checked_when_read(tmp_path):
    lines = [
        mmrft_line([1, 2, 3, 4], {"image_size": [10, 10], "other_boxes": [[5, 5, 9, 9]]}),
        mmrft_line([1, 2, 3, 4], {"image_size": [10, 10], "other_boxes": [[5, 5, 4, 9]]}),
        mmrft_line([1, 2, 3, 4], {"image_size": [10, 10], "other_boxes": [5, 5, 9, 9]}),
    ]
    path = write_lines(tmp_path / "d.jsonl", lines)
    with pytest.raises(DataError, match=r"d.jsonl:2: 'meta.other_boxes' box .* x1 < x2"):
        build_task("grounding").read(path)
    samples, stats = build_task("grounding").read(path, on_error="skip")
    assert [s.meta["other_boxes"] for s in samples] == [[[5, 5, 9, 9]]]
    assert sum(stats.skipped.values()) == 2


def test_grounding_evaluate_failures():
    task = build_task("grounding")
    sample = grounding_sample("pixels")
    cases = {
        "[20, 10, 60, 50]": "no answer tag",
        "<answer>[20, 10, 60, 50]</answer><answer>[0,0,1,1]</answer>": "several answer tags",
        "<answer>[20, 10, 60, 50] or [0, 0, 5, 5]</answer>": "several boxes",
        "<answer>left</answer>": "no box",
        "<answer>[60, 10, 20, 50]</answer>": "degenerate box",
    }
    for completion, reason in cases.items():
        record = task.evaluate_one(completion, sample)
        assert (record.score, record.reason, record.values["iou"]) == (0.0, reason, 0.0), completion
    # Parsed but off target: a wrong answer, not a format failure; IoU 1/3 < 0.5.
    record = task.evaluate_one("<answer>[40, 10, 80, 50]</answer>", sample)
    assert record.reason is None and record.score == 0.0
    assert record.values["iou"] == pytest.approx(1 / 3)
    # A box slightly past the image edge (within 5 % of the 100-px height) is clipped before
    # the IoU; one further past, or the reported [9, 9, 9111, 91], is a failure with a reason.
    record = task.evaluate_one("<answer>[20, 10, 60, 104]</answer>", sample)
    assert record.values["iou"] == pytest.approx(40 / 90) and record.reason is None
    for box in ("[20, 10, 60, 130]", "[9, 9, 9111, 91]", "[-20, 10, 60, 50]"):
        record = task.evaluate_one(f"<answer>{box}</answer>", sample)
        assert (record.score, record.reason, record.values["iou"]) == (
            0.0,
            "box outside image",
            0.0,
        ), box
    with pytest.raises(ValueError, match="no meta\\['box_frame'\\]"):
        task.evaluate_one("<answer>[1, 2, 3, 4]</answer>", Sample("x", [], [1, 2, 3, 4], {}))


def test_classification_evaluate():
    task = build_task("classification")
    sample = Sample("c", [], target="green", meta={"choices": ["red", "green", "blue"]})
    scored = {
        "<answer>green</answer>": (1.0, None, "green"),
        "<think>red?</think><answer>B</answer>": (1.0, None, "green"),
        "<answer>B. green</answer>": (1.0, None, "green"),
        "<answer>red</answer>": (0.0, None, "red"),
        "<answer>red or green</answer>": (0.0, "several options", None),
        "<answer>greenish</answer>": (0.0, "no option matched", None),
        "green": (0.0, "no answer tag", None),
    }
    for record in check_evaluate(task, sample, scored):
        assert record.values == {"accuracy": record.score}


def test_counting_evaluate():
    task = build_task("counting")
    sample = Sample("n", [], target=3, meta={"count_range": [1, 6]})
    scored = {
        "<answer>3</answer>": (1.0, None, 3),
        "<answer>three</answer>": (1.0, None, 3),
        "<answer>There are 3 shapes.</answer>": (1.0, None, 3),
        "<answer>4</answer>": (0.0, None, 4),
        "<answer>3.5</answer>": (0.0, None, 3.5),
        "<answer>3 or 4</answer>": (0.0, "several numbers", None),
        "<answer>many</answer>": (0.0, "no number", None),
        "<think>3</think>": (0.0, "no answer tag", None),
    }
    check_evaluate(task, sample, scored)


def test_chance():
    """Chance = mean over samples of 1 / |the sample's options that are some sample's target|
    (mmrft.rewards.task.uniform_target_chance); every value below is worked out by hand."""
    classification = build_task("classification")
    two = Sample("a", [], "x", {"choices": ["x", "y"]})
    four = Sample("b", [], "y", {"choices": ["x", "y", "z", "w"]})
    # targets {x, y}: both samples can only be right with x or y → 1/2 each; z, w never count
    assert classification.chance([two, four]) == pytest.approx(0.5)
    # one sample's options in a different order, its target given as a letter ("B" = x)
    lettered = Sample("c", [], "B", {"choices": ["z", "x", "y"]})
    only_x = Sample("d", [], "x", {"choices": ["x", "w"]})
    # targets {x}: one answer for the whole split (a smoke run's 2 samples): no chance level
    assert classification.chance([lettered, only_x]) is None
    # targets {x, y, z}: 1/2 (x, y of two) + 1/3 (x, y, z of four) + 1/3 (z, x, y) → 7/18
    third = Sample("e", [], "z", {"choices": ["z", "x", "y"]})
    assert classification.chance([two, four, third]) == pytest.approx((1 / 2 + 2 / 3) / 3)
    assert classification.chance([]) is None
    counting = build_task("counting")
    in_range = [Sample(f"n{k}", [], k, {"count_range": [1, 6]}) for k in (2, 3, 3)]
    # targets {2, 3} of 1–6: 1/2 each; a sample of range [3, 4] holds only 3 → 1
    assert counting.chance(in_range) == pytest.approx(1 / 2)
    narrow = Sample("m", [], 3, {"count_range": [3, 4]})
    assert counting.chance([*in_range, narrow]) == pytest.approx((3 / 2 + 1) / 4)
    every = [Sample(f"k{k}", [], k, {"count_range": [1, 6]}) for k in range(1, 7)]
    assert counting.chance(every) == pytest.approx(1 / 6)
    assert counting.chance([Sample("n", [], 2, {})]) is None
    assert build_task("grounding").chance([grounding_sample("pixels")]) is None


# -- prompts and params ----------------------------------------------------------------------------
def test_classification_prompt_lists_options_in_data_order():
    family = MODEL_FAMILIES.get("qwen2_vl")()
    sample = Sample(
        "c",
        [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "/x.png"},
                    {"type": "text", "text": "Colour?"},
                ],
            }
        ],
        target="blue",
        meta={"choices": ["yellow", "blue", "red"]},
    )
    task = build_task("classification", {"think": "none"})
    messages = task.prompt(sample, family)
    assert messages[0]["content"][0] == {"type": "image", "image": "/x.png"}
    assert messages[0]["content"][1]["text"] == (
        "Colour?\nOptions: yellow, blue, red\n"
        "Give only the final answer inside <answer> </answer> tags."
    )
    lettered = build_task("classification", {"think": "none", "lettered": True})
    text = lettered.prompt(sample, family)[0]["content"][1]["text"]
    assert "Options:\nA. yellow\nB. blue\nC. red\nAnswer with the option letter only." in text
    assert lettered.reference_answer(sample) == "B"
    assert lettered.evaluate_one("<answer>B</answer>", sample).score == 1.0
    hidden = build_task("classification", {"show_choices": False})
    assert "Options" not in hidden.prompt(sample, family)[0]["content"][1]["text"]
    assert sample.text() == "Colour?"  # the sample itself is untouched


def test_task_params_are_checked():
    with pytest.raises(ConfigError, match="lettered needs show_choices"):
        build_task("classification", {"lettered": True, "show_choices": False})
    with pytest.raises(ConfigError, match="did you mean 'show_choices'"):
        build_task("classification", {"show_choice": True})
    with pytest.raises(ConfigError, match="image_root"):
        build_task("grounding", {"image_root": 3})


# -- bundled benchmarks: reference answers score 1, default verifiers agree ----------------------
@pytest.mark.parametrize("benchmark", sorted(BUNDLED))
def test_reference_answers_score_one(benchmark):
    task = build_task(BUNDLED[benchmark], {"think": "none"})
    samples, stats = task.read(BENCHMARKS / benchmark / "test.jsonl")
    assert stats.kept == 200
    reward = build_reward(task.default_verifiers())
    high = sum(w * v.spec.high for v, w in reward.verifiers)
    for family in families() if task.name == "grounding" else families()[:1]:
        for sample in samples:
            family.annotate(sample)
        completions = [f"<answer>{task.reference_answer(s)}</answer>" for s in samples]
        records = task.evaluate(completions, samples)
        assert all(r.score == 1.0 and r.reason is None for r in records), family.name
        totals = reward(completions, samples).total
        # IoU of a box rounded to whole frame units stays just below 1.
        assert min(totals) >= high - 0.1 and all(r > 1.5 for r in totals)


def test_template_escapes_become_newlines():
    """`task.params.template='{question}\\n{format_instruction}'` on a command line keeps the
    two characters; the task makes them the newline the user meant."""
    from mmrft.config import load_config

    cfg = load_config(
        None, ["train.steps=0", r"task.params={template: '{question}\n{format_instruction}'}"]
    )
    task = build_task(cfg.task.name, cfg.task.params)
    assert task.template == "{question}\n{format_instruction}"


def test_grounding_prompt_from_an_instruction_question():
    """VLM-R1's conversations put an instruction before the expression; the prompt names the
    expression once ('Locate the man on the left in the image.')."""
    family = MODEL_FAMILIES.get("qwen2_5_vl")()
    task = build_task("grounding", {"think": "none"})
    question = (
        "Please provide the bounding box coordinate of the region this sentence describes: "
        "the man on the left."
    )
    for text, expression in [(question, "the man on the left"), ("the red cup", "the red cup")]:
        sample = Sample(
            "g",
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": "/x.png"},
                        {"type": "text", "text": text},
                    ],
                }
            ],
            [1, 2, 3, 4],
            {"image_size": [10, 10]},
        )
        prompt = task.prompt(sample, family)[-1]["content"][-1]["text"]
        assert prompt.startswith(f"Locate {expression} in the image."), prompt


def test_system_prompt_goes_first_unless_the_sample_has_one():
    from mmrft.config import load_config

    family = MODEL_FAMILIES.get("qwen2_5_vl")()
    cfg = load_config(None, ["train.steps=0", "task.system_prompt=Think step by step."])
    task = build_task(cfg.task.name, {"think": "none"}, cfg.task.system_prompt)
    plain = Sample(
        "p", [{"role": "user", "content": "Colour?"}], "red", {"choices": ["red", "blue"]}
    )
    messages = task.prompt(plain, family)
    assert messages[0] == {
        "role": "system",
        "content": [{"type": "text", "text": "Think step by step."}],
    }
    own = Sample("o", [{"role": "system", "content": "Mine."}, *plain.messages], "red", plain.meta)
    assert task.prompt(own, family)[0] == {"role": "system", "content": "Mine."}


def test_qa_task_for_free_form_answers(tmp_path):
    """A flat dataset of short answers (a word, a number) runs as the generic qa task, no
    mapping, no options; its metric is the accuracy verifier's rule."""
    path = tmp_path / "qa.jsonl"
    image = str(REPO / "assets/benchmarks/shapes_colour/images/test-0000.png")
    rows = [
        {"id": "w", "question": "What is written?", "answer": "Stop", "image": image},
        {"id": "n", "question": "How many?", "answer": 12, "image": image},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_task("qa", {"think": "none"})
    samples, _ = task.read(path)
    assert [s.target for s in samples] == ["Stop", 12]
    word, number = samples
    assert task.evaluate_one("<answer>stop.</answer>", word).score == 1.0
    assert task.evaluate_one("<answer>go</answer>", word).score == 0.0
    assert task.evaluate_one("<answer>12</answer>", number).score == 1.0
    assert task.evaluate_one("12", number).reason  # no answer tag: a reason, score 0
    assert task.reference_answer(number) == "12"
    assert {v["name"] for v in task.default_verifiers()} == {"format", "accuracy"}
    with pytest.raises(ConfigError):
        build_task("qa", {"mode": "choices"})
