"""The scheduler, one test per rule, with literal batches and block ids.

Batches are written as (request_id, tokens) pairs; block_size is 4 throughout.
"""

import unittest

from support import main, make_request, make_scheduler, ref_counts, step


class RequestTest(unittest.TestCase):

    def test_length_and_remaining_follow_generated_and_computed(self):
        request = make_request(prompt_tokens=10, max_tokens=5)
        self.assertEqual((request.length, request.remaining), (10, 10))
        request.computed, request.generated = 10, 1
        self.assertEqual((request.length, request.remaining), (11, 1))


class SchedulerTest(unittest.TestCase):

    def test_a_new_request_prefills_its_prompt_then_decodes_one_token_per_step(self):
        scheduler = make_scheduler(num_blocks=11)
        request = make_request(0, prompt_tokens=10, max_tokens=3)
        scheduler.add(request)
        self.assertEqual(step(scheduler, 0.0), [(0, 10)])
        self.assertEqual((request.computed, request.generated, request.blocks), (10, 1, [0, 1, 2]))
        self.assertEqual(step(scheduler, 1.0), [(0, 1)])
        self.assertEqual(step(scheduler, 2.0), [(0, 1)])
        self.assertEqual(request.token_times, [1.0, 2.0, 3.0])
        self.assertEqual((scheduler.running, request.blocks, scheduler.pool.free_count()), ([], [], 11))

    def test_chunked_prefill_splits_a_prompt_and_samples_only_when_it_is_done(self):
        scheduler = make_scheduler(max_num_batched_tokens=4)
        request = make_request(0, prompt_tokens=10, max_tokens=2)
        scheduler.add(request)
        self.assertEqual([step(scheduler, t) for t in (0.0, 1.0, 2.0)], [[(0, 4)], [(0, 4)], [(0, 2)]])
        self.assertEqual(request.token_times, [3.0])
        self.assertEqual(step(scheduler, 3.0), [(0, 1)])
        self.assertTrue(request.finished)

    def test_a_long_prefill_threshold_caps_each_prompts_chunk_and_lets_the_next_prompt_in(self):
        # vLLM's --long-prefill-token-threshold 4: a 10-token prompt computes 4, 4, 2 tokens while a
        # 3-token prompt behind it shares the first step's budget of 16
        scheduler = make_scheduler(max_num_batched_tokens=16, long_prefill_token_threshold=4)
        long, short = make_request(0, prompt_tokens=10, max_tokens=2), make_request(1, prompt_tokens=3, max_tokens=2)
        scheduler.add(long)
        scheduler.add(short)
        self.assertEqual(step(scheduler, 0.0), [(0, 4), (1, 3)])
        self.assertEqual(step(scheduler, 1.0), [(0, 4), (1, 1)])
        self.assertEqual(step(scheduler, 2.0), [(0, 2)])
        self.assertEqual(long.token_times, [3.0])

    def test_sglang_prefills_or_decodes_a_step_never_both(self):
        # a 10-token prompt in chunks of 8: its chunks have steps of their own, then the two decode
        # together; a decoding request waits while a new prompt prefills
        scheduler = make_scheduler(max_num_batched_tokens=8, scheduler="sglang")
        first, second = make_request(0, prompt_tokens=4, max_tokens=3), make_request(1, prompt_tokens=10, max_tokens=2)
        scheduler.add(first)
        self.assertEqual(step(scheduler, 0.0), [(0, 4)])
        scheduler.add(second)
        self.assertEqual(step(scheduler, 1.0), [(1, 8)])   # a prefill step: request 0 does not decode
        self.assertEqual(step(scheduler, 2.0), [(1, 2)])   # the chunked request goes on alone
        self.assertEqual(step(scheduler, 3.0), [(0, 1), (1, 1)])  # nothing to prefill: every request decodes
        self.assertEqual(first.token_times, [1.0, 4.0])

    def test_running_requests_go_first_in_admission_order_then_waiting_ones(self):
        scheduler = make_scheduler(num_blocks=11)
        for request_id in (0, 1):
            scheduler.add(make_request(request_id, prompt_tokens=8, max_tokens=5))
        self.assertEqual(step(scheduler), [(0, 8), (1, 8)])
        scheduler.add(make_request(2, prompt_tokens=8, max_tokens=5))
        self.assertEqual(step(scheduler), [(0, 1), (1, 1), (2, 8)])

    def test_decodes_and_a_prefill_chunk_share_the_token_budget(self):
        scheduler = make_scheduler(num_blocks=11, max_num_batched_tokens=10)
        scheduler.add(make_request(0, prompt_tokens=8, max_tokens=9))
        self.assertEqual(step(scheduler), [(0, 8)])
        scheduler.add(make_request(1, prompt_tokens=20, max_tokens=2))
        self.assertEqual([step(scheduler) for _ in range(3)],
                         [[(0, 1), (1, 9)], [(0, 1), (1, 9)], [(0, 1), (1, 2)]])

    def test_waiting_requests_are_admitted_first_come_first_served_with_head_of_line_blocking(self):
        scheduler = make_scheduler(num_blocks=6)
        scheduler.add(make_request(0, prompt_tokens=12, max_tokens=9))
        self.assertEqual(step(scheduler), [(0, 12)])
        scheduler.add(make_request(1, prompt_tokens=16, max_tokens=1))  # needs 4 blocks
        scheduler.add(make_request(2, prompt_tokens=4, max_tokens=1))   # needs 1 block
        # Request 0 grows into its 4th block, leaving 2 free: too few for the head.
        self.assertEqual(step(scheduler), [(0, 1)])
        self.assertEqual([request.request_id for request in scheduler.waiting], [1, 2])
        self.assertEqual(scheduler.pool.free_count(), 2)

    def test_max_num_seqs_caps_the_running_batch(self):
        scheduler = make_scheduler(num_blocks=11, max_num_seqs=2)
        for request_id in range(3):
            scheduler.add(make_request(request_id, prompt_tokens=4, max_tokens=2))
        self.assertEqual(step(scheduler), [(0, 4), (1, 4)])
        self.assertEqual(step(scheduler), [(0, 1), (1, 1)])
        self.assertEqual(step(scheduler), [(2, 4)])

    def _two_requests_filling_four_blocks(self, first_prompt=7, first_max_tokens=3):
        """Requests 0 and 1 hold all 4 blocks; request 2 waits behind them."""
        scheduler = make_scheduler(num_blocks=4)
        first = make_request(0, prompt_tokens=first_prompt, max_tokens=first_max_tokens)
        second = make_request(1, prompt_tokens=7, max_tokens=4)
        scheduler.add(first)
        scheduler.add(second)
        self.assertEqual(step(scheduler, 0.0), [(0, first_prompt), (1, 7)])
        scheduler.add(make_request(2, prompt_tokens=1, max_tokens=1))
        self.assertEqual(step(scheduler, 1.0), [(0, 1), (1, 1)])
        return scheduler, first, second

    def test_scheduler_preempts_the_last_admitted_when_a_block_runs_out(self):
        scheduler, first, second = self._two_requests_filling_four_blocks()
        self.assertEqual((first.blocks, second.blocks), ([0, 1], [2, 3]))
        # Request 0 needs a third block: request 1, the newest, is preempted for it.
        self.assertEqual(step(scheduler, 2.0), [(0, 1)])
        self.assertEqual(first.blocks, [], "request 0 finished and released its blocks")
        self.assertEqual((second.blocks, second.computed, second.preemptions), ([], 0, 1))
        self.assertEqual(scheduler.num_preemptions, 1)
        self.assertEqual(first.token_times, [1.0, 2.0, 3.0])

    def test_preempted_request_goes_back_to_the_head_of_the_queue(self):
        scheduler, _, second = self._two_requests_filling_four_blocks(first_max_tokens=9)
        step(scheduler, 2.0)
        self.assertEqual([request.request_id for request in scheduler.waiting], [1, 2])
        self.assertEqual(scheduler.running[0].blocks, [0, 1, 3], "the freed tail block is reused first")

    def test_scheduler_preempts_the_asker_itself_when_it_is_the_newest(self):
        scheduler, first, second = self._two_requests_filling_four_blocks(first_prompt=6, first_max_tokens=9)
        # Request 0 (7 tokens) still fits its 2 blocks; request 1 (9 tokens) needs a 3rd.
        self.assertEqual(step(scheduler, 2.0), [(0, 1)])
        self.assertEqual((second.preemptions, second.blocks), (1, []))
        self.assertEqual([request.request_id for request in scheduler.running], [0])

    def test_scheduler_admits_nobody_in_a_step_that_preempted(self):
        scheduler = make_scheduler(num_blocks=3, max_num_batched_tokens=9)
        newest = make_request(1, prompt_tokens=7, max_tokens=3)
        scheduler.add(make_request(0, prompt_tokens=2, max_tokens=3))
        scheduler.add(newest)
        self.assertEqual(step(scheduler), [(0, 2), (1, 7)])
        self.assertEqual(step(scheduler), [(0, 1), (1, 1)])
        # Request 1 needs a 3rd block and preempts itself. A chunk of 8 of its 9 tokens
        # would fit the 2 blocks it freed and the 8 tokens of budget left, but a step
        # that preempted admits nobody.
        self.assertEqual(step(scheduler), [(0, 1)])
        self.assertEqual((newest.preemptions, list(scheduler.waiting)), (1, [newest]))
        self.assertEqual(step(scheduler), [(1, 9)])

    def test_recompute_after_preemption_prefills_prompt_plus_output_and_keeps_streamed_tokens(self):
        scheduler, first, second = self._two_requests_filling_four_blocks()
        step(scheduler, 2.0)  # preempts request 1 after it streamed 2 tokens; request 0 finishes
        self.assertEqual(second.token_times, [1.0, 2.0])
        # Readmitted: 7 prompt + 2 generated tokens recomputed in one step, then request 2.
        self.assertEqual(step(scheduler, 3.0), [(1, 9), (2, 1)])
        self.assertEqual(second.token_times, [1.0, 2.0, 4.0])
        self.assertEqual(step(scheduler, 4.0), [(1, 1)])
        self.assertEqual((second.generated, second.finished), (4, True))

    def test_with_prefix_caching_a_preempted_request_recomputes_only_the_blocks_it_lost(self):
        scheduler = make_scheduler(num_blocks=5, prefix_caching=True)
        first, second = make_request(0, prompt_tokens=7, max_tokens=3), make_request(1, prompt_tokens=7, max_tokens=6)
        scheduler.add(first)
        scheduler.add(second)
        self.assertEqual([step(scheduler, 0.0), step(scheduler, 1.0)], [[(0, 7), (1, 7)], [(0, 1), (1, 1)]])
        # Both hold 8 tokens in two full blocks; request 0 takes the last free block and
        # request 1, the newest, is preempted for want of one: its blocks 2 and 3 are freed
        # still holding its 7 prompt tokens and its first answer token.
        self.assertEqual(step(scheduler, 2.0), [(0, 1)])
        self.assertEqual((second.preemptions, second.blocks), (1, []))
        # Readmitted, it finds both and computes only its last token (9 tokens without the cache).
        self.assertEqual(step(scheduler, 3.0), [(1, 1)])
        self.assertEqual((second.blocks, second.computed, second.generated), ([2, 3, 4], 9, 3))

    def test_a_preempted_requests_blocks_evicted_before_it_returns_are_computed_again(self):
        scheduler = make_scheduler(num_blocks=5, prefix_caching=True)
        scheduler.add(make_request(0, prompt_tokens=7, max_tokens=8))
        second = make_request(1, prompt_tokens=7, max_tokens=6)
        scheduler.add(second)
        batches = [step(scheduler, float(now_s)) for now_s in range(9)]
        self.assertEqual(batches[2:8], [[(0, 1)]] * 6)  # request 1 preempted at step 2, its tail block 3 freed first
        # Request 0's fourth block (step 6) evicted block 3; block 2 still holds request 1's
        # first 4 tokens: readmitted once request 0 is done, it computes the other 5.
        self.assertEqual(batches[8], [(1, 5)])
        self.assertEqual(second.blocks, [2, 3, 4])
        # vLLM counts a readmission's hits apart from new requests' (its prefix_cache_hits and
        # a request's cached tokens are of its first admission): 4 tokens found again, 0 hit
        self.assertEqual((scheduler.num_preempted_hit_tokens, scheduler.num_prefix_hit_tokens,
                          scheduler.num_prefix_query_tokens, second.num_prefix_hit_tokens), (4, 0, 14, 0))

    def test_no_chunked_prefill_admits_a_prompt_only_if_all_of_it_fits_the_remaining_budget(self):
        scheduler = make_scheduler(num_blocks=11, max_num_batched_tokens=10, chunked_prefill=False)
        for request_id, prompt in ((0, 6), (1, 6), (2, 3)):
            self.assertTrue(scheduler.add(make_request(request_id, prompt_tokens=prompt, max_tokens=4)))
        self.assertEqual(step(scheduler), [(0, 6)])
        self.assertEqual(step(scheduler), [(0, 1), (1, 6), (2, 3)])

    def test_chunked_prefill_fills_the_budget_with_a_partial_prompt(self):
        scheduler = make_scheduler(num_blocks=11, max_num_batched_tokens=10)
        for request_id, prompt in ((0, 6), (1, 6), (2, 3)):
            scheduler.add(make_request(request_id, prompt_tokens=prompt, max_tokens=4))
        self.assertEqual(step(scheduler), [(0, 6), (1, 4)])

    def test_no_chunked_prefill_rejects_requests_longer_than_the_budget(self):
        scheduler = make_scheduler(max_num_batched_tokens=10, chunked_prefill=False)
        request = make_request(0, prompt_tokens=8, max_tokens=4)
        self.assertFalse(scheduler.add(request))
        self.assertEqual(request.error_kind, "batched-tokens")
        self.assertEqual(request.error, "prompt + output 12 tokens exceed --max-num-batched-tokens 10 "
                                        "without chunked prefill")
        self.assertFalse(scheduler.has_work())

    def test_a_request_longer_than_max_model_len_is_rejected(self):
        scheduler = make_scheduler(max_model_len=16)
        request = make_request(0, prompt_tokens=14, max_tokens=4)
        self.assertFalse(scheduler.add(request))
        self.assertEqual(request.error, "prompt + output 18 tokens exceed --max-model-len 16")

    def test_a_request_needing_more_blocks_than_the_cache_has_is_rejected(self):
        scheduler = make_scheduler(num_blocks=4)
        request = make_request(0, prompt_tokens=14, max_tokens=4)
        self.assertFalse(scheduler.add(request))
        self.assertEqual(request.error, "prompt + output 18 tokens need 5 KV blocks, the cache has 4")

    def test_prefix_caching_reuses_full_prefix_blocks_by_name_and_position(self):
        scheduler = make_scheduler(num_blocks=11, prefix_caching=True)
        first = make_request(0, prompt_tokens=10, max_tokens=5, prefix="sys", prefix_tokens=8)
        scheduler.add(first)
        self.assertEqual(step(scheduler), [(0, 10)])
        self.assertEqual(scheduler.pool.cached, {("sys", 0): 0, ("sys", 1): 1})
        second = make_request(1, prompt_tokens=12, max_tokens=5, prefix="sys", prefix_tokens=8)
        scheduler.add(second)
        self.assertEqual(step(scheduler), [(0, 1), (1, 4)])
        self.assertEqual(second.blocks, [0, 1, 3])
        self.assertEqual(ref_counts(scheduler.pool)[0], 2)
        self.assertEqual((scheduler.num_prefix_hit_tokens, scheduler.num_prefix_query_tokens), (8, 22))

    def test_prefix_caching_always_computes_the_last_prompt_token(self):
        scheduler = make_scheduler(num_blocks=11, prefix_caching=True)
        scheduler.add(make_request(0, prompt_tokens=8, max_tokens=1, prefix="sys", prefix_tokens=8))
        step(scheduler)
        self.assertEqual(len(scheduler.pool.cached), 2)
        scheduler.add(make_request(1, prompt_tokens=8, max_tokens=1, prefix="sys", prefix_tokens=8))
        # Both blocks are cached, but only the first is used: the 8th token must be computed.
        self.assertEqual(step(scheduler), [(1, 4)])

    def test_a_block_cached_this_step_is_a_hit_for_a_request_admitted_after_it(self):
        scheduler = make_scheduler(num_blocks=11, prefix_caching=True)
        for request_id in (0, 1):
            scheduler.add(make_request(request_id, prompt_tokens=10, max_tokens=2, prefix="sys",
                                       prefix_tokens=8))
        self.assertEqual(step(scheduler), [(0, 10), (1, 2)])

    def test_a_lookup_resumes_past_the_last_ones_hits_only_while_none_of_them_is_evicted(self):
        for resume, expected in ((True, [3, 0, 0, 3]), (False, [3, 3, 3, 3])):
            pool, looked_up = main.BlockPool(11), []
            pool.RESUME_LOOKUPS = resume
            keys = [("sys", 0), ("sys", 1), ("sys", 2)]
            pool.cache_many(pool.allocate(3), keys)
            pool.release([0, 1, 2])  # free list: 3 .. 10, then 2, 1, 0
            lookup = pool.lookup
            pool.lookup = lambda wanted: looked_up.append(len(wanted)) or lookup(wanted)
            hits, memo = pool.lookup_again(keys, None)
            self.assertEqual(hits, [0, 1, 2])
            hits.append(99)  # NOTE: the hits become the request's blocks, which grow
            hits, memo = pool.lookup_again(keys, memo)
            self.assertEqual(hits, [0, 1, 2])
            pool.allocate(8)  # blocks 3 .. 10, which hold no key
            hits, memo = pool.lookup_again(keys, memo)
            self.assertEqual(hits, [0, 1, 2])
            pool.allocate(1)  # block 2: evicts ("sys", 2)
            self.assertEqual(pool.lookup_again(keys, memo)[0], [0, 1])
            # whole, nothing new twice, whole again after the eviction (or whole every time)
            self.assertEqual(looked_up, expected)

    def test_requests_with_different_prefix_names_share_nothing(self):
        scheduler = make_scheduler(num_blocks=11, prefix_caching=True)
        scheduler.add(make_request(0, prompt_tokens=10, max_tokens=2, prefix="a", prefix_tokens=8))
        scheduler.add(make_request(1, prompt_tokens=10, max_tokens=2, prefix="b", prefix_tokens=8))
        self.assertEqual(step(scheduler), [(0, 10), (1, 10)])
        self.assertEqual(scheduler.num_prefix_hit_tokens, 0)

    def test_without_prefix_caching_identical_prefixes_are_computed_twice(self):
        scheduler = make_scheduler(num_blocks=11)
        for request_id in (0, 1):
            scheduler.add(make_request(request_id, prompt_tokens=10, max_tokens=2, prefix="sys",
                                       prefix_tokens=8))
        self.assertEqual(step(scheduler), [(0, 10), (1, 10)])
        self.assertEqual(scheduler.pool.cached, {})

    def test_queue_time_runs_from_sent_to_the_start_of_the_first_step_that_scheduled_it(self):
        scheduler = make_scheduler(num_blocks=11, max_num_seqs=1)
        first, second = make_request(0, 4, 2), make_request(1, 4, 2)
        first.sent_s = second.sent_s = 0.0
        scheduler.add(first)
        scheduler.add(second)
        for now_s in (0.0, 1.0, 2.0):
            step(scheduler, now_s)
        self.assertEqual((first.queue_s, second.queue_s), (0.0, 2.0))


def recording_looks(scheduler_class):
    """scheduler_class, recording the id of each waiting request admission looks at."""
    class RecordingLooks(scheduler_class):
        def __init__(self, *args):
            super().__init__(*args)
            self.looked_at = []

        def _tokens_with_kv(self, request, num_hit_tokens):
            if request.request_id not in self.looked_at:
                self.looked_at.append(request.request_id)
            return super()._tokens_with_kv(request, num_hit_tokens)
    return RecordingLooks


def ids(batch):
    return [(request.request_id, num_tokens) for request, num_tokens in batch]


class StandingRefusalTest(unittest.TestCase):
    """A head refused for want of blocks is not looked at again until something that could
    change the answer has changed: a block freed, a key entered, a smaller budget, another head."""

    def test_a_head_refused_for_blocks_is_looked_at_again_only_once_a_block_is_freed(self):
        scheduler = make_scheduler(num_blocks=4, block_size=4, prefix_caching=True, extend=recording_looks)
        scheduler.add(make_request(0, prompt_tokens=8, max_tokens=8))
        scheduler.add(make_request(1, prompt_tokens=12, max_tokens=2, prefix="p", prefix_tokens=8))
        steps = []
        for index in range(9):
            scheduler.looked_at = []
            steps.append((step(scheduler, float(index)), scheduler.looked_at))
        self.assertEqual(steps, [([(0, 8)], [0, 1])]  # 1 needs 3 blocks, 2 are free
                         + [([(0, 1)], [])] * 7  # 0 decodes, taking blocks and freeing none
                         + [([(1, 12)], [1])])  # 0 ended and freed its 4 blocks

    def test_a_refusal_stands_no_longer_once_a_key_of_the_heads_prefix_is_entered(self):
        scheduler = make_scheduler(num_blocks=3, block_size=4, prefix_caching=True)
        first = make_request(0, prompt_tokens=8, max_tokens=4, prefix="p", prefix_tokens=8)
        second = make_request(1, prompt_tokens=10, max_tokens=2, prefix="p", prefix_tokens=8)
        scheduler.add(first)
        scheduler.add(second)
        # a caller that splits each step's budget itself (as a fast engine or a subclass may)
        batch, _ = scheduler.schedule_waiting(6, 0.0)  # 0 computes 6 tokens: 2 blocks, 1 of them full
        scheduler.update(batch, 1.0)
        batch, _, _ = scheduler.schedule_running(1)
        admitted, _ = scheduler.schedule_waiting(8, 1.0)
        self.assertEqual((ids(batch), ids(admitted)), ([(0, 1)], []))  # 1 hits 1 block and needs 2 more; 1 is free
        scheduler.update(batch, 2.0)
        batch, _, _ = scheduler.schedule_running(1)  # 0's second block is full: its key enters, no block is freed
        admitted, _ = scheduler.schedule_waiting(8, 2.0)
        self.assertEqual((ids(batch), ids(admitted)), ([(0, 1)], [(1, 2)]))  # 1 hits 2 blocks, needs 1

    def test_a_refusal_stands_no_longer_once_a_key_leaves_the_host_tier(self):
        scheduler = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=4, prefix_caching=True,
                                   kv_offloading_blocks=6)
        scheduler.host.store([("doc", index) for index in range(4)])  # evicted earlier: 16 tokens of "doc"
        scheduler.add(make_request(0, prompt_tokens=4, max_tokens=8))
        self.assertEqual(step(scheduler), [(0, 4)])
        scheduler.add(make_request(1, prompt_tokens=20, max_tokens=2, prefix="doc", prefix_tokens=20))
        # 1 has 16 tokens in host and 3 of budget: blocks for 19 tokens, 5, where 4 are free
        self.assertEqual(step(scheduler, 1.0), [(0, 1)])
        scheduler.host.discard([("doc", 0)])  # as a host eviction would: no block freed, no key entered
        # without a host hit it computes 3 tokens from the start: 1 block
        self.assertEqual(step(scheduler, 2.0), [(0, 1), (1, 3)])

    def test_a_refusal_stands_no_longer_once_the_budget_is_smaller(self):
        scheduler = make_scheduler(num_blocks=5, block_size=4)
        scheduler.add(make_request(0, prompt_tokens=8, max_tokens=8))
        step(scheduler)  # 0 holds 2 of the 5 blocks
        scheduler.add(make_request(1, prompt_tokens=16, max_tokens=2))
        self.assertEqual(scheduler.schedule_waiting(16, 1.0), ([], 16))  # 16 tokens need 4 blocks
        admitted, budget = scheduler.schedule_waiting(12, 1.0)  # a smaller chunk needs fewer
        self.assertEqual((ids(admitted), budget), ([(1, 12)], 0))

    def test_a_refusal_is_of_its_request_the_next_head_is_looked_at_once_it_is_aborted(self):
        scheduler = make_scheduler(num_blocks=5, block_size=4)
        scheduler.add(make_request(0, prompt_tokens=8, max_tokens=8))
        step(scheduler, 0.0)
        refused = make_request(1, prompt_tokens=16, max_tokens=2)
        scheduler.add(refused)
        scheduler.add(make_request(2, prompt_tokens=4, max_tokens=2))
        self.assertEqual(step(scheduler, 1.0), [(0, 1)])  # 1 needs 4 blocks, 2 are free
        scheduler.abort(refused)  # the client gave up: nothing is freed
        self.assertEqual(step(scheduler, 2.0), [(0, 1), (2, 4)])


if __name__ == "__main__":
    unittest.main()
