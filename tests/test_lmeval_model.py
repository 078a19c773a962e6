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
    with pytest.raises(ValueError, match=f"{tmp_path} is not writable$"):
        ThreadWeaverLM.create_from_arg_string(f"trajectories={tmp_path}/new/t.jsonl")


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


def test_resume_needs_a_trajectories_file():
    with pytest.raises(ValueError, match="^model_args resume=true needs trajectories=FILE, the file to resume from$"):
        split_model_args(simple_parse_args_string("resume=true"))
