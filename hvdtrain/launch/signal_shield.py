"""`python -m hvdtrain.launch.signal_shield SIGNALS PROGRAM [ARGS...]`: PROGRAM with SIGNALS (names
without SIG, comma-separated) blocked.

Inside a Slurm job hvdtrain starts Open MPI's node daemons (prted) through this, as their launch
agent (supervisor.py): Slurm ends a job by sending SIGTERM to every process in it, and a prted
that receives it kills its ranks within half a second, before they can checkpoint; with it
blocked, the ranks (which PRRTE starts with an empty mask) take the signal themselves and have
Slurm's KillWait to finish their step. USR1 and USR2 are blocked too: `--signal=USR1@N` without
`B:` goes to every job step, and kills a prted that does not block it.
"""

import os
import signal
import sys


def main():
    names, program, *args = sys.argv[1:]
    signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, f"SIG{name}") for name in names.split(",")])
    os.execv(program, [program, *args])


if __name__ == "__main__":
    main()
