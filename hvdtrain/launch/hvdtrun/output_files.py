"""horovodrun's `--output-filename DIR` for hvdtrun: every rank's stdout and stderr are also
written to DIR/rank.N/stdout and DIR/rank.N/stderr (N zero-padded to the width of the largest
rank, the layout horovodrun gives them), while the output goes on to hvdtrun's own streams as it
does without the flag. Open MPI 5's own `--output dir=` lost some ranks' files here (with
PMIX_ERR_EXISTS errors), so mpirun tags each line with its rank (`--output tag`) and hvdtrun
sorts the lines, taking the tags off.
"""

import os
import re

# mpirun's tag, after its time stamp where -prefix-timestamp asked for one: [JOB,RANK]<STREAM>:
TAG = re.compile(r"(\[[A-Z][a-z]{2} [^\]]*\])?\[\d+,(\d+)\]<(stdout|stderr|stddiag)>: ")


class RankOutput:
    """One of mpirun's tagged streams: what it writes goes on to `console` without the tags, and
    each rank's part also into that rank's file. Text before the first tag (mpirun's own) goes
    to the console only."""

    def __init__(self, directory, world_size, console):
        self.directory, self.console = directory, console
        self.width = len(str(max(world_size - 1, 0)))
        self.files = {}

    def _file(self, rank, stream):
        key = (rank, "stderr" if stream == "stddiag" else stream)
        if key not in self.files:
            folder = os.path.join(self.directory, f"rank.{str(rank).zfill(self.width)}")
            os.makedirs(folder, exist_ok=True)
            self.files[key] = open(os.path.join(folder, key[1]), "a")
        return self.files[key]

    def write(self, text):
        pieces = TAG.split(text)  # text before, then (stamp, rank, stream, text) for each tag
        self.console.write(pieces[0])
        for stamp, rank, stream, segment in zip(*[iter(pieces[1:])] * 4):
            line = f"{stamp} {segment}" if stamp else segment
            self.console.write(line)
            self._file(int(rank), stream).write(line)

    def flush(self):
        self.console.flush()
        for file in self.files.values():
            file.flush()

    def close(self):
        for file in self.files.values():
            file.close()
