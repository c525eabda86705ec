"""Launching: what runs in the process a user starts, before and around the ranks.

The `hvdtrain` command (cli.py) composes and checks the config (compose.py), continues a run
(resume.py), starts the ranks with mpirun (mpirun.py) or srun, or submits a Slurm batch job
(slurm.py), and watches the job to restart it (supervisor.py). `hvdtrun` (hvdtrun/) is Horovod's
horovodrun for hvdtrain scripts. What every rank runs is hvdtrain/training/.
"""
