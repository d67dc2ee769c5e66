"""The p2p shell: a libp2p gossipsub host in its own trio thread behind a small asyncio API.

What it is: :class:`~tenzro_training.p2p.host.P2PHost` (the host), :class:`P2PConfig`, the
tuned py-libp2p Pubsub and GossipSub it runs (:mod:`.pubsub`), libp2p message signatures
(:mod:`.signing`) and the persisted peer identity (:func:`load_or_create_peer_key`). What it is
NOT: the gossip rules; those are pure and live in :mod:`tenzro_training.gossip`.
"""

from tenzro_training.p2p.host import GossipMessage, P2PConfig, P2PError, P2PHost
from tenzro_training.p2p.keys import PeerKeyError, load_or_create_peer_key

__all__ = ["GossipMessage", "P2PConfig", "P2PError", "P2PHost", "PeerKeyError", "load_or_create_peer_key"]
