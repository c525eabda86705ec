"""The hosts share no file system where the tests write: what one host wrote, the others do not see."""

import os
import socket
import sys


def ranks_look_for_a_file(path, first_host):
    seen = os.path.exists(path)
    here = socket.gethostname()
    assert seen == (here == first_host), f"{path} is {'' if seen else 'not '}visible on {here}"
    # What every host runs stays visible everywhere, as an identical install on every host is.
    assert os.path.isfile(sys.executable) and os.path.isfile(__file__), here


def test_only_the_first_host_sees_the_files_written_here(netns_cluster, cluster_mpirun, tmp_path):
    written = tmp_path / "written-on-the-first-host"
    written.write_text("here")
    cluster_mpirun((1, 1, 1), ranks_look_for_a_file, written, netns_cluster.hosts[0].namespace)


def test_a_file_written_on_another_host_stays_there(netns_cluster, cluster_mpirun, tmp_path):
    cluster_mpirun((1, 1), ranks_write_a_file, tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == [netns_cluster.hosts[0].namespace]


def ranks_write_a_file(directory):
    os.makedirs(directory, exist_ok=True)  # on the second host, the tmpfs hides it
    with open(os.path.join(directory, socket.gethostname()), "w") as file:
        file.write("written")
