#!/usr/bin/env python
"""Soak the MemWAL model: run the state machine of tests/model/machine.py for --minutes with random seeds.

    .venv/bin/python scripts/soak.py --minutes 10            # batches of random sequences until time is up
    .venv/bin/python scripts/soak.py --seed 123 --batch 50   # replay one batch exactly (prints its steps)

Prints how many sequences ran; on a divergence, the seed, the shrunk steps (as hypothesis prints them)
and the command that replays the batch, and exits 1. Tables live on the local filesystem (a temporary
directory, removed at the end).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to run (default 5)")
    parser.add_argument("--seed", type=int, default=None, help="run exactly one batch with this seed")
    parser.add_argument("--batch", type=int, default=25, help="sequences per seed (default 25)")
    parser.add_argument("--steps", type=int, default=20, help="steps per sequence (default 20)")
    parser.add_argument("--no-shrink", action="store_true",
                        help="report the first failing sequence as found (shrinking slow sequences can take minutes)")
    args = parser.parse_args(argv)

    sys.path[:0] = [str(REPO / "tests" / "model"), str(REPO / "tests")]
    import hypothesis.core
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test
    from machine import local_machine

    root = tempfile.mkdtemp(prefix="memwal-soak-")
    config = settings(
        max_examples=args.batch,
        stateful_step_count=args.steps,
        deadline=None,
        database=None,
        print_blob=True,
        phases=[Phase.generate] if args.no_shrink else [Phase.generate, Phase.shrink],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    started = time.monotonic()
    deadline = started + args.minutes * 60
    rng = random.Random()
    total = batches = 0
    try:
        while True:
            seed = args.seed if args.seed is not None else rng.getrandbits(64)
            machine = local_machine(root)
            hypothesis.core.global_force_seed = seed
            try:
                run_state_machine_as_test(machine, settings=config)
            except BaseException as exc:
                total += machine.stats["sequences"]
                print(f"\nDIVERGENCE after {total} sequences ({time.monotonic() - started:.0f}s), seed {seed}:",
                      flush=True)
                # hypothesis attaches the shrunk steps ("Falsifying example: state = ...") as exception notes
                print("".join(traceback.format_exception(exc)), flush=True)
                print("Replay with:\n"
                      f"  .venv/bin/python scripts/soak.py --seed {seed} --batch {args.batch} "
                      f"--steps {args.steps}", flush=True)
                return 1
            finally:
                hypothesis.core.global_force_seed = None
            total += machine.stats["sequences"]
            batches += 1
            stats = ", ".join(f"{k}={v}" for k, v in sorted(machine.stats.items()) if k != "sequences")
            print(f"seed {seed}: {machine.stats['sequences']} sequences ok ({stats})", flush=True)
            if args.seed is not None or time.monotonic() >= deadline:
                break
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"soak: {total} sequences in {batches} batches, {time.monotonic() - started:.0f}s, no divergence")
    return 0


if __name__ == "__main__":
    sys.exit(main())
