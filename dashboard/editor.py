"""The plan being edited on the planner page, and its prediction by the local simulator.

The editor's state is a small JSON-able dict kept in the browser (``planner-editor``): the
profile and cluster ids, the pipeline's shape, the memory per device, each stage's
replicas and the layers' non-keep policies. Stage boundaries live in the range slider:
``boundaries[k]`` is the index of the first layer of stage k + 1, so a chain's stages are
contiguous runs of the profile's layer order, which is topological, and every cut is a
valid plan. Predictions are simulated here with the planner package, without a round trip
to the backend, and kept for a moment so the figures of one state are computed once.
"""

import itertools
import json
import threading
from collections import OrderedDict
from typing import Any

from pipestudio.planner import Cluster, Plan, Profile, SimResult, simulate
from pipestudio.planner.algorithms.request import memory_only_cluster
from pipestudio.planner.formats.documents import parse_document

Editor = dict[str, Any]
_KEEP = 8
_cache: OrderedDict[str, SimResult] = OrderedDict()
_cache_lock = threading.Lock()


def new_editor(
    profile_id: int,
    cluster_id: int | None,
    *,
    schedule: str,
    num_microbatches: int,
    microbatch_size: int | None,
    device_memory_bytes: int | None,
    optimizer: str = "adam",
    virtual_stages: int = 1,
) -> Editor:
    return {
        "profile_id": profile_id,
        "cluster_id": cluster_id,
        "schedule": schedule,
        "virtual_stages": virtual_stages,
        "num_microbatches": num_microbatches,
        "microbatch_size": microbatch_size,
        "device_memory_bytes": device_memory_bytes,
        "optimizer": optimizer,
        "replicas": None,
        "devices": None,
        "policies": {},
        "source": "manual",
        "plan_id": None,
        "plan_state": None,
    }


def equal_boundaries(num_layers: int, num_stages: int) -> list[int]:
    """Cuts giving stages of equal layer counts (the first ``n % k`` one more)."""
    base, extra = divmod(num_layers, num_stages)
    cuts, start = [], 0
    for stage_idx in range(num_stages - 1):
        start += base + (1 if stage_idx < extra else 0)
        cuts.append(start)
    return cuts


def stage_sizes(boundaries: list[int], num_layers: int) -> list[int]:
    cuts = [0, *boundaries, num_layers]
    return [b - a for a, b in itertools.pairwise(cuts)]


def plan_document(profile: Profile, editor: Editor, boundaries: list[int]) -> dict[str, Any]:
    """The Plan document of the editor's state cut at ``boundaries``."""
    names = [layer.name for layer in profile.layers]
    cuts = [0, *sorted(int(b) for b in boundaries), profile.num_layers]
    replicas = editor.get("replicas") or [1] * (len(cuts) - 1)
    devices = editor.get("devices")
    if len(replicas) != len(cuts) - 1:
        replicas, devices = [1] * (len(cuts) - 1), None
    stages = []
    for stage_idx, (start, end) in enumerate(itertools.pairwise(cuts)):
        stage: dict[str, Any] = {"layers": names[start:end], "replicas": replicas[stage_idx]}
        if devices:
            stage["devices"] = devices[stage_idx]
        stages.append(stage)
    return {
        "model": profile.model,
        "schedule": editor["schedule"],
        "virtual_stages": (editor.get("virtual_stages") or 1)
        if editor["schedule"] == "interleaved-1f1b"
        else 1,
        "num_microbatches": editor["num_microbatches"],
        "microbatch_size": editor.get("microbatch_size") or profile.microbatch_size,
        "optimizer": editor.get("optimizer", "adam"),
        "precision": profile.precision,
        "stages": stages,
        "policies": dict(editor.get("policies") or {}),
        "provenance": {"planner": editor.get("source", "manual"), "edited_in": "dashboard"},
    }


def build_plan(profile: Profile, editor: Editor, boundaries: list[int]) -> Plan:
    return parse_document(Plan, plan_document(profile, editor, boundaries), source="plan")


def editor_from_plan(
    editor: Editor, profile: Profile, plan: dict[str, Any], source: str
) -> tuple[Editor, list[int]]:
    """Load a plan (from a planner) into the editor: its shape, replicas, policies and cuts.

    Stages must be contiguous runs of the profile's layer order; the planners' plans are.
    """
    index = profile.layer_index
    boundaries = [min(index[name] for name in stage["layers"]) for stage in plan["stages"][1:]]
    policies = {
        name: policy for name, policy in plan.get("policies", {}).items() if policy != "keep"
    }
    loaded = {
        **editor,
        "schedule": plan["schedule"],
        "virtual_stages": plan.get("virtual_stages", 1),
        "num_microbatches": plan["num_microbatches"],
        "microbatch_size": plan["microbatch_size"],
        "optimizer": plan.get("optimizer", "adam"),
        "replicas": [stage.get("replicas", 1) for stage in plan["stages"]],
        "devices": (
            None
            if any(stage.get("devices") is None for stage in plan["stages"])
            else [stage["devices"] for stage in plan["stages"]]
        ),
        "policies": policies,
        "source": source,
        "plan_id": None,
        "plan_state": None,
    }
    return loaded, boundaries


def editor_cluster(editor: Editor, cluster: Cluster | None, plan: Plan) -> Cluster | None:
    """The cluster to simulate on: the chosen one, else free links with the given memory."""
    if cluster is not None:
        return cluster
    memory = editor.get("device_memory_bytes")
    if memory is None:
        return None
    num_devices = max(device for stage in plan.worker_devices() for device in stage) + 1
    return memory_only_cluster(num_devices, memory)


def predict(profile_id: int, profile: Profile, plan: Plan, cluster: Cluster | None) -> SimResult:
    """``simulate`` with its timeline, remembered for the last few plans.

    The prediction and the timeline of one edit are asked for at once; simulating under
    the lock makes the second wait for the first's result instead of simulating again.
    """
    key = json.dumps(
        [
            profile_id,
            plan.model_dump(mode="json"),
            None if cluster is None else cluster.model_dump(mode="json"),
        ],
        sort_keys=True,
    )
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        result = simulate(profile, plan, cluster)
        _cache[key] = result
        while len(_cache) > _KEEP:
            _cache.popitem(last=False)
    return result
