"""Secure transport: SASL and TLS to the brokers, basic auth and TLS to the schema registry.

The same settings, and the same environment variables, as writ's TypeScript
side (``src/security/transport.ts``)::

    KAFKA_SSL                        true/false (1/0, yes/no); implied by any KAFKA_SSL_* file
    KAFKA_SSL_CA_FILE                CA certificate(s) to trust (PEM file)      → ssl.ca.location
    KAFKA_SSL_CERT_FILE, _KEY_FILE   client certificate and key (mutual TLS)    → ssl.certificate.location, ssl.key.location
    KAFKA_SSL_REJECT_UNAUTHORIZED    false turns certificate checks off (development only)
    KAFKA_SASL_MECHANISM             scram-sha-512 (default), scram-sha-256, plain
    KAFKA_SASL_USERNAME
    KAFKA_SASL_PASSWORD              or KAFKA_SASL_PASSWORD_FILE (the file's content, one trailing newline dropped)
    SCHEMA_REGISTRY_USERNAME
    SCHEMA_REGISTRY_PASSWORD         or SCHEMA_REGISTRY_PASSWORD_FILE
    SCHEMA_REGISTRY_CA_FILE          CA for an https registry URL

Error messages name the field or the variable, never a secret; passwords are
left out of every ``repr``. librdkafka gets ``security.protocol`` (``SSL``,
``SASL_PLAINTEXT`` or ``SASL_SSL``), ``sasl.mechanism`` (``SCRAM-SHA-512``…),
``sasl.username``, ``sasl.password`` and the ``ssl.*`` settings.
"""

from __future__ import annotations

import base64
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SECURITY_VARIABLES",
    "ConnectionSecurity",
    "KafkaSecurity",
    "RegistryAuth",
    "RegistryTls",
    "SecurityConfigError",
    "check_registry_url",
    "transport_warnings",
]

#: Every variable :meth:`ConnectionSecurity.from_env` reads (as TypeScript's ``SECURITY_VARIABLES``).
SECURITY_VARIABLES = (
    "KAFKA_SSL",
    "KAFKA_SSL_CA_FILE",
    "KAFKA_SSL_CERT_FILE",
    "KAFKA_SSL_KEY_FILE",
    "KAFKA_SSL_REJECT_UNAUTHORIZED",
    "KAFKA_SASL_MECHANISM",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SASL_PASSWORD_FILE",
    "SCHEMA_REGISTRY_USERNAME",
    "SCHEMA_REGISTRY_PASSWORD",
    "SCHEMA_REGISTRY_PASSWORD_FILE",
    "SCHEMA_REGISTRY_CA_FILE",
)

SASL_MECHANISMS = {"scram-sha-512": "SCRAM-SHA-512", "scram-sha-256": "SCRAM-SHA-256", "plain": "PLAIN"}
_PEM_BLOCK = re.compile(r"-----BEGIN [A-Z0-9 ]+-----")


class SecurityConfigError(ValueError):
    """An invalid security setting. ``field`` is the setting or variable at fault; the message never holds a secret."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"invalid configuration: {field}: {message}")
        self.field = field
        self.detail = message


def _is_pem(value: str) -> bool:
    return _PEM_BLOCK.search(value) is not None


def _check_pem_source(value: str | None, name: str, *, secret: bool = False) -> None:
    """PEM text, or the path of a readable file holding PEM (as TypeScript's ``pem()`` checks)."""
    if value is None:
        return
    if not isinstance(value, str) or value == "":
        raise SecurityConfigError(name, "must be PEM text or a file path")
    if _is_pem(value):
        return
    if "\n" in value or "\r" in value or len(value) > 4096:
        raise SecurityConfigError(name, "neither PEM text (-----BEGIN …) nor a file path")
    try:
        with open(value, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as err:
        code = err.strerror or "unreadable"
        raise SecurityConfigError(name, f"not PEM text, and not a readable file ({code})" if secret else f"cannot read {value} ({code})") from None
    if not _is_pem(text):
        raise SecurityConfigError(name, "the file holds no PEM block" if secret else f"{value} holds no PEM block")


@dataclass(frozen=True)
class KafkaSecurity:
    """How the client's Kafka connections authenticate and encrypt (TypeScript's ``kafka: {ssl, sasl}``).

    ``ssl``: TLS to the brokers (turned on by any ``ssl_*`` file too).
    ``ssl_ca``: CA certificate(s) to trust instead of the system's, a PEM file
    path or PEM text; ``ssl_cert`` / ``ssl_key`` (and ``ssl_key_password``): a
    client certificate; ``ssl_verify=False`` turns certificate checks off
    (development only). ``sasl_username`` / ``sasl_password`` with
    ``sasl_mechanism`` (``SCRAM-SHA-512`` by default, ``SCRAM-SHA-256``,
    ``PLAIN``: only over TLS).
    """

    ssl: bool = False
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = field(default=None, repr=False)
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_verify: bool = True
    sasl_mechanism: str = "SCRAM-SHA-512"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        mech = SASL_MECHANISMS.get(str(self.sasl_mechanism).lower())
        if mech is None:
            raise SecurityConfigError("kafka.sasl.mechanism", f"must be one of {', '.join(SASL_MECHANISMS.values())}")
        object.__setattr__(self, "sasl_mechanism", mech)
        if (self.sasl_username is None) != (self.sasl_password is None):
            raise SecurityConfigError("kafka.sasl", "username and password go together")
        for name, value in (("kafka.sasl.username", self.sasl_username), ("kafka.sasl.password", self.sasl_password)):
            if value is not None and (not isinstance(value, str) or value == ""):
                raise SecurityConfigError(name, "must not be empty")
        if (self.ssl_cert is None) != (self.ssl_key is None):
            raise SecurityConfigError("kafka.ssl.cert" if self.ssl_cert is None else "kafka.ssl.key", "cert and key go together")
        _check_pem_source(self.ssl_ca, "kafka.ssl.ca")
        _check_pem_source(self.ssl_cert, "kafka.ssl.cert")
        _check_pem_source(self.ssl_key, "kafka.ssl.key", secret=True)
        if self.ssl_ca is not None or self.ssl_cert is not None or not self.ssl_verify:
            object.__setattr__(self, "ssl", True)

    @property
    def sasl(self) -> bool:
        return self.sasl_username is not None

    @property
    def security_protocol(self) -> str:
        """librdkafka's ``security.protocol``."""
        if self.sasl:
            return "SASL_SSL" if self.ssl else "SASL_PLAINTEXT"
        return "SSL" if self.ssl else "PLAINTEXT"

    def librdkafka_config(self) -> dict[str, Any]:
        """The librdkafka settings (admin client, producer, consumer). Holds the password: never log it."""
        conf: dict[str, Any] = {"security.protocol": self.security_protocol}
        if self.sasl:
            conf["sasl.mechanism"] = self.sasl_mechanism
            conf["sasl.username"] = self.sasl_username
            conf["sasl.password"] = self.sasl_password
        if self.ssl:
            for value, location, pem in (
                (self.ssl_ca, "ssl.ca.location", "ssl.ca.pem"),
                (self.ssl_cert, "ssl.certificate.location", "ssl.certificate.pem"),
                (self.ssl_key, "ssl.key.location", "ssl.key.pem"),
            ):
                if value is not None:
                    conf[pem if _is_pem(value) else location] = value
            if self.ssl_key_password is not None:
                conf["ssl.key.password"] = self.ssl_key_password
            if not self.ssl_verify:
                conf["enable.ssl.certificate.verification"] = False
                conf["ssl.endpoint.identification.algorithm"] = "none"
        return conf


@dataclass(frozen=True)
class RegistryAuth:
    """HTTP basic auth to the schema registry (never in the URL)."""

    username: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.username, str) or self.username == "":
            raise SecurityConfigError("schemaRegistryAuth.username", "must not be empty")
        if not isinstance(self.password, str) or self.password == "":
            raise SecurityConfigError("schemaRegistryAuth.password", "must not be empty")

    def header(self) -> str:
        """The ``Authorization`` header value. A secret: never log it."""
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode("ascii")


@dataclass(frozen=True)
class RegistryTls:
    """TLS to an https schema registry: a CA to trust (PEM file or text), a client certificate, or no checks (development only)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = field(default=None, repr=False)
    key_password: str | None = field(default=None, repr=False)
    verify: bool = True

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise SecurityConfigError("schemaRegistryTls.cert" if self.cert is None else "schemaRegistryTls.key", "cert and key go together")
        _check_pem_source(self.ca, "schemaRegistryTls.ca")
        _check_pem_source(self.cert, "schemaRegistryTls.cert")
        _check_pem_source(self.key, "schemaRegistryTls.key", secret=True)

    def ssl_context(self) -> ssl.SSLContext:
        """An ``ssl.SSLContext`` for urllib with these settings."""
        if self.ca is not None and _is_pem(self.ca):
            ctx = ssl.create_default_context(cadata=self.ca)
        else:
            ctx = ssl.create_default_context(cafile=self.ca)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert is not None and self.key is not None:
            if _is_pem(self.cert) or _is_pem(self.key):
                # The ssl module loads a chain from files only.
                raise SecurityConfigError("schemaRegistryTls.cert", "give the client certificate and key as file paths")
            ctx.load_cert_chain(self.cert, self.key, password=self.key_password)
        return ctx


def check_registry_url(url: str | None, auth: RegistryAuth | None, tls: RegistryTls | None) -> None:
    """As TypeScript's registry fields: no credentials in the URL; auth and TLS only with a URL, TLS only with https."""
    if not url:
        if auth is not None:
            raise SecurityConfigError("schemaRegistryAuth", "given without a schema registry URL")
        if tls is not None:
            raise SecurityConfigError("schemaRegistryTls", "given without a schema registry URL")
        return
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        raise SecurityConfigError("schemaRegistryUrl", "not a URL") from None
    if parts.username is not None or parts.password is not None:
        raise SecurityConfigError(
            "schemaRegistryUrl",
            "must not carry credentials (user:password@): give them as schema_registry_auth (SCHEMA_REGISTRY_USERNAME, SCHEMA_REGISTRY_PASSWORD)",
        )
    if parts.scheme not in ("http", "https"):
        raise SecurityConfigError("schemaRegistryUrl", "must be an http or https URL")
    if tls is not None and parts.scheme != "https":
        raise SecurityConfigError("schemaRegistryTls", "needs an https schema registry URL")


def transport_warnings(kafka: KafkaSecurity | None, registry_url: str | None, auth: RegistryAuth | None, tls: RegistryTls | None) -> list[str]:
    """Settings that work but should not be used in production (no secrets in them), as TypeScript's ``transportWarnings``."""
    out: list[str] = []
    if kafka is not None and kafka.sasl and not kafka.ssl:
        what = "credentials" if kafka.sasl_mechanism == "PLAIN" else "credentials exchanges"
        out.append(f"Kafka SASL ({kafka.sasl_mechanism}) without TLS: {what} and records cross the network in clear (set KAFKA_SSL=true)")
    if kafka is not None and not kafka.ssl_verify:
        out.append("Kafka TLS certificate verification is off: development only")
    if auth is not None and (registry_url or "").startswith("http:"):
        out.append("schema registry basic auth over plain http: the password crosses the network in clear")
    if tls is not None and not tls.verify:
        out.append("schema registry TLS certificate verification is off: development only")
    return out


# ---------------------------------------------------------------------------------------------
# Environment variables


def _set(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return None if value is None or value == "" else value


def _bool_var(env: Mapping[str, str], name: str) -> bool | None:
    raw = _set(env, name)
    if raw is None:
        return None
    if re.fullmatch(r"true|1|yes", raw, flags=re.I):
        return True
    if re.fullmatch(r"false|0|no", raw, flags=re.I):
        return False
    raise SecurityConfigError(name, "must be true or false")


def _secret_var(env: Mapping[str, str], name: str) -> str | None:
    """A password from ``name`` or ``name_FILE`` (the file's content, one trailing newline dropped); never both."""
    direct = _set(env, name)
    path = _set(env, f"{name}_FILE")
    if direct is not None and path is not None:
        raise SecurityConfigError(f"{name}_FILE", f"set {name} or {name}_FILE, not both")
    if direct is not None:
        return direct
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise SecurityConfigError(f"{name}_FILE", f"cannot read {path} ({err.strerror or 'unreadable'})") from None
    value = re.sub(r"\r?\n$", "", text)
    if value == "":
        raise SecurityConfigError(f"{name}_FILE", f"{path} is empty")
    return value


@dataclass(frozen=True)
class ConnectionSecurity:
    """The security settings of a client: Kafka (SASL, TLS) and the schema registry (basic auth, TLS)."""

    kafka: KafkaSecurity | None = None
    schema_registry_auth: RegistryAuth | None = None
    schema_registry_tls: RegistryTls | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConnectionSecurity:
        """From the environment variables TypeScript's owners, CLI and MCP server read (see the module doc).

        Raises :class:`SecurityConfigError` naming the variable (never its value, for a secret).
        """
        env = os.environ if env is None else env
        ssl_on = _bool_var(env, "KAFKA_SSL")
        verify = _bool_var(env, "KAFKA_SSL_REJECT_UNAUTHORIZED")
        ca, cert, key = _set(env, "KAFKA_SSL_CA_FILE"), _set(env, "KAFKA_SSL_CERT_FILE"), _set(env, "KAFKA_SSL_KEY_FILE")
        tls_details = any(v is not None for v in (ca, cert, key)) or verify is not None
        if tls_details and ssl_on is False:
            raise SecurityConfigError("KAFKA_SSL", "is false, but KAFKA_SSL_* settings are given")
        mechanism = _set(env, "KAFKA_SASL_MECHANISM")
        username = _set(env, "KAFKA_SASL_USERNAME")
        password = _secret_var(env, "KAFKA_SASL_PASSWORD")
        if mechanism is not None or username is not None or password is not None:
            if username is None:
                raise SecurityConfigError("KAFKA_SASL_USERNAME", "required with KAFKA_SASL_MECHANISM or KAFKA_SASL_PASSWORD")
            if password is None:
                raise SecurityConfigError("KAFKA_SASL_PASSWORD", "required with KAFKA_SASL_USERNAME (or KAFKA_SASL_PASSWORD_FILE)")
        kafka: KafkaSecurity | None = None
        if tls_details or ssl_on is not None or username is not None:
            try:
                kafka = KafkaSecurity(
                    ssl=bool(ssl_on) or tls_details,
                    ssl_ca=ca,
                    ssl_cert=cert,
                    ssl_key=key,
                    ssl_verify=verify is not False,
                    sasl_mechanism=mechanism or "SCRAM-SHA-512",
                    sasl_username=username,
                    sasl_password=password,
                )
            except SecurityConfigError as err:
                raise SecurityConfigError(_ENV_OF.get(err.field, err.field), err.detail) from None

        reg_user = _set(env, "SCHEMA_REGISTRY_USERNAME")
        reg_password = _secret_var(env, "SCHEMA_REGISTRY_PASSWORD")
        auth: RegistryAuth | None = None
        if reg_user is not None or reg_password is not None:
            if reg_user is None:
                raise SecurityConfigError("SCHEMA_REGISTRY_USERNAME", "required with SCHEMA_REGISTRY_PASSWORD")
            if reg_password is None:
                raise SecurityConfigError("SCHEMA_REGISTRY_PASSWORD", "required with SCHEMA_REGISTRY_USERNAME (or SCHEMA_REGISTRY_PASSWORD_FILE)")
            auth = RegistryAuth(reg_user, reg_password)
        reg_ca = _set(env, "SCHEMA_REGISTRY_CA_FILE")
        tls: RegistryTls | None = None
        if reg_ca is not None:
            try:
                tls = RegistryTls(ca=reg_ca)
            except SecurityConfigError as err:
                raise SecurityConfigError("SCHEMA_REGISTRY_CA_FILE", err.detail) from None
        return cls(kafka=kafka, schema_registry_auth=auth, schema_registry_tls=tls)


_ENV_OF = {
    "kafka.ssl.ca": "KAFKA_SSL_CA_FILE",
    "kafka.ssl.cert": "KAFKA_SSL_CERT_FILE",
    "kafka.ssl.key": "KAFKA_SSL_KEY_FILE",
    "kafka.sasl.mechanism": "KAFKA_SASL_MECHANISM",
    "kafka.sasl.username": "KAFKA_SASL_USERNAME",
    "kafka.sasl.password": "KAFKA_SASL_PASSWORD",
    "kafka.sasl": "KAFKA_SASL_USERNAME",
}
