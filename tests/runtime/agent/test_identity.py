"""A worker keeps its id and secret across restarts (runtime/agent/identity.py)."""

import stat
from pathlib import Path

from pipestudio.runtime.agent.identity import Identity, default_state_dir


def test_the_identity_outlives_the_process(tmp_path: Path) -> None:
    first = Identity(tmp_path / "state", "gpu node/1", "http://a:8000")
    assert (first.worker_id, first.secret) == (None, None)
    first.keep("w123", "s3cret")
    path = tmp_path / "state" / "worker-gpu_node_1.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, "the secret is the worker's alone"
    again = Identity(tmp_path / "state", "gpu node/1", "http://a:8000")
    assert (again.worker_id, again.secret) == ("w123", "s3cret")
    other_server = Identity(tmp_path / "state", "gpu node/1", "http://b:8000")
    assert other_server.worker_id is None
    other_server.keep("w9", "x")
    assert Identity(tmp_path / "state", "gpu node/1", "http://a:8000").worker_id == "w123"


def test_an_unwritable_or_broken_state_costs_only_the_persistence(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    identity = Identity(blocked, "w", "http://a")
    identity.keep("w1", "s")  # cannot write under a file: kept in memory, no error
    assert identity.worker_id == "w1"
    (tmp_path / "worker-w.json").write_text("{broken")
    assert Identity(tmp_path, "w", "http://a").worker_id is None


def test_the_default_directory_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIPESTUDIO_WORKER_STATE_DIR", str(tmp_path / "x"))
    assert default_state_dir() == tmp_path / "x"
    monkeypatch.delenv("PIPESTUDIO_WORKER_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "pipestudio"
