"""Import TensorFlow without its start-up noise on a CPU host.

TensorFlow's C++ side logs through absl before its own logging is set up, so TF_CPP_MIN_LOG_LEVEL
does not silence it: every rank prints that no CUDA driver was found, that cuInit failed and which
CPU instructions the binary could use, several lines per rank before training starts. Those lines
are written to file descriptor 2 directly, so they are caught there while TensorFlow is imported
and finds its devices, and everything else that was written meanwhile is passed on. A user who sets
TF_CPP_MIN_LOG_LEVEL asked for TensorFlow's own choice, and gets everything.
"""

import os
import re
import sys
import tempfile

NOISE = re.compile(r"absl::InitializeLog|cudart_stub\.cc|cuda_platform\.cc|cuda_executor\.cc|cpu_feature_guard\.cc"
                   r"|^To enable the following instructions|computation placer already registered"
                   r"|Unable to register cu(DNN|FFT|BLAS) factory")


def import_tensorflow():
    """TensorFlow, imported with its devices discovered, its start-up noise left out."""
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ or "tensorflow" in sys.modules:
        import tensorflow

        return tensorflow
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import tensorflow

            tensorflow.config.list_physical_devices()  # cuInit happens here, and logs on a CPU host
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(keepends=True)
                    if not NOISE.search(line)]
    sys.stderr.write("".join(kept))
    return tensorflow
