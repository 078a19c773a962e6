"""The model and server commands: prepare, sft, pgrpo, serve, proxy, generate and quickstart."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from threadweaver.cli_args import add_arguments, from_args

from .command import Command, os_error, show_warnings


def _prepare_arguments(p: argparse.ArgumentParser) -> None:
    from threadweaver.prepare import PrepareArgs

    add_arguments(p, PrepareArgs)


def _prepare(args: argparse.Namespace) -> None:
    from threadweaver.prepare import PrepareArgs, PrepareError, prepare

    try:
        prepared = prepare(from_args(PrepareArgs, args))
    except PrepareError as err:
        sys.exit(f"threadweaver prepare: {err}")
    print("\n".join(prepared.lines))


def _sft(args: argparse.Namespace) -> None:
    from threadweaver.hf_collator import sft

    show_warnings()
    try:
        out = sft.main(args.rest)
    except (ValueError, OSError) as err:
        sys.exit(f"threadweaver sft: {err}")
    print(f"saved model and tokenizer to {out}")


def _pgrpo(args: argparse.Namespace) -> None:
    from threadweaver.trl_pgrpo import command

    show_warnings()
    try:
        out = command.main(args.rest)
    except (ValueError, TypeError) as err:
        sys.exit(f"threadweaver pgrpo: {err}")
    except OSError as err:  # an --output-dir that cannot be made (under /proc, under a file), a full disk
        sys.exit(f"threadweaver pgrpo: {os_error(err)}")
    print(f"saved model and tokenizer to {out}")


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    from threadweaver.orchestrator import Limits
    from threadweaver.vllm_orchestrator.serve import ServeArgs

    add_arguments(p, ServeArgs)
    add_arguments(p, Limits, exclude=("branching",))


def _model_after_a_flag(args: argparse.Namespace) -> str | None:
    """The path meant as MODEL where argparse read the value of a vLLM flag before it as MODEL: in
    ``serve --api-key KEY runs/m`` it reads KEY, the word after a flag it does not know. Only where MODEL is
    no path, comes right after a flag serve does not know, and right before a path (``serve --enforce-eager
    Qwen/Qwen3-8B --download-dir /data`` is fine)."""
    if os.path.exists(os.path.expanduser(args.model)):
        return None
    own = args.command_parser.option_strings
    words = args.words
    for at in range(1, len(words) - 1):
        flag, following = words[at - 1], words[at + 1]
        unknown_flag = flag.startswith("-") and "=" not in flag and flag not in own
        if words[at] == args.model and unknown_flag and os.path.exists(following):
            return following
    return None


def _serve(args: argparse.Namespace) -> None:
    from threadweaver.orchestrator import Limits
    from threadweaver.vllm_orchestrator.serve import ServeArgs, serve_until_stopped

    if folder := _model_after_a_flag(args):
        sys.exit(
            f"threadweaver serve: {args.model} was read as MODEL: give MODEL first, then vLLM's flags "
            f"(threadweaver serve {folder} ...)"
        )
    try:
        limits = from_args(Limits, args, branching=True)
        serve_until_stopped(from_args(ServeArgs, args), [*args.rest, *args.vllm_args], limits)
    except (RuntimeError, ValueError) as err:
        sys.exit(f"threadweaver serve: {err}")


def _proxy_arguments(p: argparse.ArgumentParser) -> None:
    from threadweaver.orchestrator import Limits
    from threadweaver.vllm_orchestrator.proxy import ProxyArgs

    add_arguments(p, ProxyArgs)
    add_arguments(p, Limits, exclude=("branching",))


def _proxy(args: argparse.Namespace) -> None:
    from threadweaver.engine import EngineError
    from threadweaver.orchestrator import Limits
    from threadweaver.vllm_orchestrator.proxy import ProxyArgs, serve_proxy

    try:
        serve_proxy(from_args(ProxyArgs, args), from_args(Limits, args, branching=True))
    except (ValueError, OSError, EngineError) as err:
        sys.exit(f"threadweaver proxy: {err}")


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    from threadweaver.orchestrator import Limits, Sampling
    from threadweaver.vllm_orchestrator.engines import EngineArgs
    from threadweaver.vllm_orchestrator.generate import GenerateArgs

    for config in (GenerateArgs, EngineArgs, Limits, Sampling):
        add_arguments(p, config)


def _generate(args: argparse.Namespace) -> None:
    from threadweaver.engine import EngineError
    from threadweaver.interrupts import Stopped
    from threadweaver.jsonl import RowError
    from threadweaver.orchestrator import Limits, Sampling
    from threadweaver.vllm_orchestrator.engines import EngineArgs
    from threadweaver.vllm_orchestrator.generate import GenerateArgs, run

    try:
        progress = run(*(from_args(config, args) for config in (GenerateArgs, EngineArgs, Limits, Sampling)))
    except RowError as err:
        sys.exit(f"threadweaver generate: {args.problems}: {err}")
    except ValueError as err:  # bad input or settings: the same command would fail again
        sys.exit(f"threadweaver generate: {err}")
    except (EngineError, OSError) as err:
        sys.exit(f"threadweaver generate: {err}{_resume_hint(args.out)}")
    except KeyboardInterrupt as interrupt:  # Ctrl-C
        raise Stopped(f"stopped{_resume_hint(args.out)}", interrupt) from None
    if not progress.done:
        print(f"nothing to decode: every trajectory is already in {args.out}")
        return
    cut_short = progress.cut_short()
    print(
        f"decoded {progress.done} trajectories into {args.out}{', ' + cut_short if cut_short else ''}: "
        f"mean speedup {progress.mean_speedup:.2f}x, "
        f"{progress.tokens_per_s:.0f} generated tokens/s, {progress.degraded_by_kind()}\n"
        f"mean wall-clock per trajectory: {progress.wall_clock()}"
    )
    if _has_answers(args.problems):
        print(
            f"to grade them by the problems' answers (pass@1): threadweaver filter {shlex.quote(args.out)} KEPT.jsonl"
        )


def _has_answers(problems: str) -> bool:
    """Whether ``threadweaver filter`` can grade the trajectories: every problem in ``problems`` (as the file is now;
    a pipe was read once, by the run) has an answer it reads."""
    from threadweaver.batch import read_problems
    from threadweaver.reward import row_answer

    if not os.path.isfile(problems):
        return False
    try:
        for line, _, row in read_problems(problems):
            row_answer(row, line)
    except (OSError, ValueError):
        return False
    return True


def _resume_hint(out: str) -> str:
    if not (os.path.isfile(out) and os.path.getsize(out)):
        return ""
    return f"\nfinished trajectories are in {out}; rerun the same command to resume"


def _quickstart_arguments(p: argparse.ArgumentParser) -> None:
    from threadweaver.quickstart import QuickstartArgs

    add_arguments(p, QuickstartArgs)


def _quickstart(args: argparse.Namespace) -> None:
    from threadweaver.interrupts import Stopped
    from threadweaver.quickstart import QuickstartArgs, run

    try:
        run(from_args(QuickstartArgs, args))
    except (ValueError, RuntimeError, OSError) as err:
        sys.exit(f"threadweaver quickstart: {err}")
    except Stopped as stopped:  # sft's advice names flags quickstart does not take; a rerun trains anew
        raise stopped.interrupt from None


MODEL_COMMANDS = (
    Command(
        "prepare",
        "bring your own model: add the tags as tokens, check its chat template, write it for sft, vLLM and lm-eval",
        _prepare,
        _prepare_arguments,
        epilog="MODEL: a transformers directory, a hub id or a GGUF file. What it changes is printed; "
        "preparing a prepared model changes nothing.",
    ),
    # Their flags are the fields of the TRL configs they fill, parsed when the command runs.
    Command(
        "sft",
        "fine-tune a model on trajectories with TRL's SFTTrainer and tree attention (--help: every flag)",
        _sft,
        own_flags=True,
        own_help=True,
    ),
    Command(
        "pgrpo",
        "P-GRPO: reinforce correct and faster fork-join reasoning with TRL (the paper's defaults)",
        _pgrpo,
        own_flags=True,
        own_help=True,
    ),
    Command(
        "serve",
        "start a vLLM server set up for fork-join decoding; prints its URL",
        _serve,
        _serve_arguments,
        epilog="Every other flag goes to the vLLM server as it is (--api-key, --tensor-parallel-size, ...); "
        "so does everything after a lone --.",
        own_flags=True,
        vllm_flags=True,
    ),
    Command(
        "proxy",
        "serve fork-join chat and completion routes in front of a vLLM or SGLang server",
        _proxy,
        _proxy_arguments,
    ),
    Command("generate", "decode JSONL problems into JSONL trajectories (resumable)", _generate, _generate_arguments),
    Command(
        "quickstart",
        "serve, evaluate and compare the embedded ThreadWeaver model and its sequential baseline with vLLM and lm_eval",
        _quickstart,
        _quickstart_arguments,
    ),
)
