"""What the launchers ask of hvdtrain/launch/mpirun.py before they start ranks: the remote agent
mpirun reaches other hosts with (and its arguments), and which hosts answer it. Jobs started through it:
tests/parallel/launch/test_mpirun.py."""

import pytest

from hvdtrain.launch import mpirun
from hvdtrain.run.hosts import Host


@pytest.fixture
def agent(tmp_path):
    """A remote agent in place of ssh: host `up` answers, `slow` never does, any other fails."""
    path = tmp_path / "agent.sh"
    path.write_text("#!/bin/sh\ncase $2 in up) exit 0;; slow) exec sleep 30;; *) exit 1;; esac\n")
    path.chmod(0o755)
    return path


def test_the_agent_is_the_one_the_arguments_give_mpirun(agent):
    assert mpirun.remote_agent(["--mca", "plm_ssh_agent", f"{agent} extra-word"], {}) == [str(agent), "extra-word"]


def test_the_agent_is_the_one_open_mpis_variable_gives():
    assert mpirun.remote_agent([], {"OMPI_MCA_plm_rsh_agent": "rsh -x"}) == ["rsh", "-x"]


def test_without_either_the_agent_is_ssh_that_asks_for_no_password():
    assert mpirun.remote_agent([], {}) == ["ssh", "-o", "BatchMode=yes"]


def test_the_agents_arguments_are_those_open_mpi_gives_it():
    assert mpirun.remote_agent(["--mca", "plm_ssh_args", "-p 2222"], {}) == ["ssh", "-o", "BatchMode=yes", "-p", "2222"]
    assert mpirun.remote_agent([], {"OMPI_MCA_plm_rsh_agent": "rsh", "OMPI_MCA_plm_rsh_args": "-l me"}) == \
        ["rsh", "-l", "me"]


def test_hosts_that_the_agent_does_not_reach_in_time_are_left_out(agent, monkeypatch):
    monkeypatch.setattr(mpirun, "PROBE_TIMEOUT_S", 1.0)
    hosts = [Host("localhost", 1), Host("up", 1), Host("down", 1), Host("slow", 1)]
    assert mpirun.reachable_hosts(hosts, ["--mca", "plm_ssh_agent", f"{agent} extra-word"], {}) == hosts[:2]
