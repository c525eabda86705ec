"""Hydra's errors as hvdtrain's: one line `invalid config: KEY=VALUE: what is allowed`.

Hydra reports an error of its own (a value of the wrong type, an unknown recipe, an override it
cannot parse) in several lines and exits with status 1, unless HYDRA_FULL_ERROR=1, when it raises
it. The `hvdtrain` command sets that while Hydra runs and turns what Hydra raises into a
ConfigError, which it reports like its own (exit status 2); a user who set HYDRA_FULL_ERROR=1
gets Hydra's full report. Keys the schema does not have are refused before Hydra runs.
"""

import contextlib
import os
import re
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from hvdtrain.runner.config import CONF_DIR, SCHEMA_KEYS, ConfigError, allowed_values, invalid, unknown_key_problem

FULL_ERROR_VARIABLE = "HYDRA_FULL_ERROR"

# Whether Hydra has started a job: an error other than Hydra's or OmegaConf's before that comes
# from composing the config (OmegaConf asserts when a key is set below a null section); after it,
# from the job itself, which keeps its traceback.
_job_started = False


def job_started():
    global _job_started
    _job_started = True


@contextlib.contextmanager
def reported_as_config_errors():
    """Around Hydra's main: what Hydra raises comes out as a ConfigError."""
    if os.environ.get(FULL_ERROR_VARIABLE) == "1":
        yield
        return
    os.environ[FULL_ERROR_VARIABLE] = "1"
    try:
        yield
    except ConfigError:
        raise
    except Exception as error:
        if isinstance(error, (HydraException, OmegaConfBaseException)) or not _job_started:
            raise invalid(problem(error)) from None
        raise
    finally:
        os.environ.pop(FULL_ERROR_VARIABLE, None)


def refuse_unknown_keys(overrides, config_dir=None):
    """Hydra's `+key=value` adds a key the schema does not have, which training would never read;
    a misspelt key without `+` Hydra refuses without naming the key meant. Both are refused here,
    before Hydra composes anything, naming the nearest known key. `config_dir` is Hydra's
    --config-dir, which may add groups of the user's."""
    config_dirs = [CONF_DIR] + ([Path(config_dir)] if config_dir else [])
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        is_group_choice = any((directory / key).is_dir() for directory in config_dirs)
        found = None if override.is_hydra_override() or is_group_choice else unknown_key_problem(key)
        if found:
            raise invalid(found)


def problem(error):
    """One line for an error Hydra raised: the key (and value) at fault and what is allowed."""
    cause = error if isinstance(error, OmegaConfBaseException) else error.__cause__  # OmegaConf's names the key
    if isinstance(error, OverrideParseException):
        return f"{error.override}: cannot be read as an override: {_one_line(error.message)}"
    if isinstance(error, MissingConfigException) and error.options:
        group, _, option = error.missing_cfg_file.rpartition("/")
        allowed = ", ".join(sorted(error.options, key=_natural_order))
        if group == "cluster":  # layouts without a file of their own are made when asked for (config.LAYOUT)
            allowed += ", or any HOSTSxSLOTS such as 3x2"
        return f"{group}={option!r}: unknown {group}; allowed: {allowed}"
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key.startswith("hydra."):
        return f"{cause.full_key}: not a key of Hydra's config (hvdtrain --cfg hydra shows them)"
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        return unknown_key_problem(cause.full_key) or f"{cause.full_key}: unknown key"
    if isinstance(cause, ValidationError) and cause.full_key in SCHEMA_KEYS:
        return f"{cause.full_key}={cause.value!r}: {allowed_values(cause.full_key)}"
    if isinstance(cause, OmegaConfBaseException):
        message = (cause.msg or str(cause) or type(cause).__name__).splitlines()[0]  # the rest repeats key and types
        return f"{cause.full_key}: {message}" if cause.full_key else message
    return _one_line(str(error)) or type(error).__name__


def _one_line(text):
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _natural_order(name):
    """'2x4' before '16x8': numbers compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
