"""Built-in models' layer names known without building them (``builtin_models.py``) are
the layers the factories build, for their defaults and for other counts."""

import inspect

import pytest

from pipestudio.builtin_models import BUILTIN, MAX_BLOCKS, builtin_layer_names
from pipestudio.runtime.models import MODELS, load_model


def test_every_built_in_model_is_known() -> None:
    assert set(BUILTIN) == set(MODELS)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_the_names_are_the_built_layers(name: str) -> None:
    argument, default, _ = BUILTIN[name]
    assert inspect.signature(MODELS[name]).parameters[argument].default == default
    assert builtin_layer_names(name, {}) == [n for n, _ in load_model(name).layers]
    small = {"width": "16", "heads": "2", "seq_len": "8", "vocab": "32", "image_size": "32"}
    accepted = inspect.signature(MODELS[name]).parameters
    for count in (1, 3, 5):
        args = {k: v for k, v in small.items() if k in accepted} | {argument: str(count)}
        built = [n for n, _ in load_model(name, args).layers]
        assert builtin_layer_names(name, args) == built, (name, count)


@pytest.mark.parametrize(
    "value,words",
    [
        ("x", "'x' is not a whole number"),
        ("0", "outside"),
        (str(MAX_BLOCKS + 1), "outside"),
        ("1.5", "whole"),
    ],
)
def test_counts_that_cannot_be_built_are_named(value: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        builtin_layer_names("gpt", {"layers": value})


def test_a_model_that_is_not_built_in_has_no_names_here() -> None:
    assert builtin_layer_names("mine:build", {"layers": "3"}) is None
