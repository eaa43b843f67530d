"""The launch id: shared by every rank of one torchrun launch, new for each launch, read with a bound.

Real processes: ``torch.distributed.run --standalone`` (every rank a client of the agent's store), and two
processes started by hand with ``MASTER_ADDR``/``MASTER_PORT`` (rank 0 hosts the store, as with a launcher
that has none).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fgdata.distributed import launch_id
from fgdata.errors import FgdataError

REPO = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
#: Prints "RANK ID"; then, with an argument, waits for a line on stdin (so rank 0's store outlives the reader).
SCRIPT = """import os, sys
from fgdata.distributed import launch_id
os.write(1, f"{os.environ['RANK']} {launch_id(120)}\\n".encode())  # one write: ranks share the pipe
if sys.argv[1:]:
    sys.stdin.readline()
"""

pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ids(stdout: str) -> dict[int, str]:
    """The "RANK ID" lines; anything else a launcher prints on stdout is not ours."""
    return {int(m[1]): m[2] for m in re.finditer(r"^(\d+) ([0-9a-f]+)$", stdout, re.M)}


@pytest.mark.slow  # two torchrun launches of two ranks each
def test_every_rank_of_a_launch_shares_one_id_and_each_launch_has_its_own(tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    seen = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                               str(script)], capture_output=True, text=True, timeout=240, env={**os.environ, **ENV})
        assert done.returncode == 0, done.stderr[-3000:]
        got = ids(done.stdout)
        assert sorted(got) == [0, 1] and got[0] == got[1] and len(got[0]) == 32, done.stdout
        seen.append(got[0])
    assert seen[0] != seen[1]


def test_rank_0_hosts_the_store_when_the_launcher_has_none(tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    env = {**os.environ, **ENV, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env = {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC_")}

    def start(rank: int, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), *args], env={**env, "RANK": str(rank)}, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    reader = start(1)  # first: it waits for rank 0's store to listen
    host = start(0, "hold")
    try:
        out1, err1 = reader.communicate(timeout=240)
        out0, err0 = host.communicate("done\n", timeout=240)
    finally:
        for proc in (reader, host):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert reader.returncode == host.returncode == 0, (err0, err1)
    assert ids(out0)[0] == ids(out1)[1] and len(ids(out0)[0]) == 32
    assert err0 == err1 == ""  # no warnings from torch's store on the way


def test_a_rank_without_rank_0_fails_in_one_line_naming_the_store(monkeypatch):
    port = free_port()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    with pytest.raises(FgdataError) as err:
        launch_id(0.3)
    assert str(err.value) == (f"rank 1: no launch id from rank 0 through torchrun's store at "
                              f"MASTER_ADDR:MASTER_PORT=127.0.0.1:{port} within 0.3 s (--wait-timeout): "
                              "nothing listens there")


def test_one_process_has_no_launch_and_imports_no_torch():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-c", "import sys\nfrom fgdata.distributed import launch_id\n"
                           "print(launch_id(1), 'torch' in sys.modules)"], capture_output=True, text=True,
                          env={**env, **ENV}, timeout=60)
    assert done.stdout.split() == ["None", "False"], done.stderr
