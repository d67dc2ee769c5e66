"""Tenzro Train: the protocol core and the node-side shells around it.

The modules directly in this package (spec, merkle, vrf, election, records, fragments,
payload, aggregation, ...) are the pure protocol core: plain functions over typed values,
no I/O. The subpackages ``node``, ``p2p`` and ``trainer`` and the ``cli`` module are the
shells that do I/O around that core (see README.md, "Architecture").
"""

__version__ = "0.1.0"
