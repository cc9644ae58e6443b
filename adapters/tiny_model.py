"""A tiny, locally built Llama-style model for driving a real vLLM engine on CPU.

No model can be downloaded here, so kvfence builds its own: a 2-layer
``LlamaForCausalLM`` (hidden size 64) with a word-level tokenizer over a fixed
300-token vocabulary. Each *version* is the same architecture and tokenizer
with different random weights, which is exactly what an in-place RL weight
update looks like to the inference engine.

Layout produced by :func:`build_tiny_model` (one directory per version)::

    ROOT/v{version}/
        config.json              LlamaConfig (float32)
        model.safetensors        weights, float32
        generation_config.json
        tokenizer.json           word-level ``tokenizers`` model
        tokenizer_config.json    PreTrainedTokenizerFast
        special_tokens_map.json  (if transformers writes one)
        KVFENCE_OK               completion marker (written last)

Builds are deterministic: the same version always yields byte-identical
files for a given torch/transformers install (the seed is derived from the
version, weights are drawn from an explicit ``torch.Generator`` in sorted
parameter-name order, independent of transformers' own init code).

torch / transformers / tokenizers are imported lazily inside functions, so
this module imports fine without them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

#: Special tokens, ids 0..3.
SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>")
#: Total vocabulary size (special tokens + words).
VOCAB_SIZE = 300
HIDDEN_SIZE = 64
INTERMEDIATE_SIZE = 128
NUM_LAYERS = 2
#: head_dim = 64 / 2 = 32: the smallest head size vLLM's CPU attention supports
#: (``CPUAttentionBackend.get_supported_head_sizes``; 16 fails at run time).
NUM_HEADS = 2
NUM_KV_HEADS = 1
MAX_POSITIONS = 512
#: Std-dev of the normal init of every matrix. Larger than the usual 0.02 so
#: that two versions give clearly different next-token distributions.
INIT_STD = 0.25
_SEED_BASE = 0x6B7666  # "kvf"
_MARKER = "KVFENCE_OK"

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def seed_for_version(version: int) -> int:
    """Torch RNG seed used for the weights of ``version`` (a non-negative int)."""
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return _SEED_BASE + 7919 * version


def vocab_words() -> list[str]:
    """The ordered vocabulary: 4 special tokens then 296 lowercase words.

    Token id == list index. Words are consonant-vowel-consonant syllables
    ("bab", "bad", ...), all distinct and whitespace-free.
    """
    words: list[str] = []
    for c1 in _CONSONANTS:
        for v in _VOWELS:
            for c2 in _CONSONANTS:
                words.append(c1 + v + c2)
    n_words = VOCAB_SIZE - len(SPECIAL_TOKENS)
    return [*SPECIAL_TOKENS, *words[:n_words]]


def build_tokenizer():
    """Return a ``tokenizers.Tokenizer``: word-level, whitespace pre-tokenizer.

    No normalizer and no post-processor (no BOS is added), so
    ``encode(" ".join(words))`` is exactly the ids of ``words``; unknown words
    map to ``<unk>`` (id 0).
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {w: i for i, w in enumerate(vocab_words())}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return tok


def _build_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        torch_dtype="float32",
    )


def _write_model(out: Path, version: int) -> None:
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    config = _build_config()
    model = LlamaForCausalLM(config).to(torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(seed_for_version(version))
    with torch.no_grad():
        for _name, param in sorted(model.named_parameters()):
            if param.dim() == 1:  # RMSNorm weights
                param.fill_(1.0)
            else:
                values = torch.randn(param.shape, generator=gen, dtype=torch.float32)
                param.copy_(values * INIT_STD)
    model.save_pretrained(out, safe_serialization=True)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    fast.save_pretrained(out)


def model_dir(root: Path, version: int) -> Path:
    """Directory of ``version`` under ``root`` (``root/v{version}``); no I/O."""
    return Path(root) / f"v{version}"


def build_tiny_model(root: Path, version: int) -> Path:
    """Build (once) the tiny model of ``version`` under ``root``; return its dir.

    Idempotent: if ``root/v{version}/KVFENCE_OK`` exists nothing is done.
    The model is written to a temp dir beside it and renamed into place, so
    concurrent builders and interrupted builds never leave a half-written
    directory. Sizes: 300-token vocab, hidden 64, 2 layers, 2 heads (1 KV
    head, head dim 32), 512 positions; ~0.1 M parameters, ~0.4 MB float32.
    """
    root = Path(root)
    out = model_dir(root, version)
    if (out / _MARKER).is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=root))
    tmp.chmod(0o755)
    try:
        _write_model(tmp, version)
        (tmp / _MARKER).write_text(f"version={version} seed={seed_for_version(version)}\n")
        if out.exists():
            # Stale partial dir without marker (e.g. from an older build).
            if (out / _MARKER).is_file():
                return out
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)
        except OSError:
            if (out / _MARKER).is_file():  # lost a race to another builder
                return out
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def encode(model_path: Path, text: str) -> list[int]:
    """Token ids of ``text`` with the tokenizer saved in ``model_path``.

    Uses only the ``tokenizers`` library (no torch). No special tokens are
    added, matching what vLLM sends to the model for this tokenizer.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
    return list(tok.encode(text).ids)


def prompt_ids(n_tokens: int, offset: int = 0) -> list[int]:
    """A deterministic prompt of ``n_tokens`` ordinary (non-special) token ids.

    Cycles through the word ids with a stride so consecutive tokens differ;
    ``offset`` shifts the sequence to get distinct prompts.
    """
    n_special = len(SPECIAL_TOKENS)
    n_words = VOCAB_SIZE - n_special
    return [n_special + (offset + 37 * i) % n_words for i in range(n_tokens)]


# ----- a tiny LoRA adapter for the tiny model (kvfence's LoadLora on vLLM) -----------------

#: Rank of the tiny LoRA adapter; vLLM's ``max_lora_rank`` must be at least this.
LORA_RANK = 8
#: Modules the tiny LoRA adapter adapts (PEFT names); every layer's attention projections
#: whose output feeds the KV cache (``k_proj``/``v_proj``) and the query.
LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
#: Std-dev of the LoRA A and B matrices: large enough that two revisions give clearly
#: different logprobs on the tiny model (B is not zero, unlike PEFT's fresh init).
LORA_STD = 0.3
_LORA_SEED_BASE = 0x6C6F7261  # "lora"
_LORA_MARKER = "KVFENCE_LORA_OK"


def lora_seed(revision: int) -> int:
    """Torch RNG seed of the LoRA bytes of ``revision`` (a non-negative int)."""
    if revision < 0:
        raise ValueError(f"LoRA revision must be >= 0, got {revision}")
    return _LORA_SEED_BASE + 104729 * revision


def write_tiny_lora(out: Path, revision: int) -> Path:
    """Write the LoRA adapter of ``revision`` (PEFT layout) into directory ``out``.

    ``out`` may already hold another revision: its files are overwritten in place (what a
    trainer does when it saves a new adapter under the same name and path). Files:
    ``adapter_config.json`` (``peft_type`` LORA, rank :data:`LORA_RANK`, ``lora_alpha``
    = rank, targets :data:`LORA_TARGETS`) and ``adapter_model.safetensors`` with
    ``base_model.model.model.layers.{i}.self_attn.{m}.lora_{A,B}.weight`` per layer and
    target, shapes ``A: (rank, hidden)``, ``B: (out, rank)``, float32. Deterministic per
    revision; the marker ``KVFENCE_LORA_OK`` names the revision last written. No download:
    the shapes come from this module's constants, the format is what vLLM's
    ``vllm/lora/peft_helper.py`` and ``vllm/lora/lora_model.py`` read.
    """
    import json

    import torch
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    head_dim = HIDDEN_SIZE // NUM_HEADS
    widths = {
        "q_proj": NUM_HEADS * head_dim,
        "k_proj": NUM_KV_HEADS * head_dim,
        "v_proj": NUM_KV_HEADS * head_dim,
    }
    gen = torch.Generator(device="cpu").manual_seed(lora_seed(revision))
    tensors = {}
    for layer in range(NUM_LAYERS):
        for module in LORA_TARGETS:
            base = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = torch.randn((LORA_RANK, HIDDEN_SIZE), generator=gen) * LORA_STD
            b = torch.randn((widths[module], LORA_RANK), generator=gen) * LORA_STD
            tensors[f"{base}.lora_A.weight"] = a.contiguous()
            tensors[f"{base}.lora_B.weight"] = b.contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": LORA_RANK,
        "lora_alpha": LORA_RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(LORA_TARGETS),
        "base_model_name_or_path": None,
    }
    marker = out / _LORA_MARKER
    marker.unlink(missing_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1) + "\n")
    marker.write_text(f"revision={revision} seed={lora_seed(revision)}\n")
    return out


def lora_revision_on_disk(out: Path) -> int | None:
    """The revision :func:`write_tiny_lora` last wrote completely into ``out``, or
    ``None``."""
    marker = Path(out) / _LORA_MARKER
    if not marker.is_file():
        return None
    text = marker.read_text().split()[0]
    return int(text.split("=", 1)[1])
