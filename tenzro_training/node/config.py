"""The node's configuration: :class:`NodeConfig` and the JSON config file it is read from.

What this module is: two frozen values, :class:`SyncerIdentity` (a syncer candidate whose VRF
secret this node holds, so it can ticket that candidate in every election) and
:class:`NodeConfig` (data directory, chain id, run timings, registered candidates, genesis
balances, limits, RPC address), with ``from_dict``/``to_dict`` for the JSON file format that
``docs/node.md`` documents. Every value is checked on construction; a bad file raises
:class:`ConfigError` naming the offending field.

What it is NOT: the command line (``node/main.py`` merges the file, ``--dev`` and flags) or the
service (``node/service.py``). Nothing here opens a file or a socket.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from rpc.dispatcher import DEFAULT_MAX_ANSWER_BYTES, DEFAULT_MAX_BATCH, DEFAULT_MAX_BATCH_SECONDS
from storage.interface import WAL_RECOVERY_MODES
from storage.external import EXTERNAL_VALUE_BYTES
from tenzro_training import vrf
from tenzro_training.addresses import AddressError, format_address, parse_address
from tenzro_training.errors import EncodingError, TenzroError, VRFError
from tenzro_training.receipt_abi import MAX_RECEIPT_BYTES
from tenzro_training.records import Candidate
from tenzro_training.run_state import RunTimings

if TYPE_CHECKING:  # the server (aiohttp) is imported only where limits are built
    from rpc.server import ServerLimits

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CHECKPOINT_BYTES",
    "DEFAULT_MAX_GRADIENT_ABS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "ConfigError",
    "NodeConfig",
    "SyncerIdentity",
]

DEFAULT_MAX_PAYLOAD_BYTES: Final = 64 << 20
DEFAULT_MAX_BODY_BYTES: Final = 96 << 20
DEFAULT_MAX_CHECKPOINT_BYTES: Final = 16 << 30
DEFAULT_MAX_GRADIENT_ABS: Final = 1e6
"""An outer gradient is the change of a weight over H inner steps: O(lr * H), far below 1 for
any sane run; 1e6 leaves six orders of magnitude of headroom and still cannot overflow."""
DEFAULT_MIN_STAKE: Final = 10**18
"""1 TNZO, what `tenzro trainer run` stakes by default. A free stake would make enrolling and
then staying silent (a failed run) or equivocating (a slash of nothing) cost an attacker
nothing; an operator who wants that (a private deployment) sets ``timings.min_stake`` to "0"."""
DEFAULT_TIMINGS: Final = RunTimings(min_stake=DEFAULT_MIN_STAKE)
DEFAULT_MAX_GRACE_WINDOW_MS: Final = 3_600_000
"""A spec's straggler window, once a round reaches quorum, is the only deadline left on it, and a
run in Training cannot be cancelled: a spec with a window of years lets one silent trainer lock
the escrow and every stake for that long. One hour, the default round timeout."""
DEFAULT_MAX_RECEIPT_BYTES: Final = 768 * 1024
"""Largest receipt a posted spec's run may seal (``receipt_abi.compute_receipt_size_bound``).
A claim carries the whole receipt in one transaction: measured with the shipped escrow on
py-evm (Prague), a worst-case receipt of this size claims in 18.5-20.8M gas, inside a 30M block
with room to spare (tests/chain/test_escrow.py; EIP-7623's calldata floor dominates), and the
precompile's absolute cap (MAX_RECEIPT_BYTES, 4 MiB) is far beyond what any block carries.
About 124 rounds for 12 fragments and 8 trainers (docs/receipt.md "Receipt size")."""
DEFAULT_MAX_TRAINER_COUNT: Final = 256
"""Largest ``trainer_count`` a posted spec may ask for. A claim credits every payee in the same
transaction (~36K gas each: a fresh storage slot, an event), on top of the receipt's calldata:
the worst-case receipt of 256 trainers at ``max_receipt_bytes`` claims in 22.0M gas, and ~900
trainers no longer fit a 30M block whatever the receipt's size (tests/chain/test_escrow.py)."""
_MAX_JSON_INT: Final = 2**53 - 1
_F32_MAX: Final = 3.4028234663852886e38
_U256: Final = 2**256
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,77}")
_HEX32 = re.compile(r"0x[0-9a-fA-F]{64}")

_TOP_KEYS: Final = (
    "chain_id", "timings", "candidates", "syncer_identities", "genesis", "sync_writes", "wal_recovery",
    "external_value_bytes", "max_payload_bytes", "max_checkpoint_bytes", "allowed_checkpoint_dirs", "rpc_host",
    "rpc_port", "max_body_bytes", "model_cache_runs", "model_cache_bytes", "model_snapshot_rounds", "payload_cache_bytes",
    "prune_payloads", "rpc_max_batch", "max_gradient_abs", "max_grace_window_ms", "max_receipt_bytes",
    "max_trainer_count", "rpc_max_connections", "rpc_max_connections_per_ip", "rpc_idle_timeout_ms",
    "rpc_read_timeout_ms", "rpc_max_inflight_bytes", "rpc_max_batch_answer_bytes", "rpc_max_batch_ms",
    "min_reward_pool", "max_open_runs", "max_open_runs_per_sponsor", "serve_artifacts",
)
_TIMING_KEYS: Final = (
    "election_window_ms", "enrollment_window_ms", "round_timeout_ms", "finalize_window_ms", "min_stake",
)


class ConfigError(TenzroError, ValueError):
    """The node configuration is invalid; ``path`` names the field (e.g. ``genesis[2].balance``)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)


# --- field checks ----------------------------------------------------------------------------


def _int(path: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(path, f"expected an integer in {lo}..{hi}, got {value!r}")
    return value


def _positive_float(path: str, value: object) -> float:
    """A finite number in (0, float32 max], as a float (JSON integers accepted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= _F32_MAX:
        raise ConfigError(path, f"expected a number in (0, {_F32_MAX:g}], got {value!r}")
    return float(value)


def _bool(path: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, f"expected true or false, got {value!r}")
    return value


def _amount(path: str, value: object) -> int:
    """A uint256 written as a decimal string (preferred) or a JSON integer."""
    if isinstance(value, str):
        if _DECIMAL.fullmatch(value) is None:
            raise ConfigError(path, f"expected a decimal uint256 string, got {value!r}")
        value = int(value)
    return _int(path, value, 0, _U256 - 1)


def _address(path: str, value: object) -> bytes:
    if isinstance(value, bytes):
        if len(value) != 20:
            raise ConfigError(path, f"expected 20 bytes, got {len(value)}")
        return value
    try:
        return parse_address(value)
    except AddressError as exc:
        raise ConfigError(path, exc.reason) from None


def _hex32(path: str, value: object) -> bytes:
    if isinstance(value, bytes):
        if len(value) != 32:
            raise ConfigError(path, f"expected 32 bytes, got {len(value)}")
        return value
    if not isinstance(value, str) or _HEX32.fullmatch(value) is None:
        raise ConfigError(path, "expected 0x + 64 hex digits")
    return bytes.fromhex(value[2:])


def _obj(
    path: str, value: object, allowed: tuple[str, ...], required: tuple[str, ...] = ()
) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"expected an object, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}" if path else unknown[0], "unknown field")
    missing = [k for k in required if k not in value]
    if missing:
        raise ConfigError(f"{path}.{missing[0]}" if path else missing[0], "missing")
    return value


def _list(path: str, value: object) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(path, f"expected an array, got {type(value).__name__}")
    return value


# --- values ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncerIdentity:
    """A syncer candidate this node tickets itself (SPEC.md "VRF syncer election")."""

    address: bytes
    """20-byte EVM address of the syncer (its secp256k1 key signs finalizeRound; the node does
    NOT hold it)."""
    vrf_secret: bytes
    """32-byte ECVRF secret: the node tickets this candidate itself in every election."""

    def __post_init__(self) -> None:
        _address("syncer_identity.address", self.address)
        if not isinstance(self.vrf_secret, bytes) or len(self.vrf_secret) != 32:
            raise ConfigError("syncer_identity.vrf_secret", "expected 32 bytes")

    @property
    def vrf_public_key(self) -> bytes:
        """The ECVRF public key of :attr:`vrf_secret`."""
        try:
            return vrf.public_key(self.vrf_secret)
        except VRFError as exc:
            raise ConfigError("syncer_identity.vrf_secret", str(exc)) from None

    def __repr__(self) -> str:  # never print a secret into a log
        return f"SyncerIdentity(address={format_address(self.address)}, vrf_secret=<hidden>)"


_ENVELOPE_BYTES: Final = 4096
"""A submitOuterGradient request's JSON-RPC envelope besides its base64 payload (the method,
task id, round, fragment and a 65-byte signature in hex: well under this)."""



def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeConfig:
    """Everything a node needs besides its store. Checked on construction (ConfigError)."""

    data_dir: Path | None = None
    """None -> in-memory store (tests); else RocksDB at data_dir/"db", final models in
    data_dir/"models"."""
    chain_id: int = 1337
    """EIP-712 domain chain id every signature is checked under."""
    timings: RunTimings = DEFAULT_TIMINGS
    """Windows (ms) and min_stake, copied into each run when it is posted (a config that lists
    only some of them keeps these defaults for the rest)."""
    max_grace_window_ms: int = DEFAULT_MAX_GRACE_WINDOW_MS
    """Largest ``grace_window_ms`` a posted spec may ask for (postTask refuses a larger one)."""
    max_receipt_bytes: int = DEFAULT_MAX_RECEIPT_BYTES
    """Largest receipt a posted spec's run could seal (postTask refuses a spec whose bound is
    larger: its trainers could not be paid, the claim would not fit a block)."""
    max_trainer_count: int = DEFAULT_MAX_TRAINER_COUNT
    """Largest ``trainer_count`` a posted spec may ask for (postTask refuses more: one claim
    credits every payee)."""
    min_reward_pool: int = 1
    """Smallest ``reward_pool`` (attoTNZO; a decimal string in the config file) postTask accepts.
    A post costs the node a model snapshot on disk and a layout in memory; with a pool of 0, a key
    holding nothing could post without limit (malicious-participant probe, 2026-11-26). 1 makes
    every sponsor a funded account. It is a deposit, refunded when the run is cancelled or fails,
    not a price (docs/node.md)."""
    max_open_runs: int = 1024
    """Most runs not yet Sealed, Failed or Cancelled the node holds; postTask refuses more (1317)."""
    max_open_runs_per_sponsor: int = 64
    """Most such runs of one sponsor address; postTask refuses more (1317)."""
    candidates: tuple[Candidate, ...] = ()
    """Registered syncer candidates (address, VRF public key, stake): the election's inputs."""
    syncer_identities: tuple[SyncerIdentity, ...] = ()
    """The node's own candidates (each must be registered in ``candidates`` with the VRF key of
    its secret)."""
    genesis: tuple[tuple[bytes, int], ...] = ()
    """(address, attoTNZO) balances credited once, when the store is first created."""
    sync_writes: bool = False
    """fsync every batch (survives power loss); the WAL is always on either way."""
    wal_recovery: str = "strict"
    """How the store's open replays its write-ahead log (``storage.interface.WAL_RECOVERY_MODES``):
    ``strict`` refuses a log damaged before its end; ``point_in_time`` opens it anyway,
    dropping every batch after the damage (an operator's explicit choice)."""
    external_value_bytes: int = EXTERNAL_VALUE_BYTES
    """Size from which the store keeps a payload or a model fragment in a file of its own beside
    the database rather than through its write-ahead log (``storage.rocks.RocksStore``,
    docs/storage.md "Large values"). Files are cheaper from a few KiB up on a local filesystem."""
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    """Largest outer-gradient payload accepted (inline or over gossip)."""
    max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES
    """Largest init checkpoint file the node reads."""
    allowed_checkpoint_dirs: tuple[Path, ...] = ()
    """file:// init checkpoints must lie under one of these (after resolving symlinks);
    () = anywhere the node can read."""
    rpc_host: str = "127.0.0.1"
    rpc_port: int = 8545
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Largest JSON-RPC request body (a base64 payload is 4/3 of its bytes)."""
    rpc_max_batch: int = DEFAULT_MAX_BATCH
    """Most requests one JSON-RPC batch may hold; a larger batch is refused whole (-32600)."""
    rpc_max_connections: int = 512
    """Open JSON-RPC connections at once (``rpc.server.ServerLimits``; docs/rpc.md "Resource limits")."""
    rpc_max_connections_per_ip: int = 128
    """Open JSON-RPC connections from one IP address."""
    rpc_idle_timeout_ms: int = 30_000
    """A JSON-RPC connection without a whole request head this long is closed."""
    rpc_read_timeout_ms: int = 60_000
    """A JSON-RPC request body must arrive within this long (408)."""
    rpc_max_inflight_bytes: int | None = None
    """Bytes all JSON-RPC requests may hold at once (bodies and answers); None: 4 x max_body_bytes."""
    rpc_max_batch_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    """A batch's answer past this many bytes refuses its remaining elements."""
    rpc_max_batch_ms: int = int(DEFAULT_MAX_BATCH_SECONDS * 1000)
    """A batch that has held the service thread this long refuses its remaining elements."""
    max_gradient_abs: float = DEFAULT_MAX_GRADIENT_ABS
    """Largest magnitude of an outer-gradient value the node accepts (inline or over gossip).
    Finite but huge values (float32 max) would overflow a Mean or the outer step, and a round
    that no syncer can finalize fails the run with the attacker's stake refunded; within this
    bound no round can overflow: the weights move by at most 7x the bound per round."""
    model_cache_runs: int = 16
    """Runs whose committed fp32 weights and momentum stay in memory between finalizes (8 bytes
    per parameter each), so a finalize steps them in place instead of rebuilding them from the
    store; 0 turns the cache off (every finalize rebuilds them: slower, no memory held). Within
    :attr:`model_cache_bytes`."""
    model_cache_bytes: int = 1 << 30
    """Bytes the runs in the model cache may hold together, but never fewer than 2 runs (or
    ``model_cache_runs`` if lower) are kept for it: two large runs evicting each other would
    each replay up to ``model_snapshot_rounds`` - 1 rounds at every finalize; 0 means 2 runs
    whatever their size, as before this setting existed. Until 2026-11-26 the cache held 2 runs
    whatever their size: with 5 small runs on one node, nearly every finalize rebuilt its model
    from the store (multi-run probe: 19-26 rebuilds for 15 finalizes)."""
    model_snapshot_rounds: int = 8
    """Write a run's weights and momentum to the store every this many rounds (1 = every
    round). Between snapshots the committed state is the snapshot plus the rounds after it,
    replayed from their stored payloads (and checked against their committed hashes) when the
    cache above does not hold it: after a restart, an eviction, or a failed finalize."""
    payload_cache_bytes: int = 512 * 1024 * 1024
    """Bytes of accepted outer-gradient payloads of open rounds kept in memory, so a finalize
    does not read back what it was just sent (payloads past the budget are read from the
    store); 0 turns it off."""
    prune_payloads: bool = False
    """False (archive, the default): keep every accepted payload, so ``tenzro audit`` and third
    parties can recompute any round of any run from its checkpoint. True: delete the payloads
    the node no longer needs, those of an open run's rounds before its latest model snapshot
    (deleted in the snapshot's batch) and all of a run's once it is Sealed, Cancelled or Failed
    (in that transition's batch). The submission records (hashes and signatures) stay."""
    serve_artifacts: bool = True
    """Serve run artifacts on the RPC port (``GET /artifacts/v1/runs/...``, docs/rpc.md "Run
    artifacts over HTTP"): committed rounds' payloads, sealed runs' final models, init
    checkpoints, so that a third party can recompute a sealed run from the node's URL alone.
    False: those paths are 404 like any unknown one (a node that must not give out models)."""

    def __post_init__(self) -> None:
        if self.data_dir is not None and not isinstance(self.data_dir, Path):
            object.__setattr__(self, "data_dir", Path(self.data_dir))
        _int("chain_id", self.chain_id, 1, _U256 - 1)
        if not isinstance(self.timings, RunTimings):
            raise ConfigError("timings", "expected a RunTimings")
        candidates = tuple(self.candidates)
        for i, c in enumerate(candidates):
            if not isinstance(c, Candidate):
                raise ConfigError(f"candidates[{i}]", "expected a Candidate")
        if len({c.address for c in candidates}) != len(candidates):
            raise ConfigError("candidates", "an address is registered twice")
        if len({c.vrf_public_key for c in candidates}) != len(candidates):
            raise ConfigError("candidates", "two candidates share a VRF public key")
        object.__setattr__(self, "candidates", candidates)
        identities = tuple(self.syncer_identities)
        registered = {c.address: c for c in candidates}
        for i, ident in enumerate(identities):
            if not isinstance(ident, SyncerIdentity):
                raise ConfigError(f"syncer_identities[{i}]", "expected a SyncerIdentity")
            cand = registered.get(ident.address)
            if cand is None:
                raise ConfigError(
                    f"syncer_identities[{i}].address", f"{format_address(ident.address)} is not a registered candidate"
                )
            if cand.vrf_public_key != ident.vrf_public_key:
                raise ConfigError(
                    f"syncer_identities[{i}].vrf_secret", "its public key differs from the candidate's registered key"
                )
        if len({ident.address for ident in identities}) != len(identities):
            raise ConfigError("syncer_identities", "an address is listed twice")
        object.__setattr__(self, "syncer_identities", identities)
        genesis = tuple((_address(f"genesis[{i}].address", a), _amount(f"genesis[{i}].balance", b))
                        for i, (a, b) in enumerate(self._genesis_pairs()))
        if len({a for a, _ in genesis}) != len(genesis):
            raise ConfigError("genesis", "an address is listed twice")
        if sum(b for _, b in genesis) >= _U256:
            raise ConfigError("genesis", "the balances add up to more than a uint256")
        object.__setattr__(self, "genesis", genesis)
        _bool("sync_writes", self.sync_writes)
        if self.wal_recovery not in WAL_RECOVERY_MODES:
            raise ConfigError("wal_recovery", f"expected one of {', '.join(WAL_RECOVERY_MODES)}")
        _int("external_value_bytes", self.external_value_bytes, 1, 2**40)
        _int("max_payload_bytes", self.max_payload_bytes, 1, 2**40)
        _int("max_checkpoint_bytes", self.max_checkpoint_bytes, 1, 2**50)
        dirs = tuple(Path(d) for d in self.allowed_checkpoint_dirs)
        for i, d in enumerate(dirs):
            if not d.is_absolute():
                raise ConfigError(f"allowed_checkpoint_dirs[{i}]", f"must be an absolute path, got {str(d)!r}")
        object.__setattr__(self, "allowed_checkpoint_dirs", dirs)
        if not isinstance(self.rpc_host, str) or not self.rpc_host:
            raise ConfigError("rpc_host", "expected a non-empty string")
        if len(self.rpc_host) > 253 or any(not 0x20 < ord(c) < 0x7F for c in self.rpc_host):
            raise ConfigError("rpc_host", "expected a host name or IP address (printable ASCII, no spaces)")
        _int("rpc_port", self.rpc_port, 0, 65535)
        _int("max_body_bytes", self.max_body_bytes, 1024, 2**40)
        _int("rpc_max_batch", self.rpc_max_batch, 1, 1_000_000)
        _int("rpc_max_connections", self.rpc_max_connections, 1, 1_000_000)
        _int("rpc_max_connections_per_ip", self.rpc_max_connections_per_ip, 1, 1_000_000)
        _int("rpc_idle_timeout_ms", self.rpc_idle_timeout_ms, 1, 86_400_000)
        _int("rpc_read_timeout_ms", self.rpc_read_timeout_ms, 1, 86_400_000)
        if self.rpc_max_inflight_bytes is not None:
            # At least one whole body: a largest request must be able to run alone.
            _int("rpc_max_inflight_bytes", self.rpc_max_inflight_bytes, self.max_body_bytes, 2**50)
        _int("rpc_max_batch_answer_bytes", self.rpc_max_batch_answer_bytes, 1, 2**40)
        _int("rpc_max_batch_ms", self.rpc_max_batch_ms, 1, 86_400_000)
        object.__setattr__(self, "max_gradient_abs", _positive_float("max_gradient_abs", self.max_gradient_abs))
        _int("model_cache_runs", self.model_cache_runs, 0, 1024)
        _int("model_cache_bytes", self.model_cache_bytes, 0, 2**50)
        _int("model_snapshot_rounds", self.model_snapshot_rounds, 1, 2**32)
        _int("payload_cache_bytes", self.payload_cache_bytes, 0, 2**50)
        _bool("prune_payloads", self.prune_payloads)
        _bool("serve_artifacts", self.serve_artifacts)
        _int("max_grace_window_ms", self.max_grace_window_ms, 0, _MAX_JSON_INT)
        _int("max_receipt_bytes", self.max_receipt_bytes, 1, MAX_RECEIPT_BYTES)
        _int("max_trainer_count", self.max_trainer_count, 1, _MAX_JSON_INT)
        object.__setattr__(self, "min_reward_pool", _amount("min_reward_pool", self.min_reward_pool))
        _int("max_open_runs", self.max_open_runs, 1, _MAX_JSON_INT)
        _int("max_open_runs_per_sponsor", self.max_open_runs_per_sponsor, 1, _MAX_JSON_INT)

    def _genesis_pairs(self) -> list[tuple[object, object]]:
        pairs = []
        for i, entry in enumerate(_list("genesis", self.genesis)):
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise ConfigError(f"genesis[{i}]", "expected an (address, balance) pair")
            pairs.append((entry[0], entry[1]))
        return pairs

    # --- readers ---------------------------------------------------------------------------

    def advice(self) -> tuple[str, ...]:
        """Settings that are valid one by one but work against each other, or expose the node: one
        line each, for the node to log as warnings at start. Not refusals: each has a setup where
        it is what the operator wants (payloads that only ever come over gossip; a deliberately
        patient failover; a public host behind a proxy that vets sponsors)."""
        out = []
        inline = 4 * -(-self.max_payload_bytes // 3) + _ENVELOPE_BYTES
        if inline > self.max_body_bytes:
            out.append(f"max_payload_bytes {self.max_payload_bytes} does not fit a JSON-RPC body: base64-encoded it "
                       f"takes ~{inline} bytes, above max_body_bytes {self.max_body_bytes}; payloads that large can "
                       f"only arrive over gossip")
        t = self.timings
        if t.finalize_window_ms >= t.round_timeout_ms:
            out.append(f"timings.finalize_window_ms {t.finalize_window_ms} is not shorter than timings.round_timeout_ms "
                       f"{t.round_timeout_ms}: a silent syncer holds a round longer than its trainers had to train it "
                       f"before the next candidate takes over")
        if not _is_loopback(self.rpc_host) and not self.allowed_checkpoint_dirs:
            out.append(f"rpc_host {self.rpc_host} may be reachable from other hosts and allowed_checkpoint_dirs is empty: "
                       f"any funded sponsor can make the node read and hash any file it can read "
                       f"(docs/node.md \"Running on a public host\")")
        return tuple(out)

    def get_candidate(self, address: bytes) -> Candidate | None:
        """The registered candidate with this address, or None."""
        for candidate in self.candidates:
            if candidate.address == address:
                return candidate
        return None

    # --- JSON ------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, obj: object, *, data_dir: Path | None) -> NodeConfig:
        """Read the JSON config file format (docs/node.md). Every key is optional (absent =
        default), ``timings`` may give only some windows; unknown keys are a ConfigError."""
        d = _obj("", obj, _TOP_KEYS)
        kwargs: dict[str, Any] = {"data_dir": data_dir}
        if "chain_id" in d:
            kwargs["chain_id"] = d["chain_id"]
        if "timings" in d:
            kwargs["timings"] = _timings_from_dict(d["timings"])
        if "candidates" in d:
            kwargs["candidates"] = tuple(
                _candidate_from_dict(f"candidates[{i}]", c) for i, c in enumerate(_list("candidates", d["candidates"]))
            )
        if "syncer_identities" in d:
            kwargs["syncer_identities"] = tuple(
                _identity_from_dict(f"syncer_identities[{i}]", s)
                for i, s in enumerate(_list("syncer_identities", d["syncer_identities"]))
            )
        if "genesis" in d:
            entries = []
            for i, g in enumerate(_list("genesis", d["genesis"])):
                e = _obj(f"genesis[{i}]", g, ("address", "balance"), ("address", "balance"))
                address = _address(f"genesis[{i}].address", e["address"])
                entries.append((address, _amount(f"genesis[{i}].balance", e["balance"])))
            kwargs["genesis"] = tuple(entries)
        if "allowed_checkpoint_dirs" in d:
            dirs = []
            for i, p in enumerate(_list("allowed_checkpoint_dirs", d["allowed_checkpoint_dirs"])):
                if not isinstance(p, str) or not p:
                    raise ConfigError(f"allowed_checkpoint_dirs[{i}]", "expected a path string")
                dirs.append(Path(p))
            kwargs["allowed_checkpoint_dirs"] = tuple(dirs)
        plain = ("sync_writes", "wal_recovery", "external_value_bytes", "max_payload_bytes", "max_checkpoint_bytes", "rpc_host", "rpc_port", "max_body_bytes",
                 "model_cache_runs", "model_cache_bytes", "model_snapshot_rounds", "payload_cache_bytes", "prune_payloads",
                 "rpc_max_batch", "max_gradient_abs", "max_grace_window_ms", "max_receipt_bytes",
                 "max_trainer_count", "rpc_max_connections", "rpc_max_connections_per_ip", "rpc_idle_timeout_ms",
                 "rpc_read_timeout_ms", "rpc_max_inflight_bytes", "rpc_max_batch_answer_bytes", "rpc_max_batch_ms",
                 "min_reward_pool", "max_open_runs", "max_open_runs_per_sponsor", "serve_artifacts")
        for key in plain:
            if key in d:
                kwargs[key] = d[key]
        try:
            return cls(**kwargs)
        except ConfigError:
            raise
        except (TenzroError, TypeError) as exc:  # a Candidate or RunTimings check
            raise ConfigError("", str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON config form (``data_dir`` excluded: it comes from the command line);
        ``NodeConfig.from_dict(c.to_dict(), data_dir=c.data_dir) == c``."""
        return {
            "chain_id": self.chain_id,
            "timings": self.timings.to_dict(),
            "candidates": [
                {
                    "address": format_address(c.address),
                    "vrf_public_key": "0x" + c.vrf_public_key.hex(),
                    "stake": str(c.stake),
                }
                for c in self.candidates
            ],
            "syncer_identities": [
                {"address": format_address(s.address), "vrf_secret": "0x" + s.vrf_secret.hex()}
                for s in self.syncer_identities
            ],
            "genesis": [{"address": format_address(a), "balance": str(b)} for a, b in self.genesis],
            "sync_writes": self.sync_writes,
            "wal_recovery": self.wal_recovery,
            "external_value_bytes": self.external_value_bytes,
            "max_payload_bytes": self.max_payload_bytes,
            "max_checkpoint_bytes": self.max_checkpoint_bytes,
            "allowed_checkpoint_dirs": [str(p) for p in self.allowed_checkpoint_dirs],
            "rpc_host": self.rpc_host,
            "rpc_port": self.rpc_port,
            "max_body_bytes": self.max_body_bytes,
            "model_cache_runs": self.model_cache_runs,
            "model_cache_bytes": self.model_cache_bytes,
            "model_snapshot_rounds": self.model_snapshot_rounds,
            "payload_cache_bytes": self.payload_cache_bytes,
            "prune_payloads": self.prune_payloads,
            "rpc_max_batch": self.rpc_max_batch,
            "max_gradient_abs": self.max_gradient_abs,
            "max_grace_window_ms": self.max_grace_window_ms,
            "max_receipt_bytes": self.max_receipt_bytes,
            "max_trainer_count": self.max_trainer_count,
            "rpc_max_connections": self.rpc_max_connections,
            "rpc_max_connections_per_ip": self.rpc_max_connections_per_ip,
            "rpc_idle_timeout_ms": self.rpc_idle_timeout_ms,
            "rpc_read_timeout_ms": self.rpc_read_timeout_ms,
            "rpc_max_inflight_bytes": self.rpc_max_inflight_bytes,
            "rpc_max_batch_answer_bytes": self.rpc_max_batch_answer_bytes,
            "rpc_max_batch_ms": self.rpc_max_batch_ms,
            "min_reward_pool": str(self.min_reward_pool),
            "max_open_runs": self.max_open_runs,
            "max_open_runs_per_sponsor": self.max_open_runs_per_sponsor,
            "serve_artifacts": self.serve_artifacts,
        }

    def server_limits(self) -> ServerLimits:
        """The JSON-RPC server's :class:`rpc.server.ServerLimits` from these settings."""
        from rpc.server import ServerLimits

        return ServerLimits(
            max_connections=self.rpc_max_connections, max_connections_per_ip=self.rpc_max_connections_per_ip,
            idle_timeout_s=self.rpc_idle_timeout_ms / 1000, read_timeout_s=self.rpc_read_timeout_ms / 1000,
            max_inflight_bytes=self.rpc_max_inflight_bytes, max_answer_bytes=self.rpc_max_batch_answer_bytes,
            max_batch_seconds=self.rpc_max_batch_ms / 1000,
        )


def _timings_from_dict(value: object) -> RunTimings:
    d = _obj("timings", value, _TIMING_KEYS)
    kwargs: dict[str, Any] = {}
    for key in _TIMING_KEYS:
        if key in d:
            kwargs[key] = _amount(f"timings.{key}", d[key]) if key == "min_stake" else d[key]
    try:
        return replace(DEFAULT_TIMINGS, **kwargs)
    except EncodingError as exc:
        raise ConfigError("timings", str(exc)) from None


def _candidate_from_dict(path: str, value: object) -> Candidate:
    keys = ("address", "vrf_public_key", "stake")
    d = _obj(path, value, keys, keys)
    address = _address(f"{path}.address", d["address"])
    key = _hex32(f"{path}.vrf_public_key", d["vrf_public_key"])
    stake = _amount(f"{path}.stake", d["stake"])
    try:
        vrf.validate_public_key(key)
        return Candidate(address, key, stake)
    except TenzroError as exc:
        raise ConfigError(f"{path}.vrf_public_key", str(exc)) from None


def _identity_from_dict(path: str, value: object) -> SyncerIdentity:
    """``{"address", "vrf_secret"}`` (the secret inline, as the dev genesis writes it) or
    ``{"address", "vrf_secret_file"}`` (an absolute path to a 0600 file ``tenzro keys new-vrf``
    wrote, so the config itself holds no secret)."""
    d = _obj(path, value, ("address", "vrf_secret", "vrf_secret_file"), ("address",))
    address = _address(f"{path}.address", d["address"])
    if ("vrf_secret" in d) == ("vrf_secret_file" in d):
        raise ConfigError(path, "give exactly one of vrf_secret and vrf_secret_file")
    if "vrf_secret" in d:
        return SyncerIdentity(address=address, vrf_secret=_hex32(f"{path}.vrf_secret", d["vrf_secret"]))
    file = d["vrf_secret_file"]
    if not isinstance(file, str) or not file or not Path(file).is_absolute():
        raise ConfigError(f"{path}.vrf_secret_file", "expected an absolute path")
    from tenzro_training.keyfiles import KeyFileError, parse_vrf_document, read_private_file

    try:
        secret = parse_vrf_document(file, read_private_file(file), address)
    except KeyFileError as exc:
        raise ConfigError(f"{path}.vrf_secret_file", str(exc)) from None
    return SyncerIdentity(address=address, vrf_secret=secret)
