"""Environments served by an OpenEnv server, as mmrft environments (:mod:`mmrft.rollout.environment`).

OpenEnv (``openenv-core``) serves an environment behind a WebSocket session per episode::

    client → {"type": "reset", "data": {reset arguments}}
    server → {"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}
    client → {"type": "step", "data": {action fields}}          (as often as the model calls)
    server → {"type": "observation", "data": {...}}   or   {"type": "error", "data": {...}}
    client → {"type": "close"}

at ``<url>/ws``, and its action's JSON schema at ``GET <url>/schema`` (``{"action": …,
"observation": …, "state": …}``; its HTTP ``/reset`` and ``/step`` make a fresh environment per
request, so a multi-step episode needs the session). :func:`openenv_environment` registers an
environment whose one tool (``step`` by default) *is* the server's action: its arguments are
the action's fields, with the server's schema (fetched when the tools are first described,
``title`` / ``examples`` left out), and each trajectory holds its own session in the
environment's worker process, under its time budget and memory cap like any environment::

    # my_openenv.py, given to a run with --plugin my_openenv.py
    from mmrft.rollout.openenv import openenv_environment

    openenv_environment("echo", "http://localhost:8000", reward_range=(0.0, 1.0))

    # mmrft train my.yaml rollout.tools.environment=echo \\
    #     'reward.verifiers=[{name: environment_reward}]' --plugin my_openenv.py

**Observations.** A reply's ``observation`` object becomes the model's text as compact JSON
(or ``render(observation) -> str``); the fields named in ``image_fields`` hold images (base64,
a data URL or not) and are shown as images instead. **The episode** ends when the server says
``done``: the reward is the last step's (``episode_reward="last"``) or the steps' sum
(``"sum"``), mapped from ``reward_range`` to [0, 1] (a value outside it is clamped and the
state says so); ``None`` when the server gives none. The state records the steps and their
rewards for trajectory-aware verifiers.

**What the server sends is untrusted input**: a message is at most ``max_message_bytes`` (the
client closes the session past it), must be a JSON object of a known type, an observation an
object, a reward a finite number or null; anything else, an ``error`` reply and a refused
action come back to the model as a failed observation (the server's message bounded), and a
session that breaks ends the episode without a reward (``state["error"]``), never the run.
The reset arguments must depend on the sample only (a group shares its first observation):
by default ``sample.meta["openenv_reset"]`` (e.g. ``{"seed": 7}``).

Needs the ``websockets`` package: ``pip install 'mmrft[openenv]'``.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from mmrft.rollout.environment import Environment, EnvironmentSpec, environment
from mmrft.rollout.tool import Observation, ToolFailure, _short

MAX_MESSAGE_BYTES = 16 * 2**20
"""Largest message (bytes) read from an OpenEnv server; the session closes past it."""

SCHEMA_NOISE = ("title", "examples")
"""JSON-schema keywords of a pydantic action schema that only document (left out)."""


def http_url(url: str) -> str:
    """The server's base HTTP(S) URL (a ``ws://`` / ``wss://`` one mapped back)."""
    return re.sub(r"^ws", "http", url.rstrip("/"))


def ws_url(url: str) -> str:
    """The server's session endpoint: ``ws(s)://host:port/ws``."""
    return re.sub(r"^http", "ws", url.rstrip("/")) + "/ws"


def clean_schema(schema: Any) -> Any:
    """``schema`` without the documentation-only keywords of :data:`SCHEMA_NOISE` (at every
    level; a property *named* ``title`` stays)."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key in SCHEMA_NOISE:
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: clean_schema(v) for name, v in value.items()}
            else:
                out[key] = clean_schema(value)
        return out
    if isinstance(schema, list):
        return [clean_schema(v) for v in schema]
    return schema


def fetch_action_schema(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The action schema of the server at ``url`` (``GET <url>/schema``, ``"action"``),
    cleaned (:func:`clean_schema`); a ``RuntimeError`` naming the URL when it cannot be read."""
    import urllib.request

    where = http_url(url) + "/schema"
    try:
        with urllib.request.urlopen(where, timeout=timeout_s) as reply:
            body = reply.read(MAX_MESSAGE_BYTES + 1)
        if len(body) > MAX_MESSAGE_BYTES:
            raise ValueError(f"over {MAX_MESSAGE_BYTES} bytes")
        action = json.loads(body)["action"]
        if not isinstance(action, dict):
            raise ValueError("'action' is not an object")
    except Exception as exc:
        raise RuntimeError(
            f"OpenEnv server {where}: no action schema ({_short(exc, 200)})"
        ) from None
    return clean_schema(action)


def decode_image(value: Any) -> Any:
    """A base64 image (raw or a ``data:`` URL) as an RGB PIL image; ``ValueError`` otherwise."""
    from PIL import Image

    if not isinstance(value, str):
        raise ValueError(f"an image field holds a {type(value).__name__}, not base64 text")
    data = value.split(",", 1)[1] if value.startswith("data:") else value
    try:
        raw = base64.b64decode(data, validate=True)
        with Image.open(io.BytesIO(raw)) as image:
            return image.convert("RGB")
    except (binascii.Error, OSError, ValueError) as exc:
        raise ValueError(f"an image field that is not a base64 image ({_short(exc, 80)})") from None


class OpenEnvSession:
    """One episode's WebSocket session with an OpenEnv server (module docstring)."""

    def __init__(self, url: str, timeout_s: float, max_message_bytes: int) -> None:
        from mmrft.typecheck import require_extra

        require_extra("websockets", "openenv", "an OpenEnv environment")
        from websockets.sync.client import connect

        self.timeout_s = timeout_s
        self.socket = connect(
            ws_url(url), open_timeout=timeout_s, max_size=max_message_bytes, compression=None
        )

    def send(self, kind: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a ``reset`` or ``step`` message, return the reply's ``data`` of an
        ``observation`` reply (checked); :class:`ToolFailure` ``env_error`` for an ``error``
        reply, ``ValueError`` for a malformed one."""
        self.socket.send(json.dumps({"type": kind, "data": data or {}}))
        raw = self.socket.recv(timeout=self.timeout_s)
        try:
            reply = json.loads(raw)
        except (TypeError, ValueError):
            raise ValueError("the server sent a message that is not JSON") from None
        if not isinstance(reply, dict):
            raise ValueError("the server sent a message that is not a JSON object")
        data = reply.get("data")
        if reply.get("type") == "error":
            detail = data.get("message", data) if isinstance(data, dict) else data
            raise ToolFailure(
                "env_error", f"The environment refused it: {_short(str(detail), 300)}"
            )
        if reply.get("type") != "observation" or not isinstance(data, dict):
            raise ValueError(f"the server sent a '{_short(str(reply.get('type')), 40)}' message")
        observation, reward, done = data.get("observation"), data.get("reward"), data.get("done")
        if not isinstance(observation, dict):
            raise ValueError("the server's observation is not a JSON object")
        if reward is not None and not (
            isinstance(reward, (int, float))
            and not isinstance(reward, bool)
            and math.isfinite(reward)
        ):
            raise ValueError(
                f"the server's reward is not a finite number: {_short(repr(reward), 40)}"
            )
        if not isinstance(done, bool):
            raise ValueError("the server's 'done' is not true or false")
        return {"observation": observation, "reward": reward, "done": done}

    def close(self) -> None:
        try:
            self.socket.send(json.dumps({"type": "close"}))
        finally:
            self.socket.close()


class OpenEnvRemote(Environment):
    """The base of the environments :func:`openenv_environment` registers: one
    :class:`OpenEnvSession` per instance (per trajectory)."""

    url: ClassVar[str] = ""
    session_timeout_s: ClassVar[float] = 30.0
    max_message_bytes: ClassVar[int] = MAX_MESSAGE_BYTES
    action_schema: ClassVar[dict[str, Any] | None] = None
    image_fields: ClassVar[tuple[str, ...]] = ()
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    episode_reward: ClassVar[str] = "last"
    reset_arguments: ClassVar[Callable[[Any], dict[str, Any]] | None] = None
    render: ClassVar[Callable[[dict[str, Any]], str] | None] = None

    @classmethod
    def tool_schema(cls, method: str) -> dict[str, Any]:
        """The action schema given to :func:`openenv_environment`, else the server's."""
        if cls.action_schema is not None:
            return clean_schema(cls.action_schema)
        return fetch_action_schema(cls.url, cls.session_timeout_s)

    def reset(self, sample: Any) -> Observation:
        self.session: OpenEnvSession | None = None
        self.rewards: list[float | None] = []
        if type(self).reset_arguments is not None:
            arguments = type(self).reset_arguments(sample)
        else:
            arguments = dict(sample.meta.get("openenv_reset") or {})
        self.session = OpenEnvSession(self.url, self.session_timeout_s, self.max_message_bytes)
        reply = self.session.send("reset", arguments)
        if reply["done"]:
            raise ToolFailure("env_error", "The environment's episode ended at its reset.")
        return self._observation(reply)

    def _act(self, action: dict[str, Any]) -> Observation:
        if self.session is None:
            raise ToolFailure("env_error", "The environment has no session.")
        try:
            reply = self.session.send("step", action)
        except ToolFailure:
            raise  # a refused action: the episode goes on
        except Exception as exc:  # the session is broken: the episode ends without a reward
            self.finish(
                None, {**self._record(), "error": _short(str(exc) or type(exc).__name__, 300)}
            )
            return Observation.fail(
                "env_error", f"The environment's session failed: {_short(exc, 200)}"
            )
        self.rewards.append(reply["reward"])
        observation = self._observation(reply)
        if reply["done"]:
            reward, unscaled = self._episode_reward()
            state = self._record()
            if unscaled is not None:
                state["reward_out_of_range"] = unscaled
            self.finish(reward, state)
        return observation

    def _observation(self, reply: dict[str, Any]) -> Observation:
        fields = dict(reply["observation"])
        images = []
        for name in self.image_fields:
            if name in fields:
                images.append(decode_image(fields.pop(name)))
        render = type(self).render
        text = render(fields) if render is not None else json.dumps(fields, sort_keys=True)
        if not isinstance(text, str):
            raise ValueError(f"render() gave a {type(text).__name__}, not text")
        return Observation(ok=True, text=text, images=images, info={"reward": reply["reward"]})

    def _episode_reward(self) -> tuple[float | None, float | None]:
        """``(reward in [0, 1] or None, the server's total when it was outside reward_range)``."""
        given = [r for r in self.rewards if r is not None]
        if not given:
            return None, None
        total = given[-1] if self.episode_reward == "last" else sum(given)
        low, high = self.reward_range
        scaled = (total - low) / (high - low)
        outside = None if 0.0 <= scaled <= 1.0 else float(total)
        return min(1.0, max(0.0, scaled)), outside

    def _record(self) -> dict[str, Any]:
        return {"steps": len(self.rewards), "rewards": self.rewards[-64:]}

    def close(self) -> None:
        session, self.session = getattr(self, "session", None), None
        if session is not None:
            session.close()


def openenv_environment(
    name: str,
    url: str,
    *,
    tool: str = "step",
    description: str = "",
    action_schema: dict[str, Any] | None = None,
    image_fields: tuple[str, ...] = (),
    reward_range: tuple[float, float] = (0.0, 1.0),
    episode_reward: Literal["last", "sum"] = "last",
    reset_arguments: Callable[[Any], dict[str, Any]] | None = None,
    render: Callable[[dict[str, Any]], str] | None = None,
    timeout_s: float = 30.0,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
) -> EnvironmentSpec:
    """Register environment ``name`` served by the OpenEnv server at ``url`` (``http(s)://``
    or ``ws(s)://`` host and port; module docstring) and return its spec.

    Args:
        tool: the name of the one tool the model calls (the server's action).
        description: the tool's description (what the action does), told to the model.
        action_schema: the action's JSON schema; default the server's (``GET /schema``).
        image_fields: observation fields holding base64 images, shown as images.
        reward_range: ``(low, high)`` of the server's rewards, mapped to [0, 1].
        episode_reward: the episode's reward: the ``last`` step's or the ``sum``.
        reset_arguments: ``sample -> reset data``; default ``sample.meta["openenv_reset"]``.
        render: ``observation fields -> text``; default compact JSON.
        timeout_s: the time budget of a reset and of each step (seconds), the message wait.
        max_message_bytes: the largest message read from the server.
    """
    low, high = (float(v) for v in reward_range)
    if not (math.isfinite(low) and math.isfinite(high) and high > low):
        raise ValueError(
            f"openenv_environment('{name}'): reward_range must be (low, high), low < high"
        )
    if episode_reward not in ("last", "sum"):
        raise ValueError(f"openenv_environment('{name}'): episode_reward is 'last' or 'sum'")
    if not re.fullmatch(r"[A-Za-z_]\w*", tool) or tool.startswith("_"):
        raise ValueError(f"openenv_environment('{name}'): tool must be a public identifier")

    def act(self: OpenEnvRemote, **action: Any) -> Observation:
        return self._act(action)

    act.__name__ = act.__qualname__ = tool
    act.__doc__ = description or f"Act in the {name} environment (its action's fields)."
    class_name = "OpenEnv_" + re.sub(r"\W", "_", name)
    cls = type(
        class_name,
        (OpenEnvRemote,),
        {
            "__doc__": f"The OpenEnv environment served at {url}.",
            # the caller's module (as namedtuple does): the one a worker process imports to
            # re-create the class, which registers it there too
            "__module__": sys._getframe(1).f_globals.get("__name__", __name__),
            tool: act,
            "schema_methods": (tool,),
            "url": url,
            "session_timeout_s": float(timeout_s),
            "max_message_bytes": int(max_message_bytes),
            "action_schema": action_schema,
            "image_fields": tuple(image_fields),
            "reward_range": (low, high),
            "episode_reward": episode_reward,
            "reset_arguments": staticmethod(reset_arguments) if reset_arguments else None,
            "render": staticmethod(render) if render else None,
        },
    )
    environment(name, timeout_s=timeout_s)(cls)
    return cls.environment_spec  # type: ignore[attr-defined]
