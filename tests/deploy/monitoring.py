"""The metric names deploy/grafana/pdppo.json and deploy/prometheus/alerts.yml query, for the
tests that check them against a real /metrics (tests/integration/test_service_metrics.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "pdppo.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
_NAME = re.compile(r"\b(pdppo_[a-z0-9_]+)\b")


def _exprs(panel: dict[str, Any]) -> list[str]:
    found = [str(t["expr"]) for t in panel.get("targets", [])]
    for inner in panel.get("panels", []):
        found += _exprs(inner)
    return found


def dashboard_exprs() -> list[str]:
    return _exprs({"panels": json.loads(DASHBOARD.read_text())["panels"]})


def alert_exprs() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [str(rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def used_names() -> set[str]:
    """Every pdppo_* series name a dashboard panel or an alert rule's expression reads."""
    return {name for expr in dashboard_exprs() + alert_exprs() for name in _NAME.findall(expr)}
