"""The training workload's decoder against independent computations: shapes, causality, grouped-query
attention against a naive repeat-the-kv-heads attention, tied weights, deterministic init, the
planner's parameter counts, bf16 autocast, and a short in-process training run on the synthetic
corpus whose loss must fall far below the uniform ln(vocab). CPU, no process groups."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from distval.plan import presets
from distval.train.data import PAD_ID, TEXT_VOCAB_SIZE, DataConfig, ShardedLoader, load_data
from distval.train.model import apply_rope, build_model, count_params, rope_cos_sin

TINY = presets.model("tiny")
# GPT-2's architecture (LayerNorm, GELU, biases, learned positions) at test size.
MINI_GPT2 = dataclasses.replace(presets.model("gpt2"), name="mini-gpt2", num_layers=2, hidden_size=48, num_heads=4,
                                num_kv_heads=4, seq_len=32, vocab_size=300, ffn_hidden_size=192, max_positions=32)


def tokens(batch=3, seq=TINY.seq_len, vocab=TINY.vocab_size, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_language_model_shapes_and_initial_loss():
    model = build_model(TINY)
    x = tokens()
    assert model(x).shape == (3, TINY.seq_len, TINY.vocab_size)
    assert len(model.blocks) == TINY.num_layers and isinstance(model.blocks, torch.nn.ModuleList)
    loss = model.loss({"tokens": x})
    assert loss.dim() == 0
    # small init: predictions are close to uniform
    assert abs(loss.item() - math.log(TINY.vocab_size)) < 0.1


def test_loss_is_cross_entropy_of_the_shifted_tokens():
    model = build_model(TINY)
    x = tokens()
    logits = model(x)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, TINY.vocab_size), x[:, 1:].reshape(-1))
    torch.testing.assert_close(model.loss({"tokens": x}), expected)


def test_attention_is_causal():
    model = build_model(TINY)
    x = tokens(batch=1)
    y = x.clone()
    y[0, 40] = (y[0, 40] + 1) % TINY.vocab_size
    before, after = model(x), model(y)
    torch.testing.assert_close(before[:, :40], after[:, :40])
    assert not torch.allclose(before[:, 40:], after[:, 40:])


def test_grouped_query_attention_equals_naive_attention_with_repeated_kv_heads():
    assert TINY.num_kv_heads < TINY.num_heads
    attn = build_model(TINY).blocks[0].attn
    assert attn.k_proj.out_features == attn.v_proj.out_features == TINY.num_kv_heads * TINY.head_dim
    x = torch.randn(2, 16, TINY.hidden_size, generator=torch.Generator().manual_seed(1))
    b, t, h, d = 2, 16, TINY.num_heads, TINY.head_dim
    q = attn.q_proj(x).view(b, t, h, d).transpose(1, 2)
    k = attn.k_proj(x).view(b, t, TINY.num_kv_heads, d).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, TINY.num_kv_heads, d).transpose(1, 2)
    cos, sin = rope_cos_sin(t, d, x.device)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    group = h // TINY.num_kv_heads  # query head i uses kv head i // group
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    naive = attn.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h * d))
    torch.testing.assert_close(attn(x), naive, rtol=1e-5, atol=1e-6)


def test_rope_rotates_by_position_and_keeps_norms():
    cos, sin = rope_cos_sin(8, 16, torch.device("cpu"))
    x = torch.randn(1, 1, 8, 16, generator=torch.Generator().manual_seed(2))
    rotated = apply_rope(x, cos, sin)
    torch.testing.assert_close(rotated[..., 0, :], x[..., 0, :])  # position 0: no rotation
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))


def test_tied_embedding_is_the_output_projection():
    model = build_model(TINY)
    assert model.lm_head is None
    x = tokens(batch=1)
    torch.testing.assert_close(model(x), model.hidden_states(x) @ model.tok_emb.weight.T)
    # a token no input uses still gets an embedding gradient: through the output projection
    x = x.masked_fill(x == 7, 8)
    model.loss({"tokens": x}).backward()
    assert model.tok_emb.weight.grad[7].abs().sum() > 0


def test_untied_embedding_has_its_own_head():
    spec = dataclasses.replace(TINY, tied_embeddings=False)
    model = build_model(spec)
    assert model.lm_head is not None and model.lm_head.weight is not model.tok_emb.weight
    assert not torch.equal(model.lm_head.weight, model.tok_emb.weight)
    assert count_params(model) == spec.num_params() == TINY.num_params() + TINY.vocab_size * TINY.hidden_size
    assert count_params(model, non_embedding=True) == spec.flop_params()


def test_init_is_deterministic_and_ignores_the_global_rng():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = build_model(TINY, seed=5)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn from the global generator
    torch.manual_seed(999)
    b = build_model(TINY, seed=5)
    c = build_model(TINY, seed=6)
    for (name, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb), name
        if pa.dim() == 2:
            assert not torch.equal(pa, pc), name
    assert (a.blocks[0].attn_norm.weight == 1).all()
    # residual projections start smaller (GPT-2 scaling by 1/sqrt(2·layers))
    assert a.blocks[0].attn.o_proj.weight.std() < a.blocks[0].attn.q_proj.weight.std()


@pytest.mark.parametrize("name", ["tiny", "small", "gpt2", "gpt2-medium", "smollm2-135m", "smollm2-360m", "llama-7b"])
def test_parameter_count_matches_the_planner(name):
    spec = presets.model(name)
    model = build_model(spec, device="meta")  # shapes only: no memory, no init
    assert count_params(model) == spec.num_params()
    assert count_params(model, non_embedding=True) == spec.flop_params()


def test_parameter_count_of_built_models_matches_the_planner():
    for spec in (TINY, presets.model("small"), MINI_GPT2):
        assert count_params(build_model(spec)) == spec.num_params()


def test_gpt2_architecture_builds_and_runs():
    model = build_model(MINI_GPT2)
    assert model.pos_emb is not None and model.blocks[0].attn.q_proj.bias is not None
    assert model.blocks[0].mlp_norm.bias is not None and model.blocks[0].mlp.kind == "gelu"
    x = tokens(batch=2, seq=32, vocab=300)
    assert model(x).shape == (2, 32, 300)
    # learned positions: the same token at two positions gets different logits
    same = torch.full((1, 4), 5)
    out = model(same)
    assert not torch.allclose(out[0, 0], out[0, 3])
    with pytest.raises(ValueError, match="positions"):
        model(tokens(batch=1, seq=33, vocab=300))


def test_bf16_autocast_forward_and_backward():
    model = build_model(TINY)
    x = tokens()
    reference = model.loss({"tokens": x}).item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = model.loss({"tokens": x})
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert abs(loss.item() - reference) < 0.05
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def test_sequence_classifier_heads():
    spec = dataclasses.replace(TINY, vocab_size=TEXT_VOCAB_SIZE)
    model = build_model(spec, num_classes=5)
    x = tokens(vocab=TEXT_VOCAB_SIZE)
    labels = torch.tensor([0, 3, 4])
    assert model(x).shape == (3, 5) and model.lm_head is None
    torch.testing.assert_close(model(x), model.classifier(model.hidden_states(x)[:, -1]))
    assert abs(model.loss({"tokens": x, "labels": labels}).item() - math.log(5)) < 0.1
    assert count_params(model) == spec.num_params() + 5 * spec.hidden_size
    # every parameter gets a gradient (DDP and hook strategies need no unused parameters)
    model.loss({"tokens": x, "labels": labels}).backward()
    assert all(p.grad is not None for p in model.parameters())
    # mean pooling leaves the padding out
    mean = build_model(spec, num_classes=5, pooling="mean", pad_id=PAD_ID)
    padded = x.clone()
    padded[:, :10] = PAD_ID
    keep = (padded != PAD_ID).unsqueeze(-1).float()
    pooled = (mean.hidden_states(padded) * keep).sum(1) / keep.sum(1)
    torch.testing.assert_close(mean(padded), mean.classifier(pooled))
    with pytest.raises(ValueError, match="pad_id"):
        build_model(spec, num_classes=5, pooling="mean")
    with pytest.raises(ValueError, match="labels"):
        model.loss({"tokens": x})


def test_synthetic_loss_falls_far_below_uniform():
    data = load_data(DataConfig(num_samples=2048), TINY.seq_len, TINY.vocab_size, seed=0)
    model = build_model(TINY, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = ShardedLoader(data, global_batch=16, micro_batch=16, seed=0)
    losses = []
    for _ in range(100):
        batch = next(loader)
        loss = model.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    uniform = math.log(TINY.vocab_size)
    final = sum(losses[-5:]) / 5
    assert abs(losses[0] - uniform) < 0.1
    assert final < 0.4 * uniform, losses[::10]
    assert final < data.loss_floor + 0.6  # close to the best any model can do
