"""SASL/TLS settings: explicit and from the environment variables of writ's TypeScript side, their librdkafka form,
and the registry over HTTPS with basic auth (a local HTTPS server with a CA made here). No broker needed."""

from __future__ import annotations

import base64
import datetime
import http.server
import ipaddress
import json
import logging
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from writ_client import ConnectionSecurity, KafkaSecurity, RegistryAuth, RegistryError, RegistryTls, SecurityConfigError, WireCodec, WritClient
from writ_client.security import transport_warnings

SECRET = "s3cret-Pa55word"


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    p = tmp_path / "agent.password"
    p.write_text(SECRET + "\n")
    return p


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it."""
    d = tmp_path_factory.mktemp("tls")
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "writ python test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "writ-registry")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


# -- explicit settings ----------------------------------------------------------------------------


def test_sasl_ssl_with_scram_maps_to_librdkafka(tls: dict[str, Path]) -> None:
    k = KafkaSecurity(ssl=True, ssl_ca=str(tls["ca"]), sasl_mechanism="scram-sha-512", sasl_username="agent-a", sasl_password=SECRET)
    assert k.librdkafka_config() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "agent-a",
        "sasl.password": SECRET,
        "ssl.ca.location": str(tls["ca"]),
    }
    assert SECRET not in repr(k) and SECRET not in str(k)


def test_other_protocols_and_forms(tls: dict[str, Path]) -> None:
    assert KafkaSecurity().librdkafka_config() == {"security.protocol": "PLAINTEXT"}
    assert KafkaSecurity(ssl=True).librdkafka_config() == {"security.protocol": "SSL"}
    # a CA alone turns TLS on; PEM text goes to ssl.ca.pem
    pem = tls["ca"].read_text()
    assert KafkaSecurity(ssl_ca=pem).librdkafka_config() == {"security.protocol": "SSL", "ssl.ca.pem": pem}
    plain = KafkaSecurity(sasl_mechanism="PLAIN", sasl_username="u", sasl_password=SECRET)
    assert plain.librdkafka_config()["security.protocol"] == "SASL_PLAINTEXT"
    assert plain.librdkafka_config()["sasl.mechanism"] == "PLAIN"
    assert KafkaSecurity(sasl_mechanism="scram-sha-256", sasl_username="u", sasl_password=SECRET).sasl_mechanism == "SCRAM-SHA-256"
    mtls = KafkaSecurity(ssl_ca=str(tls["ca"]), ssl_cert=str(tls["cert"]), ssl_key=str(tls["key"]), ssl_key_password="kpw").librdkafka_config()
    assert mtls["ssl.certificate.location"] == str(tls["cert"]) and mtls["ssl.key.location"] == str(tls["key"]) and mtls["ssl.key.password"] == "kpw"
    off = KafkaSecurity(ssl_verify=False).librdkafka_config()
    assert off["security.protocol"] == "SSL" and off["enable.ssl.certificate.verification"] is False


def test_invalid_settings_name_the_field_never_the_secret(tmp_path: Path, tls: dict[str, Path]) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"sasl_mechanism": "gssapi", "sasl_username": "u", "sasl_password": SECRET}, "kafka.sasl.mechanism"),
        ({"sasl_username": "u"}, "kafka.sasl"),
        ({"sasl_password": SECRET}, "kafka.sasl"),
        ({"sasl_username": "", "sasl_password": SECRET}, "kafka.sasl.username"),
        ({"ssl_ca": str(tmp_path / "missing.pem")}, "kafka.ssl.ca"),
        ({"ssl_cert": str(tls["cert"])}, "kafka.ssl.key"),
        ({"ssl_cert": str(tls["cert"]), "ssl_key": str(tmp_path / "nokey.pem")}, "kafka.ssl.key"),
    ]
    for kwargs, field in cases:
        with pytest.raises(SecurityConfigError) as err:
            KafkaSecurity(**kwargs)
        assert err.value.field == field, kwargs
        assert SECRET not in str(err.value)
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(SecurityConfigError, match="holds no PEM block"):
        KafkaSecurity(ssl_ca=str(not_pem))
    # a secret's path is not repeated either
    with pytest.raises(SecurityConfigError) as err:
        KafkaSecurity(ssl_cert=str(tls["cert"]), ssl_key=str(not_pem))
    assert str(not_pem) not in str(err.value)


def test_registry_auth_and_url_rules(tls: dict[str, Path]) -> None:
    auth = RegistryAuth("writ", SECRET)
    assert SECRET not in repr(auth)
    assert auth.header() == "Basic " + base64.b64encode(f"writ:{SECRET}".encode()).decode()
    with pytest.raises(SecurityConfigError) as err:
        WireCodec(f"https://writ:{SECRET}@127.0.0.1:1/apis/ccompat/v7")
    assert err.value.field == "schemaRegistryUrl" and SECRET not in str(err.value)
    with pytest.raises(SecurityConfigError, match="needs an https"):
        WireCodec("http://127.0.0.1:1", tls=RegistryTls(ca=str(tls["ca"])))
    with pytest.raises(SecurityConfigError, match="without a schema registry URL"):
        WireCodec(None, auth=auth)
    with pytest.raises(SecurityConfigError) as err:
        RegistryAuth("writ", "")
    assert err.value.field == "schemaRegistryAuth.password"


def test_warnings_for_settings_that_are_development_only() -> None:
    k = KafkaSecurity(sasl_username="u", sasl_password=SECRET)
    out = transport_warnings(k, "http://r", RegistryAuth("u", SECRET), RegistryTls(verify=False))
    assert any("without TLS" in w for w in out)
    assert any("basic auth over plain http" in w for w in out)
    assert any("verification is off" in w for w in out)
    assert not any(SECRET in w for w in out)
    assert transport_warnings(KafkaSecurity(ssl=True, sasl_username="u", sasl_password=SECRET), "https://r", RegistryAuth("u", SECRET), None) == []


# -- environment variables ------------------------------------------------------------------------


def test_from_env_as_the_secure_stack_gives_it(tls: dict[str, Path], password_file: Path) -> None:
    env = {
        "KAFKA_BROKERS": "127.0.0.1:19492",
        "KAFKA_SSL_CA_FILE": str(tls["ca"]),
        "KAFKA_SASL_MECHANISM": "scram-sha-512",
        "KAFKA_SASL_USERNAME": "agent-a",
        "KAFKA_SASL_PASSWORD_FILE": str(password_file),
        "SCHEMA_REGISTRY_URL": "https://127.0.0.1:18481/apis/ccompat/v7",
        "SCHEMA_REGISTRY_USERNAME": "writ",
        "SCHEMA_REGISTRY_PASSWORD_FILE": str(password_file),
        "SCHEMA_REGISTRY_CA_FILE": str(tls["ca"]),
    }
    s = ConnectionSecurity.from_env(env)
    assert s.kafka is not None and s.kafka.librdkafka_config() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "agent-a",
        "sasl.password": SECRET,  # the file's content, its trailing newline dropped
        "ssl.ca.location": str(tls["ca"]),
    }
    assert s.schema_registry_auth == RegistryAuth("writ", SECRET)
    assert s.schema_registry_tls == RegistryTls(ca=str(tls["ca"]))
    assert SECRET not in repr(s)

    client = WritClient.from_env(agent_id="agent-a", reply_topic="writ.replies.agent-a", env=env)
    assert client.brokers == "127.0.0.1:19492"
    assert client.schema_registry_url == env["SCHEMA_REGISTRY_URL"]
    conf = client.producer_config()
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.password"] == SECRET
    # the wire contract stays as it is
    assert conf["enable.idempotence"] is True and conf["acks"] == "all" and conf["partitioner"] == "murmur2_random"
    assert client._conf()["sasl.username"] == "agent-a"
    # an argument wins over its variable
    other = KafkaSecurity(ssl=True)
    assert WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env=env, kafka_security=other).kafka_security is other


def test_from_env_other_combinations(tls: dict[str, Path], password_file: Path) -> None:
    assert ConnectionSecurity.from_env({}) == ConnectionSecurity()
    assert ConnectionSecurity.from_env({"KAFKA_SSL": "true"}).kafka == KafkaSecurity(ssl=True)
    assert ConnectionSecurity.from_env({"KAFKA_SSL": "0"}).kafka == KafkaSecurity(ssl=False)
    s = ConnectionSecurity.from_env({"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": SECRET})
    assert s.kafka is not None and s.kafka.security_protocol == "SASL_PLAINTEXT" and s.kafka.sasl_mechanism == "SCRAM-SHA-512"
    s = ConnectionSecurity.from_env({"KAFKA_SSL_REJECT_UNAUTHORIZED": "false"})
    assert s.kafka is not None and s.kafka.ssl and not s.kafka.ssl_verify
    # empty variables are unset, as in TypeScript
    assert ConnectionSecurity.from_env({"KAFKA_SASL_USERNAME": "", "KAFKA_SASL_PASSWORD_FILE": ""}) == ConnectionSecurity()


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"KAFKA_SSL": "maybe"}, "KAFKA_SSL"),
        ({"KAFKA_SSL": "false", "KAFKA_SSL_CA_FILE": "/x"}, "KAFKA_SSL"),
        ({"KAFKA_SASL_PASSWORD": SECRET}, "KAFKA_SASL_USERNAME"),
        ({"KAFKA_SASL_USERNAME": "u"}, "KAFKA_SASL_PASSWORD"),
        ({"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": SECRET, "KAFKA_SASL_PASSWORD_FILE": "/x"}, "KAFKA_SASL_PASSWORD_FILE"),
        ({"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD_FILE": "/nonexistent/pw"}, "KAFKA_SASL_PASSWORD_FILE"),
        ({"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": SECRET, "KAFKA_SASL_MECHANISM": "oauthbearer"}, "KAFKA_SASL_MECHANISM"),
        ({"KAFKA_SSL_CA_FILE": "/nonexistent/ca.pem"}, "KAFKA_SSL_CA_FILE"),
        ({"SCHEMA_REGISTRY_PASSWORD": SECRET}, "SCHEMA_REGISTRY_USERNAME"),
        ({"SCHEMA_REGISTRY_USERNAME": "writ"}, "SCHEMA_REGISTRY_PASSWORD"),
        ({"SCHEMA_REGISTRY_CA_FILE": "/nonexistent/ca.pem"}, "SCHEMA_REGISTRY_CA_FILE"),
    ],
)
def test_from_env_errors_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SecurityConfigError) as err:
        ConnectionSecurity.from_env(env)
    assert err.value.field == variable
    assert SECRET not in str(err.value)


def test_an_empty_password_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SecurityConfigError, match="is empty") as err:
        ConnectionSecurity.from_env({"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD_FILE": str(empty)})
    assert err.value.field == "KAFKA_SASL_PASSWORD_FILE"


def test_from_env_needs_brokers() -> None:
    with pytest.raises(ValueError, match="KAFKA_BROKERS"):
        WritClient.from_env(agent_id="a", reply_topic="writ.replies.a", env={})


# -- the registry over HTTPS with basic auth ------------------------------------------------------


class _Registry(http.server.BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._handle()

    def do_GET(self) -> None:  # noqa: N802
        self._handle()

    def _handle(self) -> None:
        auth = self.headers.get("authorization")
        type(self).seen.append(auth)
        if self.path.endswith("/schemas/ids/99"):
            # A registry (or something in front of it) that redirects elsewhere, over plain http.
            self.send_response(302)
            self.send_header("location", f"http://127.0.0.1:{_Thief.port}/collect")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if auth != RegistryAuth("writ", SECRET).header():
            self._answer(401, {"message": "Unauthorized"})
        elif self.command == "POST":
            self._answer(200, {"id": 7})
        else:
            self._answer(200, {"schema": "{}"})


class _Thief(http.server.BaseHTTPRequestHandler):
    port = 0
    seen: list[str | None] = []

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802
        type(self).seen.append(self.headers.get("authorization"))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.fixture(scope="module")
def https_registry(tls: dict[str, Path]) -> Iterator[str]:
    thief = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Thief)
    _Thief.port = thief.server_address[1]
    threading.Thread(target=thief.serve_forever, daemon=True).start()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(tls["cert"]), str(tls["key"]))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}/apis/ccompat/v7"
    server.shutdown()
    server.server_close()
    thief.shutdown()
    thief.server_close()


def test_the_codec_uses_basic_auth_and_trusts_the_given_ca(https_registry: str, tls: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    _Registry.seen.clear()
    good = WireCodec(https_registry, auth=RegistryAuth("writ", SECRET), tls=RegistryTls(ca=str(tls["ca"])))
    framed = good.encode("writ.intents", "WriteIntent", {"a": 1})
    assert framed[:5] == b"\x00\x00\x00\x00\x07" and json.loads(framed[5:]) == {"a": 1}
    assert good.schema_id_exists(7) is True
    assert _Registry.seen == [RegistryAuth("writ", SECRET).header()] * 2
    # the CA as PEM text works too
    assert WireCodec(https_registry, auth=RegistryAuth("writ", SECRET), tls=RegistryTls(ca=tls["ca"].read_text())).schema_id_exists(8)

    # a wrong password: the registry's 401, a clear error without the password
    wrong = f"wrong-{SECRET}"
    bad = WireCodec(https_registry, auth=RegistryAuth("writ", wrong), tls=RegistryTls(ca=str(tls["ca"])))
    with pytest.raises(RegistryError) as err:
        bad.schema_id_exists(7)
    assert err.value.status == 401 and not err.value.retriable and "answered 401" in str(err.value)
    with pytest.raises(RegistryError) as err2:
        bad.schema_id("writ.intents", "WriteIntent")
    assert err2.value.status == 401 and not err2.value.retriable
    for text in (str(err.value), str(err2.value), caplog.text):
        assert wrong not in text and SECRET not in text

    # a redirect is not followed: the credentials never reach the host it points to
    _Thief.seen.clear()
    with pytest.raises(RegistryError) as err4:
        good.schema_id_exists(99)
    assert err4.value.status == 302 and _Thief.seen == [] and SECRET not in str(err4.value)

    # without the CA the server's certificate is not trusted: no request gets through
    _Registry.seen.clear()
    untrusted = WireCodec(https_registry, auth=RegistryAuth("writ", SECRET))
    with pytest.raises(RegistryError, match="could not reach") as err3:
        untrusted.schema_id_exists(7)
    assert _Registry.seen == [] and SECRET not in str(err3.value)
