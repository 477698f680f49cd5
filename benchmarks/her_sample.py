"""Time the trajectory buffer's sample with hindsight relabelling against without, on the bit-flipping shape.

For every capacity, a :class:`gper.TrajectoryReplayBuffer` of ``--num-envs`` streams of
bit-flipping episodes (obs 50 float32 bits, achieved goal 50, desired goal 50, int64 action,
float32 reward; each step flips one bit; an episode ends terminated on reaching its goal or
truncated after ``--episode-length`` steps, same-step autoreset) is filled until every stream's
ring is full, its drawable starts given random priorities, then timed as captured CUDA graphs
(``gper.bench.timing.time_graph``: replays timed with CUDA events, the median of the repeats):

| op | call |
| --- | --- |
| ``sample`` / ``plain`` | ``rb.sample(B, n_step=n, gamma=0.98, relabel=False)``: the stored goals |
| ``sample`` / ``<strategy>`` | ``rb.sample(B, n_step=n, gamma=0.98)``, ``HindsightRelabeling(strategy=...)`` |
| ``add`` / ``plain``, ``her`` | one step of every stream continuing its episode, without and with the index |

The relabelling has ratio 0.8, the reward ``-(achieved != desired).any(-1)`` (as float32) and
``terminated_fn`` true on reaching the goal.

``x_plain`` is a row's median over the plain row beside it. Each strategy other than the first
is a buffer of its own, loaded from the first one's ``state_dict`` (the same rows and tree).

    python benchmarks/her_sample.py                            # 2^20 and 2^24 slots, B = 16384, n_step 1 and 3
    python benchmarks/her_sample.py --capacities 20 --repeats 3
    python benchmarks/her_sample.py --device cpu --capacities 14 --batch 256   # a smoke run (eager, no graphs)

Writes ``benchmarks/results/her-sample-<device>-<stamp>.{csv,md}`` and prints the same table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from functools import partial
from pathlib import Path

import torch

import gper
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import Timing, time_fn, time_graph

COLUMNS = ["op", "capacity", "batch", "n_step", "variant", "median_us", "min_us", "max_us", "x_plain", "iters"]
BITS = 50
SPEC = {
    "obs": ((BITS,), torch.float32),
    "achieved_goal": ((BITS,), torch.float32),
    "desired_goal": ((BITS,), torch.float32),
    "action": ((), torch.int64),
    "reward": ((), torch.float32),
}
OBS_KEYS = ("obs", "achieved_goal", "desired_goal")
GAMMA = 0.98
WINDOW = 8


def reward_fn(achieved: torch.Tensor, desired: torch.Tensor, info: dict) -> torch.Tensor:
    return -(achieved != desired).any(-1).float()


def terminated_fn(achieved: torch.Tensor, desired: torch.Tensor, info: dict) -> torch.Tensor:
    return (achieved == desired).all(-1)


class BitFlipping:
    """``num_envs`` bit-flipping streams on the device, one step of all at a time (same-step autoreset)."""

    def __init__(self, num_envs: int, length: int, device: torch.device, seed: int) -> None:
        self.g = torch.Generator(device=device).manual_seed(seed)
        self.e, self.length, self.device = num_envs, length, device
        self.state, self.goal = self._bits(), self._bits()
        self.t = torch.zeros(num_envs, dtype=torch.int64, device=device)

    def _bits(self) -> torch.Tensor:
        return torch.randint(0, 2, (self.e, BITS), device=self.device, generator=self.g).float()

    def step(self) -> dict[str, torch.Tensor]:
        action = torch.randint(0, BITS, (self.e,), device=self.device, generator=self.g)
        nxt = self.state.clone()
        nxt.scatter_(1, action[:, None], 1.0 - nxt.gather(1, action[:, None]))
        self.t += 1
        terminated = terminated_fn(nxt, self.goal, {})
        truncated = ~terminated & (self.t >= self.length)
        out = {
            "obs": self.state,
            "achieved_goal": self.state,
            "desired_goal": self.goal,
            "action": action,
            "reward": reward_fn(nxt, self.goal, {}),
            "next_obs": nxt,
            "next_achieved_goal": nxt,
            "next_desired_goal": self.goal,
            "terminated": terminated,
            "truncated": truncated,
        }
        done = (terminated | truncated)[:, None]
        self.state = torch.where(done, self._bits(), nxt)
        self.goal = torch.where(done, self._bits(), self.goal)
        self.t = torch.where(done[:, 0], 0, self.t)
        return out

    def continuing(self) -> dict[str, torch.Tensor]:
        """A step whose next observation is its observation: added again and again, it continues
        every stream's episode (the steady state of ``add``, one input a graph reads in place)."""
        step = self.step()
        for key in OBS_KEYS:
            step["next_" + key] = step[key].clone()
        step["terminated"] = torch.zeros_like(step["terminated"])
        step["truncated"] = torch.zeros_like(step["truncated"])
        return step


def build(args, capacity: int, device: torch.device, her: gper.HindsightRelabeling | None):
    return gper.TrajectoryReplayBuffer(
        capacity,
        args.num_envs,
        SPEC,
        window=WINDOW,
        obs_keys=OBS_KEYS,
        device=device,
        backend=args.backend,
        seed=args.seed,
        her=her,
        cpu_fallback=False,
    )


def relabeling(strategy: str) -> gper.HindsightRelabeling:
    return gper.HindsightRelabeling(reward_fn, strategy=strategy, relabel_ratio=0.8, terminated_fn=terminated_fn)


def fill(rb, env: BitFlipping, steps: int) -> None:
    for _ in range(steps):
        rb.add(env.step())
    # random priorities on every drawable start (log-uniform TD errors), in updates of one size
    starts = rb.drawable().nonzero().squeeze(1)
    size = min(2**20, starts.numel())
    g = torch.Generator(device=starts.device).manual_seed(1)
    for lo in range(0, starts.numel(), size):
        idx = starts[lo : lo + size]
        if idx.numel() < size:
            idx = torch.cat([idx, starts[: size - idx.numel()]])
        td = 10.0 ** (torch.rand(size, device=starts.device, generator=g) * 5 - 3)
        rb.update_priorities(idx, td)


def timed(fn, device: torch.device, args) -> Timing:
    if device.type == "cuda":
        return time_graph(fn, repeats=args.repeats, target_ms=args.target_ms)
    return time_fn(fn, repeats=args.repeats, target_ms=args.target_ms, device=device)


def run_capacity(args, cap: int, device: torch.device, record) -> None:
    """Fill one buffer of ``cap`` slots and time its rows (each buffer is freed on return)."""
    b = args.batch
    t0 = time.perf_counter()
    env = BitFlipping(args.num_envs, args.episode_length, device, args.seed)
    rb = build(args, cap, device, relabeling(args.strategies[0]))
    fill(rb, env, cap // args.num_envs)
    print(f"capacity {cap:,}: filled in {time.perf_counter() - t0:.1f} s ({rb.stats()['drawable']:,} starts)")
    for n in args.n_steps:
        t = timed(lambda n=n: rb.sample(b, n_step=n, gamma=GAMMA, relabel=False), device, args)
        record("sample", cap, n, "plain", t, b)
        t = timed(lambda n=n: rb.sample(b, n_step=n, gamma=GAMMA), device, args)
        record("sample", cap, n, args.strategies[0], t, b)
    for strategy in args.strategies[1:]:
        other = build(args, cap, device, relabeling(strategy))
        other.load_state_dict(rb.state_dict())
        for n in args.n_steps:
            t = timed(lambda n=n, other=other: other.sample(b, n_step=n, gamma=GAMMA), device, args)
            record("sample", cap, n, strategy, t, b)
        del other
    if args.no_add:
        return
    step = env.continuing()
    plain = build(args, cap, device, None)
    for _ in range(WINDOW + 2):
        plain.add(step)
    record("add", cap, "-", "plain", timed(partial(plain.add, step), device, args), args.num_envs)
    del plain
    record("add", cap, "-", "her", timed(partial(rb.add, step), device, args), args.num_envs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default="auto", help="auto, triton or torch")
    p.add_argument("--capacities", nargs="+", type=int, default=[20, 24], help="log2 of the slots")
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--n-steps", nargs="+", type=int, default=[1, 3])
    p.add_argument("--strategies", nargs="+", default=["future", "final", "episode"])
    p.add_argument("--num-envs", type=int, default=1024)
    p.add_argument("--episode-length", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--target-ms", type=float, default=20.0, help="length of one timed repeat")
    p.add_argument("--no-add", action="store_true", help="skip the add rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    env_info = environment(device)
    what = "her sample" + ("" if device.type == "cuda" else " (eager: no CUDA graphs on the CPU)")
    print(header_line(env_info, what))
    files = ResultFiles(Path(args.out), env_info, COLUMNS, prefix="her-sample")
    rows: list[dict] = []

    def record(op: str, cap: int, n: int | str, variant: str, t: Timing, batch: int | str) -> None:
        plain = next(
            (r for r in rows if (r["op"], r["capacity"], r["n_step"], r["variant"]) == (op, cap, n, "plain")), None
        )
        row = {
            "op": op,
            "capacity": cap,
            "batch": batch,
            "n_step": n,
            "variant": variant,
            "median_us": round(t.median_us, 2),
            "min_us": round(t.min_us, 2),
            "max_us": round(t.max_us, 2),
            "x_plain": round(t.median_us / plain["median_us"], 3) if plain else None,
            "iters": t.iters,
        }
        rows.append(row)
        files.append([row])
        print(f"  {op} 2^{cap.bit_length() - 1} n={n} {variant}: {t.median_us:.1f} us", flush=True)

    for log2 in args.capacities:
        run_capacity(args, 2**log2, device, record)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    headers = ["op", "capacity", "batch", "n_step", "variant", "median us", "min us", "max us", "x plain"]
    keys = ["op", "capacity", "batch", "n_step", "variant", "median_us", "min_us", "max_us", "x_plain"]
    table = [
        [f"2^{r[k].bit_length() - 1}" if k == "capacity" else "" if r[k] is None else str(r[k]) for k in keys]
        for r in rows
    ]
    right = [False, True, True, True, False, True, True, True, True]
    print()
    print_table(headers, table, right)
    files.write_markdown(
        "\n".join(
            [
                "# Hindsight relabelling: sample with HER against without (bit-flipping shape)",
                "",
                header_line(env_info, what),
                "",
                f"Command: `python benchmarks/her_sample.py {shlex.join(argv if argv is not None else sys.argv[1:])}`",
                "",
                f"{args.num_envs} streams, window {WINDOW}, episodes of up to {args.episode_length} steps; relabel "
                "ratio 0.8 with terminated_fn; times in microseconds per call"
                + (", CUDA-graph replays timed with CUDA events" if device.type == "cuda" else ", eager"),
                "",
                format_markdown(headers, table, right),
                "",
            ]
        )
    )
    print(f"wrote {files.csv_path} and {files.md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
