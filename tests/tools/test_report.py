"""The HTML plan report and the plan diff."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from tofu_tf.options import Options, Recompute
from tofu_tf.tools.report import SECTIONS, html_report, plan_diff
from tofu_tf.search.baselines import BASELINES
from tofu_tf.search.plan import make_plan
from tofu_tf.search.topology import Topology

from tests.search.test_search import graph_of


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.headings, self.stack, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        if tag not in ("meta", "br"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "h2":
            self.headings.append(data)
        self.text.append(data)


@pytest.fixture(scope="module")
def plans():
    graph = graph_of("transformer", "adam")
    free = make_plan(graph, num_devices=8)
    tight = make_plan(graph, num_devices=8,
                      options=Options(memory_budget_bytes=int(0.7 * free.peak_bytes)))
    baselines = {name: fn(graph, Topology.default(8)).total_bytes
                 for name, fn in BASELINES.items()}
    return free, tight, baselines


def test_the_report_has_every_section_and_well_formed_html(plans, tmp_path):
    free, _, baselines = plans
    page = html_report(free, title="transformer", baselines=baselines)
    parser = _Collect()
    parser.feed(page)
    assert parser.stack == ["html"] or parser.stack == []
    assert parser.headings == list(SECTIONS)
    text = "".join(parser.text)
    for name in baselines:
        assert name in text
    for d in range(8):
        assert f"device {d}:" in text
    heaviest = max((t for level in free.levels for t in level.transfers),
                   key=lambda t: t.bytes)
    assert heaviest.op in text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium not installed")
def test_the_report_opens_in_headless_chromium_without_errors(plans, tmp_path):
    free, _, baselines = plans
    path = tmp_path / "plan.html"
    path.write_text(html_report(free, baselines=baselines))
    run = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                          "--enable-logging=stderr", "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert all(section in run.stdout for section in SECTIONS)
    assert "CONSOLE" not in run.stderr and "Uncaught" not in run.stderr


def test_the_diff_names_what_changed(plans):
    free, tight, _ = plans
    text = plan_diff(free, tight)
    assert "bytes moved:" in text and "peak per device:" in text
    assert "change state" in text and "tensor " in text
    same = plan_diff(free, free)
    assert "same" in same and "0 of" in same and "store every shared tensor" in same


def test_the_diff_and_the_page_name_the_step_rewrites(plans):
    free, _, _ = plans
    graph = graph_of("transformer", "adam")
    rewritten = make_plan(graph, num_devices=free.num_devices,
                          options=Options(early_updates=True, recompute=Recompute.CHEAP))
    text = plan_diff(free, rewritten)
    assert "step rewrites: updates early False -> True" in text
    assert f"recomputed forward ops 0 -> {len(rewritten.recompute)}" in text
    assert "forward ops recomputed in the backward pass" in html_report(rewritten)
