"""JSON Schemas of every record, generated from the Structs (``python -m proto.schemagen``).

The files in ``proto/schema/`` are committed; a test fails when they are stale. They
describe the JSON body after the domain-prefix line (SPEC.md §2), the envelope, and the
trust file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from proto.envelope import Envelope
from proto.records import RECORD_TYPES, Checkpoint, kind_of
from proto.trust import TrustFile

SCHEMA_DIR = Path(__file__).parent / "schema"


def render() -> dict[str, bytes]:
    """File name -> schema bytes."""
    out: dict[str, bytes] = {}
    named: list[tuple[str, type]] = [(kind_of(t), t) for t in RECORD_TYPES]
    named += [("checkpoint", Checkpoint), ("envelope", Envelope), ("trust", TrustFile)]
    for name, struct_type in named:
        schema = msgspec.json.schema(struct_type)
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://gridledger.invalid/schema/{name}.v1.json"
        out[f"{name}.json"] = msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n"
    return out


def main() -> int:
    """Write the schemas."""
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name, data in render().items():
        (SCHEMA_DIR / name).write_bytes(data)
    print(f"wrote {len(render())} schemas to {SCHEMA_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
