"""Stopping the ledger's Kafka source when aiokafka's close trips over its own fetch task.

aiokafka 0.12's ``Fetcher.close`` cancels a fetch task asleep in its retry backoff (after a
fetch timed out) and awaits it without suppressing the CancelledError, which then escapes
``consumer.stop()`` before the consumer's broker connections are closed. Seen in a
whole-trace replay: the ledger process died at its final stop. ``_stop_consumer`` tells
that apart from a cancellation of the caller."""

from __future__ import annotations

import asyncio

import pytest

from ledger.consume import _stop_consumer


class _Client:
    def __init__(self) -> None:
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


class _TrippingConsumer:
    """Stops the way aiokafka's does when a fetch retry's backoff sleep is cancelled."""

    def __init__(self) -> None:
        self._client = _Client()

    async def stop(self) -> None:
        async def backoff() -> None:
            await asyncio.sleep(3600)

        task = asyncio.ensure_future(backoff())
        await asyncio.sleep(0)
        task.cancel()
        await task  # raises CancelledError, as Fetcher.close's `await x` does


class _SlowConsumer:
    def __init__(self) -> None:
        self._client = _Client()
        self.entered = asyncio.Event()

    async def stop(self) -> None:
        self.entered.set()
        await asyncio.sleep(3600)


def test_an_inner_cancelled_error_is_absorbed_and_the_connections_closed() -> None:
    consumer = _TrippingConsumer()
    asyncio.run(_stop_consumer(consumer))
    assert consumer._client.closed == 1


def test_the_inner_error_escapes_a_bare_stop() -> None:
    """The premise: without the wrapper the CancelledError reaches the caller."""
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(_TrippingConsumer().stop())


def test_a_cancellation_of_the_caller_still_propagates() -> None:
    consumer = _SlowConsumer()

    async def main() -> None:
        stopping = asyncio.ensure_future(_stop_consumer(consumer))
        await consumer.entered.wait()
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        assert stopping.cancelled()

    asyncio.run(main())
    assert consumer._client.closed == 0
