"""SPEC §5, "Terms are valid when all of these hold", written for the verifier from the text.

Deliberately NOT ``proto.terms.validate_terms``: the ledger rejects invalid terms with that
function, and a verifier that called it too would agree with the ledger on any bug in it.
Here the rules are transcribed again, numbered as in the SPEC, with the SPEC's own
constants; tests/test_verifier_terms.py compares both implementations on generated terms.
Rule 6 (``ledger_key`` is the key of the ledger folding the stream) needs the ledger's key
and is applied by the referee (``verifier/decisions.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from proto.records import PlacementTerms

# §5 rule 2: the currencies and their ISO 4217 minor units, as the SPEC lists them.
SPEC_CURRENCIES: Final[Mapping[str, int]] = {
    **dict.fromkeys(("USD", "EUR", "GBP", "CHF", "CAD", "AUD", "SGD", "CNY", "INR"), 2),
    **dict.fromkeys(("JPY", "KRW"), 0),
    **dict.fromkeys(("BHD", "KWD"), 3),
}
MAX_SCALE: Final = 9  # §5 rule 2: currency_scale <= 9
MAX_WINDOW_MS: Final = 31_622_400_000  # §4.1: 366 days
MAX_SAFE: Final = 2**53 - 1  # §5 rule 5


def device_key(uuid: str) -> str:
    """SPEC §5 (3): what names one device, whatever the letter case of its uuid."""
    return uuid.lower()


def spelled(uuid: str) -> str:
    """SPEC §5 (3): a uuid's canonical spelling: lower case but a leading GPU- or MIG-."""
    key = device_key(uuid)
    return key[:4].upper() + key[4:] if key[:4] in ("gpu-", "mig-") else key


def share_total(terms: PlacementTerms) -> int:
    """S: the sum of ``share_milli`` over ``gpus`` (1000 = one whole GPU)."""
    total = 0
    for gpu in terms.gpus:
        total += gpu.share_milli
    return total


def payable_ceiling(terms: PlacementTerms, charge_minor: int = 0) -> int:
    """SPEC §7.7 P(M + Ah), with Ah = ``charge_minor``: the most the buyer can ever owe
    under ``terms`` with those charges. M = floor((S × W + U) × rate / 3 600 000 000)
    bounds the gross and the release charge together, whatever the usage; P adds the
    desk's fee when the buyer pays it."""
    w = terms.window_end_ms - terms.window_start_ms
    m = (share_total(terms) * w + terms.increment_ms * 1000) * terms.rate_per_gpu_hour_minor
    n = m // 3_600_000_000 + charge_minor
    return n + n * terms.desk_fee_bps // 10_000 if terms.fee_payer == "buyer" else n


def adjustment_bounded(terms: PlacementTerms, credit_minor: int, charge_minor: int) -> bool:
    """SPEC §6.3 adjustment, §7.7: an adjustment after which the sums are Ac =
    ``credit_minor`` and Ah = ``charge_minor`` keeps every total of every later record
    within 2^53 - 1 (else ADJUSTMENT_INVALID)."""
    return credit_minor <= MAX_SAFE and payable_ceiling(terms, charge_minor) <= MAX_SAFE


def broken_rules(terms: PlacementTerms) -> list[str]:
    """The §5 rules 1-5 and 7, §5.1 W1-W4 and §5.2 R1, R3 that ``terms`` break, one line
    each (empty: the terms are valid)."""
    broken: list[str] = []
    w = terms.window_end_ms - terms.window_start_ms
    # 1. the window, the minimum duration, the increment
    if not terms.window_end_ms > terms.window_start_ms:
        broken.append("§5.1: window_end_ms is not after window_start_ms")
    if w > MAX_WINDOW_MS:
        broken.append("§5.1: W exceeds MAX_WINDOW_MS")
    if not w >= terms.minimum_duration_ms:
        broken.append("§5.1: W < minimum_duration_ms")
    if not terms.increment_ms <= w:
        broken.append("§5.1: increment_ms > W")
    # 2. the currency and its scale
    minor_units = SPEC_CURRENCIES.get(terms.currency)
    if minor_units is None:
        broken.append(f"§5.2: currency {terms.currency!r} is not one the SPEC lists")
    elif not minor_units <= terms.currency_scale <= MAX_SCALE:
        broken.append(f"§5.2: currency_scale outside {minor_units}..{MAX_SCALE}")
    # 3. unique node ids, unique GPU uuids, every GPU on a listed node
    node_ids = {node.node_id for node in terms.nodes}
    if len(node_ids) != len(terms.nodes):
        broken.append("§5.3: node ids are not unique")
    if len({device_key(gpu.uuid) for gpu in terms.gpus}) != len(terms.gpus):
        broken.append("§5.3: GPU uuids are not unique")
    odd = [gpu.uuid for gpu in terms.gpus if gpu.uuid != spelled(gpu.uuid)]
    if odd:
        broken.append(f"§5.3: GPU uuid {odd[0]!r} is not canonical (want {spelled(odd[0])!r})")
    if any(gpu.node_id not in node_ids for gpu in terms.gpus):
        broken.append("§5.3: a GPU's node_id is not in nodes")
    # 4. three different party ids; four different keys; no node key among them
    if len({terms.operator.id, terms.buyer.id, terms.desk.id}) != 3:
        broken.append("§5.4: operator, buyer and desk ids are not three different ids")
    keys = {terms.operator.key, terms.buyer.key, terms.desk.key, terms.ledger_key}
    if len(keys) != 4:
        broken.append("§5.4: the four keys (three parties and ledger) are not all different")
    if any(node.key in keys for node in terms.nodes):
        broken.append("§5.4: a node key equals a party's or the ledger's key")
    # 5. bounds
    if share_total(terms) * (w + terms.reclaim_notice_ms) + terms.increment_ms * 1000 > MAX_SAFE:
        broken.append("§5.5: S x (W + reclaim_notice_ms) + increment_ms x 1000 > 2^53 - 1")
    elif w > 0 and payable_ceiling(terms) > MAX_SAFE:
        broken.append("§5.5: the payable ceiling P(M) > 2^53 - 1 (§7.7)")
    # 7. the amendment link: version 1 exactly when supersedes is ZERO_HASH
    if (terms.version == 1) != (terms.supersedes == "0" * 64):
        broken.append("§5.7: version is 1 exactly when supersedes is ZERO_HASH")
    broken += _workload_rules(terms)
    broken += _residency_rules(terms)
    return broken


WHOLE_GPU: Final = 1000  # §5: share_milli 1000 is one whole GPU


def _workload_rules(terms: PlacementTerms) -> list[str]:
    """§5.1 W1-W4, from the SPEC's text."""
    broken: list[str] = []
    w, d = terms.workload, terms.delivery
    shares = [gpu.share_milli for gpu in terms.gpus]
    # W1: dedicated isolation -> every GPU whole
    if w is not None and w.isolation == "dedicated" and any(s != WHOLE_GPU for s in shares):
        broken.append("§5.1 W1: isolation dedicated with a GPU share below 1000")
    # W2: checkpoint or drain on reclaim -> some notice
    if d is not None and d.on_reclaim in {"checkpoint", "drain"} and terms.reclaim_notice_ms == 0:
        broken.append("§5.1 W2: on_reclaim checkpoint/drain with reclaim_notice_ms 0")
    # W3: mig isolation -> every GPU a slice
    if w is not None and w.isolation == "mig" and WHOLE_GPU in shares:
        broken.append("§5.1 W3: isolation mig with a whole GPU")
    # W4: no acceptance requirement twice
    if d is not None and len(frozenset(d.acceptance)) < len(d.acceptance):
        broken.append("§5.1 W4: an acceptance requirement repeats")
    # §5.3 M1: no workload identity twice
    m = terms.metering
    if m is not None and len(frozenset(m.holders)) < len(m.holders):
        broken.append("§5.3 M1: a metering holder repeats")
    return broken


def outside_residency(terms: PlacementTerms) -> frozenset[str]:
    """§5.2: the ids of the nodes outside the terms' residency policy (none without one)."""
    if terms.residency is None:
        return frozenset()
    allowed = frozenset(terms.residency.allowed_regions)
    return frozenset(node.node_id for node in terms.nodes if node.region not in allowed)


def _residency_rules(terms: PlacementTerms) -> list[str]:
    """§5.2 R1 and R3, from the SPEC's text."""
    r = terms.residency
    if r is None:
        return []
    broken: list[str] = []
    # R1: a node carrying a GPU of the terms lies inside the policy
    outside = outside_residency(terms)
    for node_id in sorted({gpu.node_id for gpu in terms.gpus} & outside):
        broken.append(f"§5.2 R1: node {node_id} carries GPUs outside the allowed regions")
    # R3: no region, no jurisdiction twice
    if len(frozenset(r.allowed_regions)) < len(r.allowed_regions):
        broken.append("§5.2 R3: an allowed region repeats")
    if len(frozenset(r.jurisdictions)) < len(r.jurisdictions):
        broken.append("§5.2 R3: a jurisdiction repeats")
    return broken
