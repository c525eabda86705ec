"""`hvdtrun.run` (horovod.run) across the cluster's 3 network-namespace hosts: the ranks on the
other hosts reach the calling process at its interfaces' addresses for the function, and their
results come back in rank order."""

import json
import shlex
import sys
import textwrap

from support.commands import run_command


def test_a_function_runs_on_every_host_and_each_ranks_result_comes_back(netns_cluster, tmp_path):
    hosts = ",".join(f"{host.address}:1" for host in netns_cluster.hosts)
    (tmp_path / "program.py").write_text(textwrap.dedent(f"""
        import json, socket
        from hvdtrain.launch import hvdtrun

        def where():
            import numpy as np
            from hvdtrain import core
            core.init()
            summed = core.allreduce_async(np.ones(3) * (core.rank() + 1), name="x", op=core.ReduceOp.SUM).wait()
            # the address this rank's host reaches the others at
            probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            probe.connect(({netns_cluster.hosts[0].address!r}, 9))
            return [core.rank(), probe.getsockname()[0], summed.tolist()]

        print(json.dumps(hvdtrun.run(where, num_proc=3, hosts={hosts!r},
                                     mpi_args={shlex.join(netns_cluster.mpirun_args())!r})))
    """))
    result = run_command([sys.executable, "program.py"], cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer == [[rank, host.address, [6.0, 6.0, 6.0]] for rank, host in enumerate(netns_cluster.hosts)]
