"""hvdtrain as a Kubernetes job: `hvdtrain ... launcher=kubernetes` prints the manifests for
`kubectl apply -f -` instead of launching, and the pods they make run this module.

The job is Horovod's topology on Kubernetes:
- a StatefulSet of `cluster.num_hosts` worker pods with stable names (`<name>-worker-<i>`), each
  running an ssh server as the image's user (`python -m hvdtrain.launch.kubernetes worker`), with
  `cluster.slots` GPUs as `nvidia.com/gpu` limits where train.device=cuda;
- a headless Service that gives each worker pod its DNS name, before it is ready too;
- a Job whose launcher pod (`... kubernetes launch`) waits until every worker answers ssh, then
  runs the recipe with hvdtrain's own launcher and supervisor on the workers' names (restarts
  from checkpoints included); a launcher pod started again, after its node failed, resumes the
  run it finds;
- a Secret with an ssh key pair made for this job as the manifests are printed (never stored
  anywhere else: the printed manifests hold its private key);
- the user's PersistentVolumeClaim at /runs on every pod, where the run directory
  (/runs/<name>) is: rank 0 (on worker 0) writes checkpoints there, the launcher reads them.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hvdtrain.launch import mpirun
from hvdtrain.run.config import ConfigError
from hvdtrain.run.hosts import Host

RUNS = "/runs"
KEYS = "/etc/hvdtrain/ssh"
KEY = "id_ed25519"
# The overrides that describe the job to Kubernetes, not the run it trains
NOT_PASSED_ON = ("launcher", "kubernetes.", "hydra.", "dry_run")
PROBE_INTERVAL_S = 5.0


# ----------------------------------------------------------------------------- the manifests


def job_name(cfg):
    """kubernetes.name, else hvdtrain-<recipe> made a valid object name."""
    if cfg.kubernetes.name:
        return cfg.kubernetes.name
    return re.sub(r"[^a-z0-9]+", "-", f"hvdtrain-{cfg.recipe.name}".lower())[:40].strip("-")


def worker_hosts(cfg):
    """The hosts the ranks run on: the worker pods, by the names the headless Service gives them."""
    name = job_name(cfg)
    return [Host(f"{name}-worker-{i}.{name}-workers", cfg.cluster.slots) for i in range(cfg.cluster.num_hosts)]


def passed_on(overrides):
    """The command line's overrides that the launcher pod composes the run with."""
    return [o for o in overrides if not o.lstrip("+~").startswith(NOT_PASSED_ON)]


def manifests(cfg, overrides, keys):
    """The job's objects (dicts, in the order to apply them) for the run of `cfg`, composed in the
    launcher pod from `overrides` (the command line's); `keys`: the ssh key pair (private, public)."""
    kubernetes, name = cfg.kubernetes, job_name(cfg)
    port = kubernetes.ssh_port
    private, public = keys

    def labels(component=None):
        marks = {"app.kubernetes.io/name": "hvdtrain", "app.kubernetes.io/instance": name}
        return {**marks, "app.kubernetes.io/component": component} if component else marks

    def metadata(suffix, component=None):
        meta = {"name": f"{name}-{suffix}", "labels": labels(component)}
        if kubernetes.namespace:
            meta["namespace"] = kubernetes.namespace
        return meta

    workers = labels("worker")
    mounts = [{"name": "ssh-keys", "mountPath": KEYS, "readOnly": True}, {"name": "runs", "mountPath": RUNS},
              {"name": "shm", "mountPath": "/dev/shm"}]  # torch's data loader workers share batches there

    def pod_spec(container, **more):
        return {"securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
                "containers": [{"name": container["name"], "image": kubernetes.image, **container,
                                "volumeMounts": mounts}],
                "volumes": [{"name": "ssh-keys", "secret": {"secretName": f"{name}-ssh", "defaultMode": 0o440}},
                            {"name": "runs", "persistentVolumeClaim": {"claimName": kubernetes.runs_claim}},
                            {"name": "shm", "emptyDir": {"medium": "Memory"}}],
                **more}

    module = ["python", "-m", "hvdtrain.launch.kubernetes"]
    worker = {"name": "worker", "command": [*module, "worker", "--port", str(port)],
              "ports": [{"name": "ssh", "containerPort": port}],
              "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 5}}
    if cfg.train.device == "cuda":
        worker["resources"] = {"limits": {"nvidia.com/gpu": cfg.cluster.slots}}
    hosts = ",".join(host.host for host in worker_hosts(cfg))
    launcher = {"name": "launcher",
                "command": [*module, "launch", "--hosts", hosts, "--slots", str(cfg.cluster.slots), "--port", str(port),
                            "--wait", str(kubernetes.worker_wait_s), "--run-dir", f"{RUNS}/{name}", "--",
                            *passed_on(overrides)]}
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": metadata("ssh"), "type": "Opaque",
         "stringData": {KEY: private, f"{KEY}.pub": public, "authorized_keys": public}},
        {"apiVersion": "v1", "kind": "Service", "metadata": metadata("workers", "worker"),
         "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": workers,
                  "ports": [{"name": "ssh", "port": port, "targetPort": port}]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata("worker", "worker"),
         "spec": {"serviceName": f"{name}-workers", "replicas": cfg.cluster.num_hosts,
                  "podManagementPolicy": "Parallel", "selector": {"matchLabels": workers},
                  "template": {"metadata": {"labels": workers}, "spec": pod_spec(worker)}}},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata("launcher", "launcher"),
         "spec": {"backoffLimit": 2,
                  "template": {"metadata": {"labels": labels("launcher")},
                               "spec": pod_spec(launcher, restartPolicy="Never")}}},
    ]


def ssh_key_pair():
    """(private, public) key of a new ed25519 pair, made with ssh-keygen."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / KEY
        try:
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdtrain", "-f", str(path)],
                           check=True, capture_output=True, timeout=30)
        except FileNotFoundError:
            raise ConfigError("launcher=kubernetes makes the job's ssh keys with ssh-keygen, which is not on PATH "
                              "(install OpenSSH's client)") from None
        return path.read_text(), path.with_suffix(".pub").read_text()


class _Dumper(yaml.SafeDumper):
    """YAML with text of several lines (the keys) as literal blocks, as people write it."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def printed(objects):
    """The manifests as one YAML stream, for `kubectl apply -f -`."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False)


# ----------------------------------------------------------------------------- in the pods


def sshd_config(port, home):
    """The ssh server's settings (written under `home`, with a host key made for this pod): it
    lets in the job's key only, and gives the sessions mpirun opens this pod's PATH, where the
    image's Python and mpirun are."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    host_key = home / "ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True,
                       capture_output=True)
    config = home / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", f"HostKey {host_key}", f"AuthorizedKeysFile {KEYS}/authorized_keys", f"PidFile {home}/sshd.pid",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "StrictModes no",  # the keys are a Secret's files: root's, readable by the pod's group
        f"SetEnv PATH={os.environ.get('PATH', '/usr/bin:/bin')}", ""]))
    return config


def worker(port):
    """A worker pod: an ssh server on `port`, as this user, in the foreground."""
    config = sshd_config(port, Path.home() / ".hvdtrain-sshd")
    os.execv("/usr/sbin/sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)])  # sshd re-executes itself by its path


def client_config(port, home=None):
    """The ssh client's settings for mpirun and the probes: the job's key, the workers' port, and
    no host keys kept (the pods' are made as each starts)."""
    ssh = Path(home or Path.home()) / ".ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ssh / KEY
    key.write_bytes((Path(KEYS) / KEY).read_bytes())
    key.chmod(0o600)
    (ssh / "config").write_text("\n".join([
        "Host *", f"  Port {port}", f"  IdentityFile {key}", "  StrictHostKeyChecking no",
        "  UserKnownHostsFile /dev/null", "  LogLevel ERROR", "  BatchMode yes", ""]))


def wait_for_workers(hosts, wait_s, probe=mpirun.reachable_hosts, interval_s=PROBE_INTERVAL_S):
    """Return once every host answers ssh; ConfigError naming the pods that did not within wait_s."""
    deadline = time.monotonic() + wait_s
    while True:
        answering = probe(hosts, [], os.environ)
        silent = [host for host in hosts if host not in answering]
        if not silent:
            return
        if time.monotonic() >= deadline:
            pods = ", ".join(host.host.split(".")[0] for host in silent)
            raise ConfigError(f"worker pod(s) {pods} did not answer ssh within {wait_s:g} s "
                              "(kubernetes.worker_wait_s); kubectl describe pod names why")
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))


def launch_command(hosts, run_dir, overrides):
    """The `hvdtrain` command of the launcher pod: the run it finds in run_dir resumed (a launcher
    pod started again), else a new one there from the overrides, on the worker pods."""
    if (Path(run_dir) / "config.yaml").is_file():
        return ["hvdtrain", f"resume={run_dir}"]
    listed = ",".join(f"{host.host}:{host.slots}" for host in hosts)
    return ["hvdtrain", *overrides, "launcher=local", f"cluster.hosts=[{listed}]", f"hydra.run.dir={run_dir}"]


def launch(hosts, wait_s, run_dir, overrides):
    try:
        wait_for_workers(hosts, wait_s)
    except ConfigError as error:
        print(f"hvdtrain: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    command = launch_command(hosts, run_dir, overrides)
    print(f"hvdtrain: every worker answers; {' '.join(command)}", flush=True)
    os.execvp(command[0], command)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hvdtrain.launch.kubernetes",
                                     description="What the pods of a launcher=kubernetes job run.")
    roles = parser.add_subparsers(dest="role", required=True)
    as_worker = roles.add_parser("worker", help="serve ssh for mpirun")
    as_worker.add_argument("--port", type=int, required=True)
    as_launcher = roles.add_parser("launch", help="wait for the workers, then train on them")
    as_launcher.add_argument("--hosts", required=True, help="the worker pods' DNS names, comma-separated")
    as_launcher.add_argument("--slots", type=int, required=True)
    as_launcher.add_argument("--port", type=int, required=True)
    as_launcher.add_argument("--wait", type=float, required=True, help="seconds to wait for every worker")
    as_launcher.add_argument("--run-dir", required=True)
    as_launcher.add_argument("overrides", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    if options.role == "worker":
        worker(options.port)
    client_config(options.port)
    overrides = options.overrides[1:] if options.overrides[:1] == ["--"] else options.overrides
    launch([Host(name, options.slots) for name in options.hosts.split(",")], options.wait, options.run_dir, overrides)


if __name__ == "__main__":
    main()
