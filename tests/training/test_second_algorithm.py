"""The trainer core's seam: a second algorithm, a linear Q-learner in about 100 lines, trained by
the same core as DQN, with checkpoints, a resume that computes what the uninterrupted run does,
the report, evaluations, and the core's refusals."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import gper
from gper.dqn import DQN
from gper.envs import make_env
from gper.training import AlgorithmSpec, RunConfig, train
from gper.training.environment import pick_device
from gper.training.episodes import EpisodeTracker
from gper.training.runlog import read_metrics

# ---- the algorithm: everything a new algorithm writes (settings, learner, registration)


@dataclasses.dataclass
class LinearQConfig(RunConfig):
    learning_rate: float = 0.01
    gamma: float = 0.99
    epsilon: float = 0.2
    batch_size: int = 32
    buffer_size: int = 4096


class LinearQ:
    """Q(s, a) = w[a] . [s, 1]; one semi-gradient step a batch of prioritized transitions."""

    def __init__(self, cfg: LinearQConfig, env) -> None:
        self.cfg, self.env, self.device, self.lr = cfg, env, env.device, cfg.learning_rate
        self.w = torch.zeros(env.n_actions, env.obs_dim + 1, device=self.device)
        d = env.obs_dim
        spec = {
            "obs": ((d,), torch.float32),
            "next_obs": ((d,), torch.float32),
            "action": ((), torch.int64),
            "reward": ((), torch.float32),
            "done": ((), torch.float32),
        }
        self.rb = gper.PrioritizedReplayBuffer(cfg.buffer_size, spec, device=self.device, seed=cfg.seed)
        self.episodes = EpisodeTracker(env.num_envs, self.device, autoreset=env.autoreset)
        self.sums = torch.zeros(2, dtype=torch.float64, device=self.device)  # TD error², Q
        self.updates = torch.zeros((), dtype=torch.int64, device=self.device)  # read back once an epoch
        self.env_steps = torch.zeros((), dtype=torch.float64, device=self.device)
        self.obs = env.reset(seed=cfg.seed)

    def q(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.cat([obs, torch.ones_like(obs[:, :1])], dim=1) @ self.w.T

    def collect_step(self, timer) -> None:
        n = self.env.num_envs
        explore = torch.rand(n, device=self.device) < self.cfg.epsilon  # torch's generator: checkpointed
        random_action = torch.randint(0, self.env.n_actions, (n,), device=self.device)
        action = torch.where(explore, random_action, self.greedy(self.obs))
        step = self.env.step(action)
        row = {"obs": self.obs, "next_obs": step.next_obs, "action": action, "reward": step.reward}
        self.rb.add(row | {"done": step.terminated.float()})
        self.env_steps += n
        self.episodes.record(step.reward.double(), step.terminated | step.truncated, self.env_steps)
        self.obs = step.obs

    def learn_step(self, train_step: int, timer) -> None:
        batch = self.rb.sample(self.cfg.batch_size, beta=0.4)
        x = torch.cat([batch["obs"], torch.ones_like(batch["obs"][:, :1])], dim=1)
        q = (x @ self.w.T).gather(1, batch["action"][:, None])[:, 0]
        target = batch["reward"] + self.cfg.gamma * (1 - batch["done"]) * self.q(batch["next_obs"]).max(1).values
        td = target - q
        step = (self.lr * batch.weights * td)[:, None] * x / self.cfg.batch_size
        self.w.index_add_(0, batch["action"], step)
        self.rb.update_priorities(batch, td)
        self.sums += torch.stack([(td**2).mean(), q.mean()]).double()
        self.updates += 1

    def device_values(self) -> dict[str, torch.Tensor]:
        return {"updates": self.updates}

    def after_sync(self) -> None:
        pass

    def charts(self, host, env_step: int) -> dict[str, float]:
        return {"charts/epsilon": self.cfg.epsilon, "charts/updates": float(host["updates"])}

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs).argmax(dim=1)

    def state_dict(self, *, replay: bool) -> dict:
        state = {"w": self.w, "sums": self.sums, "updates": self.updates, "env_steps": self.env_steps, "obs": self.obs}
        return state | {"episodes": self.episodes.state_dict(), "env": self.env.state_dict()}

    def load_state_dict(self, state: dict, *, replay: bool) -> None:
        for name in ("w", "sums", "updates", "env_steps", "obs"):
            getattr(self, name).copy_(state[name])
        self.episodes.load_state_dict(state["episodes"])
        self.env.load_state_dict(state["env"])

    def honour_settings(self) -> None:
        self.lr = self.cfg.learning_rate  # a resumed run's own learning rate


def setup(cfg: LinearQConfig, log, launch):  # the core seeded torch with cfg.seed
    return cfg, LinearQ(cfg, make_env(cfg.env, cfg.num_envs, pick_device(cfg.device), seed=cfg.seed)), []


LINEAR_Q = AlgorithmSpec(
    "linear-q", LinearQConfig, setup, {0: "losses/td_loss", 1: "losses/q_values"}, honoured=("learning_rate",)
)

# ---- the tests


def _config(tmp_path, **changes) -> LinearQConfig:
    return LinearQConfig(**dict(run_dir=str(tmp_path), total_steps=2400, keep_checkpoints=10, eval_every=2) | changes)


def _final_weights(folder) -> torch.Tensor:
    [last] = sorted((folder / "checkpoints").glob("step-*"))[-1:]
    return torch.load(last / "trainer.pt", weights_only=True)["agent"]["w"]


def test_a_second_algorithm_trains_reports_and_resumes_through_the_core(tmp_path):
    results = train(LINEAR_Q, _config(tmp_path, run_name="whole"), log=lambda _: None)
    whole = tmp_path / "whole"
    assert results.env_steps == 2400 and results.train_steps == (2400 - 1000) // 8 and results.episodes > 0
    steps = sorted(int(p.name.removeprefix("step-")) for p in (whole / "checkpoints").glob("step-*"))
    assert steps == [2000, 2400]  # every epoch of 2000 env steps and the end
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["env_steps"] == 2400 and summary["eval_at_step"] == 2400
    rows = read_metrics(whole / "metrics.jsonl")
    epochs = [r for r in rows if "charts/SPS" in r]
    assert [r["global_step"] for r in epochs] == [2000, 2400]
    assert all(r["losses/td_loss"] >= 0 and r["charts/epsilon"] == 0.2 for r in epochs)
    assert [r["global_step"] for r in rows if "eval/mean_return" in r] == [2400]
    assert json.loads((whole / "config.json").read_text())["learning_rate"] == 0.01

    # resumed from the checkpoint of the first epoch, in a folder of its own: the same weights
    first = whole / "checkpoints" / "step-000000002000"
    resumed = train(LINEAR_Q, _config(tmp_path, run_name="resumed", resume=str(first)), log=lambda _: None)
    assert resumed.env_steps == 2400 and resumed.episodes == results.episodes
    assert torch.equal(_final_weights(tmp_path / "resumed"), _final_weights(whole))
    assert not torch.equal(_final_weights(whole), torch.zeros_like(_final_weights(whole)))
    # the record goes on as the uninterrupted run's: every metric but the clock's
    assert _untimed(read_metrics(tmp_path / "resumed" / "metrics.jsonl")) == _untimed(rows)
    again = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    for key in ("episodes", "mean_return_last100", "best_mean_return_last100", "eval_mean_return", "eval_at_step"):
        assert again[key] == summary[key], key
    assert [r["charts/updates"] for r in epochs] == [(2000 - 1000) // 8, 175]  # device values read back

    # a resumed run takes its own learning rate (honoured): the weights then differ
    faster = _config(tmp_path, run_name="faster", resume=str(first), learning_rate=0.05)
    train(LINEAR_Q, faster, log=lambda _: None)
    assert not torch.equal(_final_weights(tmp_path / "faster"), _final_weights(whole))


def _untimed(rows: list[dict]) -> list[dict]:
    clock = ("charts/SPS", "charts/train_steps_per_s", "eval/seconds")
    return [{k: v for k, v in r.items() if k not in clock and not k.startswith("timing/")} for r in rows]


def test_the_core_refuses_another_algorithms_checkpoint_and_changed_settings(tmp_path):
    train(LINEAR_Q, _config(tmp_path, run_name="a", total_steps=2000), log=lambda _: None)
    folder = str(tmp_path / "a")
    with pytest.raises(ValueError, match="gamma 0.9 \\(checkpoint: 0.99\\)"):
        train(LINEAR_Q, _config(tmp_path, resume=folder, gamma=0.9), log=lambda _: None)
    dqn = gper.dqn.Config(resume=folder, total_steps=2000, device="cpu", run_dir=str(tmp_path), progress=False)
    with pytest.raises(ValueError, match="it is a checkpoint of linear-q"):
        train(DQN, dqn, log=lambda _: None)


def test_the_core_refuses_what_it_cannot_run_in_one_line(tmp_path):
    @dataclasses.dataclass
    class Thin:
        env: str = "cartpole"

    with pytest.raises(TypeError, match="lack the run settings num_envs, seed"):
        AlgorithmSpec("thin", Thin, setup)
    with pytest.raises(ValueError, match="train_every must be an integer >= 1, got 0"):
        train(LINEAR_Q, _config(tmp_path, train_every=0), log=lambda _: None)
    with pytest.raises(ValueError, match="market reads the setting 'data', which LinearQConfig lacks"):
        train(LINEAR_Q, _config(tmp_path, env="market"), log=lambda _: None)
    with pytest.raises(ValueError, match="linear-q does not train data-parallel"):
        train(LINEAR_Q, _config(tmp_path, distributed="local"), log=lambda _: None)

    class Partial(LinearQ):
        honour_settings = None  # not a method: the learner lacks it

    def partial_setup(cfg, log, launch):
        return cfg, Partial(cfg, make_env(cfg.env, cfg.num_envs, pick_device(cfg.device), seed=cfg.seed)), []

    with pytest.raises(TypeError, match="its learner Partial lacks honour_settings"):
        train(AlgorithmSpec("partial", LinearQConfig, partial_setup), _config(tmp_path), log=lambda _: None)
