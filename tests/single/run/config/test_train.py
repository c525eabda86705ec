"""The `train` section's precision and layout settings (hvdtrain/run/config/train.py): fp16 only
where it can run (CUDA, torch), channels_last only for image models, autocast a precision and
never a boolean, not even in a run's saved config.yaml; the settings that can run pass."""

import pytest

from hvdtrain.run.config import ConfigError, validate
from hvdtrain.run.run_dir import claim_run_dir, load_run_config

from support.configs import compose

REFUSED = {
    "fp16 on the CPU": (["train.autocast=fp16", "train.device=cpu"],
                        "train.autocast='fp16': float16 autocast is for CUDA, with a GradScaler; on the CPU "
                        "(train.device=cpu) use bf16"),
    "fp16 with tensorflow": (["train.autocast=fp16", "recipe.framework=tensorflow"],
                             "train.autocast='fp16': the tensorflow loop has no loss scaling; use bf16 (Keras's "
                             "mixed_bfloat16 policy)"),
    "channels_last for digits": (["train.channels_last=true"],
                                 "train.channels_last=True: applies to image models (resnet50, resnet101, resnet152, "
                                 "vgg16, inception_v3), not digits_mlp"),
    "an integer for autocast": (["train.autocast=1"],
                                "train.autocast='1': allowed: none, bf16, fp16"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_precision_and_layout_settings_that_cannot_run_are_refused(case):
    overrides, problem = REFUSED[case]
    with pytest.raises(ConfigError) as error:
        validate(compose(*overrides))
    assert str(error.value) == f"invalid config: {problem}"


@pytest.mark.parametrize("overrides", [
    ["train.autocast=bf16", "train.device=cpu"], ["train.autocast=fp16", "train.device=cuda"],
    ["recipe=synthetic", "train.channels_last=true"], ["recipe=synthetic", "train.channels_last=true",
                                                       "recipe.framework=tensorflow", "train.autocast=bf16"],
])
def test_precision_and_layout_settings_that_can_run_pass(overrides):
    validate(compose(*overrides))


@pytest.mark.parametrize("setting", ["true", "false"])
def test_autocast_takes_a_precision_not_a_boolean(setting):
    with pytest.raises(ConfigError, match=f"^invalid config: train.autocast='{setting.title()}': allowed: none, bf16, "
                                          f"fp16$"):
        validate(compose(f"train.autocast={setting}"))


def test_a_saved_config_with_a_boolean_autocast_is_refused_by_name(tmp_path):
    claim_run_dir(compose(), tmp_path)
    text = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(text.replace("autocast: none", "autocast: false"))
    with pytest.raises(ConfigError, match="train.autocast='False': allowed: none, bf16, fp16"):
        validate(load_run_config(tmp_path / "config.yaml"))
