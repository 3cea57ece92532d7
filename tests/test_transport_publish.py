"""transport.kafka and transport.local without a broker: settings, client arguments, local
publishing."""

from __future__ import annotations

import ssl
import threading
from pathlib import Path

import pytest

import transport.local as local_transport
from devtools import builders
from proto.envelope import seal
from proto.errors import ProtoError
from proto.reasons import Reason
from proto.records import PlacementClosed
from transport.kafka import KafkaSettings, client_kwargs, placement_of
from transport.local import publish_local
from transport.spool import SpoolLocked, SpoolWriter, read_spool

T0 = 1_700_000_000_000


def _envelopes() -> list[bytes]:
    cast = builders.make_cast("publish")
    terms = builders.make_terms(cast, "pp1", [builders.gpu("n1", 0)], T0, T0 + 3_600_000)
    return [
        builders.signed_terms(cast, terms),
        builders.adjustment(cast, "pp1", "adj-1", "credit", 100, T0),
        seal(PlacementClosed(placement_id="pp1", closed_at_ms=T0 + 4_000_000), [cast.ledger]),
    ]


def test_placement_of() -> None:
    assert [placement_of(e) for e in _envelopes()] == ["pp1"] * 3
    with pytest.raises(ProtoError):
        placement_of(b'{"payload":"","signatures":[]}')
    with pytest.raises(ProtoError) as info:
        placement_of(b'{"payload":"eA==","signatures":[]}')  # payload b"x": no prefix line
    assert info.value.reason is Reason.BAD_PREFIX
    with pytest.raises(ProtoError):
        placement_of(b"\xff not json")


def test_settings_and_client_kwargs(tmp_path: Path) -> None:
    plain = KafkaSettings(bootstrap="127.0.0.1:9092")
    assert client_kwargs(plain) == {
        "bootstrap_servers": "127.0.0.1:9092",
        "security_protocol": "PLAINTEXT",
    }
    sasl = KafkaSettings(
        bootstrap="k:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="node-a",
        sasl_password="s3cret",
    )
    kwargs = client_kwargs(sasl)
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert (kwargs["sasl_mechanism"], kwargs["sasl_plain_username"]) == ("SCRAM-SHA-512", "node-a")
    assert kwargs["sasl_plain_password"] == "s3cret"
    assert "s3cret" not in repr(sasl)
    for bad in (
        {"bootstrap": ""},
        {"bootstrap": "k:1", "security_protocol": "TLS"},
        {"bootstrap": "k:1", "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "GSSAPI"},
        {"bootstrap": "k:1", "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"},
    ):
        with pytest.raises(ValueError):
            KafkaSettings(**bad)  # type: ignore[arg-type]


def test_publish_local_appends_and_checks(tmp_path: Path) -> None:
    envelopes = _envelopes()
    first = publish_local(tmp_path, "publish-desk", envelopes[:2])
    second = publish_local(tmp_path, "publish-desk", envelopes[2:])
    assert first[1] < second[0]
    assert [e.data for e in read_spool(tmp_path / "publish-desk")] == envelopes
    with pytest.raises(ProtoError):
        publish_local(tmp_path, "publish-desk", [envelopes[0], b"{}"])
    assert [e.data for e in read_spool(tmp_path / "publish-desk")] == envelopes  # nothing added
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            publish_local(tmp_path, bad, envelopes)


def test_publish_local_waits_for_the_lock_then_gives_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envelopes = _envelopes()
    holder = SpoolWriter(tmp_path / "publish-desk")
    release = threading.Timer(0.3, holder.close)
    release.start()
    try:
        positions = publish_local(tmp_path, "publish-desk", envelopes)  # waits, then writes
    finally:
        release.join()
    assert len(positions) == 3
    monkeypatch.setattr(local_transport, "SPOOL_LOCK_WAIT_S", 0.2)
    with SpoolWriter(tmp_path / "publish-desk"), pytest.raises(SpoolLocked):
        publish_local(tmp_path, "publish-desk", envelopes)
    assert len(list(read_spool(tmp_path / "publish-desk"))) == 3
