"""`hvdtrun.run`'s arguments (hvdtrain/launch/hvdtrun/function_job.py): horovod.run's, each
becoming hvdtrun's flag of the same meaning, refused as hvdtrun refuses it, with a ValueError
raised before any rank starts; and the package that every rank imports stays light. The jobs:
tests/parallel/launch/hvdtrun/test_function_job.py."""

import subprocess
import sys
import threading

import pytest

from hvdtrain.launch import hvdtrun
from hvdtrain.launch.hvdtrun import function_job


@pytest.mark.parametrize("arguments, refusal", [
    ({"use_gloo": True}, "hvdtrun.run: --gloo is not supported by hvdtrun (hvdtrain has no Gloo controller; it runs "
                         "on MPI)"),
    ({"hosts": "localhost:1", "hostfile": "hosts.txt"}, "Argument hosts and hostfile only allow one provided."),
    ({"num_proc": 3, "hosts": "localhost:2"}, "hvdtrun.run: -np 3 asks for 3 ranks but -H localhost:2 offers only "
                                              "2 slots"),
    ({"min_num_proc": 3, "hosts": "localhost:2"}, "hvdtrun.run: --min-np 3 asks for at least 3 ranks but "
                                                  "-H localhost:2 offers only 2 slots"),
    ({"max_num_proc": 2}, "hvdtrun.run: --max-np is for elastic jobs: it needs --host-discovery-script, or "
                          "--min-np on fixed hosts"),
])
def test_arguments_hvdtrun_refuses_raise_value_error_with_its_reason(arguments, refusal):
    with pytest.raises(ValueError) as raised:
        hvdtrun.run(lambda: None, **arguments)
    assert str(raised.value) == refusal


def test_a_function_that_does_not_pickle_is_refused_before_the_job():
    lock = threading.Lock()
    with pytest.raises(ValueError, match="^hvdtrun.run: the function or its arguments cannot be pickled: "):
        hvdtrun.run(lambda held: None, args=(lock,))


def test_a_call_from_another_thread_than_the_main_one_is_refused():
    raised = []
    thread = threading.Thread(target=lambda: raised.append(pytest.raises(ValueError, hvdtrun.run, lambda: None)))
    thread.start()
    thread.join()
    assert "call it from the main thread" in str(raised[0].value)


def test_horovods_arguments_become_hvdtruns_flags():
    assert function_job._flags(num_proc=4, min_num_proc=2, max_num_proc=8, slots=2, reset_limit=3,
                               cooldown_range=(10, 60), hosts=None, hostfile=None,
                               host_discovery_script="./discover.sh", start_timeout=90, ssh_port=None,
                               ssh_identity_file=None, disable_cache=None, output_filename=None, verbose=True,
                               use_gloo=False, use_mpi=True, mpi_args="--mca btl self,tcp",
                               network_interfaces=["eth0", "ib0"]) == [
        "-np", "4", "--min-np", "2", "--max-np", "8", "--slots-per-host", "2", "--reset-limit", "3",
        "--blacklist-cooldown-range", "10", "60", "--host-discovery-script", "./discover.sh", "--start-timeout", "90",
        "--verbose", "--mpi", "--mpi-args", "--mca btl self,tcp", "--network-interfaces", "eth0,ib0"]


def test_horovods_deprecated_names_are_taken_with_its_warnings():
    with pytest.warns(DeprecationWarning) as warned:
        taken = function_job._horovods_deprecated_names(1, None, None, None, np=4, min_np=None, max_np=None,
                                                        network_interface="eth0,eth1")
    assert taken == (4, None, None, ["eth0", "eth1"])
    assert [str(warning.message) for warning in warned] == [
        "network_interface is deprecated, use network_interfaces instead", "np is deprecated, use num_proc instead"]


def test_the_package_every_rank_imports_does_not_import_the_function_job():
    loaded = subprocess.run([sys.executable, "-c", "import sys, hvdtrain.launch.hvdtrun.rank_start; "
                             "print(sorted(name for name in sys.modules if name.startswith('hvdtrain')))"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert "function_job" not in loaded and "cloudpickle" not in loaded, loaded
