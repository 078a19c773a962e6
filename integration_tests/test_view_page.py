"""``threadweaver view`` pages in a real headless Chromium, offline (integration_tests/browser.py).

The data is decoded by the real orchestrator over a scripted engine, in the real Qwen
tokenizer's format; the pages are written by the real CLI. The inspector's highlighted set
is checked against the ancestors in the core's token trie, token by token.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from browser import chromium, console_errors, network_requests, open_page, remote, wait_until

from threadweaver.batch import trajectory_row
from threadweaver.kit.tokenizers import load_tokenizer
from threadweaver.orchestrator import Limits, Orchestrator
from threadweaver.reward import grade
from threadweaver.rows import RowReader
from threadweaver.testing import CLI, ScriptedEngine
from threadweaver.tree import parse
from threadweaver.trie import trajectory_trie
from threadweaver.view import Timeline, critical_requests, timelines_page

pytestmark = pytest.mark.slow

ROWS = 230  # more than the page renders at once (200)
PROMPT = "What is 6 times 7?"
HEAD = "<Parallel><Outlines><Outline>1: six sevens</Outline><Outline>2: check</Outline></Outlines>"
INNER = "<Thread>1: split<Parallel><Outlines><Outline>1: three</Outline><Outline>2: four</Outline></Outlines>"


def flat(row: int) -> dict:
    """One block; thread 2's length and the answer vary with the row."""
    answer = "42" if row % 3 else "41"
    return {
        PROMPT: f"Let me think about row {row}. " + HEAD,
        "<Thread>1:": " six times seven is forty two</Thread>",
        "<Thread>2:": " check" * (1 + row % 17) + "</Thread>",
        "</Parallel>": f" So the answer is \\boxed{{{answer}}}.<EOS>",
    }


NESTED = {
    **flat(1),
    "<Thread>1:": INNER[len("<Thread>1:") :],
    INNER + "<Thread>1:": " three sevens are twenty one, doubled</Thread>",
    INNER + "<Thread>2:": " fine</Thread>",
    "<Thread>2: fine</Thread></Parallel>": " so forty two</Thread>",
}
DEGRADED = {**flat(2), "<Thread>1:": " six times seven<EOS>"}  # EOS inside thread 1


def decode(fmt, script, limits=Limits(), **head):
    trajectory = asyncio.run(Orchestrator(ScriptedEngine(fmt, script), fmt, limits).run(fmt.encode(PROMPT)))
    return trajectory_row(trajectory, fmt, 0.1, limits, answer="42", sample=0, **head), trajectory


def script_of(row: int) -> dict:
    return NESTED if row == 5 else DEGRADED if row % 40 == 7 else flat(row)


def cli(*args: str) -> None:
    done = subprocess.run([CLI, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The files and pages, with what the core says about them."""
    out = tmp_path_factory.mktemp("view")
    reader = RowReader(load_tokenizer("qwen"))
    fmt = reader.fmt
    fork_join, serial, trajectories = [], [], []
    for row in range(ROWS):
        decoded, trajectory = decode(fmt, script_of(row), id=f"problem-{row:03d}")
        fork_join.append(decoded)
        trajectories.append(trajectory)
        serial.append(decode(fmt, script_of(row), Limits(concurrent_threads=False), id=f"problem-{row:03d}")[0])
    sft = {
        "id": "sft-nested",
        "messages": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": fork_join[5]["text"]}],
    }
    for name, rows in (("fork_join", fork_join), ("serial", serial), ("sft", [sft])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli("view", str(out / "fork_join.jsonl"), "--tokenizer", "qwen", "--out", str(out / "one.html"))
    cli(
        "view",
        str(out / "fork_join.jsonl"),
        str(out / "serial.jsonl"),
        "--tokenizer",
        "qwen",
        "--out",
        str(out / "two.html"),
    )
    cli("view", str(out / "sft.jsonl"), "--tokenizer", "qwen", "--out", str(out / "sft.html"))
    sft_trie = trajectory_trie(reader.prompt(sft), parse(reader.trajectory(sft), fmt).nodes, fmt, train_injected=True)
    return {
        "out": out,
        "fmt": fmt,
        "rows": fork_join,
        "serial": serial,
        "trajectories": trajectories,
        "sft_trie": sft_trie,
    }


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def column(driver, key: str) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll(`#rows tbody td[data-key='${arguments[0]}']`)]"
        ".map((td) => td.textContent)",
        key,
    )


def shown(driver) -> int:
    return driver.execute_script("return document.querySelectorAll('#rows tbody tr').length")


def choose(driver, select: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", select)).select_by_value(value)


def open_row(driver, index: int, panes: int = 1) -> None:
    driver.execute_script(
        f"document.querySelector('#rows tr[data-index=\"{index}\"]').scrollIntoView({{block: 'center'}})"
    )
    driver.find_element("css selector", f'#rows tr[data-index="{index}"] td').click()
    wait_until(driver, lambda d: len(d.find_elements("css selector", f'#detail .pane[data-index="{index}"]')) == 1)
    assert len(driver.find_elements("css selector", "#detail .pane")) == panes


def test_the_table_sorts_filters_searches_and_renders_rows_as_it_scrolls(browser, data):
    open_page(browser, data["out"] / "one.html")
    assert shown(browser) == 200 and browser.find_element("id", "count").text == f"{ROWS} of {ROWS} rows"
    browser.execute_script("document.getElementById('more').scrollIntoView()")
    wait_until(browser, lambda d: shown(d) == ROWS)

    speedups = sorted(round(r["stats"]["speedup"], 2) for r in data["rows"])
    header = browser.find_element("css selector", '#rows th[data-key="speedup"]')
    for order in (speedups, speedups[::-1]):  # a second click reverses
        header.click()
        values = [float(v.rstrip("x")) for v in column(browser, "speedup")]
        assert len(values) >= 200 and values == order[: len(values)]

    degraded = [r["id"] for r in data["rows"] if r["degradations"]]
    choose(browser, "filter-format", "faulty")
    assert sorted(column(browser, "id")) == degraded and len(degraded) == 6
    assert browser.find_element("id", "count").text == f"6 of {ROWS} rows"
    choose(browser, "filter-format", "")
    kind = data["rows"][7]["degradations"][0]["kind"]
    choose(browser, "filter-kind", kind)
    assert sorted(column(browser, "id")) == degraded
    choose(browser, "filter-kind", "")

    correct = sum(grade(r["text"], "42").correct for r in data["rows"])
    assert 0 < correct < ROWS
    choose(browser, "filter-correct", "correct")
    assert browser.find_element("id", "count").text == f"{correct} of {ROWS} rows"
    assert set(column(browser, "correct")) == {"yes"}
    choose(browser, "filter-correct", "")

    search = browser.find_element("id", "search")
    search.send_keys("think about row 123.")  # text search
    assert column(browser, "id") == ["problem-123"]
    search.clear()
    search.send_keys("problem-05")  # ids too
    wait_until(browser, lambda d: shown(d) == 10)
    assert not browser.find_element("css selector", "#filter-drop").find_element("xpath", "..").is_displayed()


def ancestors(parent: list[int], query: int) -> set[int]:
    out = {query}
    while parent[query] >= 0:
        query = parent[query]
        out.add(query)
    return out


def check_inspector(driver, trie) -> None:
    """Point at tokens of the pane's inspector with the mouse: lit = the token's ancestors in the trie.

    The tokens: either side of every branch (where a thread, a join or a continuation starts),
    the last, and every seventh.
    """
    from selenium.webdriver.common.action_chains import ActionChains

    nodes = driver.find_elements("css selector", "#detail .inspector .node")
    assert len(nodes) == len(trie.input_ids)
    assert [int(n.get_attribute("data-index")) for n in nodes] == list(range(len(nodes)))
    trained = driver.execute_script(
        "return [...document.querySelectorAll('#detail .inspector .node')].map((n) => n.classList.contains('trained'))"
    )
    assert trained == [bool(t) for t in trie.trained]
    branches = {i for i in range(1, len(nodes)) if trie.parent[i] != i - 1}
    queries = sorted({*branches, *(i - 1 for i in branches), len(nodes) - 1, *range(0, len(nodes), 7)})
    assert len(branches) >= 2
    for query in queries:
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", nodes[query])
        ActionChains(driver).move_to_element(nodes[query]).perform()
        lit = driver.execute_script(
            "return [...document.querySelectorAll('#detail .inspector .node.visible')].map((n) => +n.dataset.index)"
        )
        assert set(lit) == ancestors(trie.parent, query), f"token {query}"
        assert {q for q in range(len(nodes)) if trie.attends(query, q)} == set(lit)


def test_the_inspector_lights_exactly_each_tokens_ancestors_in_a_nested_trajectory(browser, data):
    open_page(browser, data["out"] / "one.html")
    open_row(browser, 5)
    trajectory = data["trajectories"][5]
    assert trajectory.stats.max_depth == 2
    lanes = browser.execute_script(
        "return [...document.querySelectorAll('#detail text.lane')].map((t) => t.textContent)"
    )
    assert lanes == ["main", "thread 1", "thread 1.1", "thread 1.2", "thread 2"]
    # the decoded trajectory's P-GRPO trie: injected tokens are context, not trained
    trie = trajectory_trie(
        trajectory.prompt_ids,
        trajectory.nodes,
        data["fmt"],
        train_injected=False,
        closed_threads=trajectory.closed_threads,
    )
    check_inspector(browser, trie)

    open_page(browser, data["out"] / "sft.html")
    open_row(browser, 0)
    check_inspector(browser, data["sft_trie"])


def test_a_degraded_trajectory_shows_its_problem_where_it_happened(browser, data):
    open_page(browser, data["out"] / "one.html")
    open_row(browser, 7)
    (degradation,) = data["trajectories"][7].degradations
    (marker,) = browser.find_elements("css selector", "#detail .tokens .fault")
    assert int(marker.get_attribute("data-position")) == degradation.position
    assert marker.get_attribute("data-kind") == degradation.kind and marker.get_attribute("title") == str(degradation)
    token = browser.execute_script("return arguments[0].nextElementSibling", marker)
    assert int(token.get_attribute("data-position")) == degradation.position  # the marker precedes its token
    listed = browser.find_element("css selector", "#detail .faults").text
    assert f"{degradation.kind} at token {degradation.position}: {degradation}" in listed


def test_the_page_opens_and_reads_rows_with_no_network(browser, data):
    network_requests(browser)  # forget earlier pages
    open_page(browser, data["out"] / "one.html")
    for index in (0, 5, 7):  # each row's details are unpacked in the page (DecompressionStream)
        open_row(browser, index)
    assert remote(network_requests(browser)) == []
    assert console_errors(browser) == []
    assert browser.execute_script("return navigator.onLine") is False  # the browser really was offline


def test_two_files_side_by_side_give_the_differences_per_row(browser, data):
    open_page(browser, data["out"] / "two.html")
    rows = browser.find_elements("css selector", "#pairs tbody tr")
    assert len(rows) == ROWS
    expected = {
        r["id"]: round(s["stats"]["speedup"] - r["stats"]["speedup"], 2)
        for r, s in zip(data["rows"], data["serial"], strict=True)
    }
    cells = browser.execute_script(
        "return [...document.querySelectorAll('#pairs tbody tr')]"
        ".map((tr) => [tr.cells[0].textContent, +tr.cells[4].textContent])"
    )
    assert {i: d for i, d in cells} == pytest.approx(expected, abs=0.011)
    differences = [d for _, d in cells]
    assert max(differences) < 0 < max(differences) - min(differences)  # serial is B: every change a loss
    assert [abs(d) for d in differences] == sorted((abs(d) for d in differences), reverse=True)  # biggest change first
    order = browser.find_element("id", "pairs-order")
    assert order.text.startswith("Sorted by the size of the change in speedup (B − A), biggest first")
    header = browser.find_element("css selector", '#pairs th[data-key="dspeedup"]')
    for signed in (sorted(differences, reverse=True), sorted(differences)):  # a click: by sign; again: reversed
        header.click()
        cells = browser.execute_script(
            "return [...document.querySelectorAll('#pairs tbody tr')].map((tr) => +tr.cells[4].textContent)"
        )
        assert cells == signed
    assert order.text.startswith("Sorted by the change in speedup (B − A), lowest first")
    header.click()  # round to the size again
    assert order.text.startswith("Sorted by the size of the change in speedup (B − A), biggest first")
    browser.find_element("css selector", '#pairs th[data-key="speedup0"]').click()
    cells = browser.execute_script(
        "return [...document.querySelectorAll('#pairs tbody tr')].map((tr) => +tr.cells[2].textContent.slice(0, -1))"
    )
    assert cells == sorted(cells, reverse=True) and order.text.startswith("Sorted by speedup A, highest first")
    first = browser.find_element("css selector", "#pairs tbody tr")
    a, b = int(first.get_attribute("data-index")), int(first.get_attribute("data-other"))
    first.click()
    wait_until(browser, lambda d: len(d.find_elements("css selector", "#detail .pane")) == 2)
    assert browser.find_element("id", "detail").get_attribute("class") == "side-by-side"
    panes = [int(p.get_attribute("data-index")) for p in browser.find_elements("css selector", "#detail .pane")]
    assert panes == [a, b] and b == a + ROWS  # the same problem in the second file
    serial = browser.find_elements("css selector", "#detail .pane[data-index] svg.timeline")[1]
    rects = serial.find_elements("css selector", "rect.request")
    assert rects and all("critical" in r.get_attribute("class") for r in rects)  # one after another: all critical


def test_every_header_is_aligned_as_its_column_and_files_are_named_once(browser, data):
    open_page(browser, data["out"] / "two.html")
    for table in ("pairs", "rows"):
        aligned = browser.execute_script(
            "const table = document.getElementById(arguments[0]);"
            "const row = table.querySelector('tbody tr');"
            "return [...table.querySelectorAll('thead th')]"
            ".map((th, i) => [getComputedStyle(th).textAlign, getComputedStyle(row.cells[i]).textAlign]);",
            table,
        )
        assert [header for header, _ in aligned] == [cell for _, cell in aligned], table
        assert "right" in {cell for _, cell in aligned}
    assert set(column(browser, "file")) == {"A"}  # not a long path on every row
    choose(browser, "filter-file", "1")
    wait_until(browser, lambda d: set(column(d, "file")) == {"B"})
    legend = browser.find_element("id", "files").text
    assert f"A: {data['out'] / 'fork_join.jsonl'}" in legend and f"B: {data['out'] / 'serial.jsonl'}" in legend


def test_the_quickstart_timelines_come_from_the_same_renderer(browser, data, tmp_path):
    fmt = data["fmt"]
    forked, trajectory = decode(fmt, NESTED)
    serial, _ = decode(fmt, NESTED, Limits(concurrent_threads=False))
    page = timelines_page(
        [("problem 5", [Timeline("fork-join", forked), Timeline("one after another", serial)])],
        "timelines",
        "two runs of one trajectory",
    )
    (tmp_path / "timelines.html").write_text(page)
    open_page(browser, tmp_path / "timelines.html")
    svgs = browser.find_elements("css selector", "#groups svg.timeline")
    assert len(svgs) == 2
    critical = [len(svg.find_elements("css selector", "rect.request.critical")) for svg in svgs]
    assert critical == [len(critical_requests(forked["requests"], forked["stats"])), len(serial["requests"])]
    assert critical[0] < len(forked["requests"])
    lanes = [t.text for t in svgs[0].find_elements("css selector", "text.lane")]
    assert lanes == ["main", "thread 1", "thread 1.1", "thread 1.2", "thread 2"]
    assert console_errors(browser) == []


def test_serve_shows_the_same_page_on_loopback(data):
    server = subprocess.Popen(
        [CLI, "view", str(data["out"] / "fork_join.jsonl"), "--tokenizer", "qwen", "--serve"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stdout.readline().split()[0]
        assert url.startswith("http://127.0.0.1:")
        with chromium(offline=False) as driver:
            driver.get(url)
            wait_until(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "true")
            assert driver.find_element("id", "count").text == f"{ROWS} of {ROWS} rows"
            assert remote(network_requests(driver)) == [url]  # the page itself, nothing else
    finally:
        server.terminate()
        server.wait(timeout=30)
