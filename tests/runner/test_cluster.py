import socket

import pytest
from omegaconf import OmegaConf

from hvdtrain.run import hosts as cluster, job
from hvdtrain.run.config import ConfigError
from hvdtrain.run.config.cluster import ClusterConfig
from hvdtrain.run.hosts import Host

from support.configs import compose


def layout(name, num_hosts, slots, **values):
    return OmegaConf.structured(ClusterConfig(name=name, num_hosts=num_hosts, slots=slots, **values))


def test_slurm_nodelists_expand():
    assert cluster.expand_nodelist("node[01-03,07],login5") == ["node01", "node02", "node03", "node07", "login5"]
    assert cluster.expand_nodelist("rack[1-2]-gpu[9-10]") == ["rack1-gpu9", "rack1-gpu10", "rack2-gpu9", "rack2-gpu10"]
    assert cluster.expand_nodelist("a,b") == ["a", "b"]
    assert cluster.expand_counts("4(x2),2") == [4, 4, 2]


def test_hosts_come_from_the_config_a_hostfile_or_slurm(tmp_path):
    assert cluster.resolve_hosts(layout("2x4", 2, 4, hosts=["a", "b:8", "c"]), env={}) == [Host("a", 4), Host("b", 4)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\nn1 slots=4\nn2:4\n\nn3\n")
    assert cluster.resolve_hosts(layout("2x4", 3, 4, hostfile=str(hostfile)), env={}) == [
        Host("n1", 4), Host("n2", 4), Host("n3", 4)]
    env = {"SLURM_JOB_NODELIST": "c[1-4]", "SLURM_TASKS_PER_NODE": "8(x4)"}
    assert cluster.resolve_hosts(layout("4x8", 4, 8), env=env) == [Host(f"c{i}", 8) for i in range(1, 5)]
    assert cluster.resolve_hosts(layout("1x8", 1, 8), env={}) == [Host("localhost", 8)]


@pytest.mark.parametrize("cfg,env,message", [
    (layout("4x4", 4, 4), {}, "needs 4 hosts but none were given"),
    (layout("4x4", 4, 4, hosts=["a", "b"]), {}, "needs 4 hosts but cluster.hosts gives 2: a, b"),
    (layout("2x8", 2, 8), {"SLURM_JOB_NODELIST": "c[1-2]", "SLURM_TASKS_PER_NODE": "8,4"}, "host c2 offers 4"),
    (layout("2x4", 2, 4, hosts=["a:x", "b"]), {}, "'a:x' is not a host"),
    (layout("2x4", 2, 4, hostfile="/no/such/hostfile"), {}, "no such file"),
])
def test_hosts_that_cannot_carry_the_layout_are_refused(cfg, env, message):
    with pytest.raises(ConfigError, match=message):
        cluster.resolve_hosts(cfg, env=env)


def test_hosts_given_with_the_local_layout_are_used(tmp_path):
    # `local` is this machine only when nothing names another host, as with horovodrun -np 2.
    assert cluster.resolve_hosts(compose("cluster.hosts=[n1,n2]").cluster, env={}) == [Host("n1", 2)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=4\n")
    assert cluster.resolve_hosts(compose(f"cluster.hostfile={hostfile}").cluster, env={}) == [Host("n1", 2)]
    assert cluster.resolve_hosts(compose().cluster, env={}) == [Host("localhost", 2)]
    # ...but not the nodes of a Slurm allocation: in a batch job, `local` is the node the script runs on.
    slurm = {"SLURM_JOB_NODELIST": "c[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert cluster.resolve_hosts(compose().cluster, env=slurm) == [Host("localhost", 2)]


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
        cluster.resolve_hosts(layout("2x4", 2, 4, hostfile=str(hostfile)), env={})
    assert str(error.value).startswith(f"invalid config: cluster.hostfile={str(hostfile)!r} {message}")


def test_a_hostfile_is_never_ignored(tmp_path):
    with pytest.raises(ConfigError, match=r"^invalid config: cluster.hostfile='/no/such/hostfile': no such file$"):
        cluster.resolve_hosts(compose("cluster.hostfile=/no/such/hostfile").cluster, env={})
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1\n")
    with pytest.raises(ConfigError, match=r"cluster.hosts=\['a', 'b'\] and cluster.hostfile='.*' both name hosts; "
                                          r"give one of them"):
        cluster.resolve_hosts(layout("2x4", 2, 4, hosts=["a", "b"], hostfile=str(hostfile)), env={})


def test_a_dry_run_names_hosts_it_was_not_given_as_placeholders():
    assert cluster.resolve_hosts(layout("2x8", 2, 8), env={}, dry_run=True) == [Host("<host0>", 8), Host("<host1>", 8)]
    with pytest.raises(ConfigError, match="needs 2 hosts but cluster.hosts gives 1: a"):
        cluster.resolve_hosts(layout("2x8", 2, 8, hosts=["a"]), env={}, dry_run=True)  # hosts given are checked


def test_cuda_is_checked_where_the_ranks_run_here():
    assert cluster.all_on_this_machine([Host("localhost", 2)])
    assert cluster.all_on_this_machine([Host(socket.gethostname(), 2)])
    assert not cluster.all_on_this_machine([Host("localhost", 2), Host("node7", 2)])


def test_an_existing_job_is_recognised():
    assert job.inside_existing_job({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"})
    assert job.inside_existing_job({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert job.inside_existing_job({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "8"})
    assert not job.inside_existing_job({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"})
    assert not job.inside_existing_job({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"})  # a batch script
    assert not job.inside_existing_job({})
