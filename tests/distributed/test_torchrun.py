"""Two torchrun "nodes" on one host (``--nnodes 2 --node-rank 0/1``, rendezvous on 127.0.0.1): the
multi-host launch path of a sharded buffer, with 1 and 2 processes per node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from spawn import free_port

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("per_node", [1, 2], ids=["2x1", "2x2"])
def test_two_torchrun_nodes(per_node):
    port = free_port()
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    # the check imports workers.py beside it (torchrun runs the script with its folder first on the path)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(per_node)]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    nodes = [
        subprocess.Popen(
            [*cmd, "--node-rank", str(rank), str(HERE / "torchrun_check.py")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = []
    try:
        for node in nodes:
            outs.append(node.communicate(timeout=120)[0])
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    for node, out in zip(nodes, outs, strict=True):
        assert node.returncode == 0, out[-3000:]
    assert sum(out.count("chi-square z") for out in outs) == 2 * per_node, outs
