"""The timeline: a Chrome trace written by rank 0, from HOROVOD_TIMELINE or started and stopped
at run time, with each tensor's phases as well-formed, properly nested events in rows named as
Horovod names them (`allreduce.NAME`), readable while the job still runs."""

import json
from pathlib import Path

import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import Settings

# One and a half chunks of float32: reduced where it lies in two pieces, no fusion buffer.
LARGE_ELEMENTS = Settings.chunk_bytes * 3 // 2 // 4
ALLREDUCE_PACKED = {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE",
                    "MEMCPY_OUT_FUSION_BUFFER"}


def ranks_timeline(directory):
    core.init()
    me = core.rank()
    handles = core.grouped_allreduce_async([np.ones(10, np.float32) for _ in range(3)], name="tl.small")
    handles.append(core.allreduce_async(np.ones(LARGE_ELEMENTS, np.float32), name="tl.large"))
    for handle in handles:
        handle.wait()
    core.broadcast_async(np.ones(3), 0, name="tl.bcast").wait()
    core.allgather_async(np.ones((me + 1, 2)), name="tl.gather").wait()
    core.allreduce_async(np.ones(3)).wait()
    if me == 0:
        # The job runs on, and what has finished is in the file already: a crash or a hang
        # from here on would leave it readable.
        by_tensor, _ = phases_by_tensor(Path(directory) / "from_environment.json")
        assert set(by_tensor) == {"allreduce.tl.small_0", "allreduce.tl.small_1", "allreduce.tl.small_2",
                                  "allreduce.tl.large", "broadcast.tl.bcast", "allgather.tl.gather",
                                  "allreduce.noname.1"}, sorted(by_tensor)
        assert {e["name"] for e in by_tensor["allreduce.noname.1"]} >= {"ALLREDUCE", "NEGOTIATE_ALLREDUCE"}
    core.barrier()
    core.stop_timeline()
    core.allreduce_async(np.ones(3), name="tl.after_stop").wait()
    if me == 0:
        with pytest.raises(ValueError, match=f"cannot write the timeline to '{directory}/missing/t.json': No such file"):
            core.start_timeline(f"{directory}/missing/t.json")
    core.start_timeline(f"{directory}/runtime.{me}.json")
    core.allreduce_async(np.ones(3), name="tl.restarted").wait()
    core.stop_timeline()
    core.allreduce_async(np.ones(3), name="tl.stopped_again").wait()


def phases_by_tensor(path):
    """{row name: [complete events]} of a trace, checking that every event is well-formed. A
    trace still being written lacks its closing bracket, as Chrome's trace format allows."""
    text = path.read_text().rstrip()
    events = json.loads(text if text.endswith("]") else text + "]")
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    by_tensor = {}
    for event in events:
        assert {"name", "ph", "pid"} <= event.keys(), event
        if event["ph"] == "X":
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0 and event["dur"] >= 0, event
            by_tensor.setdefault(names[event["pid"]], []).append(event)
        else:
            assert event["ph"] in ("M", "i"), event
    return by_tensor, events


def assert_nested(tensor, events, operation):
    """Negotiation ends where the operation starts; every other phase lies inside the operation."""
    (outer,) = [e for e in events if e["name"] == operation]
    (negotiation,) = [e for e in events if e["name"] == f"NEGOTIATE_{operation}"]
    slack = 0.01  # microseconds lost to rounding in the file
    assert negotiation["ts"] + negotiation["dur"] <= outer["ts"] + slack, (tensor, negotiation, outer)
    for inner in events:
        if inner is not outer and inner is not negotiation:
            assert outer["ts"] - slack <= inner["ts"], (tensor, inner, outer)
            assert inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + slack, (tensor, inner, outer)


def test_timeline(mpirun, tmp_path):
    from_environment = tmp_path / "from_environment.json"
    mpirun(2, ranks_timeline, tmp_path, env={"HOROVOD_TIMELINE": str(from_environment),
                                             "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    by_tensor, events = phases_by_tensor(from_environment)
    assert sorted(by_tensor) == ["allgather.tl.gather", "allreduce.noname.1", "allreduce.tl.large",
                                 "allreduce.tl.small_0", "allreduce.tl.small_1", "allreduce.tl.small_2",
                                 "barrier.noname.1", "broadcast.tl.bcast"]
    for name in ("allreduce.tl.small_0", "allreduce.tl.small_1", "allreduce.tl.small_2"):
        assert {e["name"] for e in by_tensor[name]} == ALLREDUCE_PACKED, by_tensor[name]
        assert_nested(name, by_tensor[name], "ALLREDUCE")
    large_phases = [e["name"] for e in by_tensor["allreduce.tl.large"]]
    assert sorted(large_phases) == ["ALLREDUCE", "MPI_ALLREDUCE", "MPI_ALLREDUCE", "NEGOTIATE_ALLREDUCE", "QUEUE"]
    assert_nested("allreduce.tl.large", by_tensor["allreduce.tl.large"], "ALLREDUCE")
    for name, operation in (("broadcast.tl.bcast", "BROADCAST"), ("allgather.tl.gather", "ALLGATHER")):
        assert {e["name"] for e in by_tensor[name]} == {f"NEGOTIATE_{operation}", operation, "QUEUE",
                                                        f"MPI_{operation}"}, by_tensor[name]
        assert_nested(name, by_tensor[name], operation)
    assert sum(e["name"] == "CYCLE_START" and e["ph"] == "i" for e in events) >= 5

    by_tensor, events = phases_by_tensor(tmp_path / "runtime.0.json")
    assert list(by_tensor) == ["allreduce.tl.restarted"] and not [e for e in events if e["name"] == "CYCLE_START"]
    assert not (tmp_path / "runtime.1.json").exists(), "only rank 0 writes the timeline"


def test_a_timeline_in_a_missing_folder_is_refused_naming_the_variable(tmp_path, monkeypatch):
    missing = tmp_path / "no such folder" / "timeline.json"
    monkeypatch.setenv("HOROVOD_TIMELINE", str(missing))
    with pytest.raises(ValueError, match=f"HOROVOD_TIMELINE='{missing}': folder {missing.parent} does not exist"):
        core.init()  # refused before MPI is touched
    assert not core.is_initialized()
