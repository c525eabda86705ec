"""Horovod's `horovod.ray.ray_logger`: `log(info)` in a function that a RayExecutor runs sends
`info` to the driver, where each of the call's `callbacks` is called with it."""

import warnings

from hvdtrain.launch.relay import send_to_caller

_warned = False


def log(info_dict):
    """Send `info_dict` (anything that pickles) to the callbacks of the call running this
    function; outside such a call, warn once and send nothing, as Horovod does."""
    global _warned
    if not send_to_caller(info_dict) and not _warned:
        warnings.warn("hvdtrain.ray.ray_logger.log called outside a function run by a RayExecutor: nothing is sent",
                      stacklevel=2)
        _warned = True
