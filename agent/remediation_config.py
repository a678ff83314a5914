"""The remediation settings from the agent's arguments: the YAML mapping of
`--remediation-config` (none: the defaults), with `--dry-run` on top.

One loader for both ways the agent runs: beside its supervised engine (agent.webhook)
and over a node's engine pods (agent.kubernetes.node).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from inferd.agent.remediation_rules import PolicyConfig


def load_policy_config(args: argparse.Namespace) -> PolicyConfig:
    """The PolicyConfig the arguments ask for; ValueError names a setting that is wrong."""
    settings: dict[str, Any] = {}
    if getattr(args, "remediation_config", None):
        settings = yaml.safe_load(Path(args.remediation_config).read_text()) or {}
        if not isinstance(settings, dict):
            raise ValueError(f"{args.remediation_config}: expected a mapping of settings")
    if getattr(args, "dry_run", False):
        settings["dry_run"] = True
    return PolicyConfig.from_dict(settings)
