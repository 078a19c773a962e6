"""The main job on the embedded default kit.

Today it runs the data path: it writes the synthetic task, checks every training
trajectory strictly, flattens them into tries, and reports the token latency that
the parallel form offers against the sequential form of the same solutions.
"""

from __future__ import annotations

import json
import os

from tqdm import tqdm

from threadweaver.dataset import write_synth
from threadweaver.format import Format
from threadweaver.kit.tokenizers import synth_tokenizer_object
from threadweaver.report import file_stats, format_summary, parsed_rows, summary
from threadweaver.requests import plan_requests
from threadweaver.synth import SynthConfig
from threadweaver.trie import trajectory_trie


def run(out: str, *, train: int, validation: int, seed: int) -> dict:
    config = SynthConfig()
    data = os.path.join(out, "data")
    print(f"[1/3] writing the synthetic task to {data}")
    write_synth(data, config, train, validation, seed)
    fmt = Format.from_tokenizer(synth_tokenizer_object())

    print("[2/3] checking training trajectories strictly and flattening them into tries")
    trie_tokens = expanded_tokens = 0
    for _, row, tree in tqdm(parsed_rows(os.path.join(data, "parallel", "train.jsonl"), fmt, strict=True),
                             total=train, unit=" rows"):
        prompt = fmt.encode(row["messages"][0]["content"])
        trie_tokens += len(trajectory_trie(prompt, tree.nodes, fmt, train_injected=True))
        expanded_tokens += plan_requests(prompt, tree.nodes, fmt).expanded_tokens

    print("[3/3] token latency on the held-out problems")
    result = {"trie_tokens": trie_tokens, "expanded_request_tokens": expanded_tokens}
    for form in ("parallel", "sequential"):
        result[form] = summary(file_stats(os.path.join(data, form, "validation.jsonl"), fmt))
        print(f"\n{form} form\n{format_summary(result[form])}")
    result["critical_path_speedup_vs_sequential"] = (
        result["sequential"]["mean_total_tokens"] / result["parallel"]["mean_critical_path_tokens"]
    )
    print(f"\ntrie tokens vs one row per request: {trie_tokens} vs {expanded_tokens} "
          f"({expanded_tokens / trie_tokens:.2f}x fewer)")
    print(f"parallel critical path vs sequential length: "
          f"{result['critical_path_speedup_vs_sequential']:.2f}x shorter")
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {os.path.join(out, 'summary.json')}")
    return result
