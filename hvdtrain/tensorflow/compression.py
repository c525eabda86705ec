"""Gradient compression for the wire, as in horovod.tensorflow."""

import tensorflow as tf

from hvdtrain.core.horovod_api import NoneCompressor


class FP16Compressor:
    """Send floating-point tensors as float16, halving the bytes; restore the dtype after."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
