"""`threadweaver serve` builds the vLLM command line for the workload, and serve and proxy refuse bad settings
(no server started here)."""

import os
import re
from dataclasses import replace

import pytest

from threadweaver.orchestrator import Limits
from threadweaver.vllm_orchestrator.serve import ServeArgs, check_tags, server_command, server_env


def flags(command):
    return dict(zip(command, command[1:] + [""]))


def test_cpu_gets_the_vllm_cpu_settings_and_prefix_caching():
    command = server_command(ServeArgs("model-dir", device="cpu"), 8123)
    f = flags(command)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert f["--model"] == "model-dir" and f["--port"] == "8123"
    assert f["--dtype"] == "bfloat16" and f["--block-size"] == "32" and "--enforce-eager" in command
    assert "--enable-prefix-caching" in command and "--enable-prompt-tokens-details" in command


def test_gpu_keeps_vllm_defaults_and_explicit_choices_win():
    command = server_command(ServeArgs("m", device="gpu", gpu_memory_utilization=0.8), 1, ["--max-num-seqs", "8"])
    f = flags(command)
    assert f["--gpu-memory-utilization"] == "0.8" and "--dtype" not in f and "--enforce-eager" not in command
    assert command[-2:] == ["--max-num-seqs", "8"]
    assert (
        flags(server_command(ServeArgs("m", device="cpu", dtype="float32", block_size=64), 1))["--block-size"] == "64"
    )


def test_the_quickstarts_servers_split_the_gpu_and_a_model_of_ones_own_keeps_its_context(monkeypatch):
    from threadweaver.quickstart.evaluate import server_args

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)

    embedded = server_args({"parallel": "p", "baseline": "b"}, "float32", 2048)
    for args in embedded.values():  # two servers side by side on one GPU: each asking for 90% of it fails
        f = flags(server_command(replace(args, device="gpu"), 1))
        assert f["--gpu-memory-utilization"] == "0.45" and f["--max-model-len"] == "2048"
        assert args.cpu_kv_cache_gib == 1
    from threadweaver.quickstart import OWN_MODEL_CONTEXT

    own = server_args({"parallel": "Qwen/Qwen3-8B"}, "auto", OWN_MODEL_CONTEXT)["parallel"]
    assert flags(server_command(own, 1))["--max-model-len"] == "8192"
    assert own.cpu_kv_cache_gib is None  # the environment's, else 2 GiB: 1 holds 2,048 tokens of the pairs' models
    assert flags(server_command(replace(own, device="gpu"), 1))["--gpu-memory-utilization"] == "0.9"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve", "{kit}", "--block-size", "0"], "--block-size must be a whole number of at least 1, not 0"),
        (["serve", "{kit}", "--port", "99999"], "--port must be a port number (0 to 65535), not 99999"),
        (["serve", "{kit}", "--gpu-memory-utilization", "7"], "--gpu-memory-utilization is a share"),
        (["serve", "{kit}", "--startup-timeout-s", "-1"], "--startup-timeout-s must be a finite number of seconds"),
        (["serve", "{tmp}/nomodel"], "{tmp}/nomodel: no such directory (a hub id reads org/name)"),
        (["serve", "--api-key", "KEY", "{kit}"], "KEY was read as MODEL: give MODEL first, then vLLM's flags"),
        (["proxy", "--backend", "notaurl"], "--backend must be an http:// or https:// URL, not 'notaurl'"),
        (["proxy", "--port", "-5"], "--port must be a port number (0 to 65535), not -5"),
        (["proxy", "--max-trajectories", "0"], "--max-trajectories must be a whole number of at least 1, not 0"),
        (["proxy", "--backend-timeout-s", "0"], "--backend-timeout-s must be a finite number of seconds, more than 0"),
        (
            ["proxy", "--backend-timeout-s", "inf"],
            "--backend-timeout-s must be a finite number of seconds, more than 0",
        ),
    ],
)
def test_serve_and_proxy_refuse_bad_settings_naming_the_flag_before_anything_starts(tmp_path, argv, message, capsys):
    from threadweaver.cli import main

    (tmp_path / "kit").mkdir()
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / "kit" / name).write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        main([arg.format(kit=tmp_path / "kit", tmp=tmp_path) for arg in argv])
    assert message.format(tmp=tmp_path) in f"{exit_.value.code}{capsys.readouterr().err}"


@pytest.mark.parametrize(
    "host, reason",
    [
        ("bad host", "must be a host name or IP address to listen on (127.0.0.1, 0.0.0.0, ::), not 'bad host'"),
        ("", "must be a host name or IP address to listen on (127.0.0.1, 0.0.0.0, ::), not ''"),
        (
            "http://127.0.0.1",
            "must be a host name or IP address to listen on (127.0.0.1, 0.0.0.0, ::), not a URL: 'http://127.0.0.1'",
        ),
        ("localhost:8000", "must be a host without a port (give the port as --port), not 'localhost:8000'"),
        ("[::1]", "must be an IPv6 address without brackets (::1), not '[::1]'"),
    ],
)
def test_a_host_that_cannot_be_one_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys, host, reason):
    """serve once started vLLM with it, then stopped with an InvalidURL traceback; the proxy shares the rule,
    and so does every ServeArgs (quickstart's and self-train's servers)."""
    from threadweaver.cli import main
    from threadweaver.cli_args import SettingError
    from threadweaver.vllm_orchestrator import proxy, serve

    monkeypatch.setattr(serve.VLLMServer, "start", lambda self: pytest.fail("vLLM started"))
    monkeypatch.setattr(proxy, "serve_proxy", lambda *args: pytest.fail("the proxy started"))
    (tmp_path / "kit").mkdir()
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / "kit" / name).write_text("{}")
    for command in (["serve", str(tmp_path / "kit")], ["proxy"]):
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--host", host])
        assert exit_.value.code == f"threadweaver {command[0]}: --host {reason}"
    with pytest.raises(SettingError, match="host must be"):
        ServeArgs("m", host=host)
    for fine in ("127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "gpu-node_3.cluster.local"):
        assert ServeArgs("m", host=fine).host == fine


@pytest.mark.parametrize(
    "argv, model, extra",
    [
        (["{tmp}/m.gguf", "--tokenizer", "{kit}"], "{tmp}/m.gguf", ["--tokenizer", "{kit}"]),  # GGUF, its tokenizer
        (["gpt2", "--download-dir", "{kit}"], "gpt2", ["--download-dir", "{kit}"]),  # a hub id without an org
        (["--enforce-eager", "{kit}"], "{kit}", ["--enforce-eager"]),  # a switch of vLLM's before MODEL
        (
            ["--enforce-eager", "org/m", "--download-dir", "{kit}"],
            "org/m",
            ["--enforce-eager", "--download-dir", "{kit}"],
        ),
        (["--branching-default", "org/m", "--download-dir", "{kit}"], "org/m", ["--download-dir", "{kit}"]),
        (["--served-model-name", "m", "m", "--download-dir", "{kit}"], "m", ["--download-dir", "{kit}"]),
    ],
)
def test_serve_takes_models_given_with_a_path_among_vllms_flags(tmp_path, argv, model, extra, monkeypatch):
    """These were refused as "KEY was read as MODEL"."""
    from threadweaver.cli import main
    from threadweaver.vllm_orchestrator import serve

    (tmp_path / "kit").mkdir()
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    paths = {"kit": tmp_path / "kit", "tmp": tmp_path}
    started = []
    monkeypatch.setattr(serve, "serve_until_stopped", lambda args, rest, limits: started.append((args.model, rest)))
    main(["serve", *(arg.format(**paths) for arg in argv)])
    assert started == [(model.format(**paths), [arg.format(**paths) for arg in extra])]


@pytest.fixture(scope="module")
def tagless(tmp_path_factory):
    """A model directory whose tokenizer is Qwen3's as it ships (no block tags): not prepared."""
    from threadweaver.kit.tokenizers import qwen_tokenizer

    path = tmp_path_factory.mktemp("tagless")
    qwen_tokenizer(tags=False).save_pretrained(path)
    (path / "config.json").write_text("{}")
    return path


def test_serve_refuses_a_model_without_the_tags_when_every_request_is_fork_join(tagless, capsys):
    from threadweaver.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", str(tagless), "--branching-default"])
    assert exit_.value.code == (
        "threadweaver serve: --branching-default decodes every request fork-join, but the model's tokenizer "
        "has no single token for <Parallel>, </Parallel>, <Outlines>, </Outlines>, <Outline>, </Outline>, "
        f"<Thread>, </Thread>, so it cannot decode fork-join: `threadweaver prepare {tagless} DIR` adds the tags "
        "(then serve DIR)"
    )
    assert "starting vLLM" not in capsys.readouterr().err


def test_only_branching_default_refuses_it_and_the_tokenizer_checked_is_the_one_vllm_loads(tagless, synth, tmp_path):
    """Fork-join on request: the server starts (plain requests work there; the plugin's 400 says how to prepare)."""
    check_tags(ServeArgs(str(tagless)))
    synth.save_pretrained(tmp_path)  # --tokenizer: the tokenizer vLLM loads, and the one checked
    check_tags(ServeArgs(str(tagless), branching_default=True), ["--tokenizer", str(tmp_path)])
    check_tags(ServeArgs(str(tagless), branching_default=True), [f"--tokenizer={tmp_path}"])
    with pytest.raises(ValueError, match="has no single token for <Parallel>"):
        check_tags(ServeArgs(str(tmp_path), branching_default=True), ["--tokenizer", str(tagless)])


def test_the_check_reads_vllms_flags_in_either_spelling():
    """vLLM's parser takes ``--tokenizer-revision`` and ``--tokenizer_revision``, ``=VALUE`` or a separate one."""
    from threadweaver.vllm_orchestrator.serve import _vllm_flag

    extra = ["--tokenizer_revision=v2", "--revision", "v1", "--trust_remote_code", "--max-model-len", "64"]
    assert (_vllm_flag(extra, "--tokenizer-revision"), _vllm_flag(extra, "--revision")) == ("v2", "v1")
    assert _vllm_flag(extra, "--max-model-len") == "64" and _vllm_flag(extra, "--tokenizer") is None


def test_a_tokenizer_that_cannot_be_loaded_for_the_check_is_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError) as refused:
        check_tags(ServeArgs(str(empty), branching_default=True))
    assert str(refused.value).startswith(f"--branching-default: cannot load the tokenizer of {empty} to check its tags")


def test_the_proxy_tells_clients_what_failed_not_where_the_backend_is(capsys):
    from threadweaver.vllm_orchestrator.proxy import backend_hider

    hide = backend_hider("http://user:secret@10.0.0.7:8000")
    message = (
        "cannot reach the vLLM server at http://user:secret@10.0.0.7:8000 (ClientConnectorError: Cannot connect "
        "to host 10.0.0.7:8000 ssl:default [Connect call failed ('10.0.0.7', 8000)]) after 3 tries"
    )
    shown = hide(message)
    assert "10.0.0.7" not in shown and "secret" not in shown, shown
    assert shown.startswith("cannot reach the vLLM server at <backend> (ClientConnectorError: Cannot connect to host")
    assert capsys.readouterr().err == f"threadweaver proxy: {message}\n"  # the operator sees it all
    assert hide("the prompt is 9 tokens") == "the prompt is 9 tokens" and capsys.readouterr().err == ""
    by_name = backend_hider("http://pool:9")("cannot reach http://pool:9 [Connect call failed ('10.1.2.3', 9)]")
    assert by_name == "cannot reach <backend> [Connect call failed <backend>]"  # nor what its name resolved to


def test_a_start_up_that_vllm_refuses_with_status_2_exits_2(tmp_path, monkeypatch, capfd):
    """vLLM's argparse refusal of a flag serve passed on (a typo of one of serve's own, say) exited 1 after a line that
    named no flag; it is a flag the command cannot read, status 2 (the vLLM server is stood in for by a process that
    exits 2 as argparse does: tests/../integration_tests/test_kit_serves_in_vllm.py runs vLLM itself)."""
    import sys

    from threadweaver.vllm_orchestrator import serve

    monkeypatch.setattr(serve, "server_command", lambda *_: [sys.executable, "-c", "import sys; sys.exit(2)"])
    with pytest.raises(SystemExit) as exited:
        serve.serve_until_stopped(ServeArgs(str(tmp_path), port=0), ["--max-tokns", "9"])
    assert exited.value.code == 2
    assert capfd.readouterr().err.splitlines()[-1] == (
        "threadweaver serve: vLLM refused its command line (its error is above); the flags serve passed on to it: "
        "--max-tokns 9 (`threadweaver serve --help` lists serve's own)"
    )
    with pytest.raises(SystemExit) as exited:
        serve.serve_until_stopped(ServeArgs(str(tmp_path), port=0))
    assert exited.value.code == 2
    assert (
        capfd.readouterr().err.splitlines()[-1]
        == "threadweaver serve: vLLM refused its command line (its error is above)"
    )


def test_the_cpu_kv_cache_flag_wins_over_the_environment_which_wins_over_the_default():
    def cache(environ, **flags):
        return server_env(ServeArgs("m", device="cpu", **flags), Limits(), environ)["VLLM_CPU_KVCACHE_SPACE"]

    assert cache({}) == "2"
    assert cache({"VLLM_CPU_KVCACHE_SPACE": "40"}) == "40"  # vLLM's own way to size it
    assert cache({"VLLM_CPU_KVCACHE_SPACE": "40"}, cpu_kv_cache_gib=1) == "1"  # once the environment's, silently
    assert "VLLM_CPU_KVCACHE_SPACE" not in server_env(ServeArgs("m", device="gpu", cpu_kv_cache_gib=1), Limits(), {})
    for junk in ("junk", "-3", "1.5"):  # vLLM failed on them once it had started
        with pytest.raises(ValueError, match=re.escape(f"VLLM_CPU_KVCACHE_SPACE is {junk!r}: vLLM reads it as")):
            cache({"VLLM_CPU_KVCACHE_SPACE": junk})
        assert cache({"VLLM_CPU_KVCACHE_SPACE": junk}, cpu_kv_cache_gib=3) == "3"
    assert cache({"VLLM_CPU_KVCACHE_SPACE": " "}) == "2"  # set but empty: as unset


def test_the_servers_commands_start_for_their_user_keep_the_users_kv_cache(monkeypatch):
    from threadweaver.quickstart.evaluate import server_args

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert server_args({"parallel": "p"}, "float32", 2048)["parallel"].cpu_kv_cache_gib == 1
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")  # once overridden by the quickstart's and self-train's 1 GiB
    args = server_args({"parallel": "p"}, "float32", 2048)["parallel"]
    assert (
        args.cpu_kv_cache_gib is None
        and server_env(args, Limits(), {"VLLM_CPU_KVCACHE_SPACE": "8"})["VLLM_CPU_KVCACHE_SPACE"] == "8"
    )


def test_serve_refuses_a_port_another_server_listens_on_before_vllm_starts(tmp_path, monkeypatch, capsys):
    """The other server answered the start-up's health checks: serve printed its URL as its own ("serving MODEL at
    http://127.0.0.1:8000"), and vLLM failed to bind only once it had loaded the model."""
    import socket

    from threadweaver.cli import main
    from threadweaver.vllm_orchestrator import serve

    started = []
    monkeypatch.setattr(serve.subprocess, "Popen", lambda *a, **k: started.append(a))
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            main(["serve", str(tmp_path), "--port", str(port)])
    assert exit_.value.code == (
        f"threadweaver serve: port {port} of 127.0.0.1 is in use (another server listens there): give another --port, "
        "or --port 0 for a free one"
    )
    assert started == [] and "serving" not in capsys.readouterr().err
    assert serve.listen_problem("127.0.0.1", port) is None  # free again once the other server is gone


SERVER_STAND_IN = """
import signal, subprocess, sys, time
log, stuck = sys.argv[1], sys.argv[2] == "stuck"
child = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
def said(number, _):
    open(sys.argv[1], "a").write(signal.Signals(number).name + " ")
    sys.exit(0)
for number in (signal.SIGTERM, signal.SIGINT):
    signal.signal(number, said)
print("ready", flush=True)
time.sleep(60)
''', log], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
def stop(*_):
    child.send_signal(signal.SIGINT)  # as vLLM's API server stops its engine core
    child.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if stuck else stop)
print("ready", flush=True)
time.sleep(60)
"""
"""A vLLM server's stand-in: a process with a child (its engine core) that logs the signal it gets; unless
``stuck``, it stops its child itself on SIGTERM."""


@pytest.mark.parametrize("stuck", [False, True], ids=["stops", "stuck"])
def test_stop_signals_the_server_which_stops_its_engine_core_and_a_stuck_one_is_killed_whole(tmp_path, stuck):
    """A SIGTERM to the server's whole process group killed vLLM's engine core under its server: a plain stream then
    held the server the whole timeout, and the kill left its shared memory in /dev/shm."""
    import subprocess
    import sys
    import time

    from threadweaver.testing import logged
    from threadweaver.vllm_orchestrator.serve import VLLMServer, group_alive

    log = tmp_path / "child.log"
    server = VLLMServer(ServeArgs(str(tmp_path), port=0))
    command = [sys.executable, "-c", SERVER_STAND_IN, str(log), "stuck" if stuck else "stops"]
    server.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert server.process.stdout.readline() == "ready\n"
    with logged("threadweaver.vllm_orchestrator.serve") as warnings:
        server.stop(timeout=2)
    deadline = time.monotonic() + 10  # a killed child is gone once it is reaped (by init: its server was killed)
    while group_alive(server.process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.process.returncode == (-9 if stuck else 0) and not group_alive(server.process.pid)
    if stuck:
        assert warnings == [
            "the vLLM server had not stopped 2 s after SIGTERM (an open stream, say): killed",
            "processes of the vLLM server outlived it by 5 s: killed",  # its child, which nothing stopped
        ]
        assert not log.exists()  # the kill, which no process can catch
    else:
        assert warnings == [] and log.read_text() == "SIGINT "  # from its server, not our SIGTERM


HEALTHY_STAND_IN = """
import http.server, signal, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
def stop(*_):
    child.kill()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *_):
        pass
print(child.pid, flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""
"""A vLLM server's stand-in that answers /health, with a child (its engine core); it prints the child's pid."""


def test_the_server_and_its_engine_core_run_in_a_group_of_their_own_in_the_callers_session(tmp_path):
    """vllm-cpu's spin-waits in a session of their own, scheduled as one group (Linux's autogroups), held every
    process of the caller's session off a 2-core machine's cores for as long as a request decoded."""
    import sys

    from threadweaver.vllm_orchestrator.serve import VLLMServer

    server = VLLMServer(ServeArgs(str(tmp_path), port=0, device="cpu"))
    server.command = [sys.executable, "-c", HEALTHY_STAND_IN, str(server.port)]
    log = tmp_path / "server.log"
    server.log_path = str(log)
    with server:
        child = int(log.read_text().split()[0])
        for pid in (server.process.pid, child):
            assert os.getsid(pid) == os.getsid(0) and os.getpgid(pid) == server.process.pid != os.getpgid(0)
