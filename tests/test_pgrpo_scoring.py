"""P-GRPO's scoring: each trie token's log-prob from its parent's logits, a chunk at a time,
equals the float32 log-softmax of the gathered parent logits, in value and in gradient."""

import pytest
import torch

from threadweaver.trl_pgrpo.scoring import parent_logps


def gathered(logits, parents, tokens, temperature):
    """The straightforward way: copy each token's parent row of logits, then a log-softmax."""
    rows = logits.gather(1, parents[:, :, None].expand(-1, -1, logits.shape[-1]))
    scores = torch.log_softmax(rows / temperature, -1)
    return scores.gather(-1, tokens[:, :, None])[..., 0], -(scores.exp() * scores).sum(-1)


def trie_parents(batch: int, kept: int, completion: int, generator) -> torch.Tensor:
    """Parents as a trie batch has them: mostly the position before, forks back to earlier positions,
    and padding that is its own parent (at the end of some rows)."""
    offset = kept - completion  # the first completion token's parent is the last prompt position
    parents = torch.arange(completion).repeat(batch, 1) + offset - 1
    forks = torch.rand(batch, completion, generator=generator) < 0.2
    earlier = (torch.rand(batch, completion, generator=generator) * (parents - offset + 2)).long() + offset - 1
    parents = torch.where(forks, earlier.clamp(min=offset - 1), parents)
    parents[0, completion - 3 :] = torch.arange(completion - 3, completion) + offset  # padding
    return parents


@pytest.mark.parametrize(
    ("dtype", "temperature", "chunk", "grad_rtol"),
    [(torch.float32, 1.0, 7, 1e-5), (torch.float32, 0.7, 1024, 1e-5), (torch.bfloat16, 0.9, 5, 2**-8)],
    ids=["float32, chunks cut rows", "temperature, one chunk", "bf16 logits"],
)
def test_chunked_parent_log_probs_equal_the_gathered_log_softmax(dtype, temperature, chunk, grad_rtol):
    """Against the gathered log-softmax in float64: the values (computed in float32) to float32's
    rounding, the gradients (through the log-probs and the entropies) to that of the logits' dtype."""
    g = torch.Generator().manual_seed(0)
    batch, kept, completion, vocab = 3, 20, 17, 50
    logits = (torch.randn(batch, kept, vocab, generator=g) * 3).to(dtype).requires_grad_()
    parents = trie_parents(batch, kept, completion, g)
    tokens = torch.randint(vocab, (batch, completion), generator=g)
    weights = torch.randn(batch, completion, generator=g)
    entropy_weights = torch.randn(batch, completion, generator=g)  # TRL's entropy bonus trains the entropy too

    logps, entropy = parent_logps(logits, parents, tokens, temperature, entropy=True, chunk=chunk)
    ((logps * weights).sum() + (entropy * entropy_weights).sum()).backward()
    exact = logits.detach().double().requires_grad_()
    expected, expected_entropy = gathered(exact, parents, tokens, temperature)
    ((expected * weights.double()).sum() + (expected_entropy * entropy_weights.double()).sum()).backward()

    assert logps.dtype == torch.float32 and logps.shape == (batch, completion)
    assert torch.allclose(logps.double(), expected, atol=1e-5)
    assert torch.allclose(entropy.double(), expected_entropy, atol=1e-5)
    assert torch.allclose(logits.grad.double(), exact.grad, rtol=grad_rtol, atol=2e-5)
    assert (parents[:, 1:] != parents[:, :-1] + 1).any(), "no fork: the gather was never tested"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks every tensor stays on the logits' device")
def test_on_a_gpu_every_tensor_stays_on_the_logits_device():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 9, 30, generator=g).to("cuda", torch.bfloat16).requires_grad_()
    parents = trie_parents(2, 9, 8, g).cuda()
    tokens = torch.randint(30, (2, 8), generator=g).cuda()
    logps, entropy = parent_logps(logits, parents, tokens, 0.8, entropy=True, chunk=4)
    logps.sum().backward()
    expected, expected_entropy = gathered(logits.detach().double(), parents, tokens, 0.8)
    assert torch.allclose(logps.double(), expected, atol=1e-5)
    assert torch.allclose(entropy.double(), expected_entropy, atol=1e-5)
    assert logits.grad.device == logits.device


@pytest.mark.parametrize("used", ["log-probs", "entropies"])
def test_a_loss_of_one_output_alone_gets_its_gradient(used):
    """The other output gets no gradient (None reaches the backward), as when TRL's loss has no entropy bonus."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 11, generator=g).requires_grad_()
    parents, tokens = torch.tensor([[0, 1, 1, 3], [0, 0, 2, 4]]), torch.randint(11, (2, 4), generator=g)
    logps, entropy = parent_logps(logits, parents, tokens, 0.8, entropy=True, chunk=5)
    (logps if used == "log-probs" else entropy).sum().backward()
    exact = logits.detach().double().requires_grad_()
    expected = gathered(exact, parents, tokens, 0.8)[0 if used == "log-probs" else 1]
    expected.sum().backward()
    assert torch.allclose(logits.grad.double(), exact.grad, atol=1e-6)


def test_a_parent_outside_the_kept_positions_is_an_error_not_another_rows_logits():
    with pytest.raises(IndexError, match="row 1, token 2: parent -1 is outside the 4 positions"):
        parent_logps(torch.randn(2, 4, 5), torch.tensor([[0, 1, 2], [0, 1, -1]]), torch.zeros(2, 3, dtype=torch.long))


def test_without_entropy_none_is_computed():
    logits = torch.randn(1, 4, 6)
    logps, entropy = parent_logps(logits, torch.tensor([[0, 1, 1]]), torch.tensor([[2, 3, 4]]))
    assert entropy is None
    assert torch.allclose(logps[0, 2], torch.log_softmax(logits[0, 1], -1)[4])
