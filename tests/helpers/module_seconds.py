"""Seconds per test module, from a pytest run's `--durations=0` report: tests/module_seconds.txt, the order in which
tests/conftest.py hands modules to the pytest-xdist workers (the slowest first).

    python -m pytest -q -p no:cacheprovider --durations=0 | tee /tmp/suite.log
    python tests/helpers/module_seconds.py /tmp/suite.log > tests/module_seconds.txt

It also prints (on stderr) the wall time two workers would take with the modules in each order, handed out as
loadscope does (the next module to the worker that is free first): xdist's own order (most tests first) against
the slowest first. A prediction from one run's durations, not a measurement: the next CI run measures.
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?\.py)::")


def module_seconds(report: str) -> tuple[dict[str, float], dict[str, int]]:
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    for line in report.splitlines():
        match = DURATION.match(line)
        if match:
            seconds[match[2]] += float(match[1])
            tests[match[2]].add(line.split("::", 1)[1])
    return dict(seconds), {module: len(names) for module, names in tests.items()}


def wall_time(order: list[str], seconds: dict[str, float], workers: int = 2) -> float:
    """Each module to the worker that is free first, in this order."""
    free = [0.0] * workers
    for module in order:
        first = free.index(min(free))
        free[first] += seconds[module]
    return max(free)


def main(path: str) -> None:
    seconds, tests = module_seconds(Path(path).read_text())
    by_tests = sorted(seconds, key=lambda module: -tests[module])
    by_seconds = sorted(seconds, key=lambda module: -seconds[module])
    print("# seconds module: tests/helpers/module_seconds.py makes this from a run's --durations=0 report")
    for module in by_seconds:
        print(f"{seconds[module]:.0f} {module}")
    total = sum(seconds.values())
    print(
        f"{total:.0f} s of tests; two workers: {wall_time(by_tests, seconds):.0f} s in xdist's order (most tests "
        f"first), {wall_time(by_seconds, seconds):.0f} s slowest first",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main(sys.argv[1])
