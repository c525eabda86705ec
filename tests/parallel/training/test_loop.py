"""The training loop's resume (hvdtrain/training/loop.py, checkpoint.py) on real ranks: a run
killed as a whole after two checkpoints, its newest checkpoint cut short, goes on from the one
before and ends exactly as the uninterrupted default run: the same weights and momentum buffers
bit for bit, the same history, the same metrics, throughput figures that count each step once."""

from support.commands import assert_the_figures_divide, history, results_of

from parallel.runs import RUN_STEPS, assert_same_weights


def test_a_killed_run_resumes_to_the_same_weights(crashed_and_resumed, default_run):
    run_dir, _ = crashed_and_resumed
    assert_same_weights(run_dir, default_run[0], RUN_STEPS)


def test_a_killed_run_resumes_to_the_same_history(crashed_and_resumed, default_run):
    run_dir, _ = crashed_and_resumed
    assert history(run_dir) == history(default_run[0])


def test_a_killed_run_resumes_to_the_same_metrics(crashed_and_resumed, default_run):
    run_dir, _ = crashed_and_resumed
    assert results_of(run_dir)["metrics"] == results_of(default_run[0])["metrics"]


def test_a_resumed_runs_figures_count_each_step_once(crashed_and_resumed):
    run_dir, _ = crashed_and_resumed
    assert_the_figures_divide(results_of(run_dir), samples_trained=RUN_STEPS * 64)
