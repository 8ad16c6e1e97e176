"""FP8 itself: formats and rounding, recipes, the backends (TE, torchao, the emulator) and the fused decoder they
share, conversion (``convert_model``, ``autocast``), FP8 health records. Imports ``core``, ``records``, ``model``."""
