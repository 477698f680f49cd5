"""Edge cases of ShardedPrioritizedReplayBuffer on 2 gloo processes of this host (CPU, torch back
end; the Triton one under the interpreter where said): see tests/distributed/edge_workers.py."""

from __future__ import annotations

import pytest
from edge_workers import (
    a_shard_refused_on_one_rank_loads_nowhere,
    a_shard_that_fails_on_one_rank_fails_the_build_on_all,
    new_items_enter_at_the_group_max_after_an_update,
    no_host_data_in_a_step,
    triton_shards_draw_as_torch_shards,
)
from spawn import run_ranks

from helpers import TRITON_ON_CPU


def test_a_step_makes_no_tensor_from_host_data():
    run_ranks(no_host_data_in_a_step, 2, timeout=60)


def test_a_shard_refused_on_one_rank_is_loaded_on_none(tmp_path):
    run_ranks(a_shard_refused_on_one_rank_loads_nowhere, 2, str(tmp_path), timeout=60)


def test_new_items_enter_at_the_group_max_after_an_update():
    run_ranks(new_items_enter_at_the_group_max_after_an_update, 2, timeout=60)


def test_a_shard_that_fails_on_one_rank_fails_the_build_on_every_rank():
    run_ranks(a_shard_that_fails_on_one_rank_fails_the_build_on_all, 2, timeout=60)


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton under TRITON_INTERPRET=1")
def test_shards_that_run_triton_draw_route_and_update_as_shards_that_run_torch():
    run_ranks(triton_shards_draw_as_torch_shards, 2, timeout=90)
