"""What `hvdtrun` starts on each rank in place of the user's command: it tells hvdtrun that this
rank has started (so that hvdtrun can hold the job to its start timeout), then becomes the
command by exec, so that the command is the rank's process exactly as under plain mpirun.

The connection to hvdtrun stays open in the command (one more open descriptor, which nothing
reads or writes): the kernel closes it when the process ends, however it ends, so hvdtrun can
tell, after mpirun has ended, whether every rank did (rank_watch.py).

    python -m hvdtrain.launch.hvdtrun.rank_start ADDRESS[,ADDRESS...] PORT -- COMMAND...

The addresses are those of hvdtrun's machine, tried in order (a rank on another host may reach
only some of them). It imports nothing of hvdtrain, so that it adds only an interpreter's start.
"""

import os
import socket
import sys

# Long enough for a loaded network, short enough that a wrong address does not hold the start.
CONNECT_TIMEOUT_S = 10.0


def report_started(addresses, port, rank):
    """The descriptor of the connection that told hvdtrun this rank has started, left open."""
    errors = []
    for address in addresses:
        try:
            connection = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as error:
            errors.append(f"{address}: {error}")
            continue
        try:
            connection.sendall(f"{rank}\n".encode())
        except OSError as error:
            connection.close()
            errors.append(f"{address}: {error}")
            continue
        return connection.detach()
    raise ConnectionError("; ".join(errors))


def main(argv):
    addresses, port, _separator, *command = argv
    rank = os.environ["OMPI_COMM_WORLD_RANK"]  # hvdtrun starts the job with Open MPI's mpirun
    try:
        connection = report_started(addresses.split(","), int(port), rank)
    except ConnectionError as error:
        # Without its report hvdtrun would stop the job at its start timeout, blaming the
        # start: failing now says what is wrong.
        print(f"hvdtrun: rank {rank} on {socket.gethostname()} cannot reach hvdtrun ({error}); "
              f"choose a reachable interface with --network-interface", file=sys.stderr)
        sys.exit(1)
    os.set_inheritable(connection, True)  # Python opens sockets to close on exec
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"hvdtrun: rank {rank} on {socket.gethostname()} cannot run {command[0]!r}: {error.strerror}",
              file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
