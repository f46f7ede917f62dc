"""specdec: speculative decoding with exact rejection sampling, measured honestly."""
from .config import SpeculativeConfig
from .engine_args import EngineArgs
from .errors import SpecDecError
from .llm import LLM
from .proposers import BuildContext, Proposer
from .proposers.registry import Method, register_method
from .sampling_params import SamplingParams

__all__ = ["BuildContext", "EngineArgs", "LLM", "Method", "Proposer", "SamplingParams", "SpeculativeConfig",
           "SpecDecError", "register_method"]
__version__ = "0.1.0"
