"""The trainer's checkpoints, in process on the CPU: when they are written, what a resume
continues bit for bit, which settings a resume takes or refuses, and the one-line refusals of
damaged checkpoints. The subprocess tests (signals, SIGKILL) are in ``test_crash.py``."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import signal
from pathlib import Path

import pytest
import torch

from gper.cli import main
from gper.dqn import Config, WalkForward, setup, train
from gper.dqn.algorithm import fixed_settings, stored_config
from gper.training import epochs
from gper.training.checkpoints import CheckpointError, list_checkpoints, step_of
from gper.training.runlog import read_metrics
from helpers import assert_same_training, run_checkpoint

QUIET = dict(log=lambda _: None)
pytestmark = pytest.mark.usefixtures("one_thread")


def _steps(folder) -> list[int]:
    return [step_of(p) for p in list_checkpoints(folder / "checkpoints")]


@pytest.fixture
def run(smoke, tmp_path):
    """Settings of a run that checkpoints every epoch (5 epochs of 200 env steps) and keeps them all."""
    return dict(smoke, total_steps=1000, checkpoint_every=1, keep_checkpoints=10, run_dir=str(tmp_path))


# ---------------------------------------------------------------------------- when they are written


def test_checkpoints_every_n_epochs_and_at_the_end(run, tmp_path):
    train(Config(**{**run, "checkpoint_every": 2}, run_name="a"), **QUIET)
    assert _steps(tmp_path / "a") == [400, 800, 1000]
    train(Config(**{**run, "checkpoint_every": 0}, run_name="b"), **QUIET)
    assert _steps(tmp_path / "b") == [1000]
    train(Config(**{**run, "save": False}, run_name="c"), **QUIET)
    assert not (tmp_path / "c" / "checkpoints").exists()


def test_only_the_newest_are_kept(run, tmp_path):
    train(Config(**{**run, "keep_checkpoints": 2}, run_name="a"), **QUIET)
    assert _steps(tmp_path / "a") == [800, 1000]
    assert [p.name for p in (tmp_path / "a" / "checkpoints").iterdir() if p.name.startswith(".")] == []


# ---------------------------------------------------------------------------- resuming bit for bit


@pytest.mark.parametrize("sampling", ["proportional", "rank"])
def test_a_run_resumed_mid_way_ends_where_the_whole_run_does(run, tmp_path, sampling):
    """Resumed from the checkpoint at env step 400, a run reaches the same parameters, optimizer
    state, replay and episode history as the run that never stopped: the RNG states, the buffer's
    counters, epsilon, the target updates and the episodes in flight all came along."""
    run = dict(run, sampling=sampling)
    train(Config(**run, run_name="whole"), **QUIET)
    middle = tmp_path / "whole" / "checkpoints" / "step-000000000400"
    train(Config(**run, run_name="resumed", resume=str(middle)), **QUIET)
    assert_same_training(tmp_path / "whole", tmp_path / "resumed")
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())
    resumed = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    for key in ("env_steps", "train_steps", "episodes", "mean_return_last100", "best_mean_return_last100"):
        assert resumed[key] == whole[key], key


def _older_checkpoint(tmp_path, edit) -> Path:
    """A copy of the "whole" run's checkpoint at env step 400 whose trainer.pt settings ``edit``
    (a function of the settings dict, changing it in place) turned into an older gper's."""
    middle = tmp_path / "whole" / "checkpoints" / "step-000000000400"
    old = tmp_path / "old" / middle.name
    shutil.copytree(middle, old)
    state = torch.load(old / "trainer.pt", weights_only=True)
    edit(state["config"])
    torch.save(state, old / "trainer.pt")
    return old


def test_a_checkpoint_with_the_walk_settings_flat_resumes_as_before(run, tmp_path):
    """A checkpoint written before ``Config.walk`` (its trainer.pt's settings with ``steps_per_bar``,
    ``validations``, ... among the others) reads back with them in ``walk`` and resumes bit for bit."""
    train(Config(**run, run_name="whole"), **QUIET)
    old = _older_checkpoint(tmp_path, lambda config: config.update(config.pop("walk")))
    assert stored_config(old).walk == WalkForward()
    train(Config(**run, run_name="resumed", resume=str(old)), **QUIET)
    assert_same_training(tmp_path / "whole", tmp_path / "resumed")


def test_a_checkpoint_from_before_the_loss_setting_resumes_as_huber(run, tmp_path):
    """A checkpoint written before ``Config.loss``, ``Config.actions`` and ``Config.vol_target`` (none
    among its settings) ran with the Huber loss (and a market of 45 actions, unscaled): it reads back
    with those and resumes bit for bit; asked for ``mse`` it is refused."""
    train(Config(**run, run_name="whole"), **QUIET)
    names = ("loss", "actions", "vol_target", "turnover_bps")
    old = _older_checkpoint(tmp_path, lambda config: [config.pop(k) for k in names])
    stored = stored_config(old)
    assert (stored.loss, stored.actions, stored.vol_target, stored.turnover_bps) == ("huber", 45, None, 0.0)
    with pytest.raises(ValueError, match=r"loss 'mse' \(checkpoint: 'huber'\)"):
        train(Config(**run, loss="mse", run_name="refused", resume=str(old)), **QUIET)
    train(Config(**run, run_name="resumed", resume=str(old)), **QUIET)
    assert_same_training(tmp_path / "whole", tmp_path / "resumed")


def test_a_checkpoint_from_before_adam_eps_resumes_with_torchs_epsilon(run, tmp_path):
    """A checkpoint of the MLP learner written before ``Config.adam_eps`` ran Adam with torch's 1e-8:
    it reads back with that and resumes bit for bit; asked for another epsilon it is refused."""
    train(Config(**run, run_name="whole"), **QUIET)
    old = _older_checkpoint(tmp_path, lambda config: config.pop("adam_eps"))
    assert stored_config(old).adam_eps == 1e-8
    with pytest.raises(ValueError, match=r"adam_eps 0.0001 \(checkpoint: 1e-08\)"):
        train(Config(**run, adam_eps=1e-4, run_name="refused", resume=str(old)), **QUIET)
    train(Config(**run, run_name="resumed", resume=str(old)), **QUIET)
    assert_same_training(tmp_path / "whole", tmp_path / "resumed")


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
def test_a_gpu_run_resumed_mid_way_ends_where_the_whole_run_does(run, tmp_path, graphs):
    """The same on CUDA, with and without CUDA graphs: the CUDA generator's state and Adam's
    capturable state travel in the checkpoint too."""
    run = dict(run, device="cuda", cuda_graphs=graphs)
    train(Config(**run, run_name="whole"), **QUIET)
    middle = tmp_path / "whole" / "checkpoints" / "step-000000000400"
    train(Config(**run, run_name="resumed", resume=str(middle)), **QUIET)
    assert_same_training(tmp_path / "whole", tmp_path / "resumed")


@pytest.mark.gpu
def test_a_gpu_checkpoint_resumes_on_the_cpu(run, tmp_path):
    train(Config(**dict(run, device="cuda"), run_name="gpu"), **QUIET)
    middle = tmp_path / "gpu" / "checkpoints" / "step-000000000600"
    results = train(Config(**dict(run, device="cpu"), run_name="cpu", resume=str(middle)), **QUIET)
    assert results.env_steps == 1000 and results.device == "cpu"


@pytest.mark.parametrize("sig, raised", [(signal.SIGTERM, SystemExit), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_inside_an_epoch_checkpoints_that_iteration(run, tmp_path, monkeypatch, sig, raised):
    """A stop signal during iteration 130 (of 250; epochs of 50) ends the run after it, with a
    checkpoint at env step 524 whose episode ring still holds the epoch's unreported episodes;
    resumed, the run ends where the whole run does."""
    train(Config(**run, run_name="whole"), **QUIET)
    step = epochs.step_iteration

    def step_then_signal(cfg, agent, it, timer, train_steps):
        trained = step(cfg, agent, it, timer, train_steps)
        if it == 130:
            signal.raise_signal(sig)
        return trained

    monkeypatch.setattr(epochs, "step_iteration", step_then_signal)
    lines = []
    with pytest.raises(raised):
        train(Config(**run, run_name="stopped"), log=lines.append)
    monkeypatch.undo()
    stopped = tmp_path / "stopped" / "checkpoints"
    assert _steps(tmp_path / "stopped") == [200, 400, 524]
    assert lines[-1] == f"gper train: {sig.name}: stopped after writing {stopped / 'step-000000000524'}; " + (
        f"continue with --resume {tmp_path / 'stopped'}"
    )
    assert signal.getsignal(sig) is not None and "StopSignals" not in repr(signal.getsignal(sig))
    train(Config(**run, resume=str(tmp_path / "stopped")), **QUIET)
    assert_same_training(tmp_path / "whole", tmp_path / "stopped")


def test_resuming_a_run_folder_continues_it_in_place(run, tmp_path):
    """From its run folder, a run continues in that folder from the newest checkpoint: the records
    a run wrote after that checkpoint are dropped from metrics.jsonl, which then holds what the
    uninterrupted run's does; the temporary directory of an unfinished write is removed."""
    train(Config(**run, run_name="whole"), **QUIET)
    # a run that died while writing its checkpoint at 800, having written metrics past 600
    folder = tmp_path / "died"
    shutil.copytree(tmp_path / "whole", folder)
    for name in ("summary.json", "plot.png", "checkpoints/step-000000001000"):
        shutil.rmtree(folder / name) if (folder / name).is_dir() else (folder / name).unlink()
    (folder / "checkpoints" / "step-000000000800").rename(folder / "checkpoints" / ".tmp-step-000000000800")
    lines = []
    train(Config(**run, resume=str(folder)), log=lines.append)
    assert "gper train: resumed from" in "\n".join(lines) and "never finished" in "\n".join(lines)
    assert not (folder / "checkpoints" / ".tmp-step-000000000800").exists()
    assert_same_training(tmp_path / "whole", folder)

    def episodes(name):
        return [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if "charts/episodic_return" in r]

    assert episodes("died") == episodes("whole")
    assert json.loads((folder / "config.json").read_text())["total_steps"] == 1000  # the settings in force


# ---------------------------------------------------------------------------- settings on resume


def test_a_resume_honours_total_steps_and_learning_rate(run, tmp_path):
    train(Config(**{**run, "total_steps": 600}, run_name="a"), **QUIET)
    resumed = train(Config(**{**run, "total_steps": 800, "learning_rate": 1e-3}, resume=str(tmp_path / "a")), **QUIET)
    assert resumed.env_steps == 800 and _steps(tmp_path / "a")[-1] == 800
    trainer, _ = run_checkpoint(tmp_path / "a")
    assert [g["lr"] for g in trainer["agent"]["optimizer"]["param_groups"]] == [1e-3]
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["total_steps"] == 800 and config["learning_rate"] == 1e-3


def test_a_resume_refuses_settings_that_change_shapes_or_the_method(run, tmp_path):
    train(Config(**{**run, "total_steps": 400}, run_name="a"), **QUIET)
    before = (tmp_path / "a" / "config.json").read_text()
    changed = Config(**{**run, "batch_size": 16, "hidden": (8,), "alpha": 0.5}, resume=str(tmp_path / "a"))
    with pytest.raises(ValueError) as info:
        train(changed, **QUIET)
    message = str(info.value)
    assert "\n" not in message and "step-000000000400" in message
    assert "batch_size 16 (checkpoint: 32)" in message and "hidden (8,) (checkpoint: (16,))" in message
    assert "alpha 0.5 (checkpoint: 0.6)" in message and "gamma" not in message
    assert (tmp_path / "a" / "config.json").read_text() == before  # refused before anything was written
    with pytest.raises(ValueError, match=r"total_steps 200 is below its env step 400$"):
        train(Config(**{**run, "total_steps": 200}, resume=str(tmp_path / "a")), **QUIET)


def test_which_settings_a_resume_keeps_fixed():
    fixed = set(fixed_settings())
    assert {"env", "seed", "num_envs", "buffer_size", "batch_size", "hidden", "sampling", "alpha"} <= fixed
    assert not fixed & {"total_steps", "learning_rate", "progress", "run_dir", "run_name", "time_every"}
    assert not fixed & {"save", "checkpoint_every", "keep_checkpoints", "resume"}


def test_the_command_resumes_with_the_checkpoints_settings(run, tmp_path, capsys):
    train(Config(**{**run, "total_steps": 400, "seed": 5}, run_name="a"), **QUIET)
    folder = tmp_path / "a"
    recorded = json.loads((folder / "config.json").read_text())
    del recorded["gper"]  # config.json also says which gper wrote it
    assert dataclasses.asdict(stored_config(folder)) == {
        **recorded,
        "run_dir": "runs",
        "run_name": None,
        "resume": str(folder),
    } | {"hidden": (16,), "sweep": (), "device": "cpu"} | {"cuda_graphs": True, "precision": "tf32", "threads": None}
    # config.json records what ran on the CPU; the checkpoint keeps what was asked (a GPU resume runs as one)
    assert (recorded["cuda_graphs"], recorded["precision"], recorded["threads"]) == (False, "fp32", 1)
    assert main(["train", "--resume", str(folder), "--total-steps", "600"]) == 0
    assert '"env_steps": 600' in capsys.readouterr().out and _steps(folder)[-1] == 600
    assert main(["train", "--resume", str(folder), "--seed", "6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed 6 (checkpoint: 5)" in err


def test_adam_keeps_its_own_device_flags_when_loading_another_devices_state(smoke):
    """A CUDA agent's Adam is capturable and fused; its state loads into a CPU agent, which keeps
    its own flags and CPU step counts (and the other way round, the same code moves them)."""
    _, agent, _ = setup(Config(**smoke), log=lambda _: None)
    for _ in range(60):
        agent.collect.run()
    for _ in range(3):
        agent.learn.run()
    state = agent.state_dict()
    state["optimizer"] = copy.deepcopy(state["optimizer"])
    for group in state["optimizer"]["param_groups"]:
        group.update(capturable=True, fused=True)
    _, other, _ = setup(Config(**smoke), log=lambda _: None)
    other.load_state_dict(state)
    group = other.optimizer.param_groups[0]
    assert group["capturable"] is False and group["fused"] is None
    assert all(s["step"].device.type == "cpu" and s["step"].item() == 3 for s in other.optimizer.state.values())
    other.learn.run()
    assert all(s["step"].item() == 4 for s in other.optimizer.state.values())


def test_a_new_run_does_not_write_into_a_folder_with_checkpoints(run, tmp_path):
    train(Config(**{**run, "total_steps": 200}, run_name="a"), **QUIET)
    with pytest.raises(ValueError, match="holds the checkpoints of another run"):
        train(Config(**{**run, "total_steps": 200}, run_name="a"), **QUIET)


# ---------------------------------------------------------------------------- damaged checkpoints


def _cut(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


class _Opaque:
    pass


DAMAGE = {
    "trainer cut short": ("trainer.pt", _cut, "trainer.pt: cannot be read: PytorchStreamReader failed"),
    "replay cut short": ("replay.safetensors", _cut, "replay.safetensors: cannot be loaded: "),
    "empty trainer": ("trainer.pt", lambda p: p.write_bytes(b""), "trainer.pt: cannot be read: cut short"),
    "replay missing": ("replay.safetensors", lambda p: p.unlink(), "replay.safetensors: missing"),
    "code in trainer": (
        "trainer.pt",
        lambda p: torch.save({"agent": _Opaque()}, p),
        f"trainer.pt: cannot be read: holds {__name__}._Opaque, more than tensors and plain containers",
    ),
    "not a trainer": ("trainer.pt", lambda p: torch.save([1, 2], p), "trainer.pt: holds a list, not a trainer"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_in_one_line(run, tmp_path, capsys, damage):
    """Resuming a run folder whose newest checkpoint is damaged is refused (not skipped): the
    line names the file, what is wrong, and the checkpoint before it to resume from instead."""
    name, spoil, expected = DAMAGE[damage]
    train(Config(**{**run, "total_steps": 400}, run_name="a"), **QUIET)
    newest = tmp_path / "a" / "checkpoints" / "step-000000000400"
    spoil(newest / name)
    argv = ["train", "--resume", str(tmp_path / "a"), "--total-steps", "600", "--progress", "False"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gper train: error: {newest}/") and err.count("\n") == 1, err
    assert expected in err, err
    assert err.rstrip().endswith(f"the checkpoint before it is {newest.parent / 'step-000000000200'}")
    assert _steps(tmp_path / "a") == [200, 400]  # nothing written, nothing deleted


def test_a_replay_of_another_step_is_refused(run, tmp_path):
    train(Config(**{**run, "total_steps": 600}, run_name="a"), **QUIET)
    ckpts = tmp_path / "a" / "checkpoints"
    (ckpts / "step-000000000400" / "replay.safetensors").replace(ckpts / "step-000000000600" / "replay.safetensors")
    with pytest.raises(CheckpointError, match=r"step-000000000600/replay.safetensors: wrong content: counts \{"):
        train(Config(**{**run, "total_steps": 800}, resume=str(tmp_path / "a")), **QUIET)


@pytest.mark.parametrize(
    "where, message",
    [
        ("nowhere", "no such run folder or checkpoint directory"),
        ("a/config.json", "is a file: resume from a run folder or a checkpoint directory"),
        ("a/checkpoints/.tmp-step-000000000600", "whose writing never finished"),
        ("empty", "no complete checkpoint in"),
    ],
)
def test_resume_names_what_it_cannot_resume_from(run, tmp_path, where, message):
    train(Config(**{**run, "total_steps": 200}, run_name="a"), **QUIET)
    (tmp_path / "a" / "checkpoints" / ".tmp-step-000000000600").mkdir()
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=message):
        train(Config(**run, resume=str(tmp_path / where)), **QUIET)
