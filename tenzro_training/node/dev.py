"""Dev genesis: deterministic, funded accounts and syncer candidates for ``tenzro node --dev``.

What this module is: :func:`dev_genesis`, which derives a sponsor, ``trainers`` trainers and
``syncers`` syncer candidates from fixed seeds (the same keys on every machine, like anvil's or
hardhat's dev accounts), funds each through ``NodeConfig.genesis``, registers the syncers as
election candidates whose VRF secrets the node holds (so a lone dev node can run elections), and
writes ``<data_dir>/dev-accounts.json`` (mode 0600) so the CLI and tests can sign as any of them.

What it is NOT: anything safe for real value. Every key here is public knowledge (derivable from
this file); a dev node is for demos and tests. The node never holds the syncers' secp256k1 keys:
the syncer daemon reads them from dev-accounts.json (``--key-file``) and signs finalizeRound itself.

Derivation (documented so another implementation can reproduce the accounts):
- secp256k1 private key of ``role`` number ``i`` = SHA-256(``"tenzro-dev-account/<role>/<i>"``)
  (re-hashed with a ``"/retry"`` suffix in the astronomically unlikely case it is not a valid
  scalar); the sponsor is ``sponsor/0``;
- a syncer's ECVRF secret = SHA-256(``"tenzro-dev-vrf/syncer/<i>"``).

Dev timings (:data:`DEV_TIMINGS`): election window 1 s, enrollment window 60 s, round timeout
10 min, finalize window 10 s before failover, no minimum stake. A ``--config`` file overrides
them (and anything else) for a node started with ``--dev``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Final

from tenzro_training import auth, vrf
from tenzro_training.addresses import Address, format_address
from tenzro_training.node.config import SyncerIdentity
from tenzro_training.records import Candidate
from tenzro_training.run_state import RunTimings

__all__ = [
    "DEV_ACCOUNTS_FILE",
    "DEV_BALANCE",
    "DEV_SYNCER_STAKE",
    "DEV_TIMINGS",
    "compute_dev_private_key",
    "compute_dev_vrf_secret",
    "dev_accounts",
    "dev_genesis",
]

DEV_ACCOUNTS_FILE: Final = "dev-accounts.json"
DEV_BALANCE: Final = 10**24
"""1,000,000 TNZO (18 decimals) credited to every dev account."""
DEV_SYNCER_STAKE: Final = 10**21
"""Stake registered for every dev syncer candidate (equal stakes: each is equally likely to win)."""
DEV_TIMINGS: Final = RunTimings(
    election_window_ms=1_000,
    enrollment_window_ms=60_000,
    round_timeout_ms=600_000,
    finalize_window_ms=10_000,
    min_stake=0,
)

_SECP256K1_N: Final = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_ROLES: Final = ("sponsor", "trainer", "syncer")


def compute_dev_private_key(role: str, index: int) -> bytes:
    """The dev secp256k1 private key of ``role`` number ``index`` (see the module docstring)."""
    if role not in _ROLES or isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"dev account must be one of {_ROLES} with an index >= 0, got {role!r} {index!r}")
    seed = f"tenzro-dev-account/{role}/{index}".encode()
    key = hashlib.sha256(seed).digest()
    while not 0 < int.from_bytes(key, "big") < _SECP256K1_N:  # probability ~2^-128
        seed += b"/retry"
        key = hashlib.sha256(seed).digest()
    return key


def compute_dev_vrf_secret(index: int) -> bytes:
    """The ECVRF secret of dev syncer ``index``."""
    return hashlib.sha256(f"tenzro-dev-vrf/syncer/{index}".encode()).digest()


def _address_of(private_key: bytes) -> Address:
    # Recover the address through the same EIP-712 path the node uses, so a key that signs
    # here is exactly the address the node will recover.
    from eth_account import Account

    return Address(bytes.fromhex(Account.from_key(private_key).address[2:]))


def dev_accounts(*, trainers: int = 8, syncers: int = 3, balance: int = DEV_BALANCE) -> list[dict[str, Any]]:
    """The dev accounts in file order: sponsor, trainers 0.., syncers 0.."""
    if trainers < 0 or syncers < 0:
        raise ValueError("trainers and syncers must be >= 0")
    roles = [("sponsor", 0)] + [("trainer", i) for i in range(trainers)] + [("syncer", i) for i in range(syncers)]
    out: list[dict[str, Any]] = []
    for role, index in roles:
        key = compute_dev_private_key(role, index)
        entry: dict[str, Any] = {
            "role": role,
            "index": index,
            "address": format_address(_address_of(key)),
            "private_key": "0x" + key.hex(),
            "balance": str(balance),
        }
        if role == "trainer":
            entry["did"] = f"did:tenzro:trainer:dev-{index}"
        if role == "sponsor":
            entry["did"] = "did:tenzro:human:dev-sponsor"
        if role == "syncer":
            secret = compute_dev_vrf_secret(index)
            entry["vrf_secret"] = "0x" + secret.hex()
            entry["vrf_public_key"] = "0x" + vrf.public_key(secret).hex()
            entry["stake"] = str(DEV_SYNCER_STAKE)
        out.append(entry)
    return out


def _stage_private(path: Path, text: str) -> Path:
    """Write ``text`` beside ``path``, readable by the owner only and fsynced, and return that
    temporary; :func:`_publish` renames it into place. A ``path`` that is a directory is refused
    here (OSError EISDIR), before anything is written, as the rename would refuse it."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older tmp file may have had a wider mode
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _publish(tmp: Path, path: Path) -> None:
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only, atomically (tmp + rename)."""
    _publish(_stage_private(path, text), path)


def write_dev_accounts(data_dir: Path, document: dict[str, Any]) -> None:
    """Write ``data_dir/dev-accounts.json`` (mode 600, atomically), creating ``data_dir``."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    _write_private(data_dir / DEV_ACCOUNTS_FILE, json.dumps(document, indent=2) + "\n")


class StagedDevAccounts:
    """``data_dir/dev-accounts.json`` written in two steps, for ``tenzro node --dev``: staged
    (a full, fsynced temporary) before the store is opened, so that a path that cannot be written
    is refused before anything else is created; published (renamed into place) only once the
    store has accepted the config's chain id and genesis, so that a refused start does not leave
    the file naming a chain id the store was not created for (ops probe). ``discard`` removes a
    temporary that was never published."""

    def __init__(self, data_dir: Path, document: dict[str, Any]) -> None:
        self.path = Path(data_dir) / DEV_ACCOUNTS_FILE
        self._tmp: Path | None = _stage_private(self.path, json.dumps(document, indent=2) + "\n")

    def publish(self) -> None:
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            _publish(tmp, self.path)

    def discard(self) -> None:
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def dev_genesis(
    data_dir: Path, *, trainers: int = 8, syncers: int = 3, chain_id: int = auth.DEFAULT_CHAIN_ID,
    write: bool = True,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Derive the dev accounts, write ``data_dir/dev-accounts.json`` (unless ``write`` is false:
    :func:`write_dev_accounts` writes it later) and return ``(node_config_kwargs,
    accounts_document)``.

    ``node_config_kwargs`` holds ``chain_id``, ``timings`` (:data:`DEV_TIMINGS`), ``genesis``
    (every account funded with :data:`DEV_BALANCE`), ``candidates`` (the syncers, stake
    :data:`DEV_SYNCER_STAKE`) and ``syncer_identities`` (their VRF secrets): pass them to
    ``NodeConfig(**kwargs, data_dir=...)`` or merge them under a config file's values.
    Calling it again gives the same accounts (the file is rewritten with the same content).
    """
    accounts = dev_accounts(trainers=trainers, syncers=syncers)
    document = {
        "chain_id": chain_id,
        "warning": "dev keys are public: never use them for anything of value",
        "accounts": accounts,
    }
    if write:
        write_dev_accounts(data_dir, document)

    genesis = tuple((bytes.fromhex(a["address"][2:]), DEV_BALANCE) for a in accounts)
    candidates: list[Candidate] = []
    identities: list[SyncerIdentity] = []
    for a in accounts:
        if a["role"] != "syncer":
            continue
        address = Address(bytes.fromhex(a["address"][2:]))
        secret = bytes.fromhex(a["vrf_secret"][2:])
        candidates.append(Candidate(address, vrf.public_key(secret), DEV_SYNCER_STAKE))
        identities.append(SyncerIdentity(address=address, vrf_secret=secret))
    kwargs: dict[str, Any] = {
        "chain_id": chain_id,
        "timings": DEV_TIMINGS,
        "genesis": genesis,
        "candidates": tuple(candidates),
        "syncer_identities": tuple(identities),
    }
    return kwargs, document
