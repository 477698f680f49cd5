"""PureJaxRL's DQN (the vendored :mod:`gper.bench.trainers.purejaxrl_dqn`) timed for N seeds in one
``jax.vmap``, as PureJaxRL's own script runs it: ``jax.jit(jax.vmap(make_train(config)))(rngs)``.

This module runs in a worker process of its own (``python -m gper.bench.trainers.purejaxrl_run``):
JAX keeps the GPU memory it took until its process ends, and the gper runs of the same bench
need it afterwards. The parent (:mod:`gper.bench.trainers.run`) reads the JSON it writes.
:func:`status` and :func:`default_config` import nothing of JAX, so a machine without it can
report the peer as skipped.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import statistics
import time
from pathlib import Path
from typing import Any

from gper.bench.peers.base import version
from gper.bench.trainers.solve import GOAL, solve_steps, time_to_solve_estimate

#: the modules the vendored file imports that are not in gper's own dependencies
REQUIRED = ("jax", "flax", "optax", "chex", "gymnax", "flashbax")
#: how to install them (gymnax 1.0 and flashbax 0.1.3 are the versions the vendored file is patched for)
INSTALL_HINT = 'pip install "gymnax>=1.0" "flashbax>=0.1.3", which bring jax, flax, optax and chex'
VENDORED = Path(__file__).with_name("purejaxrl_dqn.py")


def status() -> tuple[bool, str]:
    """Whether PureJaxRL's DQN can run here, with the versions it would run on or what is missing
    (checked without importing JAX)."""
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    if missing:
        return False, f"{', '.join(missing)} not installed: {INSTALL_HINT}"
    names = ("jax", "jaxlib", "gymnax", "flashbax", "flax", "optax")
    return True, ", ".join(f"{n} {version(n)}" for n in names)


def default_config(path: Path = VENDORED) -> dict[str, Any]:
    """The config of PureJaxRL's ``main()`` (``default_config()`` of the vendored file), read from
    the file's text without importing it, so that gper's side of the bench can copy its settings
    on a machine without JAX."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "default_config":
            ret = next(n for n in node.body if isinstance(n, ast.Return))
            return ast.literal_eval(ret.value)
    raise ValueError(f"{path} has no default_config()")


def total_env_steps(config: dict[str, Any]) -> int:
    """Env steps of one seed's run, as make_train counts them: NUM_UPDATES updates of NUM_ENVS steps."""
    return int(config["TOTAL_TIMESTEPS"] // config["NUM_ENVS"]) * int(config["NUM_ENVS"])


def time_seeds(n: int, config: dict[str, Any]) -> dict[str, Any]:
    """Compile and run ``n`` seeds of PureJaxRL's DQN in one vmap; the times and each seed's solve step."""
    import jax
    import numpy as np

    from gper.bench.trainers import purejaxrl_dqn

    config = dict(config)  # make_train writes NUM_UPDATES into the dict it is given
    rngs = jax.random.split(jax.random.PRNGKey(config["SEED"]), n)
    t0 = time.perf_counter()
    compiled = jax.jit(jax.vmap(purejaxrl_dqn.make_train(config))).lower(rngs).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(rngs))
    run_s = time.perf_counter() - t0
    m = out["metrics"]
    steps = solve_steps(
        np.asarray(m["returned_episode"]), np.asarray(m["returned_episode_returns"]), np.asarray(m["timesteps"])
    )
    total = total_env_steps(config)
    reached = [s for s in steps if s is not None]
    median_step = statistics.median(reached) if reached else None
    del out, m, compiled
    jax.clear_caches()
    return {
        "seeds": n,
        "compile_s": compile_s,
        "run_s": run_s,
        "total_env_steps": total,
        "env_steps_per_s": n * total / run_s,
        "solve_steps": steps,
        "reached": len(reached),
        "median_solve_step": median_step,
        "median_time_to_goal_est_s": time_to_solve_estimate(run_s, median_step, total),
        "device": str(jax.devices()[0].device_kind),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gper.bench.trainers.purejaxrl_run", description=__doc__)
    p.add_argument("--seeds", nargs="+", type=int, required=True, help="seed counts, each run as one vmap")
    p.add_argument("--json", required=True, help="where to write the results (rewritten after each seed count)")
    p.add_argument("--total-steps", type=int, help="override TOTAL_TIMESTEPS (smoke runs; default the file's)")
    args = p.parse_args(argv)
    config = default_config()
    if args.total_steps:
        config["TOTAL_TIMESTEPS"] = args.total_steps
    info = {"versions": status()[1], "config": config, "goal": GOAL, "rows": []}
    for n in args.seeds:
        print(f"purejaxrl: {n} seeds ...", flush=True)
        try:
            row = time_seeds(n, config)
        except Exception as e:  # one seed count failing (out of memory, say) leaves the others' rows
            row = {"seeds": n, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        info["rows"].append(row)
        Path(args.json).write_text(json.dumps(info), encoding="utf-8")
        print(f"purejaxrl: {json.dumps({k: v for k, v in row.items() if k != 'solve_steps'})}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
