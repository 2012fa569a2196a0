"""deploy/prometheus: promtool accepts the rules and the example config, the rules' unit tests
pass, and they bite (a rule whose threshold is broken fails them). Skipped without promtool,
except under PDPPO_REQUIRE_PROMTOOL=1, which `.ci/alerts` sets after installing it: in CI a
missing promtool is a failure, never a skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.monitoring import ALERTS, DEPLOY, alert_exprs, dashboard_exprs, used_names

PROMETHEUS = DEPLOY / "prometheus"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("PDPPO_REQUIRE_PROMTOOL") == "1":
            pytest.fail("promtool is not installed (apt-get install prometheus)")
        pytest.skip("promtool is not installed (apt-get install prometheus; .ci/alerts does)")
    return found


def run(*args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_accepts_the_rules_and_the_example_config() -> None:
    rules = run("check", "rules", "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS: 14 rules found" in rules.stdout
    config = run("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_the_rules_unit_tests_pass() -> None:
    tested = run("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_a_disk_rule_with_a_broken_threshold_fails_the_unit_tests(tmp_path: Path) -> None:
    rules = ALERTS.read_text()
    assert rules.count("pdppo_disk_total_bytes < 0.10") == 1
    (tmp_path / "alerts.yml").write_text(rules.replace("total_bytes < 0.10", "total_bytes < 0.01"))
    shutil.copy(PROMETHEUS / "alerts_test.yml", tmp_path)
    tested = run("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert tested.returncode == 1, tested.stdout
    output = tested.stdout + tested.stderr
    assert "alertname: PdppoDiskNearlyFull, time: 8m" in output


def test_the_brief_s_alerts_are_there_and_the_dashboard_queries_the_service() -> None:
    exprs = " ".join(alert_exprs())
    for name in ("pdppo_queue_oldest_job_age_seconds", "pdppo_workers_alive"):
        assert name in exprs
    assert "pdppo_disk_free_bytes / pdppo_disk_total_bytes" in exprs
    assert 'code=~"storage_full|storage_error"' in exprs
    assert len(dashboard_exprs()) == 27
    assert {"pdppo_jobs", "pdppo_worker_running_jobs", "pdppo_jobs_ended_total"} <= used_names()
