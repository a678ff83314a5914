"""The node agent: topology, engine supervision, metrics export, remediation, CLI."""
