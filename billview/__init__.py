"""The bill a person reads: line items, derivations, a delivery timeline, HTML/CSV/JSON.

A pure rendering package shared by the ledger (which renders from its own store) and the
verifier (which renders from what it recomputed itself). It imports nothing of the
project but ``proto/`` (tests/test_layout.py), so the verifier stays independent of the
ledger: each side gathers its own ``BillFacts`` and this package only arranges them.

    facts.py     what a side hands in (terms, statement, reclaim, adjustments, samples)
    timeline.py  per-GPU delivery segments (delivered / unhealthy / unallocated /
                 reclaimed / not reported) and the SVG drawn with matplotlib
    build.py     the line items of SPEC §7, each with the numbers that give it
    render.py    HTML (printable), CSV, JSON and plain text
"""
