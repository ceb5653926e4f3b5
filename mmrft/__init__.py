"""mmrft: multimodal reinforcement fine-tuning with verifiable rewards.

The public plugin API lives here: a user's verifier, task or model family imports only these.
"""

from mmrft.data import Sample
from mmrft.family import MediaBudget, ModelFamily, model_family
from mmrft.rewards import Score, verifier
from mmrft.task import EvalRecord, Task, task

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
# train(cfg) → summary dict, evaluate_config(cfg) → EvalResult.
_API = {
    "load_config": "mmrft.config",
    "train": "mmrft.trainer",
    "evaluate_config": "mmrft.evaluate",
}


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'mmrft' has no attribute {name!r}")
