"""`gridledger demo`: the whole story of one placement, end to end, in under a minute.

1. Operator, buyer and desk each get a key pair; the ledger gets one; two GPU nodes get
   one each; so does a second buyer, to whom the buyer resells (files under
   ``WORKDIR/keys``, private keys 0600).
2. The placement terms are written as readable TOML (``WORKDIR/terms.toml``) and each
   party signs the same canonical bytes separately (``terms.signed.json``); the trust
   file pins every party's key, the second buyer's too.
3. Two node agents meter one hour of simulated GPU time on a simulated clock (an hour
   in seconds): one GPU goes unhealthy for ten minutes; half-way through, the buyer
   resells its two H100s for the rest of the window to the second buyer at a resale
   rate (an assignment, SPEC §6.8, signed apart by the buyer, the new buyer and the desk
   with ``gridledger assign`` and ``gridledger cosign``); the operator issues a reclaim
   notice with less notice than the terms require.
4. The ledger folds every signed event as it arrives (embedded ``local`` transport by
   default, or a real Kafka broker with ``--kafka``), closes the placement once its
   window and late grace have passed, and issues a final signed statement carrying both
   obligations (SPEC §7.10): the original buyer's, net of the resale, and the new
   buyer's.
5. The export (``WORKDIR/exports/<placement>.duckdb``) is verified offline against the
   trust file the parties pinned (``WORKDIR/trust.json``), which writes a statement page
   per party (the new buyer's too) — and then a copy in which one signed usage event
   claims a minute more (signature kept) is shown to fail, with the findings named.

Everything is deterministic except the key pairs, which are fresh for each workdir.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import duckdb
import msgspec

from billview.units import duration
from proto.canonical import signed_bytes
from proto.envelope import encode_envelope, open_envelope, sign_payload
from proto.invariant import invariant, of_type, present
from proto.keys import SigningKey, load_signing_key, write_key_pair
from proto.money import format_gpu_hours, format_minor
from proto.records import PlacementTerms, Statement
from proto.terms import check_terms_signatures, load_terms_file, validate_terms
from proto.trust import TRUST_FORMAT, TrustedKey, TrustFile, dump_trust

if TYPE_CHECKING:
    from ledger.service import KafkaLedgerService, LedgerService
    from meter.clock import SimClock

WINDOW_START_MS: Final = 1_796_083_200_000  # 2026-12-01T00:00:00Z
MINUTE_MS: Final = 60_000
HOUR_MS: Final = 60 * MINUTE_MS
PLACEMENT_ID: Final = "pl-demo-0001"
DEMO_REGION: Final = "eu:de"  # the nodes' region and the placement's residency (SPEC §5.2)
TOPIC: Final = "gridledger.records"
PARTIES: Final = {
    "operator": "acme-gpu-cloud",
    "buyer": "inferco-batch",
    "desk": "gridx-desk",
    "ledger": "gridledger-ledger-1",
}
NODES: Final = ("node-a", "node-b")
UNHEALTHY_GPU: Final = "GPU-node-b-1"
STEP_MS: Final = 5 * MINUTE_MS
TAMPER_LINES_SHOWN: Final = 6
# The reclaim: issued at minute 48, effective at minute 52 (4 minutes' notice; 10 agreed).
RECLAIM_ISSUED_MS: Final = WINDOW_START_MS + 48 * MINUTE_MS
RECLAIM_EFFECTIVE_MS: Final = WINDOW_START_MS + 52 * MINUTE_MS
# The resale (SPEC §6.8): at minute 30 the buyer sells node-a's two H100s, for the rest of
# the window, to a second buyer at 2.20 USD per GPU-hour; it reaches the log at minute 30.
NEW_BUYER: Final = "finetune-labs"
ASSIGNMENT_ID: Final = "resale-0001"
HANDOVER_MS: Final = WINDOW_START_MS + 30 * MINUTE_MS
RESALE_GPUS: Final = ("GPU-node-a-0", "GPU-node-a-1")
RESALE_RATE: Final = "2.20"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `demo` command."""
    demo = sub.add_parser(
        "demo",
        help="run one placement end to end: sign, meter, settle, export, verify, tamper",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--workdir", type=Path, default=Path("demo-out"), help="output directory (default demo-out)"
    )
    demo.add_argument("--kafka", metavar="HOST:PORT", help="use a real Kafka broker")
    demo.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    # The narrative is the demo's output; log lines only for what went wrong, unless asked.
    _LOGGING.update(fmt=args.log_format, level=args.log_level or "warning")
    _quiet_logs()
    try:
        result = run_demo(args.workdir, kafka=args.kafka, out=sys.stdout)
    except DemoError as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, DemoInputError) else 1
    return 0 if result.verified and result.tamper_caught else 1


class DemoError(Exception):
    """The demo could not run (a broker that does not answer, a busy workdir)."""


_NOT_OURS: Final = (
    "not empty and not a demo's workdir (the demo replaces its own only); choose a new or "
    "empty directory"
)


class DemoInputError(DemoError):
    """The demo was given something it cannot use (exit 2): a --workdir that holds
    something else."""


@dataclass(frozen=True)
class DemoResult:
    """What the demo produced, for tests and scripts."""

    workdir: Path
    export: Path
    tampered: Path
    trust: Path
    statement_html: Path  # the original buyer's page
    new_buyer_html: Path  # the new buyer's page (SPEC §7.10)
    assignment: Path  # the resale, as the three parties signed it
    statement: Statement
    verified: bool
    tamper_caught: bool
    tamper_findings: str


# How the demo logs (``_handle``): its --log-format, and its --log-level or warning.
_LOGGING: dict[str, str | None] = {"fmt": None, "level": "warning"}


def _quiet_logs() -> None:
    """The demo's logging, again: a command the demo runs in-process (``main``) sets its
    own, at info, to the stderr of that moment."""
    from gridledger.logs import configure_logging

    configure_logging(_LOGGING["fmt"], _LOGGING["level"])


def _say(out: io.TextIOBase | None, text: str = "") -> None:
    if out is not None:
        print(text, file=out, flush=True)


def run_demo(workdir: Path, *, kafka: str | None = None, out: object = None) -> DemoResult:
    """Run the demo in ``workdir`` (created fresh; an earlier demo there is replaced)."""
    stream = out if isinstance(out, io.TextIOBase) else None
    workdir = workdir.resolve()
    if workdir.exists():
        if not (workdir / ".gridledger-demo").exists() and any(workdir.iterdir()):
            raise DemoInputError(f"--workdir {workdir}: {_NOT_OURS}")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / ".gridledger-demo").write_text("made by gridledger demo\n")
    started = time.perf_counter()

    _say(stream, "== 1. Parties and keys")
    keys = _make_keys(workdir / "keys")
    for role, name in PARTIES.items():
        _say(stream, f"   {role:<8} {name:<22} key id {keys[name].key_id}")
    _say(stream, f"   buyer 2  {NEW_BUYER:<22} key id {keys[NEW_BUYER].key_id}  (buys a resale)")
    for node in NODES:
        _say(stream, f"   node     {node:<22} key id {keys[node].key_id}")

    _say(stream, "\n== 2. Terms, signed by each party apart")
    terms_toml = _write_terms_toml(workdir, keys)
    signed = _sign_apart(terms_toml, workdir / "keys", workdir / "terms.signed.json")
    terms = signed[0]
    _describe_terms(stream, terms)
    _say(stream, f"   signed by operator, buyer and desk -> {signed[1].name}")
    trust_path = _write_trust(workdir, keys, stream, simulation=kafka is not None)
    _say(stream, f"   (it pins {NEW_BUYER} as a buyer too: the verifier checks its signature)")

    _say(stream, "\n== 3. Metering one hour on a simulated clock")
    _say(stream, f"   {UNHEALTHY_GPU} is unhealthy from minute 20 to 30")
    _say(
        stream,
        f"   at minute 30 {PARTIES['buyer']} resells {' and '.join(RESALE_GPUS)} to {NEW_BUYER}",
    )
    _say(stream, "   reclaim notice issued at minute 48, effective at minute 52 (10 agreed)")
    ledger_key = keys[PARTIES["ledger"]]
    transport: _Transport = (
        _LocalTransport(workdir, ledger_key)
        if kafka is None
        else _KafkaTransport(kafka, ledger_key, stream)
    )
    statement = _run_timeline(workdir, keys, terms, signed[1], transport, stream)
    _write_ledger_toml(workdir, kafka, getattr(transport, "settings", None))

    _say(stream, "\n== 4. The statement, per party: the placement's, then the resale's two sides")
    _print_statement(stream, terms, statement)
    if not statement.resale:
        raise DemoError("the ledger did not accept the resale; see the export's rejections")

    _say(stream, "\n== 5. Export, verified offline; the bill a person reads")
    export = workdir / "exports" / f"{PLACEMENT_ID}.duckdb"
    html_dir = workdir / "statement"
    code, text = _verify(export, trust_path, html_dir)
    _say(stream, _indent(text).rstrip("\n"))
    verified = code == 0
    statement_html = html_dir / f"{PLACEMENT_ID}.buyer.html"
    new_buyer_html = html_dir / f"{PLACEMENT_ID}.{NEW_BUYER}.html"
    _say(stream, "   the statement, every line with the numbers behind it (HTML per party):")
    _say(stream, f"   {statement_html}")
    _say(stream, f"   {new_buyer_html}")
    _say(stream, "   (and the operator's and desk's pages, CSV and JSON beside them)\n")

    _say(stream, "== 6. A tampered copy: one signed usage event edited, its signature kept")
    tampered = workdir / "exports" / "tampered" / f"{PLACEMENT_ID}.duckdb"
    what = _tamper(export, tampered)
    _say(stream, f"   changed: {what}")
    tamper_code, tamper_text = _verify(tampered, trust_path, None)
    _say(stream, _indent(_first_lines(tamper_text, TAMPER_LINES_SHOWN)))
    caught = tamper_code == 1
    _say(stream, "   the verifier caught it" if caught else "   NOT CAUGHT")
    _say(stream, f"\ndone in {time.perf_counter() - started:.1f} s; files in {workdir}")
    return DemoResult(
        workdir=workdir,
        export=export,
        tampered=tampered,
        trust=trust_path,
        statement_html=statement_html,
        new_buyer_html=new_buyer_html,
        assignment=workdir / "assignment.signed.json",
        statement=statement,
        verified=verified,
        tamper_caught=caught,
        tamper_findings=tamper_text,
    )


def _write_ledger_toml(workdir: Path, kafka: str | None, settings: object) -> Path:
    """``WORKDIR/ledger.toml``: the demo ledger's settings, so that the ledger commands of
    the README (``ledger statement``, ``list``, ``export``) work on the demo's store from
    inside the workdir once the demo has stopped."""
    from transport.kafka import KafkaSettings

    lines = [
        "# The demo ledger's settings (written by `gridledger demo`); from this directory:",
        f"#   gridledger ledger statement {PLACEMENT_ID}",
        "#   gridledger ledger list",
        f'ledger_id = "{PARTIES["ledger"]}"',
        f'key_file = "keys/{PARTIES["ledger"]}.key"',
        'db = "ledger.duckdb"',
        'http = "off"',
    ]
    if kafka is None or not isinstance(settings, KafkaSettings):
        lines += ['transport = "local"', 'local_dir = "local"']
    else:
        lines += [
            'transport = "kafka"',
            "arrival = \"sender\"  # the demo's topic keeps the simulated senders' times",
            "",
            "[kafka]",
            f'bootstrap = "{settings.bootstrap}"',
            f'topic = "{settings.topic}"',
        ]
    path = workdir / "ledger.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---- 1 and 2: keys and terms ---------------------------------------------------------------


def _make_keys(keys_dir: Path) -> dict[str, SigningKey]:
    keys: dict[str, SigningKey] = {}
    for name in [*PARTIES.values(), NEW_BUYER, *NODES]:
        write_key_pair(SigningKey.generate(name), keys_dir)
        keys[name] = load_signing_key(keys_dir / f"{name}.key")
    return keys


def _gpus() -> list[tuple[str, str, str, int]]:
    """(node, uuid, model, share_milli): two whole H100s and two half A100s (MIG)."""
    return [
        ("node-a", "GPU-node-a-0", "H100-SXM-80GB", 1000),
        ("node-a", "GPU-node-a-1", "H100-SXM-80GB", 1000),
        ("node-b", "GPU-node-b-0", "A100-SXM-80GB", 500),
        ("node-b", UNHEALTHY_GPU, "A100-SXM-80GB", 500),
    ]


def _write_terms_toml(workdir: Path, keys: dict[str, SigningKey]) -> Path:
    lines = [
        "# Placement terms: what operator, buyer and desk agree before the work starts.",
        "# Times are UTC; durations and money are integers (minor units of the currency).",
        f'placement_id = "{PLACEMENT_ID}"',
        "window_start_ms = 2026-12-01T00:00:00Z",
        "window_end_ms = 2026-12-01T01:00:00Z",
        "created_at_ms = 2026-11-30T12:00:00Z",
        'rate_basis = "gpu_hour"',
        "rate_per_gpu_hour_minor = 245        # 2.45 USD per GPU-hour",
        'currency = "USD"',
        "currency_scale = 2",
        "increment_ms = 60000                 # billed by the started minute",
        "minimum_duration_ms = 1800000",
        "desk_fee_bps = 250                   # 2.5 %",
        'fee_payer = "operator"',
        "interruptible = false",
        "reclaim_notice_ms = 600000           # 10 minutes",
        "reclaim_penalty_bps = 10000",
        "sla_availability_target_bps = 9500",
        "sla_credit_bps = 1000",
        "settlement_period_ms = 3600000",
        "late_grace_ms = 300000",
        f'ledger_key = "file:keys/{PARTIES["ledger"]}.pub"',
    ]
    for role in ("operator", "buyer", "desk"):
        name = PARTIES[role]
        lines += ["", f"[{role}]", f'id = "{name}"', f'key = "file:keys/{name}.pub"']
    for node in NODES:
        lines += [
            "",
            "[[nodes]]",
            f'node_id = "{node}"',
            f'key = "file:keys/{node}.pub"',
            f'region = "{DEMO_REGION}"',
            'fabric = "nvlink"',
        ]
    for node, gpu_uuid, model, share in _gpus():
        lines += [
            "",
            "[[gpus]]",
            f'node_id = "{node}"',
            f'uuid = "{gpu_uuid}"',
            f'model = "{model}"',
            f"share_milli = {share}",
            "memory_mib = 81920",
        ]
    lines += [
        "",
        "# What runs, how it is delivered, where the data may go (SPEC §5.1, §5.2).",
        "[workload]",
        'class = "inference"',
        'runtime = "oci:registry.example/llm-serve:1.4 (containerd, CUDA 12.4)"',
        'isolation = "shared"                 # node-b\'s GPUs are time-shared halves',
        'data_access = "read-only model weights; prompts and outputs stay in eu:de"',
        "",
        "[delivery]",
        f'operator_of_record = "{PARTIES["operator"]}"',
        'support_contact = "noc@operator.example"',
        'support_hours = "24x7"',
        'acceptance = ["buyer SSH access to both nodes", "nvidia-smi lists the placed GPUs"]',
        'on_reclaim = "checkpoint"            # the 10 minutes of notice are for this',
        "",
        "[residency]",
        f'allowed_regions = ["{DEMO_REGION}"]',
        'jurisdictions = ["EU"]',
    ]
    path = workdir / "terms.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _sign_apart(toml: Path, keys_dir: Path, out: Path) -> tuple[PlacementTerms, Path]:
    """Each party runs `gridledger terms sign` on its own machine; here, one after another."""
    from gridledger.cli import main

    source = toml
    for role in ("buyer", "operator", "desk"):
        key_file = keys_dir / f"{PARTIES[role]}.key"
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["terms", "sign", str(source), "--key", str(key_file), "--out", str(out)])
        _quiet_logs()
        if code != 0:
            raise DemoError(f"{role} could not sign the terms (exit {code})")
        source = out
    terms, envelope = load_terms_file(out)
    envelope = present(envelope, "envelope of the signed terms")
    invariant(not validate_terms(terms), "the demo's terms are valid")
    invariant(check_terms_signatures(envelope, terms), "all three parties signed the terms")
    return terms, out


def _write_trust(
    workdir: Path, keys: dict[str, SigningKey], stream: io.TextIOBase | None, *, simulation: bool
) -> Path:
    """The parties' trust file. The Kafka run is a simulation (arrival = "sender"): its
    trust file says it admits one, or the verdict could not be FINAL (SPEC §6.6, §9)."""
    trust_path = workdir / "trust.json"
    trust_path.write_bytes(dump_trust(_trust(keys, simulations=simulation)))
    _say(stream, f"   trust file pinned by the parties     -> {trust_path.name}")
    if simulation:
        _say(stream, "   (it admits a simulation: the Kafka run's arrival times are the senders')")
    return trust_path


def _trust(keys: dict[str, SigningKey], *, simulations: bool = False) -> TrustFile:
    pinned = [
        TrustedKey(id=name, role=role, key=keys[name].public_key)  # type: ignore[arg-type]
        for role, name in PARTIES.items()
    ]
    # SPEC §9: an assignment's new buyer is pinned as a buyer under the id it names.
    pinned.append(TrustedKey(id=NEW_BUYER, role="buyer", key=keys[NEW_BUYER].public_key))
    return TrustFile(format=TRUST_FORMAT, keys=pinned, simulations=simulations)


def _describe_terms(out: io.TextIOBase | None, t: PlacementTerms) -> None:
    gpus = ", ".join(f"{g.uuid} ({g.model}, {g.share_milli}/1000)" for g in t.gpus)
    _say(out, f"   placement {t.placement_id}: 1 hour from 2026-12-01T00:00Z")
    _say(out, f"   GPUs: {gpus}")
    rate = format_minor(t.rate_per_gpu_hour_minor, t.currency_scale)
    _say(out, f"   price {rate} {t.currency} per GPU-hour, billed per started minute,")
    _say(
        out, f"   desk fee {t.desk_fee_bps / 100:g}% paid by the {t.fee_payer}, SLA 95% or 10% back"
    )
    workload = present(t.workload, "the demo's workload terms")
    delivery = present(t.delivery, "the demo's delivery terms")
    residency = present(t.residency, "the demo's residency terms")
    _say(
        out,
        f"   workload {workload.workload_class}, {workload.isolation} isolation; on reclaim: "
        f"{delivery.on_reclaim}; operator of record {delivery.operator_of_record}",
    )
    _say(
        out,
        f"   residency: regions {', '.join(residency.allowed_regions)} "
        f"({', '.join(residency.jurisdictions)}); every node carrying a GPU is there",
    )
    # SPEC §5.2 R1: the same terms with a GPU node elsewhere are refused before signing.
    moved = msgspec.structs.replace(
        t,
        nodes=[
            msgspec.structs.replace(n, region="us-east-1") if n.node_id == NODES[-1] else n
            for n in t.nodes
        ],
    )
    refused = [p for p in validate_terms(moved) if p.startswith("R1:")]
    invariant(len(refused) == 1, "terms with a GPU node outside the residency are refused")
    _say(out, f"   a draft with {NODES[-1]} in us-east-1 is refused at signing: {refused[0]}")


# ---- 3: meter and ledger ---------------------------------------------------------------------


def _agents(
    workdir: Path, keys: dict[str, SigningKey], terms: PlacementTerms, clock: object
) -> list[object]:
    from meter.agent import Agent, AgentConfig
    from meter.clock import SimClock
    from meter.sim import SimDevice, Simulator, parse_sim_spec

    sim_clock = of_type(clock, SimClock, "the demo's clock")
    agents: list[object] = []
    for node in NODES:
        devices = [
            SimDevice(g.uuid, g.model, g.memory_mib) for g in terms.gpus if g.node_id == node
        ]
        spec = "seed=7"
        if node == "node-b":
            spec += f",unhealthy={UNHEALTHY_GPU}@{20 * MINUTE_MS}-{30 * MINUTE_MS}"
        source = Simulator(parse_sim_spec(spec), devices, terms.window_start_ms, node_id=node)
        config = AgentConfig(
            node_id=node,
            signing_key=keys[node],
            terms=(terms,),
            spool_dir=workdir / "local" / f"node-{node}",
            interval_ms=MINUTE_MS,
            delivered_on_spool=True,
            collect_read=True,
        )
        agents.append(Agent(config, source, sim_clock))
    return agents


def _reclaim(keys: dict[str, SigningKey], terms: PlacementTerms) -> bytes:
    from proto.records import ReclaimNotice

    notice = ReclaimNotice(
        placement_id=terms.placement_id,
        reclaim_id="reclaim-0001",
        issued_at_ms=RECLAIM_ISSUED_MS,
        effective_at_ms=RECLAIM_EFFECTIVE_MS,
        gpus=[g.uuid for g in terms.gpus],
        reason="capacity needed for a priority tenant",
    )
    return encode_envelope(sign_payload(signed_bytes(notice), [keys[PARTIES["operator"]]]))


def _resell(
    workdir: Path, terms: PlacementTerms, signed_terms: Path, out: io.TextIOBase | None
) -> Path:
    """The resale (SPEC §6.8): the buyer runs `gridledger assign`, then the new buyer and
    the desk each `gridledger cosign` the file, each on its own machine with its own key;
    here, one after another. Returns the signed assignment."""
    from gridledger.cli import main
    from gridledger.cmd_records import missing_signers
    from proto.records import Assignment

    keys_dir = workdir / "keys"
    path = workdir / "assignment.signed.json"
    terms_arg = ["--terms", str(signed_terms)]
    steps = [
        (
            "buyer",
            [
                "assign",
                *terms_arg,
                "--new-buyer",
                NEW_BUYER,
                "--new-buyer-key",
                str(keys_dir / f"{NEW_BUYER}.pub"),
                "--handover-at",
                str(HANDOVER_MS),
                "--rate",
                RESALE_RATE,
                "--gpus",
                ",".join(RESALE_GPUS),
                "--id",
                ASSIGNMENT_ID,
                "--issued-at",
                str(HANDOVER_MS),
                "--key",
                str(keys_dir / f"{PARTIES['buyer']}.key"),
                "--out",
                str(path),
            ],
        ),
        (
            "new buyer",
            ["cosign", str(path), *terms_arg, "--key", str(keys_dir / f"{NEW_BUYER}.key")],
        ),
        (
            "desk",
            ["cosign", str(path), *terms_arg, "--key", str(keys_dir / f"{PARTIES['desk']}.key")],
        ),
    ]
    for who, argv in steps:
        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            code = main(argv)
        _quiet_logs()
        if code != 0:
            last = said.getvalue().strip().splitlines()[-1:] or [""]
            raise DemoError(f"the {who} could not sign the resale (exit {code}): {last[0]}")
    opened = open_envelope(path.read_bytes().rstrip(b"\n"))
    record = of_type(opened.record, Assignment, "the demo's signed resale")
    invariant(
        not missing_signers(terms, opened.envelope, record),
        "the buyer, the new buyer and the desk signed the resale",
    )
    rate = format_minor(record.rate_per_gpu_hour_minor, terms.currency_scale)
    _say(
        out,
        f"   minute  30: {terms.buyer.id} resells {' and '.join(record.gpus)} to "
        f"{record.new_buyer.id}\n"
        f"               for the rest of the window at {rate} {terms.currency} per GPU-hour "
        "(paid to the desk);\n"
        "               signed apart: gridledger assign (buyer), cosign (new buyer),\n"
        f"               cosign (desk) -> {path.name}; the desk publishes it",
    )
    return path


def _timeline(terms: PlacementTerms) -> Iterator[int]:
    """The steps of the simulated clock: every STEP_MS, and the minute the operator sends
    the reclaim notice (it reaches the log then: its notice runs from there, SPEC §6.6)."""
    start = now = terms.window_start_ms
    end = terms.window_end_ms + terms.late_grace_ms + MINUTE_MS
    while now < end:
        step = min(start + ((now - start) // STEP_MS + 1) * STEP_MS, end)
        if now < RECLAIM_ISSUED_MS < step:
            step = RECLAIM_ISSUED_MS
        now = step
        yield now


class _Transport(Protocol):
    """How the demo's envelopes reach its ledger: the only part of the timeline loop
    (``_run_timeline``) that differs between the embedded transport and Kafka."""

    def start(self, store: object, clock: object, signed_terms: bytes) -> None:
        """Start the ledger over ``store`` on ``clock`` and deliver the signed terms."""

    def arrival(self) -> str:
        """One line: where the ledger takes the inputs' arrival times from (SPEC §6.6)."""

    def deliver(self, usage: list[bytes], published: list[tuple[str, bytes]]) -> int:
        """Deliver one step's usage events (already in the agents' spools) and the records
        parties publish (publisher, envelope: the operator's reclaim, the desk's resale),
        and let the ledger fold them; return the count the progress line adds."""

    def finish(self, store: object) -> None:
        """Wait until the ledger has closed the placement."""

    def close(self) -> None:
        """Stop the ledger."""


class _LocalTransport:
    """The embedded transport: the ledger reads the agents' spools and one spool of its own
    per publisher under ``workdir/local``."""

    def __init__(self, workdir: Path, ledger_key: SigningKey) -> None:
        self.local = workdir / "local"
        self.ledger_key = ledger_key
        self.service: LedgerService | None = None

    def start(self, store: object, clock: object, signed_terms: bytes) -> None:
        from ledger.service import LedgerService
        from ledger.store import Store
        from meter.clock import SimClock
        from transport.local import publish_local

        publish_local(self.local, "publish-terms", [signed_terms.rstrip(b"\n")])
        self.service = LedgerService(
            of_type(store, Store, "the demo's store"),
            self.ledger_key,
            ledger_id=PARTIES["ledger"],
            local_dir=self.local,
            clock=of_type(clock, SimClock, "the demo's clock").now_ms,
        )

    def arrival(self) -> str:
        return 'arrival times from the log: the intake log\'s clock (arrival = "log")'

    def deliver(self, usage: list[bytes], published: list[tuple[str, bytes]]) -> int:
        from transport.local import publish_local, publisher_source

        for publisher, envelope in published:
            publish_local(self.local, publisher_source(publisher), [envelope])
        present(self.service, "the demo's ledger").run_until_idle()
        return len(usage)

    def finish(self, store: object) -> None:
        """Nothing to wait for: ``run_until_idle`` closes what the clock made due."""

    def close(self) -> None:
        if self.service is not None:
            self.service.close()


class _KafkaTransport:
    """Kafka: a fresh topic; each step's envelopes are published in order, awaiting every
    ack (the agents' own shipper does this in production, ``meter run``), and the ledger
    consumes them on one event loop kept across the steps."""

    def __init__(self, bootstrap: str, ledger_key: SigningKey, out: io.TextIOBase | None) -> None:
        from transport.kafka import SIMULATION_TOPIC_CONFIG, KafkaSettings, create_topic

        topic = f"{TOPIC}.demo-{uuid.uuid4().hex[:8]}"
        try:
            # An hour in seconds: the broker's clock does not follow the simulated one, so
            # the topic keeps the time each sender states (SPEC §6.6, simulations only).
            create_topic(bootstrap, topic, 3, config=SIMULATION_TOPIC_CONFIG)
        except Exception as exc:
            raise DemoError(f"cannot create topic {topic} on {bootstrap}: {exc}") from exc
        _say(out, f"   through Kafka at {bootstrap}, topic {topic}")
        self.settings = KafkaSettings(bootstrap=bootstrap, topic=topic)
        self.ledger_key = ledger_key
        self.loop = asyncio.Runner()
        self.service: KafkaLedgerService | None = None
        self.clock: SimClock | None = None

    def start(self, store: object, clock: object, signed_terms: bytes) -> None:
        from ledger.config import KafkaConfig
        from ledger.service import KafkaLedgerService
        from ledger.store import Store
        from meter.clock import SimClock
        from transport.kafka import publish_kafka

        sim_clock = of_type(clock, SimClock, "the demo's clock")
        self.clock = sim_clock

        async def start() -> None:
            service = KafkaLedgerService(
                of_type(store, Store, "the demo's store"),
                self.ledger_key,
                KafkaConfig(settings=self.settings),
                clock=sim_clock.now_ms,
                arrival="sender",
            )
            await service.start()
            self.service = service
            await publish_kafka(
                self.settings,
                [(PLACEMENT_ID, signed_terms.rstrip())],
                timestamps_ms=[sim_clock.now_ms()],
            )

        self.loop.run(start())

    def deliver(self, usage: list[bytes], published: list[tuple[str, bytes]]) -> int:
        from transport.kafka import publish_kafka

        service = present(self.service, "the demo's ledger")
        batch = [(PLACEMENT_ID, e) for e in [*usage, *(e for _, e in published)]]
        sent_ms = present(self.clock, "the demo's clock").now_ms()

        async def step() -> None:
            # Each sender states the simulated time it sends at.
            await publish_kafka(self.settings, batch, timestamps_ms=[sent_ms] * len(batch))
            await service.run_until(deadline_s=60.0)

        self.loop.run(step())
        return len(batch)

    def arrival(self) -> str:
        return (
            "arrival times stated by the senders on the simulated clock "
            '(arrival = "sender", CreateTime topic: a simulation, never production)'
        )

    def finish(self, store: object) -> None:
        from ledger.store import Store

        ledger = of_type(store, Store, "the demo's store")
        service = present(self.service, "the demo's ledger")
        self.loop.run(
            service.run_until(lambda: ledger.close_index(PLACEMENT_ID) is not None, deadline_s=60.0)
        )

    def close(self) -> None:
        try:
            if self.service is not None:
                service = self.service
                try:
                    self.loop.run(service.stop())
                finally:
                    service.close()
        finally:
            self.loop.close()


def _run_timeline(
    workdir: Path,
    keys: dict[str, SigningKey],
    terms: PlacementTerms,
    signed_terms: Path,
    transport: _Transport,
    out: io.TextIOBase | None,
) -> Statement:
    """The demo's one loop, whatever the transport: the agents tick on a simulated clock,
    the reclaim notice goes out at its minute, the ledger folds after every step; then
    the witnesses, the export and the final statement."""
    from ledger.export import export_placement
    from ledger.store import Store
    from meter.agent import Agent
    from meter.clock import SimClock

    clock = SimClock(terms.window_start_ms)
    agents = [a for a in _agents(workdir, keys, terms, clock) if isinstance(a, Agent)]
    ledger_key = keys[PARTIES["ledger"]]
    store = Store(workdir / "ledger.duckdb", ledger_public_key=ledger_key.public_key)
    try:
        transport.start(store, clock, signed_terms.read_bytes())
        _say(out, f"   {transport.arrival()}")
        reclaimed = resold = closed_said = False
        events = 0
        for now in _timeline(terms):
            clock.set(now)
            usage = [e for agent in agents for e in agent.tick()]
            published: list[tuple[str, bytes]] = []
            if not resold and now >= HANDOVER_MS:
                # The desk publishes the resale once all three have signed it.
                assignment = _resell(workdir, terms, signed_terms, out)
                published.append(("desk", assignment.read_bytes().rstrip(b"\n")))
                resold = True
            if not reclaimed and now >= RECLAIM_ISSUED_MS:
                published.append(("operator", _reclaim(keys, terms)))
                reclaimed = True
            events += transport.deliver(usage, published)
            if not closed_said:  # nothing changes after the close: said once
                closed_said = _progress(out, terms, store, now, events)
        transport.finish(store)
        for agent in agents:
            agent.close()
        _witnesses(workdir, keys, terms, signed_terms, store, ledger_key, clock.now_ms(), out)
        export = workdir / "exports" / f"{PLACEMENT_ID}.duckdb"
        export.parent.mkdir(parents=True, exist_ok=True)
        export_placement(store, PLACEMENT_ID, export, key=ledger_key)
        return _final_statement(store)
    finally:
        transport.close()


def _witnesses(
    workdir: Path,
    keys: dict[str, SigningKey],
    terms: PlacementTerms,
    signed_terms: Path,
    store: object,
    ledger_key: SigningKey,
    now_ms: int,
    out: io.TextIOBase | None,
) -> None:
    """Operator and buyer witness the closed log through the ledger's API (SPEC §8.3),
    on the demo's simulated clock (``now_ms``).

    Each uses only its own key and what it knows: the operator its agents' delivery logs,
    the buyer the terms it signed, the resale it signed and the reclaim notice it received
    (saved with the time it received them). Both must cosign, or the demo stops: no honest
    run is refused.
    """

    from ledger.access import Access
    from ledger.http import LedgerApi, LedgerHttpServer
    from ledger.metrics import LedgerMetrics
    from ledger.store import Store
    from witness.known import keep
    from witness.runner import EXIT_OK, witness_once

    known = workdir / "witness" / "buyer-known"
    known.mkdir(parents=True, exist_ok=True)
    for name, raw, at_ms in (
        ("terms.signed.json", signed_terms.read_bytes(), terms.created_at_ms),
        ("reclaim.json", _reclaim(keys, terms), RECLAIM_ISSUED_MS),
        ("assignment.signed.json", (workdir / "assignment.signed.json").read_bytes(), HANDOVER_MS),
    ):
        keep(known, raw, at_ms, name=name)  # as `gridledger witness keep` does
    ledger_store = of_type(store, Store, "the demo's store")
    # As between companies (SPEC §13): each witness signs its requests with its party key.
    access = Access(ledger_store, ledger_key.public_key, clock_s=lambda: int(time.time()))
    api = LedgerApi(ledger_store, ledger_key, LedgerMetrics(), access=access)
    server = LedgerHttpServer(api, "127.0.0.1", 0)
    server.start()
    try:
        operator_logs = sorted((workdir / "local").glob("node-*/DELIVERED.jsonl"))
        roles: list[tuple[str, list[Path], Path | None]] = [
            ("operator", operator_logs, None),
            ("buyer", [], known),
        ]
        for role, delivery_logs, known_dir in roles:
            party = PARTIES[role]
            result = witness_once(
                ledger_url=server.url,
                terms_path=signed_terms,
                key_path=workdir / "keys" / f"{party}.key",
                state_dir=workdir / "witness" / role,
                delivery_logs=delivery_logs,
                known_dir=known_dir,
                now_s=now_ms // 1000,
            )
            _say(out, f"   {role} witness: {result.line}")
            if result.code != EXIT_OK:
                raise DemoError(f"the {role}'s witness did not cosign: {result.line}")
    finally:
        server.stop()


def _progress(
    out: io.TextIOBase | None, terms: PlacementTerms, store: object, now: int, events: int
) -> bool:
    """Say where the timeline is; True once the placement is closed."""
    from ledger.store import Store

    ledger = of_type(store, Store, "the demo's store")
    minute = (now - terms.window_start_ms) // MINUTE_MS
    head = ledger.head(PLACEMENT_ID)
    records = 0 if head is None else head.chain_index + 1
    closed = ledger.close_index(PLACEMENT_ID) is not None
    label = f"minute {minute:>3}" if minute <= 60 else f"minute {minute:>3} (late grace)"
    _say(
        out,
        f"   {label}: {events:>3} events signed and spooled, {records:>3} ledger records"
        + (", placement closed" if closed else ""),
    )
    return closed


def _final_statement(store: object) -> Statement:
    from ledger.store import Store

    ledger = of_type(store, Store, "the demo's store")
    rows = [r for r in ledger.statements(PLACEMENT_ID) if r[2]]
    if not rows:
        raise DemoError("the ledger issued no final statement; the placement did not close")
    return of_type(open_envelope(rows[-1][1]).record, Statement, "record of a statement row")


# ---- 4, 5, 6: statement, verify, tamper -------------------------------------------------------


def _print_statement(out: io.TextIOBase | None, t: PlacementTerms, s: Statement) -> None:
    def money(value: int) -> str:
        return f"{format_minor(value, s.currency_scale):>9} {s.currency}"

    totals = s.totals
    _say(out, f"   delivered        {format_gpu_hours(totals.delivered_mgms):>9} GPU-hours")
    _say(out, f"   billable         {format_gpu_hours(totals.billable_mgms):>9} GPU-hours")
    _say(out, f"   gross            {money(totals.gross_minor)}")
    notice = f"{duration(RECLAIM_EFFECTIVE_MS - RECLAIM_ISSUED_MS)} notice of"
    _say(
        out,
        f"   reclaim credit   {money(totals.reclaim_credit_minor)}  "
        f"({notice} {duration(t.reclaim_notice_ms)})",
    )
    _say(out, f"   SLA credit       {money(totals.sla_credit_minor)}")
    _say(out, f"   desk fee         {money(totals.fee_minor)}  (paid by the {t.fee_payer})")
    _say(out, f"   buyer   {t.buyer.id:<16} owes      {money(totals.buyer_owes_minor)}")
    _say(out, f"   operator {t.operator.id:<15} receives  {money(totals.operator_receives_minor)}")
    _say(out, f"   desk    {t.desk.id:<16} receives  {money(totals.desk_receives_minor)}")
    # SPEC §7.10: the resale adds a second obligation and nets the original buyer's.
    proceeds = sum(e.gross_minor - e.fee_minor for e in s.resale)
    resale_fees = sum(e.fee_minor for e in s.resale)
    for e in s.resale:
        handover = (HANDOVER_MS - t.window_start_ms) // MINUTE_MS
        reclaim = (RECLAIM_EFFECTIVE_MS - t.window_start_ms) // MINUTE_MS
        _say(out, f"\n   new buyer {e.new_buyer}, {e.assignment_id}: {', '.join(RESALE_GPUS)}")
        _say(
            out,
            f"   delivered        {format_gpu_hours(e.delivered_mgms):>9} GPU-hours"
            f"  (minute {handover} to the reclaim at {reclaim})",
        )
        _say(out, f"   billable         {format_gpu_hours(e.billable_mgms):>9} GPU-hours")
        _say(
            out,
            f"   owes the desk    {money(e.gross_minor)}  "
            f"(at {RESALE_RATE} {s.currency} per GPU-hour)",
        )
    if s.resale:
        net = totals.buyer_owes_minor - proceeds
        desk = totals.desk_receives_minor + resale_fees
        bps = t.desk_fee_bps / 100
        _say(out, f"\n   original buyer {t.buyer.id}")
        _say(
            out,
            f"   owes             {money(totals.buyer_owes_minor)}  (for the operator, as above)",
        )
        _say(
            out,
            f"   resale brings    {money(proceeds)}  (the new buyer's payment less the "
            f"desk's {bps:g}% fee, {format_minor(resale_fees, s.currency_scale)})",
        )
        _say(out, f"   net              {money(net)}")
        buyers = " + ".join(
            format_minor(v, s.currency_scale) for v in [net, *(e.gross_minor for e in s.resale)]
        )
        _say(
            out,
            f"\n   balanced: the buyers pay {buyers} = "
            f"{format_minor(totals.operator_receives_minor, s.currency_scale)} to the operator + "
            f"{format_minor(desk, s.currency_scale)} to the desk\n"
            f"   (the desk: {format_minor(totals.desk_receives_minor, s.currency_scale)} fee + "
            f"{format_minor(resale_fees, s.currency_scale)} resale fee)",
        )
        invariant(
            net + sum(e.gross_minor for e in s.resale) == totals.operator_receives_minor + desk,
            "the parties of the statement balance (SPEC §7.10)",
        )
    _say(out, f"   (final statement through record {s.through_index}, signed by the ledger)")


def _verify(export: Path, trust: Path, html_dir: Path | None) -> tuple[int, str]:
    """``gridledger verify`` on the export (its bill into ``html_dir``): (exit, output)
    without the lines naming the statement files (the demo says where they are)."""
    from verifier.cli import main as verify_main

    argv = [str(export), "--trust", str(trust)]
    if html_dir is not None:
        argv += ["--html", str(html_dir)]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = verify_main(argv)
    lines = buffer.getvalue().splitlines(keepends=True)
    return code, "".join(
        line for line in lines if not line.startswith(("statement: ", "  (the operator"))
    )


def _tamper(export: Path, tampered: Path) -> str:
    """Copy the export and move one accepted usage event's end a minute later."""
    tampered.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(export, tampered)
    con = duckdb.connect(str(tampered))
    try:
        row = con.execute(
            "SELECT chain_index, envelope FROM usage_events WHERE status = 'accepted' "
            "ORDER BY chain_index LIMIT 1 OFFSET 10"
        ).fetchone()
        if row is None:
            raise DemoError("the export has too few usage events to tamper with")
        chain_index, envelope = int(row[0]), bytes(row[1])
        data = json.loads(envelope)
        opened = open_envelope(envelope)
        # Claim one more minute of delivery: end_ms + 60000, signatures kept as they were.
        event = msgspec.json.decode(opened.payload.split(b"\n", 1)[1])
        forged = opened.payload.replace(
            f'"end_ms":{event["end_ms"]}'.encode(), f'"end_ms":{event["end_ms"] + 60000}'.encode()
        )
        data["payload"] = msgspec.json.encode(forged).decode().strip('"')
        new_envelope = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
        con.execute(
            "UPDATE usage_events SET envelope = ? WHERE chain_index = ?",
            [new_envelope, chain_index],
        )
    finally:
        con.close()
    return f"usage event at chain index {chain_index}: end_ms moved one minute later"


def _first_lines(text: str, count: int) -> str:
    lines = text.rstrip("\n").splitlines()
    if len(lines) <= count:
        return text
    hidden = len(lines) - count
    return "\n".join(
        [*lines[:count], f"  ... {hidden} more lines: the edit breaks everything after it"]
    )


def _indent(text: str) -> str:
    return "".join(f"   {line}\n" for line in text.rstrip("\n").splitlines())
