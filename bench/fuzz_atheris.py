"""Coverage-guided fuzzing of the wire decoders with atheris (libFuzzer). Not a test.

atheris is not a project dependency: ``.venv/bin/pip install atheris`` first. The
hypothesis fuzzers in ``tests/test_fuzz_decoders.py`` run in the suite; this harness is
for longer, coverage-guided runs that find inputs a grammar-free generator would not.

    .venv/bin/python bench/fuzz_atheris.py                    # open_envelope, 60 s
    .venv/bin/python bench/fuzz_atheris.py --target note --seconds 300
    .venv/bin/python bench/fuzz_atheris.py --target payload -- -max_len=65536

Targets (each may raise only its documented exception; anything else is a crash that
libFuzzer reports with the input saved as ``crash-<sha1>``):

* ``envelope``: ``proto.envelope.open_envelope`` (ProtoError); an accepted envelope
  must re-encode to the same bytes.
* ``payload``: ``proto.canonical.decode_payload`` (ProtoError); accepted bytes are
  canonical.
* ``note``: ``proto.note.parse_note`` then ``parse_checkpoint_body`` on UTF-8 text
  (ProtoError).

The corpus starts from one valid envelope of every record kind (written to
``--corpus``), so libFuzzer mutates real structure from the first second.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import atheris

# devtools/ is not installed (not in the wheel): import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

with atheris.instrument_imports():
    from devtools import builders
    from proto.canonical import decode_payload, signed_bytes
    from proto.envelope import decode_envelope, encode_envelope, open_envelope
    from proto.errors import ProtoError
    from proto.note import parse_checkpoint_body, parse_note


def seed_corpus() -> list[bytes]:
    """A valid envelope of the common kinds, and their payloads."""
    cast = builders.make_cast("atheris")
    t0 = 1_767_225_600_000
    gpus = [builders.gpu("node-a", 0)]
    terms = builders.make_terms(cast, "p-a", gpus, t0, t0 + 3_600_000)
    stream = builders.StreamWriter(cast.node_key("node-a"), "p-a", "node-a")
    envelopes = [
        builders.signed_terms(cast, terms),
        stream.event(t0, t0 + 60_000, [builders.sample(gpus[0])]),
        builders.reclaim(cast, terms, t0 + 60_000, t0 + 120_000, "r-1"),
        builders.adjustment(cast, "p-a", "a-1", "credit", 5, t0),
        builders.closed(cast, "p-a", t0 + 3_600_000),
    ]
    return envelopes + [decode_envelope(e).payload for e in envelopes]


def fuzz_envelope(data: bytes) -> None:
    """open_envelope: ProtoError, or canonical bytes that re-encode exactly."""
    try:
        opened = open_envelope(data)
    except ProtoError:
        return
    if encode_envelope(opened.envelope) != data or signed_bytes(opened.record) != opened.payload:
        raise AssertionError("accepted an envelope whose bytes are not canonical")


def fuzz_payload(data: bytes) -> None:
    """decode_payload: ProtoError, or canonical bytes."""
    try:
        record = decode_payload(data)
    except ProtoError:
        return
    if signed_bytes(record) != data:
        raise AssertionError("accepted a payload whose bytes are not canonical")


def fuzz_note(data: bytes) -> None:
    """parse_note and parse_checkpoint_body on UTF-8 text: ProtoError only."""
    text = data.decode("utf-8", "replace")
    try:
        note = parse_note(text)
        parse_checkpoint_body(note.body)
    except ProtoError:
        return


TARGETS: dict[str, Callable[[bytes], None]] = {
    "envelope": fuzz_envelope,
    "payload": fuzz_payload,
    "note": fuzz_note,
}


def main() -> int:
    """Parse options, write the seed corpus, hand over to libFuzzer."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=sorted(TARGETS), default="envelope")
    parser.add_argument("--seconds", type=int, default=60, help="libFuzzer -max_total_time")
    parser.add_argument("--corpus", type=Path, default=None, help="corpus directory (kept)")
    parser.add_argument("libfuzzer_args", nargs="*", help="passed to libFuzzer after --")
    args = parser.parse_args()
    corpus = args.corpus or Path(tempfile.mkdtemp(prefix=f"atheris-{args.target}-"))
    corpus.mkdir(parents=True, exist_ok=True)
    for index, seed in enumerate(seed_corpus()):
        (corpus / f"seed-{index:02d}").write_bytes(seed)
    print(f"corpus: {corpus}", file=sys.stderr)
    argv = [
        sys.argv[0],
        f"-max_total_time={args.seconds}",
        "-max_len=300000",  # past MAX_ENVELOPE_BYTES: the size limits are in reach
        "-timeout=5",  # one input taking 5 s is a hang
        "-rss_limit_mb=2048",
        *args.libfuzzer_args,
        str(corpus),
    ]
    atheris.Setup(argv, TARGETS[args.target])
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
