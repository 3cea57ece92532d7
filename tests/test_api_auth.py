"""Between companies over a network (SPEC §13): every request signed with the caller's own
Ed25519 key (RFC 9421), each party sees only its own, a GET never writes (SPEC §8.4), and
the remote CLI fetches as a buyer and as an auditor. All over real HTTP on 127.0.0.1."""

from __future__ import annotations

import base64
import dataclasses
import http.client
import ipaddress
import json
import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog
from support import ledger_toml
from test_ledger_scenario import (
    GRACE_MS,
    INTERVAL_MS,
    LATE_CLOCK_MS,
    T0_MS,
    WINDOW_MS,
    build_scenario,
    ledger_key_file,
    local_service,
    publish_scenario_local,
)

from devtools.builders import Cast, StreamWriter, gpu, make_terms, sample, signed_terms
from gridledger.cli import main as gridledger_main
from ledger.access import Access
from ledger.attest_loop import attest_once, unattested
from ledger.config import ConfigError, load_config, port_file_for
from ledger.http import LedgerApi, LedgerHttpServer, TlsConfigError
from ledger.service import LedgerService
from proto.cosign import cosignature_of
from proto.httpsig import (
    DEFAULT_LIFETIME_S,
    Request,
    SignatureRefused,
    sign_url,
    signature_base,
    verify_request,
)
from proto.keys import SigningKey, write_key_pair
from proto.note import LEDGER_NOTE_NAME, parse_note
from proto.trust import dump_trust
from transport.local import node_source, publisher_source

PID_B = "net-b"


def test_the_rfc_9421_ed25519_example_signs_to_the_published_bytes() -> None:
    """RFC 9421 Appendix B.2.6: the signature base of the test request and the key
    ``test-key-ed25519`` (its PKCS#8 seed) give the RFC's signature byte for byte."""
    pkcs8 = base64.b64decode("MC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF")
    key = SigningKey("test-key-ed25519", pkcs8[-32:])
    assert base64.b64encode(key.public_key).decode() == (
        "JrQLj5P/89iXES9+vFgrIy29clF9CC/oPPsw3c5D0bs="
    )
    components = ("date", "@method", "@path", "@authority", "content-type", "content-length")
    lines = [
        ("date", "Tue, 20 Apr 2021 02:07:55 GMT"),
        ("@method", "POST"),
        ("@path", "/foo"),
        ("@authority", "example.com"),
        ("content-type", "application/json"),
        ("content-length", "18"),
    ]
    params: list[tuple[str, int | str]] = [("created", 1618884473), ("keyid", "test-key-ed25519")]
    signature = key.sign(signature_base(lines, components, params))
    assert base64.b64encode(signature).decode() == (
        "wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw=="
    )


def test_a_signature_covers_method_authority_path_query_and_body() -> None:
    key = SigningKey.from_seed_text("k", "httpsig")
    now = 1_800_000_000
    url = "http://127.0.0.1:8787/placements/p/records?from=0&to=2"
    headers = {k.lower(): v for k, v in sign_url(key, "GET", url, b"", now).items()}
    request = Request("GET", "127.0.0.1:8787", "/placements/p/records", "from=0&to=2")
    assert verify_request(request, headers, now).public_key == key.public_key
    for changed in (
        dataclasses.replace(request, method="POST"),
        dataclasses.replace(request, authority="127.0.0.1:8788"),
        dataclasses.replace(request, path="/placements/q/records"),
        dataclasses.replace(request, query="from=0&to=3"),
    ):
        with pytest.raises(SignatureRefused):
            verify_request(changed, headers, now)
    with pytest.raises(SignatureRefused, match="expired"):
        verify_request(request, headers, now + DEFAULT_LIFETIME_S + 1)
    with pytest.raises(SignatureRefused, match="future"):
        verify_request(request, headers, now - 61)
    body_url = "http://127.0.0.1:8787/placements/p/checkpoint/cosign"
    posted = {k.lower(): v for k, v in sign_url(key, "POST", body_url, b"note", now).items()}
    post = Request("POST", "127.0.0.1:8787", "/placements/p/checkpoint/cosign", "", b"note")
    verify_request(post, posted, now)
    with pytest.raises(SignatureRefused, match="Content-Digest"):
        verify_request(dataclasses.replace(post, body=b"other"), posted, now)
    long_lived = sign_url(key, "GET", url, b"", now, lifetime_s=301)
    with pytest.raises(SignatureRefused, match="at most 300"):
        verify_request(request, {k.lower(): v for k, v in long_lived.items()}, now)


@dataclass
class World:
    url: str
    cast: Cast
    other_buyer: SigningKey
    auditor: SigningKey
    service: LedgerService
    pid: str
    server: LedgerHttpServer


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """Two placements of one ledger with different buyers, operator and desk shared; an
    auditor key in the ledger's list; the API behind ``Access``."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    scenario = build_scenario("net", placements=1, nodes=1, events=3)
    cast = scenario.cast
    other = SigningKey.from_seed_text("buyer-2", "net/other-buyer")
    cast_b = dataclasses.replace(cast, buyer=other, nodes={})
    g = gpu(f"{PID_B}-n0", 0)
    terms = make_terms(cast_b, PID_B, [g], T0_MS, T0_MS + WINDOW_MS, late_grace_ms=GRACE_MS)
    inputs = [*scenario.inputs, (PID_B, publisher_source("desk"), signed_terms(cast_b, terms))]
    writer = StreamWriter(cast_b.node_key(g.node_id), PID_B, g.node_id)
    for e in range(3):
        start = T0_MS + e * INTERVAL_MS
        inputs.append(
            (PID_B, node_source(g.node_id), writer.event(start, start + INTERVAL_MS, [sample(g)]))
        )
    publish_scenario_local(tmp_path / "spool", inputs)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    auditor = SigningKey.from_seed_text("auditor-1", "net/auditor")
    access = Access(
        service.store,
        cast.ledger.public_key,
        frozenset({auditor.public_key}),
        clock_s=lambda: int(time.time()),
    )
    server = LedgerHttpServer(
        LedgerApi(service.store, service.key, service.metrics, access=access),
        "127.0.0.1",
        0,
        ops=("127.0.0.1", 0),
    )
    server.start()
    try:
        yield World(server.url, cast, other, auditor, service, scenario.placement_ids[0], server)
    finally:
        server.stop()
        service.close()
        structlog.reset_defaults()


def _call(
    url: str,
    key: SigningKey | None,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    method = "POST" if body is not None else "GET"
    request = urllib.request.Request(url, data=body, method=method)
    sent = headers or (sign_url(key, method, url, body or b"", int(time.time())) if key else {})
    for name, value in sent.items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read(), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_anonymous_forged_replayed_and_expired_requests_are_refused(world: World) -> None:
    url = f"{world.url}/placements/{world.pid}/statement"
    status, body, headers = _call(url, None)
    assert status == 401 and "not signed" in json.loads(body)["error"]
    assert '"@method"' in headers["Accept-Signature"]
    assert _call(f"{world.url}/placements", None)[0] == 401
    # Signed by another key but claiming the buyer's keyid: the signature does not verify.
    forged = sign_url(SigningKey.from_seed_text("x", "impostor"), "GET", url, b"", int(time.time()))
    buyer_id = base64.b64encode(world.cast.buyer.public_key).decode()
    forged["Signature-Input"] = forged["Signature-Input"].rsplit(";keyid=", 1)[0] + (
        f';keyid="{buyer_id}"'
    )
    status, body, _ = _call(url, None, headers=forged)
    assert status == 401 and "does not verify" in json.loads(body)["error"]
    # The buyer's own request, once; the same bytes again are a replay.
    signed = sign_url(world.cast.buyer, "GET", url, b"", int(time.time()))
    assert _call(url, None, headers=signed)[0] == 200
    status, body, _ = _call(url, None, headers=signed)
    assert status == 401 and "replayed" in json.loads(body)["error"]
    stale = sign_url(world.cast.buyer, "GET", url, b"", int(time.time()) - 400)
    status, body, _ = _call(url, None, headers=stale)
    assert status == 401 and "expired" in json.loads(body)["error"]
    # Signed for one placement, sent for another: the path is covered.
    other = f"{world.url}/placements/{PID_B}/statement"
    moved = sign_url(world.cast.operator, "GET", url, b"", int(time.time()))
    status, body, _ = _call(other, None, headers=moved)
    assert status == 401 and "does not verify" in json.loads(body)["error"]


def test_each_party_sees_only_its_own(world: World) -> None:
    base = world.url
    listing = json.loads(_call(f"{base}/placements", world.cast.buyer)[1])["placements"]
    assert [p["placement_id"] for p in listing] == [world.pid]
    assert listing[0]["roles"] == ["buyer"]
    listing = json.loads(_call(f"{base}/placements", world.other_buyer)[1])["placements"]
    assert [p["placement_id"] for p in listing] == [PID_B]
    operator = json.loads(_call(f"{base}/placements", world.cast.operator)[1])["placements"]
    assert sorted(p["placement_id"] for p in operator) == sorted([world.pid, PID_B])
    auditor = json.loads(_call(f"{base}/placements", world.auditor)[1])["placements"]
    assert sorted(p["placement_id"] for p in auditor) == sorted([world.pid, PID_B])
    stranger = SigningKey.from_seed_text("stranger", "net/stranger")
    assert json.loads(_call(f"{base}/placements", stranger)[1]) == {"placements": []}

    # Another placement's buyer: the same 404 as a placement that does not exist.
    unknown = _call(f"{base}/placements/no-such/statement", world.cast.buyer)
    for path in ("statement", "statement.html", "export", "checkpoint", "records"):
        status, body, _ = _call(f"{base}/placements/{PID_B}/{path}", world.cast.buyer)
        assert status == 404, (path, body)
        assert json.loads(body)["error"] == json.loads(unknown[1])["error"].replace(
            "no-such", PID_B
        )
    assert _call(f"{base}/placements/{PID_B}/statement", world.other_buyer)[0] == 200

    # Pages: the buyer's own; the operator's page is the operator's.
    page = f"{base}/placements/{world.pid}/statement.html"
    status, body, _ = _call(page, world.cast.buyer)
    assert status == 200 and b"operator's page" not in body
    assert _call(f"{page}?party=operator", world.cast.buyer)[0] == 404
    assert _call(f"{page}?party=operator", world.cast.operator)[0] == 200
    assert _call(f"{page}?party=buyer", world.auditor)[0] == 200

    # Metrics: not to a party on the API; unsigned on the ops listener only.
    assert _call(f"{base}/metrics", world.cast.buyer)[0] == 404
    assert _call(f"{base}/metrics", world.auditor)[0] == 200
    ops = _ops_url(world)
    with urllib.request.urlopen(f"{ops}/metrics", timeout=30) as reply:
        assert b"gridledger_ledger_records_folded_total" in reply.read()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{ops}/placements", timeout=30)
    assert refused.value.code == 404


def _ops_url(world: World) -> str:
    with urllib.request.urlopen(f"{world.url}/health", timeout=30) as reply:
        assert json.loads(reply.read())["status"] == "ok"
    assert world.server.ops_url is not None
    return world.server.ops_url


def test_a_get_never_writes_and_a_party_asks_for_a_checkpoint(world: World) -> None:
    store = world.service.store
    base = f"{world.url}/placements/{world.pid}"
    before = (store.checkpoints(world.pid), store.statement_heads())
    assert before[0] == []
    for path in ("statement", "statement.html", "checkpoint", "records", "export"):
        status, body, _ = _call(f"{base}/{path}", world.cast.buyer)
        assert status in (200, 400, 503), (path, body)
    assert (store.checkpoints(world.pid), store.statement_heads()) == before
    status, body, _ = _call(f"{base}/checkpoint", world.cast.buyer)
    assert status == 503 and "POST" in json.loads(body)["error"]

    # The buyer asks: a statement and checkpoint at the head, once per interval.
    status, body, _ = _call(f"{base}/checkpoint", world.cast.buyer, body=b"")
    assert status == 200, body
    note = parse_note(body.decode())
    assert note.signed_by(LEDGER_NOTE_NAME, world.cast.ledger.public_key)
    size = store.heads()[world.pid][0] + 1
    assert [n for n, _ in store.checkpoints(world.pid)] == [size]
    assert _call(f"{base}/checkpoint", world.cast.buyer)[1] == body
    lines = _call(f"{base}/records?from=0&to={size}", world.cast.buyer)[1].splitlines()
    assert len(lines) == size
    assert _call(f"{base}/records?from=0&to={size + 1}", world.cast.buyer)[0] == 400

    # The ledger's own loop issues the rest (here, the other placement).
    assert unattested(store) == [PID_B]
    assert attest_once(store, world.service.key) == 1
    assert unattested(store) == []


def test_the_remote_cli_fetches_and_verifies_as_buyer_and_auditor(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trust = tmp_path / "trust.json"
    trust.write_bytes(dump_trust(world.cast.trust()))
    buyer_key, _ = write_key_pair(world.cast.buyer, tmp_path / "buyer")
    auditor_key, _ = write_key_pair(world.auditor, tmp_path / "auditor")
    for who, key in (("buyer", buyer_key), ("auditor", auditor_key)):
        out = tmp_path / f"{who}.duckdb"
        argv = ["fetch", "export", world.pid, "--ledger", world.url, "--key", str(key)]
        assert gridledger_main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
        code = gridledger_main(["verify", str(out), "--trust", str(trust)])
        assert code in (0, 3), capsys.readouterr().out  # FINAL, or PROVISIONAL: not witnessed
        assert "FINAL" in capsys.readouterr().out or code == 3
    page = tmp_path / "page.html"
    argv = ["fetch", "page", world.pid, "--ledger", world.url, "--key", str(buyer_key)]
    assert gridledger_main([*argv, "--out", str(page)]) == 0
    assert "<html" in page.read_text().lower()
    capsys.readouterr()
    argv = ["fetch", "statement", PID_B, "--ledger", world.url, "--key", str(buyer_key)]
    assert gridledger_main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("FAIL: ") and "404" in err and err.count("\n") == 1
    argv = ["fetch", "statement", world.pid, "--ledger", "http://127.0.0.1:9", "--key"]
    assert gridledger_main([*argv, str(buyer_key)]) == 75


def test_the_witness_signs_its_requests(world: World, tmp_path: Path) -> None:
    terms_path = tmp_path / "terms.signed.json"
    terms = world.service.store.terms(world.pid)
    assert terms is not None
    terms_path.write_bytes(signed_terms(world.cast, terms))
    operator_key, _ = write_key_pair(world.cast.operator, tmp_path / "operator")
    argv = ["witness", "run", "--ledger", world.url, "--terms", str(terms_path)]
    argv += ["--key", str(operator_key), "--state", str(tmp_path / "op-witness")]
    assert gridledger_main(argv) == 0
    note = parse_note(world.service.store.checkpoints(world.pid)[-1][1])
    operator = world.cast.operator
    assert cosignature_of(note, operator.name, operator.public_key) is not None


def test_ledger_run_serves_signed_requests_issues_on_its_period_and_opens_ops(
    tmp_path: Path,
) -> None:
    """``ledger run`` (local transport, a subprocess): anonymous 401, the buyer's signed
    requests answered, the final statement issued by the ledger's own loop (no request
    asked for it), /metrics unsigned on the ops listener only; bad config keys named."""
    scenario = build_scenario("net-run", placements=1, nodes=1, events=3)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    pid = scenario.placement_ids[0]
    config = ledger_toml(
        tmp_path / "ledger.toml",
        ledger_key_file(tmp_path / "keys", scenario.cast),
        http="127.0.0.1:0",
        ops_http="127.0.0.1:0",
        attest_interval_s=0.2,
        clock_ms=LATE_CLOCK_MS,
        local_dir=tmp_path / "spool",
        db=tmp_path / "ledger.duckdb",
    )
    log = (tmp_path / "ledger.log").open("wb")
    argv = [sys.executable, "-m", "gridledger", "--log-level", "debug", "ledger", "run"]
    ledger = subprocess.Popen(
        [*argv, "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        port_file = port_file_for(tmp_path / "ledger.duckdb")
        deadline = time.monotonic() + 60
        final: dict[str, object] = {}
        while time.monotonic() < deadline and not final.get("envelope"):
            assert ledger.poll() is None, (tmp_path / "ledger.log").read_text()[-2000:]
            time.sleep(0.2)
            if not port_file.exists():
                continue
            ports = json.loads(port_file.read_text())
            url = f"http://{ports['host']}:{ports['port']}"
            status, body, _ = _call(f"{url}/placements/{pid}/statement", scenario.cast.buyer)
            if status == 200 and json.loads(body)["final"]:
                final = json.loads(body)
        assert final.get("envelope"), "the ledger's loop issued no final statement in 60 s"
        assert _call(f"{url}/placements/{pid}/statement", None)[0] == 401
        with urllib.request.urlopen(f"{ports['ops_url']}/metrics", timeout=30) as reply:
            assert b"gridledger_ledger" in reply.read()
        assert _call(f"{url}/metrics", scenario.cast.buyer)[0] == 404
    finally:
        ledger.terminate()
        assert ledger.wait(timeout=60) == 0
        log.close()
    access_log = [
        line
        for line in (tmp_path / "ledger.log").read_text().splitlines()
        if "http_request" in line
    ]
    assert any("401" in line and "/statement" in line for line in access_log), access_log[-5:]
    bad = ledger_toml(tmp_path / "bad.toml", tmp_path / "k", api_auditors=["not a key"])
    with pytest.raises(ConfigError, match=r"api_auditors\[0\]"):
        load_config(bad)


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, PEM."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gridledger test ledger")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / "api.pem", directory / "api.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def test_tls_on_the_api(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """TLS configured: the remote CLI fetches over https, checking the certificate against
    the CA it is given; without it the certificate is refused; a bad key pair is named."""
    cert, key = _self_signed(tmp_path / "certs")
    api = world.server.api
    server = LedgerHttpServer(api, "127.0.0.1", 0, tls=(cert, key))
    server.start()
    try:
        assert server.url.startswith("https://127.0.0.1:")
        buyer_key, _ = write_key_pair(world.cast.buyer, tmp_path / "buyer")
        argv = ["fetch", "statement", world.pid, "--ledger", server.url, "--key", str(buyer_key)]
        assert gridledger_main([*argv, "--cafile", str(cert)]) == 0
        assert json.loads(capsys.readouterr().out)["placement_id"] == world.pid
        assert gridledger_main(argv) == 75  # the system's CAs do not know this certificate
        assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
        plain = server.url.replace("https://", "http://")
        assert not _plain_answers(plain)
    finally:
        server.stop()
    with pytest.raises(TlsConfigError, match="cannot use TLS certificate"):
        LedgerHttpServer(api, "127.0.0.1", 0, tls=(key, cert))


def _plain_answers(url: str) -> bool:
    """Whether plain HTTP to a TLS port gets an HTTP answer (it must not)."""
    try:
        urllib.request.urlopen(f"{url}/health", timeout=10)
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return False
    return True


def test_the_nonce_memory_and_each_keys_rate_are_bounded(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_NONCES signed requests in flight at once, one more is refused as busy (never
    let through); past RATE_BURST requests a key waits RATE_PER_S (429)."""
    import ledger.access as access_module

    monkeypatch.setattr(access_module, "MAX_NONCES", 3)
    clock = [1000.0]
    access = Access(
        world.service.store,
        world.cast.ledger.public_key,
        clock_s=lambda: int(time.time()),
        monotonic=lambda: clock[0],
    )
    request = Request("GET", "127.0.0.1:1", "/placements", "")

    def ask(key: SigningKey) -> None:
        url = "http://127.0.0.1:1/placements"
        headers = sign_url(key, "GET", url, b"", int(time.time()))
        access.authenticate(request, {k.lower(): v for k, v in headers.items()})

    for _ in range(3):
        ask(world.cast.buyer)
    with pytest.raises(access_module.Busy):
        ask(world.cast.buyer)  # three nonces unexpired: the fourth is not let through
    monkeypatch.setattr(access_module, "MAX_NONCES", 100_000)
    monkeypatch.setattr(access_module, "RATE_BURST", 2.0)
    monkeypatch.setattr(access_module, "RATE_PER_S", 1.0)
    fresh = SigningKey.from_seed_text("rate", "net/rate")
    ask(fresh)
    ask(fresh)
    with pytest.raises(access_module.RateLimited):
        ask(fresh)
    clock[0] += 1.0  # one token back
    ask(fresh)
    ask(world.cast.operator)  # another key has its own bucket
