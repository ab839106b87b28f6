"""Profiles page: upload a profile (native JSON or PipeDream graph.txt), list, chart layers."""

import base64
import binascii
import json
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from pipestudio.dashboard.api import ApiError
from pipestudio.dashboard.components.profile_charts import layer_bytes_figure, layer_time_figure
from pipestudio.dashboard.context import Context
from pipestudio.dashboard.widgets import (
    bump,
    chart,
    chart_box,
    chart_output,
    field,
    message,
    section,
    table,
)

PATH = "/profiles"
NAME = "Profiles"
COLUMNS = ("id", "name", "model", "layers", "micro-batch size", "source", "uploaded")


def layout(**_: Any) -> html.Div:
    upload = dcc.Upload(
        id="profiles-upload",
        className="ps-upload",
        multiple=False,
        children=html.Div(
            [
                html.B("Drop a profile here, or click to choose a file"),
                html.Div(
                    "PipeStudio profile JSON (from `pipestudio profile`) or PipeDream's graph.txt",
                    className="ps-hint",
                ),
            ]
        ),
    )
    options = html.Div(
        [
            field(
                "Name (optional)",
                dcc.Input(
                    id="profiles-name",
                    className="ps-input",
                    placeholder="default: the model's name",
                ),
            ),
            field(
                "PipeDream batch size",
                dcc.Input(
                    id="profiles-batch-size",
                    type="number",
                    min=1,
                    step=1,
                    className="ps-input",
                    placeholder="required for graph.txt",
                ),
                "samples in the profiled minibatch (graph.txt does not say)",
            ),
            field(
                "PipeDream model name",
                dcc.Input(id="profiles-model", className="ps-input", placeholder="e.g. vgg16"),
                "graph.txt does not name its model",
            ),
        ],
        className="ps-row",
    )
    return html.Div(
        [
            section("Upload a profile", upload, options, html.Div(id="profiles-status")),
            section(
                "Stored profiles",
                html.Div(id="profiles-list"),
                html.Div(
                    [
                        field(
                            "Show layers of",
                            dcc.Dropdown(
                                id="profiles-select",
                                placeholder="pick a profile",
                                style={"minWidth": "320px"},
                            ),
                        ),
                        html.Button(
                            "Delete this profile",
                            id="profiles-delete",
                            className="ps-button ps-secondary",
                        ),
                    ],
                    className="ps-row",
                ),
                html.Div(id="profiles-delete-status"),
            ),
            section(
                "Layers",
                chart_box("profiles-time-graph"),
                chart_box("profiles-bytes-graph"),
            ),
            dcc.Store(id="profiles-changed", data=0),
        ]
    )


def decode_upload(contents: str, filename: str) -> str:
    """The uploaded file's text; ``ValueError`` naming the file when it is not text."""
    try:
        payload = contents.split(",", 1)[1]
        return base64.b64decode(payload).decode("utf-8")
    except (AttributeError, IndexError, binascii.Error, UnicodeDecodeError):
        raise ValueError(
            f"{filename!r} is not a text file: upload a PipeStudio profile "
            "(.json) or a PipeDream graph.txt"
        ) from None


def upload_body(
    text: str, filename: str, name: str | None, batch_size: int | None, model: str | None
) -> dict[str, Any]:
    """The ``POST /api/profiles`` body: JSON when the file is JSON, else PipeDream text."""
    if text.lstrip().startswith(("{", "[")):
        try:
            document = json.loads(text)
        except RecursionError:
            raise ValueError(
                f"{filename!r} nests its JSON too deeply to be read as a profile"
            ) from None
        except ValueError as exc:
            raise ValueError(
                f"{filename!r} is neither a PipeStudio profile (it starts like "
                f"JSON, which does not parse: {exc}) nor a PipeDream graph.txt"
            ) from None
        if not isinstance(document, dict):
            raise ValueError(
                f"{filename!r} holds a JSON {type(document).__name__}, not a profile object"
            )
        return {"name": name or None, "format": "pipestudio", "profile": document}
    stem = filename.rsplit("/", 1)[-1].removesuffix(".txt")
    if not batch_size:
        raise ValueError(
            f"{filename!r} is a PipeDream graph, which does not say the batch "
            'size it was profiled at: fill in "PipeDream batch size" (every '
            "activation size and time scales with it)"
        )
    model = model or (stem if stem not in ("", "graph") else None) or name
    if not model:
        raise ValueError(
            f'{filename!r} does not name its model: fill in "PipeDream model '
            'name" (or a profile name)'
        )
    return {
        "name": name or None,
        "format": "pipedream",
        "graph": text,
        "batch_size": batch_size,
        "model": model,
    }


def upload_profile(
    context: Context,
    contents: str | None,
    filename: str | None,
    name: str | None,
    batch_size: int | None,
    model: str | None,
) -> tuple[html.Div, int | None]:
    """Send an uploaded file to the backend: (the notice to show, the new profile's id)."""
    if not contents:
        return message("Choose a file to upload."), None
    filename = filename if isinstance(filename, str) and filename else "upload"
    try:
        body = upload_body(decode_upload(contents, filename), filename, name, batch_size, model)
        created = context.client.create_profile(body)
    except (ValueError, ApiError) as exc:
        return message(f"Could not read {filename}:\n{exc}", "error"), None
    return message(
        f"Uploaded {filename}: profile {created['id']} '{created['name']}', "
        f"{created['num_layers']} layers.",
        "ok",
    ), created["id"]


def profile_rows(profiles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "id": p["id"],
            "name": p["name"],
            "model": p["model"],
            "layers": p["num_layers"],
            "micro-batch size": p["microbatch_size"],
            "source": p["source"],
            "uploaded": str(p["created_at"])[:19].replace("T", " "),
        }
        for p in profiles
    ]


def list_profiles(
    context: Context, selected: int | None
) -> tuple[Any, list[dict[str, Any]], int | None]:
    """The table, the dropdown's options and the selection (the newest when none)."""
    try:
        found = context.client.profiles()
    except ApiError as exc:
        return message(f"Cannot list profiles: {exc}", "error"), [], None
    options = [
        {"label": f"{p['id']}: {p['name']} ({p['num_layers']} layers)", "value": p["id"]}
        for p in found
    ]
    ids = [p["id"] for p in found]
    if selected not in ids:
        selected = max(ids) if ids else None
    empty = "No profiles yet: drop a profile file above to upload one."
    return table(COLUMNS, profile_rows(found), empty), options, selected


def layer_figures(
    context: Context, profile_id: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    if profile_id is None:
        return layer_time_figure(None), layer_bytes_figure(None)
    profile = context.profile(profile_id)
    return layer_time_figure(profile), layer_bytes_figure(profile)


def delete_profile(context: Context, profile_id: int | None) -> html.Div:
    if profile_id is None:
        return message("Pick a profile to delete.")
    try:
        context.client.delete_profile(profile_id)
    except ApiError as exc:
        return message(f"Profile {profile_id} was not deleted: {exc}", "error")
    return message(f"Deleted profile {profile_id}.", "ok")


def register_callbacks(app: Dash, context: Context) -> None:
    @app.callback(
        Output("profiles-status", "children"),
        Output("profiles-changed", "data", allow_duplicate=True),
        Output("profiles-select", "value", allow_duplicate=True),
        Input("profiles-upload", "contents"),
        State("profiles-upload", "filename"),
        State("profiles-name", "value"),
        State("profiles-batch-size", "value"),
        State("profiles-model", "value"),
        State("profiles-changed", "data"),
        prevent_initial_call=True,
    )
    def _upload(
        contents: str | None,
        filename: str | None,
        name: str | None,
        batch_size: int | None,
        model: str | None,
        changed: int,
    ) -> Any:
        notice, created = upload_profile(context, contents, filename, name, batch_size, model)
        if created is None:
            return notice, no_update, no_update
        return notice, bump(changed), created

    @app.callback(
        Output("profiles-list", "children"),
        Output("profiles-select", "options"),
        Output("profiles-select", "value"),
        Input("profiles-changed", "data"),
        State("profiles-select", "value"),
    )
    def _list(_: int, selected: int | None) -> Any:
        return list_profiles(context, selected)

    @app.callback(
        chart_output("profiles-time-graph"),
        chart_output("profiles-bytes-graph"),
        Input("profiles-select", "value"),
    )
    def _charts(profile_id: int | None) -> Any:
        times, sizes = layer_figures(context, profile_id)
        return chart("profiles-time-graph", times), chart("profiles-bytes-graph", sizes)

    @app.callback(
        Output("profiles-delete-status", "children"),
        Output("profiles-changed", "data", allow_duplicate=True),
        Input("profiles-delete", "n_clicks"),
        State("profiles-select", "value"),
        State("profiles-changed", "data"),
        prevent_initial_call=True,
    )
    def _delete(_: int, profile_id: int | None, changed: int) -> Any:
        return delete_profile(context, profile_id), bump(changed)
