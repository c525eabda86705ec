"""horovodrun's --output-filename for hvdtrun (hvdtrain/launch/hvdtrun/output_files.py): mpirun's
tagged output sorted into each rank's files, and on to the console without the tags. A real job:
tests/parallel/launch/hvdtrun/test_command.py."""

import io

from hvdtrain.launch.hvdtrun.output_files import RankOutput


def written(tmp_path, world_size, *texts):
    console = io.StringIO()
    output = RankOutput(tmp_path, world_size, console)
    for text in texts:
        output.write(text)
    output.close()
    files = {str(path.relative_to(tmp_path)): path.read_text() for path in tmp_path.rglob("*") if path.is_file()}
    return console.getvalue(), files


def test_each_ranks_lines_go_to_its_file_and_to_the_console_without_the_tags(tmp_path):
    console, files = written(tmp_path, 2, "[1,1]<stdout>: b\n", "[1,0]<stdout>: a\n", "[1,0]<stderr>: oops\n")
    assert console == "b\na\noops\n"
    assert files == {"rank.0/stdout": "a\n", "rank.0/stderr": "oops\n", "rank.1/stdout": "b\n"}


def test_mpiruns_own_text_goes_to_the_console_only(tmp_path):
    console, files = written(tmp_path, 1, "mpirun says\n", "[1,0]<stdout>: x\n")
    assert console == "mpirun says\nx\n"
    assert files == {"rank.0/stdout": "x\n"}


def test_ranks_partial_lines_that_mpirun_joins_into_one_are_told_apart(tmp_path):
    _, files = written(tmp_path, 2, "[1,0]<stdout>: half[1,1]<stdout>: other half\n")
    assert files == {"rank.0/stdout": "half", "rank.1/stdout": "other half\n"}


def test_time_stamps_stay_with_their_lines(tmp_path):
    console, files = written(tmp_path, 1, "[Sat Nov 28 08:21:53 2026][1,0]<stdout>: x\n")
    assert console == "[Sat Nov 28 08:21:53 2026] x\n"
    assert files == {"rank.0/stdout": "[Sat Nov 28 08:21:53 2026] x\n"}


def test_the_rank_is_zero_padded_to_the_width_of_the_largest_as_horovodrun_writes_it(tmp_path):
    _, files = written(tmp_path, 12, "[1,3]<stdout>: x\n", "[1,11]<stddiag>: y\n")
    assert files == {"rank.03/stdout": "x\n", "rank.11/stderr": "y\n"}
