"""What every rank runs: its entry point (worker.py), the training loop both frameworks share
(loop.py) with each framework's part (train_torch.py, train_tensorflow.py), checkpoints
(checkpoint.py), what keeps a run alive through failures and preemptions (fault_tolerance.py),
each rank's share of the data (sharding.py) and LARS (lars.py)."""
