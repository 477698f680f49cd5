"""The keyword settings every buffer shares: declared once (gper.replay.config), shown in each
buffer's signature with their defaults, documented with them in PrioritizedReplayBuffer."""

import inspect
import re

import pytest
import torch

import gper
from gper.distributed import ShardedPrioritizedReplayBuffer
from gper.replay.config import DEFAULTS, CommonSettings, ReplaySettings

SPEC = {"x": ((), torch.float32)}


@pytest.mark.parametrize(
    "cls, accepted",
    [
        (gper.PrioritizedReplayBuffer, ReplaySettings),
        (gper.TrajectoryReplayBuffer, ReplaySettings),
        (ShardedPrioritizedReplayBuffer, CommonSettings),
    ],
)
def test_signature_lists_every_setting_keyword_only_with_its_default(cls, accepted):
    params = inspect.signature(cls).parameters
    for name in accepted.__annotations__:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == DEFAULTS[name], name
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def test_the_flat_buffer_documents_every_setting_with_its_default():
    doc = inspect.getdoc(gper.PrioritizedReplayBuffer)
    for name in ReplaySettings.__annotations__:
        default = repr(DEFAULTS[name]).replace("'", '"')
        assert re.search(rf"^    {name} \(default {re.escape(default)}\): ", doc, re.M), name


def test_an_unknown_setting_raises_before_anything_is_built():
    with pytest.raises(TypeError, match="unexpected keyword argument 'alhpa'"):
        gper.PrioritizedReplayBuffer(8, SPEC, alhpa=0.5, device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword argument 'alhpa'"):
        gper.TrajectoryReplayBuffer(8, 1, SPEC, alhpa=0.5, device="cpu")
    # a shard never falls back to the CPU, and "rank" sampling is refused: neither is a setting of it
    for name in ("cpu_fallback", "rank_refresh_interval"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            ShardedPrioritizedReplayBuffer(8, SPEC, **{name: DEFAULTS[name]})


def test_settings_are_keyword_only():
    with pytest.raises(TypeError, match="positional"):
        gper.PrioritizedReplayBuffer(8, SPEC, 0.5)


def test_given_settings_reach_the_buffer():
    rb = gper.PrioritizedReplayBuffer(8, SPEC, alpha=0.5, sampling="rank", seed=7, device="cpu", backend="torch")
    assert (rb.alpha, rb.beta, rb.sampling, rb.seed, rb.backend) == (0.5, DEFAULTS["beta"], "rank", 7, "torch")
    assert rb.rank_refresh_interval == DEFAULTS["rank_refresh_interval"]
