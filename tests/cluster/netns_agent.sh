#!/bin/sh
# Open MPI's remote-exec agent for "hosts" that are network namespaces on this machine (see
# tests/cluster/netns_cluster.py). Open MPI calls it as `netns_agent.sh PRIVATE_DIR FIRST_HOST
# HOST COMMAND`, where it would call `ssh HOST COMMAND` (the first two words come with the agent's
# name in plm_ssh_agent); HOST is the address of one namespace's interface.
#
# Hosts do not share a file system: on every host but FIRST_HOST (the one that shares the view of
# the machine where the job was started, as the launching host of a real cluster does) a fresh,
# empty tmpfs lies over PRIVATE_DIR, in a mount namespace of the host's own, so that a file one
# host expects another to have written is not there. Everything outside PRIVATE_DIR (the
# repository, the virtual environment) stays visible, as an identical install on every host is.
private_dir=$1
first_host=$2
host=$3
shift 3
namespace=
for candidate in $(ip netns list | cut -d' ' -f1); do
    if ip -n "$candidate" -4 -o addr show | grep -qF "inet $host/"; then
        namespace=$candidate
        break
    fi
done
if [ -z "$namespace" ]; then
    echo "netns_agent.sh: no network namespace has the address '$host'" >&2
    exit 1
fi
private=
if [ "$host" != "$first_host" ]; then
    private=$private_dir
fi
# A UTS namespace of its own gives each host its own hostname, which MPI reports as the
# processor name; the namespace's name serves. The command is shell text, run in the home
# directory, as ssh would run it (Open MPI's daemon crashes if it starts in a directory that the
# tmpfs hides). TMPDIR is PRIVATE_DIR on every host: a daemon that was killed leaves its session
# directory there, with the cluster, not in /tmp, where a later daemon given the same pid would
# fail to start on it.
exec ip netns exec "$namespace" unshare --uts --mount --propagation private sh -c '
    hostname "$0" || exit 1
    if [ -n "$1" ]; then
        mount -t tmpfs -o mode=0755 hvdtrain-private-files "$1" || exit 1
    fi
    cd || exit 1
    export TMPDIR="$3"
    exec sh -c "$2"' "$namespace" "$private" "$*" "$private_dir"
