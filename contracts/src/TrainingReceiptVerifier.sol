// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Rfc6962} from "./Rfc6962.sol";

/// @title TrainingReceiptVerifier
/// @notice Pure-Solidity verification of a Tenzro training receipt (docs/receipt.md, version 1)
///         for EVM chains WITHOUT the TRAINING_VERIFY precompile (0x1008), plus the on-chain
///         inclusion check a single trainer uses to prove one round record is in a run root.
/// @dev What this is: the receipt validity rules of tenzro_training/receipt_abi.py re-done with
///      the SHA-256 precompile (0x02): strict ABI decoding (re-encode equals input), version,
///      every round record decoded strictly and checked (index, task id, rule arithmetic),
///      the run root recomputed (RFC 6962 over [spec, rounds..., final record]), the final model
///      hash, trainer weights against the accepted lists, the syncer list, and the spec's
///      top-level task_id / sponsor_address / reward_pool / max_rounds / quorum / trainer_count /
///      aggregation and architecture.fragment_count read from its canonical JSON (every round
///      keeps the spec's rule and fragment count, with quorum..trainer_count accepted per
///      fragment). What it is NOT: a JSON schema validator. The spec bytes are committed by the
///      run root, so they are whatever the node committed; this library reads the fields it
///      needs and does not re-check the rest of the spec grammar (docs/solidity-verifier.md).
///      `verify` reverts (never returns true) on bytes that do not ABI-decode; the
///      TrainingReceiptVerifierContract wrapper turns that into `false`.
library TrainingReceiptVerifier {
    uint16 internal constant RECEIPT_VERSION = 1;
    uint16 internal constant RECORD_VERSION = 1;
    uint8 internal constant KIND_ROUND = 1;
    uint8 internal constant KIND_FINAL = 2;

    uint8 internal constant RULE_MEAN = 0;
    uint8 internal constant RULE_TRIMMED_MEAN = 1;
    uint8 internal constant RULE_COORDINATE_MEDIAN = 2;
    uint8 internal constant RULE_KRUM = 3;
    uint32 internal constant MAX_ALPHA_BPS = 10000;
    uint256 internal constant MAX_JSON_SAFE_INT = 2 ** 53 - 1;

    struct ReceiptTrainer {
        address trainer;
        uint256 weight;
        uint256 stake;
        string did;
        bool slashed;
    }

    /// @dev The pinned top-level tuple. abi.encode(Receipt) is the receipt bytes.
    struct Receipt {
        uint16 version;
        string taskId;
        bytes specCanonical;
        address sponsor;
        uint256 rewardPool;
        bytes32 runRoot;
        bytes32 finalModelHash;
        bytes[] roundRecords;
        ReceiptTrainer[] trainers;
        address[] syncers;
        uint64 sealedAt;
    }

    struct FragmentOutcome {
        bytes32 aggregateHash;
        address[] accepted;
        uint32 selected;
        uint32 trimmed;
        bytes32 reportHash;
    }

    /// @dev The ten values of a RoundRecord leaf. The leaf is abi.encode of ten separate values,
    ///      i.e. abi.encode(RoundRecord) WITHOUT its leading 0x20 offset word.
    struct RoundRecord {
        uint8 kind;
        uint16 version;
        string taskId;
        uint64 round;
        address syncer;
        uint32 syncerRank;
        uint8 ruleKind;
        uint32 ruleParam;
        FragmentOutcome[] fragments;
        bytes32 modelHash;
    }

    // ------------------------------------------------------------------------------------------
    // Receipt verification
    // ------------------------------------------------------------------------------------------

    /// @notice True iff `receipt` is a valid version-1 receipt whose run root is `claimedRoot`.
    /// @dev Reverts on bytes that abi.decode rejects; returns false for every other invalid input.
    function verify(bytes32 claimedRoot, bytes memory receipt) internal pure returns (bool) {
        Receipt memory r = abi.decode(receipt, (Receipt));
        // Strict: exactly the canonical encoding (no aliased offsets, no trailing bytes).
        if (keccak256(abi.encode(r)) != keccak256(receipt)) return false;
        if (r.version != RECEIPT_VERSION) return false;
        if (r.runRoot != claimedRoot) return false;
        if (!isValidTaskId(bytes(r.taskId))) return false;

        uint256 rounds = r.roundRecords.length;
        if (rounds == 0) return false; // max_rounds >= 1 in every valid spec
        bytes32[] memory leaves = new bytes32[](rounds + 2);
        leaves[0] = Rfc6962.leafHash(r.specCanonical);
        bytes32 taskHash = keccak256(bytes(r.taskId));
        RoundRecord[] memory recs = new RoundRecord[](rounds);
        for (uint256 i = 0; i < rounds; ++i) {
            (bool ok, RoundRecord memory rec) = decodeRoundRecord(r.roundRecords[i]);
            if (!ok || rec.round != i || keccak256(bytes(rec.taskId)) != taskHash) return false;
            recs[i] = rec;
            leaves[i + 1] = Rfc6962.leafHash(r.roundRecords[i]);
        }
        if (recs[rounds - 1].modelHash != r.finalModelHash) return false;
        leaves[rounds + 1] = Rfc6962.leafHash(
            abi.encode(KIND_FINAL, RECORD_VERSION, r.taskId, uint64(rounds), r.finalModelHash)
        );
        if (Rfc6962.runRootOf(Rfc6962.rootOfLeafHashes(leaves)) != r.runRoot) return false;

        if (!_checkSpec(r, recs)) return false;
        if (!_checkTrainers(r.trainers, recs)) return false;
        return _checkSyncers(r.syncers, recs);
    }

    /// @dev Trainers: strictly ascending addresses (canonical order, so no duplicates), a valid
    ///      DID each, every accepted address among them, and weight == its number of
    ///      appearances in the accepted lists, or exactly 0 for a slashed trainer.
    function _checkTrainers(ReceiptTrainer[] memory trainers, RoundRecord[] memory recs)
        private
        pure
        returns (bool)
    {
        uint256 t = trainers.length;
        for (uint256 i = 0; i < t; ++i) {
            if (i > 0 && trainers[i - 1].trainer >= trainers[i].trainer) return false;
            if (!isValidDid(bytes(trainers[i].did))) return false;
        }
        uint256[] memory counts = new uint256[](t);
        for (uint256 i = 0; i < recs.length; ++i) {
            FragmentOutcome[] memory frags = recs[i].fragments;
            for (uint256 f = 0; f < frags.length; ++f) {
                address[] memory acc = frags[f].accepted;
                for (uint256 a = 0; a < acc.length; ++a) {
                    (bool found, uint256 at) = _find(trainers, acc[a]);
                    if (!found) return false;
                    counts[at] += 1;
                }
            }
        }
        for (uint256 i = 0; i < t; ++i) {
            // A slashed trainer's weight is 0 (it forfeits its reward); anyone else's is its count.
            uint256 w = trainers[i].weight;
            if (trainers[i].slashed ? w != 0 : w != counts[i]) return false;
        }
        return true;
    }

    /// @dev Binary search in the strictly ascending trainer list.
    function _find(ReceiptTrainer[] memory trainers, address who) private pure returns (bool, uint256) {
        uint256 lo = 0;
        uint256 hi = trainers.length;
        while (lo < hi) {
            uint256 mid = (lo + hi) >> 1;
            address m = trainers[mid].trainer;
            if (m == who) return (true, mid);
            if (m < who) lo = mid + 1;
            else hi = mid;
        }
        return (false, 0);
    }

    /// @dev syncers == the round records' syncers, deduplicated, in order of first appearance.
    function _checkSyncers(address[] memory syncers, RoundRecord[] memory recs) private pure returns (bool) {
        uint256 n = 0;
        for (uint256 i = 0; i < recs.length; ++i) {
            address s = recs[i].syncer;
            bool seen = false;
            for (uint256 j = 0; j < n; ++j) {
                if (syncers[j] == s) {
                    seen = true;
                    break;
                }
            }
            if (seen) continue;
            if (n >= syncers.length || syncers[n] != s) return false;
            ++n;
        }
        return n == syncers.length;
    }

    // ------------------------------------------------------------------------------------------
    // Round records
    // ------------------------------------------------------------------------------------------

    /// @notice Decode a RoundRecord leaf strictly and check its field rules (records.py).
    /// @dev Reverts when abi.decode does; ok == false for a non-canonical encoding or a record
    ///      whose fields break the rules (kind, version, task id, rank, rule and per-fragment
    ///      accepted / selected / trimmed arithmetic).
    function decodeRoundRecord(bytes memory leaf) internal pure returns (bool ok, RoundRecord memory rec) {
        // The leaf is the tuple's body; a struct with dynamic members is encoded behind one offset word.
        bytes memory wrapped = bytes.concat(bytes32(uint256(0x20)), leaf);
        rec = abi.decode(wrapped, (RoundRecord));
        if (keccak256(abi.encode(rec)) != keccak256(wrapped)) return (false, rec);
        return (isValidRoundRecord(rec), rec);
    }

    function isValidRoundRecord(RoundRecord memory rec) internal pure returns (bool) {
        if (rec.kind != KIND_ROUND || rec.version != RECORD_VERSION) return false;
        if (!isValidTaskId(bytes(rec.taskId))) return false;
        if (rec.syncerRank == 0) return false;
        uint8 rk = rec.ruleKind;
        uint256 p = rec.ruleParam;
        if (rk == RULE_TRIMMED_MEAN) {
            if (p > MAX_ALPHA_BPS) return false;
        } else if (rk == RULE_KRUM) {
            if (p > MAX_JSON_SAFE_INT) return false;
        } else if (rk == RULE_MEAN || rk == RULE_COORDINATE_MEDIAN) {
            if (p != 0) return false;
        } else {
            return false;
        }
        if (rec.fragments.length == 0) return false;
        for (uint256 f = 0; f < rec.fragments.length; ++f) {
            FragmentOutcome memory o = rec.fragments[f];
            uint256 k = o.accepted.length;
            if (k == 0) return false;
            for (uint256 a = 1; a < k; ++a) {
                if (o.accepted[a - 1] >= o.accepted[a]) return false;
            }
            if (rk == RULE_TRIMMED_MEAN) {
                uint256 t = (k * p) / 10000;
                if (k < 2 * t + 1 || o.trimmed != t || o.selected != 0) return false;
            } else if (rk == RULE_KRUM) {
                if (k <= 2 * p + 2 || o.selected >= k || o.trimmed != 0) return false;
            } else if (o.selected != 0 || o.trimmed != 0) {
                return false;
            }
        }
        return true;
    }

    // ------------------------------------------------------------------------------------------
    // Inclusion of one round record in a run root
    // ------------------------------------------------------------------------------------------

    /// @notice True iff `roundRecord` is a valid round record for round `index - 1` and `proof`
    ///         is its RFC 6962 audit path as leaf `index` of a `size`-leaf run tree whose
    ///         run root is `runRoot` (runRoot = sha256(prefix || MTH), recomputed here).
    /// @dev Leaf 0 is the spec, so round r is leaf r + 1; size is 2 + R for a sealed run
    ///      (1 + R while training). Reverts if the record does not ABI-decode.
    function verifyRoundInclusion(
        bytes32 runRoot,
        bytes memory roundRecord,
        uint256 index,
        uint256 size,
        bytes32[] memory proof
    ) internal pure returns (bool) {
        if (index == 0) return false;
        (bool ok, RoundRecord memory rec) = decodeRoundRecord(roundRecord);
        if (!ok || rec.round != index - 1) return false;
        return Rfc6962.verifyInclusionInRunRoot(runRoot, roundRecord, index, size, proof);
    }

    /// @notice How many of `roundRecord`'s fragments accepted `trainer` (0 if none).
    /// @dev Reverts on a record that does not ABI-decode; returns 0 for an invalid one.
    function acceptedCount(bytes memory roundRecord, address trainer) internal pure returns (uint256 n) {
        (bool ok, RoundRecord memory rec) = decodeRoundRecord(roundRecord);
        if (!ok) return 0;
        for (uint256 f = 0; f < rec.fragments.length; ++f) {
            address[] memory acc = rec.fragments[f].accepted;
            for (uint256 a = 0; a < acc.length; ++a) {
                if (acc[a] == trainer) {
                    ++n;
                    break;
                }
            }
        }
    }

    /// @notice True iff `trainer` is in some fragment's accepted list of `roundRecord`.
    function accepted(bytes memory roundRecord, address trainer) internal pure returns (bool) {
        return acceptedCount(roundRecord, trainer) > 0;
    }

    // ------------------------------------------------------------------------------------------
    // The spec's canonical JSON: eight top-level fields
    // ------------------------------------------------------------------------------------------

    /// @dev How many spec values _scanTopLevel locates: 7 top-level keys (see _whichKey for the
    ///      order) and architecture.fragment_count in the last slot.
    uint256 private constant SPEC_KEYS = 8;
    uint256 private constant FRAGMENT_COUNT_SLOT = 7;
    /// @dev _whichKey's answer for "architecture" (whose object holds fragment_count).
    uint256 private constant ARCHITECTURE_KEY = 8;
    /// @dev Digits read for quorum / trainer_count (both <= 2^53 - 1 in a valid spec).
    uint256 private constant MAX_COUNT_DIGITS = 16;

    /// @dev Reads the top-level (depth 1) values of "task_id", "sponsor_address", "reward_pool",
    ///      "max_rounds", "quorum", "trainer_count", "aggregation" and "architecture" (in which
    ///      only "fragment_count" is read) with a string/escape/depth-aware
    ///      scan (so a metadata key of the same name, or the text inside a string, is never
    ///      mistaken for them), requires each exactly once and compares them with what the spec's
    ///      RFC 8785 form must contain: "task_id":"<taskId>", "sponsor_address":"<EIP-55 of
    ///      sponsor>", "reward_pool":"<decimal rewardPool>", "max_rounds":<decimal R>, and
    ///      "aggregation":<the rounds' rule in its one JSON form>, the unquoted values followed by
    ///      , or }. Every round uses that rule and has architecture.fragment_count fragments,
    ///      each with quorum..trainer_count accepted trainers (receipt.find_rule_violation).
    function _checkSpec(Receipt memory r, RoundRecord[] memory recs) private pure returns (bool) {
        bytes memory s = r.specCanonical;
        uint256[SPEC_KEYS] memory at = _scanTopLevel(s);
        for (uint256 i = 0; i < SPEC_KEYS; ++i) {
            if (at[i] == 0) return false;
        }
        if (!_matchQuoted(s, at[0], bytes(r.taskId))) return false;
        if (!_matchQuoted(s, at[1], bytes.concat("0x", checksumHex(r.sponsor)))) return false;
        if (!_matchQuoted(s, at[2], toDecimal(r.rewardPool))) return false;
        if (!_matchValue(s, at[3], toDecimal(recs.length))) return false;
        (bool quorumOk, uint256 quorum) = _readCount(s, at[4]);
        (bool countOk, uint256 trainerCount) = _readCount(s, at[5]);
        (bool fragmentsOk, uint256 fragmentCount) = _readCount(s, at[FRAGMENT_COUNT_SLOT]);
        if (!quorumOk || !countOk || !fragmentsOk) return false;
        uint8 rk = recs[0].ruleKind;
        uint32 rp = recs[0].ruleParam;
        if (!_matchValue(s, at[6], _ruleJson(rk, rp))) return false;
        for (uint256 i = 0; i < recs.length; ++i) {
            if (recs[i].ruleKind != rk || recs[i].ruleParam != rp) return false;
            FragmentOutcome[] memory frags = recs[i].fragments;
            if (frags.length != fragmentCount) return false;
            for (uint256 f = 0; f < frags.length; ++f) {
                uint256 k = frags[f].accepted.length;
                if (k < quorum || k > trainerCount) return false;
            }
        }
        return true;
    }

    /// @dev A rule's one JSON form in the spec (docs/spec.md "Aggregation"), RFC 8785 spelling.
    function _ruleJson(uint8 kind, uint32 param) private pure returns (bytes memory) {
        if (kind == RULE_MEAN) return '"Mean"';
        if (kind == RULE_COORDINATE_MEDIAN) return '"CoordinateMedian"';
        if (kind == RULE_TRIMMED_MEAN) return bytes.concat('{"TrimmedMean":{"alpha_bps":', toDecimal(param), "}}");
        return bytes.concat('{"Krum":{"f":', toDecimal(param), "}}"); // RULE_KRUM: records are checked first
    }

    /// @dev s[at..] == value, followed by , or } (an unquoted top-level value ends there).
    function _matchValue(bytes memory s, uint256 at, bytes memory value) private pure returns (bool) {
        uint256 end = at + value.length;
        if (end >= s.length || !_matchAt(s, at, value)) return false;
        bytes1 next = s[end];
        return next == "," || next == "}";
    }

    /// @dev The decimal integer at s[at..] (1..MAX_COUNT_DIGITS digits, no leading zero),
    ///      followed by , or }.
    function _readCount(bytes memory s, uint256 at) private pure returns (bool ok, uint256 v) {
        uint256 i = at;
        while (i < s.length && s[i] >= "0" && s[i] <= "9") {
            v = v * 10 + (uint8(s[i]) - 48);
            ++i;
            if (i - at > MAX_COUNT_DIGITS) return (false, 0);
        }
        if (i == at || i >= s.length || (s[at] == "0" && i - at > 1)) return (false, 0);
        ok = s[i] == "," || s[i] == "}";
    }

    /// @dev Where the values of the SPEC_KEYS keys start: slots 0-6 at depth 1 of the top-level
    ///      object, slot 7 "fragment_count" at depth 2 inside the top-level "architecture"
    ///      object, found in the same single pass (nested values of other keys never count); 0
    ///      means missing (a value never starts at 0: the object opens with '{'). A duplicate
    ///      key, or an unbalanced close, zeroes them all.
    function _scanTopLevel(bytes memory s) private pure returns (uint256[SPEC_KEYS] memory at) {
        uint256[SPEC_KEYS] memory none;
        uint256 n = s.length;
        if (n == 0 || s[0] != "{") return at;
        uint256 depth = 0;
        bool inStr = false;
        bool esc = false;
        bool expectKey = false;
        bool archNext = false; // the depth-1 value being read is that of "architecture"
        bool inArch = false; // inside the "architecture" object (at depth 2 or deeper)
        for (uint256 i = 0; i < n; ++i) {
            bytes1 c = s[i];
            if (inStr) {
                if (esc) esc = false;
                else if (c == "\\") esc = true;
                else if (c == '"') inStr = false;
                continue;
            }
            if (c == '"') {
                if (expectKey && depth == 1) {
                    (uint256 which, uint256 vstart) = _whichKey(s, i);
                    archNext = which == ARCHITECTURE_KEY;
                    if (which < FRAGMENT_COUNT_SLOT) {
                        if (at[which] != 0) return none; // duplicate key
                        at[which] = vstart;
                    }
                } else if (expectKey && _matchAt(s, i, '"fragment_count":')) {
                    // depth 2 inside "architecture": the only place expectKey is set below depth 1
                    if (at[FRAGMENT_COUNT_SLOT] != 0) return none;
                    at[FRAGMENT_COUNT_SLOT] = i + 17;
                }
                inStr = true;
                expectKey = false;
            } else if (c == "{" || c == "[") {
                ++depth;
                if (depth == 2) inArch = archNext && c == "{";
                expectKey = c == "{" && (depth == 1 || (depth == 2 && inArch));
            } else if (c == "}" || c == "]") {
                if (depth == 0) return none;
                --depth;
                if (depth < 2) inArch = false;
            } else if (c == ",") {
                if (depth == 1) archNext = false;
                expectKey = depth == 1 || (depth == 2 && inArch);
            }
        }
    }

    /// @dev If s[q..] is one of the depth-1 keys with its quotes and the colon, which one
    ///      (0..6, or ARCHITECTURE_KEY) and where its value starts; otherwise (SPEC_KEYS + 1, 0).
    function _whichKey(bytes memory s, uint256 q) private pure returns (uint256, uint256) {
        if (_matchAt(s, q, '"task_id":')) return (0, q + 10);
        if (_matchAt(s, q, '"sponsor_address":')) return (1, q + 18);
        if (_matchAt(s, q, '"reward_pool":')) return (2, q + 14);
        if (_matchAt(s, q, '"max_rounds":')) return (3, q + 13);
        if (_matchAt(s, q, '"quorum":')) return (4, q + 9);
        if (_matchAt(s, q, '"trainer_count":')) return (5, q + 16);
        if (_matchAt(s, q, '"aggregation":')) return (6, q + 14);
        if (_matchAt(s, q, '"architecture":')) return (ARCHITECTURE_KEY, q + 15);
        return (SPEC_KEYS + 1, 0);
    }

    function _matchAt(bytes memory s, uint256 at, bytes memory pat) private pure returns (bool) {
        if (at + pat.length > s.length) return false;
        for (uint256 i = 0; i < pat.length; ++i) {
            if (s[at + i] != pat[i]) return false;
        }
        return true;
    }

    /// @dev s[at..] == '"' || value || '"'.
    function _matchQuoted(bytes memory s, uint256 at, bytes memory value) private pure returns (bool) {
        return _matchAt(s, at, bytes.concat('"', value, '"'));
    }

    // ------------------------------------------------------------------------------------------
    // Small text helpers (shared with tests through the wrapper)
    // ------------------------------------------------------------------------------------------

    /// @notice 1-128 chars of [A-Za-z0-9._-] (records.is_valid_task_id).
    function isValidTaskId(bytes memory t) internal pure returns (bool) {
        if (t.length == 0 || t.length > 128) return false;
        for (uint256 i = 0; i < t.length; ++i) {
            if (!_isIdChar(t[i])) return false;
        }
        return true;
    }

    function _isIdChar(bytes1 c) private pure returns (bool) {
        return (c >= "a" && c <= "z") || (c >= "A" && c <= "Z") || (c >= "0" && c <= "9") || c == "."
            || c == "_" || c == "-";
    }

    /// @notice did:tenzro:[a-z]{1,32}:[A-Za-z0-9._-]{1,128} (run_state.DID_PATTERN, full match).
    function isValidDid(bytes memory d) internal pure returns (bool) {
        bytes memory prefix = "did:tenzro:";
        if (!_matchAt(d, 0, prefix)) return false;
        uint256 i = prefix.length;
        uint256 kindStart = i;
        while (i < d.length && d[i] >= "a" && d[i] <= "z") ++i;
        uint256 kindLen = i - kindStart;
        if (kindLen == 0 || kindLen > 32 || i >= d.length || d[i] != ":") return false;
        ++i;
        uint256 idLen = d.length - i;
        if (idLen == 0 || idLen > 128) return false;
        for (; i < d.length; ++i) {
            if (!_isIdChar(d[i])) return false;
        }
        return true;
    }

    /// @notice The 40 hex digits of `a` in EIP-55 mixed-case checksum form (no 0x).
    function checksumHex(address a) internal pure returns (bytes memory out) {
        bytes16 digits = "0123456789abcdef";
        out = new bytes(40);
        uint160 v = uint160(a);
        for (uint256 i = 0; i < 20; ++i) {
            uint8 b = uint8(v >> (8 * (19 - i)));
            out[2 * i] = digits[b >> 4];
            out[2 * i + 1] = digits[b & 15];
        }
        bytes32 h = keccak256(out);
        for (uint256 i = 0; i < 40; ++i) {
            bytes1 c = out[i];
            if (c >= "a") {
                uint8 nibble = i % 2 == 0 ? uint8(h[i / 2]) >> 4 : uint8(h[i / 2]) & 15;
                if (nibble >= 8) out[i] = bytes1(uint8(c) - 32);
            }
        }
    }

    /// @notice Decimal digits of `v` (no sign, no leading zeros; "0" for zero).
    function toDecimal(uint256 v) internal pure returns (bytes memory out) {
        if (v == 0) return "0";
        uint256 len = 0;
        for (uint256 t = v; t != 0; t /= 10) ++len;
        out = new bytes(len);
        for (uint256 i = len; i > 0; --i) {
            out[i - 1] = bytes1(uint8(48 + (v % 10)));
            v /= 10;
        }
    }
}

/// @title TrainingReceiptVerifierContract
/// @notice Thin deployable wrapper around the library (tests, and chains that want a shared
///         verifier address). Every entry point returns false instead of reverting on bytes
///         that do not ABI-decode.
contract TrainingReceiptVerifierContract {
    /// @notice TrainingReceiptVerifier.verify, with undecodable input reported as false.
    function verify(bytes32 claimedRoot, bytes calldata receipt) external view returns (bool) {
        try this.verifyOrRevert(claimedRoot, receipt) returns (bool ok) {
            return ok;
        } catch {
            return false;
        }
    }

    /// @notice The library call itself: reverts on undecodable input.
    function verifyOrRevert(bytes32 claimedRoot, bytes calldata receipt) external pure returns (bool) {
        return TrainingReceiptVerifier.verify(claimedRoot, receipt);
    }

    function verifyRoundInclusion(
        bytes32 runRoot,
        bytes calldata roundRecord,
        uint256 index,
        uint256 size,
        bytes32[] calldata proof
    ) external view returns (bool) {
        try this.verifyRoundInclusionOrRevert(runRoot, roundRecord, index, size, proof) returns (bool ok) {
            return ok;
        } catch {
            return false;
        }
    }

    function verifyRoundInclusionOrRevert(
        bytes32 runRoot,
        bytes calldata roundRecord,
        uint256 index,
        uint256 size,
        bytes32[] calldata proof
    ) external pure returns (bool) {
        return TrainingReceiptVerifier.verifyRoundInclusion(runRoot, roundRecord, index, size, proof);
    }

    function accepted(bytes calldata roundRecord, address trainer) external view returns (bool) {
        try this.acceptedCountOrRevert(roundRecord, trainer) returns (uint256 n) {
            return n > 0;
        } catch {
            return false;
        }
    }

    function acceptedCountOrRevert(bytes calldata roundRecord, address trainer) external pure returns (uint256) {
        return TrainingReceiptVerifier.acceptedCount(roundRecord, trainer);
    }

    function checksumHex(address a) external pure returns (string memory) {
        return string(TrainingReceiptVerifier.checksumHex(a));
    }

    function gasOfVerify(bytes32 claimedRoot, bytes calldata receipt) external view returns (bool ok, uint256 used) {
        uint256 g = gasleft();
        ok = TrainingReceiptVerifier.verify(claimedRoot, receipt);
        used = g - gasleft();
    }
}
