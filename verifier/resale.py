"""Resale (SPEC §6.8, §7.10): both obligations re-derived from the envelopes, in SQL.

The referee (``verifier/decisions.py``) decides each assignment and step (7) keeps the
accepted ones in ``w_assign`` / ``w_assign_gpus`` with their effective handover. Here
DuckDB computes, at every chain index from each assignment on, its cumulative D_k, B_k,
G_k and F_k (``w_resale_exp``) from the same counted samples as §7.1 (``HEALTH_SQL``),
and compares them with the ``resale`` list every LedgerRecord claims (``w_resale_rec``):
an entry the ledger billed wrong, dropped, added or reordered is ``RESALE_MISMATCH``.
Each accepted assignment's new buyer must be pinned in the trust file as a buyer under
the id the assignment names (SPEC §9).

The verifier's own implementation: it imports ``proto`` only, never ``ledger``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from proto import limits as proto_limits
from proto.keys import key_id
from proto.trust import TrustFile
from verifier import limits
from verifier.findings import Step
from verifier.pricing import HEALTH_SQL, effective_end_sql

if TYPE_CHECKING:
    from verifier.state import Verification

RESALE_FIELDS: Final = (
    "assignment_id",
    "new_buyer",
    "delivered_mgms",
    "billable_mgms",
    "gross_minor",
    "fee_minor",
)

_MGMS_PER_GPU_HOUR: Final = proto_limits.MILLI_GPU_MS_PER_GPU_HOUR
_BPS: Final = proto_limits.MAX_BPS

# SPEC §7.10 at every index of the chain from each assignment's own record on, each event
# clipped to [h_k, the effective end in force when it is folded) (§6.7 step 5, §6.3 reclaim).
_EXPECTED_SQL: Final = f"""
CREATE OR REPLACE TABLE w_resale_exp AS
WITH t AS (SELECT * FROM w_terms LIMIT 1),
rc AS (SELECT chain_index AS rc_index, effective_at_ms
       FROM w_reclaim ORDER BY chain_index LIMIT 1),
rl AS (SELECT chain_index AS rl_index, end_ms AS rl_end
       FROM w_release ORDER BY chain_index LIMIT 1),
hs AS ({HEALTH_SQL}),
ev AS (  -- share x overlap([start, end), [h_k, effective end when folded)), after k
    SELECT u.chain_index, a.ord,
           SUM(g.share_milli::HUGEINT * GREATEST(0,
               LEAST(u.end_ms, {effective_end_sql("u.chain_index")})
               - GREATEST(u.start_ms, a.h_ms)) * s.weight_bps // 10000) AS d_i
    FROM w_usage u
    JOIN hs s ON s.chain_index = u.chain_index AND s.counts
    JOIN w_gpus g ON g.uuid = s.uuid
    JOIN w_assign_gpus ag ON ag.uuid = s.uuid
    JOIN w_assign a ON a.ord = ag.ord AND a.chain_index < u.chain_index
    CROSS JOIN t LEFT JOIN rc ON TRUE LEFT JOIN rl ON TRUE
    GROUP BY u.chain_index, a.ord
),
idx AS (SELECT chain_index FROM w_records UNION SELECT chain_index FROM w_usage),
grid AS (
    SELECT i.chain_index, a.ord, a.assignment_id, a.new_buyer, a.rate
    FROM idx i JOIN w_assign a ON a.chain_index <= i.chain_index
),
cum AS (
    SELECT grid.*, SUM(COALESCE(ev.d_i, 0)::HUGEINT) OVER (
               PARTITION BY grid.ord ORDER BY grid.chain_index
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS d
    FROM grid LEFT JOIN ev USING (chain_index, ord)
),
billed AS (
    SELECT c.*, ((c.d + t.unit_mgms - 1) // t.unit_mgms) * t.unit_mgms AS b, t.fee_bps
    FROM cum c CROSS JOIN t
)
SELECT chain_index, ord, assignment_id, new_buyer, d, b,
       (b * rate) // {_MGMS_PER_GPU_HOUR} AS g,
       (((b * rate) // {_MGMS_PER_GPU_HOUR}) * fee_bps) // {_BPS} AS f
FROM billed
"""

_MISMATCH_SQL: Final = """
SELECT COALESCE(e.chain_index, r.chain_index) AS i, COALESCE(e.ord, r.ord) AS k,
       e.assignment_id, e.new_buyer, e.d, e.b, e.g, e.f,
       r.assignment_id, r.new_buyer, r.d, r.b, r.g, r.f
FROM (SELECT * FROM w_resale_exp WHERE chain_index IN (SELECT chain_index FROM w_records)) e
FULL OUTER JOIN w_resale_rec r ON e.chain_index = r.chain_index AND e.ord = r.ord
WHERE e.chain_index IS NULL OR r.chain_index IS NULL
   OR e.assignment_id IS DISTINCT FROM r.assignment_id
   OR e.new_buyer IS DISTINCT FROM r.new_buyer
   OR e.d IS DISTINCT FROM r.d OR e.b IS DISTINCT FROM r.b
   OR e.g IS DISTINCT FROM r.g OR e.f IS DISTINCT FROM r.f
ORDER BY i, k
"""


# ``w_resale_exp`` as _EXPECTED_SQL makes it, empty: what it makes without an assignment.
_EMPTY_SQL: Final = (
    "CREATE OR REPLACE TABLE w_resale_exp(chain_index BIGINT, ord BIGINT, "
    "assignment_id VARCHAR, new_buyer VARCHAR, d HUGEINT, b HUGEINT, g HUGEINT, f HUGEINT)"
)


def compute_resale(con: Any, assigned: bool, claimed: bool) -> None:
    """Fill ``w_resale_exp``: every assignment's figures at every index from its record
    (``assigned``: whether w_assign holds a row; ``claimed``: w_resale_rec). Without an
    accepted assignment the table is empty, made so directly: most placements have none,
    and planning _EXPECTED_SQL costs more than a small export's whole pass
    (bench/verify_small.py); and only when _MISMATCH_SQL reads it (some record claims
    an entry): ``resale_at`` answers [] without an assignment."""
    if assigned:
        con.execute(_EXPECTED_SQL)
    elif claimed:
        con.execute(_EMPTY_SQL)


def resale_at(con: Any, chain_index: int, assigned: bool = True) -> list[dict[str, Any]]:
    """The recomputed resale list at one index, in chain order (empty: none; and so
    without reading w_resale_exp when no assignment was accepted, ``assigned`` False)."""
    if not assigned:
        return []
    rows = con.execute(
        "SELECT assignment_id, new_buyer, d, b, g, f FROM w_resale_exp "
        "WHERE chain_index = ? ORDER BY ord",
        [chain_index],
    ).fetchall()
    return [
        dict(zip(RESALE_FIELDS, (r[0], r[1], *(int(v) for v in r[2:])), strict=True)) for r in rows
    ]


def _entry(values: tuple[Any, ...]) -> str:
    if values[0] is None:
        return "no entry"
    assignment_id, buyer, d, b, g, f = values
    return f"{assignment_id} ({buyer}): D {d}, B {b}, G {g}, F {f}"


def check_resale(run: Verification, trust: TrustFile) -> None:
    """Compare every record's resale list with SPEC §7.10 and check each new buyer's pin."""
    con = run.con
    run.work.flush()
    any_assigned = "w_assign" in run.work.filled
    any_claimed = "w_resale_rec" in run.work.filled
    compute_resale(con, any_assigned, any_claimed)
    # Neither expected nor claimed entries: the comparison has no row to find.
    rows = con.execute(_MISMATCH_SQL).fetchall() if any_assigned or any_claimed else []
    if rows:
        run.findings.count("RESALE_MISMATCH", len(rows))
    for row in rows[: limits.MAX_MISMATCH_ROWS]:
        index, k = int(row[0]), int(row[1])
        run.findings.add(
            Step.OBLIGATION,
            "RESALE_MISMATCH",
            f"ledger_records[{index}].resale[{k}]",
            _entry(tuple(row[2:8])),
            _entry(tuple(row[8:14])),
            "the resale entry differs from SPEC §7.10 recomputed from the envelopes",
            counted=True,
        )
    for assigned in run.referee.assignments:
        buyer = assigned.new_buyer
        where = f"assignment {assigned.assignment_id} (chain_index {assigned.index})"
        pinned = sorted({k.id for k in trust.keys if k.key == buyer.key and k.role == "buyer"})
        if not pinned:
            run.add(
                Step.TERMS,
                "ASSIGNMENT_KEY_NOT_PINNED",
                where,
                "the new buyer's key pinned as a buyer",
                f"{buyer.id} key {key_id(buyer.key)} not pinned as buyer",
                "SPEC §9: an assignment moves money to a new buyer the user must have pinned "
                f"(gridledger trust init ... --new-buyer {buyer.id}=FILE.pub)",
            )
        elif pinned != [buyer.id]:
            run.add(
                Step.TERMS,
                "PARTY_ID_MISMATCH",
                where,
                f"new buyer id {' or '.join(map(repr, pinned))} (pinned in the trust file)",
                f"{buyer.id!r} in the assignment",
                "SPEC §9: each party's id is the id its key is pinned under",
            )
