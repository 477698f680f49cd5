"""``gper train`` in a subprocess, stopped by SIGTERM, SIGINT or SIGKILL (at seeded random moments and
in the middle of checkpoint writes), then resumed from its run folder until done: on the CPU it
ends with the parameters of the run that was never stopped, bit for bit."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import gper
from gper.dqn import Config, train
from gper.training.checkpoints import PAUSE_ENV, TEMP_PREFIX, list_checkpoints, step_of
from gper.training.runlog import read_metrics
from helpers import computed_records, event_scalars, jsonl_scalars, run_checkpoint

REPLAY = "replay.safetensors"

#: a short cartpole run on the CPU with a checkpoint every epoch (20 epochs of 200 env steps)
SETTINGS = dict(
    env="cartpole",
    device="cpu",
    seed=1,
    total_steps=4000,
    num_envs=4,
    learning_starts=200,
    batch_size=32,
    buffer_size=1000,
    epoch_steps=200,
    hidden=(16,),
    progress=False,
    checkpoint_every=1,
    keep_checkpoints=2,
)
TIMEOUT = 60  # seconds any one process may take


def _argv(**settings) -> list[str]:
    out = []
    for key, value in settings.items():
        out += [f"--{key.replace('_', '-')}"] + ([str(v) for v in value] if isinstance(value, tuple) else [str(value)])
    return out


def _env(pause: float | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(gper.__file__).parents[1]))
    env.pop(PAUSE_ENV, None)
    if pause is not None:
        env[PAUSE_ENV] = str(pause)
    return env


def _start(args: list[str], pause: float | None = None) -> subprocess.Popen:
    # SIGINT as the default: a test runner started in the background may have it ignored, and
    # an ignored SIGINT stays ignored in the trainer
    return subprocess.Popen(
        [sys.executable, "-m", "gper", "train", *args],
        env=_env(pause),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for(proc: subprocess.Popen, ready, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (status {proc.returncode}) before {what}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {what} within {TIMEOUT} s")
        time.sleep(0.005)


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in (folder / "checkpoints").glob(f"{TEMP_PREFIX}step-*") if p.is_dir()]


def _newer_than(folder: Path, step: int):
    return lambda: any(step_of(p) > step for p in list_checkpoints(folder / "checkpoints"))


def _newest_step(folder: Path) -> int:
    found = list_checkpoints(folder / "checkpoints")
    return step_of(found[-1]) if found else -1


class Whole(NamedTuple):
    folder: Path
    settings: dict


@pytest.fixture(scope="module", params=[{}, {"population": 3}], ids=["one-agent", "population"])
def whole(tmp_path_factory, request) -> Whole:
    """The run folder of the run that is never stopped (in this process, on one thread as the
    subprocesses): one agent, and a population of three."""
    settings = SETTINGS | request.param
    folder = tmp_path_factory.mktemp("whole")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(Config(**settings, run_dir=str(folder), run_name="run"), log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    return Whole(folder / "run", settings)


def _assert_same_as(run: Whole, folder: Path) -> None:
    whole = run.folder
    (ta, ra), (tb, rb) = run_checkpoint(whole), run_checkpoint(folder)
    assert tb["iteration"] == ta["iteration"] == SETTINGS["total_steps"] // SETTINGS["num_envs"]
    for name in ("qnet", "target"):
        for key, value in ta["agent"][name].items():
            assert torch.equal(value, tb["agent"][name][key]), f"{name}.{key} differs"
    for key in ("counters", "sums", "beta", "obs"):
        assert torch.equal(ta["agent"][key], tb["agent"][key]), key
    assert all(torch.equal(ra[k], rb[k]) for k in ra if isinstance(ra[k], torch.Tensor)), "replay differs"
    assert ta["returns"] == tb["returns"]

    def episodes(run):
        return [r for r in read_metrics(run / "metrics.jsonl") if any(k.endswith("charts/episodic_return") for k in r)]

    assert episodes(folder) == episodes(whole)
    # the whole record (evaluations and losses too), and TensorBoard's view of it: no step twice
    assert computed_records(folder) == computed_records(whole)
    assert event_scalars(folder) == jsonl_scalars(folder)


def _resume(folder: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gper", "train", "--resume", str(folder)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gper train: done" in done.stdout


def test_sigkill_at_random_moments_and_mid_checkpoint_then_resume_gives_the_same_run(whole, tmp_path):
    """Three kills: at a seeded random moment after a checkpoint; while a checkpoint's directory
    holds trainer.pt but not yet replay.safetensors; after both files are written, before the rename.
    Each resume starts from the newest complete checkpoint and removes the half-written one."""
    rng = random.Random(2024)
    folder = tmp_path / "run"
    args = _argv(**whole.settings, run_dir=tmp_path, run_name="run")

    proc = _start(args)
    _wait_for(proc, _newer_than(folder, -1), "a first checkpoint")
    time.sleep(rng.uniform(0.0, 0.8))
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.kill()
    proc.wait(TIMEOUT)

    def between_files():
        return any(
            (p / "trainer.pt").exists() and not (p / "replay.safetensors").exists() for p in _temporaries(folder)
        )

    def before_rename():
        return any((p / "replay.safetensors").exists() for p in _temporaries(folder))

    for moment, name in ((between_files, "a checkpoint between its files"), (before_rename, "one before its rename")):
        newest = _newest_step(folder)
        proc = _start(["--resume", str(folder)], pause=0.4)
        _wait_for(proc, _newer_than(folder, newest), "a new checkpoint")  # it trains on
        _wait_for(proc, moment, name)
        time.sleep(0.05)  # inside the writer's pause
        proc.kill()
        proc.wait(TIMEOUT)
        assert _temporaries(folder), "the kill left no half-written checkpoint"

    _resume(folder)
    assert not _temporaries(folder)
    _assert_same_as(whole, folder)


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)])
def test_sigterm_and_sigint_stop_with_a_checkpoint_then_resume_gives_the_same_run(whole, tmp_path, sig, status):
    """The signal ends the run after the collection iteration in progress, with a checkpoint of
    that very point (usually inside an epoch); exit status 143 for SIGTERM, 130 for SIGINT."""
    rng = random.Random(int(sig))
    folder = tmp_path / "run"
    proc = _start(_argv(**whole.settings, run_dir=tmp_path, run_name="run"))
    _wait_for(proc, _newer_than(folder, 400), "a checkpoint past env step 400")
    time.sleep(rng.uniform(0.0, 0.3))
    before = _newest_step(folder)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == status, out
    stopped = _newest_step(folder)
    assert stopped >= before and not _temporaries(folder)
    assert f"gper train: {sig.name}: stopped after writing {folder / 'checkpoints'}/step-{stopped:012d}" in out
    assert stopped < SETTINGS["total_steps"], "the run finished before the signal"
    assert "Traceback" not in out, out
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["stopped"] == sig.name and summary["env_steps"] == stopped
    assert (folder / "plot.png").exists()
    _resume(folder)
    _assert_same_as(whole, folder)
