"""How long ``rlctl --help`` takes, as a ratio to a bare ``python -c pass``.

python -m bench.bench_cli_startup
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time


def timed(args: list[str], n: int = 7) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    bare = timed([sys.executable, "-c", "pass"])
    help_ = timed([sys.executable, "-m", "rlctl", "--help"])
    print(f"python -c pass : {bare:.3f} s")
    print(f"rlctl --help   : {help_:.3f} s  ({help_ / bare:.1f}x bare interpreter)")


if __name__ == "__main__":
    main()
