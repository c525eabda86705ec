"""The run model: what the `hvdtrain` command and every rank of its job share.

The config schema, section by section (config/), the plan derived from it (plan.py), the device
the ranks train on (devices.py), the hosts (hosts.py), which kind of process this is (job.py),
the run directory's files (run_dir.py) and a scheduler's notice to stop (preemption.py). It
imports no framework and starts nothing.
"""
