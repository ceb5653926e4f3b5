"""The rollout layer: how one step's completions are produced and scored.

What it is: the engines behind one protocol (:mod:`.base`: ``Engine``, ``Sampling``,
``Rollouts``; :mod:`.hf`, :mod:`.vllm`, :mod:`.served`; :mod:`.engine` builds the one a config
names), the tool API, stateful environments (OpenEnv servers' too: :mod:`.openenv`) and the
multi-turn tool loop (:mod:`.tool`, :mod:`.environment`, :mod:`.tool_loop`), which
prompts a step sees (:mod:`.sampling`), rollout perturbation (:mod:`.perturb`, NoisyRollout),
the collector that runs a step's rollouts end to end (:mod:`.collector`: prompts → engine →
verifiers → group transforms → ``StepBatch``) and its asynchronous form (:mod:`.ahead`), and the
set-up a run needs before its first rollout, shared by training and evaluation (:mod:`.setup`).

May import: the base, :mod:`mmrft.runtime`, :mod:`mmrft.data`, :mod:`mmrft.models`,
:mod:`mmrft.rewards`, :mod:`mmrft.policy`; nothing above (evaluation and training use it).

Exports: the plugin API of tools, environments and samplers (``from mmrft.rollout import tool,
environment, Environment, Sampler``; ``AudioClip``, ``VideoClip`` for tools' media;
``openenv_environment`` for an OpenEnv server); the
engines and the collector are imported from their modules. Importing this package loads no
engine: tool plugins stay light.
"""

from mmrft.rollout.environment import Environment, environment
from mmrft.rollout.openenv import openenv_environment
from mmrft.rollout.sampling import Sampler, SamplerView, sampler
from mmrft.rollout.tool import (
    AudioClip,
    Observation,
    ToolContext,
    ToolFailure,
    ToolSpec,
    VideoClip,
    fit_pixels,
    tool,
)

__all__ = [
    "AudioClip",
    "Environment",
    "Observation",
    "Sampler",
    "SamplerView",
    "ToolContext",
    "ToolFailure",
    "ToolSpec",
    "VideoClip",
    "environment",
    "fit_pixels",
    "openenv_environment",
    "sampler",
    "tool",
]
