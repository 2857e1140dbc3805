"""One frozen Settings object; the only module that reads the environment.

Precedence, lowest to highest: defaults < config file (TOML, `[stream_dedup]` table or top
level) < environment (`STREAM_DEDUP_<NAME>`) < explicit overrides (the CLI flags).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from stream_dedup.config_checks import check
from stream_dedup.core.sketch import Params
from stream_dedup.errors import ConfigError
from stream_dedup.security import read_properties, read_secret

ENV_PREFIX = "STREAM_DEDUP_"
_PARAMS = Params()  # the defaults of what a feature means are Params' own


@dataclass(frozen=True, slots=True)
class Settings:
    # --- what a feature means (stamped into the index) ---
    shingle_words: int = _PARAMS.shingle_words  # 8
    groups: int = _PARAMS.groups  # k = 6
    group_size: int = _PARAMS.group_size  # s = 14
    seed: int = _PARAMS.seed
    hash_family: str = _PARAMS.family  # affine32
    boilerplate: bool = _PARAMS.boilerplate
    # --- decision rule ---
    threshold: int = 2  # r: shared features that make a near-duplicate
    min_shingles: int = 25  # below this, only the exact and canonical layers apply
    max_page_bytes: int = 8 * 1024 * 1024
    max_posting: int = 64  # longest posting list kept per feature (most recent pages)
    # --- verification of candidate matches ---
    verify_rate: float = 1.0
    verify_min_resemblance: float = 0.80
    verify_max_ld_ratio: float = 0.20
    verify_max_candidates: int = 3
    # Pages sharing at least one but fewer than r features: verify them (always) and drop
    # them as "near-verified" when verification says near-duplicate. Raises recall between
    # resemblance 0.8 and 0.95, where the 6x14 r=2 filter alone catches little.
    verify_single_feature: bool = True
    # ... with a stricter bar: the 84-hash estimate has a standard error of ~0.04, and on
    # the httpbis drafts 0.80 let 8 of 53 such drops with J8 0.775-0.8 through, 0.85 let 1 of 40.
    near_verified_min_resemblance: float = 0.85
    # More candidates for the near-verified tier: `bands` LSH bands of `band_size` of the
    # same min-hashes, index keys besides the features (8 bytes a band a kept page in the
    # memory index). Pages at resemblance 0.85 share one with probability 0.975 (5 x 4:
    # 1 - (1 - 0.85**4)**5), a feature 0.48. 0: the features alone.
    bands: int = 5
    band_size: int = 4
    # Verify by the exact Jaccard of the two pages' shingle sets, at verify_min_jaccard in
    # both tiers (the bars above then apply only to pages stored without one). A kept page
    # stores its set with its verification record: 4 bytes a shingle, past 8,192 shingles a
    # MOD-m sample of 4,096-8,192 (on disk by default).
    verify_exact: bool = True
    verify_min_jaccard: float = 0.80
    # --- containment (Broder 1997: c(A, B) = |S(A) ∩ S(B)| / |S(A)|) ---
    # A page at least this contained in an earlier kept page is dropped ("contained"); a
    # kept page lists the earlier kept pages it contains this much ("contains"). Measured
    # exactly on the two pages' shingle sets (MOD-m samples past 8,192 shingles). 0: off.
    contain_min: float = 0.90
    # Containment keys a page stores: its bottom-k shingles in one random order (core/sketch.py
    # contain_keys; index keys, 8 bytes each in memory), which find a page inside a larger
    # one (J = |A| / |B|) where features and bands do not; a page asks with its bottom
    # contain_query_keys (lookups, not memory), which find an earlier page inside it
    contain_keys: int = 4
    contain_query_keys: int = 8
    # A kept page also stores the rest of a 1/contain_sample sample of its shingles (at
    # most 256) as deep keys, which find a short excerpt of a long page (the memory index
    # keeps them on disk beside its records; the LSM and Redis indexes keep none); a page
    # asks them with its contain_deep_asked smallest. 0: none
    contain_sample: int = 8
    contain_deep_asked: int = 3
    # Pages with fewer shingles are not "contained" anywhere, nor listed in `contains`
    contain_min_shingles: int = 25
    # Candidates whose shared containment key has this many pages or more are not tried: a
    # shingle that common is a site's template, not text (Broder et al. 1997 drop them too)
    contain_common: int = 8
    contain_max_candidates: int = 3
    ld_c: int = _PARAMS.ld_c  # Coates' signature: a symbol per ~c (32) characters (stamped)
    ld_n: int = _PARAMS.ld_n  # ... over windows of n (4) characters (stamped)
    # --- recrawls: which URLs are the same (core/urls.py) ---
    # Query parameters that do not name another page, removed before URLs are compared:
    # names or fnmatch patterns, comma-separated (e.g. "utm_*,sessionid,jsessionid")
    url_ignore_params: str = ""
    # --- the Kafka service (`serve`) ---
    bootstrap_servers: str = "127.0.0.1:9092"
    input_topic: str = "pages"
    decisions_topic: str = "decisions"
    kept_topic: str = ""  # empty: do not forward kept pages
    dead_letter_topic: str = "pages-dead-letter"
    group_id: str = "stream-dedup"
    # json (the JSONL page schema) | html (value = HTML bytes) | warc (one WARC record)
    # | scrapy-cluster (its crawled_firehose JSON)
    input_format: str = "json"
    # A JSON format's page fields read from other message fields (json_field_map), e.g.
    # "url=link,html=content": a crawler's own JSON dialect without a translator
    json_fields: str = ""
    # Message fields (JSON formats) or Kafka headers (html, warc) copied into each decision
    # ("carried"), e.g. "crawlid,appid": "" carries nothing
    carry_fields: str = ""
    batch_size: int = 500  # records decided, delivered and committed together (serve, replay)
    workers: int = 1  # processes for parsing and sketching
    recent_decisions: int = 100_000  # decisions remembered by source, for re-deliveries
    # Kafka transactions (kafka/transactions.py): a batch's outputs and input offsets commit
    # together, once; a memory or LSM index is restored from `changelog_topic` at start
    exactly_once: bool = False
    changelog_topic: str = ""  # "": "<group_id>-index-changelog"
    transaction_timeout_s: float = 60.0  # the broker aborts a transaction open this long
    # --- connecting to a secured Kafka (security.py; every command that talks to Kafka) ---
    # A Kafka client properties file (security.protocol, sasl.mechanism, sasl.jaas.config,
    # ssl.* as Kafka's own tools take them), read under the environment and the flags
    kafka_properties: str = ""
    kafka_security_protocol: str = "PLAINTEXT"  # | SSL | SASL_PLAINTEXT | SASL_SSL
    kafka_sasl_mechanism: str = ""  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 | OAUTHBEARER
    kafka_sasl_username: str = ""
    # Secrets (repr=False, and no flag: a command line is visible to every user): the
    # environment or the config file, or a file named by the *_file setting
    kafka_sasl_password: str = field(default="", repr=False)
    kafka_sasl_password_file: str = ""
    kafka_sasl_oauth_token_file: str = ""  # OAUTHBEARER: the token, read at every login
    kafka_ssl_cafile: str = ""  # PEM; "": the system's CA store
    kafka_ssl_certfile: str = ""  # a client certificate (PEM), for mutual TLS
    kafka_ssl_keyfile: str = ""
    kafka_ssl_key_password: str = field(default="", repr=False)
    kafka_ssl_key_password_file: str = ""
    kafka_ssl_check_hostname: bool = True
    # --- the HTTP API (/metrics, /healthz, /readyz, /v1/check, /v1/stats) ---
    http_host: str = "127.0.0.1"
    http_port: int = 8080  # 0: no HTTP server
    http_token: str = field(default="", repr=False)  # bearer token for /v1/*; empty: open
    http_token_file: str = ""  # the token from this file instead
    stall_seconds: float = 120.0  # /readyz fails when records wait and no batch finished since
    # --- the index ---
    index: str = "memory"  # memory | lsm | redis
    index_path: str = ""  # the LSM directory (required with index = "lsm")
    # a Redis Cluster node or a single Redis (required with index = "redis"); repr=False:
    # it may hold a password
    redis_url: str = field(default="", repr=False)
    # Redis: the index's set buckets (strings), this many per hash tag (1,024
    # tags); fixed when the index is made. A record bucket holds 4 x pages held / (1,024 x
    # buckets) records: keep that near 80, under Redis's 128 (docs/scale-out.md)
    redis_buckets: int = 128
    # Redis: where kept pages' verification records go (read only to verify; with their
    # shingle sets ~5.2 KB of Redis RAM a mean web page, ~730 bytes without): another
    # Redis-protocol store, e.g. Kvrocks on SSD; "": the index's own
    redis_records_url: str = field(default="", repr=False)
    # Redis AUTH and TLS (a password in a URL wins over these; TLS: rediss:// URLs)
    redis_username: str = ""  # an ACL user
    redis_password: str = field(default="", repr=False)
    redis_password_file: str = ""
    redis_ssl_cafile: str = ""
    redis_ssl_certfile: str = ""
    redis_ssl_keyfile: str = ""
    redis_ssl_check_hostname: bool = True
    warm_from: str = ""  # memory index: start with the pages of this LSM index (a snapshot)
    # memory index: where what only verification reads (sketch, shingle set, LD signature:
    # ~640 bytes + 4 a shingle up to 8,192, ~5 KB a mean web page) lives: "disk", an
    # unlinked temporary file in memory_records_dir ("": $TMPDIR, else /var/tmp), leaving
    # ~240 bytes a page of RAM; or "ram" (all of it in RAM)
    memory_records: str = "disk"
    memory_records_dir: str = ""
    retention_days: float = 0.0  # forget pages crawled longer ago (0 = keep forever)
    # --- namespaces (index/namespaces.py): many crawls in one index, none matching another ---
    namespace: str = ""  # the namespace pages are decided in ("": the default one)
    # A message field (JSON formats) or Kafka header (html, warc) naming a page's namespace
    # (absent in a message: `namespace`), e.g. Scrapy Cluster's "crawlid"
    namespace_field: str = ""
    # Namespaces also matched against, never written to, comma-separated (a reference
    # collection)
    namespace_read: str = ""
    # --- derived ---
    params: Params = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        params = Params(
            shingle_words=self.shingle_words,
            groups=self.groups,
            group_size=self.group_size,
            seed=self.seed,
            family=self.hash_family,
            boilerplate=self.boilerplate,
            ld_c=self.ld_c,
            ld_n=self.ld_n,
        )
        object.__setattr__(self, "params", params)
        check(self)

    @property
    def read_namespaces(self) -> tuple[str, ...]:
        """The namespaces also matched against (namespace_read), in order, once each."""
        names = [n.strip() for n in self.namespace_read.split(",")]
        if any(not n for n in names) and self.namespace_read.strip():
            from stream_dedup.index.namespaces import check_name

            check_name("", "namespace_read")
        return tuple(dict.fromkeys(n for n in names if n))

    @property
    def contains_on(self) -> bool:
        """Whether containment is decided (it needs the shingle sets: verify_exact)."""
        return self.contain_min > 0 and self.contain_keys > 0 and self.verify_exact

    @property
    def deep_asked(self) -> int:
        """Keys a page asks the deep tier with (0: no deep keys stored nor asked)."""
        return min(self.contain_deep_asked, self.contain_query_keys) \
            if self.contains_on and self.contain_sample > 0 and self.index == "memory" else 0

    @property
    def stored_keys(self) -> int:
        """The index keys a kept page stores before its deep keys: its features, its band
        keys (for the near-verified tier) and its first containment keys."""
        return self.groups + (self.bands if self.verify_single_feature else 0) + \
            (self.contain_keys if self.contains_on else 0)

    @property
    def contain_asked(self) -> int:
        """The keys a probe ends with that are containment's (asked, then deep-asked)."""
        return self.contain_query_keys + self.deep_asked if self.contains_on else 0

    def changelog(self) -> str:
        """The changelog topic of the index (exactly-once, memory and LSM indexes)."""
        return self.changelog_topic or f"{self.group_id}-index-changelog"

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.init]

    @classmethod
    def load(
        cls,
        config_file: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        if config_file is not None:
            values.update(_read_file(Path(config_file)))
        given = {name: env[ENV_PREFIX + name.upper()] for name in cls.names()
                 if ENV_PREFIX + name.upper() in env}
        given.update({k: v for k, v in (overrides or {}).items() if v is not None})
        properties = given.get("kafka_properties", values.get("kafka_properties"))
        if properties:  # over the config file, under the environment and the flags
            values.update(read_properties(str(properties)))
        values.update(given)
        if values.get("http_token_file"):
            if values.get("http_token"):
                raise ConfigError("http_token and http_token_file are both given: keep one")
            values["http_token"] = read_secret(str(values["http_token_file"]),
                                               "http_token_file")
        return cls(**{k: _coerce(k, v) for k, v in values.items()})


_TYPES = {f.name: f.type for f in fields(Settings) if f.init}


def _read_file(path: Path) -> dict[str, Any]:
    import tomllib  # only with a config file: 5-10 ms of every start otherwise

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    table = data.get("stream_dedup", data)
    unknown = sorted(set(table) - set(_TYPES))
    if unknown:
        raise ConfigError(f"unknown setting(s) in {path}: {', '.join(unknown)}")
    return dict(table)


def _coerce(name: str, value: Any) -> Any:
    if name not in _TYPES:
        raise ConfigError(f"unknown setting {name!r}")
    kind = _TYPES[name]
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind == "int":
            return value if isinstance(value, int) else int(str(value), 0)
        if kind == "float":
            return float(value)
        return str(value)
    except ValueError:
        raise ConfigError(f"setting {name} expects {kind}, got {value!r}") from None
