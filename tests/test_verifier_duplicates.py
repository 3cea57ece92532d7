"""step7_decisions.duplicate_indices: a chained input whose envelope bytes equal an earlier
one's (by chain_index, then table, then row) is a duplicate — the hash pre-filter must
find exactly what ranking every row by SHA-256 found."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, cast

import duckdb

from verifier.source import ALIAS, INPUT_TABLES, PlainShape
from verifier.step7_decisions import duplicate_indices


def reference(con: Any, tables: list[str]) -> set[int]:
    """The query duplicate_indices ran before (every row hashed and ranked)."""
    union = " UNION ALL ".join(
        f"SELECT chain_index, rowid AS r, '{t}' AS tbl, sha256(envelope) AS h FROM {ALIAS}.{t}"
        for t in tables
    )
    rows = con.execute(
        f"SELECT chain_index FROM (SELECT chain_index, row_number() OVER "
        f"(PARTITION BY h ORDER BY chain_index, tbl, r) AS n FROM ({union})) WHERE n > 1"
    ).fetchall()
    return {int(r[0]) for r in rows}


def make_run(rows: dict[str, list[tuple[int, bytes]]]) -> Any:
    """A run whose source says nothing is plain: duplicate_indices runs its SQL."""
    con = duckdb.connect()
    con.execute(f"ATTACH ':memory:' AS {ALIAS}")
    tables = [t for t in INPUT_TABLES if t.name in rows]
    for table in tables:
        con.execute(f"CREATE TABLE {ALIAS}.{table.name}(chain_index BIGINT, envelope BLOB)")
        con.executemany(
            f"INSERT INTO {ALIAS}.{table.name} VALUES (?, ?)",
            [[i, e] for i, e in rows[table.name]],
        )
    filled = tuple(t for t in tables if rows[t.name]) or tuple(tables[:1])
    return SimpleNamespace(
        con=con,
        source=SimpleNamespace(
            input_tables=tuple(tables),
            filled_input_tables=filled,
            plain_shape=lambda: PlainShape(indices=False, envelopes=False),
        ),
    )


def test_duplicates_within_and_across_tables() -> None:
    names = [t.name for t in INPUT_TABLES][:3]
    a, b, c = names
    rows = {
        a: [(0, b"x"), (1, b"y"), (5, b"x"), (7, b"z"), (7, b"z")],  # 5 and the second 7
        b: [(2, b"y"), (3, b"w"), (4, b"\x00" * 300)],  # 2 repeats a's 1
        c: [(3, b"w"), (6, b"\x00" * 300), (8, b"\x00" * 299)],  # 3 ties: c ranks after b
    }
    run = make_run(rows)
    found = duplicate_indices(cast(Any, run))
    assert found == {2, 3, 5, 6, 7}
    assert found == reference(run.con, [a, b, c])


def test_none_and_random_agree_with_reference() -> None:
    names = [t.name for t in INPUT_TABLES][:4]
    assert duplicate_indices(make_run({names[0]: [(i, bytes([i])) for i in range(50)]})) == set()
    rng = random.Random(15)
    for _ in range(20):
        rows = {
            name: [
                (rng.randrange(40), bytes(rng.randrange(6) for _ in range(3))) for _ in range(30)
            ]
            for name in names
        }
        run = make_run(rows)
        assert duplicate_indices(run) == reference(run.con, names)
