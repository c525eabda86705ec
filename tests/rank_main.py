"""Runs one function of a test file on every rank: `python tests/rank_main.py FILE FUNCTION [ARG...]`.

The tests launch this under mpirun (see conftest.py), so that a multi-rank test's body sits
next to the pytest test that launches it.
"""

import importlib.util
import sys


def main():
    path, function_name, *args = sys.argv[1:]
    spec = importlib.util.spec_from_file_location("rank_test_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    getattr(module, function_name)(*args)


if __name__ == "__main__":
    main()
