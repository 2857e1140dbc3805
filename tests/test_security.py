"""The security settings without a server (security.py, kafka/secure.py): properties files
read as Kafka's tools read them, every key mapped or refused by name, the settings checked
against each other, secrets from files, and passwords kept out of what is printed."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from stream_dedup import Settings
from stream_dedup.cli.main import main
from stream_dedup.errors import ConfigError
from stream_dedup.kafka.secure import explain, security_kwargs
from stream_dedup.security import (
    kafka_security,
    parse_jaas,
    parse_properties,
    properties_settings,
    redact,
    redis_security,
)

PASSWORD = "s3cret-Pa55 word"


def _props(tmp_path: Path, text: str) -> str:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return str(path)


def test_a_properties_file_as_kafka_tools_write_it(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read here")
    path = _props(tmp_path, f"""# from the platform team
bootstrap.servers=kafka-1:9093,kafka-2:9093
security.protocol = SASL_SSL
sasl.mechanism: SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
    username="crawler" password="{PASSWORD}";
ssl.truststore.type=PEM
ssl.truststore.location={ca}
ssl.endpoint.identification.algorithm=https
""")
    s = Settings.load(env={}, overrides={"kafka_properties": path})
    assert (s.bootstrap_servers, s.kafka_security_protocol, s.kafka_sasl_mechanism,
            s.kafka_sasl_username, s.kafka_sasl_password, s.kafka_ssl_cafile,
            s.kafka_ssl_check_hostname) == ("kafka-1:9093,kafka-2:9093", "SASL_SSL",
                                            "SCRAM-SHA-512", "crawler", PASSWORD, str(ca), True)
    # the environment and the flags win over the file
    s = Settings.load(env={"STREAM_DEDUP_KAFKA_SASL_USERNAME": "other"},
                      overrides={"kafka_properties": path, "bootstrap_servers": "b:1"})
    assert (s.kafka_sasl_username, s.bootstrap_servers) == ("other", "b:1")
    assert PASSWORD not in repr(s)


def test_librdkafka_names_and_a_plain_login(tmp_path: Path) -> None:
    props = parse_properties("security.protocol=SASL_PLAINTEXT\nsasl.mechanisms=PLAIN\n"
                             "sasl.username=u\nsasl.password=p\n")
    assert properties_settings(props, "f") == {
        "kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN",
        "kafka_sasl_username": "u", "kafka_sasl_password": "p"}
    family, options = parse_jaas('org.apache.kafka.common.security.plain.PlainLoginModule '
                                 'required username="a b" password="x\\"y";', "f")
    assert (family, options) == ("PLAIN", {"username": "a b", "password": 'x"y'})
    mapped = properties_settings({"sasl.jaas.config": "org.apache.kafka.common.security.plain."
                                  "PlainLoginModule required username=u password=p;"}, "f")
    assert mapped["kafka_sasl_mechanism"] == "PLAIN"  # the login module says it


@pytest.mark.parametrize("text, named", [
    ("request.timeout.ms=5000", "request.timeout.ms is not supported"),
    ("ssl.truststore.location={tmp}/x.jks", "a JKS store"),
    ("ssl.keystore.type=PKCS12\nssl.keystore.location=/k.p12", "a PKCS12 store"),
    ("sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required;",
     "Krb5LoginModule is not supported"),
    ("sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
     "username=u password=p;", "needs sasl.mechanism=SCRAM-SHA-256"),
    ("ssl.endpoint.identification.algorithm=ldap", "'https'"),
])
def test_what_cannot_be_mapped_is_refused_by_name(tmp_path: Path, text: str, named: str) -> None:
    (tmp_path / "x.jks").write_bytes(b"\xfe\xed\xfe\xed\x00\x00\x00\x02")  # a JKS magic
    with pytest.raises(ConfigError, match=named):
        Settings.load(env={}, overrides={"kafka_properties": _props(
            tmp_path, text.replace("{tmp}", str(tmp_path)))})


def test_a_missing_properties_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kafka_properties: cannot read .*nope"):
        Settings.load(env={}, overrides={"kafka_properties": str(tmp_path / "nope")})


def _checked(**values: object) -> object:
    return kafka_security(Settings(**values))  # type: ignore[arg-type]


@pytest.mark.parametrize("values, named", [
    ({"kafka_security_protocol": "SASL_SSL"}, "kafka_sasl_mechanism: none"),
    ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "GSSAPI"}, "GSSAPI"),
    ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "PLAIN"},
     "needs kafka_sasl_username and a password"),
    ({"kafka_sasl_mechanism": "PLAIN"}, "kafka_security_protocol is PLAINTEXT"),
    ({"kafka_ssl_cafile": "/etc/hostname"}, "TLS files are given"),
    ({"kafka_security_protocol": "SSL", "kafka_ssl_cafile": "/no/ca.pem"},
     "kafka_ssl_cafile: no such file"),
    ({"kafka_security_protocol": "TLS"}, "is not one of PLAINTEXT, SSL"),
    ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "OAUTHBEARER"},
     "kafka_sasl_oauth_token_file"),
])
def test_settings_that_do_not_agree_are_refused(values: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        _checked(**values)


def test_passwords_come_from_files_and_never_show(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")  # as `echo` leaves it
    s = Settings.load(env={"STREAM_DEDUP_KAFKA_SASL_PASSWORD_FILE": str(secret),
                           "STREAM_DEDUP_HTTP_TOKEN_FILE": str(secret)},
                      overrides={"kafka_security_protocol": "SASL_SSL",
                                 "kafka_sasl_mechanism": "SCRAM-SHA-256",
                                 "kafka_sasl_username": "crawler"})
    sec = kafka_security(s)
    assert sec.password == PASSWORD and s.http_token == PASSWORD
    assert PASSWORD not in repr(s) and PASSWORD not in repr(sec)
    assert PASSWORD not in sec.describe()
    kwargs = security_kwargs(s)
    assert kwargs["sasl_plain_password"] == PASSWORD
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert kwargs["ssl_context"].check_hostname
    with pytest.raises(ConfigError, match="kafka_sasl_password_file: cannot read") as err:
        kafka_security(s.replace(kafka_sasl_password_file=str(tmp_path / "gone")))
    assert PASSWORD not in str(err.value)


def test_explain_names_the_setting_and_hides_the_password() -> None:
    s = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="PLAIN",
                 kafka_sasl_username="crawler", kafka_sasl_password=PASSWORD)
    line = explain(RuntimeError(f"SaslAuthenticationFailed: password {PASSWORD} bad"), s)
    assert line is not None and "kafka_sasl_username" in line and PASSWORD not in line
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed "
                                             "certificate in certificate chain")
    assert "kafka_ssl_cafile" in (explain(verify, s) or "")
    mismatch = ssl.SSLCertVerificationError(1, "certificate verify failed: IP address "
                                               "mismatch, certificate is not valid for '::1'")
    assert "--no-kafka-ssl-check-hostname" in (explain(mismatch, s) or "")
    assert explain(ConnectionRefusedError(111, "refused"), s) is None  # waited for


def test_redis_urls_are_printed_without_their_password() -> None:
    assert redact(f"redis://alice:{PASSWORD}@h:1,rediss://:{PASSWORD}@x:2,redis://h:3") == \
        "redis://alice:***@h:1,rediss://:***@x:2,redis://h:3"
    s = Settings(index="redis", redis_url=f"redis://alice:{PASSWORD}@h:1")
    assert PASSWORD not in repr(s)
    sec = redis_security(s.replace(redis_password="other", redis_username="bob",
                                   redis_ssl_check_hostname=False))
    assert sec.client_kwargs(f"redis://alice:{PASSWORD}@h:1") == {}  # the URL's wins
    assert sec.client_kwargs("rediss://h:1") == {"username": "bob", "password": "other",
                                                 "ssl_check_hostname": False}
    with pytest.raises(ConfigError, match="no Redis URL is rediss://"):
        redis_security(s.replace(redis_ssl_cafile="/etc/hostname"))


def test_help_names_the_secrets_variables_and_offers_no_flag_for_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for env in ("STREAM_DEDUP_KAFKA_SASL_PASSWORD", "STREAM_DEDUP_REDIS_PASSWORD"):
        assert env in text
    for flag in ("--kafka-sasl-password ", "--redis-password ", "--http-token "):
        assert flag not in text
    assert "--kafka-properties FILE" in text and "--kafka-sasl-password-file FILE" in text


# --- what a review found (each once leaked a secret or connected otherwise than Kafka) -----
@pytest.mark.parametrize("url", [
    f"redis://alice:ab/cd{PASSWORD}@127.0.0.1:7400", f"redis://alice:Ab#c{PASSWORD}@h:1",
    f"redis://alice:a,{PASSWORD}@h:1,redis://h:2", f"redis://alice@h:1/?password={PASSWORD}",
    f"rediss://:p@{PASSWORD}@[::1]:6379"])
def test_any_password_a_redis_url_carries_is_hidden(url: str) -> None:
    assert PASSWORD not in redact(url) and "***" in redact(url)


def test_a_secret_given_as_a_flag_is_not_taken_for_its_file_flag_nor_echoed(
        capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--redis-password", "--kafka-sasl-password", "--http-token"):
        with pytest.raises(SystemExit):
            main(["replay", "x.jsonl", "-o", "y", flag, PASSWORD])
        err = capsys.readouterr().err
        assert "unrecognized arguments" in err and PASSWORD not in err


@pytest.mark.parametrize("config, expected", [
    ('org.apache.kafka.common.security.plain.PlainLoginModule required username="a"'
     'password="p w";', {"username": "a", "password": "p w"}),
    ("org.apache.kafka.common.security.plain.PlainLoginModule REQUIRED username='a' "
     "password='x;y=z'", {"username": "a", "password": "x;y=z"}),
])
def test_jaas_as_kafka_reads_it(config: str, expected: dict[str, str]) -> None:
    assert parse_jaas(config, "f") == ("PLAIN", expected)


def test_jaas_with_two_login_modules_is_refused_without_quoting_it() -> None:
    config = ('org.apache.kafka.common.security.plain.PlainLoginModule required username=a '
              f'password="{PASSWORD}"; x.Other required;')
    with pytest.raises(ConfigError, match="one login module") as err:
        parse_jaas(config, "f")
    assert PASSWORD not in str(err.value)


def test_properties_as_java_reads_them(tmp_path: Path) -> None:
    assert parse_properties("a=1\\\\\\\nb=2\nc=p\\u00e4ss\nd=x\fy\ne : v  \n  f\\\n   g\n") == {
        "a": "1\\b=2", "c": "päss", "d": "x\fy", "e": "v", "fg": ""}
    latin = tmp_path / "latin.properties"
    latin.write_bytes("sasl.username=j\xf6rg\n".encode("latin-1"))
    assert Settings.load(env={}, overrides={"kafka_properties": str(latin)}
                         ).kafka_sasl_username == "jörg"
    with pytest.raises(ConfigError, match="not key=value") as err:
        properties_settings({f"x{PASSWORD}": ""}, "f")
    assert PASSWORD not in str(err.value)


def test_a_secret_and_its_file_together_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("other")
    s = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="PLAIN",
                 kafka_sasl_username="u", kafka_sasl_password=PASSWORD,
                 kafka_sasl_password_file=str(secret))
    with pytest.raises(ConfigError, match="kafka_sasl_password and kafka_sasl_password_file"):
        kafka_security(s)


def test_aiokafka_s_debug_line_with_the_sasl_bytes_is_dropped(
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.DEBUG, logger="aiokafka.conn"):
        logging.getLogger("aiokafka.conn").debug(
            "Request to %s: SaslAuthenticateRequest_v1(sasl_auth_bytes=%r)", "h:1",
            f"u\0u\0{PASSWORD}".encode())
        logging.getLogger("aiokafka.conn").debug("Request to %s: MetadataRequest", "h:1")
    assert PASSWORD not in caplog.text and "MetadataRequest" in caplog.text
