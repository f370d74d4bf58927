"""A tiny local corpus, a tokenizer trained on it with ``tokenizers``, and tiny HF MoE model folders."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = [
    "def",
    "return",
    "class",
    "import",
    "self",
    "value",
    "list",
    "dict",
    "for",
    "while",
    "if",
    "else",
    "try",
    "except",
    "yield",
    "lambda",
    "print",
    "open",
    "read",
    "write",
    "path",
    "sum",
    "min",
    "max",
    "sort",
    "key",
    "item",
]


def write_corpus(root: Path, n_docs: int = 60, seed: int = 0) -> list[Path]:
    """The same documents split over a .jsonl, a .txt and (with pyarrow) a .parquet file."""
    rng = random.Random(seed)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) for _ in range(n_docs)]
    root.mkdir(parents=True, exist_ok=True)
    files = [root / "a.jsonl", root / "b.txt"]
    third = len(docs) // 3
    files[0].write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:third]))
    files[1].write_text("\n".join(docs[third : 2 * third]))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": docs[2 * third :]}), root / "c.parquet")
        files.append(root / "c.parquet")
    except ImportError:
        files[0].write_text(
            files[0].read_text() + "".join(json.dumps({"text": d}) + "\n" for d in docs[2 * third :])
        )
    return files


def train_tokenizer(files: list[Path]):
    """A word-level tokenizer trained locally, wrapped as a transformers fast tokenizer with EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(WORDS, trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def write_model(path: Path, kind: str, tokenizer) -> Path:
    """A tiny random model of ``kind`` with the tokenizer's vocabulary, saved as a HF folder."""
    from tests.support.tiny_moe import tiny_model

    model = tiny_model(kind)
    model.resize_token_embeddings(len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
