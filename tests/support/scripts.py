"""The project's scripts (scripts/), loaded as modules by the tests that check their parts."""

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name):
    """scripts/NAME.py as a module; scripts/ is importable while it loads, as a script run from
    there imports its siblings (bench_horovod imports run_benchmarks)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module
