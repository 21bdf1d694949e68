"""The per-example randomness seed of the BERT tasks (issue 30, point 8): a 64-bit content hash,
not a 31-bit CRC, so distinct examples do not share a masking, dropout or privatization key."""

from __future__ import annotations

import zlib

import jax
import numpy as np

from fedpriv.tasks.mlm import example_keys, row_seed


def test_row_seed_is_64_bits_and_separates_rows_whose_crc_bits_agree():
    # Two distinct rows whose CRCs agree on 15 bits (a birthday pair, found by search).
    rng = np.random.default_rng(0)
    seen: dict[int, np.ndarray] = {}
    pair = None
    for _ in range(200_000):
        row = rng.integers(0, 30_000, 4).astype(np.int32)
        crc = zlib.crc32(row.tobytes()) & 0x7FFF  # a 15-bit truncation: a birthday pair in ~2**8 draws
        if crc in seen and not np.array_equal(seen[crc], row):
            pair = (seen[crc], row)
            break
        seen[crc] = row
    assert pair is not None
    a, b = (row_seed(r) for r in pair)
    assert a.shape == (2,) and a.dtype == np.uint32 and not np.array_equal(a, b)
    # The arrays of an example are length-prefixed: moving a boundary changes the seed.
    x = np.arange(6, dtype=np.int32)
    assert not np.array_equal(row_seed(x[:2], x[2:]), row_seed(x[:3], x[3:]))
    np.testing.assert_array_equal(row_seed(x), row_seed(x.copy()))  # a function of the content


def test_no_collision_among_distinct_rows_where_31_bits_collide():
    """n = 2e5 distinct rows: a 31-bit seed is expected to hold about n**2 / 2**32 = 9 colliding
    pairs (the old CRC seed's birthday bound); the 64-bit one about 1e-9."""
    seeds = np.stack([row_seed(np.array([r], np.int64)) for r in range(200_000)])
    packed = seeds[:, 0].astype(np.uint64) | (seeds[:, 1].astype(np.uint64) << np.uint64(32))
    assert np.unique(packed).size == packed.size
    assert np.unique(seeds[:, 0] & 0x7FFFFFFF).size < packed.size  # 31 bits alone would collide here already


def test_example_keys_fold_both_words():
    rng = jax.random.key(0)
    seeds = np.array([[1, 2], [1, 3], [2, 2]], np.uint32)
    keys = np.asarray(jax.random.key_data(example_keys(rng, seeds, 0)))
    assert len({tuple(k) for k in keys}) == 3
    want = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(rng, 0), 1), 3)
    np.testing.assert_array_equal(keys[1], np.asarray(jax.random.key_data(want)))
