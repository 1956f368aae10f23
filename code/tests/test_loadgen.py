"""loadgen against a scripted fake server: stream parsing, metrics, errors, load shapes."""

import gc
import json
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import unittest
from unittest import mock

from fake_server import (FakeServer, chunk, counting_completion, error_response, reset_connection, sse, stall_for,
                         standard_stream, stream_of, text_chunk)
from support import (LateClock, connected_pair, kernel_stamping, main, records_from_report, run_cli,
                     start_interruptible, wait_until)

LLAMA_400 = {"error": {"code": 400, "message": "request (1124 tokens) exceeds the available context size "
                                               "(1024 tokens), try increasing it",
                       "type": "exceed_context_size_error", "n_prompt_tokens": 1124, "n_ctx": 1024}}


def parse(stream):
    """Feed a stream to the parser line by line, line n arriving at t = n seconds."""
    record = main.MeasuredRequest(0, sent_s=0.0)
    parser = main.StreamParser(record)
    for index, line in enumerate(stream.splitlines(keepends=True), start=1):
        if not parser.feed(line, float(index)):
            break
    parser.end()
    return record


def measure(server, timeout_s=10.0):
    """Send one request to server and return its record."""
    record = main.MeasuredRequest(0, sent_s=0.0)
    with main.StreamLoop() as loop:
        main.stream_chat(main.Endpoint.parse(server.url), main.chat_body("m", "hi", 8, False, 0.0),
                         {"Content-Type": "application/json"}, record, loop, timeout_s)
    return record


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StreamParsingTest(unittest.TestCase):
    """parse(): line n arrives at t = n, so each event (a data line, a blank line) is 2 s."""

    def test_usage_gives_exact_token_counts_and_a_role_only_chunk_is_not_a_token(self):
        record = parse(standard_stream(num_tokens=4, prompt_tokens=12))
        self.assertIsNone(record.error)
        self.assertEqual((record.prompt_tokens, record.output_tokens), (12, 4))
        self.assertEqual(record.chunk_times, [3.0, 5.0, 7.0, 9.0])  # the role chunk was t=1
        summary = main.summarize([record])
        self.assertEqual(summary["ttft_ms"]["p50"], 3000.0)
        self.assertEqual(summary["tpot_ms"]["p50"], 2000.0)
        self.assertEqual((record.finish_reason, record.saw_done, record.token_counts), ("length", True, "usage"))

    def test_two_tokens_per_chunk_give_tpot_from_usage_and_itl_per_token_and_per_chunk(self):
        stream = sse(chunk(role="assistant"), chunk("ab"), chunk("cd"), chunk("ef"),
                     chunk(finish="length", usage=(5, 6)))
        record = parse(stream)
        self.assertEqual(record.chunk_times, [3.0, 5.0, 7.0])
        self.assertEqual(record.token_times, [3.0, 3.0, 4.0, 5.0, 6.0, 7.0])
        summary = main.summarize([record])
        self.assertEqual(summary["tpot_ms"]["mean"], 800.0)            # (7 - 3) s / 5 gaps
        self.assertEqual(summary["itl_ms"]["count"], 5)
        self.assertEqual(summary["itl_ms"]["max"], 1000.0)             # 2 s gap / 2 tokens
        self.assertEqual(summary["itl_per_chunk_ms"]["count"], 2)
        self.assertEqual(summary["itl_per_chunk_ms"]["p50"], 2000.0)

    def test_a_running_usage_count_gives_each_chunk_its_exact_tokens(self):
        events = [chunk("a", usage=(5, 1)), chunk("bcd", usage=(5, 4)), chunk("e", finish="stop", usage=(5, 5))]
        record = parse(sse(*events))
        self.assertEqual(record.token_counts, "usage-per-chunk")
        # Events at t = 1, 3, 5 carrying 1, 3 and 1 tokens.
        self.assertEqual(record.token_times, [1.0, 1.0 + 2 / 3, 1.0 + 4 / 3, 3.0, 5.0])

    def test_reasoning_content_counts_as_the_first_token(self):
        stream = sse(chunk(role="assistant"), chunk(reasoning="hmm"), chunk("yes"),
                     chunk(finish="stop", usage=(3, 2)))
        record = parse(stream)
        self.assertEqual(record.chunk_times, [3.0, 5.0])
        self.assertEqual(main.summarize([record])["ttft_ms"]["p50"], 3000.0)

    def test_usage_in_the_finish_chunk_or_a_later_chunk_gives_the_same_counts(self):
        in_finish = sse(chunk("a"), chunk("b"), chunk(finish="stop", usage=(7, 2)))
        later = sse(chunk("a"), chunk("b"), chunk(finish="stop"), chunk(choices=False, usage=(7, 2)))
        for stream in (in_finish, later):
            record = parse(stream)
            self.assertEqual((record.prompt_tokens, record.output_tokens, record.error), (7, 2, None))

    def test_a_stream_without_usage_counts_chunks_and_says_so(self):
        record = parse(sse(chunk("a"), chunk("b"), chunk("c", finish="stop")))
        self.assertEqual((record.output_tokens, record.token_counts), (3, "chunks"))

    def test_llama_cpp_timings_are_kept(self):
        timings = {"cache_n": 4, "prompt_n": 25, "prompt_ms": 75.4, "prompt_per_token_ms": 3.0,
                   "predicted_n": 2, "predicted_ms": 25.6, "predicted_per_token_ms": 12.8}
        stream = sse(chunk("a"), chunk("b"), chunk(finish="length"),
                     chunk(choices=False, usage=(29, 2), timings=timings))
        record = parse(stream)
        self.assertEqual(record.timings, {"prompt_n": 25, "prompt_ms": 75.4, "cache_n": 4, "predicted_n": 2,
                                          "predicted_ms": 25.6, "predicted_per_token_ms": 12.8})

    def test_comments_other_fields_no_space_data_and_crlf_are_understood(self):
        stream = (b": keep-alive\r\n\r\nevent: message\r\nid: 7\r\ndata:" + json.dumps(chunk("a")).encode()
                  + b"\r\n\r\ndata:" + json.dumps(chunk(finish="stop", usage=(3, 1))).encode() + b"\r\n\r\ndata:[DONE]\r\n")
        record = parse(stream)
        self.assertEqual((record.error, record.chunk_times, record.output_tokens, record.saw_done),
                         (None, [5.0], 1, True))

    def test_an_event_spread_over_two_data_lines_is_one_event(self):
        head, tail = json.dumps(chunk("a")).split(', "choices"')
        stream = (f'data: {head},\ndata:  "choices"{tail}\n\n'.encode()
                  + sse(chunk(finish="stop", usage=(3, 1))))
        record = parse(stream)
        self.assertEqual((record.error, record.chunk_times, record.output_tokens), (None, [1.0], 1))

    def test_an_in_band_error_event_fails_the_request(self):
        stream = sse(chunk("a"), {"error": {"message": "engine died", "type": "internal_error"}})
        record = parse(stream)
        self.assertEqual((record.error_kind, record.error), ("stream-error", "engine died (internal_error)"))

    def test_one_json_completion_instead_of_a_stream_says_the_server_does_not_stream(self):
        completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
        record = parse(json.dumps(completion, indent=2).encode())
        self.assertEqual((record.error_kind, record.error), (
            "bad-response", "the server answered one JSON completion, not an event stream: it does not stream "
                            "(the request asked for stream: true)"))
        record = parse(b'{"error": {"message": "model not loaded", "type": "unavailable"}}')
        self.assertEqual((record.error_kind, record.error), ("stream-error", "model not loaded (unavailable)"))
        record = parse(b"<html>gateway says hello</html>\n")
        self.assertEqual((record.error_kind, record.error), (
            "bad-response", "the answer is not an event stream (it starts '<html>gateway says hello</html>')"))

    def test_a_completions_stream_counts_its_text_chunks(self):
        record = parse(sse(text_chunk("Once"), text_chunk(" upon"), text_chunk("", finish="length"),
                           text_chunk(usage=(7, 2))))
        self.assertEqual((record.error, record.chunk_times, record.output_tokens, record.prompt_tokens,
                          record.finish_reason), (None, [1.0, 3.0], 2, 7, "length"))  # lines 1 and 3


def self_signed_certificate(folder):
    """(certificate, key) files for 127.0.0.1 made by openssl, or None without it."""
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return cert, key


class HttpStreamTest(unittest.TestCase):
    """The same streams over HTTP from the fake server: framing, flush boundaries, errors."""

    def test_comments_no_space_data_crlf_and_an_event_split_across_flushes_parse(self):
        first = b": keep-alive\r\n\r\ndata:" + json.dumps(chunk("a")).encode() + b"\r\n\r\nevent: x\r\n"
        split = json.dumps(chunk("b")).encode()
        pieces = (first, b"data: " + split[:10], split[10:] + b"\r\n\r\n",
                  b"data: " + json.dumps(chunk(finish="stop", usage=(3, 2))).encode() + b"\r\n\r\ndata:[DONE]\r\n\r\n")
        with FakeServer(chat=stream_of(*pieces)) as server:
            record = measure(server)
        self.assertIsNone(record.error)
        self.assertEqual((len(record.chunk_times), record.output_tokens, record.saw_done), (2, 2, True))

    def test_a_stream_over_tls_is_connected_step_by_step_and_read_whole(self):
        with tempfile.TemporaryDirectory() as folder:
            tls = self_signed_certificate(folder) or self.skipTest("openssl is not installed (it makes the certificate)")
            trusting = ssl.create_default_context(cafile=tls[0])
            with FakeServer(tls=tls) as server, mock.patch.object(main.ssl, "create_default_context",
                                                                 return_value=trusting):
                self.assertTrue(server.url.startswith("https://"))
                record = measure(server)
        self.assertIsNone(record.error)
        self.assertEqual((len(record.chunk_times), record.output_tokens, record.prompt_tokens), (4, 4, 12))

    def test_a_server_certificate_that_is_not_trusted_fails_the_request_saying_so(self):
        with tempfile.TemporaryDirectory() as folder:
            tls = self_signed_certificate(folder) or self.skipTest("openssl is not installed (it makes the certificate)")
            with FakeServer(tls=tls) as server:
                record = measure(server)
        self.assertEqual(record.error_kind, "connection")
        self.assertIn("CERTIFICATE_VERIFY_FAILED", record.error)

    def test_a_malformed_chunk_in_the_heads_read_fails_as_a_malformed_body(self):
        def handle(handler, body):  # NOTE: one write, so the bad chunk comes in the head's read
            handler.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n")
            handler.close_connection = True
        with FakeServer(chat=handle) as server:
            record = measure(server)
        self.assertEqual((record.status, record.error_kind, record.error),
                         (200, "bad-response", "malformed chunked body: invalid literal for int() with base 16: b'zz'"))

    def test_a_truncated_stream_is_an_error_not_a_short_answer(self):
        with FakeServer(chat=stream_of(sse(chunk("a"), chunk("b"), done=False))) as server:
            record = measure(server)
        self.assertEqual(record.error_kind, "truncated")
        self.assertEqual(main.summarize([record])["num_completed"], 0)

    def test_a_finish_reason_without_done_is_complete(self):
        with FakeServer(chat=stream_of(sse(chunk("a"), chunk(finish="stop", usage=(1, 1)), done=False))) as server:
            self.assertIsNone(measure(server).error)

    def test_a_stalled_stream_becomes_a_timeout_error(self):
        gate = threading.Event()
        try:
            with FakeServer(chat=stream_of(sse(chunk("a"), done=False), b"", gate=gate)) as server:
                record = measure(server, timeout_s=0.5)
        finally:
            gate.set()
        self.assertEqual(record.error_kind, "timeout")
        self.assertIn("--timeout 0.5 s", record.error)

    def test_an_http_error_keeps_status_and_the_servers_message(self):
        with FakeServer(chat=error_response(400, LLAMA_400)) as server:
            record = measure(server)
        self.assertEqual((record.status, record.error_kind), (400, "http 400"))
        self.assertEqual(record.error, "request (1124 tokens) exceeds the available context size (1024 tokens), "
                                       "try increasing it (exceed_context_size_error)")

    def test_a_refused_connection_raises_server_unreachable(self):
        with self.assertRaisesRegex(main.ServerUnreachable, "connection refused"):
            with main.StreamLoop() as loop:
                main.stream_chat(main.Endpoint.parse(f"http://127.0.0.1:{free_port()}"), b"{}", {},
                                 main.MeasuredRequest(0, sent_s=0.0), loop, 5.0)

    def test_a_close_delimited_stream_without_chunking_parses(self):
        def handle(handler, body):
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Connection", "close")
            handler.end_headers()
            handler.wfile.write(standard_stream(num_tokens=3))
            handler.close_connection = True
        with FakeServer(chat=handle) as server:
            record = measure(server)
        self.assertEqual((record.error, record.output_tokens, len(record.chunk_times)), (None, 3, 3))


def lag_report(delay_p99=None, round_p99=None, itl_p50=5.0, decode_lag_p99=None):
    """The parts of a loadgen report that loadgen_warnings reads."""
    def distribution(p99):
        return {"count": 0} if p99 is None else {"count": 100, "p50": p99 / 4, "p99": p99, "max": p99 * 2}
    return {"reader_delay_ms": distribution(delay_p99), "reader_round_ms": distribution(round_p99),
            "reader_decode_lag_ms": distribution(decode_lag_p99), "send_lateness_ms": distribution(None),
            "summary": {"itl_ms": {"p50": itl_p50}}}


class ReaderLagTest(unittest.TestCase):
    """How loadgen dates bytes it reads late, and when it says its figures are unreliable."""

    def test_kernel_stamps_date_bytes_by_their_arrival_not_by_a_late_read(self):
        with kernel_stamping() as stamped:
            if stamped is None:
                self.skipTest("no kernel receive stamps here (Linux on x86_64 or arm64 has them)")
            client, server, receiver = stamped
            before_s = time.perf_counter()
            server.sendall(b"data: {}\n\n")
            sent_s = time.perf_counter()
            time.sleep(0.2)
            reading_s = time.perf_counter()
            data, arrived_s, waited_s = receiver.recv()
            read_s = time.perf_counter() - reading_s
        self.assertEqual(data, b"data: {}\n\n")
        # NOTE: recv reads two clocks one after the other; a thread preempted between them (a
        # loaded machine) dates the bytes earlier by as long, and recv lasted at least that
        self.assertGreaterEqual(arrived_s, before_s - 0.001 - read_s)
        self.assertLess(arrived_s, sent_s + 0.05)  # loopback delivers within send(); the read came 0.2 s on
        self.assertGreater(waited_s, 0.15)

    def test_a_reader_held_up_still_dates_a_token_by_its_arrival(self):
        held, written, released_s = threading.Event(), threading.Event(), []

        def handle(handler, body):
            handler.start_stream()
            handler.write_chunk(sse(chunk("a"), done=False))
            held.wait(10)  # NOTE: "b" goes out while the thread that reads this stream is busy
            handler.write_chunk(sse(chunk("b"), done=False))
            written.set()
            handler.write_chunk(sse(chunk(finish="stop", usage=(1, 2))))
            handler.end_stream()

        def on_event(at, event):
            # the reader is held until 0.2 s after "b" was written, however late each thread runs
            if not held.is_set() and event["choices"][0]["delta"].get("content") == "a":
                held.set()
                written.wait(10)
                time.sleep(0.2)
                released_s.append(time.perf_counter())

        record = main.MeasuredRequest(0, sent_s=0.0)
        with kernel_stamping() as stamped, FakeServer(chat=handle) as server, main.StreamLoop() as loop:
            if stamped is None:
                self.skipTest("no kernel receive stamps here (Linux on x86_64 or arm64 has them)")
            main.stream_chat(main.Endpoint.parse(server.url), main.chat_body("m", "hi", 2, False, 0.0),
                             {"Content-Type": "application/json"}, record, loop, 10.0, on_event)
        self.assertIsNone(record.error)
        self.assertEqual(len(record.chunk_times), 2)
        self.assertLess(record.chunk_times[1], released_s[0] - 0.1)  # read after released_s, dated before it

    def test_an_injected_clock_dates_bytes_when_read_without_kernel_stamps(self):
        clock = iter([10.0, 12.5]).__next__
        client, server = connected_pair()
        with client, server, main.StreamLoop(clock=LateClock().clock) as loop:
            self.assertFalse(loop.kernel_stamps)
            receiver = main.Receiver(client, clock, stamped=False)
            server.sendall(b"x")
            self.assertEqual(receiver.recv(), (b"x", 12.5, None))

    def test_late_reads_warn_only_near_the_gap_between_a_streams_events(self):
        self.assertEqual(main.loadgen_warnings(lag_report(delay_p99=1.9, round_p99=30.0), 1, 8), [])
        self.assertEqual(main.loadgen_warnings(lag_report(delay_p99=3.0, round_p99=30.0), 2, 8), [
            "the stream reader read bytes 3.0 ms after they arrived at p99: a stream's events that wait together "
            "get the last one's time; use --workers 4"])
        self.assertEqual(main.loadgen_warnings(lag_report(delay_p99=20.0, itl_p50=60.0), 1, 8), [])

    def test_without_kernel_stamps_the_readers_rounds_warn(self):
        self.assertEqual(main.loadgen_warnings(lag_report(round_p99=3.0), 1, 8), [
            "the stream reader's rounds took 3.0 ms at p99: token times behind them are late by up to that; "
            "use --workers 2"])
        self.assertEqual(main.loadgen_warnings(lag_report(round_p99=1.0), 1, 8), [])

    def test_answers_decoded_late_warn_that_requests_waiting_on_them_went_out_late(self):
        self.assertEqual(main.loadgen_warnings(lag_report(decode_lag_p99=4.0), 1, 8), [])
        self.assertEqual(main.loadgen_warnings(lag_report(decode_lag_p99=40.0), 1, 8), [
            "the stream reader decoded answers 40.0 ms after they arrived at p99: a request that waits for another "
            "to end (a closed loop's next, a conversation's next turn, one under --concurrency) went out up to "
            "that late; use --workers 2"])

    def backlog_then_a_new_event(self, max_undecoded_reads):
        """Twelve "slow" streams' events wait, read, to be decoded when a "late" stream's event
        arrives (it is written while the first slow one is decoded). The clock counts the
        slow events decoded, so the late event's time says how many were decoded before it
        was read. A "first" stream's event holds the loop until every slow event is written."""
        num_slow, decoded = 12, []
        all_sent, all_written = threading.Barrier(num_slow + 2), threading.Barrier(num_slow + 1)
        loop_held, late_go, late_written = threading.Event(), threading.Event(), threading.Event()

        def handle(handler, body):
            prompt = body["messages"][0]["content"]
            handler.start_stream()
            all_sent.wait(10)
            if prompt == "slow":
                loop_held.wait(10)
            if prompt == "late":
                late_go.wait(10)
            handler.write_chunk(sse(chunk(prompt), done=False))
            if prompt == "slow":
                all_written.wait(10)
            if prompt == "late":
                late_written.set()
            handler.write_chunk(sse(chunk(finish="stop", usage=(1, 1))))
            handler.end_stream()

        def on_event(at, event):
            content = event["choices"][0]["delta"].get("content")
            if content == "first":
                loop_held.set()
                all_written.wait(10)
            elif content == "slow":
                if not decoded:
                    late_go.set()
                    late_written.wait(10)
                decoded.append(at)

        records = [main.MeasuredRequest(index) for index in range(num_slow + 2)]
        prompts = ["first", "late"] + ["slow"] * num_slow
        with FakeServer(chat=handle) as server, main.StreamLoop(clock=lambda: float(len(decoded))) as loop, \
                mock.patch.object(main, "DECODE_SLICE_S", 0.0), \
                mock.patch.object(main, "MAX_UNDECODED_READS", max_undecoded_reads):
            endpoint = main.Endpoint.parse(server.url)
            streams = [loop.send(endpoint, endpoint.request_bytes("POST", main.CHAT_PATH, {}, main.chat_body(
                "m", prompt, 2, False, 0.0)), record, 10.0, on_event) for prompt, record in zip(prompts, records)]
            self.assertTrue(all(stream.done.wait(10) for stream in streams))
        self.assertTrue(all(record.error is None for record in records), [r.error for r in records])
        return records[1].chunk_times[0]

    def test_a_socket_that_becomes_ready_is_read_before_a_backlog_of_reads_is_decoded(self):
        self.assertEqual(self.backlog_then_a_new_event(max_undecoded_reads=4096), 1.0)

    def test_past_max_undecoded_reads_the_loop_decodes_its_backlog_before_reading_on(self):
        self.assertEqual(self.backlog_then_a_new_event(max_undecoded_reads=0), 12.0)

    def test_a_late_reader_with_a_process_per_cpu_is_told_to_find_more_cores_not_more_workers(self):
        self.assertEqual(main.loadgen_warnings(lag_report(delay_p99=3.0), 2, 2), [
            "the stream reader read bytes 3.0 ms after they arrived at p99: a stream's events that wait together "
            "get the last one's time; --workers 2 already has a process for each of the 2 CPUs here: run loadgen "
            "where it has more cores, not beside the server"])


class HttpBodyTest(unittest.TestCase):

    def test_chunked_bodies_decode_across_arbitrary_splits(self):
        wire = b"4\r\nWiki\r\n6;ext=1\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\n"
        for split in range(1, len(wire)):
            body = main.HttpBody({"transfer-encoding": "chunked"})
            decoded = body.feed(wire[:split]) + body.feed(wire[split:])
            self.assertEqual((decoded, body.complete), (b"Wikipedia in \r\n\r\nchunks.", True))

    def test_content_length_bodies_stop_at_their_length(self):
        body = main.HttpBody({"content-length": "5"})
        self.assertEqual((body.feed(b"abc"), body.complete), (b"abc", False))
        self.assertEqual((body.feed(b"defgh"), body.complete), (b"de", True))

    def test_a_malformed_chunk_size_raises_value_error(self):
        with self.assertRaises(ValueError):
            main.HttpBody({"transfer-encoding": "chunked"}).feed(b"zz\r\n")


class TokenSpreadTest(unittest.TestCase):

    def test_tokens_spread_evenly_with_the_remainder_on_the_last_chunks(self):
        self.assertEqual(main.tokens_per_chunk([None] * 3, 7, 3), [2, 2, 3])
        self.assertEqual(main.tokens_per_chunk([None] * 3, 3, 3), [1, 1, 1])
        self.assertIsNone(main.tokens_per_chunk([None] * 3, 2, 3))

    def test_a_gap_that_delivered_k_tokens_counts_as_k_gaps(self):
        self.assertEqual(main.spread_token_times([0.0, 4.0], [1, 4]), [0.0, 1.0, 2.0, 3.0, 4.0])


class PrometheusTest(unittest.TestCase):

    def test_parser_reads_labels_special_values_and_skips_comments(self):
        samples = main.parse_prometheus(
            '# HELP vllm:x help\n# TYPE vllm:x gauge\n'
            'vllm:num_requests_running{model_name="a b",engine="0"} 3\n'
            'vllm:num_requests_running{model_name="c\\"d",engine="1"} 4.5 1700000000\n'
            'weird_nan NaN\nup_inf +Inf\ndown -Inf\nnot a sample line\n')
        self.assertEqual(samples["vllm:num_requests_running"],
                         [({"model_name": "a b", "engine": "0"}, 3.0), ({"model_name": 'c"d', "engine": "1"}, 4.5)])
        self.assertTrue(samples["weird_nan"][0][1] != samples["weird_nan"][0][1])
        self.assertEqual((samples["up_inf"][0][1], samples["down"][0][1]), (float("inf"), float("-inf")))
        self.assertEqual(main.metric_total(samples, "vllm:num_requests_running"), 7.5)
        self.assertIsNone(main.metric_total(samples, "absent"))


def llama_metrics(decodes, busy_avg, prompt, predicted, processing, deferred, cached=0):
    return (f"# TYPE llamacpp:n_decode_total counter\nllamacpp:prompt_tokens_total {prompt}\n"
            f"llamacpp:prompt_tokens_cached_total {cached}\nllamacpp:tokens_predicted_total {predicted}\n"
            f"llamacpp:n_decode_total {decodes}\nllamacpp:requests_processing {processing}\n"
            f"llamacpp:requests_deferred {deferred}\nllamacpp:n_busy_slots_per_decode {busy_avg}\n")


def vllm_metrics(running, waiting, kv, preemptions, hits, queries, generated):
    return (f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
            f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n'
            f'vllm:num_preemptions_total{{model_name="m"}} {preemptions}\n'
            f'vllm:prefix_cache_hits_total{{model_name="m"}} {hits}\n'
            f'vllm:prefix_cache_queries_total{{model_name="m"}} {queries}\n'
            f'vllm:generation_tokens_total{{model_name="m"}} {generated}\n')


class ServerWindowTest(unittest.TestCase):

    def test_llama_cpp_mean_batch_in_the_window_follows_the_step_8_formula(self):
        scrapes = [main.parse_prometheus(text) for text in (
            llama_metrics(100, 1.0, 500, 100, 0, 0),
            llama_metrics(200, 2.0, 900, 300, 4, 3),
            llama_metrics(300, 2.5, 1400, 600, 2, 1, cached=40))]
        window = main.server_window(scrapes)
        # (2.5 x 300 - 1.0 x 100) / (300 - 100)
        self.assertEqual(window["mean_batch"], 3.25)
        self.assertEqual((window["decode_calls"], window["prompt_tokens"], window["generated_tokens"]),
                         (200.0, 900.0, 500.0))
        self.assertEqual((window["max_running"], window["max_waiting"], window["cached_prompt_tokens"]),
                         (4.0, 3.0, 40.0))
        self.assertEqual(window["server"], "llama.cpp")

    def test_vllm_counter_deltas_and_gauge_maxima_are_exact(self):
        scrapes = [main.parse_prometheus(text) for text in (
            vllm_metrics(0, 0, 0.1, 5, 100, 1000, 10_000),
            vllm_metrics(32, 40, 1.0, 9, 400, 1800, 12_000),
            vllm_metrics(30, 12, 0.7, 12, 700, 2000, 15_000))]
        window = main.server_window(scrapes)
        self.assertEqual(window["server"], "vllm")
        self.assertEqual((window["max_running"], window["max_waiting"], window["kv_usage_peak"]), (32.0, 40.0, 1.0))
        self.assertEqual((window["preemptions"], window["generated_tokens"]), (7.0, 5000.0))
        self.assertEqual((window["prefix_cache_hits"], window["prefix_cache_queries"]), (600.0, 1000.0))
        self.assertEqual(window["prefix_hit_rate"], 0.6)

    def test_one_scrape_is_no_window(self):
        self.assertIsNone(main.server_window([main.parse_prometheus(llama_metrics(1, 1, 1, 1, 0, 0))]))


class LoadgenCliTest(unittest.TestCase):

    def loadgen(self, server, *argv):
        return run_cli("loadgen", "--url", server.url, "--scrape-interval", "0.05", *argv)

    def test_a_closed_loop_run_reports_the_summary_and_the_server_window(self):
        metrics = [llama_metrics(100, 1.0, 0, 0, 0, 0), llama_metrics(164, 3.0, 192, 64, 4, 0)]
        with FakeServer(metrics=metrics) as server:
            code, out, err = self.loadgen(server, "--concurrency", "4", "--requests", "16")
            bodies = server.bodies
        self.assertEqual((code, err), (0, ""))
        lines = out.splitlines()
        self.assertEqual(lines[0], f"loadgen fake-model at {server.url} 16 requests closed loop concurrency 4 "
                                   f"max tokens 64")
        self.assertEqual(lines[1], "tokens per request prompt 12.0 output 4.0 (from usage)")
        self.assertEqual([line.split()[0] for line in lines[3:8]], ["ttft", "tpot", "itl", "chunk", "e2e"])
        # (3.0 x 164 - 1.0 x 100) / 64
        self.assertIn("server llama.cpp mean batch 6.12 max running 4 max waiting 0 decodes 64 "
                      "prompt tokens 192 cached 0 generated 64", out)
        self.assertEqual(len(bodies), 16)

    def test_a_metrics_scrape_reset_mid_run_is_skipped_and_the_window_kept(self):
        gate = threading.Event()
        metrics = [llama_metrics(100, 1.0, 0, 0, 0, 0), reset_connection, llama_metrics(104, 2.0, 24, 8, 2, 0)]
        with FakeServer(chat=stream_of(standard_stream(), gate=gate), metrics=metrics) as server:
            opener = threading.Thread(target=lambda: (wait_until(lambda: server.num_scrapes >= 3), gate.set()))
            opener.start()
            code, out, err = self.loadgen(server, "--concurrency", "2", "--requests", "2")
            opener.join()
        self.assertEqual((code, err), (0, ""))
        self.assertIn("server llama.cpp mean batch 27.00 max running 2 max waiting 0 decodes 4 ", out)  # (2 x 104 - 100) / 4

    def test_a_metrics_endpoint_that_fails_at_the_end_leaves_the_streams_measured_and_says_why(self):
        with FakeServer(metrics=[llama_metrics(1, 1, 0, 0, 0, 0), reset_connection]) as server:
            code, out, err = self.loadgen(server, "--requests", "3", "--json")
        report = json.loads(out)
        self.assertEqual((code, err, report["summary"]["num_completed"], report["server"]), (0, "", 3, None))
        self.assertRegex(report["server_note"], r"^the last scrape failed, so no window: /metrics unreadable: "
                                                r"GET http://127\.0\.0\.1:\d+/metrics: ConnectionResetError: ")

    def test_a_metrics_endpoint_that_stalls_from_the_start_leaves_the_streams_measured(self):
        with FakeServer(metrics=[stall_for(0.05)]) as server:
            code, out, err = self.loadgen(server, "--requests", "3")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("tokens per request prompt 12.0 output 4.0 (from usage)", out)
        self.assertRegex(out, r"\nserver window unavailable: /metrics unreadable: GET http://127\.0\.0\.1:\d+/metrics: "
                              r"RemoteDisconnected: Remote end closed connection without response\n")

    def test_the_request_body_carries_the_openai_streaming_fields(self):
        with FakeServer() as server:
            code, _, _ = self.loadgen(server, "--requests", "1", "--max-tokens", "32", "--ignore-eos",
                                      "--temperature", "0.5")
            body = server.bodies[0]
        self.assertEqual(code, 0)
        self.assertEqual(body["model"], "fake-model")
        self.assertEqual((body["stream"], body["stream_options"]), (True, {"include_usage": True}))
        self.assertEqual((body["max_tokens"], body["ignore_eos"], body["temperature"]), (32, True, 0.5))
        self.assertEqual(body["messages"][0]["role"], "user")

    def test_endpoint_completions_posts_a_bare_prompt_and_reads_text_chunks(self):
        with FakeServer(chat=counting_completion()) as server:
            code, out, err = run_cli("loadgen", "--url", server.url, "--endpoint", "/v1/completions", "--requests",
                                     "3", "--concurrency", "1", "--max-tokens", "3", "--prompt-tokens", "20", "--json")
            paths, bodies = list(server.paths), list(server.bodies)
        self.assertEqual((code, err), (0, ""))
        report = json.loads(out)
        self.assertEqual(paths, ["/v1/completions"] * 3)
        self.assertEqual([(type(body["prompt"]), "messages" in body, body["max_tokens"]) for body in bodies],
                         [(str, False, 3)] * 3)
        self.assertEqual((report["settings"]["endpoint"], report["summary"]["num_completed"],
                          report["summary"]["output_tokens"]), ("/v1/completions", 3, 9))

    def test_model_flag_overrides_the_first_listed_model(self):
        with FakeServer(models=("first", "second")) as server:
            self.loadgen(server, "--requests", "1")
            self.loadgen(server, "--requests", "1", "--model", "second")
            self.assertEqual([body["model"] for body in server.bodies], ["first", "second"])

    def test_prompts_share_the_prefix_and_differ_after_it(self):
        with FakeServer() as server:
            self.loadgen(server, "--requests", "3", "--prompt-tokens", "60", "--shared-prefix-tokens", "40")
            prompts = [body["messages"][0]["content"] for body in server.bodies]
        heads = {" ".join(prompt.split()[:40]) for prompt in prompts}
        self.assertEqual(len(heads), 1)
        self.assertEqual(len({" ".join(prompt.split()[40:]) for prompt in prompts}), 3)
        self.assertTrue(all(50 <= len(prompt.split()) <= 62 for prompt in prompts))

    def test_prompt_file_text_is_the_body_of_every_prompt(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
            handle.write("Explain paged attention.")
        try:
            with FakeServer() as server:
                self.loadgen(server, "--requests", "2", "--prompt-file", handle.name, "--seed", "7")
                prompts = [body["messages"][0]["content"] for body in server.bodies]
        finally:
            os.unlink(handle.name)
        self.assertEqual(prompts, ["Request 7-0. Explain paged attention.", "Request 7-1. Explain paged attention."])

    def test_prompts_differ_between_runs_unless_the_seed_is_repeated(self):
        def prompts(*argv):
            with FakeServer() as server:
                self.loadgen(server, "--requests", "2", *argv)
                return [body["messages"][0]["content"] for body in server.bodies]
        self.assertNotEqual(prompts(), prompts())
        self.assertEqual(prompts("--seed", "3"), prompts("--seed", "3"))

    def test_the_api_key_is_sent_as_a_bearer_token_and_never_printed(self):
        with FakeServer(metrics=[llama_metrics(1, 1, 0, 0, 0, 0)]) as server:
            code, out, err = self.loadgen(server, "--requests", "2", "--api-key", "sk-SECRET", "--json",
                                          "--json-requests")
            seen = [headers.get("Authorization") for headers in server.headers_seen]
        self.assertEqual(code, 0)
        self.assertTrue(seen and all(value == "Bearer sk-SECRET" for value in seen), seen)
        self.assertNotIn("SECRET", out + err)

    def test_openai_api_key_from_the_environment_is_used(self):
        with mock.patch.dict(os.environ, {"OPENAI_API_KEY": "sk-ENV"}), FakeServer() as server:
            self.loadgen(server, "--requests", "1")
            self.assertEqual(server.headers_seen[-1].get("Authorization"), "Bearer sk-ENV")

    def test_an_http_400_is_kept_per_request_and_the_others_are_reported(self):
        def script(index, body):
            return error_response(400, LLAMA_400) if index == 2 else stream_of(standard_stream())
        with FakeServer(chat=script, per_request=True) as server:
            code, out, err = self.loadgen(server, "--requests", "5")
        self.assertEqual(code, 1)
        self.assertIn("tokens per request prompt 12.0 output 4.0", out)
        self.assertIn("errors 1: http 400 1", out)
        self.assertIn("  request 2 http 400: request (1124 tokens) exceeds the available context size", out)
        report = json.loads(self.loadgen_json(script))
        self.assertEqual((report["summary"]["num_completed"], report["summary"]["errors"]), (4, {"http 400": 1}))
        self.assertEqual(report["errors"][0]["status"], 400)

    def loadgen_json(self, script):
        with FakeServer(chat=script, per_request=True) as server:
            return self.loadgen(server, "--requests", "5", "--json")[1]

    def test_a_truncated_stream_is_reported_then_exits_1(self):
        with FakeServer(chat=stream_of(sse(chunk("a"), done=False))) as server:
            code, out, err = self.loadgen(server, "--requests", "2")
        self.assertEqual((code, err), (1, ""))
        self.assertIn("errors 2: truncated 2", out)

    def test_a_refused_connection_exits_1_with_one_line_and_no_traceback(self):
        url = f"http://127.0.0.1:{free_port()}"
        for argv in (("--model", "m"), ()):
            code, out, err = run_cli("loadgen", "--url", url, "--requests", "4", *argv)
            self.assertEqual((code, out), (1, ""))
            self.assertEqual(err, f"servesim: cannot connect to {url}: connection refused\n")

    def test_missing_metrics_is_said_and_the_run_goes_on(self):
        with FakeServer(metrics=None) as server:
            code, out, _ = self.loadgen(server, "--requests", "2")
        self.assertEqual(code, 0)
        self.assertIn("server window unavailable: no /metrics (HTTP 404); llama-server needs --metrics", out)

    def test_warmup_requests_are_sent_first_and_left_out_of_the_report(self):
        with FakeServer() as server:
            code, out, _ = self.loadgen(server, "--requests", "3", "--warmup", "2", "--json")
            self.assertEqual(len(server.bodies), 5)
        report = json.loads(out)
        self.assertEqual(report["summary"]["num_requests"], 3)

    def test_goodput_counts_requests_meeting_every_slo(self):
        with FakeServer() as server:
            code, out, _ = self.loadgen(server, "--requests", "4", "--slo-ttft-ms", "60000", "--slo-tpot-ms",
                                        "60000", "--json")
        goodput = json.loads(out)["summary"]["goodput"]
        self.assertEqual((goodput["num_met"], goodput["attainment"]), (4, 1.0))
        self.assertEqual(goodput["slo"], {"ttft_ms": 60000.0, "tpot_ms": 60000.0})

    def test_the_json_report_round_trips(self):
        def script(index, body):
            return error_response(429, {"error": {"message": "busy"}}) if index == 1 else stream_of(standard_stream())
        with FakeServer(chat=script, per_request=True, metrics=[llama_metrics(1, 1, 0, 0, 0, 0)]) as server:
            code, out, _ = self.loadgen(server, "--requests", "4", "--json-requests", "--slo-ttft-ms", "1000")
        report = json.loads(out)
        records = records_from_report(json.loads(json.dumps(report)))
        self.assertEqual(main.summarize(records, main.Slo(ttft_ms=1000.0)), report["summary"])
        self.assertEqual([r["request_id"] for r in report["requests"]], [0, 1, 2, 3])
        self.assertEqual(report["requests"][0]["sent_s"] >= 0, True)

    def test_a_price_gives_the_measured_runs_dollars_per_million_tokens(self):
        with FakeServer() as server:
            code, out, _ = self.loadgen(server, "--requests", "4", "--price-per-hour", "3.6", "--num-devices", "2",
                                        "--json")
        summary = json.loads(out)["summary"]
        self.assertEqual(code, 0)
        # $3.60 x 2 devices an hour, over the output tokens an hour at the measured throughput
        self.assertEqual((summary["cost"]["usd_per_hour"], summary["cost"]["num_devices"]), (7.2, 2))
        self.assertAlmostEqual(summary["cost"]["usd_per_million_output_tokens"],
                               7.2 / (summary["output_tok_per_s"] * 3600) * 1e6, places=6)
        with FakeServer() as server:
            self.assertNotIn("cost", json.loads(self.loadgen(server, "--requests", "2", "--json")[1])["summary"])

    def test_an_ipv6_url_reaches_the_server_with_a_bracketed_host_header(self):
        try:
            server = FakeServer(host="::1").__enter__()
        except OSError as error:
            self.skipTest(f"no IPv6 loopback here ({error})")
        try:
            code, out, err = run_cli("loadgen", "--url", server.url, "--requests", "1", "--json")
        finally:
            server.__exit__(None, None, None)
        self.assertEqual((code, err), (0, ""))
        port = server.url.rsplit(":", 1)[1]
        self.assertEqual(server.headers_seen[-1]["Host"], f"[::1]:{port}")
        self.assertEqual(json.loads(out)["settings"]["url"], f"http://[::1]:{port}")

    def test_a_bad_url_exits_2(self):
        code, out, err = run_cli("loadgen", "--url", "localhost:8080")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--url: expected http://HOST:PORT", err)


class OpenLoopTest(unittest.TestCase):

    def plan(self, server, schedule, concurrency=None):
        bodies = [main.chat_body("m", "hi", 4, False, 0.0)] * len(schedule)
        return main.LoadPlan(main.Endpoint.parse(server.url), bodies, {"Content-Type": "application/json"},
                             0, concurrency, schedule, 10.0)

    def test_gamma_schedule_has_the_requested_mean_rate_and_starts_at_zero(self):
        offsets = main.open_loop_schedule(4000, rate=20.0, burstiness=0.5, seed=1)
        self.assertEqual(offsets[0], 0.0)
        self.assertAlmostEqual(offsets[-1] / 3999, 1 / 20, delta=0.004)
        self.assertEqual(main.open_loop_schedule(50, 20.0, 1.0, 3), main.open_loop_schedule(50, 20.0, 1.0, 3))

    def test_sends_follow_the_precomputed_absolute_schedule(self):
        schedule = main.open_loop_schedule(20, rate=10.0, burstiness=1.0, seed=5)
        fake = LateClock()
        with FakeServer() as server:
            with main.LoadRun(self.plan(server, schedule), clock=fake.clock, sleep=fake.sleep) as run:
                run.start()
                run.wait()
        self.assertEqual([record.sent_s for record in run.records], schedule)

    def test_a_late_wake_up_delays_its_own_send_and_never_the_later_ones(self):
        # NOTE: every sleep ends 3 ms late (a loaded machine): a send due after a sleep is 3 ms
        # late, one due sooner than that after the last send goes at once, and none is later;
        # sleeping from one send to the next instead would add the late wake-ups up
        schedule = main.open_loop_schedule(24, rate=60.0, burstiness=1.0, seed=2)
        late = LateClock(late_s=0.003)
        with FakeServer() as server:
            with main.LoadRun(self.plan(server, schedule), clock=late.clock, sleep=late.sleep) as run:
                run.start()
                run.wait()
        expected, now = [], 0.0
        for due in schedule:
            now = due + 0.003 if due > now else now
            expected.append(round(now - due, 9))
        self.assertEqual([round(r.sent_s - r.scheduled_s, 9) for r in run.records], expected)
        self.assertEqual([r.scheduled_s for r in run.records], schedule)
        self.assertEqual(max(expected), 0.003)
        self.assertTrue(any(0 < lateness < 0.003 for lateness in expected))  # due within a late wake-up: at once
        self.assertTrue(all(r.error is None for r in run.records))

    def test_a_load_run_keeps_the_cyclic_collector_off_until_it_is_closed(self):
        seen = []  # whether the collector was on, at each event read

        def on_event(at, event):
            seen.append(gc.isenabled())
        with FakeServer() as server:
            with main.LoadRun(self.plan(server, [0.0, 0.0]), on_event=on_event) as run:
                run.start()
                run.wait()
            self.assertTrue(gc.isenabled())
        self.assertTrue(seen)
        self.assertEqual(set(seen), {False})

    def test_a_surprise_after_an_answer_fails_that_request_and_the_run_still_ends(self):
        bodies = [b'{"model": "m", "stream": true}', main.chat_body("m", "next", 4, False, 0.0)]  # no prompt in the first
        with FakeServer() as server:
            plan = main.LoadPlan(main.Endpoint.parse(server.url), bodies, {"Content-Type": "application/json"}, 0,
                                 None, [0.0, None], 10.0, next_turn={0: 1}, think_s={1: 0.0})
            with main.LoadRun(plan) as run:
                run.start()
                run.wait()
        self.assertEqual((run.records[0].error_kind, run.records[0].error), ("bad-response", "KeyError: 'prompt'"))
        self.assertIsNone(run.records[1].sent_s)

    def test_rate_with_concurrency_caps_requests_in_flight(self):
        gate = threading.Event()
        with FakeServer(chat=stream_of(sse(chunk("a"), done=False), sse(chunk(finish="stop", usage=(1, 1))), gate=gate)) as server:
            with main.LoadRun(self.plan(server, [0.0] * 6, concurrency=2)) as run:
                dispatcher = threading.Thread(target=run.start)
                dispatcher.start()
                self.assertTrue(server.wait_for_requests(2))
                dispatcher.join(0.3)
                self.assertEqual(sum(r.sent_s is not None for r in run.records), 2)  # the third waits for a slot
                gate.set()
                dispatcher.join(10)
                run.wait()
        self.assertEqual(len(server.bodies), 6)


class InterruptTest(unittest.TestCase):

    def test_ctrl_c_stops_sending_and_a_second_one_ends_the_grace_reporting_what_finished(self):
        gate = threading.Event()  # never opened while loadgen runs: both streams stay in flight
        with FakeServer(chat=stream_of(sse(chunk("a"), done=False), sse(chunk(finish="stop", usage=(9, 2))),
                                       gate=gate)) as server:
            # NOTE: a grace of an hour, so that ending at all (within the 60 s a stuck child gets)
            # is ending it at once, however loaded the machine
            process = start_interruptible("loadgen", "--url", server.url, "--model", "m", "--concurrency", "2",
                                          "--requests", "10", grace_s=3600)
            try:
                self.assertTrue(server.wait_for_requests(2))
                process.send_signal(signal.SIGINT)
                notice = process.stderr.readline()
                process.send_signal(signal.SIGINT)
                out, err = process.communicate(timeout=60)
            finally:
                process.kill()
                gate.set()
            self.assertEqual(len(server.bodies), 2)
        self.assertEqual(notice, "loadgen: interrupted; streams in flight get 3600 s to end (Ctrl-C again: stop now)\n")
        self.assertEqual(process.returncode, 130, err)
        self.assertNotIn("Traceback", err)
        self.assertIn(" 2 requests closed loop concurrency 2", out.splitlines()[0])
        self.assertIn("errors 2: interrupted 2", out)

    def test_streams_still_open_after_the_grace_count_as_interrupted(self):
        gate = threading.Event()  # never opened while the run is measured
        with FakeServer(chat=stream_of(sse(chunk("a"), done=False), sse(chunk(finish="stop", usage=(9, 2))),
                                       gate=gate)) as server:
            plan = main.LoadPlan(main.Endpoint.parse(server.url), [main.chat_body("m", "hi", 4, False, 0.0)] * 2,
                                 {"Content-Type": "application/json"}, 0, 2, None, 10.0)
            try:
                with main.LoadRun(plan) as run:
                    run.start()
                    self.assertTrue(server.wait_for_requests(2))
                    run.stop()
                    main.finish_in_flight(run, grace_s=0.05)
                    errors = [(record.error_kind, record.error) for record in run.measured()]
            finally:
                gate.set()
        self.assertEqual(errors, [("interrupted", "still streaming when the run was interrupted")] * 2)


if __name__ == "__main__":
    unittest.main()
