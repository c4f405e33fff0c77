"""The torchrun suites (gloo, CPU): every form x layout x kernel at 1, 2 and 4 ranks against the reference,
and bad input refused on every rank without a hang."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def torchrun(nproc, script, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           os.path.join(HERE, script)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_every_case_matches_reference(nproc):
    rc, out = torchrun(nproc, "dist_check.py", timeout=600)
    print(out)
    assert rc == 0, out[-4000:]
    assert "80 passed, 0 failed" in out


def test_bad_input_refused_on_every_rank():
    rc, out = torchrun(2, "dist_bad_input.py", timeout=300)
    print(out)
    assert rc == 0, out[-4000:]
    assert out.count("5 passed, 0 failed") == 2
