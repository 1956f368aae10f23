"""BlockPool: the LRU free list, reference counts and the content cache, by exact block ids."""

import unittest

from support import main, make_pool


def cached_pool(num_blocks=11, count=4):
    """A pool whose first count blocks are allocated and cached as key0, key1, ..."""
    pool = make_pool(num_blocks)
    blocks = pool.allocate(count)
    for index, block in enumerate(blocks):
        pool.cache(block, f"key{index}")
    return pool, blocks


class BlockPoolTest(unittest.TestCase):

    def test_a_fresh_pool_hands_out_blocks_in_id_order(self):
        pool = make_pool(num_blocks=11)
        self.assertEqual(pool.allocate(3), [0, 1, 2])
        self.assertEqual(pool.allocate(2), [3, 4])
        self.assertEqual((pool.free_count(), pool.used_count()), (6, 5))

    def test_block_pool_evicts_least_recently_released_first(self):
        pool = make_pool(num_blocks=4)
        a, b, c, d = pool.allocate(4)
        for block in (a, b, c, d):
            pool.cache(block, f"key{block}")
        pool.release([c])
        pool.release([a])
        pool.release([d])
        self.assertEqual(list(pool.free), [2, 0, 3])
        self.assertEqual(pool.allocate(2), [2, 0])
        self.assertEqual(pool.num_evictions, 2)
        self.assertEqual(pool.lookup(["key2"]), [])
        self.assertEqual(pool.lookup(["key3"]), [3])

    def test_release_walks_in_reverse_so_the_tail_is_evicted_before_the_head(self):
        pool, blocks = cached_pool(num_blocks=4, count=4)
        pool.release(blocks)
        self.assertEqual(list(pool.free), [3, 2, 1, 0])
        self.assertEqual(pool.allocate(1), [3])
        self.assertEqual(pool.lookup(["key0", "key1", "key2", "key3"]), [0, 1, 2])

    def test_a_released_block_is_a_hit_until_allocate_reaches_it(self):
        pool, blocks = cached_pool(num_blocks=11, count=2)
        pool.release(blocks)
        self.assertEqual(pool.allocate(9), [2, 3, 4, 5, 6, 7, 8, 9, 10])
        self.assertEqual(pool.lookup(["key0", "key1"]), [0, 1])
        self.assertEqual(pool.num_evictions, 0)
        self.assertEqual(pool.allocate(1), [1])
        self.assertEqual(pool.num_evictions, 1)
        self.assertEqual(pool.lookup(["key0", "key1"]), [0])

    def test_touch_pulls_a_cached_free_block_off_the_free_list(self):
        pool, blocks = cached_pool(num_blocks=11, count=2)
        pool.release(blocks)
        self.assertEqual(pool.free_count(), 11)
        hits = pool.lookup(["key0", "key1"])
        self.assertEqual(pool.free_among(hits), 2)
        pool.touch(hits)
        self.assertEqual(pool.free_count(), 9)
        self.assertEqual(pool.refs, {0: 1, 1: 1})
        self.assertNotIn(0, pool.free)
        self.assertEqual(pool.allocate(1), [2])

    def test_shared_blocks_are_freed_only_when_the_last_reference_goes(self):
        pool, blocks = cached_pool(num_blocks=11, count=2)
        pool.touch(pool.lookup(["key0", "key1"]))
        self.assertEqual(pool.refs, {0: 2, 1: 2})
        pool.release(blocks)
        self.assertEqual(pool.refs, {0: 1, 1: 1})
        self.assertEqual(pool.free_count(), 9)
        pool.release(blocks)
        self.assertEqual(pool.refs, {})
        self.assertEqual(pool.free_count(), 11)

    def test_lookup_returns_the_leading_run_and_stops_at_the_first_miss(self):
        pool, _ = cached_pool(num_blocks=11, count=4)
        self.assertEqual(pool.lookup(["key0", "key1", "nope", "key3"]), [0, 1])
        self.assertEqual(pool.lookup(["nope", "key0"]), [])
        self.assertEqual(pool.lookup([]), [])

    def test_cache_keeps_the_first_block_that_holds_a_key(self):
        pool = make_pool(num_blocks=11)
        first, second = pool.allocate(2)
        pool.cache(first, "system-a")
        pool.cache(second, "system-a")
        self.assertEqual(pool.lookup(["system-a"]), [first])
        self.assertEqual(pool.key_of, {first: "system-a"})

    def test_free_among_counts_only_blocks_on_the_free_list(self):
        pool, blocks = cached_pool(num_blocks=11, count=3)
        pool.release([blocks[1]])
        self.assertEqual(pool.free_among([0, 1, 2]), 1)

    def test_allocating_more_than_is_free_raises_capacity_error(self):
        pool = make_pool(num_blocks=11)
        pool.allocate(10)
        with self.assertRaisesRegex(main.CapacityError, "asked for 2 KV blocks, 1 free"):
            pool.allocate(2)
        self.assertEqual(pool.free_count(), 1)


if __name__ == "__main__":
    unittest.main()
