"""A secured broker, in aiokafka's terms: the keyword arguments every client of ours takes
(SASL and TLS from the settings, security.py), and what a refusal at start means, in one
line that names the setting to fix (a wrong password is not retried like a broker that is
down: it would fail the same way forever).

aiokafka says why it could not connect only in its log: `start()` raises "Unable to
bootstrap from [...]" with no cause, whatever happened (measured with aiokafka 0.14 against
deploy/kafka-local's secure listeners: a wrong password, an unknown CA, a host name
mismatch, a plain-text client on a TLS port). `REFUSALS` keeps the last reason it logged.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.helpers import create_ssl_context

from stream_dedup.config import Settings
from stream_dedup.errors import ConfigError
from stream_dedup.security import KafkaSecurity, kafka_security, read_secret, scrub

log = logging.getLogger("stream_dedup.kafka")
FRESH_S = 30.0  # a logged reason this recent explains a failed start
CLOSED_ATTEMPTS = 3  # "connection closed" this often in a row at start: not a broker restart


class Refusals(logging.Handler):
    """The last reason aiokafka logged for a connection it could not make."""

    PATTERN = re.compile(r'Unable connect to "([^"]*)": (.*)', re.DOTALL)

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last: tuple[float, str, str] | None = None  # when, host, reason

    def emit(self, record: logging.LogRecord) -> None:
        m = self.PATTERN.match(record.getMessage())
        if m:
            self.last = (time.monotonic(), m.group(1), m.group(2))

    def recent(self) -> str | None:
        if self.last is None or time.monotonic() - self.last[0] > FRESH_S:
            return None
        return f"{self.last[1]}: {self.last[2]}"


class HideSasl(logging.Filter):
    """aiokafka logs every request at debug level, a SASL one with the password (or token)
    in its bytes: those records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot be formatted is not ours to judge
            return True
        return "sasl_auth_bytes" not in text and "SaslAuthenticate" not in text


REFUSALS = Refusals()
logging.getLogger("aiokafka").addHandler(REFUSALS)
logging.getLogger("aiokafka.conn").addFilter(HideSasl())


class FileToken(AbstractTokenProvider):  # type: ignore[misc]
    """OAUTHBEARER: the token in a file, read at every login (a rotated token is used as
    soon as it is written, as Kubernetes projects service account tokens)."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def token(self) -> str:
        return await asyncio.to_thread(read_secret, self.path, "kafka_sasl_oauth_token_file")


def security_kwargs(s: Settings) -> dict[str, Any]:
    """aiokafka's security arguments for settings `s` (nothing for PLAINTEXT)."""
    sec = kafka_security(s)
    if sec.protocol == "PLAINTEXT":
        return {}
    kwargs: dict[str, Any] = {"security_protocol": sec.protocol}
    if sec.tls:
        kwargs["ssl_context"] = ssl_context(sec)
    if sec.sasl:
        kwargs["sasl_mechanism"] = sec.mechanism
        if sec.mechanism == "OAUTHBEARER":
            kwargs["sasl_oauth_token_provider"] = FileToken(sec.oauth_token_file)
        else:
            kwargs["sasl_plain_username"] = sec.username
            kwargs["sasl_plain_password"] = sec.password
    return kwargs


def ssl_context(sec: KafkaSecurity) -> ssl.SSLContext:
    """The TLS context: the CA file (else the system's store), a client certificate if
    given, host names checked unless turned off. A file that is not what it should be is a
    ConfigError naming the setting."""
    try:
        context = create_ssl_context(cafile=sec.cafile or None)
    except ssl.SSLError as exc:
        raise ConfigError(f"Kafka TLS: cannot load kafka_ssl_cafile {sec.cafile}: {exc}") \
            from None
    if sec.certfile:
        try:
            context.load_cert_chain(sec.certfile, sec.keyfile or None,
                                    sec.key_password or None)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(scrub(f"Kafka TLS: cannot load the client certificate "
                                    f"(kafka_ssl_certfile, kafka_ssl_keyfile, the key's "
                                    f"password): {exc}", sec.secrets())) from None
    if sec.cafile == "":
        context.load_default_certs()
    context.check_hostname = sec.check_hostname
    return context


def explain(exc: BaseException, s: Settings, attempts: int = 1) -> str | None:
    """One line for a refusal at start that no retry gets past (a wrong password, a
    certificate not trusted, a TLS port spoken to in plain text ...), naming the setting to
    fix; None for anything else (a broker that is down is waited for, as before).
    `attempts`: how many times in a row the start failed so."""
    sec = kafka_security(s)
    text = scrub(f"{type(exc).__name__}: {exc}", sec.secrets())
    reason = REFUSALS.recent() if "Unable to bootstrap" in str(exc) else None
    if reason is not None:
        text = scrub(reason, sec.secrets())
        if "closed" in reason and "Connection at" in reason:
            if attempts < CLOSED_ATTEMPTS:
                return None
            return (f"Kafka closed every connection at once ({text}): a TLS listener "
                    f"spoken to as {sec.protocol}, or one that wants a client certificate? "
                    "Check kafka_security_protocol (SSL or SASL_SSL for a TLS port) and "
                    "kafka_ssl_certfile")
    chain = [exc, exc.__cause__, exc.__context__]
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in chain) \
            or "CERTIFICATE_VERIFY_FAILED" in text:
        if "mismatch" in text:
            return (f"Kafka TLS: the broker's certificate names another host ({text}); connect "
                    "by a name the certificate has (bootstrap_servers), or, for a test "
                    "broker only, --no-kafka-ssl-check-hostname")
        return (f"Kafka TLS: the broker's certificate is not signed by "
                f"{sec.cafile or 'a CA of the system store'} ({text}): give its CA as "
                "kafka_ssl_cafile")
    name = type(exc).__name__
    if "Authentication" in name or "SaslAuthentication" in text or "authentication" in \
            text.lower():
        return (f"Kafka authentication failed for {sec.username or 'this client'} "
                f"({sec.mechanism or sec.protocol}; {text}): check kafka_sasl_username, the "
                "password and kafka_sasl_mechanism")
    if "Authorization" in name:
        return _refused_operation(name, text, sec.username or "this client", s)
    return None


def _refused_operation(name: str, text: str, user: str, s: Settings) -> str:
    """What an authorization error refused, and the ACL that allows it (Kafka's names)."""
    what = {
        "ClusterAuthorizationFailedError": "IdempotentWrite on the cluster (the producers "
        "are idempotent, so that a retry does not duplicate an output)",
        "GroupAuthorizationFailedError": f"Read on the consumer group {s.group_id}",
        "TransactionalIdAuthorizationFailed": f"Write on the transactional ids {s.group_id}-* "
        "(--exactly-once)",
        "TopicAuthorizationFailedError": "Read on the input topic / Write on the output topics "
        "named",
    }.get(name, "an operation")
    return f"Kafka refused {user} {what} ({text}): grant it with kafka-acls.sh"
