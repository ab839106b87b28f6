"""What the pages' callbacks share: the API client and the documents already fetched.

Profiles and clusters never change once stored (the API has no route that edits them), so
each is fetched once per dashboard process and parsed once; a drag then simulates without
asking the backend anything.
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pipestudio.dashboard.api import ApiClient
from pipestudio.planner import Cluster, Profile
from pipestudio.planner.formats.documents import parse_document

_KEEP = 16


@dataclass
class Context:
    client: ApiClient
    _documents: OrderedDict[tuple[str, int], Any] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _cached(self, key: tuple[str, int]) -> Any:
        with self._lock:
            if key in self._documents:
                self._documents.move_to_end(key)
                return self._documents[key]
        return None

    def _keep(self, key: tuple[str, int], value: Any) -> Any:
        with self._lock:
            self._documents[key] = value
            while len(self._documents) > _KEEP:
                self._documents.popitem(last=False)
        return value

    def profile(self, profile_id: int) -> Profile:
        key = ("profile", int(profile_id))
        found = self._cached(key)
        if found is None:
            document = self.client.profile(profile_id)["document"]
            found = self._keep(key, parse_document(Profile, document, source="profile"))
        return found

    def cluster(self, cluster_id: int) -> Cluster:
        key = ("cluster", int(cluster_id))
        found = self._cached(key)
        if found is None:
            document = self.client.cluster(cluster_id)["document"]
            found = self._keep(key, parse_document(Cluster, document, source="cluster"))
        return found


def serving_context() -> "Context | None":
    """The context of the dashboard serving this request (a page's layout drawn for a
    browser); None outside a request (Dash checks the layouts when it starts)."""
    import flask

    if not flask.has_request_context():
        return None
    found = flask.current_app.config.get("PIPESTUDIO_CONTEXT")
    return found if isinstance(found, Context) else None
