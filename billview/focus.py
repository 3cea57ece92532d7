"""FinOps FOCUS rows of the invoices (SPEC §11.5): CSV, or Parquet written by DuckDB.

One row per GPU per charge period for GPU time (the usage line's per-GPU parts), one row
per other line; each row names its invoice, so the rows of an invoice sum to its total to
the minor unit. Costs are exact decimal text built from minor units, never floats;
Parquet stores them as DECIMAL(38, 9) (a currency has at most 9 decimals, SPEC §5).
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path
from typing import Final

from billview.invoice import Invoice, InvoiceLine, gpu_hours
from billview.units import iso_utc
from proto.money import format_minor

COLUMNS: Final = (
    "InvoiceId",
    "InvoiceIssuerName",
    "ProviderName",
    "BillingAccountId",
    "BillingCurrency",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "ConsumedQuantity",
    "ConsumedUnit",
    "PricingQuantity",
    "PricingUnit",
    "ListUnitPrice",
    "ResourceId",
    "SkuId",
    "Tags",
)
DECIMAL_COLUMNS: Final = (
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "ConsumedQuantity",
    "PricingQuantity",
    "ListUnitPrice",
)
TIME_COLUMNS: Final = (
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
)
CATEGORY: Final = {
    "usage": "Usage",
    "release": "Usage",
    "resale": "Usage",
    "desk_fee": "Usage",
    "resale_proceeds": "Usage",
    "resale_fee": "Usage",
    "reclaim_credit": "Credit",
    "sla_credit": "Credit",
    "adjustment_credit": "Credit",
    "adjustment_charge": "Adjustment",
    "credit_cap": "Adjustment",
    "tax": "Tax",
}

Row = dict[str, str]


def _time(ms: int) -> str:
    return iso_utc(ms)


def _row(doc: Invoice, line: InvoiceLine, amount_minor: int, **more: str) -> Row:
    cost = format_minor(amount_minor, line.currency_scale)
    head = next(
        (
            c.head
            for c in doc.covers
            if (c.placement_id, c.period) == (line.placement_id, line.period)
        ),
        "",
    )
    tags = {"gridledger/placement": line.placement_id, "gridledger/period": str(line.period),
            "gridledger/statement": head, "gridledger/line": line.kind}  # fmt: skip
    row: Row = {c: "" for c in COLUMNS}
    row.update(
        InvoiceId=doc.number,
        InvoiceIssuerName=doc.payee.id,
        ProviderName=doc.payee.id,
        BillingAccountId=doc.payer.id,
        BillingCurrency=line.currency,
        BillingPeriodStart=_time(doc.billing_period_start_ms),
        BillingPeriodEnd=_time(doc.billing_period_end_ms),
        ChargePeriodStart=_time(line.charge_start_ms),
        ChargePeriodEnd=_time(line.charge_end_ms),
        ChargeCategory=CATEGORY.get(line.kind, "Adjustment"),
        ChargeClass="" if doc.kind == "invoice" else "Correction",
        ChargeDescription=line.description,
        BilledCost=cost,
        EffectiveCost=cost,
        ListCost=cost,
        ContractedCost=cost,
        SkuId=line.sku,
        Tags=json.dumps(tags, sort_keys=True, separators=(",", ":")),
    )
    row.update(more)
    return row


def _price(line: InvoiceLine) -> str:
    """The unit price as a bare decimal (``2.50 / GPU-h`` -> ``2.50``)."""
    return line.unit_price.split(" ", 1)[0]


def focus_rows(docs: list[Invoice]) -> list[Row]:
    """The rows of ``docs``, in document and line order."""
    rows: list[Row] = []
    for doc in docs:
        for line in doc.lines:
            if line.gpus:
                for part in line.gpus:
                    hours = gpu_hours(part.delivered_mgms)
                    rows.append(
                        _row(doc, line, part.amount_minor, ResourceId=part.uuid,
                             ChargeDescription=f"{line.description}: {part.uuid}",
                             ConsumedQuantity=hours, ConsumedUnit="GPU-Hours",
                             PricingQuantity=hours, PricingUnit="GPU-Hours",
                             ListUnitPrice=_price(line))
                    )  # fmt: skip
            elif line.quantity:
                rows.append(
                    _row(doc, line, line.amount_minor, ConsumedQuantity=line.quantity,
                         ConsumedUnit="GPU-Hours", PricingQuantity=line.quantity,
                         PricingUnit="GPU-Hours", ListUnitPrice=_price(line))
                )  # fmt: skip
            else:
                rows.append(_row(doc, line, line.amount_minor))
    return rows


def to_csv(rows: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def write_focus(rows: list[Row], out: Path) -> None:
    """``out`` as CSV (``.csv``) or Parquet (``.parquet``, typed: DECIMAL(38, 9) costs and
    quantities, TIMESTAMP periods in UTC)."""
    text = to_csv(rows)
    if out.suffix == ".csv":
        out.write_text(text, encoding="utf-8")
        return
    import duckdb

    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "focus.csv"
        staged.write_text(text, encoding="utf-8")
        columns = ", ".join(_typed(c) for c in COLUMNS)
        con = duckdb.connect(":memory:")
        try:
            con.execute("SET TimeZone = 'UTC'")
            con.execute(
                f"COPY (SELECT {columns} FROM read_csv(?, all_varchar = true, header = true)) "
                "TO '" + str(out).replace("'", "''") + "' (FORMAT parquet)",
                [str(staged)],
            )
        finally:
            con.close()


def _typed(column: str) -> str:
    if column in DECIMAL_COLUMNS:
        return f'CAST(NULLIF("{column}", \'\') AS DECIMAL(38, 9)) AS "{column}"'
    if column in TIME_COLUMNS:
        return f'CAST("{column}" AS TIMESTAMP) AS "{column}"'
    return f'"{column}"'
