"""P-GRPO inside TRL: a real ``PGRPOTrainer`` on the embedded SFT'd ThreadWeaver model
(a 1M-parameter Qwen3 trained by ``threadweaver sft``), rollouts decoded in-process by
the shared orchestrator, on synthetic problems, on CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from pgrpo_helpers import GROUP, METRICS, Recorder, Recording, config, dataset, messages_dataset, trainer_for
from trained_model import run_cli
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from threadweaver.orchestrator import trajectory_text
from threadweaver.quickstart.recipe import embedded_models
from threadweaver.reward import RewardConfig, acceleration, grade
from threadweaver.synth import make_rows
from threadweaver.trl_pgrpo import PGRPOConfig, PGRPOTrainer
from threadweaver.trl_pgrpo.idle_steps import SKIPPED_METRIC
from threadweaver.trl_pgrpo.trainer import problem_dataset
from threadweaver.vllm_orchestrator.transformers_engine import TransformersEngine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    trainer = trainer_for(tmp_path_factory.mktemp("pgrpo"), max_steps=3)
    recorder = Recorder(trainer)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    return trainer, recorder.steps, before


def test_a_run_trains_on_parallel_rollouts_and_logs_every_metric(trained):
    trainer, steps, before = trained
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 3 and all(math.isfinite(entry["loss"]) for entry in logs)
    for name in METRICS:
        assert all(name in entry for entry in logs), name
    assert all(entry["threadweaver/parallel_activation"] > 0 for entry in logs)
    assert max(entry["threadweaver/speedup"] for entry in logs) > 1.2
    changed = [name for name, p in trainer.model.named_parameters() if not torch.equal(before[name], p.detach())]
    assert len(changed) == len(before)
    trajectories = [t for _, batch, _ in steps for t in batch]
    assert any(t.stats.blocks > 0 for t in trajectories)
    for entry, (_, batch, _) in zip(logs, steps):
        ended = [t.stats.total_tokens for t in batch if t.finish_reason == "stop"]
        assert entry["completions/clipped_ratio"] == pytest.approx(1 - len(ended) / len(batch))
        assert entry["completions/mean_length"] == pytest.approx(sum(t.stats.total_tokens for t in batch) / len(batch))
        assert entry["completions/max_terminated_length"] == max(ended)


def test_two_processes_log_the_rollouts_of_both(tmp_path):
    """Under torchrun on two CPU processes, the metrics rank 0 logs are means over every
    process's rollouts, not over its own."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    script = os.path.join(os.path.dirname(__file__), "pgrpo_two_processes.py")
    done = subprocess.run(
        [torchrun, "--nproc_per_node", "2", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["processes"] for r in ranks] == [2, 2]
    total = ranks[0]["total_tokens"] + ranks[1]["total_tokens"]
    critical = ranks[0]["critical_path_tokens"] + ranks[1]["critical_path_tokens"]
    stopped = ranks[0]["stopped"] + ranks[1]["stopped"]
    [log] = ranks[0]["logs"]
    assert log["threadweaver/total_tokens"] == pytest.approx(sum(total) / len(total))
    assert log["threadweaver/critical_path_tokens"] == pytest.approx(sum(critical) / len(critical))
    assert log["completions/clipped_ratio"] == pytest.approx(1 - sum(stopped) / len(stopped))
    assert ranks[0]["total_tokens"] != ranks[1]["total_tokens"], "both ranks rolled out the same: nothing was shown"
    # the processes decided together whether the step had a gradient (an all-reduce that must not hang)
    assert [r["logs"][0][SKIPPED_METRIC] for r in ranks] == [float(log["grad_norm"] == 0)] * 2


def test_advantages_are_group_mean_centred_and_not_std_scaled(trained):
    trainer, steps, _ = trained
    reward = RewardConfig(factor=0.5, clip=0.2)
    spread = False
    for inputs, trajectories, out in steps:
        rewards = []
        for row, t in zip(inputs, trajectories):
            correct = grade(trajectory_text(t, trainer.fmt), row["answer"]).correct
            rewards.append(
                float(correct)
                + (acceleration(t.stats.total_tokens, t.stats.critical_path_tokens, reward) if correct else 0.0)
            )
        rewards = torch.tensor(rewards).view(-1, GROUP)
        advantages = out["advantages"].view(-1, GROUP)
        assert torch.allclose(advantages.sum(1), torch.zeros(len(advantages)), atol=1e-5)
        assert torch.allclose(advantages, rewards - rewards.mean(1, keepdim=True), atol=1e-5)
        spread = spread or bool((rewards.std(1) > 0).any())
    assert spread, "no group had rewards that differ: the std check above proved nothing"


def test_every_trained_token_scores_as_in_its_own_request_at_step_0(tmp_path):
    """Before any update, the trainer's log-prob of each sampled token equals a separate plain forward
    over the request that sampled it, so the importance ratio against the sampler is 1."""
    path = str(embedded_models()["parallel"])
    sampler = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    engine = Recording(TransformersEngine(sampler, pad_token_id=0))
    trainer = trainer_for(tmp_path, engine=engine, max_steps=1)
    out = trainer._generate_and_score_completions([dict(row) for row in dataset(2) for _ in range(GROUP)])
    assert any(t.stats.blocks > 0 for t in trainer._trajectories)
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    trainer._tree = {key: out[key] for key in ("tree_parent", "tree_position", "tree_end")}
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, out["completion_ids"].shape[1]
        )
    trainer._tree = None

    separate = {}
    with torch.no_grad():
        for context, completion in engine.answered:
            sequence = torch.tensor([context + completion])
            scores = torch.log_softmax(sampler(sequence).logits[0].float(), -1)
            for i, token in enumerate(completion):
                separate[(context + completion[:i], token)] = scores[len(context) + i - 1, token].item()

    errors, width = [], out["prompt_ids"].shape[1]
    for b in range(len(ids)):
        pad = width - int(out["prompt_mask"][b].sum())
        row = ids[b, pad:].tolist()
        parent = list(range(-1, width - pad - 1)) + [p for p in out["tree_parent"][b].tolist()]
        for t in torch.nonzero(out["tool_mask"][b] * out["completion_mask"][b])[:, 0].tolist():
            j, path, at = width - pad + t, [], parent[width - pad + t]
            while at >= 0:
                path.append(row[at])
                at = parent[at]
            errors.append(abs(logps[b, t].item() - separate[(tuple(reversed(path)), row[j])]))
    assert len(errors) == sum(t.stats.total_tokens for t in trainer._trajectories)
    assert max(errors) < 1e-5


def test_a_step_without_signal_moves_no_weight(tmp_path):
    """After a step with a signal, two steps where every rollout earns the same reward: all
    advantages and gradients are 0, yet AdamW would move every weight on its momentum and
    weight decay. PGRPOTrainer takes no optimizer step there, so the weights stay exactly
    where step 1 left them."""
    rewarded = []

    def alike_after_step_1(completions, **kwargs) -> list[float]:
        rewarded.append(len(completions))
        return [float(i % 2) for i in range(len(completions))] if len(rewarded) == 1 else [1.0] * len(completions)

    path = str(embedded_models()["parallel"])
    trainer = PGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=[alike_after_step_1],
        args=config(tmp_path, max_steps=3, weight_decay=0.1, max_completion_length=256),
        train_dataset=dataset(8),
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    weights = []

    class AfterEachStep(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            weights.append({name: p.detach().clone() for name, p in model.named_parameters()})

    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.add_callback(AfterEachStep())
    trainer.train()
    assert len(rewarded) == 3 and len(weights) == 3
    assert all(not torch.equal(before[name], p) for name, p in weights[0].items())
    for later in weights[1:]:
        assert all(torch.equal(weights[0][name], p) for name, p in later.items())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["grad_norm"] > 0 for entry in logs] == [True, False, False]
    assert [entry[SKIPPED_METRIC] for entry in logs] == [0.0, 1.0, 1.0]


def test_the_sequential_baseline_rolls_out_plainly_and_earns_no_acceleration(tmp_path):
    trainer = trainer_for(tmp_path, branching=False, max_steps=1)
    recorder = Recorder(trainer)
    trainer.train()
    [(_, trajectories, out)] = recorder.steps
    assert all(t.stats.blocks == 0 and len(t.requests) == 1 for t in trajectories)
    assert bool((out["tool_mask"] * out["completion_mask"]).sum(1).eq(out["completion_mask"].sum(1)).all())
    [log] = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert log["rewards/acceleration/mean"] == 0.0 and log["threadweaver/parallel_activation"] == 0.0


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"scale_rewards": "group"}, "does not divide by their std"),
        ({"scale_rewards": "batch"}, "does not divide by their std"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "normalises each reward"),
        ({"mask_truncated_completions": True}, "token trie whose last token ends a branch"),
        ({"num_generations": 0}, "num_generations must be a whole number of at least 2, not 0"),  # before TRL's 1/0
        ({"max_threads": 0}, "max_threads must be a whole number of at least 1, not 0"),
        ({"temperature": -1.0}, "temperature must be between 0 and 2, not -1.0"),
    ],
)
def test_settings_that_break_p_grpo_are_refused_with_the_reason(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **setting)


def test_the_command_names_a_refused_setting_by_its_flag_before_the_model_loads(tmp_path):
    from threadweaver.trl_pgrpo import command

    def refusal(*flags) -> str:
        with pytest.raises(ValueError) as refused:
            command.main([str(tmp_path / "not-loaded"), str(tmp_path / "not-read.jsonl"), *flags])
        return str(refused.value)

    assert refusal("--num_generations", "0") == "--num-generations must be a whole number of at least 2, not 0"
    assert refusal("--prompts-per-step", "0") == "--prompts-per-step must be a whole number of at least 1, not 0"
    for flags, start in [  # TRL's flags that P-GRPO cannot honour, once named as Python's fields
        (["--mask-truncated-completions", "true"], "--mask-truncated-completions reads truncation off a row's"),
        (["--scale_rewards", "group"], "--scale-rewards is 'group': P-GRPO centres rewards"),
        (["--use-vllm", "--vllm-mode", "server"], "--vllm-mode is 'server', but PGRPOTrainer rolls out"),
    ]:
        assert refusal(*flags).startswith(start), refusal(*flags)


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"vllm_mode": "server"}, "pass engine=VLLMServerEngine"),
        ({"vllm_enable_sleep_mode": True}, "leave it off"),
        ({"vllm_tensor_parallel_size": 2}, "Use 1"),
    ],
)
def test_vllm_settings_the_rollouts_cannot_honour_are_refused_with_what_to_do(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, use_vllm=True, **setting)


def test_colocated_vllm_and_an_engine_are_not_both_taken(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(str(embedded_models()["parallel"]))
    engine = TransformersEngine(model, pad_token_id=0)
    with pytest.raises(ValueError, match="pass either it or engine="):
        trainer_for(tmp_path, engine=engine, use_vllm=True)


PROMPT_OR_MESSAGES = "PGRPOTrainer needs a 'prompt' column (a string, or a list of chat messages"
ANSWER = "an 'answer' column (the gold answer the correctness reward grades against"


@pytest.mark.parametrize(
    "train, evaluate, expected",
    [
        (
            [{"question": "A=1+2\nA=?", "solution": "3"}],
            None,
            f"train_dataset has the columns ['question', 'solution'], but {PROMPT_OR_MESSAGES}",
        ),
        (
            [{"prompt": "A=1+2\nA=?", "solution": "3"}],
            None,
            f"train_dataset has the columns ['prompt', 'solution'], but PGRPOTrainer needs {ANSWER}",
        ),
        (
            [{"prompt": "A=?", "answer": "3"}],
            {"held": [{"prompt": "B=?", "gold": "4"}]},
            f"eval_dataset['held'] has the columns ['prompt', 'gold'], but PGRPOTrainer needs {ANSWER}",
        ),
    ],
)
def test_a_dataset_without_its_columns_is_refused_before_the_model_loads(tmp_path, train, evaluate, expected):
    """The model is a directory that does not exist: a refusal that came after loading it (or
    after a rollout, where the rewards read ``answer``) would be an OSError instead."""
    with pytest.raises(ValueError) as refused:
        PGRPOTrainer(
            str(tmp_path / "not-loaded"),
            args=config(tmp_path),
            train_dataset=Dataset.from_list(train),
            eval_dataset=evaluate and {key: Dataset.from_list(rows) for key, rows in evaluate.items()},
        )
    assert expected in str(refused.value)
    assert ANSWER in str(refused.value)  # every case lacks it


def test_own_reward_functions_need_no_answer_column(tmp_path):
    path = str(embedded_models()["parallel"])
    trainer = PGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=[lambda completions, **kwargs: [0.0] * len(completions)],
        args=config(tmp_path),
        train_dataset=dataset(2).remove_columns("answer"),
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    assert trainer.train_dataset.column_names == ["prompt"]


def test_messages_rows_roll_out_their_turns_before_the_solution(tmp_path):
    """``threadweaver synth``'s rows, as ``threadweaver pgrpo`` takes them: TRL's batches carry the
    user turn as the prompt (TRL itself reads only ``prompt``: a KeyError at step 1 before)."""
    path = str(embedded_models()["parallel"])
    rows = messages_dataset(GROUP)
    trainer = PGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        args=config(tmp_path),
        train_dataset=rows,
        eval_dataset={"held": rows},
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    batch = next(iter(trainer.get_train_dataloader()))
    by_id = {row["id"]: row for row in rows}
    for row in batch:
        assert row["prompt"] == by_id[row["id"]]["messages"][:1] and row["prompt"][0]["role"] == "user"
        assert trainer.reader.prompt({"prompt": row["prompt"]}) == trainer.reader.prompt(by_id[row["id"]])
    assert trainer.eval_dataset["held"]["prompt"] == [r["messages"][:1] for r in rows]
    both = rows.add_column("prompt", ["B=?"] * len(rows))  # messages first, as every command reads a row
    assert problem_dataset(both, "train_dataset", gold=True)["prompt"] == [r["messages"][:1] for r in rows]
    bad = rows.select([0]).map(lambda row: {"messages": row["messages"][1:]})
    with pytest.raises(ValueError, match="train_dataset row 0: field 'messages' has no turn before the assistant's"):
        PGRPOTrainer(str(tmp_path / "not-loaded"), args=config(tmp_path), train_dataset=bad)


def test_paper_defaults(tmp_path):
    args = PGRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert (args.learning_rate, args.num_generations, args.epsilon, args.epsilon_high) == (1e-6, 8, 0.2, 0.28)
    assert (args.scale_rewards, args.acceleration_factor, args.acceleration_clip) == ("none", 0.5, 0.2)
    assert args.reward_config().factor == 0.5
    assert PGRPOConfig(output_dir=str(tmp_path), use_cpu=True, branching=False).reward_config().factor == 0.0
    assert args.reward_config().form == "reduction"
    ratio = PGRPOConfig(output_dir=str(tmp_path), use_cpu=True, acceleration_form="ratio", acceleration_clip=1.0)
    assert acceleration(300, 200, ratio.reward_config()) == pytest.approx(0.5 * (300 / 200 - 1))
    with pytest.raises(ValueError, match="acceleration_form"):
        PGRPOConfig(output_dir=str(tmp_path), use_cpu=True, acceleration_form="speedup")


def problems_file(path, n: int, conversational: bool = True):
    rows = make_rows(n, 3, split="pgrpo-cli")
    with open(path, "w") as f:
        for r in rows:
            prompt = [{"role": "user", "content": r["prompt"]}] if conversational else r["prompt"]
            f.write(json.dumps({"prompt": prompt, "answer": r["answer"]}) + "\n")
    return path


def test_the_command_trains_and_saves_a_plain_model_and_goes_on_from_its_checkpoint(tmp_path):
    data = problems_file(tmp_path / "problems.jsonl", 2, conversational=False)
    out = tmp_path / "out"
    flags = ["--output-dir", str(out), "--num-generations", "2", "--save-steps", "1"]
    done = run_cli(
        "pgrpo",
        str(embedded_models()["parallel"]),
        str(data),
        *flags,
        "--max-steps",
        "1",
        "--max-completion-length",
        "640",
    )
    assert f"saved model and tokenizer to {out}" in done.stdout
    [log] = [entry for entry in json.loads((out / "log_history.json").read_text()) if "loss" in entry]
    assert all(name in log for name in METRICS)
    assert json.loads((out / "config.json").read_text()).get("_attn_implementation") in (None, "sdpa")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config._attn_implementation == "sdpa"

    checkpoint = out / "checkpoint-1"
    resumed = run_cli(
        "pgrpo",
        str(embedded_models()["parallel"]),
        str(data),
        *flags,
        "--max-steps",
        "2",
        "--max-completion-length",
        "600",
        "--resume-from-checkpoint",
        str(checkpoint),
    )
    assert f"saved model and tokenizer to {out}" in resumed.stdout
    # a line of its own, led by its level and logger: it once came bare, as if pgrpo's own output
    assert (
        f"\nWARNING threadweaver.hf_collator.sft: going on from {checkpoint} with --max-completion-length 600, where "
        "it had --max-completion-length 640: the Trainer takes them as they are"
    ) in resumed.stderr, resumed.stderr


def test_the_command_rolls_out_on_a_colocated_vllm(tmp_path):
    data = problems_file(tmp_path / "problems.jsonl", 2)
    out = tmp_path / "out"
    done = run_cli(
        "pgrpo",
        str(embedded_models()["parallel"]),
        str(data),
        "--output-dir",
        str(out),
        "--use-vllm",
        "--max-steps",
        "1",
        "--num-generations",
        "2",
        "--max-completion-length",
        "640",
    )
    assert f"saved model and tokenizer to {out}" in done.stdout
    [log] = [entry for entry in json.loads((out / "log_history.json").read_text()) if "loss" in entry]
    assert all(name in log for name in METRICS) and "sampling/importance_sampling_ratio/mean" in log


def test_the_command_names_a_row_without_an_answer(tmp_path):
    data = tmp_path / "problems.jsonl"
    data.write_text(json.dumps({"prompt": "A=1+2\nA=?", "answer": "3"}) + "\n" + json.dumps({"prompt": "B=?"}) + "\n")
    done = run_cli(
        "pgrpo", str(embedded_models()["parallel"]), str(data), "--output-dir", str(tmp_path / "out"), check=False
    )
    assert done.returncode != 0
    assert f"threadweaver pgrpo: {data}: line 2: no 'answer' field" in done.stderr
    assert done.stderr.count("TRL currently supports vLLM versions") <= 1, done.stderr  # it said so five times


def test_example_script_trains_with_pgrpotrainer(tmp_path):
    data = problems_file(tmp_path / "problems.jsonl", 2)
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "pgrpo_trl.py")
    subprocess.run(
        [sys.executable, example, str(embedded_models()["parallel"]), str(data), "--output-dir", str(tmp_path / "out")]
        + ["--max-steps", "1"],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    assert (tmp_path / "out" / "model.safetensors").exists()
    usage = subprocess.run([sys.executable, example, "--help"], check=True, capture_output=True, text=True).stdout
    assert "--max-steps" in usage and "model_dir" in usage
