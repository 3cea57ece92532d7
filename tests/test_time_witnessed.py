"""Time nobody can bend (SPEC §6.6 "Bounded from both sides", §8.2, §8.3, §9): each attack
class built with only its attacker's keys, each refused by a witness or failed by the
verifier with the evidence named — and the honest run of each cosigned with no refusal.

* the ledger key alone delays an input a party delivered (W_TIME, and W_MISSING while it
  is held back);
* the ledger key plus one party's backdates that party's input, which the other party's
  witness never saw delivered (W_TIME against its own cosignature; BACKDATED in the
  verifier from the cosigned checkpoints of the export);
* an input delivered after the close is left out (W_MISSING: witnessing does not stop at
  the close);
* a resale's new buyer witnesses its own obligation, and the trust policy can require it.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from test_verifier_exports import ExportBuilder, explain, verify

from devtools.builders import (
    Cast,
    StreamWriter,
    adjustment,
    assignment,
    closed,
    gpu,
    make_cast,
    make_terms,
    reclaim,
    release,
    sample,
    signed_terms,
)
from gridledger.cli import main as gridledger_main
from ledger.checkpoints import make_checkpoint
from ledger.export import export_placement
from ledger.http import LedgerApi, LedgerHttpServer
from ledger.issuer import cosign_checkpoint, issue_checkpoint
from ledger.metrics import LedgerMetrics
from ledger.pricing import ZERO_TOTALS
from ledger.service import LedgerService
from ledger.store import Store
from proto.canonical import signed_bytes
from proto.cosign import cosign, cosignature_of
from proto.envelope import open_envelope, seal, sha256_hex
from proto.errors import ProtoError
from proto.keys import SigningKey, write_key_pair
from proto.limits import ARRIVAL_REQUIRED_FROM_MS, MAX_ARRIVAL_LAG_MS, MAX_CLOCK_SKEW_MS
from proto.note import parse_note
from proto.records import ZERO_HASH, LedgerRecord, PlacementTerms
from proto.trust import TrustedKey, TrustFile, dump_trust
from transport.local import publish_local, publisher_source
from verifier.verify import verify_export
from witness.check import Cosigned, Refused, witness
from witness.known import Known, keep
from witness.runner import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, witness_once
from witness.state import STATE_FORMAT, WitnessState

WS = ARRIVAL_REQUIRED_FROM_MS  # terms recent enough that every record is timed
MIN = 60_000
PID = "pl-time"
GRACE = 300_000


def at(minute: float) -> int:
    """The moment ``minute`` minutes into the window, in ms."""
    return WS + int(minute * MIN)


# ---- a ledger that holds only the ledger key: it chains what it likes, when it likes ----


@dataclass
class Log:
    """The records of one placement as a (possibly dishonest) ledger chains them."""

    cast: Cast
    terms: PlacementTerms
    items: list[tuple[bytes, int, str, str]] = field(default_factory=list)

    def add(self, raw: bytes, arrived_ms: int, status: str = "accepted", reason: str = "") -> int:
        self.items.append((raw, arrived_ms, status, reason))
        return len(self.items) - 1

    def records(self) -> list[bytes]:
        out, prev = [], ZERO_HASH
        for index, (raw, arrived, status, reason) in enumerate(self.items):
            opened = open_envelope(raw)
            record = LedgerRecord(
                placement_id=PID,
                index=index,
                prev=prev,
                kind=opened.kind,  # type: ignore[arg-type]
                source=opened.input_hash,
                status=status,  # type: ignore[arg-type]
                reason=reason,
                delivered_mgms=0,
                totals=ZERO_TOTALS,
                arrived_ms=arrived,
            )
            prev = sha256_hex(signed_bytes(record))
            out.append(seal(record, []))
        return out


@dataclass
class Witness:
    """One party's witness, run round after round against the log as it grows."""

    log: Log
    name: str
    key: SigningKey
    known: list[Known]
    state: WitnessState = field(
        default_factory=lambda: WitnessState(format=STATE_FORMAT, placement_id=PID)
    )

    def round(self, now_ms: int) -> Cosigned | Refused:
        records = self.log.records()
        payloads = [open_envelope(r).payload for r in records]
        note = make_checkpoint(PID, payloads, self.log.cast.ledger)
        outcome = witness(
            self.state,
            self.log.terms,
            note,
            records[self.state.size :],
            self.known,
            name=self.name,
            key=self.key,
            now_s=now_ms // 1000,
        )
        if isinstance(outcome, Cosigned):
            self.state = outcome.state
        return outcome


def known(raw: bytes, delivered_ms: int) -> Known:
    """A signed input a party sent or received, with when (SPEC §8.3)."""
    opened = open_envelope(raw)
    record = opened.record
    node_id, seq = (getattr(record, "node_id", ""), getattr(record, "seq", -1))
    return Known(opened.input_hash, opened.kind, node_id, seq, delivered_ms, "test")


def refusal(outcome: object, code: str) -> Refused:
    assert isinstance(outcome, Refused), f"expected {code}, got a cosignature"
    assert outcome.refusal.code == code, outcome.refusal.detail
    return outcome


@dataclass
class Scene:
    """Terms, node n1 reporting every ten minutes to ``last_event`` (delivered at each
    interval's end), and the keys of the operator, buyer, desk, ledger and a new buyer."""

    last_event: int = 50
    cast: Cast = field(default_factory=lambda: make_cast("time-witnessed"))
    new_buyer: SigningKey = field(
        default_factory=lambda: SigningKey.from_seed_text("buyer-2", "time-witnessed/buyer-2")
    )

    def __post_init__(self) -> None:
        g = gpu("n1", 0)
        self.terms = make_terms(self.cast, PID, [g], at(0), at(60), late_grace_ms=GRACE)
        self.terms_raw = signed_terms(self.cast, self.terms)
        writer = StreamWriter(self.cast.node_key("n1"), PID, "n1")
        self.events = [
            (writer.event(at(m), at(m + 10), [sample(g)]), at(m + 10))
            for m in range(0, self.last_event, 10)
        ]
        self.log = Log(self.cast, self.terms)
        self.log.add(self.terms_raw, at(-1))
        self.close_at = at(60) + GRACE

    def chain_events(self, through_ms: int) -> None:
        """Chain each event delivered by ``through_ms`` (and not chained yet), on time."""
        chained = {raw for raw, *_ in self.log.items}
        for raw, delivered in self.events:
            if delivered <= through_ms and raw not in chained:
                self.log.add(raw, delivered)

    def operator(self, extra: Sequence[Known] = ()) -> Witness:
        usage = [known(raw, d) for raw, d in self.events]
        op = self.cast.operator
        return Witness(self.log, op.name, op, [*usage, *extra])

    def buyer(self, extra: Sequence[Known] = ()) -> Witness:
        b = self.cast.buyer
        return Witness(self.log, b.name, b, [known(self.terms_raw, at(-1)), *extra])

    def buyer2(self, extra: Sequence[Known] = ()) -> Witness:
        return Witness(self.log, self.new_buyer.name, self.new_buyer, list(extra))


# ---- 1. the ledger alone delays an input ------------------------------------------------

Build = Callable[[Scene], tuple[bytes, int]]


def _reclaim(s: Scene) -> tuple[bytes, int]:
    return reclaim(s.cast, s.terms, at(42), at(55), "rc-1"), at(42)


def _release(s: Scene) -> tuple[bytes, int]:
    return release(s.cast, s.terms, at(42), at(55), "rl-1"), at(42)


def _assignment(s: Scene) -> tuple[bytes, int]:
    raw = assignment(s.cast, s.terms, "as-1", s.new_buyer, at(45), ["GPU-n1-0"], 400, at(42))
    return raw, at(42)


# (what is delayed, whose witness knows it was delivered)
DELAYS: list[tuple[str, Build, str]] = [
    ("reclaim-operator", _reclaim, "operator"),  # the operator published it
    ("reclaim-buyer", _reclaim, "buyer"),  # the buyer received it
    ("release-buyer", _release, "buyer"),
    ("assignment-buyer", _assignment, "buyer"),
    ("assignment-new-buyer", _assignment, "buyer2"),
]


def _witness_of(s: Scene, role: str, extra: Sequence[Known]) -> Witness:
    builder: Callable[[Sequence[Known]], Witness] = getattr(s, role)
    return builder(extra)


@pytest.mark.parametrize(("build", "role"), [d[1:] for d in DELAYS], ids=[d[0] for d in DELAYS])
def test_the_ledger_alone_delaying_an_input_is_refused_by_the_party_that_delivered_it(
    build: Build, role: str
) -> None:
    s = Scene()
    raw, delivered = build(s)
    w = _witness_of(s, role, [known(raw, delivered)])
    s.chain_events(at(40))
    assert isinstance(w.round(at(41)), Cosigned)
    # Held back: owed to the log from delivered + lag + skew on, refused while missing.
    assert isinstance(w.round(delivered + MAX_ARRIVAL_LAG_MS + MAX_CLOCK_SKEW_MS), Cosigned)
    held = refusal(w.round(at(45)), "W_MISSING")
    assert sha256_hex(raw) in held.refusal.detail and str(delivered) in held.refusal.detail
    # Chained at 51:59 with that later arrival: refused as delayed, the record kept.
    s.chain_events(at(50))
    index = s.log.add(raw, at(51) + 59_000)
    delayed = refusal(w.round(at(52)), "W_TIME")
    assert delayed.refusal.index == index and "delayed" in delayed.refusal.detail
    assert base64.b64decode(delayed.refusal.record) == s.log.records()[index]
    assert w.state.size < index  # the refused tree was not taken in


@pytest.mark.parametrize(("build", "role"), [d[1:] for d in DELAYS], ids=[d[0] for d in DELAYS])
def test_the_honest_ledger_chaining_it_on_time_is_cosigned_to_the_close(
    build: Build, role: str
) -> None:
    s = Scene()
    raw, delivered = build(s)
    w = _witness_of(s, role, [known(raw, delivered)])
    s.chain_events(at(40))
    assert isinstance(w.round(at(41)), Cosigned)
    s.log.add(raw, delivered + 1_000)
    assert isinstance(w.round(at(43)), Cosigned)
    s.chain_events(at(60))
    s.log.add(closed(s.cast, PID, s.close_at), s.close_at)
    outcome = w.round(s.close_at + 1_000)
    assert isinstance(outcome, Cosigned), getattr(outcome, "refusal", None)


def test_a_delay_within_the_lag_is_cosigned_and_one_ms_more_is_refused() -> None:
    for late, ok in ((MAX_ARRIVAL_LAG_MS, True), (MAX_ARRIVAL_LAG_MS + 1, False)):
        s = Scene()
        raw, delivered = _reclaim(s)
        w = s.operator([known(raw, delivered)])
        s.chain_events(at(40))
        s.log.add(raw, delivered + late)
        outcome = w.round(at(44))
        assert isinstance(outcome, Cosigned) is ok, getattr(outcome, "refusal", None)


def test_a_usage_event_waiting_for_a_lower_seq_may_arrive_with_it() -> None:
    """SPEC §6.2: an event held for a lower seq the operator delivered later arrives with
    that seq; its own delivery does not bound it, the lower seq's does."""
    s = Scene()
    (e0, _), (e1, _) = s.events[:2]
    w = s.operator()
    w.known = [known(e1, at(20)), known(e0, at(35))]  # seq 0 re-sent at minute 35
    s.log.add(e0, at(35) + 500)
    s.log.add(e1, at(35) + 500)
    assert isinstance(w.round(at(36)), Cosigned)


def test_a_simulation_may_carry_the_arrival_before_it_only_when_the_witness_is_told() -> None:
    """SPEC §6.6: under arrival = "sender" a re-sent event lands after later-stated ones and
    carries max(a_prev, t); a production witness refuses that as a delay."""
    for simulation in (False, True):
        s = Scene()
        raw, delivered = _reclaim(s)
        w = s.operator([known(raw, delivered)])
        s.chain_events(at(50))  # stated up to minute 50, then the reclaim stated at 42
        s.log.add(raw, at(50))
        records = s.log.records()
        note = make_checkpoint(PID, [open_envelope(r).payload for r in records], s.cast.ledger)
        outcome = witness(
            w.state,
            s.terms,
            note,
            records,
            w.known,
            name=w.name,
            key=w.key,
            now_s=at(51) // 1000,
            simulation=simulation,
        )
        if simulation:
            assert isinstance(outcome, Cosigned), outcome
        else:
            assert "delayed" in refusal(outcome, "W_TIME").refusal.detail


# ---- 2. the ledger plus one party backdates that party's input --------------------------


def _backdated(s: Scene) -> tuple[bytes, int]:
    """The operator signs a reclaim at minute 51 saying minute 42 (on paper, 13 minutes of
    notice); the ledger chains it as arriving at 42, right after the last record (minute
    40, so arrival stays monotone): from the log, the buyer's credit for short notice
    shrinks."""
    raw = reclaim(s.cast, s.terms, at(42), at(55), "rc-bd")
    return raw, at(42)


def test_a_backdated_input_is_refused_by_the_other_partys_witness() -> None:
    s = Scene(last_event=40)
    buyer = s.buyer()  # never saw the reclaim delivered: only its own cosignatures
    s.chain_events(at(40))
    assert isinstance(buyer.round(at(41)), Cosigned)
    # Nothing new: re-cosigned at minute 50 (SPEC §8.2: witnesses cosign often).
    assert isinstance(buyer.round(at(50)), Cosigned)
    assert buyer.state.cosigned_at_s == at(50) // 1000
    raw, backdated = _backdated(s)
    index = s.log.add(raw, backdated)
    out = refusal(buyer.round(at(52)), "W_TIME")
    assert out.refusal.index == index and "backdated" in out.refusal.detail
    assert f"size {index}" in out.refusal.detail and str(at(50)) in out.refusal.detail
    # Dated within the skew of the cosignature it is cosigned (the honest ledger's case).
    honest = Scene(last_event=40)
    w = honest.buyer()
    honest.chain_events(at(40))
    assert isinstance(w.round(at(50)), Cosigned)
    honest.log.add(raw, at(50) - MAX_CLOCK_SKEW_MS)
    assert isinstance(w.round(at(52)), Cosigned)


def _export(
    s: Scene, tmp: Path, reclaim_at: int, cosigned: dict[int, int], trust: TrustFile | None = None
) -> tuple[Path, int]:
    """The export of terms, the events, the reclaim at ``reclaim_at`` and the close, with
    checkpoints at the sizes of ``cosigned`` (cosigned by operator and buyer at those
    times, ms) and at the head."""
    b = ExportBuilder(s.cast, s.terms)
    b.add(s.terms_raw, arrived_ms=at(-1))
    for raw, delivered in s.events:
        b.add(raw, arrived_ms=delivered)
    raw, _ = _backdated(s)
    b.add(raw, arrived_ms=reclaim_at)
    last = b.add(closed(s.cast, PID, s.close_at), arrived_ms=s.close_at)
    b.statements_at = [last]
    b.checkpoints_at = [*cosigned, last + 1]
    b.cosigned_at_s = {size: ms // 1000 for size, ms in cosigned.items()}
    return b.write(tmp / "x.duckdb"), len(s.events) + 1


def test_the_verifier_fails_a_record_dated_before_a_checkpoint_that_did_not_hold_it(
    tmp_path: Path,
) -> None:
    s = Scene(last_event=40)
    size = len(s.events) + 1  # terms and the events: the tree the witnesses saw at 50
    path, index = _export(s, tmp_path, at(42), {size: at(50)})
    report = verify(path, s.cast.trust())
    found = [f for f in report.findings.kept if f.rule == "BACKDATED"]
    assert found, explain(report)
    assert f"size {size}" in found[0].line() and str(at(50) // 1000) in found[0].line()
    assert not report.ok
    # The honest export: the reclaim dated when it reached the log, after minute 50.
    honest, _ = _export(Scene(last_event=40), tmp_path, at(51), {size: at(50)})
    report = verify(honest, s.cast.trust())
    assert not report.findings.kept, explain(report)
    assert report.is_final, report.provisional
    assert index == size


def test_the_verifier_fails_a_record_dated_after_a_witness_saw_it(tmp_path: Path) -> None:
    s = Scene(last_event=40)
    # The buyer and operator cosigned a tree holding the reclaim at minute 44; the ledger
    # dated the reclaim 51 (a shorter notice, a larger credit than it gave).
    path, _ = _export(s, tmp_path, at(51), {len(s.events) + 2: at(44)})
    report = verify(path, s.cast.trust())
    assert "POSTDATED" in report.findings.rules(), explain(report)


def test_a_stated_witnessing_interval_makes_unwitnessed_time_provisional(
    tmp_path: Path,
) -> None:
    s = Scene(last_event=40)
    size = len(s.events) + 1
    path, _ = _export(s, tmp_path, at(51), {size: at(50)})
    strict = msgspec.structs.replace(s.cast.trust(), witness_interval_s=600)
    report = verify(path, strict)
    assert not report.findings.kept, explain(report)
    assert not report.is_final
    assert any("time not witnessed" in r for r in report.provisional), report.provisional
    loose = msgspec.structs.replace(s.cast.trust(), witness_interval_s=4 * 3600)
    assert verify(path, loose).is_final


# ---- 3. witnessing does not stop at the close -------------------------------------------


@pytest.mark.parametrize("direction", ["charge", "credit"])
def test_an_input_delivered_after_the_close_and_left_out_is_refused(direction: str) -> None:
    s = Scene()
    s.chain_events(at(60))
    s.log.add(closed(s.cast, PID, s.close_at), s.close_at)
    delivered = s.close_at + 5 * MIN
    # a post-close charge (buyer and desk), or a credit (operator and desk)
    raw = adjustment(s.cast, PID, f"adj-{direction}", direction, 500, delivered)
    k = known(raw, delivered)
    w = s.buyer([k]) if direction == "charge" else s.operator([k])
    assert isinstance(w.round(s.close_at + MIN), Cosigned)
    out = refusal(w.round(delivered + 3 * MIN), "W_MISSING")
    assert f"adjustment input {sha256_hex(raw)}" in out.refusal.detail
    # The honest ledger chains it after the close (a later period): cosigned.
    s.log.add(raw, delivered + 1_000)
    assert isinstance(w.round(delivered + 3 * MIN), Cosigned)
    assert w.state.size == len(s.log.items) and w.state.close_index == len(s.log.items) - 2


# ---- 4. the new buyer of a resale witnesses its own obligation --------------------------


@dataclass
class Resold:
    cast: Cast
    buyer2: SigningKey
    terms: PlacementTerms
    store: Store
    service: LedgerService
    tmp: Path
    known: dict[str, Path]


def _resold(tmp: Path) -> Resold:
    """An honest ledger (embedded transport, simulated clock): terms, a resale at minute
    30, the close; each party's known inputs saved with when it sent them."""
    cast = make_cast("time-resold")
    buyer2 = SigningKey.from_seed_text("buyer-2", "time-resold/buyer-2")
    terms = make_terms(cast, PID, [gpu("n1", 0)], at(0), at(60), late_grace_ms=GRACE)
    spool = tmp / "spool"
    now = [at(-1)]
    store = Store(tmp / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        store, cast.ledger, ledger_id="l-1", local_dir=spool, clock=lambda: now[0]
    )
    terms_raw = signed_terms(cast, terms)
    sold = assignment(cast, terms, "as-1", buyer2, at(30), ["GPU-n1-0"], 400)
    publish_local(spool, publisher_source("desk"), [terms_raw])
    service.run_until_idle()
    now[0] = at(30)
    publish_local(spool, publisher_source("desk"), [sold])
    service.run_until_idle()
    now[0] = at(60) + GRACE + 1
    service.run_until_idle()
    dirs: dict[str, Path] = {}
    for role, files in (
        ("buyer", [("terms", terms_raw, at(-1)), ("as-1", sold, at(30))]),
        ("buyer2", [("as-1", sold, at(30))]),
    ):
        d = tmp / f"{role}-known"
        d.mkdir()
        for name, raw, ms in files:
            keep(d, raw, ms, name=name)  # the time in the party's own receipt log
        dirs[role] = d
    return Resold(cast, buyer2, terms, store, service, tmp, dirs)


def _trust(r: Resold, cosigners: list[str]) -> TrustFile:
    base = r.cast.trust()
    keys = [*base.keys, TrustedKey(id="buyer-2", role="buyer", key=r.buyer2.public_key)]
    return msgspec.structs.replace(base, keys=keys, cosigners=cosigners)


def test_the_new_buyer_witnesses_and_the_policy_can_require_it(tmp_path: Path) -> None:
    r = _resold(tmp_path)
    keys = tmp_path / "keys"
    keys.mkdir()
    for k in (r.cast.operator, r.cast.buyer, r.buyer2):
        write_key_pair(k, keys)
    terms_file = tmp_path / "terms.signed.json"
    terms_file.write_bytes(signed_terms(r.cast, r.terms))
    server = LedgerHttpServer(LedgerApi(r.store, r.cast.ledger, LedgerMetrics()), "127.0.0.1", 0)
    server.start()
    now_s = (at(60) + GRACE) // 1000 + 30

    def run(name: str, known_dir: Path | None) -> str:
        result = witness_once(
            ledger_url=server.url,
            terms_path=terms_file,
            key_path=keys / f"{name}.key",
            state_dir=tmp_path / f"state-{name}",
            known_dir=known_dir,
            now_s=now_s,
        )
        assert result.code == EXIT_OK, result.line
        return result.line

    try:
        # Without the assignment it holds, the new buyer's key is no party key.
        lone = witness_once(
            ledger_url=server.url,
            terms_path=terms_file,
            key_path=keys / "buyer-2.key",
            state_dir=tmp_path / "state-lone",
            now_s=now_s,
        )
        assert lone.code == EXIT_USAGE and "new buyer" in lone.line
        run(r.cast.operator.name, None)
        run(r.cast.buyer.name, r.known["buyer"])
        required = _trust(r, ["operator", "buyer", "new-buyers"])
        unwitnessed = tmp_path / "before.duckdb"
        export_placement(r.store, PID, unwitnessed, key=r.cast.ledger)
        report = verify_export(unwitnessed, required)
        assert not report.findings.kept, explain(report)
        assert not report.is_final
        assert "not witnessed by the new-buyers (buyer-2)" in report.provisional
        assert verify_export(unwitnessed, _trust(r, ["operator", "buyer"])).is_final
        assert "as buyer-2" in run("buyer-2", r.known["buyer2"])
        witnessed = tmp_path / "after.duckdb"
        export_placement(r.store, PID, witnessed, key=r.cast.ledger)
        report = verify_export(witnessed, required)
        assert not report.findings.kept, explain(report)
        assert report.is_final, report.provisional
        assert "buyer-2" in report.witnessed_by
        # The note the new buyer's witness keeps: the export must extend it (SPEC §9).
        kept = tmp_path / "state-buyer-2" / f"{PID}.checkpoint"
        assert cosignature_of(parse_note(kept.read_text()), "buyer-2", r.buyer2.public_key)
        trust_file = tmp_path / "trust.json"
        trust_file.write_bytes(dump_trust(required))
        args = ["verify", str(witnessed), "--trust", str(trust_file), "--checkpoint", str(kept)]
        assert gridledger_main(args) == 0
    finally:
        server.stop()
        r.service.close()


def test_the_ledger_keeps_no_cosignature_dated_outside_what_it_covers(tmp_path: Path) -> None:
    r = _resold(tmp_path)
    try:
        note = parse_note(issue_checkpoint(r.store, r.cast.ledger, PID))
        close_s = (at(60) + GRACE) // 1000
        buyer = r.cast.buyer
        for stamp in (close_s - 61, close_s + 301):  # before its last record; past the clock
            planted = cosign(note, buyer.name, buyer, stamp).text()
            with pytest.raises(ProtoError, match="cosignature of"):
                cosign_checkpoint(r.store, r.cast.ledger, PID, planted, now_ms=close_s * 1000)
        ok = cosign(note, buyer.name, buyer, close_s).text()
        merged, added = cosign_checkpoint(
            r.store, r.cast.ledger, PID, ok, now_ms=int(time.time() * 1000)
        )
        assert added == [buyer.name] and merged.startswith(note.body)
    finally:
        r.service.close()


def test_witness_interval_bounds_are_inclusive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MAX_WITNESS_INTERVAL_S: the trust file's witness_interval_s and ``witness run
    --interval`` take 1..86 400 s; one more is refused in one line."""
    from proto.limits import MAX_WITNESS_INTERVAL_S
    from proto.trust import TrustError, load_trust

    cast = make_cast("time-interval")
    for value, ok in (
        (1, True),
        (MAX_WITNESS_INTERVAL_S, True),
        (MAX_WITNESS_INTERVAL_S + 1, False),
    ):
        path = tmp_path / f"trust-{value}.json"
        trust = msgspec.structs.replace(cast.trust(), witness_interval_s=value)
        path.write_bytes(dump_trust(trust))
        if ok:
            assert load_trust(path).witness_interval_s == value
        else:
            with pytest.raises(TrustError):
                load_trust(path)
    for bad in (str(MAX_WITNESS_INTERVAL_S + 1), "0", "1e3", "-5"):
        args = ["witness", "run", "--ledger", "http://127.0.0.1:9", "--terms", "t", "--key", "k"]
        capsys.readouterr()
        assert gridledger_main([*args, "--state", str(tmp_path), f"--interval={bad}"]) == EXIT_USAGE
        err = capsys.readouterr().err.strip()
        assert err.startswith("FAIL: --interval") and "\n" not in err, err


def test_a_ledger_behind_its_log_serves_no_checkpoint_to_witness(tmp_path: Path) -> None:
    """SPEC §8.4: while the ledger is behind its log, a witness gets no checkpoint to
    cosign (exit 75, try again), so no cosignature is dated after inputs it has not
    chained yet."""
    r = _resold(tmp_path)
    terms_file = tmp_path / "terms.signed.json"
    terms_file.write_bytes(signed_terms(r.cast, r.terms))
    write_key_pair(r.cast.operator, tmp_path / "keys")
    lagging: list[str | None] = ["the ledger was last caught up with its log 90000 ms ago"]
    api = LedgerApi(r.store, r.cast.ledger, LedgerMetrics(), behind=lambda: lagging[0])
    server = LedgerHttpServer(api, "127.0.0.1", 0)
    server.start()
    try:

        def run() -> tuple[int, str]:
            result = witness_once(
                ledger_url=server.url,
                terms_path=terms_file,
                key_path=tmp_path / "keys" / f"{r.cast.operator.name}.key",
                state_dir=tmp_path / "state",
                now_s=(at(60) + GRACE) // 1000 + 30,
            )
            return result.code, result.line

        code, line = run()
        assert code == EXIT_UNAVAILABLE and "90000 ms ago" in line, line
        assert not (tmp_path / "state" / "refusals").exists()  # not a refusal: later
        lagging[0] = None
        assert run()[0] == EXIT_OK
    finally:
        server.stop()
        r.service.close()


def test_a_kafka_ledger_is_behind_its_log_until_read_to_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC §8.4 on Kafka: behind until every owned partition was read to its end offset,
    and again once that is more than MAX_CLOCK_SKEW_MS / 2 ago."""
    import asyncio

    from ledger.config import KafkaConfig
    from ledger.consume import PartitionLag
    from ledger.service import KafkaLedgerService
    from transport.kafka import KafkaSettings

    cast = make_cast("time-behind")
    store = Store(tmp_path / "k.duckdb", ledger_public_key=cast.ledger.public_key)
    kafka = KafkaConfig(settings=KafkaSettings(bootstrap="127.0.0.1:9", topic="t"))
    ledger = KafkaLedgerService(store, cast.ledger, kafka, crypto_worker=False)
    try:
        lags = [PartitionLag(0, 5, 9), PartitionLag(1, 3, 3)]

        async def lag() -> list[PartitionLag]:
            return lags

        monkeypatch.setattr(ledger.source, "lag", lag)
        assert "not read its partitions" in (ledger.behind_log() or "")
        assert asyncio.run(ledger.update_lag()) == 4
        assert ledger.behind_log() is not None
        lags = [PartitionLag(0, 9, 9), PartitionLag(1, 3, 3)]
        assert asyncio.run(ledger.update_lag()) == 0
        assert ledger.behind_log() is None
        assert ledger.caught_up_ms is not None
        ledger.caught_up_ms -= MAX_CLOCK_SKEW_MS // 2 - 1_000
        assert ledger.behind_log() is None
        ledger.caught_up_ms -= 2_000
        assert "last caught up" in (ledger.behind_log() or "")
    finally:
        ledger.close()
