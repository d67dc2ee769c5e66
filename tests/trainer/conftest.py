"""Shared by the inner-loop tests on the CPU (test_inner.py) and on CUDA (test_cuda.py): the tiny
patch transformer, its deterministic init checkpoint and three shards of the shipped corpus."""

from __future__ import annotations

import pytest
import torch

from tenzro_training.trainer.data import Shard, load_corpus, shard_windows
from tenzro_training.trainer.model import PatchTransformerConfig, create_init_checkpoint

TINY_MODEL = PatchTransformerConfig(context_len=32, horizon=8, patch_len=8, d_model=32, n_layers=2, n_heads=4, d_ff=64)


@pytest.fixture(scope="module")
def shards() -> list[Shard]:
    corpus = load_corpus()
    return [shard_windows(corpus, i, 3, TINY_MODEL.context_len, TINY_MODEL.horizon) for i in range(3)]


@pytest.fixture(scope="module")
def init() -> dict[str, torch.Tensor]:
    return create_init_checkpoint(TINY_MODEL, 0)
