"""The LLM layer above the runtime: many sequences of a causal LM served on gears.

``Engine.from_folder(folder)`` reads an onnxruntime-genai builder folder
(:mod:`~gear_runtime.llm.folder`), compiles its prompt and batch gears into one gear file in
a cache (:mod:`~gear_runtime.llm.gears`) and runs every live sequence's decode step in one
run of the covering batch gear (:mod:`~gear_runtime.llm.engine`), sampling per sequence
(:mod:`~gear_runtime.llm.sampling`).
"""

from gear_runtime.llm.engine import Engine, EngineFullError, EngineStats, Stream
from gear_runtime.llm.folder import ModelFolder, read_folder
from gear_runtime.llm.gears import EngineGears, choose_gears
from gear_runtime.llm.sampling import SamplingParams, SequenceSampler, sample

__all__ = ["Engine", "EngineFullError", "EngineGears", "EngineStats", "ModelFolder",
           "SamplingParams", "SequenceSampler", "Stream", "choose_gears", "read_folder",
           "sample"]
