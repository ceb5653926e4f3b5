"""mmrft: multimodal reinforcement fine-tuning with verifiable rewards.

The public plugin API lives here: a user's verifier, task or model family imports only these.
The package is read by layer (docs/architecture.md): the base modules at the top (config,
plugins, typecheck, errors, algorithms), then runtime, data, models, rewards and policy,
rollout, evaluation, training, and the command line on top.

The Python API (``load_config``, ``train``, ``evaluate_config``, imported on first use) runs
what the CLI runs; ``mmrft.train(cfg, verbose=False)`` and ``mmrft.evaluate_config(cfg,
verbose=False)`` print nothing, and ``train`` returns the run summary (a dict) whose
``run_dir``, ``checkpoint`` (newest checkpoint Path or None), ``metrics`` (the last
evaluation's), ``before`` and ``after`` are attributes too.
"""

from mmrft import _moved

_moved.install()  # old flat paths (mmrft.answers, mmrft.video, ...) keep importing

from mmrft.data import Sample  # noqa: E402
from mmrft.models.family import MediaBudget, ModelFamily, model_family  # noqa: E402
from mmrft.rewards.task import EvalRecord, Task, task  # noqa: E402

_moved.alias_loaded()  # e.g. mmrft.task: `import mmrft.task` must not replace the function task
from mmrft.rewards.verifier import Score, verifier  # noqa: E402

__all__ = [
    "EvalRecord",
    "MediaBudget",
    "ModelFamily",
    "Sample",
    "Score",
    "Task",
    "model_family",
    "task",
    "verifier",
]
__version__ = "0.1.0"

# The Python API (what the CLI runs), imported on first use so that a plugin's
# `from mmrft import verifier` stays light: load_config(config, overrides) → RunConfig,
# train(cfg) → TrainResult (the summary dict, summary["run_dir"], with the attributes run_dir,
# checkpoint, metrics, evals, before, after), evaluate_config(cfg) → EvalResult. Both take
# verbose=False: nothing on stdout/stderr (no banner, tables, progress bars); train.log is
# written in full and warnings go to `logging`. train and evaluate_config check a config built
# or changed in code as load_config checks a file, before anything is written
# (mmrft.config.validate_config: types, unknown attributes, nesting, ranges).
_API = {
    "load_config": "mmrft.config",
    "train": "mmrft.training.trainer",
    "evaluate_config": "mmrft.evaluation.evaluate",
}


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'mmrft' has no attribute {name!r}")
