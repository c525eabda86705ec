"""Horovod Elastic scripts, written for this project in Horovod's style (only their import lines
name hvdtrain), under `hvdtrun --host-discovery-script ...` (hvdtrain/launch/hvdtrun/elastic.py):
a rank killed by a real SIGKILL, and a change of the discovered hosts, each end the job, which
hvdtrun starts again (an error of the script's own ends it for good); the script goes on from its last commit and ends with the weights of an
uninterrupted run (PyTorch's TorchState, Keras's KerasState with its callbacks), and an
ElasticSampler shares the rest of an epoch among the new ranks, so that each epoch trains every
sample once. The states without hvdtrun: tests/single/torch/test_elastic.py."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from support.commands import wait_until

TIMEOUT = 180
STEPS, GLOBAL_BATCH, COMMIT_EVERY = 60, 12, 5

SCRIPT = textwrap.dedent(f"""
    import os, signal, sys, time
    import torch
    import hvdtrain.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    inputs = torch.linspace(-1, 1, {STEPS * GLOBAL_BATCH} * 4).reshape(-1, 4)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    progress, kill_at = sys.argv[1], int(sys.argv[2])

    @hvd.elastic.run
    def train(state):
        while state.step < {STEPS}:
            share = {GLOBAL_BATCH} // hvd.size()
            rows = slice(state.step * {GLOBAL_BATCH} + hvd.rank() * share,
                         state.step * {GLOBAL_BATCH} + (hvd.rank() + 1) * share)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows]).backward()
            optimizer.step()
            state.step += 1
            if hvd.rank() == 0:
                with open(progress, "a") as log:
                    log.write(f"{{state.step}} {{hvd.size()}}\\n")
            if state.step == kill_at and hvd.rank() == 1 and not os.path.exists(progress + ".killed"):
                open(progress + ".killed", "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            if state.step % {COMMIT_EVERY} == 0:
                state.commit()
            time.sleep(0.05)

    state = hvd.elastic.TorchState(model, optimizer, step=0)
    state.register_reset_callbacks([lambda: print(f"reset: {{hvd.size()}} ranks at step {{state.step}}", flush=True)])
    train(state)
    if hvd.rank() == 0:
        torch.save(model.state_dict(), progress + ".weights")
""")


def uninterrupted_weights():
    """The same training in one process with the whole global batch each step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    inputs = torch.linspace(-1, 1, STEPS * GLOBAL_BATCH * 4).reshape(-1, 4)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    for step in range(STEPS):
        rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows]).backward()
        optimizer.step()
    return model.state_dict()


NEVER = -1  # no step or epoch is


def two_slot_hosts(where):
    """The hosts file that the discovery script reads, to start with: this machine, 2 slots."""
    hosts_file = where / "hosts"
    hosts_file.write_text("localhost:2\n")
    return hosts_file


def start_hvdtrun(tmp_path, hosts_file, kill_at=NEVER, script_text=SCRIPT):
    """hvdtrun running `script_text`, whose rank 1 kills itself once at step (the torch script) or
    epoch (the Keras one) `kill_at`: (the process, its log, the script's progress file)."""
    script = tmp_path / "elastic_train.py"
    script.write_text(script_text)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    discover.chmod(0o755)
    progress = tmp_path / "progress.txt"
    log = open(tmp_path / "hvdtrun.log", "w+")
    process = subprocess.Popen([sys.executable, "-m", "hvdtrain.launch.hvdtrun.command", "--min-np", "2", "--max-np", "3",
                                "--host-discovery-script", str(discover), "--reset-limit", "3",
                                sys.executable, str(script), str(progress), str(kill_at)],
                               stdout=log, stderr=subprocess.STDOUT, text=True)
    return process, log, progress


def finished(process, log):
    """(hvdtrun's exit status, its output), once it has ended."""
    try:
        process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"hvdtrun did not finish in {TIMEOUT} s")
    log.seek(0)
    return process.returncode, log.read()


def assert_weights_of_an_uninterrupted_run(progress):
    weights = torch.load(str(progress) + ".weights")
    for name, expected in uninterrupted_weights().items():
        torch.testing.assert_close(weights[name], expected, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def killed_at_step_12(tmp_path_factory):
    """(exit status, output, the progress file) of the script whose rank 1 is killed after step 12."""
    where = tmp_path_factory.mktemp("killed")
    process, log, progress = start_hvdtrun(where, two_slot_hosts(where), kill_at=12)
    return (*finished(process, log), progress)


def test_a_job_with_a_killed_rank_finishes(killed_at_step_12):
    status, output, _ = killed_at_step_12
    assert status == 0, output


def test_a_killed_rank_restarts_the_job_from_the_last_commit(killed_at_step_12):
    _, output, _ = killed_at_step_12
    assert "hvdtrun: the job failed (exit status 137); starting it again from its last commit (reset 1)" in output
    assert "reset: 2 ranks at step 10" in output  # the commit of step 10, the last before the kill


def test_the_steps_after_the_last_commit_are_trained_again(killed_at_step_12):
    _, _, progress = killed_at_step_12
    steps = [int(line.split()[0]) for line in progress.read_text().split("\n") if line]
    assert steps[steps.index(12) + 1] == 11  # steps 11 and 12 are trained again


def test_a_job_restarted_after_a_kill_ends_with_the_uninterrupted_weights(killed_at_step_12):
    _, _, progress = killed_at_step_12
    assert_weights_of_an_uninterrupted_run(progress)


def test_an_error_of_the_scripts_own_ends_the_job_without_a_restart(tmp_path):
    """Rank 1 raises at step 7: started again from its last commit (step 5), it would raise again,
    over and over, so the job ends with EXIT_RANK_ERROR (3), which hvdtrun does not restart."""
    raising = SCRIPT.replace("os.kill(os.getpid(), signal.SIGKILL)", 'raise ValueError("a bad batch")')
    status, output = finished(*start_hvdtrun(tmp_path, two_slot_hosts(tmp_path), kill_at=7, script_text=raising)[:2])
    assert status == 3, output
    assert "hvdtrain: rank 1 raised ValueError: a bad batch; a restart would meet it again" in output, output
    assert ("hvdtrun: the job failed (exit status 3): a rank raised an error that a restart would meet again, so it "
            "is not started again") in output, output
    assert "starting it again" not in output, output


@pytest.fixture(scope="module")
def hosts_grown(tmp_path_factory):
    """(exit status, output, the progress file) of the script whose discovered hosts grow from 2
    slots to 3 after 15 steps."""
    where = tmp_path_factory.mktemp("grown")
    hosts_file = two_slot_hosts(where)
    process, log, progress = start_hvdtrun(where, hosts_file)
    wait_until(lambda: progress.exists() and len(progress.read_text().split("\n")) > 15, TIMEOUT, "15 steps")
    hosts_file.write_text("localhost:3\n")
    return (*finished(process, log), progress)


def test_a_job_whose_hosts_changed_finishes(hosts_grown):
    status, output, _ = hosts_grown
    assert status == 0, output


def test_new_hosts_restart_the_job_on_them_at_the_next_commit(hosts_grown):
    _, output, _ = hosts_grown
    assert "hvdtrun: the hosts changed to localhost:3; the job starts again on them at its next commit" in output
    assert "hvdtrun: the hosts changed; starting it again from its last commit (reset 1)" in output


def test_the_job_goes_on_with_the_new_hosts_ranks(hosts_grown):
    _, _, progress = hosts_grown
    sizes = [line.split() for line in progress.read_text().split("\n") if line]
    assert sizes[0][1] == "2" and sizes[-1] == [str(STEPS), "3"]


def test_a_job_stopped_at_a_commit_trains_no_step_twice(hosts_grown):
    _, _, progress = hosts_grown
    sizes = [line.split() for line in progress.read_text().split("\n") if line]
    assert [int(step) for step, _ in sizes] == list(range(1, STEPS + 1))


def test_a_job_restarted_on_new_hosts_ends_with_the_uninterrupted_weights(hosts_grown):
    _, _, progress = hosts_grown
    assert_weights_of_an_uninterrupted_run(progress)


KERAS_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import tensorflow as tf
    import hvdtrain.keras as hvd

    hvd.init()
    tf.keras.utils.set_random_seed(0)
    inputs = np.linspace(-1, 1, 128 * 4, dtype="float32").reshape(-1, 4)
    targets = inputs @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
    share = len(inputs) // hvd.size()
    inputs, targets = (a[hvd.rank() * share:(hvd.rank() + 1) * share] for a in (inputs, targets))
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
    progress, kill_at = sys.argv[1], int(sys.argv[2])
    EPOCHS = 4

    class KillOnce(tf.keras.callbacks.Callback):
        def on_batch_end(self, batch, logs=None):
            if state.epoch == kill_at and batch == 3 and hvd.rank() == 1 and not os.path.exists(progress + ".killed"):
                open(progress + ".killed", "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state):
        model.fit(inputs, targets, batch_size=8, shuffle=False, epochs=EPOCHS - state.epoch, verbose=0,
                  # the epoch count updated before the epoch's commit, which keeps it
                  callbacks=[hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
                             hvd.elastic.CommitStateCallback(state, batches_per_commit=10 ** 6), KillOnce()])

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    state.register_reset_callbacks([lambda: print(f"reset: {hvd.size()} ranks at epoch {state.epoch}", flush=True)])
    train(state)
    if hvd.rank() == 0:
        np.save(progress + ".weights.npy", np.concatenate([w.ravel() for w in model.get_weights()]))
""")


@pytest.fixture(scope="module")
def keras_runs(tmp_path_factory):
    """{"uninterrupted": (output, final weights), "killed": (output, final weights)} of the Keras
    script run without a kill and with rank 1 killed in epoch 2."""
    where = tmp_path_factory.mktemp("keras")
    hosts_file = two_slot_hosts(where)
    runs = {}
    for name, kill_at in (("uninterrupted", NEVER), ("killed", 2)):
        directory = where / name
        directory.mkdir()
        process, log, progress = start_hvdtrun(directory, hosts_file, kill_at=kill_at, script_text=KERAS_SCRIPT)
        status, output = finished(process, log)
        assert status == 0, output
        runs[name] = (output, np.load(str(progress) + ".weights.npy"))
    return runs


def test_a_keras_script_is_started_again_after_a_killed_rank(keras_runs):
    output, _ = keras_runs["killed"]
    assert "hvdtrun: the job failed (exit status 137); starting it again from its last commit (reset 1)" in output


def test_a_keras_script_goes_on_from_its_last_epoch_commit(keras_runs):
    output, _ = keras_runs["killed"]
    assert "reset: 2 ranks at epoch 2" in output


def test_the_keras_scripts_uninterrupted_run_is_never_started_again(keras_runs):
    output, _ = keras_runs["uninterrupted"]
    assert "starting it again" not in output, output


def test_a_keras_script_restarted_ends_with_the_uninterrupted_weights(keras_runs):
    np.testing.assert_allclose(keras_runs["killed"][1], keras_runs["uninterrupted"][1], rtol=1e-6, atol=1e-7)


SAMPLES, SAMPLER_EPOCHS, SAMPLER_BATCH = 72, 3, 2

SAMPLER_SCRIPT = textwrap.dedent(f"""
    import sys, time
    import torch
    import hvdtrain.torch as hvd

    hvd.init()
    dataset = list(range({SAMPLES}))
    sampler = hvd.elastic.ElasticSampler(dataset, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size={SAMPLER_BATCH}, sampler=sampler)
    progress = sys.argv[1]

    @hvd.elastic.run
    def train(state):
        while state.epoch < {SAMPLER_EPOCHS}:
            for batch_idx, samples in enumerate(loader):
                with open(f"{{progress}}.trained-{{hvd.size()}}-{{hvd.rank()}}", "a") as trained:
                    trained.write(f"{{state.epoch}} {{' '.join(map(str, samples.tolist()))}}\\n")
                if hvd.rank() == 0:
                    with open(progress, "a") as log:
                        log.write(f"{{state.epoch}} {{hvd.size()}}\\n")
                state.train_sampler.record_batch(batch_idx, {SAMPLER_BATCH})
                state.commit()
                time.sleep(0.2)  # an epoch outlasts hvdtrun's discovery (once a second) and the next commit
            state.epoch += 1
            state.train_sampler.set_epoch(state.epoch)
            state.commit()

    train(hvd.elastic.TorchState(train_sampler=sampler, epoch=0))
""")


@pytest.fixture(scope="module")
def sampler_hosts_grown(tmp_path_factory):
    """(exit status, output, {epoch: [the samples trained in it, on every rank]}, {epoch: the
    world sizes that trained in it}) of the ElasticSampler script whose hosts grow from 2 slots to
    3 once it is in its second epoch."""
    where = tmp_path_factory.mktemp("sampler")
    hosts_file = two_slot_hosts(where)
    process, log, progress = start_hvdtrun(where, hosts_file, script_text=SAMPLER_SCRIPT)
    in_second_epoch = SAMPLES // (2 * SAMPLER_BATCH) + 4
    wait_until(lambda: progress.exists() and len(progress.read_text().split("\n")) > in_second_epoch, TIMEOUT,
               "the second epoch")
    hosts_file.write_text("localhost:3\n")
    status, output = finished(process, log)
    trained, sizes = {}, {}
    for path in where.glob("progress.txt.trained-*"):
        size = int(path.name.split("-")[1])
        for line in path.read_text().splitlines():
            epoch, *samples = map(int, line.split())
            trained.setdefault(epoch, []).extend(samples)
            sizes.setdefault(epoch, set()).add(size)
    return status, output, trained, sizes


def test_a_sampler_job_whose_hosts_grew_mid_epoch_finishes_on_them(sampler_hosts_grown):
    status, output, _, sizes = sampler_hosts_grown
    assert status == 0, output
    assert {2, 3} in sizes.values() and sizes[SAMPLER_EPOCHS - 1] == {3}, sizes


def test_each_epoch_trains_every_sample_once_across_a_change_of_hosts(sampler_hosts_grown):
    _, _, trained, _ = sampler_hosts_grown
    assert sorted(trained) == list(range(SAMPLER_EPOCHS))
    for epoch, samples in trained.items():
        assert set(samples) == set(range(SAMPLES)), epoch
        # the new ranks' shares are filled up with at most 2 samples given again where the rest of
        # the epoch does not divide by 3
        assert len(samples) - SAMPLES <= 2, (epoch, sorted(samples))
