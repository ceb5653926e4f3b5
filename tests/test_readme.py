"""The README's code examples run as written."""

import re
from pathlib import Path

import pytest

from mmrft import Sample
from mmrft.rewards import build_reward
from mmrft.task import build_task

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    reward = build_reward([{"name": "short_answer", "params": {"max_words": 2}}])
    samples = [Sample("a", []), Sample("b", []), Sample("c", [])]
    out = reward(["<answer>red</answer>", "<answer>a red thing here</answer>", "red"], samples)
    assert out.total == [1.0, 0.0, 0.0]
    task = build_task("caption_word", {"think": "none"})
    record = task.evaluate_one("<answer>Red</answer>", Sample("x", [], target="red"))
    assert record.score == 1.0


def test_cited_docs_are_in_the_repository():
    """Comments cite docs/reference.md (and its pitfalls), never a file outside the repository."""
    repo = Path(__file__).resolve().parents[1]
    cited = set()
    for folder in ("mmrft", "tasks", "verifiers", "configs", "tests", "scripts", "benchmarks"):
        for path in (repo / folder).rglob("*"):
            if path.suffix not in (".py", ".yaml", ".md") or path.name == "test_readme.py":
                continue
            text = path.read_text(encoding="utf-8")
            assert "REFERENCE.md" not in text, path
            cited |= set(re.findall(r"docs/[\w.-]+\.md", text))
    assert "docs/reference.md" in cited
    for doc in cited:
        assert (repo / doc).is_file(), doc
    pitfalls = re.findall(r"^(\d+)\. ", (repo / "docs/reference.md").read_text(), flags=re.M)
    assert pitfalls == [str(n) for n in range(1, len(pitfalls) + 1)] and len(pitfalls) == 13


def test_task_hooks_the_readme_names_exist():
    from mmrft.task import Task

    section = README.split("## Adding a task", 1)[1].split("\n## ", 1)[0]
    hooks = set(re.findall(r"`(\w+)\(", section)) | {"formats"}
    assert {"parse_record", "read_format", "formats"} <= hooks
    for hook in hooks:
        assert hasattr(Task, hook), hook


def test_install_section_names_extras_that_exist():
    """Every extra the README's install lines name is in pyproject.toml, and `all` covers every
    modality extra."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    section = README.split("## Install", 1)[1].split("\n## ", 1)[0]
    lines = re.findall(r'^pip install -e "\.\[([\w,]+)\]"', section, flags=re.M)
    assert len(lines) >= 4
    for named in lines:
        for extra in named.split(","):
            assert extra in extras, extra
    assert extras["all"] == ["mmrft[video,audio,data,render,track]"]
    assert {"video", "audio", "data", "render", "track"} <= set(extras)
