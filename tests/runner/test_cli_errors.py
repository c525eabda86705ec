"""The `hvdtrain` command's errors: whatever is wrong with the command line (an unknown key, a value
of the wrong type, an unknown recipe or layout, an override Hydra cannot parse, a device that is
not there) ends in one line `hvdtrain: invalid config: ...` and exit status 2, before anything is
launched; Hydra's own multi-line report only with HYDRA_FULL_ERROR=1."""

import json

import pytest

from hvdtrain.launch.compose import RECIPES_DIR

from support.commands import run_hvdtrain

OPTIMIZER_KEYS = ("name, base_lr, base_batch_size, momentum, nesterov, weight_decay, exclude_from_weight_decay, "
                  "momentum_correction, trust_coefficient, exclude_from_adaptation")
TRAIN_KEYS = ", ".join(f"train.{key}" for key in (
    "epochs", "batch_size", "backward_passes_per_step", "autocast", "device", "channels_last", "cudnn_benchmark",
    "seed", "log_every_steps", "eval_every_epochs", "checkpoint_every_steps", "checkpoint_every_s", "keep_checkpoints",
    "preempt_signal"))

ONE_LINE_ERRORS = {
    "key added with +, misspelt": (["+optimzer.base_lr=0.5"],
                                   "optimzer.base_lr: unknown key; did you mean optimizer.base_lr?"),
    "misspelt key": (["optimzer.base_lr=0.5"], "optimzer.base_lr: unknown key; did you mean optimizer.base_lr?"),
    "key added with +, nothing near": (["+optimizer.bogus=1"],
                                       f"optimizer.bogus: unknown key; the keys of optimizer: {OPTIMIZER_KEYS}"),
    "key deleted with ~, misspelt": (["~train.epoch"], "train.epoch: unknown key; did you mean train.epochs?"),
    "not an integer": (["train.epochs=abc"], "train.epochs='abc': must be an integer"),
    "not a boolean": (["train.channels_last=maybe"], "train.channels_last='maybe': must be true or false"),
    "not an autocast mode": (["train.autocast=fp32"],
                             "train.autocast='fp32': allowed: none, bf16, fp16"),
    "not a list": (["optimizer.exclude_from_weight_decay=bn"],
                   "optimizer.exclude_from_weight_decay='bn': must be a list of strings, written [x,y,...]"),
    "a section set to a value": (["train=3"], f"train=3: is a section; set its keys instead: {TRAIN_KEYS}"),
    "unknown layout": (["cluster=3x3x"], "cluster='3x3x': unknown cluster; allowed: 1x1, 1x2, 1x4, 1x8, 2x4, 2x8, "
                                         "4x4, 4x8, 8x8, 16x8, 32x4, 32x8, local, or any HOSTSxSLOTS such as 3x2"),
    "unknown model": (["model=resnet9000"], "model='resnet9000': unknown model; allowed: digits_cnn, digits_mlp, "
                                            "inception_v3, mnist1d_cnn, mnist1d_mlp, resnet50, resnet101, resnet152, "
                                            "vgg16"),
    "LARS without a positive trust coefficient": (["optimizer=lars", "optimizer.trust_coefficient=-1"],
                                                  "optimizer.trust_coefficient=-1.0: must be a positive number "
                                                  "(LARS's eta, e.g. 0.001)"),
    "unparsable override": (["train.epochs=[1,"], "train.epochs=[1,: cannot be read as an override: no viable "
                                                  "alternative at input '[1,' See https://hydra.cc/docs/1.2/advanced/"
                                                  "override_grammar/basic for details"),
    "a key below a null section": (["recipe=synthetic", "recipe.target.value=3"],
                                   "Unexpected type for root: NoneType"),  # OmegaConf asserts: no key to name
    "unknown key of Hydra's": (["hydra.bogus=1"], "hydra.bogus: not a key of Hydra's config (hvdtrain --cfg hydra "
                                                  "shows them)"),
    "a sweep without -m": (["train.epochs=1,2"], "Ambiguous value for argument 'train.epochs=1,2' 1. To use it as a "
                                                 "list, use key=[value1,value2] 2. To use it as string, quote the "
                                                 "value: key=\\'value1,value2\\' 3. To sweep over it, add --multirun "
                                                 "to your command line"),
    "--cfg job with an unknown layout": (["--cfg", "job", "cluster=3x3x"],
                                         "cluster='3x3x': unknown cluster; allowed: 1x1, 1x2, 1x4, 1x8, 2x4, 2x8, "
                                         "4x4, 4x8, 8x8, 16x8, 32x4, 32x8, local, or any HOSTSxSLOTS such as 3x2"),
    "an unknown preempt signal": (["train.preempt_signal=SIGUSR1"], "train.preempt_signal='SIGUSR1': allowed: USR1, "
                                                                    "USR2, TERM (a signal's name without SIG), or null"),
    "an unknown rank launcher": (["cluster.launcher=ssh"], "cluster.launcher='ssh': allowed: mpirun, srun"),
    "an unknown launcher": (["launcher=pbs"], "launcher='pbs': allowed: local, slurm"),
    "a time limit sbatch cannot read": (["launcher=slurm", "slurm.time=2h"],
                                        "slurm.time='2h': must be a time limit as sbatch takes it: MINUTES, HH:MM:SS "
                                        "or D-HH:MM:SS"),
    "an sbatch line that is no option": (["launcher=slurm", "slurm.sbatch_lines=['qos=high']"],
                                         "slurm.sbatch_lines=['qos=high']: 'qos=high' is not an sbatch option (such "
                                         "as --qos=high)"),
    "an unknown value in one job of a sweep": (["-m", "train.epochs=1,abc"], "train.epochs='abc': must be an integer"),
}


@pytest.mark.parametrize("case", ONE_LINE_ERRORS)
def test_a_bad_command_line_ends_in_one_line_and_exit_status_2(case, tmp_path):
    arguments, problem = ONE_LINE_ERRORS[case]
    result = run_hvdtrain(*arguments, "dry_run=true", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"hvdtrain: invalid config: {problem}\n")
    # No run directory is left; a sweep leaves Hydra's record of what it was asked.
    assert [path.name for path in tmp_path.rglob("*") if path.is_file()] in ([], ["multirun.yaml"])


def test_an_unknown_recipe_lists_the_recipes(tmp_path):
    result = run_hvdtrain("recipe=nope", f"hydra.run.dir={tmp_path / 'run'}")
    prefix = "hvdtrain: invalid config: recipe='nope': unknown recipe; allowed: "
    assert result.returncode == 2 and result.stderr.startswith(prefix) and result.stderr.count("\n") == 1
    listed = result.stderr[len(prefix):].strip().split(", ")
    assert sorted(listed) == sorted(path.stem for path in RECIPES_DIR.glob("*.yaml"))
    assert listed.index("resnet50_imagenet") < listed.index("resnet101_imagenet")  # numbers in number order


def test_hydra_full_error_shows_hydras_own_report():
    result = run_hvdtrain("train.epochs=abc", env={"HYDRA_FULL_ERROR": "1"})
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "Error merging override train.epochs=abc" in result.stderr


def test_valid_command_lines_still_work(tmp_path):
    sweep = run_hvdtrain("-m", "optimizer.base_lr=0.05,0.1", "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert sweep.returncode == 0, sweep.stderr
    plans = [json.loads(line) for line in sweep.stdout.splitlines() if line.startswith("{")]
    assert [plan["base_lr"] for plan in plans] == [0.05, 0.1]
    shown = run_hvdtrain("--cfg", "job", "recipe=vgg16_imagenet", "++train.epochs=3")
    assert shown.returncode == 0, shown.stderr
    assert "name: vgg16" in shown.stdout and "epochs: 3" in shown.stdout
    assert run_hvdtrain("--help", "recipe=resnet50_imagenet").returncode == 0


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_cuda_without_a_visible_device_is_refused_before_launch(framework, tmp_path):
    result = run_hvdtrain("train.device=cuda", f"recipe.framework={framework}", f"hydra.run.dir={tmp_path / 'run'}",
                          env={"CUDA_VISIBLE_DEVICES": ""})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"hvdtrain: invalid config: train.device='cuda': no CUDA device visible to {framework} on this machine with "
        f"CUDA_VISIBLE_DEVICES=''; use train.device=auto (a GPU where there is one) or train.device=cpu\n")
    assert not (tmp_path / "run").exists()
    # The plan needs no device: it says what launching it here would meet.
    plan = run_hvdtrain("train.device=cuda", "dry_run=true", env={"CUDA_VISIBLE_DEVICES": ""})
    assert plan.returncode == 0, plan.stderr
    plan = json.loads(plan.stdout)
    assert (plan["device"], plan["gpus_per_host"]) == ("cuda", 2)
    assert plan["device_reason"].startswith("launching it here is refused: train.device='cuda': no CUDA device")
