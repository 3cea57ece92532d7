"""The obligation (SPEC §7), recomputed as set-based SQL over tables built from envelopes.

The verifier fills small work tables with values taken from DECODED envelopes (never the
export's convenience columns) and only for inputs its own referee accepted; then DuckDB
computes, for every chain index, the cumulative totals: interval overlaps with the window
and the effective end, sums and products in HUGEINT (``B × rate`` reaches ~2^85), running
totals with window functions. Rounding happens once, on cumulative values, as SPEC §7
says. A rejected input contributes nothing, so it leaves the totals unchanged.

Two stages: ``w_base`` holds D, B, G, R, Q and K per index (none depends on
adjustments); after the adjustments are decided (by the bounds of §7.7, on the terms and
their sums alone: ``verifier/terms_rules.adjustment_bounded``), ``w_totals`` adds Ac, Ah
and everything of §7.6. §7.6 is written once, in SQL (``_settle_sql``): the SQL is the
verifier's independent implementation of SPEC §7 (the ledger's is the Python fold).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final

from proto import limits as proto_limits
from proto.records import PlacementTerms
from verifier.terms_rules import share_total

TOTAL_FIELDS: Final = (
    "delivered_mgms",
    "billable_mgms",
    "gross_minor",
    "reclaim_credit_minor",
    "sla_credit_minor",
    "adjustment_credit_minor",
    "adjustment_charge_minor",
    "credits_minor",
    "net_minor",
    "fee_minor",
    "buyer_owes_minor",
    "operator_receives_minor",
    "desk_receives_minor",
    "release_charge_minor",
)

# SPEC §7.1 "Health from evidence": a sample with one of these XIDs never counts (XID
# table 1, for terms without ``metering``; §5.3 names table 2 in ``proto/xids.py``).
CRITICAL_XIDS: Final = (48, 63, 64, 74, 79, 92, 94, 95)
# w_samples.critical_xid: whether a sample's xids hold any of the terms' table, computed
# as the row is written (a BOOLEAN appends several times faster than a BIGINT[] list per
# sample); so are ``held`` and ``weight_bps`` (§7.1.2: ``verifier/step7_decisions.py``).
CRITICAL_XID_SET: Final = frozenset(CRITICAL_XIDS)

_MGMS_PER_GPU_HOUR: Final = proto_limits.MILLI_GPU_MS_PER_GPU_HOUR
_BPS: Final = proto_limits.MAX_BPS

WORK_TABLES: Final = (
    "CREATE TABLE w_terms(ws BIGINT, we BIGINT, unit_mgms HUGEINT, rate HUGEINT, "
    "share_total HUGEINT, notice_ms BIGINT, interruptible BOOLEAN, min_duration_ms BIGINT, "
    "penalty_bps HUGEINT, sla_target_bps BIGINT, sla_credit_bps HUGEINT, fee_bps HUGEINT, "
    "fee_payer VARCHAR, release_notice_ms BIGINT)",
    "CREATE TABLE w_gpus(uuid VARCHAR, share_milli BIGINT)",
    "CREATE TABLE w_usage(chain_index BIGINT, node_id VARCHAR, seq BIGINT, "
    "record_hash VARCHAR, start_ms BIGINT, end_ms BIGINT)",
    "CREATE TABLE w_samples(chain_index BIGINT, uuid VARCHAR, allocated BOOLEAN, healthy BOOLEAN, "
    "power_mw BIGINT, critical_xid BOOLEAN, ecc_uncorrectable BIGINT, retired_pages BIGINT, "
    "present BOOLEAN, held BOOLEAN, weight_bps BIGINT, allocation_unknown BOOLEAN)",
    "CREATE TABLE w_reclaim(chain_index BIGINT, notice_from_ms BIGINT, effective_at_ms BIGINT, "
    "arrived_ms BIGINT)",
    "CREATE TABLE w_adjust(chain_index BIGINT, adjustment_id VARCHAR, direction VARCHAR, "
    "amount_minor BIGINT, accepted BOOLEAN)",
    "CREATE TABLE w_close(chain_index BIGINT)",
    # SPEC §6.8, §7.10: accepted assignments (ord: their rank in chain order), their GPUs,
    # and the resale entries each LedgerRecord claims.
    "CREATE TABLE w_assign(chain_index BIGINT, ord BIGINT, assignment_id VARCHAR, "
    "new_buyer VARCHAR, h_ms BIGINT, rate HUGEINT)",
    "CREATE TABLE w_assign_gpus(ord BIGINT, uuid VARCHAR)",
    "CREATE TABLE w_resale_rec(chain_index BIGINT, ord BIGINT, assignment_id VARCHAR, "
    "new_buyer VARCHAR, d BIGINT, b BIGINT, g BIGINT, f BIGINT)",
    # SPEC §6.7: the accepted release: its arrival a, its end e, the effective end before it.
    "CREATE TABLE w_release(chain_index BIGINT, arrived_ms BIGINT, end_ms BIGINT, "
    "end_before_ms BIGINT)",
    "CREATE TABLE w_records(chain_index BIGINT, record_hash VARCHAR, event_delivered_mgms BIGINT, "
    + ", ".join(f"{name} BIGINT" for name in TOTAL_FIELDS)
    + ")",
)


def create_work_tables(con: Any, skip: Collection[str] = (), only: Collection[str] = ()) -> None:
    """Create the (empty) work tables in the verifier's database (one call: a small
    export's checklist pays per statement): every one but ``skip``, or those in ``only``
    (a checklist whose pricing may be deferred makes the HELD_TABLES only when it is not)."""
    chosen = [
        statement
        for statement in WORK_TABLES
        if (name := _table_of(statement)) not in skip and (not only or name in only)
    ]
    if chosen:
        con.execute("; ".join(chosen))


def _table_of(statement: str) -> str:
    """The table a statement of WORK_TABLES creates."""
    return statement.split()[2].split("(")[0]


def terms_row(terms: PlacementTerms) -> tuple[Any, ...]:
    """The row of ``w_terms``: the pricing parameters of the accepted terms."""
    return (
        terms.window_start_ms,
        terms.window_end_ms,
        terms.increment_ms * 1000,
        terms.rate_per_gpu_hour_minor,
        share_total(terms),
        terms.reclaim_notice_ms,
        terms.interruptible,
        terms.minimum_duration_ms,
        terms.reclaim_penalty_bps,
        terms.sla_availability_target_bps,
        terms.sla_credit_bps,
        terms.desk_fee_bps,
        terms.fee_payer,
        terms.release_notice_ms,
    )


def gpu_rows(terms: PlacementTerms) -> list[tuple[Any, ...]]:
    """The rows of ``w_gpus``: each GPU's share."""
    return [(g.uuid, g.share_milli) for g in terms.gpus]


def load_terms(con: Any, terms: PlacementTerms) -> None:
    """The pricing parameters of the accepted terms, and each GPU's share."""
    con.execute(
        "INSERT INTO w_terms VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        list(terms_row(terms)),
    )
    appender = con.appender("w_gpus")
    appender.append_rows(gpu_rows(terms))
    appender.flush()


# SPEC §7.1 health from evidence, whatever the flag, per sample of an accepted event;
# retired pages: growth over the highest count of the stream's earlier accepted samples of
# that GPU (not at seq 0). Also read by the bill (``verifier/bill.py``).
def _health_sql(keyed: bool) -> str:
    """HEALTH_SQL; ``keyed``: over a batch's tables, each row's export key ``ek`` first and
    kept apart (``verify_exports``)."""
    ek, by, using = ("s.ek, ", "s.ek, ", "ek, ") if keyed else ("", "", "")
    return f"""
    SELECT {ek}s.chain_index, s.uuid, s.allocated AND s.held AS allocated, s.weight_bps,
           s.allocation_unknown,
           s.allocated AND s.held AND s.healthy AND s.present AND s.power_mw > 0
           AND s.ecc_uncorrectable = 0
           AND NOT s.critical_xid
           AND (u.seq = 0 OR s.retired_pages <= COALESCE(MAX(s.retired_pages) OVER (
                    PARTITION BY {by}u.node_id, s.uuid ORDER BY s.chain_index
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)) AS counts
    FROM w_samples s JOIN w_usage u USING ({using}chain_index)
"""


HEALTH_SQL: Final = _health_sql(False)


def _index_sql(keyed: bool) -> str:
    """The index set: every chain index with a ledger record, plus every adjustment."""
    ek = "ek, " if keyed else ""
    return (
        f"SELECT {ek}chain_index FROM w_records UNION SELECT {ek}chain_index FROM w_adjust "
        f"UNION SELECT {ek}chain_index FROM w_usage"
    )


def effective_end_sql(index: str) -> str:
    """SPEC §6.7 step 5, §6.3 reclaim: the placement's effective end in force when the
    input at chain index ``index`` is folded: the window's end, moved by an accepted
    reclaim (its effective time) or an accepted release (its end e) chained before it,
    whichever is earlier. An amendment resets it to its own window's end, but it comes
    before anything is priced (§6.3 terms (3)), so no reclaim or release precedes it.
    Reads the relations ``t`` (w_terms), ``rc`` (the first w_reclaim row, columns
    rc_index, effective_at_ms) and ``rl`` (the first w_release row, rl_index, rl_end),
    the last two LEFT JOINed. Both §7.1 (``_base_sql``) and §7.10 (``verifier/resale.py``)
    clip to it, so the two cannot drift apart."""
    return (
        f"LEAST(t.we, CASE WHEN rc.rc_index < {index} THEN rc.effective_at_ms ELSE t.we END, "
        f"CASE WHEN rl.rl_index < {index} THEN rl.rl_end ELSE t.we END)"
    )


def _base_sql(keyed: bool) -> str:
    """SPEC §7.1-§7.3 and §7.5 per chain index. Every product is HUGEINT.

    Written once for both uses: one export's work tables (``keyed`` False), and a batch's
    (``verify_exports``), where every table has the export key ``ek`` as its first column
    and every single-row relation of one export (t, rc, cl, rl, q) is one row per key,
    joined on it where the single export joins ``ON TRUE``: each export's rows meet only
    its own."""

    def on(left: str, right: str) -> str:
        return f"{left}.ek = {right}.ek" if keyed else "TRUE"

    def cross(name: str, other: str) -> str:  # "CROSS JOIN t", keyed "JOIN t ON t.ek = o.ek"
        return f"JOIN {name} ON {name}.ek = {other}.ek" if keyed else f"CROSS JOIN {name}"

    def first(table: str, columns: str) -> str:  # each export's lowest chain index
        if keyed:
            return (
                f"SELECT ek, {columns}\n       FROM {table} "
                "QUALIFY row_number() OVER (PARTITION BY ek ORDER BY chain_index) = 1"
            )
        return f"SELECT {columns}\n       FROM {table} ORDER BY chain_index LIMIT 1"

    ek = "ek, " if keyed else ""
    t = "SELECT * FROM w_terms" if keyed else "SELECT * FROM w_terms LIMIT 1"
    cl = (
        "SELECT ek, min(chain_index) AS cl_index FROM w_close GROUP BY ek"
        if keyed
        else "SELECT min(chain_index) AS cl_index FROM w_close"
    )
    rc = first("w_reclaim", "chain_index AS rc_index, notice_from_ms, effective_at_ms")
    rl_columns = (
        "chain_index AS rl_index, arrived_ms AS rl_arrived, end_ms AS rl_end,\n"
        "              end_before_ms AS rl_before"
    )
    rl = first("w_release", rl_columns)
    by_ek = "PARTITION BY i.ek " if keyed else ""
    e_rc_rl = f"LEFT JOIN rc ON {on('rc', 't')} LEFT JOIN rl ON {on('rl', 't')}"
    and_b = " AND b.ek = cl.ek" if keyed else ""
    e_join, t_ek, e_on = ("JOIN", "t.ek, ", " ON e.ek = t.ek") if keyed else ("CROSS JOIN", "", "")
    return f"""
CREATE OR REPLACE TABLE w_base AS
WITH t AS ({t}),
rc AS ({rc}),
cl AS ({cl}),
rl AS ({rl}),
hs AS ({_health_sql(keyed)}),
ev AS (  -- §7.1: share x overlap([start, end), [ws, effective end when folded))
    SELECT {"u.ek, " if keyed else ""}u.chain_index,
           SUM(g.share_milli::HUGEINT * GREATEST(0,
               LEAST(u.end_ms, {effective_end_sql("u.chain_index")})
               - GREATEST(u.start_ms, t.ws)) * s.weight_bps // {_BPS}) AS d_i
    FROM w_usage u
    JOIN hs s ON s.chain_index = u.chain_index AND s.counts{" AND s.ek = u.ek" if keyed else ""}
    JOIN w_gpus g ON g.uuid = s.uuid{" AND g.ek = u.ek" if keyed else ""}
    {cross("t", "u")} LEFT JOIN rc ON {on("rc", "u")} LEFT JOIN rl ON {on("rl", "u")}
    GROUP BY {"u.ek, " if keyed else ""}u.chain_index
),
cum AS (
    SELECT {"i.ek, " if keyed else ""}i.chain_index, COALESCE(ev.d_i, 0)::HUGEINT AS d_i,
           SUM(COALESCE(ev.d_i, 0)::HUGEINT) OVER (
               {by_ek}ORDER BY i.chain_index ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS d
    FROM ({_index_sql(keyed)}) i LEFT JOIN ev USING ({ek}chain_index)
),
billed AS (  -- §7.2
    SELECT {"c.ek, " if keyed else ""}c.chain_index, c.d_i, c.d,
           ((c.d + t.unit_mgms - 1) // t.unit_mgms) * t.unit_mgms AS b,
           (((c.d + t.unit_mgms - 1) // t.unit_mgms) * t.unit_mgms * t.rate)
               // {_MGMS_PER_GPU_HOUR} AS g,
           CASE WHEN rc.rc_index <= c.chain_index THEN  -- §7.3
               (t.share_total
                * (GREATEST(0, t.notice_ms - GREATEST(0, rc.effective_at_ms - rc.notice_from_ms))
                   + CASE WHEN t.interruptible  -- §7.9: taken only up to an earlier release
                          THEN GREATEST(0, LEAST(t.ws + t.min_duration_ms,
                                                 CASE WHEN rl.rl_index < rc.rc_index
                                                      THEN rl.rl_end ELSE t.we END)
                                           - rc.effective_at_ms)
                          ELSE LEAST(t.we, CASE WHEN rl.rl_index < rc.rc_index
                                                THEN rl.rl_end ELSE t.we END)
                               - rc.effective_at_ms END)
                * t.rate * t.penalty_bps) // ({_MGMS_PER_GPU_HOUR}::HUGEINT * {_BPS})
           ELSE 0 END AS r,
           CASE WHEN rl.rl_index <= c.chain_index THEN  -- §7.9 release charge
               (t.share_total
                * GREATEST(0, LEAST(rl.rl_before, GREATEST(t.ws + t.min_duration_ms,
                                                           rl.rl_arrived + t.release_notice_ms))
                              - rl.rl_end)
                * t.rate) // {_MGMS_PER_GPU_HOUR}
           ELSE 0 END AS k
    FROM cum c {cross("t", "c")} LEFT JOIN rc ON {on("rc", "c")} LEFT JOIN rl ON {on("rl", "c")}
),
q AS (  -- §7.5: fixed at the accepted close from D and G there
    SELECT {"cl.ek, " if keyed else ""}cl.cl_index,
           CASE WHEN (CASE WHEN e.span_ms = 0 THEN {_BPS}
                           ELSE ({_BPS} * b.d) // (t.share_total * e.span_ms) END)
                     < t.sla_target_bps
                THEN (b.g * t.sla_credit_bps) // {_BPS} ELSE 0 END AS q
    FROM cl JOIN billed b ON b.chain_index = cl.cl_index{and_b} {cross("t", "cl")}
    {e_join} (SELECT {t_ek}LEAST(CASE WHEN rc.rc_index < cl.cl_index THEN rc.effective_at_ms
                                  ELSE t.we END,
                             CASE WHEN rl.rl_index < cl.cl_index THEN rl.rl_end
                                  ELSE t.we END) - t.ws AS span_ms
                FROM t {cross("cl", "t")} {e_rc_rl}) e{e_on}
)
SELECT {"b.ek, " if keyed else ""}b.chain_index, b.d_i, b.d, b.b, b.g, b.r,
       CASE WHEN q.cl_index <= b.chain_index THEN q.q ELSE 0 END::HUGEINT AS q,
       b.k::HUGEINT AS k
FROM billed b LEFT JOIN q ON {on("q", "b")}
"""


_BASE_SQL: Final = _base_sql(False)


def _settle_sql(adjusted: str, keyed: bool = False) -> str:
    """SPEC §7.6 for the rows of ``adjusted``: (chain_index, d_i, d, b, g, r, q, k, ac, ah)
    (``keyed``: a batch's, each with its export key ``ek`` first: ``_base_sql``)."""
    t = "SELECT * FROM w_terms" if keyed else "SELECT * FROM w_terms LIMIT 1"
    ek = "n.ek, " if keyed else ""
    join = "JOIN t ON t.ek = n.ek" if keyed else "CROSS JOIN t"
    return f"""
WITH t AS ({t}),
adj AS ({adjusted}),
net AS (
    SELECT *, LEAST(r + q + ac, g + ah + k) AS c,  -- §7.9: K beside the gross
           g + ah + k - LEAST(r + q + ac, g + ah + k) AS n FROM adj
)
SELECT {ek}n.chain_index, n.d_i AS event_delivered_mgms,
       n.d AS delivered_mgms, n.b AS billable_mgms, n.g AS gross_minor,
       n.r AS reclaim_credit_minor, n.q AS sla_credit_minor,
       n.ac AS adjustment_credit_minor, n.ah AS adjustment_charge_minor,
       n.c AS credits_minor, n.n AS net_minor,
       (n.n * t.fee_bps) // {_BPS} AS fee_minor,
       CASE WHEN t.fee_payer = 'buyer' THEN n.n + (n.n * t.fee_bps) // {_BPS} ELSE n.n END
           AS buyer_owes_minor,
       CASE WHEN t.fee_payer = 'operator' THEN n.n - (n.n * t.fee_bps) // {_BPS} ELSE n.n END
           AS operator_receives_minor,
       (n.n * t.fee_bps) // {_BPS} AS desk_receives_minor,
       n.k AS release_charge_minor
FROM net n {join}
"""


# SPEC §7.4 (cumulative accepted adjustments) and §7.6 on top of the base, every index.
_TOTALS_SQL: Final = "CREATE OR REPLACE TABLE w_totals AS " + _settle_sql(
    """SELECT b.*,
           SUM(CASE WHEN a.direction = 'credit' THEN a.amount_minor ELSE 0 END::HUGEINT)
               OVER w AS ac,
           SUM(CASE WHEN a.direction = 'charge' THEN a.amount_minor ELSE 0 END::HUGEINT)
               OVER w AS ah
    FROM w_base b LEFT JOIN (SELECT * FROM w_adjust WHERE accepted) a USING (chain_index)
    WINDOW w AS (ORDER BY b.chain_index ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"""
)

# The same when w_adjust holds no row (most placements): Ac and Ah are 0 at every index,
# what the window over no accepted adjustment sums to, without its join and window
# (~1 ms less on a small export; the same values and column types).
_UNADJUSTED: Final = "SELECT b.*, 0::HUGEINT AS ac, 0::HUGEINT AS ah FROM w_base b"
_TOTALS_UNADJUSTED_SQL: Final = "CREATE OR REPLACE TABLE w_totals AS " + _settle_sql(_UNADJUSTED)


def compute_base(con: Any) -> None:
    """Fill ``w_base``: D, B, G, R, Q at every index (SPEC §7.1-§7.3, §7.5)."""
    con.execute(_BASE_SQL)


def compute_totals(con: Any, adjustments: bool = True) -> None:
    """Fill ``w_totals``: every total of SPEC §7.6 at every index (``adjustments``:
    whether w_adjust may hold a row; False only when it holds none)."""
    con.execute(_TOTALS_SQL if adjustments else _TOTALS_UNADJUSTED_SQL)


def totals_at(con: Any, chain_index: int) -> dict[str, int] | None:
    """The recomputed totals at one index, or None when the index has none."""
    names = ", ".join(TOTAL_FIELDS)
    rows = con.execute(
        f"SELECT {names} FROM w_totals WHERE chain_index = ?", [chain_index]
    ).fetchall()
    row = rows[0] if rows else None
    if row is None:
        return None
    return {name: int(value) for name, value in zip(TOTAL_FIELDS, row, strict=True)}


# The columns compared between each LedgerRecord (w_records) and the recomputed totals.
COMPARED: Final = ("event_delivered_mgms", *TOTAL_FIELDS)

# A small export of at most this many ledger_records rows has its records and recomputed
# totals read in one statement and compared in Python (``chain_rows``): there a
# statement's planning costs more than fetching the rows (bench/verify_small.py).
CHAIN_ROWS_MAX: Final = 256


def chain_rows(con: Any) -> list[tuple[Any, ...]]:
    """Every LedgerRecord row joined with the recomputed totals at its index, by chain
    index: (chain_index, record_hash, the record's COMPARED values, the recomputed ones).
    One statement in place of ``record_mismatches``' count and ``step9_obligation``'s
    read at the statements' indices, for an export of few records (``CHAIN_ROWS_MAX``):
    there each statement's planning costs more than fetching every row (~1 ms each)."""
    record = ", ".join(f"r.{c}" for c in COMPARED)
    recomputed = ", ".join(f"t.{c}" for c in COMPARED)
    return list(
        con.execute(
            f"SELECT r.chain_index, r.record_hash, {record}, {recomputed} FROM w_records r "
            "JOIN w_totals t USING (chain_index) ORDER BY r.chain_index"
        ).fetchall()
    )


def mismatches_in(rows: list[tuple[Any, ...]], limit: int) -> list[tuple[str, int, int, int, int]]:
    """``record_mismatches`` over ``chain_rows``' rows: the same tuples in the same order
    (per column in COMPARED order; each column's mismatching rows by chain index, the
    first ``limit``). ``!=`` on ints and None is SQL's IS DISTINCT FROM."""
    n = len(COMPARED)
    if all(row[2 : 2 + n] == row[2 + n :] for row in rows):
        return []
    out: list[tuple[str, int, int, int, int]] = []
    for k, column in enumerate(COMPARED):
        bad = [row for row in rows if row[2 + k] != row[2 + n + k]]
        for row in bad[: max(int(limit), 0)]:
            out.append((column, len(bad), int(row[0]), int(row[2 + n + k]), int(row[2 + k])))
    return out


def record_mismatches(con: Any, limit: int) -> list[tuple[str, int, int, int, int]]:
    """Per compared column: (column, mismatching rows, first index, expected, actual).

    Compares every LedgerRecord's event ``delivered_mgms`` and totals (decoded from its
    envelope) with the recomputed ones; at most ``limit`` examples per column.
    """
    columns = COMPARED
    join = " FROM w_records r JOIN w_totals t USING (chain_index)"
    # First whether any row differs at all (one count: ~0.8 ms less planning than the
    # per-column counts on a small export, where an honest one has none to count).
    rows = con.execute(
        "SELECT count(*)"
        + join
        + " WHERE "
        + " OR ".join(f"r.{c} IS DISTINCT FROM t.{c}" for c in columns)
    ).fetchall()
    if not rows[0][0]:
        return []
    # Every column's count in one statement: on a small export each statement's planning
    # costs more than its rows (bench/verify_small.py).
    counts = con.execute(
        "SELECT "
        + ", ".join(f"count(*) FILTER (WHERE r.{c} IS DISTINCT FROM t.{c})" for c in columns)
        + join
    ).fetchall()[0]
    out: list[tuple[str, int, int, int, int]] = []
    for column, count in zip(columns, counts, strict=True):
        if not count:
            continue
        rows = con.execute(
            f"SELECT r.chain_index, t.{column}, r.{column} FROM w_records r "
            f"JOIN w_totals t USING (chain_index) WHERE r.{column} IS DISTINCT FROM t.{column} "
            f"ORDER BY r.chain_index LIMIT {int(limit)}"
        ).fetchall()
        for index, expected, actual in rows:
            out.append((column, int(count), int(index), int(expected), int(actual)))
    return out


# ---- a batch of small exports priced in one pass (``verify_exports``) --------------------

# The work tables the obligation's SQL reads without adjustments (w_adjust stays empty: an
# export with one is priced on its own).
BATCH_TABLES: Final = (
    "w_terms",
    "w_gpus",
    "w_usage",
    "w_samples",
    "w_reclaim",
    "w_adjust",
    "w_close",
    "w_release",
    "w_records",
)

# What a checklist whose pricing may be deferred holds back (``WorkTables.keeping``): the
# tables only the obligation's SQL reads (w_terms, w_gpus: ``load_terms``), written when
# it is not deferred after all (``step9_obligation.price_base``). w_usage is also read by
# the referee's re-delivery lookup (``WorkTables.usage_record_hash``), which reads its
# kept rows while it is held.
HELD_TABLES: Final = frozenset(
    {
        "w_terms",
        "w_gpus",
        "w_usage",
        "w_samples",
        "w_reclaim",
        "w_close",
        "w_release",
        "w_records",
    }
)

# The same tables with the export key ``ek`` as their first column.
_BATCH_DDL: Final = "; ".join(
    statement.replace("CREATE TABLE", "CREATE OR REPLACE TABLE", 1).replace("(", "(ek BIGINT, ", 1)
    for statement in WORK_TABLES
    if _table_of(statement) in BATCH_TABLES
)
_BATCH_DROP: Final = "; ".join(
    f"DROP TABLE IF EXISTS {table}" for table in (*BATCH_TABLES, "w_base", "w_totals")
)
_BATCH_BASE_SQL: Final = _base_sql(True)
_BATCH_TOTALS_SQL: Final = "CREATE OR REPLACE TABLE w_totals AS " + _settle_sql(
    _UNADJUSTED, keyed=True
)
# The exports of the batch whose recomputed totals differ from a LedgerRecord's (or have
# none at its index): what ``check_records`` would find something in.
_BATCH_MISMATCH_SQL: Final = (
    "SELECT DISTINCT r.ek FROM w_records r LEFT JOIN w_totals t USING (ek, chain_index) "
    "WHERE " + " OR ".join(f"r.{c} IS DISTINCT FROM t.{c}" for c in COMPARED)
)


@dataclass
class DeferredPricing:
    """One small export's pricing, deferred to its batch (``verify_exports``): the rows of
    its work tables as the checklist wrote them (``BATCH_TABLES``). ``rows`` stays None
    when step (9) priced the export on its own after all (``step9_obligation.price_base``
    says when it may defer)."""

    rows: dict[str, list[tuple[Any, ...]]] | None = None


def batch_mismatches(con: Any, batch: list[DeferredPricing]) -> set[int]:
    """The positions in ``batch`` whose LedgerRecords differ from SPEC §7 recomputed: the
    obligation's own SQL (``_base_sql``, ``_settle_sql``) over every export's rows at once
    on ``con``, a database holding nothing else, each row keyed by its export's position.
    Raises duckdb.Error (the caller then prices each export on its own)."""
    con.execute(_BATCH_DDL)
    try:
        for table in BATCH_TABLES:
            rows = [
                (ek, *row)
                for ek, item in enumerate(batch)
                for row in (item.rows or {}).get(table, ())
            ]
            if rows:
                appender = con.appender(table)
                appender.append_rows(rows)
                appender.flush()
                del appender
        con.execute(_BATCH_BASE_SQL)
        con.execute(_BATCH_TOTALS_SQL)
        return {int(row[0]) for row in con.execute(_BATCH_MISMATCH_SQL).fetchall()}
    finally:
        con.execute(_BATCH_DROP)
