"""`hvdtrun`: Horovod 0.28's horovodrun for hvdtrain (command.py), with its elastic driver
(elastic.py), what each rank runs first to report that it has started (rank_start.py), and
hvdtrun's side of those reports (rank_watch.py)."""
