#!/usr/bin/env python3
"""servesim: an LLM server's memory plan, scheduler and metrics, in one file.

An LLM server is a batch scheduler with a KV cache. Every step it picks which
sequences advance, how many prompt tokens to prefill and who waits, under two
budgets: tokens per step and KV cache blocks. servesim does the memory
arithmetic, replays that loop on a virtual clock with a roofline cost per step,
and reports the numbers a real server is judged by (TTFT, TPOT, inter-token
latency, queue time, throughput, KV use) with the same definitions vLLM's
benchmarks use. Standard library only; Python 3.9 or newer.

Usage:
    python3 code/main.py capacity [--hardware H] [--model M] [options]
    python3 code/main.py simulate (--trace FILE | --rate R | --concurrency N) [options]
    python3 code/main.py sweep --concurrency 1,8,32 [options]

Examples:
    # the memory plan: weights, KV per token, blocks, max concurrency, step time
    python3 code/main.py capacity --hardware l4-24gb
    # the scheduler on a trace, with and without prefix caching
    python3 code/main.py simulate --hardware l4-24gb --trace code/fixtures/burst.jsonl
    python3 code/main.py simulate --hardware l4-24gb --trace code/fixtures/burst.jsonl --prefix-caching
    # closed-loop clients: how throughput and latency trade as the batch grows
    python3 code/main.py sweep --requests 256 --concurrency 1,8,32,128,256

Options shared by every subcommand:
    --hardware NAME              h100-sxm-80gb (default), a100-sxm-80gb, l4-24gb, cpu-4vcpu
    --model NAME                 llama-3.1-8b (default), llama-3.1-70b, smollm2-135m-q8_0
    --gpu-memory-utilization F   share of device memory for weights + KV cache (0.90)
    --block-size N               tokens per KV block (16)
    --kv-tokens N                fix the KV cache size in tokens (llama.cpp --ctx-size)
    --max-model-len N            longest request in tokens
    --json                       print the full report as JSON

Options of simulate and sweep:
    --max-num-seqs N             sequences per step (256)
    --max-num-batched-tokens N   tokens per step, prefill chunks included (8192)
    --no-chunked-prefill         a prompt is admitted only if all of it fits the step
    --prefix-caching             share full KV blocks of identical prompt prefixes
    --requests N                 requests to generate (256)
    --prompt-tokens N|LO-HI      prompt length, fixed or uniform in a range (256-1024)
    --output-tokens N|LO-HI      output length, fixed or uniform in a range (64-256)
    --seed N                     seed for lengths and arrivals (0)

Trace format (--trace): JSON Lines, one request per line:
    {"arrival_s": 0.12, "prompt_tokens": 1342, "output_tokens": 251,
     "prefix": "system-a", "prefix_tokens": 1024}
prefix and prefix_tokens are optional: requests whose prompts start with the same
prefix name share its first prefix_tokens tokens, which prefix caching can reuse.

Exit status: 0 success; 1 the model does not fit; 2 bad input (one line on
stderr naming the flag or file:line and what was expected).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from typing import Deque, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

GIB = 1024 ** 3
KIB = 1024
GB = 1e9


# =============================================================================
# Errors
# =============================================================================

class ServesimError(Exception):
    """Base of the errors the CLI turns into an exit code and one line."""

    exit_code = 1


class UsageError(ServesimError):
    """Bad input: a flag, a file or a line that is not what was expected (exit 2)."""

    exit_code = 2


class CapacityError(ServesimError):
    """Something does not fit in memory: a model on a device, blocks in a pool (exit 1)."""

    exit_code = 1


# =============================================================================
# Presets: hardware and models
# =============================================================================

@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU) as the roofline sees it: memory, bandwidth, FLOPs."""

    name: str
    memory_gib: float        # GiB, device memory as nvidia-smi reports it
    bandwidth_gbs: float     # GB/s, peak memory bandwidth (datasheet)
    tflops: float            # TFLOPS, dense BF16 peak without sparsity (datasheet)
    mfu: float               # share of peak FLOPs a real step reaches (model FLOPs utilisation)
    mbu: float               # share of peak bandwidth a real step reaches (bandwidth utilisation)
    step_overhead_ms: float  # ms per step for scheduling, kernel launches and sampling
    reserve_gib: float       # GiB held back for activations (vLLM measures it in a profiling run)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer as the memory plan and the roofline see it."""

    name: str
    params: float            # parameters (model card)
    layers: int              # transformer blocks (config.json num_hidden_layers)
    kv_heads: int            # KV heads (num_key_value_heads); GQA makes it < query heads
    head_dim: int            # dimension of one attention head
    bytes_per_param: float   # 2 for BF16; 34/32 for llama.cpp Q8_0 (32 int8 + one fp16 scale)
    kv_dtype_bytes: int      # bytes per cached key or value element (2 for FP16/BF16)

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        # A key and a value vector per layer per KV head.
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes


# mfu 0.5 and mbu 0.75 on the GPUs: a ratio of 2/3 puts the compute knee of Llama 3.1 8B
# at ~197 tokens per step on an H100 and ~269 on an L4, as the lesson prints.
HARDWARE: Dict[str, Hardware] = {
    hw.name: hw for hw in (
        # H100 SXM5 80GB: nvidia-smi 81,559 MiB; HBM3 3.35 TB/s; 989.4 TFLOPS dense BF16.
        Hardware("h100-sxm-80gb", memory_gib=79.6, bandwidth_gbs=3350, tflops=989.4,
                 mfu=0.5, mbu=0.75, step_overhead_ms=1.0, reserve_gib=2.0),
        # A100 SXM4 80GB: nvidia-smi 81,920 MiB; HBM2e 2,039 GB/s; 312 TFLOPS dense BF16.
        Hardware("a100-sxm-80gb", memory_gib=80.0, bandwidth_gbs=2039, tflops=312,
                 mfu=0.5, mbu=0.75, step_overhead_ms=1.0, reserve_gib=2.0),
        # L4 24GB: nvidia-smi 23,034 MiB; GDDR6 300 GB/s; 121 TFLOPS dense BF16.
        Hardware("l4-24gb", memory_gib=22.5, bandwidth_gbs=300, tflops=121,
                 mfu=0.5, mbu=0.75, step_overhead_ms=1.0, reserve_gib=1.5),
        # A 4-vCPU machine running llama.cpp: effective figures, not datasheet peaks
        # (mfu = mbu = 1), meant to be calibrated against a real server.
        Hardware("cpu-4vcpu", memory_gib=16.0, bandwidth_gbs=20, tflops=0.1,
                 mfu=1.0, mbu=1.0, step_overhead_ms=2.0, reserve_gib=0.5),
    )
}

MODELS: Dict[str, ModelSpec] = {
    model.name: model for model in (
        # meta-llama/Llama-3.1-8B config.json: 32 layers, 8 KV heads of 128; 8.03 B params.
        ModelSpec("llama-3.1-8b", params=8.03e9, layers=32, kv_heads=8, head_dim=128,
                  bytes_per_param=2, kv_dtype_bytes=2),
        # meta-llama/Llama-3.1-70B config.json: 80 layers, 8 KV heads of 128; 70.6 B params.
        ModelSpec("llama-3.1-70b", params=70.6e9, layers=80, kv_heads=8, head_dim=128,
                  bytes_per_param=2, kv_dtype_bytes=2),
        # HuggingFaceTB/SmolLM2-135M-Instruct: 30 layers, 3 KV heads of 64, tied embeddings;
        # 134,515,008 params in llama.cpp's Q8_0; FP16 KV cache.
        ModelSpec("smollm2-135m-q8_0", params=134_515_008, layers=30, kv_heads=3, head_dim=64,
                  bytes_per_param=34 / 32, kv_dtype_bytes=2),
    )
}

DEFAULT_HARDWARE = "h100-sxm-80gb"
DEFAULT_MODEL = "llama-3.1-8b"


def get_preset(presets: Dict[str, object], name: str, flag: str):
    """The preset called name, or a UsageError that lists the valid names."""
    if name not in presets:
        raise UsageError(f"{flag}: unknown preset {name!r}; expected one of {', '.join(presets)}")
    return presets[name]


# =============================================================================
# Capacity: the memory plan
# =============================================================================

@dataclass(frozen=True)
class CapacityPlan:
    """What is left for the KV cache once the weights are in, and what it holds."""

    hardware: Hardware
    model: ModelSpec
    gpu_memory_utilization: float
    block_size: int
    max_model_len: int        # tokens per request in the max-concurrency line
    budget_bytes: float       # device memory x gpu_memory_utilization
    kv_cache_bytes: float     # what the blocks take
    num_blocks: int
    kv_tokens_fixed: bool     # True when --kv-tokens set the size (llama.cpp --ctx-size)

    @property
    def num_kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """How many requests of max_model_len tokens fit in the cache at once."""
        return self.num_kv_tokens / self.max_model_len

    def to_dict(self) -> dict:
        return {
            "hardware": self.hardware.name,
            "model": self.model.name,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "weight_bytes": self.model.weight_bytes,
            "kv_bytes_per_token": self.model.kv_bytes_per_token,
            "budget_bytes": self.budget_bytes,
            "reserve_bytes": self.hardware.reserve_gib * GIB,
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_tokens_fixed": self.kv_tokens_fixed,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "num_kv_tokens": self.num_kv_tokens,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.max_concurrency,
        }


def plan_capacity(hardware: Hardware, model: ModelSpec, gpu_memory_utilization: float = 0.9,
                  block_size: int = 16, kv_tokens: Optional[int] = None,
                  max_model_len: int = 4096) -> CapacityPlan:
    """Size the KV cache the way vLLM does at start-up, with a fixed activation reserve.

    The budget is the device memory times gpu_memory_utilization; the weights and the
    reserve come off it and the rest becomes whole blocks. kv_tokens fixes the cache
    instead (llama.cpp's --ctx-size), which must still fit. Raises CapacityError when
    the weights do not fit, naming the ways out.
    """
    budget = hardware.memory_gib * GIB * gpu_memory_utilization
    reserve = hardware.reserve_gib * GIB
    free = budget - model.weight_bytes - reserve
    if free <= 0:
        raise CapacityError(
            f"{model.name} does not fit on {hardware.name}: weights "
            f"{model.weight_bytes / GB:.2f} GB plus {hardware.reserve_gib:.1f} GiB reserve exceed "
            f"{budget / GIB:.2f} GiB ({hardware.memory_gib:g} GiB x {gpu_memory_utilization:.2f}); "
            f"quantize the weights (FP8, Q8_0, Q4), shard them over several devices with "
            f"tensor parallelism, or use a device with more memory")
    block_bytes = block_size * model.kv_bytes_per_token
    if kv_tokens is not None:
        num_blocks = -(-kv_tokens // block_size)
        if num_blocks * block_bytes > free:
            raise CapacityError(
                f"a {kv_tokens:,}-token KV cache ({num_blocks * block_bytes / GIB:.2f} GiB) does not "
                f"fit in the {free / GIB:.2f} GiB left after {model.name}'s weights on {hardware.name}")
    else:
        num_blocks = int(free // block_bytes)
    return CapacityPlan(hardware, model, gpu_memory_utilization, block_size, max_model_len,
                        budget, num_blocks * block_bytes, num_blocks, kv_tokens is not None)


# =============================================================================
# Roofline: the cost of one step
# =============================================================================

def step_seconds(hardware: Hardware, model: ModelSpec, num_tokens: int,
                 num_context_tokens: int) -> float:
    """Seconds for one forward pass: the slower of moving the bytes and doing the math.

    num_tokens counts every token processed (one per decoding sequence plus prefill
    chunks); num_context_tokens is the KV the attention reads. Attention FLOPs and
    kernel details are left out: a roofline for direction and order of magnitude.
    """
    compute_s = 2 * model.params * num_tokens / (hardware.tflops * 1e12 * hardware.mfu)
    memory_s = ((model.weight_bytes + num_context_tokens * model.kv_bytes_per_token)
                / (hardware.bandwidth_gbs * GB * hardware.mbu))
    return hardware.step_overhead_ms / 1000 + max(compute_s, memory_s)


def critical_batch(hardware: Hardware, model: ModelSpec) -> float:
    """Tokens per step at which the arithmetic takes as long as reading the weights."""
    weight_read_s = model.weight_bytes / (hardware.bandwidth_gbs * GB * hardware.mbu)
    compute_per_token_s = 2 * model.params / (hardware.tflops * 1e12 * hardware.mfu)
    return weight_read_s / compute_per_token_s


# =============================================================================
# KV cache: a pool of blocks with prefix caching
# =============================================================================

class BlockPool:
    """Fixed-size KV blocks: a free list in LRU order, reference counts, a content cache.

    Contract:
    - A block is either in use (reference count >= 1) or on the free list, never both.
    - The free list is ordered least recently released first; allocate() takes from
      the front, release() appends at the back.
    - A block can carry a content key (cache()). Released blocks keep their key, so
      they stay prefix-cache hits until allocate() reaches them and evicts the key.
    - touch() takes a reference on cached blocks, pulling free ones off the free list.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free: "OrderedDict[int, None]" = OrderedDict((block, None) for block in range(num_blocks))
        self.refs: Dict[int, int] = {}
        self.cached: Dict[Hashable, int] = {}   # content key -> block
        self.key_of: Dict[int, Hashable] = {}   # block -> content key
        self.num_evictions = 0

    def free_count(self) -> int:
        return len(self.free)

    def used_count(self) -> int:
        return self.num_blocks - len(self.free)

    def free_among(self, blocks: Iterable[int]) -> int:
        """How many of blocks sit on the free list (touching them would take them off)."""
        return sum(1 for block in blocks if block in self.free)

    def allocate(self, count: int) -> List[int]:
        """Take count blocks from the front of the free list, evicting their cached keys."""
        if count > len(self.free):
            raise CapacityError(f"asked for {count} KV blocks, {len(self.free)} free")
        blocks = []
        for _ in range(count):
            block, _ = self.free.popitem(last=False)
            key = self.key_of.pop(block, None)
            if key is not None:
                del self.cached[key]
                self.num_evictions += 1
            self.refs[block] = 1
            blocks.append(block)
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; blocks that reach zero join the free list."""
        # NOTE: walk in reverse so a sequence's tail is released (and later evicted)
        # before its head: the head is the prefix other requests are likely to share.
        for block in reversed(blocks):
            count = self.refs[block] - 1
            if count:
                self.refs[block] = count
            else:
                del self.refs[block]
                self.free[block] = None

    def cache(self, block: int, key: Hashable) -> None:
        """Record that block holds the content named key (the first holder wins)."""
        if key not in self.cached and block not in self.key_of:
            self.cached[key] = block
            self.key_of[block] = key

    def lookup(self, keys: Sequence[Hashable]) -> List[int]:
        """The leading run of keys that are cached, as blocks; stops at the first miss."""
        hits = []
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks, reviving any that were free."""
        for block in blocks:
            if block in self.free:
                del self.free[block]
            self.refs[block] = self.refs.get(block, 0) + 1


# =============================================================================
# Requests
# =============================================================================

@dataclass(eq=False)
class Request:
    """A request: its prompt, what it has generated, and how much of both has KV.

    There is no prefill phase and no decode phase, only computed tokens catching up
    with length. A new request has its whole prompt remaining (prefill, possibly in
    chunks); a running one has the token it sampled last step remaining (decode); a
    preempted one lost its KV and has prompt plus output remaining (recompute).
    Whenever a step brings computed up to length, the request samples a token.

    Times are seconds on the caller's clock; the metrics read sent_s, token_times,
    output_tokens, prompt_tokens, queue_s and error, the same fields a measured
    request carries.
    """

    request_id: int
    prompt_tokens: int
    max_tokens: int                    # tokens to generate (the output length, EOS ignored)
    arrival_s: float = 0.0             # when an open-loop workload sends it
    prefix: Optional[str] = None       # name of a shared leading text (a system prompt)
    prefix_tokens: int = 0             # how many leading prompt tokens that text covers
    generated: int = 0
    computed: int = 0                  # tokens whose KV is in the cache
    blocks: List[int] = field(default_factory=list)
    num_cached_blocks: int = 0         # leading blocks already entered in the prefix cache
    num_prefix_hit_tokens: int = 0     # prompt tokens served from the prefix cache
    preemptions: int = 0
    sent_s: Optional[float] = None
    scheduled_s: Optional[float] = None  # start of the first step that scheduled it
    token_times: List[float] = field(default_factory=list)
    error_kind: Optional[str] = None
    error: Optional[str] = None

    @property
    def length(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def remaining(self) -> int:
        return self.length - self.computed

    @property
    def finished(self) -> bool:
        return self.generated == self.max_tokens

    @property
    def output_tokens(self) -> int:
        return self.generated

    @property
    def queue_s(self) -> Optional[float]:
        if self.scheduled_s is None or self.sent_s is None:
            return None
        return self.scheduled_s - self.sent_s


# =============================================================================
# Scheduler: continuous batching over a paged KV cache
# =============================================================================

@dataclass(frozen=True)
class SchedulerConfig:
    """The knobs a vLLM user turns, under vLLM's flag names."""

    max_num_seqs: int = 256              # --max-num-seqs: sequences per step
    max_num_batched_tokens: int = 8192   # --max-num-batched-tokens: tokens per step
    block_size: int = 16                 # --block-size: tokens per KV block
    chunked_prefill: bool = True         # --no-chunked-prefill turns it off
    prefix_caching: bool = False         # --prefix-caching
    max_model_len: Optional[int] = None  # --max-model-len: longest request (None: no limit)


Batch = List[Tuple[Request, int]]


class Scheduler:
    """Decides, every step, which requests advance and by how many tokens.

    Running requests go first, in admission order, each taking what it needs from
    the step's token budget. When one needs a KV block and none is free, the most
    recently admitted request is preempted (its blocks freed, itself requeued at the
    head of the waiting queue to be recomputed); a step that preempted admits nobody.
    Otherwise waiting requests are admitted first come first served while sequences,
    tokens and blocks last; the head of the queue blocks everyone behind it.
    """

    def __init__(self, config: SchedulerConfig, num_blocks: int):
        self.config = config
        self.pool = BlockPool(num_blocks)
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.num_preemptions = 0
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.config.block_size)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> bool:
        """Queue a request, or reject it (error set, False) if it could never run."""
        config = self.config
        longest = request.prompt_tokens + request.max_tokens
        if config.max_model_len is not None and longest > config.max_model_len:
            request.error_kind = "max-model-len"
            request.error = (f"prompt + output {longest:,} tokens exceed "
                             f"--max-model-len {config.max_model_len:,}")
        elif self.blocks_for(longest) > self.pool.num_blocks:
            request.error_kind = "kv-cache"
            request.error = (f"prompt + output {longest:,} tokens need {self.blocks_for(longest):,} "
                             f"KV blocks, the cache has {self.pool.num_blocks:,}")
        elif not config.chunked_prefill and longest > config.max_num_batched_tokens:
            # NOTE: without chunking, a recompute after preemption must fit one step too,
            # so the bound is the longest the request can grow, as vLLM's config check is.
            request.error_kind = "batched-tokens"
            request.error = (f"prompt + output {longest:,} tokens exceed --max-num-batched-tokens "
                             f"{config.max_num_batched_tokens:,} without chunked prefill")
        if request.error is not None:
            return False
        self.waiting.append(request)
        return True

    def schedule(self, now_s: float) -> Batch:
        """The batch for one step: (request, tokens to compute) in schedule order."""
        budget = self.config.max_num_batched_tokens
        # First, schedule the RUNNING requests.
        batch, budget, preempted = self._schedule_running(budget)
        # Next, schedule the WAITING requests, unless this step evicted work.
        if not preempted:
            batch += self._schedule_waiting(budget, now_s)
        assert sum(num_tokens for _, num_tokens in batch) <= self.config.max_num_batched_tokens
        assert len(self.running) <= self.config.max_num_seqs
        return batch

    def _schedule_running(self, budget: int) -> Tuple[Batch, int, bool]:
        batch: Batch = []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_tokens = min(request.remaining, budget)
            num_new_blocks = self.blocks_for(request.computed + num_tokens) - len(request.blocks)
            # NOTE: preempt from the tail (the newest); the requester itself may go.
            # Requests before index are already in the batch and are never preempted.
            while num_new_blocks > self.pool.free_count() and index < len(self.running):
                self._preempt(self.running.pop())
                preempted = True
            if index == len(self.running):
                break
            self._allocate(request, num_new_blocks, num_tokens)
            batch.append((request, num_tokens))
            budget -= num_tokens
            index += 1
        return batch, budget, preempted

    def _schedule_waiting(self, budget: int, now_s: float) -> Batch:
        batch: Batch = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            hits = self.pool.lookup(self._prefix_keys(request))
            num_cached = len(hits) * self.config.block_size
            num_tokens = min(request.length - num_cached, budget)
            if not self.config.chunked_prefill and num_tokens < request.length - num_cached:
                break
            num_new_blocks = self.blocks_for(num_cached + num_tokens) - len(hits)
            # NOTE: free cached hits count as free blocks but touching them takes them
            # off the free list, so they cannot also be allocated.
            if num_new_blocks > self.pool.free_count() - self.pool.free_among(hits):
                break
            self.waiting.popleft()
            self.pool.touch(hits)
            request.blocks = hits
            request.computed = num_cached
            request.num_cached_blocks = len(hits)
            request.num_prefix_hit_tokens += num_cached
            self.num_prefix_query_tokens += request.length
            self.num_prefix_hit_tokens += num_cached
            if request.scheduled_s is None:
                request.scheduled_s = now_s
            self._allocate(request, num_new_blocks, num_tokens)
            self.running.append(request)
            batch.append((request, num_tokens))
            budget -= num_tokens
        return batch

    def _preempt(self, request: Request) -> None:
        """Free a request's KV and put it back at the head of the queue to recompute."""
        self.pool.release(request.blocks)
        request.blocks = []
        request.computed = 0
        request.num_cached_blocks = 0
        request.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _allocate(self, request: Request, num_new_blocks: int, num_tokens: int) -> None:
        """Give request the blocks for num_tokens more tokens; enter full prefix blocks in the cache."""
        if num_new_blocks > 0:
            request.blocks.extend(self.pool.allocate(num_new_blocks))
        if self.config.prefix_caching and request.prefix is not None:
            num_full = min(request.prefix_tokens, request.computed + num_tokens) // self.config.block_size
            for index in range(request.num_cached_blocks, num_full):
                self.pool.cache(request.blocks[index], (request.prefix, index))
            request.num_cached_blocks = max(request.num_cached_blocks, num_full)

    def _prefix_keys(self, request: Request) -> List[Tuple[str, int]]:
        """Content keys of the request's full prefix blocks: (prefix name, block index)."""
        if not self.config.prefix_caching or request.prefix is None:
            return []
        # NOTE: the last token is always computed, even when every block hits,
        # because the model needs its logits to sample the next token.
        num_full = min(request.prefix_tokens, request.length - 1) // self.config.block_size
        return [(request.prefix, index) for index in range(num_full)]

    def update(self, batch: Batch, now_s: float) -> List[Request]:
        """Apply a computed step: advance KV, sample tokens, free finished requests."""
        finished = []
        for request, num_tokens in batch:
            request.computed += num_tokens
            if request.computed == request.length:
                request.generated += 1
                request.token_times.append(now_s)
                if request.finished:
                    finished.append(request)
        if finished:
            for request in finished:
                self.pool.release(request.blocks)
                request.blocks = []
            self.running = [request for request in self.running if not request.finished]
        return finished


# =============================================================================
# Simulation: the scheduler on a virtual clock
# =============================================================================

@dataclass
class SimulationResult:
    """What a simulated run leaves behind: its requests and what the engine saw."""

    requests: List[Request]
    num_blocks: int
    block_size: int
    num_steps: int = 0
    num_batched_seqs: int = 0
    num_batched_tokens: int = 0
    busy_s: float = 0.0                # virtual seconds spent in steps
    kv_peak: float = 0.0               # highest share of blocks in use after scheduling
    kv_block_seconds: float = 0.0      # blocks in use x step seconds, for the time-weighted mean
    num_preemptions: int = 0
    num_evictions: int = 0
    num_prefix_query_tokens: int = 0
    num_prefix_hit_tokens: int = 0

    def engine_report(self) -> dict:
        busy = self.busy_s
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "num_steps": self.num_steps,
            "mean_batch_seqs": self.num_batched_seqs / self.num_steps if self.num_steps else 0.0,
            "mean_batch_tokens": self.num_batched_tokens / self.num_steps if self.num_steps else 0.0,
            "busy_s": busy,
            "kv_peak": self.kv_peak,
            "kv_mean": self.kv_block_seconds / (busy * self.num_blocks) if busy else 0.0,
            "num_preemptions": self.num_preemptions,
            "num_evictions": self.num_evictions,
            "prefix_query_tokens": self.num_prefix_query_tokens,
            "prefix_hit_tokens": self.num_prefix_hit_tokens,
            "prefix_hit_rate": (self.num_prefix_hit_tokens / self.num_prefix_query_tokens
                                if self.num_prefix_query_tokens else 0.0),
        }


def simulate(scheduler: Scheduler, hardware: Hardware, model: ModelSpec,
             requests: List[Request], concurrency: Optional[int] = None) -> SimulationResult:
    """Run requests through the scheduler, pricing each step with step_seconds().

    Open loop (concurrency None): each request is sent at its arrival_s. Closed loop:
    concurrency clients each send their next request the moment the previous one ends
    (or is rejected), in list order, as a load generator's worker threads do.
    """
    result = SimulationResult(requests, scheduler.pool.num_blocks, scheduler.config.block_size)
    pending = deque(sorted(requests, key=lambda r: r.arrival_s) if concurrency is None else requests)
    clock_s = 0.0
    stalled = False

    def send_next(now_s: float) -> None:
        while pending:
            request = pending.popleft()
            request.sent_s = now_s
            if scheduler.add(request):
                return

    if concurrency is not None:
        for _ in range(concurrency):
            send_next(0.0)
    while True:
        if concurrency is None:
            while pending and pending[0].arrival_s <= clock_s:
                request = pending.popleft()
                request.sent_s = request.arrival_s
                scheduler.add(request)
        if not scheduler.has_work():
            if concurrency is None and pending:
                clock_s = pending[0].arrival_s
                continue
            break
        batch = scheduler.schedule(clock_s)
        if not batch:
            # A pass that only preempted frees blocks, so the next one makes progress.
            if stalled:
                raise RuntimeError("scheduler made no progress in two passes")
            stalled = True
            continue
        stalled = False
        num_tokens = 0
        num_context_tokens = 0
        for request, tokens in batch:
            num_tokens += tokens
            num_context_tokens += request.computed + tokens
        duration_s = step_seconds(hardware, model, num_tokens, num_context_tokens)
        used = scheduler.pool.used_count()
        result.num_steps += 1
        result.num_batched_seqs += len(batch)
        result.num_batched_tokens += num_tokens
        result.busy_s += duration_s
        result.kv_block_seconds += used * duration_s
        result.kv_peak = max(result.kv_peak, used / scheduler.pool.num_blocks)
        clock_s += duration_s
        finished = scheduler.update(batch, clock_s)
        if concurrency is not None:
            for _ in finished:
                send_next(clock_s)
    result.num_preemptions = scheduler.num_preemptions
    result.num_evictions = scheduler.pool.num_evictions
    result.num_prefix_query_tokens = scheduler.num_prefix_query_tokens
    result.num_prefix_hit_tokens = scheduler.num_prefix_hit_tokens
    return result


# =============================================================================
# Metrics: one definition for simulated and measured requests
# =============================================================================

PERCENTILES = (50, 95, 99)


def percentile(sorted_values: Sequence[float], pct: float) -> Optional[float]:
    """Nearest-rank percentile of already sorted values; None when there are none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def distribution_ms(values_s: Iterable[float]) -> dict:
    """Mean, nearest-rank percentiles and max of a list of seconds, in milliseconds."""
    values = sorted(value * 1000 for value in values_s)
    stats = {"count": len(values), "mean": sum(values) / len(values) if values else None}
    for pct in PERCENTILES:
        stats[f"p{pct}"] = percentile(values, pct)
    stats["max"] = values[-1] if values else None
    return stats


def summarize(records: Sequence) -> dict:
    """The latency and throughput summary of finished requests, simulated or measured.

    A record has sent_s, token_times (seconds, one per output token), output_tokens,
    prompt_tokens, queue_s (None when unknown) and error (None when it succeeded).
    TTFT is sent to first token; TPOT the mean gap after the first token (first token
    excluded, as in vLLM's benchmarks); ITL every gap; throughput counts the span from
    the first request sent to the last token received.
    """
    done = [r for r in records if r.error is None and r.token_times]
    ttft = [r.token_times[0] - r.sent_s for r in done]
    tpot = [(r.token_times[-1] - r.token_times[0]) / (r.output_tokens - 1)
            for r in done if r.output_tokens > 1 and len(r.token_times) > 1]
    itl = [later - earlier for r in done for earlier, later in zip(r.token_times, r.token_times[1:])]
    e2e = [r.token_times[-1] - r.sent_s for r in done]
    queue = [r.queue_s for r in done if r.queue_s is not None]
    sent = [r.sent_s for r in records if r.sent_s is not None]
    span_s = (max(r.token_times[-1] for r in done) - min(sent)) if done else 0.0
    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    errors: Dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error_kind or "error"] = errors.get(r.error_kind or "error", 0) + 1
    return {
        "num_requests": len(records),
        "num_completed": len(done),
        "num_failed": sum(errors.values()),
        "errors": errors,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "span_s": span_s,
        "output_tok_per_s": output_tokens / span_s if span_s else 0.0,
        "total_tok_per_s": (prompt_tokens + output_tokens) / span_s if span_s else 0.0,
        "req_per_s": len(done) / span_s if span_s else 0.0,
        "ttft_ms": distribution_ms(ttft),
        "tpot_ms": distribution_ms(tpot),
        "itl_ms": distribution_ms(itl),
        "queue_ms": distribution_ms(queue),
        "e2e_ms": distribution_ms(e2e),
    }


# =============================================================================
# Traces and synthetic workloads
# =============================================================================

TRACE_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")


def read_trace(path: str) -> List[Request]:
    """Requests from a JSON Lines trace (see the module docstring for the fields)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.readlines()
    except OSError as error:
        raise UsageError(f"--trace {path}: cannot read it ({error.strerror})") from None
    requests = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"--trace {path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{where}: not JSON ({error.msg}); expected one object per line") from None
        if not isinstance(row, dict):
            raise UsageError(f"{where}: expected a JSON object with {', '.join(TRACE_FIELDS)}")
        missing = [name for name in TRACE_FIELDS if name not in row]
        if missing:
            raise UsageError(f"{where}: missing {', '.join(missing)}; expected {', '.join(TRACE_FIELDS)}")
        arrival_s = row["arrival_s"]
        prompt = row["prompt_tokens"]
        output = row["output_tokens"]
        prefix = row.get("prefix")
        prefix_tokens = row.get("prefix_tokens", 0)
        if not _is_number(arrival_s) or arrival_s < 0:
            raise UsageError(f"{where}: arrival_s must be a number >= 0, got {arrival_s!r}")
        for name, value, least in (("prompt_tokens", prompt, 1), ("output_tokens", output, 1),
                                   ("prefix_tokens", prefix_tokens, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise UsageError(f"{where}: {name} must be an integer >= {least}, got {value!r}")
        if prefix is not None and not isinstance(prefix, str):
            raise UsageError(f"{where}: prefix must be a string, got {prefix!r}")
        if prefix_tokens > prompt:
            raise UsageError(f"{where}: prefix_tokens {prefix_tokens} exceed prompt_tokens {prompt}")
        requests.append(Request(len(requests), prompt, output, float(arrival_s), prefix, prefix_tokens))
    if not requests:
        raise UsageError(f"--trace {path}: no requests in the file")
    return requests


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def synthetic_requests(num_requests: int, prompt_tokens: Tuple[int, int],
                       output_tokens: Tuple[int, int], seed: int,
                       rate: Optional[float] = None) -> List[Request]:
    """Seeded requests with uniform lengths; Poisson arrivals at rate, else all at 0.

    Lengths are drawn before arrivals, so a seed gives the same prompts and outputs
    whether they are replayed open loop or closed loop.
    """
    rng = random.Random(seed)
    lengths = [(rng.randint(*prompt_tokens), rng.randint(*output_tokens)) for _ in range(num_requests)]
    arrival_s = 0.0
    requests = []
    for index, (prompt, output) in enumerate(lengths):
        requests.append(Request(index, prompt, output, arrival_s))
        if rate is not None:
            arrival_s += rng.expovariate(rate)
    return requests


# =============================================================================
# Command line
# =============================================================================

class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one UsageError line instead of usage + exit."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # a typo must not silently pick a flag
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(message)


def _flag_type(name: str, convert, check, expected: str):
    """An argparse type: convert the text, check it, or explain what was expected."""
    def parse(text: str):
        try:
            value = convert(text)
        except (ValueError, TypeError):
            value = None
        if value is None or not check(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    parse.__name__ = name
    return parse


positive_int = _flag_type("positive_int", int, lambda v: v > 0, "a positive integer")
non_negative_int = _flag_type("non_negative_int", int, lambda v: v >= 0, "an integer >= 0")
positive_float = _flag_type("positive_float", float, lambda v: v > 0 and math.isfinite(v),
                            "a positive number")
fraction = _flag_type("fraction", float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def _parse_range(text: str) -> Optional[Tuple[int, int]]:
    low, sep, high = text.partition("-")
    low_value = int(low)
    high_value = int(high) if sep else low_value
    return (low_value, high_value) if 0 < low_value <= high_value else None


def _parse_int_list(text: str) -> Optional[List[int]]:
    values = [int(part) for part in text.split(",")]
    return values if all(value > 0 for value in values) else None


token_range = _flag_type("token_range", _parse_range, lambda v: True,
                         "N or LO-HI with 0 < LO <= HI (e.g. 256-1024)")
int_list = _flag_type("int_list", _parse_int_list, lambda v: True,
                      "positive integers separated by commas (e.g. 1,8,32)")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--hardware", default=DEFAULT_HARDWARE,
                        help=f"hardware preset: {', '.join(HARDWARE)} (default %(default)s)")
    common.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"model preset: {', '.join(MODELS)} (default %(default)s)")
    common.add_argument("--gpu-memory-utilization", type=fraction, default=0.9,
                        help="share of device memory for weights and KV cache (default %(default)s)")
    common.add_argument("--block-size", type=positive_int, default=16,
                        help="tokens per KV cache block (default %(default)s)")
    common.add_argument("--kv-tokens", type=positive_int,
                        help="fix the KV cache at this many tokens, like llama.cpp --ctx-size")
    common.add_argument("--json", action="store_true", help="print the full report as JSON")

    engine = _Parser(add_help=False)
    engine.add_argument("--max-model-len", type=positive_int,
                        help="reject requests whose prompt + output exceed this (default: no limit)")
    engine.add_argument("--max-num-seqs", type=positive_int, default=256,
                        help="most sequences in one step (default %(default)s)")
    engine.add_argument("--max-num-batched-tokens", type=positive_int, default=8192,
                        help="most tokens in one step, prefill chunks included (default %(default)s)")
    engine.add_argument("--no-chunked-prefill", dest="chunked_prefill", action="store_false",
                        help="admit a prompt only if all of it fits the step's token budget")
    engine.add_argument("--prefix-caching", action="store_true",
                        help="reuse full KV blocks of prompts that share a prefix")
    engine.add_argument("--requests", type=positive_int, default=256,
                        help="requests to generate without --trace (default %(default)s)")
    engine.add_argument("--prompt-tokens", type=token_range, default=(256, 1024),
                        help="prompt tokens, N or LO-HI uniform (default 256-1024)")
    engine.add_argument("--output-tokens", type=token_range, default=(64, 256),
                        help="output tokens, N or LO-HI uniform (default 64-256)")
    engine.add_argument("--seed", type=int, default=0, help="seed for lengths and arrivals (default 0)")

    parser = _Parser(prog="servesim", description=__doc__.split("\n\n")[0],
                     epilog="Exit status: 0 success, 1 does not fit, 2 bad input.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    capacity = commands.add_parser("capacity", parents=[common], help="the memory plan",
                                   description="Weights, KV cache, blocks, max concurrency and "
                                               "step time of a model on a device.")
    capacity.add_argument("--max-model-len", type=positive_int, default=4096,
                          help="tokens per request in the max concurrency line (default %(default)s)")
    capacity.set_defaults(run=cmd_capacity)

    simulate_parser = commands.add_parser(
        "simulate", parents=[common, engine], help="replay a workload on a virtual clock",
        description="Run the scheduler on a virtual clock and report TTFT, TPOT, ITL, queue "
                    "time, throughput and what the engine saw.")
    arrivals = simulate_parser.add_mutually_exclusive_group(required=True)
    arrivals.add_argument("--trace", help="JSON Lines trace: open loop at each request's arrival_s")
    arrivals.add_argument("--rate", type=positive_float, help="open loop: Poisson arrivals, requests/s")
    arrivals.add_argument("--concurrency", type=positive_int,
                          help="closed loop: N clients, each sending when its last request ends")
    simulate_parser.set_defaults(run=cmd_simulate)

    sweep = commands.add_parser(
        "sweep", parents=[common, engine], help="simulate several concurrencies, one table",
        description="One closed-loop run per concurrency on the same seeded requests.")
    sweep.add_argument("--concurrency", type=int_list, required=True,
                       help="comma-separated client counts, e.g. 1,8,32,128,256")
    sweep.set_defaults(run=cmd_sweep)
    return parser


def _resolve(args) -> Tuple[Hardware, ModelSpec]:
    return (get_preset(HARDWARE, args.hardware, "--hardware"),
            get_preset(MODELS, args.model, "--model"))


def _plan(args, max_model_len: int) -> CapacityPlan:
    hardware, model = _resolve(args)
    return plan_capacity(hardware, model, args.gpu_memory_utilization, args.block_size,
                         args.kv_tokens, max_model_len)


def _print_json(report: dict) -> None:
    print(json.dumps(report, indent=2))


def format_capacity(plan: CapacityPlan) -> List[str]:
    hardware, model = plan.hardware, plan.model
    if plan.kv_tokens_fixed:
        kv_detail = "fixed by --kv-tokens"
    else:
        kv_detail = f"budget - weights - {hardware.reserve_gib:.1f} GiB reserve"
    step_ms = step_seconds(hardware, model, 1, 1) * 1000
    knee = critical_batch(hardware, model)
    rows = [
        ("weights", f"{model.weight_bytes / GB:.2f} GB",
         f"{model.params / 1e9:.2f} B params x {round(model.bytes_per_param, 4):g} bytes"),
        ("kv per token", f"{model.kv_bytes_per_token / KIB:.1f} KiB",
         f"2 x {model.layers} layers x {model.kv_heads} kv heads x {model.head_dim} head dim "
         f"x {model.kv_dtype_bytes} bytes"),
        ("memory budget", f"{plan.budget_bytes / GIB:.2f} GiB",
         f"{hardware.memory_gib:g} GiB x {plan.gpu_memory_utilization:.2f}"),
        ("kv cache", f"{plan.kv_cache_bytes / GIB:.2f} GiB", kv_detail),
        ("blocks", f"{plan.num_blocks:,} x {plan.block_size} tokens = {plan.num_kv_tokens:,} tokens", ""),
        ("max concurrency", f"{plan.max_concurrency:.2f}x at {plan.max_model_len:,} tokens per request", ""),
        ("decode step", f"{step_ms:.2f} ms at batch 1; compute catches up with the weight read "
                        f"at ~{knee:.{0 if knee >= 10 else 1}f} tokens per step", ""),
    ]
    lines = [f"capacity {model.name} on {hardware.name} "
             f"gpu-memory-utilization {plan.gpu_memory_utilization:.2f}"]
    lines += [f"{label:<16}{value:<12}{detail}".rstrip() for label, value, detail in rows]
    return lines


def cmd_capacity(args) -> int:
    plan = _plan(args, args.max_model_len)
    if args.json:
        hardware, model = plan.hardware, plan.model
        _print_json({"capacity": plan.to_dict(),
                     "decode_step_ms": step_seconds(hardware, model, 1, 1) * 1000,
                     "critical_batch_tokens": critical_batch(hardware, model)})
    else:
        print("\n".join(format_capacity(plan)))
    return 0


def _describe_range(bounds: Tuple[int, int]) -> str:
    low, high = bounds
    return str(low) if low == high else f"{low}-{high}"


def _workload(args, rate: Optional[float] = None) -> List[Request]:
    if getattr(args, "trace", None):
        return read_trace(args.trace)
    return synthetic_requests(args.requests, args.prompt_tokens, args.output_tokens, args.seed, rate)


def run_simulation(args, plan: CapacityPlan, concurrency: Optional[int],
                   rate: Optional[float] = None) -> dict:
    """One simulated run from parsed flags, as the report that text and --json print."""
    config = SchedulerConfig(args.max_num_seqs, args.max_num_batched_tokens, args.block_size,
                             args.chunked_prefill, args.prefix_caching, args.max_model_len)
    requests = _workload(args, rate)
    scheduler = Scheduler(config, plan.num_blocks)
    result = simulate(scheduler, plan.hardware, plan.model, requests, concurrency)
    if getattr(args, "trace", None):
        arrivals = {"mode": "trace", "trace": args.trace}
    elif concurrency is not None:
        arrivals = {"mode": "closed", "concurrency": concurrency}
    else:
        arrivals = {"mode": "poisson", "rate": rate}
    settings = {"hardware": plan.hardware.name, "model": plan.model.name, "arrivals": arrivals,
                "num_requests": len(requests), "scheduler": asdict(config)}
    if arrivals["mode"] != "trace":
        settings.update(prompt_tokens=list(args.prompt_tokens), output_tokens=list(args.output_tokens),
                        seed=args.seed)
    rejected = [{"request_id": r.request_id, "kind": r.error_kind, "error": r.error}
                for r in requests if r.error is not None]
    return {"settings": settings, "capacity": plan.to_dict(), "engine": result.engine_report(),
            "summary": summarize(requests), "rejected": rejected}


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_summary(summary: dict) -> List[str]:
    """The latency and throughput lines shared by simulate and loadgen reports."""
    lines = [f"{'':<10}{'p50':>10}{'p99':>10}"]
    for label, name in (("ttft ms", "ttft_ms"), ("tpot ms", "tpot_ms"), ("itl ms", "itl_ms"),
                        ("queue ms", "queue_ms"), ("e2e ms", "e2e_ms")):
        stats = summary[name]
        if stats["count"]:
            lines.append(f"{label:<10}{_ms(stats['p50']):>10}{_ms(stats['p99']):>10}")
    lines.append(f"throughput {summary['output_tok_per_s']:.1f} output tok/s "
                 f"{summary['total_tok_per_s']:.1f} total tok/s {summary['req_per_s']:.2f} req/s")
    return lines


def format_simulation(report: dict) -> List[str]:
    settings, engine = report["settings"], report["engine"]
    arrivals = settings["arrivals"]
    if arrivals["mode"] == "trace":
        how = "trace arrivals"
    elif arrivals["mode"] == "closed":
        how = f"closed loop concurrency {arrivals['concurrency']}"
    else:
        how = f"poisson arrivals {arrivals['rate']:g} req/s"
    lines = [
        f"servesim {settings['model']} on {settings['hardware']} {settings['num_requests']} requests {how}",
        f"kv cache {engine['num_blocks']:,} blocks x {engine['block_size']} tokens "
        f"peak {engine['kv_peak']:.1%} mean {engine['kv_mean']:.1%}",
        f"steps {engine['num_steps']:,} mean batch {engine['mean_batch_seqs']:.1f} seqs "
        f"preemptions {engine['num_preemptions']} evictions {engine['num_evictions']} "
        f"prefix hits {engine['prefix_hit_rate']:.1%}",
    ]
    lines += format_summary(report["summary"])
    lines += _format_rejected(report["rejected"])
    return lines


def _format_rejected(rejected: List[dict]) -> List[str]:
    by_kind: Dict[str, List[dict]] = {}
    for entry in rejected:
        by_kind.setdefault(entry["kind"], []).append(entry)
    return [f"rejected {len(entries)} requests ({kind}), e.g. request {entries[0]['request_id']}: "
            f"{entries[0]['error']}" for kind, entries in by_kind.items()]


def cmd_simulate(args) -> int:
    plan = _plan(args, args.max_model_len or 4096)
    report = run_simulation(args, plan, args.concurrency, args.rate)
    if args.json:
        _print_json(report)
    else:
        print("\n".join(format_simulation(report)))
    return 0


SWEEP_COLUMNS = ("concurrency", "out tok/s", "ttft p50", "tpot p50", "tpot p95", "queue p95",
                 "batch", "kv peak", "preempt")


def sweep_row(concurrency: int, report: dict) -> List[str]:
    summary, engine = report["summary"], report["engine"]
    return [str(concurrency), f"{summary['output_tok_per_s']:.1f}", _ms(summary["ttft_ms"]["p50"]),
            _ms(summary["tpot_ms"]["p50"]), _ms(summary["tpot_ms"]["p95"]),
            _ms(summary["queue_ms"]["p95"]), f"{engine['mean_batch_seqs']:.1f}",
            f"{engine['kv_peak']:.1%}", str(engine["num_preemptions"])]


def format_table(header: Sequence[str], rows: List[List[str]]) -> List[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)).rstrip()
            for row in [list(header)] + rows]


def cmd_sweep(args) -> int:
    plan = _plan(args, args.max_model_len or 4096)
    runs = [run_simulation(args, plan, concurrency) for concurrency in args.concurrency]
    if args.json:
        _print_json({"concurrency": args.concurrency, "runs": runs})
        return 0
    print(f"sweep {plan.model.name} on {plan.hardware.name} {args.requests} requests "
          f"prompt {_describe_range(args.prompt_tokens)} output {_describe_range(args.output_tokens)}")
    rows = [sweep_row(concurrency, run) for concurrency, run in zip(args.concurrency, runs)]
    print("\n".join(format_table(SWEEP_COLUMNS, rows)))
    for run in runs:
        for line in _format_rejected(run["rejected"]):
            print(line)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except ServesimError as error:
        prefix = "servesim: error: " if isinstance(error, UsageError) else "servesim: "
        print(prefix + str(error), file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
