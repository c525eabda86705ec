"""The Handle every collective returns (hvdtrain/core/requests.py): every thread waiting on it
wakes with the result, or with the engine's error, whenever the engine finishes it."""

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


class _FinishedAsTheWaiterAppears(Handle):
    """A handle that the engine finishes the moment a waiting thread publishes its lock: the
    narrowest interleaving of wait() and _finish()."""

    @property
    def _waiter(self):
        return self.__dict__.get("waiter")

    @_waiter.setter
    def _waiter(self, lock):
        self.__dict__["waiter"] = lock
        if lock is not None:
            self._finish("result")


def test_a_handle_finished_as_its_waiter_blocks_returns_the_result():
    handle = _FinishedAsTheWaiterAppears("raced")
    assert handle.wait() == "result"
