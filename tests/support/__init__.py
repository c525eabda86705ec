"""What the tests share: running functions on real ranks (ranks.py), running the commands as a
user runs them (commands.py), composing configs as `hvdtrain` does (configs.py), the
stand-in GPUs of the device backends' tests (devices.py), Adasum's reference (adasum.py)."""
