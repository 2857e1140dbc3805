"""Values that cross module boundaries: pages in, decisions out.

All frozen: a Page or Decision never changes after it is made, so it can be handed to
another process, logged, or compared in a golden test without surprises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

DecisionKind = Literal["keep", "drop", "reject"]
Carried = tuple[tuple[str, Any], ...]

# Reasons a `keep` or `drop` carries; a `reject` carries a PageError kind instead.
UNIQUE = "unique"
EXACT = "exact"
CANONICAL = "canonical"
NEAR = "near"
NEAR_VERIFIED = "near-verified"  # shared fewer than r features, but verification says near
VERIFIED_DISTINCT = "verified-distinct"
# Recrawls (a page whose URL has a kept version): the same content as that version, or a
# new version of the URL that replaces it in the index.
UNCHANGED = "unchanged"
CHANGED = "changed"
CONTAINED = "contained"  # at least contain_min of its shingles are in an earlier kept page
SUPERSEDED = "superseded"  # a fetch older than the URL's kept version, which differs


@dataclass(frozen=True, slots=True)
class Revisit:
    """A WARC revisit record's claim: the payload is the one captured at `refers_to_uri`
    (`refers_to_date`); `profile` is the WARC-Profile (identical-payload-digest or
    server-not-modified)."""

    profile: str
    refers_to_uri: str | None = None
    refers_to_date: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """One crawled page as it arrives: raw bytes plus whatever the crawler knew."""

    url: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    fetched_at: str | None = None
    status: int | None = None
    # Where it came from ("file.warc.gz#12", "topic/3/1042"); stable across re-delivery.
    source: str | None = None
    # Its input position as one sortable int (`position_id`): its page id, the same in
    # every instance and on every re-delivery. None: the deduplicator numbers it.
    position: int | None = None
    # The crawler's digest of the payload in WARC's form ("sha1:" + base32), when it gave one
    payload_digest: str | None = None
    # A WARC revisit record: no body, decided against the version it refers to.
    revisit: Revisit | None = None
    # The input's own identifiers to copy into its decision (--carry-fields), in order:
    # (name, a JSON value); () for none
    carried: Carried = ()
    # Its namespace (index/namespaces.py; --namespace-field): "" the process's (--namespace)
    namespace: str = ""

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for key, value in self.headers:
            if key.lower() == lname:
                return value
        return None


# Page ids from here up carry a time (`position_id` of a record with a timestamp); below,
# they are local counters (replay, the library), which say nothing against a position.
TIMED_IDS = 1 << 56


def position_id(timestamp_ms: int, partition: int, offset: int) -> int:
    """A Kafka record's page id: (timestamp, partition, offset) packed into one int that
    sorts by time, needs no counter, and is the same wherever the record is read. 42 bits
    of milliseconds (to year 2109), 16 of partition, 40 of offset: 98 bits."""
    return ((max(0, timestamp_ms) & (1 << 42) - 1) << 56 | (partition & 0xFFFF) << 40
            | (offset & (1 << 40) - 1))


def public_id(page_id: int | None) -> str | None:
    """A page id as decisions carry it in JSON: a decimal string. An id of a Kafka record
    needs 98 bits, which JSON readers that hold integers in 64 bits or a double (Java, Go,
    Elasticsearch, JavaScript) refuse or round; as a string every reader gets it exactly,
    and every id has one JSON type wherever it came from (docs/decision.schema.json)."""
    return None if page_id is None else str(page_id)


@dataclass(frozen=True, slots=True)
class Rejected:
    """An input record that could not become a Page (bad JSON, broken WARC record...)."""

    url: str | None
    kind: str
    message: str
    source: str | None = None
    raw: bytes | None = field(default=None, repr=False)
    carried: Carried = ()  # as Page.carried, when the record could be read that far


@dataclass(frozen=True, slots=True)
class Skipped:
    """An input record that is neither a page nor an error: a WARC request, metadata or
    warcinfo record, a non-HTML response... Never decided nor dead-lettered; counted by
    `kind` (its record type, or "non-html"), and its input position is committed."""

    kind: str
    source: str | None = None


@dataclass(frozen=True, slots=True)
class DuplicateOf:
    page_id: int
    url: str


@dataclass(frozen=True, slots=True)
class Previous:
    """The version of the page's URL the index held when the page was decided. `match`:
    how an `unchanged` page matched it (exact, canonical, near, revisit); None otherwise."""

    page_id: int
    url: str
    fetched_at: str | None = None
    match: str | None = None


@dataclass(frozen=True, slots=True)
class Contained:
    """An earlier kept page a kept page contains: c(that page, this one)."""

    page_id: int
    url: str
    containment: float


@dataclass(frozen=True, slots=True)
class Decision:
    url: str | None
    decision: DecisionKind
    reason: str
    page_id: int | None = None
    duplicate_of: DuplicateOf | None = None
    shared_features: int = 0
    resemblance: float | None = None
    ld_estimate: float | None = None
    verified: bool = False
    # The exact Jaccard of the two pages' shingle sets, when verification computed it
    # (`resemblance` is then still the 84-hash estimate, for comparison)
    jaccard: float | None = None
    short: bool = False
    error: str | None = None
    source: str | None = None
    fetched_at: str | None = None  # the page's own crawl time, when known
    previous: Previous | None = None  # its URL's kept version (recrawls)
    # `unchanged` only: the payload's digest in WARC's form, for a revisit record
    payload_digest: str | None = None
    # `contained`: c(this page, duplicate_of); a keep: the earlier kept pages it contains
    containment: float | None = None
    contains: tuple[Contained, ...] = ()
    # The page id of its cluster's kept page: its own (keep), its duplicate_of's (drop), its
    # URL's version's (unchanged, superseded); None for a reject
    cluster: int | None = None
    # The input's fields named by --carry-fields, in that order (`carried` in the JSON,
    # present only when some are)
    carried: Carried = ()
    # The namespace it was decided in (a reject: the process's), `namespace` in the JSON;
    # "" the default one, left out of the JSON, so consumers of one namespace see nothing new
    namespace: str = ""

    def in_namespace(self, name: str) -> Decision:
        """This decision, saying it was made in namespace `name` ("": the default)."""
        return self if name == self.namespace else replace(self, namespace=name)

    def to_dict(self) -> dict[str, Any]:
        """The decision as JSON carries it (docs/decision.schema.json): ids as strings."""
        out: dict[str, Any] = {
            "url": self.url,
            "decision": self.decision,
            "reason": self.reason,
            "page_id": public_id(self.page_id),
            "duplicate_of": (
                None
                if self.duplicate_of is None
                else {"page_id": public_id(self.duplicate_of.page_id),
                      "url": self.duplicate_of.url}
            ),
            "shared_features": self.shared_features,
            "resemblance": self.resemblance,
            "ld_estimate": self.ld_estimate,
            "jaccard": self.jaccard,
            "verified": self.verified,
            "short": self.short,
            "error": self.error,
            "source": self.source,
            "fetched_at": self.fetched_at,
            "previous": None if self.previous is None else {
                "page_id": public_id(self.previous.page_id), "url": self.previous.url,
                "fetched_at": self.previous.fetched_at, "match": self.previous.match},
            "payload_digest": self.payload_digest,
            "containment": self.containment,
            "contains": [{"page_id": public_id(c.page_id), "url": c.url,
                          "containment": c.containment} for c in self.contains],
            "cluster": public_id(self.cluster),
        }
        if self.namespace:
            out["namespace"] = self.namespace
        if self.carried:
            out["carried"] = dict(self.carried)
        return out

    def to_json(self) -> str:
        """One line of JSON, always valid UTF-8 when encoded: a lone surrogate that came in
        with the input (an error message may quote it) becomes "?"."""
        text = json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))
        if not text.isascii():
            text = text.encode("utf-8", "replace").decode("utf-8")
        return text
