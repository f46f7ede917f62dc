"""specdec: speculative decoding with exact rejection sampling, measured honestly."""
from .config import Method, SpeculativeConfig, register_method
from .engine_args import EngineArgs
from .errors import SpecDecError
from .llm import LLM
from .proposers import BuildContext, Proposer
from .proposers.plugins import load_plugins
from .sampling_params import SamplingParams

__all__ = ["BuildContext", "EngineArgs", "LLM", "Method", "Proposer", "SamplingParams", "SpeculativeConfig",
           "SpecDecError", "register_method"]
__version__ = "0.1.0"

load_plugins()          # third-party methods (the specdec.proposers entry-point group), after every built-in
