from .engine_config import EngineConfig
from .llm_engine import LLMEngine
from .output import RequestOutput, StepOutput, StreamDelta
from .scheduler import SchedulerConfig

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SchedulerConfig", "StepOutput", "StreamDelta"]
