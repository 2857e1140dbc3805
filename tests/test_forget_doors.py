"""The operator's doors to forgetting (cli/index.py, http/app.py's /v1/forget): `stream-dedup
index forget | stats` on an LSM directory and a Redis index that real `replay` processes made,
every bad word refused with exit 2 and nothing changed, and POST /v1/forget on a real
Deduplicator: refused without a configured token, 401 with a wrong one, 400 on a bad
selector, and a page forgotten is kept again by /v1/check.

The crawl: two hosts of unrelated pages (a.example crawled in January, b.example in June),
each with an exact copy and a near-duplicate, so that a host's pages are forgotten and
decided again without the other host's pages changing anything."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from indexkit import flush_redis
from opskit import free_port, get

from stream_dedup import Deduplicator, Page, Settings
from stream_dedup.http import ApiState, build_app
from stream_dedup.http.thread import BackgroundServer
from stream_dedup.index.namespaces import NamespaceError, check_name, selector
from stream_dedup.metrics import Metrics

REPO = Path(__file__).resolve().parents[1]
A, B = "a.example", "b.example"
TOKEN = "s3cret"


def _pages() -> list[dict[str, str]]:
    rng = random.Random(44)

    def text() -> list[str]:
        return [f"w{rng.randrange(10**6)}x" for _ in range(400)]

    def html(words: list[str]) -> str:
        return "<html><body>" + "".join(f"<p>{' '.join(words[i:i + 100])}</p>"
                                        for i in range(0, len(words), 100)) + "</body></html>"

    out = []
    for host, month in ((A, "01"), (B, "06")):
        texts = [text() for _ in range(5)]
        for i, words in enumerate(texts):
            out.append({"url": f"http://{host}/p{i}", "html": html(words),
                        "fetched_at": f"2026-{month}-{i + 1:02d}T00:00:00Z"})
        near = list(texts[1])
        near[200] = "changed"
        out.append({"url": f"http://{host}/copy0", "html": html(texts[0]),
                    "fetched_at": f"2026-{month}-10T00:00:00Z"})
        out.append({"url": f"http://{host}/near1", "html": html(near),
                    "fetched_at": f"2026-{month}-11T00:00:00Z"})
    return out


KEPT_A = KEPT_B = 5  # each host's five distinct pages


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("crawl") / "two-hosts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in _pages()))
    return path


def _cli(*args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "stream_dedup", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == status, (args, done.returncode, done.stderr[-2000:])
    return done


def _json(*args: str) -> Any:
    return json.loads(_cli(*args).stdout)


def _replay(crawl: Path, index: list[str], namespace: str, out: Path) -> list[dict[str, Any]]:
    _cli("replay", str(crawl), *index, "--namespace", namespace, "-o", str(out), "-q")
    return [json.loads(line) for line in out.read_text().splitlines()]


def _outcome(decisions: list[dict[str, Any]], host: str) -> list[tuple[str, str, str]]:
    return [(d["url"], d["decision"], d["reason"]) for d in decisions
            if d["url"].startswith(f"http://{host}/")]


def _keeps(decisions: list[dict[str, Any]], host: str) -> int:
    return sum(d == "keep" for _, d, _ in _outcome(decisions, host))


# --- index forget | stats on an LSM directory --------------------------------------------------

def test_forget_and_stats_on_an_lsm_index_made_by_replay(crawl: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "index")
    index = ["--index", "lsm", "--index-path", path]
    first = _replay(crawl, index, "n1", tmp_path / "n1.jsonl")
    assert (_keeps(first, A), _keeps(first, B)) == (KEPT_A, KEPT_B)
    _replay(crawl, index, "n2", tmp_path / "n2.jsonl")
    stats = _json("index", "stats", "--index-path", path)
    assert stats["pages"] == 2 * (KEPT_A + KEPT_B)
    assert {n: s["pages"] for n, s in stats["namespaces"].items()} == {
        "n1": KEPT_A + KEPT_B, "n2": KEPT_A + KEPT_B}
    assert stats["namespaces"]["n1"]["oldest"].startswith("2026-01-01")
    assert "offsets" in stats and stats["stamp"].startswith("0x")

    got = _json("index", "forget", "--host", A, "--namespace", "n1", *index)
    assert got["forgotten"] == KEPT_A
    assert (got["namespace"], got["selector"]) == ("n1", {"host": A})
    assert isinstance(got["seconds"], float) and got["seconds"] >= 0
    stats = _json("index", "stats", "--index-path", path)
    assert stats["namespaces"]["n1"]["pages"] == KEPT_B
    assert stats["namespaces"]["n2"]["pages"] == KEPT_A + KEPT_B  # another namespace: kept
    assert stats["namespaces"]["n1"]["oldest"].startswith("2026-06-01")

    again = _replay(crawl, index, "n1", tmp_path / "n1-again.jsonl")
    assert _outcome(again, A) == _outcome(first, A)  # decided as if never seen
    assert _keeps(again, B) == 0  # still held

    # --before: n2's January pages (host a), not its June ones
    got = _json("index", "forget", "--before", "2026-03-01", "--namespace", "n2", *index)
    assert (got["forgotten"], got["selector"]) == (KEPT_A, {"before": "2026-03-01"})
    # --url: one page; --all: the rest of a namespace
    got = _json("index", "forget", "--url", f"http://{B}/p3", "--namespace", "n2", *index)
    assert got["forgotten"] == 1
    got = _json("index", "forget", "--all", "--namespace", "n2", *index)
    assert got["forgotten"] == KEPT_B - 1
    got = _json("index", "forget", "--all", *index)  # the default namespace holds nothing
    assert (got["forgotten"], got["namespace"]) == (0, "")
    stats = _json("index", "stats", "--index-path", path)
    assert stats["pages"] == KEPT_A + KEPT_B
    assert stats["namespaces"].get("n2", {}).get("pages", 0) == 0


@pytest.fixture(scope="module")
def lsm_index(crawl: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lsm") / "index"
    _replay(crawl, ["--index", "lsm", "--index-path", str(path)], "n1", path.parent / "d.jsonl")
    return path


def _held(path: Path) -> list[tuple[int, str, str]]:
    """Every page the LSM index holds: (row, URL, namespace)."""
    from stream_dedup.index.lsm import LsmIndex

    index = LsmIndex(path, stamp=None, create=False)
    try:
        return [(row, doc.url, doc.namespace) for row, doc, *_ in index.stored_docs()]
    finally:
        index.close()


BAD = {
    "two selectors": (["forget", "--host", A, "--all"], "exactly one of"),
    "no selector": (["forget", "--namespace", "n1"], "exactly one of"),
    "malformed date": (["forget", "--before", "2026-02-30", "--namespace", "n1"],
                       "is not a date"),
    "empty namespace": (["forget", "--all", "--namespace", ""], "a namespace needs a name"),
    "bad namespace": (["forget", "--all", "--namespace", "n 1"], "is not a namespace name"),
    "empty url": (["forget", "--url", " ", "--namespace", "n1"], "give the page's URL"),
    "unknown selector": (["forget", "--path", "/p1", "--namespace", "n1"],
                         "unrecognized arguments: --path"),
    "selector on stats": (["stats", "--host", A], "only `index forget` takes a selector"),
    "compact of redis": (["compact", "--index", "redis", "--redis-url", "redis://127.0.0.1:1"],
                         "works on an LSM index directory"),
    "no index": (["forget", "--all"], "needs an index"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_words_exit_2_with_a_reason_and_change_nothing(case: str, lsm_index: Path) -> None:
    argv, reason = BAD[case]
    before = _held(lsm_index)
    assert len(before) == KEPT_A + KEPT_B
    where = [] if "--index" in argv or case == "no index" else ["--index-path", str(lsm_index)]
    done = _cli("index", *argv, *where, status=2)
    lines = done.stderr.splitlines()
    assert reason in lines[-1] and lines[-1].startswith("stream-dedup"), done.stderr
    if case != "unknown selector":  # argparse's own: its usage line, then the reason
        assert len(lines) == 1, done.stderr
    assert _held(lsm_index) == before


def test_index_help_teaches_forget() -> None:
    text = _cli("index", "--help").stdout
    for shown in ("index forget --host example.com --namespace crawl-7", "--before DATE",
                  "--index redis --redis-url", '{"forgotten": N'):
        assert shown in text


# --- index forget | stats on a Redis index -----------------------------------------------------

@pytest.mark.redis
def test_forget_and_stats_on_a_redis_index(crawl: Path, tmp_path: Path, redis_url: str) -> None:
    flush_redis(redis_url)
    index = ["--index", "redis", "--redis-url", redis_url]
    first = _replay(crawl, index, "n1", tmp_path / "n1.jsonl")
    assert (_keeps(first, A), _keeps(first, B)) == (KEPT_A, KEPT_B)
    stats = _json("index", "stats", *index)
    assert stats["namespaces"]["n1"]["pages"] == KEPT_A + KEPT_B
    assert stats["namespaces"]["n1"]["oldest"].startswith("2026-01-01")

    # other sketch parameters than the index's: refused, nothing forgotten
    done = _cli("index", "forget", "--host", A, "--namespace", "n1", *index, "--groups", "5",
                status=2)
    assert "other sketch parameters" in done.stderr, done.stderr
    assert _json("index", "stats", *index)["namespaces"] == stats["namespaces"]
    done = _cli("index", "export", str(tmp_path / "copy"), *index, status=2)
    assert "works on an LSM index directory" in done.stderr

    got = _json("index", "forget", "--host", A, "--namespace", "n1", *index)
    assert (got["forgotten"], got["namespace"], got["selector"]) == (KEPT_A, "n1", {"host": A})
    stats = _json("index", "stats", *index)
    assert stats["namespaces"]["n1"]["pages"] == KEPT_B
    again = _replay(crawl, index, "n1", tmp_path / "n1-again.jsonl")
    assert _outcome(again, A) == _outcome(first, A)
    assert _keeps(again, B) == 0


# --- POST /v1/forget -------------------------------------------------------------------------

def _state(token: str = "") -> ApiState:
    settings = Settings(http_token=token)
    metrics = Metrics(settings)
    dedup = Deduplicator(settings, observer=metrics)
    dedup.check_batch([_page(p) for p in _pages()])
    assert len(dedup.index) == KEPT_A + KEPT_B
    return ApiState(settings, metrics, dedup)


def _page(p: dict[str, str]) -> Page:
    return Page(p["url"], p["html"].encode(), (("Content-Type", "text/html"),), p["fetched_at"])


def _run(state: ApiState, go: Any) -> None:
    async def main() -> None:
        async with TestClient(TestServer(build_app(state))) as client:
            await go(client)
    asyncio.run(main())


async def _check(c: TestClient[Any, Any], p: dict[str, str], headers: dict[str, str]) -> str:
    r = await c.post(f"/v1/check?url={p['url']}", data=p["html"].encode(),
                     headers={"Content-Type": "text/html", **headers})
    assert r.status == 200
    return str((await r.json())["decision"]["decision"])


def test_forget_is_refused_without_a_configured_token() -> None:
    state = _state()

    async def go(c: TestClient[Any, Any]) -> None:
        for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
            r = await c.post("/v1/forget", json={"all": True}, headers=headers)
            body = await r.json()
            assert r.status == 403 and body["error"] == "forbidden", body
            assert "STREAM_DEDUP_HTTP_TOKEN" in body["message"]
        assert (await c.get("/v1/stats")).status == 200  # the rest of /v1 stays open
        assert await _check(c, _pages()[0], {}) == "drop"
    _run(state, go)
    assert state.dedup is not None and len(state.dedup.index) == KEPT_A + KEPT_B


# Bad selectors: 400 with the NamespaceError's own message
BAD_SELECTORS: list[dict[str, Any]] = [
    {"host": A, "all": True}, {}, {"namespace": "n1"}, {"all": False},
    {"before": "2026-02-30"}, {"namespace": "", "all": True}, {"namespace": "n 1", "all": True},
    {"url": " "},
]
# Bad shapes: 400 saying what is wrong
BAD_SHAPES: list[tuple[Any, str]] = [
    ({"path": "/p1"}, "unknown field(s) path"), ({"all": "yes"}, "all is true or false"),
    ({"host": 7}, "the others are strings"), (["all"], "send a JSON object"),
    ("all", "send a JSON object"),
]


def _refusal(words: dict[str, Any]) -> str:
    """What index/namespaces.py says of these words."""
    try:
        if "namespace" in words:
            check_name(words["namespace"])
        selector(**{k: v for k, v in words.items() if v is not False})
    except NamespaceError as err:
        return str(err)
    raise AssertionError(f"{words} are good words")


def test_forget_with_the_token() -> None:
    state = _state(TOKEN)
    assert state.dedup is not None
    ok = {"Authorization": f"Bearer {TOKEN}"}
    pages = _pages()

    async def go(c: TestClient[Any, Any]) -> None:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = await c.post("/v1/forget", json={"all": True}, headers=headers)
            assert r.status == 401 and (await r.json())["error"] == "unauthorized"
        r = await c.post("/v1/forget", data=b"{not json", headers=ok)
        assert r.status == 400 and (await r.json())["error"] == "bad-json"
        for words in BAD_SELECTORS:
            r = await c.post("/v1/forget", json=words, headers=ok)
            body = await r.json()
            assert r.status == 400 and body["error"] == "bad-selector", (words, body)
            assert body["message"] == _refusal(words)
        for shape, reason in BAD_SHAPES:
            r = await c.post("/v1/forget", json=shape, headers=ok)
            body = await r.json()
            assert r.status == 400 and reason in body["message"], (shape, body)
        assert len(state.dedup.index) == KEPT_A + KEPT_B  # nothing changed

        assert await _check(c, pages[0], ok) == "drop"  # its URL's version is held
        r = await c.post("/v1/forget", json={"url": pages[0]["url"]}, headers=ok)
        body = await r.json()
        assert r.status == 200, body
        assert (body["forgotten"], body["namespace"], body["selector"]) == (
            1, "", {"url": pages[0]["url"]})
        assert isinstance(body["seconds"], float)
        assert await _check(c, pages[0], ok) == "keep"  # as if never seen
        r = await c.post("/v1/forget", json={"namespace": "other", "all": True}, headers=ok)
        assert (await r.json())["forgotten"] == 0
        r = await c.post("/v1/forget", json={"host": B}, headers=ok)
        assert (await r.json())["forgotten"] == KEPT_B
    _run(state, go)
    assert len(state.dedup.index) == KEPT_A - 1


def test_forget_through_the_threaded_server_of_replay() -> None:
    """replay --http-port serves the app from a thread of its own (http/thread.py): a forget
    there, over a real socket."""
    state = _state(TOKEN)
    assert state.dedup is not None
    port = free_port()
    with BackgroundServer(build_app(state), "127.0.0.1", port):
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/forget", data=json.dumps({"host": A}).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
            assert json.loads(resp.read())["forgotten"] == KEPT_A
        status, _ = get(f"http://127.0.0.1:{port}/v1/stats")  # no token: not even a read
        assert status == 401
    assert len(state.dedup.index) == KEPT_B
