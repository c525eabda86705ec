#!/bin/sh
# Open MPI's remote-exec agent for "hosts" that are network namespaces on this machine
# (see tests/cluster/conftest.py). Open MPI calls it as `netns_agent.sh HOST COMMAND`, where it
# would call `ssh HOST COMMAND`; HOST is the address of one namespace's interface.
host=$1
shift
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
# A UTS namespace of its own gives each host its own hostname, which MPI reports as the
# processor name; the namespace's name serves. The command is shell text, as ssh would run it.
exec ip netns exec "$namespace" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$namespace" "$*"
