"""`hvdtrun.run`, horovod.run for hvdtrain (hvdtrain/launch/hvdtrun/function_job.py), called as
a user's program calls it, each program a process of its own under a timeout: every rank's result
in rank order, a closure that travels, a rank's error raised in the caller naming the rank, an
elastic job's results (of a discovery script's hosts, and of fixed ones), the ranks' output
where the caller's streams are no descriptors, and the caller's process as it was. Its arguments
alone: tests/single/launch/hvdtrun/test_function_job.py."""

import json
import sys
import textwrap

from support.commands import run_command

TIMEOUT = 120


def run_program(tmp_path, body):
    """What a program of `body` (after `from hvdtrain.launch import hvdtrun`) printed last, as
    JSON, and its whole output."""
    (tmp_path / "program.py").write_text("import json, os, signal, sys\nfrom hvdtrain.launch import hvdtrun\n\n"
                                         + textwrap.dedent(body))
    result = run_command([sys.executable, "program.py"], cwd=tmp_path, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result


def test_every_ranks_result_comes_back_in_rank_order(tmp_path):
    answer, _ = run_program(tmp_path, """
        def work(scale, offset=0):
            import torch
            import hvdtrain.torch as hvd
            hvd.init()
            summed = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)
            return [hvd.rank(), hvd.size(), summed.item() * scale + offset]

        print(json.dumps(hvdtrun.run(work, args=(10,), kwargs={"offset": 1}, num_proc=3)))
    """)
    assert answer == [[0, 3, 61.0], [1, 3, 61.0], [2, 3, 61.0]]


def test_a_closure_over_the_callers_objects_travels_to_the_ranks(tmp_path):
    answer, _ = run_program(tmp_path, """
        weights = {"a": 2, "b": 3}
        print(json.dumps(hvdtrun.run(lambda: sum(weights.values()) * int(os.environ["OMPI_COMM_WORLD_RANK"]),
                                     num_proc=2)))
    """)
    assert answer == [0, 5]


def test_a_rank_that_raises_fails_the_call_naming_the_rank_with_its_error_as_the_cause(tmp_path):
    answer, _ = run_program(tmp_path, """
        from hvdtrain.launch.relay import RankFailed

        def fails():
            if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
                raise KeyError("no such column on purpose")
            return 0

        try:
            hvdtrun.run(fails, num_proc=2)
        except RankFailed as failure:
            print(json.dumps([str(failure).splitlines()[0], repr(failure.__cause__)]))
    """)
    assert answer == ["rank 1 (127.0.0.1) failed: KeyError: 'no such column on purpose'",
                      "KeyError('no such column on purpose')"]


def test_an_elastic_jobs_results_are_those_of_its_start_that_finished(tmp_path):
    (tmp_path / "discover.sh").write_text("#!/bin/sh\necho localhost:2\n")
    (tmp_path / "discover.sh").chmod(0o755)
    answer, _ = run_program(tmp_path, """
        def train():
            import hvdtrain.torch as hvd
            hvd.init()

            @hvd.elastic.run
            def steps(state):
                while state.step < 5:
                    state.step += 1
                    state.commit()
                return [hvd.rank(), hvd.size(), state.step]

            return steps(hvd.elastic.ObjectState(step=0))

        run = hvdtrun.run  # imported: hvdtrain.core sets OMPI_MCA_mpi_yield_when_idle as it is
        before = dict(os.environ)
        results = run(train, min_num_proc=2, host_discovery_script="./discover.sh")
        print(json.dumps([results, dict(os.environ) == before]))
    """)
    assert answer == [[[0, 2, 5], [1, 2, 5]], True]  # the elastic driver's variables gone with the job


def test_an_elastic_job_on_fixed_hosts_as_horovods_own_test_runs_it(tmp_path):
    """Horovod 0.28.1's test/single/test_elastic_run.py: --min-np with hosts makes the job elastic."""
    answer, _ = run_program(tmp_path, """
        def train():
            return [int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"]),
                    os.environ.get("HOROVOD_ELASTIC")]

        print(json.dumps(hvdtrun.run(train, num_proc=2, min_num_proc=2, max_num_proc=2,
                                     hosts="localhost:2,127.0.0.1:2")))
    """)
    assert answer == [[0, 2, "1"], [1, 2, "1"]]


def test_the_ranks_output_is_copied_into_the_callers_streams_where_they_are_no_descriptors(tmp_path):
    answer, _ = run_program(tmp_path, """
        import io

        sys.stdout = io.StringIO()  # as in a notebook
        hvdtrun.run(lambda: print("said on rank", os.environ["OMPI_COMM_WORLD_RANK"], flush=True), num_proc=2)
        said, sys.stdout = sys.stdout.getvalue(), sys.__stdout__
        print(json.dumps(sorted(said.splitlines())))
    """)
    assert answer == ["said on rank 0", "said on rank 1"]


def test_the_callers_signal_handlers_and_environment_are_as_they_were(tmp_path):
    answer, _ = run_program(tmp_path, """
        def on_term(signum, frame):
            pass

        signal.signal(signal.SIGTERM, on_term)
        on_int = signal.getsignal(signal.SIGINT)  # SIG_IGN where this was started in the background
        hvdtrun.run(lambda: None, num_proc=2)
        print(json.dumps([signal.getsignal(signal.SIGTERM) is on_term,
                          signal.getsignal(signal.SIGINT) is on_int,
                          [name for name in os.environ if name.startswith("HVDTRAIN_")]]))
    """)
    assert answer == [True, True, []]
