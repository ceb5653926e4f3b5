"""Prompts and your reward functions, nothing else: the way TRL users start.

A dataset with a prompt column (``prompt``, ``question``, ``problem`` or ``query``, media
optional, any other columns kept in ``meta``) is trained against the reward functions or
verifiers listed in ``reward.verifiers``; there is no answer format, no default verifier and
no answer parsing. The prompt is the sample's text as it is (``task.params.template`` may
wrap it, e.g. ``"{question} Answer in one word."``). A target (``answer``, ``solution``,
...) is optional and reaches the reward functions as ``target`` / ``solution`` / ...
(:mod:`mmrft.rewards.functions`)::

    mmrft train data.train=prompts.jsonl data.test=held_out.jsonl task.name=prompt \\
        'reward.verifiers=[{name: my_rewards.py:brevity}, {name: my_rewards.py:correct}]'

Evaluation decodes greedily and reports the weighted reward of the same verifiers
(``reward``, the primary metric) and each verifier's mean (``verifier/<name>``); with
``eval.verifiers`` set, those score it instead.
"""

from __future__ import annotations

from typing import Any, ClassVar

from mmrft.data import Sample
from mmrft.rewards.task import EvalRecord, ExampleData, Task, task
from mmrft.typecheck import ConfigError


@task("prompt")
class PromptTask(Task):
    """Prompts scored by your reward functions only (reward.verifiers); metric: the reward.

    Template field: ``{question}`` (the sample's text, as it is). No default verifiers, no
    answer format; a warm start trains on the samples' targets as they are, where they have
    them.
    """

    template = "{question}"
    primary_metric = "reward"
    scored_by_reward = True
    # for --smoke without the config's data: chart questions with their answers as targets
    example_data: ClassVar[ExampleData] = {"mmrft": ("charts/train.jsonl", "charts/test.jsonl", {})}

    def __init__(self, *, template: str | None = None) -> None:
        """
        Args:
            template: wraps each prompt (field ``{question}``); default: the prompt as it is.
        """
        super().__init__(think="none", template=template)

    def default_verifiers(self) -> list[dict[str, Any]]:
        raise ConfigError(
            "reward.verifiers: task 'prompt' is scored by your reward functions only; list "
            "them, e.g. reward.verifiers=[{name: my_rewards.py:my_reward}] (a plain function "
            "fn(completions, **kwargs) -> list of floats, or a registered verifier)"
        )

    def reference_answer(self, sample: Sample) -> str:
        """The sample's target as it is (a warm start's answer, or what an environment's
        scripted episode acts on); a sample without one cannot be warm-started on."""
        if sample.target is None or sample.target == "":
            raise ConfigError(
                f"warm_start.steps: task 'prompt' warm-starts on the samples' targets, and "
                f"sample '{sample.id}' has none; set warm_start.steps=0"
            )
        return str(sample.target)

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        """No answer parsing: the evaluation fills ``reward`` from the verifiers."""
        return EvalRecord(sample.id, completion, completion, 0.0)
