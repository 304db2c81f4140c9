"""The gear file format, below everything that writes or reads it.

| module            | holds                                                                 |
|-------------------|-----------------------------------------------------------------------|
| ``format``        | every name the writer (compiler) and the readers share, and the codecs |
| ``info``          | ``ModelInfo``: what a loaded gear model is, whatever the backend       |
| ``reader``        | ``read_gear_file`` -> ``GearFile`` (checks everything before use)      |
| ``digest``        | the integrity record: sealed by compile, checked by the reader;        |
|                   | ``reseal`` (also ``gear_runtime.gearfile.reseal``) re-seals an edit    |
| ``external_data`` | the one data file beside a gear file (ONNX external data)              |
| ``inline_data``   | a static model's inline weights found in its file, never parsed        |
| ``onnx_graph``    | general ONNX graph helpers                                             |
| ``kernel_guards`` | request values a kernel turns into memory offsets (an attention mask's |
|                   | lengths), found in the graph, checked before every run                 |
| ``passthrough``   | outputs no node computes (wrapped in an Identity, unwrapped on read)   |
"""

from gear_runtime.gearfile.digest import reseal

__all__ = ["reseal"]
