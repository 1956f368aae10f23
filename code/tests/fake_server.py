"""A stdlib OpenAI-compatible server on 127.0.0.1:0 whose answers each test scripts.

    with FakeServer(chat=stream_of([chunk(role="assistant"), chunk("Hi"), ...])) as server:
        run_cli("loadgen", "--url", server.url, ...)

chat(handler, body) writes the answer to one POST /v1/chat/completions; metrics is a
list of /metrics texts served in turn (the last one repeats; a callable instead of a text
misbehaves: reset_connection, stall_for), or None for a 404; pages
maps other GET paths (/props, /get_server_info, ...) to the JSON they answer.
"""

import json
import socket
import ssl
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chunk(content=None, role=None, reasoning=None, finish=None, usage=None, timings=None, choices=True):
    """One chat.completion.chunk event as a dict."""
    delta = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    event = {"object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []}
    if usage is not None:
        event["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                          "total_tokens": usage[0] + usage[1]}
    if timings is not None:
        event["timings"] = timings
    return event


def sse(*events, done=True):
    """The bytes of a well-formed stream: one "data: {json}" line and a blank line each."""
    text = "".join(f"data: {json.dumps(event)}\n\n" for event in events)
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


def standard_stream(num_tokens=4, prompt_tokens=12):
    """Role chunk, num_tokens one-token chunks, finish chunk, usage chunk, [DONE]."""
    events = [chunk(role="assistant", content="")]
    events += [chunk(f" w{index}") for index in range(num_tokens)]
    events += [chunk(finish="length"), chunk(choices=False, usage=(prompt_tokens, num_tokens))]
    return sse(*events)


def stream_of(*pieces, gate=None):
    """A chat handler writing pieces (bytes), each flushed as its own HTTP chunk.

    If gate (a threading.Event) is given, the handler waits for it before the last piece.
    """
    def handle(handler, body):
        handler.start_stream()
        for index, piece in enumerate(pieces):
            if gate is not None and index == len(pieces) - 1:
                gate.wait(30)
            handler.write_chunk(piece)
        handler.end_stream()
    return handle


def reset_connection(handler):
    """Close the connection at once, unanswered, with a TCP reset (SO_LINGER 0)."""
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.connection.close()
    handler.close_connection = True


def stall_for(seconds):
    """A /metrics answer that sends nothing for seconds, then closes the connection."""
    def stall(handler):
        time.sleep(seconds)
        handler.close_connection = True
    return stall


def word_tokens(text):
    """A stand-in tokenizer: a token per word, two for a word of more than six letters."""
    return sum(1 + (len(word) > 6) for word in text.split())


def counting_chat(tokenizer=word_tokens, overhead=9, answer=("Sure", " thing", ".")):
    """A chat handler whose usage counts the prompt (every message) with tokenizer, plus a
    chat template's overhead, and that answers with the pieces of answer, one a chunk."""
    def handle(handler, body):
        prompt = sum(tokenizer(message["content"]) for message in body["messages"]) + overhead
        events = [chunk(role="assistant", content="")] + [chunk(piece) for piece in answer]
        events += [chunk(finish="stop"), chunk(choices=False, usage=(prompt, len(answer)))]
        stream_of(sse(*events))(handler, body)
    return handle


def text_chunk(text="", finish=None, usage=None):
    """One /v1/completions stream event: the text itself, no delta."""
    event = {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not None:
        event = {"object": "text_completion", "choices": [],
                 "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}
    return event


def counting_completion(tokenizer=word_tokens, overhead=1, answer=("Sure", " thing", ".")):
    """counting_chat for /v1/completions: the bare prompt counted (plus a BOS token), the
    answer as text chunks."""
    def handle(handler, body):
        events = [text_chunk(piece) for piece in answer] + [text_chunk(finish="stop")]
        events.append(text_chunk(usage=(tokenizer(body["prompt"]) + overhead, len(answer))))
        stream_of(sse(*events))(handler, body)
    return handle


def error_response(status, payload):
    def handle(handler, body):
        handler.send_json(status, payload)
    return handle


def send_body(handler, status, data, content_type):
    """Answer handler's request with data (bytes) as its whole body (the fake engine's too)."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def send_json(handler, status, payload):
    send_body(handler, status, json.dumps(payload).encode(), "application/json")


METRICS_TYPE = "text/plain; version=0.0.4"  # Prometheus' text format


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # keep test output clean
        pass

    def do_GET(self):
        server = self.server.fake
        server.headers_seen.append(dict(self.headers))
        if self.path in server.pages:
            self.send_json(200, server.pages[self.path])
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": name} for name in server.models]})
        elif self.path == "/metrics" and server.metrics:
            with server.lock:
                text = server.metrics[0] if len(server.metrics) == 1 else server.metrics.pop(0)
                server.num_scrapes += 1
            if callable(text):
                text(self)  # a scripted misbehaviour: reset_connection, or a stall
            else:
                send_body(self, 200, text.encode(), METRICS_TYPE)
        else:
            self.send_json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def do_POST(self):
        received_s = time.perf_counter()  # NOTE: first, before reading the body: when the request arrived
        server = self.server.fake
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        if self.path == "/tokenize":
            if server.tokenizer is None:
                self.send_json(404, {"error": {"code": 404, "message": "File Not Found"}})
            else:
                self.send_json(200, {"tokens": list(range(server.tokenizer(body["content"])))})
            return
        with server.arrived:
            server.paths.append(self.path)
            server.received_s.append(received_s)
            server.bodies.append(body)
            server.headers_seen.append(dict(self.headers))
            index = len(server.bodies) - 1
            server.arrived.notify_all()
        handler = server.chat(index, body) if server.per_request else server.chat
        try:
            handler(self, body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True

    def send_json(self, status, payload):
        send_json(self, status, payload)


class ListeningServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with a real server's listen backlog (uvicorn's is 2048): with the
    standard library's 5, a client opening more connections at once than that waits a SYN
    retransmission (1 s) for the rest."""
    request_queue_size = 128
    daemon_threads = True


class FakeServer:
    """Context manager: a ThreadingHTTPServer on 127.0.0.1:0 serving in a thread.

    chat: a handler for every request, or with per_request=True a function
    (index, body) -> handler, so each request can get its own script.
    """

    def __init__(self, chat=None, metrics=None, models=("fake-model",), per_request=False, tokenizer=None, pages=None,
                 host="127.0.0.1", tls=None):
        self.host = host                  # "::1" listens on IPv6
        self.tls = tls                    # (certificate file, key file): serve https
        self.chat = chat or stream_of(standard_stream())
        self.pages = dict(pages or {})  # path -> the JSON a GET of it answers (a server's own endpoints)
        self.per_request = per_request
        self.metrics = list(metrics) if metrics else None
        self.models = models
        self.bodies = []
        self.paths = []            # the path each chat or completion request was posted to
        self.received_s = []       # perf_counter when each chat request's body had arrived
        self.tokenizer = tokenizer  # text -> token count for POST /tokenize (llama.cpp's shape), or a 404
        self.headers_seen = []
        self.num_scrapes = 0
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)

    def __enter__(self):
        server_class = ListeningServer
        if ":" in self.host:
            server_class = type("IPv6Server", (ListeningServer,), {"address_family": socket.AF_INET6})
        self.httpd = server_class((self.host, 0), _Handler)
        self.httpd.fake = self
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait_for_requests(self, count, timeout_s=30):
        """Block until count chat requests have arrived; False on timeout."""
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.bodies) >= count, timeout_s)

    @property
    def url(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.httpd.server_address[1]}"
