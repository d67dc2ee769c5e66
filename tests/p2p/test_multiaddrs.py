"""Multiaddr checks of p2p.host: what a node or trainer refuses before starting, and the peer
ids a trainer reads from its --bootstrap addresses (the only peers whose weights it takes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from libp2p.peer.id import ID

from tenzro_training.p2p.host import P2PError, check_multiaddrs, get_peer_ids
from tenzro_training.p2p.keys import load_or_create_peer_key


def test_peer_ids_are_those_the_bootstrap_addresses_name(tmp_path: Path) -> None:
    ids = [ID.from_pubkey(load_or_create_peer_key(tmp_path / f"k{i}").public_key).to_base58() for i in range(2)]
    addrs = (f"/ip4/127.0.0.1/tcp/4001/p2p/{ids[0]}", f"/dns4/node.example/tcp/4002/p2p/{ids[1]}",
             f"/ip4/10.0.0.1/tcp/4003/p2p/{ids[0]}")
    assert get_peer_ids(addrs) == frozenset(ids)
    assert get_peer_ids(()) == frozenset()


@pytest.mark.parametrize("addr", ["garbage", "/ip4/127.0.0.1/tcp/4001", "/ip4/127.0.0.1/tcp/4001/p2p/notapeerid"])
def test_invalid_bootstrap_address_is_a_p2p_error(addr: str) -> None:
    with pytest.raises(P2PError, match="not a multiaddr"):
        get_peer_ids((addr,))
    with pytest.raises(P2PError, match="bootstrap address"):
        check_multiaddrs((), (addr,))


def test_invalid_listen_address_is_a_p2p_error() -> None:
    with pytest.raises(P2PError, match="listen address 'nope' is not a multiaddr"):
        check_multiaddrs(("nope",), ())
    check_multiaddrs(("/ip4/0.0.0.0/tcp/0",), ())
