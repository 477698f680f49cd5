"""TorchRL's DQN on CartPole-v1 with gper's prioritized buffer against TorchRL's own buffers, and
the replay calls alone.

Two tables, in one run:

1. **DQN runs.** The same TorchRL loop for every buffer: ``GymEnv("CartPole-v1")`` with
   ``RewardSum``, a ``QValueActor`` over a 64x64 MLP, epsilon-greedy, a ``Collector`` with the
   policy and the stored data on the device, ``DQNLoss`` (double DQN) + Adam + ``SoftUpdate``.
   Buffers: ``gper-per`` (``gper.integrations.torchrl.PrioritizedReplayBuffer``, beta annealed to
   1), ``torchrl-uniform`` (``TensorDictReplayBuffer(storage=LazyTensorStorage(N, device))``),
   ``torchrl-per-cuda`` (``TensorDictPrioritizedReplayBuffer`` over that storage: TorchRL's PyPI
   wheels refuse it on CUDA, and the row says so) and ``torchrl-per-host`` (the same with
   ``sampler_device="cpu"``: the sum tree on the host). Each (buffer, seed) runs in its own
   process, in parallel; per run: wall time, frames/s, mean return of the last 20 episodes and
   of greedy episodes afterwards.
2. **Replay calls.** ``extend``, ``sample`` and ``sample`` + ``update_tensordict_priority`` at
   batch 256 and 16384 into a full buffer of 2^20, for the DQN CartPole TensorDict (what the
   collector writes) and a 51-float obs / int64 action one; gper against TorchRL's uniform
   buffer on the same device (whose update is TorchRL's no-op for a non-prioritized sampler).
   Median of repeats, CUDA events around back-to-back calls (``gper.bench.timing.time_fn``).

    python benchmarks/torchrl_dqn.py            # the GPU: about 3 minutes on an H200
    python benchmarks/torchrl_dqn.py --quick    # tiny settings, any machine

Writes ``benchmarks/results/torchrl-<device>-<stamp>.{md,csv}`` (``--out`` elsewhere).
Needs ``pip install ".[torchrl,gym]"`` (from the checkout).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import time_fn

VARIANTS = ("gper-per", "torchrl-uniform", "torchrl-per-cuda", "torchrl-per-host")
ALPHA, BETA, EPS = 0.6, 0.4, 1e-8  # TorchRL's eps
LAST_EPISODES = 20
COLUMNS = [
    "table",
    "impl",
    "seed",
    "status",
    "frames",
    "updates",
    "wall_s",
    "frames_per_s",
    "episodes",
    "mean_return_last20",
    "greedy_return",
    "layout",
    "op",
    "capacity",
    "batch",
    "median_us",
    "min_us",
    "max_us",
]


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:240]


# ---------------------------------------------------------------- buffers


def make_buffer(impl: str, capacity: int, batch: int | None, device: torch.device, seed: int):
    """The buffer ``impl`` over ``capacity`` slots on ``device``; its prioritized sampler (to anneal beta) or None."""
    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer

    if impl == "gper-per":
        from gper.integrations.torchrl import PrioritizedReplayBuffer

        rb = PrioritizedReplayBuffer(
            alpha=ALPHA, beta=BETA, eps=EPS, capacity=capacity, batch_size=batch, device=device, seed=seed
        )
        return rb, rb
    storage = LazyTensorStorage(capacity, device=device)
    if impl == "torchrl-uniform":
        return TensorDictReplayBuffer(storage=storage, batch_size=batch), None
    where = {"torchrl-per-cuda": None, "torchrl-per-host": "cpu"}[impl]  # None: next to the storage
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=ALPHA, beta=BETA, eps=EPS, storage=storage, batch_size=batch, sampler_device=where
    )
    return rb, rb.sampler


def check_works(rb, td) -> None:
    """Extend, sample and update once: TorchRL refuses some combinations only at first use."""
    rb.extend(td)
    s = rb.sample(4)
    s.set("td_error", torch.ones(4, 1, device=s.device))
    rb.update_tensordict_priority(s)


# ---------------------------------------------------------------- one DQN run (a child process)


def train(impl: str, seed: int, a: dict) -> dict:
    """One DQN run; ``a`` holds the settings. Returns its row."""
    from tensordict.nn import TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.envs import ExplorationType, GymEnv, RewardSum, TransformedEnv, set_exploration_type
    from torchrl.modules import MLP, EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate

    device = torch.device(a["device"])
    torch.manual_seed(seed)
    row = {"table": "dqn", "impl": impl, "seed": seed}
    env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum())
    env.set_seed(seed)
    spec = env.action_spec.to(device)
    actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[64, 64]), in_keys=["observation"], spec=spec)
    actor = actor.to(device)
    explore = EGreedyModule(spec, annealing_num_steps=int(a["frames"] * 0.4), eps_init=1.0, eps_end=0.05).to(device)
    loss = DQNLoss(actor, action_space=spec, delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, eps=0.995)
    opt = torch.optim.Adam(loss.parameters(), lr=a["lr"])
    try:
        rb, sampler = make_buffer(impl, a["capacity"], a["batch"], device, seed)
        probe, _ = make_buffer(impl, 64, None, device, seed)
        check_works(probe, cartpole_td(8, device))
    except Exception as e:  # noqa: BLE001 - the refusal is the result
        return row | {"status": "refused: " + first_line(e)}
    collector = Collector(
        env,
        TensorDictSequential(actor, explore),
        frames_per_batch=a["frames_per_batch"],
        total_frames=a["frames"],
        init_random_frames=a["init_random_frames"],
        policy_device=device,
        storing_device=device,
        env_device="cpu",
        auto_register_policy_transforms=False,
    )
    returns, frames, updates = [], 0, 0
    t0 = time.perf_counter()
    for data in collector:
        rb.extend(data)
        frames += data.numel()
        explore.step(data.numel())
        done = data["next", "done"].squeeze(-1)
        returns += data["next", "episode_reward"][done].squeeze(-1).tolist()
        if sampler is not None:  # beta annealed from 0.4 to 1 over the run
            sampler.beta = min(1.0, BETA + (1.0 - BETA) * frames / a["frames"])
        if frames >= a["init_random_frames"]:
            for _ in range(a["updates_per_batch"]):
                sample = rb.sample()
                value = loss(sample)["loss"]
                opt.zero_grad(set_to_none=True)
                value.backward()
                opt.step()
                target.step()
                rb.update_tensordict_priority(sample)
                updates += 1
        if time.perf_counter() - t0 > a["max_run_s"]:
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    collector.shutdown()
    greedy = []
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        for i in range(a["eval_episodes"]):
            env.set_seed(10_000 + 100 * seed + i)
            episode = env.rollout(500, actor, auto_cast_to_device=True, break_when_any_done=True)
            greedy.append(float(episode["next", "reward"].sum()))
    last = returns[-LAST_EPISODES:]
    status = "ok" if frames >= a["frames"] else f"stopped at --max-run-s {a['max_run_s']}"
    return row | {
        "status": status,
        "frames": frames,
        "updates": updates,
        "wall_s": round(wall, 2),
        "frames_per_s": round(frames / wall, 1),
        "episodes": len(returns),
        "mean_return_last20": round(statistics.mean(last), 1) if last else None,
        "greedy_return": round(statistics.mean(greedy), 1) if greedy else None,
    }


def run_child(impl: str, seed: int, a: dict, threads: int) -> dict:
    """:func:`train` in a process of its own (its own CUDA context, its own cores)."""
    cmd = [sys.executable, __file__, "--child", json.dumps({"impl": impl, "seed": seed, "a": a})]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = " / ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])[:300]
    return {"table": "dqn", "impl": impl, "seed": seed, "status": f"error (exit {proc.returncode}): {tail}"}


# ---------------------------------------------------------------- replay calls alone


def cartpole_td(n: int, device: torch.device):
    """n transitions laid out as TorchRL's collector writes them for DQN on CartPole (with RewardSum)."""
    from tensordict import TensorDict

    flag = lambda: torch.rand(n, 1, device=device) < 0.05
    action = torch.nn.functional.one_hot(torch.randint(0, 2, (n,), device=device), 2)
    f32 = lambda *shape: torch.randn(n, *shape, device=device)
    step = {"done": flag(), "terminated": flag(), "truncated": flag(), "episode_reward": f32(1).abs() * 100}
    return TensorDict(
        {
            "observation": f32(4),
            "action": action,
            "action_value": f32(2),
            "chosen_action_value": f32(1),
            **step,
            ("collector", "traj_ids"): torch.arange(n, device=device),
            "next": {"observation": f32(4), "reward": torch.ones(n, 1, device=device), **step},
        },
        batch_size=[n],
        device=device,
    )


def obs51_td(n: int, device: torch.device):
    """n transitions of a 51-float observation and an int64 action (gper's reference transition as a TensorDict)."""
    from tensordict import TensorDict

    return TensorDict(
        {
            "observation": torch.randn(n, 51, device=device),
            "action": torch.randint(0, 45, (n,), device=device),
            "next": {
                "observation": torch.randn(n, 51, device=device),
                "reward": torch.randn(n, 1, device=device),
                "done": torch.rand(n, 1, device=device) < 0.05,
            },
        },
        batch_size=[n],
        device=device,
    )


LAYOUTS = {"cartpole-dqn": cartpole_td, "obs51-int64": obs51_td}


def time_calls(rb, data, b: int, repeats: int, device: torch.device, base: dict, log) -> list[dict]:
    """Rows for ``rb.extend(data)``, ``rb.sample(b)`` and sample + ``update_tensordict_priority``."""
    td_error = torch.rand(b, 1, device=device)

    def step() -> None:
        s = rb.sample(b)
        s.set("td_error", td_error)
        rb.update_tensordict_priority(s)

    rows = []
    for op, fn in {"extend": lambda: rb.extend(data), "sample": lambda: rb.sample(b), "sample+update": step}.items():
        t = time_fn(fn, warmup=5, repeats=repeats, device=device)
        us = {"median_us": round(t.median_us, 1), "min_us": round(t.min_us, 1), "max_us": round(t.max_us, 1)}
        rows.append(base | {"status": "ok", "op": op, "batch": b} | us)
        log(f"  {base['impl']} {base['layout']} {op} B={b}: {t.median_us:,.1f} us")
    return rows


def replay_rows(a: dict, device: torch.device, log) -> list[dict]:
    """Time extend, sample and sample+update of each buffer, layout and batch size (full buffers)."""
    rows = []
    capacity = a["replay_capacity"]
    for layout, make in LAYOUTS.items():
        for impl in ("gper-per", "torchrl-uniform", "torchrl-per-cuda"):
            base = {"table": "replay", "impl": impl, "layout": layout, "capacity": capacity}
            try:
                rb, _ = make_buffer(impl, capacity, None, device, seed=0)
                check_works(rb, make(8, device))
            except Exception as e:  # noqa: BLE001 - the refusal is the result
                rows.append(base | {"status": "refused: " + first_line(e)})
                log(f"  {impl} {layout}: refused: {first_line(e)}")
                continue
            chunk = min(capacity, 2**16)
            for _ in range(-(-capacity // chunk)):
                rb.extend(make(chunk, device))
            for b in a["replay_batches"]:
                rows += time_calls(rb, make(b, device), b, a["repeats"], device, base, log)
            del rb
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- tables


def _fmt(v: object) -> str:
    if v is None or v == "":
        return "-"
    return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def dqn_table(rows: list[dict]) -> tuple[list[str], list[list[str]], list[bool]]:
    keys = ["frames", "updates", "wall_s", "frames_per_s", "episodes", "mean_return_last20", "greedy_return"]
    headers = ["buffer", "seed", *(k.replace("_", " ") for k in keys), "status"]
    table = [[r["impl"], str(r["seed"]), *(_fmt(r.get(k)) for k in keys), r["status"]] for r in rows]
    return headers, table, [False, True] + [True] * len(keys) + [False]


def replay_table(rows: list[dict], batches: list[int]) -> tuple[list[str], list[list[str]], list[bool]]:
    """One line per (layout, buffer, op): the median µs per call at each batch size."""
    headers = ["layout", "buffer", "op", *(f"B={b} µs" for b in batches)]
    table, seen = [], set()
    for r in rows:
        key = (r["layout"], r["impl"], r.get("op"))
        if key in seen:
            continue
        seen.add(key)
        if r["status"] != "ok":
            table.append([r["layout"], r["impl"], r["status"]] + [""] * len(batches))
            continue
        cells = {x["batch"]: _fmt(x["median_us"]) for x in rows if (x["layout"], x["impl"], x.get("op")) == key}
        table.append([r["layout"], r["impl"], r["op"], *(cells.get(b, "-") for b in batches)])
    return headers, table, [False, False, False] + [True] * len(batches)


def markdown(header: str, command: str, a: dict, dqn: tuple, summary: list[str], replay: tuple | None) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in a.items() if k != "device")
    lines = ["# TorchRL DQN on CartPole-v1 with gper's buffer against TorchRL's, and the replay calls alone", ""]
    lines += [header, "", f"Command: `{command}`", "", f"Settings: {settings}.", ""]
    lines += ["## DQN runs", "", format_markdown(*dqn), "", *summary, ""]
    if replay is not None:
        lines += ["## Replay calls", ""]
        lines += [
            f"Full buffers of {a['replay_capacity']:,}; median µs per call of {a['repeats']} repeats (CUDA events "
            "around back-to-back calls on a GPU). sample+update: `sample(B)`, set `td_error`, "
            "`update_tensordict_priority` (a no-op for TorchRL's uniform buffer).",
            "",
            format_markdown(*replay),
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--frames", type=int, default=30_000, help="environment frames per DQN run")
    p.add_argument("--frames-per-batch", type=int, default=16)
    p.add_argument("--updates-per-batch", type=int, default=4, help="gradient steps per collected batch")
    p.add_argument("--init-random-frames", type=int, default=1_000)
    p.add_argument("--batch", type=int, default=128, help="DQN batch size")
    p.add_argument("--capacity", type=int, default=100_000, help="DQN replay capacity")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--max-run-s", type=float, default=110.0, help="a DQN run stops here even short of --frames")
    p.add_argument("--parallel", type=int, default=None, help="DQN runs at a time (default all)")
    p.add_argument("--replay-capacity", type=int, default=2**20)
    p.add_argument("--replay-batches", nargs="+", type=int, default=[256, 16384])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-replay", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny settings: a smoke run on any machine")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    if args.child:
        job = json.loads(args.child)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        print("RESULT " + json.dumps(train(job["impl"], job["seed"], job["a"])), flush=True)
        return 0
    if args.quick:
        args.seeds, args.frames, args.frames_per_batch, args.updates_per_batch = args.seeds[:1], 600, 16, 2
        args.init_random_frames, args.batch, args.capacity, args.eval_episodes = 200, 32, 2_000, 1
        args.replay_capacity, args.replay_batches, args.repeats = 2**12, [32, 256], 3
    device = torch.device(args.device)
    env = environment(device)
    what = "torchrl dqn + replay"
    print(header_line(env, what))
    files = ResultFiles(Path(args.out), env, COLUMNS, prefix="torchrl")
    names = ("device", "frames", "frames_per_batch", "updates_per_batch", "init_random_frames", "batch", "capacity")
    a = {k: getattr(args, k) for k in (*names, "lr", "eval_episodes", "max_run_s")}
    a |= {"replay_capacity": args.replay_capacity, "replay_batches": args.replay_batches, "repeats": args.repeats}
    t0 = time.perf_counter()
    replay = [] if args.skip_replay else replay_rows(a, device, print)  # alone on the machine: before the runs
    files.append(replay)
    jobs = [(impl, seed) for impl in args.variants for seed in args.seeds]
    parallel = args.parallel or len(jobs)
    threads = max(1, (os.cpu_count() or 1) // parallel)
    print(f"{len(jobs)} DQN runs of {args.frames:,} frames, {parallel} at a time, {threads} CPU thread(s) each")
    with ThreadPoolExecutor(parallel) as pool:
        dqn = list(pool.map(lambda j: run_child(j[0], j[1], a, threads), jobs))
    files.append(dqn)
    dh, dt, dr = dqn_table(dqn)
    rh, rt, rr = replay_table(replay, args.replay_batches)
    print_table(dh, dt, dr, title="DQN on CartPole-v1")
    if replay:
        print_table(rh, rt, rr, title=f"replay calls, capacity {args.replay_capacity:,}, median of {args.repeats}")
    summary = []
    for impl in args.variants:
        ok = [r for r in dqn if r["impl"] == impl and r.get("frames")]
        if ok:
            greedy = [r["greedy_return"] for r in ok if r["greedy_return"] is not None]
            fps = statistics.median(r["frames_per_s"] for r in ok)
            line = f"- **{impl}**: {len(ok)} runs, median {fps:,.0f} frames/s"
            summary.append(line + (f", greedy return median {statistics.median(greedy):.1f}" if greedy else ""))
    print("\n".join(summary) + f"\ntotal {time.perf_counter() - t0:.0f} s")
    command = f"python benchmarks/torchrl_dqn.py {shlex.join(argv if argv is not None else sys.argv[1:])}"
    files.write_markdown(
        markdown(header_line(env, what), command, a, (dh, dt, dr), summary, (rh, rt, rr) if replay else None)
    )
    print(f"wrote {files.csv_path} and {files.md_path}")
    return 0 if all(r["status"] == "ok" or r["status"].startswith("refused") for r in dqn + replay) else 1


if __name__ == "__main__":
    raise SystemExit(main())
