"""SyncBatchNormalization: batch normalization over the global batch, as in Horovod."""

import inspect

import tensorflow as tf

from hvdtrain import core

from .collectives import Average, allreduce

# tf-keras (Keras 2) would otherwise use its fused kernel, which computes the moments itself.
_HAS_FUSED_KERNEL = "fused" in inspect.signature(tf.keras.layers.BatchNormalization.__init__).parameters


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """Batch normalization whose training statistics are the mean and variance over all
    ranks' batches, each rank's batch weighing the same (Horovod's rule). Works with Keras 3
    and with tf-keras, whichever tf.keras is."""

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        if _HAS_FUSED_KERNEL:
            kwargs["fused"] = False
        super().__init__(**kwargs)

    def _moments(self, inputs, *args, **kwargs):
        mean, variance = super()._moments(inputs, *args, **kwargs)
        if core.size() == 1:
            return mean, variance
        # Var[X] = E[X^2] - E[X]^2, with both expectations averaged over ranks.
        mean_of_square = variance + tf.square(mean)
        group_mean, group_mean_of_square = tf.unstack(allreduce(tf.stack([mean, mean_of_square]), op=Average))
        return group_mean, group_mean_of_square - tf.square(group_mean)
