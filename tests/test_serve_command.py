"""`threadweaver serve` builds the vLLM command line for the workload (no server started here)."""

from threadweaver.vllm_orchestrator.serve import ServeArgs, server_command


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
