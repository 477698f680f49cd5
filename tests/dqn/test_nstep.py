"""The trainer on the trajectory replay: ``--n-step``, ``--replay`` and ``--gym-autoreset`` checked,
the replay each picks, the n-step target of the learn step, short runs of every environment, and
resume; on a GPU (marked ``gpu``) the trajectory steps in CUDA graphs without a host sync."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

import gper
from gper.cli import main
from gper.dqn import Agent, Config, FixedBatch, resolve, setup, train, trajectory_spec
from gper.dqn.agent import SUM_LOSS
from gper.dqn.config import replay_kind, trajectory_capacity
from gper.training.runlog import read_metrics
from gper.training.timing import PhaseTimer
from helpers import assert_same_training

CPU = torch.device("cpu")
QUIET = dict(log=lambda _: None)
pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(n_step=0), "n_step must be an integer from 1 to 64, got 0"),
        (dict(n_step=65), "n_step must be an integer from 1 to 64, got 65"),
        (dict(n_step=2.0), "n_step must be an integer from 1 to 64, got 2.0"),
        (dict(n_step=True), "n_step must be an integer from 1 to 64, got True"),
        (dict(replay="ring"), "replay must be auto, flat or trajectory, got 'ring'"),
        (dict(n_step=3, replay="flat"), r"n_step 3 needs the trajectory replay: use --replay trajectory \(or auto\)"),
        (dict(gym_autoreset="never"), "gym_autoreset must be same-step or next-step, got 'never'"),
        (dict(gym_autoreset="next-step"), "gym_autoreset next-step is for gym:<ID> environments; cartpole resets"),
        (
            dict(env="gym:CartPole-v1", gym_autoreset="next-step", replay="flat"),
            "gym:CartPole-v1 resets on the next step, which the flat replay cannot tell from a transition",
        ),
        (
            dict(n_step=8, buffer_size=39, num_envs=4),
            r"buffer_size 39 is too small .* num_envs \* \(n_step \+ 2\) = 40",
        ),
        (
            dict(n_step=8, learning_starts=28, batch_size=16, num_envs=4),
            r"learning_starts 28 is too small .* num_envs \* n_step = 32 env steps",
        ),
    ],
)
def test_bad_replay_settings_are_refused(smoke, change, message):
    with pytest.raises(ValueError, match=message):
        resolve(Config(**{**smoke, **change}), CPU)


def test_which_replay_runs():
    cfg = Config(env="gym:CartPole-v1")
    assert replay_kind(cfg, "same-step") == "flat" and replay_kind(cfg, "next-step") == "trajectory"
    assert replay_kind(Config(n_step=3), "same-step") == "trajectory"
    assert replay_kind(Config(replay="trajectory"), "same-step") == "trajectory"
    assert replay_kind(Config(replay="flat"), "same-step") == "flat"
    with pytest.raises(ValueError, match="resets on the next step"):
        replay_kind(Config(replay="flat"), "next-step")
    # the trajectory replay keeps whole rings of buffer_size // num_envs steps
    assert trajectory_capacity(Config(buffer_size=1003, num_envs=4)) == 1000


def test_setup_builds_the_replay_the_settings_ask_for(smoke):
    cfg, agent, _ = setup(Config(**smoke), **QUIET)
    assert cfg.replay == "flat" and type(agent.rb) is gper.PrioritizedReplayBuffer and not agent.trajectory
    cfg, agent, _ = setup(Config(**smoke | dict(n_step=3, buffer_size=1003)), **QUIET)
    assert cfg.replay == "trajectory" and isinstance(agent.rb, gper.TrajectoryReplayBuffer) and agent.trajectory
    assert agent.rb.num_envs == agent.env.num_envs == 4 and agent.rb.window == 3 and agent.rb.capacity == 1000
    cfg, agent, _ = setup(Config(**smoke | dict(replay="trajectory")), **QUIET)
    assert cfg.replay == "trajectory" and agent.rb.window == 1


def test_an_agent_refuses_a_replay_that_cannot_serve_it(smoke):
    cfg, agent, _ = setup(Config(**smoke), **QUIET)
    with pytest.raises(ValueError, match="n_step 3 needs a TrajectoryReplayBuffer, got PrioritizedReplayBuffer"):
        Agent(resolve(Config(**smoke | dict(n_step=3)), CPU), agent.env, agent.rb, 10)
    _, trajectory, _ = setup(Config(**smoke | dict(n_step=2)), **QUIET)
    with pytest.raises(ValueError, match="window 2 is shorter than n_step 3"):
        Agent(resolve(Config(**smoke | dict(n_step=3)), CPU), agent.env, trajectory.rb, 10)


# ---------------------------------------------------------------------------- the n-step target


def _trajectory_learner(n_step: int, batch: FixedBatch, gamma: float = 0.9) -> Agent:
    """A learn-only agent on a small trajectory replay, learning from ``batch``."""
    settings = dict(env="cartpole", device="cpu", total_steps=1000, num_envs=1, learning_starts=32, batch_size=8)
    cfg = resolve(Config(**settings, buffer_size=64, hidden=(16,), epoch_steps=100, n_step=n_step, gamma=gamma), CPU)
    rb = gper.TrajectoryReplayBuffer(64, 1, trajectory_spec(4), window=n_step, backend="torch", device="cpu")
    return Agent.for_learning(4, 2, cfg, rb, total_train_steps=10, batch_source=lambda: batch)


def _double_q(agent: Agent, fields: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Q(s, a) of the online network and the double-Q value of next_obs, written out."""
    qnet, target = copy.deepcopy(agent.qnet), copy.deepcopy(agent.target)
    with torch.no_grad():
        q = qnet(fields["obs"]).gather(1, fields["action"].unsqueeze(1)).squeeze(1)
        next_action = qnet(fields["next_obs"]).argmax(dim=1, keepdim=True)
        return q, target(fields["next_obs"]).gather(1, next_action).squeeze(1)


def test_the_learn_step_bootstraps_with_the_batchs_discount():
    """From the trajectory replay the target is reward + discount * Q'(next_obs): the batch's
    n-step return and gamma^m (0 where terminated), not gamma and a done flag."""
    g = torch.Generator().manual_seed(0)
    fields = {
        "obs": torch.randn(8, 4, generator=g),
        "next_obs": torch.randn(8, 4, generator=g),
        "action": torch.randint(0, 2, (8,), generator=g),
        "reward": torch.tensor([2.71, 1.9, 1.0, 0.0, 2.71, -1.0, 0.5, 3.0]),
        # m = 3, 2, 1 steps summed; terminated rows bootstrap nothing
        "discount": torch.tensor([0.729, 0.81, 0.9, 0.0, 0.729, 0.0, 0.81, 0.9]),
    }
    agent = _trajectory_learner(3, FixedBatch(fields))
    q, next_q = _double_q(agent, fields)
    agent.learn.run()
    y = fields["reward"] + fields["discount"] * next_q
    torch.testing.assert_close(agent.learn_state.td, q - y, rtol=0, atol=0)
    assert agent.learn_state.done is None and agent.learn_state.discount is fields["discount"]
    # a flat target (gamma, no done) would differ wherever m > 1 or the episode terminated
    flat = fields["reward"] + agent.cfg.gamma * next_q
    assert not torch.allclose(agent.learn_state.td, q - flat)


def test_one_step_trajectory_targets_equal_the_flat_ones_bit_for_bit():
    """n_step 1: the batch's discount is gamma or 0, so reward + discount * Q' rounds as the flat
    replay's reward + gamma * (1 - done) * Q' does."""
    g = torch.Generator().manual_seed(1)
    done = (torch.rand(8, generator=g) < 0.4).float()
    fields = {"obs": torch.randn(8, 4, generator=g), "next_obs": torch.randn(8, 4, generator=g)}
    fields |= {"action": torch.randint(0, 2, (8,), generator=g), "reward": torch.randn(8, generator=g)}
    gamma32 = torch.tensor(0.99, dtype=torch.float32)
    agent = _trajectory_learner(1, FixedBatch(fields | {"discount": gamma32 * (1 - done)}), gamma=0.99)
    q, next_q = _double_q(agent, fields)
    agent.learn.run()
    flat_y = fields["reward"] + 0.99 * (1.0 - done) * next_q
    assert torch.equal(agent.learn_state.td, q - flat_y)


def test_the_agent_draws_n_step_returns_from_the_replay(smoke):
    """The default batch source asks the replay for n_step-step returns discounted by gamma. With
    cartpole's reward of 1 a step, gamma 0.5 and n_step 3: a start whose episode goes on for 3 more
    steps has return 1.75 and discount 0.125; one whose episode terminates at its m-th step has
    the m-step return (1, 1.5 or 1.75) and discount 0."""
    cfg, agent, _ = setup(Config(**smoke | dict(n_step=3, gamma=0.5)), **QUIET)
    for _ in range(60):  # 240 env steps: cartpole's early episodes end every 10 to 40 steps
        agent.collect.run()
    b = agent.sample_replay()
    assert b["reward"].shape == b["discount"].shape == (cfg.batch_size,) and b["discount"].dtype == torch.float32
    ended = b["terminated"]
    assert not bool(b["truncated"].any())  # no episode reaches 500 steps here
    assert torch.all(b["reward"][~ended] == 1.75) and torch.all(b["discount"][~ended] == 0.125)
    assert torch.all(b["discount"][ended] == 0)
    assert all(float(r) in (1.0, 1.5, 1.75) for r in b["reward"][ended])
    assert 0 < int(ended.sum()) < cfg.batch_size


def test_huber_of_the_n_step_target_is_what_fwd_bwd_minimises():
    """The loss the step sums is the IS-weighted Huber loss of q against the n-step target."""
    g = torch.Generator().manual_seed(2)
    fields = {"obs": torch.randn(8, 4, generator=g), "next_obs": torch.randn(8, 4, generator=g)}
    fields |= {"action": torch.randint(0, 2, (8,), generator=g), "reward": 3 * torch.randn(8, generator=g)}
    fields["discount"] = torch.full((8,), 0.81)
    weights = torch.rand(8, generator=g) + 0.5
    agent = _trajectory_learner(2, FixedBatch(fields, weights))
    q, next_q = _double_q(agent, fields)
    agent.learn.run()
    y = fields["reward"] + fields["discount"] * next_q
    loss = (F.huber_loss(q, y, reduction="none", delta=1.0) * weights).mean()
    torch.testing.assert_close(agent.sums[SUM_LOSS].float(), loss)


@pytest.mark.parametrize(
    "change",
    [
        dict(env="cartpole"),
        dict(env="market", num_envs=4, episode_len=16, bars=3000, test_bars=500),
        dict(env="gym:CartPole-v1"),
        dict(env="gym:CartPole-v1", gym_autoreset="next-step"),
    ],
    ids=["cartpole", "market", "gym-same-step", "gym-next-step"],
)
def test_the_replay_reads_every_episode_end_from_the_collect_step(smoke, change):
    """Each environment's observations reach the replay as they continue (padded alike), so the
    trajectory replay finds every episode's end from the flags and sees no discontinuity: each
    episode ended by the step before the last has its end row (same-step: a row more than the
    steps; next-step: the reset step's row), and no reset step is drawable."""
    if change["env"].startswith("gym:"):
        pytest.importorskip("gymnasium")
    cfg, agent, _ = setup(Config(**smoke | change | dict(replay="trajectory")), **QUIET)
    for _ in range(149):
        agent.collect.run()
    ended = int(agent.episodes.count)  # each has its end row once the next step is added
    agent.collect.run()
    stats, steps = agent.rb.stats(), 150 * cfg.num_envs
    assert stats["steps"] == 150 and stats["discontinuities"] == 0 and ended > 4
    if cfg.gym_autoreset == "next-step":
        assert stats["size"] == steps and stats["drawable"] <= steps - ended
    else:
        assert stats["size"] == steps + ended and stats["drawable"] <= steps


@pytest.mark.parametrize("replay", ["flat", "trajectory"])
def test_a_truncated_step_bootstraps_from_its_final_observation(smoke, replay):
    """A time-limit truncation is not a terminal state: its transition goes to the final
    observation (not the reset one) and keeps its bootstrap (flat: done 0; trajectory: discount
    gamma, truncated and not terminated)."""
    cfg, agent, _ = setup(Config(**smoke | dict(replay=replay, gamma=0.9)), **QUIET)
    agent.env.set_state(torch.zeros(4, 4, dtype=torch.float64), torch.full((4,), 499))  # one step to the limit
    agent.collect.run()
    final = agent.next_obs.clone()  # the step's next_obs: the final observations
    assert not torch.equal(agent.obs, final)  # the envs reset: the agent acts on the new episodes
    if replay == "flat":
        assert torch.equal(agent.rb.storage["next_obs"][:4], final)
        assert torch.equal(agent.rb.storage["done"][:4], torch.zeros(4))
        return
    for _ in range(2):
        agent.collect.run()
    b = agent.rb.sample(256, n_step=1, gamma=0.9)
    cut = b["truncated"]
    assert 0 < int(cut.sum()) < 256 and not bool(b["terminated"].any())
    assert all(any(torch.equal(row, f) for f in final) for row in b["next_obs"][cut])
    assert torch.all(b["discount"] == torch.tensor(0.9, dtype=torch.float32))


# ---------------------------------------------------------------------------- short runs


@pytest.mark.parametrize(
    "env, flags",
    [
        ("cartpole", []),
        ("market", ["--num-envs", "4", "--episode-len", "32", "--bars", "3000", "--test-bars", "500"]),
        ("gym:CartPole-v1", ["--gym-autoreset", "same-step"]),
        ("gym:CartPole-v1", ["--gym-autoreset", "next-step"]),
    ],
)
def test_gper_train_n_step_3_runs_and_logs(tmp_path, capsys, env, flags):
    if env.startswith("gym:"):
        pytest.importorskip("gymnasium")
    argv = ["train", "--env", env, "--device", "cpu", "--n-step", "3", "--total-steps", "400"]
    argv += ["--learning-starts", "200", "--batch-size", "32", "--buffer-size", "1000", "--epoch-steps", "200"]
    argv += ["--hidden", "16", "--progress", "False", "--eval-every", "1", "--eval-episodes", "2"]
    argv += ["--run-dir", str(tmp_path), "--run-name", "r", *flags]
    assert main(argv) == 0
    assert '"env_steps": 400' in capsys.readouterr().out
    folder = tmp_path / "r"
    config = json.loads((folder / "config.json").read_text())
    assert (config["n_step"], config["replay"]) == (3, "trajectory")
    rows = read_metrics(folder / "metrics.jsonl")
    assert any("losses/td_loss" in r for r in rows) and any("eval/mean_return" in r for r in rows)
    assert any("charts/episodic_return" in r for r in rows)


@pytest.mark.parametrize("sampling", ["rank", "uniform"])
def test_other_sampling_modes_train_on_n_step_returns(tmp_path, smoke, sampling):
    """Rank mode re-sorts the trajectory replay's drawable starts at each epoch's end, as the flat one's."""
    results = train(Config(**smoke | dict(n_step=3, sampling=sampling), run_dir=str(tmp_path)), **QUIET)
    assert results.train_steps == 100 and results.episodes > 0


def test_a_next_step_gym_run_picks_the_trajectory_replay_and_counts_its_episodes(tmp_path, smoke):
    """With n_step 1, auto picks the trajectory replay for a next-step env; the episodes it records
    are CartPole's (reward 1 a step, so return == length: no reset step counted)."""
    pytest.importorskip("gymnasium")
    cfg = Config(**smoke | dict(env="gym:CartPole-v1", gym_autoreset="next-step"), run_dir=str(tmp_path), run_name="n")
    results = train(cfg, **QUIET)
    assert results.env_steps == 600 and results.train_steps > 0 and results.episodes > 5
    assert json.loads((tmp_path / "n" / "config.json").read_text())["replay"] == "trajectory"
    rows = read_metrics(tmp_path / "n" / "metrics.jsonl")
    episodes = [r for r in rows if "charts/episodic_return" in r]
    assert episodes and all(r["charts/episodic_return"] == r["charts/episodic_length"] for r in episodes)
    assert all(8 <= r["charts/episodic_length"] <= 500 for r in episodes)  # CartPole's shortest is 8


# ---------------------------------------------------------------------------- resume


@pytest.mark.parametrize("n_step", [1, 3])
def test_a_trajectory_run_resumed_mid_way_ends_where_the_whole_run_does(smoke, tmp_path, n_step):
    """As the flat replay's resume test: the trajectory replay (rings, pending observations,
    drawable starts, priorities, its random counter) travels in the checkpoint, bit for bit."""
    run = dict(smoke, total_steps=1000, checkpoint_every=1, keep_checkpoints=10, run_dir=str(tmp_path))
    run |= dict(n_step=n_step, replay="trajectory")
    train(Config(**run, run_name="whole"), **QUIET)
    middle = tmp_path / "whole" / "checkpoints" / "step-000000000400"
    train(Config(**run, run_name="resumed", resume=str(middle)), **QUIET)
    assert_same_training(tmp_path / "whole", tmp_path / "resumed")
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())
    resumed = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    for key in ("env_steps", "train_steps", "episodes", "mean_return_last100", "best_mean_return_last100"):
        assert resumed[key] == whole[key], key
    # n_step and the replay are the method: a resume may not change them
    with pytest.raises(ValueError, match=f"n_step 2 \\(checkpoint: {n_step}\\)"):
        train(Config(**run | dict(n_step=2), run_name="other", resume=str(middle)), **QUIET)


@pytest.mark.gpu
def test_a_gpu_trajectory_run_resumed_mid_way_ends_where_the_whole_run_does(smoke, tmp_path):
    """The same on CUDA with CUDA graphs: the resumed run captures its steps anew."""
    run = dict(smoke, device="cuda", total_steps=1000, checkpoint_every=1, keep_checkpoints=10, run_dir=str(tmp_path))
    run |= dict(n_step=3)
    train(Config(**run, run_name="whole"), **QUIET)
    middle = tmp_path / "whole" / "checkpoints" / "step-000000000400"
    train(Config(**run, run_name="resumed", resume=str(middle)), **QUIET)
    assert_same_training(tmp_path / "whole", tmp_path / "resumed")


# ---------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("env, n_step", [("cartpole", 5), ("market", 3)])
def test_trajectory_steps_never_sync(env, n_step, graphs):
    """The trajectory replay's add and n-step sample inside the collect and learn steps: captured
    in CUDA graphs (and eager), no host synchronisation. n_step 5: the buffer's host count of its
    adds must reach window + 1 = 6 before the collect graph's replays, which it does not see."""
    small = dict(device="cuda", total_steps=20_000, learning_starts=512, batch_size=256, buffer_size=4096)
    settings = dict(env=env, cuda_graphs=graphs, num_envs=8, hidden=(64, 64), n_step=n_step, **small)
    cfg, agent, _ = setup(Config(**settings), **QUIET)
    assert agent.trajectory and agent.rb.window == n_step
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


@pytest.mark.gpu
def test_one_graph_trajectory_step_matches_eager_steps():
    """The captured n-step learn step computes what the eager one does, step for step."""
    small = dict(device="cuda", total_steps=20_000, learning_starts=512, batch_size=256, buffer_size=4096)
    settings = dict(env="market", num_envs=16, hidden=(64, 64), n_step=3, **small)
    _, eager, _ = setup(Config(**settings, cuda_graphs=False), **QUIET)
    for _ in range(64):
        eager.collect.run()
    _, graphed, _ = setup(Config(**settings, cuda_graphs=True), **QUIET)
    graphed.load_state_dict(eager.state_dict())
    for _ in range(12):
        eager.learn.run()
        graphed.learn.run()
    torch.cuda.synchronize()
    assert graphed.learn.captured and not eager.learn.captured
    for a, b in zip(graphed.qnet.parameters(), eager.qnet.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(graphed.counters, eager.counters)
