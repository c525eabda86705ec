"""The Handle every collective returns (hvdtrain/core/requests.py): every thread waiting on it
wakes with the result, or with the engine's error."""

import threading
import time

import pytest

from hvdtrain.core.requests import Handle


def test_a_handle_wakes_every_thread_waiting_on_it_and_gives_them_the_error():
    handle, failed = Handle("late"), Handle("failed")
    results = []
    waiting = [threading.Thread(target=lambda: results.append(handle.wait()), daemon=True) for _ in range(3)]
    for thread in waiting:
        thread.start()
    time.sleep(0.2)  # let the threads block before the result arrives
    assert not handle.poll() and results == []
    handle._finish("result")
    for thread in waiting:
        thread.join(timeout=5)
    assert results == ["result"] * 3
    assert handle.poll() and handle.wait() == "result"
    failed._finish(error=ValueError("from the engine"))
    with pytest.raises(ValueError, match="from the engine"):
        failed.synchronize()
