"""SPEC §6.9: hardware evidence for node keys, through the real pipeline and on bad input.

A test attestation service (an Ed25519 key, and a P-384 key for the ES384 form NVIDIA's
service uses) issues tokens; the ledger folds them with its configured roots, the
verifier re-derives every decision with the roots its trust file pins.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from test_verifier_exports import HOUR, MINUTE, T0, explain, verify

from billview.render import to_html
from devtools.builders import (
    Cast,
    StreamWriter,
    closed,
    gpu,
    key_binding,
    make_cast,
    make_terms,
    sample,
    signed_terms,
)
from ledger.bill import bill_doc
from ledger.config import ConfigError, config_from_mapping
from ledger.export import export_placement
from ledger.fold import Fold
from ledger.ingest import Ingestor
from ledger.inputs import Item
from ledger.service import LedgerService, fixed_clock
from ledger.snapshot import decode as decode_snapshot
from ledger.snapshot import encode as encode_snapshot
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.sim import SimDevice, Simulator, parse_sim_spec
from meter.stream import node_gpus
from proto.attestation import (
    AttestationRoot,
    claims_for,
    evidence_nonce,
    issue_evidence,
    load_root_key,
    p384_public_bytes,
    parse_evidence,
)
from proto.keys import SigningKey, key_id, write_key_pair
from proto.records import PlacementTerms
from proto.trust import TRUST_FORMAT, TrustedKey, TrustFile, load_trust
from transport.local import node_source, publish_local, publisher_source
from verifier.verify import verify_export

FOREVER = (0, 2**53 - 1)
SERVICE = SigningKey.from_seed_text("test-attestation", "tests/attestation-service")
STRANGER = SigningKey.from_seed_text("stranger", "tests/unknown-attestation-service")
ROOTS = (AttestationRoot("test-attestation", "EdDSA", SERVICE.public_key),)


def _trust(cast: Cast, *roots: AttestationRoot) -> TrustFile:
    base = cast.trust()
    pinned = [TrustedKey(id=r.id, role="attestation", key=r.key, alg=r.alg) for r in roots]
    return TrustFile(format=TRUST_FORMAT, keys=[*base.keys, *pinned])


def _placement(name: str, required: bool = True) -> tuple[Cast, PlacementTerms]:
    cast = make_cast(name)
    gpus = [gpu("node-a", i, model="H100-80GB") for i in range(2)]
    return cast, make_terms(cast, f"{name}-p", gpus, T0, T0 + HOUR, attestation_required=required)


def _token(
    terms: PlacementTerms,
    key: bytes,
    *,
    node: str = "node-a",
    signer: SigningKey = SERVICE,
    gpus: dict[str, str] | None = None,
    **changes: Any,
) -> str:
    models = gpus if gpus is not None else {g.uuid: g.model for g in terms.gpus}
    claims = claims_for(terms.placement_id, node, key, models, iat=T0 // 1000)
    claims.update(changes)
    return issue_evidence(claims, kid="test-1", ed25519=signer)


def _attest(cast: Cast, terms: PlacementTerms, evidence: str, **kw: Any) -> bytes:
    key = kw.pop("key", cast.node_key("node-a"))
    signers = kw.pop("signers", [cast.operator])
    return key_binding(
        cast, terms.placement_id, "node-a", key, *FOREVER, T0, signers=signers, evidence=evidence
    )


# ---- the real pipeline: publisher + meter -> local transport -> ledger -> export -> verify -------


def _run_pipeline(tmp: Path, cast: Cast, terms: PlacementTerms, inputs: list[bytes]) -> Path:
    local = tmp / "local"
    publish_local(local, publisher_source("desk"), inputs)
    devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, "node-a")]
    config = AgentConfig("node-a", cast.node_key("node-a"), (terms,), local / node_source("node-a"))
    clock = SimClock(T0)
    agent = Agent(config, Simulator(parse_sim_spec("seed=3,claim_healthy=1"), devices, T0), clock)
    clock.advance(HOUR)
    agent.tick()
    agent.close()
    store = Store(tmp / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store,
        cast.ledger,
        ledger_id="ledger-1",
        local_dir=local,
        clock=fixed_clock(T0 + 3 * HOUR),
        attestation_roots=ROOTS,
    )
    out = tmp / f"{terms.placement_id}.duckdb"
    try:
        run = service.run_until_idle()
        assert run.closed == [terms.placement_id]
        export_placement(store, terms.placement_id, out, key=cast.ledger)
        # The ledger's own statement page (SPEC §7.8), kept beside the export.
        page = to_html(bill_doc(store, cast.ledger, terms.placement_id), "buyer")
        (tmp / "ledger-page.html").write_text(page)
    finally:
        service.close()
    return out


def test_attested_placement_through_meter_ledger_export_verify(tmp_path: Path) -> None:
    cast, terms = _placement("att-run")
    evidence = _token(terms, cast.node_key("node-a").public_key)
    out = _run_pipeline(
        tmp_path, cast, terms, [signed_terms(cast, terms), _attest(cast, terms, evidence)]
    )
    report = verify(out, _trust(cast, *ROOTS))
    assert report.ok, explain(report)
    # By hand: 2 whole GPUs x 60 one-minute events, all counting, at 250 minor/GPU-hour:
    # D = 2 x 1000 x 3 600 000 = 7.2e9 milli-GPU-ms, B = D, G = floor(B x 250 / 3.6e9)
    # = 500; fee 5 % = 25 paid by the operator: buyer owes 500, operator receives 475.
    assert report.totals is not None
    assert report.totals["delivered_mgms"] == 7_200_000_000
    assert report.totals["gross_minor"] == 500
    assert report.totals["buyer_owes_minor"] == 500
    assert report.totals["operator_receives_minor"] == 475
    # The statement says which GPUs were attested, by whom, when.
    assert report.attestation_checked
    [attested] = report.attestations
    assert attested["gpus"] == sorted(g.uuid for g in terms.gpus)
    assert attested["attester"] == "test-attestation"
    assert attested["iat"] == T0 // 1000
    assert attested["key_id"] == key_id(cast.node_key("node-a").public_key)
    assert attested["record_index"] == 1
    # Both statement pages say which GPUs were attested, by whom, when.
    with_bill = verify_export(out, _trust(cast, *ROOTS), bill=True)
    assert with_bill.bill is not None
    doc = with_bill.bill.doc(with_bill)
    assert [(a.gpus, a.attester, a.iat_s) for a in doc.attested] == [
        (sorted(g.uuid for g in terms.gpus), "test-attestation", T0 // 1000)
    ]
    assert ("hardware evidence" in dict(doc.terms)) and terms.attestation_required
    for page in (to_html(doc, "buyer"), (tmp_path / "ledger-page.html").read_text()):
        assert "Hardware evidence" in page
        assert all(g.uuid in page for g in terms.gpus)
        assert "test-attestation" in page
    # The verify CLI says it too, one line per attested key.
    from proto.trust import dump_trust

    (tmp_path / "trust.json").write_bytes(dump_trust(_trust(cast, *ROOTS)))
    cli = subprocess.run(
        [sys.executable, "-m", "verifier", str(out), "--trust", str(tmp_path / "trust.json")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode in (0, 3), cli.stdout + cli.stderr
    [line] = [x for x in cli.stdout.splitlines() if "attested:" in x]
    assert "node node-a" in line and "by test-attestation" in line
    assert all(g.uuid in line for g in terms.gpus)
    # A verifier pinning no root judges all but the signature, and says so.
    unchecked = verify(out, cast.trust())
    assert unchecked.ok, explain(unchecked)
    assert not unchecked.attestation_checked
    assert unchecked.attestations[0]["attester"] == ""
    # A verifier pinning another service does not accept this evidence: the ledger's
    # acceptance is a finding, and so is every usage event it let through.
    other = AttestationRoot("someone-else", "EdDSA", STRANGER.public_key)
    strict = verify(out, _trust(cast, other))
    assert not strict.ok
    rules = {f.rule for f in strict.findings.kept}
    assert {"EVIDENCE_INVALID", "NOT_ATTESTED"} <= rules, explain(strict)
    assert strict.attestations == []


def test_usage_without_evidence_is_not_attested_and_nothing_is_billed(tmp_path: Path) -> None:
    cast, terms = _placement("att-none")
    out = _run_pipeline(tmp_path, cast, terms, [signed_terms(cast, terms)])
    report = verify(out, _trust(cast, *ROOTS))
    assert report.ok, explain(report)
    assert report.totals is not None and report.totals["delivered_mgms"] == 0
    assert report.attestations == []
    import duckdb

    con = duckdb.connect(str(out), read_only=True)
    reasons = con.execute("SELECT reason, count(*) FROM usage_events GROUP BY reason").fetchall()
    con.close()
    # The first event is NOT_ATTESTED and takes seq 0; the rest wait and are flushed at
    # the close as SEQ_GAP (SPEC §6.3 usage, §6.9).
    assert dict(reasons) == {"NOT_ATTESTED": 1, "SEQ_GAP": 59}


# ---- bad evidence: a named rejection, nothing settled changes ---------------------------


def _folded(cast: Cast, terms: PlacementTerms, roots: Any = ROOTS) -> tuple[Fold, StreamWriter]:
    """A fold with the terms, full evidence and 10 minutes of usage accepted."""
    fold = Fold(cast.ledger, attestation_roots=roots)
    writer = StreamWriter(cast.node_key("node-a"), terms.placement_id, "node-a")
    key = cast.node_key("node-a").public_key
    for raw in (
        signed_terms(cast, terms),
        _attest(cast, terms, _token(terms, key)),
        writer.event(T0, T0 + 10 * MINUTE, [sample(g) for g in terms.gpus]),
    ):
        [outcome] = fold.apply(raw, "t", None)
        assert outcome.status == "accepted", outcome.reason
    return fold, writer


def _bad_cases(cast: Cast, terms: PlacementTerms) -> dict[str, bytes]:
    key = cast.node_key("node-a").public_key
    other = SigningKey.from_seed_text("other", "tests/other-node-key").public_key
    good = _token(terms, key)
    head, body, sig = good.split(".")
    flipped = base64.urlsafe_b64decode(sig + "==")
    tampered_sig = base64.urlsafe_b64encode(bytes([flipped[0] ^ 1]) + flipped[1:]).rstrip(b"=")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["iat"] += 1
    tampered_body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=")
    wrong_hash = _token(terms, key, **{"x-gridledger-node-key-sha256": "0" * 64})
    return {
        # evidence issued for another key (its nonce and its hash name that key)
        "another key": _attest(cast, terms, _token(terms, other)),
        # the right nonce, but the key hash of another key
        "another key's hash": _attest(cast, terms, wrong_hash),
        "wrong nonce": _attest(
            cast, terms, _token(terms, key, eat_nonce=evidence_nonce("elsewhere", "node-a", key))
        ),
        "unknown root": _attest(cast, terms, _token(terms, key, signer=STRANGER)),
        "GPU not in terms": _attest(cast, terms, _token(terms, key, gpus={"GPU-zz": "H100-80GB"})),
        "model mismatch": _attest(
            cast, terms, _token(terms, key, gpus={terms.gpus[0].uuid: "A100-80GB"})
        ),
        "tampered signature": _attest(cast, terms, f"{head}.{body}.{tampered_sig.decode()}"),
        "tampered claims": _attest(cast, terms, f"{head}.{tampered_body.decode()}.{sig}"),
        "overall result false": _attest(
            cast, terms, _token(terms, key, **{"x-nvidia-overall-att-result": False})
        ),
        "not a token": _attest(cast, terms, "eyJ.eyJ.AAAA"),
    }


def test_bad_evidence_is_rejected_by_name_and_changes_nothing_settled(tmp_path: Path) -> None:
    cast, terms = _placement("att-bad")
    fold, writer = _folded(cast, terms)
    pid = terms.placement_id
    before = fold.totals(pid)
    assert before is not None and before.delivered_mgms == 2 * 1000 * 10 * MINUTE
    key = cast.node_key("node-a").public_key
    for name, raw in _bad_cases(cast, terms).items():
        [outcome] = fold.apply(raw, f"bad:{name}", None)
        assert (outcome.status, outcome.reason) == ("rejected", "EVIDENCE_INVALID"), name
        assert fold.totals(pid) == before, name
    # The buyer alone cannot attach evidence (SPEC §4.0: the operator signs).
    [outcome] = fold.apply(
        _attest(cast, terms, _token(terms, key), signers=[cast.buyer]), "buyer", None
    )
    assert (outcome.status, outcome.reason) == ("rejected", "SIG_MISSING")
    # The attestation in force is still the good one: usage keeps being folded.
    [outcome] = fold.apply(
        writer.event(T0 + 10 * MINUTE, T0 + 20 * MINUTE, [sample(g) for g in terms.gpus]), "u", None
    )
    assert outcome.status == "accepted"


def test_bad_evidence_decisions_are_rederived_by_the_verifier(tmp_path: Path) -> None:
    """The same stream through the real ledger's store and export: the verifier agrees
    with every EVIDENCE_INVALID and NOT_ATTESTED, and the bill is the attested usage."""
    cast, terms = _placement("att-verify")
    key = cast.node_key("node-a").public_key
    writer = StreamWriter(cast.node_key("node-a"), terms.placement_id, "node-a")
    a0 = terms.gpus[0]
    stream = [
        signed_terms(cast, terms),
        *_bad_cases(cast, terms).values(),
        _attest(cast, terms, _token(terms, key, gpus={a0.uuid: a0.model})),  # GPU 0 only
        writer.event(T0, T0 + 10 * MINUTE, [sample(a0)]),
        writer.event(T0 + 10 * MINUTE, T0 + 20 * MINUTE, [sample(g) for g in terms.gpus]),
        closed(cast, terms.placement_id, T0 + 2 * HOUR),
    ]
    out = _ledger_export(tmp_path, cast.ledger, terms.placement_id, stream)
    report = verify(out, _trust(cast, *ROOTS))
    assert report.ok, explain(report)
    import duckdb

    con = duckdb.connect(str(out), read_only=True)
    bindings = [
        r[0] for r in con.execute("SELECT reason FROM key_bindings ORDER BY chain_index").fetchall()
    ]
    usage = [
        r[0] for r in con.execute("SELECT reason FROM usage_events ORDER BY chain_index").fetchall()
    ]
    con.close()
    assert bindings == ["EVIDENCE_INVALID"] * 10 + [""]
    # 10 minutes of GPU 0, then an event naming GPU 1 too, which is not attested.
    assert usage == ["", "NOT_ATTESTED"]
    assert report.totals is not None and report.totals["delivered_mgms"] == 1000 * 10 * MINUTE
    assert [a["gpus"] for a in report.attestations] == [[a0.uuid]]


def _ledger_export(tmp: Path, ledger: SigningKey, placement_id: str, raws: list[bytes]) -> Path:
    """Fold ``raws`` through the real ledger (store, Ingestor with the test root, as a
    ledger.toml with [[attestation_roots]] gives it) and export the placement."""
    items = [
        Item(
            data=raw,
            position=f"local:test:0:{i}",
            stream_key=placement_id,
            source="local:test",
            next_position=f"local:test:0:{i + 1}",
        )
        for i, raw in enumerate(raws)
    ]
    out = tmp / f"{placement_id}.duckdb"
    with Store(tmp / "ledger.duckdb", ledger_public_key=ledger.public_key) as store:
        ingestor = Ingestor(store, ledger, attestation_roots=ROOTS)
        try:
            for start in range(0, len(items), 5):  # several batches, as a consumer would
                ingestor.ingest(items[start : start + 5])
        finally:
            ingestor.close()
        export_placement(store, placement_id, out, key=ledger)
    return out


# ---- ES384, the algorithm NVIDIA's service signs with ---------------------------------------


def test_es384_evidence_verifies_and_a_flipped_bit_does_not() -> None:
    cast, terms = _placement("att-es384")
    p384 = ec.generate_private_key(ec.SECP384R1())
    roots = (AttestationRoot("nras-test", "ES384", p384_public_bytes(p384)),)
    key = cast.node_key("node-a").public_key
    models = {g.uuid: g.model for g in terms.gpus}
    # iat: issued when the binding is (SPEC §6.9 (6): fresh against its issued time)
    claims = claims_for(terms.placement_id, "node-a", key, models, iat=T0 // 1000)
    token = issue_evidence(claims, kid="nras-1", p384=p384)
    assert parse_evidence(token).header.alg == "ES384"
    head, body, sig = token.split(".")
    raw = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    bad = base64.urlsafe_b64encode(raw[:-1] + bytes([raw[-1] ^ 1])).rstrip(b"=").decode()
    for evidence, roots_used, expected in (
        (f"{head}.{body}.{bad}", roots, ("rejected", "EVIDENCE_INVALID")),
        # an EdDSA root never verifies an ES384 token
        (token, ROOTS, ("rejected", "EVIDENCE_INVALID")),
        (token, roots, ("accepted", None)),
    ):
        fold = Fold(cast.ledger, attestation_roots=roots_used)
        fold.apply(signed_terms(cast, terms), "t", None)
        [outcome] = fold.apply(_attest(cast, terms, evidence), "b", None)
        got = (outcome.status, None if outcome.reason is None else outcome.reason.value)
        assert got == expected


def test_snapshot_keeps_attestations() -> None:
    cast, terms = _placement("att-snap")
    fold, _ = _folded(cast, terms)
    state = fold._cache.get(terms.placement_id)
    assert state.attested
    again = decode_snapshot(terms.placement_id, encode_snapshot(state))
    assert again.attested == state.attested


def test_evidence_field_is_optional_and_never_null() -> None:
    """A binding without evidence has the bytes it always had; one with ``evidence: ""``
    written out, or null, is refused at decoding."""
    from proto.canonical import signed_bytes
    from proto.envelope import open_envelope
    from proto.errors import ProtoError

    cast, terms = _placement("att-bytes")
    plain = key_binding(cast, terms.placement_id, "node-a", cast.node_key("node-a"), 0, 5, 0)
    payload = open_envelope(plain).payload
    assert b"evidence" not in payload
    for value in ('""', "null"):
        forged = payload.replace(
            b'"issued_at_ms":0', b'"evidence":' + value.encode() + b',"issued_at_ms":0'
        )
        assert forged != payload
        with pytest.raises(ProtoError):
            from proto.canonical import decode_payload

            decode_payload(forged)
    assert signed_bytes(open_envelope(plain).record) == payload


# ---- configuration, trust file, CLI ---------------------------------------------------------


def test_ledger_toml_attestation_roots(tmp_path: Path) -> None:
    base = {"ledger_id": "l", "key_file": "k", "db": "d", "local_dir": "s"}
    key = base64.b64encode(SERVICE.public_key).decode()
    config = config_from_mapping(
        {**base, "attestation_roots": [{"id": "svc", "alg": "EdDSA", "key": key}]}, tmp_path
    )
    assert config.attestation_roots == (AttestationRoot("svc", "EdDSA", SERVICE.public_key),)
    assert config_from_mapping(base, tmp_path).attestation_roots is None
    for bad in (
        [{"id": "svc", "alg": "ES384", "key": key}],  # a 32-byte key is no P-384 point
        [{"id": "svc", "alg": "RS256", "key": key}],
        [{"id": "svc", "alg": "EdDSA"}],
        [],
    ):
        with pytest.raises(ConfigError):
            config_from_mapping({**base, "attestation_roots": bad}, tmp_path)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gridledger", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_trust_init_pins_attestation_roots_from_pem_and_jwk(tmp_path: Path) -> None:
    cast = make_cast("att-trust")
    for k in (cast.operator, cast.buyer, cast.desk, cast.ledger):
        write_key_pair(k, tmp_path)
    p384 = ec.generate_private_key(ec.SECP384R1())
    pem = p384.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "nras.pem").write_bytes(pem)
    point = p384_public_bytes(p384)
    jwk = {
        "kty": "EC",
        "crv": "P-384",
        "x": base64.urlsafe_b64encode(point[1:49]).rstrip(b"=").decode(),
        "y": base64.urlsafe_b64encode(point[49:]).rstrip(b"=").decode(),
    }
    (tmp_path / "nras.jwk").write_text(json.dumps(jwk))
    assert load_root_key(tmp_path / "nras.jwk") == ("ES384", point)
    parties = [
        f"--{role}={getattr(cast, role).name}.pub"
        for role in ("operator", "buyer", "desk", "ledger")
    ]
    done = _cli("trust", "init", *parties, "--attestation", "nras=nras.pem", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    trust = load_trust(tmp_path / "trust.json")
    assert trust.attestation_roots() == (AttestationRoot("nras", "ES384", point),)
    (tmp_path / "junk.pem").write_text("-----BEGIN PUBLIC KEY-----\nnope\n")
    bad = _cli(
        "trust", "init", *parties, "--attestation", "x=junk.pem", "--out", "t2.json", cwd=tmp_path
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_bind_key_with_evidence(tmp_path: Path) -> None:
    cast, terms = _placement("att-cli")
    write_key_pair(cast.operator, tmp_path)
    write_key_pair(cast.node_key("node-a"), tmp_path)
    (tmp_path / "terms.json").write_bytes(signed_terms(cast, terms))
    key = cast.node_key("node-a").public_key
    (tmp_path / "good.jwt").write_text(_token(terms, key) + "\n")
    (tmp_path / "other.jwt").write_text(
        _token(terms, SigningKey.from_seed_text("o", "tests/o").public_key)
    )
    (tmp_path / "garbage.jwt").write_text("not a token")
    common = [
        "bind-key",
        "--terms",
        "terms.json",
        "--node",
        "node-a",
        "--node-key",
        "node-a.pub",
        "--issued-at",
        str(T0),
        "--key",
        f"{cast.operator.name}.key",
    ]
    done = _cli(*common, "--evidence", "good.jwt", "--out", "b.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    fold = Fold(cast.ledger, attestation_roots=ROOTS)
    fold.apply(signed_terms(cast, terms), "t", None)
    [outcome] = fold.apply((tmp_path / "b.json").read_bytes().strip(), "b", None)
    assert outcome.status == "accepted", outcome.reason
    for name in ("other.jwt", "garbage.jwt", "missing.jwt"):
        bad = _cli(*common, "--evidence", name, "--out", "x.json", cwd=tmp_path)
        assert bad.returncode != 0, name
        assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr, bad.stderr
        assert not (tmp_path / "x.json").exists()


def test_trust_file_rejects_an_attestation_key_without_alg(tmp_path: Path) -> None:
    from proto.trust import TrustError

    cast = make_cast("att-alg")
    data = msgspec.to_builtins(cast.trust())
    data["keys"].append(
        {"id": "svc", "role": "attestation", "key": base64.b64encode(SERVICE.public_key).decode()}
    )
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(TrustError, match="no alg"):
        load_trust(tmp_path / "t.json")


# ---- bounds (BOUNDS.md) -------------------------------------------------------------------


def test_evidence_of_max_chars_decodes_one_more_is_out_of_range() -> None:
    from proto.limits import MAX_EVIDENCE_CHARS

    cast, terms = _placement("att-max-chars")
    fold = Fold(cast.ledger, attestation_roots=ROOTS)
    fold.apply(signed_terms(cast, terms), "t", None)
    for extra, expected in (
        (0, ("chained", "EVIDENCE_INVALID")),
        (1, ("quarantined", "OUT_OF_RANGE")),
    ):
        junk = "a.b." + "c" * (MAX_EVIDENCE_CHARS - 4 + extra)
        assert len(junk) == MAX_EVIDENCE_CHARS + extra
        [outcome] = fold.apply(_attest(cast, terms, junk), f"j{extra}", None)
        assert (outcome.decision, outcome.reason and outcome.reason.value) == expected


def test_evidence_of_max_gpus_is_accepted_one_more_is_evidence_invalid() -> None:
    from proto.limits import MAX_EVIDENCE_CHARS, MAX_EVIDENCE_GPUS

    cast = make_cast("att-max-gpus")
    gpus = [gpu("node-a", i, model="H100-80GB") for i in range(MAX_EVIDENCE_GPUS)]
    terms = make_terms(cast, "att-max-gpus-p", gpus, T0, T0 + HOUR, attestation_required=True)
    key = cast.node_key("node-a").public_key
    full = _token(terms, key)
    assert len(full) <= MAX_EVIDENCE_CHARS
    models = {g.uuid: g.model for g in gpus}
    claims = claims_for(terms.placement_id, "node-a", key, models, iat=T0 // 1000)
    submods = dict(claims["submods"])  # type: ignore[call-overload]
    submods["GPU-extra"] = {"ueid": gpus[0].uuid, "hwmodel": gpus[0].model}
    claims["submods"] = submods
    over = issue_evidence(claims, kid="test-1", ed25519=SERVICE)
    for evidence, expected in ((full, "accepted"), (over, "rejected")):
        fold = Fold(cast.ledger, attestation_roots=ROOTS)
        fold.apply(signed_terms(cast, terms), "t", None)
        [outcome] = fold.apply(_attest(cast, terms, evidence), "b", None)
        assert outcome.status == expected, outcome.reason
        if expected == "rejected":
            assert outcome.reason is not None and outcome.reason.value == "EVIDENCE_INVALID"


def test_attestation_roots_up_to_the_bound(tmp_path: Path) -> None:
    from proto.limits import MAX_ATTESTATION_ROOTS
    from proto.trust import TrustError, dump_trust

    cast = make_cast("att-roots")
    key = base64.b64encode(SERVICE.public_key).decode()
    base = {"ledger_id": "l", "key_file": "k", "db": "d", "local_dir": "s"}
    for n, ok in ((MAX_ATTESTATION_ROOTS, True), (MAX_ATTESTATION_ROOTS + 1, False)):
        roots = [AttestationRoot(f"r{i}", "EdDSA", SERVICE.public_key) for i in range(n)]
        path = tmp_path / f"trust-{n}.json"
        path.write_bytes(dump_trust(_trust(cast, *roots)))
        entries = [{"id": f"r{i}", "alg": "EdDSA", "key": key} for i in range(n)]
        if ok:
            assert len(load_trust(path).attestation_roots()) == n
            assert config_from_mapping({**base, "attestation_roots": entries}, tmp_path)
        else:
            with pytest.raises(TrustError, match="attestation keys"):
                load_trust(path)
            with pytest.raises(ConfigError, match="attestation_roots"):
                config_from_mapping({**base, "attestation_roots": entries}, tmp_path)
