#!/bin/sh
# Installs from Debian what the tests' clusters need beyond Python packages: for the Slurm cluster
# (tests/cluster/slurm_cluster.py) Slurm's controller, node daemon and client commands, munge, and
# libpmix-dev (Slurm's mpi/pmix plugin, which `srun --mpi=pmix` uses, loads the libpmix.so that
# only the -dev package ships); for Spark (tests/integration/spark/, tests/cluster/spark_cluster.py)
# a Java 17 runtime. Does nothing when all of it is installed already.
#
#     sudo sh scripts/install_test_packages.sh
set -eu
PACKAGES="slurmctld slurmd slurm-client munge libpmix-dev openjdk-17-jre-headless"

if [ "$(id -u)" -ne 0 ]; then
    echo "install_test_packages.sh: must run as root (it installs Debian packages with apt-get)" >&2
    exit 1
fi
missing=
for package in $PACKAGES; do
    if [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" != "install ok installed" ]; then
        missing="$missing $package"
    fi
done
[ -z "$missing" ] && exit 0

# The tests run daemons of their own, not the services the packages set up.
# APT::Sandbox::User=root: apt's download user cannot work where /tmp is not world-writable.
export DEBIAN_FRONTEND=noninteractive
apt-get -o APT::Sandbox::User=root update -q
# shellcheck disable=SC2086
apt-get -o APT::Sandbox::User=root install -y -q --no-install-recommends $missing
