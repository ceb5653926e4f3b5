"""Plain reward functions, written the way TRL users write them, used as verifiers by name.

A reward function is a plain function in a ``.py`` file or an importable module, with TRL's
signature ``fn(completions, **kwargs) -> list[float | None]``; the config names it
``FILE.py:FUNCTION`` (or ``package.module:FUNCTION``) where a verifier name goes::

    # my_rewards.py
    def brevity(completions, **kwargs):
        return [1.0 if len(c) < 200 else 0.0 for c in completions]

    # config.yaml
    reward:
      verifiers:
        - {name: my_rewards.py:brevity, weight: 0.5}

It is called once per batch with the keyword arguments

* ``completions``: the completions' texts (the last turn of a tool rollout);
* ``prompts``: the text of each completion's question (:meth:`mmrft.data.Sample.text`);
* ``target`` and the usual answer column names (``answer``, ``solution``,
  ``ground_truth``): each completion's ground truth (``Sample.target``), so TRL's
  ``def accuracy_reward(completions, solution, **kwargs)`` runs unchanged;
* every ``meta`` key of the samples (the dataset's other columns), ``None`` where a sample
  lacks it;
* the entry's ``params``.

It returns one number per completion, or ``None`` where it does not apply; an ``async def``
function is an async verifier (:mod:`mmrft.rewards`: awaited on the reward's event loop, in the
trainer's process, never in a verifier worker). It declares no
range: its scores are used as they are (the range shown is (−inf, inf)) and, unlike a
registered verifier, a low score carries no reason. A function that should carry reasons and a
range is a verifier: decorate it with ``@verifier`` (:mod:`mmrft.rewards`).
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrft.data import STANDARD_FIELDS, Sample
from mmrft.typecheck import ConfigError

FUNCTION_SPEC = re.compile(r"^(?P<source>.+\.py|[A-Za-z_][\w.]*):(?P<function>[A-Za-z_]\w*)$")
"""``path/to/file.py:function`` or ``package.module:function``."""

#: Names the completions' own keyword arguments take; a meta key of the same name is not passed.
RESERVED = ("completions", "prompts", "target", *STANDARD_FIELDS["answer"])


def is_function_spec(name: str) -> bool:
    """Whether a verifier name is a plain function's ``source:function``."""
    return bool(FUNCTION_SPEC.match(name))


@dataclass(frozen=True)
class RewardFunction:
    """A plain reward function called as a verifier: ``(completions, samples, **params)``.

    Holds only the spec string and imports the function when first called, so it pickles
    (to verifier worker processes) by value."""

    spec: str

    def function(self) -> Any:
        """The function ``spec`` names; ConfigError when the file, module or name is not
        there, or names something that is not callable."""
        from mmrft.plugins import PluginError, load_plugin

        match = FUNCTION_SPEC.match(self.spec)
        if match is None:
            raise ConfigError(f"'{self.spec}' is not FILE.py:FUNCTION or module:FUNCTION")
        try:
            module = load_plugin(match["source"])
        except PluginError as exc:
            raise ConfigError(f"reward function '{self.spec}': {exc}") from None
        fn = getattr(module, match["function"], None)
        if not callable(fn):
            names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
            from mmrft.plugins import did_you_mean

            raise ConfigError(
                f"reward function '{self.spec}': {match['source']} defines no function "
                f"'{match['function']}'; {did_you_mean(match['function'], names)}"
            )
        return fn

    @property
    def __signature__(self) -> inspect.Signature:
        """``(completions, samples, *, <the function's parameters with defaults>)``: what
        ``params`` may set (checked at start-up like a verifier's keyword parameters)."""
        P = inspect.Parameter
        own = [
            P(p.name, P.KEYWORD_ONLY, default=p.default, annotation=p.annotation)
            for p in inspect.signature(self.function()).parameters.values()
            if p.default is not P.empty
            and p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)
            and p.name not in RESERVED
        ]
        positional = [P(n, P.POSITIONAL_OR_KEYWORD) for n in ("completions", "samples")]
        return inspect.Signature([*positional, *own])

    def __call__(
        self, completions: Sequence[str], samples: Sequence[Sample], **params: Any
    ) -> list[float | None] | Awaitable[list[float | None]]:
        """The function's results as a list; for an ``async def`` function, an awaitable of
        them (so the verifier is async, :meth:`mmrft.rewards.VerifierSpec.bind`)."""
        function = self.function()
        if inspect.iscoroutinefunction(function):
            return self._awaited(function, completions, samples, params)
        if not completions:
            return []
        return list(function(list(completions), **self._arguments(samples, params)))

    async def _awaited(
        self,
        function: Any,
        completions: Sequence[str],
        samples: Sequence[Sample],
        params: dict[str, Any],
    ) -> list[float | None]:
        if not completions:
            return []
        return list(await function(list(completions), **self._arguments(samples, params)))

    @staticmethod
    def _arguments(samples: Sequence[Sample], params: dict[str, Any]) -> dict[str, Any]:
        """TRL's keyword arguments: prompts, the answer columns, the meta columns, ``params``."""
        targets = [s.target for s in samples]
        columns: dict[str, list[Any]] = {}
        for key in dict.fromkeys(k for s in samples for k in s.meta):
            if key not in RESERVED and key not in params:
                columns[key] = [s.meta.get(key) for s in samples]
        answers = dict.fromkeys(("target", *STANDARD_FIELDS["answer"]), targets)
        return {"prompts": [s.text() for s in samples], **answers, **columns, **params}


def function_labels(names: Sequence[str]) -> dict[str, str]:
    """The name each of a reward's verifiers goes by in metrics, logs and messages
    (``verifier/<label>``, ``train/reasons/<label>/...``, ``data.stats_verifier``).

    A registered verifier keeps its name. A plain function ``path/to/my_rewards.py:brief`` (or
    ``pkg.my_rewards:brief``) is ``brief``, the same on every machine; where another entry of
    ``names`` or a registered verifier goes by that name too, it is ``my_rewards:brief`` (the
    file's stem or the module's last part), and where that is shared as well, the spec as
    written. Every label is distinct.
    """
    from mmrft.plugins import VERIFIERS

    short = {n: FUNCTION_SPEC.match(n)["function"] if is_function_spec(n) else n for n in names}
    counts = Counter(short.values())
    labels = {}
    for name in names:
        label = short[name]
        if is_function_spec(name) and (counts[label] > 1 or label in VERIFIERS):
            match = FUNCTION_SPEC.match(name)
            source = match["source"]
            stem = Path(source).stem if source.endswith(".py") else source.rsplit(".", 1)[-1]
            label = f"{stem}:{match['function']}"
        labels[name] = label
    counts = Counter(labels.values())
    return {n: n if counts[label] > 1 else label for n, label in labels.items()}


def register_function(spec: str) -> Any:
    """Register the plain function ``spec`` as a verifier of that name (range (−inf, inf))
    after checking that it can be imported; returns its :class:`mmrft.rewards.VerifierSpec`."""
    from mmrft.plugins import VERIFIERS
    from mmrft.rewards.verifier import VerifierSpec

    if spec in VERIFIERS:  # registered by an earlier reward (the evaluation's, a resume)
        return VERIFIERS.get(spec)
    function = RewardFunction(spec)
    function.function()  # import now: a missing file or name fails at start-up
    registered = VerifierSpec(name=spec, fn=function, low=float("-inf"), high=float("inf"))
    VERIFIERS.add(spec, registered)
    return registered
