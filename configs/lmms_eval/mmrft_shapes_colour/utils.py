"""The bundled benchmark's lines as lmms-eval documents: the image, mmrft's classification
prompt, and mmrft's strict scoring (one ``<answer>`` tag, its content equal to the target)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lmms_eval.api.task import ConfigurableTask
from PIL import Image

REPO = Path(__file__).resolve().parents[3]
INSTRUCTION = "Give only the final answer inside <answer> </answer> tags."
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class BundledJsonTask(ConfigurableTask):
    """A JSON-lines task whose ``data_files`` are relative to the repository root, so that it
    runs from any working directory."""

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # lmms-eval hands a Python task its whole YAML, whose `class` key TaskConfig refuses
        super().__init__(config={k: v for k, v in (config or {}).items() if k != "class"}, **kwargs)

    def download(self, dataset_kwargs: dict[str, Any] | None = None) -> None:
        kwargs = dict(dataset_kwargs or {})
        kwargs["data_files"] = {k: str(REPO / v) for k, v in kwargs["data_files"].items()}
        super().download(kwargs)


def _data_dir(doc: dict[str, Any]) -> Path:
    return REPO / "assets" / "benchmarks" / doc["id"].rsplit("-", 2)[0]


def doc_to_visual(doc: dict[str, Any]) -> list[Image.Image]:
    """The line's images, in order, as RGB PIL images (paths are relative to its file)."""
    parts = [p for m in doc["messages"] for p in m["content"] if p.get("type") == "image"]
    return [Image.open(_data_dir(doc) / p["image"]).convert("RGB") for p in parts]


def doc_to_text(doc: dict[str, Any]) -> str:
    """The question, its options and the answer format, as mmrft's classification task words
    them."""
    parts = [p for m in doc["messages"] for p in m["content"] if p.get("type") == "text"]
    question = "\n".join(p["text"] for p in parts)
    options = ", ".join(doc["meta"]["choices"])
    return f"{question}\nOptions: {options}\n{INSTRUCTION}"


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """``acc``: exactly one ``<answer>`` tag whose stripped content equals the target
    (case-insensitive); ``format_fail``: not exactly one tag."""
    tags = ANSWER.findall(results[0])
    if len(tags) != 1:
        return {"acc": 0.0, "format_fail": 1.0}
    return {"acc": float(tags[0].strip().lower() == doc["target"].lower()), "format_fail": 0.0}
