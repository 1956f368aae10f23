"""What a reader of the lesson checks first: which servesim this is, and that the lesson's
own printed figures can be had again (its generic H100 roofline, kept as a preset)."""

import unittest

from support import main, run_cli, run_json


class VersionTest(unittest.TestCase):

    def test_version_prints_the_version_and_the_date_of_the_code_and_exits_0(self):
        code, out, err = run_cli("--version")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out, f"servesim {main.__version__} ({main.CODE_DATE})\n")
        self.assertRegex(main.__version__, r"^\d+\.\d+\.\d+$")
        self.assertRegex(main.CODE_DATE, r"^20\d\d-[01]\d-[0-3]\d$")

    def test_the_help_names_the_version_flag(self):
        self.assertIn("--version", main.build_parser().format_help())


class LessonPresetTest(unittest.TestCase):

    def test_the_lessons_roofline_prints_the_lessons_step_9_figures_at_one_client(self):
        # the lesson's Step 9 sweep, first row: 132.9 out tok/s, TPOT 7.4 ms (the fitted H100: 6.8)
        report = run_json("sweep", "--hardware", "h100-lesson", "--no-async-scheduling", "--requests", "256",
                          "--concurrency", "1", "--quiet")
        summary = report["runs"][0]["summary"]
        self.assertEqual(round(summary["tpot_ms"]["p50"], 1), 7.4)
        self.assertAlmostEqual(summary["output_tok_per_s"], 132.9, delta=132.9 * 0.01)
        fitted = run_json("sweep", "--requests", "256", "--concurrency", "1", "--quiet")["runs"][0]["summary"]
        self.assertEqual(round(fitted["tpot_ms"]["p50"], 1), 6.8)

    def test_the_lessons_preset_is_the_datasheet_at_the_generic_efficiencies_and_unpriced(self):
        lesson, fitted = main.HARDWARE["h100-lesson"], main.HARDWARE["h100-sxm-80gb"]
        self.assertEqual((lesson.mfu, lesson.mbu, lesson.step_overhead_ms), (0.5, 0.75, 1.0))
        self.assertEqual((lesson.bandwidth_gbs, lesson.tflops, lesson.memory_gib),
                         (fitted.bandwidth_gbs, fitted.tflops, fitted.memory_gib))
        self.assertEqual(lesson.price_per_hour, 0)
        self.assertNotIn("h100-lesson", main.PRICED_HARDWARE)  # plan's default grid prices every device


if __name__ == "__main__":
    unittest.main()
