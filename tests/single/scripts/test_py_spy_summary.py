"""scripts/py_spy_summary.py: py-spy's raw samples summed by thread, line and function."""

import pytest

from support.scripts import load_script

# py-spy's raw format: "thread (TID): NAME;frame;...;frame COUNT", outermost frame first; a thread
# Python has not named yet appears by its id alone.
SAMPLES = """\
thread (11);<module> (job.py:3);setup (job.py:10) 5
thread (11): MainThread;<module> (job.py:4);loop (job.py:20);Handle.wait (hvdtrain/core/requests.py:138) 30
thread (11): MainThread;<module> (job.py:4);loop (job.py:21) 5
thread (12): hvdtrain-engine;Engine._run (hvdtrain/core/engine.py:280);Event.wait (threading.py:629) 8
thread (12): hvdtrain-engine;Engine._run (hvdtrain/core/engine.py:273);Engine._cycle (hvdtrain/core/engine.py:334) 2
"""


@pytest.fixture
def summary():
    return load_script("py_spy_summary")


def test_a_thread_is_named_as_python_names_it_later_and_its_samples_are_summed(summary):
    threads = summary.parse(SAMPLES.splitlines())
    assert {name: sum(stacks.values()) for name, stacks in threads.items()} == {"MainThread": 40,
                                                                               "hvdtrain-engine": 10}


def test_within_keeps_a_threads_samples_in_that_function_and_other_threads_whole(summary):
    threads = summary.parse(SAMPLES.splitlines(), within="loop")
    assert {name: sum(stacks.values()) for name, stacks in threads.items()} == {"MainThread": 35,
                                                                               "hvdtrain-engine": 10}


def test_the_summary_gives_each_threads_share_its_lines_and_its_functions(summary):
    text = summary.summary(summary.parse(SAMPLES.splitlines(), within="loop"), top=3)
    assert text.splitlines()[:4] == [
        "45 samples", "", "## MainThread: 35 samples, 77.8 % of all", "  self (the line it was on):"]
    assert "     85.7 %  Handle.wait (hvdtrain/core/requests.py:138)" in text
    assert "     14.3 %  loop (job.py:21)" in text
    assert "    100.0 %  loop (job.py)" in text  # lines 20 and 21 of one function
    assert "     20.0 %  Engine._cycle (hvdtrain/core/engine.py)" in text


def test_a_profile_without_samples_is_refused_naming_the_file(summary, tmp_path, monkeypatch):
    profile = tmp_path / "empty.txt"
    profile.write_text("")
    monkeypatch.setattr("sys.argv", ["py_spy_summary.py", str(profile)])
    with pytest.raises(SystemExit, match=f"^{profile}: no samples$"):
        summary.main()
