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
from urllib.parse import urlsplit, urlunsplit

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


def redact(url: str) -> str:
    """A URL (or comma-separated URLs) fit to print: a password in it becomes ***."""
    out = []
    for part in url.split(","):
        try:
            parts = urlsplit(part.strip())
            password = parts.password
        except ValueError:
            out.append(HIDDEN)  # too malformed to tell where a password would be
            continue
        if password is None:
            out.append(part.strip())
            continue
        user = parts.username or ""
        host = parts.netloc.rsplit("@", 1)[1]
        out.append(urlunsplit(parts._replace(netloc=f"{user}:{HIDDEN}@{host}")))
    return ",".join(out)


def scrub(text: str, secrets: list[str]) -> str:
    """`text` with every secret in it (a library's message may quote one) replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, HIDDEN)
    return text


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
    password = s.kafka_sasl_password
    if s.kafka_sasl_password_file:
        password = read_secret(s.kafka_sasl_password_file, "kafka_sasl_password_file")
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
    key_password = s.kafka_ssl_key_password
    if s.kafka_ssl_key_password_file:
        key_password = read_secret(s.kafka_ssl_key_password_file, "kafka_ssl_key_password_file")
    return KafkaSecurity(protocol, mechanism if sasl else "", s.kafka_sasl_username, password,
                         s.kafka_sasl_oauth_token_file, s.kafka_ssl_cafile,
                         s.kafka_ssl_certfile, s.kafka_ssl_keyfile, key_password,
                         s.kafka_ssl_check_hostname)


# --- Kafka client properties ----------------------------------------------------------------
_JAAS = re.compile(r"\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?)\s*;?\s*$",
                   re.DOTALL)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+?))(?=\s|;|$)')
_LOGIN_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": "PLAIN",
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
}


def parse_properties(text: str) -> dict[str, str]:
    """A Java .properties text: `key=value`, `key: value` or `key value`; # and ! comments;
    a line ending in a backslash goes on; \\t \\n \\\\ escapes."""
    out: dict[str, str] = {}
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.lstrip()
        if not line or line[0] in "#!":
            continue
        while line.endswith("\\") and not line.endswith("\\\\"):
            line = line[:-1] + next(lines, "").lstrip()
        m = re.match(r"((?:[^\s=:\\]|\\.)+)\s*[=:\s]\s*(.*)", line)
        key, value = (m.group(1), m.group(2)) if m else (line, "")
        out[_unescape(key)] = _unescape(value.rstrip())
    return out


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda e: _ESCAPES.get(e.group(1), e.group(1)), text)


def parse_jaas(config: str, source: str) -> tuple[str, dict[str, str]]:
    """sasl.jaas.config -> (the mechanism family its login module implies, its options)."""
    m = _JAAS.fullmatch(config)
    if not m:
        raise ConfigError(f"{source}: sasl.jaas.config is not '<LoginModule> required "
                          "key=\"value\" ...;'")
    module = m.group(1)
    if module not in _LOGIN_MODULES:
        raise ConfigError(f"{source}: sasl.jaas.config's {module} is not supported (PLAIN and "
                          "SCRAM login modules are; for OAUTHBEARER use "
                          "kafka_sasl_oauth_token_file)")
    options = {k: (quoted.replace('\\"', '"').replace("\\\\", "\\") if quoted is not None
                   else bare)
               for k, quoted, bare in ((o.group(1), o.group(2), o.group(3))
                                       for o in _JAAS_OPTION.finditer(m.group(3)))}
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
        return "JKS"


def read_properties(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"kafka_properties: cannot read {path}: {exc.strerror}") from None
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
        parts = urlsplit(url)
        if self.username and not parts.username:
            kwargs["username"] = self.username
        if self.password and not parts.password:
            kwargs["password"] = self.password
        if parts.scheme == "rediss":
            kwargs["ssl_check_hostname"] = self.check_hostname
            if self.cafile:
                kwargs["ssl_ca_certs"] = self.cafile
            if self.certfile:
                kwargs["ssl_certfile"] = self.certfile
                kwargs["ssl_keyfile"] = self.keyfile or self.certfile
        return kwargs

    def secrets(self, *urls: str) -> list[str]:
        found = [self.password]
        for url in urls:
            for part in url.split(","):
                try:
                    found.append(urlsplit(part.strip()).password or "")
                except ValueError:
                    continue
        return [s for s in found if s]


def redis_security(s: Any) -> RedisSecurity:
    password = s.redis_password
    if s.redis_password_file:
        password = read_secret(s.redis_password_file, "redis_password_file")
    for setting in ("redis_ssl_cafile", "redis_ssl_certfile", "redis_ssl_keyfile"):
        _file_exists(getattr(s, setting), setting)
    tls_files = s.redis_ssl_cafile or s.redis_ssl_certfile or s.redis_ssl_keyfile
    urls = [u.strip() for u in f"{s.redis_url},{s.redis_records_url}".split(",") if u.strip()]
    if tls_files and urls and not any(u.startswith("rediss://") for u in urls):
        raise ConfigError("redis_ssl_* files are given but no Redis URL is rediss:// (TLS)")
    return RedisSecurity(s.redis_username, password, s.redis_ssl_cafile, s.redis_ssl_certfile,
                         s.redis_ssl_keyfile, s.redis_ssl_check_hostname)
