"""Flakiness check: run a pytest selection N times in a row, optionally while busy processes
keep every core loaded, and log each run's closing line.

    python benchmarks/repeat_tests.py [--runs 50] [--load] [--log FILE] -- PYTEST ARGS
    python benchmarks/repeat_tests.py --runs 50 --load -- tests/test_distributed.py

Each run is a fresh ``python -m pytest`` process (a crash at interpreter exit, such as an
abort from a backend thread, fails that run). ``--load`` starts one busy-looping process per
core for the whole loop. Stops at the first failing run unless ``--keep-going``; exit code 0
only if every run passed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path


def _busy() -> None:  # pragma: no cover - a load generator
    while True:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--load", action="store_true", help="keep every core busy meanwhile")
    p.add_argument("--log", help="append each run's result here (default: print only)")
    p.add_argument("--keep-going", action="store_true", help="do not stop at a failure")
    p.add_argument(
        "pytest_args", nargs="*", help="after --: what pytest runs (default: the distributed tests)"
    )
    args = p.parse_args()
    tests = args.pytest_args or ["tests/test_distributed.py"]
    load = []
    if args.load:
        load = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(os.cpu_count())]
        for proc in load:
            proc.start()
    log = open(args.log, "a") if args.log else None

    def say(line: str) -> None:
        print(line, flush=True)
        if log:
            print(line, file=log, flush=True)

    failed = 0
    try:
        head = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {args.runs} runs of pytest {' '.join(tests)}"
        head += f" ({'with ' + str(len(load)) + ' busy processes' if load else 'no extra load'})"
        say(head)
        for i in range(1, args.runs + 1):
            start = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *tests],
                capture_output=True,
                text=True,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
            closing = lines[-1] if lines else "(no output)"
            say(f"run {i}: exit {proc.returncode} | {time.monotonic() - start:.0f} s | {closing}")
            if proc.returncode != 0:
                failed += 1
                name = Path(args.log or "repeat").with_suffix(f".run{i}.txt")
                name.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
                say(f"  output kept in {name}")
                if not args.keep_going:
                    break
    finally:
        for proc in load:
            proc.terminate()
        say(f"{failed} failed run(s)")
        if log:
            log.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
