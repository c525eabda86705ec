"""`hvdtrun`: Horovod 0.28's horovodrun for hvdtrain (command.py), with its elastic driver
(elastic.py), horovodrun's --config-file (config_file.py) and --output-filename
(output_files.py), what each rank runs first to report that it has started (rank_start.py) and
hvdtrun's side of those reports (rank_watch.py); `hvdtrun.run`, horovod.run, runs a Python
function on every rank (function_job.py)."""


def __getattr__(name):
    # Imported when first asked for: every rank imports this package to run rank_start.py, which
    # must add no more than an interpreter's start.
    if name == "run":
        from hvdtrain.launch.hvdtrun.function_job import run

        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
