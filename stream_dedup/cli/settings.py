"""The settings' command-line flags, by group, built from Settings: each flag's help ends
with its environment variable and its default, so --help, the environment and the config
file never disagree (tests/test_replay.py checks that every setting has a flag)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields

from stream_dedup.config import ENV_PREFIX, Settings
from stream_dedup.core.sketch import FAMILIES
from stream_dedup.security import KAFKA_PROTOCOLS, SASL_MECHANISMS

# Secrets: from the environment, the config file or a file (the *_file flags), never a flag
# (a command line is visible to every user of the machine: ps). --help names their variables
# in the groups' titles.
SECRETS = ("http_token", "kafka_sasl_password", "kafka_ssl_key_password", "redis_password")


@dataclass(frozen=True)
class Flag:
    """A setting's command-line flag: the field of Settings it sets is its name."""

    name: str
    help: str
    metavar: str | None = None
    choices: Sequence[str] | None = None
    serve_only: bool = False  # replay does not use it
    replay_help: str | None = None  # replay uses the flag, but not the setting's default
    repeatable: bool = False  # given several times: joined by commas


# Every setting `serve` uses, by group, in the order --help shows them. Each flag's help
# ends with its environment variable and its default, from Settings itself
# (tests/test_replay.py checks that every setting is here, and SECRETS have no flag).
SETTING_FLAGS: dict[str, list[Flag]] = {
    "filter (Broder's 6 features of 14 min-hashes, r=2; the first six and ld_c/ld_n are "
    "stamped into a persistent index)": [
        Flag("shingle_words", "words per shingle", "W"),
        Flag("groups", "features per page (k)", "K"),
        Flag("group_size", "min-hashes per feature (s)", "S"),
        Flag("seed", "seed of the hash permutations (decimal or 0x...)", "SEED"),
        Flag("hash_family", "min-hash permutation family: affine32 (32-bit multiply-add, "
             "half the cost of affine64), affine64, mix64 (full avalanche, ~3x affine64)",
             choices=list(FAMILIES)),
        Flag("boilerplate", "drop navigation, headers, footers and link lists before "
             "hashing"),
        Flag("threshold", "shared features that make a near-duplicate (r)", "R"),
        Flag("min_shingles", "pages with fewer shingles use only the exact layers", "N"),
        Flag("max_page_bytes", "reject larger pages without parsing them. serve: a kept page "
             "larger than the kept topic's max.message.bytes (Kafka's default ~1 MiB) goes "
             "there as a reference to its input offset; it says so at start", "N"),
        Flag("max_posting", "longest posting list kept per feature (the most recent pages)",
             "N"),
    ],
    "verification of near-duplicate candidates": [
        Flag("verify_rate", "share of candidates verified, 0..1", "P"),
        Flag("verify_exact", "verify by the exact Jaccard of the two pages' shingle sets "
             "(each kept page stores its set with its record, 4 B a shingle: on disk with "
             "the memory index's default); off: by the 84-hash estimate (sd ~0.04)"),
        Flag("verify_min_jaccard", "exact Jaccard needed to confirm, both tiers", "X"),
        Flag("bands", "LSH bands of the min-hashes, more candidates for near-verified: with "
             "5 x 4 a page at J 0.85 shares a band with chance 0.975 (a feature: 0.48); "
             "each band costs an index entry a kept page (8 B in memory); 0: features only",
             "B"),
        Flag("band_size", "min-hashes per band", "N"),
        Flag("verify_min_resemblance", "full-sketch resemblance needed to confirm (pages "
             "without a stored shingle set, or --no-verify-exact)", "X"),
        Flag("verify_max_ld_ratio", "estimated Levenshtein distance / length allowed", "X"),
        Flag("verify_max_candidates", "candidates tried per page before it is kept as "
             "verified-distinct", "N"),
        Flag("verify_single_feature", "verify pages that share fewer than r features (but "
             "one) and drop them as near-verified when verification says so"),
        Flag("near_verified_min_resemblance", "resemblance such a near-verified drop needs "
             "(when verified by the estimate)", "X"),
        Flag("ld_c", "LD signature compression: a symbol per ~C characters", "C"),
        Flag("ld_n", "LD signature window, characters", "N"),
    ],
    "containment (Broder 1997: c(A, B), the share of A's shingles in B; needs the shingle "
    "sets, --verify-exact)": [
        Flag("contain_min", "drop a page at least this contained in an earlier kept page "
             "('contained'); list the earlier kept pages this much inside a kept one "
             "('contains'); 0: off", "X"),
        Flag("contain_keys", "containment keys a page stores (its bottom-N shingles in one "
             "random order, as index keys, 8 B each in memory): a page inside one k times "
             "its size holds one with chance ~1 - (1 - 1/k)**N", "N"),
        Flag("contain_query_keys", "containment keys a page asks with (its bottom N: "
             "lookups, not memory): an earlier page k times smaller inside it is found with "
             "chance ~1 - (1 - 1/k)**N", "N"),
        Flag("contain_sample", "deep keys: a kept page also stores a 1/N sample of its "
             "shingles (at most 256; the memory index holds them on disk beside its "
             "records, the LSM and Redis indexes none), which finds an excerpt of n "
             "shingles with chance ~1 - (1 - 1/N)**n: 0.96 at n = 25 for N = 8; 0: none",
             "N"),
        Flag("contain_deep_asked", "deep keys a page asks with (its bottom N: a read of "
             "each disk run each)", "N"),
        Flag("contain_min_shingles", "pages with fewer shingles are never 'contained' nor "
             "listed in 'contains'", "N"),
        Flag("contain_common", "a containment key this many kept pages share is a "
             "template's: its pages are not tried", "N"),
        Flag("contain_max_candidates", "pages tried for containment per kept page", "N"),
    ],
    "recrawls (a URL holds one version: a page whose URL has a kept version is unchanged, "
    "or a changed version that replaces it; docs/reference.md)": [
        Flag("url_ignore_params", "query parameters that do not make another URL, removed "
             "before w3lib's canonicalize_url gives a URL's normal form (scheme and host "
             "lower-cased, default port and fragment dropped, percent-encoding and query "
             "order made uniform): names or patterns, comma-separated, e.g. 'utm_*,"
             "sessionid,jsessionid,phpsessid'", "NAMES"),
    ],
    "index (what the filter remembers)": [
        Flag("index", "memory (gone on exit), lsm (RocksDB on disk; restarts and crashes "
             "are invisible in the decisions) or redis (shared: every instance on the same "
             "Redis decides as one; see docs/scale-out.md)",
             choices=["memory", "lsm", "redis"]),
        Flag("index_path", "the LSM index directory (only with --index lsm)", "DIR"),
        Flag("redis_url", "redis: any node of a Redis Cluster (the rest is discovered) or "
             "a single Redis or Kvrocks, e.g. redis://127.0.0.1:7000; several seeds "
             "comma-separated, so a start does not depend on one node", "URL"),
        Flag("redis_buckets", "redis: set buckets per hash tag (1,024 tags), fixed when the "
             "index is made; the default suits up to ~2.5M pages held: take pages / 20,000 "
             "(docs/scale-out.md)", "N"),
        Flag("redis_records_url", "redis: keep the kept pages' verification records (with "
             "their shingle sets ~5.2 KB of Redis RAM a mean web page; ~860 B with "
             "--no-verify-exact) in this other store, e.g. Kvrocks on SSD, so that the Redis "
             "index holds ~250 B a page (default: in the index's Redis)",
             "URL"),
        Flag("warm_from", "start a memory index with the pages of an LSM index (a "
             "snapshot)", "DIR"),
        Flag("memory_records", "memory index: where what only verification reads (sketch, "
             "shingle set, LD signature: ~640 B + 4 a shingle up to 8,192, ~5 KB a mean web "
             "page) lives: disk (an unlinked temporary file; ~240 B a page of RAM) or ram "
             "(all of it in RAM)", choices=["disk", "ram"]),
        Flag("memory_records_dir", "memory index: the directory of that file (default: "
             "$TMPDIR, else /var/tmp, on disk where /tmp is a tmpfs; a warning if it is in "
             "RAM)", "DIR"),
        Flag("retention_days", "forget pages crawled (or, without a crawl time, kept) more "
             "than DAYS ago, while running (0 = never)", "DAYS"),
    ],
    "namespaces: many crawls or collections in one index, none matching another": [
        Flag("namespace", "decide pages in this namespace: its own matches, URL versions "
             "and counts (default: the default namespace)", "NAME"),
        Flag("namespace_field", "a page's namespace from this message field (JSON "
             "formats; a.b nested) or Kafka header (html, warc), e.g. crawlid; a message "
             "without it: --namespace", "FIELD"),
        Flag("namespace_read", "also match against this namespace, never writing to it "
             "(e.g. a reference collection); repeat it or comma-separate", "NAME",
             repeatable=True),
    ],
    "Kafka": [
        Flag("bootstrap_servers", "Kafka brokers", "HOST:PORT[,..]"),
        Flag("input_topic", "crawled pages in", "TOPIC", serve_only=True),
        Flag("decisions_topic", "one decision per page, keyed by URL", "TOPIC",
             serve_only=True),
        Flag("kept_topic", "forward the original message of every kept page here (empty: "
             "off)", "TOPIC", serve_only=True),
        Flag("dead_letter_topic", "original bytes + error headers of bad input", "TOPIC",
             serve_only=True),
        Flag("group_id", "consumer group", "ID", serve_only=True),
        Flag("input_format", "json: value is a page object (url + html or body_b64); "
             "html: value is HTML, key is the URL, metadata in headers; warc: value is one "
             "WARC record (plain or gzipped; request, metadata, warcinfo records are skipped "
             "and counted); scrapy-cluster: Scrapy Cluster's crawled_firehose JSON "
             "(response_url, body in its encoding, status_code, response_headers, timestamp)",
             choices=["json", "html", "warc", "scrapy-cluster"], serve_only=True),
        Flag("json_fields", "JSON formats: read page fields from your crawler's own message "
             "fields, PAGE=MESSAGE comma-separated; page fields: url, html, body_b64, "
             "encoding, status, fetched_at, headers; a|b tries a then b, a.b is a nested "
             "field; refines scrapy-cluster too (base64 bodies: body_b64=body). E.g. "
             "url=link|url,html=content,status=code,fetched_at=meta.time", "MAP",
             serve_only=True),
        Flag("carry_fields", "copy these message fields (JSON formats; a.b nested) or Kafka "
             "headers (html, warc) into each decision's \"carried\" object (null when missing), "
             "so you can join decisions to your records, e.g. crawlid,appid", "NAMES",
             serve_only=True),
        Flag("recent_decisions", "decisions remembered for records delivered again (by "
             "position and body)", "N", serve_only=True),
    ],
    "exactly-once (Kafka transactions: read outputs with isolation.level=read_committed)": [
        Flag("exactly_once", "commit each batch's decisions, kept pages, dead letters and "
             "input offsets in one Kafka transaction, one transactional id per input "
             "partition (<group-id>-<topic>-<partition>: a stalled instance is fenced); a "
             "memory or LSM index is restored from the changelog topic at start, so a crash "
             "changes no decision", serve_only=True),
        Flag("changelog_topic", "the index's changes, written in each batch's transaction "
             "(compacted, one partition; default <group-id>-index-changelog)", "TOPIC",
             serve_only=True),
        Flag("transaction_timeout_s", "the broker aborts a transaction open longer than "
             "this (a stalled instance's batch comes again)", "S", serve_only=True),
    ],
    "Kafka security (every command that talks to Kafka): a client properties file, or "
    "these; passwords from STREAM_DEDUP_KAFKA_SASL_PASSWORD and "
    "STREAM_DEDUP_KAFKA_SSL_KEY_PASSWORD, the config file or the *-file flags, never a "
    "flag": [
        Flag("kafka_properties", "a Kafka client properties file as Kafka's own tools take "
             "it (security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore."
             "location with type PEM, librdkafka's sasl.username/ssl.ca.location ...); a key "
             "it cannot map is refused by name; the flags and environment win over it",
             "FILE"),
        Flag("kafka_security_protocol", "how to reach the brokers", choices=KAFKA_PROTOCOLS),
        Flag("kafka_sasl_mechanism", "SASL mechanism (SASL_* protocols)",
             choices=SASL_MECHANISMS),
        Flag("kafka_sasl_username", "SASL user (PLAIN, SCRAM)", "USER"),
        Flag("kafka_sasl_password_file", "read the SASL password from FILE (a mounted "
             "Kubernetes Secret)", "FILE"),
        Flag("kafka_sasl_oauth_token_file", "OAUTHBEARER: the token, read from FILE at every "
             "login (so a rotated token is picked up)", "FILE"),
        Flag("kafka_ssl_cafile", "the CA (PEM) that signed the brokers' certificates "
             "(default: the system's store)", "FILE"),
        Flag("kafka_ssl_certfile", "client certificate (PEM), for mutual TLS", "FILE"),
        Flag("kafka_ssl_keyfile", "its private key (PEM)", "FILE"),
        Flag("kafka_ssl_key_password_file", "the private key's password, from FILE", "FILE"),
        Flag("kafka_ssl_check_hostname", "check that a broker's certificate names the host "
             "connected to (off only for a test broker)"),
    ],
    "Redis security (--index redis): the password from STREAM_DEDUP_REDIS_PASSWORD, the "
    "config file or --redis-password-file, never a flag (nor in --redis-url on a command "
    "line: STREAM_DEDUP_REDIS_URL may hold redis://USER:PASSWORD@HOST:PORT); TLS: rediss:// "
    "URLs": [
        Flag("redis_username", "ACL user (Redis 6+)", "USER"),
        Flag("redis_password_file", "read the password from FILE", "FILE"),
        Flag("redis_ssl_cafile", "rediss://: the CA (PEM) of the nodes' certificates", "FILE"),
        Flag("redis_ssl_certfile", "rediss://: client certificate (PEM)", "FILE"),
        Flag("redis_ssl_keyfile", "rediss://: its private key (PEM)", "FILE"),
        Flag("redis_ssl_check_hostname", "rediss://: check that a node's certificate names "
             "the host connected to"),
    ],
    "throughput": [
        Flag("batch_size", "records decided, delivered and committed together", "N"),
        Flag("workers", "cores for parsing and sketching: the deciding thread and N-1 "
             "worker processes", "N"),
    ],
    "HTTP API (/metrics, /healthz, /readyz, /v1/check, /v1/stats); a bearer token for "
    "/v1/* from STREAM_DEDUP_HTTP_TOKEN or the config file's http_token, never a flag "
    "(default: none, the API is open)": [
        Flag("http_host", "address to listen on (0.0.0.0 in a container)", "ADDR"),
        Flag("http_token_file", "read the bearer token from FILE", "FILE"),
        Flag("http_port", "port to listen on, 0 = off", "PORT",
             replay_help="serve the HTTP API on PORT while replaying (default: off)"),
        Flag("stall_seconds", "/readyz fails when records wait and no batch finished for "
             "S seconds", "S", serve_only=True),
    ],
}
_DEFAULTS = {f.name: f.default for f in fields(Settings) if f.init}


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return repr(value) if value == "" else str(value)


def setting_flags(parser: argparse.ArgumentParser, *, serve: bool) -> None:
    """The flags of every setting the command uses, built from SETTING_FLAGS."""
    parser.add_argument("--config", metavar="FILE", help="TOML file with settings (a "
                        "[stream_dedup] table or top level); the environment "
                        "(STREAM_DEDUP_<NAME>) wins over it, flags win over both")
    for title, flags in SETTING_FLAGS.items():
        group = parser.add_argument_group(title)
        for flag in flags:
            if flag.serve_only and not serve:
                continue
            default = _DEFAULTS[flag.name]
            text = (flag.replay_help if flag.replay_help and not serve else
                    f"{flag.help} [env {ENV_PREFIX}{flag.name.upper()}, default "
                    f"{_shown(default)}]").replace("%", "%%")
            option = "--" + flag.name.replace("_", "-")
            if flag.repeatable:
                group.add_argument(option, action="append", metavar=flag.metavar, help=text)
            elif isinstance(default, bool):
                group.add_argument(option, action=argparse.BooleanOptionalAction,
                                   default=None, help=text)
            else:
                kind = {int: lambda v: int(v, 0), float: float}.get(type(default), str)
                if flag.choices and all(c.isupper() for c in flag.choices):
                    kind = str.upper  # Kafka's names: sasl_ssl as SASL_SSL, as the env takes it
                group.add_argument(option, type=kind, metavar=flag.metavar,
                                   choices=flag.choices, help=text)


def settings_of(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name, None) for name in Settings.names()}
    for name, value in overrides.items():
        if isinstance(value, list):  # a repeatable flag
            overrides[name] = ",".join(value)
    return Settings.load(config_file=args.config, overrides=overrides)
