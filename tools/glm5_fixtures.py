#!/usr/bin/env python3
"""glm5_fixtures.py: builds the tiny glm_moe_dsa reference fixtures under tests/fixtures/glm5/<name>/.

Each fixture is a random GlmMoeDsaForCausalLM made with transformers (the oracle) and saved as a Hugging Face
directory (config.json + model.safetensors), plus
  input_ids.json   [B][S] token ids (equal-length rows)
  logits.npy       float32 [B, S, V] eager fp32 logits of the model as saved (bf16 weights are rounded first)
  generate.json    {"prompt": [...], "max_new_tokens": N, "tokens": [...]} from greedy model.generate
  grads.json       autograd gradients of L = sum_t w_t log p(target_t) over input_ids (targets: next token of
                   each row, -1 at the row end): per parameter its L2 norm and 8 sampled entries (flat index
                   i * numel // 8); indexer weights have none (transformers runs the indexer under no_grad)
The script retries seeds until every hard decision the model makes (indexer top-k boundaries, expert choice and
group choice, greedy argmax) has a clear margin, so that float rounding in another implementation cannot flip
them; the tests then compare logits with max relative error < 1e-4 and require identical greedy tokens.

Usage: python3 tools/glm5_fixtures.py [OUT_DIR]   (default tests/fixtures/glm5 next to this script's repo)
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as M

MARGIN = 2e-4  # minimum gap between the last chosen and the first rejected candidate of every top-k


def tiny_config(**over):
    base = dict(vocab_size=128, hidden_size=32, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=3,
                num_attention_heads=2, num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=2,
                q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                index_topk=4, index_head_dim=16, index_n_heads=4, first_k_dense_replace=1,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=256,
                attn_implementation="eager")
    base.update(over)
    return GlmMoeDsaConfig(**base)


FIXTURES = {
    # GLM-5.1 style: every layer runs its own indexer; index_topk 4 < sequence length 12.
    "glm5.1-tiny": dict(config=dict(), dtype="float32", fused=False),
    # GLM-5.2 style IndexShare: freq 2, offset 2 over 4 layers -> full, full, shared, full; float16 weights.
    "glm5.2-tiny": dict(config=dict(num_hidden_layers=4, index_topk_freq=2, index_skip_topk_offset=2,
                                    first_k_dense_replace=2, rope_parameters={"rope_type": "default",
                                                                               "rope_theta": 8000000.0}),
                        dtype="float16", fused=False),
    # Group-limited routing (4 groups of 4, keep 2), norm_topk_prob false, YaRN rope with mscale (DeepSeek-V3.2
    # style attention scaling), bf16 weights, fused 3-D expert keys.
    "glm5-groups-bf16": dict(config=dict(n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2,
                                         norm_topk_prob=False, routed_scaling_factor=1.5, n_shared_experts=2,
                                         index_topk=5, index_topk_pattern="FSF",
                                         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                          "original_max_position_embeddings": 64, "mscale": 0.8,
                                                          "mscale_all_dim": 1.0}),
                             dtype="bfloat16", fused=True),
}


def randomize(model, gen):
    """Weights large enough that decisions are well separated (HF's init std 0.02 makes near-ties)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm weights and the k_norm bias
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def gap_after(values, k):
    """Smallest gap between the k-th and (k+1)-th largest entry of each row (inf when there is no (k+1)-th)."""
    if values.shape[-1] <= k:
        return float("inf")
    top = values.topk(k + 1, dim=-1).values
    gap = top[..., k - 1] - top[..., k]
    gap = gap[torch.isfinite(gap)]
    return gap.min().item() if gap.numel() else float("inf")


class MarginProbe:
    """Patches the indexer and router to record how close each top-k decision was."""

    def __init__(self):
        self.worst = float("inf")
        self.orig_indexer = M.GlmMoeDsaIndexer.forward
        self.orig_router = M.GlmMoeDsaTopkRouter.forward

    def __enter__(self):
        probe = self

        def indexer_forward(mod, hidden_states, q_resid, position_embeddings, attention_mask, position_ids,
                            cache=None):
            out = probe.orig_indexer(mod, hidden_states, q_resid, position_embeddings, attention_mask,
                                     position_ids, cache=cache)
            if cache is None:  # recompute the scores the same way and check the k-th / (k+1)-th gap per row
                b, s, _ = hidden_states.shape
                cos, sin = position_embeddings
                q = mod.wq_b(q_resid).view(b, s, mod.n_heads, mod.head_dim)
                q_rot, q_pass = torch.split(q, [mod.qk_rope_head_dim, mod.head_dim - mod.qk_rope_head_dim], -1)
                k = mod.k_norm(mod.wk(hidden_states)).unsqueeze(2)
                k_rot, k_pass = torch.split(k, [mod.qk_rope_head_dim, mod.head_dim - mod.qk_rope_head_dim], -1)
                q_rot, k_rot = M.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
                q = torch.cat([q_rot, q_pass], -1)
                k = torch.cat([k_rot, k_pass], -1).squeeze(2)
                scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * mod.softmax_scale)
                w = mod.weights_proj(hidden_states).float() * mod.n_heads ** -0.5
                idx = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)
                causal = torch.ones(s, s, dtype=torch.bool).tril()
                idx = idx.masked_fill(~causal, float("-inf"))
                scale = idx[torch.isfinite(idx)].abs().max().item()
                probe.worst = min(probe.worst, gap_after(idx, mod.index_topk) / scale)
            return out

        def router_forward(mod, hidden_states):
            logits, w, idx = probe.orig_router(mod, hidden_states)
            s = logits.sigmoid() + mod.e_score_correction_bias
            g = s.view(-1, mod.num_group, mod.num_experts // mod.num_group)
            if mod.num_group > 1:
                probe.worst = min(probe.worst, gap_after(g.topk(2, -1).values.sum(-1), mod.topk_group))
            keep = torch.zeros(s.shape[0], mod.num_group, dtype=torch.bool)
            keep.scatter_(1, g.topk(2, -1).values.sum(-1).topk(mod.topk_group, -1).indices, True)
            masked = s.masked_fill(~keep.repeat_interleave(mod.num_experts // mod.num_group, 1), float("-inf"))
            probe.worst = min(probe.worst, gap_after(masked, mod.top_k))
            return logits, w, idx

        M.GlmMoeDsaIndexer.forward = indexer_forward
        M.GlmMoeDsaTopkRouter.forward = router_forward
        return self

    def __exit__(self, *exc):
        M.GlmMoeDsaIndexer.forward = self.orig_indexer
        M.GlmMoeDsaTopkRouter.forward = self.orig_router


def fuse_experts(path):
    """Rewrites per-expert keys as the fused 3-D tensors transformers uses in memory (gate_up_proj, down_proj)."""
    sd = load_file(path)
    out, experts = {}, {}
    for key, t in sd.items():
        if ".mlp.experts." in key:
            prefix, rest = key.split(".mlp.experts.")
            e, proj = rest.split(".")[:2]
            experts.setdefault(prefix, {}).setdefault(int(e), {})[proj] = t
        else:
            out[key] = t
    for prefix, per in experts.items():
        n = len(per)
        out[prefix + ".mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([per[e]["gate_proj"], per[e]["up_proj"]], 0) for e in range(n)]).contiguous()
        out[prefix + ".mlp.experts.down_proj"] = torch.stack([per[e]["down_proj"] for e in range(n)]).contiguous()
    save_file(out, path, metadata={"format": "pt"})


def write_grads(model, ids, path):
    b, s = ids.shape
    targets = torch.cat([ids[:, 1:], torch.full((b, 1), -1)], 1)
    w = torch.tensor([0.5 + 0.4 * np.cos(3 * t + 1) for t in range(b * s)], dtype=torch.float32).view(b, s)
    model.zero_grad()
    with torch.enable_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()
        logp = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        loss = (w * logp * (targets >= 0)).sum()
        loss.backward()
    out = {"targets": targets.flatten().tolist(), "weights": w.flatten().tolist(), "tensors": {}}
    for pname, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        flat = g.detach().flatten().double()
        n = flat.numel()
        idx = [i * n // 8 for i in range(8)]
        out["tensors"][pname] = {"norm": flat.norm().item(), "indices": idx, "values": [flat[i].item() for i in idx]}
    with open(path, "w") as fh:
        json.dump(out, fh)


def build(name, spec, out_root):
    for seed in range(1, 200):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        cfg = tiny_config(**spec["config"])
        model = GlmMoeDsaForCausalLM(cfg).eval()
        randomize(model, gen)
        low = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(spec["dtype"])
        if low is not None:  # the reference sees exactly the weights the file holds
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(low).float())
                for bname, b in model.named_buffers():  # e_score_correction_bias is saved in the same dtype
                    if bname.endswith("e_score_correction_bias"):
                        b.copy_(b.to(low).float())
        ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=gen)
        with MarginProbe() as probe, torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits.float()
            prompt = ids[:1, :5]
            steps, seq = 7, prompt
            for _ in range(steps):  # no-cache greedy, checking the top-1 / top-2 gap of every step
                step_logits = model(input_ids=seq, use_cache=False).logits[:, -1]
                probe.worst = min(probe.worst, gap_after(step_logits, 1))
                seq = torch.cat([seq, step_logits.argmax(-1, keepdim=True)], 1)
        if probe.worst < MARGIN:
            continue
        with torch.no_grad():
            gen_out = model.generate(prompt, max_new_tokens=steps, do_sample=False, pad_token_id=0,
                                     eos_token_id=None)
        new_tokens = gen_out[0, prompt.shape[1]:].tolist()
        if new_tokens != seq[0, prompt.shape[1]:].tolist():
            continue  # cached and uncached greedy must agree, or the fixture is ambiguous
        d = os.path.join(out_root, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
        write_grads(model, ids, os.path.join(d, "grads.json"))  # before the cast to the storage dtype below
        model.to(getattr(torch, spec["dtype"])).save_pretrained(d)
        for f in os.listdir(d):
            if f not in ("config.json", "model.safetensors", "grads.json"):
                os.remove(os.path.join(d, f))
        if spec["fused"]:
            fuse_experts(os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "input_ids.json"), "w") as fh:
            json.dump(ids.tolist(), fh)
        np.save(os.path.join(d, "logits.npy"), logits.numpy().astype(np.float32))
        with open(os.path.join(d, "generate.json"), "w") as fh:
            json.dump({"prompt": prompt[0].tolist(), "max_new_tokens": steps, "tokens": new_tokens}, fh)
        # the saved directory must reload in transformers to the same logits
        back = GlmMoeDsaForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            again = back(input_ids=ids, use_cache=False).logits
        assert torch.allclose(again, logits, rtol=0, atol=1e-5), name
        print(f"{name}: seed {seed}, worst margin {probe.worst:.2e}, indexer_types {cfg.indexer_types}, "
              f"generate {new_tokens}")
        return
    raise SystemExit(f"{name}: no seed gave clear margins")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "fixtures", "glm5")
    for name, spec in FIXTURES.items():
        build(name, spec, out)


if __name__ == "__main__":
    main()
