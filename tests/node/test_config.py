"""NodeConfig: the JSON config file format (docs/node.md), round trips and every rejection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tenzro_training import vrf
from tenzro_training.node.config import DEFAULT_MIN_STAKE, ConfigError, NodeConfig, SyncerIdentity
from tenzro_training.records import Candidate
from tenzro_training.run_state import RunTimings

from tests.node.conftest import SYNCERS, VRF_SECRETS, make_config


def test_defaults() -> None:
    config = NodeConfig()
    assert config.data_dir is None and config.chain_id == 1337
    # A trainer's stake must cost something by default: 1 TNZO, what `tenzro trainer run` stakes.
    assert config.timings == RunTimings(min_stake=10**18) and config.timings.min_stake == DEFAULT_MIN_STAKE
    assert config.max_grace_window_ms == 3_600_000
    assert config.max_receipt_bytes == 768 * 1024
    assert config.max_trainer_count == 256
    assert config.max_payload_bytes == 64 << 20 and config.max_body_bytes == 96 << 20
    assert (config.rpc_host, config.rpc_port, config.sync_writes) == ("127.0.0.1", 8545, False)
    assert config.serve_artifacts is True  # a sealed run is recomputable from the node's URL
    assert NodeConfig.from_dict({"serve_artifacts": False}, data_dir=None).serve_artifacts is False
    assert NodeConfig.from_dict({}, data_dir=None) == config
    # Timings listed in part keep the node's defaults for the rest, min_stake included.
    partial = NodeConfig.from_dict({"timings": {"election_window_ms": 7}}, data_dir=None)
    assert partial.timings.min_stake == DEFAULT_MIN_STAKE and partial.timings.election_window_ms == 7
    assert NodeConfig.from_dict({"timings": {"min_stake": "0"}}, data_dir=None).timings.min_stake == 0


def test_round_trip(tmp_path: Path) -> None:
    config = make_config(tmp_path, allowed_checkpoint_dirs=(tmp_path,), sync_writes=True, rpc_port=0,
                         wal_recovery="point_in_time", external_value_bytes=4096)
    obj = config.to_dict()
    assert "data_dir" not in obj
    assert NodeConfig.from_dict(obj, data_dir=tmp_path) == config
    assert obj["syncer_identities"][0]["vrf_secret"] == "0x" + VRF_SECRETS[0].hex()
    assert "vrf_secret" not in repr(config.syncer_identities[0]).replace("vrf_secret=<hidden>", "")


def test_file_format_example() -> None:
    key = vrf.public_key(VRF_SECRETS[0])
    obj = {
        "chain_id": 31337,
        "timings": {"election_window_ms": 50, "min_stake": "1000"},
        "candidates": [{"address": SYNCERS[0].text, "vrf_public_key": "0x" + key.hex(), "stake": "5"}],
        "syncer_identities": [{"address": SYNCERS[0].text.lower(), "vrf_secret": "0x" + VRF_SECRETS[0].hex()}],
        "genesis": [{"address": SYNCERS[0].text, "balance": "1000000000000000000"}, {"address": "0x" + "11" * 20, "balance": 7}],
        "allowed_checkpoint_dirs": ["/srv/checkpoints"],
        "max_payload_bytes": 1 << 20,
    }
    config = NodeConfig.from_dict(obj, data_dir=Path("/var/lib/tenzro"))
    assert config.chain_id == 31337 and config.data_dir == Path("/var/lib/tenzro")
    assert config.timings.election_window_ms == 50 and config.timings.min_stake == 1000
    assert config.timings.finalize_window_ms == RunTimings().finalize_window_ms  # partial timings keep defaults
    assert config.candidates == (Candidate(SYNCERS[0].address, key, 5),)
    assert config.syncer_identities == (SyncerIdentity(address=SYNCERS[0].address, vrf_secret=VRF_SECRETS[0]),)
    assert config.genesis == ((SYNCERS[0].address, 10**18), (b"\x11" * 20, 7))
    assert config.allowed_checkpoint_dirs == (Path("/srv/checkpoints"),)
    assert config.get_candidate(SYNCERS[0].address) is config.candidates[0]
    assert config.get_candidate(b"\x00" * 20) is None


def _base() -> dict[str, Any]:
    return make_config().to_dict()


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"unknown": 1}, "unknown"),
        ({"chain_id": 0}, "chain_id"),
        ({"chain_id": True}, "chain_id"),
        ({"timings": {"election_window_ms": 0}}, "timings"),
        ({"timings": {"nope": 1}}, "timings.nope"),
        ({"genesis": [{"address": "0x12", "balance": "1"}]}, "genesis[0].address"),
        ({"genesis": [{"address": "0x" + "11" * 20, "balance": "-1"}]}, "genesis[0].balance"),
        ({"genesis": [{"address": "0x" + "11" * 20, "balance": "01"}]}, "genesis[0].balance"),
        ({"genesis": [{"address": "0x" + "11" * 20, "balance": "1"}] * 2}, "genesis"),
        ({"genesis": [{"address": "0x" + "11" * 20}]}, "genesis[0].balance"),
        ({"genesis": [{"address": "0x" + "11" * 20, "balance": str(2**256 - 1)},
                      {"address": "0x" + "22" * 20, "balance": "1"}]}, "genesis"),
        ({"candidates": [{"address": "0x" + "11" * 20, "vrf_public_key": "0x" + "00" * 31, "stake": "1"}]},
         "candidates[0].vrf_public_key"),
        ({"syncer_identities": [{"address": "0x" + "11" * 20, "vrf_secret": "0x" + "01" * 32}]},
         "syncer_identities[0].address"),
        ({"allowed_checkpoint_dirs": ["relative/dir"]}, "allowed_checkpoint_dirs[0]"),
        ({"rpc_port": 70000}, "rpc_port"),
        ({"rpc_host": ""}, "rpc_host"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
        ({"sync_writes": "yes"}, "sync_writes"),
        ({"serve_artifacts": 1}, "serve_artifacts"),
        ({"serve_artifacts": None}, "serve_artifacts"),
        ({"wal_recovery": "lenient"}, "wal_recovery"),
        ({"wal_recovery": None}, "wal_recovery"),
        ({"external_value_bytes": 0}, "external_value_bytes"),
        ({"external_value_bytes": "64KiB"}, "external_value_bytes"),
        ({"model_cache_runs": -1}, "model_cache_runs"),
        ({"model_snapshot_rounds": 0}, "model_snapshot_rounds"),
        ({"model_snapshot_rounds": 1.5}, "model_snapshot_rounds"),
        ({"payload_cache_bytes": -1}, "payload_cache_bytes"),
        ({"payload_cache_bytes": "1GiB"}, "payload_cache_bytes"),
        ({"rpc_max_batch": 0}, "rpc_max_batch"),
        ({"rpc_max_batch": 10.0}, "rpc_max_batch"),
        ({"rpc_max_connections": 0}, "rpc_max_connections"),
        ({"rpc_max_connections_per_ip": "8"}, "rpc_max_connections_per_ip"),
        ({"rpc_idle_timeout_ms": 0}, "rpc_idle_timeout_ms"),
        ({"rpc_read_timeout_ms": 1.5}, "rpc_read_timeout_ms"),
        ({"rpc_max_inflight_bytes": 1024, "max_body_bytes": 2048}, "rpc_max_inflight_bytes"),  # < one body
        ({"rpc_max_batch_answer_bytes": 0}, "rpc_max_batch_answer_bytes"),
        ({"rpc_max_batch_ms": 0}, "rpc_max_batch_ms"),
        ({"max_gradient_abs": 0}, "max_gradient_abs"),
        ({"max_gradient_abs": -1.0}, "max_gradient_abs"),
        ({"max_gradient_abs": 1e39}, "max_gradient_abs"),
        ({"max_gradient_abs": True}, "max_gradient_abs"),
        ({"max_gradient_abs": "1e6"}, "max_gradient_abs"),
        ({"max_grace_window_ms": -1}, "max_grace_window_ms"),
        ({"max_grace_window_ms": 2**53}, "max_grace_window_ms"),
        ({"max_grace_window_ms": "60000"}, "max_grace_window_ms"),
        ({"max_receipt_bytes": 0}, "max_receipt_bytes"),
        ({"max_receipt_bytes": 4 * 1024 * 1024 + 1}, "max_receipt_bytes"),  # the precompile's cap
        ({"max_trainer_count": 0}, "max_trainer_count"),
        ({"timings": {"min_stake": -1}}, "timings.min_stake"),
    ],
)
def test_invalid_config(change: dict[str, Any], path: str) -> None:
    obj = _base()
    obj.update(change)
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_dict(obj, data_dir=None)
    assert info.value.path == path


def test_invalid_identity_key_mismatch() -> None:
    obj = _base()
    obj["syncer_identities"][0]["vrf_secret"] = "0x" + VRF_SECRETS[1].hex()  # registered key is VRF_SECRETS[0]'s
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_dict(obj, data_dir=None)
    assert info.value.path == "syncer_identities[0].vrf_secret"


def test_invalid_duplicate_candidates() -> None:
    obj = _base()
    obj["candidates"].append(dict(obj["candidates"][0]))
    with pytest.raises(ConfigError):
        NodeConfig.from_dict(obj, data_dir=None)


def test_invalid_two_candidates_with_one_vrf_key_or_one_identity_listed_twice() -> None:
    """Two registered addresses sharing a VRF key would hold the same ticket (the election refuses
    them), and an identity listed twice would ticket twice: both are config errors at start."""
    obj = _base()
    obj["candidates"][1]["vrf_public_key"] = obj["candidates"][0]["vrf_public_key"]
    obj["syncer_identities"] = obj["syncer_identities"][:1]
    with pytest.raises(ConfigError, match="two candidates share a VRF public key") as info:
        NodeConfig.from_dict(obj, data_dir=None)
    assert info.value.path == "candidates"
    obj = _base()
    obj["syncer_identities"].append(dict(obj["syncer_identities"][0]))
    with pytest.raises(ConfigError, match="an address is listed twice") as info:
        NodeConfig.from_dict(obj, data_dir=None)
    assert info.value.path == "syncer_identities"


def test_a_localhost_rpc_host_is_not_warned_about_as_public() -> None:
    """rpc_host "localhost" is a loopback bind like 127.0.0.1 and ::1; a name or another address
    may be reachable from other hosts and gets the allowed_checkpoint_dirs warning."""
    public = "may be reachable from other hosts"
    for host in ("localhost", "127.0.0.1", "::1"):
        assert not any(public in w for w in NodeConfig(rpc_host=host).advice()), host
    for host in ("0.0.0.0", "node.example", "10.0.0.5"):
        assert any(public in w for w in NodeConfig(rpc_host=host).advice()), host


def test_invalid_not_an_object() -> None:
    with pytest.raises(ConfigError):
        NodeConfig.from_dict([], data_dir=None)
    with pytest.raises(ConfigError):
        SyncerIdentity(address=b"\x01" * 20, vrf_secret=b"\x01" * 31)


# --- syncer VRF secrets in files (tenzro keys new-vrf) ---------------------------------------------


def _vrf_file(tmp_path: Path, text: str, mode: int = 0o600, name: str = "syncer0.vrf") -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return path


def _with_file(path: object) -> dict[str, Any]:
    obj = _base()
    obj["syncer_identities"] = [{"address": SYNCERS[0].text, "vrf_secret_file": str(path)}]
    return obj


@pytest.mark.parametrize("content", [
    '{"address": "%s", "vrf_secret": "0x%s"}' % (SYNCERS[0].text.lower(), VRF_SECRETS[0].hex()),
    '{"vrf_secret": "%s"}' % VRF_SECRETS[0].hex(),
    "0x%s\n" % VRF_SECRETS[0].hex(),
])
def test_vrf_secret_from_a_file(tmp_path: Path, content: str) -> None:
    config = NodeConfig.from_dict(_with_file(_vrf_file(tmp_path, content)), data_dir=None)
    assert config.syncer_identities == (SyncerIdentity(address=SYNCERS[0].address, vrf_secret=VRF_SECRETS[0]),)
    inline = _base()
    inline["syncer_identities"] = inline["syncer_identities"][:1]
    assert config == NodeConfig.from_dict(inline, data_dir=None)  # the same node as with the secret inline


@pytest.mark.parametrize(("content", "mode", "reason"), [
    ("0x" + "11" * 32, 0o644, "allows group/other access"),
    ("0x" + "11" * 31, 0o600, "must be 32 bytes"),
    ("zz", 0o600, "not hex"),
    ('{"address": "0x' + "22" * 20 + '", "vrf_secret": "0x' + "11" * 32 + '"}', 0o600, "not 0x"),
    ("{nope", 0o600, "not valid JSON"),
    ('{"secret": 1}', 0o600, "vrf_secret"),
])
def test_invalid_vrf_secret_file(tmp_path: Path, content: str, mode: int, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as info:
        NodeConfig.from_dict(_with_file(_vrf_file(tmp_path, content, mode)), data_dir=None)
    assert info.value.path == "syncer_identities[0].vrf_secret_file"


def test_invalid_vrf_secret_file_references(tmp_path: Path) -> None:
    for path in ("relative/syncer0.vrf", "", 7, str(tmp_path / "missing")):
        with pytest.raises(ConfigError) as info:
            NodeConfig.from_dict(_with_file(path), data_dir=None)
        assert info.value.path == "syncer_identities[0].vrf_secret_file"
    both = _with_file(_vrf_file(tmp_path, VRF_SECRETS[0].hex()))
    both["syncer_identities"][0]["vrf_secret"] = "0x" + VRF_SECRETS[0].hex()
    neither = _base()
    del neither["syncer_identities"][0]["vrf_secret"]
    for obj in (both, neither):
        with pytest.raises(ConfigError, match="exactly one of vrf_secret and vrf_secret_file"):
            NodeConfig.from_dict(obj, data_dir=None)
    # A secret that is not the registered candidate's key is refused as inline ones are.
    wrong = _with_file(_vrf_file(tmp_path, VRF_SECRETS[1].hex(), name="other.vrf"))
    with pytest.raises(ConfigError, match="public key differs"):
        NodeConfig.from_dict(wrong, data_dir=None)


def test_the_documented_example_config_is_valid() -> None:
    """docs/node.md's example file parses, names every top-level key, and keeps the defaults it shows."""
    import json
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "node.md").read_text()
    section = text[text.index("## Config file format"):]
    example = json.loads(re.search(r"```json\n(.*?)\n```", section, re.DOTALL).group(1))  # type: ignore[union-attr]
    assert set(example) == set(NodeConfig().to_dict())  # every key is shown
    for key in ("candidates", "syncer_identities", "genesis"):  # "0x..." placeholders
        example[key] = []
    NodeConfig.from_dict(example, data_dir=None)
    defaults = NodeConfig()
    for key in ("model_cache_runs", "model_cache_bytes", "model_snapshot_rounds", "payload_cache_bytes", "prune_payloads",
                "serve_artifacts", "rpc_max_batch", "max_gradient_abs", "max_grace_window_ms", "max_receipt_bytes",
                "max_trainer_count", "rpc_max_connections", "rpc_max_connections_per_ip", "rpc_idle_timeout_ms",
                "rpc_read_timeout_ms", "rpc_max_inflight_bytes", "rpc_max_batch_answer_bytes", "rpc_max_batch_ms"):
        assert example[key] == getattr(defaults, key), key


def test_server_limits_come_from_the_config() -> None:
    limits = NodeConfig(rpc_max_connections=9, rpc_idle_timeout_ms=1500, rpc_max_inflight_bytes=2**30).server_limits()
    assert (limits.max_connections, limits.idle_timeout_s, limits.max_inflight_bytes) == (9, 1.5, 2**30)
    assert NodeConfig().server_limits().max_inflight_bytes is None  # the server's 4 x max_body_bytes


@pytest.mark.parametrize("host", ["a\x00b", "local host", "h\n", "\u00e9.example", "x" * 254])
def test_invalid_rpc_host(host: str) -> None:
    """A NUL byte reached the socket layer and ended `tenzro node` with a traceback."""
    with pytest.raises(ConfigError) as info:
        NodeConfig(rpc_host=host)
    assert info.value.path == "rpc_host"


_MAX_JSON_INT = 2**53 - 1


@pytest.mark.parametrize(
    ("field", "lo", "hi"),
    [
        ("chain_id", 1, 2**256 - 1),
        ("max_payload_bytes", 1, 2**40),
        ("max_checkpoint_bytes", 1, 2**50),
        ("rpc_port", 0, 65535),
        ("max_body_bytes", 1024, 2**40),
        ("rpc_max_batch", 1, 1_000_000),
        ("rpc_max_connections", 1, 1_000_000),
        ("rpc_max_connections_per_ip", 1, 1_000_000),
        ("rpc_idle_timeout_ms", 1, 86_400_000),
        ("rpc_read_timeout_ms", 1, 86_400_000),
        ("rpc_max_inflight_bytes", 96 << 20, 2**50),  # at least the default max_body_bytes
        ("rpc_max_batch_answer_bytes", 1, 2**40),
        ("rpc_max_batch_ms", 1, 86_400_000),
        ("model_cache_runs", 0, 1024),
        ("model_cache_bytes", 0, 2**50),
        ("model_snapshot_rounds", 1, 2**32),
        ("payload_cache_bytes", 0, 2**50),
        ("max_grace_window_ms", 0, _MAX_JSON_INT),
        ("max_receipt_bytes", 1, 4 * 1024 * 1024),
        ("max_trainer_count", 1, _MAX_JSON_INT),
        ("min_reward_pool", 0, 2**256 - 1),
        ("max_open_runs", 1, _MAX_JSON_INT),
        ("max_open_runs_per_sponsor", 1, _MAX_JSON_INT),
    ],
)
def test_integer_limits_accept_their_whole_range_and_nothing_past_it(field: str, lo: int, hi: int) -> None:
    """Each documented bound is inclusive, and one past either end is refused, naming the field."""
    for value in (lo, hi):
        config = NodeConfig(**{field: value})
        assert getattr(config, field) == value
        assert getattr(NodeConfig.from_dict(config.to_dict(), data_dir=None), field) == value
    for value in (lo - 1, hi + 1):
        with pytest.raises(ConfigError) as info:
            NodeConfig(**{field: value})
        assert info.value.path == field


def test_amounts_in_the_file_stop_at_uint256() -> None:
    top = str(2**256 - 1)
    assert NodeConfig.from_dict({"min_reward_pool": top}, data_dir=None).min_reward_pool == 2**256 - 1
    assert NodeConfig.from_dict({"timings": {"min_stake": top}}, data_dir=None).timings.min_stake == 2**256 - 1
    for obj, path in [({"min_reward_pool": str(2**256)}, "min_reward_pool"),
                      ({"timings": {"min_stake": str(2**256)}}, "timings.min_stake"),
                      ({"genesis": [{"address": "0x" + "11" * 20, "balance": str(2**256)}]}, "genesis[0].balance")]:
        with pytest.raises(ConfigError) as info:
            NodeConfig.from_dict(obj, data_dir=None)
        assert info.value.path == path


def test_keys_given_as_bytes_to_from_dict_are_taken_as_they_are() -> None:
    """A caller building the document in Python may give the 32-byte keys as bytes; only 32 bytes pass."""
    key = vrf.public_key(VRF_SECRETS[0])
    obj = {
        "candidates": [{"address": SYNCERS[0].address, "vrf_public_key": key, "stake": "5"}],
        "syncer_identities": [{"address": SYNCERS[0].address, "vrf_secret": VRF_SECRETS[0]}],
    }
    config = NodeConfig.from_dict(obj, data_dir=None)
    assert config.candidates == (Candidate(SYNCERS[0].address, key, 5),)
    assert config.syncer_identities == (SyncerIdentity(address=SYNCERS[0].address, vrf_secret=VRF_SECRETS[0]),)
    obj["candidates"][0]["vrf_public_key"] = key[:31]
    with pytest.raises(ConfigError, match="expected 32 bytes, got 31") as info:
        NodeConfig.from_dict(obj, data_dir=None)
    assert info.value.path == "candidates[0].vrf_public_key"


@pytest.mark.parametrize("host", ["a\x7fb", "\x7f"])
def test_invalid_rpc_host_with_a_delete_character(host: str) -> None:
    with pytest.raises(ConfigError) as info:
        NodeConfig(rpc_host=host)
    assert info.value.path == "rpc_host"
    assert NodeConfig(rpc_host="!~.example").rpc_host == "!~.example"  # the printable ends are fine


@pytest.mark.parametrize("entry", [5, None, "", ["/srv"]])
def test_invalid_allowed_checkpoint_dir_that_is_not_a_path_string(entry: object) -> None:
    with pytest.raises(ConfigError, match="expected a path string") as info:
        NodeConfig.from_dict({"allowed_checkpoint_dirs": ["/srv/ok", entry]}, data_dir=None)
    assert info.value.path == "allowed_checkpoint_dirs[1]"


def test_advice_names_settings_that_work_against_each_other(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """docs/node.md had only advised these cross-checks; a node now says them at start (warnings,
    not refusals: each has a setup where it is meant)."""
    import asyncio
    import logging

    from tenzro_training.node.main import NodeStartupError, run_node

    assert NodeConfig().advice() == ()
    assert NodeConfig(rpc_host="::1").advice() == NodeConfig(rpc_host="127.0.0.2").advice() == ()
    # 72 MiB of payload is 96 MiB of base64: just over the default body with its envelope.
    [payload] = NodeConfig(max_payload_bytes=72 << 20).advice()
    assert payload.startswith("max_payload_bytes 75497472 does not fit a JSON-RPC body") and "only arrive over gossip" in payload
    assert NodeConfig(max_payload_bytes=71 << 20).advice() == ()
    from dataclasses import replace

    slow = replace(NodeConfig().timings, round_timeout_ms=60_000, finalize_window_ms=60_000)
    [failover] = NodeConfig(timings=slow).advice()
    assert failover.startswith("timings.finalize_window_ms 60000 is not shorter than timings.round_timeout_ms 60000")
    public = NodeConfig(rpc_host="0.0.0.0")
    [exposed] = public.advice()
    assert exposed.startswith("rpc_host 0.0.0.0 may be reachable from other hosts and allowed_checkpoint_dirs is empty")
    assert NodeConfig(rpc_host="node.example", allowed_checkpoint_dirs=(tmp_path,)).advice() == ()
    # The node logs each at start, before anything else can fail.
    (tmp_path / "file").write_text("x")
    config = NodeConfig(data_dir=tmp_path / "file", rpc_host="0.0.0.0", rpc_port=0)
    with caplog.at_level(logging.WARNING, logger="tenzro.node"), pytest.raises(NodeStartupError, match="not a directory"):
        asyncio.run(run_node(config, tmp_path / "file", announce=lambda line: None))
    assert [r.getMessage() for r in caplog.records if r.name == "tenzro.node"] == [f"config: {exposed}"]
