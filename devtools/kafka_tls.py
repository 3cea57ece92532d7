"""A throwaway PKI and a TLS + SASL/SCRAM listener for the test Kafka broker.

Kafka on a network that others share must not take records from anyone who can reach
its port. The meter and the ledger connect with ``security_protocol = "SASL_SSL"``: TLS
proves the broker is ours (the client pins our CA) and SCRAM proves the client is a
known user. This module builds what a test needs to show that end to end on one host:

* ``make_test_pki(directory)`` — a fresh CA and a broker certificate for 127.0.0.1 and
  localhost, as PEM files (``ca.pem``, ``broker-chain.pem``, ``broker-key.pem``), made
  with ``cryptography``. Private keys are written 0600. Nothing here is for production:
  the CA key sits next to the certificates and lives as long as the test.
* ``sasl_ssl_listener_config(listener, pki, mechanism)`` — the broker properties of one
  SASL_SSL listener using that PKI (PEM keystore and truststore, SCRAM enabled).
* ``SecureKafkaBroker`` — ``devtools.kafka_broker.KafkaBroker`` with one more listener,
  SASL_SSL on its own port, and SCRAM users written into the KRaft storage when it is
  formatted (``kafka-storage format --add-scram``), so they exist before the first start.

The launcher's PLAINTEXT listener stays, on 127.0.0.1 only: the launcher probes readiness
and creates topics through it, and the broker talks to itself over it. A production
broker would have the SASL_SSL listener alone (or SSL with client certificates inside).

Usage::

    pki = make_test_pki(tmp / "pki")
    users = {"meter": ScramUser("meter", secrets.token_hex(16))}
    with SecureKafkaBroker(pki, users.values()) as broker:
        settings = broker.client_settings(users["meter"], topic="t")
        producer = AIOKafkaProducer(**client_kwargs(settings))
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devtools.kafka_broker import HOST, BrokerStartError, KafkaBroker, _free_port
from transport.kafka import DEFAULT_TOPIC, KafkaSettings

__all__ = [
    "DEFAULT_SCRAM_MECHANISM",
    "SECURE_LISTENER",
    "ScramUser",
    "SecureKafkaBroker",
    "TestPki",
    "make_test_pki",
    "sasl_ssl_listener_config",
    "scram_format_args",
]

# ---- named limits and defaults ------------------------------------------------------------

SECURE_LISTENER: Final = "SECURE"
"""Name of the SASL_SSL listener in the broker's ``listeners`` setting."""

DEFAULT_SCRAM_MECHANISM: Final = "SCRAM-SHA-512"
"""SCRAM mechanism of the secure listener (Kafka also offers SCRAM-SHA-256)."""

SCRAM_MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
"""Mechanisms whose credentials ``kafka-storage format --add-scram`` can write."""

SCRAM_ITERATIONS: Final = 8192
"""PBKDF2 iterations of each SCRAM credential (Kafka's own default is 4096)."""

CERT_VALID_DAYS: Final = 7
"""Lifetime of the test CA and broker certificates: long enough for any test run."""

CERT_BACKDATE_S: Final = 300
"""Certificates start this long before now, so a slightly slow clock still accepts them."""

MAX_SCRAM_USERS: Final = 64
"""Users one test broker is formatted with (each costs a PBKDF2 at format time)."""

# ``--add-scram 'SCRAM-SHA-512=[name=N,password=P]'`` is parsed by splitting on ``,``,
# ``=`` and the brackets, with no escaping: names and passwords must avoid those.
_SCRAM_TEXT_RE: Final = re.compile(r"^[A-Za-z0-9._~@+-]{1,128}$")


# ---- the PKI ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TestPki:
    """Paths of a throwaway PKI: the CA that clients pin and the broker's key pair."""

    __test__ = False  # a pytest collector must not mistake it for a test class

    directory: Path
    ca_cert: Path
    ca_key: Path
    broker_chain: Path
    broker_key: Path

    def ca_pem(self) -> str:
        """The CA certificate, PEM."""
        return self.ca_cert.read_text(encoding="ascii")

    def broker_chain_pem(self) -> str:
        """The broker certificate followed by the CA certificate, PEM."""
        return self.broker_chain.read_text(encoding="ascii")

    def broker_cert_pem(self) -> str:
        """The broker certificate alone, PEM (the first block of the chain file)."""
        chain = self.broker_chain_pem()
        end = "-----END CERTIFICATE-----"
        return chain[: chain.index(end) + len(end)] + "\n"

    def broker_key_pem(self) -> str:
        """The broker's private key, unencrypted PKCS#8 PEM."""
        return self.broker_key.read_text(encoding="ascii")


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` 0600 from the start (never briefly readable by others)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)  # O_CREAT's mode does not apply to a file that existed


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_test_pki(
    directory: Path,
    *,
    hosts: Sequence[str] = (HOST, "localhost"),
    ca_name: str = "gridledger test CA",
    now: dt.datetime | None = None,
) -> TestPki:
    """A new CA and a broker certificate for ``hosts`` (IP addresses or DNS names), as PEM.

    Keys are ECDSA P-256 (quick to make; Kafka's PEM keystore reads EC keys). The broker
    certificate names every host as a subjectAltName, so clients verify the hostname.
    """
    directory.mkdir(parents=True, exist_ok=True)
    start = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(seconds=CERT_BACKDATE_S)
    end = start + dt.timedelta(days=CERT_VALID_DAYS)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    broker_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    broker_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_subject)
        .public_key(broker_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(broker_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    pki = TestPki(
        directory=directory,
        ca_cert=directory / "ca.pem",
        ca_key=directory / "ca-key.pem",
        broker_chain=directory / "broker-chain.pem",
        broker_key=directory / "broker-key.pem",
    )
    pki.ca_cert.write_bytes(_cert_pem(ca_cert))
    _write_private(pki.ca_key, _key_pem(ca_key))
    pki.broker_chain.write_bytes(_cert_pem(broker_cert) + _cert_pem(ca_cert))
    _write_private(pki.broker_key, _key_pem(broker_key))
    return pki


# ---- broker configuration -----------------------------------------------------------------


def _inline_pem(pem: str) -> str:
    """One PEM block as one properties line (spaces for newlines).

    A value in server.properties ends at the line end, and the launcher escapes
    backslashes, so neither ``\\n`` escapes nor line continuations can be used. Kafka's
    PEM reader skips whitespace in the base64, but its ``BEGIN .*`` pattern is greedy
    within a line: two blocks on one line read as the last one only. Hence one block.
    """
    if pem.count("-----BEGIN ") != 1:
        raise ValueError("one PEM block per inline broker setting")
    return " ".join(line.strip() for line in pem.strip().splitlines())


def sasl_ssl_listener_config(
    listener: str,
    pki: TestPki,
    mechanism: str = DEFAULT_SCRAM_MECHANISM,
) -> dict[str, str]:
    """Broker properties of the SASL_SSL listener ``listener`` (not its address).

    TLS: the broker key and chain inline as PEM (``ssl.keystore.type=PEM``), the CA as a
    PEM truststore. SASL: ``mechanism`` only, SCRAM credentials from the cluster metadata
    (``scram_format_args`` writes them at format time). Client certificates are not asked
    for: SCRAM authenticates the client.
    """
    if mechanism not in SCRAM_MECHANISMS:
        raise ValueError(f"mechanism {mechanism!r} is not one of {', '.join(SCRAM_MECHANISMS)}")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", listener):
        raise ValueError(f"listener name {listener!r} is not a plain identifier")
    prefix = f"listener.name.{listener.lower()}."
    return {
        f"{prefix}sasl.enabled.mechanisms": mechanism,
        f"{prefix}{mechanism.lower()}.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        f"{prefix}ssl.keystore.type": "PEM",
        # The leaf alone: clients pin the CA that issued it directly, so no chain is needed.
        f"{prefix}ssl.keystore.certificate.chain": _inline_pem(pki.broker_cert_pem()),
        f"{prefix}ssl.keystore.key": _inline_pem(pki.broker_key_pem()),
        f"{prefix}ssl.truststore.type": "PEM",
        f"{prefix}ssl.truststore.certificates": _inline_pem(pki.ca_pem()),
        f"{prefix}ssl.client.auth": "none",
        f"{prefix}ssl.enabled.protocols": "TLSv1.3,TLSv1.2",
    }


@dataclass(frozen=True, slots=True)
class ScramUser:
    """A SCRAM user of the test broker. The password never appears in ``repr``."""

    name: str
    password: str

    def __post_init__(self) -> None:
        for what, text in (("name", self.name), ("password", self.password)):
            if not _SCRAM_TEXT_RE.match(text):
                raise ValueError(
                    f"SCRAM {what} must be 1-128 of [A-Za-z0-9._~@+-] "
                    "(kafka-storage --add-scram cannot escape other characters)"
                )

    def __repr__(self) -> str:
        return f"ScramUser(name={self.name!r}, password='***')"


def scram_format_args(
    users: Iterable[ScramUser],
    mechanism: str = DEFAULT_SCRAM_MECHANISM,
    *,
    iterations: int = SCRAM_ITERATIONS,
) -> list[str]:
    """``kafka-storage format`` arguments that create each user's SCRAM credential."""
    if mechanism not in SCRAM_MECHANISMS:
        raise ValueError(f"mechanism {mechanism!r} is not one of {', '.join(SCRAM_MECHANISMS)}")
    args: list[str] = []
    listed = list(users)
    if len(listed) > MAX_SCRAM_USERS:
        raise ValueError(f"{len(listed)} SCRAM users, limit {MAX_SCRAM_USERS}")
    for user in listed:
        args += [
            "--add-scram",
            f"{mechanism}=[name={user.name},password={user.password},iterations={iterations}]",
        ]
    return args


# ---- the broker ---------------------------------------------------------------------------


class SecureKafkaBroker(KafkaBroker):
    """The test broker with a SASL_SSL listener on ``secure_port`` and SCRAM users.

    Ports are chosen when the object is made (free ports of 127.0.0.1 unless given) and
    kept across ``restart``. ``bootstrap`` is still the PLAINTEXT listener the launcher
    uses; ``secure_bootstrap`` is the one clients of the secured broker use.
    """

    def __init__(
        self,
        pki: TestPki,
        users: Iterable[ScramUser],
        *,
        mechanism: str = DEFAULT_SCRAM_MECHANISM,
        secure_port: int | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        extra_config: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        ports: set[int] = set()

        def pick(given: int | None) -> int:
            chosen = given
            # Bounded: three distinct free ports are found within a few tries.
            for _ in range(16):
                if chosen is not None and chosen not in ports:
                    break
                chosen = _free_port()
            if chosen is None or chosen in ports:
                raise BrokerStartError("could not pick three distinct free ports")
            ports.add(chosen)
            return chosen

        plain = pick(port)
        controller = pick(controller_port)
        secure = pick(secure_port)
        self._pki = pki
        self._mechanism = mechanism
        self._users = tuple(users)
        self._secure_port = secure
        self._scram_args = scram_format_args(self._users, mechanism)
        config = {
            "listeners": (
                f"PLAINTEXT://{HOST}:{plain},CONTROLLER://{HOST}:{controller},"
                f"{SECURE_LISTENER}://{HOST}:{secure}"
            ),
            "advertised.listeners": (
                f"PLAINTEXT://{HOST}:{plain},CONTROLLER://{HOST}:{controller},"
                f"{SECURE_LISTENER}://{HOST}:{secure}"
            ),
            "listener.security.protocol.map": (
                f"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,{SECURE_LISTENER}:SASL_SSL"
            ),
            "sasl.enabled.mechanisms": mechanism,
            **sasl_ssl_listener_config(SECURE_LISTENER, pki, mechanism),
            **dict(extra_config or {}),
        }
        super().__init__(port=plain, controller_port=controller, extra_config=config, **kwargs)

    @property
    def secure_port(self) -> int:
        """The SASL_SSL listener's port."""
        return self._secure_port

    @property
    def secure_bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the SASL_SSL listener."""
        return f"{HOST}:{self._secure_port}"

    @property
    def mechanism(self) -> str:
        """The SCRAM mechanism the secure listener accepts."""
        return self._mechanism

    @property
    def pki(self) -> TestPki:
        """The PKI whose CA the broker's certificate chains to."""
        return self._pki

    def client_settings(self, user: ScramUser, *, topic: str = DEFAULT_TOPIC) -> KafkaSettings:
        """Settings a meter or ledger would use to reach this broker as ``user``."""
        return KafkaSettings(
            bootstrap=self.secure_bootstrap,
            topic=topic,
            security_protocol="SASL_SSL",
            sasl_mechanism=self._mechanism,
            sasl_username=user.name,
            sasl_password=user.password,
            ssl_cafile=str(self._pki.ca_cert),
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"SecureKafkaBroker({self.workdir}, secure={self.secure_bootstrap}, {state})"

    def _format_args(self) -> list[str]:
        """``--add-scram`` arguments: SCRAM credentials must exist in the metadata log
        before a SASL client can log in, and on a fresh KRaft node the format step is
        where they are written."""
        return list(self._scram_args)

    def _redact(self, text: str) -> str:
        """The format output can echo the --add-scram arguments: never show passwords."""
        for user in self._users:
            text = text.replace(user.password, "***")
        return text
