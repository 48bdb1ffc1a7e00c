"""Generation under expert parallelism against two public measurements (nothing here is fitted to them).

1. The all-to-all term (gen_ep_alltoall, ``rlhfsim.costs.genparallel.call_s``) against DeepEP's published low-latency
   kernel times: deepseek-ai/DeepEP docs/legacy.md ("Low-latency kernels with pure RDMA"): H800, one CX7 400 Gb/s NIC
   per GPU, 128 tokens per GPU, hidden 7168, top-8, FP8 dispatch, BF16 combine. Priced on the catalog's h100-sxm
   (the same 400 Gb/s NIC per GPU, 50 GB/s; its NVLink is the H100's, not the H800's).
2. One decode step of DeepSeek-V3 as SGLang's large-scale EP deployment ran it (lmsys.org/blog/2025-05-05-large-scale-ep,
   "Decode Phase"; the launch in sgl-project/sglang#6017): 9 nodes of 8 H100, --tp 72 --dp 72 --enable-dp-attention
   (EP 72, attention TP 1), --ep-num-redundant-experts 32, DeepEP low-latency (FP8 dispatch), two-batch overlap,
   --cuda-graph-bs 256, FP8 weights; 256 sequences per GPU at a KV length of 2,000: 22,282 output tokens/s per node.
   The bundled h100-sxm profile prices SGLang's decode; its CUDA-graph limit (160 rows, SGLang's default) is raised to
   the launch's 256.

Run: PYTHONPATH=. python scenarios/examples/moe-ep/check_ep_decode.py
"""

from __future__ import annotations

import copy

from rlhfsim.costs.genparallel import FP8_DISPATCH_BYTES, GenLayout, call_s, engine_weight_bytes
from rlhfsim.costs.model import CostModel
from rlhfsim.costs.profile import default_profile_for, load_profile
from rlhfsim.costs.model import with_stack_rate
from rlhfsim.hardware.catalog import get_gpu
from rlhfsim.models.catalog import DTYPE_BYTES, load_model

GPU = get_gpu("h100-sxm")

# DeepEP docs/legacy.md, low-latency kernels: EP -> (dispatch us, combine us)
DEEPEP_LL = {8: (77, 114), 16: (118, 195), 32: (155, 273), 64: (173, 314), 128: (192, 369), 256: (194, 360)}
SGLANG_TOKENS_PER_NODE = 22_282


def deepep() -> None:
    cost = CostModel.load(GPU)
    print("gen_ep_alltoall per call vs DeepEP low-latency (128 tokens/GPU, h 7168, top-8, FP8 dispatch, BF16 combine)")
    print(f"{'EP':>4} {'dispatch us':>22} {'combine us':>22}")
    for ep, (d_pub, c_pub) in DEEPEP_LL.items():
        lay = GenLayout(1, ep, True, 0, True, False, GPU.link_domain(8), ep > 8)
        d = call_s(cost, 128, 8, 7168, FP8_DISPATCH_BYTES, lay) * 1e6
        c = call_s(cost, 128, 8, 7168, 2, lay) * 1e6
        print(f"{ep:>4} {d:8.0f} vs {d_pub:4d} ({d / d_pub - 1:+5.0%}) {c:8.0f} vs {c_pub:4d} ({c / c_pub - 1:+5.0%})")


def sglang() -> None:
    doc = with_stack_rate(copy.deepcopy(load_profile(default_profile_for(GPU.name))), GPU)
    doc["generation"]["sglang"]["graph_max_batch"] = 256      # --cuda-graph-bs 256
    cost = CostModel(GPU, doc)
    m = load_model("deepseek-v3")
    batch, kv = 256, 256 * 2000
    print("\nDeepSeek-V3 decode, SGLang EP 72 with DP attention on 9 x 8 H100, 256 rows/GPU at KV 2,000 "
          f"(published {SGLANG_TOKENS_PER_NODE:,} tokens/s per node, {8 * batch / SGLANG_TOKENS_PER_NODE * 1e3:.1f} ms "
          "per step)")
    for overlap in (False, True):
        lay = GenLayout(1, 72, True, 32, True, overlap, GPU.link_domain(8), True)
        price = cost.decoder(m, "float8", 1, "sglang", par=lay).price(batch, kv, 1)
        per_node = 8 * batch / price.total_s
        parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in price.terms().items() if abs(v) > 5e-5)
        print(f"  two_batch_overlap {str(overlap):5}: step {price.total_s * 1e3:6.1f} ms, {per_node:8,.0f} tokens/s per node "
              f"({per_node / SGLANG_TOKENS_PER_NODE - 1:+.0%}); ms: {parts}")
    lay = GenLayout(1, 72, True, 32, True, True, 8, True)
    w, kv_b = engine_weight_bytes(m, DTYPE_BYTES["float8"], lay), kv * m.kv_bytes_per_token("float8")
    print(f"  memory per GPU: weights {w / 1e9:.1f} GB + KV {kv_b / 1e9:.1f} GB = {(w + kv_b) / 1e9:.1f} GB "
          f"(the launch's --mem-fraction-static 0.81 of 80 GiB: {0.81 * GPU.mem_bytes / 1e9:.1f} GB)")


if __name__ == "__main__":
    deepep()
    sglang()
