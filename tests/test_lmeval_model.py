"""The ``threadweaver`` lm-eval model's arguments and sampling, as lm-eval hands them over.

Decoding through lm-eval runs in integration_tests/test_lmeval_tasks.py.
"""

import logging
import os

import pytest
from lm_eval.utils import simple_parse_args_string

from threadweaver.lmeval_tasks import model
from threadweaver.lmeval_tasks.model import ThreadWeaverLM, sampling_from, split_model_args


@pytest.mark.parametrize(
    "arg_string, branching, concurrent",
    [
        ("branching=false,concurrent_threads=FALSE", False, False),
        ("branching=0,concurrent_threads=1", False, True),
        ("branching=True", True, True),
    ],
)
def test_boolean_model_args_from_the_command_line(arg_string, branching, concurrent):
    limits = split_model_args(simple_parse_args_string(arg_string))[2]
    assert (limits.branching, limits.concurrent_threads) == (branching, concurrent)


@pytest.mark.parametrize("value, expected", [("false", False), ("True", True), ("0", False), (1, True), (False, False)])
def test_boolean_model_args_from_python(value, expected):
    assert split_model_args({"branching": value, "warm_join": value})[2].warm_join is expected


@pytest.mark.parametrize(
    "arg_string, name", [("branching=no", "branching"), ("concurrent_threads=off", "concurrent_threads")]
)
def test_other_words_for_a_boolean_are_refused_naming_the_arg(arg_string, name):
    with pytest.raises(ValueError, match=f"^model_args {name} must be true or false \\(or 1 or 0\\), not '"):
        ThreadWeaverLM.create_from_arg_string(arg_string)


def test_trajectories_path_is_checked_when_the_model_is_made(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=f"^trajectories={tmp_path}: {tmp_path} is a folder, not a file$"):
        ThreadWeaverLM.create_from_arg_string(f"trajectories={tmp_path}")
    with pytest.raises(ValueError, match=f"^trajectories={tmp_path}/file/t.jsonl: {tmp_path}/file is a file, not a"):
        ThreadWeaverLM.create_from_arg_string(f"trajectories={tmp_path}/file/t.jsonl")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_trajectories_path_is_refused(tmp_path):
    tmp_path.chmod(0o500)
    with pytest.raises(ValueError, match=f"cannot write a file in {tmp_path} \\("):
        ThreadWeaverLM.create_from_arg_string(f"trajectories={tmp_path}/new/t.jsonl")


def test_a_trajectories_path_where_no_file_can_be_made_is_refused_even_as_root():
    """os.access passes root anywhere, /proc included, where the first trajectory's write then failed."""
    with pytest.raises(ValueError, match="^trajectories=/proc/t.jsonl: cannot write a file in /proc \\("):
        ThreadWeaverLM.create_from_arg_string("trajectories=/proc/t.jsonl")


def test_a_tokenizer_that_cannot_load_is_one_line_naming_the_model_arg(tmp_path):
    """A missing folder read as a hub id: "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"."""
    missing = str(tmp_path / "nope")
    for arg in ("tokenizer", "model"):
        said = f"^cannot load the tokenizer '{missing}' \\({arg}= in --model_args\\): {missing}: no such directory"
        with pytest.raises(ValueError, match=said):
            ThreadWeaverLM.create_from_arg_string(f"base_url=http://127.0.0.1:9,{arg}={missing}")


def test_a_trajectories_file_of_other_rows_is_refused(tmp_path):
    """A task's own data file, named as trajectories=, got the trajectories appended: the next run could not read
    its problems."""
    problems = tmp_path / "aime24.jsonl"
    problems.write_text('{"Problem": "1+1?", "Answer": 2}\n')
    with pytest.raises(ValueError, match=f"^trajectories={problems}: {problems} holds no finished row: "):
        split_model_args({"trajectories": str(problems)})
    assert problems.read_text() == '{"Problem": "1+1?", "Answer": 2}\n'
    (tmp_path / "t.jsonl").write_text('{"id": "tw_aime24/0", "sample": 0}\n')  # a trajectories file: appended to
    assert split_model_args({"trajectories": str(tmp_path / "t.jsonl")})[0].trajectories == str(tmp_path / "t.jsonl")


def test_trajectories_path_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = split_model_args(simple_parse_args_string("trajectories=~/runs/t.jsonl"))[0]
    assert args.trajectories == str(tmp_path / "runs" / "t.jsonl") and not (tmp_path / "~").exists()


def test_a_temperature_under_do_sample_false_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(model, "_warned_greedy", False)
    tw_synth = {"until": [], "do_sample": False, "max_gen_toks": 1024}
    with caplog.at_level(logging.WARNING, logger=model.__name__):
        assert sampling_from({**tw_synth, "temperature": 0.0}, 0)[0].temperature == 0.0
        assert not caplog.records
        for _ in range(2):
            assert sampling_from({**tw_synth, "temperature": 1.5}, 0)[0].temperature == 0.0
    [record] = caplog.records
    assert "do_sample=false overrides temperature=1.5" in record.message
    assert "--gen_kwargs do_sample=true,temperature=1.5" in record.message
    assert sampling_from({**tw_synth, "do_sample": True, "temperature": 1.5}, 0)[0].temperature == 1.5


@pytest.mark.parametrize(
    "gen_kwargs, message",
    [
        ({"max_gen_toks": "abc"}, "generation kwarg max_gen_toks must be a whole number, not 'abc'"),
        ({"top_k": "abc"}, "generation kwarg top_k must be a whole number, not 'abc'"),
        ({"temperature": "hot"}, "generation kwarg temperature must be a number, not 'hot'"),
        ({"max_gen_toks": 0}, "generation kwarg max_gen_toks must be at least 1, not 0"),
    ],
)
def test_a_bad_generation_kwarg_is_named_as_typed(gen_kwargs, message):
    """--gen_kwargs max_gen_toks=abc said "invalid literal for int() with base 10", and 0 said max_tokens."""
    with pytest.raises(ValueError, match=f"^{message}$"):
        sampling_from({"until": [], **gen_kwargs}, 0)
    assert sampling_from({"max_gen_toks": "64", "top_k": 5.0, "temperature": "0.5"}, 0)[:2] == (
        model.Sampling(temperature=0.5, top_k=5, seed=0),
        64,
    )


def test_none_in_any_case_is_none():
    """lm-eval reads only None as None; "seed must be a whole number (or none)" refused seed=none."""
    args, _, limits = split_model_args(simple_parse_args_string("seed=none,timeout_s=NULL,max_request_tokens=None"))
    assert (args.seed, limits.timeout_s, limits.max_request_tokens) == (None, None, None)


def test_resume_needs_a_trajectories_file():
    with pytest.raises(ValueError, match="^model_args resume=true needs trajectories=FILE, the file to resume from$"):
        split_model_args(simple_parse_args_string("resume=true"))


def test_the_start_up_hook_installs_says_its_status_and_removes_once(tmp_path, monkeypatch, capsys):
    """``remove`` said "removed" with nothing there."""
    import runpy

    from threadweaver.lmeval_tasks import discovery

    monkeypatch.setattr(discovery, "pth_path", lambda: tmp_path / "threadweaver-lmeval.pth")

    def run(action: str) -> tuple[int, str]:
        monkeypatch.setattr("sys.argv", ["python -m threadweaver.lmeval_tasks", action])
        with pytest.raises(SystemExit) as done:
            runpy.run_module("threadweaver.lmeval_tasks", run_name="__main__")
        return done.value.code, capsys.readouterr().out.strip()

    pth = tmp_path / "threadweaver-lmeval.pth"
    assert run("install") == (0, f"installed {pth}") and run("status") == (0, f"{pth}: installed")
    assert run("remove") == (0, f"removed {pth}") and not pth.exists()
    assert run("remove") == (0, f"{pth}: not installed, nothing to remove")
    assert run("status") == (1, f"{pth}: not installed")


def test_a_run_the_server_failed_says_where_its_trajectories_are(tmp_path, monkeypatch, capsys):
    """Only Ctrl-C said it: a server killed mid-run ended in "cannot reach the vLLM server ... is it running?", with
    the finished trajectories in the file unnamed and resume=true unsaid."""
    import socket
    import sys

    from lm_eval.api.instance import Instance

    from threadweaver.engine import EngineError
    from threadweaver.lmeval_tasks import cli_errors, measured
    from threadweaver.quickstart.recipe import embedded_models
    from threadweaver.vllm_orchestrator.http import HTTPOptions
    from threadweaver.vllm_orchestrator.vllm_server_engine import VLLMServerEngine

    for name, fresh in (("_tokenizer", None), ("_tokenizer_hint", None), ("_unloadable", set())):
        monkeypatch.setattr(measured, name, fresh)  # the model sets the tasks' tokenizer for the whole process
    trajectories = tmp_path / "t.jsonl"
    args = f"engine=transformers,model={embedded_models()['parallel']},trajectories={trajectories}"
    lm = ThreadWeaverLM.create_from_arg_string(args)
    with socket.socket() as s:  # a port nothing listens on: the server is gone
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    lm.engine = VLLMServerEngine(url, options=HTTPOptions(retries=0))
    request = Instance("generate_until", {}, ("A=1+2\nA=?", {"until": [], "max_gen_toks": 8}), 0, ("tw_synth", 0, 1))
    capsys.readouterr()
    with pytest.raises(EngineError) as failed:
        lm.generate_until([request], disable_tqdm=True)
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    cli_errors.install()  # as in lm-eval's CLI
    sys.excepthook(EngineError, failed.value, failed.value.__traceback__)
    said = capsys.readouterr().err
    assert said.startswith(f"threadweaver: cannot reach the vLLM server at {url}") and said.endswith(
        f"; the trajectories it finished are in {trajectories}: rerun with resume=true added to "
        "model_args to go on (without it, a rerun decodes them again)\n"
    )
