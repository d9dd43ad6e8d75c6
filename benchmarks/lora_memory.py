"""Peak memory of one `kbench.parametric.lora.train_lora` step on agent-base-sized data.

8 rows x 1,024 random tokens, a third of the positions after the first 200 labelled (about
the share of assistant tokens in an agent-base transcript), one optimizer step on the
default model. The peak RSS of this process is printed; run it once per micro-batch size.

    PYTHONPATH=src python benchmarks/lora_memory.py --micro-batch-size 1
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from kbench.config import LoraConfig
from kbench.parametric.lora import IGNORE, Example, train_lora
from kbench.backends.packaged import DEFAULT_MODEL_DIR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(args.rows):
        ids = torch.randint(100, model.config.vocab_size, (args.length,), generator=generator).tolist()
        labels = [token if (i > 200 and i % 3 == 0) else IGNORE for i, token in enumerate(ids)]
        examples.append(Example(ids, labels))
    settings = LoraConfig(rank=16, alpha=32, learning_rate=1e-3, batch_size=args.rows, seed=0, steps=1,
                          micro_batch_size=args.micro_batch_size)
    started = time.perf_counter()
    run = train_lora(model, examples, settings)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"rows={args.rows} length={args.length} micro_batch_size={args.micro_batch_size}: "
          f"step {time.perf_counter() - started:.0f}s, loss {run.step_losses[0]:.3f}, peak RSS {peak_gib:.2f} GiB")


if __name__ == "__main__":
    main()
