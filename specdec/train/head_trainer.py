"""`specdec train-head`: train an EAGLE-3 or Medusa head for a target, on this machine (CPU or CUDA).

1. Text: documents from the sources (train/data.py), each up to `doc_len` tokens of context.
2. Draft vocabulary: the `draft_vocab` most frequent tokens of that text (plus the end tokens), ascending by id.
3. Features, teacher-forced through the target over whole documents (a window's states carry their context),
   kept in memory (and in OUT.features.pt until the run ends, for --resume): per token the hidden states the head reads
   (EAGLE-3: the inputs of three layers; Medusa: the final normed state) in the runtime dtype, and the target's
   top-k next-token probabilities (never whole 152k-wide rows). ~9 KB a token for EAGLE-3 on the 1.5B.
4. Training: soft cross-entropy against the target's distribution restricted to the draft vocabulary.
   EAGLE-3 unrolls `ttt_steps` steps of training-time test (step j's row t predicts x_{t+j+2} from the head's own
   output of step j-1; losses weighted 0.8^j, as in the paper's reference code); Medusa head i predicts x_{t+i+2}
   from the state at t (weights 0.8^i). AdamW, linear warm-up then cosine decay, gradient clipping.
5. Checkpoints every `checkpoint_every` steps (written atomically; `--resume` continues from the last, reusing the
   run's documents and features from OUT.docs.pt and OUT.features.pt), and the
   head saved in vLLM's layout (models/heads.py) with what it was trained on in `training.json`.

Initialisation follows the methods' reference code where it helps a short run: Medusa's blocks start as the
identity and its output heads as the target's rows; EAGLE-3's output head and final norm start from the target's,
`fc` from the identity on the last layer it reads, and the layer's output projections (o_proj, down_proj) at zero,
so the untrained head already predicts roughly what the target's late states predict.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..errors import SpecDecError
from ..proposers.eagle import EAGLE3
from ..proposers.medusa import METHOD as MEDUSA
from ..utils import save_torch_atomic
from .features import (
    Features,
    draft_vocabulary,
    extract_features,
    refreshed_vocabulary,
    soft_ce,
    soft_targets,
    target_head_weight,
)
from .run_cache import RunCache


@dataclass
class TrainConfig:
    method: str                         # eagle3 | medusa | eagle3,medusa (both from one pass over the target:
                                        # then saved to OUT/eagle3 and OUT/medusa)
    data: str                           # comma list of sources (train/data.py)
    out: str
    seq_len: int = 512                  # tokens per training window (the head's attention span in training)
    doc_len: int = 2048                 # tokens of context per document when the target computes the features
    max_tokens: int | None = None       # cap on training tokens, spread evenly over the sources
    epochs: float = 1.0
    batch_seqs: int = 4
    lr: float = 5e-4
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    draft_vocab: int = 8192             # EAGLE-3's draft vocabulary / Medusa's truncated vocabulary
    intermediate_size: int | None = None   # EAGLE-3's MLP width (None: the target's)
    ttt_steps: int = 3                  # EAGLE-3 training-time-test depth
    num_heads: int = 3                  # Medusa heads
    topk: int = 16                      # target probabilities kept per token
    checkpoint_every: int = 50
    resume: bool = False
    int8: bool = False                  # store 2-D weights as int8 + per-row scale (a shipped head <= 50 MB)
    seed: int = 0
    regenerate: int = 0                 # > 0: chat sources get the target's own greedy answers, up to this many
                                        # tokens (self-distillation), generated batched by the engine
    regenerate_seqs: int = 16           # sequences decoded together while regenerating
    init: str | None = None             # start from this trained head (its weights and draft vocabulary): more
                                        # data for a head already trained; with two methods, INIT/eagle3, INIT/medusa
    refresh_vocab: int = 0              # with init: swap up to this many of the head's draft tokens that are rarest
                                        # in this data for the most frequent ones it lacks (their output rows start
                                        # from the target's output head)

    def __post_init__(self):
        ms = self.methods
        if not ms or any(m not in (EAGLE3.name, MEDUSA.name) for m in ms) or len(set(ms)) != len(ms):
            raise SpecDecError(f"train-head --method must be eagle3, medusa or eagle3,medusa, got '{self.method}'")
        if self.regenerate < 0:
            raise SpecDecError("train-head: regenerate must be >= 0")
        if self.refresh_vocab < 0:
            raise SpecDecError("train-head: refresh-vocab must be >= 0")
        if self.refresh_vocab and self.init is None:
            raise SpecDecError("train-head: --refresh-vocab needs --init (a new head's vocabulary comes from the data)")
        for name in ("seq_len", "doc_len", "batch_seqs", "draft_vocab", "ttt_steps", "num_heads", "topk",
                     "checkpoint_every", "regenerate_seqs"):
            if getattr(self, name) < 1:
                raise SpecDecError(f"train-head: {name.replace('_', '-')} must be >= 1")
        if self.epochs <= 0 or self.lr <= 0:
            raise SpecDecError("train-head: epochs and lr must be > 0")


    @property
    def methods(self) -> list[str]:
        return [m.strip() for m in self.method.split(",") if m.strip()]

    def out_dir(self, method: str) -> str:
        return self.out if len(self.methods) == 1 else os.path.join(self.out, method)

    def init_dir(self, method: str) -> str | None:
        if self.init is None:
            return None
        return self.init if len(self.methods) == 1 else os.path.join(self.init, method)


class HeadTrainer:
    def __init__(self, cfg: TrainConfig, target, progress: bool = True):
        """target: a LoadedModel (the engine's runtime model: its states are what the head will read)."""
        torch.manual_seed(cfg.seed)
        self.cfg, self.target, self.progress = cfg, target, progress
        self.model = target.model
        self.device = self.model.embed_tokens.weight.device
        self.cache = RunCache(cfg.out, cfg.resume)

    # -- the pieces ----------------------------------------------------------------------------------------------
    def initial_head(self, method: str):
        """The head named by --init for `method` (float32, on the target's device), or None."""
        from ..models.heads import load_head

        path = self.cfg.init_dir(method)
        if path is None:
            return None
        loaded = load_head(path, self.model, torch.float32, self.device)
        if loaded.method != method:
            raise SpecDecError(f"--init {path} holds a {loaded.method} head, not {method}")
        head = type(loaded.module)(loaded.module.cfg).to(self.device)    # trainable parameters, not loaded tensors
        with torch.no_grad():
            head.load_state_dict({k: v.clone() for k, v in loaded.module.state_dict().items()})
        return head

    @staticmethod
    def head_vocab(head) -> torch.Tensor:
        """A head's draft vocabulary as ascending target ids."""
        return (head.draft_to_target if hasattr(head, "draft_to_target") else head.token_map).cpu().clone()

    def build_head(self, method: str, vocab_ids: torch.Tensor):
        from ..models.eagle3 import Eagle3Config, Eagle3Head, default_aux_layers
        from ..models.medusa import MedusaConfig, MedusaHeads

        init = self.initial_head(method)
        if init is not None:
            return self.revocab(init, vocab_ids)
        c, mc = self.cfg, self.model.config
        w_head = target_head_weight(self.model)[vocab_ids.to(self.device)]               # [vd, H] fp32
        name = self.target.name
        if method == MEDUSA.name:
            head = MedusaHeads(MedusaConfig(mc.hidden_size, mc.vocab_size, c.num_heads, 1, len(vocab_ids), name))
            head.token_map.copy_(vocab_ids)
            with torch.no_grad():
                for lm in head.lm_heads:
                    lm.weight.copy_(w_head)
            return head
        aux = default_aux_layers(mc.num_layers)
        ec = Eagle3Config(mc.hidden_size, c.intermediate_size or mc.intermediate_size, mc.num_heads, mc.num_kv_heads,
                          mc.head_dim, mc.vocab_size, len(vocab_ids), mc.rms_norm_eps, mc.rope_theta,
                          mc.max_position_embeddings, mc.hidden_size, aux, False, name)
        head = Eagle3Head(ec)
        head.set_vocab(vocab_ids)
        H = mc.hidden_size
        with torch.no_grad():
            head.lm_head.weight.copy_(w_head)
            head.norm.weight.copy_(self.model.norm.weight.float())
            head.fc.weight.zero_()
            head.fc.weight[:, (len(aux) - 1) * H:] = torch.eye(H)
            head.self_attn.o_proj.weight.zero_()
            head.mlp.down_proj.weight.zero_()
        return head

    def revocab(self, head, vocab_ids: torch.Tensor):
        """A trained head moved onto the draft vocabulary vocab_ids (same size): a token it had keeps its trained
        output row(s), a new one starts from the target's output head."""
        old = self.head_vocab(head)
        if torch.equal(old, vocab_ids):
            return head
        w_head = target_head_weight(self.model)[vocab_ids.to(self.device)]               # [vd, H] fp32
        row_of = torch.full((self.model.config.vocab_size,), -1, dtype=torch.long)
        row_of[old] = torch.arange(len(old))
        src = row_of[vocab_ids]                                                         # [vd] old row or -1
        had = (src >= 0).to(self.device)
        outs = head.lm_heads if hasattr(head, "lm_heads") else [head.lm_head]
        with torch.no_grad():
            for lm in outs:
                w = lm.weight.float()
                lm.weight.copy_(torch.where(had[:, None], w[src.clamp(min=0).to(self.device)], w_head))
            if hasattr(head, "token_map"):
                head.token_map.copy_(vocab_ids)
            else:
                head.set_vocab(vocab_ids)
        return head

    def method_layers(self, method: str) -> tuple[int, ...]:
        from ..models.eagle3 import default_aux_layers

        n = self.model.config.num_layers
        return (n,) if method == MEDUSA.name else default_aux_layers(n)

    def layers(self) -> tuple[int, ...]:
        """Every layer some method reads, in the order the feature columns hold them."""
        return tuple(dict.fromkeys(i for m in self.cfg.methods for i in self.method_layers(m)))

    def columns(self, method: str) -> torch.Tensor:
        H, order = self.model.config.hidden_size, self.layers()
        return torch.cat([torch.arange(order.index(i) * H, (order.index(i) + 1) * H)
                          for i in self.method_layers(method)])

    def loss(self, head, method: str, batch: list[tuple[int, int, int]], feats: Features, t2d: torch.Tensor,
             vd: int):
        """Mean weighted loss and per-step top-1 agreement over a batch of windows (document, start, end)."""
        c = self.cfg
        parts = [feats.window(*w) for w in batch]
        T = max(len(p[0]) for p in parts)
        pad = lambda t, fill=0: F.pad(t, (0, 0) * (t.dim() - 1) + (0, T - t.shape[0]), value=fill)  # noqa: E731
        x = torch.stack([pad(p[0]) for p in parts]).to(self.device)                               # [B, T]
        valid = torch.stack([pad(torch.ones(len(p[0]), dtype=torch.bool), False) for p in parts]).to(self.device)
        cols = self.columns(method)
        states = torch.stack([pad(p[1][:, cols]) for p in parts]).to(self.device).float()         # [B, T, S]
        ids = torch.stack([pad(p[2]) for p in parts]).to(self.device)
        probs = torch.stack([pad(p[3]) for p in parts]).to(self.device)
        target, weight = soft_targets(ids, probs, t2d, vd)                                         # [B, T, vd]
        weight = weight * valid.to(weight)
        steps = c.ttt_steps if method == EAGLE3.name else c.num_heads
        if method == EAGLE3.name:
            with torch.no_grad():
                emb = self.model.embed_tokens(torch.cat([x[:, 1:], x[:, -1:]], 1)).float()         # x_{t+1}
            outs = head.train_forward(emb, head.fc(states), steps)
        else:
            outs = head(states)
        total, agree = 0.0, []
        for j, logits in enumerate(outs):
            # row t predicts x_{t+j+2}: the target's distribution at position t+j+1
            tgt = torch.cat([target[:, j + 1:], target[:, :j + 1] * 0], 1)
            w = torch.cat([weight[:, j + 1:], weight[:, :j + 1] * 0], 1)
            loss_j, agree_j = soft_ce(logits, tgt, w)
            total = total + 0.8 ** j * loss_j
            agree.append(float(agree_j))
        return total, agree

    def regenerate(self, asks: list[list[dict]]) -> list[list[int]]:
        """Each conversation's opening turn followed by the target's greedy answer  # token ids (prompt + answer)"""
        from ..engine import EngineConfig, LLMEngine, SchedulerConfig
        from ..sampling_params import SamplingParams
        from ..utils import progress_bar

        tok = self.target.tokenizer
        engine = LLMEngine(EngineConfig(self.model, tok, scheduler=SchedulerConfig(
            max_num_seqs=self.cfg.regenerate_seqs, max_num_batched_tokens=1024)))
        params = SamplingParams(max_tokens=self.cfg.regenerate, temperature=0.0)
        seqs = []                                   # None where the prompt leaves no room for the answer
        for i, msgs in enumerate(asks):
            ids = tok.encode_chat(msgs)
            fits = len(ids) + self.cfg.regenerate < min(engine.max_model_len, self.cfg.doc_len)
            seqs.append(engine.add_request(f"regen-{i}", ids, params) if fits else None)
        bar = progress_bar(range(sum(s is not None for s in seqs)), "regenerate", self.progress)
        while engine.has_unfinished():
            for out in engine.step():
                if out.error is not None:
                    raise out.error
                if out.delta is not None and out.delta.finished:
                    if hasattr(bar, "update"):
                        bar.update(1)
        if hasattr(bar, "close"):
            bar.close()
        return [None if s is None else s.prompt_ids + s.output_ids for s in seqs]

    # -- the run -------------------------------------------------------------------------------------------------
    def run(self) -> dict:
        """Data, features, then each method's head trained and saved; returns {method: what was done}."""
        from .data import load_sequences

        c = self.cfg
        t0 = time.perf_counter()
        tok = self.target.tokenizer
        data_key = {k: getattr(c, k) for k in ("data", "doc_len", "max_tokens", "regenerate")}
        data_key |= {"target": self.target.name, "weights": self._weights_print(), "device": str(self.device)}
        docs = self.cache.cached("docs", data_key, lambda: load_sequences(c.data, tok, c.doc_len, c.max_tokens,
                                                                     self.regenerate if c.regenerate else None))
        num_tokens = sum(len(d) for d in docs)
        windows = [(i, s, min(s + c.seq_len, len(d))) for i, d in enumerate(docs) for s in range(0, len(d), c.seq_len)
                   if min(s + c.seq_len, len(d)) - s >= 8]
        vocab = self.model.config.vocab_size
        vocabs = {}
        for m in c.methods:             # --init keeps the head's own vocabulary (--refresh-vocab: a part renewed);
                                        # else the data's frequent tokens
            init = self.initial_head(m)
            if init is None:
                vocabs[m] = draft_vocabulary(docs, c.draft_vocab, vocab, list(tok.eos_token_ids))
            elif c.refresh_vocab:
                vocabs[m] = refreshed_vocabulary(self.head_vocab(init), docs, c.refresh_vocab, vocab,
                                                 list(tok.eos_token_ids))
            else:
                vocabs[m] = self.head_vocab(init)
        feats = self.cache.cached("features", data_key | {"layers": self.layers(), "topk": c.topk},
                             lambda: extract_features(self.model, docs, self.layers(), c.topk, self.progress))
        t_feat = time.perf_counter() - t0
        data = {"documents": len(docs), "windows": len(windows), "tokens": num_tokens, "feature_s": round(t_feat, 1)}
        out = {}
        for m in c.methods:
            t2d = torch.full((vocab,), -1, dtype=torch.long)
            t2d[vocabs[m]] = torch.arange(len(vocabs[m]))
            out[m] = self.train(m, c.out_dir(m), windows, feats, t2d.to(self.device), vocabs[m], data)
        self.cache.remove("docs", "features")
        return out

    # -- what the run's caches are keyed by -------------------------------------------------------------------
    def _weights_print(self) -> str:
        """The target's weights as the features see them: its fingerprint and its stored bytes (a quantized target
        differs from its bf16 self)."""
        from ..models.heads import target_fingerprint

        return f"{target_fingerprint(self.model)}-{self.model.weight_nbytes()}-{self.model.embed_tokens.weight.dtype}"

    def train(self, method: str, out: str, windows, feats: Features, t2d, vocab_ids, data: dict) -> dict:
        from ..models.heads import save_head, target_fingerprint
        from ..utils import progress_bar, write_json_atomic

        c = self.cfg
        torch.manual_seed(c.seed)
        head = self.build_head(method, vocab_ids).float().to(self.device).train()
        opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=c.lr,
                                weight_decay=c.weight_decay, betas=(0.9, 0.95))
        steps_per_epoch = math.ceil(len(windows) / c.batch_seqs)
        total_steps = max(1, math.ceil(steps_per_epoch * c.epochs))
        ckpt = out.rstrip("/") + ".checkpoint.pt"
        start, history = 0, []
        if c.resume and os.path.isfile(ckpt):
            state = torch.load(ckpt, map_location=self.device, weights_only=False)
            if state["config"] != asdict(c) | {"resume": state["config"]["resume"]}:
                raise SpecDecError(f"{ckpt} was written by a run with other settings; remove it or run without "
                                   "--resume")
            head.load_state_dict(state["head"])
            opt.load_state_dict(state["optimizer"])
            start, history = state["step"], state["history"]
        g = torch.Generator().manual_seed(c.seed)
        order = [torch.randperm(len(windows), generator=g).tolist() for _ in range(math.ceil(c.epochs))]   # per epoch

        def lr_at(step):
            if step < c.warmup_steps:
                return c.lr * (step + 1) / c.warmup_steps
            frac = (step - c.warmup_steps) / max(1, total_steps - c.warmup_steps)
            return c.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

        autocast = train_autocast(self.device)
        bar = progress_bar(range(start, total_steps), "train", self.progress)
        t1 = time.perf_counter()
        for step in bar:
            epoch, i = divmod(step, steps_per_epoch)
            batch = [windows[j] for j in order[epoch][i * c.batch_seqs: (i + 1) * c.batch_seqs]]
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            with autocast:
                loss, agree = self.loss(head, method, batch, feats, t2d, len(vocab_ids))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), c.grad_clip)
            opt.step()
            history.append({"step": step, "loss": round(loss.item(), 4), "agree": [round(a, 3) for a in agree]})
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", agree=" ".join(f"{a:.2f}" for a in agree))
            if (step + 1) % c.checkpoint_every == 0 and step + 1 < total_steps:
                save_torch_atomic({"config": asdict(c), "head": head.state_dict(), "optimizer": opt.state_dict(),
                              "step": step + 1, "history": history}, ckpt)
        t_train = time.perf_counter() - t1
        tail = history[-max(1, len(history) // 10):]
        info = {"method": method, "target": self.target.name, "data": c.data, **data,
                "draft_vocab": len(vocab_ids), "steps": total_steps, "train_s": round(t_train, 1),
                "final_loss": round(sum(h["loss"] for h in tail) / len(tail), 4),
                "final_agree": [round(sum(h["agree"][j] for h in tail) / len(tail), 3)
                                for j in range(len(tail[-1]["agree"]))] if tail else [],
                "device": str(self.device), "threads": torch.get_num_threads(),
                "autocast": "bf16" if isinstance(autocast, torch.autocast) else "fp32", "config": asdict(c)}
        # the longest context its features were computed at: past it a head is off its training (an EAGLE head's
        # attention never saw such positions, and the target's states there come from text it was not trained on),
        # and auto leaves it out of longer prompts
        extra = {"specdec_target_fingerprint": target_fingerprint(self.model), "specdec_trained_context": c.doc_len}
        save_head(head, method, out, extra, int8=c.int8)
        write_json_atomic(os.path.join(out, "training.json"), {**info, "history": history})
        if os.path.isfile(ckpt):
            os.unlink(ckpt)
        return info


def train_autocast(device: torch.device):
    """bf16 autocast where bf16 matmuls run natively (CUDA; CPUs with AVX-512 BF16), else plain fp32. On an AVX2
    CPU a bf16 step is dozens of times slower than fp32's: one EAGLE-3 forward and backward over 256 tokens, 2 TTT
    steps, took 2.3 s + 60.9 s in bf16 and 0.44 s + 0.83 s in fp32 (AMD EPYC, 2 threads)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    from ..models.quantization.kernels import native_bf16

    return torch.autocast("cpu", dtype=torch.bfloat16) if native_bf16() else contextlib.nullcontext()
