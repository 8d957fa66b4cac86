from __future__ import annotations

import pytest

from deskpod.errors import ConfigError
from deskpod.train.sampler import GlobalBatchSampler, shard_indices
from deskpod.train.schedule import lr_factor


def test_ranks_split_each_global_batch_exactly() -> None:
    n, per, world = 103, 4, 3
    ranks = [list(GlobalBatchSampler(n, per, world, r, seed=1).batches(0)) for r in range(world)]
    steps = GlobalBatchSampler(n, per, world, 0, seed=1).steps_per_epoch
    assert steps == 103 // 12 and all(len(b) == steps for b in ranks)
    seen = [i for r in ranks for batch in r for i in batch]
    assert len(seen) == len(set(seen)) == steps * 12, "no sample twice in an epoch"


def test_global_batches_do_not_depend_on_world_size() -> None:
    one = list(GlobalBatchSampler(64, 16, 1, 0, seed=5).batches(2))
    two = [list(GlobalBatchSampler(64, 8, 2, r, seed=5).batches(2)) for r in range(2)]
    for s in range(len(one)):
        assert sorted(one[s]) == sorted(two[0][s] + two[1][s])


def test_reshuffles_each_epoch_and_resumes_mid_epoch() -> None:
    s = GlobalBatchSampler(100, 10, 2, 1, seed=0)
    e0, e1 = list(s.batches(0)), list(s.batches(1))
    assert e0 != e1
    assert list(s.batches(0, start=3)) == e0[3:]
    assert list(GlobalBatchSampler(100, 10, 2, 1, seed=0).batches(0)) == e0, "same seed, same order"


def test_batch_larger_than_data_is_refused() -> None:
    with pytest.raises(ConfigError, match="only 10 training samples"):
        GlobalBatchSampler(10, 8, 2, 0, seed=0)


def test_validation_shards_cover_everything_once() -> None:
    seen = [i for r in range(3) for b in shard_indices(10, 3, r, 2) for i in b]
    assert sorted(seen) == list(range(10))


def test_warmup_then_cosine() -> None:
    total, warm = 100, 10
    assert lr_factor(0, total, warm, "cosine") == pytest.approx(0.1)
    assert lr_factor(5, total, warm, "cosine") == pytest.approx(0.55)
    assert lr_factor(10, total, warm, "cosine") == pytest.approx(1.0)
    assert lr_factor(55, total, warm, "cosine") == pytest.approx(0.5)
    assert lr_factor(100, total, warm, "cosine") == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(80, total, 0, "step") == pytest.approx(0.01)
    assert lr_factor(60, total, 0, "step") == pytest.approx(0.1)
    assert lr_factor(99, total, 0, "constant") == 1.0
