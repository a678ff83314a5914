"""inferd's Grafana boards as code: `python -m dashboards.generate` writes dashboards/generated/."""
