"""Hostile records and a broker outage against a real broker: the stream never stops.

Each poison kind sits between two good pages on one partition; the service must give every
record a decision, send the poison's bytes to the dead-letter topic, commit past it, and
keep running. The outage test stops its own broker mid-stream and starts it again.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from opskit import DEPLOY, free_broker_port, free_port, get, samples, wait_for
from schemakit import decision_of
from test_service import (
    committed_and_end,
    create_topics,
    decisions_of,
    kcat_consume,
    kcat_produce,
    names,
    page_message,
    service,  # noqa: F401  (the fixture)
)
from test_warc_kafka import produce, raw_messages
from warcgen import Resp, http_block, metadata, request, response, warc_record, warcinfo

from stream_dedup.cli.sample import build

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

GOOD = build(seed=41)


def _headers(message: dict[str, Any]) -> dict[str, str]:
    h = message.get("headers") or []
    return dict(zip(h[::2], h[1::2], strict=True))


def kcat_raw(bootstrap: str, topic: str, value: bytes, key: bytes,
             headers: tuple[bytes, ...] = ()) -> None:
    """One message with exactly these bytes (header arguments may be any bytes). Key and
    value go through stdin, between delimiters that neither holds: a key can be longer than
    one command-line argument may be."""
    assert b"\x01" not in key + value and b"\x02" not in key + value
    cmd: list[bytes] = [b"kcat", b"-P", b"-b", bootstrap.encode(), b"-t", topic.encode(),
                        b"-K", b"\x01", b"-D", b"\x02"]
    for h in headers:
        cmd += [b"-H", h]
    subprocess.run(cmd, input=key + b"\x01" + value + b"\x02", check=True, timeout=60)


def _good(i: int) -> tuple[str, bytes]:
    return page_message(GOOD[i])


def test_poison_records_become_dead_letters_and_the_stream_goes_on(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    b, t = kafka_bootstrap, names("poison")
    create_topics(b, [t["input"]], partitions=1)
    _create_topic(b, t["kept"], {"max.message.bytes": "200000"})
    long_url = "https://x.example/" + "a" * 600_000
    poisons = [
        # 1. a URL holding a lone surrogate (valid JSON, not valid Unicode)
        ("surrogate", b'{"url":"https://x.example/\\ud800","html":"<p>hi</p>"}', b"k-sur", ()),
        # 3. a header key that is not UTF-8 (aiokafka's reader raises on it)
        ("header", json.dumps({"url": "https://x.example/h", "html": "<p>h</p>"}).encode(),
         b"k-hdr", (b"\xff\xfekey=v",)),
        # 4. a 600 KB URL: its decision (the URL twice: value and key) is above 1 MB
        ("long-url", json.dumps({"url": long_url, "html": GOOD[2].html}).encode(),
         b"k-long", ()),
        # 4. a kept page above the kept topic's max.message.bytes (200,000)
        ("big-kept", json.dumps({"url": "https://x.example/big", "html": "<p>" + " ".join(
            f"w{i}" for i in range(60_000)) + "</p>"}).encode(), b"k-big", ()),
    ]
    for i, (_, value, key, headers) in enumerate(poisons):
        kcat_produce(b, t["input"], [_good(2 * i + 4)])
        kcat_raw(b, t["input"], value, key, headers)
    kcat_produce(b, t["input"], [_good(12)])
    total = 2 * len(poisons) + 1
    svc = service(t, "--batch-size", "3")
    wait_for("every record decided",
             lambda: len(kcat_consume(b, t["decisions"])) >= total, timeout=120)
    assert svc.proc.poll() is None, svc.text()[-3000:]  # still running
    assert svc.stop() == 0

    messages = kcat_consume(b, t["decisions"])
    got = [decision_of(m["payload"]) for m in messages]
    assert [d["source"] for d in got] == [f"{t['input']}/0/{i}" for i in range(total)]
    poison_decisions = got[1::2]
    assert [(d["decision"], d["reason"]) for d in poison_decisions] == [
        ("reject", "bad-url"), ("reject", "bad-header"), ("keep", "unique"),
        ("keep", "unique")]
    assert all(d["decision"] == "keep" for d in got[0::2])
    long_decision = messages[5]
    assert int(_headers(long_decision)["stream-dedup-reduced"]) > 1_000_000
    assert got[5]["url"].startswith("https://x.example/aaa") and len(got[5]["url"]) < 2000

    dead = kcat_consume(b, t["dead"])
    assert [_headers(m)["stream-dedup-error"] for m in dead] == ["bad-url", "bad-header"]
    assert dead[0]["payload"].encode() == poisons[0][1]  # the original bytes
    assert json.loads(dead[1]["payload"])["url"] == "https://x.example/h"
    assert "\\xff\\xfekey" in _headers(dead[1])["stream-dedup-message"]

    kept = {m["offset"]: m for m in kcat_consume(b, t["kept"])}
    refs = [m for m in kept.values() if "stream-dedup-ref" in _headers(m)]
    assert [_headers(m)["stream-dedup-ref"] for m in refs] == [
        f"{t['input']}/0/5", f"{t['input']}/0/7"]  # both too large for 200,000 bytes
    assert all(not m["payload"] for m in refs)
    assert committed_and_end(b, t["input"], t["group"]) == (total, total)
    assert "larger than the kept topic" in svc.text()  # the warning at start


def test_html_input_with_a_bad_status_header(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    b, t = kafka_bootstrap, names("status")
    create_topics(b, [t["input"]], partitions=1)
    html = GOOD[0].html.encode()
    kcat_raw(b, t["input"], html, b"https://s.example/1", (b"status=200",))
    kcat_raw(b, t["input"], html, b"https://s.example/2", ("status=²".encode(),))  # 2.
    kcat_raw(b, t["input"], GOOD[1].html.encode(), b"https://s.example/3",
             (b"\xc3\x28=x", b"status=200"))  # 3., in the html format
    kcat_raw(b, t["input"], GOOD[2].html.encode(), b"https://s.example/4")
    svc = service(t, "--input-format", "html", "--batch-size", "2")
    wait_for("4 decisions", lambda: len(kcat_consume(b, t["decisions"])) >= 4)
    assert svc.stop() == 0
    got = decisions_of(b, t["decisions"])
    assert [(d["decision"], d["reason"]) for d in got] == [
        ("keep", "unique"), ("reject", "bad-field"), ("reject", "bad-header"),
        ("keep", "unique")]
    assert "status" in got[1]["error"]
    dead = kcat_consume(b, t["dead"])
    assert [m["payload"].encode() for m in dead] == [html, GOOD[1].html.encode()]


def _firehose(i: int, **change: Any) -> bytes:
    """GOOD[i] as Scrapy Cluster's crawled_firehose message, with `change` applied."""
    page = GOOD[i]
    msg = {"url": page.url, "response_url": page.url, "status_code": 200, "status_msg": "OK",
           "body": page.html, "encoding": "utf-8",
           "response_headers": {"Content-Type": ["text/html; charset=utf-8"]},
           "timestamp": "2026-01-01T00:00:00", "crawlid": f"c-{i}", "appid": "app",
           "links": [], "attrs": None, **change}
    return json.dumps({k: v for k, v in msg.items() if v is not ...}).encode()


def test_bad_firehose_fields_are_dead_letters_of_their_own_kinds(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """--input-format scrapy-cluster: one poison of each kind a dialect adds, each between
    two good pages; the rejects carry their crawlid too (but the one too large)."""
    b, t = kafka_bootstrap, names("firehose")
    create_topics(b, [t["input"]], partitions=1)
    poisons = [
        ("no-body", _firehose(40, body=...)),
        ("bad-body", _firehose(41, body=["<p>a list</p>"])),
        ("unknown-encoding", _firehose(42, encoding="klingon-8")),
        ("bad-headers", _firehose(43, response_headers={"Content-Type": 5})),
        ("bad-status", _firehose(44, status_code="two hundred")),
        ("bad-timestamp", _firehose(45, timestamp={"at": 1})),
        ("carried-too-large", _firehose(46, crawlid="c" * 5000)),
    ]
    goods = [14 + 2 * i for i in range(len(poisons) + 1)]  # kept, every one (sample pages)
    for good, (_, value) in zip(goods, poisons, strict=False):
        kcat_raw(b, t["input"], _firehose(good), b"")
        kcat_raw(b, t["input"], value, b"")
    kcat_raw(b, t["input"], _firehose(goods[-1]), b"")
    total = 2 * len(poisons) + 1
    svc = service(t, "--input-format", "scrapy-cluster", "--carry-fields", "crawlid",
                  "--batch-size", "3")
    wait_for("every record decided",
             lambda: len(kcat_consume(b, t["decisions"])) >= total, timeout=120)
    assert svc.proc.poll() is None, svc.text()[-3000:]  # still running
    assert svc.stop() == 0
    got = decisions_of(b, t["decisions"])
    assert [d["source"] for d in got] == [f"{t['input']}/0/{i}" for i in range(total)]
    assert [(d["decision"], d["reason"]) for d in got[1::2]] == [
        ("reject", kind) for kind, _ in poisons]
    assert [(d["decision"], d["carried"]) for d in got[0::2]] == [
        ("keep", {"crawlid": f"c-{i}"}) for i in goods]
    assert [d["carried"]["crawlid"] for d in got[1::2]] == [
        f"c-{40 + i}" for i in range(len(poisons) - 1)] + [None]
    assert all(d["url"] == GOOD[40 + i].url for i, d in enumerate(got[1::2]))
    dead = kcat_consume(b, t["dead"])
    assert [_headers(m)["stream-dedup-error"] for m in dead] == [k for k, _ in poisons]
    assert [m["payload"].encode() for m in dead] == [v for _, v in poisons]
    assert committed_and_end(b, t["input"], t["group"]) == (total, total)


def test_a_non_retriable_error_stops_with_a_clear_message(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A compacted kept topic refuses a message without a key (the broker's
    InvalidRecordException, non-retriable): a configuration error, not a page's fault."""
    b, t = kafka_bootstrap, names("fatal")
    create_topics(b, [t["input"]], partitions=1)
    _create_topic(b, t["kept"], {"cleanup.policy": "compact"})
    subprocess.run(["kcat", "-P", "-b", b, "-t", t["input"]], input=_good(0)[1], check=True,
                   timeout=60)  # no key
    svc = service(t)
    assert svc.wait(timeout=90) == 1
    text = svc.text()
    assert f"stopping: sending to {t['kept']}" in text, text[-3000:]
    assert "Traceback" not in text
    assert committed_and_end(b, t["input"], t["group"]) == (0, 1)  # nothing committed


def _create_topic(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    import asyncio

    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=config)])
        finally:
            await admin.close()
    asyncio.run(go())


# --- a broker outage ----------------------------------------------------------------------
@pytest.fixture
def own_broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A broker of this test's own, so it can be stopped without touching the others'."""
    directory = tmp_path / "kafka"
    port = free_broker_port()  # below the ephemeral range: the broker restarts on it
    env = {**os.environ, "KAFKA_LOCAL_PORT": str(port),
           "KAFKA_LOCAL_CONTROLLER_PORT": str(free_broker_port(taken=port)),
           "KAFKA_LOCAL_STOP_TIMEOUT": "10"}
    script = str(DEPLOY / "kafka-local")

    def run(cmd: str) -> str:
        """start, stop, or freeze/thaw (SIGSTOP/SIGCONT: a hung broker, not a dead one)."""
        if cmd in ("freeze", "thaw"):
            pid = int((directory / "kafka.pid").read_text())
            os.kill(pid, signal.SIGSTOP if cmd == "freeze" else signal.SIGCONT)
            return ""
        done = subprocess.run([script, cmd, str(directory)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1] if cmd == "start" else ""

    bootstrap = run("start")
    try:
        yield bootstrap, run
    finally:
        run("thaw")
        subprocess.run([script, "stop", str(directory)], env=env, capture_output=True,
                       timeout=120)


def _serve(bootstrap: str, t: dict[str, str], log: Path, *extra: str
           ) -> subprocess.Popen[bytes]:
    """`serve` as a child process of this test (its broker is the test's own)."""
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers", bootstrap,
             "--input-topic", t["input"], "--decisions-topic", t["decisions"],
             "--dead-letter-topic", t["dead"], "--group-id", t["group"], "--http-port", "0",
             *extra], stdout=fh, stderr=fh)


def _sigterm_exits_within(proc: subprocess.Popen[bytes], log: Path, seconds: float) -> None:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert time.monotonic() - started < seconds, log.read_text()[-3000:]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_broker_outage_mid_stream_is_survived_quietly(own_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bootstrap, broker = own_broker
    t = names("outage")
    create_topics(bootstrap, [t["input"]], partitions=1)
    pages = [p for seed in range(50, 56) for p in build(seed=seed)]
    first, second = pages[: len(pages) // 2], pages[len(pages) // 2:]
    kcat_produce(bootstrap, t["input"], [page_message(p) for p in first])
    port = free_port()
    log = tmp_path / "serve.log"
    proc = _serve(bootstrap, t, log, "--http-port", str(port), "--batch-size", "20")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for("the first half decided",
                 lambda: len(kcat_consume(bootstrap, t["decisions"])) >= len(first))
        broker("stop")
        size0, cpu0, t0 = log.stat().st_size, _cpu_seconds(proc.pid), time.monotonic()
        wait_for("/readyz to report the broker",
                 lambda: get(base + "/readyz")[0] == 503, timeout=30)
        time.sleep(20)  # the outage; what is measured is what it costs, not an absence
        cpu = (_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        logged = log.stat().st_size - size0
        errors = samples(get(base + "/metrics")[1].decode(), "stream_dedup_kafka_errors_total")
        assert cpu < 0.25, f"{cpu:.0%} of a core while the broker was down"
        assert logged < 30_000, f"{logged} bytes of log in 20 s"
        assert sum(errors.values()) >= 3, errors
        broker("start")
        kcat_produce(bootstrap, t["input"], [page_message(p) for p in second])
        wait_for("every page decided after the outage",
                 lambda: len(kcat_consume(bootstrap, t["decisions"])) >= len(pages), timeout=180)
        assert get(base + "/readyz")[0] == 200
        _sigterm_exits_within(proc, log, 10)
    finally:
        if proc.poll() is None:
            proc.kill()
    got = decisions_of(bootstrap, t["decisions"])
    assert {d["source"] for d in got} == {f"{t['input']}/0/{i}" for i in range(len(pages))}
    assert committed_and_end(bootstrap, t["input"], t["group"]) == (len(pages), len(pages))


def test_sigterm_while_the_broker_is_down_exits_within_seconds(own_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bootstrap, broker = own_broker
    t = names("down")
    create_topics(bootstrap, [t["input"]], partitions=1)
    pages = build(seed=57)
    kcat_produce(bootstrap, t["input"], [page_message(p) for p in pages])
    log = tmp_path / "serve.log"
    proc = _serve(bootstrap, t, log, "--batch-size", "5")
    try:
        wait_for("a first decision", lambda: len(kcat_consume(bootstrap, t["decisions"])) >= 1)
        broker("stop")
        wait_for("the service to notice", lambda: "Unable" in log.read_text(errors="replace")
                 or "not acknowledged" in log.read_text(errors="replace"), timeout=60)
        _sigterm_exits_within(proc, log, 10)
    finally:
        if proc.poll() is None:
            proc.kill()
    broker("start")  # what was decided but not committed is delivered again: nothing lost
    committed, end = committed_and_end(bootstrap, t["input"], t["group"])
    decided = {d["source"] for d in decisions_of(bootstrap, t["decisions"])}
    assert committed <= len(decided) and end == len(pages)


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_compressed_input_batches_with_a_bad_header_key(kafka_bootstrap: str, service,  # noqa: F811
                                                        codec: str) -> None:  # type: ignore[no-untyped-def]
    b, t = kafka_bootstrap, names(f"z{codec}")
    create_topics(b, [t["input"]], partitions=1)
    lines = b"".join(_good(i)[1] + b"\n" for i in range(6))
    subprocess.run(["kcat", "-P", "-b", b, "-t", t["input"], "-z", codec, "-H", "x=1"],
                   input=lines, check=True, timeout=60)
    subprocess.run([b"kcat", b"-P", b"-b", b.encode(), b"-t", t["input"].encode(), b"-z",
                    codec.encode(), b"-H", b"\xff\xfekey=v"], input=lines, check=True, timeout=60)
    svc = service(t, "--batch-size", "5")
    wait_for("12 decisions", lambda: len(kcat_consume(b, t["decisions"])) >= 12)
    assert svc.stop() == 0
    got = decisions_of(b, t["decisions"])
    assert [d["source"] for d in got] == [f"{t['input']}/0/{i}" for i in range(12)]
    assert all(d["decision"] != "reject" for d in got[:6])
    assert [(d["decision"], d["reason"]) for d in got[6:]] == [("reject", "bad-header")] * 6


def test_output_topics_with_small_limits(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Output topics that accept a few KB: small messages are not packed into a batch the
    broker refuses (it holds a whole batch to the limit), and what does not fit alone is
    reduced, never emptied."""
    b, t = kafka_bootstrap, names("small")
    create_topics(b, [t["input"]], partitions=1)
    _create_topic(b, t["decisions"], {"max.message.bytes": "5000"})
    _create_topic(b, t["kept"], {"max.message.bytes": "3000"})
    _create_topic(b, t["dead"], {"max.message.bytes": "2000"})
    small = [(f"https://s.example/{i}", json.dumps({"url": f"https://s.example/{i}", "html":
              f"<p>page {i}: " + " ".join(f"w{i}x{j}" for j in range(60)) + "</p>"}).encode())
             for i in range(30)]
    bad = [(f"k{i}", b"{not json " + b"x" * 1200) for i in range(10)]
    kcat_produce(b, t["input"], small + bad)
    svc = service(t, "--batch-size", "50")
    wait_for("40 decisions", lambda: len(kcat_consume(b, t["decisions"])) >= 40, timeout=120)
    assert svc.stop() == 0
    got = decisions_of(b, t["decisions"])  # every value parses as a decision
    assert [d["decision"] for d in got] == ["keep"] * 30 + ["reject"] * 10
    kept = kcat_consume(b, t["kept"])
    assert [json.loads(m["payload"])["url"] for m in kept] == [u for u, _ in small]
    dead = kcat_consume(b, t["dead"])
    assert len(dead) == 10 and all(
        _headers(m)["stream-dedup-source"].startswith(t["input"] + "/0/")
        and _headers(m)["stream-dedup-error"] == "bad-json"
        and m["payload"].startswith("{not json") for m in dead)
    assert "producer batches of at most 2000 bytes" in svc.text()


def test_sigterm_while_connecting_to_a_hung_broker(own_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A broker that accepts connections but never answers (SIGSTOP) holds a client's start
    for its request timeout (40 s): a stop must not wait for it."""
    bootstrap, broker = own_broker
    t = names("hung")
    broker("freeze")
    log = tmp_path / "serve.log"
    proc = _serve(bootstrap, t, log)
    try:
        wait_for("the service to start connecting",
                 lambda: "stream-dedup serve:" in log.read_text(errors="replace"))
        _sigterm_exits_within(proc, log, 10)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_warc_poison_records_are_dead_letters_and_the_stream_goes_on(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Each kind of bad WARC message between good ones, skipped records among them: a
    reject of its kind for each, its bytes on the dead-letter topic, everything
    committed, the service still running."""
    b, t = kafka_bootstrap, names("warcpoison")
    create_topics(b, [t["input"]], partitions=1)
    html = b"<html><body>" + b" ".join(b"w%d" % i for i in range(400)) + b"</body></html>"
    good = [response(Resp(f"http://g.example/{i}", html.replace(b"w1 ", b"v%d " % i)))
            for i in range(8)]
    plain = response(Resp("http://p.example/", b"<p>plain</p>"))
    poisons = [
        (b'{"url": "http://j.example/", "html": "<p>json</p>"}', "not-warc"),
        # a deflate block of the reserved type (0xff): refused at once, whatever the record
        (gzip.compress(plain)[:10] + b"\xff" * 80, "bad-gzip"),
        (gzip.compress(plain)[:-30], "truncated"),
        (warc_record("response", http_block(Resp("http://x/", html)),
                     content_type="application/http; msgtype=response"), "no-url"),
        (plain + response(Resp("http://q.example/", html)), "multiple-records"),
        (warc_record("response", b"<html>no status line", url="http://h.example/",
                     content_type="application/http; msgtype=response"), "bad-http"),
        (plain.replace(b"Content-Length:", b"Content-Lenght:", 1), "bad-record"),
    ]
    skipped = [warcinfo(), request("http://g.example/0"), gzip.compress(metadata("http://g/"))]
    values = [skipped[0]]
    for i, (value, _) in enumerate(poisons):
        values += [good[i], value]
    values += [skipped[1], good[7], skipped[2]]
    produce(b, t["input"], values)
    svc = service(t, "--input-format", "warc", "--batch-size", "3")
    wait_for("every record committed", lambda: committed_and_end(b, t["input"], t["group"])
             == (len(values), len(values)), timeout=120)
    assert svc.proc.poll() is None, svc.text()[-3000:]
    got = decisions_of(b, t["decisions"])
    assert [d["reason"] for d in got if d["decision"] == "reject"] == [k for _, k in poisons]
    assert [d["url"] for d in got if d["decision"] != "reject"] == [
        f"http://g.example/{i}" for i in range(8)]
    dead = raw_messages(b, t["dead"])
    assert [h["stream-dedup-error"].decode() for _, h in dead] == [k for _, k in poisons]
    assert [v for v, _ in dead] == [v for v, _ in poisons]  # the bytes as they came
    assert svc.stop() == 0
    assert "'warcinfo': 1, 'request': 1, 'metadata': 1" in svc.text()
