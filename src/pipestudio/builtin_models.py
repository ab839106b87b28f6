"""The layers a built-in model has for given arguments, known without building it.

The backend checks a launch with it before any worker builds the model: a plan whose layers
the model and arguments do not give is refused at once, naming the layers. It imports no
torch (the backend does not), which is why it lives beside ``allowlist.py`` rather than in
``runtime/models``. Each built-in model repeats one block a number of times set by one argument; its
other layers are fixed. ``tests/runtime/models/test_names.py`` holds these names equal to the
layers the factories build, and the defaults to the factories' own.
"""

from collections.abc import Callable, Mapping

#: The most blocks a name list is made for (a larger count is refused, not enumerated).
MAX_BLOCKS = 100_000


def _chain(prefix: list[str], block: str, suffix: list[str]) -> Callable[[int], list[str]]:
    return lambda count: [*prefix, *(f"{block}{idx}" for idx in range(count)), *suffix]


def _unet(depth: int) -> list[str]:
    return [
        *(f"enc{level}" for level in range(depth)),
        "bottom",
        *(f"dec{level}" for level in reversed(range(depth))),
        "head",
    ]


#: model -> (the argument that counts its blocks, its default, the names for a count)
BUILTIN: dict[str, tuple[str, int, Callable[[int], list[str]]]] = {
    "gpt": ("layers", 4, _chain(["embed"], "block", ["head"])),
    "dynamic": ("layers", 4, _chain(["embed"], "block", ["head"])),
    "mlp": ("layers", 4, _chain([], "block", ["head"])),
    "resnet": ("blocks", 4, _chain(["stem"], "block", ["head"])),
    "unet": ("depth", 2, _unet),
}


def builtin_layer_names(model: str, args: Mapping[str, object]) -> list[str] | None:
    """The layer names of built-in ``model`` built with ``args`` (text or numbers, as a
    run stores them); None for a model that is not built in. ValueError naming the
    argument when its count is not a whole number from 1 to ``MAX_BLOCKS``."""
    if model not in BUILTIN:
        return None
    argument, default, names = BUILTIN[model]
    value = args.get(argument, default)
    try:
        count = int(str(value))
    except ValueError:
        raise ValueError(f"{argument}={value!r} is not a whole number") from None
    if not 1 <= count <= MAX_BLOCKS:
        raise ValueError(f"{argument}={count} is outside 1..{MAX_BLOCKS}")
    return names(count)
