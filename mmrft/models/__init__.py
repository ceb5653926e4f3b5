"""The models layer: the model-family API and one adapter per family.

What it is: :mod:`.family` (``ModelFamily``, ``@model_family``, box frames, media budgets,
batching of multimodal prompts), the adapters (:mod:`.qwen_vl`: Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen3.5; :mod:`.qwen_audio`: Qwen2-Audio and the Omni thinkers; :mod:`.internvl`, :mod:`.gemma`,
:mod:`.glm`), the attention kernel a family's model may be loaded with (:mod:`.attention`: the
block-sparse kernel of packed rows), and the tiny-model builders (:mod:`.tiny`).

May import: the base, :mod:`mmrft.runtime` and :mod:`mmrft.data`; nothing above.

Exports: the family API (``from mmrft.models import ModelFamily, model_family``); an adapter to
subclass is imported from its module (``from mmrft.models.qwen_vl import Qwen3VL``).
"""

from mmrft.models.family import BoxFrame, MediaBudget, ModelFamily, model_family

__all__ = ["BoxFrame", "MediaBudget", "ModelFamily", "model_family"]
