"""A hostile peer for transport tests: one bare py-libp2p host (no P2PHost, none of our fixes)
that dials ADDR, opens a gossipsub stream and writes one length-prefixed frame, then prints
{"event": "sent"} and waits a second for the frame to be read.

Frames (``--frame``):
- ``garbage``: bytes that are not a pubsub RPC protobuf;
- ``signatures``: one well-formed RPC of three messages on ``tenzro/test/raw`` ("raw:<i>:"):
  i = 900 unsigned, 901 signed and then altered, 902 signed correctly by this peer.

Usage: python tests/p2p/garbage_peer.py MULTIADDR [--frame garbage|signatures]
"""

from __future__ import annotations

import argparse
import json

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
from libp2p.utils import encode_varint_prefixed

GARBAGE = b"\xff\xff\xff\xff not a protobuf"
RAW_TOPIC = "tenzro/test/raw"


def signatures_frame(host: IHost) -> bytes:
    def signed(i: int) -> rpc_pb2.Message:
        msg = rpc_pb2.Message(data=b"raw:%d:" % i, topicIDs=[RAW_TOPIC], from_id=host.get_id().to_bytes(),
                              seqno=i.to_bytes(8, "big"))
        signature = host.get_private_key().sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
        msg.key, msg.signature = host.get_public_key().serialize(), signature
        return msg

    unsigned = signed(900)
    unsigned.ClearField("signature")
    altered = signed(901)
    altered.data = b"raw:901:altered"
    return rpc_pb2.RPC(publish=[unsigned, altered, signed(902)]).SerializeToString()


async def main(addr: str, frame: str) -> None:
    host = new_host()
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        await host.connect(info)
        stream = await host.new_stream(info.peer_id, [PROTOCOL_ID_V11])
        await stream.write(encode_varint_prefixed(GARBAGE if frame == "garbage" else signatures_frame(host)))
        print(json.dumps({"event": "sent"}), flush=True)
        await trio.sleep(1.0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("--frame", choices=["garbage", "signatures"], default="garbage")
    args = ap.parse_args()
    trio.run(main, args.addr, args.frame)
