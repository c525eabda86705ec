"""The timeline on real ranks (hvdtrain/core/timeline.py): a Chrome trace written by rank 0, from
HOROVOD_TIMELINE or started and stopped at run time, with each tensor's phases as well-formed,
properly nested events in rows named as Horovod names them (`allreduce.NAME`), readable while the
job still runs. Each check starts its own engine, which starts the HOROVOD_TIMELINE trace anew."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hvdtrain import core
from hvdtrain.core import Settings

# One and a half chunks of float32: reduced where it lies in two pieces, no fusion buffer.
LARGE_ELEMENTS = Settings.chunk_bytes * 3 // 2 // 4
ALLREDUCE_PACKED = {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE",
                    "MEMCPY_OUT_FUSION_BUFFER"}
FROM_ENVIRONMENT = "from_environment.json"


def phases_by_tensor(path):
    """{row name: [complete events]} of a trace, checking that every event is well-formed. A
    trace still being written lacks its closing bracket, as Chrome's trace format allows."""
    text = Path(path).read_text().rstrip()
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


def run_collectives():
    """Packed allreduces, one in pieces, a broadcast, an allgather of uneven rows, an unnamed allreduce."""
    handles = core.grouped_allreduce_async([np.ones(10, np.float32) for _ in range(3)], name="tl.small")
    handles.append(core.allreduce_async(np.ones(LARGE_ELEMENTS, np.float32), name="tl.large"))
    for handle in handles:
        handle.wait()
    core.broadcast_async(np.ones(3), 0, name="tl.bcast").wait()
    core.allgather_async(np.ones((core.rank() + 1, 2)), name="tl.gather").wait()
    core.allreduce_async(np.ones(3)).wait()


def a_trace_holds_what_has_finished_while_the_job_still_runs(folder):
    """A crash or a hang from there on would leave it readable."""
    core.init()
    run_collectives()
    if core.rank() == 0:
        by_tensor, _ = phases_by_tensor(Path(folder) / FROM_ENVIRONMENT)
        assert set(by_tensor) == {"allreduce.tl.small_0", "allreduce.tl.small_1", "allreduce.tl.small_2",
                                  "allreduce.tl.large", "broadcast.tl.bcast", "allgather.tl.gather",
                                  "allreduce.noname.1"}, sorted(by_tensor)
        assert {e["name"] for e in by_tensor["allreduce.noname.1"]} >= {"ALLREDUCE", "NEGOTIATE_ALLREDUCE"}
    core.barrier()
    core.shutdown()


def each_tensors_phases_are_nested_events_in_a_row_named_as_horovods(folder):
    """HOROVOD_TIMELINE_MARK_CYCLES=1 marks the cycles too."""
    core.init()
    me = core.rank()
    run_collectives()
    core.barrier()
    core.stop_timeline()
    core.allreduce_async(np.ones(3), name="tl.after_stop").wait()
    core.shutdown()
    if me != 0:
        return
    by_tensor, events = phases_by_tensor(Path(folder) / FROM_ENVIRONMENT)
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


def start_timeline_refuses_a_folder_that_does_not_exist(folder):
    core.init()
    if core.rank() == 0:
        with pytest.raises(ValueError, match=f"cannot write the timeline to '{folder}/missing/t.json': No such file"):
            core.start_timeline(f"{folder}/missing/t.json")
    core.shutdown()


def a_timeline_started_at_run_time_records_until_stopped_on_rank_0_only(folder):
    core.init()
    me = core.rank()
    core.start_timeline(f"{folder}/runtime.{me}.json")
    core.allreduce_async(np.ones(3), name="tl.restarted").wait()
    core.stop_timeline()
    core.allreduce_async(np.ones(3), name="tl.stopped_again").wait()
    core.barrier()
    core.shutdown()
    if me == 0:
        by_tensor, events = phases_by_tensor(Path(folder) / "runtime.0.json")
        assert list(by_tensor) == ["allreduce.tl.restarted"] and not [e for e in events if e["name"] == "CYCLE_START"]
        assert not os.path.exists(f"{folder}/runtime.1.json"), "only rank 0 writes the timeline"


CHECKS = [a_trace_holds_what_has_finished_while_the_job_still_runs,
          each_tensors_phases_are_nested_events_in_a_row_named_as_horovods,
          start_timeline_refuses_a_folder_that_does_not_exist,
          a_timeline_started_at_run_time_records_until_stopped_on_rank_0_only]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Where this module's job writes its traces."""
    return str(tmp_path_factory.mktemp("timeline"))


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_timeline_on_two_ranks(ranks, folder, check):
    env = {"HOROVOD_TIMELINE": f"{folder}/{FROM_ENVIRONMENT}", "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
    ranks.run(2, CHECKS, folder, env=env).assert_passed(check)
