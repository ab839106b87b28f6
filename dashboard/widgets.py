"""Small pieces of layout the pages share: labelled fields, messages, graphs, tables."""

from collections.abc import Sequence
from typing import Any

from dash import Output, dcc, html, no_update

#: Every chart's modebar offers "Download plot as a PNG" (Plotly's toImage).
GRAPH_CONFIG: dict[str, Any] = {
    "displaylogo": False,
    "toImageButtonOptions": {"format": "png", "scale": 2},
}


def field(label: str, control: Any, hint: str = "") -> html.Div:
    children = [html.Label(label, className="ps-label"), control]
    if hint:
        children.append(html.Div(hint, className="ps-hint"))
    return html.Div(children, className="ps-field")


def graph(component_id: str, figure: dict[str, Any] | None = None) -> dcc.Graph:
    config: Any = {
        **GRAPH_CONFIG,
        "toImageButtonOptions": {**GRAPH_CONFIG["toImageButtonOptions"], "filename": component_id},
    }
    return dcc.Graph(id=component_id, figure=figure or {"data": [], "layout": {}}, config=config)


def chart_box(component_id: str) -> html.Div:
    """Where the chart ``component_id`` goes once its first figure comes (``chart``, into
    ``chart_output``): an empty Plotly chart costs a browser 15-30 ms to draw on a small
    machine, and the Planner, which drew seven of them, showed its first numbers a quarter
    of a second later for it."""
    return html.Div(id=f"{component_id}-box")


def chart_output(component_id: str) -> Output:
    return Output(f"{component_id}-box", "children")


def chart(component_id: str, figure: Any) -> Any:
    """What ``chart_output(component_id)`` gets: ``figure`` drawn (``no_update`` stays,
    None leaves the place empty). Dash (4.2 on) mounts a chart set this way anew at every
    answer, where a figure output updates it in place: for charts that each answer
    replaces (the Planner's), not for ones updated live (the Runs page's)."""
    return figure if figure is no_update or figure is None else graph(component_id, figure)


def message(text: str, kind: str = "info") -> html.Div:
    """A notice: ``info``, ``ok`` or ``error``; errors keep their line breaks."""
    return html.Div(
        text, className=f"ps-message ps-{kind}", role="alert" if kind == "error" else "status"
    )


def table(
    columns: Sequence[str], rows: Sequence[dict[str, Any]], empty: str, table_id: str | None = None
) -> html.Div:
    """A plain table, or the ``empty`` sentence when there are no rows."""
    if not rows:
        return html.Div(empty, className="ps-empty", id=table_id or "")
    head = html.Thead(html.Tr([html.Th(column) for column in columns]))
    body = html.Tbody(
        [html.Tr([html.Td(row.get(column, "")) for column in columns]) for row in rows]
    )
    # the box scrolls sideways on a narrow screen rather than push the page wider
    return html.Div(
        html.Table([head, body], className="ps-table"),
        id=table_id or "",
        className="ps-table-box",
    )


def section(title: str, *children: Any, section_id: str | None = None) -> html.Section:
    return html.Section([html.H3(title), *children], className="ps-section", id=section_id or "")


def bump(counter: Any) -> int:
    """The next value of a page's change counter (the ``dcc.Store`` its lists listen to).
    The counter comes back from the browser, so anything but a count starts again at 1:
    the change it announces is made by then, and must not be answered as a failure."""
    valid = isinstance(counter, int) and not isinstance(counter, bool) and counter >= 0
    return (counter if valid else 0) + 1
