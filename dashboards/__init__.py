"""inferd's Grafana boards as code: `python -m inferd.dashboards.generate` writes dashboards/generated/."""
