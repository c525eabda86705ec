"""The hosts of a run (hvdtrain/run/hosts.py): Slurm's node lists and task counts expanded; hosts
from cluster.hosts, a hostfile or a Slurm allocation, and this machine for a one-host layout
without any; hosts that cannot carry the layout, hostfile lines that cannot be read, and a
hostfile beside cluster.hosts refused; placeholders in a dry run; which hosts are this machine."""

import socket

import pytest
from omegaconf import OmegaConf

from hvdtrain.run import hosts
from hvdtrain.run.config import ConfigError
from hvdtrain.run.config.cluster import ClusterConfig
from hvdtrain.run.hosts import Host

from support.configs import compose


def layout(name, num_hosts, slots, **values):
    return OmegaConf.structured(ClusterConfig(name=name, num_hosts=num_hosts, slots=slots, **values))


def test_slurm_nodelists_expand():
    assert hosts.expand_nodelist("node[01-03,07],login5") == ["node01", "node02", "node03", "node07", "login5"]
    assert hosts.expand_nodelist("rack[1-2]-gpu[9-10]") == ["rack1-gpu9", "rack1-gpu10", "rack2-gpu9", "rack2-gpu10"]
    assert hosts.expand_nodelist("a,b") == ["a", "b"]


def test_slurm_task_counts_expand():
    assert hosts.expand_counts("4(x2),2") == [4, 4, 2]


def test_the_layout_takes_its_hosts_from_cluster_hosts_in_order():
    assert hosts.resolve_hosts(layout("2x4", 2, 4, hosts=["a", "b:8", "c"]), env={}) == [Host("a", 4), Host("b", 4)]


def test_the_layout_takes_its_hosts_from_a_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\nn1 slots=4\nn2:4\n\nn3\n")
    assert hosts.resolve_hosts(layout("2x4", 3, 4, hostfile=str(hostfile)), env={}) == [
        Host("n1", 4), Host("n2", 4), Host("n3", 4)]


def test_the_layout_takes_its_hosts_from_a_slurm_allocation():
    env = {"SLURM_JOB_NODELIST": "c[1-4]", "SLURM_TASKS_PER_NODE": "8(x4)"}
    assert hosts.resolve_hosts(layout("4x8", 4, 8), env=env) == [Host(f"c{i}", 8) for i in range(1, 5)]


def test_a_one_host_layout_without_hosts_runs_on_this_machine():
    assert hosts.resolve_hosts(layout("1x8", 1, 8), env={}) == [Host("localhost", 8)]


@pytest.mark.parametrize("cfg,env,message", [
    (layout("4x4", 4, 4), {}, "needs 4 hosts but none were given"),
    (layout("4x4", 4, 4, hosts=["a", "b"]), {}, "needs 4 hosts but cluster.hosts gives 2: a, b"),
    (layout("2x8", 2, 8), {"SLURM_JOB_NODELIST": "c[1-2]", "SLURM_TASKS_PER_NODE": "8,4"}, "host c2 offers 4"),
    (layout("2x4", 2, 4, hosts=["a:x", "b"]), {}, "'a:x' is not a host"),
    (layout("2x4", 2, 4, hostfile="/no/such/hostfile"), {}, "no such file"),
])
def test_hosts_that_cannot_carry_the_layout_are_refused(cfg, env, message):
    with pytest.raises(ConfigError, match=message):
        hosts.resolve_hosts(cfg, env=env)


def test_the_local_layout_runs_on_the_hosts_of_cluster_hosts():
    # `local` is this machine only when nothing names another host, as with horovodrun -np 2.
    assert hosts.resolve_hosts(compose("cluster.hosts=[n1,n2]").cluster, env={}) == [Host("n1", 2)]


def test_the_local_layout_runs_on_the_hosts_of_a_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=4\n")
    assert hosts.resolve_hosts(compose(f"cluster.hostfile={hostfile}").cluster, env={}) == [Host("n1", 2)]


def test_the_local_layout_without_hosts_is_this_machine():
    assert hosts.resolve_hosts(compose().cluster, env={}) == [Host("localhost", 2)]


def test_the_local_layout_in_a_slurm_allocation_is_the_node_the_script_runs_on():
    slurm = {"SLURM_JOB_NODELIST": "c[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert hosts.resolve_hosts(compose().cluster, env=slurm) == [Host("localhost", 2)]


@pytest.mark.parametrize("contents,message", [
    ("n1 slots=4\nn2 slotz=4\n",
     "line 2: unexpected field 'slotz=4'; a line is NAME, NAME:SLOTS or NAME slots=SLOTS"),
    ("n1 slots=4 max_slots=8\n", "line 1: unexpected field 'max_slots=8'"),
    ("# hosts\n\nn1 slots=four\n", "line 3: 'n1:four' is not a host"),
])
def test_a_hostfile_line_that_cannot_be_read_is_refused_with_its_file_and_line(contents, message, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(contents)
    with pytest.raises(ConfigError) as error:
        hosts.resolve_hosts(layout("2x4", 2, 4, hostfile=str(hostfile)), env={})
    assert str(error.value).startswith(f"invalid config: cluster.hostfile={str(hostfile)!r} {message}")


def test_a_hostfile_that_is_not_there_is_refused():
    with pytest.raises(ConfigError, match=r"^invalid config: cluster.hostfile='/no/such/hostfile': no such file$"):
        hosts.resolve_hosts(compose("cluster.hostfile=/no/such/hostfile").cluster, env={})


def test_a_hostfile_beside_cluster_hosts_is_refused(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1\n")
    with pytest.raises(ConfigError, match=r"cluster.hosts=\['a', 'b'\] and cluster.hostfile='.*' both name hosts; "
                                          r"give one of them"):
        hosts.resolve_hosts(layout("2x4", 2, 4, hosts=["a", "b"], hostfile=str(hostfile)), env={})


def test_a_dry_run_names_hosts_it_was_not_given_as_placeholders():
    assert hosts.resolve_hosts(layout("2x8", 2, 8), env={}, dry_run=True) == [Host("<host0>", 8), Host("<host1>", 8)]


def test_a_dry_run_checks_the_hosts_it_was_given():
    with pytest.raises(ConfigError, match="needs 2 hosts but cluster.hosts gives 1: a"):
        hosts.resolve_hosts(layout("2x8", 2, 8, hosts=["a"]), env={}, dry_run=True)


def test_localhost_and_this_machines_name_are_this_machine():
    assert hosts.all_on_this_machine([Host("localhost", 2)])
    assert hosts.all_on_this_machine([Host(socket.gethostname(), 2)])


def test_a_job_with_another_host_is_not_all_on_this_machine():
    assert not hosts.all_on_this_machine([Host("localhost", 2), Host("node7", 2)])
