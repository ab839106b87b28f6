"""Workers and clusters page: the workers that registered (their host, devices, slots, state,
the run each is busy with and when it was last heard from), the stored clusters, and a form
that makes a cluster or edits one (picked from the list: its levels, bandwidths, memory and
host link fill the form; saved in place unless a plan uses it, or as a new cluster), so
that nothing the Planner uses is hidden."""

from datetime import datetime
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from pipestudio.dashboard.api import ApiError
from pipestudio.dashboard.components.style import format_bytes
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.widgets import bump, field, message, section, table
from pipestudio.planner import PlannerError, cluster_template
from pipestudio.planner.units import parse_size

PATH = "/machines"
NAME = "Workers & clusters"
WORKER_COLUMNS = ("name", "host", "devices", "slots", "state", "running", "last heard", "models")
CLUSTER_COLUMNS = (
    "id",
    "name",
    "devices",
    "levels (size @ Gbit/s)",
    "memory per device",
    "host link",
    "plans",
)
ACTIVE = ("starting", "running", "resuming")


def layout(**_: Any) -> html.Div:
    pick = html.Div(
        [
            field(
                "Edit a cluster",
                dcc.Dropdown(
                    id="machines-cluster-pick",
                    clearable=True,
                    placeholder="none: the form makes a new one",
                    style={"minWidth": "18rem"},
                ),
            ),
            html.Button("Save changes", id="machines-save", className="ps-button"),
            html.Button("Delete cluster", id="machines-delete", className="ps-button ps-secondary"),
        ],
        className="ps-row",
    )
    form = html.Div(
        [
            field(
                "Name",
                dcc.Input(
                    id="machines-cluster-name",
                    className="ps-input",
                    placeholder="e.g. 2 hosts x 4 GPUs",
                ),
            ),
            field(
                "Devices per level",
                dcc.Input(id="machines-sizes", className="ps-input", placeholder="4,2"),
                "innermost first: 4,2 is two groups of four",
            ),
            field(
                "Bandwidth per level (Gbit/s)",
                dcc.Input(id="machines-bandwidths", className="ps-input", placeholder="300,100"),
            ),
            field(
                "Memory per device",
                dcc.Input(id="machines-memory", className="ps-input", placeholder="80GiB"),
                "empty: unlimited",
            ),
            field(
                "Host link (Gbit/s)",
                dcc.Input(id="machines-host", className="ps-input", placeholder="200"),
                "swap; empty: free",
            ),
            html.Button("Create cluster", id="machines-create", className="ps-button"),
        ],
        className="ps-row",
    )
    return html.Div(
        [
            section("Workers", html.Div(id="machines-workers")),
            section(
                "Clusters",
                html.Div(id="machines-clusters"),
                pick,
                form,
                html.Div(id="machines-status"),
            ),
            dcc.Store(id="machines-changed", data=0),
            dcc.Interval(id="machines-interval", interval=5000),
        ]
    )


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
            parts.append(
                f"{kind}:{device.get('index', 0)} {device.get('name', '')}".strip()
                + (f" ({format_bytes(memory)})" if isinstance(memory, int) else "")
            )
    return ", ".join(parts) or "—"


def worker_rows(
    workers: list[dict[str, Any]], runs: list[dict[str, Any]], now: datetime
) -> list[dict[str, str]]:
    """One row per worker: what it offers, and the active runs it holds ranks of."""
    busy: dict[str, list[int]] = {}
    for run in runs:
        if run["state"] in ACTIVE:
            for rank in run.get("ranks") or []:
                busy.setdefault(rank["worker_id"], []).append(run["id"])
    return [
        {
            "name": w["name"],
            "host": w["host"],
            "devices": _devices(w.get("devices") or []),
            "slots": str(w["slots"]),
            "state": w["state"],
            "running": ", ".join(f"run {r}" for r in sorted(set(busy.get(w["id"], [])))) or "—",
            "last heard": _ago(w.get("last_seen_at"), now),
            "models": ", ".join([*w.get("builtin_models", []), *w.get("allowed_models", [])])
            or "—",
        }
        for w in sorted(workers, key=lambda w: w["name"])
    ]


def cluster_rows(
    clusters: list[dict[str, Any]], plans: list[dict[str, Any]]
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
        rows.append(
            {
                "id": str(cluster["id"]),
                "name": cluster["name"],
                "devices": str(len(devices)),
                "levels (size @ Gbit/s)": " · ".join(
                    f"{level['size']} @ {level['bandwidth_gbps'] or 'free'}"
                    for level in document["levels"]
                ),
                "memory per device": (
                    "unlimited"
                    if memories == {None}
                    else ", ".join(sorted(format_bytes(m) for m in memories if m is not None))
                ),
                "host link": (
                    "free"
                    if links == {None}
                    else ", ".join(
                        f"{g:g} Gbit/s" for g in sorted(g for g in links if g is not None)
                    )
                ),
                "plans": ", ".join(f"plan {p}" for p in sorted(used.get(cluster["id"], []))) or "—",
            }
        )
    return rows


def _numbers(text: str | None, what: str, kind: type) -> list[Any]:
    """Comma-separated numbers; ``free`` (a link with no transfer time) reads as None."""
    try:
        return [
            None if part.lower() == "free" else kind(part)
            for part in (text or "").replace(" ", "").split(",")
            if part
        ]
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a comma-separated list of numbers") from None


def _size_text(num_bytes: int) -> str:
    """Bytes as the form writes them, exactly (``parse_size`` reads it back)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes % size == 0:
            return f"{num_bytes // size}{unit}"
    return str(num_bytes)


def form_values(cluster: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """A stored cluster as the form shows it (name, sizes, bandwidths, memory, host link);
    ValueError for one the form cannot describe (devices that differ)."""
    document = cluster["document"]
    devices = document["devices"]
    described = {
        (
            d.get("memory_bytes"),
            d.get("host_to_device_gbps"),
            d.get("device_to_host_gbps"),
            d.get("staging_gbps"),
        )
        for d in devices
    }
    if len(described) != 1:
        raise ValueError(
            f"cluster {cluster['id']}'s devices differ in memory or host links; "
            "the form describes devices that are all alike: change its "
            "document through the API (PUT /api/clusters/{id})"
        )
    memory, to_device, to_host, staging = described.pop()
    if to_device != to_host or staging is not None:
        raise ValueError(
            f"cluster {cluster['id']}'s host links differ by direction or set "
            "staging_gbps, which the form cannot show: change its document "
            "through the API (PUT /api/clusters/{id})"
        )
    return (
        cluster["name"],
        ",".join(str(level["size"]) for level in document["levels"]),
        ",".join(
            "free" if level["bandwidth_gbps"] is None else f"{level['bandwidth_gbps']:g}"
            for level in document["levels"]
        ),
        "" if memory is None else _size_text(memory),
        "" if to_device is None else f"{to_device:g}",
    )


def _document(
    name: str | None,
    sizes: str | None,
    bandwidths: str | None,
    memory: str | None,
    host: str | None,
) -> dict[str, Any]:
    """The form as a Cluster document (``planner.cluster_template``)."""
    levels = _numbers(sizes, "devices per level", int)
    gbps = _numbers(bandwidths, "bandwidth per level", float)
    if not levels or None in levels:
        raise ValueError("devices per level: give at least one level, e.g. 4")
    if len(gbps) != len(levels):
        raise ValueError(
            f"give one bandwidth per level: {len(levels)} level(s), {len(gbps)} bandwidth(s)"
        )
    host_gbps = _numbers(host, "host link", float)
    return cluster_template(
        levels,
        list(gbps),
        device_memory_bytes=parse_size(memory) if memory else None,
        host_bandwidth_gbps=host_gbps[0] if host_gbps else None,
        name=(name or "cluster").strip() or "cluster",
    ).model_dump(mode="json")


def create_cluster(
    context: Context,
    name: str | None,
    sizes: str | None,
    bandwidths: str | None,
    memory: str | None,
    host: str | None,
) -> Any:
    """Make and store a cluster from the form."""
    try:
        created = context.client.create_cluster(
            _document(name, sizes, bandwidths, memory, host), (name or "").strip() or None
        )
    except (ValueError, PlannerError, ApiError) as exc:
        return message(f"Not created:\n{exc}", "error"), False
    return message(
        f"Created cluster {created['id']} ({created['num_devices']} devices); "
        "pick it on the Planner page.",
        "ok",
    ), True


def save_cluster(
    context: Context,
    cluster_id: int | None,
    name: str | None,
    sizes: str | None,
    bandwidths: str | None,
    memory: str | None,
    host: str | None,
) -> Any:
    """Replace the picked cluster with the form's (refused while a plan uses it)."""
    if cluster_id is None:
        return message("Pick the cluster to change first (or create a new one).", "error"), False
    try:
        saved = context.client.replace_cluster(
            cluster_id,
            _document(name, sizes, bandwidths, memory, host),
            (name or "").strip() or None,
        )
    except (ValueError, PlannerError, ApiError) as exc:
        return message(f"Cluster {cluster_id} not changed:\n{exc}", "error"), False
    return message(f"Saved cluster {saved['id']} ({saved['num_devices']} devices).", "ok"), True


def delete_cluster(context: Context, cluster_id: int | None) -> Any:
    if cluster_id is None:
        return message("Pick the cluster to delete first.", "error"), False
    try:
        context.client.delete_cluster(cluster_id)
    except ApiError as exc:
        return message(f"Cluster {cluster_id} not deleted:\n{exc}", "error"), False
    return message(f"Deleted cluster {cluster_id}.", "ok"), True


def register_callbacks(app: Dash, context: Context) -> None:
    @app.callback(
        Output("machines-workers", "children"),
        Output("machines-clusters", "children"),
        Output("machines-cluster-pick", "options"),
        Input("machines-interval", "n_intervals"),
        Input("machines-changed", "data"),
    )
    def _list(_: int | None, __: int) -> Any:
        try:
            workers, runs = context.client.workers(), context.client.runs()
            clusters, plans = context.client.clusters(), context.client.plans()
        except ApiError as exc:
            notice = message(f"Cannot read them: {exc}", "error")
            return notice, notice, no_update
        now = datetime.now().astimezone()
        options = [
            {"label": f"{c['id']}: {c['name']}", "value": c["id"]}
            for c in sorted(clusters, key=lambda c: c["id"])
        ]
        return (
            table(
                WORKER_COLUMNS,
                worker_rows(workers, runs, now),
                "No worker has registered: start one with `pipestudio worker --server URL`.",
                "machines-workers-table",
            ),
            table(
                CLUSTER_COLUMNS,
                cluster_rows(clusters, plans),
                "No clusters yet: make one below.",
                "machines-clusters-table",
            ),
            options,
        )

    @app.callback(
        Output("machines-cluster-name", "value"),
        Output("machines-sizes", "value"),
        Output("machines-bandwidths", "value"),
        Output("machines-memory", "value"),
        Output("machines-host", "value"),
        Output("machines-status", "children", allow_duplicate=True),
        Input("machines-cluster-pick", "value"),
        prevent_initial_call=True,
    )
    def _load(cluster_id: int | None) -> Any:
        if cluster_id is None:
            return ("", "", "", "", "", message("The form makes a new cluster.", "info"))
        try:
            values = form_values(context.client.cluster(cluster_id))
        except (ApiError, ValueError) as exc:
            return (*[no_update] * 5, message(str(exc), "error"))
        return (
            *values,
            message(
                f"Cluster {cluster_id} is in the form: change it and save "
                "the changes, or create it as a new cluster.",
                "info",
            ),
        )

    @app.callback(
        Output("machines-status", "children", allow_duplicate=True),
        Output("machines-changed", "data", allow_duplicate=True),
        Input("machines-save", "n_clicks"),
        State("machines-cluster-pick", "value"),
        State("machines-cluster-name", "value"),
        State("machines-sizes", "value"),
        State("machines-bandwidths", "value"),
        State("machines-memory", "value"),
        State("machines-host", "value"),
        State("machines-changed", "data"),
        prevent_initial_call=True,
    )
    def _save(
        _: int,
        cluster_id: int | None,
        name: str | None,
        sizes: str | None,
        bandwidths: str | None,
        memory: str | None,
        host: str | None,
        changed: int,
    ) -> Any:
        notice, saved = save_cluster(context, cluster_id, name, sizes, bandwidths, memory, host)
        return notice, bump(changed) if saved else no_update

    @app.callback(
        Output("machines-status", "children", allow_duplicate=True),
        Output("machines-changed", "data", allow_duplicate=True),
        Output("machines-cluster-pick", "value"),
        Input("machines-delete", "n_clicks"),
        State("machines-cluster-pick", "value"),
        State("machines-changed", "data"),
        prevent_initial_call=True,
    )
    def _delete(_: int, cluster_id: int | None, changed: int) -> Any:
        notice, deleted = delete_cluster(context, cluster_id)
        if not deleted:
            return notice, no_update, no_update
        return notice, bump(changed), None

    @app.callback(
        Output("machines-status", "children", allow_duplicate=True),
        Output("machines-changed", "data", allow_duplicate=True),
        Input("machines-create", "n_clicks"),
        State("machines-cluster-name", "value"),
        State("machines-sizes", "value"),
        State("machines-bandwidths", "value"),
        State("machines-memory", "value"),
        State("machines-host", "value"),
        State("machines-changed", "data"),
        prevent_initial_call=True,
    )
    def _create(
        _: int,
        name: str | None,
        sizes: str | None,
        bandwidths: str | None,
        memory: str | None,
        host: str | None,
        changed: int,
    ) -> Any:
        notice, made = create_cluster(context, name, sizes, bandwidths, memory, host)
        return notice, bump(changed) if made else no_update
