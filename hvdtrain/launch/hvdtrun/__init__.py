"""`hvdtrun`: Horovod 0.28's horovodrun for hvdtrain (command.py), with its elastic driver
(elastic.py) and what each rank runs first to report that it has started (rank_start.py)."""
