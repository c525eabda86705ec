"""The statuses an hvdtrain process exits with, and which of them a restart cannot mend.

A rank that fails exits at once with a status that says why; mpirun exits with the status of the
first rank that ended abnormally (128 + the signal for one that was killed), and what started the
job reads it: the `hvdtrain` command's supervisor restarts the job from its newest checkpoint,
hvdtrun's elastic driver from its last commit, unless a restart would only meet the same error.
"""

EXIT_CONFIG = 2  # a refused config or command line
EXIT_RANK_ERROR = 3  # a Python exception on a rank: a bug or bad data
EXIT_COMMUNICATION = 75  # EX_TEMPFAIL: this rank's collectives failed, as a peer went away or stalled
EXIT_HOSTS_UPDATED = 76  # an elastic job ends itself to be started again on the hosts there are now
EXIT_PREEMPTED = 77  # the ranks stopped with a checkpoint on a scheduler's notice

NOT_RESTARTED = {
    EXIT_CONFIG: "the command or its config was refused",
    EXIT_RANK_ERROR: "a rank raised an error that a restart would meet again",
}


def exit_status(error):
    """The status a rank exits with after `error` ended its work: whether a restart can help is
    decided from it."""
    from .exceptions import HorovodInternalError, TensorMismatchError

    seen = error
    while seen is not None:
        if isinstance(seen, TensorMismatchError):  # ranks that disagree will disagree again
            return EXIT_RANK_ERROR
        if isinstance(seen, HorovodInternalError) or type(seen).__module__.startswith("mpi4py"):
            return EXIT_COMMUNICATION
        seen = seen.__cause__ or seen.__context__
    # TensorFlow hands on an error of a py_function as its own type, with the original's text
    return EXIT_COMMUNICATION if "HorovodInternalError" in str(error) else EXIT_RANK_ERROR
