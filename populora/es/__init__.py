"""EggRoll evolution strategies on the routed low-rank path, and the torcheggroll 0.2.0 API.

- :class:`EggrollES`: ask / tell / step ES whose population runs in one routed forward;
  :meth:`EggrollES.ask` hands out the generation's :class:`Individuals`.
- :class:`TorchEggrollES`: the torcheggroll 0.2.0 class, same API.
- :func:`generate_lora_noise`, :func:`generate_standard_noise`,
  :func:`generate_noise_for_shapes`, :func:`compute_es_gradient`: its utilities.

Higher fitness is better everywhere. See ``spec/es.md`` for the semantics.

On a Hugging Face causal LM (``LlamaForCausalLM`` and kin), ``EggrollES(model, ...)``
works as on any module: every ``nn.Linear`` and ``nn.Embedding`` weight is
perturbed on the routed path (one batched forward; the member's output is the
model's own output object, so a loss reads ``out["logits"]``); the RMSNorm
gains are frozen with one warning naming them, or perturbed with
``perturb_unroutable=True`` (then each member runs through
``torch.func.functional_call``, one member at a time, since HF's forward
returns a cache object that ``vmap`` cannot batch); a tied embedding / head
is one parameter with one perturbation; noise is drawn in float32 and the
update computed in float32 for bf16 / fp16 weights, then cast to their dtype.

To train a LoRA adapter on a frozen base instead (the PEFT-style use), wrap
the model with ``peft.get_peft_model(model, LoraConfig(...))`` first: PEFT
freezes the base, and ES evolves what requires grad, i.e. only the
``lora_A`` / ``lora_B`` weights (plain ``nn.Linear`` layers, so on the routed
path); ``save_pretrained`` then writes the evolved adapter. Combine with
``param_filter`` to narrow it further. ``tests/test_llm_es.py`` shows both.
"""

from populora.es.compat import TorchEggrollES
from populora.es.config import EggrollConfig
from populora.es.core import EggrollES
from populora.es.members import ESStateError, Individuals
from populora.es.noise import (
    compute_es_gradient,
    generate_lora_noise,
    generate_noise_for_shapes,
    generate_standard_noise,
    stable_seed,
)
from populora.es.shaping import FITNESS_SHAPINGS

__all__ = [
    "EggrollConfig",
    "FITNESS_SHAPINGS",
    "ESStateError",
    "EggrollES",
    "Individuals",
    "TorchEggrollES",
    "compute_es_gradient",
    "generate_lora_noise",
    "generate_noise_for_shapes",
    "generate_standard_noise",
    "stable_seed",
]
