"""Every named maximum of the wire, in one place (see SPEC.md, "Limits").

A value outside these bounds is rejected with a named reason; nothing is truncated.
"""

from __future__ import annotations

from typing import Final

# RFC 8785 (I-JSON) integers: every integer in signed bytes lies within +-(2^53 - 1).
MAX_SAFE_INTEGER: Final = 2**53 - 1

# Size of one envelope on the wire (JSON), and of the signed payload inside it.
MAX_ENVELOPE_BYTES: Final = 256 * 1024
MAX_PAYLOAD_BYTES: Final = 192 * 1024

# Signatures on one envelope (terms need three; nothing needs more than eight).
MAX_SIGNATURES: Final = 8

# GPUs in one placement, nodes in one placement, samples in one usage event.
MAX_GPUS: Final = 256
MAX_NODES: Final = 256
MAX_SAMPLES: Final = MAX_GPUS

# XID codes listed in one GPU sample (SPEC §7.1): distinct codes of one interval.
MAX_XIDS: Final = 16

# Length of identifiers and free text.
MAX_ID_CHARS: Final = 128
MAX_TEXT_CHARS: Final = 512

# Workload, delivery and residency terms (SPEC §5.1, §5.2): acceptance requirements,
# allowed regions and jurisdictions listed in one terms record.
MAX_ACCEPTANCE_ITEMS: Final = 16
MAX_HOLDERS: Final = 16  # SPEC §5.3: workload identities in the terms' metering
MAX_REGIONS: Final = 64
MAX_JURISDICTIONS: Final = 16

# A placement window may not exceed 366 days; a usage interval may not exceed 1 day.
MAX_WINDOW_MS: Final = 366 * 24 * 3_600_000
MAX_INTERVAL_MS: Final = 24 * 3_600_000

# Price per GPU-hour, in minor units: keeps gross <= billable < 2^53 (SPEC "Bounds").
MAX_RATE_MINOR: Final = 3_600_000_000
# SPEC §4.1, §6.8: accepted assignments (resales) per placement.
MAX_ASSIGNMENTS: Final = 16

# Basis points are 0..10_000.
MAX_BPS: Final = 10_000

# Whole GPU in thousandths.
MAX_SHARE_MILLI: Final = 1000

# Inputs held (SPEC §6.2: before the placement's terms, and usage events in their stream
# hold, counted together): at most this many per placement, and this many envelope bytes
# (each input's raw bytes as received) per placement; the next is quarantined
# (UNKNOWN_PLACEMENT before the terms, HOLD_FULL for a stream hold).
MAX_HELD_PER_PLACEMENT: Final = 100_000
MAX_HELD_BYTES_PER_PLACEMENT: Final = 16 * 1024 * 1024
# SPEC §6.2: envelope bytes held over all placements of one ledger process (shard); an
# input past it is quarantined with the same reasons (detail "ledger-wide"). Which input
# it hits depends on how placements interleave: the ledger's protection, not the chain's.
MAX_HELD_BYTES_LEDGER: Final = 256 * 1024 * 1024

# Units in SPEC formulas.
MS_PER_HOUR: Final = 3_600_000
MILLI_GPU_MS_PER_GPU_HOUR: Final = 1000 * MS_PER_HOUR  # 3_600_000_000

# How far a party's clock may run ahead of the log's arrival clock (SPEC §6.6: a usage
# event may end at most this long after it arrived) and a witness's clock from the
# log's (SPEC §8.3 W_TIME), and a party's from the ledger's when it judges "delivered
# before the close deadline" (SPEC §8.3 W_MISSING).
MAX_CLOCK_SKEW_MS: Final = 60_000
# SPEC §6.6 "Bounded from both sides": a record of an input a party delivered at d says
# it arrived no later than d (or what the input waited for) + this; and the input is owed
# to the log once the witness's clock passes d + this + MAX_CLOCK_SKEW_MS (SPEC §8.3).
MAX_ARRIVAL_LAG_MS: Final = 60_000
# SPEC §8.2, §9: how often a witness cosigns by default (trust policy witness_interval_s);
# backdating by any coalition is bounded by this + MAX_CLOCK_SKEW_MS.
WITNESS_INTERVAL_S: Final = 60
MAX_WITNESS_INTERVAL_S: Final = 86_400

# SPEC §6.5 across shards: a claim request reaching the capacity log later than this after
# its terms arrived is denied CAPACITY_LATE, so a shard waits at most this long for it.
MAX_CAPACITY_WAIT_MS: Final = 60_000

# SPEC §6.6: every record of a placement whose terms were created at or after this moment
# (2026-12-01T00:00:00Z) carries arrived_ms; untimed records are accepted only in older
# placements (chained before time from the log existed).
ARRIVAL_REQUIRED_FROM_MS: Final = 1_796_083_200_000

# SPEC §6.3 usage: in a placement whose terms in force were created at or after this moment
# (2026-01-01T00:00:00Z), a usage event rejected for its content (steps 4-6) takes its seq
# and advances the stream; in older placements it takes its seq and stops the stream.
REJECTION_ADVANCES_FROM_MS: Final = 1_767_225_600_000

# SPEC §6.9: hardware evidence on a key binding — a compact JWS (an EAT) of at most this
# many characters; at most this many GPUs (``submods``) in it, and this many attestation
# roots pinned by a trust file or a ledger.toml.
MAX_EVIDENCE_CHARS: Final = 32_768
MAX_EVIDENCE_GPUS: Final = MAX_GPUS
MAX_ATTESTATION_ROOTS: Final = 64
# SPEC §6.9 (6): a token's ``iat`` (seconds) x 1000 lies in [a - MAX_EVIDENCE_AGE_MS,
# a + MAX_CLOCK_SKEW_MS], ``a`` the binding's arrival (its issued_at_ms when untimed).
MAX_EVIDENCE_AGE_MS: Final = 86_400_000
# SPEC §6.9 Expiry: under attestation_required a sample is attested only when its event
# ends at or before iat x 1000 + MAX_ATTESTATION_VALIDITY_MS (the same span as the age
# bound: no token speaks for a GPU more than 24 h after it was measured).
MAX_ATTESTATION_VALIDITY_MS: Final = 86_400_000
