"""The mistakes a run can make without a model fail before torch and transformers are imported,
and a failed start-up leaves no run folder (mmrft/rollout/preflight.py, training/setup.py)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import NO_EVAL, short_run

from mmrft.config import load_config
from mmrft.data import DataError
from mmrft.rollout.preflight import preflight
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]

# label | arguments of `mmrft` (shell words) | what its one error line says
MISTAKES_TABLE = """
key typo | train demo optim.lrr=1 | unknown config key 'optim.lrr'; did you mean
wrong type | train demo train.steps=abc | train.steps: expected an integer
missing data file | train demo data.train=/nowhere/train.jsonl | dataset file not found: /nowhere/train.jsonl (data.train)
hub id not cached | train demo model.path=org/not-cached-model | model.path: 'org/not-cached-model' is not a local folder, HF_HUB_OFFLINE is set
missing extra | train demo rollout.engine=vllm | needs vLLM: pip install
verifier parameter | train demo 'reward.verifiers=[{name: accuracy, params: {modee: x}}]' | verifier 'accuracy': unknown parameter 'modee'; did you mean 'mode'?
sampler parameter | train demo data.sampler=variance data.sampler_params.floorr=1 | data.sampler_params: unknown parameter 'floorr'; did you mean 'floor'?
task parameter | train demo task.params.thinkk=none | unknown parameter 'thinkk'
tool name | train demo rollout.tools.names=[zoom] | rollout.tools.names:
eval data file | eval demo data.test=/nowhere/test.jsonl | dataset file not found: /nowhere/test.jsonl (data.test)
"""
MISTAKES = {
    label.strip(): (shlex.split(args), said.strip())
    for label, args, said in (line.split(" | ") for line in MISTAKES_TABLE.strip().splitlines())
}
# last: the device check imports torch (only torch) to ask for CUDA
CUDA = (["train", "demo", "device=cuda"], "device: 'cuda' requested but no CUDA device")

SCRIPT = """
import contextlib, io, json, sys
from mmrft.cli import main
cases, out = json.loads(sys.argv[1]), {}
for label, args in cases:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    heavy = sorted(m for m in ("torch", "transformers", "matplotlib") if m in sys.modules)
    out[label] = {"code": code, "stderr": err.getvalue(), "heavy": heavy}
print(json.dumps(out))
"""


def run_mistakes(tmp_path: Path, cases: list[tuple[str, list[str]]]) -> dict:
    """Each case's exit status, stderr and the heavy modules imported by then, in one fresh
    process (the cases run one after another, so a heavy import by one shows in the next)."""
    cases = [(label, [*args, f"output_dir={tmp_path / 'runs'}"]) for label, args in cases]
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(cases)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_mistakes_fail_before_any_heavy_import_and_leave_no_run_folder(tmp_path):
    cases = [(label, args) for label, (args, _) in MISTAKES.items()] + [("cuda", CUDA[0])]
    outcomes = run_mistakes(tmp_path, cases)
    expected = {**{label: said for label, (_, said) in MISTAKES.items()}, "cuda": CUDA[1]}
    for label, outcome in outcomes.items():
        errors = [line for line in outcome["stderr"].splitlines() if line.startswith("error:")]
        assert outcome["code"] == 2 and len(errors) == 1, (label, outcome)
        assert expected[label] in errors[0], (label, errors[0])
        assert "Traceback" not in outcome["stderr"], label
        assert outcome["heavy"] == ([] if label != "cuda" else ["torch"]), (label, outcome)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_preflight_module_imports_nothing_heavy():
    code = (
        "import sys; import mmrft.rollout.preflight, mmrft.cli; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_preflight_checks_what_evaluation_does_not_need_only_for_training(tmp_path):
    missing_train = load_config("demo", ["data.train=/nowhere/train.jsonl"])
    with pytest.raises(DataError, match="data.train"):
        preflight(missing_train)
    assert preflight(missing_train, training=False).family.name == "qwen2_5_vl"
    typo = load_config("demo", ["eval.verifiers=[{name: accuracyy}]"])
    with pytest.raises(ConfigError, match=r"^eval\.verifiers\[0\]\.name: .*accuracy"):
        preflight(typo, training=False)


def test_a_start_up_that_fails_after_the_run_folder_exists_removes_it_unless_it_was_there(
    tmp_path,
):
    from mmrft.training.trainer import train

    data = tmp_path / "bad.jsonl"
    bench = REPO / "assets/benchmarks/shapes_colour"
    data.write_text((bench / "train.jsonl").read_text().splitlines()[0] + "\n{not json\n")
    cfg = load_config(
        "demo",
        [*short_run(tmp_path, "bad"), *NO_EVAL, f"data.train={data}", f"data.media_root={bench}"],
    )
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not valid JSON"):
        train(cfg)  # found while the data are read, after the run folder was made
    assert not (tmp_path / "bad").exists()
    (tmp_path / "bad").mkdir()  # a run folder from before (a resume): kept
    (tmp_path / "bad" / "notes.txt").write_text("mine")
    with pytest.raises(DataError):
        train(cfg)
    assert (tmp_path / "bad" / "notes.txt").read_text() == "mine"
