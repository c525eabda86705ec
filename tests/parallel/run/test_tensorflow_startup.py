"""TensorFlow's C++ start-up lines (no CUDA driver, cuInit failed, CPU instructions) are not shown by
the training workers (hvdtrain/run/tensorflow_startup.py), in a process of their own, unless the
user asks for TensorFlow's own logging."""

import os
import subprocess
import sys

NOISE = ("absl::InitializeLog", "cudart_stub", "cuInit", "cpu_feature_guard")
SCRIPT = ("from hvdtrain.run.tensorflow_startup import import_tensorflow\n"
          "tf = import_tensorflow()\n"
          "print(int(tf.reduce_sum(tf.ones(3))))\n")


def start(**variables):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", SCRIPT], env={**env, **variables}, capture_output=True,
                          text=True, timeout=300)


def test_start_up_lines_are_left_out():
    quiet = start()
    assert quiet.returncode == 0 and quiet.stdout == "3\n", quiet.stderr
    assert not [line for line in quiet.stderr.splitlines() if any(word in line for word in NOISE)], quiet.stderr


def test_start_up_lines_are_shown_where_the_user_asks_for_tensorflows_logging():
    asked = start(TF_CPP_MIN_LOG_LEVEL="0")
    assert asked.returncode == 0 and asked.stdout == "3\n"
    # On a CPU host TensorFlow logs that it found no CUDA driver; the user who asked sees it.
    assert any(word in asked.stderr for word in NOISE), asked.stderr
