"""Who a worker is to its backend, kept across restarts: the id and secret of its last
``welcome``, in ``STATE_DIR/worker-NAME.json`` by server.

A restarted worker says them in its first ``hello`` and keeps its id; without the secret
nobody can take that id over (``backend/services/workers.py``). The file is written with
mode 0600; a directory that cannot be written costs only the persistence (a restart then
registers a new worker, and the old record leaves the lists after the retention period).
"""

import json
import logging
import os
import re
from pathlib import Path

log = logging.getLogger("pipestudio.worker")


def default_state_dir() -> Path:
    """``PIPESTUDIO_WORKER_STATE_DIR``, else ``$XDG_STATE_HOME/pipestudio``, else
    ``~/.local/state/pipestudio``."""
    chosen = os.environ.get("PIPESTUDIO_WORKER_STATE_DIR")
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "pipestudio"


class Identity:
    """The worker ``name``'s id and secret at the backend ``server``, read and kept in
    ``state_dir`` (None: in memory only)."""

    def __init__(self, state_dir: Path | None, name: str, server: str) -> None:
        self.server = server
        self.path = (
            None
            if state_dir is None
            else state_dir / f"worker-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.json"
        )
        known = self._read().get(server, {})
        self.worker_id: str | None = known.get("worker_id")
        self.secret: str | None = known.get("secret")

    def _read(self) -> dict[str, dict[str, str]]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            found = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s (%s); registering as a new worker", self.path, exc)
            return {}
        return found if isinstance(found, dict) else {}

    def keep(self, worker_id: str, secret: str | None) -> None:
        """Remember what a ``welcome`` gave (written only when it changed)."""
        if (worker_id, secret) == (self.worker_id, self.secret):
            return
        self.worker_id, self.secret = worker_id, secret
        if self.path is None:
            return
        every = {**self._read(), self.server: {"worker_id": worker_id, "secret": secret}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
                json.dump(every, out)
            tmp.replace(self.path)
        except OSError as exc:
            log.warning(
                "cannot keep this worker's identity in %s (%s): a restart will "
                "register a new worker",
                self.path,
                exc,
            )
