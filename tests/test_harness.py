"""lmms-eval inside mmrft (eval.harness=lmms_eval): the adapter, the run's metrics and files,
`mmrft eval`, keep_best, the missing extra, one evaluation in a distributed run.

The lmms-eval task is the bundled local one (configs/lmms_eval/mmrft_shapes_colour): the
demo's test split with mmrft's classification prompt, no download."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from mmrft.config import load_config
from mmrft.typecheck import ConfigError

# found, not imported: collecting this file in every pytest worker must not import lmms-eval
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lmms_eval") is None,
    reason='lmms-eval not installed (pip install -e ".[eval]")',
)

REPO = Path(__file__).resolve().parents[1]
TASK = "mmrft_shapes_colour"
HARNESS = ["eval.harness=lmms_eval", f"eval.harness_tasks=[{TASK}]"]


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    """lmms-eval reads the JSON lines through `datasets`, which writes a cache: the test's own."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def tiny_run(tmp_path: Path, *extra: str):
    return load_config(
        REPO / "configs/demo.yaml",
        [
            f"output_dir={tmp_path}",
            "name=harness",
            "warm_start.steps=0",
            "train.steps=2",
            "train.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "data.max_test_samples=4",
            "eval.every=1",
            "checkpoint.every=0",
            "train.threads=1",
            *HARNESS,
            "eval.harness_limit=4",
            *extra,
        ],
    )


def metric_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------- pieces


def test_results_flatten_to_harness_metrics():
    from mmrft.evaluation.harness import flatten_results

    results = {
        "results": {
            "mmmu_val": {"alias": "mmmu_val", "acc,none": 0.5, "acc_stderr,none": "N/A"},
            "gsm": {"exact_match,flexible-extract": 0.25, "exact_match_stderr,none": 0.1},
        }
    }
    assert flatten_results(results) == {
        "harness/mmmu_val/acc": 0.5,
        "harness/gsm/exact_match/flexible-extract": 0.25,
        "harness/gsm/exact_match_stderr": 0.1,
    }


def test_generation_settings_and_stop_strings():
    from mmrft.evaluation.harness import cut_at_until, sampling_of

    greedy = sampling_of({"max_new_tokens": 16, "temperature": 0, "do_sample": False}, 99)
    assert greedy.greedy and greedy.max_new_tokens == 16
    assert sampling_of({}, 99).max_new_tokens == 99 and sampling_of({}, 99).greedy
    # a temperature without do_sample=False samples; do_sample=False wins over a temperature
    hot = sampling_of({"temperature": 0.7, "top_p": 0.9}, 8)
    assert not hot.greedy and hot.temperature == 0.7 and hot.top_p == 0.9
    assert sampling_of({"temperature": 0.7, "do_sample": False}, 8).greedy
    assert cut_at_until("A. yes\nQ: next", ["\nQ:"]) == "A. yes"
    assert cut_at_until("one\n\ntwo", ["\n\n"]) == "one\n\ntwo"  # as lmms-eval's Qwen adapters
    assert cut_at_until("a</s>b", "</s>") == "a"


def test_visuals_become_conversation_parts(tmp_path):
    from PIL import Image

    from mmrft.evaluation.harness import to_conversation

    image = Image.new("L", (8, 8))
    audio = {"array": [0.0, 0.5, -0.5] * 100, "sampling_rate": 16000}
    (turn,) = to_conversation([image, "clip.mp4", "x.png", audio, None], "<image>\nWhat?", tmp_path)
    kinds = [p["type"] for p in turn["content"]]
    assert kinds == ["image", "video", "image", "audio", "text"]
    assert turn["content"][0]["image"].mode == "RGB"
    assert Path(turn["content"][3]["audio"]).is_file()  # written for the audio families
    assert turn["content"][-1]["text"] == "What?"
    with pytest.raises(ValueError, match="of type int"):
        to_conversation([3], "q", tmp_path)


# --------------------------------------------------------------------------- configuration


def test_a_missing_extra_names_the_pip_line(monkeypatch):

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "lmms_eval" else find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match=r'eval\.harness: .*pip install -e "\.\[eval\]"'):
        load_config(REPO / "configs/demo.yaml", HARNESS)
    monkeypatch.setitem(sys.modules, "lmms_eval", None)  # `import lmms_eval` fails
    from mmrft.evaluation.harness import require_lmms_eval

    with pytest.raises(ConfigError, match=r'pip install -e "\.\[eval\]"'):
        require_lmms_eval()


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["eval.harness_tasks=[mmmu_val]"], "eval.harness_tasks"),  # harness unset
        (["eval.harness=lmms_eval"], "eval.harness_tasks"),  # no task
        ([*HARNESS, "eval.harness_limit=1.5"], "eval.harness_limit"),
        (["checkpoint.keep_best=accuracy"], "checkpoint.keep_best"),
        (["checkpoint.keep_best=harness/x/acc"], "checkpoint.keep_best"),  # harness unset
        (["eval.harness=lm_eval"], "eval.harness"),
    ],
)
def test_bad_harness_settings_fail_at_start_up(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(REPO / "configs/demo.yaml", overrides)


@pytest.mark.slow  # indexes lmms-eval's ~2000 built-in tasks (~12 s)
def test_an_unknown_task_is_refused_with_the_closest_names():
    from mmrft.evaluation.harness import Harness

    with pytest.raises(
        ConfigError,
        match=r"unknown lmms-eval task mmrft_shapes_color .*closest: mmrft_shapes_colour",
    ):
        Harness(["mmrft_shapes_color"], [], None, 4, 8, 0, "m")


# --------------------------------------------------------------------------- the adapter


@pytest.fixture(scope="module")
def demo_policy():
    from mmrft.policy.model import load_policy
    from mmrft.rollout.preflight import preflight

    cfg = load_config(REPO / "configs/demo.yaml", ["data.max_test_samples=12"])
    task, family = preflight(cfg, training=False)
    policy = load_policy(cfg.model, torch.device("cpu"), trainable=False, family=family)
    return cfg, task, policy


def test_the_adapter_sends_the_model_what_mmrft_eval_sends(demo_policy, tmp_path):
    """The lmms-eval task's document, through the adapter, is the same prompt (token ids and
    pixels) as the benchmark's line through mmrft's task; greedy answers and the log-likelihood
    of each target (which depends on the image) are equal too."""
    from mmrft.evaluation.evaluate import evaluate
    from mmrft.evaluation.harness import Harness, adapter, to_conversation
    from mmrft.rollout.hf import HFEngine
    from mmrft.rollout.setup import read_data

    cfg, task, policy = demo_policy
    (samples,) = read_data(cfg, task, policy.family, splits=("test",))
    harness = Harness([TASK], [], 12, 6, 12, 0, cfg.model.path)
    result = harness.run(policy, HFEngine(policy, 6))
    docs = result.samples[TASK]
    assert [d["doc_id"] for d in docs] == list(range(12))
    mine = evaluate(policy, task, samples, 6, 12)
    answers = [d["filtered_resps"] for d in docs]  # one response per document
    assert [a[0] if isinstance(a, list) else a for a in answers] == [
        r.completion for r in mine.records
    ]
    assert result.metrics[f"harness/{TASK}/acc"] == mine.metrics["accuracy"]
    assert result.metrics[f"harness/{TASK}/format_fail"] == mine.metrics["format_fail"]

    # the prompts, token for token and pixel for pixel

    spec = importlib.util.spec_from_file_location(
        "u", REPO / "configs/lmms_eval" / TASK / "utils.py"
    )
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    lines = [json.loads(x) for x in (REPO / "assets/benchmarks/shapes_colour/test.jsonl").open()]
    family, processor = policy.family, policy.processor
    lls = []
    for line, sample in zip(lines[:12], samples):
        theirs = family.prepare(
            processor,
            [to_conversation(utils.doc_to_visual(line), utils.doc_to_text(line), tmp_path)],
        )
        ours = family.prepare(processor, [task.prompt(sample, family)])
        assert torch.equal(theirs["input_ids"], ours["input_ids"])
        assert torch.equal(theirs["pixel_values"], ours["pixel_values"])
        lls.append(ours)

    # log-likelihoods: the adapter's against the policy's forward on mmrft's own prompt row
    from lmms_eval.api.instance import Instance

    from mmrft.policy.model import completion_logps

    model = adapter(policy, HFEngine(policy, 6), 6, 12)
    model.task_dict = {TASK: {"test": lines}}
    requests = [
        Instance(
            "loglikelihood",
            (
                utils.doc_to_text(line),
                f"<answer>{line['target']}</answer>",
                utils.doc_to_visual,
                i,
                TASK,
                "test",
            ),
            idx=0,
            metadata={"task": TASK, "doc_id": i, "repeats": 1},
        )
        for i, line in enumerate(lines[:12])
    ]
    # doc_to_visual is called with the document: the adapter reads task_dict[task][split][id]
    got = model.loglikelihood(requests)
    for (value, greedy), prepared, line in zip(got, lls, lines):
        rows = family.split_rows(prepared, processor)
        ids = policy.tokenizer.encode(
            f"<answer>{line['target']}</answer>", add_special_tokens=False
        )
        with torch.no_grad():
            logps, _, _ = completion_logps(policy, rows, [ids])
        assert value == pytest.approx(float(logps.sum()), abs=1e-5)
        assert greedy is False  # the untrained model answers "itit…", not the tag
    assert len({round(v, 4) for v, _ in got}) > 1  # the image moves the value


# --------------------------------------------------------------------------- in the loop


def test_a_run_logs_harness_metrics_at_every_evaluation_and_keeps_the_best(tmp_path):
    from mmrft.training.trainer import train

    extra = ("optim.lr=0.05", "train.completions_every=1")
    best = (f"checkpoint.keep_best=harness/{TASK}/format_fail", "checkpoint.keep_best_mode=min")
    result = train(tiny_run(tmp_path / "a", *extra, *best), verbose=False)
    run_dir = result.run_dir
    lines = metric_lines(run_dir)
    harness = [m for m in lines if f"harness/{TASK}/acc" in m]
    assert [m["step"] for m in harness] == [0, 1, 2]  # before, every step, after
    for m in harness:
        assert m["time/eval_s"] >= m["time/harness_s"] > 0
        assert "eval/classification/accuracy" in m  # the task's evaluation in the same line
    for name in ("before", "step-000001", "after"):
        (results,) = (run_dir / "eval" / name / "lmms_eval").glob("*/*_results.json")
        payload = json.loads(results.read_text())
        assert payload["results"][TASK]["acc,none"] == pytest.approx(
            harness[0][f"harness/{TASK}/acc"], abs=1
        )
        assert payload["n-samples"][TASK]["effective"] == 4
        (samples,) = results.parent.glob(f"*_samples_{TASK}.jsonl")
        assert len(samples.read_text().splitlines()) == 4
    best_json = json.loads((run_dir / "best" / "best.json").read_text())
    assert best_json["metric"] == f"harness/{TASK}/format_fail"
    assert best_json["step"] == 0  # none better
    assert list((run_dir / "best").glob("*.safetensors"))
    assert result["best"] == best_json
    assert f"harness/{TASK}/acc" in result.evals["after"]

    # lmms-eval seeds Python, NumPy and torch; the run's streams are restored after it: a run
    # without the harness samples the same rollouts
    plain = tiny_run(tmp_path / "b", *extra, "eval.harness=", "eval.harness_tasks=[]")
    without = train(plain, verbose=False).run_dir
    for name in ("metrics.jsonl", "completions.jsonl"):
        assert (run_dir / name).exists()
    rewards = [
        [
            (m["step"], m["train/reward"], m["rollout/len_mean"])
            for m in metric_lines(d)
            if "train/reward" in m
        ]
        for d in (run_dir, without)
    ]
    assert rewards[0] == rewards[1] and len(rewards[0]) == 2
    assert (run_dir / "completions.jsonl").read_text() == (
        without / "completions.jsonl"
    ).read_text()

    # resumed for a third step: the best so far comes back with the checkpoint (a run that
    # forgot it would take step 3's equal value as a first best)
    resumed = train(tiny_run(tmp_path / "a", *extra, *best, "train.steps=3"), verbose=False)
    assert json.loads((run_dir / "best" / "best.json").read_text()) == best_json
    assert resumed["best"] == best_json


def test_mmrft_eval_writes_lmms_evals_files(tmp_path, monkeypatch):
    """`mmrft eval` with the harness and no test split: lmms-eval's results and samples."""
    from mmrft.cli import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    args = ["eval", "demo", *HARNESS, "eval.harness_limit=3", "data.test=", "--out", str(out)]
    assert main(args) == 0
    (results,) = (out / "lmms_eval").glob("*/*_results.json")
    payload = json.loads(results.read_text())
    for key in (
        "results",
        "configs",
        "versions",
        "n-shot",
        "higher_is_better",
        "n-samples",
        "config",
    ):
        assert key in payload  # lmms-eval's own results format
    assert payload["config"]["model_args"].endswith("tiny-qwen2_5_vl")
    assert len(next(results.parent.glob("*_samples_*.jsonl")).read_text().splitlines()) == 3
    assert json.loads((out / "results.json").read_text())["metrics"][f"harness/{TASK}/acc"] == 0.0


# --------------------------------------------------------------------------- distributed


def _two_ranks(rank: int, world: int, out: str) -> None:
    from mmrft.training.trainer import train

    torch.set_num_threads(1)
    train(tiny_run(Path(out), "eval.every=0", "train.steps=1"), verbose=False)


@pytest.mark.slow  # make test-slow: 10-16 s of make test's ten minutes
def test_a_distributed_run_evaluates_each_sample_once(tmp_path, monkeypatch):
    from ranks import run_ranks

    run_ranks(_two_ranks, str(tmp_path))
    run_dir = tmp_path / "harness"
    harness = [m for m in metric_lines(run_dir) if f"harness/{TASK}/acc" in m]
    assert [m["step"] for m in harness] == [0, 1]  # one line per evaluation, not one per rank
    for name in ("before", "after"):
        (results,) = (run_dir / "eval" / name / "lmms_eval").glob("*/*_results.json")
        (samples,) = results.parent.glob("*_samples_*.jsonl")
        assert [json.loads(x)["doc_id"] for x in samples.read_text().splitlines()] == [0, 1, 2, 3]
