"""`launcher=kubernetes` (hvdtrain/launch/kubernetes.py): the manifests it prints pass Kubernetes'
own schemas (kubernetes-validate, offline) and describe the job (workers by the layout, GPUs where
the device is CUDA, the launcher's command on the workers' names, a fresh key pair); bad input
ends in one line before anything is printed or written; and what the pods run: the launcher
waits for the workers and gives up naming the pod, then trains, or resumes the run it finds."""

import os
import stat

import kubernetes_validate
import pytest
import yaml

from hvdtrain.launch import kubernetes
from hvdtrain.run.config import ConfigError
from hvdtrain.run.hosts import Host

from support.commands import hvdtrain_here

JOB = ("launcher=kubernetes", "cluster=2x4", "kubernetes.image=registry.example/hvdtrain:0.1",
       "kubernetes.runs_claim=runs", "train.device=cuda", "train.epochs=3")
KUBERNETES_VERSION = "1.30"  # the oldest release Kubernetes still supported in 2026


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """(the objects `hvdtrain JOB` printed, the directory it ran in)."""
    where = tmp_path_factory.mktemp("kubernetes")
    with pytest.MonkeyPatch.context() as monkeypatch:
        result = hvdtrain_here(*JOB, monkeypatch=monkeypatch, cwd=where)
    assert result.returncode == 0, result.stdout + result.stderr
    return list(yaml.safe_load_all(result.stdout)), where


def by_kind(objects):
    return {o["kind"]: o for o in objects}


def test_the_manifests_pass_kubernetes_schemas(printed):
    objects, _ = printed
    assert [o["kind"] for o in objects] == ["Secret", "Service", "StatefulSet", "Job"]
    for manifest in objects:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_one_worker_pod_per_host_with_a_gpu_per_rank(printed):
    workers = by_kind(printed[0])["StatefulSet"]["spec"]
    assert workers["replicas"] == 2 and workers["serviceName"] == "hvdtrain-digits-workers"
    assert workers["template"]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 4}}


def test_the_workers_names_resolve_before_they_are_ready(printed):
    service = by_kind(printed[0])["Service"]["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True


def test_the_launcher_trains_the_command_lines_run_on_the_worker_pods(printed):
    command = by_kind(printed[0])["Job"]["spec"]["template"]["spec"]["containers"][0]["command"]
    hosts = "hvdtrain-digits-worker-0.hvdtrain-digits-workers,hvdtrain-digits-worker-1.hvdtrain-digits-workers"
    assert command == ["python", "-m", "hvdtrain.launch.kubernetes", "launch", "--hosts", hosts, "--slots", "4",
                       "--port", "2222", "--wait", "600", "--run-dir", "/runs/hvdtrain-digits", "--",
                       "cluster=2x4", "train.device=cuda", "train.epochs=3"]


def test_every_pod_mounts_the_claim_and_the_keys(printed):
    for kind in ("StatefulSet", "Job"):
        spec = by_kind(printed[0])[kind]["spec"]["template"]["spec"]
        assert {"name": "runs", "persistentVolumeClaim": {"claimName": "runs"}} in spec["volumes"]
        assert {"name": "ssh-keys", "mountPath": "/etc/hvdtrain/ssh", "readOnly": True} in \
            spec["containers"][0]["volumeMounts"]


def test_the_key_pair_is_made_for_each_job_and_authorized(printed):
    keys = by_kind(printed[0])["Secret"]["stringData"]
    assert keys["authorized_keys"] == keys["id_ed25519.pub"] and "PRIVATE KEY" in keys["id_ed25519"]
    assert kubernetes.ssh_key_pair()[1] != keys["id_ed25519.pub"]


def test_printing_the_manifests_leaves_no_run_directory(printed):
    _, where = printed
    assert [p for p in where.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("given, problem", [
    (("kubernetes.runs_claim=runs",), "kubernetes.image=None: must name the image the pods run"),
    (("kubernetes.image=img",), "kubernetes.runs_claim=None: must name the PersistentVolumeClaim"),
    (("kubernetes.image=img", "kubernetes.runs_claim=runs", "cluster=2x4", "cluster.hosts=[a,b]"),
     "launcher=kubernetes makes the hosts"),
    (("kubernetes.image=img", "kubernetes.runs_claim=runs", "kubernetes.name=Big_Name"),
     "kubernetes.name='Big_Name': must be lower-case letters"),
])
def test_bad_input_ends_in_one_line_before_anything_is_printed(given, problem, tmp_path, monkeypatch):
    result = hvdtrain_here("launcher=kubernetes", *given, monkeypatch=monkeypatch, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert len(result.stderr.splitlines()) == 1 and problem in result.stderr, result.stderr
    assert list(tmp_path.rglob("*.yaml")) == []


HOSTS = [Host("job-worker-0.job-workers", 2), Host("job-worker-1.job-workers", 2)]


def test_the_launcher_waits_until_every_worker_answers():
    answers = iter([HOSTS[:1], HOSTS[:1], HOSTS])
    kubernetes.wait_for_workers(HOSTS, 60, probe=lambda hosts, args, env: next(answers), interval_s=0)


def test_the_launcher_gives_up_on_a_silent_worker_naming_its_pod():
    with pytest.raises(ConfigError, match=r"worker pod\(s\) job-worker-1 did not answer ssh within 0.2 s"):
        kubernetes.wait_for_workers(HOSTS, 0.2, probe=lambda hosts, args, env: HOSTS[:1], interval_s=0.05)


def test_a_launcher_pod_trains_a_new_run_on_the_workers(tmp_path):
    assert kubernetes.launch_command(HOSTS, tmp_path / "run", ["cluster=2x2", "train.epochs=3"]) == [
        "hvdtrain", "cluster=2x2", "train.epochs=3", "launcher=local",
        "cluster.hosts=[job-worker-0.job-workers:2,job-worker-1.job-workers:2]", f"hydra.run.dir={tmp_path / 'run'}"]


def test_a_launcher_pod_started_again_resumes_the_run_it_finds(tmp_path):
    (tmp_path / "config.yaml").write_text("{}")
    assert kubernetes.launch_command(HOSTS, tmp_path, ["cluster=2x2"]) == ["hvdtrain", f"resume={tmp_path}"]


def test_the_launchers_ssh_client_uses_the_jobs_key_and_keeps_no_host_keys(tmp_path, monkeypatch):
    keys = tmp_path / "secret"
    keys.mkdir()
    (keys / "id_ed25519").write_text("private")
    monkeypatch.setattr(kubernetes, "KEYS", str(keys))
    kubernetes.client_config(2222, home=tmp_path / "home")
    ssh = tmp_path / "home" / ".ssh"
    assert stat.S_IMODE(os.stat(ssh / "id_ed25519").st_mode) == 0o600
    config = (ssh / "config").read_text()
    assert "Port 2222" in config and "StrictHostKeyChecking no" in config and "UserKnownHostsFile /dev/null" in config


def test_the_workers_ssh_server_lets_in_the_jobs_key_only_with_this_pods_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/opt/hvdtrain/bin:/usr/bin")
    config = kubernetes.sshd_config(2222, tmp_path).read_text().splitlines()
    assert {"Port 2222", "AuthorizedKeysFile /etc/hvdtrain/ssh/authorized_keys", "PasswordAuthentication no",
            "SetEnv PATH=/opt/hvdtrain/bin:/usr/bin"} <= set(config)
    assert (tmp_path / "ssh_host_ed25519_key").exists()
