"""BlockPool: the LRU free list, reference counts and the content cache, by exact block ids."""

import random
import unittest

from support import free_blocks, keys_held, main, make_pool, ref_counts


class ReferencePool:
    """The pool's contract written plainly (an ordered dict as the free list), for the
    randomised test to hold the real one against."""

    def __init__(self, num_blocks):
        self.free, self.refs, self.cached, self.key_of = dict.fromkeys(range(num_blocks)), {}, {}, {}
        self.num_evictions = 0
        self.evicted = []  # every key evicted, in order

    def allocate(self, count):
        blocks = list(self.free)[:count]
        for block in blocks:
            del self.free[block]
            self.refs[block] = 1
            if block in self.key_of:
                self.evicted.append(self.key_of.pop(block))
                del self.cached[self.evicted[-1]]
                self.num_evictions += 1
        return blocks

    def release(self, blocks):
        for block in reversed(blocks):
            self.refs[block] -= 1
            if not self.refs[block]:
                del self.refs[block]
                self.free[block] = None

    def cache_many(self, blocks, keys):
        for block, key in zip(blocks, keys):
            if key not in self.cached and block not in self.key_of:
                self.cached[key], self.key_of[block] = block, key

    def lookup(self, keys):
        hits = []
        for key in keys:
            if key not in self.cached:
                break
            hits.append(self.cached[key])
        return hits

    def touch(self, blocks):
        for block in blocks:
            self.free.pop(block, None)
            self.refs[block] = self.refs.get(block, 0) + 1


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
        self.assertEqual(free_blocks(pool), [2, 0, 3])
        self.assertEqual(pool.allocate(2), [2, 0])
        self.assertEqual(pool.num_evictions, 2)
        self.assertEqual(pool.lookup(["key2"]), [])
        self.assertEqual(pool.lookup(["key3"]), [3])

    def test_release_walks_in_reverse_so_the_tail_is_evicted_before_the_head(self):
        pool, blocks = cached_pool(num_blocks=4, count=4)
        pool.release(blocks)
        self.assertEqual(free_blocks(pool), [3, 2, 1, 0])
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
        self.assertEqual(ref_counts(pool), {0: 1, 1: 1})
        self.assertNotIn(0, free_blocks(pool))
        self.assertEqual(pool.allocate(1), [2])

    def test_shared_blocks_are_freed_only_when_the_last_reference_goes(self):
        pool, blocks = cached_pool(num_blocks=11, count=2)
        pool.touch(pool.lookup(["key0", "key1"]))
        self.assertEqual(ref_counts(pool), {0: 2, 1: 2})
        pool.release(blocks)
        self.assertEqual(ref_counts(pool), {0: 1, 1: 1})
        self.assertEqual(pool.free_count(), 9)
        pool.release(blocks)
        self.assertEqual(ref_counts(pool), {})
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
        self.assertEqual(keys_held(pool), {first: "system-a"})

    def test_cache_allocated_refuses_a_block_that_already_names_content(self):
        pool = make_pool(num_blocks=11)
        block = pool.allocate(1)[0]
        pool.cache_allocated([block], ["system-a"])
        with self.assertRaisesRegex(RuntimeError, "already names content"):
            pool.cache_allocated([block], ["system-b"])

    def test_free_among_counts_only_blocks_on_the_free_list(self):
        pool, blocks = cached_pool(num_blocks=11, count=3)
        pool.release([blocks[1]])
        self.assertEqual(pool.free_among([0, 1, 2]), 1)

    def test_a_revived_block_released_again_goes_to_the_back_once(self):
        pool, blocks = cached_pool(num_blocks=4, count=4)
        pool.release(blocks)
        pool.touch([1])
        self.assertEqual((free_blocks(pool), pool.free_count()), ([3, 2, 0], 3))
        pool.release([1])
        self.assertEqual(free_blocks(pool), [3, 2, 0, 1])
        self.assertEqual(pool.allocate(3), [3, 2, 0])
        self.assertEqual(pool.lookup(["key0", "key1"]), [])
        self.assertEqual(pool.lookup(["key1"]), [1])

    def test_the_pool_holds_to_the_plain_reference_over_random_calls(self):
        for seed in range(60):
            rng = random.Random(seed)
            num_blocks = rng.randint(1, 12)
            pool, reference = make_pool(num_blocks), ReferencePool(num_blocks)
            if seed % 2:
                pool.REBUILD_AFTER = 0  # rebuild the free list's table whenever more were taken than are left
            held = []  # each holder's blocks, as a request keeps them
            for _ in range(300):
                free = len(reference.free)
                if held and rng.random() < 0.4:
                    blocks = held.pop(rng.randrange(len(held)))
                    pool.release(blocks)
                    reference.release(blocks)
                elif rng.random() < 0.5 and free:
                    count = rng.randint(1, free)
                    blocks = pool.allocate(count)
                    self.assertEqual(blocks, reference.allocate(count), f"seed {seed}")
                    keys = [("k", rng.randint(0, 15)) for _ in blocks]
                    if rng.random() < 0.7:
                        keys = list(dict.fromkeys(keys))  # distinct within one call, as a request's are
                    cache = pool.cache_allocated if rng.random() < 0.5 else pool.cache_many  # fresh blocks: either
                    cache(blocks[:len(keys)], keys)
                    reference.cache_many(blocks[:len(keys)], keys)
                    held.append(blocks)
                    if held and rng.random() < 0.2:  # blocks that may already name content
                        again = held[rng.randrange(len(held))]
                        keys = [("k", rng.randint(0, 15)) for _ in again]
                        pool.cache_many(again, keys)
                        reference.cache_many(again, keys)
                else:
                    keys = [("k", rng.randint(0, 15)) for _ in range(rng.randint(0, 4))]
                    hits = pool.lookup(keys)
                    self.assertEqual(hits, reference.lookup(keys), f"seed {seed}")
                    hits = list(dict.fromkeys(hits))
                    pool.touch(hits)
                    reference.touch(hits)
                    held.append(hits)
                self.assertEqual(free_blocks(pool), list(reference.free), f"seed {seed}")
                self.assertEqual(pool.free_count(), len(reference.free))
                self.assertEqual(ref_counts(pool), reference.refs)
                self.assertEqual((pool.cached, pool.num_evictions), (reference.cached, reference.num_evictions))
                mark = rng.randint(0, reference.num_evictions)
                expected = reference.evicted[mark:] if len(reference.evicted) - mark <= pool.EVICTION_WINDOW else None
                self.assertEqual(pool.evicted_since(mark), expected)

    def test_evicted_since_names_the_keys_evicted_after_a_count_within_its_window(self):
        pool = make_pool(num_blocks=4)
        pool.cache_many(pool.allocate(4), ["a", "b", "c", "d"])
        pool.release([0, 1, 2, 3])  # the free list is now 3, 2, 1, 0
        mark = pool.num_evictions
        pool.allocate(2)
        self.assertEqual(pool.evicted_since(mark), ["d", "c"])
        self.assertEqual(pool.evicted_since(pool.num_evictions), [])
        pool.recent_evictions.clear()  # as if more than the window had been evicted since
        self.assertIsNone(pool.evicted_since(mark))

    def test_allocating_more_than_is_free_raises_capacity_error(self):
        pool = make_pool(num_blocks=11)
        pool.allocate(10)
        with self.assertRaisesRegex(main.CapacityError, "asked for 2 KV blocks, 1 free"):
            pool.allocate(2)
        self.assertEqual(pool.free_count(), 1)


if __name__ == "__main__":
    unittest.main()
