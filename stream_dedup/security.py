"""Connecting to a secured Kafka and Redis: what the settings may say and how they agree,
a Kafka client properties file read as Kafka's own tools read it, and secrets that stay in
the process (never in a message, a log line, --help or an exception).

Pure, except that it reads the files the settings name (passwords, a properties file) and
checks that the certificate files exist. The clients are built at the edges:
kafka/client.py (aiokafka's arguments), index/redis/client.py (redis-py's).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from stream_dedup.errors import ConfigError

KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
HIDDEN = "***"


# --- secrets --------------------------------------------------------------------------------
def read_secret(path: str, setting: str) -> str:
    """A secret kept in a file (a Kubernetes Secret's mounted key): its text, less the line
    end an editor or `echo` leaves. An error names the setting and the path, never the
    text."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{setting}: {path} is not UTF-8 text") from None


# scheme://userinfo@rest: userinfo runs to the LAST @ (a password may hold / # ? , @ unencoded)
_USERINFO = re.compile(r"^(\w[\w+.-]*://)(.*)@(.*)$", re.DOTALL)
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&]*")


def split_urls(text: str) -> list[str]:
    """Comma-separated URLs: split only before a `scheme://` (a password may hold a comma)."""
    return [u.strip() for u in re.split(r",\s*(?=\w[\w+.-]*://)", text) if u.strip()]


def url_password(url: str) -> str:
    """The password a URL carries (in its user info or a `password=` query argument)."""
    m = _USERINFO.match(url)
    if m and ":" in m.group(2):
        return m.group(2).split(":", 1)[1]
    query = re.search(r"(?i)[?&]password=([^&]*)", url)
    return query.group(1) if query else ""


def redact(url: str) -> str:
    """URLs (comma-separated) fit to print: a password in them becomes ***."""
    out = []
    for part in split_urls(url):
        m = _USERINFO.match(part)
        if m and ":" in m.group(2):
            part = f"{m.group(1)}{m.group(2).split(':', 1)[0]}:{HIDDEN}@{m.group(3)}"
        out.append(_QUERY_PASSWORD.sub(lambda q: q.group(1) + HIDDEN, part))
    return ",".join(out)


def scrub(text: str, secrets: list[str]) -> str:
    """`text` with every secret in it (a library's message may quote one) replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, HIDDEN)
    return text


def _one_of(value: str, path: str, setting: str) -> str:
    """A secret given as itself or in a file, not both (which would win is a guess)."""
    if value and path:
        raise ConfigError(f"{setting} and {setting}_file are both given: keep one")
    return read_secret(path, f"{setting}_file") if path else value


def _file_exists(path: str, setting: str) -> str:
    if path and not os.path.isfile(path):
        raise ConfigError(f"{setting}: no such file: {path}")
    return path


# --- Kafka ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class KafkaSecurity:
    """How a Kafka client authenticates and encrypts, checked: a SASL protocol has a
    mechanism and its credentials, TLS files only with a TLS protocol."""

    protocol: str = "PLAINTEXT"
    mechanism: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    oauth_token_file: str = ""
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    key_password: str = field(default="", repr=False)
    check_hostname: bool = True

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def secrets(self) -> list[str]:
        return [self.password, self.key_password]

    def describe(self) -> str:
        """One line for the log at start: what is used, no secret."""
        what = [self.protocol]
        if self.sasl:
            what.append(f"{self.mechanism} as {self.username or 'a token'}")
        if self.tls:
            what.append(f"CA {self.cafile or 'the system store'}")
            if self.certfile:
                what.append(f"client certificate {self.certfile}")
            if not self.check_hostname:
                what.append("host names NOT checked")
        return ", ".join(what)


def kafka_security(s: Any) -> KafkaSecurity:
    """The Kafka security of settings `s`, checked, passwords read from their files."""
    protocol = s.kafka_security_protocol.upper()
    if protocol not in KAFKA_PROTOCOLS:
        raise ConfigError(f"kafka_security_protocol: {s.kafka_security_protocol!r} is not one "
                          f"of {', '.join(KAFKA_PROTOCOLS)}")
    mechanism = s.kafka_sasl_mechanism.upper()
    sasl = protocol.startswith("SASL_")
    tls = protocol in ("SSL", "SASL_SSL")
    password = _one_of(s.kafka_sasl_password, s.kafka_sasl_password_file, "kafka_sasl_password")
    if not sasl and (mechanism or s.kafka_sasl_username or password):
        raise ConfigError(f"SASL settings are given but kafka_security_protocol is {protocol}: "
                          "use SASL_SSL (or SASL_PLAINTEXT on a trusted network)")
    if sasl:
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"kafka_sasl_mechanism: {s.kafka_sasl_mechanism or 'none'} with "
                              f"{protocol}; one of {', '.join(SASL_MECHANISMS)} (GSSAPI/"
                              "Kerberos is not supported)")
        if mechanism == "OAUTHBEARER":
            if not s.kafka_sasl_oauth_token_file:
                raise ConfigError("OAUTHBEARER needs kafka_sasl_oauth_token_file: a file "
                                  "holding the token (read again at every login)")
            _file_exists(s.kafka_sasl_oauth_token_file, "kafka_sasl_oauth_token_file")
        elif not s.kafka_sasl_username or not password:
            raise ConfigError(f"SASL {mechanism} needs kafka_sasl_username and a password "
                              "(STREAM_DEDUP_KAFKA_SASL_PASSWORD, the config file, or "
                              "kafka_sasl_password_file)")
    files = {"kafka_ssl_cafile": s.kafka_ssl_cafile, "kafka_ssl_certfile": s.kafka_ssl_certfile,
             "kafka_ssl_keyfile": s.kafka_ssl_keyfile}
    if not tls and any(files.values()):
        raise ConfigError(f"TLS files are given but kafka_security_protocol is {protocol}: "
                          "use SSL or SASL_SSL")
    for setting, path in files.items():
        _file_exists(path, setting)
    if s.kafka_ssl_keyfile and not s.kafka_ssl_certfile:
        raise ConfigError("kafka_ssl_keyfile needs kafka_ssl_certfile (the client certificate)")
    key_password = _one_of(s.kafka_ssl_key_password, s.kafka_ssl_key_password_file,
                           "kafka_ssl_key_password")
    return KafkaSecurity(protocol, mechanism if sasl else "", s.kafka_sasl_username, password,
                         s.kafka_sasl_oauth_token_file, s.kafka_ssl_cafile,
                         s.kafka_ssl_certfile, s.kafka_ssl_keyfile, key_password,
                         s.kafka_ssl_check_hostname)


# --- Kafka client properties ----------------------------------------------------------------
# sasl.jaas.config's tokens, as Kafka's JaasConfig reads them (a StreamTokenizer): a quoted
# string ("..." or '...'), = or ;, or a word
_JAAS_TOKEN = re.compile(r"""\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|([=;])|([^\s=;"']+))""",
                         re.DOTALL)
_JAAS_FLAGS = ("required", "requisite", "sufficient", "optional")
_LOGIN_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": "PLAIN",
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
}


def parse_properties(text: str) -> dict[str, str]:
    """A .properties text as java.util.Properties reads it: lines end at \\n, \\r or
    \\r\\n; `key=value`, `key: value` or `key value`; # and ! comments; an odd number of
    trailing backslashes continues a line; \\t \\n \\r \\f \\uXXXX escapes. Values are
    trimmed, as Kafka trims what it reads."""
    out: dict[str, str] = {}
    lines = iter(re.split(r"\r\n|\r|\n", text))
    for raw in lines:
        line = raw.lstrip(" \t\f")
        if not line or line[0] in "#!":
            continue
        while (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            line = line[:-1] + next(lines, "").lstrip(" \t\f")
        m = re.match(r"((?:[^\s=:\\]|\\.)*)[ \t\f]*[=:]?[ \t\f]*(.*)", line, re.DOTALL)
        assert m is not None  # every part of the pattern may be empty
        out[_unescape(m.group(1))] = _unescape(m.group(2)).strip()
    return out


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    def one(e: re.Match[str]) -> str:
        c = e.group(1)
        return chr(int(c[1:], 16)) if len(c) == 5 else _ESCAPES.get(c, c)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", one, text, flags=re.DOTALL)


def parse_jaas(config: str, source: str) -> tuple[str, dict[str, str]]:
    """sasl.jaas.config -> (the mechanism family its login module implies, its options).
    One login module, as Kafka allows; an error never quotes the text (it holds a
    password)."""
    bad = ConfigError(f"{source}: sasl.jaas.config is not '<LoginModule> required "
                      "key=\"value\" ...;' with one login module")
    tokens: list[tuple[str, str]] = []  # (kind: word | str | sym, text)
    pos, config = 0, config.rstrip()
    while pos < len(config):
        m = _JAAS_TOKEN.match(config, pos)
        if m is None:
            raise bad
        pos = m.end()
        if m.group(3):
            tokens.append(("sym", m.group(3)))
        elif m.group(4):
            tokens.append(("word", m.group(4)))
        else:
            quoted = m.group(1) if m.group(1) is not None else m.group(2)
            tokens.append(("str", _unescape(quoted)))
    if len(tokens) < 2 or tokens[0][0] != "word" or tokens[1][1].lower() not in _JAAS_FLAGS:
        raise bad
    module, options, i = tokens[0][1], {}, 2
    while i < len(tokens) and tokens[i] != ("sym", ";"):
        if i + 2 >= len(tokens) or tokens[i][0] != "word" or tokens[i + 1] != ("sym", "=") \
                or tokens[i + 2][0] == "sym":
            raise bad
        options[tokens[i][1]] = tokens[i + 2][1]
        i += 3
    if tokens[i + 1:]:
        raise bad  # a second login module: Kafka refuses it too
    if module not in _LOGIN_MODULES:
        raise ConfigError(f"{source}: sasl.jaas.config's {module} is not supported (PLAIN and "
                          "SCRAM login modules are; for OAUTHBEARER use "
                          "kafka_sasl_oauth_token_file)")
    return _LOGIN_MODULES[module], options


def properties_settings(props: dict[str, str], source: str) -> dict[str, Any]:
    """A Kafka client properties file -> settings. Every key is mapped or refused by name:
    a setting silently dropped would connect some other way than the file says."""
    out: dict[str, Any] = {}
    truststore_type = _store_type(props, "ssl.truststore")
    keystore_type = _store_type(props, "ssl.keystore")
    family = ""
    for key, value in props.items():
        if key == "bootstrap.servers":
            out["bootstrap_servers"] = value
        elif key == "security.protocol":
            out["kafka_security_protocol"] = value
        elif key == "sasl.mechanism" or key == "sasl.mechanisms":  # librdkafka's name too
            out["kafka_sasl_mechanism"] = value
        elif key == "sasl.jaas.config":
            family, options = parse_jaas(value, source)
            out["kafka_sasl_username"] = options.get("username", "")
            out["kafka_sasl_password"] = options.get("password", "")
        elif key == "sasl.username":  # librdkafka (kcat)
            out["kafka_sasl_username"] = value
        elif key == "sasl.password":
            out["kafka_sasl_password"] = value
        elif key in ("ssl.truststore.location", "ssl.ca.location"):
            if key == "ssl.truststore.location" and truststore_type != "PEM":
                raise ConfigError(f"{source}: ssl.truststore.location is a {truststore_type} "
                                  "store; aiokafka reads PEM: export the CA (keytool "
                                  "-exportcert -rfc) and give it as ssl.truststore.location "
                                  "with ssl.truststore.type=PEM")
            out["kafka_ssl_cafile"] = value
        elif key == "ssl.keystore.location":
            if keystore_type != "PEM":
                raise ConfigError(f"{source}: ssl.keystore.location is a {keystore_type} store; "
                                  "aiokafka reads PEM: give the certificate and key as PEM "
                                  "(ssl.keystore.type=PEM, or ssl.certificate.location and "
                                  "ssl.key.location)")
            out["kafka_ssl_certfile"] = out.setdefault("kafka_ssl_certfile", value)
            out["kafka_ssl_keyfile"] = out.setdefault("kafka_ssl_keyfile", value)
        elif key == "ssl.certificate.location":
            out["kafka_ssl_certfile"] = value
        elif key == "ssl.key.location":
            out["kafka_ssl_keyfile"] = value
        elif key in ("ssl.key.password", "ssl.keystore.password"):
            out["kafka_ssl_key_password"] = value
        elif key == "ssl.endpoint.identification.algorithm":
            if value.lower() not in ("", "https", "none"):
                raise ConfigError(f"{source}: ssl.endpoint.identification.algorithm={value}: "
                                  "'https' (check the broker's host name) or empty")
            out["kafka_ssl_check_hostname"] = value.lower() == "https"
        elif key in ("ssl.truststore.type", "ssl.keystore.type", "ssl.truststore.password"):
            pass  # read with the location above (a PEM store has no password)
        elif not re.fullmatch(r"[\w.-]+", key):
            raise ConfigError(f"{source}: a line that is not key=value (not quoted here: it "
                              "may hold a secret)")
        else:
            raise ConfigError(f"{source}: {key} is not supported (stream-dedup maps "
                              "bootstrap.servers, security.protocol, sasl.mechanism, "
                              "sasl.jaas.config, sasl.username/password and the ssl.* "
                              "locations; set the rest with its own settings)")
    if family == "SCRAM" and not out.get("kafka_sasl_mechanism", "").upper().startswith("SCRAM"):
        raise ConfigError(f"{source}: a ScramLoginModule needs sasl.mechanism=SCRAM-SHA-256 "
                          "or SCRAM-SHA-512")
    if family == "PLAIN":
        out.setdefault("kafka_sasl_mechanism", "PLAIN")
    return out


def _store_type(props: dict[str, str], store: str) -> str:
    """A store's type as Kafka reads it: the .type key, else JKS (Kafka's default) unless
    the file is PEM text."""
    given = props.get(f"{store}.type")
    if given:
        return given.upper()
    try:
        with open(props.get(f"{store}.location", ""), "rb") as f:
            return "PEM" if f.read(64).lstrip().startswith(b"-----BEGIN") else "JKS"
    except OSError:
        return "PEM"  # no such file: the check of the file says so, not a type guessed


def read_properties(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(f"kafka_properties: cannot read {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")  # what java.util.Properties.load(InputStream) reads
    return properties_settings(parse_properties(text), path)


# --- Redis ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RedisSecurity:
    """An ACL user and password (or the URL's), and TLS files for rediss:// URLs."""

    username: str = ""
    password: str = field(default="", repr=False)
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    check_hostname: bool = True

    def client_kwargs(self, url: str) -> dict[str, Any]:
        """redis-py's keyword arguments for `url` (a password in the URL wins: it may be
        another store's)."""
        kwargs: dict[str, Any] = {}
        m = _USERINFO.match(url)
        if self.username and not (m and m.group(2).split(":", 1)[0]):
            kwargs["username"] = self.username
        if self.password and not url_password(url):
            kwargs["password"] = self.password
        if url.startswith("rediss://"):
            kwargs["ssl_check_hostname"] = self.check_hostname
            if self.cafile:
                kwargs["ssl_ca_certs"] = self.cafile
            if self.certfile:
                kwargs["ssl_certfile"] = self.certfile
                kwargs["ssl_keyfile"] = self.keyfile or self.certfile
        return kwargs

    def secrets(self, *urls: str) -> list[str]:
        found = [self.password, *(url_password(u) for url in urls for u in split_urls(url))]
        return [s for s in found if s]


def redis_security(s: Any) -> RedisSecurity:
    password = _one_of(s.redis_password, s.redis_password_file, "redis_password")
    for setting in ("redis_ssl_cafile", "redis_ssl_certfile", "redis_ssl_keyfile"):
        _file_exists(getattr(s, setting), setting)
    tls_files = s.redis_ssl_cafile or s.redis_ssl_certfile or s.redis_ssl_keyfile
    if s.redis_ssl_keyfile and not s.redis_ssl_certfile:
        raise ConfigError("redis_ssl_keyfile needs redis_ssl_certfile (the client certificate)")
    urls = split_urls(f"{s.redis_url},{s.redis_records_url}")
    if tls_files and urls and not any(u.startswith("rediss://") for u in urls):
        raise ConfigError("redis_ssl_* files are given but no Redis URL is rediss:// (TLS)")
    return RedisSecurity(s.redis_username, password, s.redis_ssl_cafile, s.redis_ssl_certfile,
                         s.redis_ssl_keyfile, s.redis_ssl_check_hostname)
