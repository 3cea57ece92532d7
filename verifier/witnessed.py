"""(10) completeness: is this the whole, final, witnessed obligation? (SPEC.md §9)

Runs after steps (1)-(9) found nothing: every record, statement and checkpoint it reads
was already checked, so it only asks what they add up to:

* the log holds an accepted ``closed`` (else the placement is **open**);
* the latest statement is final and covers the last record (a closed log without one is
  a finding: an export cut after the close, or a statement withheld);
* a ledger-signed checkpoint covers the last record (else records were added after the
  last checkpoint, or the export was cut and re-checkpointed by nobody);
* that checkpoint carries a valid C2SP cosignature of every cosigner the trust file's
  policy requires (else it is **unwitnessed**): the ``new-buyers`` entry stands for every
  accepted assignment's new buyer (SPEC §8.2);
* with ``witness_interval_s`` in the trust file, every record's time is witnessed within
  it by each of those cosigners (SPEC §9; §6.6: the bound on backdating);
* its arrival times are the log's (``arrival = log``, signed in the statements, SPEC
  §6.6), unless the trust file admits simulations (``"simulations": true``).

FINAL needs all of these; PROVISIONAL names what is missing; a finding makes it FAILED.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from proto.cosign import cosignature_of
from proto.errors import ProtoError
from proto.note import SignedNote, parse_checkpoint_body, parse_note
from proto.records import Party, PlacementTerms
from proto.trust import NEW_BUYERS, PARTY_ROLES, TrustFile

FINAL: Final = "final"
PROVISIONAL: Final = "provisional"


@dataclass(frozen=True, slots=True)
class Cosigner:
    """A cosigner the policy requires: its name on note lines and its key (None: unpinned)."""

    entry: str  # the policy entry: a role or a witness id
    name: str
    key: bytes | None


@dataclass
class Completeness:
    """What step (10) concluded."""

    level: str = PROVISIONAL
    reasons: list[str] = field(default_factory=list)  # why not final (empty when final)
    findings: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    witnessed_by: list[str] = field(default_factory=list)  # on the checkpoint of the last record
    checkpoint_size: int = 0  # the largest checkpoint in the export


def required_cosigners(
    trust: TrustFile, terms: PlacementTerms, new_buyers: Sequence[Party] = ()
) -> list[Cosigner]:
    """The policy's entries, resolved against this placement's parties, its accepted
    assignments' new buyers and pinned witnesses."""
    parties = {"operator": terms.operator, "buyer": terms.buyer, "desk": terms.desk}
    out: list[Cosigner] = []
    for entry in trust.cosigner_policy():
        if entry in PARTY_ROLES:
            party = parties[entry]
            out.append(Cosigner(entry, party.id, party.key))
            continue
        if entry == NEW_BUYERS:
            out += [Cosigner(entry, p.id, p.key) for p in new_buyers]
            continue
        pinned = [k.key for k in trust.keys if k.role == "witness" and k.id == entry]
        out.append(Cosigner(entry, entry, pinned[0] if pinned else None))
    return out


def judge(
    *,
    terms: PlacementTerms,
    trust: TrustFile,
    record_count: int,
    closed: bool,
    statements: Sequence[tuple[int, bool]],
    checkpoint_notes: Sequence[str],
    new_buyers: Sequence[Party] = (),
    first_arrived_ms: int | None = None,
    simulation: bool = False,
) -> Completeness:
    """Step (10) over what steps (1)-(9) verified; see the module docstring.

    ``statements`` are (through_index, final) pairs; ``checkpoint_notes`` the note texts;
    ``new_buyers`` those of the accepted assignments; ``first_arrived_ms`` record 0's
    arrival (where the witnessing interval starts); ``simulation``: the statements (or the
    meta row) say ``arrival = sender`` (SPEC §6.6).
    """
    result = Completeness()
    if simulation and not trust.simulations:
        result.reasons.append(
            "a simulation: arrival times stated by the senders (arrival = sender), which "
            'the trust file does not admit ("simulations": true)'
        )
    last = record_count - 1
    if not closed:
        result.reasons.append("open: the log holds no accepted close")
    latest = max(statements, default=None)
    if closed and (latest is None or latest[0] != last or not latest[1]):
        shown = "none" if latest is None else f"through {latest[0]}, final={latest[1]}"
        result.findings.append(
            (
                "FINAL_STATEMENT_MISSING",
                "statements",
                f"a final statement through record {last}",
                shown,
                "a closed placement's export ends with its final statement (cut or withheld?)",
            )
        )
    elif not closed and (latest is None or latest[0] != last):
        result.reasons.append(f"no statement covers record {last}")
    notes: dict[int, SignedNote] = {}
    for text in checkpoint_notes:
        try:
            note = parse_note(text)
            notes[parse_checkpoint_body(note.body).size] = note
        except ProtoError:
            continue  # step (8) reported it
    result.checkpoint_size = max(notes, default=0)
    head = notes.get(record_count)
    if head is None:
        result.reasons.append(
            f"unwitnessed tail: no checkpoint covers all {record_count} records "
            f"(largest covers {result.checkpoint_size})"
        )
        return _settle(result)
    cosigners = required_cosigners(trust, terms, new_buyers)
    for cosigner in cosigners:
        if cosigner.key is None:
            result.reasons.append(f"witness {cosigner.entry!r} is not pinned in the trust file")
        elif cosignature_of(head, cosigner.name, cosigner.key) is None:
            result.reasons.append(f"not witnessed by the {cosigner.entry} ({cosigner.name})")
        else:
            result.witnessed_by.append(cosigner.name)
    if trust.witness_interval_s is not None:
        for cosigner in cosigners:
            gap = _widest_gap(notes, cosigner, first_arrived_ms, record_count)
            if gap is not None and gap[0] > trust.witness_interval_s:
                result.reasons.append(
                    f"time not witnessed: the {cosigner.entry} ({cosigner.name}) cosigned "
                    f"nothing for {gap[0]} s before the checkpoint of size {gap[1]} "
                    f"(witness_interval_s {trust.witness_interval_s}; SPEC §9)"
                )
    return _settle(result)


def _widest_gap(
    notes: dict[int, SignedNote], cosigner: Cosigner, start_ms: int | None, record_count: int
) -> tuple[int, int] | None:
    """(seconds, size): the widest span over which a record was appended unseen by
    ``cosigner`` — from its latest cosignature of a tree without the record (or record
    0's arrival) to its earliest of a tree with it — or None when it cosigned nothing."""
    if cosigner.key is None:
        return None
    stamps: dict[int, tuple[int, int]] = {}  # size -> (earliest, latest) its own, seconds
    for size, note in notes.items():
        cosigned = cosignature_of(note, cosigner.name, cosigner.key)
        if cosigned is not None and 0 < size <= record_count:
            stamps[size] = (cosigned.timestamp_s, cosigned.timestamp_s)
    if not stamps:
        return None
    sizes = sorted(stamps)
    widest: tuple[int, int] | None = None
    floor_s = None if start_ms is None else start_ms // 1000
    earliest_after = [0] * len(sizes)
    best = None
    for k in range(len(sizes) - 1, -1, -1):
        at = stamps[sizes[k]][0]
        best = at if best is None else min(best, at)
        earliest_after[k] = best
    for k, size in enumerate(sizes):
        if floor_s is not None:
            gap = earliest_after[k] - floor_s
            if widest is None or gap > widest[0]:
                widest = (gap, size)
        latest = stamps[size][1]
        floor_s = latest if floor_s is None else max(floor_s, latest)
    return widest


def _settle(result: Completeness) -> Completeness:
    result.level = FINAL if not result.reasons and not result.findings else PROVISIONAL
    return result
