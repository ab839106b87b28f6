"""What ranks tell each other travels as JSON (runtime/engine/exchange.py): a peer that
sends a pickle which would run code gets a refusal, not a shell."""

import multiprocessing as mp
import os
import pickle
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipestudio.runtime.engine import exchange


class _Payload:
    """What an attacker's peer sends: unpickling it would create ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def _rank(rank: int, port: int, evil: str | None, results: Any) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30)
    )
    if evil is not None and rank == 1:
        raw = bytearray(pickle.dumps(_Payload(evil)))
        exchange._encoded = lambda _value: torch.frombuffer(raw, dtype=torch.uint8)
    try:
        gathered = exchange.all_gather_json({"rank": rank, "loss": float("nan")})
        reports = exchange.gather_json([rank, "x" * 1000 * rank], dst=0)
        results.put((rank, "ok", gathered, reports))
    except ValueError as exc:
        results.put((rank, "refused", type(exc).__name__, None))
    dist.destroy_process_group()


def _run(evil: str | None) -> dict[int, tuple[Any, ...]]:
    context = mp.get_context("spawn")
    with torch.multiprocessing.get_context("spawn").Manager() as manager:
        results = manager.Queue()
        probe = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
        port = probe.port
        del probe
        processes = [
            context.Process(target=_rank, args=(rank, port, evil, results)) for rank in range(2)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
        return {item[0]: item for item in (results.get(timeout=5) for _ in range(2))}


def test_ranks_exchange_json_in_rank_order() -> None:
    got = _run(None)
    _, state, gathered, reports = got[0]
    assert state == "ok" and [g["rank"] for g in gathered] == [0, 1]
    assert str(gathered[1]["loss"]) == "nan"
    assert reports == [[0, ""], [1, "x" * 1000]]
    assert got[1][3] is None, "only the destination gathers"


def test_a_pickle_from_a_peer_is_refused_not_run(tmp_path: Path) -> None:
    touched = tmp_path / "pwned"
    got = _run(str(touched))
    assert got[0][1] == "refused", got
    assert not touched.exists(), "a peer's pickle ran in rank 0"
