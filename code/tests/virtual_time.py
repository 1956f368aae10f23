"""A FakeEngine and its clients in virtual time: what profile measures, with no real clock.

    with FakeEngine(decode_ms={1: 9, 2: 19}) as engine, VirtualTime(engine):
        run_cli("profile", "--url", engine.url, ...)

A profile times a server's steps; against a fake that sleeps on the real clock, a loaded
machine's late wake-ups move what it measures (a 9 ms step read as 10). Here the engine's
steps and the profile's load runs share one clock that jumps from event to event: inside
the block, main.LoadRun sends each request by handing its prompt to the engine (after
FRONT_END_S, plus the engine's request_path_ms), and each token reaches its record the
moment the engine's step that made it ends. The engine takes its steps exactly as its
thread would (FakeEngine.begin_step and end_step), so its /metrics, /props and the rest
still answer over HTTP; main.MetricsSampler's scrapes during a run come every interval_s
of virtual time; main.Profiler times its budget on the same clock. The network path of
profile (the stream loop, the SSE parser) is left to the tests that run on the real clock.

A closed loop's clients send at once, so an idle engine admits all of them in one step;
with send_gap_s they go out that far apart, and the first starts a step alone (as on a
real clock, where the engine wakes to the first request before the others are in).
"""

import heapq
import itertools
import json
from unittest import mock

from support import main

FRONT_END_S = 0.0005  # HTTP and the handler, each way together: a TTFT is more than its prefill step


class VirtualTime:
    """Context manager: engine's steps and profile's load runs on one virtual clock."""

    def __init__(self, engine, send_gap_s=0.0):
        self.engine = engine
        self.send_gap_s = send_gap_s  # between the first sends of a closed loop (0: all at once)
        self.now = 0.0
        self.samplers = []  # MetricsSamplers started: scraped every interval_s while a run goes
        self.patches = []

    def clock(self):
        return self.now

    def __enter__(self):
        virtual = self

        class VirtualLoadRun:
            """main.LoadRun's face (start, wait, stop, close, records), served in virtual time."""

            def __init__(self, plan, clock=None, sleep=None, on_event=None):
                self.plan = plan
                self.records = [main.MeasuredRequest(index) for index in range(len(plan.bodies))]

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.close()

            def start(self):
                virtual.serve(self.plan, self.records)

            def wait(self):
                pass

            def stop(self):
                pass

            def close(self):
                pass

            def measured(self):
                return self.records[self.plan.num_warmup:]

        class VirtualSampler(main.MetricsSampler):
            """Scrapes at virtual times: start() and finish() as the real one, none on a thread."""

            def start(self):
                if self.scrape():
                    virtual.samplers.append(self)

            def finish(self):
                if self not in virtual.samplers:
                    return None
                virtual.samplers.remove(self)
                return server_window_or_problem(self)

        class VirtualProfiler(main.Profiler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **dict(kwargs, clock=virtual.clock))

        self.engine.virtual, self.engine.clock = True, self.clock
        self.patches = [mock.patch.object(main, "LoadRun", VirtualLoadRun),
                        mock.patch.object(main, "MetricsSampler", VirtualSampler),
                        mock.patch.object(main, "Profiler", VirtualProfiler)]
        for patch in self.patches:
            patch.start()
        return self

    def __exit__(self, *exc):
        for patch in reversed(self.patches):
            patch.stop()
        self.engine.virtual = False

    def serve(self, plan, records):
        """Every request of plan, closed or open loop, until the last answer ends."""
        engine, start_s = self.engine, self.now
        events, order = [], itertools.count()  # (virtual time, order, kind, payload), the earliest first

        def at(time_s, kind, payload=None):
            heapq.heappush(events, (time_s, next(order), kind, payload))

        if plan.schedule is None:  # closed loop: concurrency clients, each sending its next as the last ends
            pending = iter(range(len(plan.bodies)))
            for index in itertools.islice(pending, plan.concurrency or len(plan.bodies)):
                at(start_s + index * self.send_gap_s, "send", index)
        else:
            assert plan.concurrency is None and None not in plan.schedule, "open loop without a cap or turns only"
            pending = iter(())
            for index, offset in enumerate(plan.schedule):
                at(start_s + offset, "send", index)
        for sampler in self.samplers:
            at(start_s + sampler.interval_s, "scrape", sampler)
        streams, stepping, num_open = {}, False, len(plan.bodies)
        while num_open:
            self.now, _, kind, payload = heapq.heappop(events)
            if kind == "send":
                records[payload].sent_s = self.now
                at(self.now + FRONT_END_S + engine.request_path_ms / 1000, "submit", payload)
            elif kind == "submit":
                body = json.loads(plan.bodies[payload])
                text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
                streams[engine.submit(len(text.split()), body.get("max_tokens", 16))] = payload
                if not stepping:  # an idle engine starts a step as a request comes
                    stepping = True
                    at(self.now, "step")
            elif kind == "step":
                with engine.lock:
                    decoding, admitted, cost_s = engine.begin_step()
                at(self.now + cost_s, "step end", (decoding, admitted))
            elif kind == "step end":
                decoding, admitted = payload
                with engine.lock:
                    engine.end_step(decoding, admitted)
                    stepping = engine.has_work()
                for stream in decoding + admitted:
                    record = records[streams[stream]]
                    record.chunk_times.append(self.now)
                    record.token_times.append(self.now)
                    if stream.generated >= stream.max_tokens:
                        self.finish(record, stream)
                        num_open -= 1
                        following = next(pending, None)
                        if following is not None:
                            at(self.now, "send", following)
                if stepping:
                    at(self.now, "step")
            elif kind == "scrape" and payload in self.samplers:
                payload.scrape()
                at(self.now + payload.interval_s, "scrape", payload)

    def finish(self, record, stream):
        """The record of an answer that ended, as the stream parser leaves it."""
        record.prompt_tokens, record.output_tokens = stream.prompt_tokens, stream.generated
        record.finish_reason, record.saw_done, record.status = "length", True, 200
        if self.engine.timings:
            record.timings = {"prompt_n": stream.prompt_tokens, "prompt_ms": stream.prompt_ms,
                              "predicted_n": stream.generated}


def server_window_or_problem(sampler):
    """MetricsSampler.finish()'s last scrape and window, without its thread."""
    if not sampler.scrape():
        sampler.problem = f"the last scrape failed, so no window: {sampler.problem}"
        return None
    return main.server_window(sampler.scrapes)
