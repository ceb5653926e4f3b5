"""One registry for tasks, verifiers and model families, and the plugin loader.

Built-ins (``mmrft.tasks``, ``mmrft.verifiers``, ``mmrft.models``, ``mmrft.tools``) register
themselves through the same decorators a user's plugin uses. A user plugin is named in a config's
``plugins:`` list (or ``--plugin`` on the command line) as one of

* a file path ``path/to/my_rewards.py`` (imported by path),
* a dotted module ``mypkg.rewards`` (imported by name),
* nothing at all: installed packages exposing the entry-point group ``mmrft.plugins`` are
  imported automatically.

Importing the plugin runs its ``@verifier`` / ``@task`` / ``@model_family`` / ``@tool``
decorators.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import logging
import pkgutil
import re
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
C = TypeVar("C", bound=type)

ENTRY_POINT_GROUP = "mmrft.plugins"
FILE_PLUGIN_PREFIX = "mmrft_user_plugin_"
"""Module names of plugin files start with this (:func:`load_plugin`)."""


class UnknownNameError(KeyError):
    """A name that is not registered. The message lists the closest registered names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class PluginError(ImportError):
    """A plugin that cannot be found or imported."""


def closest(name: str, valid: Iterable[str], n: int = 3) -> list[str]:
    """Return up to ``n`` entries of ``valid`` closest to ``name`` (difflib ratio ≥ 0.5)."""
    return difflib.get_close_matches(name, list(valid), n=n, cutoff=0.5)


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """A short hint: "did you mean 'x'?" or the list of valid names when nothing is close."""
    valid = sorted(valid)
    near = closest(name, valid)
    if near:
        return "did you mean " + " or ".join(f"'{v}'" for v in near) + "?"
    return "valid: " + ", ".join(valid) if valid else "nothing is registered"


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring on one line (a summary that runs over several lines
    is kept whole), its reStructuredText markup removed for a terminal: ````x```` → ``x``,
    ``:class:`mmrft.x.Y``` → ``Y``."""
    lines = []
    for line in (doc or "").strip().splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    text = " ".join(lines)
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([^`]+)`", r"\1", text)  # :func:`mmrft.x.f` → f
    return text.replace("``", "")


class Registry(Generic[T]):
    """Name → object mapping for one kind of plugin (``task``, ``verifier``, ``model family``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, obj: T) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")
        old = self._items.get(name)
        if old is not None and old is not obj:
            # Re-registering the same name is allowed (a plugin imported twice, a notebook cell
            # re-run) but never silent.
            log.warning("%s '%s' registered again; the newer definition wins", self.kind, name)
        self._items[name] = obj

    def named(self, name: str) -> Callable[[C], C]:
        """A class decorator: the class gets ``name`` as its ``name`` attribute and is
        registered under it (``@model_family``, ``@sampler``, ``@task``)."""

        def register(cls: C) -> C:
            cls.name = name
            self.add(name, cls)
            return cls

        return register

    def get(self, name: str) -> T:
        load_builtins()
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'; {did_you_mean(name, self._items)}"
                + unregistered_hint(name, self.kind)
            ) from None

    def names(self) -> list[str]:
        load_builtins()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        load_builtins()
        return name in self._items


TASKS: Registry[Any] = Registry("task")
VERIFIERS: Registry[Any] = Registry("verifier")
MODEL_FAMILIES: Registry[Any] = Registry("model family")
TOOLS: Registry[Any] = Registry("tool")
"""Tools of multi-turn rollouts (:mod:`mmrft.rollout.tool`); an alias is registered as one more name
of the same :class:`~mmrft.rollout.tool.ToolSpec`."""
ENVIRONMENTS: Registry[Any] = Registry("environment")
"""Stateful environments of multi-turn rollouts (:mod:`mmrft.rollout.environment`): one instance
per trajectory, whose public methods are the tools."""
SAMPLERS: Registry[Any] = Registry("sampler")
"""Prompt samplers (``data.sampler``): :class:`~mmrft.rollout.sampling.Sampler` subclasses registered
with ``@sampler``; the built-ins live in :mod:`mmrft.rollout.sampling` and register when it is imported."""

_BUILTIN_PACKAGES = ("mmrft.verifiers", "mmrft.tasks", "mmrft.models", "mmrft.tools")
_builtins_loaded = False


def load_builtins() -> None:
    """Import every module of the built-in plugin packages and the installed entry points, once."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for package_name in _BUILTIN_PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{package_name}.{info.name}")
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as exc:
            raise PluginError(
                f"plugin entry point '{ep.name}' ({ep.value}) failed to import: {exc}"
            ) from exc


def load_plugin(spec: str) -> Any:
    """Import one user plugin, a ``.py`` file path or a dotted module name; returns the module
    (imported once: a second call returns the same module)."""
    load_builtins()
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise PluginError(f"plugin file not found: {spec}")
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        module_name = f"{FILE_PLUGIN_PREFIX}{path.stem}_{digest}"  # the same in every process
        if module_name in sys.modules:
            return sys.modules[module_name]
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise PluginError(f"plugin file {spec} failed to import: {exc}") from exc
        _USER_MODULES.append(module_name)
        return module
    try:
        module = importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        raise PluginError(f"plugin module '{spec}' not found ({exc})") from exc
    if spec not in _USER_MODULES:
        _USER_MODULES.append(spec)
    return module


_USER_MODULES: list[str] = []  # the user plugins imported, by module name


def unregistered_hint(name: str, kind: str) -> str:
    """A hint when a user plugin defines a function called ``name`` that never registered
    itself: it lacks its decorator (``@verifier("name")``, ``@task``, ``@tool``)."""
    for module_name in _USER_MODULES:
        module = sys.modules.get(module_name)
        if module is not None and callable(getattr(module, name, None)):
            where = getattr(module, "__file__", module_name)
            decorator = {"verifier": "@verifier", "task": "@task", "tool": "@tool"}.get(
                kind, "its registration decorator"
            )
            plain = f", or name the plain function as {where}:{name}" if kind == "verifier" else ""
            return (
                f" ({where} defines a function '{name}' that is not registered: decorate it "
                f'with {decorator}("{name}") from mmrft{plain})'
            )
    return ""


def load_plugins(specs: Iterable[str]) -> None:
    for spec in specs:
        load_plugin(spec)
