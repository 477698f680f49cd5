"""The greedy policy's periodic evaluation: when it runs, what it writes, on which environment, and
that training computes the same with it on or off."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gper.dqn import Config, build_env, resolve, train
from gper.training.evaluation import Evaluator, due, eval_seed
from gper.training.runlog import read_metrics
from helpers import assert_same_training, computed_records

pytestmark = pytest.mark.usefixtures("one_thread")
QUIET = dict(log=lambda _: None)
CPU = torch.device("cpu")


def _evals(folder) -> list[dict]:
    return [r for r in read_metrics(folder / "metrics.jsonl") if "eval/mean_return" in r]


def test_training_computes_the_same_with_evaluation_on_or_off(smoke, tmp_path):
    """An evaluation after every epoch changes nothing of the training: the same networks, optimizer,
    replay and episodes, and the same records but the evaluations'."""
    run = dict(smoke, total_steps=1000, run_dir=str(tmp_path))
    train(Config(**run, eval_every=1, run_name="on"), **QUIET)
    train(Config(**run, eval_every=0, run_name="off"), **QUIET)
    assert_same_training(tmp_path / "on", tmp_path / "off")
    on = [r for r in computed_records(tmp_path / "on") if not any(k.startswith("eval/") for k in r)]
    assert on == computed_records(tmp_path / "off")
    evals = _evals(tmp_path / "on")
    assert [r["global_step"] for r in evals] == [200, 400, 600, 800, 1000] and not _evals(tmp_path / "off")
    assert {k for r in evals for k in r} == {
        "global_step",
        "eval/mean_return",
        "eval/std_return",
        "eval/min_return",
        "eval/max_return",
        "eval/mean_length",
        "eval/episodes",
        "eval/seconds",
    }
    assert all(r["eval/episodes"] == 10 and r["eval/min_return"] <= r["eval/mean_return"] for r in evals)


@pytest.mark.gpu
@pytest.mark.parametrize("env", ["cartpole", "market"])
def test_on_cuda_evaluation_leaves_the_captured_steps_and_the_training_unchanged(smoke, tmp_path, env):
    """On CUDA the evaluation runs eagerly between epochs, on an environment of its own, while
    collection and learning replay their CUDA graphs: both runs train the same, bit for bit."""
    run = dict(smoke, device="cuda", cuda_graphs=True, total_steps=1000, run_dir=str(tmp_path), env=env, num_envs=4)
    if env == "market":
        run.update(episode_len=32, hidden=(32,), bars=5000, test_bars=1000)
    on = train(Config(**run, eval_every=1, run_name="on"), **QUIET)
    train(Config(**run, eval_every=0, run_name="off"), **QUIET)
    assert on.device.startswith("cuda") and on.eval_at_step == 1000
    assert_same_training(tmp_path / "on", tmp_path / "off")
    assert [r["global_step"] for r in _evals(tmp_path / "on")] == [200, 400, 600, 800, 1000]


def test_evaluations_come_every_eval_every_epochs_and_after_the_last():
    cfg = Config(eval_every=3)
    assert [e for e in range(1, 11) if due(cfg, e, last=e == 10)] == [3, 6, 9, 10]
    assert not any(due(Config(eval_every=0), e, last=True) for e in range(1, 4))


def test_an_evaluation_depends_on_the_policy_and_the_run_seed_only(smoke):
    """Every evaluation replays the same start states: the same network scores the same, whatever
    ran before; its seed is not the training environment's."""
    cfg = resolve(Config(**smoke, eval_episodes=4), CPU)
    evaluator = Evaluator(cfg, CPU)
    net = torch.nn.Linear(4, 2)
    policy = lambda obs: net(obs).argmax(dim=1)  # noqa: E731
    first = evaluator.run(policy)
    second = evaluator.run(policy)
    assert {k: v for k, v in first.items() if k != "eval/seconds"} == {
        k: v for k, v in second.items() if k != "eval/seconds"
    }
    assert first["eval/episodes"] == 4 and evaluator.env.num_envs == 4
    assert eval_seed(cfg.seed) not in (cfg.seed, eval_seed(cfg.seed + 1))


def test_the_market_is_evaluated_on_its_held_out_prices(smoke, tmp_path):
    market = dict(env="market", num_envs=4, episode_len=32, hidden=(32,), bars=5000, test_bars=1000)
    cfg = resolve(Config(**{**smoke, **market}, eval_episodes=3), CPU)
    evaluator = Evaluator(cfg, CPU)
    test = build_env(dataclasses.replace(cfg, num_envs=1), CPU, split="test")
    assert torch.equal(evaluator.env.prices, test.prices) and len(test.prices) == 1000
    results = train(Config(**{**smoke, **market}, eval_every=1, run_dir=str(tmp_path), run_name="m"), **QUIET)
    evals = _evals(tmp_path / "m")
    assert [r["global_step"] for r in evals] == [200, 400, 600]
    assert all(r["eval/mean_length"] == 32 for r in evals)  # whole episodes of episode_len bars
    assert results.eval_mean_return == evals[-1]["eval/mean_return"] and results.evaluation is not None


def test_a_gymnasium_env_is_evaluated_and_takes_its_registered_threshold(smoke, tmp_path):
    pytest.importorskip("gymnasium")
    results = train(
        Config(**{**smoke, "env": "gym:CartPole-v1"}, eval_every=2, run_dir=str(tmp_path), run_name="g"), **QUIET
    )
    assert [r["global_step"] for r in _evals(tmp_path / "g")] == [400, 600]
    assert results.eval_at_step == 600 and results.best_eval_mean_return >= results.eval_mean_return
    import json

    assert json.loads((tmp_path / "g" / "config.json").read_text())["solve_return"] == 475.0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(eval_every=-1), "eval_every must be an integer >= 0 (0: no evaluation), got -1"),
        (dict(eval_episodes=0), "eval_episodes must be an integer >= 1, got 0"),
        (dict(eval_every=2.5), "eval_every must be an integer, got 2.5"),
    ],
)
def test_bad_evaluation_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        resolve(Config(**settings), CPU)
