import pytest
from omegaconf import OmegaConf

from hvdtrain.runner import cluster
from hvdtrain.runner.config import ClusterConfig, ConfigError
from hvdtrain.runner.launcher import Host


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


def test_an_existing_job_is_recognised():
    assert cluster.inside_existing_job({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"})
    assert cluster.inside_existing_job({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert cluster.inside_existing_job({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "8"})
    assert not cluster.inside_existing_job({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"})
    assert not cluster.inside_existing_job({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"})  # a batch script
    assert not cluster.inside_existing_job({})
