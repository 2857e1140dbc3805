"""deploy/ and the compose stack, checked without Docker: promtool on the Prometheus config
and alert rules (and their unit tests), the Compose schema on docker-compose.yml, and the
commands and files the stack refers to."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from opskit import DEPLOY, REPO, queried_metrics

from stream_dedup.cli.main import build_parser
from stream_dedup.config import Settings
from stream_dedup.metrics import Metrics

SCHEMA = REPO.parent / "shared" / "schemas" / "compose-spec.json"
PROMETHEUS = DEPLOY / "prometheus"
REDIS_NODES = ("redis-1", "redis-2", "redis-3")
REPLICAS = ("stream-dedup-1", "stream-dedup-2")  # two `serve` in one group, on one Redis
GRAFANA = DEPLOY / "grafana"


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "docker-compose.yml").read_text()))


def _serve_settings(service: dict[str, Any]) -> Settings:
    """What `stream-dedup serve` in this compose service runs with: its command's flags over
    its environment, resolved as the CLI does."""
    args = build_parser().parse_args(service["command"])
    assert args.command == "serve"
    env = {k: str(v) for k, v in service.get("environment", {}).items()}
    overrides = {name: getattr(args, name, None) for name in Settings.names()}
    return Settings.load(config_file=args.config, env=env, overrides=overrides)


def _dashboard() -> dict[str, Any]:
    return dict(json.loads((GRAFANA / "dashboards" / "stream-dedup.json").read_text()))


def _flat(expr: str) -> str:
    return " ".join(expr.split())


def _promtool(*args: str) -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing (apt-get install prometheus; tests/run)")
    out = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


# --- Prometheus --------------------------------------------------------------------------------
def test_promtool_checks_the_config_and_rules() -> None:
    assert "SUCCESS" in _promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert "7 rules found" in _promtool("check", "rules", str(PROMETHEUS / "alerts.yml"))


def test_each_alert_fires_on_its_series() -> None:
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    fired = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"]
             if case["exp_alerts"]}
    assert fired == alerts  # every alert has a case where it fires
    assert "SUCCESS" in _promtool("test", "rules", str(PROMETHEUS / "alerts_test.yml"))


def test_prometheus_scrapes_every_replica() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    (static,) = job["static_configs"]
    targets = static["targets"]
    assert sorted(t.split(":")[0] for t in targets) == sorted(REPLICAS)
    assert "labels" not in static  # the target (label `instance`) tells the replicas apart
    services = _compose()["services"]
    for target in targets:
        host, port = target.split(":")
        settings = _serve_settings(services[host])
        assert settings.http_port == int(port) and settings.http_host == "0.0.0.0"
    assert job["job_name"] == "stream-dedup"  # the alerts' up{job="stream-dedup"}


# --- Grafana -----------------------------------------------------------------------------------
def test_grafana_dashboard_and_datasource_fit_together() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    dash = _dashboard()
    titles = " | ".join(p["title"] for p in dash["panels"]).lower()
    for needed in ("throughput", "dedup rate by reason", "precision", "lag", "latency"):
        assert needed in titles
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        if panel["type"] == "row":  # a heading: no query of its own
            assert panel["gridPos"]["w"] == 24 and not panel.get("targets")
            continue
        assert panel["datasource"]["uid"] == source["uid"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    provider = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "stream-dedup.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    mounts = _compose()["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in mounts


def test_grafana_shared_index_row() -> None:
    """Under the row "Shared index (Redis)": Redis round trips p50/p99 and errors by
    operation, and pages decided per instance (the replicas side by side)."""
    panels = _dashboard()["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and p["title"] == "Shared index (Redis)"]
    below = [p for p in panels if p["gridPos"]["y"] > row["gridPos"]["y"]]
    assert len(below) == 3
    exprs = [_flat(t["expr"]) for p in below for t in p["targets"]]
    by_op = "sum by (le, operation) (rate(stream_dedup_redis_seconds_bucket[$__rate_interval]))"
    for q in ("0.5", "0.99"):
        assert f"histogram_quantile({q}, {by_op})" in exprs
    assert ("sum by (operation) (rate(stream_dedup_redis_errors_total[$__rate_interval]))"
            in exprs)
    assert "sum by (instance) (rate(stream_dedup_pages_total[$__rate_interval]))" in exprs
    # nothing overlaps the panels above the row
    above = [p for p in panels if p not in below and p is not row]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in above)
    assert row["gridPos"]["y"] >= bottom


def test_dashboard_and_alerts_query_only_metrics_the_code_defines() -> None:
    """Every metric name a panel or an alert selects is one `Metrics` registers (a typo, or a
    metric renamed in the code, fails here without a running service)."""
    registry = Metrics(Settings(index="redis", redis_url="redis://redis-1:6379")).registry
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",), "info": ("_info",), "summary": ("", "_count", "_sum")}
    defined = {family.name + end for family in registry.collect()
               for end in suffixes[family.type]}
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    exprs = [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    wanted = {m for expr in exprs for m in queried_metrics(expr)}
    assert {"stream_dedup_redis_seconds_bucket", "stream_dedup_redis_errors_total"} <= wanted
    assert wanted - defined == set()
    assert queried_metrics("rate(stream_dedup_redis_secs_bucket[1m])") - defined  # can fail


# --- Compose and Dockerfile --------------------------------------------------------------------
def test_compose_file_matches_the_compose_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.exists():
        pytest.skip(f"{SCHEMA} is absent")
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}"
              for e in validator.iter_errors(_compose())]
    assert errors == []
    broken = dict(_compose(), services={"x": {"image": "a", "depends_on": {"y": {"what": 1}}}})
    assert list(validator.iter_errors(broken))  # the validator does reject nonsense


def test_compose_stack_is_complete_and_real() -> None:
    services = _compose()["services"]
    assert set(services) == {"kafka", *REPLICAS, "sample-crawl", "prometheus", "grafana",
                             *REDIS_NODES, "redis-cluster-init"}
    images = {name: s.get("image", "") for name, s in services.items()}
    assert re.fullmatch(r"apache/kafka:\d+\.\d+\.\d+", images["kafka"])
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", images["prometheus"])
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", images["grafana"])
    env = services["kafka"]["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"] and "broker" in env["KAFKA_PROCESS_ROLES"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    # one replica builds the image; the other and sample-crawl run that image
    assert [name for name, s in services.items() if "build" in s] == [REPLICAS[0]]
    assert services[REPLICAS[0]]["build"] == "."
    assert {images[name] for name in (*REPLICAS, "sample-crawl")} == {images[REPLICAS[0]]}
    for name in (*REPLICAS, "sample-crawl"):
        assert services[name]["environment"]["STREAM_DEDUP_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert set(services["sample-crawl"]["depends_on"]) == {"kafka", *REPLICAS}
    assert set(services["prometheus"]["depends_on"]) == set(REPLICAS)
    for service in services.values():  # every bind mount exists in the repository
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), source


def test_compose_commands_are_real_stream_dedup_commands() -> None:
    services = _compose()["services"]
    parser = build_parser()
    serve = parser.parse_args(services[REPLICAS[0]]["command"])
    assert serve.command == "serve" and serve.http_port == 8080 and serve.workers == 2
    script = services["sample-crawl"]["command"][0].replace("$$", "$").replace("$seed", "1")
    calls = []
    for line in script.splitlines():
        line = line.strip()
        if line.startswith("stream-dedup "):
            line = re.sub(r"\s*(>\s*/dev/null)?\s*(&&|\|\|\s*exit 1)?\s*$", "", line)
            calls.append(parser.parse_args(shlex.split(line)[1:]))
    assert [c.command for c in calls] == ["sample", "replay"]
    assert calls[1].to_kafka == serve.input_topic == "pages"
    assert calls[1].inputs == [f"{calls[0].directory}/sample.warc.gz",
                               f"{calls[0].directory}/sample.jsonl"]


def test_compose_replicas_decide_as_one() -> None:
    """Two `serve` in one consumer group, on one shared index in the compose Redis Cluster,
    each started after the cluster is joined and published on its own host port."""
    services = _compose()["services"]
    settings = {name: _serve_settings(services[name]) for name in REPLICAS}
    assert len({s.group_id for s in settings.values()}) == 1
    assert {s.input_topic for s in settings.values()} == {"pages"}
    # the input topic has a partition for each replica, or one of them would idle
    partitions = int(services["kafka"]["environment"]["KAFKA_NUM_PARTITIONS"])
    assert partitions >= len(REPLICAS)
    host_ports = []
    for name, s in settings.items():
        assert s.index == "redis"
        url = urlsplit(s.redis_url)
        assert url.scheme == "redis" and url.hostname in REDIS_NODES, s.redis_url
        node = services[url.hostname]["command"]
        node_port = int(node[node.index("--port") + 1]) if "--port" in node else 6379
        assert url.port == node_port
        depends = services[name]["depends_on"]
        assert depends["redis-cluster-init"]["condition"] == "service_completed_successfully"
        assert depends["kafka"]["condition"] == "service_healthy"
        (published,) = services[name]["ports"]
        address, host_port, container_port = published.split(":")
        assert address == "127.0.0.1" and int(container_port) == s.http_port
        host_ports.append(int(host_port))
    assert sorted(host_ports) == [8080, 8081]
    assert len({s.redis_url for s in settings.values()}) == 1


def test_compose_redis_cluster_is_three_masters_joined_once() -> None:
    services = _compose()["services"]
    for name in REDIS_NODES:
        node = services[name]
        assert re.fullmatch(r"redis:\d+\.\d+\.\d+", node["image"])
        command = node["command"]
        options = dict(zip(command[1::2], command[2::2], strict=True))
        assert command[0] == "redis-server" and options["--cluster-enabled"] == "yes"
        assert options["--cluster-announce-hostname"] == name  # clients follow MOVED to it
        assert options["--cluster-preferred-endpoint-type"] == "hostname"
        assert (options["--appendonly"], options["--save"]) == ("no", "")
        assert options["--maxmemory-policy"] == "noeviction"
        # a page's record (~700 bytes) stays one compact listpack hash
        assert int(options["--hash-max-listpack-value"]) >= 1024
        assert "ports" not in node  # the addresses it announces mean nothing on the host
    init = services["redis-cluster-init"]
    assert init["image"] == services["redis-1"]["image"] and init["restart"] == "no"
    assert set(init["depends_on"]) == set(REDIS_NODES)
    assert all(d["condition"] == "service_healthy" for d in init["depends_on"].values())
    script = init["command"][0].replace("$$", "$")
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    assert "--cluster create $nodes --cluster-replicas 0 --cluster-yes" in script
    assert f"for host in {' '.join(REDIS_NODES)}; do" in script


def test_dockerfile_is_slim_and_non_root() -> None:
    lines = [ln.strip() for ln in (REPO / "Dockerfile").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert froms == ["FROM python:3.11-slim AS build", "FROM python:3.11-slim"]
    # the kernels are compiled in the build stage (setup.py is copied there), and the runtime
    # stage refuses an image whose wheel came without them
    assert any(ln.startswith("COPY") and "setup.py" in ln for ln in lines)
    assert any(ln.startswith("RUN pip wheel") for ln in lines)
    assert any("import stream_dedup.core._native" in ln for ln in lines)
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert 'ENTRYPOINT ["stream-dedup"]' in lines
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".git" in ignored and "tests" in ignored


def test_docs_name_every_alert() -> None:
    # docs/operating.md (the main README links it) and deploy/README.md (the shared index's)
    readme = (REPO / "docs" / "operating.md").read_text() + (DEPLOY / "README.md").read_text()
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        assert f"`{rule['alert']}`" in readme, rule["alert"]
