"""The topics `serve` works on, checked and made at start (admin requests; kafka/client.py
holds the clients).

- **Topics that do not exist.** A broker that creates topics on first use (Kafka's
  default) logs the client into an ERROR ("not found in cluster metadata") first; one that
  does not fails the first send. `ensure_topics` creates the missing ones at start, with the
  broker's defaults (`num.partitions`, `default.replication.factor`), and says so.
- **The index's changelog** (`--exactly-once`, kafka/transactions.py) must keep every record until
  a newer one of its key replaces it: `cleanup.policy=compact`, nothing else. A topic made
  beforehand with `delete` (or `compact,delete`) would let retention drop kept pages that the
  index still holds, and a restore would silently miss them: `check_changelog` refuses it.
- **Message size limits.** `read_limits` asks the broker for `message.max.bytes` and each
  output topic's `max.message.bytes` at start, so the runner can shrink an output that would
  be refused instead of failing the batch (and an idempotent producer) on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from stream_dedup.config import Settings
from stream_dedup.errors import ConfigError
from stream_dedup.kafka.client import DEFAULT_BATCH, DEFAULT_MESSAGE_MAX, PRODUCER_MAX_REQUEST
from stream_dedup.kafka.secure import security_kwargs

log = logging.getLogger("stream_dedup.kafka")


# --- message size limits ------------------------------------------------------------------
@dataclass
class Limits:
    """The largest message each output topic accepts (bytes, as the broker counts them)."""

    broker: int = DEFAULT_MESSAGE_MAX
    topics: dict[str, int] = field(default_factory=dict)

    def of(self, topic: str) -> int:
        return min(self.topics.get(topic, self.broker), PRODUCER_MAX_REQUEST)

    def batch(self, topics: list[str], cap: int = DEFAULT_BATCH) -> int:
        """The producer's batch size: `cap`, within the smallest limit of the topics."""
        return max(1024, min([cap, *(self.of(t) for t in topics)]))


# --- topics ----------------------------------------------------------------------------------
TOPIC_ALREADY_EXISTS = 36  # another instance created it meanwhile: as good as created
TOPIC_AUTHORIZATION_FAILED = 29


async def ensure_topics(s: Settings, topics: list[str], compacted: Sequence[str] = ()
                        ) -> list[str]:
    """Create those of `topics` the cluster does not have, with the broker's default
    partitions and replication, and those of `compacted` with one partition and
    cleanup.policy=compact (the index's changelog); the ones created. One that cannot be
    created (no ACL, an old broker) is logged with what to do, not fatal: the broker may
    still create it on first use."""
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap_servers, **security_kwargs(s))
    try:
        await asyncio.wait_for(admin.start(), 10)
        existing = set(await asyncio.wait_for(admin.list_topics(), 10))
        missing = [t for t in [*topics, *compacted] if t not in existing]
        if not missing:
            return []
        # -1 and no assignment: the broker's num.partitions and default.replication.factor
        response = await asyncio.wait_for(admin.create_topics([
            NewTopic(t, 1, -1, replica_assignments={},
                     topic_configs={"cleanup.policy": "compact"}) if t in compacted else
            NewTopic(t, -1, -1, replica_assignments={}) for t in missing]), 30)
        created = []
        for topic, code, message in response.topic_errors:
            if code == TOPIC_ALREADY_EXISTS:
                continue
            if code == 0:
                created.append(topic)
                log.info("created topic %s (the broker's default partitions and replication; "
                         "to choose them, create it beforehand: kafka-topics.sh --create "
                         "--topic %s --partitions N ...)", topic, topic)
            elif code == TOPIC_AUTHORIZATION_FAILED:
                log.error("topic %s does not exist, and this user may not create it (error "
                          "29, Create on the topic not allowed): create it with kafka-topics"
                          ".sh --create --topic %s, or grant Create", topic, topic)
            else:
                log.error("topic %s does not exist and could not be created (error %d: %s); "
                          "create it with kafka-topics.sh --create --topic %s", topic, code,
                          message, topic)
        await _until_led(admin, created)
        return created
    except (KafkaError, TimeoutError, OSError) as exc:
        log.warning("could not check or create the topics %s (%s: %s); the broker creates "
                    "a missing one on first use if it allows it", ", ".join(topics),
                    type(exc).__name__, exc)
        return []
    finally:
        try:
            await asyncio.wait_for(admin.close(), 5)
        except (KafkaError, TimeoutError):
            pass


async def check_changelog(s: Settings) -> None:
    """Raise ConfigError unless the changelog topic's cleanup.policy is `compact` alone
    (a topic that does not exist yet is made so by ensure_topics). An answer the broker will
    not give (an ACL, an old broker) is logged, not fatal."""
    topic = s.changelog()
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap_servers, **security_kwargs(s))
    policy: str | None = None
    try:
        await asyncio.wait_for(admin.start(), 10)
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": None})
        for response in await asyncio.wait_for(admin.describe_configs([resource]), 10):
            for res in response.to_object()["resources"]:
                for entry in [] if res["error_code"] else res["config_entries"]:
                    if entry.get("config_names", entry.get("config_name")) == "cleanup.policy":
                        policy = entry["config_value"]
    except (KafkaError, TimeoutError, OSError, KeyError) as exc:
        log.warning("could not read the cleanup.policy of the changelog topic %s (%s: %s); "
                    "it must be compact", topic, type(exc).__name__, exc)
        return
    finally:
        try:
            await asyncio.wait_for(admin.close(), 5)
        except (KafkaError, TimeoutError):
            pass
    if policy is not None and {p.strip() for p in policy.split(",")} != {"compact"}:
        raise ConfigError(
            f"the changelog topic {topic} has cleanup.policy={policy}: retention would drop "
            "kept pages the index holds, and a restore would miss them. It must be compact: "
            f"kafka-configs.sh --bootstrap-server {s.bootstrap_servers} --alter --entity-type "
            f"topics --entity-name {topic} --add-config cleanup.policy=compact (or give "
            "--changelog-topic a new topic, made at start)")


async def _until_led(admin: AIOKafkaAdminClient, topics: list[str]) -> None:
    """Wait until every partition of `topics` (just created) has a leader: consumed before,
    the first offset lookup fails with NotLeaderForPartition and aiokafka logs an ERROR."""
    deadline = asyncio.get_running_loop().time() + 10.0
    while topics and asyncio.get_running_loop().time() < deadline:
        described = await asyncio.wait_for(admin.describe_topics(topics), 5)
        if len(described) == len(topics) and all(
                t["error_code"] == 0 and t["partitions"] and all(
                    p["error_code"] == 0 and p["leader"] >= 0 for p in t["partitions"])
                for t in described):
            return
        await asyncio.sleep(0.1)


async def read_limits(s: Settings, topics: list[str]) -> Limits:
    """`message.max.bytes` of the broker and `max.message.bytes` of each topic that exists
    (a topic created later on first use gets the broker's). Kafka's defaults if the broker
    will not say (an ACL, an old broker): logged, not fatal."""
    limits = Limits()
    admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap_servers, **security_kwargs(s))
    try:
        await asyncio.wait_for(admin.start(), 10)
        cluster = await asyncio.wait_for(admin.describe_cluster(), 10)
        resources = [ConfigResource(ConfigResourceType.TOPIC, t, {"max.message.bytes": None})
                     for t in topics]
        brokers = cluster.get("brokers") or []
        if brokers:
            resources.append(ConfigResource(ConfigResourceType.BROKER,
                                            str(brokers[0]["node_id"]),
                                            {"message.max.bytes": None}))
        for response in await asyncio.wait_for(admin.describe_configs(resources), 10):
            for res in response.to_object()["resources"]:
                if res["error_code"]:
                    continue
                for entry in res["config_entries"]:
                    value = int(entry["config_value"])
                    if res["resource_type"] == ConfigResourceType.BROKER:
                        limits.broker = value
                    else:
                        limits.topics[res["resource_name"]] = value
    except (KafkaError, TimeoutError, OSError, ValueError, KeyError) as exc:
        log.warning("could not read the broker's message size limits (%s: %s); assuming "
                    "Kafka's default %d bytes", type(exc).__name__, exc, DEFAULT_MESSAGE_MAX)
    finally:
        try:
            await asyncio.wait_for(admin.close(), 5)
        except (KafkaError, TimeoutError):
            pass
    return limits
