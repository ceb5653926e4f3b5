"""The model-family adapter API.

A model family (Qwen2-VL, Qwen2.5-VL, ...) knows how to load a checkpoint and its processor,
how to turn chat messages with media into model inputs with the family's own Hugging Face
processor and chat template, and which coordinate frame its boxes are written in:

* ``"norm1000"``: integers 0–1000 relative to the image (Qwen2-VL);
* ``"input_pixels"``: absolute pixels of the *resized* model input, whose sides are multiples
  of ``patch_size × merge_size`` (Qwen2.5-VL, Qwen3-VL).

Tasks keep ground truth in original-image pixels and ask the family for the input size
(:meth:`ModelFamily.input_size`), which :meth:`ModelFamily.annotate` stores in a sample's meta
as ``input_size`` (``[w, h]``) beside ``box_frame``, so verifiers convert predictions
explicitly and never mix frames.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from mmrft.data import Sample
from mmrft.plugins import MODEL_FAMILIES

BoxFrame = Literal["norm1000", "input_pixels", "norm1", "pixels"]


@dataclass(frozen=True)
class MediaBudget:
    """Per-image pixel budget handed to the processor.

    Attributes:
        min_pixels: lower bound on resized H·W (pixels); images are upscaled to reach it.
        max_pixels: upper bound on resized H·W (pixels); the papers use 401408 = 512·28·28.
    """

    min_pixels: int = 3136
    max_pixels: int = 401408


class ModelFamily:
    """Base class of model-family adapters.

    Class attributes:
        name: registry name (set by ``@model_family``).
        model_types: the ``config.model_type`` values of checkpoints this family loads.
        box_frame: the frame the family's boxes are written in (see the module docstring).
        box_instruction: the prompt phrase that asks for one box in that frame.
    """

    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    box_frame: ClassVar[BoxFrame] = "input_pixels"
    box_instruction: ClassVar[str] = ""

    def __init__(self, media: MediaBudget | None = None) -> None:
        self.media = media or MediaBudget()

    def load_model(self, path: str, dtype: str = "float32", attn_implementation: str | None = None) -> Any:
        raise NotImplementedError

    def load_processor(self, path: str) -> Any:
        raise NotImplementedError

    def prepare(self, processor: Any, conversations: list[list[dict[str, Any]]], add_generation_prompt: bool = True) -> Any:
        """Tokenise a batch of conversations with their media: a ``BatchFeature`` with
        ``input_ids`` and ``attention_mask`` left-padded, plus the family's media tensors."""
        raise NotImplementedError

    def input_size(self, width: int, height: int) -> tuple[int, int]:
        """(w, h) in pixels of the image as the model sees it after resizing."""
        raise NotImplementedError

    def vision_parameters(self, model: Any) -> list[Any]:
        """Parameters of the vision tower (frozen by ``model.freeze_vision``)."""
        raise NotImplementedError

    def annotate(self, sample: Sample) -> None:
        """Store ``box_frame`` and, for the first image, ``input_size`` in ``sample.meta``."""
        sample.meta["box_frame"] = self.box_frame
        size = sample.meta.get("image_size")
        if size is not None:
            sample.meta["input_size"] = list(self.input_size(int(size[0]), int(size[1])))


def model_family(name: str) -> Callable[[type[ModelFamily]], type[ModelFamily]]:
    """Register a :class:`ModelFamily` subclass under ``name``."""

    def register(cls: type[ModelFamily]) -> type[ModelFamily]:
        cls.name = name
        MODEL_FAMILIES.add(name, cls)
        return cls

    return register


def family_for_model_type(model_type: str) -> type[ModelFamily]:
    """The registered family whose ``model_types`` contain ``model_type``."""
    for name in MODEL_FAMILIES.names():
        cls = MODEL_FAMILIES.get(name)
        if model_type in cls.model_types:
            return cls
    known = {t: n for n in MODEL_FAMILIES.names() for t in MODEL_FAMILIES.get(n).model_types}
    raise KeyError(
        f"no model family handles model_type '{model_type}'; known: "
        + ", ".join(f"{t} ({n})" for t, n in sorted(known.items()))
    )
