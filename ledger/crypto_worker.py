"""The ledger's signature-check worker process (``ledger.crypto.CryptoWorker``).

Run as ``python -m ledger.crypto_worker`` by the ledger, with pipes on stdin and stdout:
it imports this module, ``proto.keys`` (pynacl) and msgspec, nothing of the fold or the
store (a ``multiprocessing`` spawn re-imports the parent's main script: measured, 451
modules with DuckDB, 3.2 s to start at load 7, and up to seconds to exit).

Protocol, both ways a frame of 4 bytes (big-endian length) and that many bytes of
msgpack: the worker first sends its process id (it is ready: SIGINT ignored, the checks
imported); then the ledger sends a chunk of jobs ``[[public key, signed bytes,
signature], ...]`` and the worker answers with one list of booleans per chunk, in order.
End of input (the ledger closed the pipe, or died however it died: it holds the only
write end) makes the worker exit after answering what it has read, so it never outlives
the ledger. Ctrl-C reaches the whole foreground process group: the worker ignores it,
the ledger stops it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import IO, Final

import msgspec

from proto.keys import verify

FRAME_HEADER_BYTES: Final = 4

Job = tuple[bytes, bytes, bytes]


def verify_chunk(jobs: Sequence[Job]) -> list[bool]:
    """For each (public key, signed bytes, signature): whether the signature verifies."""
    return [verify(public_key, payload, sig) for public_key, payload, sig in jobs]


def frame(body: bytes) -> bytes:
    """A frame of the protocol (module docstring)."""
    return len(body).to_bytes(FRAME_HEADER_BYTES, "big") + body


def read_frame(stream: IO[bytes]) -> bytes | None:
    """The body of the next frame; None at the end of the stream (or a cut frame)."""
    header = stream.read(FRAME_HEADER_BYTES)
    if len(header) < FRAME_HEADER_BYTES:
        return None
    size = int.from_bytes(header, "big")
    body = stream.read(size)
    return body if len(body) == size else None


def main() -> None:
    """Answer chunks until the end of input (module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    decode = msgspec.msgpack.Decoder(list[Job]).decode
    encode = msgspec.msgpack.Encoder().encode
    sink.write(frame(encode(os.getpid())))  # ready: SIGINT ignored, the checks imported
    sink.flush()
    while (body := read_frame(source)) is not None:
        answer = frame(encode(verify_chunk(decode(body))))
        try:
            sink.write(answer)
            sink.flush()
        except BrokenPipeError:  # the ledger is gone: nobody to flush stdout to at exit
            os._exit(0)


if __name__ == "__main__":
    main()
