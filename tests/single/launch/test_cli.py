"""The `hvdtrain` command (hvdtrain/launch/cli.py), run in this process for all it decides before
anything is launched: a config that cannot run ends in one line and launches nothing; a dry run
prints the plan as one JSON object (the hosts of a layout or of a Slurm allocation, placeholders
for hosts not given, the mpirun command it would launch); a sweep of dry runs prints one plan a
job; --cfg and --help; the progress bar the workers draw only where the command writes to a
terminal. A refusal as a user's shell sees it (the exit status and stderr of the process):
tests/parallel/launch/test_cli.py; that a dry run imports no framework:
tests/parallel/scaling/test_prediction.py."""

import io
import json
import sys

import pytest

from hvdtrain.launch import cli
from hvdtrain.run.plan import read_plans
from hvdtrain.run.job import progress_bar_wanted

from support.commands import hvdtrain_here, no_launch
from support.configs import compose


@pytest.fixture(autouse=True)
def nothing_launched(monkeypatch):
    """hvdtrain runs in this process here: none of it may start a job."""
    no_launch(monkeypatch)


# Values Hydra takes and the config's checks refuse (Hydra's own refusals: test_compose.py).
ONE_LINE_ERRORS = {
    "not an autocast mode": (["train.autocast=fp32"], "train.autocast='fp32': allowed: none, bf16, fp16"),
    "LARS without a positive trust coefficient": (["optimizer=lars", "optimizer.trust_coefficient=-1"],
                                                  "optimizer.trust_coefficient=-1.0: must be a positive number "
                                                  "(LARS's eta, e.g. 0.001)"),
    "an unknown preempt signal": (["train.preempt_signal=SIGUSR1"], "train.preempt_signal='SIGUSR1': allowed: USR1, "
                                                                    "USR2, TERM (a signal's name without SIG), or null"),
    "an unknown rank launcher": (["cluster.launcher=ssh"], "cluster.launcher='ssh': allowed: mpirun, srun, ray"),
    "an unknown launcher": (["launcher=pbs"], "launcher='pbs': allowed: local, slurm, kubernetes"),
    "a time limit sbatch cannot read": (["launcher=slurm", "slurm.time=2h"],
                                        "slurm.time='2h': must be a time limit as sbatch takes it: MINUTES, HH:MM:SS "
                                        "or D-HH:MM:SS"),
    "an sbatch line that is no option": (["launcher=slurm", "slurm.sbatch_lines=['qos=high']"],
                                         "slurm.sbatch_lines=['qos=high']: 'qos=high' is not an sbatch option (such "
                                         "as --qos=high)"),
    "negative bandwidth": (["cluster=2x4", "cluster.network.gbps=-1"],
                           "cluster.network.gbps=-1.0: must be a positive Gbit/s or null"),
}

# Command lines that cannot run, each refused by the check that knows why, before anything starts.
BAD_INPUTS = {
    "unknown model": (["model.name=resnet9000"], "model.name='resnet9000': unknown model; allowed: resnet50"),
    "unknown framework": (["recipe.framework=jax"], "recipe.framework='jax': allowed: torch, tensorflow"),
    "negative LR": (["optimizer.base_lr=-0.1"], "optimizer.base_lr=-0.1: must be a positive"),
    "warmup longer than training": (["schedule.warmup_epochs=50"], "schedule.warmup_epochs=50.0: must be between 0 and"),
    "missing data root": (["recipe=resnet50_imagenet"], "data.root is not set"),
    "batch size 0": (["train.batch_size=0"], "train.batch_size=0: must be a positive"),
    "unknown cluster": (["cluster=3-by-7"], "cluster='3-by-7': unknown cluster; allowed: 1x1, 1x2"),  # 3x7 is one
    "multi-host layout without hosts": (["cluster=4x4"], "cluster=4x4 needs 4 hosts but none were given"),
    "too few slots on a host": (["cluster=2x4", "cluster.hosts=[a:4,b:2]"], "host b offers 2"),
    "unknown key": (["train.bach_size=3"], "train.bach_size: unknown key; did you mean train.batch_size?"),
    "a run to resume that does not exist": (["resume=runs/digits/never"],
                                            "resume=runs/digits/never: no such directory"),
}


def here(*args, cwd, env=None):
    """`hvdtrain ARGS` run in this process in `cwd`, with `env` set, for a module-scoped fixture."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        no_launch(monkeypatch)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        return hvdtrain_here(*args, monkeypatch=monkeypatch, cwd=cwd)


def plans(result):
    assert result.returncode == 0, result.stdout + result.stderr
    return read_plans(result.stdout)


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """refused(ARGUMENTS): (what `hvdtrain ARGUMENTS` gives, run in a directory of its own, what
    it left there), each command line run once."""
    seen = {}

    def run(*arguments):
        if arguments not in seen:
            where = tmp_path_factory.mktemp("refused")
            seen[arguments] = here(*arguments, cwd=where), sorted(where.rglob("*"))
        return seen[arguments]

    return run


@pytest.mark.parametrize("case", ONE_LINE_ERRORS)
def test_a_value_the_checks_refuse_ends_in_one_line_and_exit_status_2(case, refused):
    result, _ = refused(*ONE_LINE_ERRORS[case][0], "dry_run=true")
    problem = ONE_LINE_ERRORS[case][1]
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"hvdtrain: invalid config: {problem}\n")


@pytest.mark.parametrize("case", ONE_LINE_ERRORS)
def test_a_value_the_checks_refuse_leaves_no_run_directory(case, refused):
    _, left = refused(*ONE_LINE_ERRORS[case][0], "dry_run=true")
    assert [path for path in left if path.is_file()] == []


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_one_clear_message(case, refused):
    result, _ = refused(*BAD_INPUTS[case][0])
    assert result.returncode != 0
    assert BAD_INPUTS[case][1] in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_launches_nothing(case, refused):
    result, left = refused(*BAD_INPUTS[case][0])
    assert "starting" not in result.stdout and left == []


def test_a_bad_progress_bar_setting_gets_a_clear_message_and_launches_nothing(tmp_path):
    result = here(f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env={"HVDTRAIN_PROGRESS_BAR": "yes"})
    assert result.returncode != 0
    assert "environment variable HVDTRAIN_PROGRESS_BAR must be 0 or 1, got 'yes'" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "starting" not in result.stdout and not (tmp_path / "run").exists()


def test_a_horovod_variable_the_ranks_would_refuse_ends_in_one_line_before_launching(tmp_path):
    result = here(f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env={"HOROVOD_FUSION_THRESHOLD": "abc"})
    assert (result.returncode, result.stdout, result.stderr) == (
        2, "", "hvdtrain: environment variable HOROVOD_FUSION_THRESHOLD='abc' is not a valid int\n")
    assert not (tmp_path / "run").exists()


@pytest.fixture
def stderr_a_terminal(monkeypatch):
    """set(terminal): the command's stderr is a terminal or not (mpirun gives the workers a pipe
    either way: the command tells them)."""
    def writes_to_a_terminal(terminal):
        class Stderr(io.StringIO):
            def isatty(self):
                return terminal

        monkeypatch.setattr(sys, "stderr", Stderr())

    monkeypatch.delenv("HVDTRAIN_PROGRESS_BAR", raising=False)
    return writes_to_a_terminal


@pytest.mark.parametrize("terminal", [True, False])
def test_the_workers_draw_a_progress_bar_only_where_the_command_writes_to_a_terminal(terminal, stderr_a_terminal,
                                                                                      tmp_path):
    stderr_a_terminal(terminal)
    _, environment = cli._launch_plan(compose(), tmp_path)
    assert environment["HVDTRAIN_PROGRESS_BAR"] == ("1" if terminal else "0")
    assert progress_bar_wanted(environment) is terminal


def test_the_users_progress_bar_setting_stands(stderr_a_terminal, monkeypatch, tmp_path):
    stderr_a_terminal(True)
    monkeypatch.setenv("HVDTRAIN_PROGRESS_BAR", "0")
    _, environment = cli._launch_plan(compose(), tmp_path)
    assert environment["HVDTRAIN_PROGRESS_BAR"] == "0"


def test_a_sweep_of_dry_runs_prints_one_plan_a_job(tmp_path, monkeypatch):
    sweep = hvdtrain_here("-m", "optimizer.base_lr=0.05,0.1", "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                          monkeypatch=monkeypatch, cwd=tmp_path)
    assert [plan["base_lr"] for plan in plans(sweep)] == [0.05, 0.1]


def test_cfg_job_shows_a_recipes_config_with_the_overrides(monkeypatch, tmp_path):
    shown = hvdtrain_here("--cfg", "job", "recipe=vgg16_imagenet", "++train.epochs=3", monkeypatch=monkeypatch,
                          cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "name: vgg16" in shown.stdout and "epochs: 3" in shown.stdout


def test_help_with_a_recipe_works(monkeypatch, tmp_path):
    assert hvdtrain_here("--help", "recipe=resnet50_imagenet", monkeypatch=monkeypatch, cwd=tmp_path).returncode == 0


def test_help_lists_the_recipes_and_clusters(monkeypatch, tmp_path):
    result = hvdtrain_here("--help", monkeypatch=monkeypatch, cwd=tmp_path)
    assert result.returncode == 0
    assert "recipe: digits" in result.stdout and "4x4" in result.stdout and "dry_run=true" in result.stdout


def test_help_shows_the_subcommands_and_the_users_own_config_folder(monkeypatch, tmp_path):
    result = hvdtrain_here("--help", monkeypatch=monkeypatch, cwd=tmp_path)
    assert all(usage in result.stdout for usage in ("hvdtrain ls", "hvdtrain cp RECIPE NEW", "--config-dir conf"))


@pytest.fixture(scope="module")
def resnet101_on_4x4(tmp_path_factory):
    """The plan a dry run of resnet101_imagenet on 4 hosts of 4 ranks prints; its mpirun command apart."""
    result = here("recipe=resnet101_imagenet", "cluster=4x4", "cluster.hosts=[h1,h2,h3,h4]", "dry_run=true",
                  "hydra.run.dir=runs/never-made", cwd=tmp_path_factory.mktemp("plan"))
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)  # one JSON object and nothing else on stdout
    return plan, plan.pop("launch_command")


def test_a_dry_run_prints_the_plan(resnet101_on_4x4):
    # The plan reads no data: a dry run needs no data.root (ImageNet's size is in its data config).
    plan, _ = resnet101_on_4x4
    assert plan == {
        "world_size": 16,
        "hosts": [{"host": "h1", "slots": 4}, {"host": "h2", "slots": 4}, {"host": "h3", "slots": 4},
                  {"host": "h4", "slots": 4}],
        "per_worker_batch_size": 32,
        "backward_passes_per_step": 1,
        "global_batch_size": 512,
        "base_lr": 0.1,
        "base_batch_size": 256,
        "peak_lr": 0.2,
        "warmup": "gradual",
        "warmup_epochs": 5.0,
        "epochs": 100,
        "steps_per_epoch": 2502,  # 1281167 ImageNet images // 16 ranks // 32
        "device": "auto",  # other hosts: their ranks decide when the job starts
        "gpus_per_host": None,
        "device_reason": "train.device=auto: decided when the job starts: CUDA if every host has a GPU for each "
                         "of its ranks, else the CPU",
        "decode": "auto",  # with the device: nvJPEG on CUDA, else PIL
        "decode_reason": "data.decode=auto: gpu where the ranks train on CUDA, decided as they start",
        "restarts": 3,  # fault.max_restarts: hvdtrain launches this job, so it supervises it
        "predicted_efficiency": None,  # the prediction's cases: tests/single/scaling/test_prediction.py
        "predicted_samples_per_s": None,
        "prediction_missing": "unknown: cluster.network.gbps (between hosts, e.g. cluster.network.gbps=25); one "
                              "device's throughput: measure it on a cuda device with profile=true in place of "
                              "dry_run=true (it writes runs/.profiles/resnet101_imagenet-resnet101-32-cuda.json), or "
                              "set recipe.reference_throughput",
    }


def test_a_dry_run_shows_the_mpirun_command_it_would_launch(resnet101_on_4x4):
    _, command = resnet101_on_4x4
    assert command[0].endswith("mpirun") and command[command.index("-np") + 1] == "16"
    assert command[command.index("-H") + 1] == "h1:4,h2:4,h3:4,h4:4"
    assert command[-3:-1] == ["-m", "hvdtrain.training.worker"]


@pytest.fixture(scope="module")
def without_hosts(tmp_path_factory):
    """The plan of a dry run of resnet101_imagenet on 4x4 without hosts."""
    result = here("recipe=resnet101_imagenet", "cluster=4x4", "dry_run=true", "hydra.run.dir=runs/never-made",
                  cwd=tmp_path_factory.mktemp("plan"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_dry_run_without_hosts_names_placeholders(without_hosts):
    assert without_hosts["hosts"] == [{"host": f"<host{i}>", "slots": 4} for i in range(4)]
    command = without_hosts["launch_command"]
    assert command[command.index("-H") + 1] == "<host0>:4,<host1>:4,<host2>:4,<host3>:4"


def test_a_dry_run_without_hosts_plans_as_with_them(without_hosts):
    assert (without_hosts["world_size"], without_hosts["global_batch_size"], without_hosts["steps_per_epoch"]) == \
        (16, 512, 2502)


def test_a_launch_from_a_data_root_without_train_and_val_is_refused_in_one_line(tmp_path, monkeypatch):
    result = hvdtrain_here("recipe=resnet101_imagenet", "cluster=4x4", "data.root=/nowhere",
                           f"hydra.run.dir={tmp_path / 'run'}", monkeypatch=monkeypatch, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == ("hvdtrain: invalid config: data.root='/nowhere': has no train/ and no val/ directory "
                             "(an ImageFolder tree needs /nowhere/train and /nowhere/val)\n")


@pytest.fixture(scope="module")
def in_an_allocation(tmp_path_factory, image_tree):
    """The plan of a dry run on 2x4 inside a Slurm allocation of two nodes, with mpirun's own options."""
    result = here("recipe=resnet101_imagenet", "cluster=2x4", f"data.root={image_tree}", "dry_run=true",
                  "cluster.mpirun_args=[--mca,plm_rsh_agent,/usr/bin/ssh]", cwd=tmp_path_factory.mktemp("plan"),
                  env={"SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_TASKS_PER_NODE": "4(x2)"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_dry_run_takes_the_hosts_of_a_slurm_allocation(in_an_allocation):
    assert in_an_allocation["hosts"] == [{"host": "gpu07", "slots": 4}, {"host": "gpu08", "slots": 4}]


def test_a_dry_run_passes_cluster_mpirun_args_to_mpirun(in_an_allocation):
    command = in_an_allocation["launch_command"]
    assert command[command.index("--mca"):command.index("--mca") + 3] == ["--mca", "plm_rsh_agent", "/usr/bin/ssh"]


def test_srun_as_the_rank_launcher_outside_slurm_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = hvdtrain_here("recipe=digits", "cluster.launcher=srun", monkeypatch=monkeypatch, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, "hvdtrain: cluster.launcher=srun starts the ranks as a step of a "
                                                     "Slurm job: run inside an allocation (salloc, sbatch, "
                                                     "launcher=slurm), or use cluster.launcher=mpirun\n")
    assert not (tmp_path / "runs").exists()
