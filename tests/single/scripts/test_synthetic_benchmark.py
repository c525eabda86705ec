"""scripts/synthetic_benchmark.py times what it claims, in this process: it waits for the
device's queued work before reading a clock, and --profile counts overlapping device work once."""

import queue
import threading
import time

import pytest

from support.scripts import load_script


def test_the_synthetic_benchmark_times_the_work_a_step_queued():
    """A step that returns once its work is queued, as a step on a GPU does: its time must count."""
    synthetic = load_script("synthetic_benchmark")
    work = queue.Queue()  # seconds of work, done in order, as a CUDA stream does it

    def device():
        while (seconds := work.get()) is not None:
            time.sleep(seconds)
            work.task_done()

    threading.Thread(target=device, daemon=True).start()
    job = synthetic.Job(rank=0, size=1, device="GPU", step=lambda: work.put(0.1), synchronize=work.join)
    work.put(1.0)  # queued before the timing starts: not the steps' time
    seconds = synthetic.timed_steps(job, 3)
    work.put(None)
    assert 0.3 <= seconds < 0.9, seconds


def test_the_profile_counts_overlapping_device_work_once_over_the_whole_trace():
    """--profile's summary: device work covers [10, 40) and [50, 60) of a trace spanning
    [0, 100) (host events included), so the device was busy 40 % of the time."""
    synthetic = load_script("synthetic_benchmark")

    def event(category, start, end):
        return {"ph": "X", "cat": category, "ts": start, "dur": end - start}

    events = [event("cpu_op", 0, 100), event("kernel", 10, 30), event("kernel", 20, 40), event("gpu_memcpy", 25, 35),
              event("gpu_memset", 50, 60), {"ph": "i", "cat": "kernel", "ts": 70}, event("cuda_runtime", 90, 95)]
    assert synthetic.device_busy_fraction(events) == 0.4
    assert synthetic.device_busy_fraction([event("cpu_op", 0, 100)]) is None


def test_the_synthetic_benchmark_refuses_two_autocast_dtypes(monkeypatch, capsys):
    synthetic = load_script("synthetic_benchmark")
    monkeypatch.setattr("sys.argv", ["synthetic_benchmark.py", "--amp", "--bf16"])
    with pytest.raises(SystemExit) as refused:
        synthetic.parse_args()
    assert refused.value.code == 2
    assert "--amp (fp16) and --bf16 are two autocast dtypes: give one" in capsys.readouterr().err
