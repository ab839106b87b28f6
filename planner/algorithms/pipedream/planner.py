"""``pipedream``: PipeDream's optimizer (SOSP'19 §3.1) on a profile and a cluster.

It answers what msr-fiddle/pipedream's ``optimizer/optimizer_graph_hierarchical.py`` (OGH
below; commit 11c40c0) answers for ``-n <devices per level> -b <bandwidths>
--activation_compression_ratio 1``, plus ``--straight_pipeline`` when ``request.single_replica``
and ``--use_memory_constraint -s M`` when the cluster's devices have a memory (M = the
smallest): the split of the model into replicated stages that minimises the time per
minibatch of the slowest stage, inter-stage communication included. The pieces:

- the graph: like the optimizer, ``Input`` sources and ``__getitem__`` sinks take no part (its
  preprocessing); they are placed afterwards, Input layers in the first stage and each sink in
  its producer's stage, so the plan holds every layer of the profile;
- the states: the antichain DAG of the rest (``antichains.py``), from its first source in the
  profile's order (for every profile in profiles/pipedream, the first in file order, as in
  OGH); a chain gives one state per layer;
- the search: its hierarchical dynamic program, evaluated exactly but fast (``dp.py``);
- the decoding: its ``analyze_partitioning``; stage k gets the layers of D(s_end) not in an
  earlier stage.

The cluster decides everything about the shape: its levels (innermost first) are the levels
of the hierarchy, with bandwidth gbps * 1e9 / 8 bytes/s (a level without a bandwidth is a free
link: no all-reduce or transfer time); ``request.num_stages`` is ignored. With several levels
the plan is flattened: a level-1 stage with r1 replicas inside a level-2 stage replicated r2
times becomes one stage with r1 * r2 replicas (and so on up the levels); ``details`` keeps the
per-level counts. The objective is the optimizer's "time per stage in pipeline" in ms:
its seconds * 1000, at the request's micro-batch size (``request.scaled``).

One quirk is kept because it is part of that optimum: below the top level the optimizer also
costs "irregular" stages, whose start state is not an ancestor of their end state, as a plain
difference of sums (``dp.py``). Such a stage's cost is not that of its layers, and
a later stage can come out with no layer at all, as in PipeDream's own output. ``details``
lists the irregular stages, and the empty ones, which the plan leaves out (their devices idle).
"""

import math
from dataclasses import dataclass, replace
from typing import Any

from pipestudio.planner.algorithms.pipedream.antichains import AntichainDag, antichain_dag, bits
from pipestudio.planner.algorithms.pipedream.dp import HierarchicalDP, Level, StageSpan, StateCosts
from pipestudio.planner.algorithms.request import (
    InfeasibleError,
    PlannerOutput,
    PlanRequest,
    memory_only_cluster,
)
from pipestudio.planner.errors import PlannerError
from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.profile import Layer, Profile

#: PipeDream's communication switch; 1 means activations travel uncompressed.
ACTIVATION_COMPRESSION_RATIO = 1.0


@dataclass(frozen=True)
class DPGraph:
    """The profile's graph without Input sources and ``__getitem__`` sinks (OGH 204-227).

    ``layers[v]`` is the profile index of DP node v; nodes keep the profile's order.
    """

    layers: tuple[int, ...]
    succs: tuple[tuple[int, ...], ...]
    preds: tuple[tuple[int, ...], ...]
    inputs: tuple[int, ...]
    sinks: tuple[int, ...]


def _is_input(layer: Layer) -> bool:
    return layer.kind == "Input" or layer.description.startswith("Input")


def _is_getitem(layer: Layer) -> bool:
    return layer.kind == "__getitem__" or layer.description.startswith("__getitem__")


def _edges_in_order(profile: Profile) -> list[tuple[int, int]]:
    """Data-flow edges in the profile's listed order (PipeDream iterates them so)."""
    if profile.edges is None:
        return [(idx, idx + 1) for idx in range(profile.num_layers - 1)]
    index = profile.layer_index
    return list(dict.fromkeys((index[edge.src], index[edge.dst]) for edge in profile.edges))


def dp_graph(profile: Profile) -> DPGraph:
    edges = _edges_in_order(profile)
    has_pred = {dst for _, dst in edges}
    inputs = {
        idx for idx, layer in enumerate(profile.layers) if idx not in has_pred and _is_input(layer)
    }
    has_succ = {src for src, dst in edges if dst not in inputs}
    sinks = {
        idx
        for idx, layer in enumerate(profile.layers)
        if idx not in inputs and idx not in has_succ and _is_getitem(layer)
    }
    kept = [idx for idx in range(profile.num_layers) if idx not in inputs | sinks]
    local = {layer_idx: node for node, layer_idx in enumerate(kept)}
    succs: list[list[int]] = [[] for _ in kept]
    preds: list[list[int]] = [[] for _ in kept]
    for src, dst in edges:
        if src in local and dst in local:
            succs[local[src]].append(local[dst])
            preds[local[dst]].append(local[src])
    if not kept:
        raise PlannerError(
            f"the profile of {profile.model!r} has only Input layers: nothing to plan"
        )
    return DPGraph(
        tuple(kept),
        tuple(map(tuple, succs)),
        tuple(map(tuple, preds)),
        tuple(sorted(inputs)),
        tuple(sorted(sinks)),
    )


def state_costs(profile: Profile, graph: DPGraph, dag: AntichainDag) -> StateCosts:
    """C, activation and parameter sums over each state's down-set (OGH 236-250).

    Each sum adds its layers in ascending order from 0.0, as the optimizer's loop does in
    our layer order, so the floats are the same; the leading run of layers 0..p-1 that a
    down-set holds is taken from a running prefix sum, which performs exactly those additions.
    A chain's down-sets are all such runs, which makes this O(n) instead of O(n^2).
    """
    layers = [profile.layers[idx] for idx in graph.layers]
    times_s = [(layer.fwd_ms + layer.bwd_ms) / 1000.0 for layer in layers]
    outputs = [layer.output_bytes for layer in layers]
    params = [layer.param_bytes for layer in layers]
    prefix = [(0.0, 0.0, 0.0)]
    time_s = act = par = 0.0
    for node in range(len(layers)):
        time_s += times_s[node]
        act += outputs[node]
        par += params[node]
        prefix.append((time_s, act, par))
    compute, activations, parameters = [], [], []
    for down in dag.down_sets:
        run = (~down & (down + 1)).bit_length() - 1  # layers 0..run-1 are all in
        time_s, act, par = prefix[run]
        for node in bits(down >> run << run):
            time_s += times_s[node]
            act += outputs[node]
            par += params[node]
        compute.append(time_s)
        activations.append(act)
        parameters.append(par)
    boundary = [float(sum(outputs[node] for node in augmented)) for augmented in dag.augmented]
    return StateCosts(compute, activations, parameters, boundary, dag.ancestors)


def cluster_levels(cluster: Cluster) -> list[Level]:
    return [
        Level(
            level.size, math.inf if level.bandwidth_gbps is None else level.bandwidth_gbps * 1e9 / 8
        )
        for level in cluster.levels
    ]


def memory_limit(cluster: Cluster) -> int | None:
    """PipeDream's ``-s``: one memory for all devices, so the smallest one."""
    memories = [
        device.memory_bytes for device in cluster.devices if device.memory_bytes is not None
    ]
    return min(memories) if memories else None


def assign_layers(
    profile: Profile, graph: DPGraph, dag: AntichainDag, spans: list[StageSpan]
) -> list[list[int]]:
    """Layer indices per stage, as OGH 321-345 assigns stage ids, plus the removed layers.

    A stage gets the layers of D(s_end) that no earlier stage has. After an irregular stage
    (see ``irregular_stages``) that can leave a later stage empty, as in PipeDream's output.
    """
    stage_of: dict[int, int] = {}
    assigned = 0
    for stage_idx, span in enumerate(spans):
        fresh = dag.down_sets[span.end - 1] & ~assigned
        assigned |= fresh
        stage_of.update((graph.layers[node], stage_idx) for node in bits(fresh))
    missing = [
        profile.layers[graph.layers[node]].name
        for node in range(len(graph.layers))
        if not assigned >> node & 1
    ]
    if missing:
        raise PlannerError(
            f"layers {', '.join(missing[:5])} of {profile.model!r} are not "
            "connected to its first source; PipeDream plans one connected graph"
        )
    stage_of.update((idx, 0) for idx in graph.inputs)
    preds = profile.graph.preds
    for sink in graph.sinks:
        stage_of[sink] = max((stage_of[pred] for pred in preds[sink]), default=0)
    stages: list[list[int]] = [[] for _ in spans]
    for layer_idx in range(profile.num_layers):
        stages[stage_of[layer_idx]].append(layer_idx)
    return stages


def irregular_stages(dag: AntichainDag, spans: list[StageSpan]) -> list[int]:
    """Stages whose start state is not an ancestor of their end state.

    PipeDream's inner levels cost such a stage as C(s_end) - C(s_start), which is not the cost
    of any set of layers (it can be negative); the optimum then is not this plan's cost.
    """
    return [
        idx
        for idx, span in enumerate(spans)
        if span.start > 0 and not dag.ancestors[span.end - 1] >> (span.start - 1) & 1
    ]


def check_microbatches(replicas: list[int], num_microbatches: int) -> None:
    """The Plan format needs every stage's replicas to divide the micro-batches."""
    bad = sorted({count for count in replicas if num_microbatches % count})
    if bad:
        multiple = math.lcm(*replicas)
        suggestion = multiple * math.ceil(num_microbatches / multiple)
        raise PlannerError(
            f"PipeDream's plan replicates its stages {replicas} times, and replica counts "
            f"{bad} do not divide --microbatches {num_microbatches}; use a multiple of "
            f"{multiple}, e.g. {suggestion}"
        )


def _infeasible(request: PlanRequest, dag: AntichainDag, memory: int | None) -> PlannerError:
    assert request.cluster is not None
    sizes = [level.size for level in request.cluster.levels]
    devices = math.prod(sizes)
    shape = " x ".join(map(str, sizes))
    if request.single_replica and devices > dag.longest_chain():
        return PlannerError(
            f"a straight pipeline on {devices} devices ({shape}) needs {devices} stages, "
            f"but the graph of {request.profile.model!r} allows at most "
            f"{dag.longest_chain()}; use fewer devices or allow replication"
        )
    if memory is not None:
        return InfeasibleError(
            f"no {'straight ' if request.single_replica else ''}PipeDream plan on {shape} devices "
            f"fits {memory} bytes per device: each stage stashes ceil(later devices / "
            "replicas) x (its activations + parameters)"
        )
    return PlannerError(f"PipeDream's optimizer finds no plan on {shape} devices")


def pipedream(request: PlanRequest) -> PlannerOutput:
    """PipeDream's optimum for ``request`` (see the module docstring). Without a cluster it
    plans the request's ``num_stages`` devices with free links and unlimited memory, as the
    other planners do."""
    if request.cluster is None:
        if request.num_stages is None:
            raise PlannerError(
                "the pipedream planner needs a cluster, or a number of stages to plan on "
                "free links: PipeDream's optimizer takes the devices per level and each "
                "level's bandwidth (e.g. cluster-template --devices 4,2 --bandwidth-gbps "
                "100,10)"
            )
        request = replace(request, cluster=memory_only_cluster(request.num_stages, None))
    assert request.cluster is not None
    profile = request.scaled
    graph = dp_graph(profile)
    dag = antichain_dag(graph.succs, graph.preds)
    levels = cluster_levels(request.cluster)
    memory = memory_limit(request.cluster)
    solver = HierarchicalDP(
        state_costs(profile, graph, dag),
        levels,
        memory_bytes=memory,
        single_replica=request.single_replica,
        activation_compression_ratio=ACTIVATION_COMPRESSION_RATIO,
    )
    optimum_s = solver.optimum_s()
    if optimum_s is None:
        raise _infeasible(request, dag, memory)
    spans = solver.stages()
    layers = assign_layers(profile, graph, dag, spans)
    kept = [idx for idx, stage in enumerate(layers) if stage]
    replicas = [math.prod(spans[idx].replicas) for idx in kept]
    check_microbatches(replicas, request.num_microbatches)
    plan = request.build_plan(
        [layers[idx] for idx in kept],
        replicas=replicas,
        planner="pipedream",
        settings={
            "devices_per_level": ",".join(str(level.num_machines) for level in levels),
            "straight": request.single_replica,
            "memory_bytes": memory,
            "time_per_minibatch_s": optimum_s,
        },
    )
    details = _details(request, levels, memory, dag, solver, spans, optimum_s)
    details["empty_stages_dropped"] = [idx for idx, stage in enumerate(layers) if not stage]
    return PlannerOutput(plan, optimum_s * 1000.0, details)


def _details(
    request: PlanRequest,
    levels: list[Level],
    memory: int | None,
    dag: AntichainDag,
    solver: HierarchicalDP,
    spans: list[StageSpan],
    optimum_s: float,
) -> dict[str, Any]:
    return {
        "time_per_minibatch_s": optimum_s,
        "levels": [
            {
                "devices": level.num_machines,
                "bandwidth_bytes_per_s": (
                    None if math.isinf(level.bandwidth_bytes_per_s) else level.bandwidth_bytes_per_s
                ),
            }
            for level in levels
        ],
        "straight": request.single_replica,
        "memory_bytes": memory,
        "activation_compression_ratio": ACTIVATION_COMPRESSION_RATIO,
        "num_states": dag.num_states,
        "stage_states": [[span.start, span.end] for span in spans],
        "irregular_stages": irregular_stages(dag, spans),
        "replicas_per_level": [list(span.replicas) for span in spans],
        "level_splits": [[list(split) for split in splits] for splits in solver.level_splits()],
        "replicas_rule": "a stage's replicas are the product of its replicas per level",
        "num_stages_ignored": request.num_stages,
        "dp_evaluations": solver.evaluations,
    }
