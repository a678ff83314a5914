"""Pieces every board shares: datasource, template variables, remediation annotations."""

from __future__ import annotations

from .spec import Annotation, Threshold, Variable

# Fixed uids, set by dashboards/provisioning/datasources/datasources.yaml.
PROMETHEUS_UID = "inferd-prometheus"
ALERTMANAGER_UID = "inferd-alertmanager"

HOST = Variable("host", "Host", 'label_values(up{job=~"inferd-.*"}, host)')
GPU = Variable("gpu", "GPU", 'label_values(DCGM_FI_DEV_GPU_UTIL{host=~"$host"}, gpu)')
SLO_CLASS = Variable(
    "slo_class", "SLO class", 'label_values(inferd_slo_time_to_first_token_seconds_count{host=~"$host"}, slo_class)'
)
MODEL = Variable("model_name", "Model", 'label_values(vllm:num_requests_running{host=~"$host"}, model_name)')

H = 'host=~"$host"'
HG = 'host=~"$host", gpu=~"$gpu"'
HM = 'host=~"$host", model_name=~"$model_name"'
HC = 'host=~"$host", slo_class=~"$slo_class"'

# Shown on every board, so a change of behaviour can be read against what inferd did.
REMEDIATION_ANNOTATIONS = (
    Annotation(
        "Remediation actions",
        f"inferd_remediation_last_action_timestamp_seconds{{{H}}} * 1000",
        "inferd: {{action}}",
        "purple",
        value_is_time=True,
        requires="remediation",
    ),
    Annotation(
        "Rollbacks",
        f"sum by (action) (increase(inferd_remediation_rollbacks_total{{{H}}}[$__interval])) > 0",
        "rollback: {{action}}",
        "red",
        requires="rollback",
    ),
    Annotation(
        "Firing alerts",
        'ALERTS{alertstate="firing", alertname=~"Inferd.*"}',
        "{{alertname}} ({{severity}})",
        "orange",
        requires="alert",
    ),
)

# Threshold ladders used on several boards.
RATIO_BUSY = (Threshold(None, "green"), Threshold(0.8, "orange"), Threshold(0.95, "red"))
RATIO_IDLE_IS_BAD = (Threshold(None, "red"), Threshold(0.3, "orange"), Threshold(0.6, "green"))
ANY_IS_BAD = (Threshold(None, "green"), Threshold(1e-9, "red"))
