"""The transformers zoo models: GPT-2, BERT, Wav2Vec2, and GPT-2 generation as one ONNX Loop."""
from __future__ import annotations

from zoo_core import CONFIGS, OPSET, SEED, ZooModel, spec
from zoo_export import finish_and_save, import_torch, perturb_constant_params, torch_zoo_model


# --------------------------------------------------------------------------------------------
# Transformers: GPT-2, BERT, wav2vec2
# --------------------------------------------------------------------------------------------


def _wrappers():
    """Small modules giving the transformers models a plain tensor signature (tuple outputs)."""
    nn = import_torch().nn

    class GPT2Logits(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, use_cache=False, return_dict=False)[0]

    class BertEncoder(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
            return out[0], out[1]

    class Wav2Vec2Encoder(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_values):
            return self.model(input_values=input_values, return_dict=False)[0]

    return GPT2Logits, BertEncoder, Wav2Vec2Encoder


def _seeded(model_class, config, seed: int):
    """model_class(config) with torch's seeded init, its constant parameters perturbed."""
    import_torch().manual_seed(seed)
    model = model_class(config).eval()
    perturb_constant_params(model, seed)
    return model


def gpt2(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """GPT-2 language model (GPT2LMHeadModel): input_ids -> logits, no KV cache."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**CONFIGS["gpt2"][size], use_cache=False, bos_token_id=0, eos_token_id=0,
                        attn_implementation="eager")
    return torch_zoo_model("gpt2", size, seed, _wrappers()[0](_seeded(GPT2LMHeadModel, config, seed)))


def bert(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """BERT encoder (BertModel): input_ids, attention_mask -> last_hidden_state, pooler_output."""
    from transformers import BertConfig, BertModel

    config = BertConfig(**CONFIGS["bert"][size], attn_implementation="eager")
    return torch_zoo_model("bert", size, seed, _wrappers()[1](_seeded(BertModel, config, seed)))


def wav2vec2(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """wav2vec 2.0 encoder (Wav2Vec2Model): input_values [batch, samples] -> last_hidden_state."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(**CONFIGS["wav2vec2"][size], feat_extract_norm="group", do_stable_layer_norm=False,
                            apply_spec_augment=False, attn_implementation="eager")
    model = _seeded(Wav2Vec2Model, config, seed)
    # The positional conv is weight-normed (a parametrization): bake w = g * v / ||v|| into a plain
    # weight.  Otherwise the exporter folds it for small weights only and the full model computes the
    # norm at run time (ReduceL2 / Div / Mul on weights), so tiny and full would differ.
    from torch.nn.utils import parametrize

    for mod in model.modules():
        if parametrize.is_parametrized(mod):
            for pname in list(mod.parametrizations):
                parametrize.remove_parametrizations(mod, pname, leave_parametrized=True)
    return torch_zoo_model("wav2vec2", size, seed, _wrappers()[2](model))


def gpt2_generate(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """GPT-2 greedy generation with a static KV cache, the whole decode loop as one ONNX Loop."""
    import generate

    sp = spec("gpt2_generate", size)
    cfg = sp.config
    from transformers import GPT2Config, GPT2LMHeadModel

    torch = import_torch()
    # GPT-2's tied lm_head makes a random-weight model repeat its input token forever; an untied one
    # (also seeded) gives tokens that depend on the whole context, which is what a test needs.
    gpt2_cfg = {k: v for k, v in cfg.items() if k not in ("prompt_len", "max_new_tokens")}
    config = GPT2Config(**gpt2_cfg, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                        attn_implementation="eager")
    hf = _seeded(GPT2LMHeadModel, config, seed)
    module = generate.greedy_decode_module(hf, cfg["prompt_len"], cfg["max_new_tokens"])

    def exporter(zm, path):
        finish_and_save(generate.decode_graph(generate.gpt2_weights(hf), cfg, OPSET), zm, path)

    feeds = sp.random_inputs(seed)
    return ZooModel(name="gpt2_generate", size=size, module=module,
                    inputs={k: torch.from_numpy(v) for k, v in feeds.items()}, dynamic_dims={}, spec=sp,
                    exporter=exporter, seed=seed)
