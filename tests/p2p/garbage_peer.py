"""A hostile peer for transport tests: one bare py-libp2p host (no P2PHost, none of our fixes)
that dials ADDR, opens a gossipsub stream and writes one length-prefixed frame that is not a
pubsub RPC protobuf, then prints {"event": "sent"} and waits a second for the frame to be read.

Usage: python tests/p2p/garbage_peer.py MULTIADDR
"""

from __future__ import annotations

import json
import sys

import multiaddr
import trio
from libp2p import new_host
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.utils import encode_varint_prefixed

GARBAGE = b"\xff\xff\xff\xff not a protobuf"


async def main(addr: str) -> None:
    host = new_host()
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        await host.connect(info)
        stream = await host.new_stream(info.peer_id, [PROTOCOL_ID_V11])
        await stream.write(encode_varint_prefixed(GARBAGE))
        print(json.dumps({"event": "sent"}), flush=True)
        await trio.sleep(1.0)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
