"""How large a file ``threadweaver view`` handles: its page in headless Chromium, lazy rows against all rows at once.

    .venv/bin/python bench/view.py [--rows 1000 10000 50000] [--out runs/bench_view]

Per size, the synthetic task's parallel SFT rows (``threadweaver synth``, about 380
tokens, one block of 2 to 4 threads each) go through the real CLI (``threadweaver view``: build time,
page size), then the page is loaded in headless Chromium, offline, twice side by side:
as written (the table renders 200 rows, more as it scrolls) and with every row rendered
at load, the baseline. For each it prints the time until the page is ready, and how long
sorting by speedup, a text search, and opening a row (its details unpacked, its timeline,
tokens, tree and mask inspector drawn) take. Needs chromium and
chromedriver (``scripts/test.sh`` installs them).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from threadweaver.testing import CLI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration_tests"))
from browser import chromium, console_errors, open_page, wait_until  # noqa: E402

LAZY = "const PAGE = 200;"

SORT = """const t = performance.now();
document.querySelector('#rows th[data-key="speedup"]').click();
return performance.now() - t;"""
SEARCH = """const box = document.getElementById('search'), t = performance.now();
box.value = 'block'; box.dispatchEvent(new Event('input'));
const ms = performance.now() - t;
box.value = ''; box.dispatchEvent(new Event('input'));
return ms;"""
OPEN = """const done = arguments[arguments.length - 1], t = performance.now();
document.querySelector('#rows tbody tr').click();
const drawn = () => document.querySelector('#detail .pane .inspector');
const wait = () => (drawn() ? done(performance.now() - t) : setTimeout(wait, 1));
wait();"""


def measure(driver, page: Path) -> dict:
    started = time.perf_counter()
    open_page(driver, page)
    ready = time.perf_counter() - started
    rendered = driver.execute_script("return document.querySelectorAll('#rows tbody tr').length")
    sort = driver.execute_script(SORT)
    search = driver.execute_script(SEARCH)
    opened = driver.execute_async_script(OPEN)
    wait_until(driver, lambda d: d.find_elements("css selector", "#detail .pane"))
    assert console_errors(driver) == []
    return {"ready": ready, "rendered": rendered, "sort": sort, "search": search, "open": opened}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--out", default="runs/bench_view")
    args = parser.parse_args()
    out = Path(args.out)
    header = (
        "| rows | build | page | ready: lazy / all rows | ratio | rows drawn | sort (ms) "
        "| search (ms) | open a row (ms) |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for rows in args.rows:
        data = out / f"synth_{rows}"
        subprocess.run(
            [CLI, "synth", "--out", str(data), "--train", "1", "--validation", str(rows)],
            check=True,
            capture_output=True,
        )
        page = out / f"view_{rows}.html"
        started = time.perf_counter()
        subprocess.run(
            [CLI, "view", str(data / "parallel" / "validation.jsonl"), "--out", str(page)],
            check=True,
            capture_output=True,
        )
        build = time.perf_counter() - started
        html = page.read_text()
        assert LAZY in html, "the page no longer sets its rows per step this way: update the bench"
        eager = out / f"view_{rows}_all_rows.html"
        eager.write_text(html.replace(LAZY, "const PAGE = Infinity;"))
        with chromium(offline=True) as driver:
            lazy = measure(driver, page)
        with chromium(offline=True) as driver:
            full = measure(driver, eager)
        assert full["rendered"] == rows

        def pair(key: str, digits: int = 0, lazy=lazy, full=full) -> str:
            return f"{lazy[key]:.{digits}f} / {full[key]:.{digits}f}"

        print(
            f"| {rows} | {build:.1f} s | {page.stat().st_size / 2**20:.1f} MB | {pair('ready', 2)} s "
            f"| {full['ready'] / lazy['ready']:.1f}x | {lazy['rendered']} / {full['rendered']} "
            f"| {pair('sort')} | {pair('search')} | {pair('open')} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
