"""Live migration changes nothing a run computes: same parameters, same ranks, every step once.

Each case moves layers at two steps, in both directions and at several boundaries,
including stages' first and last layers. Synchronous schedules and ``pipedream`` with
vertical sync must end exactly where the run without migration ends. Plain ``pipedream``
gives a moved layer the staleness of the stage that runs it (the upstream one of its two
stages until the new stage's count includes its own updates), so it is held to a
sequential emulation of weight stashing with per-micro-batch partitions (written here,
apart from the engine), which without migrations equals the engine's reference
(``reference.py``).
"""

import json
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from pipestudio.planner import Plan
from pipestudio.planner.simulator.schedule import BACKWARD, worker_order
from pipestudio.runtime.engine import EngineConfig, launch
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.execution.weights import WeightVersions
from pipestudio.runtime.engine.migration.settings import (
    MigrationSettings,
    ScriptedMigration,
    new_plan,
)
from pipestudio.runtime.engine.migration.switch import forward_versions, needed_versions
from pipestudio.runtime.engine.migration.wire import (
    WEIGHTS_SLOT,
    Channel,
    Outgoing,
    _digest,
    header_of,
    layer_weights,
    message_from,
    message_tag_of,
    weight_layout,
)
from pipestudio.runtime.models import DATA, MODELS, ModelSpec
from pipestudio.runtime.optimizers import make_optimizer
from tests.runtime.engine.helpers import final_params, make_plan, max_relative_difference
from tests.runtime.engine.reference import BF16_TOLERANCE, train_pipedream, train_single

STEPS = 6
MODEL_ARGS = {"layers": 6, "width": 16, "in_features": 8, "out_features": 4}
NAMES = [f"block{i}" for i in range(6)] + ["head"]
#: stages, then two migrations (step, moves): each moves a stage's first or last layer,
#: one boundary upstream and another downstream.
CASES: dict[int, tuple[list[list[str]], list[tuple[int, tuple[tuple[str, int], ...]]]]] = {
    3: (
        [NAMES[0:2], NAMES[2:5], NAMES[5:7]],
        [(2, (("block1", 1), ("block4", 2))), (4, (("block1", 0), ("block3", 2)))],
    ),
    4: (
        [NAMES[0:2], NAMES[2:4], NAMES[4:6], NAMES[6:7]],
        [(2, (("block2", 0), ("block5", 3))), (4, (("block1", 1), ("block2", 1), ("block5", 2)))],
    ),
}


def build() -> ModelSpec:
    return MODELS["mlp"](**MODEL_ARGS)


def _run(
    plan: Plan,
    folder: Path,
    migrations: list[ScriptedMigration] | None,
    events: list[dict[str, Any]],
) -> None:
    repartition = MigrationSettings(migrations=migrations) if migrations else None
    config = EngineConfig(
        plan=plan,
        model="mlp",
        steps=STEPS,
        threads_per_rank=1,
        model_args={k: str(v) for k, v in MODEL_ARGS.items()},
        checkpoint_dir=str(folder),
        timeout_s=20.0,
        migration=repartition,
    )
    result = launch(config, events.append, start_method="forkserver")
    assert result.ok, result.message


def _plans(
    plan: Plan, migrations: list[tuple[int, tuple[tuple[str, int], ...]]]
) -> list[tuple[int, Plan]]:
    """(first step, plan) of each partition of the run."""
    result = [(0, plan)]
    for step, moves in migrations:
        result.append((step, new_plan(result[-1][1], moves, NAMES)))
    return result


@pytest.mark.parametrize("num_stages", [3, 4])
@pytest.mark.parametrize(
    "schedule,vertical_sync,optimizer",
    [
        ("gpipe", False, "adam"),
        ("1f1b", False, "adam"),
        ("pipedream", True, "adam"),
        ("pipedream", False, "adam"),
        ("1f1b", False, "momentum"),
        ("pipedream", True, "momentum"),
    ],
)
def test_migrations_change_nothing(
    num_stages: int, schedule: str, vertical_sync: bool, optimizer: str, tmp_path: Path
) -> None:
    stages, moves = CASES[num_stages]
    plan = make_plan("mlp", stages, schedule, vertical_sync=vertical_sync, optimizer=optimizer)
    scripted = [ScriptedMigration(step, m) for step, m in moves]
    migrated: list[dict[str, Any]] = []
    _run(plan, tmp_path / "migrated", scripted, migrated)
    partitions = _plans(plan, moves)
    got = final_params(tmp_path / "migrated", partitions[-1][1], NAMES)

    # Every step ran once on every stage, by the same processes throughout.
    done = [(e["stage"], e["step"]) for e in migrated if e["type"] == "step"]
    assert sorted(done) == sorted((s, t) for s in range(num_stages) for t in range(STEPS))
    assert len({e["rank"] for e in migrated if e["type"] == "start"}) == num_stages
    scheduled = [e for e in migrated if e["type"] == "migration" and e["phase"] == "scheduled"]
    assert [e["step"] for e in scheduled] == [step for step, _ in moves]
    finished = [e for e in migrated if e["type"] == "migration" and e["phase"] == "done"]
    moved = {name for _, m in moves for name, _ in m}
    assert {n for e in finished for n in e["layers_in"]} == moved
    assert all(e["received_bytes"] > 0 for e in finished if e["layers_in"])
    summary = next(e for e in migrated if e["type"] == "summary")
    assert [s["layers"] for s in summary["stages"]] == [s.layers for s in partitions[-1][1].stages]

    if schedule == "pipedream" and not vertical_sync:
        expected = emulate_pipedream(build, partitions, plan, STEPS * plan.num_microbatches)
    else:
        baseline: list[dict[str, Any]] = []
        _run(plan, tmp_path / "plain", None, baseline)
        expected = final_params(tmp_path / "plain", plan, NAMES)
    assert max_relative_difference(got, expected) <= 1e-6
    if schedule == "pipedream" and not vertical_sync:
        unmigrated = emulate_pipedream(build, [(0, plan)], plan, STEPS * plan.num_microbatches)
        assert max_relative_difference(got, unmigrated) > 1e-6  # staleness did change


@pytest.mark.parametrize("schedule,vertical_sync", [("1f1b", False), ("pipedream", True)])
def test_bf16_runs_that_migrate_equal_the_autocast_reference(
    schedule: str, vertical_sync: bool, tmp_path: Path
) -> None:
    """Under bf16 autocast, a run that migrates layers twice (with a swapped and a
    recomputed layer among those moved) ends where the single-process reference does
    (plain training for 1f1b, weight stashing with vertical sync for pipedream), to
    ``reference.BF16_TOLERANCE``."""
    stages, moves = CASES[3]
    plan = make_plan(
        "mlp",
        stages,
        schedule,
        vertical_sync=vertical_sync,
        policies={"block1": "swap", "block4": "recompute"},
        precision="bf16",
    )
    events: list[dict[str, Any]] = []
    _run(plan, tmp_path, [ScriptedMigration(step, m) for step, m in moves], events)
    assert len([e for e in events if e["type"] == "migration" and e["phase"] == "done"]) > 0
    got = final_params(tmp_path, _plans(plan, moves)[-1][1], NAMES)
    reference = train_single if schedule == "1f1b" else train_pipedream
    assert max_relative_difference(got, reference(build, plan, STEPS)) <= BF16_TOLERANCE
    in_fp32 = reference(build, plan.model_copy(update={"precision": "fp32"}), STEPS)
    assert max_relative_difference(got, in_fp32) > 100 * BF16_TOLERANCE  # bf16 did run


def _forward_versions(plan: Plan, stage_idx: int, num_mb: int) -> dict[int, int]:
    """Micro-batches whose gradients stage ``stage_idx`` applied before each forward."""
    applied, result = 0, {}
    for kind, mb in worker_order("pipedream", list(range(num_mb)), plan.warmup_forwards(stage_idx)):
        if kind == BACKWARD:
            applied += 1
        else:
            result[mb] = applied
    return result


def _stage_of(plan: Plan) -> dict[str, int]:
    return {name: i for i, stage in enumerate(plan.stages) for name in stage.layers}


def emulate_pipedream(
    build_spec: Any, partitions: list[tuple[int, Plan]], plan: Plan, num_mb: int
) -> dict[str, Tensor]:
    """Weight stashing, one micro-batch at a time: micro-batch ``mb`` runs each layer on that
    layer's parameters after the gradients of the first ``V`` micro-batches, ``V`` counted
    on the stage that runs the layer for ``mb`` (stage 0's count with vertical sync), but
    for a layer that moved at the switch ``M`` of ``mb``'s partition, while that count is at
    most ``M``, the smaller of it and the count of the stage it came from."""
    spec = build_spec()
    versions = [_forward_versions(plan, s, num_mb) for s in range(plan.num_stages)]
    history = {
        name: [{k: v.detach().clone() for k, v in module.named_parameters()}]
        for name, module in spec.layers
    }
    optimizers = {
        name: make_optimizer(plan.optimizer, list(module.parameters()))
        for name, module in spec.layers
    }
    inputs = spec.graph_inputs()
    for mb in range(num_mb):
        index = max(
            i for i, (first, _) in enumerate(partitions) if first * plan.num_microbatches <= mb
        )
        switch_mb = partitions[index][0] * plan.num_microbatches
        stage_of = _stage_of(partitions[index][1])
        before = _stage_of(partitions[max(index - 1, 0)][1])
        weights: dict[str, dict[str, Tensor]] = {}
        for name, _ in spec.layers:
            stage_idx = 0 if plan.vertical_sync else stage_of[name]
            version = versions[stage_idx][mb]
            if not plan.vertical_sync and before[name] != stage_idx and version <= switch_mb:
                version = min(version, versions[before[name]][mb])
            weights[name] = {
                k: v.clone().requires_grad_(True) for k, v in history[name][version].items()
            }
        data, targets = spec.sample(plan.microbatch_size, mb)
        acts: dict[str, Tensor] = {DATA: data}
        for name, module in spec.layers:
            acts[name] = torch.func.functional_call(
                module, weights[name], tuple(acts[s] for s in inputs[name])
            )
        loss = spec.loss(acts[NAMES[-1]], targets) / plan.num_microbatches
        loss.backward()
        for name, module in spec.layers:
            for key, param in module.named_parameters():
                param.grad = weights[name][key].grad
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            history[name].append({k: v.detach().clone() for k, v in module.named_parameters()})
    return {
        f"{name}.{k}": v.detach()
        for name, module in spec.layers
        for k, v in module.named_parameters()
    }


def test_a_moved_layer_first_runs_on_the_upstream_stages_version() -> None:
    """For the micro-batches whose version on the new stage would still be made of the old
    stage's updates only, a moved layer runs on the version of the upstream one of its two
    stages, whichever way it moves: moving downstream, the version its old stage made
    before its own forward of the micro-batch, never one the old stage makes after a
    backward that waits for the new stage's gradient."""
    plan = make_plan("mlp", CASES[4][0], "pipedream")
    step = 3
    switch = step * plan.num_microbatches
    for upstream in range(plan.num_stages - 1):
        made = forward_versions(plan, upstream, 0, STEPS)
        behind = plan.num_stages - 1 - upstream  # micro-batches the pair's versions differ
        expected = {mb: made[mb] for mb in range(switch, switch + behind)}
        assert all(version < switch for version in expected.values())
        for old, new in ((upstream, upstream + 1), (upstream + 1, upstream)):
            assert needed_versions(plan, old, new, step, 0, STEPS, 0) == expected
    # into the last stage: its own count at the switch is the hand-off's version, which the
    # old stage makes only after its backward of the micro-batch before the switch
    last, before_last = (forward_versions(plan, s, 0, STEPS) for s in (3, 2))
    assert last[switch] == switch
    assert needed_versions(plan, 2, 3, step, 0, STEPS, 0) == {switch: before_last[switch]}
    for schedule in ("gpipe", "1f1b"):
        assert (
            needed_versions(make_plan("mlp", CASES[4][0], schedule), 1, 2, step, 0, STEPS, 0) == {}
        )


def test_a_forward_runs_a_layer_from_upstream_on_its_older_version() -> None:
    """The stage's own version is snapshotted without waiting for the moved layer, whose
    older version is fetched for that forward alone and kept for its backward."""
    live = {"a.w": torch.nn.Parameter(torch.zeros(2)), "b.w": torch.nn.Parameter(torch.ones(2))}
    older = {"b.w": torch.full((2,), 7.0)}
    snapshots: list[tuple[int, set[str]]] = []
    fetched: list[tuple[int, list[str]]] = []

    def fetch(version: int, names: list[str]) -> dict[str, Tensor]:
        fetched.append((version, names))
        return {name: older[name] for name in names}

    versions = WeightVersions(
        live,
        1,
        5,
        [5, 6],
        None,
        on_snapshot=lambda v, skip: snapshots.append((v, set(skip))),
        fetch=fetch,
        older=lambda mb, v: {"b": 4} if mb == 5 else {},
    )
    weights = versions.for_forward(5, ["a.w", "b.w"])
    assert snapshots == [(5, {"b"})] and fetched == [(4, ["b.w"])]
    assert torch.equal(weights["b.w"], older["b.w"]) and torch.equal(weights["a.w"], live["a.w"])
    assert versions.for_backward(5) is weights
    assert torch.equal(versions.stashes[5]["b.w"], live["b.w"])  # the stage's own version
    versions.release(5)
    assert not versions.own


def test_emulation_without_migration_equals_the_reference() -> None:
    plan = make_plan("mlp", CASES[3][0], "pipedream")
    got = emulate_pipedream(build, [(0, plan)], plan, 3 * plan.num_microbatches)
    assert max_relative_difference(got, train_pipedream(partial(build), plan, 3)) <= 1e-6


def _pieces_back(header: dict[str, Any], pieces: list[Tensor]) -> dict[str, Any]:
    """What a receiver assembles from the tensor pieces (the receives ``Channel`` posts)."""
    tensors, given = [], iter(pieces)
    for entry in header["tensors"]:
        target = torch.empty(entry["shape"], dtype=getattr(torch, entry["dtype"]))
        if target.numel():
            target.view(-1).copy_(next(given))
        tensors.append(target)
    return message_from(header, tensors)


def _same(a: Any, b: Any) -> None:
    if torch.is_tensor(a):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    else:
        assert a == b


def test_messages_go_raw_and_come_back_equal() -> None:
    weight, bias = torch.randn(5, 3), torch.randn(5)
    message = {
        "block0": {
            "params": {"weight": weight.t(), "bias": bias},
            "buffers": {"count": torch.tensor(7), "none": torch.empty(0)},
            "grads": {},
            "optimizer": {
                "weight": {
                    "step": torch.tensor(3.0),
                    "exp_avg": torch.randn(3, 5, dtype=torch.half),
                    "momentum_buffer": None,
                }
            },
        },
        "head": {},
    }
    sent = {
        **message,
        "block0": {
            **message["block0"],
            "params": {"weight": weight.t().clone(), "bias": bias.clone()},
        },
    }
    version = Outgoing(message, frozen=False)
    pieces = version.pieces(described=True, announce=None)
    weight.add_(1.0)  # the sender trains on: a version keeps what it was when sent
    bias.add_(1.0)
    header = json.loads(bytes(pieces[0].numpy()).decode())
    _same(_pieces_back(header, pieces[1:]), sent)
    # tensors go as their own bytes, with no pickling and nothing packed around them
    assert [p.numel() * p.element_size() for p in pieces[1:]] == [15 * 4, 5 * 4, 8, 4, 15 * 2]
    assert header["num_bytes"] == 15 * 4 + 5 * 4 + 8 + 4 + 15 * 2
    # a hand-off's tensors are sent in place; a non-contiguous one goes as a copy
    hand_off = Outgoing(message, frozen=True).pieces(described=True, announce=None)
    assert hand_off[2].data_ptr() == bias.data_ptr()
    assert hand_off[1].data_ptr() != weight.data_ptr() and hand_off[1].is_contiguous()
    assert pieces[2].data_ptr() != bias.data_ptr()


def test_leads_carry_what_the_receiver_needs_to_post_and_check() -> None:
    weights = {
        "block0": {"params": {"weight": torch.randn(4, 3), "bias": torch.randn(4)}, "buffers": {}}
    }
    training = {
        "block0": {
            "grads": {"bias": torch.randn(4)},
            "optimizer": {"bias": {"step": torch.tensor(2.0), "exp_avg": torch.randn(4)}},
        }
    }
    state = Outgoing(training, frozen=True)
    # a known layout: the receiver derives the header from its own copy of the layer
    copy = {
        "block0": {"params": {"weight": torch.zeros(4, 3), "bias": torch.zeros(4)}, "buffers": {}}
    }
    header = header_of(copy)
    pieces = Outgoing(weights, frozen=True).pieces(described=False, announce=state)
    assert pieces[0].numel() * pieces[0].element_size() == 64
    digest, header_bytes = pieces[0][:2].tolist()
    assert digest == _digest(json.dumps(header).encode())
    assert header_bytes == len(state.text)
    _same(_pieces_back(header, pieces[1:]), weights)
    # a described message leads with its header, the size the weights announced
    pieces = state.pieces(described=True, announce=None)
    assert pieces[0].numel() == header_bytes
    got = _pieces_back(json.loads(bytes(pieces[0].numpy()).decode()), pieces[1:])
    _same(got, training)


def test_weights_land_in_the_parameters_and_buffers_in_new_tensors() -> None:
    """Parameters are received in place; a buffer is not, since a pipedream forward on an
    older version may update the module's own (batch norm statistics) meanwhile."""
    modules = {"block": torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))}
    header, targets = weight_layout(modules)
    assert header == header_of(layer_weights(modules))
    params = dict(modules["block"].named_parameters())
    for entry, target in zip(header["tensors"], targets, strict=True):
        group, name = entry["path"][1:]
        if group == "params":
            assert target is not None and target.data_ptr() == params[name].data_ptr()
        else:
            assert target is None
    assert sum(target is None for target in targets) == 3


class _Watch:
    def doing(self, what: str, waiting_on: int | None = None) -> None:
        pass

    def failure(self, what: str, peer: int | None, exc: Exception) -> Exception:
        return exc


def _mismatch_rank(rank: int, init: str, answers: Any) -> None:
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=20)
    )
    torch.set_num_threads(1)
    channel = Channel(rank, 20.0, _Watch())  # type: ignore[arg-type]
    try:
        if rank == 0:
            channel.send(
                Outgoing({"w": torch.ones(4, 3)}, frozen=True), 1, message_tag_of(1, WEIGHTS_SLOT)
            )
            channel.drain()
        else:  # same bytes, another shape: the digest tells them apart
            channel.expect(0, message_tag_of(1, WEIGHTS_SLOT), header_of({"w": torch.ones(3, 4)}))
            try:
                channel.receive(0, message_tag_of(1, WEIGHTS_SLOT), "receiving layers ['w']")
                answers.put("no error")
            except EngineError as exc:
                answers.put(str(exc))
    finally:
        dist.destroy_process_group()


def test_a_layout_that_differs_from_the_senders_is_refused(tmp_path: Path) -> None:
    context = mp.get_context("spawn")
    answers = context.Queue()
    init = f"file://{tmp_path / 'store'}"
    ranks = [
        context.Process(target=_mismatch_rank, args=(rank, init, answers)) for rank in range(2)
    ]
    for process in ranks:
        process.start()
    answer = answers.get(timeout=60)
    for process in ranks:
        process.join(timeout=30)
    assert "receiving layers ['w']: the sender's layout" in answer
    assert all(process.exitcode == 0 for process in ranks)


LARGE_WIDTH = 4096


def hand_on_large_layers(
    schedule: str, folder: Path, device: str = "cpu"
) -> tuple[dict[tuple[int, int], dict[str, Any]], int]:
    """Stage 0 hands ``block1`` and ``block2`` (4096 x 4096 weights) to stage 1 at step 5
    of 9: each stage's ``memory`` event by (stage, step), and the bytes of one moved
    weight. SGD with momentum (one buffer per weight, updated in place), so memory moves by
    whole buffers and not by an optimizer's temporaries."""
    args = {"layers": "3", "width": str(LARGE_WIDTH), "in_features": "8", "out_features": "4"}
    plan = make_plan(
        "mlp", [["block0", "block1", "block2"], ["head"]], schedule, optimizer="momentum"
    )
    migration = ScriptedMigration(5, (("block1", 1), ("block2", 1)))
    events: list[dict[str, Any]] = []
    config = EngineConfig(
        plan=plan,
        model="mlp",
        steps=9,
        threads_per_rank=1,
        model_args=args,
        checkpoint_dir=str(folder),
        timeout_s=60.0,
        migration=MigrationSettings(migrations=[migration]),
        device=device,
    )
    result = launch(
        config, events.append, start_method="forkserver" if device == "cpu" else "spawn"
    )
    assert result.ok, result.message
    memory = {(e["stage"], e["step"]): e for e in events if e["type"] == "memory"}
    return memory, LARGE_WIDTH * LARGE_WIDTH * 4


@pytest.mark.parametrize("schedule", ["1f1b", "pipedream"])
def test_a_stage_lets_go_of_the_layers_it_hands_on(schedule: str, tmp_path: Path) -> None:
    """A stage that hands layers on frees their optimizer state once the new stage has it,
    so a migration relieves a stage that runs short of memory (on a GPU the parameters go
    too: ``test_gpu.py``). Every rank keeps a copy of every layer's parameters in host
    memory (docs/runtime.md), so on CPU those stay."""
    memory, weight_bytes = hand_on_large_layers(schedule, tmp_path)
    rss = {key: e["rss_bytes"] for key, e in memory.items()}
    state = 2 * weight_bytes  # the two moved weights' momentum buffers
    # step 1: before anything of the migration is sent (under pipedream the hand-off
    # reaches the downstream stage during step 4)
    assert rss[(0, 1)] - rss[(0, 8)] >= 0.8 * state  # the old stage let go of them
    assert rss[(1, 8)] - rss[(1, 1)] >= 0.8 * state  # the new one holds them
