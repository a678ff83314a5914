"""The boards, in the order Grafana lists them."""

from __future__ import annotations

from . import engine, node, numa, remediation
from .spec import Board

BOARDS: tuple[Board, ...] = (node.BOARD, numa.BOARD, engine.BOARD, remediation.BOARD)
