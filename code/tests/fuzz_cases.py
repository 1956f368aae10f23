"""Seeded fuzz cases for servesim: odd flags, files and server answers, and how to run one.

Each case is a command line, the files it reads (written to a scratch folder), optionally
a script for a misbehaving server, and the exit codes that are right for it. run_case()
runs it in process, in a thread, and reports what went wrong: a traceback or the
internal-error line, a hang (past HANG_S), an exit code outside the case's, more than one
stderr line for exit 2, or the API key anywhere in the output. test_fuzz.py runs a few
hundred; `python3 code/bench.py fuzz --cases N --seed S` runs as many as asked.
"""

import contextlib
import gzip
import io
import json
import os
import random
import socket
import socketserver
import struct
import threading
import time
from dataclasses import dataclass, field

HANG_S = 20.0
SECRET = "sk-fuzz-SECRET-0123456789"

ODD_VALUES = ("", "-1", "0", "nan", "inf", "-inf", "1e400", "abc", "--", "1" * 40, "²", "٣", " 5", "0x10",
              "1,2,,3", "1-", "-", "5-2", "1e-320", "9" * 400, "\x00", "a\nb", "✓", "3.5", "1,1e400")
ODD_JSON = (None, True, -1, 0, 1e308, 10 ** 30, "abc", "", [], [1, 2], {}, {"a": 1}, float("nan"), 3.5, "²")


@dataclass
class Case:
    family: str
    argv: list
    files: dict = field(default_factory=dict)      # name -> bytes
    server: list = None                              # chat script (see FaultServer), or None
    models: list = None                              # /v1/models script, or None for a proper answer
    info: bytes = None                               # the body of GET /server_info (SGLang's), or a 404
    expected: tuple = (0, 1, 2)

    def describe(self):
        return f"{self.family}: {' '.join(str(arg)[:60] for arg in self.argv)}"


# ---------------------------------------------------------------------------
# A server that misbehaves on cue
# ---------------------------------------------------------------------------

def sse_events(*events, done=True):
    text = "".join(f"data: {json.dumps(event) if not isinstance(event, str) else event}\n\n" for event in events)
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


def chunked(*pieces):
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def head(status=200, extra=b"", chunked_body=True):
    reason = {200: b"OK", 302: b"Found", 400: b"Bad Request", 401: b"Unauthorized", 429: b"Too Many",
              500: b"Server Error", 503: b"Unavailable"}.get(status, b"X")
    lines = b"HTTP/1.1 %d %s\r\nContent-Type: text/event-stream\r\n" % (status, reason)
    if chunked_body:
        lines += b"Transfer-Encoding: chunked\r\n"
    return lines + extra + b"\r\n"


def good_stream(num_tokens=3, usage=(5, 3), timings=None):
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    events += [{"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]} for i in range(num_tokens)]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    last = {"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}}
    if timings is not None:
        last["timings"] = timings
    events.append(last)
    return events


class FaultServer:
    """A raw TCP server on 127.0.0.1:0. Each POST gets the chat script, each GET
    /v1/models the models script: a list of ("send", bytes), ("sleep", s), ("close",),
    ("reset",) or ("echo-auth",) (an HTTP 401 whose body repeats the Authorization header)."""

    def __init__(self, chat, models=None, info=None):
        self.chat, self.models, self.info = chat, models, info

    def __enter__(self):
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                owner.serve(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def serve(self, sock):
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                received = sock.recv(65536)
                if not received:
                    return
                data += received
            request_head = data.split(b"\r\n\r\n")[0].decode("latin-1")
            path = request_head.split()[1]
            if path.endswith("/v1/models"):
                body = b'{"data": [{"id": "fuzz-model"}]}'
                script = self.models or [("send", b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                                          % (len(body), body))]
            elif path.endswith("/completions"):  # chat or not (--endpoint): the same script
                script = self.chat
            elif path.endswith("server_info") and self.info is not None:
                script = [("send", b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(self.info), self.info))]
            else:
                script = [("send", b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")]
            for step in script:
                self.act(sock, step, request_head)
        except OSError:
            pass
        finally:
            sock.close()

    @staticmethod
    def act(sock, step, request_head):
        kind = step[0]
        if kind == "send":
            sock.sendall(step[1])
        elif kind == "sleep":
            time.sleep(step[1])
        elif kind == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif kind == "echo-auth":
            auth = next((line for line in request_head.split("\r\n") if line.lower().startswith("authorization")),
                        "none").encode("latin-1")
            body = b'{"error": {"message": "bad key: ' + auth + b'", "type": "auth"}}'
            sock.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


# The server faults, each with the exit code it must give (1: a request failed).
def fault_scripts(rng):
    ok = [("send", head() + chunked(sse_events(*good_stream())))]
    odd_usage = rng.choice(ODD_JSON)
    odd_timing = rng.choice(ODD_JSON)
    faults = {
        "good": (ok, 0),
        "good-drip": ([("send", head())] + [step for event in sse_events(*good_stream()).split(b"\n\n") if event
                                           for step in (("send", b"%x\r\n%s\r\n" % (len(event) + 2, event + b"\n\n")),
                                                        ("sleep", 0.002))] + [("send", b"0\r\n\r\n")], 0),
        "reset-mid-stream": ([("send", head() + chunked(sse_events(*good_stream()[:2], done=False))[:-5]),
                              ("reset",)], 1),
        "close-before-answer": ([("close",)], 1),
        "truncated": ([("send", head() + chunked(sse_events(*good_stream()[:3], done=False)))], 1),
        "stall": ([("send", head()), ("sleep", 1.5)], 1),
        "http-500-html": ([("send", b"HTTP/1.1 500 Oops\r\nContent-Length: 12\r\n\r\n<html>x</htm")], 1),
        "http-429-json": ([("send", b'HTTP/1.1 429 Slow\r\nContent-Length: 27\r\n\r\n{"error": {"message": 7}}  ')], 1),
        "http-400-odd": ([("send", b"HTTP/1.1 400 Bad\r\nContent-Length: 4\r\n\r\nnull")], 1),
        "echo-key": ([("echo-auth",)], 1),
        "redirect": ([("send", b"HTTP/1.1 302 Found\r\nLocation: http://x/\r\nContent-Length: 0\r\n\r\n")], 1),
        "non-sse-200": ([("send", b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n{\"choices\": []}\n")], 1),
        "gzip": ([("send", head(extra=b"Content-Encoding: gzip\r\n") + chunked(gzip.compress(sse_events(*good_stream()))))], 1),
        "bad-chunk-size": ([("send", head() + b"zz\r\ndata: x\r\n")], 1),
        "bad-content-length": ([("send", b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\ndata: [DONE]\n\n")], 1),
        "not-http": ([("send", b"SSH-2.0-OpenSSH\r\n\r\n")], 1),
        "huge-line": ([("send", head() + chunked(b"data: " + b"x" * (4 << 20) + b"\n\n"))], 1),
        "delta-string": ([("send", head() + chunked(sse_events({"choices": [{"delta": "hello"}]})))], 1),
        "choices-number": ([("send", head() + chunked(sse_events({"choices": 7})))], 1),
        "odd-usage": ([("send", head() + chunked(sse_events(*good_stream()[:-1], {
            "choices": [], "usage": {"prompt_tokens": odd_usage, "completion_tokens": 3}})))],
            0 if isinstance(odd_usage, int) and not isinstance(odd_usage, bool) and 0 <= odd_usage <= 10 ** 7
            or odd_usage is None else 1),
        "odd-timings": ([("send", head() + chunked(sse_events(*good_stream(timings={
            "prompt_ms": odd_timing, "predicted_per_token_ms": "fast"}))))], 1),
        "error-event": ([("send", head() + chunked(sse_events({"error": {"message": rng.choice(ODD_JSON)}})))], 1),
        "not-json-event": ([("send", head() + chunked(b"data: {oops\n\n"))], 1),
        "comments-and-crlf": ([("send", head() + chunked(b": keep-alive\r\n\r\n" + sse_events(*good_stream())
                                                        .replace(b"\n", b"\r\n")))], 0),
    }
    return faults


def loadgen_cases(rng):
    cases = []
    for name, (script, exit_code) in fault_scripts(rng).items():
        argv = ["loadgen", "--url", "URL", "--requests", "2", "--concurrency", str(rng.choice((1, 2))),
                "--timeout", "0.5", "--scrape-interval", "0.05", "--max-tokens", "3", "--api-key", SECRET,
                "--json-requests" if rng.random() < 0.5 else "--json"]
        argv += ["--endpoint", "/v1/completions"] if rng.random() < 0.3 else []
        cases.append(Case(f"server {name}", argv, server=script, expected=(exit_code,)))
    for name, script in (("models-reset", [("reset",)]), ("models-stall", [("sleep", 1.5)]),
                         ("models-close", [("close",)]), ("models-not-json", [("send", b"HTTP/1.1 200 OK\r\n"
                                                                                   b"Content-Length: 3\r\n\r\nabc")]),
                         ("models-empty", [("send", b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"data": []}')]),
                         ("models-odd", [("send", b'HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\n{"data": [{"id":7}]}')])):
        cases.append(Case(f"discovery {name}", ["loadgen", "--url", "URL", "--requests", "1", "--timeout", "0.5"],
                          server=fault_scripts(rng)["good"][0], models=script, expected=(1,)))
    info = {"version": "0.5.4", "max_running_requests": 48, "chunked_prefill_size": 4096, "context_length": 8192,
            "disable_radix_cache": False, "internal_states": [{"max_total_num_tokens": 300000}]}
    for _ in range(3):  # SGLang's own settings, odd: discovery is best effort, the run goes on
        cases.append(Case("discovery odd server info", ["loadgen", "--url", "URL", "--requests", "1", "--timeout",
                                                        "0.5", "--json"], server=fault_scripts(rng)["good"][0],
                          info=dumps(mutate_json(rng, info)), expected=(0,)))
    for key in ("sk\r\ninjected: 1", "ключ", "tab\there", "\x7fdel"):
        cases.append(Case("odd api key", ["loadgen", "--url", "URL", "--api-key", key, "--requests", "1",
                                          "--model", "m"], server=fault_scripts(rng)["good"][0], expected=(2,)))
    cases.append(Case("refused", ["loadgen", "--url", "http://127.0.0.1:9", "--requests", "1", "--model", "m",
                                  "--api-key", SECRET], expected=(1,)))
    return cases


# ---------------------------------------------------------------------------
# Odd flags, files and reports
# ---------------------------------------------------------------------------

BASE_COMMANDS = (
    ["capacity", "--hardware", "l4-24gb"],
    ["simulate", "--concurrency", "2", "--requests", "4", "--prompt-tokens", "40", "--output-tokens", "8"],
    ["sweep", "--concurrency", "1,2", "--requests", "4", "--prompt-tokens", "40", "--output-tokens", "8"],
    ["search", "--requests", "6", "--prompt-tokens", "40", "--output-tokens", "8", "--slo-ttft-ms", "500",
     "--tolerance", "0.5"],
    ["simulate", "--rate", "4", "--requests", "4", "--prompt-tokens", "40", "--output-tokens", "8",
     "--disaggregate"],
    ["explain", "--hardware", "l4-24gb", "--model", "llama-3.1-8b", "--max-num-seqs", "8"],
    ["simulate", "--rate", "8", "--requests", "6", "--prompt-tokens", "40", "--output-tokens", "8",
     "--replicas", "2", "--router", "prefix-affinity", "--prefix-caching"],
    ["plan", "--hardware", "l4-24gb,h100-sxm-80gb", "--tensor-parallel-size", "1", "--replicas", "1,2",
     "--rate", "4", "--requests", "6", "--prompt-tokens", "40", "--output-tokens", "8", "--slo-ttft-ms", "500",
     "--jobs", "1", "--quiet"],
)
FLAGS = ("--requests", "--prompt-tokens", "--output-tokens", "--rate", "--concurrency", "--max-num-seqs",
         "--max-num-batched-tokens", "--block-size", "--kv-tokens", "--num-gpu-blocks-override", "--gpu-memory-utilization",
         "--max-model-len",
         "--tensor-parallel-size", "--interconnect-gbs", "--seed", "--burstiness", "--time-scale", "--start",
         "--limit", "--slo-ttft-ms", "--slo-percentile", "--slo-attainment", "--max-tokens-in-flight",
         "--kv-link-gbs", "--hardware", "--model", "--scheduler", "--ubatch-size", "--tolerance", "--start-load",
         "--prompt-tokens=", "--by", "--trace-format", "--disaggregate-min-prompt-tokens", "--batch-size",
         "--replicas", "--router", "--quantization", "--dtype", "--kv-cache-dtype", "--price-per-hour",
         "--max-num-seqs=", "--prefix-caching", "--rate-schedule", "--duration-s", "--max-replicas", "--min-replicas",
         "--scale-target", "--scale-metric", "--scale-period-s", "--fail-replica", "--restart-s",
         "--pipeline-parallel-size", "--data-parallel-size", "--network-gbs", "--enable-expert-parallel",
         "--attention-efficiency")


SERVER_COMMANDS = (
    ["loadgen", "--url", "URL", "--requests", "2", "--timeout", "0.5", "--max-tokens", "3", "--scrape-interval",
     "0.05"],
    ["profile", "--url", "URL", "--repeat", "1", "--max-num-seqs", "2", "--prefill-tokens", "16", "--output-tokens",
     "4", "--timeout", "0.5", "--quiet"],
    ["explain", "--url", "URL", "--scrapes", "2", "--scrape-interval", "0.01"],
    ["loadgen", "--url", "URL", "--trace", "t.jsonl", "--timeout", "0.5", "--scrape-interval", "0.05"],
)
SERVER_FLAGS = ("--length-scale", "--max-context", "--workers", "--endpoint", "--time-scale", "--temperature", "--rate",
                "--burstiness", "--warmup", "--max-tokens", "--prompt-tokens",
                "--timeout", "--scrape-interval", "--seed", "--prompt-file", "--shared-prefix-tokens", "--url",
                "--concurrency", "--model", "--slo-ttft-ms", "--repeat", "--budget-s", "--prefill-tokens",
                "--output-tokens", "--max-num-seqs", "--scrapes", "--requests")
REPORT_COMMANDS = (
    ["compare", "c1.json", "c4.json", "--hardware", "cpu-2vcpu", "--model", "gemma-3-270m-q4_k_m"],
    ["calibrate", "c1.json", "c4.json", "--hardware", "cpu-2vcpu", "--model", "gemma-3-270m-q4_k_m"],
)


def server_flag_cases(rng, count, reports):
    """Odd flags of the subcommands that talk to a server (a well-behaved one) or read reports."""
    cases = []
    for _ in range(count):
        if rng.random() < 0.3:
            argv = list(rng.choice(REPORT_COMMANDS)) + [rng.choice(FLAGS), rng.choice(ODD_VALUES + ("2", "3"))]
            cases.append(Case("flags report", argv, files=reports))
            continue
        argv = list(rng.choice(SERVER_COMMANDS))
        argv += [rng.choice(SERVER_FLAGS), rng.choice(ODD_VALUES + ("1", "2", "0.5", "prompt.txt", "http://[::1"))]
        trace = b'{"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 3}\n{"arrival_s": 0.01, "prompt_tokens": 9, ' \
                b'"output_tokens": 2, "prefix": "p", "prefix_tokens": 4}\n'
        cases.append(Case("flags server", argv, files={"prompt.txt": rng.choice((b"", b"hello", b"\xff\xfe")),
                                                       "t.jsonl": trace},
                          server=[("send", head() + chunked(sse_events(*good_stream())))]))
    return cases


def flag_cases(rng, count):
    cases = []
    for _ in range(count):
        argv = list(rng.choice(BASE_COMMANDS))
        flag, value = rng.choice(FLAGS), rng.choice(ODD_VALUES + ("1", "2", "64", "0.5", "8192"))
        if flag.endswith("="):
            argv.append(flag + value)
        elif rng.random() < 0.1:
            argv.append(flag)  # no value
        else:
            argv += [flag, value]
        if argv[0] == "explain" and rng.random() < 0.7:
            argv.insert(1, "scrape.prom")
        cases.append(Case("flags", argv, files={"scrape.prom": b"vllm:num_requests_running 3\n"}))
    return cases


def mutate_json(rng, value, depth=0):
    """value with one field changed, dropped or added, somewhere inside it."""
    if isinstance(value, dict) and value and (depth < 3 or rng.random() < 0.5):
        key = rng.choice(sorted(value))
        roll = rng.random()
        copy = dict(value)
        if roll < 0.15:
            del copy[key]
        elif roll < 0.55 and isinstance(value[key], (dict, list)):
            copy[key] = mutate_json(rng, value[key], depth + 1)
        else:
            copy[key] = rng.choice(ODD_JSON)
        return copy
    if isinstance(value, list) and value:
        copy = list(value)
        index = rng.randrange(len(copy))
        copy[index] = mutate_json(rng, copy[index], depth + 1) if rng.random() < 0.6 else rng.choice(ODD_JSON)
        return copy
    return rng.choice(ODD_JSON)


def dumps(value):
    return json.dumps(value, allow_nan=True).encode()


def trace_cases(rng, count):
    cases = []
    row = {"arrival_s": 0.1, "prompt_tokens": 40, "output_tokens": 8, "prefix": "s", "prefix_tokens": 16}
    moon = {"timestamp": 10, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]}
    for _ in range(count):
        kind = rng.choice(("servesim", "azure", "mooncake", "conversation", "burstgpt"))
        if kind == "servesim":
            lines = [dumps(dict(row, arrival_s=0.1 * i)) for i in range(3)] + [dumps(mutate_json(rng, row))]
        elif kind == "conversation":
            turn = {"arrival_s": 0.0, "prompt_tokens": 30, "output_tokens": 4, "conversation": "c", "think_s": 0.5}
            lines = [dumps(dict(turn, turn=i + 1)) for i in range(3)] + [dumps(mutate_json(rng, dict(turn, turn=4)))]
        elif kind == "mooncake":
            lines = [dumps(dict(moon, timestamp=10 * i)) for i in range(3)] + [dumps(mutate_json(rng, moon))]
        elif kind == "burstgpt":
            cells = ["45", "ChatGPT", "1087", "230", "1317", "Conversation log"]
            cells[rng.randrange(6)] = rng.choice(ODD_VALUES)
            header = rng.choice((b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                                 b"Timestamp,Model,Request tokens", b"Timestamp,Request tokens,Response tokens"))
            lines = [header, b"5,GPT-4,472,18,490,API log", ",".join(cells).encode("utf-8")]
        else:
            cells = ["2024-05-10 00:00:00.009930+00:00", "374", "44"]
            cells[rng.randrange(3)] = rng.choice(ODD_VALUES)
            lines = [b"TIMESTAMP,ContextTokens,GeneratedTokens", b"2023-11-16 18:15:46.1,10,4",
                     ",".join(cells).encode("utf-8")]
        if rng.random() < 0.2:
            lines.insert(rng.randrange(len(lines) + 1), bytes(rng.randrange(256) for _ in range(rng.randrange(1, 30))))
        name, data = f"t.{'csv' if kind in ('azure', 'burstgpt') else 'jsonl'}", b"\n".join(lines)
        if rng.random() < 0.2:  # compressed, and now and then cut short
            name, data = name + ".gz", gzip.compress(data)
            data = data[:rng.randrange(1, len(data))] if rng.random() < 0.3 else data
        command = rng.choice((["--hardware", "l4-24gb"], ["--prefix-caching", "--replicas", "2"]))
        cases.append(Case(f"trace {kind}", ["simulate", "--trace", name, *command],
                          files={name: data}, expected=(0, 2)))
    return cases


LLAMA_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 1000, "intermediate_size": 128, "torch_dtype": "bfloat16", "head_dim": 16,
                "tie_word_embeddings": False, "text_config": {"hidden_size": 64}}
MOE_CONFIG = dict(LLAMA_CONFIG, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  layer_types=["sliding_attention", "full_attention"], sliding_window=64)
HARDWARE = {"name": "hw", "memory_gib": 24, "bandwidth_gbs": 300, "tflops": 100, "mfu": 0.5, "mbu": 0.7,
            "step_overhead_ms": 1, "reserve_gib": 1, "interconnect_gbs": 32}


def _gguf_string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _gguf_odd_value(rng):
    """(type id, bytes) of a metadata value of a random type and value."""
    roll = rng.randrange(5)
    if roll == 0:
        return 8, _gguf_string(rng.choice(("abc", "", "2", "²")))
    if roll == 1:
        items = [rng.choice((0, 1, 4, 2 ** 31)) for _ in range(rng.randrange(0, 3))]
        return 9, struct.pack("<IQ", 4, len(items)) + b"".join(struct.pack("<I", i) for i in items)
    if roll == 2:
        return 6, struct.pack("<f", rng.choice((0.0, 2.5, float("nan"), float("inf"))))
    if roll == 3:
        return 7, struct.pack("<?", True)
    return 4, struct.pack("<I", rng.choice((0, 1, 2 ** 32 - 1)))


def gguf_file(rng):
    string = _gguf_string
    metadata = [("general.architecture", 8, string("llama")), ("llama.block_count", 4, struct.pack("<I", 2)),
                ("llama.embedding_length", 4, struct.pack("<I", 64)),
                ("llama.attention.head_count", 4, struct.pack("<I", 4)),
                ("llama.attention.head_count_kv", 9, struct.pack("<IQ", 4, 2) + struct.pack("<II", 2, 2))]
    if rng.random() < 0.5:  # one field of another type or value
        index = rng.randrange(len(metadata))
        metadata[index] = (metadata[index][0],) + _gguf_odd_value(rng)
    out = b"GGUF" + struct.pack("<IQQ", 3, 2, len(metadata))
    for key, kind, value in metadata:
        out += string(key) + struct.pack("<I", kind) + value
    out += string("token_embd.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 64, 100) + struct.pack("<IQ", 1, 0)
    out += string("output.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 64, 100) + struct.pack("<IQ", 1, 12800)
    out += bytes(-len(out) % 32) + bytes(25600)
    data = bytearray(out)
    for _ in range(rng.randrange(0, 3)):
        roll = rng.random()
        if roll < 0.3:
            del data[rng.randrange(len(data)):]
        elif roll < 0.8:
            index = rng.randrange(min(len(data), 400)) if data else 0
            if data:
                data[index] = rng.randrange(256)
        else:
            index = rng.randrange(min(len(data), 400)) if data else 0
            data[index:index + 8] = struct.pack("<Q", rng.choice((0, 1, 2 ** 63, 2 ** 64 - 1, 7, 9)))
    return bytes(data)


_PLAN_JOB = []


def plan_job():
    """A job plan --emit writes (made once, by the main module the tests import)."""
    if not _PLAN_JOB:
        import main
        parser = main.build_parser("plan")
        args = parser.parse_args(["plan", "--hardware", "l4-24gb", "--tensor-parallel-size", "1", "--replicas", "1",
                                  "--rate", "4", "--requests", "3", "--prompt-tokens", "40", "--output-tokens", "8",
                                  "--slo-ttft-ms", "500"])
        _, jobs = main.plan_grid(main.build_plan_spec(args), main.plan_points(args))
        job = dict(jobs[0])
        job["workload_zlib"] = main.encode_rows(job.pop("workload"))
        _PLAN_JOB.append(job)
    return _PLAN_JOB[0]


def file_cases(rng, count):
    cases = []
    for _ in range(count):
        kind = rng.choice(("gguf", "config", "hardware", "profile", "job"))
        if kind == "gguf":
            cases.append(Case("gguf", ["capacity", "--model-file", "m.gguf", "--hardware", "cpu-4vcpu"],
                              files={"m.gguf": gguf_file(rng)}))
        elif kind == "config":
            config = rng.choice((LLAMA_CONFIG, MOE_CONFIG))
            cases.append(Case("hf config", ["capacity", "--model-file", "config.json"],
                              files={"config.json": dumps(mutate_json(rng, config))}))
        elif kind == "job":
            cases.append(Case("plan job", ["simulate", "--job", "job.json"],
                              files={"job.json": dumps(mutate_json(rng, plan_job()))}))
        elif kind == "hardware":
            command = rng.choice((["capacity"], ["simulate", "--concurrency", "1", "--requests", "2",
                                                 "--tensor-parallel-size", "2"]))
            cases.append(Case("hardware file", command + ["--hardware-file", "hw.json"],
                              files={"hw.json": dumps(mutate_json(rng, HARDWARE))}))
        else:
            profile = {"servesim_step_profile": 1, "server": {"kind": "llama.cpp", "slots": 4,
                                                              "slot_context_tokens": 1024},
                       "decode": [{"batch": 1, "step_ms": 10}, {"batch": 2, "step_ms": 14}],
                       "prefill": [{"prompt_tokens": 100, "step_ms": 30}],
                       "prefill_batch_factors": [{"num_prompts": 2, "factor": 0.9}], "mixed_overlap_ms": 1,
                       "request_overhead_ms": 2, "decode_context_tokens": 50}
            cases.append(Case("step profile", ["simulate", "--step-profile", "p.json", "--concurrency", "2",
                                               "--requests", "4", "--prompt-tokens", "40", "--output-tokens", "8",
                                               "--hardware", "cpu-2vcpu", "--model", "gemma-3-270m-q4_k_m"],
                              files={"p.json": dumps(mutate_json(rng, profile))}))
    return cases


VLLM_BENCH_RESULT = {"backend": "vllm", "model_id": "m", "num_prompts": 8, "request_rate": "inf", "burstiness": 1.0,
                     "max_concurrency": 2, "completed": 8, "total_input_tokens": 800, "total_output_tokens": 80,
                     "output_throughput": 50.0, "total_token_throughput": 550.0, "median_ttft_ms": 30.0,
                     "median_tpot_ms": 9.0, "p99_ttft_ms": 40.0, "input_lens": [100] * 8, "output_lens": [10] * 8}
SGLANG_BENCH_RESULT = {"backend": "sglang", "request_rate": float("inf"), "max_concurrency": 2, "completed": 8,
                       "total_input_tokens": 800, "total_output_tokens": 80, "output_throughput": 50.0,
                       "median_ttft_ms": 30.0, "median_tpot_ms": 9.0, "median_e2e_latency_ms": 120.0,
                       "input_lens": [100] * 8, "output_lens": [10] * 8, "errors": [""] * 8}


def report_cases(rng, count, loadgen_report, simulate_report):
    cases = []
    for _ in range(count):
        source = rng.choice((loadgen_report, simulate_report, {"runs": [simulate_report]}, VLLM_BENCH_RESULT,
                             dict(VLLM_BENCH_RESULT, ramp_up_strategy="linear", ramp_up_start_rps=1,
                                  ramp_up_end_rps=5), SGLANG_BENCH_RESULT))
        mutated = mutate_json(rng, source)
        if rng.random() < 0.1:
            mutated = rng.choice(({"settings": {}, "engine": {}}, {"settings": {}, "summary": {}}, [], "x", {}))
        command = rng.choice((["explain", "r.json"], ["compare", "r.json", "--hardware", "cpu-2vcpu"],
                              ["calibrate", "r.json", "r.json"]))
        text = dumps(mutated)
        if rng.random() < 0.2:  # several results, one a line, as --append-result and --output-file write them
            text = text + b"\n" + dumps(mutate_json(rng, source))
        cases.append(Case(f"report {command[0]}", command, files={"r.json": text}))
    return cases


INFERENCE_PERF_CONFIG = {"api.streaming": "true", "shared_prefix.num_groups": "2", "shared_prefix.num_prompts_per_group": "2",
                         "shared_prefix.system_prompt_len": "10", "shared_prefix.question_len": "20",
                         "shared_prefix.output_len": "8", "load.type": "constant", "stage.rate": "2",
                         "stage.duration": "3", "load.request_timeout": "null", "server.ignore_eos": "true"}
ODD_YAML = ("null", "[1, 2]", "{a: 1}", "'5'", "1e9", "-3", "0", "poisson", "concurrent", "false", "~", "- x",
            "&a 1", "\"2\"", "1.5", "2e7")
INFERENCE_PERF_STAGE = {"load_summary": {"count": 6, "requested_rate": 2.0},
                        "successes": {"count": 6, "latency": {
                            "time_to_first_token": {"mean": 0.05, "median": 0.05, "p90": 0.06, "p99": 0.07},
                            "request_latency": {"mean": 0.5, "median": 0.5, "p90": 0.6, "p99": 0.7}},
                            "throughput": {"requests_per_sec": 2.0},
                            "prompt_len": {"mean": 30, "min": 28, "median": 30, "max": 32},
                            "output_len": {"mean": 8, "min": 8, "median": 8, "max": 8}},
                        "failures": {"count": 0}}


def inference_perf_config(rng):
    """An inference-perf results/config.yaml, its values now and then odd (YAML of another shape)."""
    value = {key: (rng.choice(ODD_VALUES + ODD_YAML) if rng.random() < 0.15 else text)
             for key, text in INFERENCE_PERF_CONFIG.items()}
    stage_keys = ("rate", "duration") if value["load.type"] != "concurrent" else ("num_requests", "concurrency_level")
    lines = ["api:", "  type: completion", f"  streaming: {value['api.streaming']}", "data:", "  type: shared_prefix",
             "  shared_prefix:"]
    lines += [f"    {key.split('.')[1]}: {text}" for key, text in value.items() if key.startswith("shared_prefix.")]
    lines += ["load:", f"  type: {value['load.type']}", "  stages:",
              f"  - {stage_keys[0]}: {value['stage.rate']}", f"    {stage_keys[1]}: {value['stage.duration']}",
              f"  request_timeout: {value['load.request_timeout']}", "server:", "  type: vllm", "  model_name: org/m",
              f"  ignore_eos: {value['server.ignore_eos']}"]
    if rng.random() < 0.1:
        del lines[rng.randrange(len(lines))]
    return ("\n".join(lines) + "\n").encode("utf-8", "replace")


def inference_perf_cases(rng, count):
    """inference-perf run folders, their config, stage files and exp-config odd, compared and fitted."""
    cases = []
    for _ in range(count):
        files = {"run/results/config.yaml": inference_perf_config(rng),
                 "run/results/stage_0_lifecycle_metrics.json": dumps(mutate_json(rng, INFERENCE_PERF_STAGE)),
                 "models/m/config.json": dumps(LLAMA_CONFIG)}
        if rng.random() < 0.5:
            files["run/exp-config.yaml"] = rng.choice((b"model: org/m\ntensor_parallelism: 1\n",
                                                       b"model: org/m\ntensor_parallelism: 0\n",
                                                       b"model: [x]\nmax_num_seqs: abc\n", b"\x00\xff"))
        command = rng.choice((["compare", "run", "--model-dir", "models", "--no-sensitivity"],
                              ["compare", "run/results", "--model-file", "models/m/config.json", "--json"],
                              ["calibrate", "run", "--model-file", "models/m/config.json"]))
        cases.append(Case("inference-perf", command + ["--hardware", "h100-sxm-80gb"], files=files))
    return cases


def scrape_cases(rng, count):
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:num_preemptions_total", "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count",
             "llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode", "sglang:token_usage",
             "vllm:prefix_cache_queries_total", "vllm:prompt_tokens_total", "llamacpp:prompt_seconds_total")
    cases = []
    for _ in range(count):
        texts = []
        for _ in range(rng.choice((1, 2))):
            lines = []
            for _ in range(rng.randrange(1, 12)):
                value = rng.choice(("1", "0", "NaN", "+Inf", "-Inf", "1e400", "-5", "x", "3.5", "", "1e308"))
                label = rng.choice(("", '{model_name="m"}', '{a="\\"q\\""}', "{broken", '{a="1",b="2"}'))
                lines.append(f"{rng.choice(names)}{label} {value}")
            if rng.random() < 0.2:
                lines.append(bytes(rng.randrange(256) for _ in range(20)).decode("latin-1"))
            texts.append("\n".join(lines).encode("utf-8", "replace"))
        files = {f"s{index}.prom": text for index, text in enumerate(texts)}
        cases.append(Case("scrape", ["explain", *files, "--hardware", "l4-24gb", "--model", "llama-3.1-8b",
                                     "--max-num-seqs", "16"], files=files, expected=(0, 2)))
    return cases


def generate(seed, num_cases, loadgen_report, simulate_report):
    """num_cases cases from every family, the same ones for the same seed."""
    rng = random.Random(seed)
    server = loadgen_cases(rng)
    rest = max(0, num_cases - len(server))
    fixtures = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "llamacpp")
    reports = {}
    for name in ("c1.json", "c4.json"):
        with open(os.path.join(fixtures, name), "rb") as handle:
            reports[name] = handle.read()
    cases = (server + server_flag_cases(rng, rest // 10, reports) + flag_cases(rng, rest * 2 // 10)
             + trace_cases(rng, rest * 2 // 10)
             + file_cases(rng, rest * 2 // 10) + report_cases(rng, rest * 2 // 10, loadgen_report, simulate_report)
             + inference_perf_cases(rng, rest // 10))
    cases += scrape_cases(rng, num_cases - len(cases))
    return cases[:num_cases] if num_cases >= len(server) else rng.sample(cases, num_cases)


# ---------------------------------------------------------------------------
# Running one
# ---------------------------------------------------------------------------

def run_case(main, case, directory):
    """Run one case in directory; (problems, exit code, stdout, stderr, seconds)."""
    for name, data in case.files.items():
        os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
        with open(os.path.join(directory, name), "wb") as handle:
            handle.write(data)
    here = os.getcwd()
    os.chdir(directory)
    out, err, result = io.StringIO(), io.StringIO(), {}
    try:
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(FaultServer(case.server, case.models, case.info)) if case.server else None
            argv = [server.url if arg == "URL" and server else arg for arg in case.argv]

            def run():
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    result["code"] = main.main(argv)
            start = time.monotonic()
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            thread.join(HANG_S)
            elapsed = time.monotonic() - start
    finally:
        os.chdir(here)
    stdout, stderr, code = out.getvalue(), err.getvalue(), result.get("code")
    problems = []
    if code is None:
        problems.append(f"hung past {HANG_S:g} s")
    if "Traceback" in stderr or "internal error" in stderr:
        problems.append("traceback: " + stderr.strip().splitlines()[-1][:200])
    elif code is not None and code not in case.expected:
        problems.append(f"exit {code}, expected {' or '.join(map(str, case.expected))}: {stderr.strip()[:200]}")
    if code == 2 and len(stderr.splitlines()) != 1:
        problems.append(f"exit 2 with {len(stderr.splitlines())} stderr lines")
    if SECRET in stdout + stderr:
        problems.append("the API key was printed")
    return problems, code, stdout, stderr, elapsed
