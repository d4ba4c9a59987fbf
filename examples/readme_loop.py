# The training loop of README.md, verbatim (a test keeps the two identical). Run it with
#   torchrun --nproc-per-node 2 examples/readme_loop.py SHARDS [STEPS] [LOG.jsonl]
# on the output of `slimdata build` (e.g. `make demo` -> demo-out).
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from slimdata.hooks import StepTelemetry, hf, run_step
from slimdata.hooks.loader import DocumentLoader, LoaderConfig
from streaming import StreamingDataset
from torch.nn.parallel import DistributedDataParallel
from transformers import LlamaConfig, LlamaForCausalLM

from slimdata.solver import Layout

shards = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
log = sys.argv[3] if len(sys.argv) > 3 else None
dist.init_process_group("gloo")  # "nccl" on GPUs
rank, world_size = dist.get_rank(), dist.get_world_size()

vocab = json.loads(Path(shards, "slimdata.json").read_text())["tokenizer"]["vocab_size"]
config = LlamaConfig(
    vocab_size=vocab,
    hidden_size=64,
    intermediate_size=172,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1 << 20,
    attn_implementation=hf.register(),  # "slimdata": attention runs the plan's packs
)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
ddp = DistributedDataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

loader = DocumentLoader(
    StreamingDataset(local=shards, shuffle=False, batch_size=1),
    rank=rank,
    config=LoaderConfig(
        layout=Layout(dp=world_size, context=8192, memory_gib=8),
        global_batch_tokens=16384,
        oversize="split",  # documents over the context become independent pieces
        model=model,  # the cost model is derived from the model being trained
    ),
)
telemetry = StepTelemetry(log=log)
for step, payload in enumerate(loader):  # the step's StepPlan + this rank's tokens
    if step == steps:
        break
    run_step(ddp, payload, callbacks=[telemetry])
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
