"""Two implementations of one spec: the real ledger folds, exports; the verifier checks.

The ledger's fold (ledger/fold.py, incremental Python) and the verifier (verifier/, a
re-derivation of SPEC §6 plus SQL pricing) were written apart from SPEC.md. Here the same
inputs go through the ledger's Ingestor and export, and the verifier must agree with
every decision and every amount — including the decisions the test author wrote by hand
in the full scenario, and randomly generated streams with faults.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_verifier_exports import HOUR, MINUTE, T0, explain, full_scenario, verify

from devtools.builders import (
    Cast,
    StreamWriter,
    adjustment,
    amendment,
    assignment,
    closed,
    gpu,
    key_binding,
    make_cast,
    make_terms,
    reclaim,
    release,
    resume,
    sample,
    signed_terms,
)
from ledger.export import export_placement
from ledger.ingest import Ingestor
from ledger.inputs import Item
from ledger.store import Store
from proto.envelope import open_envelope
from proto.keys import SigningKey
from proto.limits import REJECTION_ADVANCES_FROM_MS
from proto.trust import TrustedKey, TrustFile


def _ledger_export(
    tmp: Path,
    cast_key: SigningKey,
    placement_id: str,
    raws: list[bytes],
    arrivals: list[int | None] | None = None,
) -> Path:
    """Fold ``raws`` in order through the real ledger and export the placement;
    ``arrivals``: when each reached the log (None: untimed)."""
    out = tmp / f"ledger-{placement_id}.duckdb"
    with Store(tmp / "ledger.duckdb", ledger_public_key=cast_key.public_key) as store:
        _fold_in_batches(store, cast_key, _items(placement_id, raws, arrivals))
        export_placement(store, placement_id, out, key=cast_key)
    return out


def _items(
    placement_id: str, raws: list[bytes], arrivals: list[int | None] | None = None
) -> list[Item]:
    """``raws`` as the embedded transport hands them over, one source, in order."""
    return [
        Item(
            data=raw,
            position=f"local:test:0:{i}",
            stream_key=placement_id,
            source="local:test",
            next_position=f"local:test:0:{i + 1}",
            arrived_ms=None if arrivals is None else arrivals[i],
        )
        for i, raw in enumerate(raws)
    ]


def _fold_in_batches(store: Store, key: SigningKey, items: list[Item]) -> None:
    ingestor = Ingestor(store, key)
    for start in range(0, len(items), 7):  # several batches, as a consumer would
        ingestor.ingest(items[start : start + 7])


def test_real_ledger_export_of_the_full_scenario_verifies(tmp_path: Path) -> None:
    s = full_scenario(tmp_path)
    raws = [item.raw for item in s.builder.items]
    # Inputs the ledger must not chain: a re-delivery (dropped), garbage (quarantined),
    # and usage that arrives before the terms (held, then processed after them).
    early = raws[1]
    stream = [early, raws[0], *raws[2:5], raws[3], b"not an envelope", *raws[5:]]
    out = _ledger_export(tmp_path, s.cast.ledger, s.terms.placement_id, stream)
    report = verify(out, s.trust)
    assert report.ok, explain(report)
    # The ledger decided exactly what the scenario's author wrote by hand.
    con = duckdb.connect(str(out), read_only=True)
    decided = {}
    for table in ("terms", "key_bindings", "usage_events", "reclaims", "adjustments", "closes"):
        for _, input_hash, status, reason in con.execute(
            f"SELECT chain_index, input_hash, status, reason FROM {table}"
        ).fetchall():
            decided[input_hash] = (status, reason)
    dropped = con.execute("SELECT value FROM meta WHERE key = 'dropped_duplicates'").fetchone()
    con.close()
    from proto.envelope import sha256_hex

    expected = {sha256_hex(i.raw): (i.status, i.reason) for i in s.builder.items}
    assert decided == expected
    assert dropped == ("1",)
    # And the amounts are the hand-checked scenario's.
    last = s.builder.items[-1].record
    assert last is not None and report.totals is not None
    assert report.totals["buyer_owes_minor"] == last.totals.buyer_owes_minor


# ---- random streams with faults, through both implementations ---------------------------

_FAULTS = (
    "ok",
    "ok",
    "ok",
    "gap",
    "overlap",
    "stranger",
    "unhealthy",
    "outside",
    "repeat",
    "foreign_gpu",
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    faults=st.lists(st.sampled_from(_FAULTS), min_size=1, max_size=25),
    reclaim_at=st.none() | st.integers(5, 50),
    adjust=st.lists(
        st.tuples(st.sampled_from(["credit", "charge"]), st.integers(1, 500)), max_size=3
    ),
    fee_payer=st.sampled_from(["operator", "buyer"]),
    interruptible=st.booleans(),
    close=st.booleans(),
    advancing=st.booleans(),
)
def test_random_streams_agree(
    tmp_path_factory: pytest.TempPathFactory,
    faults: list[str],
    reclaim_at: int | None,
    adjust: list[tuple[str, int]],
    fee_payer: str,
    interruptible: bool,
    close: bool,
    advancing: bool,
) -> None:
    """``advancing``: terms created from REJECTION_ADVANCES_FROM_MS on (a content rejection
    advances its stream, SPEC §6.3 usage), else before (it stops the stream)."""
    tmp = tmp_path_factory.mktemp("random")
    cast = make_cast("random")
    pid = "p-random"
    gpus = [gpu("n1", 0), gpu("n1", 1, share_milli=250)]
    terms = make_terms(
        cast,
        pid,
        gpus,
        T0,
        T0 + HOUR,
        fee_payer=fee_payer,
        interruptible=interruptible,
        minimum_duration_ms=30 * MINUTE,
        created_at_ms=REJECTION_ADVANCES_FROM_MS if advancing else T0,
    )
    raws = [signed_terms(cast, terms)]
    writer = StreamWriter(cast.node_key("n1"), pid, "n1")
    minute = 0
    for fault in faults:
        start, end = T0 + minute * MINUTE, T0 + (minute + 1) * MINUTE
        samples = [sample(gpus[0]), sample(gpus[1], healthy=fault != "unhealthy")]
        if fault == "foreign_gpu":  # a driver hiccup names a GPU outside the terms
            samples.append(sample(gpu("n1", 7)))
        if fault == "gap":
            writer.seq += 1
        elif fault == "overlap":
            start -= MINUTE // 2
        elif fault == "outside":
            start, end = T0 + 2 * HOUR, T0 + 2 * HOUR + MINUTE
        if fault == "stranger":
            stranger = StreamWriter(
                SigningKey.from_seed_text("s", "stranger"),
                pid,
                "n1",
                seq=writer.seq,
                prev=writer.prev,
            )
            raws.append(stranger.event(start, end, samples))
        else:
            raws.append(writer.event(start, end, samples))
        if fault == "repeat":
            raws.append(raws[-1])
        minute += 1
        if reclaim_at is not None and minute == reclaim_at:
            raws.append(
                reclaim(cast, terms, T0 + (minute - 3) * MINUTE, T0 + minute * MINUTE, "rc")
            )
    for i, (direction, amount) in enumerate(adjust):
        raws.append(adjustment(cast, pid, f"adj-{i % 2}", direction, amount, T0))
    if close:
        raws.append(closed(cast, pid, T0 + HOUR + terms.late_grace_ms))
        raws.append(
            writer.event(T0 + (minute + 1) * MINUTE, T0 + (minute + 2) * MINUTE, [sample(gpus[0])])
        )
    out = _ledger_export(tmp, cast.ledger, pid, raws)
    report = verify(out, cast.trust())
    assert report.ok, explain(report)


_MIXED = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "usage",
                "usage",
                "usage",
                "foreign_gpu",
                "clock_step",
                "overlap",
                "resume",
                "usage_key2",
                "usage_n2",
                "gap",
                "gap_n2",
                "early",
                "bind_key2",
                "revoke_key2",
                "amend",
                "reclaim",
                "release",
                "credit",
                "charge",
                "assign",
                "repeat",
            ]
        ),
        st.integers(0, 59),
    ),
    min_size=1,
    max_size=30,
)


class Mixed(NamedTuple):
    """A random stream of one placement, ready to fold: its inputs, when each reached
    the log (None: untimed), and the trust file its verifier uses."""

    cast: Cast
    pid: str
    raws: list[bytes]
    arrivals: list[int | None]
    trust: TrustFile


def _mixed(
    ops: list[tuple[str, int]],
    close: bool,
    timed: bool,
    amounts: Callable[[int], int] | None = None,
    **terms_changes: Any,
) -> Mixed:
    """The inputs of ``ops`` (``test_random_mixed_streams_agree`` says which); ``timed``:
    each input reaches the log when it is dated, never before the one before it;
    ``amounts``: the amount of the adjustment of op ``n`` (default 100 + n);
    ``terms_changes``: fields of the terms other than the builders' defaults."""
    cast = make_cast("mixed")
    pid = "p-mixed"
    gpus = [gpu("n1", 0), gpu("n1", 1, share_milli=500)]
    terms = make_terms(cast, pid, gpus, T0, T0 + HOUR, **terms_changes)
    raws = [signed_terms(cast, terms)]
    dated = [T0 - MINUTE]  # when each input is dated (its arrival, when timed)
    writer = StreamWriter(cast.node_key("n1"), pid, "n1")
    n2_gpu = gpu("n2", 0, share_milli=500)
    writer_n2 = StreamWriter(cast.node_key("n2"), pid, "n2")
    key2 = SigningKey.from_seed_text("n1-second", "mixed/n1-second")
    new_buyer = SigningKey.from_seed_text("buyer-2", "mixed/buyer-2")
    minute = amendments = late_amendments = 0
    for n, (kind, at_min) in enumerate(ops):
        at = T0 + at_min * MINUTE
        if kind in ("usage", "usage_key2"):
            start = T0 + minute * MINUTE
            samples = [sample(gpus[0]), sample(gpus[1])]
            if kind == "usage_key2":  # the same stream, signed by the second key
                other = StreamWriter(key2, pid, "n1", seq=writer.seq, prev=writer.prev)
                raws.append(other.event(start, start + MINUTE, samples))
                writer.seq, writer.prev = other.seq, other.prev
            else:
                raws.append(writer.event(start, start + MINUTE, samples))
            dated.append(start + MINUTE)
            minute += 1
        elif kind == "foreign_gpu":  # rejected for its content (GPU_NOT_IN_TERMS)
            start = T0 + minute * MINUTE
            raws.append(writer.event(start, start + MINUTE, [sample(gpu("n1", 7))]))
            dated.append(start + MINUTE)
            minute += 1
        elif kind == "clock_step":  # ends 2 minutes past its arrival when timed: FUTURE_DATED
            start = T0 + minute * MINUTE
            raws.append(writer.event(start, start + 3 * MINUTE, [sample(gpus[0])]))
            dated.append(start + MINUTE)
            minute += 3
        elif kind == "overlap":  # starts a minute before the last end: INTERVAL_OVERLAP
            start = T0 + max(minute - 1, 0) * MINUTE
            raws.append(writer.event(start, start + MINUTE, [sample(gpus[0])]))
            dated.append(start + MINUTE)
            minute = max(minute, 1)
        elif kind == "resume":  # the node lost its spool: its stream restarts 3 seqs on
            raw = resume(cast, pid, "n1", writer.seq + 3, T0 + minute * MINUTE, f"rs-{n}")
            raws.append(raw)
            dated.append(T0 + minute * MINUTE)
            writer.seq, writer.prev = writer.seq + 3, open_envelope(raw).record_hash
        elif kind == "gap":  # the node's next event skips a seq: held beyond the gap
            writer.seq += 1
        elif kind == "gap_n2":
            writer_n2.seq += 1
        elif kind == "early":  # an event that reaches the log before the terms: held
            start = T0 + minute * MINUTE
            raws.insert(0, writer.event(start, start + MINUTE, [sample(gpus[0])]))
            dated.insert(0, dated[0])
            minute += 1
        elif kind == "usage_n2":
            start = T0 + minute * MINUTE
            raws.append(writer_n2.event(start, start + MINUTE, [sample(n2_gpu)]))
            dated.append(start + MINUTE)
            minute += 1
        elif kind == "bind_key2":
            raws.append(key_binding(cast, pid, "n1", key2, T0, T0 + 2 * HOUR, at))
            dated.append(at)
        elif kind == "revoke_key2":
            raws.append(key_binding(cast, pid, "n1", key2, T0, at, at, signers=[cast.operator]))
            dated.append(at)
        elif kind == "amend" and late_amendments < 1:
            # Before anything else an amendment is accepted and the next amends it; after,
            # one more is sent (accepted or AMENDMENT_TOO_LATE) and no other: two late
            # amendments of one version are two agreements (TERMS_DISPUTED, by design).
            # An odd minute also moves the second GPU to node n2 (its nodes with it).
            moved = make_terms(
                cast, pid, [gpus[0], n2_gpu] if at_min % 2 else gpus, T0, T0 + HOUR, **terms_changes
            )
            amended = amendment(
                terms,
                late_grace_ms=terms.late_grace_ms + MINUTE,
                gpus=moved.gpus,
                nodes=moved.nodes,
            )
            raws.append(signed_terms(cast, amended))
            dated.append(dated[-1])
            if len(raws) == amendments + 2:
                terms, amendments = amended, amendments + 1
            else:
                late_amendments += 1
        elif kind == "reclaim":
            raws.append(reclaim(cast, terms, at - terms.reclaim_notice_ms, at, f"rc-{n}"))
            dated.append(at)
        elif kind == "release":
            raws.append(release(cast, terms, at, at, f"rl-{n}"))
            dated.append(at)
        elif kind in ("credit", "charge"):
            amount = 100 + n if amounts is None else amounts(n)
            raws.append(adjustment(cast, pid, f"adj-{n}", kind, amount, at))
            dated.append(at)
        elif kind == "assign":
            raws.append(assignment(cast, terms, f"as-{n}", new_buyer, at, [gpus[n % 2].uuid], 90))
            dated.append(at)
        elif kind == "repeat":
            raws.append(raws[-1])
            dated.append(dated[-1])
    if close:
        raws.append(closed(cast, pid, T0 + HOUR + terms.late_grace_ms))
        dated.append(T0 + HOUR + terms.late_grace_ms)
    assert len(dated) == len(raws)
    arrivals: list[int | None] = [None] * len(raws)
    if timed:
        arrivals = [max(dated[: i + 1]) for i in range(len(dated))]
    base = cast.trust()  # the resale's new buyer pinned, as its user would (SPEC §9)
    pinned = TrustedKey(id=new_buyer.name, role="buyer", key=new_buyer.public_key)
    return Mixed(
        cast, pid, raws, arrivals, msgspec.structs.replace(base, keys=[*base.keys, pinned])
    )


_SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _created(advancing: bool) -> dict[str, int]:
    """Terms of the rule now (a content rejection advances its stream) or of before."""
    return {"created_at_ms": REJECTION_ADVANCES_FROM_MS if advancing else T0}


@settings(_SETTINGS, max_examples=12)
@given(ops=_MIXED, close=st.booleans(), timed=st.booleans(), advancing=st.booleans())
def test_random_mixed_streams_agree(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[str, int]],
    close: bool,
    timed: bool,
    advancing: bool,
) -> None:
    """Every kind a party signs, in random order and at random times — usage by the
    node's key and a second bound (then revoked) key, amendments (some moving a GPU to
    another node, whose events then count), reclaims, releases, credits, charges, resales
    of a GPU, repeats, gaps in a node's seqs (held, then SEQ_GAP at the close flush, in
    node then seq order), an event before the terms, events rejected for their content (a
    GPU outside the terms, a clock step, an overlap: under terms of REJECTION_ADVANCES_FROM_MS
    on each advances its stream), resumes of the node's stream (SPEC §6.3 resume: some
    flush held events, some come too late) — through the real ledger: it never raises, and the
    verifier re-derives every decision and amount from the export."""
    mixed = _mixed(ops, close, timed, **_created(advancing))
    tmp = tmp_path_factory.mktemp("mixed")
    out = _ledger_export(tmp, mixed.cast.ledger, mixed.pid, mixed.raws, mixed.arrivals)
    report = verify(out, mixed.trust)
    assert report.ok, explain(report)


@settings(_SETTINGS, max_examples=6)
@given(ops=_MIXED, close=st.booleans(), timed=st.booleans(), advancing=st.booleans())
def test_random_mixed_streams_restart_anywhere(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[str, int]],
    close: bool,
    timed: bool,
    advancing: bool,
) -> None:
    """The same streams folded once in batches and once with the ledger stopped and
    started again after every input (its state back from the store each time: bindings,
    revocations, holds, releases, resales, amendments, streams advanced by content
    rejections): the same records, byte for byte."""
    mixed = _mixed(ops, close, timed, **_created(advancing))
    tmp = tmp_path_factory.mktemp("restart")
    items = _items(mixed.pid, mixed.raws, mixed.arrivals)
    key = mixed.cast.ledger
    with Store(tmp / "batches.duckdb", ledger_public_key=key.public_key) as store:
        _fold_in_batches(store, key, items)
        once = store.query("SELECT chain_index, envelope FROM records ORDER BY chain_index")
    for item in items:
        with Store(tmp / "restarts.duckdb", ledger_public_key=key.public_key) as store:
            Ingestor(store, key).ingest([item])
    with Store(tmp / "restarts.duckdb", ledger_public_key=key.public_key) as store:
        again = store.query("SELECT chain_index, envelope FROM records ORDER BY chain_index")
    assert [(i, bytes(e)) for i, e in again] == [(i, bytes(e)) for i, e in once]


def test_resale_after_a_release_vector_verifies(tmp_path: Path) -> None:
    """proto/vectors/resale_release.json through the real ledger and the verifier: the
    verifier re-derives the resale clipped at the release's end e (SPEC §7.10 with §6.7
    step 5) and finds nothing; before it clipped at a reclaim only (RESALE_MISMATCH)."""
    import base64
    import json

    import vectorgen

    data = json.loads((vectorgen.VECTORS_DIR / "resale_release.json").read_text())
    cast = vectorgen._cast()
    raws = [base64.b64decode(step["envelope_b64"]) for step in data["steps"]]
    arrivals: list[int | None] = [step["arrived_ms"] for step in data["steps"]]
    out = _ledger_export(tmp_path, cast.ledger, "pl-vector", raws, arrivals)
    base = cast.trust()
    buyer2 = base64.b64decode(data["new_buyers"]["buyer-2"])
    trust = msgspec.structs.replace(
        base, keys=[*base.keys, TrustedKey(id="buyer-2", role="buyer", key=buyer2)]
    )
    report = verify(out, trust)
    assert report.ok, explain(report)


@pytest.mark.parametrize("rule", ["advancing", "before"])
def test_a_rejection_costs_its_own_interval_vector_verifies(tmp_path: Path, rule: str) -> None:
    """proto/vectors/rejection_advances.json through the real ledger, stopped and started
    again after every input, and the verifier: a GPU outside the terms at minute 10 and a
    clock step at minute 30 cost their own minutes only (40 of 60 minutes billed) under
    terms of REJECTION_ADVANCES_FROM_MS on; under older terms the rest of the window is
    flushed SEQ_GAP (10 minutes billed). Both exports verify."""
    import base64
    import json

    import vectorgen

    data = json.loads((vectorgen.VECTORS_DIR / "rejection_advances.json").read_text())[rule]
    cast = vectorgen._cast()
    raws = [base64.b64decode(step["envelope_b64"]) for step in data["steps"]]
    arrivals: list[int | None] = [step["arrived_ms"] for step in data["steps"]]
    items = _items("pl-rejection", raws, arrivals)
    for item in items:  # restarted anywhere
        with Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key) as store:
            Ingestor(store, cast.ledger).ingest([item])
    out = tmp_path / "export.duckdb"
    with Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key) as store:
        reasons = store.query(
            "SELECT reason FROM records WHERE status = 'rejected' ORDER BY chain_index"
        )
        export_placement(store, "pl-rejection", out, key=cast.ledger)
    expected = [
        reason
        for step in data["steps"]
        for o in step["outcomes"]
        if o["status"] == "rejected"
        for reason in [o["reason"]]
    ]
    assert [r for (r,) in reasons] == expected
    minutes = data["totals"]["delivered_mgms"] // (1000 * MINUTE)
    assert minutes == (40 if rule == "advancing" else 10)
    report = verify(out, cast.trust())
    assert report.ok, explain(report)


@pytest.mark.parametrize("rule", ["advancing", "before"])
def test_a_ledger_folding_by_the_other_rejection_rule_is_caught(
    tmp_path: Path, rule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verifier decides which rule a placement's terms take on its own: a ledger that
    folded the vector's stream by the other rule (it flushed SEQ_GAP where the terms say a
    content rejection advances, or advanced where they say it stops) signs decisions the
    verifier's referee does not make."""
    import base64
    import json

    import vectorgen

    from proto import limits as proto_limits

    data = json.loads((vectorgen.VECTORS_DIR / "rejection_advances.json").read_text())[rule]
    cast = vectorgen._cast()
    raws = [base64.b64decode(step["envelope_b64"]) for step in data["steps"]]
    arrivals: list[int | None] = [step["arrived_ms"] for step in data["steps"]]
    with monkeypatch.context() as patch:  # the dishonest ledger's date
        wrong = 2**62 if rule == "advancing" else 0
        patch.setattr(proto_limits, "REJECTION_ADVANCES_FROM_MS", wrong)
        out = _ledger_export(tmp_path, cast.ledger, "pl-rejection", raws, arrivals)
    report = verify(out, cast.trust())
    assert not report.ok
    rules = {f.rule for f in report.findings.kept}
    # the decisions differ (the referee wants SEQ_GAP where the ledger accepted, or the
    # reverse), and so does every amount the billed minutes make
    assert {"SEQ_GAP", "TOTAL_DELIVERED_MGMS", "STATEMENT_TOTALS"} <= rules, rules


def test_a_node_resumed_after_losing_its_spool_vector_verifies(tmp_path: Path) -> None:
    """proto/vectors/resume.json through the real ledger, stopped and started again after
    every input, and the verifier: the resume flush, the resumed stream's event chained
    to the resume record and billed, the old node's stray events refused; the verifier
    re-derives every decision and amount."""
    import base64
    import json

    import vectorgen

    data = json.loads((vectorgen.VECTORS_DIR / "resume.json").read_text())
    cast = vectorgen._cast()
    raws = [base64.b64decode(step["envelope_b64"]) for step in data["steps"]]
    arrivals: list[int | None] = [step["arrived_ms"] for step in data["steps"]]
    for item in _items("pl-resume", raws, arrivals):  # restarted anywhere
        with Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key) as store:
            Ingestor(store, cast.ledger).ingest([item])
    out = tmp_path / "export.duckdb"
    with Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key) as store:
        heads = store.query("SELECT count(*) FROM records WHERE placement_id = 'pl-resume'")
        export_placement(store, "pl-resume", out, key=cast.ledger)
    assert heads[0][0] == data["records"]
    report = verify(out, cast.trust())
    assert report.ok, explain(report)
    assert report.totals is not None and report.totals["delivered_mgms"] == 40 * 60_000 * 1000
