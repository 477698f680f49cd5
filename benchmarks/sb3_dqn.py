"""Stable-Baselines3's DQN on its own ReplayBuffer against PrioritizedDQN on gper's buffer.

Two tables, printed under one header line and written to
``benchmarks/results/sb3-<device>-<stamp>.{md,csv}`` (``--out`` elsewhere):

* **runs**: each (variant, seed) trains in its own process, in parallel: wall seconds, env steps
  per second, the mean return of the last 100 training episodes (``model.ep_info_buffer``) and
  of ``--eval-episodes`` greedy episodes (``evaluate_policy``). ``sb3`` is ``DQN`` with SB3's
  buffer; ``gper`` is ``PrioritizedDQN`` (alpha 0.6, beta 0.4 annealed to 1) with the same
  hyperparameters (RL Zoo's CartPole-v1 DQN, for every ``--env``).
* **replay**: one call of SB3's ``ReplayBuffer.sample`` against the adapter's ``sample`` and
  ``sample`` + ``update_priorities``, full buffers of ``--capacity`` transitions of the env's
  spaces, on ``--device``; CUDA events around back-to-back calls (``perf_counter`` on the CPU),
  the median of ``--repeats`` repeats. SB3's sample includes its host-to-device copies.

    python benchmarks/sb3_dqn.py                      # the H200 run: 3 seeds x 2 variants, 50k steps
    python benchmarks/sb3_dqn.py --quick --device cpu  # a smoke run (do not commit its files)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from gper.bench.report import DEFAULT_OUT, ResultFiles, environment, format_markdown, header_line, print_table

#: RL Zoo's tuned DQN for CartPole-v1 (rl-baselines3-zoo, hyperparams/dqn.yml)
HYPERPARAMS = dict(
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=256,
    gradient_steps=128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    policy_kwargs=dict(net_arch=[256, 256]),
)
VARIANTS = ("sb3", "gper")
COLUMNS = [
    "table",
    "variant",
    "seed",
    "env",
    "status",
    "env_steps",
    "wall_s",
    "steps_per_s",
    "final_mean100",
    "episodes",
    "eval_mean",
    "eval_std",
    "op",
    "capacity",
    "batch",
    "us_per_call",
    "us_min",
    "us_max",
]


# ---------------------------------------------------------------------------- one run (a worker process)


def train_one(job: dict) -> dict:
    """Train one variant for one seed; the row of the runs table."""
    import numpy as np
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    from gper.integrations.sb3 import PrioritizedDQN

    class Deadline(BaseCallback):
        def __init__(self, seconds: float) -> None:
            super().__init__()
            self.end = time.perf_counter() + seconds

        def _on_step(self) -> bool:
            return time.perf_counter() < self.end

    torch.set_num_threads(job["threads"])
    cls = PrioritizedDQN if job["variant"] == "gper" else DQN
    params = dict(HYPERPARAMS, buffer_size=min(HYPERPARAMS["buffer_size"], job["steps"]))
    if job["quick"]:
        params |= dict(learning_starts=200, train_freq=64, gradient_steps=32, policy_kwargs=dict(net_arch=[64, 64]))
    model = cls("MlpPolicy", job["env"], seed=job["seed"], device=job["device"], **params)
    t0 = time.perf_counter()
    model.learn(job["steps"], callback=Deadline(job["max_seconds"]))
    if job["device"].startswith("cuda"):
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    returns = [ep["r"] for ep in model.ep_info_buffer]
    eval_env = make_vec_env(job["env"], n_envs=1, seed=job["seed"] + 10_000)  # episodes training never saw
    eval_mean, eval_std = evaluate_policy(model, eval_env, n_eval_episodes=job["eval_episodes"], deterministic=True)
    steps = model.num_timesteps
    return {
        "table": "runs",
        "variant": job["variant"],
        "seed": job["seed"],
        "env": job["env"],
        "status": "ok" if steps >= job["steps"] else f"stopped at {job['max_seconds']:.0f} s",
        "env_steps": steps,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "final_mean100": float(np.mean(returns)) if returns else None,
        "episodes": model._episode_num,
        "eval_mean": float(eval_mean),
        "eval_std": float(eval_std),
    }


def run_worker(job: dict) -> dict:
    """``train_one`` in a fresh process (its own CUDA context, no shared RNG or allocator)."""
    cmd = [sys.executable, __file__, "--worker", json.dumps(job)]
    env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = " / ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])[:300]
        return {
            "table": "runs",
            "variant": job["variant"],
            "seed": job["seed"],
            "env": job["env"],
            "status": f"error: {tail}",
        }
    row = json.loads(lines[-1][len("RESULT ") :])
    print(f"  {row['variant']} seed {row['seed']}: {row['steps_per_s']:.0f} steps/s, eval {row['eval_mean']:.1f}")
    return row


# ---------------------------------------------------------------------------- the replay table


def _timer(device: torch.device):
    """``time(fn, n)``: seconds per call of ``n`` back-to-back calls (CUDA events on a GPU)."""

    def time_calls(fn, n: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / n
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    return time_calls


def replay_rows(env_id: str, device: torch.device, capacity: int, batches: list[int], repeats: int) -> list[dict]:
    """SB3's ReplayBuffer.sample vs the adapter's sample (+ update) on full buffers of ``capacity``."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.buffers import ReplayBuffer

    from gper.integrations.sb3 import PrioritizedReplayBuffer

    env = gym.make(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    # filled n_envs transitions per add: 1000 adds of 1000 envs make 10^6 transitions
    n_envs = 1000 if capacity % 1000 == 0 else 1
    steps = capacity // n_envs
    theirs = ReplayBuffer(capacity, obs_space, act_space, device, n_envs)
    ours = PrioritizedReplayBuffer(capacity, obs_space, act_space, device, n_envs, seed=0)
    rng = np.random.default_rng(0)
    obs_space.seed(0)
    act_space.seed(0)
    # one pool of n_envs observations and actions, rolled each add: the values do not change the timings
    obs_pool = np.stack([obs_space.sample() for _ in range(n_envs)])
    action_pool = np.stack([act_space.sample() for _ in range(n_envs)])
    for i in range(steps):
        obs, action = np.roll(obs_pool, i, axis=0), np.roll(action_pool, i, axis=0)
        reward, done = rng.standard_normal(n_envs), rng.random(n_envs) < 0.05
        for rb in (theirs, ours):
            rb.add(obs, obs, action, reward, done, [{}] * n_envs)
    # priorities far from uniform, as after training
    ours.update_priorities(torch.arange(capacity, device=ours.device), torch.rand(capacity, device=ours.device) * 10)
    time_calls = _timer(device)
    rows = []
    for b in batches:
        td = torch.rand(b, device=ours.device)

        def step(b=b, td=td) -> None:
            ours.update_priorities(ours.sample(b), td)

        for op, fn in (
            ("sb3 ReplayBuffer.sample", lambda b=b: theirs.sample(b)),
            ("gper adapter sample", lambda b=b: ours.sample(b)),
            ("gper adapter sample + update_priorities", step),
        ):
            fn(), fn()  # compile, capture, allocate
            n = max(5, min(200, int(0.02 / max(time_calls(fn, 3), 1e-7))))  # a repeat of about 20 ms
            us = sorted(time_calls(fn, n) * 1e6 for _ in range(repeats))
            rows.append(
                {
                    "table": "replay",
                    "env": env_id,
                    "op": op,
                    "capacity": capacity,
                    "batch": b,
                    "us_per_call": statistics.median(us),
                    "us_min": us[0],
                    "us_max": us[-1],
                }
            )
            print(f"  {op}, B = {b}: {statistics.median(us):.1f} us")
    return rows


# ---------------------------------------------------------------------------- tables


def _f(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


def run_table(rows: list[dict]) -> tuple[list[str], list[list[str]], list[bool]]:
    headers = [
        "variant",
        "seed",
        "status",
        "env steps",
        "wall s",
        "steps/s",
        "mean100 (train)",
        "episodes",
        "greedy eval",
    ]
    table = []
    for r in rows:
        ev = f"{r['eval_mean']:.1f} ± {r['eval_std']:.1f}" if r.get("eval_mean") is not None else "-"
        table.append(
            [
                r["variant"],
                str(r["seed"]),
                r["status"],
                _f(r.get("env_steps")),
                _f(r.get("wall_s")),
                _f(r.get("steps_per_s"), 0),
            ]
            + [_f(r.get("final_mean100")), _f(r.get("episodes")), ev]
        )
    return headers, table, [False, True, False] + [True] * 6


def replay_table(rows: list[dict]) -> tuple[list[str], list[list[str]], list[bool]]:
    headers = ["op", "capacity", "batch", "µs/call (median)", "min", "max"]
    table = [
        [r["op"], f"{r['capacity']:,}", str(r["batch"]), _f(r["us_per_call"]), _f(r["us_min"]), _f(r["us_max"])]
        for r in rows
    ]
    return headers, table, [False, True, True, True, True, True]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1", help="a Gymnasium id with discrete actions")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=50_000, help="env steps per run")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--parallel", type=int, default=6, help="runs at a time, each in its own process")
    p.add_argument("--max-seconds", type=float, default=120.0, help="a run stops training after this long")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--capacity", type=int, default=1_000_000, help="transitions in the replay table's buffers")
    p.add_argument("--batches", nargs="+", type=int, default=[256, 16384])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-runs", action="store_true", help="the replay table only")
    p.add_argument("--no-replay", action="store_true", help="the runs table only")
    p.add_argument("--quick", action="store_true", help="tiny settings for a smoke run")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(train_one(json.loads(args.worker))), flush=True)
        return 0
    if args.quick:
        args.steps, args.seeds, args.eval_episodes = 1500, args.seeds[:1], 2
        args.capacity, args.batches, args.repeats = 10_000, [256, 4096], 3
    device = torch.device(args.device)
    env = environment(device)
    title = f"sb3 dqn {args.env}"
    print(header_line(env, title))
    files = ResultFiles(args.out, env, COLUMNS, prefix="sb3")
    t0 = time.perf_counter()
    runs: list[dict] = []
    if not args.no_runs:
        threads = max(1, (os.cpu_count() or 2) // max(1, args.parallel))
        jobs = [
            dict(
                variant=v,
                seed=s,
                env=args.env,
                device=args.device,
                steps=args.steps,
                max_seconds=args.max_seconds,
                eval_episodes=args.eval_episodes,
                quick=args.quick,
                threads=threads,
            )
            for s in args.seeds
            for v in args.variants
        ]
        print(f"{len(jobs)} runs of {args.steps:,} env steps, {args.parallel} at a time")
        with ThreadPoolExecutor(args.parallel) as pool:
            runs = list(pool.map(run_worker, jobs))
        files.append(runs)
    replay: list[dict] = []
    if not args.no_replay:  # after the runs, on a quiet device
        print(f"replay calls, {args.capacity:,} transitions of {args.env}")
        replay = replay_rows(args.env, device, args.capacity, args.batches, args.repeats)
        files.append(replay)
    sections = [f"# SB3 DQN vs PrioritizedDQN on {args.env}", "", header_line(env, title), ""]
    sections += [f"Command: `python benchmarks/sb3_dqn.py {' '.join(argv if argv is not None else sys.argv[1:])}`", ""]
    if runs:
        print_table(*run_table(runs))
        sections += [
            f"## Runs ({args.steps:,} env steps, {args.parallel} processes at a time)",
            "",
            format_markdown(*run_table(runs)),
            "",
        ]
        for v in args.variants:
            ok = [r for r in runs if r["variant"] == v and r.get("steps_per_s")]
            if ok:
                line = (
                    f"- **{v}**: median {statistics.median(r['steps_per_s'] for r in ok):,.0f} env steps/s, "
                    f"greedy eval median {statistics.median(r['eval_mean'] for r in ok):.1f} over {len(ok)} seeds"
                )
                print(line)
                sections.append(line)
        sections.append("")
    if replay:
        print_table(*replay_table(replay))
        sections += [f"## Replay calls (device {args.device})", "", format_markdown(*replay_table(replay)), ""]
    files.write_markdown("\n".join(sections))
    print(f"total {time.perf_counter() - t0:.0f} s; wrote {files.csv_path} and {files.md_path}")
    return 0 if all(r["status"] == "ok" for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
