"""Stateful environments of multi-turn rollouts: one instance per trajectory, whose public
methods are the tools the model may call (TRL's ``environment_factory``; the episodes of
OpenEnv, NeMo Gym, VAGEN)::

    @environment("grid_world", timeout_s=5.0)
    class GridWorld(Environment):
        \"\"\"Walk to the goal on a grid shown as an image.\"\"\"

        def reset(self, sample: Sample) -> Observation:
            self.at, self.goal = ..., ...          # from the sample: a group shares its start
            return Observation(ok=True, text="The grid:", images=[self.render()])

        def move(self, direction: Literal["up", "down", "left", "right"]) -> Observation:
            \"\"\"Move one cell.

            Args:
                direction: where to move
            \"\"\"
            ...
            if self.at == self.goal:
                self.finish(reward=1.0, state={"moves": self.moves})
            return Observation(ok=True, text="...", images=[self.render()])

**The tools** are the methods a subclass defines whose names do not start with ``_`` (not
``reset`` and ``finish``), described to the model by JSON schemas built from their signatures
and Google-style docstrings (transformers' ``get_json_schema``: the first paragraph is the
description, ``Args:`` the arguments' descriptions, ``Literal`` an ``enum``). A method takes
its arguments as keywords and returns an :class:`~mmrft.rollout.tool.Observation`, a ``str``
(text) or a PIL image; it refuses a call with :class:`~mmrft.rollout.tool.ToolFailure`.

**An episode.** The loop (:class:`mmrft.rollout.tool_loop.ToolLoop` with
``rollout.tools.environment``) creates one instance per trajectory and calls ``reset(sample)``;
its observation (text and images) joins the sample's last user message, so it is part of the
prompt, which a group shares: ``reset`` must depend on the sample only (draw randomness from a
seed in ``sample.meta``; the ``G`` first observations of a group are compared and a difference
stops the run). Every call the model makes goes to its own trajectory's instance. The instance
may :meth:`Environment.finish` the episode with a reward in [0, 1] and a JSON state: the
trajectory then ends (``stop = "env_done"``) after that call, and the ``environment_reward``
verifier (or any trajectory-aware one, reading ``Trajectory.environment``) scores it.

**Budgets, failures and isolation are the tools'** (:mod:`mmrft.rollout.tool`): arguments are
checked against the schema before a call; nothing the model writes raises; every call runs in
the environment's worker process under the environment's ``timeout_s`` and the worker's memory
cap, and what it returns is checked and bounded there (text to the trajectory's token budget,
media to its media budget, images downscaled) before it is sent back. The instances live in
that worker, between the calls of their trajectory: a call that times out, runs out of
memory or kills the worker takes every live instance with it, so their trajectories end
(``stop = "env_lost"``) with the failure as their last observation's reason. The loop closes
the instances when their trajectories end. ``@environment(..., isolate=False)`` keeps the
instances in the trainer's process (an environment that needs its state: a simulator handle),
each call under a thread's budget as a non-isolated tool's.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from mmrft.plugins import ENVIRONMENTS, first_paragraph
from mmrft.rollout.tool import (
    MAX_INFO_CHARS,
    Observation,
    ToolCall,
    ToolContext,
    ToolFailure,
    ToolSpec,
    _checked,
    _short,
    call_checked,
    check_schema,
    validate_arguments,
)

log = logging.getLogger(__name__)

RESERVED = ("reset", "finish", "status", "close", "tool_schema")
"""Method names an environment's tools cannot take."""


class Environment:
    """The base of an environment (module docstring): subclass it, define ``reset`` and the
    tools, and register the class with :func:`environment`.

    Attributes:
        done: whether the episode has ended (:meth:`finish`).
        reward: the episode's reward in [0, 1] once finished, else ``None``.
        state: JSON facts the verifiers may read (``Trajectory.environment["state"]``).

    Class attributes:
        schema_methods: tool methods whose arguments' JSON schema comes from
            :meth:`tool_schema` (an environment served elsewhere: its action schema), not from
            their signature and docstring; they take the arguments as keywords.
    """

    schema_methods: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def tool_schema(cls, method: str) -> dict[str, Any]:
        """The JSON schema (``parameters``) of tool ``method`` of :attr:`schema_methods`; built
        on first use of the environment's tools, never at registration."""
        raise NotImplementedError(f"{cls.__name__} gives no schema for '{method}'")

    def close(self) -> None:
        """Release what the instance holds (a connection): called when its trajectory ends;
        what it raises is logged, not raised."""

    def __init__(self) -> None:
        self.done = False
        self.reward: float | None = None
        self.state: dict[str, Any] = {}

    def reset(self, sample: Any) -> Observation | str:
        """Start the episode of ``sample``; the first observation (joins the prompt)."""
        raise NotImplementedError

    def finish(self, reward: float | None = None, state: dict[str, Any] | None = None) -> None:
        """End the episode after the current call, with ``reward`` ∈ [0, 1] and ``state``."""
        if reward is not None and not (isinstance(reward, (int, float)) and 0.0 <= reward <= 1.0):
            raise ValueError(f"an environment's reward is a number in [0, 1], got {reward!r}")
        self.done = True
        self.reward = None if reward is None else float(reward)
        if state is not None:
            self.state = dict(state)

    def status(self) -> dict[str, Any]:
        """``{"done", "reward", "state"}``, the state checked to be JSON of at most
        :data:`~mmrft.rollout.tool.MAX_INFO_CHARS` characters (else it is replaced by an
        ``{"error": ...}``)."""
        state = self.state if isinstance(self.state, dict) else {}
        try:
            if len(json.dumps(state)) > MAX_INFO_CHARS:
                state = {"error": f"state over {MAX_INFO_CHARS} characters of JSON"}
        except (TypeError, ValueError, RecursionError):
            state = {"error": "state not JSON-serialisable"}
        reward = self.reward if isinstance(self.reward, float) else None
        return {"done": bool(self.done), "reward": reward, "state": state}


@dataclass(frozen=True)
class EnvironmentSpec:
    """A registered environment.

    Attributes:
        name: its registry name (``rollout.tools.environment``).
        fn: the class (``fn`` as for a tool: what a worker process re-creates).
        description: one line (``mmrft list environments``).
        methods: the names of its tool methods.
        timeout_s: time budget of ``reset`` and of each call (seconds; 0 = no limit).
        isolate: the instances live in a worker process (module docstring).
        demonstration: ``demonstration(sample, reference) -> turn texts`` of a scripted episode
            for ``warm_start.demonstrations`` (tool calls, then whatever ends it), where
            ``reference`` is the answer the warm start pairs with the sample (another
            sample's under ``labels: random``: the format, not the answer); ``None``: none.
    """

    name: str
    fn: type[Environment]
    description: str
    methods: tuple[str, ...] = ()
    timeout_s: float = 10.0
    isolate: bool = True
    demonstration: Callable[[Any, str], list[str]] | None = None

    @property
    def tools(self) -> dict[str, ToolSpec]:
        """Its methods as tools, by name (:class:`~mmrft.rollout.tool.ToolSpec` whose ``fn``
        is the unbound method), their schemas built on first use (:func:`method_schema`
        imports transformers, which registering a plugin must not: every worker process
        registers the built-ins); ``TypeError`` naming the method when one cannot be built."""
        return _tool_specs(self.fn, self.name, self.methods, self.timeout_s, self.isolate)


@functools.cache
def _tool_specs(
    cls: type, name: str, methods: tuple[str, ...], timeout_s: float, isolate: bool
) -> dict[str, ToolSpec]:
    tools = {}
    for attr in methods:
        member = vars(cls)[attr]
        where = f"environment '{name}' tool '{attr}'"
        if attr in cls.schema_methods:
            parameters = cls.tool_schema(attr)
            check_schema(parameters, f"{where} parameters")
        else:
            parameters = method_schema(member, where)
        tools[attr] = ToolSpec(
            name=attr,
            fn=member,
            description=first_paragraph(member.__doc__) or attr,
            parameters=parameters,
            timeout_s=timeout_s,
            isolate=isolate,
        )
    return tools


def method_schema(method: Callable[..., Any], where: str) -> dict[str, Any]:
    """The JSON schema of a tool method's arguments (``self`` left out) from its type hints
    and Google-style docstring (``transformers.utils.get_json_schema``), checked to use only
    what the argument validator implements (:func:`~mmrft.rollout.tool.check_schema`)."""
    from transformers.utils import get_json_schema

    def bare(*args: Any, **kwargs: Any) -> Any:  # the signature without self
        return method(None, *args, **kwargs)

    signature = inspect.signature(method)
    bare.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    bare.__doc__ = method.__doc__
    bare.__name__ = method.__name__
    bare.__annotations__ = {
        k: v for k, v in inspect.get_annotations(method, eval_str=True).items() if k != "self"
    }
    try:
        schema = get_json_schema(bare)["function"]
    except Exception as exc:
        raise TypeError(
            f"{where}: no JSON schema from its signature and docstring ({exc})"
        ) from exc
    parameters = schema.get("parameters") or {"type": "object", "properties": {}}
    parameters.pop("return", None)
    for prop in parameters.get("properties", {}).values():  # keywords the validator lacks
        prop.pop("nullable", None)
    check_schema(parameters, f"{where} parameters")
    return parameters


def environment(
    name: str,
    *,
    timeout_s: float = 10.0,
    isolate: bool = True,
    description: str | None = None,
    demonstration: Callable[[Any, str], list[str]] | None = None,
) -> Callable[[type[Environment]], type[Environment]]:
    """Register an :class:`Environment` subclass as environment ``name`` (module docstring).

    Args:
        name: the registry name (``rollout.tools.environment``).
        timeout_s: time budget of ``reset`` and of each tool call (seconds; 0 = no limit).
        isolate: keep the instances in a worker process killed at ``timeout_s`` (default);
            ``False``: in the trainer's process, each call under a thread's budget.
        description: one line; default the class docstring's first paragraph.
        demonstration: the turn texts of a scripted episode for a warm start
            (:attr:`EnvironmentSpec.demonstration`).
    """

    def register(cls: type[Environment]) -> type[Environment]:
        if not (inspect.isclass(cls) and issubclass(cls, Environment)):
            raise TypeError(
                f"@environment('{name}') decorates an Environment subclass, got {cls!r}"
            )
        if cls.reset is Environment.reset:
            raise TypeError(f"environment '{name}': define reset(self, sample)")
        methods = tuple(
            attr
            for attr, member in vars(cls).items()
            if not attr.startswith("_") and attr not in RESERVED and inspect.isfunction(member)
        )
        if not methods:
            raise TypeError(f"environment '{name}': no tool methods (public methods of the class)")
        for attr in methods:  # what a schema needs, checked without building it
            if attr in cls.schema_methods:
                continue
            member = vars(cls)[attr]
            documented = set(
                re.findall(r"^\s+(\w+)\s*(?:\(.*\))?:", _args_section(member.__doc__), re.M)
            )
            for param in list(inspect.signature(member).parameters)[1:]:
                if param not in documented:
                    raise TypeError(
                        f"environment '{name}' tool '{attr}': no JSON schema without a "
                        f"description of '{param}' (a Google-style 'Args:' section)"
                    )
        spec = EnvironmentSpec(
            name=name,
            fn=cls,
            description=description or first_paragraph(cls.__doc__) or name,
            methods=methods,
            timeout_s=float(timeout_s),
            isolate=bool(isolate),
            demonstration=demonstration,
        )
        ENVIRONMENTS.add(name, spec)
        cls.environment_spec = spec  # type: ignore[attr-defined]
        return cls

    return register


def _args_section(doc: str | None) -> str:
    """The ``Args:`` section of a Google-style docstring (empty when it has none)."""
    match = re.search(
        r"^\s*Args:\s*$(.*?)(?:^\s*(?:Returns|Raises|Yields|Examples?):|\Z)", doc or "", re.M | re.S
    )
    return match.group(1) if match else ""


# -- one call, in whichever process holds the instances ------------------------------------------

Limits = tuple[int | None, int | None]
"""``(max_text_chars, max_media)`` of an observation (:func:`mmrft.rollout.tool._checked`)."""


def _as_observation(value: Any) -> Any:
    """A method's return value as an :class:`Observation` (text or a PIL image allowed)."""
    from PIL import Image

    if isinstance(value, str):
        return Observation(ok=True, text=value)
    if isinstance(value, Image.Image):
        return Observation(ok=True, text="", images=[value])
    return value


def _run(what: str, fn: Callable[[], Any], context: ToolContext, limits: Limits) -> Observation:
    """``fn()`` (a method that may return text or an image) as a checked observation
    (:func:`~mmrft.rollout.tool.call_checked`)."""
    return call_checked(what, lambda: _as_observation(fn()), context, *limits)


class _Instances:
    """The live instances of one process (a worker's, or the trainer's for ``isolate=False``),
    by key."""

    def __init__(self) -> None:
        self.live: dict[str, Environment] = {}

    def serve(self, request: tuple) -> Any:
        """``("reset", key, name, sample, fields, limits)``, ``("call", key, name, method,
        arguments, fields, limits)`` → ``(observation, status)``; ``("close", keys)`` → None."""
        kind = request[0]
        if kind == "close":
            for key in request[1]:
                env = self.live.pop(key, None)
                if env is not None:
                    try:
                        env.close()
                    except Exception as exc:  # the trajectory is over: say so, go on
                        log.warning("closing an environment instance: %s", _short(exc, 160))
            return None
        if kind == "reset":
            _, key, name, sample, fields, limits = request
            context = ToolContext(**fields)
            env = ENVIRONMENTS.get(name).fn()
            obs = _run(f"Environment '{name}' reset", lambda: env.reset(sample), context, limits)
            self.live[key] = env
            return obs, env.status()
        _, key, name, method, arguments, fields, limits = request
        env = self.live.get(key)
        if env is None:
            return lost(name), LOST
        if env.done:
            text = f"The episode of environment '{name}' has ended; no call runs."
            return Observation.fail("episode_ended", text), env.status()
        context = ToolContext(**fields)
        fn = getattr(env, method)
        obs = _run(f"Tool '{method}'", lambda: fn(**arguments), context, limits)
        return obs, env.status()


LOST = {"done": True, "reward": None, "state": {}, "lost": True}
"""The status of an instance that is gone (its worker was replaced)."""


def lost(name: str) -> Observation:
    return Observation.fail(
        "environment_lost",
        f"Environment '{name}' lost this episode's state (its worker was stopped); the episode ends.",
    )


_WORKER = _Instances()
"""The instances a worker process holds."""


def serve_environment(request: tuple) -> Any:
    """The handler of an environment worker process (:class:`EnvironmentRunner`)."""
    return _WORKER.serve(request)


# -- the trainer's side ----------------------------------------------------------------------------


@dataclass
class Step:
    """What one environment call gave: the checked observation and the episode's status
    (``done``, ``reward``, ``state``; ``lost`` when the instance is gone)."""

    observation: Observation
    status: dict[str, Any]


class EnvironmentRunner:
    """The instances of one environment for a rollout loop: created per trajectory
    (:meth:`reset`), called (:meth:`call`), closed (:meth:`close`), in the environment's
    worker process (``isolate``) or in this one.

    Args:
        spec: the environment.
        memory_mb: the worker's memory cap (MiB beyond what it holds after loading; None = none).
    """

    def __init__(self, spec: EnvironmentSpec, memory_mb: int | None) -> None:
        from mmrft.rewards.pool import WorkerPool, source

        self.spec = spec
        self.tools = spec.tools
        self._keys = itertools.count()
        self._local = _Instances()
        self._lock = threading.Lock()
        self.pool = None
        if spec.isolate and source(spec.fn) is not None:
            self.pool = WorkerPool(
                {spec.name: spec},
                1,
                memory_mb,
                registry="environments",
                handler="mmrft.rollout.environment:serve_environment",
                start=False,
                what="environment",
                hint="declare the environment with @environment(..., isolate=False)",
            )
        elif spec.isolate:
            log.warning(
                "environment '%s' is defined in __main__ or inside a function, where a worker "
                "process cannot re-create it: its instances live in this process",
                spec.name,
            )
        self._pid: int | None = None  # the worker that holds the live instances

    def new_key(self) -> str:
        return f"e{next(self._keys)}"

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        if self.pool is not None:
            self.pool.close()

    def _send(self, request: tuple, what: str) -> Step:
        """One request where the instances live; a timeout, the memory cap or a dead worker
        loses every instance the worker held."""
        from mmrft.rewards.pool import NotSendable, PoolError, WorkerDied, WorkerRaised

        name = self.spec.name
        if self.pool is None:
            return self._in_thread(request, what)
        with self._lock:
            before = self.pool.pids[0] if self.pool.pids else None
            if request[0] == "call" and before != self._pid:  # replaced since the reset
                return Step(lost(name), dict(LOST))
            try:
                kind, value = self.pool.call_one(request, self.spec.timeout_s)
            except (NotSendable, WorkerDied, WorkerRaised, PoolError) as exc:
                self._pid = None
                text = f"{what} failed: {type(exc).__name__}: {_short(exc, 160)}"
                return Step(Observation.fail("tool_error", text), dict(LOST))
            if kind == "timeout":
                self._pid = None
                text = f"{what} ran past its {self.spec.timeout_s:g} s budget and was stopped."
                return Step(Observation.fail("timeout", text), dict(LOST))
            if kind == "memory":
                self._pid = None
                text = f"{what} ran out of memory (its worker's cap) and was stopped."
                return Step(Observation.fail("memory", text), dict(LOST))
            if request[0] == "reset":
                self._pid = self.pool.pids[0]
        if value is None:
            return Step(Observation(ok=True, text=""), {})
        observation, status = value
        return Step(_checked(observation, what, ToolContext(**request[-2]), *request[-1]), status)

    def _in_thread(self, request: tuple, what: str) -> Step:
        """``isolate=False``: the request in a daemon thread of this process, waited for at most
        ``timeout_s`` (an abandoned call keeps running; its instance is dropped)."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["value"] = self._local.serve(request)
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=work, name=f"mmrft-env:{self.spec.name}", daemon=True)
        thread.start()
        thread.join(self.spec.timeout_s or None)
        if thread.is_alive():
            if request[0] != "close":
                self._local.live.pop(request[1], None)
            text = f"{what} ran past its {self.spec.timeout_s:g} s budget and was stopped."
            return Step(Observation.fail("timeout", text), dict(LOST))
        if "error" in box:
            kind = "memory" if isinstance(box["error"], MemoryError) else "tool_error"
            text = f"{what} failed: {type(box['error']).__name__}: {_short(box['error'], 160)}"
            return Step(Observation.fail(kind, text), dict(LOST))
        if box["value"] is None:
            return Step(Observation(ok=True, text=""), {})
        return Step(*box["value"])

    def reset(self, key: str, sample: Any, context: ToolContext, limits: Limits) -> Step:
        """Create instance ``key`` and start its episode on ``sample``."""
        request = ("reset", key, self.spec.name, sample, _fields(context), limits)
        return self._send(request, f"Environment '{self.spec.name}' reset")

    def call(self, key: str, call: ToolCall, context: ToolContext, limits: Limits) -> Step:
        """The model's ``call`` on instance ``key``: an unknown method or arguments that break
        its schema fail here (the tools' reasons), the rest runs on the instance."""
        from mmrft.plugins import UnknownNameError, did_you_mean

        spec = self.tools.get(call.name)
        if spec is None:
            message = f"unknown tool '{call.name}'; {did_you_mean(call.name, self.tools)}"
            return Step(
                Observation.fail("unknown_tool", f"{_short(UnknownNameError(message), 200)}."), {}
            )
        try:
            arguments = validate_arguments(call.arguments, spec.parameters)
        except ToolFailure as exc:
            return Step(Observation.fail(exc.reason, f"{exc.message}."), {})
        request = ("call", key, self.spec.name, call.name, arguments, _fields(context), limits)
        return self._send(request, f"Tool '{call.name}'")

    def close_keys(self, keys: Iterable[str]) -> None:
        """Drop the instances ``keys`` (ended trajectories)."""
        keys = list(keys)
        if not keys:
            return
        if self.pool is None:
            self._local.serve(("close", keys))
        elif self._pid is not None and self.pool.pids and self.pool.pids[0] == self._pid:
            self._send(("close", keys), "closing instances")


def _fields(context: ToolContext) -> dict[str, Any]:
    """A context's budgets without its images (what checking an observation needs)."""
    fields = {f.name: getattr(context, f.name) for f in dataclasses.fields(context)}
    fields["images"] = []
    fields["input_sizes"] = []
    return fields


def environment_descriptions(spec: EnvironmentSpec) -> list[dict[str, Any]]:
    """The function descriptions of an environment's tools (a chat template's ``tools=``)."""
    return [tool.schema() for tool in spec.tools.values()]
