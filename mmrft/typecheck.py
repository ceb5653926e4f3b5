"""Checking user-given values against type hints, and keyword parameters against signatures.

Used by the run config (``mmrft.config``) and by plugin parameters (verifier and task
``params``), so that a wrong key or a wrong type fails at start-up with a message that names
the key, the expected type and the closest valid key.
"""

from __future__ import annotations

import inspect
import math
import reprlib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

from mmrft.plugins import did_you_mean


class ConfigError(ValueError):
    """A bad configuration value or key; the message names the key."""


def require_extra(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or fail with one line naming the extra that installs it
    (:class:`ConfigError`: the run needs a feature this installation lacks)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{what} needs the '{module}' package: pip install 'mmrft[{extra}]'"
        ) from None


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 80, 80


def shown(value: Any) -> str:
    """``repr(value)`` for a message, bounded: 80 characters of a string, 3 levels of nesting
    (a config value nested thousands deep must not raise RecursionError while it is named)."""
    try:
        return _SHOWN.repr(value)
    except Exception:  # a user object whose __repr__ raises
        return f"<{type(value).__name__}>"


def check_number(
    key: str,
    value: Any,
    low: float,
    high: float | None = None,
    *,
    open_low: bool = False,
    integer: bool = False,
    unit: str = "",
) -> None:
    """``ValueError`` (one line naming ``key`` and the range) unless ``value`` is a finite number
    (an integer when ``integer``) in ``[low, high]`` (``(low, high]`` when ``open_low``;
    ``high=None``: no upper bound, ``≥ low`` or ``> low``).

    >>> check_number("mix", 1.5, 0, 1)
    Traceback (most recent call last):
    ValueError: mix: must be a finite number in [0, 1], got 1.5
    >>> check_number("min_drawn", 0, 1, integer=True)
    Traceback (most recent call last):
    ValueError: min_drawn: must be an integer ≥ 1, got 0
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (isinstance(value, int) or math.isfinite(value))  # an int is never NaN or inf
    ok = ok and (value > low if open_low else value >= low)
    ok = ok and (high is None or value <= high)
    ok = ok and (not integer or float(value).is_integer())
    if not ok:
        kind = "an integer" if integer else "a finite number"
        if high is None:
            where = f"{'>' if open_low else '≥'} {_bound(low)}"
        else:
            where = f"in {'(' if open_low else '['}{_bound(low)}, {_bound(high)}]"
        unit = f" ({unit})" if unit else ""
        raise ValueError(f"{key}: must be {kind} {where}{unit}, got {shown(value)}")


def _bound(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e10 else f"{bound:g}"


def type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(annotation))
    if origin in (list, tuple):
        args = get_args(annotation)
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin is dict:
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def coerce(value: Any, annotation: Any, key: str) -> Any:
    """Return ``value`` converted to ``annotation`` or raise :class:`ConfigError` naming ``key``.

    Accepted conversions: int → float, and strings from ``key=value`` overrides are parsed as
    YAML scalars before they get here. Everything else must already have the right type.
    """
    if annotation is Any or annotation is inspect.Parameter.empty:
        return value
    origin = get_origin(annotation)
    if origin is Literal:
        choices = get_args(annotation)
        if value in choices:
            return value
        hint = did_you_mean(
            value[:200] if isinstance(value, str) else shown(value), [str(c) for c in choices]
        )
        raise ConfigError(f"{key}: {shown(value)} is not one of {type_name(annotation)}; {hint}")
    if origin in (Union, types.UnionType):
        errors = []
        for arg in get_args(annotation):
            try:
                return coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{key}: expected {type_name(annotation)}, got {shown(value)}")
    if annotation is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {shown(value)}")
    if origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            args = get_args(annotation)
            item = args[0] if args else Any
            out = [coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
            return tuple(out) if origin is tuple else out
        raise ConfigError(f"{key}: expected {type_name(annotation)}, got {shown(value)}")
    if origin is dict or annotation is dict:
        if isinstance(value, Mapping):
            return dict(value)
        raise ConfigError(f"{key}: expected a mapping, got {shown(value)}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an int past 1.8e308
                digits = int(value.bit_length() * 0.30103) + 1
                raise ConfigError(
                    f"{key}: an integer of about {digits} digits is too large for a number (float)"
                ) from None
        raise ConfigError(f"{key}: expected a number (float), got {shown(value)}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {shown(value)}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {shown(value)}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {shown(value)}")
    if isinstance(annotation, type) and isinstance(value, annotation):
        return value
    raise ConfigError(f"{key}: expected {type_name(annotation)}, got {shown(value)}")


def bind_keyword_params(fn: Callable[..., Any], params: Mapping[str, Any], where: str) -> dict:
    """Check ``params`` against the keyword-only parameters of ``fn`` (a function or a class).

    Unknown names raise with the closest valid name; values are type-checked against the
    annotations. Returns the converted params.
    """
    target = fn.__init__ if inspect.isclass(fn) else fn
    signature = inspect.signature(target)
    hints = typing.get_type_hints(target)
    allowed = {
        name: p
        for name, p in signature.parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    out = {}
    for name, value in params.items():
        if name not in allowed:
            valid = list(allowed)
            hint = did_you_mean(name, valid) if valid else "it takes no parameters"
            raise ConfigError(f"{where}: unknown parameter '{name}'; {hint}")
        out[name] = coerce(value, hints.get(name, Any), f"{where}.{name}")
    return out


def keyword_params_doc(fn: Callable[..., Any]) -> dict[str, tuple[str, Any]]:
    """Map each keyword-only parameter of ``fn`` to (type name, default), for ``mmrft list``."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    hints = typing.get_type_hints(target)
    return {
        name: (type_name(hints.get(name, Any)), p.default)
        for name, p in inspect.signature(target).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
