"""Import paths of modules that moved into the layer folders, kept working.

mmrft's modules were flat (``mmrft.answers``, ``mmrft.video``, ``mmrft.trainer``, …) until they
moved into one folder per layer. A plugin or notebook written against an old path still imports:
``import mmrft.answers`` gives the module ``mmrft.rewards.answers`` itself (the same object, so a
name set on one is set on the other). New code uses the new paths (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

MOVED: dict[str, str] = {
    "mmrft.ahead": "mmrft.rollout.ahead",
    "mmrft.answers": "mmrft.rewards.answers",
    "mmrft.attention": "mmrft.models.attention",
    "mmrft.audio": "mmrft.data.audio",
    "mmrft.boxes": "mmrft.rewards.boxes",
    "mmrft.checkpoint": "mmrft.runtime.checkpoint",
    "mmrft.collector": "mmrft.rollout.collector",
    "mmrft.distributed": "mmrft.runtime.distributed",
    "mmrft.evaluate": "mmrft.evaluation.evaluate",
    "mmrft.family": "mmrft.models.family",
    "mmrft.group": "mmrft.policy.group",
    "mmrft.judges": "mmrft.rewards.judges",
    "mmrft.metrics": "mmrft.rewards.metrics",
    "mmrft.models.tiny_gemma": "mmrft.models.tiny.gemma",
    "mmrft.models.tiny_glm": "mmrft.models.tiny.glm",
    "mmrft.models.tiny_internvl": "mmrft.models.tiny.internvl",
    "mmrft.models.tiny_qwen3": "mmrft.models.tiny.qwen3",
    "mmrft.perturb": "mmrft.rollout.perturb",
    "mmrft.prompt_view": "mmrft.evaluation.prompt_view",
    "mmrft.report": "mmrft.evaluation.report",
    "mmrft.reward_functions": "mmrft.rewards.functions",
    "mmrft.runlog": "mmrft.evaluation.runlog",
    "mmrft.sampling": "mmrft.rollout.sampling",
    "mmrft.sandbox": "mmrft.rewards.sandbox",
    "mmrft.task": "mmrft.rewards.task",
    "mmrft.tool": "mmrft.rollout.tool",
    "mmrft.tracking": "mmrft.evaluation.tracking",
    "mmrft.trainer": "mmrft.training.trainer",
    "mmrft.trajectory": "mmrft.rollout.tool_loop",
    "mmrft.verifier_pool": "mmrft.rewards.pool",
    "mmrft.video": "mmrft.data.video",
    "mmrft.zero": "mmrft.runtime.zero",
}
"""Old module path → the module it is now. (``mmrft.data``, ``mmrft.rewards``, ``mmrft.policy``
and ``mmrft.models.tiny`` kept their paths: they are packages now and export the old names.)"""


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an import of an old path with the module at its new path."""

    def find_spec(self, name: str, path: object = None, target: object = None):
        if name in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at the new path is already imported."""


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())


def alias_loaded() -> None:
    """Register now the old paths whose new module is already imported. Importing an old path
    through the finder later would set it as an attribute of its parent package: ``import
    mmrft.task`` would replace the function ``mmrft.task`` (``@task``) by the module, as
    importing the flat module first did before ``mmrft/__init__`` bound the function."""
    for old, new in MOVED.items():
        if new in sys.modules:
            sys.modules.setdefault(old, sys.modules[new])
