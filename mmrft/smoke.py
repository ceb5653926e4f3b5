"""``mmrft train CONFIG --smoke``: any config, on CPU, in a minute, before renting GPUs.

The config runs as written (task and its parameters, verifiers, algorithm with its reference
model and T-GRPO, LoRA, gradient checkpointing, data format and error policy) with only what a
CPU check must change, as ``key=value`` overrides placed *before* the command line's (so the
user's own overrides still win):

* the model: the tiny model of the config's model family (``assets/models/tiny-<family>``;
  the family from the checkpoint's ``config.json``, ``model.family``, or the hub id's name:
  ``Qwen/Qwen2.5-VL-7B-Instruct`` → ``qwen2_5_vl``), ``device=cpu``, ``float32``;
* small media budgets: images of 56×56 pixels, videos of 2–4 frames of 56×56, no prompt cap;
* two RL steps of 2 prompts × 2 completions of at most 8 tokens (a warm start of at most 2
  steps), no trackers, no periodic checkpoint or evaluation, a fresh run named
  ``<run>-smoke``, and an evaluation of 2 test samples after RL;
* the data: the config's own when its files are on this machine (every line and media file
  read and checked, as in a real run), else the task's bundled example data
  (:attr:`mmrft.rewards.task.Task.example_data`) in the config's format when one is bundled, else in
  the project's format;
* judges (``judge``, ``caption_qa``) served over HTTP: a local judge on the bundled tiny
  Qwen2.5-VL, scored by label probabilities (so a random model still gives a verdict), the
  rest of the verifier's parameters as written;
* what the tiny model cannot do in a few tokens is scripted (:func:`smoke_script`,
  :class:`mmrft.rollout.collector.Script`): with tools, the first completion of each group
  writes one valid call of an enabled tool (its observation and the next turn are the
  model's); with a judge, the next one writes an answer in the task's format, so the judge is
  asked; with a verifier that runs code in the sandbox, the task's reference code. A scripted
  turn runs to its end however long (:attr:`mmrft.rollout.hf.HFEngine.script`); the model's
  turns stay at 8 tokens.

At the end the run says which stages ran (:func:`stages_line`), from what it recorded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from mmrft.config import REPO_ROOT, RunConfig
from mmrft.plugins import MODEL_FAMILIES, TASKS, load_plugins
from mmrft.typecheck import ConfigError

if TYPE_CHECKING:
    from mmrft.rollout.collector import Script

MODELS = REPO_ROOT / "assets" / "models"
BENCHMARKS = REPO_ROOT / "assets" / "benchmarks"

#: Media budgets that keep every prompt small: one 56×56 image, at most 4 frames of 56×56 video.
SMALL_MEDIA = [
    "model.min_pixels=3136",
    "model.max_pixels=3136",
    "model.video.min_frames=2",
    "model.video.max_frames=4",
    "model.video.min_pixels=3136",
    "model.video.max_pixels=3136",
]

SIZES = [
    "device=cpu",
    "model.dtype=float32",
    *SMALL_MEDIA,
    "model.video.total_pixels=null",
    "model.video.max_prompt_tokens=null",
    "train.steps=2",
    "train.prompts_per_step=2",
    "train.micro_batch_size=4",
    "train.trackers=[]",
    "rollout.group_size=2",
    "rollout.batch_size=8",
    "rollout.max_new_tokens=8",
    "eval.before=false",
    "eval.after=true",
    "eval.every=0",
    "eval.batch_size=2",
    "eval.max_new_tokens=8",
    "data.max_train_samples=8",
    "data.max_test_samples=2",
    "checkpoint.every=0",
    "checkpoint.keep_last=1",
    "checkpoint.resume=never",
]
"""The overrides of every smoke run."""

SMOKE_HARNESS_TASK = "mmrft_shapes_colour"
"""The lmms-eval task a smoke run evaluates with ``eval.harness`` (configs/lmms_eval: local)."""


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def model_family(cfg: RunConfig) -> str:
    """The registered family of ``cfg.model`` without loading it: ``model.family`` when set,
    else the ``model_type`` of a local checkpoint's ``config.json``, else the family (or model
    type) whose name the checkpoint's name contains, the longest such (``Qwen2.5-VL-7B`` is
    ``qwen2_5_vl``, not ``qwen2_vl``)."""
    import json

    names = MODEL_FAMILIES.names()
    if cfg.model.family != "auto":
        return cfg.model.family
    config = Path(cfg.model.path).expanduser() / "config.json"
    if config.is_file():
        model_type = json.loads(config.read_text()).get("model_type", "")
        for name in names:
            if model_type in MODEL_FAMILIES.get(name).model_types:
                return name
    candidates = {name: name for name in names}
    for name in names:
        candidates.update({t: name for t in MODEL_FAMILIES.get(name).model_types})
    checkpoint = _squash(Path(cfg.model.path).name)
    hits = [key for key in candidates if _squash(key) in checkpoint]
    if not hits:
        raise ConfigError(
            f"--smoke: cannot tell the model family of model.path '{cfg.model.path}'; "
            f"set model.family (one of {', '.join(names)})"
        )
    return candidates[max(hits, key=lambda key: len(_squash(key)))]


def _present(path: str) -> bool:
    return bool(path) and Path(path).expanduser().exists()


def smoke_overrides(cfg: RunConfig, source: str | None = None) -> tuple[list[str], list[str]]:
    """The overrides that turn ``cfg`` into its smoke run, and one note per substitution for
    the console (model, data). The run is named after ``source``, the config as the user
    named it (``qwen3_vl_rec`` → ``qwen3_vl_rec-smoke``), else after ``cfg.name``."""
    load_plugins(cfg.plugins)
    family = model_family(cfg)
    tiny = MODELS / f"tiny-{family}"
    if not tiny.is_dir():
        built = sorted(p.name.removeprefix("tiny-") for p in MODELS.glob("tiny-*"))
        raise ConfigError(
            f"--smoke: no tiny model of family '{family}' in {MODELS} (there are: "
            f"{', '.join(built)}); `mmrft make-tiny` builds them"
        )
    overrides = [f"model.path={tiny}", f"model.family={family}", *SIZES]
    from mmrft.training.resume import run_name

    stem = Path(str(source)).name.removesuffix(".yaml").removesuffix(".yml") if source else ""
    overrides.append(f"name={stem or run_name(cfg)}-smoke")
    notes = [f"model {cfg.model.path} → {tiny} (family {family}), CPU, float32"]
    if cfg.model.attn_implementation == "flash_attention_2":
        overrides.append("model.attn_implementation=sdpa")
    if (
        cfg.teacher.enabled
    ):  # the tiny model teaches itself: the distillation path runs, no download
        overrides += [
            f"teacher.path={tiny}",
            "teacher.dtype=null",
            "teacher.attn_implementation=null",
            "teacher.server.url=null",  # a served teacher: in process here (no server to reach)
        ]
        served = f" (served at {cfg.teacher.server.url})" if cfg.teacher.server.url else ""
        notes.append(f"teacher {cfg.teacher.path or 'of the server'}{served} → {tiny}")
    if cfg.eval.harness:  # lmms-eval on its bundled local task: the machinery, no Hub download
        overrides += [f"eval.harness_tasks=[{SMOKE_HARNESS_TASK}]", "eval.harness_limit=2"]
        notes.append(
            f"lmms-eval tasks {', '.join(cfg.eval.harness_tasks)} → {SMOKE_HARNESS_TASK} "
            "(bundled, local), 2 samples"
        )
        if cfg.checkpoint.keep_best.startswith("harness/"):
            overrides.append(f"checkpoint.keep_best=harness/{SMOKE_HARNESS_TASK}/acc")
    ws = cfg.warm_start
    overrides += [
        f"warm_start.steps={min(ws.steps, 2)}",
        f"warm_start.batch_size={min(ws.batch_size, 2)}",
    ]
    if cfg.algorithm.overlong_buffer:  # the buffer must fit in the 8 new tokens
        overrides.append("algorithm.overlong_buffer=2")
    wants = _scripted_stages(cfg)
    if wants:  # the scripted turn runs to its end, past the 8 tokens; the model's turns stop there
        notes.append(f"scripted: per group, {' and '.join(wants)} (marked scripted)")
    overrides += _data_overrides(cfg, notes)
    overrides += _judge_overrides(cfg, notes)
    return overrides, notes


SANDBOXED = ("chart_code", "svg")
"""Verifiers that run the completion in the sandbox (:mod:`mmrft.rewards.sandbox`)."""


def _verifiers_of(cfg: RunConfig, names: tuple[str, ...]) -> list[str]:
    """The reward verifiers of ``cfg`` among ``names``."""
    return [v["name"] for v in cfg.reward.verifiers if v.get("name") in names]


def _scripted_stages(cfg: RunConfig) -> list[str]:
    """What a smoke run of ``cfg`` scripts, in words (empty: nothing)."""
    wants = []
    if cfg.rollout.tools.active:
        wants.append("one tool call")
    if _verifiers_of(cfg, JUDGES):
        wants.append("one answer for the judge")
    elif _verifiers_of(cfg, SANDBOXED):
        wants.append("one answer (the reference code) for the sandbox")
    return wants


def smoke_script(cfg: RunConfig) -> Script:
    """What the smoke run of ``cfg`` (the smoke config) scripts
    (:class:`mmrft.rollout.collector.Script`): a tool call where ``rollout.tools`` enables
    tools or an environment, an answer (the task's reference answer) where a reward verifier is a judge
    (:data:`JUDGES`) or runs the answer in the sandbox (:data:`SANDBOXED`)."""
    from mmrft.rollout.collector import Script

    answer = bool(_verifiers_of(cfg, JUDGES) or _verifiers_of(cfg, SANDBOXED))
    return Script(tool_call=cfg.rollout.tools.active, answer=answer)


def stages_line(cfg: RunConfig, run_dir: str | Path) -> str:
    """One line saying which stages the smoke run in ``run_dir`` ran and which not, from what
    it recorded: ``metrics.jsonl`` (completions ``rollout/generated``, ``smoke/scripted*``,
    tool calls and turns ``rollout/tools/*``, verifiers ``train/reward/<name>``, sandbox runs
    the ``exec`` part of a code verifier), the judges' verdict cache ``judge_cache*.jsonl``
    (one line per verdict asked) and the evaluation's ``predictions.jsonl``."""
    run = Path(run_dir)
    steps = [
        m
        for m in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines())
        if "train/reward" in m
    ]

    def total(key: str, per: str | None = None) -> int:
        """Σ over steps of ``key`` (× ``per`` when given: a per-completion mean to a count)."""
        return round(sum(m.get(key, 0.0) * (m.get(per, 0.0) if per else 1.0) for m in steps))

    n = total("rollout/generated")
    ran = [f"rollout ({cfg.rollout.engine}) {n} completions ({total('smoke/scripted')} scripted)"]
    missing: list[str] = []

    def stage(count: int, done: str, not_done: str) -> None:
        """``done`` among the stages that ran when ``count`` > 0, else ``not_done`` among those
        that did not."""
        if count:
            ran.append(done)
        else:
            missing.append(not_done)

    if cfg.rollout.tools.active:
        calls = total("rollout/tools/calls_per_trajectory", "rollout/generated")
        later = round(
            sum(
                (m.get("rollout/tools/turns_mean", 1.0) - 1.0) * m["rollout/generated"]
                for m in steps
            )
        )
        ok = round(
            sum(
                m.get("rollout/tools/call_success", 0.0)
                * m.get("rollout/tools/calls_per_trajectory", 0.0)
                * m["rollout/generated"]
                for m in steps
            )
        )
        scripted_calls = total("smoke/scripted_calls")
        stage(
            calls,
            f"tool calls {calls} ({scripted_calls} scripted, {ok} ran without error)",
            "tool calls (no completion called a tool)",
        )
        stage(later, f"later turns {later}", "a second turn (no call returned an observation)")
    else:
        missing.append("tools (the recipe enables none)")
    judges = _verifiers_of(cfg, JUDGES)
    verdicts = sum(len(f.read_text().splitlines()) for f in sorted(run.glob("judge_cache*.jsonl")))
    stage(
        verdicts,
        f"judge calls {verdicts} ({total('smoke/scripted_answers')} scripted answers)",
        f"judge ({', '.join(judges)}: no answer was graded)"
        if judges
        else "judge (no verifier uses one)",
    )
    code = sorted(
        {k for m in steps for k in m if k.startswith("train/reward/") and k.endswith("/exec")}
    )
    runs = sum(total(k, "rollout/generated") for k in code)
    stage(
        runs,
        f"sandbox runs {runs}",
        "sandbox (no completion had code to run)" if code else "sandbox (no verifier uses it)",
    )
    scored = {k.split("/")[2] for m in steps for k in m if k.startswith("train/reward/")}
    labels = [str(v.get("name", "")).rsplit(":", 1)[-1] for v in cfg.reward.verifiers]
    ran.append(f"verifiers {', '.join(v for v in labels if v in scored) or 'none'}")
    missing += [f"verifier {v} (scored nothing)" for v in labels if v not in scored]
    predictions = run / "eval" / "after" / "predictions.jsonl"
    if predictions.is_file():
        ran.append(f"evaluation {len(predictions.read_text().splitlines())} samples")
    line = "smoke: stages run: " + "; ".join(ran)
    return line + ("; not run: " + "; ".join(missing) if missing else "")


JUDGES = ("judge", "caption_qa")
HTTP_ONLY = ("base_url", "model", "api_key_env", "concurrency", "timeout_s", "budget_s")
HTTP_ONLY += ("retries", "rpm", "tpm")


def _judge_overrides(cfg: RunConfig, notes: list[str]) -> list[str]:
    """``reward.verifiers`` / ``eval.verifiers`` with every served judge made a local tiny one."""
    import yaml

    judge_model = MODELS / "tiny-qwen2_5_vl"
    out = []
    for key, entries in (
        ("reward.verifiers", cfg.reward.verifiers),
        ("eval.verifiers", cfg.eval.verifiers),
    ):
        changed = False
        local = []
        for entry in entries:
            params = dict(entry.get("params") or {})
            if entry.get("name") in JUDGES and params.get("backend", "http") != "local":
                params = {k: v for k, v in params.items() if k not in HTTP_ONLY}
                params.update(backend="local", path=str(judge_model), max_tokens=8)
                if entry["name"] == "judge":
                    params["verdict"] = {"kind": "prob", "labels": {"yes": 1.0, "no": 0.0}}
                changed = True
            local.append({**entry, "params": params})
        if changed:
            out.append(
                f"{key}={yaml.safe_dump(local, default_flow_style=True, width=10**6).strip()}"
            )
            notes.append(f"{key}: served judges → a local tiny judge ({judge_model.name})")
    return out


def smoke_data(cfg: RunConfig) -> list[str]:
    """The data overrides of the smoke run when ``cfg``'s data files are not on this machine
    (the bundled stand-in; none when they are): applied after the command line's, since a
    path given there that does not exist here cannot run."""
    return _data_overrides(cfg, [])


def _data_overrides(cfg: RunConfig, notes: list[str]) -> list[str]:
    data = cfg.data
    if _present(data.train) and _present(data.test):
        notes.append(f"data: {data.train}, {data.test} (the first 8 and 2 samples)")
        return []
    if _present(data.train):
        notes.append(f"data.test '{data.test}' not found: evaluating on data.train")
        return [f"data.test={data.train}"]
    task_cls = TASKS.get(cfg.task.name)
    examples = task_cls.example_data
    fmt = data.format if data.format in examples else "mmrft"
    if fmt not in examples:
        raise ConfigError(
            f"--smoke: data.train '{data.train}' is not on this machine and task "
            f"'{cfg.task.name}' bundles no example data; give data.train and data.test"
        )
    train, test, params = examples[fmt]
    overrides = [
        f"data.train={BENCHMARKS / train}",
        f"data.test={BENCHMARKS / test}",
        f"data.format={fmt}",
        "data.fields={}",
        "data.media_root=",
        *(f"task.params.{key}={BENCHMARKS / value}" for key, value in params.items()),
    ]
    what = (
        f"{data.format} data"
        if fmt == data.format
        else f"data in mmrft's format ({data.format} has none bundled)"
    )
    notes.append(
        f"data.train '{data.train}' is not on this machine: the task's bundled {what}, "
        f"{BENCHMARKS / train}"
    )
    return overrides
