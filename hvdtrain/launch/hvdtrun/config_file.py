"""horovodrun's `--config-file FILE` for hvdtrun: a YAML file of the tuning flags, in horovodrun's
sections (Horovod 0.28's config_parser), e.g.

    controller: mpi
    params: {fusion_threshold_mb: 32, cycle_time_ms: 5, cache_capacity: 2048}
    timeline: {filename: timeline.json, mark_cycles: true}
    stall_check: {enabled: true, warning_time_seconds: 120, shutdown_time_seconds: 240}
    logging: {level: INFO, hide_timestamp: true}

Each key becomes the flag it stands for, put before the command line's, so that a flag given
there wins, as with horovodrun, and a key that asks for what hvdtrun does not do (a hierarchical
allreduce, autotuning, Gloo, ...) is refused with that flag's reason. A key horovodrun does not
read is refused naming it, rather than ignored.
"""

import yaml

# (section, key) -> the flags for a value: a flag that takes it, or, for a switch, those for
# true and false.
VALUED = {
    ("params", "fusion_threshold_mb"): "--fusion-threshold-mb",
    ("params", "cycle_time_ms"): "--cycle-time-ms",
    ("params", "cache_capacity"): "--cache-capacity",
    ("timeline", "filename"): "--timeline-filename",
    ("stall_check", "warning_time_seconds"): "--stall-check-warning-time-seconds",
    ("stall_check", "shutdown_time_seconds"): "--stall-check-shutdown-time-seconds",
    ("library_options", "num_nccl_streams"): "--num-nccl-streams",
    ("library_options", "thread_affinity"): "--thread-affinity",
    ("library_options", "gloo_timeout_seconds"): "--gloo-timeout-seconds",
    ("logging", "level"): "--log-level",
}
SWITCHES = {
    ("params", "hierarchical_allreduce"): ("--hierarchical-allreduce", "--no-hierarchical-allreduce"),
    ("params", "hierarchical_allgather"): ("--hierarchical-allgather", "--no-hierarchical-allgather"),
    ("params", "torus_allreduce"): ("--torus-allreduce", "--no-torus-allreduce"),
    ("autotune", "enabled"): ("--autotune", "--no-autotune"),
    ("timeline", "mark_cycles"): ("--timeline-mark-cycles", "--no-timeline-mark-cycles"),
    ("stall_check", "enabled"): ("--stall-check", "--no-stall-check"),
    ("library_options", "mpi_threads_disable"): ("--mpi-threads-disable", "--no-mpi-threads-disable"),
    ("logging", "with_timestamp"): ("--log-with-timestamp", "--log-without-timestamp"),
    ("logging", "hide_timestamp"): ("--log-hide-timestamp", "--no-log-hide-timestamp"),
}
# Read by horovodrun only where autotuning is enabled, which hvdtrun refuses.
AUTOTUNE_SETTINGS = ("log_file", "warmup_samples", "steps_per_sample", "bayes_opt_max_samples",
                     "gaussian_process_noise")
CONTROLLERS = {"mpi": "--mpi", "gloo": "--gloo"}


def flags(path):
    """The hvdtrun flags the config file at `path` stands for; ValueError naming the file and the
    key at fault."""
    try:
        with open(path) as file:
            config = yaml.safe_load(file)
    except OSError as error:
        raise ValueError(f"--config-file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"--config-file {path}: not YAML ({str(error).splitlines()[0]})") from None
    if config is None:
        return []
    if not isinstance(config, dict):
        raise ValueError(f"--config-file {path}: a mapping of horovodrun's sections is expected")
    taken = []
    for section, settings in config.items():
        if section == "controller":
            if str(settings).lower() not in CONTROLLERS:
                raise ValueError(f"--config-file {path}: controller: {settings!r} is neither mpi nor gloo")
            taken.append(CONTROLLERS[str(settings).lower()])
            continue
        known = {key for known_section, key in (*VALUED, *SWITCHES) if known_section == section}
        if section == "autotune":
            known.update(AUTOTUNE_SETTINGS)
        if not known:
            raise ValueError(f"--config-file {path}: {section}: not one of horovodrun's sections (controller, "
                             f"params, autotune, timeline, stall_check, library_options, logging)")
        if not isinstance(settings, dict):
            raise ValueError(f"--config-file {path}: {section}: a mapping of its settings is expected")
        for key, value in settings.items():
            if (section, key) in VALUED:
                taken += [VALUED[section, key], str(value)]
            elif (section, key) in SWITCHES:
                if not isinstance(value, bool):
                    raise ValueError(f"--config-file {path}: {section}.{key}: {value!r} is not true or false")
                taken.append(SWITCHES[section, key][0 if value else 1])
            elif key not in AUTOTUNE_SETTINGS or section != "autotune":
                raise ValueError(f"--config-file {path}: {section}.{key}: not one of horovodrun's settings of "
                                 f"{section} ({', '.join(sorted(known))})")
    return taken
