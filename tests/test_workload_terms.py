"""SPEC §5.1 workload and delivery terms, §5.2 data residency: the objects on the wire (absent
when not agreed, so old terms keep their bytes), the rules W1-W4, R1, R3 in both
implementations (``proto.terms`` for ledger and CLI, ``verifier/terms_rules.py`` for the
verifier), the CLI (`terms sign` refuses in one line naming the node and its region,
`terms show` prints the rows), the bill's terms summary, and ``proto/vectors/residency.json``
replayed by a fresh fold and by the verifier's rules."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billview.build import terms_summary
from devtools import builders as b
from gridledger.cli import main
from ledger.fold import Fold
from proto import limits
from proto.canonical import decode_payload, signed_bytes
from proto.envelope import open_envelope
from proto.errors import ProtoError
from proto.reasons import Reason
from proto.records import Delivery, NodeSpec, PlacementTerms, Residency, Workload
from proto.terms import load_terms_file, validate_terms
from tests.test_cli_keys_terms import write_terms
from tests.test_verifier_terms import terms_strategy
from verifier.terms_rules import broken_rules

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "proto" / "vectors"
WS = 1_796_083_200_000  # 2026-12-01T00:00:00Z
HOUR = 3_600_000

WORKLOAD = Workload(
    workload_class="inference",
    runtime="oci:llm-serve:1.4",
    isolation="mig",
    data_access="read-only weights",
)
DELIVERY = Delivery(
    operator_of_record="op-1 GmbH",
    support_contact="noc@op-1.example",
    support_hours="24x7",
    acceptance=["ssh access", "MIG slices visible"],
    on_reclaim="checkpoint",
)
RESIDENCY = Residency(allowed_regions=["eu:de"], jurisdictions=["EU"])


def _terms(
    regions: dict[str, str] | None = None, shares: tuple[int, ...] = (500, 250), **changes: Any
) -> PlacementTerms:
    cast = b.make_cast("workload-terms")
    regions = regions if regions is not None else {"node-a": "eu:de"}
    nodes = [
        NodeSpec(node_id=n, key=cast.node_key(n).public_key, region=r, fabric="nvlink")
        for n, r in sorted(regions.items())
    ]
    gpus = [b.gpu("node-a", i, share_milli=s) for i, s in enumerate(shares)]
    fields: dict[str, Any] = {
        "workload": WORKLOAD,
        "delivery": DELIVERY,
        "residency": RESIDENCY,
        "nodes": nodes,
    }
    fields.update(changes)
    return b.make_terms(cast, "pl-wl", gpus, WS, WS + HOUR, **fields)


def _rules(terms: PlacementTerms) -> tuple[list[str], list[str]]:
    return validate_terms(terms), broken_rules(terms)


# ---- the wire ------------------------------------------------------------------------


def test_terms_without_the_new_objects_keep_their_bytes_and_hash() -> None:
    """records.json was generated before §5.1-§5.2: its terms decode to the same bytes,
    read as "not agreed", and are valid under both implementations."""
    data = json.loads((VECTORS / "records.json").read_text())
    (terms_vector,) = [r for r in data["records"] if r["kind"] == "terms"]
    envelope = terms_vector["envelope_utf8"].encode("utf-8")
    opened = open_envelope(envelope)
    assert isinstance(opened.record, PlacementTerms)
    assert opened.record.workload is None and opened.record.delivery is None
    assert opened.record.residency is None
    assert signed_bytes(opened.record) == opened.payload
    assert opened.record_hash == terms_vector["record_hash"]
    for field in (b'"workload"', b'"delivery"', b'"residency"'):
        assert field not in opened.payload
    assert _rules(opened.record) == ([], [])


def test_the_objects_round_trip_and_class_is_the_wire_name() -> None:
    terms = _terms()
    raw = signed_bytes(terms)
    assert b'"workload":{"class":"inference"' in raw
    assert b'"jurisdictions":["EU"]' in raw
    assert decode_payload(raw) == terms
    # jurisdictions is optional inside residency: omitted when empty
    bare = _terms(residency=Residency(allowed_regions=["eu:de"]))
    assert b"jurisdictions" not in signed_bytes(bare)


def _body(terms: PlacementTerms) -> dict[str, Any]:
    _prefix, _, body = signed_bytes(terms).partition(b"\n")
    return dict(json.loads(body))


def _encode(body: dict[str, Any]) -> bytes:
    return b"gridledger/terms/v1\n" + json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda d: d.update(workload=None), Reason.MALFORMED),
        (lambda d: d.update(residency=None), Reason.MALFORMED),
        (lambda d: d["residency"].update(jurisdictions=[]), Reason.NON_CANONICAL),
        (lambda d: d["workload"].update(gpu_kind="x"), Reason.UNKNOWN_FIELD),
        (lambda d: d["workload"].pop("runtime"), Reason.MALFORMED),
        (lambda d: d["workload"].update({"class": "mining"}), Reason.MALFORMED),
        (lambda d: d["delivery"].update(on_reclaim="pause"), Reason.MALFORMED),
        (lambda d: d["delivery"].update(operator_of_record=""), Reason.OUT_OF_RANGE),
        (lambda d: d["residency"].update(allowed_regions=[]), Reason.OUT_OF_RANGE),
        (lambda d: d["residency"].update(allowed_regions=[""]), Reason.OUT_OF_RANGE),
        (
            lambda d: d["workload"].update(runtime="x" * (limits.MAX_TEXT_CHARS + 1)),
            Reason.OUT_OF_RANGE,
        ),
    ],
)
def test_bad_objects_are_refused_at_decoding_with_a_named_reason(edit: Any, reason: Reason) -> None:
    body = _body(_terms())
    edit(body)
    with pytest.raises(ProtoError) as caught:
        decode_payload(_encode(body))
    assert caught.value.reason == reason


def test_list_bounds_at_the_limit_decode_one_more_is_out_of_range() -> None:
    cases = [
        ("delivery", "acceptance", limits.MAX_ACCEPTANCE_ITEMS),
        ("residency", "allowed_regions", limits.MAX_REGIONS),
        ("residency", "jurisdictions", limits.MAX_JURISDICTIONS),
    ]
    for obj, field, bound in cases:
        body = _body(_terms())
        items = [f"e{i}" for i in range(bound)]
        if field == "allowed_regions":
            items[0] = "eu:de"  # keep R1 satisfied
        body[obj][field] = items
        terms = decode_payload(_encode(body))
        assert isinstance(terms, PlacementTerms)
        assert _rules(terms) == ([], [])
        body[obj][field] = [*items, "one-more"]
        with pytest.raises(ProtoError) as caught:
            decode_payload(_encode(body))
        assert caught.value.reason == Reason.OUT_OF_RANGE, (obj, field)


# ---- the rules, in both implementations -------------------------------------------------


RULE_CASES: dict[str, tuple[PlacementTerms, str | None]] = {
    "valid": (_terms(), None),
    "W1 dedicated with a slice": (
        _terms(
            shares=(1000, 500), workload=msgspec.structs.replace(WORKLOAD, isolation="dedicated")
        ),
        "W1",
    ),
    "dedicated, whole GPUs": (
        _terms(
            shares=(1000, 1000), workload=msgspec.structs.replace(WORKLOAD, isolation="dedicated")
        ),
        None,
    ),
    "W2 checkpoint, no notice": (_terms(reclaim_notice_ms=0), "W2"),
    "W2 drain, no notice": (
        _terms(reclaim_notice_ms=0, delivery=msgspec.structs.replace(DELIVERY, on_reclaim="drain")),
        "W2",
    ),
    "drain, 1 ms notice": (
        _terms(reclaim_notice_ms=1, delivery=msgspec.structs.replace(DELIVERY, on_reclaim="drain")),
        None,
    ),
    "terminate, no notice": (
        _terms(
            reclaim_notice_ms=0, delivery=msgspec.structs.replace(DELIVERY, on_reclaim="terminate")
        ),
        None,
    ),
    "W3 mig with a whole GPU": (_terms(shares=(999, 1000)), "W3"),
    "mig at 999": (_terms(shares=(999, 1)), None),
    "shared with a whole GPU": (
        _terms(shares=(1000, 1), workload=msgspec.structs.replace(WORKLOAD, isolation="shared")),
        None,
    ),
    "W4 acceptance twice": (
        _terms(delivery=msgspec.structs.replace(DELIVERY, acceptance=["a", "b", "a"])),
        "W4",
    ),
    "R1 GPU node outside": (_terms(regions={"node-a": "us:east"}), "R1"),
    "R1 region differs only in case": (_terms(regions={"node-a": "EU:DE"}), "R1"),
    "gateway node outside, no GPUs": (_terms(regions={"node-a": "eu:de", "gw": "us:east"}), None),
    "R3 region twice": (_terms(residency=Residency(allowed_regions=["eu:de", "eu:de"])), "R3"),
    "R3 jurisdiction twice": (
        _terms(residency=Residency(allowed_regions=["eu:de"], jurisdictions=["EU", "EU"])),
        "R3",
    ),
    "only residency": (_terms(workload=None, delivery=None), None),
    "no residency, any region": (_terms(regions={"node-a": "us:east"}, residency=None), None),
}


@pytest.mark.parametrize("name", list(RULE_CASES))
def test_each_rule_gets_the_same_verdict_from_ledger_and_verifier(name: str) -> None:
    terms, rule = RULE_CASES[name]
    ledger_says, verifier_says = _rules(terms)
    if rule is None:
        assert ledger_says == [] and verifier_says == []
    else:
        assert any(p.startswith(f"{rule}:") for p in ledger_says), ledger_says
        assert any(f" {rule}:" in p for p in verifier_says), verifier_says


def test_r1_names_the_node_and_its_region() -> None:
    problems = validate_terms(_terms(regions={"node-a": "us:east"}))
    assert problems == [
        "R1: node node-a carries GPUs in region 'us:east', outside the allowed regions eu:de"
    ]


@st.composite
def placement_terms(draw: Any) -> PlacementTerms:
    base = draw(terms_strategy())
    regions = ["eu:de", "eu:fr", "us:east"]
    nodes = [msgspec.structs.replace(n, region=draw(st.sampled_from(regions))) for n in base.nodes]
    workload = draw(
        st.none()
        | st.builds(
            Workload,
            workload_class=st.sampled_from(["inference", "training", "reseller", "burst", "batch"]),
            runtime=st.just("r"),
            isolation=st.sampled_from(["shared", "mig", "dedicated"]),
            data_access=st.just(""),
        )
    )
    delivery = draw(
        st.none()
        | st.builds(
            Delivery,
            operator_of_record=st.just("op"),
            support_contact=st.just(""),
            support_hours=st.just(""),
            acceptance=st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
            on_reclaim=st.sampled_from(["checkpoint", "drain", "terminate"]),
        )
    )
    residency = draw(
        st.none()
        | st.builds(
            Residency,
            allowed_regions=st.lists(st.sampled_from(regions), min_size=1, max_size=3),
            jurisdictions=st.lists(st.sampled_from(["EU", "DE"]), max_size=2),
        )
    )
    # shares at the edges W1 and W3 look at
    gpus = [
        msgspec.structs.replace(g, share_milli=draw(st.sampled_from([1, 500, 999, 1000])))
        for g in base.gpus
    ]
    return msgspec.structs.replace(
        base, nodes=nodes, gpus=gpus, workload=workload, delivery=delivery, residency=residency
    )


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(placement_terms())
def test_ledger_and_verifier_agree_on_generated_placement_terms(terms: PlacementTerms) -> None:
    ledger_says, verifier_says = _rules(terms)
    assert bool(ledger_says) == bool(verifier_says), (ledger_says, verifier_says)
    # rule by rule, for the new rules
    for rule in ("W1", "W2", "W3", "W4", "R1", "R3"):
        assert any(p.startswith(f"{rule}:") for p in ledger_says) == any(
            f" {rule}:" in p for p in verifier_says
        ), (rule, ledger_says, verifier_says)


# ---- the fold, from the vectors ----------------------------------------------------------


def test_residency_vectors_are_reproduced_by_a_fold_and_by_the_verifiers_rules() -> None:
    data = json.loads((VECTORS / "residency.json").read_text())
    cast = b.make_cast("gridledger/vectors")
    assert base64.b64decode(data["ledger_public_key"]) == cast.ledger.public_key
    reasons = set()
    for case in data["terms"]:
        raw = base64.b64decode(case["envelope_b64"])
        (outcome,) = Fold(cast.ledger).apply(raw, "terms:0", None, WS)
        assert (outcome.status, outcome.reason) == (case["status"], case["reason"]), case["name"]
        terms = open_envelope(raw).record
        assert isinstance(terms, PlacementTerms)
        # the verifier's own transcription gives the same verdict
        assert bool(broken_rules(terms)) == (case["reason"] == "TERMS_INVALID"), case["name"]
        reasons.add(case["reason"])
    assert reasons == {None, "TERMS_INVALID"}
    fold = Fold(cast.ledger)
    seen = []
    for i, step in enumerate(data["steps"]):
        raw = base64.b64decode(step["envelope_b64"])
        outcomes = fold.apply(raw, f"residency:{i}", None, step["arrived_ms"])
        got = [
            (o.decision, o.status, None if o.reason is None else o.reason.value, o.record_hash)
            for o in outcomes
        ]
        want = [
            (o["decision"], o["status"], o["reason"], o["record_hash"]) for o in step["outcomes"]
        ]
        assert got == want, step["note"]
        seen += [o["reason"] for o in step["outcomes"]]
    assert seen.count("RESIDENCY") == 3 and "TERMS_INVALID" in seen and "SEQ_GAP" not in seen
    head = fold.head("pl-residency")
    assert head == (data["records"], data["head"])
    totals = fold.totals("pl-residency")
    assert totals is not None and msgspec.structs.asdict(totals) == data["totals"]
    # by hand: node-a's two slices (500 + 250) for 10 + 30 minutes, at 250 per GPU-hour
    assert data["totals"]["delivered_mgms"] == 750 * 40 * 60_000
    assert data["totals"]["gross_minor"] == 750 * 40 * 60_000 * 250 // 3_600_000_000 == 125


# ---- the CLI and the bill ---------------------------------------------------------------

PLACEMENT_TOML = """
[workload]
class = "inference"
runtime = "oci:llm-serve:1.4 (containerd)"
isolation = "shared"
data_access = "prompts stay in eu"

[delivery]
operator_of_record = "op-1 GmbH"
support_contact = "noc@op-1.example"
support_hours = "24x7"
acceptance = ["ssh access for buyer-1", "nvidia-smi lists the GPUs"]
on_reclaim = "checkpoint"

[residency]
allowed_regions = ["{region}"]
jurisdictions = ["EU"]
"""


def _placement_toml(workdir: Path, region: str) -> Path:
    path = write_terms(workdir)
    path.write_text(path.read_text() + PLACEMENT_TOML.replace("{region}", region))
    return path


def test_cli_signs_and_shows_workload_delivery_and_residency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("operator-1", "buyer-1", "desk-1", "ledger-1", "node-a"):
        assert main(["keys", "new", "--id", name, "--out", str(tmp_path / "keys")]) == 0
    toml = _placement_toml(tmp_path, "eu-west-1")
    keys = tmp_path / "keys"
    for role in ("operator-1", "buyer-1", "desk-1"):
        source = toml if role == "operator-1" else tmp_path / "terms.signed.json"
        assert main(["terms", "sign", str(source), "--key", str(keys / f"{role}.key")]) == 0
    capsys.readouterr()
    assert main(["terms", "show", str(tmp_path / "terms.signed.json")]) == 0
    out = capsys.readouterr().out
    for line in (
        "workload           inference, shared isolation",
        "runtime            oci:llm-serve:1.4 (containerd)",
        "operator of record op-1 GmbH",
        "support            noc@op-1.example, 24x7",
        "acceptance 2       nvidia-smi lists the GPUs",
        "on reclaim         checkpoint",
        "residency          regions eu-west-1",
        "jurisdictions      EU",
    ):
        assert line in out.splitlines(), line
    terms, envelope = load_terms_file(tmp_path / "terms.signed.json")
    assert envelope is not None and terms.residency == Residency(["eu-west-1"], ["EU"])


def test_cli_sign_refuses_a_node_outside_the_residency_in_one_line(tmp_path: Path) -> None:
    for name in ("operator-1", "buyer-1", "desk-1", "ledger-1", "node-a"):
        assert main(["keys", "new", "--id", name, "--out", str(tmp_path / "keys")]) == 0
    toml = _placement_toml(tmp_path, "eu:de")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gridledger",
            "terms",
            "sign",
            str(toml),
            "--key",
            str(tmp_path / "keys" / "buyer-1.key"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "node node-a" in lines[0] and "'eu-west-1'" in lines[0] and "R1" in lines[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "terms.signed.json").exists()


def test_cli_names_a_misspelt_key_in_a_workload_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("operator-1", "buyer-1", "desk-1", "ledger-1", "node-a"):
        assert main(["keys", "new", "--id", name, "--out", str(tmp_path / "keys")]) == 0
    toml = _placement_toml(tmp_path, "eu-west-1")
    toml.write_text(toml.read_text().replace('isolation = "shared"', 'isolaton = "shared"'))
    assert main(["terms", "show", str(toml)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any("unknown key workload.isolaton (did you mean isolation?)" in e for e in err), err
    assert any("missing key workload.isolation" in e for e in err), err


def test_the_bill_summary_shows_the_rows_and_old_terms_show_what_they_always_did() -> None:
    rows = dict(terms_summary(_terms()))
    assert rows["workload"] == "inference, mig isolation"
    assert rows["residency"] == "regions eu:de"
    assert rows["acceptance 1"] == "ssh access"
    old = terms_summary(_terms(workload=None, delivery=None, residency=None))
    assert [label for label, _ in old][-1] == "terms version"
    # signed free text cannot forge a line of `terms show`
    sneaky = _terms(
        workload=msgspec.structs.replace(WORKLOAD, runtime="x\nOK: fully signed by operator")
    )
    shown = dict(terms_summary(sneaky))["runtime"]
    assert "\n" not in shown and shown == "x\\nOK: fully signed by operator"


def test_the_demo_placement_carries_workload_and_residency(tmp_path: Path) -> None:
    from gridledger.demo import run_demo

    result = run_demo(tmp_path / "demo")
    assert result.verified
    terms, envelope = load_terms_file(result.workdir / "terms.signed.json")
    assert envelope is not None
    assert terms.workload is not None and terms.workload.workload_class == "inference"
    assert terms.residency is not None and terms.residency.allowed_regions == ["eu:de"]
    assert all(n.region == "eu:de" for n in terms.nodes)
    page = (result.workdir / "statement" / f"{terms.placement_id}.buyer.html").read_text()
    assert "<td>residency</td><td>regions eu:de</td>" in page
    assert "<td>workload</td><td>inference, shared isolation</td>" in page
