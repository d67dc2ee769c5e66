"""node/main.py's clock loop: a tick that keeps failing the same way is logged once, not ten
times a second (a store refusing writes on a full disk did that; storage fault probe)."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import pytest

from rpc.metrics import Registry
from storage.interface import StorageError
from tenzro_training.node.main import _tick_forever
from tenzro_training.node.metrics import NodeMetrics


class FailingService:
    def __init__(self, failures: int) -> None:
        self.calls = 0
        self.failures = failures

    def tick(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise StorageError("write to '/d/db' failed: IO error: No space left on device")

    def next_deadline_ms(self) -> None:
        return None


def test_a_tick_failing_the_same_way_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    service = FailingService(failures=5)
    metrics = NodeMetrics(Registry(), chain_id=1337)

    async def run() -> None:
        executor = ThreadPoolExecutor(max_workers=1)
        task = asyncio.create_task(_tick_forever(service, executor, metrics))
        while service.calls < 8:  # five failures, then ticks that work
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        executor.shutdown(wait=True)

    with caplog.at_level(logging.INFO, logger="tenzro.node"):
        asyncio.run(run())
    messages = [r.getMessage() for r in caplog.records if r.name == "tenzro.node"]
    assert messages.count("tick failed") == 1 and "tick works again" in messages
    assert metrics.tick_failures.get() == 5
