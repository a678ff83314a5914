"""Prometheus collectors, one per signal source."""
