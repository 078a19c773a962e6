"""The data commands: synth, stats, filter, convert, curate, self-train, view and kit."""

from __future__ import annotations

import argparse
import json
import os
import sys

from threadweaver.cli_args import add_arguments, from_args
from threadweaver.dataset import HELD_OUT_PROBLEMS, TRAIN_PROBLEMS
from threadweaver.jsonl import report_path
from threadweaver.selection import FilterConfig
from threadweaver.synth import SynthConfig

from .command import Command, os_error, show_warnings

TOKENIZER_HELP = (
    "'synth', 'qwen', a tokenizer directory or hub id (default: the tokenizer the rows record, "
    "as every command that writes rows does; else 'synth')"
)


def row_reader(spec: str | None, files: list[str], command: str):
    """The reader of ``files`` and how to word its errors: ``--tokenizer`` where given, else the tokenizer
    the rows record (files that record two names for one tokenizer, two model folders that hold it, are read
    together; two tokenizers are refused), else ``synth``; then an error the tokenizer may cause (not one of a
    row's shape) names the other choices."""
    from threadweaver.jsonl import RowError
    from threadweaver.kit.tokenizers import load_tokenizer
    from threadweaver.rows import TOKENIZER_FIELD, RowReader, recorded_tokenizer

    hint = ""
    recorded = {}
    for path in files:
        try:
            recorded[path] = recorded_tokenizer(path)
        except RowError as err:
            if spec is None:
                sys.exit(f"threadweaver {command}: {path}: {err} (--tokenizer NAME reads the rows with another)")

    def explained(err: ValueError) -> str:
        return f"{err}{'' if getattr(err, 'shape', False) else hint}"

    if spec is not None:
        for path, (_, name) in recorded.items():
            if name is not None and not _same_tokenizer(name, spec):  # two names may be one: a warning, not a refusal
                print(
                    f"threadweaver {command}: warning: {path} records the tokenizer {name!r}; reading it with "
                    f"--tokenizer {spec!r}, whose ids must mean the same tokens",
                    file=sys.stderr,
                )
        try:
            return RowReader(load_tokenizer(spec)), explained
        except (OSError, ValueError) as err:
            sys.exit(f"threadweaver {command}: cannot load the tokenizer {spec!r}: {err}")
    loaded = {}  # name: tokenizer, for each name the files record
    for path, (line, name) in recorded.items():
        if name is not None and name not in loaded:
            try:
                loaded[name] = load_tokenizer(name)
            except (OSError, ValueError) as err:
                sys.exit(
                    f"threadweaver {command}: {path}: line {line} records the tokenizer {name!r}, which cannot be "
                    f"loaded: {err} (--tokenizer NAME reads the rows with another)"
                )
    tokenizers = list(loaded.values())
    if len({_tokenizer_contents(t) for t in tokenizers}) > 1:
        sides = "; ".join(f"{path} records {name!r}" for path, (_, name) in recorded.items())
        sys.exit(
            f"threadweaver {command}: the files were written with different tokenizers ({sides}): pass --tokenizer"
        )
    if not tokenizers:
        hint = (
            f" ({', '.join(files)} records no '{TOKENIZER_FIELD}' and was read with 'synth', the embedded "
            "models' tokenizer: pass --tokenizer qwen, a tokenizer directory or hub id)"
        )
    return RowReader(tokenizers[0] if tokenizers else load_tokenizer("synth")), explained


def _tokenizer_contents(tokenizer) -> tuple:
    """What makes a tokenizer read ids as it does: its vocabulary, merges, added and special tokens (the whole
    tokenizer.json, as the tokenizers library writes it) and its chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    try:
        contents = backend.to_str()
    except AttributeError:  # a slow transformers tokenizer
        contents = tuple(sorted(tokenizer.get_vocab().items()))
    special = getattr(tokenizer, "special_tokens_map", None)
    return contents, getattr(tokenizer, "chat_template", None), json.dumps(special, sort_keys=True, default=str)


def _same_tokenizer(recorded: str, given: str) -> bool:
    """Whether two names load the same tokenizer, as far as names tell: equal, or one folder or file."""
    if recorded == given:
        return True
    paths = [os.path.expanduser(name) for name in (recorded, given)]
    return all(os.path.exists(path) for path in paths) and os.path.samefile(*paths)


def _say_unreadable(command: str, path: str, dropped_rows: list[dict]) -> None:
    """On stderr: the lines of ``path`` that could not be read, which a run that went on dropped (its report
    lists every one)."""
    from threadweaver.jsonl import unreadable_note

    if note := unreadable_note(path, dropped_rows):
        print(f"threadweaver {command}: {note}", file=sys.stderr)


def _left_as_it_was(out: str) -> str:
    """What a refusal adds where ``out`` holds an earlier run's work, which it did not touch."""
    return f"; {out} is left as it was" if os.path.exists(out) else ""


def _synth_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        required=True,
        help="output directory (a rerun of the same settings writes the same rows; one that holds another dataset "
        "is refused)",
    )
    p.add_argument("--train", type=int, default=TRAIN_PROBLEMS, help=f"training problems (default: {TRAIN_PROBLEMS})")
    p.add_argument(
        "--validation", type=int, default=HELD_OUT_PROBLEMS, help=f"held-out problems (default: {HELD_OUT_PROBLEMS})"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    add_arguments(p, SynthConfig)


def _synth(args: argparse.Namespace) -> None:

    from threadweaver.dataset import write_synth

    for flag, count in (("--train", args.train), ("--validation", args.validation)):
        if count < 0:
            sys.exit(f"threadweaver synth: {flag} must be 0 or more problems, not {count}")
    if not args.out:  # "" would write into the current directory
        sys.exit(f"threadweaver synth: --out must name a folder to write into, not {args.out!r}")
    try:
        paths = write_synth(args.out, from_args(SynthConfig, args), args.train, args.validation, args.seed)
    except ValueError as err:
        sys.exit(f"threadweaver synth: {err}")
    except OSError as err:  # what the checks before writing cannot foresee: a full disk, a folder made read-only
        sys.exit(f"threadweaver synth: {os_error(err)}")
    for path in paths:
        print(path)


def _stats_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="JSONL rows with a 'token_ids', 'text' or 'messages' field")
    p.add_argument("--tokenizer", help=TOKENIZER_HELP)
    p.add_argument("--strict", action="store_true", help="stop at the first malformed row (training data)")
    p.add_argument("--json", action="store_true", help="print one JSON object (rows and summary)")
    p.add_argument("--summary-only", action="store_true", help="print only the summary")


def _stats(args: argparse.Namespace) -> None:
    from threadweaver.jsonl import RowError, not_a_file_of_rows
    from threadweaver.progress import progress_bar
    from threadweaver.report import file_stats, format_summary, format_table, summary

    if problem := not_a_file_of_rows(args.file):
        sys.exit(f"threadweaver stats: {args.file}: {problem}")
    reader, explained = row_reader(args.tokenizer, [args.file], "stats")
    torn = []
    rows = file_stats(args.file, reader, strict=args.strict, on_torn=lambda line: torn.append((args.file, line)))
    try:
        rows = list(rows if args.json else progress_bar(rows, desc="stats", unit=" rows"))
    except RowError as err:
        sys.exit(f"threadweaver stats: {args.file}: {explained(err)}")
    except OSError as err:
        sys.exit(f"threadweaver stats: {args.file}: {err.strerror or err}")
    _say_torn("stats", torn)
    if not rows:
        sys.exit(f"threadweaver stats: {args.file}: no rows to count")
    if args.json:
        print(json.dumps({"rows": [r.as_dict() for r in rows], "summary": summary(rows)}))
        return
    if not args.summary_only:
        print(format_table(rows))
        print()
    print(format_summary(summary(rows)))


def _say_torn(command: str, torn: list[tuple[str, int]]) -> None:
    """Says on stderr which torn last lines (file, line) ``command`` left out; after its progress bar."""
    from threadweaver.jsonl import torn_note

    for path, line in torn:
        print(f"threadweaver {command}: {torn_note(path, line)}", file=sys.stderr)


def _filter_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("generated", help="JSONL rows from `threadweaver generate --n K` on problems with an 'answer'")
    p.add_argument("out", help=f"the kept rows (JSONL, as they are); the report goes to {report_path('OUT')}")
    p.add_argument("--tokenizer", help=TOKENIZER_HELP)
    add_arguments(p, FilterConfig)


def _filter(args: argparse.Namespace) -> None:

    from threadweaver.jsonl import (
        RowError,
        check_outputs,
        check_reported_output,
        check_writable,
        not_a_file_of_rows,
        write_json,
        write_jsonl,
    )
    from threadweaver.progress import progress_bar
    from threadweaver.selection import FilterConfig, format_report, nothing_kept, select

    if problem := not_a_file_of_rows(args.generated):
        sys.exit(f"threadweaver filter: {args.generated}: {problem}")
    try:
        check_outputs([args.out, report_path(args.out)], [args.generated])
        check_reported_output(args.out)
        config = from_args(FilterConfig, args)
    except ValueError as err:
        sys.exit(f"threadweaver filter: {err}")
    try:  # before any row is read: the work is not lost to a folder that takes no file
        check_writable(args.out, atomic=True)
    except ValueError as err:
        sys.exit(f"threadweaver filter: {args.out}: {err}")

    def bar(rows):
        return progress_bar(rows, desc="filter", unit=" rows")

    reader, explained = row_reader(args.tokenizer, [args.generated], "filter")
    try:
        kept, _, report = select(args.generated, reader, config, bar)
    except RowError as err:
        sys.exit(f"threadweaver filter: {args.generated}: {explained(err)}")
    except OSError as err:
        sys.exit(f"threadweaver filter: {args.generated}: {err}")
    if not report["rows"]:
        sys.exit(f"threadweaver filter: {args.generated}: no rows to filter{_left_as_it_was(args.out)}")
    _say_unreadable("filter", args.generated, report["dropped_rows"])
    try:  # the report too where none is kept (a model's pass@1, why each row was dropped): OUT is left as it was
        write_json(report_path(args.out), report)  # first: an OUT without its report is refused as no output of ours
        if kept:
            write_jsonl(args.out, kept)
    except OSError as err:  # the disk filled, or the folder changed since the check
        written = (err.filename or args.out).removesuffix(".tmp")
        sys.exit(f"threadweaver filter: {written}: cannot write ({err.strerror or err})")
    print(format_report(report))
    if not kept:
        sys.exit(
            f"threadweaver filter: {args.generated}: {nothing_kept(report)}{_left_as_it_was(args.out)}; "
            f"why each row was dropped: {report_path(args.out)}"
        )
    print(f"wrote {args.out} and {report_path(args.out)}")


def _convert_arguments(p: argparse.ArgumentParser) -> None:
    from threadweaver.convert import SOURCES, ConvertConfig

    p.add_argument("input", help="the peer's rows: JSONL, parquet (.parquet) or a JSON array (.json)")
    p.add_argument("out", help=f"our chat rows (JSONL, for sft); the report goes to {report_path('OUT')}")
    p.add_argument("--from", dest="source", required=True, choices=SOURCES, help="the input's format")
    p.add_argument("--tokenizer", default="qwen", help="'qwen' (default), 'synth', a tokenizer directory or hub id")
    add_arguments(p, ConvertConfig)


def _convert(args: argparse.Namespace) -> None:
    import errno

    from threadweaver.convert import ConvertConfig, NothingConverted, convert_file, format_report
    from threadweaver.format import Format
    from threadweaver.jsonl import check_outputs, check_reported_output, check_writable, not_a_file_of_rows
    from threadweaver.kit.tokenizers import load_tokenizer
    from threadweaver.progress import progress_bar

    def fail(message: str):
        sys.exit(f"threadweaver convert: {' '.join(message.split())}")

    if problem := not_a_file_of_rows(args.input):
        fail(f"{args.input}: {problem}")
    try:
        check_outputs([args.out, report_path(args.out)], [args.input])
        check_reported_output(args.out)
    except ValueError as err:
        fail(str(err))
    try:  # before any row is read: the work is not lost to a folder that takes no file
        check_writable(args.out, atomic=True)
    except ValueError as err:
        fail(f"{args.out}: {err}")
    try:
        config = from_args(ConvertConfig, args)
        fmt = Format.from_tokenizer(load_tokenizer(args.tokenizer))
    except (ValueError, OSError) as err:
        fail(str(err))

    def bar(rows):
        return progress_bar(rows, desc="convert", unit=" rows")

    try:
        report = convert_file(args.input, args.out, args.source, fmt, config, bar)
    except NothingConverted as err:
        if err.report["rows"]:
            print(format_report(err.report))
        fail(f"{args.input}: {err}{_left_as_it_was(args.out)}")
    except OSError as err:
        if err.filename not in (None, args.input) or err.errno in (errno.ENOSPC, errno.EDQUOT):  # writing OUT
            fail(f"{args.out}: cannot write ({err.strerror or err})")
        fail(f"{args.input}: {err}")
    except ValueError as err:
        fail(f"{args.input}: {err}")
    _say_unreadable("convert", args.input, report["dropped_rows"])
    print(format_report(report))
    print(f"wrote {args.out} and {report_path(args.out)}")


def _curate_arguments(p: argparse.ArgumentParser) -> None:
    from threadweaver.curate.config import CurateArgs, CurateConfig, LLMArgs

    for config in (CurateArgs, LLMArgs, CurateConfig):
        add_arguments(p, config)


def _curate(args: argparse.Namespace) -> None:
    from threadweaver.curate.config import CurateArgs, CurateConfig, LLMArgs
    from threadweaver.curate.pipeline import format_report
    from threadweaver.curate.run import NothingCurated, format_estimate, run

    try:
        stats = run(*(from_args(c, args) for c in (CurateArgs, LLMArgs, CurateConfig)))
    except NothingCurated as err:
        if err.report["traces"]:
            print(format_report(err.report))
        sys.exit(f"threadweaver curate: {args.traces}: {err}")
    except (ValueError, OSError) as err:
        sys.exit(f"threadweaver curate: {err}")
    if stats.get("dry_run"):
        print(format_estimate(stats))
        return
    print(format_report(stats))
    print(f"wrote {args.out}/train.jsonl, dropped.jsonl and report.json")


def _self_train_arguments(p: argparse.ArgumentParser) -> None:
    from threadweaver.orchestrator import Sampling
    from threadweaver.self_train import SAMPLING_TEMPERATURE, SelfTrainArgs

    add_arguments(p, SelfTrainArgs)
    add_arguments(p, Sampling, defaults={"temperature": SAMPLING_TEMPERATURE})
    add_arguments(p, FilterConfig)


def _self_train(args: argparse.Namespace) -> None:
    from threadweaver.engine import EngineError, Sampling
    from threadweaver.interrupts import Stopped
    from threadweaver.selection import format_report
    from threadweaver.self_train import SelfTrainArgs, check_sft_flags, run

    show_warnings()
    try:
        configs = [from_args(c, args) for c in (SelfTrainArgs, Sampling, FilterConfig)]
        check_sft_flags(args.rest)
    except (ValueError, OSError) as err:  # nothing started: nothing to go on from
        sys.exit(f"threadweaver self-train: {err}")
    try:
        summary = run(*configs, args.rest)
    except ValueError as err:  # bad input or settings: the same command would fail again
        sys.exit(f"threadweaver self-train: {err}")
    except (OSError, RuntimeError, EngineError) as err:
        sys.exit(f"threadweaver self-train: {err}{_go_on_hint(args.out)}")
    except KeyboardInterrupt as interrupt:  # Ctrl-C
        raise Stopped(f"stopped{_go_on_hint(args.out)}", interrupt) from None
    except Stopped as stopped:  # sft's own advice names its flags, which a rerun of self-train would not take
        raise Stopped(f"stopped{_go_on_hint(args.out)}", stopped.interrupt) from None
    print(format_report(summary["filter"]))
    print(f"trained on {summary['kept']} kept + {summary['mixed']} mixed rows: {summary['model']}")


def _go_on_hint(out: str) -> str:
    from threadweaver.self_train import GENERATED

    generated = os.path.join(out, GENERATED)
    if not os.path.exists(generated) or os.path.getsize(generated) == 0:  # nothing done to go on from
        return ""
    return f"\nwhat is done is in {out}; rerun the same command to go on"


def _view_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="JSONL trajectories or training rows")
    p.add_argument("file2", nargs="?", metavar="FILE2", help="a second such file, shown side by side with FILE")
    p.add_argument("more", nargs="*", help=argparse.SUPPRESS)  # refused by _view, naming the choices
    p.add_argument("--out", help="the page to write (default: FILE.html; not with --serve)")
    p.add_argument("--tokenizer", help=TOKENIZER_HELP)
    p.add_argument("--title", help="the page's title (default: the file names)")
    p.add_argument("--serve", action="store_true", help="serve the page on loopback instead of writing it")
    p.add_argument("--port", type=_port, help="with --serve: the port (default: a free one)")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return port


def _view(args: argparse.Namespace) -> None:
    """Everything that can be refused (the files, --out, the port, the tokenizer) is, before any row is read."""
    from threadweaver.jsonl import check_outputs, check_writable, not_a_file_of_rows
    from threadweaver.progress import progress_bar
    from threadweaver.view import file_page

    def bar(rows, path):
        return progress_bar(rows, desc=f"reading {path}", unit=" rows")

    if args.serve and args.out is not None:
        args.command_parser.error("--out writes the page, --serve serves it: give one of them")
    if not args.serve and args.port is not None:
        args.command_parser.error("--port is the port of --serve: give --serve too")
    if args.more:
        args.command_parser.error("one file, or two side by side")
    files = [args.file] if args.file2 is None else [args.file, args.file2]
    for path in files:
        if problem := not_a_file_of_rows(path):
            sys.exit(f"threadweaver view: {path}: {problem}")
    out = args.out or files[0] + ".html"
    server = None
    if args.serve:
        server = _page_server(args.port or 0)
    else:
        try:
            check_outputs([out], files)
        except ValueError as err:
            sys.exit(f"threadweaver view: {err}")
        try:
            check_writable(out)
        except ValueError as err:
            sys.exit(f"threadweaver view: --out {out}: {err}")
    reader, explained = row_reader(args.tokenizer, files, "view")
    torn = []
    try:
        html = file_page(files, reader, args.title, progress=bar, on_torn=lambda *at: torn.append(at))
    except OSError as err:
        sys.exit(f"threadweaver view: {err}")
    except ValueError as err:
        _say_torn("view", torn)
        sys.exit(f"threadweaver view: {explained(err)}")
    _say_torn("view", torn)
    if server is not None:
        return _serve_page(server, html)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(html)
    print(out)


def _page_server(port: int):
    """A loopback server for one page, bound now (a port in use is refused before the page is built); its
    page is set by :func:`_serve_page`."""
    import errno
    import http.server

    class Page(http.server.BaseHTTPRequestHandler):
        body = b""

        def do_GET(self):  # noqa: N802 (the standard library's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)

        def log_message(self, *args):
            pass

    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Page)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            sys.exit(f"threadweaver view: port {port} is in use: give another --port, or none for a free one")
        sys.exit(f"threadweaver view: cannot serve on port {port}: {err.strerror or err}")
    server.page = Page
    return server


def _serve_page(server, html: str) -> None:
    """Serve one page on loopback until Ctrl-C."""
    server.page.body = html.encode()
    with server:
        print(f"http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def _kit_arguments(p: argparse.ArgumentParser) -> None:
    from threadweaver.kit.models import TinyQwen3Config

    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tokenizer", choices=("synth", "qwen"), default="synth", help="which tokenizer (default: synth)")
    p.add_argument(
        "--model", action=argparse.BooleanOptionalAction, default=True, help="also save a tiny model (default: True)"
    )
    add_arguments(p, TinyQwen3Config)


def _kit(args: argparse.Namespace) -> None:
    """Saved in a staging folder first: a file that cannot go into ``--out`` (a folder in its place)
    is refused before any of ``--out`` changes."""
    import shutil
    import tempfile

    from threadweaver.jsonl import check_folder, check_outputs
    from threadweaver.kit.models import TinyQwen3Config, tiny_qwen3
    from threadweaver.kit.tokenizers import qwen_tokenizer, synth_tokenizer

    try:
        check_folder(args.out)
        config = from_args(TinyQwen3Config, args)
    except ValueError as err:
        sys.exit(f"threadweaver kit: {err}")
    tokenizer = qwen_tokenizer() if args.tokenizer == "qwen" else synth_tokenizer()
    with tempfile.TemporaryDirectory() as staging:
        tokenizer.save_pretrained(staging)
        if args.model:
            tiny_qwen3(tokenizer, config).save_pretrained(staging)
        names = sorted(os.listdir(staging))
        try:
            check_outputs([os.path.join(args.out, name) for name in names], [], named=False)
        except ValueError as err:
            sys.exit(f"threadweaver kit: {err}")
        if other := [n for n in names if _differs(os.path.join(staging, n), os.path.join(args.out, n))]:
            sys.exit(  # a trained model's weights, say: a kit written again with the same settings is left as it is
                f"threadweaver kit: {args.out} already holds {', '.join(other)} unlike this kit's: "
                "writing it would replace them; give another --out, or remove them"
            )
        os.makedirs(args.out, exist_ok=True)
        for name in names:
            shutil.move(os.path.join(staging, name), os.path.join(args.out, name))
    print(args.out)


def _differs(new: str, old: str) -> bool:
    """Whether ``old`` exists with other contents than ``new``: JSON files are compared as JSON less the
    transformers version they record, so the same kit written by another transformers is the same."""
    import filecmp
    from pathlib import Path

    if not os.path.isfile(old) or filecmp.cmp(new, old, shallow=False):
        return False
    if not new.endswith(".json"):
        return True
    try:
        documents = [json.loads(Path(path).read_bytes()) for path in (new, old)]
    except (OSError, ValueError):
        return True
    for document in documents:
        if isinstance(document, dict):
            document.pop("transformers_version", None)
    return documents[0] != documents[1]


DATA_COMMANDS = (
    Command(
        "synth", "write the synthetic task's train/validation splits (JSONL, chat messages)", _synth, _synth_arguments
    ),
    Command("stats", "token-latency statistics of trajectories in a JSONL file", _stats, _stats_arguments),
    Command(
        "filter",
        "keep a model's correct, well-formed, parallel trajectories to train on (stage 2 of the data)",
        _filter,
        _filter_arguments,
    ),
    Command(
        "convert",
        "bring a peer's parallel dataset into our format (Multiverse, reference, NPR)",
        _convert,
        _convert_arguments,
    ),
    Command(
        "curate",
        "rewrite sequential reasoning traces into parallel SFT data with an LLM (stage 1 of the data)",
        _curate,
        _curate_arguments,
    ),
    Command(
        "self-train",
        "sample a model on problems, keep its correct parallel trajectories and fine-tune on them "
        "(stage 2 of the data; more flags go to sft)",
        _self_train,
        _self_train_arguments,
        epilog="Every other flag goes to `threadweaver sft` (`threadweaver sft --help` lists them), e.g. "
        "--max-steps 400 --learning-rate 1e-5; --seed here is the sampling seed. --max-tokens is each trajectory's "
        "decoding budget as well as the filter's limit. The model goes to OUT/model; with --save-steps N, "
        "a rerun after a stop goes on from its last checkpoint.",
        own_flags=True,
    ),
    Command(
        "view", "one self-contained HTML page to read trajectories and inspect the tree mask", _view, _view_arguments
    ),
    Command("kit", "save the embedded tokenizer (and a tiny random Qwen3) to a directory", _kit, _kit_arguments),
)
