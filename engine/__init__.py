"""inferd's paged-KV inference engine.

The modules here are the engine itself: the step loop (llm_engine.py) and the output
processor it feeds (output_processor.py), the offline API (llm.py) and `inferd generate`
(generate_cmd.py), the configuration (config.py) with its one owner while the engine runs
(live_config.py), and the statistics that leave the step loop (stats.py). Each folder's
__init__.py says what it owns; docs/ARCHITECTURE.md draws them, and .importlinter's
engine-layers contract keeps the order in which they import each other.
"""

from .config import EngineConfig
from .llm import LLM
from .llm_engine import LLMEngine
from .request.outputs import CompletionOutput, RequestOutput
from .request.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "CompletionOutput"]
