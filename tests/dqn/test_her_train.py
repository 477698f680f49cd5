"""The trainer on a goal task: ``--env bitflip:N`` with ``--her``: its settings checked, the replay it
builds (observation, achieved and desired goal apart; hindsight relabelling as asked), the learn
step reading the drawn (relabelled) goal, the success rate of the evaluations, a short CPU run that
learns, resume; on a GPU (marked ``gpu``) the steps in CUDA graphs without a host sync."""

from __future__ import annotations

import json

import pytest
import torch

import gper
from gper.cli import main
from gper.dqn import Config, resolve, setup, train
from gper.dqn.network import GOAL_OBS_KEYS
from gper.training.runlog import read_metrics
from gper.training.timing import PhaseTimer
from helpers import assert_same_training

CPU = torch.device("cpu")
QUIET = dict(log=lambda _: None)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def bitflip() -> dict:
    """A short bit-flipping run on the CPU."""
    return dict(
        env="bitflip:6",
        device="cpu",
        total_steps=1200,
        num_envs=4,
        learning_starts=200,
        batch_size=32,
        buffer_size=2000,
        epoch_steps=400,
        hidden=(32,),
        progress=False,
        her="future",
        eval_episodes=8,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(her="later"), "her must be one of none, future, final, episode, got 'later'"),
        (dict(her_ratio=1.5), r"her_ratio must be in \[0, 1\], got 1.5"),
        (dict(her_ratio=float("nan")), r"her_ratio must be in \[0, 1\], got nan"),
        (dict(env="cartpole"), "her future relabels goals: it needs a goal environment"),
        (dict(replay="flat"), "bitflip:6 is goal-conditioned: it runs on the trajectory replay"),
        (dict(env="bitflip:x"), "bitflip:<N> takes a number of bits"),
    ],
)
def test_bad_goal_settings_are_refused(bitflip, change, message):
    with pytest.raises(ValueError, match=message):
        setup(Config(**bitflip | change), **QUIET)


@pytest.mark.parametrize("her", ["future", "final", "episode", "none"])
def test_setup_builds_a_relabelling_trajectory_replay(bitflip, her):
    cfg, agent, _ = setup(Config(**bitflip | dict(her=her, her_ratio=0.5)), **QUIET)
    rb = agent.rb
    assert cfg.replay == "trajectory" and isinstance(rb, gper.TrajectoryReplayBuffer)
    assert rb.obs_keys == GOAL_OBS_KEYS and agent.goal_env is agent.env
    assert rb.her.strategy == her and rb.her.relabel_ratio == 0.5
    assert rb.spec["obs"][0] == (6,) and rb.spec["achieved_goal"][0] == rb.spec["desired_goal"][0] == (6,)
    # bitflip's preset on the CPU, where the run leaves a setting unset
    assert resolve(Config(env="bitflip:6"), CPU).hidden == (256,)


def test_the_replay_stores_the_steps_parts_and_the_learner_reads_the_drawn_goal(bitflip):
    """What the collect step adds is the environment's observation split in three; the learn step's
    input is the drawn observation beside the drawn desired goal (relabelled where it was)."""
    _, agent, _ = setup(Config(**bitflip | dict(her_ratio=1.0)), **QUIET)
    env, rb = agent.env, agent.rb
    for _ in range(20):
        before = agent.obs[:, : env.obs_dim].clone()  # what the step acts on: the row it writes
        agent.collect.run()
    k = (rb.streams[:, 0] - 1) % rb.rows_per_env  # each stream's newest row
    rows = torch.arange(env.num_envs)
    stored = {name: rb.storage[name][rows, k] for name in GOAL_OBS_KEYS}
    # the newest row is the step just taken (an end row, where an episode ended, comes before it)
    for name, want in zip(GOAL_OBS_KEYS, env.split_goal_obs(before), strict=True):
        assert torch.equal(stored[name], want), name
    assert torch.equal(stored["achieved_goal"], stored["obs"])  # bitflip's achieved goal is its state
    agent.learn_state.batch = batch = rb.sample(16)
    agent._upload()
    s = agent.learn_state
    assert torch.equal(s.x[:, :6], batch["obs"]) and torch.equal(s.x[:, 6:12], batch["desired_goal"])
    assert torch.equal(s.next_x[:, :6], batch["next_obs"]) and torch.equal(
        s.next_x[:, 6:12], batch["next_desired_goal"]
    )
    assert batch["relabelled"].all()  # ratio 1: every draw relabelled
    # the reward the learner sees is bitflip's for the drawn goal and the next state
    assert torch.equal(batch["reward"], env.compute_reward(batch["next_achieved_goal"], batch["desired_goal"]))


@pytest.mark.parametrize("n_step", [1, 3])
def test_gper_train_bitflip_her_runs_and_logs_the_success_rate(tmp_path, capsys, n_step):
    argv = ["train", "--env", "bitflip:5", "--her", "future", "--device", "cpu", "--total-steps", "800"]
    argv += ["--n-step", str(n_step)]
    argv += ["--num-envs", "4", "--learning-starts", "200", "--batch-size", "32", "--buffer-size", "1000"]
    argv += ["--epoch-steps", "400", "--hidden", "16", "--progress", "False", "--eval-every", "1"]
    argv += ["--eval-episodes", "4", "--run-dir", str(tmp_path), "--run-name", "r"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "success " in out and '"eval_success_rate"' in out
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (config["her"], config["her_ratio"], config["replay"]) == ("future", 0.8, "trajectory")
    assert (config["n_step"], config["weight_norm"]) == (n_step, "batch")
    rates = [r["eval/success_rate"] for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if "eval/success_rate" in r]
    assert len(rates) == 2 and all(0.0 <= r <= 1.0 for r in rates)


def test_her_learns_eight_bits_on_the_cpu(tmp_path, bitflip):
    """DQN with future relabelling solves bitflip:8 in a few thousand env steps (without it, the
    goal is reached by chance about once in 2^8 / 8 episodes: the test's settings rarely learn it)."""
    run = bitflip | dict(
        env="bitflip:8", total_steps=24_000, num_envs=16, learning_starts=1024, batch_size=128, hidden=(128,),
        epoch_steps=4000, eval_every=1, eval_episodes=64, run_dir=str(tmp_path), save=False, tensorboard=False,
    )  # fmt: skip
    results = train(Config(**run), **QUIET)
    assert results.eval_success_rate is not None and results.eval_success_rate >= 0.9, results
    assert results.first_success_90_step is not None and results.first_success_90_s > 0


def test_a_her_run_resumed_mid_way_ends_where_the_whole_run_does(bitflip, tmp_path):
    """The episode index and the relabelling counter travel in the replay's checkpoint: the resumed
    run draws the same goals, bit for bit."""
    run = dict(bitflip, checkpoint_every=1, keep_checkpoints=10, run_dir=str(tmp_path))
    train(Config(**run, run_name="whole"), **QUIET)
    middle = tmp_path / "whole" / "checkpoints" / "step-000000000400"
    train(Config(**run, run_name="resumed", resume=str(middle)), **QUIET)
    assert_same_training(tmp_path / "whole", tmp_path / "resumed")
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())
    resumed = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    for key in ("env_steps", "train_steps", "episodes", "mean_return_last100", "eval_success_rate"):
        assert resumed[key] == whole[key], key
    with pytest.raises(ValueError, match="her 'final' \\(checkpoint: 'future'\\)"):
        train(Config(**run | dict(her="final"), run_name="other", resume=str(middle)), **QUIET)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_her_steps_never_sync(graphs):
    """The goal task's add and relabelling sample inside the collect and learn steps: captured in
    CUDA graphs (and eager), no host synchronisation."""
    settings = dict(env="bitflip:16", device="cuda", cuda_graphs=graphs, num_envs=8, hidden=(64,), her="future")
    settings |= dict(total_steps=20_000, learning_starts=512, batch_size=256, buffer_size=4096)
    _, agent, _ = setup(Config(**settings), **QUIET)
    for _ in range(80):
        agent.collect.run()
    for _ in range(5):
        agent.learn.run()
    assert agent.collect.captured == graphs and agent.learn.captured == graphs
    timer = PhaseTimer(agent.device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(20):
            agent.collect.run(timer if i % 5 == 0 else None)
            agent.learn.run(timer if i % 5 == 0 else None)
            agent.update_target(i + 1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert torch.isfinite(agent.sums).all() and agent.counters[1].item() == 25
