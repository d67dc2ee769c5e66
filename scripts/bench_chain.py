"""Benchmark receipts on chain: gas per escrow claim and TRAINING_VERIFY's Python time.

For each trainer count (default 8 and 64) it drives a real in-process node (MemoryStore) to a
Sealed run (2 rounds, every trainer submitting every fragment), then on a fresh py-evm chain
with TRAINING_VERIFY at 0x1008 deposits an ERC-20 reward into TenzroRewardEscrow and claims it
with the node's receipt (the claim credits every payee), then withdraws one payee's credit. It
prints the receipt size, the precompile's gas (compute_gas), the claim's total gas, one
withdraw's total gas, and best-of-N wall times of the pure reference ``training_verify``: the
first call on the sealed receipt (head read, digest, the full validity rules), a repeat (the
rules' result is remembered per sealed digest), and a forged receipt of the same size (one byte
of ``sealedAt`` changed: refused at the digest, before the rules), and of ``decode_receipt``
alone.

Usage::

    .venv/bin/python scripts/bench_chain.py                 # 8 and 64 trainers
    .venv/bin/python scripts/bench_chain.py --trainers 8 16 --repeats 50
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from precompile import clear_validity_memo, compute_gas, training_verify  # noqa: E402
from precompile.evm import make_web3, sealed_lookup_from_store  # noqa: E402
from tenzro_training.receipt_abi import decode_receipt  # noqa: E402
from tests.chain.conftest import Chain, SwitchableLookup, load_build, run_to_sealed  # noqa: E402
from tests.chain.test_escrow import make_setup  # noqa: E402
from tests.node.conftest import STRANGER  # noqa: E402


def best(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    artifacts = load_build().compile_contracts(("TenzroRewardEscrow.sol", "TestToken.sol"))
    print(f"{'trainers':>8} {'rounds':>6} {'receipt B':>9} {'precompile gas':>14} {'claim gas':>10} "
          f"{'withdraw gas':>12} {'verify ms':>9} {'repeat ms':>9} {'forged ms':>9} {'decode ms':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.trainers:
            run = run_to_sealed(Path(tmp), task_id=f"bench-{n}", n_trainers=n, rounds=args.rounds)
            lookup = sealed_lookup_from_store(run.store)
            data = run.run_root + run.abi
            assert training_verify(data, lookup) == b"\x01"
            forged = data[:-1] + bytes([data[-1] ^ 1])
            assert training_verify(forged, lookup) == b"\x00"

            def first() -> None:
                clear_validity_memo()
                training_verify(data, lookup)

            verify_s = best(first, args.repeats)
            repeat_s = best(lambda: training_verify(data, lookup), args.repeats)
            forged_s = best(lambda: training_verify(forged, lookup), args.repeats)
            decode_s = best(lambda: decode_receipt(run.abi), args.repeats)
            sealed = SwitchableLookup()
            chain = Chain(make_web3(sealed), sealed, artifacts)
            setup = make_setup(chain, run)
            assert setup.deposit(run.task_id).status == 1
            receipt = setup.claim(run.abi, run.run_root)
            assert receipt.status == 1, "claim failed"
            payee = setup.accounts()["t0"]
            withdrawn = chain.send(setup.escrow.functions.withdraw(setup.token.address, payee), STRANGER.key)
            assert withdrawn.status == 1, "withdraw failed"
            print(f"{n:>8} {args.rounds:>6} {len(run.abi):>9} {compute_gas(len(data)):>14} {receipt.gasUsed:>10} "
                  f"{withdrawn.gasUsed:>12} {verify_s * 1e3:>9.2f} {repeat_s * 1e3:>9.2f} {forged_s * 1e3:>9.2f} "
                  f"{decode_s * 1e3:>9.2f}")


if __name__ == "__main__":
    main()
