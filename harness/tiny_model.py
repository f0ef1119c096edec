"""Builds a tiny random-weight Llama and a word-level tokenizer that vLLM can serve on the CPU.

Run with the vLLM venv's Python (it has torch, transformers and tokenizers):
    python harness/tiny_model.py OUT_DIR
No download happens: the weights are random, the vocabulary is "w0".."w{N}". A prompt of N words
is N tokens, which lets the tests size prompts exactly.
"""

from __future__ import annotations

import sys
from pathlib import Path

VOCAB_WORDS = 1000


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(VOCAB_WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    # head_dim must be >= 32 on vLLM's CPU attention backend (256 / 4 heads = 64).
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fast.save_pretrained(out)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
