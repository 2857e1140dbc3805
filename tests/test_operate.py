"""Operating the service for real: `serve` with its HTTP API on a real broker, scraped by a
real Prometheus (Debian package `prometheus`), its metrics checked against the topics, and
every metric the dashboard and the alert rules use found in its /metrics output."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from opskit import (
    DEPLOY,
    free_port,
    get,
    get_json,
    queried_metrics,
    reordered_pair,
    sample_names,
    samples,
    wait_for,
)
from schemakit import decision_of
from test_service import committed_and_end

from stream_dedup.cli.sample import build


@dataclass
class Running:
    url: str
    topics: dict[str, str]
    sent: int
    with_fetch_time: int
    bootstrap: str
    log: Path


def _messages() -> tuple[list[tuple[bytes, bytes]], int]:
    """Sample pages (a third carry fetched_at), a reordered pair and two bad messages."""
    out: list[tuple[bytes, bytes]] = []
    with_fetch_time = 0
    for i, p in enumerate(build(seed=41)):
        page: dict[str, Any] = {"url": p.url, "html": p.html}
        if i % 3 == 0:
            page["fetched_at"] = "2026-01-02T03:04:05Z"
            with_fetch_time += 1
        out.append((p.url.encode(), json.dumps(page).encode()))
    first, reordered = reordered_pair()
    out += [(b"http://r/1", json.dumps({"url": "http://r/1", "html": first}).encode()),
            (b"http://r/2", json.dumps({"url": "http://r/2", "html": reordered}).encode()),
            (b"bad1", b"{not json"), (b"bad2", b'{"html": "<p>no url</p>"}')]
    return out, with_fetch_time


async def _produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in messages:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def _consume(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e",
                          "-J", "-q"], capture_output=True, timeout=60, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def running(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tag = f"ops-{uuid.uuid4().hex[:10]}"
    t = {"input": f"{tag}-pages", "decisions": f"{tag}-decisions", "dead": f"{tag}-dead",
         "group": f"{tag}-group"}
    messages, with_fetch_time = _messages()
    asyncio.run(_produce(kafka_bootstrap, t["input"], messages))
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers",
             kafka_bootstrap, "--input-topic", t["input"], "--decisions-topic", t["decisions"],
             "--dead-letter-topic", t["dead"], "--group-id", t["group"], "--batch-size", "16",
             "--http-port", str(port)], stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def done() -> bool:
            try:
                status, body = get(url + "/v1/stats")
            except OSError:  # not listening yet
                return False
            if status != 200:
                return False
            stats = json.loads(body)
            return bool(stats["pages"] == len(messages) and stats["kafka"]["consumer_lag"]
                        and stats["kafka"]["consumer_lag_total"] == 0)
        wait_for("every message decided and the lag seen at 0", done, timeout=120)
        # Decided is not yet delivered: the delivery metrics move once the broker acknowledged
        # a batch, before its commit.
        wait_for("every batch committed", lambda: committed_and_end(
            kafka_bootstrap, t["input"], t["group"])[0] == len(messages), timeout=60)
        yield Running(url, t, len(messages), with_fetch_time, kafka_bootstrap, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def _answers(url: str) -> bool:
    try:
        return get(url)[0] == 200
    except OSError:
        return False


def _metrics(running: Running) -> str:
    status, body = get(running.url + "/metrics")
    assert status == 200
    return body.decode()


# --- the service's numbers agree with the topics -----------------------------------------------
@pytest.mark.kafka
def test_metrics_agree_with_the_topics(running: Running) -> None:
    text = _metrics(running)
    decisions = [decision_of(m["payload"]) for m in _consume(running.bootstrap,
                                                             running.topics["decisions"])]
    assert len(decisions) == running.sent
    counted = Counter(f'{{decision="{d["decision"]}",reason="{d["reason"]}"}}'
                      for d in decisions)
    pages = {k: v for k, v in samples(text, "stream_dedup_pages_total").items() if v}
    assert pages == dict(counted)
    dead = _consume(running.bootstrap, running.topics["dead"])
    assert samples(text, "stream_dedup_kafka_dead_letters_total")[""] == len(dead) == 2
    assert samples(text, "stream_dedup_rejects_total") == {'{kind="bad-json"}': 1,
                                                            '{kind="no-url"}': 1}
    verify = samples(text, "stream_dedup_verify_total")
    assert verify['{outcome="overturned"}'] == 1 and verify['{outcome="confirmed"}'] == 8
    assert samples(text, "stream_dedup_near_precision_estimate")[""] == pytest.approx(8 / 9)
    lag = samples(text, "stream_dedup_kafka_consumer_lag")
    assert len(lag) == 2 and set(lag.values()) == {0.0}  # both partitions, nothing waiting
    latency = samples(text, "stream_dedup_decision_latency_seconds_count")
    assert latency['{since="fetch"}'] == running.with_fetch_time
    assert latency['{since="consume"}'] == running.sent - running.with_fetch_time
    batches = samples(text, "stream_dedup_batches_total")[""]
    assert batches == samples(text, "stream_dedup_kafka_commit_seconds_count")[""] >= 2
    assert samples(text, "stream_dedup_index_pages")[""] == counted[
        '{decision="keep",reason="unique"}'] + 1  # + the verified-distinct page


@pytest.mark.kafka
def test_readyz_check_and_stats_on_the_service(running: Running) -> None:
    ready = get_json(running.url + "/readyz")
    assert ready["ready"] and ready["checks"]["broker"] == {"ok": True,
                                                            "detail": running.bootstrap}
    page = build(seed=41)[0]
    status, body = get(running.url + "/v1/stats")
    before = json.loads(body)["pages"]
    req = urllib.request.Request(
        running.url + "/v1/check?" + urllib.parse.urlencode({"url": "http://elsewhere/"}),
        data=page.html.encode(), headers={"Content-Type": "text/html; charset=utf-8"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        d = decision_of(json.dumps(json.loads(resp.read())["decision"]))
    assert (d["decision"], d["reason"]) == ("drop", "exact")
    # two partitions: the article or its tracking-URL copy may have been kept first
    assert d["duplicate_of"]["url"] in (page.url, page.url + "?utm_source=feed")
    assert get_json(running.url + "/v1/stats")["pages"] == before  # a check is not a page


# --- the dashboard and the alerts ask only for metrics that exist --------------------------
def _dashboard_exprs() -> list[str]:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "stream-dedup.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def _alert_exprs() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


@pytest.mark.kafka
def test_every_metric_of_the_dashboard_and_alerts_exists(running: Running) -> None:
    exposed = sample_names(_metrics(running))
    wanted = {m for expr in _dashboard_exprs() + _alert_exprs() for m in queried_metrics(expr)}
    assert len(wanted) >= 15
    assert wanted - exposed == set()


# --- a real Prometheus scrapes it ------------------------------------------------------------
@pytest.mark.kafka
def test_prometheus_scrapes_the_service(running: Running, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the `prometheus` binary is missing (apt-get install prometheus; tests/run)")
    port = free_port()
    target = urllib.parse.urlsplit(running.url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(DEPLOY / "prometheus" / "alerts.yml")],
        "scrape_configs": [{"job_name": "stream-dedup",
                            "static_configs": [{"targets": [target]}]}],
    }))
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([binary, f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=fh, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api/v1"

    def query(expr: str) -> list[dict[str, Any]]:
        body = get_json(f"{api}/query?" + urllib.parse.urlencode({"query": expr}))
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    try:
        wait_for("Prometheus to answer", lambda: _answers(f"http://127.0.0.1:{port}/-/ready"),
                 timeout=60)

        def target_up() -> bool:
            active = get_json(f"{api}/targets")["data"]["activeTargets"]
            return any(t["health"] == "up" and t["labels"]["job"] == "stream-dedup"
                       for t in active)
        wait_for("the stream-dedup target to be up", target_up, timeout=60)
        wait_for("a sample of the page counters",
                 lambda: bool(query("sum(stream_dedup_pages_total)")), timeout=30)

        total = query("sum(stream_dedup_pages_total)")
        assert float(total[0]["value"][1]) == running.sent
        by_decision = {r["metric"]["decision"]: float(r["value"][1])
                       for r in query("sum by (decision) (stream_dedup_pages_total)")}
        decisions = Counter(json.loads(m["payload"])["decision"] for m in _consume(
            running.bootstrap, running.topics["decisions"]))
        assert by_decision == {k: float(v) for k, v in decisions.items()}
        assert float(query("sum(stream_dedup_kafka_consumer_lag)")[0]["value"][1]) == 0

        def rules_evaluated() -> bool:
            groups = get_json(f"{api}/rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return len(rules) == len(_alert_exprs()) and all(
                r["health"] == "ok" for r in rules)
        wait_for("the alert rules to load and evaluate", rules_evaluated, timeout=30)
        firing = [a for a in get_json(f"{api}/alerts")["data"]["alerts"]
                  if a["state"] == "firing"]
        assert firing == []  # a healthy service

        # every dashboard query is valid PromQL for this Prometheus, and the main ones answer
        wait_for("two samples for rate()", lambda: bool(
            query("sum(rate(stream_dedup_pages_total[1m]))")), timeout=30)
        answered = {expr: query(expr.replace("$__rate_interval", "1m"))
                    for expr in _dashboard_exprs()}
        for needle in ("sum(rate(stream_dedup_pages_total", "stream_dedup_near_precision_estimate",
                       "stream_dedup_kafka_consumer_lag", "stream_dedup_index_pages"):
            assert any(result for expr, result in answered.items() if needle in expr), needle
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- no broker: alive, not ready --------------------------------------------------------------
def test_unreachable_broker_is_not_ready_but_alive(tmp_path: Path) -> None:
    port, dead_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers",
             f"127.0.0.1:{dead_port}", "--http-port", str(port)],
            stdout=fh, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("/healthz", lambda: _answers(url + "/healthz"), timeout=30)
        wait_for("a failed connection", lambda: "retrying in" in log.read_text(), timeout=30)
        status, body = get(url + "/readyz")
        ready = json.loads(body)
        assert status == 503 and ready["checks"]["broker"]["ok"] is False
        assert ready["checks"]["index"]["ok"] is True
        errors = samples(get(url + "/metrics")[1].decode(), "stream_dedup_kafka_errors_total")
        assert errors['{operation="connect"}'] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]


def test_a_busy_http_port_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers",
             f"127.0.0.1:{free_port()}", "--http-port", str(port)],
            capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in out.stderr
