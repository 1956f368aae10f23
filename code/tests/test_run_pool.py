"""RunPool: the fast engine's pool under prefix caching gives BlockPool's figures, run by run.

Both pools are driven through the same random life of requests whose prefixes share
chains of keys (a trie): admissions that look up, touch and allocate, chunks whose full
blocks are entered (racing requests of the same prefix lose blocks to the first holder),
preemptions and finishes that release; and lives of one prefix computed a block or two
at a time, where requests race to enter the same blocks. After every operation every
figure must agree: free and used blocks, evictions, keys entered, blocks freed, each
lookup's length and the free blocks among its hits, and the keys each eviction names, in order.
"""

import random
import unittest

from support import main


class Chains:
    """Content keys as prefix_block_keys() makes them: each names its position and every
    key before it (a node of a trie over a few symbols, numbered as first seen)."""

    def __init__(self, rng, num_symbols):
        self.rng, self.num_symbols, self.nodes = rng, num_symbols, {}

    def chain(self, length):
        keys, parent = [], None
        for _ in range(length):
            parent = self.nodes.setdefault((parent, self.rng.randrange(self.num_symbols)), len(self.nodes) + 1)
            keys.append(parent)
        return keys


class Life:
    """One random life of requests over a BlockPool and a RunPool, checked step by step."""

    def __init__(self, test, seed, racing=False):
        """racing: one chain for all, long prompts computed a block or two at a time, so
        requests of the same prefix often enter blocks another entered first."""
        self.test, self.rng = test, random.Random(seed)
        num_blocks = self.rng.choice((6, 20, 64, 200))
        self.pools = (main.BlockPool(num_blocks), main.RunPool(num_blocks))
        self.evicted = ([], [])  # every key each pool told evict_to of, in order (a host tier's stores)
        for pool, heard in zip(self.pools, self.evicted):
            pool.evict_to = heard.extend
        self.chains = Chains(self.rng, 1 if racing else self.rng.choice((1, 2, 3)))
        self.longest, self.most_grown = (24, 2) if racing else (12, 5)
        self.running = []  # [keys, number of blocks wanted, blocks cached so far, a list per pool]

    def same(self, figures):
        reference, runs = (figures(pool) for pool in self.pools)
        self.test.assertEqual(reference, runs)
        return reference

    def counts(self):
        self.same(lambda pool: (pool.free_count(), pool.used_count(), pool.num_evictions, pool.num_entered,
                                pool.num_freed))
        self.test.assertEqual(*self.evicted)
        self.test.assertEqual(len(self.evicted[0]), self.pools[0].num_evictions)

    def admit(self):
        keys = self.chains.chain(self.rng.randint(0, self.longest))
        wanted = len(keys) + self.rng.randint(1, 4)
        hits = [pool.lookup(keys[:wanted - 1]) for pool in self.pools]
        self.test.assertEqual(len(hits[0]), len(hits[1]))
        free = self.pools[0].free_among(hits[0])
        self.test.assertEqual(self.pools[1].free_among(hits[1]), free)
        first = self.rng.randint(len(hits[0]) + 1, min(wanted, len(hits[0]) + self.most_grown))  # this chunk's blocks
        if first - len(hits[0]) > self.pools[0].free_count() - free:
            return
        request = [keys, wanted, len(hits[0]), []]
        for pool, blocks in zip(self.pools, hits):
            if blocks:
                pool.touch(blocks, keys)
            blocks += pool.allocate(first - len(blocks))
            request[3].append(blocks)
        self.running.append(request)
        self.enter(request)

    def enter(self, request):
        """Enter the full prefix blocks the request has computed (all it holds)."""
        keys, _, cached, lists = request
        full = min(len(keys), len(lists[0]))
        if full > cached:
            for pool, blocks in zip(self.pools, lists):
                pool.cache_range(blocks, keys, cached, full)
            request[2] = full

    def grow(self):
        request = self.rng.choice(self.running)
        more = min(self.rng.randint(1, self.most_grown), request[1] - len(request[3][0]))
        if more <= 0 or more > self.pools[0].free_count():
            return
        for pool, blocks in zip(self.pools, request[3]):
            blocks += pool.allocate(more)
        self.enter(request)

    def release(self):
        request = self.running.pop(self.rng.randrange(len(self.running)))
        for pool, blocks in zip(self.pools, request[3]):
            pool.release(blocks)

    def run(self, num_steps):
        for _ in range(num_steps):
            action = self.rng.random()
            if action < 0.4 or not self.running:
                self.admit()
            elif action < 0.75:
                self.grow()
            else:
                self.release()
            self.counts()
            probe = self.chains.chain(self.rng.randint(1, self.longest))
            self.same(lambda pool: len(pool.lookup(probe)))


NUM_LIVES, NUM_RACING = 300, 100  # the whole sets, which bench.py check runs
SUITE_SHARE = 3  # the suite lives every third of them


def lives(racing, share=1):
    """The seeds of the random lives (racing: of one prefix), every share-th of them."""
    return range(0, NUM_RACING if racing else NUM_LIVES, share)


def live(test, seed, racing):
    """One random life, checked by test's assertions."""
    Life(test, seed, racing).run(200 if racing else 120)


class RunPoolTest(unittest.TestCase):
    def test_a_run_pool_gives_every_figure_of_a_block_pool_over_random_lives(self):
        for seed in lives(False, SUITE_SHARE):
            with self.subTest(seed=seed):
                live(self, seed, False)

    def test_racing_requests_of_one_prefix_give_every_figure_of_a_block_pool(self):
        for seed in lives(True, SUITE_SHARE):
            with self.subTest(seed=seed):
                live(self, seed, True)

    def test_a_free_run_is_evicted_from_its_last_block_down(self):
        pool = main.RunPool(6)
        blocks = pool.allocate(4)
        pool.cache_range(blocks, ["a", "b", "c", "d"], 0, 4)
        pool.release(blocks)
        pool.allocate(2 + 1)  # the two plain blocks first, then the run's top
        self.assertEqual(len(pool.lookup(["a", "b", "c", "d"])), 3)
        self.assertEqual(pool.num_evictions, 1)

    def test_hits_ending_inside_a_free_run_revive_only_its_lower_part(self):
        pool = main.RunPool(8)
        blocks = pool.allocate(5)
        pool.cache_range(blocks, ["a", "b", "c", "d", "e"], 0, 5)
        pool.release(blocks)
        hits = pool.lookup(["a", "b"])
        self.assertEqual(pool.free_among(hits), 2)
        pool.touch(hits, ["a", "b"])
        self.assertEqual(pool.free_count(), 6)
        pool.allocate(3 + 2)  # the plain blocks, then c's run from its top: e, d
        self.assertEqual((len(pool.lookup(["a", "b", "c", "d", "e"])), pool.num_evictions), (3, 2))

    def test_a_block_entered_second_stays_plain_and_is_never_a_hit(self):
        pool = main.RunPool(8)
        first, second = pool.allocate(2), pool.allocate(3)
        pool.cache_range(first, ["a", "b"], 0, 2)
        pool.cache_range(second, ["a", "b", "c"], 0, 3)  # a, b held already: only c is entered
        self.assertEqual(pool.num_entered, 3)
        pool.release(first)
        pool.allocate(3 + 2)  # the free blocks, then a and b
        self.assertEqual(len(pool.lookup(["a", "b", "c"])), 0)
        self.assertEqual(pool.num_evictions, 2)

    def test_keys_lost_past_a_chunk_boundary_are_found_in_the_run_that_won_them(self):
        for pool in (main.BlockPool(10), main.RunPool(10)):
            keys, late = list("abcd"), pool.allocate(1)
            early = pool.allocate(3)
            pool.cache_range(early, keys, 0, 3)
            pool.cache_range(late, keys, 0, 1)  # a is early's
            late += pool.allocate(1)
            pool.cache_range(late, keys, 1, 2)  # b too, though late does not hold a
            late += pool.allocate(2)
            pool.cache_range(late, keys, 2, 4)  # c too; d is late's
            self.assertEqual(pool.num_entered, 4)
            pool.release(early)
            pool.allocate(6)  # the three never used, then c, b, a
            self.assertEqual((len(pool.lookup(keys)), pool.num_evictions), (0, 3))
            pool.release(late)
            pool.allocate(1)  # d, the last block late released first
            self.assertEqual(pool.num_evictions, 4)


if __name__ == "__main__":
    unittest.main()
