"""A stdlib OpenAI-compatible server that batches like llama-server, on a real clock (or,
inside virtual_time.VirtualTime, on a virtual one that profile's load runs share).

    with FakeEngine(decode_ms={1: 9, 2: 19, 3: 31, 4: 27}, prefill_ms_per_token=0.02) as server:
        run_cli("profile", "--url", server.url, ...)

`slots` requests run at once (the rest wait, as llama.cpp defers them). One engine thread
takes steps: a step carries one token for every slot that decodes and the whole prompt of
every slot just admitted, and lasts decode_ms[decoding slots] + prefill_ms_per_token x
prompt tokens (less mixed_overlap_ms when it carries both), plus context_us_per_token for
every token of context the decoding slots hold. Steps are kept on an absolute
schedule, so a late wake-up shortens the next sleep instead of stretching every gap. A
prompt's tokens are its words; with timings, the last event carries llama.cpp's timings
(prompt_ms: the step that prefilled it). GET /props, /slots, /health, /v1/models and /metrics
(llama.cpp's names) answer as llama-server does. With kind="vllm" the server answers as
vLLM does instead: no /props or /slots, max_model_len in /v1/models, and vLLM's gauges of
running and waiting requests, its cache_config_info and its queue and prefill time
histograms in /metrics (where vLLM states no --max-num-seqs: only a crowd of requests shows
the slots). request_path_ms delays every request before the engine sees it (HTTP,
tokenizing, the hop to the engine), outside the server's own queue and prefill times.
"""

import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler

import fake_server


class _Stream:
    def __init__(self, prompt_tokens, max_tokens):
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.generated = 0
        self.prompt_ms = 0.0   # the step that prefilled it, as llama.cpp's timings.prompt_ms
        self.submitted_s = self.admitted_s = 0.0
        self.events = queue.Queue()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        engine = self.server.engine
        if self.path == "/health":
            self.send_json({"status": "ok"})
        elif engine.kind == "vllm" and self.path == "/v1/models":
            self.send_json({"object": "list", "data": [{"id": "fake-engine",
                                                        "max_model_len": engine.slot_context_tokens}]})
        elif engine.kind == "vllm" and self.path in ("/props", "/slots"):
            self.send_json({"detail": "Not Found"}, 404)
        elif self.path == "/props":
            self.send_json({"total_slots": engine.slots, "build_info": "b-fake",
                            "default_generation_settings": {"n_ctx": engine.slot_context_tokens},
                            "model_path": "fake.gguf"})
        elif self.path == "/slots":
            self.send_json([{"id": index, "n_ctx": engine.slot_context_tokens} for index in range(engine.slots)])
        elif self.path == "/v1/models":
            self.send_json({"object": "list", "data": [{"id": "fake-engine"}]})
        elif self.path == "/metrics":
            fake_server.send_body(self, 200, engine.metrics().encode(), fake_server.METRICS_TYPE)
        else:
            self.send_json({"error": {"code": 404, "message": "File Not Found"}}, 404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        prompt_tokens = len((body["messages"][-1]["content"] if "messages" in body else body["prompt"]).split())
        time.sleep(self.server.engine.request_path_ms / 1000)  # a fake's path: a real clock is its point
        stream = self.server.engine.submit(prompt_tokens, body.get("max_tokens", 16))
        def piece(text):  # a chat delta, or a completion's text
            return {"delta": {"content": text} if text else {}} if "messages" in body else {"text": text}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while True:
                kind = stream.events.get()
                if kind == "token":
                    self.write_event({"choices": [dict(piece(" w"), index=0, finish_reason=None)]})
                else:
                    self.write_event({"choices": [dict(piece(""), index=0, finish_reason="length")]})
                    event = {"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                      "completion_tokens": stream.generated}}
                    if self.server.engine.timings:
                        event["timings"] = {"prompt_n": prompt_tokens, "prompt_ms": stream.prompt_ms,
                                            "predicted_n": stream.generated}
                    self.write_event(event)
                    self.write_chunk(b"data: [DONE]\n\n")
                    self.write_chunk(b"")
                    return
        except (BrokenPipeError, ConnectionResetError):
            pass

    def write_event(self, event):
        self.write_chunk(f"data: {json.dumps(event)}\n\n".encode())

    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def send_json(self, payload, status=200):
        fake_server.send_json(self, status, payload)


class FakeEngine:
    """Context manager: the server on 127.0.0.1:0 and its engine thread."""

    def __init__(self, decode_ms, prefill_ms_per_token=0.02, mixed_overlap_ms=0.0, slots=4,
                 slot_context_tokens=4096, timings=True, kind="llama.cpp", context_us_per_token=0.0,
                 request_path_ms=0.0):
        self.kind = kind
        self.request_path_ms = request_path_ms
        self.num_ended, self.queue_s, self.prefill_s = 0, 0.0, 0.0  # vLLM's histograms, of ended requests
        self.context_us_per_token = context_us_per_token
        self.timings = timings and kind == "llama.cpp"
        self.decode_ms = decode_ms
        self.prefill_ms_per_token = prefill_ms_per_token
        self.mixed_overlap_ms = mixed_overlap_ms
        self.slots = slots
        self.slot_context_tokens = slot_context_tokens
        self.waiting, self.running = [], []
        self.lock = threading.Condition()
        self.closing = False
        self.num_decode_calls = 0
        self.num_busy_slots = 0
        self.max_tokens_asked = []  # each request's max_tokens, in the order they came
        self.clock = time.perf_counter  # when streams are submitted and admitted
        self.virtual = False  # True while virtual_time.VirtualTime takes the steps instead of the thread

    def step_ms(self, num_decoding, num_prefill_tokens):
        decode = self.decode_ms[num_decoding] if num_decoding else 0.0
        prefill = self.prefill_ms_per_token * num_prefill_tokens
        return decode + prefill - (self.mixed_overlap_ms if decode and prefill else 0.0)

    def submit(self, prompt_tokens, max_tokens):
        stream = _Stream(prompt_tokens, max_tokens)
        stream.submitted_s = self.clock()
        with self.lock:
            self.max_tokens_asked.append(max_tokens)
            self.waiting.append(stream)
            self.lock.notify()
        return stream

    def metrics(self):
        with self.lock:
            mean = self.num_busy_slots / self.num_decode_calls if self.num_decode_calls else 0.0
            if self.kind == "vllm":
                return (f"vllm:num_requests_running{{engine=\"0\",model_name=\"fake-engine\"}} {len(self.running)}\n"
                        f"vllm:num_requests_waiting{{engine=\"0\",model_name=\"fake-engine\"}} {len(self.waiting)}\n"
                        f"vllm:cache_config_info{{block_size=\"16\",enable_prefix_caching=\"False\","
                        f"num_gpu_blocks=\"{self.slots * self.slot_context_tokens // 16}\"}} 1.0\n"
                        f"vllm:request_queue_time_seconds_sum{{model_name=\"fake-engine\"}} {self.queue_s}\n"
                        f"vllm:request_queue_time_seconds_count{{model_name=\"fake-engine\"}} {self.num_ended}\n"
                        f"vllm:request_prefill_time_seconds_sum{{model_name=\"fake-engine\"}} {self.prefill_s}\n"
                        f"vllm:request_prefill_time_seconds_count{{model_name=\"fake-engine\"}} {self.num_ended}\n")
            return (f"llamacpp:n_decode_total {self.num_decode_calls}\nllamacpp:n_busy_slots_per_decode {mean}\n"
                    f"llamacpp:requests_processing {len(self.running)}\n"
                    f"llamacpp:requests_deferred {len(self.waiting)}\n")

    def has_work(self):
        return bool(self.waiting or self.running)

    def begin_step(self):
        """Under the lock: admit waiting streams into free slots; (the streams that decode,
        those just admitted, the step's cost in seconds)."""
        admitted = self.waiting[:self.slots - len(self.running)]
        del self.waiting[:len(admitted)]
        decoding = list(self.running)
        self.running += admitted
        self.num_decode_calls += 1
        self.num_busy_slots += len(self.running)
        context = sum(stream.prompt_tokens + stream.generated for stream in decoding)
        cost_s = (self.step_ms(len(decoding), sum(s.prompt_tokens for s in admitted))
                  + self.context_us_per_token * context / 1000) / 1000
        for stream in admitted:
            stream.prompt_ms = cost_s * 1000
            stream.admitted_s = self.clock()
        return decoding, admitted, cost_s

    def end_step(self, decoding, admitted):
        """Under the lock, as the step ends: a token for every stream the step carried; the
        streams that reached their max_tokens end."""
        for stream in decoding + admitted:
            stream.generated += 1
            stream.events.put("token")
            if stream.generated >= stream.max_tokens:  # counted before its client can see the end
                self.num_ended += 1
                self.queue_s += stream.admitted_s - stream.submitted_s
                self.prefill_s += stream.prompt_ms / 1000
                stream.events.put("end")
                self.running.remove(stream)

    def _loop(self):
        deadline = None
        while True:
            with self.lock:
                while not self.closing and (self.virtual or not self.has_work()):
                    deadline = None
                    self.lock.wait(0.1)
                if self.closing:
                    return
                decoding, admitted, cost_s = self.begin_step()
            deadline = (deadline or time.perf_counter()) + cost_s
            time.sleep(max(0.0, deadline - time.perf_counter()))
            with self.lock:
                self.end_step(decoding, admitted)

    def __enter__(self):
        self.httpd = fake_server.ListeningServer(("127.0.0.1", 0), _Handler)
        self.httpd.engine = self
        self.threads = [threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                         daemon=True), threading.Thread(target=self._loop, daemon=True)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.closing = True
            self.lock.notify()
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"
