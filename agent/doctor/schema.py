"""The JSON Schema of `inferd doctor --json` (docs/DOCTOR.md; `inferd doctor --schema`
prints it). Version 1: fields are only ever added, and a new one is optional."""

from __future__ import annotations

from typing import Any

from .findings import LAYERS, STATUSES

SCHEMA_VERSION = 1

_EVIDENCE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "value", "unit", "source"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "value": {"type": ["number", "integer", "string", "boolean", "null"]},
        "unit": {"type": "string"},
        "source": {"type": "string", "minLength": 1},
    },
}

_FINDING = {
    "type": "object",
    "additionalProperties": False,
    "required": [
        "id",
        "check",
        "layer",
        "status",
        "title",
        "summary",
        "impact",
        "evidence",
        "fix",
        "reason",
        "not_judged",
    ],
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z_]+\\.[a-z0-9_]+$"},
        "check": {"type": "string", "pattern": "^[a-z_]+$"},
        "layer": {"enum": list(LAYERS)},
        "status": {"enum": list(STATUSES)},
        "title": {"type": "string"},
        "summary": {"type": "string"},
        "impact": {"type": "number", "minimum": 0, "maximum": 1},
        "evidence": {"type": "array", "items": _EVIDENCE},
        "fix": {"type": ["string", "null"]},
        "reason": {"type": ["string", "null"]},
        "not_judged": {"type": "array", "items": {"type": "string"}},
    },
    "allOf": [
        {"if": {"properties": {"status": {"const": "skip"}}}, "then": {"properties": {"reason": {"type": "string"}}}},
        {
            "if": {"properties": {"status": {"enum": ["warn", "fail"]}}},
            "then": {"properties": {"fix": {"type": "string"}}},
        },
    ],
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://inferd.dev/schemas/doctor-1.json",
    "title": "inferd doctor report",
    "type": "object",
    "additionalProperties": False,
    "required": ["schema_version", "generated_at", "exit_status", "counts", "inputs", "findings"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "generated_at": {"type": "number"},
        "exit_status": {"enum": [0, 1, 2]},
        "counts": {
            "type": "object",
            "additionalProperties": False,
            "required": list(STATUSES),
            "properties": {s: {"type": "integer", "minimum": 0} for s in STATUSES},
        },
        "inputs": {
            "type": "object",
            "additionalProperties": False,
            "required": [
                "agent",
                "engine",
                "prometheus",
                "since_seconds",
                "sysfs_root",
                "procfs_root",
                "gpu_backend",
                "active",
                "missing",
            ],
            "properties": {
                "agent": {"type": ["string", "null"]},
                "engine": {"type": ["string", "null"]},
                "prometheus": {"type": ["string", "null"]},
                "since_seconds": {"type": "number", "exclusiveMinimum": 0},
                "sysfs_root": {"type": "string"},
                "procfs_root": {"type": "string"},
                "gpu_backend": {"type": ["string", "null"]},
                "active": {"type": "boolean"},
                "missing": {"type": "object", "additionalProperties": {"type": "string"}},
                "found": {
                    "description": "where each endpoint came from, or what was tried (empty with --no-discover)",
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {n: {"type": "string"} for n in ("agent", "engine", "prometheus")},
                },
            },
        },
        "findings": {"type": "array", "items": _FINDING},
    },
}
