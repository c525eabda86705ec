"""Adasum's pairwise tree computed directly, in float64: what the engine's Adasum must give."""

import math

import numpy as np


def _pair(a, b):
    dot, a_norm, b_norm = a @ b, a @ a, b @ b
    negligible = math.sqrt(np.finfo(np.float64).tiny)
    a_coefficient = 1 - dot / a_norm / 2 if a_norm >= negligible else 1.0
    b_coefficient = 1 - dot / b_norm / 2 if b_norm >= negligible else 1.0
    return a_coefficient * a + b_coefficient * b


def adasum_reference(inputs):
    """The pairwise tree over the ranks' flat float64 inputs: neighbours first, the lower rank's
    vector on the left."""
    while len(inputs) > 1:
        inputs = [_pair(left, right) for left, right in zip(inputs[0::2], inputs[1::2])]
    return inputs[0]
