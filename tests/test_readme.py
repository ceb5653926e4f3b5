"""The README's code examples run as written."""

import re
from pathlib import Path

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
