#!/usr/bin/env bash
# Peer check: gridledger checkpoints and witness cosignatures, verified by other
# implementations of the C2SP specs (golang.org/x/mod/sumdb/note and
# github.com/transparency-dev/formats). See README.md.
#
# Needs Go (1.26) and the gridledger venv; the first run fetches the Go modules pinned
# in go.sum from the Go module proxy. Usage: bench/peer_c2sp/run.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"

out="$(mktemp -d "${TMPDIR:-/tmp}/peer_c2sp.XXXXXX")"
trap 'rm -rf "$out"' EXIT

# Fresh material from gridledger's own Python code (fresh keys every run).
mapfile -t fresh < <(cd "$repo" && PYTHONPATH="$repo" "$python" "$here/make_notes.py" "$out")

# go.sum pins the module versions; -mod=mod lets go resolve them without a vendor dir.
# Build output goes to the temporary directory, never into the tree.
cd "$here"
GOFLAGS="${GOFLAGS:-} -mod=mod" go build -o "$out/peer_c2sp" .
"$out/peer_c2sp" "$repo/proto/vectors/checkpoint.json" "${fresh[@]}"
