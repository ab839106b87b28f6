"""Import PipeDream's profiler output (``graph.txt``) as a Profile.

The file has one node line per layer, ``id -- description -- forward_compute_time=...,
backward_compute_time=..., activation_size=..., parameter_size=...[ -- stage_id=k]``, in no
particular order, then one edge line per data-flow edge, ``\\tsrc -- dst``. Times are
milliseconds and sizes bytes for the whole profiled minibatch, which the file does not
state; the caller gives it. A node with several outputs lists its activation sizes as
``[a; b; c]``, which count together.

Mapping to the Profile format: ``activation_size`` is both the bytes a layer sends on
(``output_bytes``) and the bytes it keeps for the backward (``saved_bytes``), which is how
PipeDream's optimizer counts activation memory. ``Input*`` nodes stay in the graph as
layers of kind ``Input`` that cost nothing; PipeDream's optimizer zeroes them too, since
their forward time is data loading (kept in the profile's metadata as ``input_load_ms``).
Layers are listed in a topological order that follows the profiler's node numbering
where the graph allows.
"""

import heapq
import math
import re
from pathlib import Path
from typing import Any

from pipestudio.planner.errors import ImportFormatError
from pipestudio.planner.formats.documents import MAX_MICROBATCH_SIZE, DocumentError, parse_document
from pipestudio.planner.formats.profile import Profile, find_cycle

_FIELD_RE = re.compile(r"(\w+)=(\[[^\]]*\]|[^,\s]+)")
_REQUIRED = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


def import_pipedream(path: str | Path, *, batch_size: int = 1, model: str | None = None) -> Profile:
    """Read a PipeDream ``graph.txt``; ``model`` defaults to the parent folder's name."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ImportFormatError(f"cannot read {path}: {exc.strerror}") from None
    name = model or path.parent.name or path.stem
    return parse_pipedream(text, model=name, batch_size=batch_size, source=str(path))


def parse_pipedream(
    text: str, *, model: str, batch_size: int = 1, source: str = "graph.txt"
) -> Profile:
    if batch_size < 1:
        raise ImportFormatError(f"--batch-size must be >= 1, got {batch_size}")
    if batch_size > MAX_MICROBATCH_SIZE:
        raise ImportFormatError(
            f"--batch-size must be <= {MAX_MICROBATCH_SIZE} (a profile's "
            f"largest microbatch_size), got {batch_size}"
        )
    nodes: dict[str, dict[str, Any]] = {}
    edges: list[tuple[str, str]] = []
    input_load_ms = 0.0
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.startswith("\t"):
            parts = [part.strip() for part in line.strip().split(" -- ")]
            if len(parts) != 2:
                raise ImportFormatError(
                    f"{source}:{line_no}: an edge line must read "
                    f"'<src> -- <dst>', got {line.strip()!r}"
                )
            edges.append((parts[0], parts[1]))
            continue
        layer, load_ms = _parse_node(line, line_no, source)
        if layer["name"] in nodes:
            raise ImportFormatError(f"{source}:{line_no}: node {layer['name']!r} appears twice")
        nodes[layer["name"]] = layer
        input_load_ms += load_ms
    if not nodes:
        raise ImportFormatError(f"{source}: no node lines found; is this a PipeDream graph.txt?")
    for src, dst in edges:
        for end in (src, dst):
            if end not in nodes:
                raise ImportFormatError(f"{source}: edge {src} -- {dst} names unknown node {end!r}")
    order = _topological_order(list(nodes), edges, source)
    document = {
        "model": model,
        "microbatch_size": batch_size,
        "dtype": "float32",
        "device": "unknown (PipeDream profile)",
        "layers": [nodes[name] for name in order],
        "edges": [{"src": src, "dst": dst} for src, dst in edges],
        "metadata": {
            "source": source,
            "source_format": "pipedream graph.txt",
            "input_load_ms": round(input_load_ms, 6),
        },
    }
    try:
        return parse_document(Profile, document, source=f"the profile read from {source}")
    except DocumentError as exc:  # a value past the Profile's limits
        raise ImportFormatError(str(exc)) from None


def _parse_node(line: str, line_no: int, source: str) -> tuple[dict[str, Any], float]:
    parts = line.split(" -- ")
    if len(parts) not in (3, 4):
        raise ImportFormatError(
            f"{source}:{line_no}: a node line must read '<id> -- <desc> "
            f"-- <fields>', got {line[:80]!r}"
        )
    node_id, description, fields_text = (part.strip() for part in parts[:3])
    fields = dict(_FIELD_RE.findall(fields_text))
    missing = [key for key in _REQUIRED if key not in fields]
    if missing:
        raise ImportFormatError(f"{source}:{line_no}: node {node_id} lacks {', '.join(missing)}")
    try:
        values = {key: _number(fields[key]) for key in _REQUIRED}
    except ValueError:
        raise ImportFormatError(
            f"{source}:{line_no}: node {node_id} has a field that is not a "
            f"number: {fields_text[:120]!r}"
        ) from None
    for key, value in values.items():
        if value < 0:
            raise ImportFormatError(
                f"{source}:{line_no}: node {node_id} has negative {key}={value}"
            )
        if not math.isfinite(value):
            raise ImportFormatError(
                f"{source}:{line_no}: node {node_id} has {key}={value}; expected a finite number"
            )
    kind = description.split("(", 1)[0].strip() or "layer"
    activation = round(values["activation_size"])
    if kind.startswith("Input"):
        layer = {
            "name": node_id,
            "kind": "Input",
            "fwd_ms": 0.0,
            "bwd_ms": 0.0,
            "output_bytes": activation,
            "description": description,
        }
        return layer, values["forward_compute_time"]
    layer = {
        "name": node_id,
        "kind": kind,
        "fwd_ms": values["forward_compute_time"],
        "bwd_ms": values["backward_compute_time"],
        "param_bytes": round(values["parameter_size"]),
        "saved_bytes": activation,
        "output_bytes": activation,
        "description": description,
    }
    return layer, 0.0


def _number(text: str) -> float:
    if text.startswith("["):
        return sum(float(item) for item in text.strip("[]").split(";") if item.strip())
    return float(text)


def _topological_order(names: list[str], edges: list[tuple[str, str]], source: str) -> list[str]:
    """Kahn's algorithm, taking the lowest node number first among the ready nodes."""
    index = {name: idx for idx, name in enumerate(names)}
    succs: list[list[int]] = [[] for _ in names]
    indegree = [0] * len(names)
    for src, dst in set(edges):
        succs[index[src]].append(index[dst])
        indegree[index[dst]] += 1
    heap = [(_node_number(name), name) for name in names if indegree[index[name]] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, name = heapq.heappop(heap)
        order.append(name)
        for succ in succs[index[name]]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                heapq.heappush(heap, (_node_number(names[succ]), names[succ]))
    if len(order) != len(names):
        cycle = find_cycle(len(names), [(index[s], index[d]) for s, d in edges])
        raise ImportFormatError(
            f"{source}: the graph has a cycle: " + " -> ".join(names[i] for i in cycle)
        )
    return order


def _node_number(name: str) -> tuple[int, str]:
    digits = re.search(r"(\d+)$", name)
    return (int(digits.group(1)) if digits else 1 << 62, name)
