"""Turn a `spec.Board` into Grafana dashboard JSON with grafana-foundation-sdk."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from grafana_foundation_sdk.builders import bargauge, heatmap, prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import heatmap as heatmap_m

from .common import PROMETHEUS_UID
from .spec import Annotation, Board, Panel, Variable

PROMETHEUS = dash_m.DataSourceRef(type_val="prometheus", uid=PROMETHEUS_UID)

# each kind's builder has its own methods (heatmap's calculate, ...); _panel calls by kind
_BUILDERS: dict[str, Callable[[], Any]] = {
    "timeseries": timeseries.Panel,
    "stat": stat.Panel,
    "heatmap": heatmap.Panel,
    "state-timeline": statetimeline.Panel,
    "bargauge": bargauge.Panel,
}


def _thresholds(panel: Panel) -> dash_b.ThresholdsConfig:
    steps = [dash_m.Threshold(value=t.value, color=t.color) for t in panel.thresholds]
    return dash_b.ThresholdsConfig().mode(dash_m.ThresholdsMode.ABSOLUTE).steps(steps)


def _panel(panel: Panel, panel_id: int) -> Any:
    builder = (
        _BUILDERS[panel.kind]()
        .id(panel_id)
        .title(panel.title)
        .description(panel.full_description)
        .unit(panel.unit)
        .datasource(PROMETHEUS)
        .thresholds(_thresholds(panel))
        .span(panel.width)
        .height(panel.height)
    )
    for index, query in enumerate(panel.queries):
        target = prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(chr(ord("A") + index))
        builder = builder.with_target(target.instant() if panel.kind in ("stat", "bargauge") else target.range())
    if panel.min is not None:
        builder = builder.min(panel.min)
    if panel.max is not None:
        builder = builder.max(panel.max)
    if panel.value_names:
        options = {
            _format_number(value): dash_m.ValueMappingResult(text=text, index=i)
            for i, (value, text) in enumerate(panel.value_names)
        }
        builder = builder.mappings([dash_m.ValueMap(options=options)])
    if panel.kind == "timeseries":
        builder = builder.thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common_m.GraphTresholdsStyleMode.DASHED)
        )
        if panel.stacked:
            builder = builder.stacking(common_b.StackingConfig().mode(common_m.StackingMode.NORMAL)).fill_opacity(30)
    elif panel.kind == "heatmap":
        color = (
            heatmap.HeatmapColorOptions()
            .mode(heatmap_m.HeatmapColorMode.SCHEME)
            .scheme("RdYlGn")
            .reverse(True)  # high share = red
            .exponent(0.5)
            .steps(64)
        )
        color = color.min(panel.min if panel.min is not None else 0)
        if panel.max is not None:
            color = color.max(panel.max)
        builder = (
            builder.calculate(False).color(color).cell_values(heatmap.CellValues().unit(panel.unit)).show_tooltip()
        )
    elif panel.kind in ("stat", "state-timeline", "bargauge"):
        builder = builder.color_scheme(dash_b.FieldColor().mode(dash_m.FieldColorModeId.THRESHOLDS))
    return builder


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _variable(variable: Variable) -> dash_b.QueryVariable:
    return (
        dash_b.QueryVariable(variable.name)
        .label(variable.label)
        .query(variable.query)
        .datasource(PROMETHEUS)
        .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dash_m.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dash_m.VariableOption(selected=True, text="All", value="$__all"))
    )


def _annotation(annotation: Annotation) -> dash_b.AnnotationQuery:
    return (
        dash_b.AnnotationQuery()
        .name(annotation.name)
        .datasource(PROMETHEUS)
        .enable(True)
        .icon_color(annotation.color)
        .expr(annotation.expr)
    )


# Prometheus annotation fields the SDK's generic AnnotationQuery does not model.
def _annotation_extras(annotation: Annotation) -> dict[str, Any]:
    extras: dict[str, Any] = {"titleFormat": annotation.title, "step": "15s"}
    if annotation.value_is_time:
        extras["useValueForTime"] = True
    return extras


def build(board: Board, annotations: tuple[Annotation, ...], links: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """Build the dashboard; `links` are (title, uid) of the other boards, carrying the variables."""
    builder = (
        dash_b.Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags(list(board.tags))
        .editable()
        .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
    )
    for variable in board.variables:
        builder = builder.with_variable(_variable(variable))
    for annotation in annotations:
        builder = builder.annotation(_annotation(annotation))
    for title, uid in links:
        builder = builder.link(
            dash_b.DashboardLink(title)
            .type(dash_m.DashboardLinkType.LINK)
            .url(f"/d/{uid}")
            .include_vars(True)
            .keep_time(True)
        )
    panel_id = 1
    for row in board.rows:
        # Expanded rows: Grafana keeps an open row's panels beside it, not inside it.
        builder = builder.with_row(dash_b.Row(row.title).id(panel_id).collapsed(False))
        panel_id += 1
        for panel in row.panels:
            builder = builder.with_panel(_panel(panel, panel_id))
            panel_id += 1
    model = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    for entry, annotation in zip(model["annotations"]["list"], annotations):
        entry.update(_annotation_extras(annotation))
    return model


def to_json(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=True) + "\n"
