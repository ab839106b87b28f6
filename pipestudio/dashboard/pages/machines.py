"""Workers and clusters page: the workers that registered (their host, devices, slots, state,
the run each is busy with and when it was last heard from), the stored clusters, and a form
that makes a cluster, so that nothing the Planner uses is hidden."""

from datetime import datetime
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from pipestudio.dashboard.api import ApiError
from pipestudio.dashboard.components.style import format_bytes
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.widgets import field, message, section, table
from pipestudio.planner import PlannerError, cluster_template
from pipestudio.planner.units import parse_size

PATH = "/machines"
NAME = "Workers & clusters"
WORKER_COLUMNS = ("name", "host", "devices", "slots", "state", "running", "last heard",
                  "models")
CLUSTER_COLUMNS = ("id", "name", "devices", "levels (size @ Gbit/s)", "memory per device",
                   "host link", "plans")
ACTIVE = ("starting", "running", "resuming")


def layout(**_: Any) -> html.Div:
    form = html.Div([
        field("Name", dcc.Input(id="machines-cluster-name", className="ps-input",
                                placeholder="e.g. 2 hosts x 4 GPUs")),
        field("Devices per level", dcc.Input(id="machines-sizes", className="ps-input",
                                             placeholder="4,2"),
              "innermost first: 4,2 is two groups of four"),
        field("Bandwidth per level (Gbit/s)", dcc.Input(
            id="machines-bandwidths", className="ps-input", placeholder="300,100")),
        field("Memory per device", dcc.Input(id="machines-memory", className="ps-input",
                                             placeholder="80GiB"), "empty: unlimited"),
        field("Host link (Gbit/s)", dcc.Input(id="machines-host", className="ps-input",
                                              placeholder="200"), "swap; empty: free"),
        html.Button("Create cluster", id="machines-create", className="ps-button"),
    ], className="ps-row")
    return html.Div([
        section("Workers", html.Div(id="machines-workers")),
        section("Clusters", html.Div(id="machines-clusters"), form,
                html.Div(id="machines-status")),
        dcc.Store(id="machines-changed", data=0),
        dcc.Interval(id="machines-interval", interval=5000),
    ])


def _ago(stamp: str | None, now: datetime) -> str:
    if not stamp:
        return "—"
    try:
        seen = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    if seen.tzinfo is None and now.tzinfo is not None:
        now = now.replace(tzinfo=None)
    seconds = max(0.0, (now - seen).total_seconds())
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def _devices(devices: list[dict[str, Any]]) -> str:
    parts = []
    for device in devices:
        kind = device.get("kind", "?")
        if kind == "cpu":
            parts.append(f"cpu ({device.get('cores', '?')} cores)")
        else:
            memory = device.get("memory_bytes")
            parts.append(f"{kind}:{device.get('index', 0)} {device.get('name', '')}".strip()
                         + (f" ({format_bytes(memory)})" if isinstance(memory, int) else ""))
    return ", ".join(parts) or "—"


def worker_rows(workers: list[dict[str, Any]], runs: list[dict[str, Any]],
                now: datetime) -> list[dict[str, str]]:
    """One row per worker: what it offers, and the active runs it holds ranks of."""
    busy: dict[str, list[int]] = {}
    for run in runs:
        if run["state"] in ACTIVE:
            for rank in run.get("ranks") or []:
                busy.setdefault(rank["worker_id"], []).append(run["id"])
    return [{"name": w["name"], "host": w["host"], "devices": _devices(w.get("devices") or []),
             "slots": str(w["slots"]), "state": w["state"],
             "running": ", ".join(f"run {r}" for r in sorted(set(busy.get(w["id"], []))))
             or "—", "last heard": _ago(w.get("last_seen_at"), now),
             "models": ", ".join([*w.get("builtin_models", []),
                                  *w.get("allowed_models", [])]) or "—"}
            for w in sorted(workers, key=lambda w: w["name"])]


def cluster_rows(clusters: list[dict[str, Any]], plans: list[dict[str, Any]]
                 ) -> list[dict[str, str]]:
    used: dict[int, list[int]] = {}
    for plan in plans:
        if plan.get("cluster_id") is not None:
            used.setdefault(plan["cluster_id"], []).append(plan["id"])
    rows = []
    for cluster in sorted(clusters, key=lambda c: c["id"]):
        document = cluster["document"]
        devices = document["devices"]
        memories = {d.get("memory_bytes") for d in devices}
        links = {d.get("host_to_device_gbps") for d in devices}
        rows.append({
            "id": str(cluster["id"]), "name": cluster["name"], "devices": str(len(devices)),
            "levels (size @ Gbit/s)": " · ".join(
                f"{level['size']} @ {level['bandwidth_gbps'] or 'free'}"
                for level in document["levels"]),
            "memory per device": ("unlimited" if memories == {None} else ", ".join(
                sorted(format_bytes(m) for m in memories if m is not None))),
            "host link": ("free" if links == {None} else ", ".join(
                f"{g:g} Gbit/s" for g in sorted(g for g in links if g is not None))),
            "plans": ", ".join(f"plan {p}" for p in sorted(used.get(cluster["id"], [])))
            or "—"})
    return rows


def _numbers(text: str | None, what: str, kind: type) -> list[Any]:
    try:
        return [kind(part) for part in (text or "").replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a comma-separated list of numbers") from None


def create_cluster(context: Context, name: str | None, sizes: str | None,
                   bandwidths: str | None, memory: str | None, host: str | None) -> Any:
    """Make and store a cluster from the form (``planner.cluster_template``)."""
    try:
        levels = _numbers(sizes, "devices per level", int)
        gbps = _numbers(bandwidths, "bandwidth per level", float)
        if not levels:
            raise ValueError("devices per level: give at least one level, e.g. 4")
        if len(gbps) != len(levels):
            raise ValueError(f"give one bandwidth per level: {len(levels)} level(s), "
                             f"{len(gbps)} bandwidth(s)")
        host_gbps = _numbers(host, "host link", float)
        document = cluster_template(
            levels, list(gbps), device_memory_bytes=parse_size(memory) if memory else None,
            host_bandwidth_gbps=host_gbps[0] if host_gbps else None,
            name=(name or "cluster").strip() or "cluster")
        created = context.client.create_cluster(document.model_dump(mode="json"),
                                                (name or "").strip() or None)
    except (ValueError, PlannerError, ApiError) as exc:
        return message(f"Not created:\n{exc}", "error"), False
    return message(f"Created cluster {created['id']} ({created['num_devices']} devices); "
                   "pick it on the Planner page.", "ok"), True


def register_callbacks(app: Dash, context: Context) -> None:
    @app.callback(Output("machines-workers", "children"),
                  Output("machines-clusters", "children"),
                  Input("url", "pathname"), Input("machines-interval", "n_intervals"),
                  Input("machines-changed", "data"))
    def _list(_: str, __: int | None, ___: int) -> Any:
        try:
            workers, runs = context.client.workers(), context.client.runs()
            clusters, plans = context.client.clusters(), context.client.plans()
        except ApiError as exc:
            notice = message(f"Cannot read them: {exc}", "error")
            return notice, notice
        now = datetime.now().astimezone()
        return (table(WORKER_COLUMNS, worker_rows(workers, runs, now),
                      "No worker has registered: start one with `pipestudio worker "
                      "--server URL`.", "machines-workers-table"),
                table(CLUSTER_COLUMNS, cluster_rows(clusters, plans),
                      "No clusters yet: make one below.", "machines-clusters-table"))

    @app.callback(Output("machines-status", "children"),
                  Output("machines-changed", "data", allow_duplicate=True),
                  Input("machines-create", "n_clicks"), State("machines-cluster-name", "value"),
                  State("machines-sizes", "value"), State("machines-bandwidths", "value"),
                  State("machines-memory", "value"), State("machines-host", "value"),
                  State("machines-changed", "data"), prevent_initial_call=True)
    def _create(_: int, name: str | None, sizes: str | None, bandwidths: str | None,
                memory: str | None, host: str | None, changed: int) -> Any:
        notice, made = create_cluster(context, name, sizes, bandwidths, memory, host)
        return notice, (changed + 1) if made else no_update
