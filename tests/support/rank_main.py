"""Runs functions of a test file on every rank: `python tests/support/rank_main.py FILE FUNCTION [ARG...]`,
or `... FILE --checks NAME[,NAME...] [ARG...]` to run several checks in one job.

The tests launch this under mpirun (ranks.py), so that a multi-rank test's body sits next to the
pytest test that launches it. A job of checks runs each in turn and reports each on its own
(`@@check NAME ok` or, after its traceback, `@@check NAME failed`), so that one job of N ranks
serves many tests, each of which names one behaviour; a check that fails does not stop the
ones after it, whose reports then say whether the ranks were still in step.
"""

import importlib.util
import os
import sys
import traceback
from pathlib import Path

REPORT = "@@check"
TESTS = Path(__file__).resolve().parent.parent  # where a test file imports `support` from, as under pytest


def load(path):
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    spec = importlib.util.spec_from_file_location("rank_test_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    path, what, *args = sys.argv[1:]
    module = load(path)
    if what != "--checks":
        getattr(module, what)(*args)
        return
    names, *args = args
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    failed = False
    for name in names.split(","):
        try:
            getattr(module, name)(*args)
        except BaseException:  # a check's failure is its report, whatever it raised
            # One write, each line marked with the rank, so that the ranks' tracebacks stay apart
            lines = traceback.format_exc().splitlines()
            print("".join(f"[rank {rank}] {line}\n" for line in lines) + f"{REPORT} {name} failed rank={rank}",
                  flush=True)
            failed = True
        else:
            print(f"{REPORT} {name} ok rank={rank}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
