"""The trainer's gossip inbox: what it keeps of its subscriptions between two looks of the main
loop (the weights it awaits, checked as they complete; the run's RunSealed), and what it drops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tenzro_training.errors import GossipReject, TenzroError

__all__ = ["GossipInbox"]

log = logging.getLogger("tenzro.trainer")


class GossipInbox:
    """Drains the trainer's subscriptions continuously and keeps ONLY what the main loop awaits:
    candidate weights of the RoundFinalized of the round it trains (``expect_finalized``),
    candidate answers to its ModelRequest (``expect_model``: any round from the one asked for on,
    since the node answers with the model it holds when it answers) and the RunSealed message.
    Everything here passed the host's topic validator (right size, signed notice, weights
    published by the trainer's own node), yet no Tenzro signature covers the weight bytes, so
    the node, or a peer with the node's libp2p key, can still send a stream naming the awaited
    (round, model_hash) with other bytes:

    - a ModelChunk is reassembled only for a round from the awaited one on, a RoundFinalized only
      for the awaited round, and at most ``MAX_CANDIDATES`` of each are held: nothing else
      occupies the buffer or grows memory; ``request_model`` checks a ModelChunk's
      (round, model_hash) against the run before it uses it;
    - candidates are kept per ``data_hash`` (a forged stream never hides the genuine one) and
      checked by ``verify(data, model_hash)`` as soon as they complete: the weights must decode
      to the model's layout and hash to the model hash the message names. A candidate that fails
      is dropped and counted (``counters["forged"]``); the trainer keeps waiting or asks again;
    - a stream dropped by the assembler (hash mismatch, eviction) is forgotten in the validators'
      dedup cache ``seen``, so the genuine republish is accepted and relayed;
    - what was used is pruned (``expect_*(None)``): memory is one model per awaited candidate.
    """

    MAX_CANDIDATES = 4
    """Verified candidates held per awaited key (distinct notices a ranked candidate could sign)."""

    def __init__(self, task_id: str, gossip: Any, model_bytes: int, *,
                 verify: Callable[[bytes, bytes], Any] | None = None, seen: Any = None) -> None:
        self._task_id = task_id
        self._g = gossip
        self._model_bytes = model_bytes
        self._verify = verify
        self._seen = seen
        self.await_round: int | None = None
        self.await_model: int | None = None
        """The first round whose ModelChunk answers are awaited (None: none)."""
        self.finalized: dict[bytes, tuple[Any, Any]] = {}
        """Candidates for ``await_round``: data_hash -> (first chunk, weights)."""
        self.models: dict[bytes, tuple[int, bytes, Any]] = {}
        """Candidates for ``await_model``: data_hash -> (round, model_hash, weights)."""
        self.sealed: Any = None
        self.counters = {"forged": 0, "unexpected": 0}
        # Weights streams only (RoundFinalized, ModelChunk): a few at once, each exactly model-sized.
        self._assembler = gossip.ChunkAssembler(
            max_total_bytes=4 * model_bytes, max_pending=4,
            on_drop=None if seen is None else seen.forget_stream,
        )
        self.changed = asyncio.Event()

    def expect_finalized(self, round_: int | None) -> None:
        """Await RoundFinalized(round_) from now on (None: none); other rounds' candidates go."""
        if round_ != self.await_round:
            self.finalized.clear()
        self.await_round = round_

    def expect_model(self, from_round: int | None) -> None:
        """Await ModelChunk answers for ``from_round`` or a later round (None: none); candidates
        of earlier rounds go."""
        self.models = {} if from_round is None else {
            k: c for k, c in self.models.items() if c[0] >= from_round
        }
        self.await_model = from_round

    async def drain(self, queue: asyncio.Queue[Any]) -> None:
        while True:
            item = await queue.get()
            try:
                self._on_message(item.data, item.from_peer)
            except TenzroError as exc:
                log.debug("dropped a gossip message: %s", exc)

    def _check(self, data: bytes, model_hash: bytes, what: str) -> Any:
        weights = data if self._verify is None else self._verify(data, model_hash)
        if weights is None:
            self.counters["forged"] += 1
            log.warning("dropped a %s stream whose weights do not hash to 0x%s (%d such so far)",
                        what, model_hash.hex(), self.counters["forged"])
        return weights

    def _add(self, msg: Any, source: str | None) -> bytes | None:
        try:
            return self._assembler.add(msg, source)
        except GossipReject:
            self.counters["forged"] += 1
            log.warning("dropped a %s stream whose bytes do not match its data hash", type(msg).__name__)
            return None

    def _on_message(self, data: bytes, source: str | None = None) -> None:
        g = self._g
        msg = g.decode_message(data)
        if getattr(msg, "task_id", None) != self._task_id:
            return
        if isinstance(msg, (g.RoundFinalizedMsg, g.ModelChunk)) and msg.total_size != self._model_bytes:
            self._unexpected(msg, source)
            return
        if isinstance(msg, g.RoundFinalizedMsg):
            if msg.round != self.await_round or msg.data_hash in self.finalized \
                    or len(self.finalized) >= self.MAX_CANDIDATES:
                self._unexpected(msg, source)
                return
            whole = self._add(msg, source)
            if whole is not None and msg.round == self.await_round:
                weights = self._check(whole, msg.model_hash, "RoundFinalized")
                if weights is not None:
                    self.finalized[msg.data_hash] = (msg, weights)
                    self.changed.set()
        elif isinstance(msg, g.ModelChunk):
            if self.await_model is None or msg.round < self.await_model or msg.data_hash in self.models \
                    or len(self.models) >= self.MAX_CANDIDATES:
                self._unexpected(msg, source)
                return
            whole = self._add(msg, source)
            if whole is not None:
                weights = self._check(whole, msg.model_hash, "ModelChunk")
                if weights is not None:
                    self.models[msg.data_hash] = (msg.round, msg.model_hash, weights)
                    self.changed.set()
        elif isinstance(msg, g.RunSealedMsg):
            self.sealed = msg
            self.changed.set()

    def _unexpected(self, msg: Any, source: str | None) -> None:
        """Drop a weights chunk nobody awaits, and forget it in the validators' dedup cache:
        the node answers every ModelRequest with the SAME bytes, so a copy that arrived before
        this trainer asked (another trainer's answer) would otherwise make every later copy a
        "duplicate" that never reaches the inbox (seen in the e2e run: two trainers starved)."""
        self.counters["unexpected"] += 1
        if self._seen is not None:
            self._seen.forget_stream((source,) + self._g.compute_stream_key(msg))

    def discard_model(self, data_hash: bytes) -> None:
        """Forget a ModelChunk candidate the run does not commit (now), freeing its slot."""
        self.models.pop(data_hash, None)

    def discard_finalized(self, data_hash: bytes) -> None:
        """Forget a RoundFinalized candidate that turned out not to match the round record, so
        another (the real syncer's) can be reassembled for that round."""
        self.finalized.pop(data_hash, None)

    async def wait(self, timeout: float) -> None:
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            pass
