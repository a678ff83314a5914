"""Remediation board: what fired, what the agent did about it, and what it undid."""

from __future__ import annotations

from .common import GPU, HOST, H
from .spec import Board, Panel, Query, Row, Threshold

alerts = Row(
    "Alerts",
    (
        Panel(
            "Firing alerts",
            "inferd alerts firing now, by name and severity (Prometheus' ALERTS series). Routing and silences live "
            "in Alertmanager.",
            "short",
            (
                Query(
                    'sum by (alertname, severity) (ALERTS{alertstate="firing", alertname=~"Inferd.*"})',
                    "{{alertname}} ({{severity}})",
                ),
            ),
            kind="state-timeline",
            thresholds=(Threshold(None, "orange"),),
            width=24,
            requires="alert",
        ),
        Panel(
            "Pending alerts",
            "inferd alerts whose condition holds but whose `for:` has not elapsed yet.",
            "short",
            (
                Query(
                    'sum by (alertname, severity) (ALERTS{alertstate="pending", alertname=~"Inferd.*"})',
                    "{{alertname}} ({{severity}})",
                ),
            ),
            kind="state-timeline",
            thresholds=(Threshold(None, "yellow"),),
            width=24,
            requires="alert-pending",
        ),
    ),
)

actions = Row(
    "Actions",
    (
        Panel(
            "Actions over time",
            "Remediation actions per rate interval by alert, action and result (applied, dry_run, refused, ...).",
            "short",
            (
                Query(
                    f"sum by (alert, action, result) (increase(inferd_remediation_actions_total{{{H}}}[$__rate_interval]))",
                    "{{alert}}: {{action}} ({{result}})",
                ),
            ),
            kind="timeseries",
            stacked=True,
            requires="remediation",
            headline=True,
        ),
        Panel(
            "Rollbacks over time",
            "Actions rolled back per rate interval because verification saw the target metric get worse.",
            "short",
            (
                Query(
                    f"sum by (action) (increase(inferd_remediation_rollbacks_total{{{H}}}[$__rate_interval]))",
                    "{{action}}",
                ),
            ),
            thresholds=(Threshold(None, "green"), Threshold(1, "red")),
            requires="rollback",
        ),
        Panel(
            "Actions in range by result",
            "Remediation actions over the selected time range, by action and result.",
            "short",
            (
                Query(
                    f"sum by (action, result) (increase(inferd_remediation_actions_total{{{H}}}[$__range]))",
                    "{{action}} ({{result}})",
                ),
            ),
            kind="bargauge",
            requires="remediation",
        ),
        Panel(
            "Time since last action",
            "Seconds since the agent last applied each kind of action.",
            "s",
            (
                Query(
                    f"time() - max by (action) (inferd_remediation_last_action_timestamp_seconds{{{H}}})", "{{action}}"
                ),
            ),
            kind="stat",
            thresholds=(Threshold(None, "orange"), Threshold(600, "green")),
            requires="remediation",
        ),
    ),
)

BOARD = Board(
    uid="inferd-remediation",
    title="inferd / Remediation",
    description="Firing alerts, the agent's remediation actions and rollbacks over time.",
    rows=(alerts, actions),
    variables=(HOST, GPU),
)
