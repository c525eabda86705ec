"""Composing a run's config with Hydra, and Hydra's errors as hvdtrain's.

The schema (hvdtrain/run/config/) goes into Hydra's ConfigStore; the config groups and recipes
are the YAML files of hvdtrain/conf/, shipped in the package so that any install has them. A
layout `cluster=HOSTSxSLOTS` without a file of its own is made when asked for, and a new run's
directory is named by its Slurm job where it runs in one (hvdtrain/launch/slurm.py), else by the
time.

Hydra reports an error of its own (a value of the wrong type, an unknown recipe, an override it
cannot parse) in several lines and exits with status 1, unless HYDRA_FULL_ERROR=1, when it raises
it. The `hvdtrain` command sets that while Hydra runs and turns what Hydra raises into a
ConfigError, one line `invalid config: KEY=VALUE: what is allowed`, which it reports like its own
(exit status 2); a user who set HYDRA_FULL_ERROR=1 gets Hydra's full report. Keys the schema does
not have are refused before Hydra runs, naming the nearest known key.
"""

import contextlib
import dataclasses
import difflib
import os
import re
import typing
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from hvdtrain.launch import slurm
from hvdtrain.run.config import ConfigError, RunConfig, invalid

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
RECIPES_DIR = CONF_DIR / "recipe"
LAYOUT = re.compile(r"(\d+)x(\d+)")  # cluster=HOSTSxSLOTS


def register_configs():
    """Put the schema into Hydra's ConfigStore, and the resolver that names a run's directory.
    The recipes are the group `recipe` (conf/recipe/); each one is global (`# @package _global_`),
    so that it can set any key and choose the other groups (`override /model: resnet50`)."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    # hydra.run.dir: a resumed run continues in its own directory, a new one gets a fresh one.
    OmegaConf.register_new_resolver("run_dir", _run_dir, replace=True)


def _run_dir(resume, parent, time):
    """hydra.run.dir: the run resumed, else a new one under `parent`. Hydra makes the directory
    before the job starts, so a resumed one that does not exist is refused here."""
    if resume and not Path(resume).is_dir():
        raise ConfigError(f"resume={resume}: no such directory")
    return resume or f"{parent}/{slurm.job_run_name() or time}"


def register_layouts(overrides, config_dir=None):
    """Put every layout `cluster=HOSTSxSLOTS` that `overrides` choose (a sweep's too) into Hydra's
    ConfigStore, unless a file cluster/HOSTSxSLOTS.yaml has it (in hvdtrain/conf or Hydra's
    --config-dir `config_dir`): any layout works without a file of its own. Zero hosts or slots
    are registered all the same, for validate() to refuse by name."""
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.key_or_group != "cluster":
            continue
        if override.value_type == ValueType.ELEMENT:
            choices = [override.get_value_element_as_str()]
        elif override.value_type in (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP):
            choices = list(override.sweep_string_iterator())
        else:
            continue
        for choice in choices:
            layout = LAYOUT.fullmatch(choice)
            files = [Path(folder) / "cluster" / f"{choice}.yaml" for folder in (CONF_DIR, config_dir) if folder]
            if layout and not any(file.is_file() for file in files):
                ConfigStore.instance().store(group="cluster", name=choice,
                                             node={"num_hosts": int(layout[1]), "slots": int(layout[2])})


def _schema_keys(section=RunConfig, prefix=""):
    """Every key of the schema, dotted ('train.epochs', sections too), with its declared type."""
    keys = {}
    for name, annotation in typing.get_type_hints(section).items():
        keys[prefix + name] = annotation
        inner = _section_type(annotation)
        if inner is not None:
            keys.update(_schema_keys(inner, f"{prefix}{name}."))
    return keys


def _section_type(annotation):
    """The dataclass of a section's annotation (`TargetConfig` for Optional[TargetConfig]), else None."""
    return next((candidate for candidate in (annotation, *typing.get_args(annotation))
                 if dataclasses.is_dataclass(candidate)), None)


SCHEMA_KEYS = _schema_keys()


def unknown_key_problem(key):
    """None if the schema has `key`; else a line naming it and the nearest known key, or, when none
    is near, the keys of the section it was meant for."""
    if key in SCHEMA_KEYS:
        return None
    parts = key.split(".")
    known_depth = next(depth for depth in range(len(parts)) if ".".join(parts[:depth + 1]) not in SCHEMA_KEYS)
    section = ".".join(parts[:known_depth])
    prefix = section + "." if section else ""
    # Compare only below the section that is right, so that `optimizer.bogus` is not taken for
    # `optimizer.base_lr` just because both begin with `optimizer.`.
    below = [known[len(prefix):] for known in SCHEMA_KEYS if known.startswith(prefix)]
    nearest = difflib.get_close_matches(".".join(parts[known_depth:]), below, n=1)
    if nearest:
        return f"{key}: unknown key; did you mean {prefix}{nearest[0]}?"
    # A name that lives in another section (train.lr for optimizer.base_lr): keys anywhere whose
    # last part has the unknown one's last part as a word.
    word = parts[-1]
    elsewhere = [known for known in SCHEMA_KEYS if word in known.rpartition(".")[2].split("_")]
    if elsewhere:
        return f"{key}: unknown key; did you mean {' or '.join(elsewhere[:3])}?"
    children = [name for name in below if "." not in name]
    return f"{key}: unknown key; the keys {'of ' + section if section else 'at the top level'}: {', '.join(children)}"


def allowed_values(key):
    """What the schema lets `key` hold, as the end of an error line ('must be an integer')."""
    annotation = SCHEMA_KEYS[key]
    if _section_type(annotation) is not None:
        children = [known for known in SCHEMA_KEYS if known.rpartition(".")[0] == key]
        return f"is a section; set its keys instead: {', '.join(children)}"
    return f"must be {_describe_type(annotation)}"


# How an error line names a value of each type, and several of them in a list.
_TYPE_NAMES = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans"),
               str: ("a string", "strings")}


def _describe_type(annotation):
    arguments = [argument for argument in typing.get_args(annotation) if argument is not type(None)]
    if typing.get_origin(annotation) is typing.Union:
        return f"{_describe_type(arguments[0])} or null"
    if typing.get_origin(annotation) is list:
        return f"a list of {_TYPE_NAMES[arguments[0]][1]}, written [x,y,...]"
    return _TYPE_NAMES[annotation][0]


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
    global _job_started
    _job_started = False
    if os.environ.get(FULL_ERROR_VARIABLE) == "1":
        yield
        return
    os.environ[FULL_ERROR_VARIABLE] = "1"
    try:
        yield
    except ConfigError:
        raise
    except Exception as error:
        ours = _config_error_under(error)  # one of our resolvers' refusals, which Hydra wraps
        if ours is not None:
            raise ours from None
        if isinstance(error, (HydraException, OmegaConfBaseException)) or not _job_started:
            raise invalid(problem(error)) from None
        raise
    finally:
        os.environ.pop(FULL_ERROR_VARIABLE, None)


def _config_error_under(error):
    while error is not None and not isinstance(error, ConfigError):
        error = error.__cause__ or error.__context__
    return error


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
        if group == "cluster":  # layouts without a file of their own are made when asked for (LAYOUT)
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
