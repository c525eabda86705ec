"""The `kubernetes` section: the job that `launcher=kubernetes` prints as manifests for
`kubectl apply -f -` instead of launching (hvdtrain/launch/kubernetes.py): worker pods of a
StatefulSet, one per host of the layout, and a launcher Job that trains on them."""

import re
from dataclasses import dataclass
from typing import Optional

# An object name Kubernetes takes (DNS-1123 label), short enough for the pods' names built on it
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")


@dataclass
class KubernetesConfig:
    image: Optional[str] = None  # the hvdtrain image every pod runs (`make image` builds one)
    # A PersistentVolumeClaim that the pods mount at /runs for run directories: the launcher and
    # rank 0's worker both read and write there, so ReadWriteMany (or pods on one node)
    runs_claim: Optional[str] = None
    name: Optional[str] = None  # prefix of every object's name; default hvdtrain-<recipe>
    namespace: Optional[str] = None  # default: the namespace kubectl applies to
    ssh_port: int = 2222  # the workers' sshd, which runs as the image's user
    worker_wait_s: int = 600  # the launcher gives up on a worker pod that does not answer by then


def check(cfg, problems):
    if cfg.launcher != "kubernetes":
        return
    kubernetes, cluster = cfg.kubernetes, cfg.cluster
    problems.check(bool(kubernetes.image), "kubernetes.image",
                   "must name the image the pods run (launcher=kubernetes; `make image` builds one)")
    problems.check(bool(kubernetes.runs_claim), "kubernetes.runs_claim",
                   "must name the PersistentVolumeClaim that holds run directories (launcher=kubernetes)")
    problems.check(kubernetes.name is None or NAME.fullmatch(kubernetes.name), "kubernetes.name",
                   "must be lower-case letters, digits and '-', at most 40, starting and ending alike")
    problems.check(1 <= kubernetes.ssh_port <= 65535, "kubernetes.ssh_port", "must be a port (1 to 65535)")
    problems.check(kubernetes.worker_wait_s > 0, "kubernetes.worker_wait_s", "must be a positive number of seconds")
    problems.check(not cluster.hosts and not cluster.hostfile, "cluster.hosts",
                   "launcher=kubernetes makes the hosts (a StatefulSet's pods, one per host of the layout): give "
                   "the layout only, e.g. cluster=2x4")
    problems.check(cluster.launcher == "mpirun", "cluster.launcher", "launcher=kubernetes starts the ranks with mpirun")
