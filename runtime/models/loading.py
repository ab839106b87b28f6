"""Turning command-line text into a model factory and its keyword arguments.

A user model is named ``MODULE:FACTORY`` (``mypkg.models:build``) or ``FILE.py:FACTORY``;
its arguments arrive as ``KEY=VALUE`` strings, converted to bool, int or float where they
read as one, and checked against the factory's signature before it is called, so a typo
is reported by name instead of surfacing as a ``TypeError`` deep inside the factory.
"""

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pipestudio.runtime.errors import ModelError


def parse_model_args(items: Iterable[str]) -> dict[str, str]:
    """``["layers=8", "width=256"]`` -> ``{"layers": "8", "width": "256"}``."""
    args: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ModelError(f"--model-arg {item!r} must look like KEY=VALUE, e.g. layers=8")
        if key in args:
            raise ModelError(f"--model-arg {key!r} is given twice")
        args[key] = value.strip()
    return args


def convert_value(text: str) -> bool | int | float | str:
    """The value a string spells: true/false, an int, a float, else the string itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def import_factory(target: str) -> Callable[..., Any]:
    """The callable named by ``MODULE:FACTORY`` or ``FILE.py:FACTORY``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ModelError(f"model {target!r} must look like MODULE:FACTORY or FILE.py:FACTORY")
    try:
        if module_name.endswith(".py"):
            module = _import_file(Path(module_name))
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError) as exc:
        raise ModelError(f"cannot import {module_name!r} for model {target!r}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelError(f"{module_name!r} has no callable {attr!r} (model {target!r})")
    return factory


def _import_file(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def check_arguments(
    model: str, factory: Callable[..., Any], args: Mapping[str, Any]
) -> dict[str, Any]:
    """``args`` validated against the factory's signature, ints widened to float where the
    default is a float; a name or type the factory does not take raises ``ModelError``."""
    params = inspect.signature(factory).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    valid = sorted(
        name for name, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    checked: dict[str, Any] = {}
    for name, value in args.items():
        if name not in params and not accepts_any:
            raise ModelError(
                f"model {model!r} has no argument {name!r}; its arguments are "
                f"{', '.join(valid) or '(none)'}"
            )
        default = params[name].default if name in params else None
        expected = type(default) if isinstance(default, (bool, int, float, str)) else None
        if expected is float and type(value) is int:
            value = float(value)
        if expected is not None and type(value) is not expected:
            raise ModelError(
                f"model {model!r}: argument {name}={value!r} must be "
                f"{expected.__name__} (like its default {default!r})"
            )
        checked[name] = value
    return checked
