"""The dashboard's client of the backend's REST API (``/api/...``), over HTTP with httpx.

Every call returns the decoded JSON body. A refused call raises ``ApiError`` whose message
is the backend's own explanation (a 422 names the field and the reason), ready to show to a
person; a backend that cannot be reached raises it too, saying where it was looked for.
"""

from collections.abc import Callable
from typing import Any

import httpx

#: Seconds to wait for an answer; planners on big profiles may take a few seconds.
TIMEOUT_S = 60.0


class ApiError(ValueError):
    """The backend refused a call, or could not be reached; ``status`` is 0 for the latter."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def error_message(response: httpx.Response) -> str:
    """The backend's ``detail`` in words: a string, or one line per bad field of a 422."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and detail:
        lines = []
        for item in detail:
            loc = [str(part) for part in item.get("loc", []) if part != "body"]
            where = ".".join(loc)
            text = str(item.get("msg", ""))
            value = item.get("input")
            if (
                isinstance(value, (int, float, str))
                and not isinstance(value, bool)
                and len(str(value)) <= 80
                and str(value) not in text
            ):
                text += f" (got {value!r})"
            lines.append(f"{where}: {text}" if where else text)
        return "\n".join(lines)
    return f"the backend answered {response.status_code} {response.reason_phrase}"


class ApiClient:
    """Calls the backend at ``base_url``. Each call carries ``credential()`` (in the
    dashboard: the signed-in person's session token, ``signin.session_token``), else
    ``token`` (a script's, or a test's), else nothing."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        http: httpx.Client | None = None,
        credential: Callable[[], str | None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token, self.credential = token, credential
        self.http = http or httpx.Client(base_url=self.base_url, timeout=TIMEOUT_S)

    def _auth(self, token: str | None) -> dict[str, str]:
        token = token or (self.credential() if self.credential else None) or self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def request(self, method: str, path: str, *, token: str | None = None, **kwargs: Any) -> Any:
        """The decoded answer; ``token`` replaces the credential for this call."""
        headers = {**self._auth(token), **kwargs.pop("headers", {})}
        try:
            response = self.http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the backend at {self.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise ApiError(error_message(response), response.status_code)
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        query = {key: value for key, value in params.items() if value is not None}
        return self.request("GET", path, params=query)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {})

    # -- signing in --------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self.get("/api/health")

    def me(self, token: str | None) -> dict[str, Any]:
        """Who ``token`` signs in as (``user`` null for no token) and whether reads are
        public; ``ApiError`` 401 for a token that is not valid."""
        if token is None:
            return self.request("GET", "/api/auth/me", headers={"Authorization": ""})
        return self.request("GET", "/api/auth/me", token=token)

    def sign_in(self, user: str | None, password: str, client: str | None = None) -> dict[str, Any]:
        """A session; ``client`` is the address of the browser signing in (forwarded, so
        that the backend brakes each browser's failed attempts apart)."""
        headers = {"Authorization": "", **({"X-Forwarded-For": client} if client else {})}
        return self.request(
            "POST", "/api/auth/session", headers=headers, json={"user": user, "password": password}
        )

    def sign_out(self, token: str) -> None:
        self.request("DELETE", "/api/auth/session", token=token)

    # -- profiles ---------------------------------------------------------------------
    def profiles(self) -> list[dict[str, Any]]:
        return self.get("/api/profiles", limit=1000)["data"]

    def profile(self, profile_id: int) -> dict[str, Any]:
        return self.get(f"/api/profiles/{profile_id}")

    def create_profile(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.post("/api/profiles", body)

    def delete_profile(self, profile_id: int) -> None:
        self.request("DELETE", f"/api/profiles/{profile_id}")

    # -- clusters ---------------------------------------------------------------------
    def clusters(self) -> list[dict[str, Any]]:
        return self.get("/api/clusters", limit=1000)["data"]

    def cluster(self, cluster_id: int) -> dict[str, Any]:
        return self.get(f"/api/clusters/{cluster_id}")

    def create_cluster(self, document: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        return self.post("/api/clusters", {"name": name, "cluster": document})

    def replace_cluster(
        self, cluster_id: int, document: dict[str, Any], name: str | None = None
    ) -> dict[str, Any]:
        return self.request(
            "PUT", f"/api/clusters/{cluster_id}", json={"name": name, "cluster": document}
        )

    def delete_cluster(self, cluster_id: int) -> None:
        self.request("DELETE", f"/api/clusters/{cluster_id}")

    # -- plans ------------------------------------------------------------------------
    def plans(self) -> list[dict[str, Any]]:
        return self.get("/api/plans", limit=1000)["data"]

    def plan(self, plan_id: int) -> dict[str, Any]:
        return self.get(f"/api/plans/{plan_id}")

    def create_plan(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.post("/api/plans", body)

    def update_plan(self, plan_id: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", f"/api/plans/{plan_id}", json=body)

    def delete_plan(self, plan_id: int) -> None:
        self.request("DELETE", f"/api/plans/{plan_id}")

    def compare(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return self.post("/api/plans/compare", body)["rows"]

    # -- runs -------------------------------------------------------------------------
    def runs(self) -> list[dict[str, Any]]:
        return self.get("/api/runs", limit=1000)["data"]

    def run(self, run_id: int) -> dict[str, Any]:
        return self.get(f"/api/runs/{run_id}")

    def launch(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.post("/api/runs", body)

    def stop_run(self, run_id: int) -> dict[str, Any]:
        return self.post(f"/api/runs/{run_id}/stop")

    def metrics(
        self,
        run_id: int,
        kinds: list[str],
        *,
        start_ms: float | None = None,
        max_points: int = 5000,
    ) -> list[dict[str, Any]]:
        return self.get(
            f"/api/runs/{run_id}/metrics", kind=kinds, start_ms=start_ms, max_points=max_points
        )["data"]

    def calibrated_profile(self, run_id: int, window: int = 20) -> dict[str, Any]:
        return self.get(f"/api/runs/{run_id}/calibrated-profile", window=window)

    def events(self, run_id: int, after_id: int = 0) -> list[dict[str, Any]]:
        return self.get(f"/api/runs/{run_id}/events", after_id=after_id, limit=1000)["data"]

    def workers(self) -> list[dict[str, Any]]:
        return self.get("/api/workers")["data"]

    # -- proposals --------------------------------------------------------------------
    def proposals(self, run_id: int) -> list[dict[str, Any]]:
        return self.get("/api/proposals", run_id=run_id, limit=1000)["data"]

    def create_proposal(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.post("/api/proposals", body)

    def decide(self, proposal_id: int, approve: bool) -> dict[str, Any]:
        verb = "approve" if approve else "reject"
        return self.post(f"/api/proposals/{proposal_id}/{verb}", {"author": "dashboard"})
