"""The runtime: a loaded model (``model``), its executors (``executor``), the one gear
dispatcher (``dispatch``) and the C++ hot path (``core``). Backends sit below it."""
