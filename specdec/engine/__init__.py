from .engine import Engine, RequestOutput, StreamDelta

__all__ = ["Engine", "RequestOutput", "StreamDelta"]
