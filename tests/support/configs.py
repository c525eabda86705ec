"""Configs composed as `hvdtrain` composes them."""

from hvdtrain.launch.compose import CONF_DIR, register_configs, register_layouts
from hvdtrain.run.config import typed


def compose(*overrides):
    """The config `hvdtrain OVERRIDES` composes, resolved and typed as the workers see it."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    register_configs()
    register_layouts(overrides)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        plain = {key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
                 for key in cfg if key != "hydra"}
    return typed(plain)
