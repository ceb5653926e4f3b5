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
