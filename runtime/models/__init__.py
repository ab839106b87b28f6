"""Built-in models and the registry that resolves a model name to a ``ModelSpec``.

Every factory takes keyword arguments with small defaults (fast on a 2-core CPU) and a
``seed``, and returns a ``ModelSpec`` (``spec.py`` states the contract; docs/runtime.md
shows how to write one's own factory).
"""

from collections.abc import Callable, Mapping

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models.dynamic import DynamicSpec, SwitchableBlock, dynamic
from pipestudio.runtime.models.gpt import gpt
from pipestudio.runtime.models.loading import (
    check_arguments,
    convert_value,
    import_factory,
    parse_model_args,
)
from pipestudio.runtime.models.mlp import mlp
from pipestudio.runtime.models.resnet import resnet
from pipestudio.runtime.models.spec import (
    DATA,
    ModelSpec,
    SpecModule,
    sample_generator,
    seeded,
)
from pipestudio.runtime.models.unet import unet

MODELS: dict[str, Callable[..., ModelSpec]] = {
    "dynamic": dynamic,
    "gpt": gpt,
    "mlp": mlp,
    "resnet": resnet,
    "unet": unet,
}


def load_model(name_or_path: str, args: Mapping[str, str] | None = None) -> ModelSpec:
    """A built-in model by name, or ``MODULE:FACTORY``'s, built with ``args`` ("k": "v")."""
    if name_or_path in MODELS:
        factory = MODELS[name_or_path]
    elif ":" in name_or_path:
        factory = import_factory(name_or_path)
    else:
        raise ModelError(
            f"unknown model {name_or_path!r}; expected one of {', '.join(MODELS)} or MODULE:FACTORY"
        )
    values = {
        key: convert_value(value) if isinstance(value, str) else value
        for key, value in (args or {}).items()
    }
    spec = factory(**check_arguments(name_or_path, factory, values))
    if not isinstance(spec, ModelSpec):
        raise ModelError(
            f"model {name_or_path!r} returned a {type(spec).__name__}, not a ModelSpec"
        )
    return spec


__all__ = [
    "DATA",
    "MODELS",
    "DynamicSpec",
    "ModelSpec",
    "SpecModule",
    "SwitchableBlock",
    "dynamic",
    "gpt",
    "load_model",
    "mlp",
    "parse_model_args",
    "resnet",
    "sample_generator",
    "seeded",
    "unet",
]
