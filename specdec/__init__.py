"""specdec: speculative decoding with exact rejection sampling, measured honestly."""
from .config import SpeculativeConfig
from .engine_args import EngineArgs
from .errors import SpecDecError
from .llm import LLM
from .sampling_params import SamplingParams

__all__ = ["EngineArgs", "LLM", "SamplingParams", "SpeculativeConfig", "SpecDecError"]
__version__ = "0.1.0"
