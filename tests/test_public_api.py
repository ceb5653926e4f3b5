"""What a user wrote keeps working, and the built-in plugins use only the public paths.

docs/architecture.md lists the public paths; the old flat paths (``mmrft.answers``, …) are
kept by ``mmrft._moved``. Pure import checks: no model is loaded.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mmrft
from mmrft import _moved

ROOT = Path(__file__).resolve().parents[1]

# Every `from mmrft... import name` that README.md, docs/ and the built-in plugins showed at
# 045f255, before the package moved into layer folders: a user's code copied from there.
OLD_IMPORTS: dict[str, list[str]] = {
    "mmrft": ["EvalRecord", "Score", "Task", "model_family", "task", "verifier"],
    "mmrft.answers": [
        "choice_index",
        "extract_answer",
        "is_number_literal",
        "match_choice",
        "math_too_large",
        "normalise_text",
        "parse_number",
    ],
    "mmrft.boxes": [
        "box_iou",
        "clip_box",
        "format_box",
        "from_pixels",
        "is_degenerate",
        "outside_image",
        "parse_boxes",
        "parse_one_box",
        "to_pixels",
    ],
    "mmrft.data": [
        "DataError",
        "ListItem",
        "OnError",
        "ReadStats",
        "Sample",
        "collect_samples",
        "default_id",
        "item_id",
        "iter_json_list",
        "local_media_path",
        "normalise_messages",
        "read_records",
    ],
    "mmrft.family": ["ModelFamily"],
    "mmrft.judges": [
        "DEFAULT_TEMPLATE",
        "HTTPJudge",
        "JudgeUnavailable",
        "LocalScorer",
        "Reply",
        "Request",
        "build_backend",
        "cache_key",
        "check_template",
        "current_cache",
        "quote",
        "render",
        "verdict_rule",
    ],
    "mmrft.metrics": [
        "average_precision",
        "coco_map",
        "coco_match",
        "interpolated_precision",
        "iou_matrix",
        "temporal_recall",
    ],
    "mmrft.models.qwen_vl": ["Qwen3VL"],
    "mmrft.plugins": ["VERIFIERS"],
    "mmrft.rewards": ["Score", "verifier"],
    "mmrft.sampling": ["Sampler", "SamplerView", "sampler"],
    "mmrft.sandbox": ["SandboxJob", "SandboxPool", "SandboxResult"],
    "mmrft.task": [
        "EvalRecord",
        "ExampleData",
        "Task",
        "ThinkMode",
        "choice_chance",
        "task",
        "uniform_target_chance",
    ],
    "mmrft.tasks.video_qa": ["user_turn"],
    "mmrft.tool": ["Observation", "ToolContext", "ToolFailure", "VideoClip", "fit_pixels", "tool"],
    "mmrft.typecheck": ["ConfigError"],
    "mmrft.verifiers.accuracy": ["accuracy"],
    "mmrft.verifiers.detection": ["MAX_CHARS_PER_BOX", "detection", "parse_detections"],
    "mmrft.verifiers.render": ["extract_code"],
    "mmrft.verifiers.temporal": ["parse_interval", "temporal_iou"],
    "mmrft.video": ["TEMPORAL_PATCH", "VideoInfo", "frame_indices", "probe_video", "resize_dims"],
}

# What the built-in plugins (tasks/, verifiers/, tools/) may import: the public paths of
# docs/architecture.md. Plugins may also import each other (mmrft.tasks.*, mmrft.verifiers.*).
PUBLIC = {
    "mmrft",
    "mmrft.config",
    "mmrft.typecheck",
    "mmrft.plugins",
    "mmrft.data",
    "mmrft.data.video",
    "mmrft.data.audio",
    "mmrft.models",
    "mmrft.models.family",
    "mmrft.models.qwen_vl",
    "mmrft.rewards",
    "mmrft.rewards.answers",
    "mmrft.rewards.boxes",
    "mmrft.rewards.metrics",
    "mmrft.rewards.sandbox",
    "mmrft.rewards.judges",
    "mmrft.rewards.task",
    "mmrft.rollout",
    "mmrft.rollout.tool",
    "mmrft.rollout.sampling",
}
PLUGIN_DIRS = {"tasks": "mmrft.tasks", "verifiers": "mmrft.verifiers", "tools": "mmrft.tools"}


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of an mmrft module in ``path``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
    return [i for i in out if i[1] == "mmrft" or i[1].startswith("mmrft.")]


@pytest.mark.parametrize("module", sorted(OLD_IMPORTS))
def test_old_documented_imports_still_work(module):
    imported = importlib.import_module(module)
    missing = [name for name in OLD_IMPORTS[module] if not hasattr(imported, name)]
    assert not missing, f"from {module} import {', '.join(missing)} no longer works"


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_moved_paths_are_the_new_modules(old):
    """An old path is the new module itself, so patching either patches both."""
    assert importlib.import_module(old) is importlib.import_module(_moved.MOVED[old])


def test_python_api_and_all():
    for name in mmrft.__all__:
        assert getattr(mmrft, name) is not None
    # the layer packages are imported: a package named `train` would now shadow mmrft.train
    importlib.import_module("mmrft.evaluation.evaluate")
    importlib.import_module("mmrft.training.trainer")

    assert callable(mmrft.load_config)
    assert callable(mmrft.train) and mmrft.train.__module__ == "mmrft.training.trainer"
    assert callable(mmrft.evaluate_config)


def _documented_imports() -> list[tuple[str, str, list[str]]]:
    """(file, module, names) of every `from mmrft... import ...` in README.md and docs/."""
    pattern = re.compile(r"^\s*from (mmrft[\w.]*) import ([^\n(]+|\([^)]*\))", re.M)
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in pattern.finditer(path.read_text()):
            names = re.sub(r"#[^\n]*", "", match.group(2)).strip("() \n").replace("\n", " ")
            names = [n.strip().split(" as ")[0] for n in names.split(",") if n.strip()]
            found.append((path.name, match.group(1), names))
    return found


def test_every_import_the_docs_show_works():
    documented = _documented_imports()
    assert len(documented) >= 5
    for where, module, names in documented:
        imported = importlib.import_module(module)
        for name in names:
            assert hasattr(imported, name), f"{where}: from {module} import {name}"


def test_docs_show_only_public_paths():
    """New docs teach the new public paths, not the kept old ones."""
    for where, module, _ in _documented_imports():
        assert module in PUBLIC or module.startswith(tuple(PLUGIN_DIRS.values())), (
            f"{where} shows `from {module} import ...`; public paths: docs/architecture.md"
        )


def test_plugins_import_only_public_paths():
    bad = []
    for folder, package in PLUGIN_DIRS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            for line, module, _ in _imports(path):
                plugin = module.startswith(tuple(f"{p}." for p in PLUGIN_DIRS.values()))
                if module not in PUBLIC and not plugin and module != package:
                    bad.append(f"{folder}/{path.name}:{line} imports {module}")
    assert not bad, "plugins must use the public paths (docs/architecture.md):\n" + "\n".join(bad)


def test_engine_never_imports_the_plugins():
    """The built-ins register through the plugin API like a user's plugin; the engine loads them
    by name (mmrft.plugins.load_builtins), never by import statement."""
    bad = []
    for path in sorted((ROOT / "mmrft").rglob("*.py")):
        for line, module, _ in _imports(path):
            if module.startswith(tuple(PLUGIN_DIRS.values())):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_import_linter_contract_holds():
    """The layers of docs/architecture.md (pyproject.toml's [tool.importlinter])."""
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
