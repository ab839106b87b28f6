"""Which models a worker runs: its built-in models, and the factories (``MODULE:FACTORY``
or ``FILE.py:FACTORY``) that the person who started it allowed by pattern.

A model names code to import and call on the worker, so holding the API token must not be
enough to run any of it: a worker runs another factory only when its own allow-list
(``pipestudio worker --allow-model``, ``PIPESTUDIO_ALLOWED_MODELS``) matches it. Patterns
are shell-style and match the whole name, case-sensitively: ``mypkg.models:*`` allows
every factory of that module, ``mypkg.*:build`` one name in every submodule; ``*`` allows
any code at all and trusts everyone who holds the API token with this machine.
"""

from collections.abc import Iterable
from fnmatch import fnmatchcase

MAX_PATTERN_CHARS = 200


class AllowListError(ValueError):
    """A pattern of an allow-list is malformed."""


def parse_patterns(items: Iterable[str]) -> list[str]:
    """The patterns of ``items`` (each may hold several, separated by commas), checked."""
    patterns = []
    for item in items:
        for pattern in (part.strip() for part in item.split(",")):
            if not pattern:
                continue
            if len(pattern) > MAX_PATTERN_CHARS or (":" not in pattern and pattern != "*"):
                raise AllowListError(
                    f"model pattern {pattern[:80]!r} must look like "
                    "MODULE:FACTORY (shell wildcards allowed, e.g. "
                    f"mypkg.models:*) and be at most {MAX_PATTERN_CHARS} "
                    "characters"
                )
            patterns.append(pattern)
    return patterns


def model_allowed(model: str, builtin: Iterable[str], patterns: Iterable[str]) -> bool:
    """Whether a worker with these built-in models and patterns runs ``model``. A file
    name that climbs out of where it points (``..``) or uses backslashes matches no
    pattern: ``models/*.py:build`` must not reach ``models/../../tmp/x.py``."""
    if model in set(builtin):
        return True
    module = model.partition(":")[0]
    if "\\" in module or ".." in module.split("/"):
        return False
    return any(fnmatchcase(model, pattern) for pattern in patterns)
