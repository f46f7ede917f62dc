from .llm_engine import LLMEngine
from .output import RequestOutput, StepOutput, StreamDelta
from .scheduler import SchedulerConfig

__all__ = ["LLMEngine", "RequestOutput", "SchedulerConfig", "StepOutput", "StreamDelta"]
