"""Atari 2600 games on ale-py's C++ vector environment, as a :class:`~gper.envs.base.VecEnv` of frame stacks.

The protocol is CleanRL's ``dqn_atari.py`` (the ``NoFrameskip-v4`` games with the usual
wrappers), so scores compare with its published ones: no sticky actions (repeat probability 0),
the minimal action set, up to 30 no-op actions at a reset, FIRE at a reset where the game has it,
each action repeated for 4 frames with the last two max-pooled, 84 x 84 grayscale frames, episodes
cut at 108,000 frames. Sticky actions (Machado et al. 2018) are a keyword away
(``repeat_action_probability=0.25``). ale-py does the emulation and the preprocessing on C++
threads, one frame per environment a step; the stacks are built here, on the device.

What a step returns: ``obs`` and ``next_obs`` are ``[N, S, 84, 84]`` uint8 stacks of the last
``S`` frames (the oldest first; zeros before the episode's first frame, as
:class:`gper.TrajectoryReplayBuffer` with ``frame_stack=S`` builds them at sample time: the
policy acts on the stacks it learns from); ``reward`` is the game's own (unclipped: a learner
clips it for learning, and reports these). Resets happen in the step that ended the episode
(``same-step``: ``next_obs`` holds the final frame).

One difference from CleanRL's wrappers in training: FIRE is pressed at a game's reset only, not
after each lost life (CleanRL's ``FireResetEnv`` runs at every reset its ``EpisodicLifeEnv``
makes), so in Breakout the agent learns to fire itself. Evaluation presses FIRE after each lost
life, as CleanRL's wrappers do (``fire_after_life_loss``: the step after a life is lost plays FIRE
in place of the policy's action): a greedy policy that never fires would otherwise play on until
the game's frame limit.

With ``life_loss_terminal`` (training, CleanRL's ``EpisodicLifeEnv``) a lost life ends the
episode as the learner sees it: ``terminated`` is true and the next stack starts afresh from the
same frame, while the game goes on. :attr:`AtariVecEnv.game_over` says which copies' games ended
in the last step: the returns a trainer reports are whole games'. Evaluation plays without it.

All of a step's host arrays go to the device as one copy from pinned memory. :meth:`step_async`
sends the actions and returns at once, so the game steps on the C++ threads while the caller
launches GPU work; :meth:`step_wait` collects the step.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import torch

from gper.envs.base import Step, VecEnv, canonical_device
from gper.envs.registry import EnvSpec, UnknownEnvironment

FRAME = (84, 84)
#: frames a stack holds by default (DQN's 4)
STACK = 4
_FRAME_BYTES = FRAME[0] * FRAME[1]


def _ale():
    try:
        import ale_py
        from ale_py.vector_env import AtariVectorEnv
    except ImportError as e:
        raise ImportError('atari:<Game> needs ale-py (which ships the ROMs): pip install ".[atari]"') from e
    return ale_py, AtariVectorEnv


def rom_name(game: str) -> str:
    """ale-py's ROM name of ``game``: ``Pong`` -> ``pong``, ``MsPacman`` -> ``ms_pacman`` (snake case stays)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", game).lower()


class AtariVecEnv(VecEnv):
    """``num_envs`` copies of an Atari game (see the module docstring).

    Args:
        game: the game, as Gymnasium names it (``Pong``, ``Breakout``, ``MsPacman``) or as ale-py
            does (``ms_pacman``).
        num_envs: copies stepped together.
        device: where stacks, rewards and flags are returned.
        seed: copy ``i`` is seeded ``seed + i`` at construction (and at ``reset(seed)``).
        frame_stack: frames a stack holds.
        life_loss_terminal: a lost life ends the learner's episode (training; see the module docstring).
        fire_after_life_loss: the step after a lost life plays FIRE, whatever the action sent
            (evaluation; games without FIRE are unchanged).
        threads: ale-py's C++ threads; 0: one per copy up to the machine's cores.
        repeat_action_probability: sticky actions (0: CleanRL's protocol; 0.25: Machado et al.'s).
        max_frames: frames after which an episode is truncated (108,000: 30 minutes of play).
    """

    graph_safe = False
    autoreset = "same-step"

    def __init__(
        self,
        game: str,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        *,
        frame_stack: int = STACK,
        life_loss_terminal: bool = True,
        fire_after_life_loss: bool = False,
        threads: int = 0,
        repeat_action_probability: float = 0.0,
        max_frames: int = 108_000,
    ) -> None:
        ale_py, vector_env = _ale()
        rom = rom_name(game)
        with warnings.catch_warnings():  # ale-py warns of an unknown ROM: the error below says it
            warnings.simplefilter("ignore", UserWarning)
            known = ale_py.roms.get_rom_path(rom) is not None
        if not known:
            raise UnknownEnvironment(f"atari:{game}")
        if not isinstance(frame_stack, int) or frame_stack < 1:
            raise ValueError(f"frame_stack must be an int >= 1, got {frame_stack!r}")
        self.name, self.num_envs, self.device = f"atari:{game}", num_envs, canonical_device(device)
        self.frame_stack, self.life_loss_terminal = frame_stack, bool(life_loss_terminal)
        #: FIRE's index in the game's actions, where it has one and fire_after_life_loss asks for it
        self.fire_action = _fire_action(ale_py, rom) if fire_after_life_loss else None
        self._env = vector_env(
            rom,
            num_envs,
            num_threads=threads,
            stack_num=1,
            reward_clipping=False,
            episodic_life=False,
            autoreset_mode="SameStep",
            repeat_action_probability=repeat_action_probability,
            max_num_frames_per_episode=max_frames,
        )
        self.n_actions = int(self._env.single_action_space.n)
        self.obs_shape = (frame_stack, *FRAME)
        self.obs_dim = frame_stack * _FRAME_BYTES
        cuda = self.device.type == "cuda"
        # one step's host arrays, packed: this step's frames, the final frames, the reward (float32
        # bytes), terminated, truncated, game over; one copy to the device a step
        n = num_envs
        self._layout = {"obs": 0, "final": n * _FRAME_BYTES, "reward": 2 * n * _FRAME_BYTES}
        self._layout |= {"flags": self._layout["reward"] + 4 * n}
        self._host = torch.empty(self._layout["flags"] + 3 * n, dtype=torch.uint8, pin_memory=cuda)
        self._dev = torch.empty_like(self._host, device=self.device)
        # the host buffer is written again only once its last copy to the device is done
        self._copied = torch.cuda.Event() if cuda else None
        self.game_over = torch.zeros(n, dtype=torch.bool, device=self.device)
        self._stack = torch.zeros(n, *self.obs_shape, dtype=torch.uint8, device=self.device)
        self._lives = np.zeros(n, dtype=np.int64)
        self._fire_next = np.zeros(n, dtype=bool)  # copies whose next step plays FIRE
        self._pending = False
        self.reset(seed)

    def _view(self, t: torch.Tensor, name: str) -> torch.Tensor:
        n, at = self.num_envs, self._layout[name]
        if name in ("obs", "final"):
            return t[at : at + n * _FRAME_BYTES].view(n, *FRAME)
        if name == "reward":
            return t[at : at + 4 * n].view(torch.float32)
        return t[at : at + 3 * n].view(3, n).view(torch.bool)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if self._pending:
            self._env.recv()
            self._pending = False
        obs, info = self._env.reset(seed=seed)
        self._lives = np.asarray(info["lives"], dtype=np.int64).copy()
        self._fire_next[:] = False
        if self._copied is not None:  # the last step's copy out of the host buffer is done
            self._copied.synchronize()
        self._view(self._host, "obs").numpy()[:] = obs[:, 0]
        frames = self._view(self._host, "obs").to(self.device)
        self._stack = torch.zeros_like(self._stack)  # a new tensor: stacks handed out stay as they were
        self._stack[:, -1] = frames
        self.game_over.zero_()
        return self._stack.clone()

    def step_async(self, actions: torch.Tensor) -> None:
        """Send ``actions`` ([N] int64, read to the host: the one synchronisation of a step) and return."""
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions must be [{self.num_envs}], got {list(actions.shape)}")
        if self._pending:
            raise RuntimeError("step_async(): the previous step's results were not collected (step_wait)")
        host = actions.detach().to("cpu", torch.int64).numpy()
        if self._fire_next.any():
            host = np.where(self._fire_next, self.fire_action, host)
        self._env.send(host)
        self._pending = True

    def step_wait(self) -> Step:
        """The step :meth:`step_async` sent (see the module docstring for what it holds)."""
        if not self._pending:
            raise RuntimeError("step_wait(): no step was sent (step_async)")
        obs, reward, terminated, truncated, info = self._env.recv()
        self._pending = False
        over = np.logical_or(terminated, truncated)
        lives = np.asarray(info["lives"], dtype=np.int64)
        # CleanRL's EpisodicLifeEnv: a life lost with lives left (the last one ends the game itself)
        died = (0 < lives) & (lives < self._lives) & ~over
        lost = died if self.life_loss_terminal else np.zeros_like(over)
        if self.fire_action is not None:
            self._fire_next = died
        self._lives = lives.copy()
        host = self._host
        if self._copied is not None:
            self._copied.synchronize()
        self._view(host, "obs").numpy()[:] = obs[:, 0]
        final = self._view(host, "final").numpy()
        final[:] = obs[:, 0]
        if over.any():
            final[over] = info["final_obs"][over, 0]
        self._view(host, "reward").numpy()[:] = reward
        flags = self._view(host, "flags").numpy()
        flags[0], flags[1], flags[2] = terminated | lost, truncated, over
        dev = self._dev
        dev.copy_(host, non_blocking=True)
        if self._copied is not None:
            self._copied.record(torch.cuda.current_stream(self.device))
        frames, last = self._view(dev, "obs"), self._view(dev, "final")
        term, trunc, game_over = self._view(dev, "flags")
        next_stack = torch.cat((self._stack[:, 1:], last[:, None]), dim=1)
        ended = (term | trunc)[:, None, None, None]
        fresh = torch.zeros_like(self._stack)
        fresh[:, -1] = frames
        self._stack = torch.where(ended, fresh, next_stack)
        self.game_over.copy_(game_over)
        return Step(next_stack, self._view(dev, "reward").clone(), term.clone(), trunc.clone(), self._stack)

    def step(self, actions: torch.Tensor) -> Step:
        self.step_async(actions)
        return self.step_wait()

    def close(self) -> None:
        self._env.close()


def _fire_action(ale_py: Any, rom: str) -> int | None:
    """FIRE's index in ``rom``'s minimal action set (the vector environment's actions), or None."""
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # before the first interface: no banner
    ale = ale_py.ALEInterface()
    ale.loadROM(ale_py.roms.get_rom_path(rom))
    actions = list(ale.getMinimalActionSet())
    return actions.index(ale_py.Action.FIRE) if ale_py.Action.FIRE in actions else None


def make_atari(game: str, num_envs: int, device: torch.device | str, seed: int = 0, **kwargs: Any) -> AtariVecEnv:
    """``atari:<Game>``: an :class:`AtariVecEnv` of ``game`` (``kwargs`` go to it)."""
    if not game:
        raise UnknownEnvironment("atari:")
    return AtariVecEnv(game, num_envs, device, seed=seed, **kwargs)


#: CleanRL's ``dqn_atari.py`` after 10M env steps: the mean of its training episodes' returns over
#: 3 seeds, and their spread (CleanRL's docs, ``docs/rl-algorithms/dqn.md``), by ROM name
CLEANRL_DQN_10M = {"beam_rider": (6673.24, 1434.37), "breakout": (366.928, 39.89), "pong": (20.25, 0.41)}


def _published(name: str) -> list[tuple[str, float, float]]:
    """CleanRL's published score of ``atari:<Game>`` as a band, where it has one."""
    score = CLEANRL_DQN_10M.get(rom_name(name.partition(":")[2]))
    if score is None:
        return []
    mean, spread = score
    return [(f"CleanRL dqn_atari.py after 10M env steps: {mean:g} ± {spread:g}", mean - spread, mean + spread)]


def _settings(run: Any, split: str) -> dict[str, Any]:
    # training loses an episode with each life (CleanRL's EpisodicLifeEnv); evaluation plays whole
    # games and fires after each lost life (CleanRL's FireResetEnv)
    return {"life_loss_terminal": split == "train", "fire_after_life_loss": split != "train"}


# The trainer's presets (gper.envs.registry.PRESETS): prioritized double DQN with 3-step returns
# (Rainbow's replay settings without its distributional head or noisy nets), CleanRL's network and
# schedule otherwise. IS weights are normalised by the batch's largest, as Dopamine's Rainbow does:
# over a million transitions the global largest made every weight about 1e-3 and, under Adam's
# epsilon of 1.5e-4, the updates nearly vanished (Pong at -19.5 after 2M steps,
# benchmarks/results/train-atari-pong-nvidia-h100-80gb-hbm3-20261206-013000.md). Adam's epsilon is
# torch's 1e-8, CleanRL's: Rainbow's 1.5e-4, which this preset had before, shrank Adam's steps on
# the small losses here (the 3136x512 layer's to 0.11, adam-eps-steps-20261206-055326.md), and
# with it three Pong seeds were at +2.6 / +10.7 / +5.5 after 2M env steps (…-pong-pop3-…-050300.md,
# whose target copies were every 250 training steps); with 1e-8 and copies every 1,000 the same
# seeds were at +19.8 / +20.0 / +19.8 (…-pong-pop3-nvidia-h200-20261206-065400.md; the run with
# copies every 1,000 and 1.5e-4, …-032500.md, was behind it at every common step).
# The target is copied every 1,000 training steps (8,000 env steps): the three seeds' mean with
# 1,000 (…-032500.md) was ahead of that run's with 250 at every common step from 180,000 on. The
# CPU's are for a smoke run only.
# fmt: off
SPEC = EnvSpec(
    "atari:<Game>",
    make_atari,
    help="an Atari game on ale-py (Pong, Breakout, ...), 84x84 frames stacked by 4",
    graph_safe_rng=False,
    settings=_settings,
    eval_split="test",
    published=_published,
    presets={
        "cuda": dict(
            total_steps=2_000_000, num_envs=8, hidden=(512,), n_step=3, buffer_size=1_000_000, batch_size=64,
            learning_rate=1e-4, adam_eps=1e-8, max_grad_norm=10.0, tau=1.0, target_every=1_000, eps_end=0.01,
            exploration_fraction=0.1, learning_starts=20_000, epoch_steps=20_000, solve_return=None,
            weight_norm="batch",
        ),
        "cpu": dict(total_steps=20_000, num_envs=4, buffer_size=20_000, learning_starts=2_000, epoch_steps=2_000),
    },
)
# fmt: on
