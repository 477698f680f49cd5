"""``gper bench trainers`` on the CPU, without JAX: the 475 step against a plain-Python oracle, the
table and files, the skip path, the settings copied from PureJaxRL, and the vendored file's patches.

No timing is checked, and nothing here trains (the gper rows are built, not run).
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import gper
from gper.bench import command
from gper.bench.commands import trainers as trainers_cmd
from gper.bench.trainers import gper_run, purejaxrl_run, run, table
from gper.bench.trainers.solve import first_solve_step, solve_steps, time_to_solve_estimate
from gper.dqn import Config, resolve

TRAINERS = Path(run.__file__).parent


def oracle_solve_step(done, returns, timesteps, goal=475.0, window=100):
    """Plain Python, as gper.training.report counts it: episodes in the order they finished (env order
    within a step), the first full window of ``window`` whose mean reaches ``goal``."""
    finished = []
    for t in range(len(done)):
        for e in range(len(done[t])):
            if done[t][e]:
                finished.append((float(returns[t][e]), int(timesteps[t])))
    for k in range(window, len(finished) + 1):
        if sum(r for r, _ in finished[k - window : k]) / window >= goal:
            return finished[k - 1][1]
    return None


def synthetic(rng, steps=3000, envs=10, p_done=0.1):
    """Episode ends at random; returns climbing from about 300 to 500 (integers, as CartPole's)."""
    done = rng.random((steps, envs)) < p_done
    trend = np.linspace(300, 520, steps)[:, None]
    returns = np.clip(np.round(trend + rng.normal(0, 40, (steps, envs))), 1, 500).astype(np.float32)
    returns[~done] = rng.integers(0, 500, int((~done).sum()))  # garbage where no episode ended: must be ignored
    timesteps = (np.arange(steps) + 1) * envs
    return done, returns, timesteps


@pytest.mark.parametrize("seed", range(6))
def test_first_solve_step_matches_oracle(seed):
    rng = np.random.default_rng(seed)
    done, returns, timesteps = synthetic(rng, p_done=rng.uniform(0.02, 0.2))
    got = first_solve_step(done, returns, timesteps)
    assert got == oracle_solve_step(done.tolist(), returns.tolist(), timesteps.tolist())


def test_solve_edge_cases():
    t = np.arange(1, 11) * 2
    done = np.zeros((10, 2), bool)
    rets = np.full((10, 2), 500.0, np.float32)
    assert first_solve_step(done, rets, t) is None  # no episode
    done[:] = True  # 20 episodes: fewer than a window
    assert first_solve_step(done, rets, t) is None
    assert first_solve_step(done, rets, t, window=5) == 6  # the 5th episode: step 3, env 0 -> timesteps[2]
    rets[:] = 475.0  # exactly the goal counts as reached
    assert first_solve_step(done, rets, t, window=20) == 20
    rets[-1, -1] = 474.0
    assert first_solve_step(done, rets, t, window=20) is None
    with pytest.raises(ValueError, match="expected done"):
        first_solve_step(done, rets, t[:-1])


def test_solve_steps_per_seed_and_estimate():
    rng = np.random.default_rng(7)
    seeds = [synthetic(rng, steps=1500) for _ in range(3)]
    done, rets, ts = (np.stack(x) for x in zip(*seeds, strict=True))
    want = [oracle_solve_step(d.tolist(), r.tolist(), t.tolist()) for d, r, t in seeds]
    assert solve_steps(done, rets, ts) == want
    assert time_to_solve_estimate(50.0, 100_000, 500_000) == pytest.approx(10.0)
    assert time_to_solve_estimate(50.0, None, 500_000) is None
    with pytest.raises(ValueError, match="expected done"):
        solve_steps(done[0], rets[0], ts[0])


PJX_ROW = {
    "trainer": "PureJaxRL",
    "settings": "its CartPole-v1 defaults",
    "seeds": 4,
    "compile_s": 12.34,
    "run_s": 40.0,
    "total_env_steps": 500_000,
    "env_steps_per_s": 50_000.0,
    "solve_steps": [100_000, None, 140_000, 120_000],
    "reached": 3,
    "median_solve_step": 120_000,
    "median_time_to_goal_est_s": 9.6,
    "device": "NVIDIA H200",
}
GPER_ROW = {
    "trainer": "gper",
    "settings": "cartpole preset",
    "seeds": 1,
    "setup_s": 1.5,
    "run_s": 30.0,
    "total_env_steps": 300_000,
    "env_steps_per_s": 10_000.0,
    "solve_steps": [176_132],
    "reached": 1,
    "median_solve_step": 176_132,
    "time_to_goal_s": 21.3,
    "device": "cuda:0",
}
FAILED_ROW = {"trainer": "gper", "settings": "cartpole preset", "seeds": 16, "status": "error: RuntimeError: boom"}


def test_table_rows_and_files(tmp_path):
    assert table.table_row(PJX_ROW) == [
        *("PureJaxRL", "its CartPole-v1 defaults", "4", "12.3", "40.0", "50,000", "3/4", "120,000", "~9.6"),
        table.EST_NOTE,
    ]
    assert table.table_row(GPER_ROW)[6:9] == ["1/1", "176,132", "21.3"]
    assert table.table_row(FAILED_ROW)[3:] == ["-"] * 6 + [FAILED_ROW["status"]]
    assert len(table.HEADERS) == len(table.RIGHT) == len(table.table_row(PJX_ROW))

    c = table.csv_row(PJX_ROW)
    assert set(c) == set(table.CSV_COLUMNS)
    assert (c["solve_steps"], c["time_to_goal_is_estimate"], c["status"]) == ("100000 - 140000 120000", True, "ok")
    assert table.csv_row(GPER_ROW)["time_to_goal_is_estimate"] is False
    assert table.csv_row(FAILED_ROW)["status"] == FAILED_ROW["status"]

    md = table.markdown("HEADER", ["jax 0.0"], [PJX_ROW, GPER_ROW, FAILED_ROW], ["a note"])
    assert md.startswith("# gper bench trainers\n\nHEADER\n")
    assert "| trainer | settings | seeds |" in md and "| PureJaxRL | its CartPole-v1 defaults | 4 |" in md
    assert "- jax 0.0" in md and md.rstrip().endswith("- a note")
    assert table.seed_spread(PJX_ROW["solve_steps"]) == "100,000..140,000 (median 120,000)"
    assert table.seed_spread([None]) == "none"


def hide_jax(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name, *a))


def test_status_and_rows_skip_without_jax(monkeypatch):
    hide_jax(monkeypatch)
    ok, text = purejaxrl_run.status()
    assert not ok and text.startswith("jax") and "not installed" in text and "gymnax" in text
    rows, versions = run.purejaxrl_rows(run.TrainersBenchConfig(seeds=(1, 16)))
    assert versions == text
    assert [(r["trainer"], r["seeds"], r["status"]) for r in rows] == [
        ("PureJaxRL", n, f"skipped: {text}") for n in (1, 16)
    ]


def test_bench_run_skipped_writes_table(monkeypatch, tmp_path, capsys):
    hide_jax(monkeypatch)
    argv = ["trainers", "--trainers", "purejaxrl", "--seeds", "1", "64", "--device", "cpu", "--out", str(tmp_path)]
    assert command.main(argv) == 0  # a skipped trainer is no failure
    out = capsys.readouterr().out
    assert f"gper {gper.__version__} bench trainers | CPU" in out
    assert out.count("skipped: jax") == 2
    (csv_path,) = tmp_path.glob("trainers-cpu-*.csv")
    (md_path,) = tmp_path.glob("trainers-cpu-*.md")
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["trainer"], r["seeds"], r["status"].split(":")[0]) for r in rows] == [
        ("PureJaxRL", "1", "skipped"),
        ("PureJaxRL", "64", "skipped"),
    ]
    assert "PureJaxRL (vendored dqn.py): jax" in md_path.read_text()


def test_cli_flags():
    args = command.build_parser().parse_args(["trainers", "--seeds", "1", "16", "--total-steps", "5000"])
    cfg = trainers_cmd.trainers_config(args)
    assert (cfg.seeds, cfg.total_steps, cfg.trainers) == ((1, 16), 5000, ("purejaxrl", "gper"))
    default = trainers_cmd.trainers_config(command.build_parser().parse_args(["trainers"]))
    assert default.seeds == (1, 16, 64, 256) and default.total_steps is None and default.preset_seeds is None
    fewer = command.build_parser().parse_args(["trainers", "--seeds", "1", "16", "--preset-seeds", "1"])
    assert trainers_cmd.trainers_config(fewer).preset_seeds == (1,)
    with pytest.raises(SystemExit, match="--seeds must be >= 1"):
        trainers_cmd.trainers_config(command.build_parser().parse_args(["trainers", "--seeds", "0"]))
    with pytest.raises(SystemExit, match="--preset-seeds must be >= 1"):
        trainers_cmd.trainers_config(command.build_parser().parse_args(["trainers", "--preset-seeds", "0"]))


def test_the_preset_rows_run_at_their_own_seed_counts(monkeypatch):
    ran = []
    monkeypatch.setattr(gper_run, "run_gper", lambda fields, n, log: ran.append(n) or {"seeds": n})
    rows = run.gper_rows(run.TrainersBenchConfig(seeds=(1, 16, 64), preset_seeds=(1,), device="cpu"))
    assert [(r["settings"], r["seeds"]) for r in rows] == [
        ("cartpole preset", 1), ("PureJaxRL's settings", 1), ("PureJaxRL's settings", 16), ("PureJaxRL's settings", 64)
    ]  # fmt: skip
    assert ran == [1, 1, 16, 64]


def test_purejaxrl_config_read_from_the_file():
    cfg = purejaxrl_run.default_config()
    assert cfg["ENV_NAME"] == "CartPole-v1"
    want = dict(NUM_ENVS=10, BUFFER_SIZE=10000, BUFFER_BATCH_SIZE=128, TOTAL_TIMESTEPS=5e5, TRAINING_INTERVAL=10)
    assert {k: cfg[k] for k in want} == want
    assert (cfg["TARGET_UPDATE_INTERVAL"], cfg["LEARNING_STARTS"], cfg["TAU"]) == (500, 10000, 1.0)
    assert purejaxrl_run.total_env_steps(cfg) == 500_000


def test_gper_at_purejaxrl_settings():
    fields = gper_run.purejaxrl_settings(purejaxrl_run.default_config())
    want = dict(num_envs=10, hidden=(120, 84), batch_size=128, buffer_size=10000, sampling="uniform")
    want |= dict(train_every=1, target_every=50, tau=1.0, total_steps=500_000, learning_starts=10000)
    want |= dict(exploration_fraction=0.5, eps_end=0.05, learning_rate=2.5e-4, double_q=False, max_grad_norm=0.0)
    want |= dict(loss="mse")  # jnp.mean((chosen_action_qvals - target) ** 2)
    assert {k: fields[k] for k in want} == want
    preset, pjx = gper_run.gper_configs(purejaxrl_run.default_config(), "cpu")
    # both are settings gper accepts: every field resolves and passes its checks
    for f in (preset, pjx):
        resolve(Config(**f), torch.device("cpu"))
    assert preset["env"] == "cartpole" and "num_envs" not in preset and preset["eval_every"] == 0
    assert gper_run.gper_configs(purejaxrl_run.default_config(), "cpu", 2000)[1]["total_steps"] == 2000
    with pytest.raises(ValueError, match="not a multiple"):
        gper_run.purejaxrl_settings({**purejaxrl_run.default_config(), "TRAINING_INTERVAL": 15})


def test_gper_more_seeds_train_as_one_population():
    fields = gper_run.gper_configs(purejaxrl_run.default_config(), "cpu", 600)[0]
    small = {**fields, "learning_starts": 64, "batch_size": 32, "hidden": (16,)}
    row = gper_run.run_gper(small, 3, log=lambda *a: None)
    assert row["seeds"] == 3 and len(row["solve_steps"]) == 3
    assert row["total_env_steps"] == 3 * 600 and row["env_steps_per_s"] > 0 and row["run_s"] > 0
    assert row["reached"] == sum(s is not None for s in row["solve_steps"])  # no CartPole agent solves in 600 steps
    assert row["reached"] == 0 and row["median_solve_step"] is None and row["all_at_goal_s"] is None
    c = table.csv_row({"trainer": "gper", "settings": "cartpole preset", **row})
    assert c["solve_steps"] == "- - -" and c["status"] == "ok"


def test_vendored_file_has_its_patches():
    text = (TRAINERS / "purejaxrl_dqn.py").read_text()
    code = [line.split("#")[0] for line in text.splitlines()]
    assert not any("wandb" in line for line in code)  # PATCH 1/3
    assert "jax.tree_map(" not in text and "jax.tree_util.tree_map(" in text  # PATCH 2/3
    assert text.count("terminated, truncated, info = vmap_step") == 1  # PATCH 3/3
    assert "_terminated, _truncated, _ = env.step(" in text
    for mark in ("PATCH 1/3", "PATCH 2/3", "PATCH 3/3", "gper (metrics)", "gper (config)"):
        assert mark in text
    assert '"returned_episode": info["returned_episode"]' in text
    assert "Copyright 2023 Chris Lu" in text and "Apache License" in (TRAINERS / "LICENSE-purejaxrl").read_text()
    assert "jax.jit(jax.vmap(make_train(config)))" in text  # how PureJaxRL's script runs seeds, as the bench does
