"""Packed token sequences from local text, JSONL and parquet files.

Documents are tokenised with the model's tokenizer, each followed by the EOS token, concatenated
and cut into ``seq_len`` blocks (the remainder is dropped). Sample ``i`` of the run is block
``perm_epoch[i mod n_blocks]`` with one seeded permutation per epoch, so the global batch of a
step does not depend on the world size: a run resumed on a different number of ranks sees
exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from cadenza.errors import ConfigError
from cadenza.jsonio import atomic_write_bytes


def read_documents(files: list[str], text_field: str = "text") -> Iterator[str]:
    """Yield documents: a whole ``.txt``/``.md`` file, one JSONL record, or one parquet row."""
    for name in files:
        try:
            yield from _read_file(Path(name), text_field)
        except UnicodeDecodeError:
            raise ConfigError(f"data file {name} is not UTF-8 text") from None


def _read_file(path: Path, text_field: str) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise ConfigError(f"{path}:{lineno} is not valid JSON") from None
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    raise ConfigError(f"{path}:{lineno} has no string field {text_field!r} (data.text_field)")
                yield record[text_field]
    elif suffix == ".parquet":
        yield from _parquet_column(path, text_field)
    elif suffix in (".txt", ".md", ".text", ""):
        yield path.read_text(encoding="utf-8")
    else:
        raise ConfigError(f"unsupported data file {path}: use .txt, .jsonl or .parquet")


def _parquet_column(path: Path, column: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("reading parquet needs pyarrow: pip install 'cadenza[parquet]'") from None
    table = pq.read_table(path)
    if column not in table.column_names:
        raise ConfigError(f"{path} has no column {column!r} (data.text_field); columns: {table.column_names}")
    for value in table.column(column).to_pylist():
        if isinstance(value, str):
            yield value


def tokenize(tokenizer, docs: Iterator[str]) -> np.ndarray:
    """One flat int32 array: every document's tokens followed by EOS (when the tokenizer has one)."""
    eos = tokenizer.eos_token_id
    parts: list[np.ndarray] = []
    for doc in docs:
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        if eos is not None:
            ids = [*ids, eos]
        parts.append(np.asarray(ids, dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def cache_key(files: list[str], text_field: str, tokenizer) -> str:
    h = hashlib.sha256()
    for f in files:
        st = os.stat(f)
        h.update(f"{os.path.abspath(f)}:{st.st_size}:{st.st_mtime_ns};".encode())
    h.update(f"{text_field}:{type(tokenizer).__name__}:{len(tokenizer)}:{tokenizer.eos_token_id}".encode())
    return h.hexdigest()[:16]


def load_tokens(files: list[str], text_field: str, tokenizer, cache_dir: Path, write: bool) -> Path:
    """Tokenise once into ``cache_dir/tokens-<key>.npy`` (only where ``write``); return its path."""
    path = Path(cache_dir) / f"tokens-{cache_key(files, text_field, tokenizer)}.npy"
    if write and not path.exists():
        tokens = tokenize(tokenizer, read_documents(files, text_field))
        import io

        buf = io.BytesIO()
        np.save(buf, tokens)
        atomic_write_bytes(path, buf.getvalue())
    return path


class PackedDataset:
    """``seq_len`` blocks of a token array, served as world-size-independent global batches."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int = 0) -> None:
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.n_blocks = len(tokens) // seq_len
        if self.n_blocks == 0:
            raise ConfigError(
                f"the data has {len(tokens)} tokens, fewer than one sequence of data.seq_len="
                f"{seq_len}; add data or lower seq_len"
            )
        self._perms: dict[int, np.ndarray] = {}

    def _block(self, sample: int) -> np.ndarray:
        epoch, pos = divmod(sample, self.n_blocks)
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.n_blocks)}
        start = int(self._perms[epoch][pos]) * self.seq_len
        return self.tokens[start : start + self.seq_len]

    def batch(self, step: int, global_batch: int, dp_rank: int, dp: int) -> torch.Tensor:
        """The ``dp_rank``-th of ``dp`` equal slices of global batch number ``step`` (1-based)."""
        if global_batch % dp:
            raise ConfigError(
                f"train.global_batch={global_batch} is not divisible by the data-parallel "
                f"degree {dp} (dp_replicate·dp_shard)"
            )
        per = global_batch // dp
        first = (step - 1) * global_batch + dp_rank * per
        rows = [self._block(first + i) for i in range(per)]
        return torch.from_numpy(np.stack(rows).astype(np.int64))
