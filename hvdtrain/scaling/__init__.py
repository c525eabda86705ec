"""The scaling model: how long a data-parallel step takes on a cluster (step_time.py), which a
dry run predicts from (prediction.py) with one device's measured step (profile.py). It plans
the gradients' submissions and fusion with the engine's and the optimizer's own planners
(hvdtrain/core/fusion.py), so that it predicts the code that runs."""
