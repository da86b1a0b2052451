"""Memory/communication estimates checked by hand, and the plan for the 13B-on-8x32GB seed example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mindfoundry.cli.main import main
from mindfoundry.config.load import load_config
from mindfoundry.config.memory_config import MemoryConfig
from mindfoundry.config.parallel_config import Layout
from mindfoundry.model.spec import ModelSpec, num_parameters
from mindfoundry.parallel.planner import (
    GiB,
    activation_bytes_per_layer,
    communication,
    estimate,
    memory_options,
    micro_batches_in_flight,
    parse_bytes,
    pipeline_bubble,
    plan,
    selective_savings_per_layer,
    stage_parameters,
)

REPO = Path(__file__).resolve().parents[2]
LLAMA_13B = REPO / "configs" / "llama-13b.yaml"

# vocab 100, d 8, 2 layers, 2 heads (head_dim 4), ffn 16, untied: per layer 2*8 (norms) + 4*8*8 (q,k,v,o) + 3*8*16 =
# 656,
# embedding 800 + head 800 + final norm 8: 2920 parameters.
TINY = ModelSpec(vocab_size=100, d_model=8, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=16, max_seq_len=16,
                 rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False, init_std=0.02)


def est(layout: Layout = Layout(), precision: str = "fp32", recompute: str = "none", **kw):
    return estimate(TINY, layout, 1, 4, precision, recompute, fixed_overhead_bytes=0, **kw)


def test_tiny_parameter_count() -> None:
    assert num_parameters(TINY) == 2920 == stage_parameters(TINY, Layout(), 0)


def test_model_states_by_hand() -> None:
    e = est()  # fp32: 4 B weights, 4 B grads, 8 B AdamW moments
    assert (e.weights, e.gradients, e.optimizer, e.fsdp_buffers) == (2920 * 4, 2920 * 4, 2920 * 8, 0)
    e = est(precision="bf16")  # 2 B weights, 2 B grads, 12 B fp32 master + moments
    assert (e.weights, e.gradients, e.optimizer) == (5840, 5840, 35040)
    e = est(
        Layout(dp_shard=2)
    )  # FSDP: everything halved, plus gather buffers of the largest unit (the 800-entry embedding)
    assert (e.weights, e.gradients, e.optimizer, e.fsdp_buffers) == (5840, 5840, 11680, 3 * 800 * 4)
    e = est(Layout(dp_replicate=2, optimizer_shard=True))  # ZeRO-1: only the optimizer state halved
    assert (e.weights, e.gradients, e.optimizer) == (11680, 11680, 11680)
    e = est(Layout(dp_replicate=2))  # DDP: nothing sharded
    assert e.model_states == 2920 * 16


def test_tensor_and_pipeline_split_parameters() -> None:
    # tp=2: matrices halved, norms replicated: per layer 16 + 640/2 = 336; embedding and head 400 each; final norm 8
    assert stage_parameters(TINY, Layout(tp=2), 0) == 2 * 336 + 400 + 8 + 400
    # pp=2: stage 0 = one layer + embedding, stage 1 = one layer + final norm + head
    assert stage_parameters(TINY, Layout(pp=2), 0) == 656 + 800
    assert stage_parameters(TINY, Layout(pp=2), 1) == 656 + 8 + 800
    tied = ModelSpec(**{**TINY.to_dict(), "tie_embeddings": True})
    assert stage_parameters(tied, Layout(), 0) == 2920 - 800  # one shared matrix
    assert stage_parameters(tied, Layout(pp=2), 1) == 656 + 8 + 800  # the last stage keeps its own copy


def test_activations_by_hand() -> None:
    # per token, fp32: 4*(4h + 2h + 2h + 4f) = 4*(32+16+16+64) = 512 bytes, + 4*a = 8 bytes of log-sum-exp (flash)
    assert activation_bytes_per_layer(TINY, Layout(), 1, 4, "fp32") == 4 * 520
    # without flash attention the softmax output a*s per token is kept: 4*2*4 = 32 bytes instead of 8
    assert activation_bytes_per_layer(TINY, Layout(), 1, 4, "fp32", flash_attention=False) == 4 * 544
    # the eager (unfused) RMSNorm keeps one more h-sized tensor per norm: +2h elements
    assert activation_bytes_per_layer(TINY, Layout(), 1, 4, "fp32", fused_norm=False) == 4 * (520 + 4 * 16)
    e = est()  # 2 layers + logits s*b*V*(4 + 8) = 4*100*12
    assert e.activations == 2 * 2080 + 4800
    e = est(
        recompute="full"
    )  # kept: each layer's input s*b*h*4 = 128 bytes; then the larger of the logits term (in the
    assert e.activations == 2 * 128 + max(2080, 4800)  # loss's backward) and one block recomputed (later)
    assert e.logits == 4800


def test_memory_modes_by_hand() -> None:
    # selective drops per token the SiLU output f = 16 and the flash log-sum-exp 4*a = 8 bytes (kv heads = heads: no
    # expanded copies): 4*16 + 8 = 72 bytes per token, 4 tokens
    assert selective_savings_per_layer(TINY, Layout(), 1, 4, "fp32") == 288
    assert est(recompute="selective").activations == 2 * (2080 - 288) + 4800
    gqa = ModelSpec(**{**TINY.to_dict(), "n_kv_heads": 1})  # keys and values expanded from 4 to 8 elements: 2*4 more
    assert selective_savings_per_layer(gqa, Layout(), 1, 4, "fp32") == 288 + 4 * 4 * 2 * 4
    # recompute of the first block only: one block kept whole, one block's input, the larger working set
    assert est(recompute="full", recomputed_layers=1).activations == 2080 + 128 + max(2080, 4800)
    # loss in chunks of 1 position: one chunk's logits, 1*100*12 bytes
    chunked = est(loss_chunk=1)
    assert (chunked.logits, chunked.activations) == (1200, 2 * 2080 + 1200)
    assert est(loss_chunk=64).logits == 4800  # a chunk longer than the sequence is the whole sequence
    # offload: two blocks' kept activations on the device (the one computing and the one in transfer)
    assert est(offload=True).activations == 2 * 2080 + 4800
    assert est(recompute="full", offload=True, loss_chunk=1).activations == 2 * 128 + 2080
    big = ModelSpec(**{**TINY.to_dict(), "n_layers": 8})
    assert estimate(big, Layout(), 1, 4, "fp32", offload=True, fixed_overhead_bytes=0).activations == 2 * 2080 + 4800


def test_memory_options_of_a_run_config() -> None:
    memory = MemoryConfig(recompute="selective", recompute_layers=[0, 3], loss_chunk=2)
    assert memory_options(memory, 4) == {
        "recompute": "selective",
        "recomputed_layers": 2,
        "loss_chunk": 2,
        "offload": False,
    }
    assert memory_options(MemoryConfig(), 4)["recomputed_layers"] is None


def test_korthikanti_scaling_with_tp_and_sequence_parallel() -> None:
    big = ModelSpec(**{**TINY.to_dict(), "d_model": 64, "n_heads": 8, "n_kv_heads": 8, "ffn_dim": 128})
    full = activation_bytes_per_layer(big, Layout(), 2, 32, "bf16", flash_attention=False)
    # with sequence parallelism everything is divided by t (Korthikanti et al. 2022, table 2)
    assert activation_bytes_per_layer(big, Layout(tp=4), 2, 32, "bf16", flash_attention=False) * 4 == full
    # without it the norm inputs and the inputs of the first linear layers (4h per token) stay whole
    no_sp = activation_bytes_per_layer(big, Layout(tp=4, sequence_parallel=False), 2, 32, "bf16", flash_attention=False)
    assert no_sp == full // 4 + 2 * 32 * 2 * (4 * 64) * 3 // 4
    # the paper's GPT formula s*b*h*(34 + 5*a*s/h) less dropout (2 sbh + 3 a s^2 b) is what this counting gives for a
    # block whose MLP keeps 2 tensors of 4h (GeLU) instead of SwiGLU's 4 tensors of f: check with f = 2h (4f = 8h =
    # 2*4h)
    gpt_like = ModelSpec(**{**big.to_dict(), "ffn_dim": 2 * 64})
    s, b, h, a = 32, 2, 64, 8
    assert activation_bytes_per_layer(gpt_like, Layout(), b, s, "fp16", flash_attention=False) == \
        s * b * h * 34 + 5 * a * s * s * b - (2 * s * b * h + 3 * a * s * s * b)


def test_pipeline_in_flight_micro_batches() -> None:
    assert micro_batches_in_flight(Layout(pp=4), 16) == 4
    assert micro_batches_in_flight(Layout(pp=4), 2) == 2
    assert micro_batches_in_flight(Layout(pp=4, pp_schedule="GPipe"), 16) == 16
    assert micro_batches_in_flight(Layout(pp=4, pp_schedule="Interleaved1F1B", pp_virtual_stages=2), 16) == 4 * (
        1 + 3 / 8
    )
    assert micro_batches_in_flight(Layout(), 16) == 1
    assert pipeline_bubble(Layout(pp=4), 12) == 3 / 15
    assert pipeline_bubble(Layout(pp=4, pp_schedule="Interleaved1F1B", pp_virtual_stages=2), 12) == 3 / 27


def test_context_parallel_divides_the_sequence() -> None:
    one = activation_bytes_per_layer(TINY, Layout(), 1, 8, "fp32")
    two = activation_bytes_per_layer(TINY, Layout(cp=2), 1, 8, "fp32")
    # local tokens halve; the gathered keys and values (2h per token) cover the whole sequence
    assert two == one // 2 + 4 * 4 * 2 * 8


def test_communication_by_hand() -> None:
    # DDP over 2: one all-reduce of 2920 fp32 gradients, 2*(1/2)*11680 bytes sent
    assert communication(TINY, Layout(dp_replicate=2), 1, 4, 3, "fp32").dp_allreduce == 11680
    # FSDP over 2, 3 micro-batches: weights gathered twice + gradients scattered once, each (1/2)*11680, per micro-batch
    assert communication(TINY, Layout(dp_shard=2), 1, 4, 3, "fp32").fsdp == 3 * 3 * 5840
    # TP over 2: per layer 8*(1/2)*A and 4*(1/2)*A for embedding+head, A = s*b*h*4 = 128 bytes, per micro-batch
    assert communication(TINY, Layout(tp=2), 1, 4, 3, "fp32").tp == 3 * (8 * 2 + 4) * 64
    # full recompute repeats the forward's half of the per-layer collectives; selective recomputes no projection
    assert communication(TINY, Layout(tp=2), 1, 4, 3, "fp32", "full").tp == 3 * (8 * 2 * 1.5 + 4) * 64
    assert communication(TINY, Layout(tp=2), 1, 4, 3, "fp32", "selective").tp == 3 * (8 * 2 + 4) * 64
    # CP: K and V (2*s*b*kv_dim*4 = 256 bytes per layer) gathered forward and scattered backward, over 2 ranks;
    # both recompute modes run the attention core again, gathering them once more
    assert communication(TINY, Layout(cp=2), 1, 4, 3, "fp32").cp == 2 * 0.5 * 256 * 2 * 3
    assert communication(TINY, Layout(cp=2), 1, 4, 3, "fp32", "selective").cp == 2.5 * 0.5 * 256 * 2 * 3
    # PP over 2: activation forward + gradient back per micro-batch
    assert communication(TINY, Layout(pp=2), 1, 4, 3, "fp32").pp == 3 * 2 * 128
    c = communication(TINY, Layout(dp_shard=2, tp=2), 1, 4, 3, "fp32")
    assert c.total == c.fsdp + c.tp and c.dp_allreduce == c.pp == c.cp == c.ep == 0


def test_parse_bytes() -> None:
    assert parse_bytes("32GiB") == 32 * GiB == parse_bytes("32G")
    assert parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("512 MiB") == 512 * 1024**2
    with pytest.raises(ValueError, match="is not a memory size"):
        parse_bytes("lots")


# --- the seed example: Llama-2-13B on 8 x 32 GB, bf16, seq 4096, 256 sequences (1M tokens) per step ---------------

@pytest.fixture(scope="module")
def plan_13b():
    spec = ModelSpec.from_config(load_config(LLAMA_13B).model)
    return spec, plan(spec, devices=8, device_memory=32 * GiB, seq=4096, global_batch=256, precision="bf16")


def test_13b_pure_data_parallel_does_not_fit(plan_13b) -> None:
    spec, rows = plan_13b
    pure = next(r for r in rows if r.layout == Layout(dp_replicate=8))
    assert pure.fits == "no"
    assert pure.memory.total > 32 * GiB and pure.memory_recompute.total > 32 * GiB
    assert pure.memory.model_states == num_parameters(spec) * 16  # 2 + 2 + 12 bytes per parameter, nothing sharded
    assert pure.memory.model_states > 190 * GiB


def test_13b_top_layout_fits_with_model_parallelism_or_sharding(plan_13b) -> None:
    _, rows = plan_13b
    top = rows[0]
    assert top.fits != "no" and top.chosen_memory.total <= 32 * GiB
    lay = top.layout
    assert lay.tp > 1 or lay.pp > 1 or lay.cp > 1 or lay.dp_shard > 1 or lay.optimizer_shard
    assert [r.sort_key() for r in rows] == sorted(r.sort_key() for r in rows)
    assert all(r.layout.world_size == 8 and r.grad_accum * r.layout.dp == 256 for r in rows)


def test_plan_cli_json(capsys) -> None:
    rc = main(["plan", "--model", str(LLAMA_13B), "--devices", "8", "--device-memory", "32GiB", "--seq", "4096",
               "--global-batch", "256", "--precision", "bf16", "--top", "5", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 5 and out["rows"][0]["fits"] != "no" and out["fitting"] >= 1
    assert (
        out["rows"][0]["memory"]["total"]
        == out["rows"][0]["memory"]["weights"]
        + out["rows"][0]["memory"]["gradients"]
        + out["rows"][0]["memory"]["optimizer"]
        + out["rows"][0]["memory"]["fsdp_buffers"]
        + out["rows"][0]["memory"]["activations"]
        + out["rows"][0]["memory"]["overhead"]
    )


def test_plan_cli_table_and_errors(capsys) -> None:
    args = [
        "plan",
        "--model",
        str(LLAMA_13B),
        "--devices",
        "8",
        "--seq",
        "4096",
        "--global-batch",
        "256",
        "--precision",
        "bf16",
    ]
    assert main([*args, "--device-memory", "32GiB"]) == 0
    captured = capsys.readouterr()
    assert "weights+grads+optim" in captured.out and "best:" in captured.err
    assert main([*args, "--device-memory", "8GiB"]) == 1  # nothing fits
    assert "no layout fits in 8.0 GiB per device" in capsys.readouterr().err
    assert main([*args, "--device-memory", "lots"]) == 2
    assert "'lots' is not a memory size" in capsys.readouterr().err
    assert main(["plan", "--model", str(LLAMA_13B), "--devices", "8", "--device-memory", "32GiB", "--seq", "8192"]) == 2
    assert "--seq 8192 exceeds model.max_seq_len=4096" in capsys.readouterr().err
