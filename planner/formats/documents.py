"""Shared machinery of the versioned JSON documents: bounded field types, loading, saving,
readable errors.

Every integer and string field of a document has an upper bound: the backend stores the
documents in SQL columns (32-bit integers, ``varchar(200)`` names), the dashboard reads
them as JavaScript numbers, and the simulator's work grows with their counts (its own work
budget is ``simulator/budget.py``). The limits sit far above any real model or cluster.
"""

import json
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from pipestudio.planner.errors import PlannerError

#: Names: the model and cluster names go into ``varchar(200)`` columns; layer, device,
#: level and candidate names are held to the same so that any name fits any column.
MAX_NAME_CHARS = 200
#: Short labels (a layer's kind, a profile's dtype and device): a type name, not prose.
MAX_LABEL_CHARS = 100
#: Free text (a layer's description, a proposal's reason, metadata values): a paragraph.
MAX_TEXT_CHARS = 2_000
#: Entries of ``metadata`` and ``provenance``: a few dozen settings, not a data store.
MAX_METADATA_ENTRIES = 100
#: Byte counts and device memory: 2**53 is the largest integer JavaScript numbers (the
#: dashboard's) hold exactly, and 8 PiB is far above any device.
MAX_BYTES = 2**53
#: Time of one operation (a layer's forward, backward or update): 1e9 ms is 11.6 days.
MAX_OP_MS = 1e9
#: Link bandwidth: 1e9 Gbit/s is a million times today's fastest links.
MAX_GBPS = 1e9
#: Samples per micro-batch: 16 Mi fits a 32-bit SQL integer with room to spare.
MAX_MICROBATCH_SIZE = 2**24
#: Micro-batches per step: the simulator's work grows with them (``simulator/budget.py``).
MAX_MICROBATCHES = 100_000
#: Devices in a cluster, and so replicas of a stage: ten times the largest training runs.
MAX_DEVICES = 100_000
MAX_REPLICAS = MAX_DEVICES
#: A device index is stored as a 32-bit SQL integer.
MAX_DEVICE_IDX = 2**31 - 1
#: Members of one group of a cluster level, and levels per cluster (device, server, rack,
#: pod... is four).
MAX_LEVEL_SIZE = 2**20
MAX_LEVELS = 16
#: Layers of a profile: the largest real one here (PipeDream's nasnetalarge) has 1,251 and
#: the planners are benchmarked on a 2,000-layer chain. Stages hold at least one layer each.
MAX_LAYERS = 20_000
MAX_STAGES = MAX_LAYERS
#: Data-flow edges of a profile: ten per layer (nasnetalarge has 1.2).
MAX_EDGES = 10 * MAX_LAYERS
#: Transfers of a proposal: one per (sending stage, receiving replica); a repartition of
#: contiguous stages sends each receiving worker about two.
MAX_TRANSFERS = 2 * MAX_DEVICES
#: Candidates a proposal lists: one per repartition algorithm.
MAX_CANDIDATES = 100
#: Steps a proposal's step times were simulated over: one or a few in practice.
MAX_SIMULATED_STEPS = 100_000


def _integral(value: Any) -> Any:
    """An integral float as the integer it is: JSON Schema's ``integer`` admits 6.0, and
    strict validation (``STRICT``) would otherwise refuse it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: Integers accept integral floats and nothing else: not "3", not true (``STRICT``).
Integral = BeforeValidator(_integral)
#: The models of documents people write: no unknown field, and each field's own JSON type
#: (no "1.5" for 1.5, no true for 1), as the JSON Schemas state them.
STRICT = ConfigDict(extra="forbid", strict=True)

#: The arithmetic a model is trained (and profiled) in: float32; float32 with TF32
#: matmuls; or bfloat16 / float16 autocast over float32 master weights and optimizer state.
Precision = Literal["fp32", "tf32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
Label = Annotated[str, Field(max_length=MAX_LABEL_CHARS)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES), Integral]
#: Floating-point operations of a layer's pass over one micro-batch (as counted by
#: PyTorch's FLOP counter); held to the byte counts' 2**53 for the same reason.
Flops = Annotated[int, Field(ge=0, le=MAX_BYTES), Integral]
Milliseconds = Annotated[float, Field(ge=0, le=MAX_OP_MS, allow_inf_nan=False)]
#: A time the planner sums from many operations (a step, a migration): finite, not held
#: to ``MAX_OP_MS``, which bounds one operation.
TotalMilliseconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Gbps = Annotated[float, Field(gt=0, le=MAX_GBPS, allow_inf_nan=False)]
#: A device's peak TFLOP/s (the fastest accelerators give a few thousand).
Tflops = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]
MicrobatchSize = Annotated[int, Field(ge=1, le=MAX_MICROBATCH_SIZE), Integral]
NumMicrobatches = Annotated[int, Field(ge=1, le=MAX_MICROBATCHES), Integral]
Replicas = Annotated[int, Field(ge=1, le=MAX_REPLICAS), Integral]
VirtualStages = Annotated[int, Field(ge=1, le=MAX_STAGES), Integral]
DeviceIdx = Annotated[int, Field(ge=0, le=MAX_DEVICE_IDX), Integral]
StageIdx = Annotated[int, Field(ge=0, lt=MAX_STAGES), Integral]
LevelSize = Annotated[int, Field(ge=1, le=MAX_LEVEL_SIZE), Integral]
#: A metadata or provenance value; integers as exact as JavaScript holds them.
MetadataValue = (
    Text
    | Annotated[int, Field(ge=-MAX_BYTES, le=MAX_BYTES), Integral]
    | Annotated[float, Field(allow_inf_nan=False)]
    | bool
)
Metadata = Annotated[dict[Name, MetadataValue], Field(max_length=MAX_METADATA_ENTRIES)]
Provenance = Annotated[dict[Name, MetadataValue | None], Field(max_length=MAX_METADATA_ENTRIES)]


class DocumentError(PlannerError):
    """A document failed validation; the message lists every bad field by its path."""


class Document(BaseModel):
    """Base of Profile, Cluster, Plan, Proposal and SimResult: strict fields, JSON in and
    out."""

    model_config = STRICT

    def to_json(self, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent, exclude_none=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")


DocT = TypeVar("DocT", bound=Document)
#: Problems listed one per line; a document with thousands of bad layers gets a summary.
_MAX_ERROR_LINES = 20


def parse_document(model: type[DocT], data: Any, *, source: str = "document") -> DocT:
    """Validate ``data`` (a dict or a JSON string) as ``model``, with a readable error."""
    try:
        if isinstance(data, (str, bytes)):
            return model.model_validate_json(data)
        return model.model_validate(data)
    except ValidationError as exc:
        raw = _as_python(data)
        raise DocumentError(describe_validation_error(exc, raw, source=source)) from None


def load_document(model: type[DocT], path: str | Path) -> DocT:
    """Read and validate a JSON document file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror}") from None
    return parse_document(model, text, source=str(path))


def describe_validation_error(exc: ValidationError, raw: Any, *, source: str) -> str:
    """One line per problem: the field's path (with layer names where known) and why."""
    lines = [f"{source} is not a valid {exc.title}:"]
    errors = exc.errors(include_url=False)
    for error in errors[:_MAX_ERROR_LINES]:
        where = _describe_path(error["loc"], raw)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] in ("missing", "extra_forbidden") or not error["loc"]:
            lines.append(f"  {where}: {message}" if where else f"  {message}")
        else:
            lines.append(f"  {where} = {_brief(error.get('input'))}: {message}")
    if len(errors) > _MAX_ERROR_LINES:
        lines.append(f"  ... and {len(errors) - _MAX_ERROR_LINES} more problems")
    return "\n".join(lines)


def _describe_path(loc: tuple[int | str, ...], raw: Any) -> str:
    parts: list[str] = []
    node = raw
    for key in loc:
        if isinstance(key, int):
            label = f"[{key}]"
            item = node[key] if isinstance(node, list) and key < len(node) else None
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                label += f" ({_brief(item['name'])})"
            parts.append(label)
            node = item
        else:
            label = key if len(key) <= 60 else f"{key[:40]}... ({len(key)} characters)"
            parts.append(f".{label}" if parts else label)
            node = node.get(key) if isinstance(node, dict) else None
    return "".join(parts)


def _brief(value: Any) -> str:
    """The bad value as the message shows it: a too-long list or text is not repeated whole."""
    if isinstance(value, (list, dict)) and len(value) > 10:
        return f"<{type(value).__name__} of {len(value)} items>"
    if isinstance(value, str) and len(value) > 60:
        return f"{value[:40]!r}... ({len(value)} characters)"
    if isinstance(value, int) and value.bit_length() > 64:  # repr fails past 4300 digits
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:60]}... ({len(text)} characters)"


def _as_python(data: Any) -> Any:
    if isinstance(data, (str, bytes)):
        try:
            return json.loads(data)
        except ValueError:
            return None
    return data
