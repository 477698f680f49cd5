"""DQN on pixels (``atari:<Game>``): the learner's targets against a hand computation, the dueling
head, and short CPU runs of ``gper train --env atari:Pong`` with a checkpoint and its resume."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

pytest.importorskip("ale_py")

from gper.dqn import Config  # noqa: E402
from gper.dqn.algorithm import stored_config, train  # noqa: E402
from gper.dqn.build import setup  # noqa: E402
from gper.dqn.pixel_net import NatureQNetwork  # noqa: E402

TINY = dict(
    env="atari:Pong", device="cpu", num_envs=2, total_steps=240, learning_starts=64, buffer_size=512, batch_size=8,
    epoch_steps=80, hidden=(32,), eval_every=0, progress=False, tensorboard=False, checkpoint_every=1,
)  # fmt: skip


def test_the_dueling_head_is_value_plus_centred_advantage():
    torch.manual_seed(0)
    net = NatureQNetwork(4, 6, hidden=16, dueling=True)
    x = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    h = net.features(x.float() / 255)
    a = net.head(h)
    want = net.value(h) + a - a.mean(dim=1, keepdim=True)
    torch.testing.assert_close(net(x), want)
    assert NatureQNetwork(4, 6, hidden=16)(x).shape == (5, 6)


def test_the_learn_step_computes_double_q_n_step_targets(tmp_path):
    cfg, agent, _ = setup(Config(**TINY, run_dir=str(tmp_path)), print, None)
    try:
        assert cfg.n_step == 3 and agent.rb.frame_stack == 4  # the atari preset's n-step, stacks of 4
        for _ in range(40):
            agent.collect_step(None)
        agent._sample()
        agent._fwd_bwd()
        b = agent.learn_state.batch
        with torch.no_grad():
            q = agent.qnet(b["obs"]).gather(1, b["action"][:, None])[:, 0]
            best = agent.qnet(b["next_obs"]).argmax(dim=1, keepdim=True)
            y = b["reward"] + b["discount"] * agent.target(b["next_obs"]).gather(1, best)[:, 0]
        torch.testing.assert_close(agent.learn_state.td, q - y)
        assert b["obs"].shape == (8, 4, 84, 84) and b["obs"].dtype == torch.uint8
        assert (b["discount"] <= cfg.gamma).all()
    finally:
        agent.env.close()


def test_a_short_run_checkpoints_and_resumes(tmp_path):
    first = train(Config(**TINY, run_dir=str(tmp_path), run_name="pong"))
    assert first.env_steps == 240 and first.train_steps > 0
    run = tmp_path / "pong"
    assert (run / "metrics.jsonl").exists()
    last = sorted((run / "checkpoints").iterdir())[-1]
    again = train(Config(**TINY | {"total_steps": 400}, run_dir=str(tmp_path), run_name="pong", resume=str(last)))
    assert again.env_steps == 400 and again.train_steps > first.train_steps
    config = json.loads((run / "config.json").read_text())
    assert config["env"] == "atari:Pong" and config["n_step"] == 3


def test_a_run_evaluates_whole_greedy_games(tmp_path):
    """An Atari run's evaluation plays whole games with the greedy policy and records their raw
    scores: here, at the run's end, two games of Pong (the evaluation environment's own rules, no
    terminal at a lost life and FIRE after one, are tests/envs/test_atari.py's)."""
    train(Config(**TINY | dict(eval_every=3, eval_episodes=2), run_dir=str(tmp_path), run_name="pong"))
    rows = [json.loads(line) for line in (tmp_path / "pong" / "metrics.jsonl").read_text().splitlines()]
    (evaluation,) = [row for row in rows if "eval/mean_return" in row]
    assert evaluation["global_step"] == 240 and evaluation["eval/episodes"] == 2
    # a game of Pong ends when a side reaches 21 points: whole games, so the score is a whole
    # difference of points and the game long (a 21-0 loss takes some 760 agent steps)
    for key in ("eval/min_return", "eval/max_return"):
        assert -21 <= evaluation[key] <= 21 and evaluation[key] == int(evaluation[key])
    assert evaluation["eval/mean_length"] > 500


def test_adam_eps_reaches_the_pixel_learners_adam_and_older_checkpoints_keep_rainbows(tmp_path):
    """The atari preset's epsilon is torch's (``--adam-eps`` sets another); a pixel checkpoint written
    before ``Config.adam_eps`` ran with 1.5e-4: it reads back with that, resumes from its stored
    settings with it, and a resume asking for the preset's is refused with a line naming it."""
    for change, want in (({}, 1e-8), ({"adam_eps": 2e-5}, 2e-5)):
        cfg, agent, _ = setup(Config(**TINY | change, run_dir=str(tmp_path)), print, None)
        agent.env.close()
        assert cfg.adam_eps == agent.optimizer.param_groups[0]["eps"] == want
    train(Config(**TINY | {"adam_eps": 1.5e-4}, run_dir=str(tmp_path), run_name="old"))
    last = sorted((tmp_path / "old" / "checkpoints").iterdir())[-1]
    state = torch.load(last / "trainer.pt", weights_only=True)
    del state["config"]["adam_eps"]  # as gper wrote it before the setting
    torch.save(state, last / "trainer.pt")
    stored = stored_config(last)
    assert stored.adam_eps == 1.5e-4
    with pytest.raises(ValueError, match=r"adam_eps 1e-08 \(checkpoint: 0.00015\)"):
        train(Config(**TINY | {"total_steps": 320}, run_dir=str(tmp_path), run_name="old", resume=str(last)))
    again = train(dataclasses.replace(stored, total_steps=320))
    assert again.env_steps == 320


def test_pixel_runs_refuse_what_they_do_not_do(tmp_path):
    for change, match in (
        (dict(sweep=("learning_rate=1e-4,3e-4",)), "no --sweep"),
        (dict(replay="flat"), "trajectory replay"),
    ):
        with pytest.raises(ValueError, match=match):
            setup(dataclasses.replace(Config(**TINY, run_dir=str(tmp_path)), **change), print, None)


@pytest.mark.gpu
def test_a_short_run_on_cuda_learns_from_its_graphs(tmp_path):
    """The learn step replays from CUDA graphs (the draw and its stacks among them) and its TD
    errors are the double-Q n-step ones of the network it started from."""
    cfg = Config(**TINY | {"device": "cuda", "total_steps": 1600, "learning_starts": 200}, run_dir=str(tmp_path))
    cfg, agent, _ = setup(cfg, print, None)
    try:
        for it in range(300):
            agent.collect_step(None)
            if it >= 100:
                agent.learn_step(it - 99, None)
        assert agent.learn.captured
        before = copy.deepcopy(agent.qnet)
        agent.collect_step(None)
        agent.learn_step(201, None)  # replays the captured step: a fresh draw into the same tensors
        b = agent.learn_state.batch
        with torch.no_grad():
            q = before(b["obs"]).gather(1, b["action"][:, None])[:, 0]
            best = before(b["next_obs"]).argmax(dim=1, keepdim=True)
            y = b["reward"] + b["discount"] * agent.target(b["next_obs"]).gather(1, best)[:, 0]
        torch.testing.assert_close(agent.learn_state.td, q - y, rtol=1e-3, atol=1e-3)  # TF32 convolutions
        assert torch.isfinite(agent.sums).all() and agent.counters[1].item() == 201
    finally:
        agent.env.close()


def test_sigkill_then_resume_finishes_the_run(tmp_path):
    """``gper train --env atari:Pong`` killed (SIGKILL) once a checkpoint is written, then resumed
    from its run folder: the run ends at its planned steps, its record has no step twice, and the
    replay came back whole (the games start afresh: their emulator state is not kept)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import gper
    from gper.training.checkpoints import list_checkpoints
    from gper.training.runlog import read_metrics

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(gper.__file__).parents[1]))
    args = ["--env", "atari:Pong", "--device", "cpu", "--num-envs", "2", "--total-steps", "480"]
    args += ["--learning-starts", "64", "--buffer-size", "512", "--batch-size", "8", "--epoch-steps", "80"]
    args += ["--hidden", "32", "--eval-every", "0", "--progress", "False", "--tensorboard", "False"]
    args += ["--checkpoint-every", "1", "--run-dir", str(tmp_path), "--run-name", "pong"]
    proc = subprocess.Popen([sys.executable, "-m", "gper", "train", *args], env=env, stdout=subprocess.DEVNULL)
    folder = tmp_path / "pong"
    deadline = time.monotonic() + 120
    while not (folder / "checkpoints").exists() or not list_checkpoints(folder / "checkpoints"):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run(
        [sys.executable, "-m", "gper", "train", "--resume", str(folder)], env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0 and "gper train: done" in done.stdout, done.stdout + done.stderr
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["env_steps"] == 480
    steps = [r["global_step"] for r in read_metrics(folder / "metrics.jsonl") if "losses/td_loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 480


def test_a_population_of_pixel_agents_trains_and_resumes(tmp_path):
    """``--population 2``: one environment of both agents' games, a replay of two instances, two
    networks; reported as a population, and resumed from its checkpoint."""
    settings = TINY | {"population": 2}
    cfg, agent, _ = setup(Config(**settings, run_dir=str(tmp_path)), print, None)
    try:
        assert agent.agents == 2 and agent.env.num_envs == 4 and agent.rb.instances == 2
        assert agent.sums.shape == (2, 3) and agent.episodes.agents == 2
        for _ in range(40):
            agent.collect_step(None)
        # env steps as the trainer counts them: one agent's (2 games an iteration), not all 4 games'
        assert agent.counters[0].item() == agent.env_steps == 40 * 2
        agent._sample()
        agent._fwd_bwd()
        b = agent.learn_state.batch
        assert b["obs"].shape == (2, 8, 4, 84, 84)
        for i in range(2):  # each agent's TD errors from its own networks and its own draws
            qnet, target = agent.network(i), agent.targets.network(i)
            with torch.no_grad():
                q = qnet(b["obs"][i]).gather(1, b["action"][i][:, None])[:, 0]
                best = qnet(b["next_obs"][i]).argmax(dim=1, keepdim=True)
                y = b["reward"][i] + b["discount"][i] * target(b["next_obs"][i]).gather(1, best)[:, 0]
            torch.testing.assert_close(agent.learn_state.td[i], q - y)
        assert not torch.equal(agent.network(0).head[2].weight, agent.network(1).head[2].weight)  # seeds 1 and 2
    finally:
        agent.env.close()
    first = train(Config(**settings, run_dir=str(tmp_path), run_name="pop"))
    assert first.env_steps == 240 and first.population is not None
    last = sorted((tmp_path / "pop" / "checkpoints").iterdir())[-1]
    again = train(Config(**settings | {"total_steps": 320}, run_dir=str(tmp_path), run_name="pop", resume=str(last)))
    assert again.env_steps == 320


class RememberTheBar:
    """A pixel task that needs the frame stack: each frame shows a bar on the left or the right at
    random, and an action earns 1 when it names the side of the bar one frame *before* the current
    one (0 on an episode's first step, whose earlier frame is the stack's zeros). Episodes are cut
    after 16 steps. The interface of :class:`~gper.envs.atari.AtariVecEnv` that the learner uses."""

    graph_safe, autoreset, n_actions, frame_stack = False, "same-step", 2, 4
    obs_shape, obs_dim = (4, 84, 84), 4 * 84 * 84

    def __init__(self, num_envs: int, seed: int = 0) -> None:
        self.name, self.num_envs, self.device = "bars", num_envs, torch.device("cpu")
        self.g = torch.Generator().manual_seed(seed)
        self.game_over = torch.zeros(num_envs, dtype=torch.bool)
        self.reset()

    def _frame(self, side: torch.Tensor) -> torch.Tensor:
        f = torch.zeros(self.num_envs, 84, 84, dtype=torch.uint8)
        f[side == 0, 30:54, 4:20] = 255
        f[side == 1, 30:54, 64:80] = 255
        return f

    def reset(self, seed=None) -> torch.Tensor:
        self.side = torch.randint(0, 2, (self.num_envs,), generator=self.g)
        self.prev = torch.full((self.num_envs,), -1)  # no earlier frame in the episode
        self.t = torch.zeros(self.num_envs, dtype=torch.int64)
        self.stack = torch.zeros(self.num_envs, *self.obs_shape, dtype=torch.uint8)
        self.stack[:, -1] = self._frame(self.side)
        return self.stack.clone()

    def step_async(self, actions: torch.Tensor) -> None:
        self.actions = actions.clone()

    def step_wait(self):
        from gper.envs.base import Step

        reward = (self.actions == self.prev).float()
        self.prev, self.side = self.side, torch.randint(0, 2, (self.num_envs,), generator=self.g)
        self.t += 1
        truncated = self.t >= 16
        frame = self._frame(self.side)
        next_stack = torch.cat((self.stack[:, 1:], frame[:, None]), dim=1)
        fresh = torch.zeros_like(self.stack)
        fresh[:, -1] = frame
        self.stack = torch.where(truncated[:, None, None, None], fresh, next_stack)
        self.prev = torch.where(truncated, -1, self.prev)
        self.t = torch.where(truncated, 0, self.t)
        self.game_over = truncated.clone()
        return Step(next_stack, reward, torch.zeros_like(truncated), truncated, self.stack.clone())

    def step(self, actions):
        self.step_async(actions)
        return self.step_wait()

    def close(self) -> None:
        pass


#: collection iterations of 4 games, a training step in each from the 100th on
ITERATIONS = 600


def test_the_learner_uses_the_frame_before_the_last_one():
    """Learning a task whose reward depends on the frame before the newest: the replay's stacks,
    the action stored with them and the n-step targets line up, or the greedy policy stays at chance."""
    from gper.dqn.config import resolve
    from gper.dqn.pixel_agent import PixelAgent, pixel_replay

    torch.manual_seed(0)
    task = {"total_steps": 8000, "learning_starts": 400, "batch_size": 32, "hidden": (64,), "learning_rate": 5e-4}
    cfg = resolve(Config(**TINY | task | {"buffer_size": 4000, "target_every": 100}), torch.device("cpu"))
    cfg = dataclasses.replace(cfg, num_envs=4, exploration_fraction=0.05, weight_norm="batch")
    env = RememberTheBar(4, seed=1)
    agent = PixelAgent(cfg, env, pixel_replay(cfg, env, torch.device("cpu")), total_train_steps=ITERATIONS - 100)
    for it in range(ITERATIONS):
        agent.collect_step(None)
        if it >= 100:
            agent.learn_step(it - 99, None)
    play = RememberTheBar(64, seed=2)
    obs, earned = play.reset(), 0.0
    for _ in range(15):  # the first step of each of the 64 episodes has no earlier frame
        step = play.step(agent.greedy(obs))
        earned += step.reward.sum().item()
        obs = step.obs
    assert earned / (14 * 64) > 0.9, f"greedy policy right {earned / (14 * 64):.2f} of the time (chance: 0.5)"


def test_dueling_is_for_pixels_only(tmp_path):
    with pytest.raises(ValueError, match="dueling is a head of the pixel network"):
        setup(Config(env="cartpole", device="cpu", dueling=True, run_dir=str(tmp_path)), print, None)


@pytest.mark.gpu
def test_a_replay_too_large_for_the_gpu_is_refused_with_its_size(tmp_path):
    with pytest.raises(ValueError, match="does not fit in cuda:0's memory: lower --buffer-size"):
        setup(Config(**TINY | {"device": "cuda", "buffer_size": 10**9}, run_dir=str(tmp_path)), print, None)
