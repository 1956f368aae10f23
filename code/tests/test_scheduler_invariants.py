"""Randomised invariants: thousands of tiny engines with mixed flags, checked after every step."""

import dataclasses
import random
import unittest

from support import free_blocks, keys_held, main, make_scheduler, ref_counts

NUM_SEEDS = 2500  # the whole set, which bench.py check runs
SUITE_SHARE = 5   # the suite checks every fifth of them


def random_case(rng, extend=None):
    block_size = rng.choice((1, 2, 4))
    caching = rng.random() < 0.5
    scheduler = make_scheduler(extend=extend,
        num_blocks=rng.randint(4, 24), block_size=block_size, max_num_seqs=rng.randint(1, 6),
        max_num_batched_tokens=rng.randint(2, 32), chunked_prefill=rng.random() < 0.7,
        prefix_caching=caching, max_model_len=rng.choice((None, None, 32)),
        max_tokens_in_flight=rng.choice((None, None, rng.randint(4, 40))), **server_features(rng, caching))
    requests = []
    for request_id in range(rng.randint(1, 10)):
        prompt = rng.randint(1, 16)
        prefix = rng.choice((None, "a", "b"))
        requests.append(main.Request(request_id, prompt, rng.randint(1, 12), rng.randint(0, 12),
                                     prefix, rng.randint(0, prompt) if prefix else 0))
    return scheduler, requests


def server_features(rng, caching):
    """Speculative decoding in a third of the cases, a host tier in a third of those that cache."""
    features = {}
    if rng.random() < 0.33:
        features.update(speculative_method="ngram", num_speculative_tokens=rng.randint(1, 4),
                        acceptance_rate=rng.choice((0.0, 0.5, 0.9, 1.0)), speculative_seed=rng.randint(0, 99))
    if caching and rng.random() < 0.33:
        features.update(kv_offloading_blocks=rng.randint(1, 12))
    return features


def counting_looks(scheduler_class):
    """scheduler_class, counting the times admission looks at a waiting request's KV."""
    class CountingLooks(scheduler_class):
        num_looks = 0

        def _tokens_with_kv(self, request, num_hit_tokens):
            self.num_looks += 1
            return super()._tokens_with_kv(request, num_hit_tokens)
    return CountingLooks


def run_to_end(scheduler, requests, on_batch, after_step=lambda: None, max_num_steps=2000):
    """Step a case until nothing is left: on_batch(batch) as each step is scheduled,
    after_step() once it is applied. False if it has not ended after max_num_steps."""
    arrivals = sorted(requests, key=lambda r: r.arrival_s)
    for step_index in range(max_num_steps):
        while arrivals and arrivals[0].arrival_s <= step_index:
            scheduler.add(arrivals.pop(0))
        if not scheduler.has_work() and not arrivals:
            return True
        batch = scheduler.schedule(float(step_index))
        on_batch(batch)
        scheduler.update(batch, step_index + 1.0)
        after_step()
    return False


class SchedulerInvariantTest(unittest.TestCase):

    def check_pool(self, scheduler):
        pool = scheduler.pool
        refs, free = ref_counts(pool), free_blocks(pool)
        self.assertEqual(len(refs) + len(free), pool.num_blocks, "used + free = total")
        self.assertEqual(len(free), pool.free_count(), "the free count counts the free list")
        self.assertEqual(len(set(free)), len(free), "a block is on the free list once")
        self.assertFalse(set(refs) & set(free), "a block is used or free, not both")
        holders = {}
        for request in scheduler.running:
            self.assertEqual(len(request.blocks), scheduler.blocks_for(request.computed))
            for block in request.blocks:
                holders[block] = holders.get(block, 0) + 1
        self.assertEqual(holders, refs, "reference counts equal the running requests holding a block")
        for request in scheduler.waiting:
            self.assertEqual((request.blocks, request.computed), ([], 0))
        self.assertEqual(keys_held(pool), {block: key for key, block in pool.cached.items()})
        if scheduler.host is not None:
            self.assertFalse(set(scheduler.host.keys) & set(pool.cached), "a key in both tiers")
            self.assertLessEqual(len(scheduler.host.keys), scheduler.host.num_blocks)

    def run_case(self, seed):
        rng = random.Random(seed)
        scheduler, requests = random_case(rng)
        config = scheduler.config

        def check_batch(batch):
            self.assertLessEqual(sum(tokens for _, tokens in batch), config.max_num_batched_tokens)
            self.assertLessEqual(len(scheduler.running), config.max_num_seqs)
            self.assertEqual(len({id(request) for request, _ in batch}), len(batch))
            for request, tokens in batch:
                drafts = scheduler.drafts.num_to_draft(request) if scheduler.drafts and request.remaining == 1 else 0
                self.assertTrue(0 < tokens <= request.remaining + drafts)
        ended = run_to_end(scheduler, requests, check_batch, lambda: self.check_pool(scheduler))
        self.assertTrue(ended, "the run did not terminate")
        for request in requests:
            if request.error is None:
                self.assertEqual(len(request.token_times), request.max_tokens)
                self.assertEqual(request.token_times, sorted(request.token_times))
            else:
                self.assertEqual(request.token_times, [])
        self.assertEqual(scheduler.pool.free_count(), scheduler.pool.num_blocks)

    def test_invariants_hold_after_every_step_for_many_seeds(self):
        for seed in range(0, NUM_SEEDS, SUITE_SHARE):
            with self.subTest(seed=seed):
                self.run_case(seed)

    def test_a_refusal_left_standing_is_what_a_fresh_look_decides(self):
        """The head refused for want of blocks is not looked at again while no block is freed
        and no key cached: every step must come out as it does when it is looked at anew."""
        num_spared = 0
        for seed in range(NUM_SEEDS // 5):
            with self.subTest(seed=seed):
                num_looks, batches = self.replay(seed, remember=True)
                num_fresh_looks, fresh_batches = self.replay(seed, remember=False)
                self.assertEqual(batches, fresh_batches)
                num_spared += num_fresh_looks - num_looks
        self.assertGreater(num_spared, 100)

    def replay(self, seed, remember):
        """A random case run to its end: (times a waiting request was looked at, every step's batch)."""
        scheduler, requests = random_case(random.Random(seed), extend=counting_looks)
        scheduler.REMEMBER_REFUSALS = remember
        batches = []
        self.assertTrue(run_to_end(scheduler, requests, lambda batch: batches.append(
            [(request.request_id, tokens) for request, tokens in batch])))
        return scheduler.num_looks, batches

    def test_the_random_cases_exercise_every_rule(self):
        """Guard against a generator that never preempts, rejects or hits the cache."""
        preemptions = rejections = hits = host_hits = accepted = rejected = 0
        for seed in range(300):
            rng = random.Random(seed)
            scheduler, requests = random_case(rng)
            hardware = dataclasses.replace(main.HARDWARE["l4-24gb"], host_link_gbs=32)
            main.simulate(scheduler, hardware, main.MODELS["llama-3.1-8b"], requests)
            preemptions += scheduler.num_preemptions
            hits += scheduler.num_prefix_hit_tokens
            rejections += sum(request.error is not None for request in requests)
            host_hits += scheduler.host.num_loaded if scheduler.host else 0
            if scheduler.drafts:
                accepted += scheduler.drafts.num_accepted_tokens
                rejected += scheduler.drafts.num_draft_tokens - scheduler.drafts.num_accepted_tokens
        for name, count in (("preemptions", preemptions), ("rejections", rejections), ("prefix hits", hits),
                            ("host-tier hits", host_hits), ("accepted drafts", accepted),
                            ("rejected drafts", rejected)):
            self.assertGreater(count, 0, name)


if __name__ == "__main__":
    unittest.main()
