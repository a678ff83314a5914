"""inferd's paged-KV inference engine."""

from .config import EngineConfig
from .llm import LLM
from .llm_engine import LLMEngine
from .request.outputs import CompletionOutput, RequestOutput
from .request.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "CompletionOutput"]
