"""``atari:<Game>`` on ale-py: the stacks a policy acts on, lives, resets, errors, and that the
stacks the trajectory replay builds at sample time are the ones the policy acted on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import gper
from gper.envs import UnknownEnvironment, make_env

pytest.importorskip("ale_py")

from gper.envs.atari import AtariVecEnv, rom_name  # noqa: E402


def random_actions(env: AtariVecEnv, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, env.n_actions, (env.num_envs,), generator=g)


def test_steps_are_stacks_of_the_last_four_frames():
    env = make_env("atari:Pong", 3, "cpu", seed=3)
    try:
        assert (env.n_actions, env.obs_shape, env.obs_dim) == (6, (4, 84, 84), 4 * 84 * 84)
        obs = env.reset(seed=3)
        assert obs.dtype == torch.uint8 and obs.shape == (3, 4, 84, 84)
        assert (obs[:, :3] == 0).all() and (obs[:, 3] != 0).any()  # a fresh game: one frame, zeros before it
        g = torch.Generator().manual_seed(0)
        ends, won, lost = 0, torch.zeros(3), torch.zeros(3)
        for _ in range(1000):
            step = env.step(random_actions(env, g))
            ended = step.terminated | step.truncated
            assert torch.equal(step.next_obs[:, :3], obs[:, 1:])  # the stack moves on by one frame
            assert torch.equal(step.obs[~ended], step.next_obs[~ended])
            assert (step.obs[ended, :3] == 0).all()  # a new game's stack starts afresh
            assert torch.equal(env.game_over, ended)  # Pong has no lives: every end is a game's
            assert set(step.reward.tolist()) <= {-1.0, 0.0, 1.0}  # the game's own points, unclipped
            won, lost = won + (step.reward > 0), lost + (step.reward < 0)
            over = step.terminated
            assert (torch.maximum(won, lost)[over] == 21).all()  # a game of Pong ends at 21 points
            ends += int(ended.sum())
            won[ended], lost[ended] = 0, 0
            obs = step.obs
        assert ends >= 1  # random play loses a game of Pong in about 900 steps
    finally:
        env.close()


def test_a_lost_life_ends_the_training_episode_only():
    g = torch.Generator().manual_seed(1)
    train = make_env("atari:Breakout", 2, "cpu", seed=1)
    play = AtariVecEnv("Breakout", 2, "cpu", seed=1, life_loss_terminal=False)
    try:
        lost = 0
        for _ in range(300):
            a = random_actions(train, g)
            s, p = train.step(a), play.step(a)
            life = s.terminated & ~train.game_over
            lost += int(life.sum())
            # the game goes on from the same frame; the learner's stack starts afresh there
            assert torch.equal(s.obs[life, -1], s.next_obs[life, -1])
            assert (s.obs[life, :3] == 0).all()
            assert not (p.terminated & ~play.game_over).any()  # evaluation plays whole games
            assert torch.equal(s.reward, p.reward)  # the same game, step for step
        assert lost >= 2
    finally:
        train.close()
        play.close()


def _recording(env: AtariVecEnv) -> list[np.ndarray]:
    """The actions ``env`` sends to ale-py from now on, one array a step."""
    sent, send = [], env._env.send
    env._env.send = lambda actions: (sent.append(np.array(actions)), send(actions))[1]
    return sent


def test_evaluation_fires_after_each_lost_life():
    """A policy that never fires (NOOP only): the game's reset serves Breakout's first ball, and
    then it waits for FIRE. Evaluation's environment (the trainer builds it with the test split)
    sends FIRE exactly on the step after each lost life (not after a game over, not after a
    reset), so its games end with all five balls lost; training's waits after its first lost
    life; Pong (no lives) gets what the policy sends."""
    from gper.dqn import Config, resolve
    from gper.training.environment import build_env

    cfg = resolve(Config(env="atari:Breakout", device="cpu", seed=3), torch.device("cpu"))
    evaluation = build_env(dataclasses.replace(cfg, num_envs=2), torch.device("cpu"), split="test", own_rng=True)
    training = AtariVecEnv("Breakout", 2, "cpu", seed=3, life_loss_terminal=False)
    pong = AtariVecEnv("Pong", 2, "cpu", seed=3, fire_after_life_loss=True)
    try:
        assert evaluation.fire_action == 1 and training.fire_action is None and pong.fire_action == 1
        noop = torch.zeros(2, dtype=torch.int64)
        evaluation.reset(seed=3), training.reset(seed=3), pong.reset(seed=3)
        sent, pong_sent = _recording(evaluation), _recording(pong)
        want, fired, games, waited = [], 0, np.zeros(2, dtype=np.int64), torch.zeros(2, dtype=torch.bool)
        fire_next = np.zeros(2, dtype=bool)
        for t in range(3000):
            if t == 40:  # a reset between a lost life and the next step: the next step is the policy's
                while not fire_next.any():
                    before = evaluation._lives.copy()
                    want.append(np.where(fire_next, 1, 0))
                    evaluation.step(noop)
                    fire_next = (0 < evaluation._lives) & (evaluation._lives < before) & ~evaluation.game_over.numpy()
                evaluation.reset(seed=4)
                fire_next[:] = False
            before = evaluation._lives.copy()
            want.append(np.where(fire_next, 1, 0))
            evaluation.step(noop), training.step(noop), pong.step(noop)
            over = evaluation.game_over.numpy()
            fire_next = (0 < evaluation._lives) & (evaluation._lives < before) & ~over
            fired, games = fired + int(fire_next.sum()), games + over
            waited |= training.game_over
            if (games >= 2).all():
                break
        assert (games >= 2).all() and fired >= 16 and not waited.any()  # 4 FIREs a game of 5 balls
        assert len(sent) == len(want) and all(np.array_equal(s, w) for s, w in zip(sent, want, strict=True))
        assert all((a == 0).all() for a in pong_sent)
        assert training._lives.tolist() == [4, 4]  # one ball served and lost, no FIRE since
    finally:
        evaluation.close(), training.close(), pong.close()


def test_bad_names_and_calls_are_refused():
    assert rom_name("MsPacman") == "ms_pacman" and rom_name("pong") == "pong" and rom_name("Pong") == "pong"
    with pytest.raises(UnknownEnvironment, match="atari:NoSuchGame"):
        make_env("atari:NoSuchGame", 1, "cpu")
    with pytest.raises(UnknownEnvironment):
        make_env("atari:", 1, "cpu")
    env = make_env("atari:Pong", 2, "cpu")
    try:
        with pytest.raises(ValueError, match=r"actions must be \[2\]"):
            env.step(torch.zeros(3, dtype=torch.int64))
        with pytest.raises(RuntimeError, match="no step was sent"):
            env.step_wait()
        env.step_async(torch.zeros(2, dtype=torch.int64))
        with pytest.raises(RuntimeError, match="were not collected"):
            env.step_async(torch.zeros(2, dtype=torch.int64))
        env.step_wait()
    finally:
        env.close()


def test_the_replay_stacks_the_frames_the_policy_acted_on(backend):
    """A trajectory replay of frame_stack=4 fed each stream's newest frame (as the pixel learner
    feeds it) draws every transition with the stacks the environment gave the policy."""
    e, steps, t = 2, 400, 128  # the ring of 128 rows wraps three times
    env = make_env("atari:Breakout", e, "cpu", seed=5)  # lives: episodes end often, inside games too
    spec = {"obs": ((84, 84), torch.uint8), "action": ((), torch.int64), "reward": ((), torch.float32)}
    rb = gper.TrajectoryReplayBuffer(e * t, e, spec, window=1, frame_stack=4, autoreset="same-step", backend=backend)
    rows: list[list] = [[] for _ in range(e)]  # per stream, per row: (obs stack, next_obs stack) or None
    ended = torch.zeros(e, dtype=torch.bool)
    g = torch.Generator().manual_seed(2)
    try:
        obs = env.reset(seed=5)
        for _ in range(steps):
            a = random_actions(env, g)
            s = env.step(a)
            rb.add(
                {"obs": obs[:, -1], "action": a, "reward": s.reward, "next_obs": s.next_obs[:, -1],
                 "terminated": s.terminated, "truncated": s.truncated}
            )  # fmt: skip
            for i in range(e):
                if ended[i]:
                    rows[i].append(None)  # the end row of the episode before
                rows[i].append((obs[i], s.next_obs[i]))
            ended = s.terminated | s.truncated
            obs = s.obs
    finally:
        env.close()
    batch = rb.sample(256, n_step=1)
    for j, idx in enumerate(batch.indices.tolist()):
        mine = rows[idx // t]
        r = len(mine) - 1 - (len(mine) - 1 - idx % t) % t  # the newest row written at that slot
        assert mine[r] is not None
        obs_stack, next_stack = mine[r][0].clone(), mine[r][1].clone()
        # frames of rows the ring has overwritten since are gone: the replay gives zeros for them
        gone = [k for k in range(4) if r - (3 - k) < len(mine) - t]
        obs_stack[gone] = 0
        next_stack[[k - 1 for k in gone if k >= 1]] = 0
        assert torch.equal(batch["obs"][j], obs_stack), f"draw {j}: the obs stack"
        assert torch.equal(batch["next_obs"][j], next_stack), f"draw {j}: the next_obs stack"
