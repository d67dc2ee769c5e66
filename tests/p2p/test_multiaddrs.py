"""Multiaddr and config checks of p2p.host: what a node or trainer refuses before starting, and
the peer ids a trainer reads from its --bootstrap addresses (the only peers whose weights it takes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from libp2p.peer.id import ID

from tenzro_training.p2p.host import P2PConfig, P2PError, check_multiaddrs, get_peer_ids
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
    check_multiaddrs(("/ip4/0.0.0.0/tcp/0", "/ip6/::1/tcp/4001"), ())


@pytest.mark.parametrize("addr", ["/dns4/localhost/tcp/4001", "/dns/localhost/tcp/0", "/dns6/localhost/tcp/0"])
def test_a_listen_address_by_name_is_refused(addr: str) -> None:
    """py-libp2p 0.8.1 binds every interface (0.0.0.0 and ::) for a listen address by DNS name:
    an operator who wrote /dns4/localhost to keep the node on loopback had it reachable from
    anywhere (found by the p2p/host.py mutation campaign)."""
    with pytest.raises(P2PError, match=f"^listen address '{addr}' must start with /ip4/ or /ip6/: py-libp2p "
                                       f"listens on every interface for /{addr.split('/')[1]}/"):
        check_multiaddrs((addr,), ())


@pytest.mark.parametrize(("fields", "match"), [
    ({"listen": "/ip4/127.0.0.1/tcp/0"}, "^listen must be a sequence of multiaddr strings$"),
    ({"bootstrap": ["/ip4/127.0.0.1/tcp/0", 4001]}, "^bootstrap must be a sequence of multiaddr strings$"),
    ({"listen": ()}, "^listen must name at least one multiaddr$"),
    ({"max_rpc_bytes": 1 << 20}, r"^max_rpc_bytes must be an int in \(1 MiB, 64 MiB\]$"),
    ({"max_rpc_bytes": (64 << 20) + 1}, r"^max_rpc_bytes must be an int in \(1 MiB, 64 MiB\]$"),
    ({"max_rpc_bytes": float(8 << 20)}, r"^max_rpc_bytes must be an int in \(1 MiB, 64 MiB\]$"),
    ({"max_inbox_bytes": (8 << 20) - 1}, "^max_inbox_bytes must be an int >= max_rpc_bytes$"),
    ({"max_inbox_bytes": float(1 << 30)}, "^max_inbox_bytes must be an int >= max_rpc_bytes$"),
    ({"publish_timeout_s": 0}, "^publish_timeout_s must be a positive number$"),
    ({"stop_timeout_s": -1.0}, "^stop_timeout_s must be a positive number$"),
    ({"connect_timeout_s": "10"}, "^connect_timeout_s must be a positive number$"),
    ({"redial_interval_s": 0.0}, "^redial_interval_s must be a positive number$"),
])
def test_invalid_p2p_config_is_refused_naming_the_field(tmp_path: Path, fields: dict[str, Any], match: str) -> None:
    """A node's or trainer's p2p settings are checked when the config is made: a bad value is one
    error naming the field, before a key is created or a port bound (a zero timeout would make
    every publish or dial give up at once, a tiny RPC size would drop every payload chunk)."""
    with pytest.raises(ValueError, match=match):
        P2PConfig(key_path=tmp_path / "k", **fields)


def test_p2p_config_edges_and_defaults_are_those_documented(tmp_path: Path) -> None:
    """The documented defaults (docs/gossip.md: redial every 5 s, a publish waits at most
    publish_timeout_s) and the edges of the ranges: an RPC size just over 1 MiB and exactly
    64 MiB, an inbox exactly one RPC; lists are taken as tuples, a key path as a Path."""
    config = P2PConfig(key_path=str(tmp_path / "k"))  # type: ignore[arg-type]
    assert config.key_path == tmp_path / "k" and isinstance(config.key_path, Path)
    assert (config.listen, config.bootstrap) == (("/ip4/127.0.0.1/tcp/0",), ())
    assert (config.max_rpc_bytes, config.max_inbox_bytes) == (8 << 20, 512 << 20)
    assert (config.publish_timeout_s, config.stop_timeout_s, config.connect_timeout_s, config.redial_interval_s) == (
        30.0, 10.0, 10.0, 5.0)
    for rpc in ((1 << 20) + 1, 64 << 20):
        edge = P2PConfig(key_path=tmp_path / "k", listen=["/ip4/0.0.0.0/tcp/0"], max_rpc_bytes=rpc, max_inbox_bytes=rpc)
        assert edge.listen == ("/ip4/0.0.0.0/tcp/0",) and edge.max_inbox_bytes == rpc
    with pytest.raises(TypeError):
        P2PConfig(tmp_path / "k")  # type: ignore[misc]  # keywords only: no field taken for another
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.listen = ("/ip4/0.0.0.0/tcp/0",)  # type: ignore[misc]  # the host holds it: it cannot change under it


def test_a_p2p_config_with_a_bad_multiaddr_is_a_p2p_error(tmp_path: Path) -> None:
    """The config checks its addresses itself: whoever makes one (node, trainer, a script) gets
    the address error at once, not a dial retried every few seconds for ever."""
    with pytest.raises(P2PError, match="bootstrap address '/ip4/127.0.0.1/tcp/4001' is not a multiaddr ending in /p2p/<peer id>"):
        P2PConfig(key_path=tmp_path / "k", bootstrap=("/ip4/127.0.0.1/tcp/4001",))
