#!/bin/sh
# `make image`: builds hvdtrain's image (Containerfile) with podman, as hvdtrain:<version>.
#
# The build context is build/image/: constraints.txt and a wheelhouse of hvdtrain's wheel and its
# pinned dependencies, downloaded once into build/wheels (about 4 GB: the CUDA build of torch) and
# reused by later builds. The base is $BASE if given (e.g. docker.io/library/debian:bookworm-slim,
# the Containerfile's default); without it, and where no registry answers (as on the machine
# hvdtrain is developed on), a Debian bookworm root made by debootstrap from apt's own mirror,
# imported into podman as localhost/hvdtrain-base:bookworm.
set -eu
cd "$(dirname "$0")/.."
VERSION=$(.venv/bin/python -c 'import hvdtrain; print(hvdtrain.__version__)')
IMAGE=${IMAGE:-hvdtrain:$VERSION}
# podman as this machine needs it: crun refuses its hybrid cgroups, and limits cannot be raised
PODMAN="podman --runtime runc"
LIMITS="--ulimit nofile=1024:1024 --ulimit nproc=1024:1024"

if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null || ! command -v runc >/dev/null; then
    apt-get install -y -q podman runc debootstrap >/dev/null
fi

mkdir -p build/wheels build/image
.venv/bin/python -m pip wheel --quiet --no-deps --wheel-dir build/wheels .
.venv/bin/python -m pip download --quiet --disable-pip-version-check --dest build/wheels \
    -c constraints.txt "$(ls build/wheels/hvdtrain-*.whl)[mpi,tf,gpu]"
rm -rf build/image/wheels
cp -al build/wheels build/image/wheels 2>/dev/null || cp -r build/wheels build/image/wheels
cp constraints.txt build/image/

if [ -z "${BASE:-}" ]; then
    BASE=localhost/hvdtrain-base:bookworm
    if ! $PODMAN image exists "$BASE"; then
        MIRROR=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
        rm -rf build/rootfs
        debootstrap --variant=minbase bookworm build/rootfs "${MIRROR:-http://deb.debian.org/debian}" >/dev/null
        tar -C build/rootfs -c . | $PODMAN import - "$BASE" >/dev/null
        rm -rf build/rootfs
    fi
fi

$PODMAN build $LIMITS --build-arg BASE="$BASE" -t "$IMAGE" -f Containerfile build/image
$PODMAN image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$IMAGE"
