"""--html and --svg: charts parsed back (xml.etree) and checked against the report's numbers;
pages with nothing fetched from anywhere; a screenshot in headless Chromium where it exists."""

import json
import os
import re
import shutil
import struct
import subprocess
import unittest
import zlib
import xml.etree.ElementTree as ET

from fake_server import FakeServer, counting_chat, word_tokens
from support import FIXTURES_DIR, ScratchTest, main, run_cli

SVG = "{http://www.w3.org/2000/svg}"
BURST = os.path.join(FIXTURES_DIR, "burst.jsonl")
SWEEP = ("sweep", "--concurrency", "1,8,32,128", "--requests", "200", "--slo-ttft-ms", "200", "--slo-tpot-ms", "15")


def series_of(svg):
    """{series name: [(x, y) pixel points]} and the chart's texts."""
    root = ET.fromstring(svg)
    lines = {}
    for group in root.iter(f"{SVG}g"):
        if group.get("class") == "series":
            polyline = group.find(f"{SVG}polyline")
            lines[group.get("data-name")] = [tuple(map(float, pair.split(","))) for pair in
                                             polyline.get("points").split()]
    texts = [element.text for element in root.iter(f"{SVG}text")]
    marks = [group.get("data-name") for group in root.iter(f"{SVG}g") if group.get("class") == "mark"]
    return root, lines, texts, marks


def data_at(root, axis, pixel):
    """The data value at a pixel, read off the chart's own tick labels (linear axes)."""
    ticks = [(float(t.text.replace(",", "")), float(t.get(axis)) - (4 if axis == "y" else 0))
             for t in root.iter(f"{SVG}text") if t.get("class") == f"{axis}-tick"]
    (low, low_px), (high, high_px) = ticks[0], ticks[-1]
    return low + (pixel - low_px) / (high_px - low_px) * (high - low)


def charts_of(page):
    return re.findall(r"<svg .*?</svg>", page, flags=re.S)


class ChartTest(ScratchTest):

    def test_nice_ticks_are_round_and_cover_the_range(self):
        self.assertEqual(main.nice_ticks(0, 97), [0, 20, 40, 60, 80, 100])
        self.assertEqual(main.nice_ticks(1, 256), [0, 100, 200, 300])
        self.assertEqual(main.nice_ticks(0.2, 0.9), [0.2, 0.4, 0.6, 0.8, 1.0])
        self.assertEqual(main.nice_ticks(1, 3), [1.0, 1.5, 2.0, 2.5, 3.0])
        self.assertEqual(main.nice_ticks(1, 3, whole=True), [1, 2, 3])

    def test_rows_numbered_on_the_x_axis_get_whole_ticks_and_a_note_at_the_bottom_goes_above(self):
        svg = main.svg_chart("t", "row", "y", [main.Series("s", ((1, 0), (2, 5), (3, 10)), notes=("low", "", ""))])
        root = ET.fromstring(svg)
        self.assertEqual([t.text for t in root.iter(f"{SVG}text") if t.get("class") == "x-tick"], ["1", "2", "3"])
        dot = next(root.iter(f"{SVG}circle"))  # the point at row 1, value 0: the plot's bottom edge
        note = next(t for t in root.iter(f"{SVG}text") if t.get("class") == "note")
        self.assertEqual(float(note.get("y")) - float(dot.get("cy")), -7)  # below it, it would cover the ticks

    def test_values_spanning_three_decades_go_on_a_log_axis_ticked_at_powers_of_ten(self):
        svg = main.svg_chart("t", "row", "ttft (ms)", [main.Series("s", ((1, 50), (2, 500), (3, 150_000)))])
        root = ET.fromstring(svg)
        ticks = {t.text: float(t.get("y")) - 4 for t in root.iter(f"{SVG}text") if t.get("class") == "y-tick"}
        self.assertEqual(list(ticks), ["10", "100", "1k", "10k", "100k", "1M"])
        self.assertIn("ttft (ms) (log scale)", [t.text for t in root.iter(f"{SVG}text")])
        dot = [float(circle.get("cy")) for circle in root.iter(f"{SVG}circle")][1]  # 500: 0.699 of a decade past 100
        self.assertAlmostEqual(dot, ticks["100"] + 0.69897 * (ticks["1k"] - ticks["100"]), delta=0.1)
        linear = ET.fromstring(main.svg_chart("t", "row", "y", [main.Series("s", ((1, 50), (2, 40_000)))]))
        self.assertEqual([t.text for t in linear.iter(f"{SVG}text") if t.get("class") == "y-tick"][:2], ["0", "10,000"])

    def test_a_mark_label_that_would_overlap_one_placed_drops_to_the_first_free_row(self):
        placed = []
        self.assertEqual([main._label_row(placed, x, width) for x, width in ((100, 50), (120, 50), (200, 50), (130, 10))],
                         [0, 1, 0, 2])

    def test_notes_stay_inside_the_plot_and_apart_where_two_series_meet_one_x(self):
        svg = main.svg_chart("t", "x", "y", [main.Series("low", ((1, 10), (4, 20)), notes=("a", "b")),
                                              main.Series("high", ((1, 30), (4, 40)), notes=("c", "d")),
                                              main.Series("dots", ((2, 5),), joined=False)])
        root = ET.fromstring(svg)
        circles = {(float(c.get("cx")), float(c.get("cy"))) for c in root.iter(f"{SVG}circle")}
        notes = {t.text: t for t in root.iter(f"{SVG}text") if t.get("class") == "note"}
        point = {"a": (64.0, 10), "b": (510.0, 20), "c": (64.0, 30), "d": (510.0, 40)}  # pixel x, data y
        cy = {name: next(cy for cx, cy in circles if cx == x and abs(cy - self.y_of(root, value)) < 1)
              for name, (x, value) in point.items()}
        self.assertEqual([notes[name].get("text-anchor") for name in "abcd"], [None, "end", None, "end"])
        # d tops its x but sits on the plot's top edge: above it, it would run into the legend
        self.assertEqual([float(notes[name].get("y")) - cy[name] for name in "abcd"], [14, 14, -7, 14])
        legend = [g for g in root.iter(f"{SVG}g") if g.get("class") == "legend"]
        self.assertEqual([g[0].tag.split("}")[1] for g in legend], ["line", "line", "circle"])  # a scatter's dot

    def y_of(self, root, value):
        """The pixel y of a data value, read off the chart's own tick labels."""
        ticks = sorted((float(t.text.replace(",", "")), float(t.get("y")) - 4) for t in root.iter(f"{SVG}text")
                       if t.get("class") == "y-tick")
        (v0, y0), (v1, y1) = ticks[0], ticks[-1]
        return y0 + (value - v0) * (y1 - y0) / (v1 - v0)

    def test_the_sweep_page_plots_each_runs_figures_with_the_knee_and_the_slo_lines(self):
        page_path, svg_path = os.path.join(self.directory, "s.html"), os.path.join(self.directory, "s.svg")
        code, out, err = run_cli(*SWEEP, "--html", page_path, "--svg", svg_path, "--json")
        self.assertEqual((code, err), (0, ""))
        runs = json.loads(out)["runs"]
        with open(page_path, encoding="utf-8") as handle:
            page = handle.read()
        throughput, ttft, tpot = charts_of(page)
        root, lines, texts, marks = series_of(throughput)
        self.assertEqual(list(lines), ["output tok/s"])
        self.assertEqual(len(lines["output tok/s"]), 4)
        self.assertIn("load (concurrent clients)", texts)
        self.assertIn("output tokens/s", texts)
        # read each point back through the axes' ticks: it is the report's figure at the run's load
        figures = [run["summary"]["output_tok_per_s"] for run in runs]
        for (x, y), load, figure in zip(lines["output tok/s"], (1, 8, 32, 128), figures):
            self.assertAlmostEqual(data_at(root, "x", x), load, delta=0.01 * 128)
            self.assertAlmostEqual(data_at(root, "y", y), figure, delta=0.005 * max(figures))
        self.assertEqual(len(marks), 1)
        self.assertTrue(marks[0].startswith("knee "))
        _, lines, texts, marks = series_of(ttft)
        self.assertEqual(list(lines), ["TTFT p50", "TTFT p95"])
        self.assertEqual(marks, ["SLO 200 ms"])
        self.assertEqual(series_of(tpot)[3], ["SLO 15 ms"])
        with open(svg_path, encoding="utf-8") as handle:
            self.assertEqual(handle.read().strip(), throughput.strip())

    def test_a_plotted_value_sits_where_its_ticks_say(self):
        svg = main.svg_chart("t", "x (s)", "y (ms)", [main.Series("a", ((0.0, 0.0), (10.0, 50.0)))])
        root, lines, texts, _ = series_of(svg)
        ticks = {float(t.text): float(t.get("y")) - 4 for t in root.iter(f"{SVG}text") if t.get("class") == "y-tick"}
        (x0, y0), (x1, y1) = lines["a"]
        self.assertAlmostEqual(y1, ticks[50.0], places=1)
        self.assertAlmostEqual(y0, ticks[0.0], places=1)

    def test_the_simulate_page_has_a_timeline_and_three_distributions(self):
        page_path = os.path.join(self.directory, "r.html")
        code, out, err = run_cli("simulate", "--hardware", "l4-24gb", "--trace", BURST, "--html", page_path, "--json")
        self.assertEqual((code, err), (0, ""))
        report = json.loads(out)
        self.assertNotIn("chart_latencies", report)
        with open(page_path, encoding="utf-8") as handle:
            page = handle.read()
        charts = charts_of(page)
        titles = [ET.fromstring(chart).find(f"{SVG}title").text for chart in charts]
        self.assertEqual(titles, ["Requests over the run", "KV cache in use", "Tokens per step",
                                  "TTFT distribution", "TPOT distribution", "ITL distribution (to p99)"])
        _, kv, _, _ = series_of(charts[1])
        self.assertGreater(len(kv["kv use"]), 10)
        _, ttft, _, _ = series_of(charts[3])
        self.assertEqual(len(ttft["TTFT"]), report["summary"]["ttft_ms"]["count"])  # 48 requests: every one
        _, requests, _, _ = series_of(charts[0])
        self.assertEqual(list(requests), ["running", "waiting", "preempted so far"])

    def test_a_page_fetches_nothing_and_runs_no_script(self):
        page_path = os.path.join(self.directory, "s.html")
        run_cli(*SWEEP, "--html", page_path)
        with open(page_path, encoding="utf-8") as handle:
            page = handle.read()
        self.assertNotIn("<script", page)
        for attribute in ("src=", "href=", "url(", "@import"):
            self.assertNotIn(attribute, page)
        self.assertEqual(set(re.findall(r"https?://[^\"' ]+", page)), {"http://www.w3.org/2000/svg"})


class EveryReportTest(ScratchTest):

    def page(self, *argv):
        path = os.path.join(self.directory, "page.html")
        code, out, err = run_cli(*argv, "--html", path)
        self.assertEqual(code, 0, err)
        with open(path, encoding="utf-8") as handle:
            return [series_of(chart) for chart in charts_of(handle.read())]

    def test_search_marks_its_answer_on_every_chart(self):
        charts = self.page("search", "--requests", "40", "--slo-ttft-ms", "300", "--tolerance", "0.3", "--quiet")
        self.assertEqual(len(charts), 3)
        for _, lines, _, marks in charts:
            self.assertTrue(any(mark.startswith("answer ") for mark in marks), marks)
        self.assertGreaterEqual(len(charts[0][1]["output tok/s"]), 3)  # every load the search tried

    def test_plan_plots_every_point_and_its_front(self):
        charts = self.page("plan", "--model", "llama-3.1-8b", "--hardware", "l4-24gb,h100-sxm-80gb",
                           "--tensor-parallel-size", "1", "--replicas", "1,2", "--rate", "4", "--requests", "30",
                           "--slo-ttft-ms", "500", "--slo-tpot-ms", "30", "--quiet")
        self.assertEqual(len(charts), 2)  # one per objective
        _, lines, texts, marks = charts[0]
        self.assertEqual(len(lines["every point"]), 4)
        self.assertIn("USD per M output tokens", texts)
        self.assertEqual(marks, ["SLO 500 ms", "answer"])

    def test_loadgen_plots_its_own_in_flight_count_and_the_distributions(self):
        with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
            charts = self.page("loadgen", "--url", server.url, "--concurrency", "2", "--requests", "6",
                               "--scrape-interval", "0.05", "--quiet")
        titles = [root.find(f"{SVG}title").text for root, _, _, _ in charts]
        self.assertEqual(titles, ["Requests over the run", "TTFT distribution", "TPOT distribution",
                                  "ITL distribution"])
        in_flight = charts[0][1]["in flight (loadgen)"]
        self.assertEqual(len(in_flight), 2 * 12 - 1)  # a step line: 6 sends and 6 ends, each a rise or a fall

    def test_compare_plots_measured_beside_predicted_by_concurrency(self):
        reports = [os.path.join(FIXTURES_DIR, "llamacpp", f"c{n}.json") for n in (1, 2, 4)]
        charts = self.page("compare", *reports, "--step-profile", os.path.join(FIXTURES_DIR, "llamacpp",
                                                                              "profile.json"))
        self.assertEqual([list(lines) for _, lines, _, _ in charts],
                         [["measured", "predicted (its error)"]] * 3)  # one run of each: no noise to show
        self.assertIn("concurrency (clients)", charts[0][2])
        again = self.page("compare", *reports, os.path.join(FIXTURES_DIR, "llamacpp", "c4-again.json"),
                          "--step-profile", os.path.join(FIXTURES_DIR, "llamacpp", "profile.json"))
        self.assertEqual(list(again[0][1]), ["measured (its run-to-run noise)", "predicted (its error)"])

    def test_an_inference_perf_compare_charts_its_stages_figures_under_the_runs_model(self):
        folder = os.path.join(self.directory, "run")
        shutil.copytree(os.path.join(FIXTURES_DIR, "gpu", "llama-3-1-8b-tp1-reasoning"), folder)
        path = os.path.join(self.directory, "page.html")
        code, out, err = run_cli("compare", folder, "--model-dir", os.path.join(FIXTURES_DIR, "gpu"), "--max-num-seqs",
                                 "128", "--no-sensitivity", "--html", path)
        self.assertEqual((code, err), (0, ""))
        with open(path, encoding="utf-8") as handle:
            page = handle.read()
        self.assertIn("<h1>servesim compare: llama-3.1-8b-instruct on h100-sxm-80gb</h1>", page)
        charts = [series_of(chart) for chart in charts_of(page)]
        titles = [root.find(f"{SVG}title").text for root, _, _, _ in charts]
        self.assertEqual(titles, ["ttft mean: measured and predicted", "e2e mean: measured and predicted",
                                  "tpot mean: measured and predicted"])  # its throughput was not published
        self.assertEqual([len(lines["measured"]) for _, lines, _, _ in charts], [1, 1, 1])


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def png_filtered_rows(data):
    """The rows of an 8-bit RGB or RGBA PNG as bytes per pixel and a list of rows as stored:
    each a filter byte and the pixels' residuals after that filter (PNG spec, section 9)."""
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    assert depth == 8 and color in (2, 6), (depth, color)
    stride, chunks, offset = 3 if color == 2 else 4, [], 8
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        if kind == b"IDAT":
            chunks.append(data[offset + 8:offset + 8 + length])
        offset += 12 + length
    raw, size = zlib.decompress(b"".join(chunks)), width * stride + 1
    return stride, [raw[y * size:(y + 1) * size] for y in range(height)]


def ink(rows, stride):
    """How much a run of filtered rows varies: the residual bytes that are not 0, leaving out
    each row's first pixel (predicted from nothing to its left); for a row stored unfiltered,
    the bytes darker than 200. A flat band of any one colour counts 0 under every filter.

    NOTE: counted on the stored residuals, never unfiltered: undoing Paeth and average
    filters byte by byte in Python took seconds for a page of screenshots."""
    count = 0
    for row in rows:
        if row[0] == 0:
            count += sum(1 for value in row[1:] if value < 200)
        else:
            body = row[1 + stride:]
            count += len(body) - body.count(0)
    return count


def tiny_png(rows, stride=3):
    """An 8-bit RGB PNG of the given filtered rows (each a filter byte and residuals)."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", (len(rows[0]) - 1) // stride, len(rows), 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b"")


class InkTest(unittest.TestCase):

    def test_flat_rows_count_nothing_under_any_filter_and_each_varied_byte_counts_once(self):
        white = b"\x00" + b"\xff" * 12  # four white pixels, stored unfiltered
        flat = [white, b"\x02" + bytes(12), b"\x01\xff\xff\xff" + bytes(9), b"\x04" + bytes(12),
                b"\x03\x80\x80\x80" + bytes(9)]
        varied = b"\x01\x10\x10\x10\x05\x00\x00" + bytes(3) + b"\xfb\x00\x00"
        stride, rows = png_filtered_rows(tiny_png(flat + [varied, b"\x00" + b"\x00" * 6 + b"\xff" * 6]))
        self.assertEqual((stride, len(rows)), (3, 7))
        self.assertEqual(ink(rows[:5], stride), 0)
        self.assertEqual(ink(rows[5:6], stride), 2)
        self.assertEqual(ink(rows[6:], stride), 6)


@unittest.skipIf(CHROMIUM is None, "headless Chromium is not installed (Debian: apt-get install chromium)")
class ScreenshotTest(ScratchTest):

    PAGE_HEIGHT = 1300  # px of the screenshot each page gets

    def test_each_kind_of_report_renders_to_a_screenshot_that_is_not_blank(self):
        reports = [os.path.join(FIXTURES_DIR, "llamacpp", f"c{n}.json") for n in (1, 2, 4)]
        pages = {"sweep": SWEEP, "simulate": ("simulate", "--hardware", "l4-24gb", "--trace", BURST),
                 "search": ("search", "--requests", "40", "--slo-ttft-ms", "300", "--tolerance", "0.3", "--quiet"),
                 "plan": ("plan", "--hardware", "l4-24gb,h100-sxm-80gb", "--tensor-parallel-size", "1", "--rate", "4",
                          "--requests", "30", "--replicas", "1,2", "--slo-ttft-ms", "500", "--quiet"),
                 "compare": ("compare", *reports, "--step-profile", os.path.join(FIXTURES_DIR, "llamacpp",
                                                                                "profile.json"))}
        with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
            pages["loadgen"] = ("loadgen", "--url", server.url, "--requests", "4", "--scrape-interval", "0.05",
                                "--quiet")
            for name, argv in pages.items():
                self.assertEqual(run_cli(*argv, "--html", os.path.join(self.directory, f"{name}.html"))[0], 0, name)
        # NOTE: one browser for every page (it takes seconds to start): the pages stacked in frames
        frames = "".join(f'<iframe src="{name}.html" width="1200" height="{self.PAGE_HEIGHT}" '
                         f'style="display:block;border:0"></iframe>' for name in pages)
        self.write("all.html", f"<!doctype html><body style='margin:0'>{frames}</body>")
        shot = os.path.join(self.directory, "all.png")
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--force-device-scale-factor=0.5",  # half size: enough to see ink (Chromium goes no smaller)
                        f"--screenshot={shot}", f"--window-size=1200,{self.PAGE_HEIGHT * len(pages)}",
                        f"file://{os.path.join(self.directory, 'all.html')}"], capture_output=True, timeout=120)
        with open(shot, "rb") as handle:
            stride, rows = png_filtered_rows(handle.read())
        band_height = len(rows) // len(pages)
        for index, name in enumerate(pages):
            with self.subTest(page=name):
                band = rows[index * band_height:(index + 1) * band_height]
                self.assertGreater(ink(band, stride), 1000, f"{name}: a blank screenshot")  # text and lines, not flat


if __name__ == "__main__":
    unittest.main()
